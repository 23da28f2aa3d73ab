import json, sys
# Per run at 8 clients: each client's time over the run's mean and its congestion window after the run; and the
# correlation of the two over every client of every run, per server.
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["results"]:
        if r["clients"] > 16:
            continue
        xs, ys = [], []
        for i, run in enumerate(r["runs"]):
            t, c = run.get("client_seconds", []), run.get("client_cwnds", [])
            if not t or not c:
                continue
            mean = sum(t) / len(t)
            print(f"{r['server']:9} {r['op']} {r['clients']} run {i} {run['ops_per_second']/1e6:.2f} M/s "
                  + " ".join(f"{x/mean:.2f}:{w}" for x, w in zip(t, c)))
            xs += [x / mean for x in t]; ys += c
        n = len(xs)
        if n > 2:
            mx, my = sum(xs) / n, sum(ys) / n
            cov = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
            vx = sum((a - mx) ** 2 for a in xs) ** 0.5; vy = sum((b - my) ** 2 for b in ys) ** 0.5
            print(f"== {path} {r['server']} {r['op']}/{r['clients']}: corr(time, cwnd) = {cov / (vx * vy) if vx and vy else 0:.2f} over {n} clients")

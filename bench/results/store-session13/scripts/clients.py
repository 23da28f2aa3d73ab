import json, sys
# Per run: each client's time over the run's mean client time, in connection order; and the mean of the
# even-indexed clients against the odd-indexed ones (connections are dealt to two server loops in turn).
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if r["clients"] > 16:
        continue
    for i, run in enumerate(r["runs"]):
        t = run.get("client_seconds", [])
        if not t:
            continue
        mean = sum(t) / len(t)
        even, odd = t[0::2], t[1::2]
        ratio = (sum(even) / len(even)) / (sum(odd) / len(odd)) if odd else 1.0
        print(f"{r['server']:9} {r['op']} {r['clients']} run {i} {run['ops_per_second']/1e6:.2f} M/s even/odd {ratio:.2f} "
              + " ".join(f"{x/mean:.2f}" for x in t))

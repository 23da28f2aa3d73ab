import json, sys
# Per run at 8 clients: the slowest client's total time and send time (inside its SETs), each over its mean;
# then per server the mean of those spreads.
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["results"]:
        if r["clients"] > 16:
            continue
        tot, snd = [], []
        for i, run in enumerate(r["runs"]):
            t, o = run.get("client_seconds", []), run.get("client_op_seconds", [])
            if not t or not o:
                continue
            mt, mo = sum(t) / len(t), sum(o) / len(o)
            tot.append(max(t) / mt); snd.append(max(o) / mo)
            if "-v" in sys.argv[0:1] or len(sys.argv) == 2:
                print(f"{r['server']:9} run {i} {run['ops_per_second']/1e6:.2f} M/s total {max(t)/mt:.2f} send {max(o)/mo:.2f} mean send {mo*1e3:.2f} ms total {mt*1e3:.2f} ms | "
                      + " ".join(f"{x/mo:.2f}" for x in o))
        if tot:
            print(f"== {path} {r['server']} {r['op']}/{r['clients']}: spread total {sum(tot)/len(tot):.2f} send {sum(snd)/len(snd):.2f}")

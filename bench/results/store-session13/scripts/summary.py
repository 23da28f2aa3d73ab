import json, sys
d = json.load(open(sys.argv[1]))
rows = {}
for r in d["results"]:
    rows.setdefault((r["op"], r["clients"]), {})[r["server"]] = r
out = []
for (op, c), s in rows.items():
    p, t = s.get("pg-store"), s.get("pytorch")
    if not p or not t:
        continue
    runs = lambda r: "/".join(f"{x/1e6:.2f}" for x in r["runs_ops_per_second"])
    out.append(f"{op}/{c} {100*(p['ops_per_second']/t['ops_per_second']-1):+.0f}% seg {p['segments_per_op']:.3f}/{t['segments_per_op']:.3f} cwnd {p['client_cwnd_p50']},{p['client_cwnd_max']}/{t['client_cwnd_p50']},{t['client_cwnd_max']} spread {p['client_spread']:.2f}/{t['client_spread']:.2f} runs ours {runs(p)} pt {runs(t)}")
print("\n".join(out))

import json, sys
# Per file and server at 8 clients: median throughput, median over runs of the clients' mean send time, of the
# slowest send time, and of the mean tail (a client's time after its last timed operation: the closing round trip
# and the untimed loop overhead), in ms.
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in d["results"]:
        if r["clients"] > 16 or r["op"] != "set":
            continue
        rows = []
        for run in r["runs"]:
            t, o = run["client_seconds"], run["client_op_seconds"]
            tails = [a - b for a, b in zip(t, o)]
            rows.append((run["ops_per_second"] / 1e6, sum(o) / len(o) * 1e3, max(o) * 1e3, sum(tails) / len(tails) * 1e3, max(tails) * 1e3))
        med = lambda i: sorted(x[i] for x in rows)[len(rows) // 2]
        name = path.split("/")[-2]
        print(f"{name:12} {r['server']:9} {med(0):.2f} M/s  send mean {med(1):.2f} max {med(2):.2f}  tail mean {med(3):.2f} max {med(4):.2f}  seg {r['segments_per_op']:.3f}")

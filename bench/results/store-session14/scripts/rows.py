import json, sys
# Ours over PyTorch's median throughput, every row of every file given.
for path in sys.argv[1:]:
    d = json.load(open(path))
    rows = {}
    for r in d["results"]:
        rows.setdefault((r["op"], r["clients"]), {})[r["server"]] = r["ops_per_second"]
    cells = [f"{op}/{c} {100 * (s['pg-store'] / s['pytorch'] - 1):+.0f}%" for (op, c), s in rows.items() if len(s) == 2]
    print(path.split("/")[-2], " ".join(cells))

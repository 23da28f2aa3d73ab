import json, sys, glob, collections
# Per variant (directory name without its round suffix): ours over PyTorch's median per round, and the medians
# over all runs of ours and PyTorch's throughput and slowest client's send time (ms).
root = sys.argv[1]
by = collections.defaultdict(list)
for path in sorted(glob.glob(root + "/*/store.json")):
    name = path.split("/")[-2]
    variant = name.rsplit("-", 1)[0]
    d = json.load(open(path))
    rows = {r["server"]: r for r in d["results"] if r["op"] == "set" and r["clients"] == 8}
    by[variant].append(rows)
med = lambda xs: sorted(xs)[len(xs) // 2]
for variant, rounds in by.items():
    ratios = [r["pg-store"]["ops_per_second"] / r["pytorch"]["ops_per_second"] for r in rounds]
    stat = {}
    for server in ("pg-store", "pytorch"):
        runs = [run for r in rounds for run in r[server]["runs"]]
        stat[server] = (med([x["ops_per_second"] / 1e6 for x in runs]), med([max(x["client_op_seconds"]) * 1e3 for x in runs]),
                        med([sum(x["client_op_seconds"]) / len(x["client_op_seconds"]) * 1e3 for x in runs]), med([x["segments_per_op"] for x in runs]))
    print(f"{variant:6} rounds " + " ".join(f"{(x - 1) * 100:+.0f}%" for x in ratios)
          + "  | ours M/s %.2f maxsend %.2f meansend %.2f seg %.3f" % stat["pg-store"]
          + "  | torch M/s %.2f maxsend %.2f meansend %.2f seg %.3f" % stat["pytorch"])

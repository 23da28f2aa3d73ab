#!/bin/bash
# Session 14: long floods (125,000 SETs per client, 8 clients) with the existing knobs: which setting avoids the
# slow runs (clients whose SETs leave one segment each).
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
store() { # name seconds args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed or timed out"
}
L="--only set --clients 8 --reps 7 --ops 100000"
for i in 1 2; do
  store base-$i 60 $L
  store t1-$i 60 $L --pgstore-threads 1
  store c400-$i 60 $L --pgstore-coalesce-us 400
  store bp0-$i 60 $L --pgstore-busy-poll-us 0
done
python3 variants.py $R
python3 - "$R" <<'PY'
import json, sys, glob
for path in sorted(glob.glob(sys.argv[1] + "/*/store.json")):
    d = json.load(open(path))
    for r in d["results"]:
        print(path.split("/")[-2], r["server"], " ".join(f"{x['ops_per_second'] / 1e6:.2f}({x['segments_per_op']:.2f})" for x in r["runs"]))
PY
cd "$OUT" && tar czf s14e.tgz r && rm -rf r

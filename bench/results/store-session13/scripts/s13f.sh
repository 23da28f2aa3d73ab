#!/bin/bash
# Session 13, final: committed defaults (2dbc351); the last full run becomes bench/results/store.{md,json}.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
nproc
store() { # name args...
  local name=$1; shift
  local s=$SECONDS
  timeout 280 ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1; echo "== $name rc=$? took $((SECONDS-s)) s"
  python3 summary.py "$R/$name/store.json" | cut -c1-60
}
store set-1 --only set --clients 8 --reps 9
store full-1
store full-2
python3 tails.py $R/*/store.json
cd "$OUT" && tar czf s13f.tgz r && rm -rf r

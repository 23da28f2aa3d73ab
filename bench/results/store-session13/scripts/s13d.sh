#!/bin/bash
# Session 13: which clients are slow at SET/8 with pg-store: client time against congestion window.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
store() { # name args...
  local name=$1; shift
  local s=$SECONDS
  timeout 200 ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1; echo "== $name rc=$? took $((SECONDS-s)) s"
  python3 summary.py "$R/$name/store.json" | cut -c1-100
}
store set-1 --only set --clients 8 --reps 9
store set-2 --only set --clients 8 --reps 9
store set-pinned --only set --clients 8 --reps 9 --pin-cpus on
python3 sends.py $R/*/store.json | grep "=="
cd "$OUT" && tar czf s13d.tgz r && rm -rf r

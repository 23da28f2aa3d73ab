#!/bin/bash
# Session 13: longer SET runs (--ops) against the default 100,000 SETs per run, 8 clients, interleaved.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
nproc
store() { # name args...
  local name=$1; shift
  timeout 250 ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed"
}
for i in 1 2; do
  store ops10k-$i --only set --clients 8 --reps 9
  store ops50k-$i --only set --clients 8 --reps 9 --ops 50000
  store ops100k-$i --only set --clients 8 --reps 9 --ops 100000
done
python3 tails.py $R/*/store.json
python3 sends.py $R/*/store.json | grep "=="
cd "$OUT" && tar czf s13g.tgz r && rm -rf r

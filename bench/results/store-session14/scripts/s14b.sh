#!/bin/bash
# Session 14: SET at 8 clients, default length, existing pgstore knobs against the defaults, interleaved rounds:
# which setting makes the slowest client thread fastest (and so the run).
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
store() { # name seconds args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed or timed out"
}
S="--only set --clients 8 --reps 9"
for i in 1 2 3 4; do
  store base-$i 40 $S
  store bp0-$i 40 $S --pgstore-busy-poll-us 0
  store t1-$i 40 $S --pgstore-threads 1
  store t4-$i 40 $S --pgstore-threads 4
  store c400-$i 40 $S --pgstore-coalesce-us 400
done
python3 tails.py $R/*/store.json > $R/tails.txt
python3 variants.py $R
cd "$OUT" && tar czf s14b.tgz r && rm -rf r

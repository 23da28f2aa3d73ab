#!/bin/bash
# Session 14: two full runs of the committed defaults (`cargo xtask bench store` with no flags); on x2 the second
# one becomes bench/results/store.{md,json}, chosen before it ran.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
nproc
for i in 1 2; do
  s=$SECONDS
  timeout 270 ./store_bench --pgstore ./pgstore --python python3 --out "$R/full-$i" > "$R/full-$i.log" 2>&1; echo "== full-$i rc=$? took $((SECONDS-s)) s"
done
python3 rows.py $R/full-*/store.json
cd "$OUT" && tar czf s14c.tgz r && rm -rf r

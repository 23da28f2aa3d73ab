#!/bin/bash
# Session 14: the committed defaults on the 16-vCPU host: three full runs and three SET-only runs at 8 clients.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
nproc
for i in 1 2 3; do
  s=$SECONDS
  timeout 150 ./store_bench --pgstore ./pgstore --python python3 --out "$R/full-$i" > "$R/full-$i.log" 2>&1; echo "== full-$i rc=$? took $((SECONDS-s)) s"
  timeout 40 ./store_bench --pgstore ./pgstore --python python3 --out "$R/set8-$i" --only set --clients 8 --reps 9 > "$R/set8-$i.log" 2>&1 || echo "== set8-$i failed"
done
python3 rows.py $R/*/store.json
cd "$OUT" && tar czf s14d.tgz r && rm -rf r

#!/bin/bash
# Session 13: the committed defaults (loops sleep on the coalescing timer), full runs and SET-only runs.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
nproc; lscpu | grep -E "Model name|L3|NUMA node|Thread|Core|Socket" | tr -s " " ; cat /sys/devices/system/cpu/cpu*/cache/index3/shared_cpu_list 2>/dev/null | sort -u | tr "\n" " "; echo
store() { # name args...
  local name=$1; shift
  local s=$SECONDS
  timeout 280 ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1; echo "== $name rc=$? took $((SECONDS-s)) s"
  python3 summary.py "$R/$name/store.json" | cut -c1-100
}
store set-1 --only set --clients 8 --reps 9
store full-1
store full-2
store set-2 --only set --clients 8 --reps 9
store full-3
cd "$OUT" && tar czf s13b.tgz r && rm -rf r

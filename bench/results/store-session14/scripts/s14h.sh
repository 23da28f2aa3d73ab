#!/bin/bash
# Session 14: with cubic, can a setting of the existing knobs bring SET at 8 clients level with PyTorch's? One
# loop, busy polling off, coalescing off, against the defaults; then a full run with one loop. Restored at the end.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
orig=$(sysctl -n net.ipv4.tcp_congestion_control)
sysctl -qw net.ipv4.tcp_congestion_control=cubic || { echo "cannot change the congestion control"; exit 0; }
echo "congestion control now $(sysctl -n net.ipv4.tcp_congestion_control) (was $orig)"
store() { # name seconds args...
  local name=$1 limit=$2; shift 2
  local s=$SECONDS
  timeout "$limit" ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed or timed out"
  echo "== $name took $((SECONDS-s)) s"
}
S="--only set --clients 8 --reps 9"
store cubic-base 40 $S
store cubic-t1 40 $S --pgstore-threads 1
store cubic-bp0 40 $S --pgstore-busy-poll-us 0
store cubic-c0 40 $S --pgstore-coalesce-us 0
store cubic-full-t1 120 --pgstore-threads 1
sysctl -qw net.ipv4.tcp_congestion_control="$orig"
echo "restored $(sysctl -n net.ipv4.tcp_congestion_control)"
python3 rows.py $R/*/store.json
python3 - "$R" <<'PY'
import json, sys, glob
for path in sorted(glob.glob(sys.argv[1] + "/cubic-[btc]*/store.json")):
    d = json.load(open(path))
    for r in d["results"]:
        if r["op"] == "set" and r["clients"] == 8:
            print(path.split("/")[-2], r["server"], " ".join(f"{x['ops_per_second'] / 1e6:.2f}({x['segments_per_op']:.2f})" for x in r["runs"]))
PY
cd "$OUT" && tar czf s14h.tgz r && rm -rf r

#!/bin/bash
# Session 14: the host's default congestion control switched to cubic (Linux's usual default; the GPU hosts run
# bbr): a full default run, then SET at 8 and 64 clients with the flood receive buffer. Restored at the end.
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
store cubic-full 200
S="--only set --clients 8,64 --reps 9"
store cubic-set-c1000-r64k 60 $S --pgstore-coalesce-us 1000 --pgstore-flood-rcvbuf-bytes 65536
store cubic-set-base 60 $S
store cubic-set-c500-r32k 60 $S --pgstore-coalesce-us 500 --pgstore-flood-rcvbuf-bytes 32768
store cubic-set-c1000-r128k 60 $S --pgstore-coalesce-us 1000 --pgstore-flood-rcvbuf-bytes 131072
sysctl -qw net.ipv4.tcp_congestion_control="$orig"
echo "restored $(sysctl -n net.ipv4.tcp_congestion_control)"
python3 rows.py $R/*/store.json
python3 - "$R" <<'PY'
import json, sys, glob
for path in sorted(glob.glob(sys.argv[1] + "/cubic-set*/store.json")):
    d = json.load(open(path))
    for r in d["results"]:
        print(path.split("/")[-2], r["server"], r["clients"], " ".join(f"{x['ops_per_second'] / 1e6:.2f}({x['segments_per_op']:.2f})" for x in r["runs"]))
PY
cd "$OUT" && tar czf s14g.tgz r && rm -rf r

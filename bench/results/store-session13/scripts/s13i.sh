#!/bin/bash
# Session 13: long SET floods (1M SETs a run, 8 clients): a fixed receive buffer on flooding connections together
# with a longer coalescing interval, so that a flooding sender's window closes before each late read.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
store() { # name binary env args...
  local name=$1 bin=$2 envs=$3; shift 3
  env $envs timeout 200 ./store_bench --pgstore "$bin" --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed"
}
L="--only set --clients 8 --reps 7 --ops 100000"
for i in 1 2; do
  store base-$i ./pgstore X=1 $L
  store c1000-$i ./pgstore X=1 $L --pgstore-coalesce-us 1000
  store c500-r32k-$i ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=32768 $L --pgstore-coalesce-us 500
  store c1000-r32k-$i ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=32768 $L --pgstore-coalesce-us 1000
  store c1000-r64k-$i ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=65536 $L --pgstore-coalesce-us 1000
  store c200-r16k-$i ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=16384 $L
done
python3 tails.py $R/*/store.json
cd "$OUT" && tar czf s13i.tgz r && rm -rf r

#!/bin/bash
# Session 13: long SET floods (1M SETs a run, 8 clients): socket state of the connections (ss) during a run, and
# a fixed receive buffer on flooding connections (PGSTORE_EXP_STREAM_RCVBUF, at their first late read) or on every
# accepted connection (PGSTORE_EXP_ACCEPT_RCVBUF), against the committed server.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
command -v ss || echo "no ss"
store() { # name binary env args...
  local name=$1 bin=$2 envs=$3; shift 3
  env $envs timeout 200 ./store_bench --pgstore "$bin" --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed"
}
# Socket snapshots during one pooled long run.
( for i in $(seq 1 400); do echo "@ $(date +%s.%N)"; ss -tmipHn state established 2>/dev/null | grep -A1 -E "pgstore|python" ; sleep 0.02; done ) > "$R/ss.txt" 2>&1 &
SSPID=$!
store ss-pooled ./pgstore X=1 --only set --clients 8 --reps 3 --ops 100000 --fresh-connections off
kill $SSPID 2>/dev/null
for i in 1 2; do
  store base-$i ./pgstore X=1 --only set --clients 8 --reps 9 --ops 100000
  store srcv64k-$i ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=65536 --only set --clients 8 --reps 9 --ops 100000
  store srcv32k-$i ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=32768 --only set --clients 8 --reps 9 --ops 100000
  store arcv64k-$i ./pgstore-rcv PGSTORE_EXP_ACCEPT_RCVBUF=65536 --only set --clients 8 --reps 9 --ops 100000
done
store srcv64k-short ./pgstore-rcv PGSTORE_EXP_STREAM_RCVBUF=65536 --only set --clients 8 --reps 9
python3 tails.py $R/*/store.json
wc -l $R/ss.txt
cd "$OUT" && tar czf s13h.tgz r && rm -rf r

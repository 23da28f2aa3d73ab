#!/bin/bash
# Session 14 (prepared in 13): the flood receive buffer (committed, off by default) with longer coalescing
# intervals, on long floods (125,000 SETs per client) and on the default length, SET at 8 clients, interleaved.
# Every call has a short timeout: a variant that stalls its senders must not eat the device budget.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
store() { # name seconds args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed or timed out"
}
L="--only set --clients 8 --reps 7 --ops 100000"
S="--only set --clients 8 --reps 9"
for i in 1 2; do
  store long-base-$i 60 $L
  store long-c1000-r64k-$i 60 $L --pgstore-coalesce-us 1000 --pgstore-flood-rcvbuf-bytes 65536
  store long-c500-r64k-$i 60 $L --pgstore-coalesce-us 500 --pgstore-flood-rcvbuf-bytes 65536
  store long-c1000-r128k-$i 60 $L --pgstore-coalesce-us 1000 --pgstore-flood-rcvbuf-bytes 131072
  store short-base-$i 40 $S
  store short-c1000-r64k-$i 40 $S --pgstore-coalesce-us 1000 --pgstore-flood-rcvbuf-bytes 65536
done
python3 tails.py $R/*/store.json
cd "$OUT" && tar czf s14a.tgz r && rm -rf r

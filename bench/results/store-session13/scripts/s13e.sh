#!/bin/bash
# Session 13: a connection read late is not deferred again for a grace period after that read (the data our
# acknowledgement released is read at once), against the committed rule; SET at 8 clients, interleaved.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
store() { # name binary grace-us args...
  local name=$1 bin=$2 grace=$3; shift 3
  PGSTORE_EXP_REDEFER_GRACE_US=$grace timeout 200 ./store_bench --pgstore "$bin" --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed"
}
for i in 1 2; do
  store base-$i ./pgstore 0 --only set --clients 8 --reps 9
  store g50-$i ./pgstore-grace 50 --only set --clients 8 --reps 9
  store g150-$i ./pgstore-grace 150 --only set --clients 8 --reps 9
done
store g50-full ./pgstore-grace 50
python3 tails.py $R/*/store.json
python3 summary.py $R/g50-full/store.json | cut -c1-60
cd "$OUT" && tar czf s13e.tgz r && rm -rf r

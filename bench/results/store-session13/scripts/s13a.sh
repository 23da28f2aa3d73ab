#!/bin/bash
# Next session: loops that sleep on the timer while only coalesced streams wait (pgstore-sleep, from
# /work/notes/streams-sleep-on-timer.patch) against the committed spinning loops (pgstore), interleaved.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
nproc; lscpu -e=CPU,CORE,SOCKET 2>/dev/null | tr "\n" " "; echo
store() { # name binary args...
  local name=$1 bin=$2; shift 2
  local s=$SECONDS
  timeout 280 ./store_bench --pgstore "$bin" --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1; echo "== $name rc=$? took $((SECONDS-s)) s"
  python3 summary.py "$R/$name/store.json" | cut -c1-110
}
for i in 1 2 3; do
  store spin-$i ./pgstore --only set --clients 8 --reps 9
  store sleep-$i ./pgstore-sleep --only set --clients 8 --reps 9
done
store spin-pinned ./pgstore --only set --clients 8 --reps 9 --pin-cpus on
store sleep-pinned ./pgstore-sleep --only set --clients 8 --reps 9 --pin-cpus on
store full-sleep ./pgstore-sleep
cd "$OUT" && tar czf s13a.tgz r && rm -rf r

#!/bin/bash
# Session 14: are the slow long-flood runs BBR's doing? Long floods (125,000 SETs per client, 8 clients) with the
# host's congestion control (bbr) and with cubic, interleaved; the setting is restored at the end.
set -u
cd "$(dirname "$0")"
R=$OUT/r
mkdir -p "$R"
orig=$(sysctl -n net.ipv4.tcp_congestion_control)
echo "congestion control: $orig; available: $(sysctl -n net.ipv4.tcp_available_congestion_control); uid $(id -u)"
cc() { sysctl -qw net.ipv4.tcp_congestion_control="$1" && echo "now $(sysctl -n net.ipv4.tcp_congestion_control)"; }
store() { # name seconds args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" ./store_bench --pgstore ./pgstore --python python3 --out "$R/$name" "$@" > "$R/$name.log" 2>&1 || echo "== $name failed or timed out"
}
L="--only set --clients 8 --reps 7 --ops 100000"
cc cubic || { echo "cannot change the congestion control"; exit 0; }
cc "$orig"
for i in 1 2 3; do
  cc "$orig"; store bbr-$i 60 $L
  cc cubic; store cubic-$i 60 $L
done
cc cubic; store cubic-short 40 --only set --clients 8 --reps 9
cc "$orig"
python3 variants.py $R
python3 - "$R" <<'PY'
import json, sys, glob
for path in sorted(glob.glob(sys.argv[1] + "/*/store.json")):
    d = json.load(open(path))
    for r in d["results"]:
        print(path.split("/")[-2], r["server"], " ".join(f"{x['ops_per_second'] / 1e6:.2f}({x['segments_per_op']:.2f})" for x in r["runs"]), "cwnd max", r.get("client_cwnd_max"))
PY
cd "$OUT" && tar czf s14f.tgz r && rm -rf r

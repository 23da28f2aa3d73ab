#!/usr/bin/env bash
# Runs pg's real-GPU suite from this bundle (no cargo needed): the conformance suite, the three experiments,
# the interop task, the benchmarks (raw NCCL loop, pg's process group, PyTorch) on the same libnccl, the
# training example beside PyTorch DDP, mixed groups of pg and PyTorch ranks, a multi-node rehearsal under
# torchrun's own launch, and the fault matrix.
# Usage: run.sh [OUT_DIR]   (env: TASKS=conformance,experiments,interop  TASK_WORLDS="N ..."  BENCH=1
#                            BENCH_PROFILE=nvlink|network  BENCH_WORLDS="N ..."  BENCH_MAX_BYTES=1073741824
#                            BENCH_TRIALS=5  FIRST_TRIALS=5  NPROC=N  TRAIN=1  TRAIN_NPROC=1  TRAIN_WORLDS="N ..."
#                            TRAIN_BUCKETS="1 2"  TRAIN_STEPS=100  MIXED=0  MIXED_RUNS="2:0 2:1 3:1 3:0"  TORCHRUN=0
#                            FAULTS=0  FAULT_WORLDS="N ..."  RECOVERY=0  RECOVERY_WORLDS="N ..."  ELASTIC=0
#                            ELASTIC_WORLDS="N ..."
#                            SUITE=network  ONLY=tasks|bench|train|mixed|torchrun|faults|recovery|elastic  CUBLAS_DIR=directory of libcublas.so.13 or .12 (else looked for under
#                            PyTorch and CUDA)  STALL_S=180  TASK_TIMEOUT_S=600)
# STALL_S: conformance ranks that finish no case for that long are stopped, their stacks written to
# OUT_DIR/stalls/, and started again at the furthest case reached; TASK_TIMEOUT_S bounds each task of a world.
# NPROC (default: the GPU count) is the world of TASKS and of the benchmarks; TASK_WORLDS and BENCH_WORLDS run
# them at each world of the list instead. Ranks beyond the GPUs share them, each its own NCCL host over
# loopback sockets (the network transport); result files then say so.
# BENCH: 1 = every benchmark, 0 = none, or a list of all-reduce, all-to-all, p2p (BENCH=all-to-all,p2p).
# BENCH_PROFILE=network sizes the benchmarks for the network transport (to 16 MiB, 10 ops per trial, 3 trials,
# raw, raw-with-events, pg and PyTorch, no graph rows and no first-collective launches) and writes
# OUT_DIR/allreduce-nccl-N-net.{md,json}, all-to-all-nccl-N-net.{md,json}, p2p-nccl-N-net.{md,json} per world.
# The conformance results are OUT_DIR/conformance.{md,json}: {"backend", "world_size", "cases": [...]} (with
# TASK_WORLDS also conformance-nccl-N.{md,json}); the interop task's OUT_DIR/interop-nccl-N.{md,json}; the
# experiments' OUT_DIR/experiments-nccl-N.{md,json}; the training runs' OUT_DIR/train-mlp-GPUxN.{md,json} (ranks
# sharing a GPU: train-mlp-nccl-N-net.{md,json}); the benchmarks' OUT_DIR/allreduce.{md,json},
# OUT_DIR/all-to-all.{md,json} and OUT_DIR/p2p.{md,json}.
# TRAIN_BUCKETS="1 2" runs pg's example and DDP with one gradient bucket and with two, one report per world.
# MIXED=1: for each WORLD:PG_RANK of MIXED_RUNS, pg's rank (pg-nccl-gpu mixed, the README's join code) beside
# PyTorch ranks (torch_mixed.py), every op checked on both sides: OUT_DIR/mixed-nccl-N.{md,json}.
# TORCHRUN=1: two torchrun agents (--nnodes 2 --nproc-per-node 2, c10d rendezvous on 127.0.0.1, each "node" its
# own NCCL_HOSTID) start pg-nccl-gpu's conformance ranks: OUT_DIR/conformance-torchrun-4.{md,json}. The agents get
# TORCHRUN_TIMEOUT_S (default 500); a rank stopped by then is reported from what it finished.
# FAULTS=1: the fault matrix on NCCL (pg-xtask faults --backend nccl: a skipped collective with the desync report,
# a rank SIGKILLed mid-all_reduce, an async error, an abort from another thread, a new group after an error) at
# each world of FAULT_WORLDS (default "2 4"): OUT_DIR/faults-nccl-N.{md,json}.
# RECOVERY=1: at each world of RECOVERY_WORLDS (default "4"), the last rank SIGKILLed during its sixth 64 MiB
# all_reduce, each survivor timed from the kill to its first correct all_reduce of the shrunk group: pg (pg-xtask
# recovery, without and with liveness from the store) beside PyTorch's best and documented paths
# (torch_recovery.py), on one libnccl: OUT_DIR/recovery-nccl-N.{md,json}. TORCH_RECOVERY_LIMIT_S (default 200): the
# seconds each PyTorch path gets; a survivor still recovering then is stopped and reported as slower than the limit.
# pg's events of every rank (RUST_LOG, default pg=info) go to OUT_DIR/recovery-pg[-liveness]-N.log.
# ELASTIC=1: the training example's elastic loop at each world of ELASTIC_WORLDS (default "4"), one process per
# rank: the last rank dies at step 20, the survivors (liveness on) shrink and train to step 100:
# OUT_DIR/elastic-mlp-nccl-NtoM.json (M = N - 1).
# SUITE=network: the one-GPU network-transport suite in one command: TASKS at worlds 2 and 4, MIXED=1,
# TORCHRUN=1, TRAIN_WORLDS="2 4" with TRAIN_BUCKETS="1 2", BENCH_PROFILE=network at BENCH_WORLDS="2 4", FAULTS=1
# at FAULT_WORLDS="2 4" (each variable still overrides).
# ONLY=PART[,PART...] runs those parts alone (the others' switches default to off): tasks, bench, train, mixed,
# torchrun, faults; with SUITE=network, those parts of the suite (SUITE=network ONLY=bench; ONLY=mixed,torchrun,train).
# With all-reduce among BENCH (nvlink profile) the bench also times the first all_reduce of a fresh group (pg
# lazy and eager, PyTorch without and with device_id, FIRST_TRIALS fresh launches each) and merges it into
# OUT_DIR/allreduce.{md,json}.
# stream_pairs.py (one GPU, PyTorch) measures the device cost of pg's two waits per op for each pair of streams.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$HERE/results}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
if [ -n "${ONLY:-}" ]; then
  for part in ${ONLY//,/ }; do
    case "$part" in tasks | bench | train | mixed | torchrun | faults | recovery | elastic) ;; *) echo "ONLY: unknown part '$part' (tasks, bench, train, mixed, torchrun, faults, recovery, elastic)"; exit 2 ;; esac
  done
  only() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
  if ! only tasks; then : "${TASKS:=none}" "${XTASK_EXPERIMENTS:=0}"; fi
  if ! only bench; then : "${BENCH:=0}"; fi
  if ! only train; then : "${TRAIN:=0}"; fi
  if only mixed; then MIXED=1; else : "${MIXED:=0}"; fi
  if only torchrun; then TORCHRUN=1; else : "${TORCHRUN:=0}"; fi
  if only faults; then FAULTS=1; else : "${FAULTS:=0}"; fi
  if only recovery; then RECOVERY=1; else : "${RECOVERY:=0}"; fi
  if only elastic; then ELASTIC=1; else : "${ELASTIC:=0}"; fi
fi
if [ "${SUITE:-}" = network ]; then
  : "${TASK_WORLDS:=2 4}" "${MIXED:=1}" "${TORCHRUN:=1}" "${TRAIN:=1}" "${TRAIN_WORLDS:=2 4}" "${TRAIN_BUCKETS:=1 2}"
  : "${BENCH:=1}" "${BENCH_PROFILE:=network}" "${BENCH_WORLDS:=2 4}" "${FAULTS:=1}" "${FAULT_WORLDS:=2 4}"
elif [ -n "${SUITE:-}" ]; then
  echo "SUITE: unknown suite '$SUITE' (network)"; exit 2
fi
{ date -u; nvidia-smi; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
GPUS="$(nvidia-smi -L | grep -c '^GPU ')"
NP="${NPROC:-$GPUS}"
GPU_TAG="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')"
GPU_NAME="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
COMMIT="$(cat "$HERE/COMMIT" 2>/dev/null || echo unknown)"
# "N ranks on G GPUs": ranks beyond the GPUs share them, each its own NCCL host over loopback sockets.
layout() {
  local n="$1" text
  text="$n rank(s) on $(( n < GPUS ? n : GPUS )) GPU(s)"
  if [ "$n" -gt "$GPUS" ]; then text="$text, network transport (NCCL_HOSTID per rank, loopback sockets, not NVLink)"; fi
  echo "$text"
}
run_label() { echo "$(date -u +%FT%TZ), $GPU_NAME, $(layout "$1"), commit $COMMIT, libnccl ${PG_NCCL_LIBRARY:-default}"; }
# A TCP port free on the loopback now (a fresh one for each job, so that no job meets the last one's store).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $(( 29600 + RANDOM % 2000 ))
}
# Rank r's placement beside torchrun's variables: GPU r % GPUS and, with ranks sharing GPUs, a host of its own.
rank_env() {
  local r="$1" n="$2"
  echo "RANK=$r LOCAL_RANK=$(( r % GPUS )) WORLD_SIZE=$n"
  if [ "$n" -gt "$GPUS" ]; then
    echo "NCCL_HOSTID=pg-rank-host-$r NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}"
  fi
}
has_torch() { python3 -c 'import torch' 2>/dev/null; }
PG_RUN_LABEL="$(run_label "$NP")"
export PG_RUN_LABEL
rc=0

# ===== the tasks (conformance, experiments, interop) and pg-xtask's experiments, at each world =====
run_tasks() {
  local W="$1"
  local PG_RUN_LABEL
  PG_RUN_LABEL="$(run_label "$W")"
  export PG_RUN_LABEL
  local TASK_LIST="${TASKS:-conformance,experiments,interop}"
  if [ "$TASK_LIST" != none ]; then
    "$HERE/pg-nccl-gpu" run --tasks "$TASK_LIST" --out "$OUT" --nproc "$W" --stall-s "${STALL_S:-180}" \
      --timeout-s "${TASK_TIMEOUT_S:-600}" || rc=1
  fi
  if [ -f "$OUT/interop.json" ]; then
    cp "$OUT/interop.json" "$OUT/interop-nccl-$W.json"; cp "$OUT/interop.md" "$OUT/interop-nccl-$W.md"
  fi
  if [ -n "${TASK_WORLDS:-}" ] && [ -f "$OUT/conformance.json" ]; then
    cp "$OUT/conformance.json" "$OUT/conformance-nccl-$W.json"; cp "$OUT/conformance.md" "$OUT/conformance-nccl-$W.md"
  fi
  if [ "${XTASK_EXPERIMENTS:-1}" = "1" ]; then
    # The same generic experiment code as `cargo xtask experiments` on the mock, with the same JSON schema.
    "$HERE/pg-xtask" experiments --backend nccl --world-size "$W" --json "$OUT/experiments-nccl.json" \
      > "$OUT/experiments-nccl.txt" 2>&1 || rc=1
    cat "$OUT/experiments-nccl.txt"
    # PyTorch's ProcessGroupNCCL in the same three experiments, in the same run: blocking wait is process-wide
    # there, so its config runs in a second launch.
    rm -f "$OUT/experiments-torch.md" "$OUT/experiments-torch.json"
    if has_torch; then
      rm -f "$OUT/torch-experiments.jsonl"
      torchrun --standalone --nproc-per-node "$W" "$HERE/torch_experiments.py" --out "$OUT" > "$OUT/torch-experiments.txt" 2>&1 || rc=1
      TORCH_NCCL_BLOCKING_WAIT=1 torchrun --standalone --nproc-per-node "$W" "$HERE/torch_experiments.py" --out "$OUT" \
        --blocking >> "$OUT/torch-experiments.txt" 2>&1 || rc=1
      python3 "$HERE/torch_experiments.py" --out "$OUT" --report > /dev/null || rc=1
    fi
    { echo "# The three experiments (communicator cache, completion after each wait, kernel streams) on NCCL, world $W"; echo; echo "$PG_RUN_LABEL; command: \`pg-xtask experiments --backend nccl --world-size $W\` and torch_experiments.py (torchrun, same run)"; echo
      echo "## pg"; echo; echo '```text'; cat "$OUT/experiments-nccl.txt"; echo '```'; echo
      if [ -f "$OUT/experiments-torch.md" ]; then echo "## PyTorch"; echo; cat "$OUT/experiments-torch.md"; fi
    } > "$OUT/experiments-nccl-$W.md"
    python3 -c 'import json, sys; pg = json.load(open(sys.argv[1])); t = sys.argv[2]
try: torch = json.load(open(t))
except OSError: torch = None
json.dump({"machine": sys.argv[3], "world_size": int(sys.argv[4]), "pg": pg, "torch": torch}, open(sys.argv[5], "w"), indent=1)' \
      "$OUT/experiments-nccl.json" "$OUT/experiments-torch.json" "$PG_RUN_LABEL" "$W" "$OUT/experiments-nccl-$W.json" || rc=1
  fi
}
for W in ${TASK_WORLDS:-$NP}; do run_tasks "$W"; done

# ===== the benchmarks =====
PROFILE="${BENCH_PROFILE:-nvlink}"
case "$PROFILE" in
  nvlink) MAX_BYTES="${BENCH_MAX_BYTES:-1073741824}"; TRIALS="${BENCH_TRIALS:-5}"; SUFFIX= ;;
  network) MAX_BYTES="${BENCH_MAX_BYTES:-16777216}"; TRIALS="${BENCH_TRIALS:-3}"; SUFFIX=-net ;;
  *) echo "BENCH_PROFILE: unknown profile '$PROFILE' (nvlink, network)"; rc=1; PROFILE=nvlink; MAX_BYTES=1073741824; TRIALS=5; SUFFIX= ;;
esac
case "${BENCH:-1}" in
  1) BENCHES=all-reduce,all-to-all,p2p ;;
  0 | "") BENCHES= ;;
  *) BENCHES="$BENCH" ;;
esac
for b in ${BENCHES//,/ }; do
  case "$b" in all-reduce | all-to-all | p2p) ;; *) echo "BENCH: unknown benchmark '$b' (all-reduce, all-to-all, p2p)"; rc=1 ;; esac
done
wants() { case ",$BENCHES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if [ -n "$BENCHES" ] || [ "${MIXED:-0}" = 1 ] || [ "${RECOVERY:-0}" = 1 ]; then
  # One libnccl for all three contestants (and for both sides of a mixed group): PyTorch's when torch is here.
  TORCH_NCCL="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
  if [ -n "$TORCH_NCCL" ] && [ -f "$TORCH_NCCL" ]; then export PG_NCCL_LIBRARY="$TORCH_NCCL"; fi
  echo "libnccl: ${PG_NCCL_LIBRARY:-default loader (libnccl.so.2, libnccl.so)}"
fi
# Named copies of a world's results when the benchmarks run at several worlds or for the network transport.
keep() {
  local name="$1" W="$2"
  if [ -n "${BENCH_WORLDS:-}" ] || [ -n "$SUFFIX" ]; then
    for ext in md json; do
      if [ -f "$OUT/$name.$ext" ]; then cp "$OUT/$name.$ext" "$OUT/$name-nccl-$W$SUFFIX.$ext"; fi
    done
  fi
}
run_benches() {
  local W="$1" TORCH_PROFILE=()
  local BENCH_ARGS=(--bench-max-bytes "$MAX_BYTES" --bench-trials "$TRIALS" --bench-profile "$PROFILE" --nproc "$W")
  if [ "$PROFILE" = network ]; then TORCH_PROFILE=(--profile network); fi
  local LABEL
  LABEL="$(date -u +%FT%TZ) $GPU_NAME, $(layout "$W"), libnccl ${PG_NCCL_LIBRARY:-default}, commit $COMMIT, command: BENCH=${BENCH:-1} BENCH_PROFILE=$PROFILE BENCH_MAX_BYTES=$MAX_BYTES BENCH_TRIALS=$TRIALS run.sh at world $W"
  if wants all-reduce; then
    rm -f "$OUT/bench.json" "$OUT/torch.json" "$OUT/first.json" "$OUT/torch-first.jsonl"
    "$HERE/pg-nccl-gpu" run --tasks bench --out "$OUT" "${BENCH_ARGS[@]}" || rc=1
    # The time to the first collective: fresh launches, sized for NVLink runs (the network profile skips it).
    if [ "$PROFILE" = nvlink ]; then
      "$HERE/pg-nccl-gpu" run --tasks first --out "$OUT" --bench-trials "${FIRST_TRIALS:-5}" --nproc "$W" || rc=1
    fi
    if has_torch; then
      torchrun --standalone --nproc-per-node "$W" "$HERE/torch_allreduce.py" --out "$OUT" --max-bytes "$MAX_BYTES" \
        --trials "$TRIALS" "${TORCH_PROFILE[@]}" || rc=1
      if [ "$PROFILE" = nvlink ]; then
        for _ in $(seq "${FIRST_TRIALS:-5}"); do
          for MODE in lazy eager; do
            torchrun --standalone --nproc-per-node "$W" "$HERE/torch_allreduce.py" --out "$OUT" --first "$MODE" || rc=1
          done
        done
      fi
    else
      echo "no torch here: the PyTorch contestant is skipped"
    fi
    PG_BENCH_LABEL="$LABEL" "$HERE/pg-nccl-gpu" merge-bench --out "$OUT" || rc=1
    keep allreduce "$W"
  fi
  for op in all-to-all p2p; do
    wants "$op" || continue
    # Each into OUT_DIR/<op>.{md,json}; a world of 1 runs the all-to-all as a self-exchange, and the p2p ring
    # (which needs two ranks) writes that it is not applicable.
    "$HERE/pg-nccl-gpu" run --tasks "bench-$op" --out "$OUT" "${BENCH_ARGS[@]}" || rc=1
    rm -f "$OUT/torch-$op.json"
    if has_torch; then
      torchrun --standalone --nproc-per-node "$W" "$HERE/torch_exchange.py" --op "$op" --out "$OUT" \
        --max-bytes "$MAX_BYTES" --trials "$TRIALS" "${TORCH_PROFILE[@]}" || rc=1
    else
      echo "no torch here: the PyTorch contestant of $op is skipped"
    fi
    PG_BENCH_LABEL="$LABEL" "$HERE/pg-nccl-gpu" "merge-$op" --out "$OUT" || rc=1
    keep "$op" "$W"
  done
}
if [ -n "$BENCHES" ]; then
  for W in ${BENCH_WORLDS:-$NP}; do run_benches "$W"; done
fi

# ===== the training example beside PyTorch DDP =====
# One world: pg's example (one process per rank with torchrun's variables, placed as pg's launchers place
# them) and DDP with the same model, data, steps and bucket layout.
run_train() {
  local TN="$1" BUCKETS="$2" TAG="$3"
  local PG_JSON="$OUT/train-pg$TAG.json" TORCH_JSON="$OUT/train-torch$TAG.json"
  local TRAIN_ARGS=(--backend nccl --world-size "$TN" --steps "${TRAIN_STEPS:-100}" --json "$PG_JSON")
  local TORCH_ARGS=(--steps "${TRAIN_STEPS:-100}" --json "$TORCH_JSON")
  if [ -n "$BUCKETS" ]; then TRAIN_ARGS+=(--buckets "$BUCKETS"); TORCH_ARGS+=(--buckets "$BUCKETS"); fi
  rm -f "$PG_JSON" "$TORCH_JSON"
  if [ "$TN" = "1" ]; then
    "$HERE/ddp_mlp" "${TRAIN_ARGS[@]}" > "$OUT/train-pg$TAG.txt" 2>&1 || rc=1
  else
    local PIDS=() PORT r p
    PORT="$(free_port)"
    for r in $(seq 0 $((TN - 1))); do
      # shellcheck disable=SC2046
      env $(rank_env "$r" "$TN") MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
        "$HERE/ddp_mlp" "${TRAIN_ARGS[@]}" > "$OUT/train-pg$TAG-rank$r.txt" 2>&1 & PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
    cp "$OUT/train-pg$TAG-rank0.txt" "$OUT/train-pg$TAG.txt"
  fi
  tail -3 "$OUT/train-pg$TAG.txt"
  if has_torch; then
    torchrun --standalone --nproc-per-node "$TN" "$HERE/torch_ddp_mlp.py" "${TORCH_ARGS[@]}" > "$OUT/train-torch$TAG.txt" 2>&1 || rc=1
    tail -3 "$OUT/train-torch$TAG.txt"
  else
    echo "no torch here: the PyTorch DDP run is skipped"
  fi
  TRAIN_COMMAND="ddp_mlp ${TRAIN_ARGS[*]}; torchrun --nproc-per-node $TN torch_ddp_mlp.py ${TORCH_ARGS[*]}"
}
# The training example loads cuBLAS at run time: PyTorch's or the CUDA toolkit's, unless CUBLAS_DIR says.
find_cublas() {
  CUBLAS_DIR="${CUBLAS_DIR:-$(dirname "$( { python3 -c 'import nvidia, os; print(*nvidia.__path__)' 2>/dev/null | xargs -r -I{} find {} -name 'libcublas.so.1[23]'; find /usr/local/cuda*/ -name 'libcublas.so.1[23]'; } 2>/dev/null | head -1)")}"
  if [ -n "$CUBLAS_DIR" ] && [ "$CUBLAS_DIR" != "." ]; then export LD_LIBRARY_PATH="$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  echo "training example: libcublas from ${CUBLAS_DIR:-the default loader path}"
}
if [ "${TRAIN:-1}" = "1" ]; then
  # The training example (cuBLAS loaded at run time) and PyTorch DDP on the same model, data and steps.
  find_cublas
  for TN in ${TRAIN_WORLDS:-${TRAIN_NPROC:-1}}; do
    NAME="train-mlp-${GPU_TAG}x$TN"
    if [ "$TN" -gt "$GPUS" ]; then NAME="train-mlp-nccl-$TN-net"; fi
    if [ -z "${TRAIN_BUCKETS:-}" ]; then
      run_train "$TN" "" ""
      if [ -f "$OUT/train-pg.json" ]; then
        PG_RUN_LABEL="$(run_label "$TN"); command: $TRAIN_COMMAND" "$HERE/pg-nccl-gpu" merge-train --out "$OUT" || rc=1
      fi
    else
      COMMANDS=
      for K in $TRAIN_BUCKETS; do run_train "$TN" "$K" "-b$K"; COMMANDS="$COMMANDS; $TRAIN_COMMAND"; done
      # The bucket list split into words on purpose: "1 2" becomes "1,2".
      # shellcheck disable=SC2086
      PG_RUN_LABEL="$(run_label "$TN")$COMMANDS" \
        "$HERE/pg-nccl-gpu" merge-train --out "$OUT" --buckets "$(echo $TRAIN_BUCKETS | tr ' ' ',')" || rc=1
    fi
    if [ -f "$OUT/train-mlp.json" ]; then
      cp "$OUT/train-mlp.json" "$OUT/$NAME.json"; cp "$OUT/train-mlp.md" "$OUT/$NAME.md"; rm -f "$OUT/train-mlp.json"
    fi
  done
fi

# ===== a lost rank survived: pg beside PyTorch's two paths =====
if [ "${RECOVERY:-0}" = "1" ]; then
  for W in ${RECOVERY_WORLDS:-4}; do
    # The reports' label: this world and the libnccl both sides load.
    PG_RUN_LABEL="$(run_label "$W")"
    export PG_RUN_LABEL
    rm -f "$OUT"/recovery-pg*.json "$OUT"/recovery-torch-*.json
    # pg's own events of every rank (the failure each found, revokes, agreements, shrinks), with times, beside the
    # rows: OUT_DIR/recovery-pg[-liveness]-N.log.
    RUST_LOG="${RUST_LOG:-pg=info}" "$HERE/pg-xtask" recovery --backend nccl --world-size "$W" \
      --json "$OUT/recovery-pg.json" --md "$OUT/recovery-pg.md" 2> "$OUT/recovery-pg-$W.log" || rc=1
    RUST_LOG="${RUST_LOG:-pg=info}" "$HERE/pg-xtask" recovery --backend nccl --world-size "$W" --liveness \
      --json "$OUT/recovery-pg-liveness.json" --md "$OUT/recovery-pg-liveness.md" 2> "$OUT/recovery-pg-liveness-$W.log" || rc=1
    if has_torch; then
      python3 "$HERE/torch_recovery.py" --world "$W" --out "$OUT" --limit-s "${TORCH_RECOVERY_LIMIT_S:-200}" || rc=1
    else
      echo "no torch here: PyTorch's recovery paths are skipped"
    fi
    python3 "$HERE/torch_recovery.py" --report --world "$W" --out "$OUT" || rc=1
  done
fi

# ===== elastic training on NCCL: a rank dies, the survivors shrink and train on =====
if [ "${ELASTIC:-0}" = "1" ]; then
  find_cublas
  for EW in ${ELASTIC_WORLDS:-4}; do
    PORT="$(free_port)"; PIDS=()
    ELASTIC_ARGS=(--backend nccl --world-size "$EW" --steps 100 --kill "$((EW - 1)):20" --json "$OUT/elastic-pg.json")
    rm -f "$OUT/elastic-pg.json"
    for r in $(seq 0 $((EW - 1))); do
      # shellcheck disable=SC2046
      env $(rank_env "$r" "$EW") MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" timeout 300 \
        "$HERE/ddp_mlp" "${ELASTIC_ARGS[@]}" > "$OUT/elastic-rank$r.txt" 2>&1 & PIDS+=($!)
    done
    # The last rank dies on purpose (it aborts); every other rank must finish.
    for i in "${!PIDS[@]}"; do wait "${PIDS[$i]}" || [ "$i" = "$((EW - 1))" ] || rc=1; done
    tail -5 "$OUT/elastic-rank0.txt"
    if [ -f "$OUT/elastic-pg.json" ]; then
      python3 -c 'import json, sys; run = json.load(open(sys.argv[1]))
json.dump({"machine": sys.argv[2], **run}, open(sys.argv[3], "w"), indent=2)' "$OUT/elastic-pg.json" \
        "$(run_label "$EW"); command: ddp_mlp ${ELASTIC_ARGS[*]:0:8} (one process per rank)" \
        "$OUT/elastic-mlp-nccl-${EW}to$((EW - 1)).json" || rc=1
    else
      rc=1
    fi
  done
fi

# ===== mixed groups: a pg rank among PyTorch ranks =====
if [ "${MIXED:-0}" = "1" ]; then
  if has_torch; then
    rm -rf "$OUT/mixed"; mkdir -p "$OUT/mixed"
    for RUN in ${MIXED_RUNS:-2:0 2:1 3:1 3:0}; do
      W="${RUN%%:*}"; P="${RUN##*:}"
      DIR="$OUT/mixed/mixed-$W-pg$P"; mkdir -p "$DIR"
      PORT="$(free_port)"; PIDS=()
      for r in $(seq 0 $((W - 1))); do
        if [ "$r" = "$P" ]; then
          # shellcheck disable=SC2046
          env $(rank_env "$r" "$W") MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" timeout 300 \
            "$HERE/pg-nccl-gpu" mixed --out "$DIR" > "$DIR/rank$r-pg.txt" 2>&1 & PIDS+=($!)
        else
          # shellcheck disable=SC2046
          env $(rank_env "$r" "$W") MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" timeout 300 \
            python3 "$HERE/torch_mixed.py" --pg-rank "$P" --out "$DIR" > "$DIR/rank$r-torch.txt" 2>&1 & PIDS+=($!)
        fi
      done
      for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
      echo "mixed group, world $W, pg at rank $P: done"
    done
    PG_RUN_LABEL="$(date -u +%FT%TZ), $GPU_NAME, rank r on GPU r % $GPUS (ranks sharing a GPU: network transport, NCCL_HOSTID per rank, loopback sockets, not NVLink), commit $COMMIT, libnccl ${PG_NCCL_LIBRARY:-default}; runs (world:pg rank) ${MIXED_RUNS:-2:0 2:1 3:1 3:0}; command: MIXED=1 run.sh" \
      "$HERE/pg-nccl-gpu" merge-mixed --out "$OUT/mixed" || rc=1
    for f in "$OUT"/mixed/mixed-nccl-*.md "$OUT"/mixed/mixed-nccl-*.json; do
      if [ -f "$f" ]; then cp "$f" "$OUT/"; fi
    done
  else
    echo "no torch here: the mixed groups are skipped"; rc=1
  fi
fi

# ===== a multi-node rehearsal under torchrun's own launch =====
if [ "${TORCHRUN:-0}" = "1" ]; then
  if command -v torchrun > /dev/null; then
    NODES="${TORCHRUN_NODES:-2}"; PER_NODE="${TORCHRUN_PER_NODE:-2}"; TW=$(( NODES * PER_NODE ))
    DIR="$OUT/torchrun"; rm -rf "$DIR"; mkdir -p "$DIR"
    PORT="$(free_port)"; PIDS=()
    for node in $(seq 0 $((NODES - 1))); do
      # Each agent a "node" of its own to NCCL; pg-nccl-gpu gives each of its ranks that share a GPU a host id
      # under the node's. Node 0 hosts the rendezvous store.
      NCCL_HOSTID="torchrun-node-$node" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}" \
        timeout "${TORCHRUN_TIMEOUT_S:-500}" torchrun --nnodes "$NODES" --node-rank "$node" --nproc-per-node "$PER_NODE" --rdzv-backend c10d \
        --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id "pg-rehearsal-$$" --rdzv-conf "is_host=$(( node == 0 ? 1 : 0 ))" \
        --no-python "$HERE/pg-nccl-gpu" rank --task conformance --out "$DIR" > "$OUT/torchrun-node$node.txt" 2>&1 & PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
    PG_RUN_LABEL="$(run_label "$TW"); launched by torchrun: $NODES agents (--nnodes $NODES --nproc-per-node $PER_NODE, c10d rendezvous on 127.0.0.1), each its own NCCL_HOSTID; command: TORCHRUN=1 run.sh" \
      "$HERE/pg-nccl-gpu" merge --task conformance --nproc "$TW" --out "$DIR" || rc=1
    for ext in md json; do
      if [ -f "$DIR/conformance.$ext" ]; then cp "$DIR/conformance.$ext" "$OUT/conformance-torchrun-$TW.$ext"; fi
    done
  else
    echo "no torchrun here: the torchrun rehearsal is skipped"; rc=1
  fi
fi

# ===== the fault matrix on NCCL =====
if [ "${FAULTS:-0}" = "1" ]; then
  for W in ${FAULT_WORLDS:-2 4}; do
    # The last rank is the faulty one; pg-xtask starts one process per rank, placed as the tasks' ranks are.
    "$HERE/pg-xtask" faults --backend nccl --world-size "$W" --json "$OUT/faults-rows-$W.json" --dumps "$OUT/faults-dumps-$W" \
      > "$OUT/faults-nccl-$W.txt" 2>&1 || rc=1
    LABEL="$(run_label "$W"); command: pg-xtask faults --backend nccl --world-size $W (FAULTS=1 run.sh)"
    { echo "# The fault matrix on NCCL, world $W"; echo; echo "$LABEL"; echo; echo '```text'; cat "$OUT/faults-nccl-$W.txt"; echo '```'
    } > "$OUT/faults-nccl-$W.md"
    python3 -c 'import json, sys
try: doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e: doc = {"backend": "nccl", "world_size": int(sys.argv[3]), "error": str(e), "rows": []}
doc["machine"] = sys.argv[2]
json.dump(doc, open(sys.argv[4], "w"), indent=1)' "$OUT/faults-rows-$W.json" "$LABEL" "$W" "$OUT/faults-nccl-$W.json" || rc=1
  done
fi
exit $rc

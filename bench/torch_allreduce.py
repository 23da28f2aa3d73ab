"""PyTorch's dist.all_reduce: the third contestant of pg's all_reduce benchmark.

Run with torchrun, one process per GPU, e.g.
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 bench/torch_allreduce.py --out DIR
Same procedure as the Rust contestants (crates/pg-lab/src/bin/pg-nccl-gpu/bench.rs): per size, per trial,
align the ranks, queue a spin so the host runs ahead, K in-place all_reduces (async_op=True, then wait()),
timing events around them on the current stream; host clocks around the call and the wait. Device time counts
only the trials in which the GPU was still spinning when the host had enqueued every op (else the events timed the
host: gpu_ahead false, time_us null when no trial was ahead). Host throughput: K ops back to back with no spin.
Medians.
--profile network: the sizes and ops per trial of ranks sharing a GPU over sockets (torch_profile.py), no graph rows.
Writes DIR/torch.json (rank 0, with every rank's numbers gathered).
With --first lazy|eager: one trial of the time to the first all_reduce instead (init_process_group without or
with device_id, then one all_reduce), appended to DIR/torch-first.jsonl; run it in fresh processes, once a trial.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch_placement import place
from torch_profile import PROFILES, all_reduce_sizes, ops_per_trial



def spin_cycles(ops, cycles_per_ms):
    """As the Rust side: 100 us per op, at least 5 ms, so the host enqueues every op before the GPU gets there."""
    return int(max(5.0, ops * 0.1) * cycles_per_ms)


def trial(t, tiny, ops, cycles_per_ms):
    dist.all_reduce(tiny)
    torch.cuda.current_stream().synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(spin_cycles(ops, cycles_per_ms))
    start.record()
    enqueue, wait = [], []
    for _ in range(ops):
        t0 = time.perf_counter_ns()
        work = dist.all_reduce(t, async_op=True)
        t1 = time.perf_counter_ns()
        work.wait()
        t2 = time.perf_counter_ns()
        enqueue.append((t1 - t0) / 1e3)
        wait.append((t2 - t1) / 1e3)
    # The event after the spin not yet passed: the GPU was still spinning when the host was done enqueuing.
    gpu_ahead = not start.query()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / ops, gpu_ahead, enqueue, wait


def throughput(t, tiny, ops):
    """ops back-to-back all_reduces (then wait()) with no spin ahead: ops per second of host time."""
    dist.all_reduce(tiny)
    torch.cuda.current_stream().synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        dist.all_reduce(t, async_op=True).wait()
    elapsed = (time.perf_counter_ns() - t0) / 1e9
    torch.cuda.synchronize()
    return ops / elapsed


def device_time(trials):
    """The median device time over the trials in which the GPU was ahead of the host; None if it never was."""
    ahead = [us for us, gpu_ahead in trials if gpu_ahead]
    return statistics.median(ahead) if ahead else None


GRAPH_MAX_BYTES = 1 << 20


def graph_rows(sizes, args, device, rank, world, tiny):
    """torch.cuda.graph around K dist.all_reduce calls (NCCL's graph support), replayed: per size a check (a graph
    of two all_reduces replayed twice gives world x the rank sum each time), then per trial a spin and one replay
    between timing events on the current stream (device time per op = elapsed / K, same GPU-ahead rule) and the
    host time of g.replay() (host cost per replayed op = replay / K). Warm-up on a side stream, as torch's docs
    say for capture."""
    rows = []
    side = torch.cuda.Stream()
    for size in [s for s in sizes if s <= GRAPH_MAX_BYTES]:
        numel = max(size // 4, 1)
        ops = ops_per_trial(args.profile, size)

        def captured(t, count):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    dist.all_reduce(t)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                for _ in range(count):
                    dist.all_reduce(t)
            return g

        check = torch.empty(numel, device=device)
        g = captured(check, 2)
        for replay in range(2):
            check.fill_(float(rank + 1))
            g.replay()
            torch.cuda.synchronize()
            want = world * (world + 1) / 2 * world
            assert torch.all(check == want).item(), f"graph replay {replay} wrong at {size} B"
        del g
        t = torch.zeros(numel, device=device)  # replaying sums of zeros stays finite
        g = captured(t, ops)
        t.zero_()
        g.replay()
        torch.cuda.synchronize()
        times, ahead, launch = [], [], []
        for _ in range(args.trials):
            dist.all_reduce(tiny)
            torch.cuda.current_stream().synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(spin_cycles(ops, args.cycles_per_ms))
            start.record()
            t0 = time.perf_counter_ns()
            g.replay()
            launch.append((time.perf_counter_ns() - t0) / 1e3)
            ahead.append(not start.query())
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / ops)
        replay_us = statistics.median(launch)
        rows.append({
            "contestant": "torch-graph",
            "bytes": size,
            "ops_per_trial": ops,
            "trials": args.trials,
            "time_us": device_time(list(zip(times, ahead))),
            "host_enqueue_us": replay_us / ops,
            "graph_launch_us": replay_us,
            "wait_us": None,
            "device_us_trials": times,
            "gpu_ahead_trials": ahead,
            "gpu_ahead": all(ahead),
            "host_ops_per_s": ops / (replay_us * 1e-6),
        })
        del g
    return rows


def first_collective(args):
    """One trial of the time to the first all_reduce in this fresh process: from before init_process_group (the
    TCPStore and the CUDA context made first, as the Rust side has them) to the op's completion on the device.
    Rank 0 appends the slowest rank's time to DIR/torch-first.jsonl."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = place()
    tiny = torch.ones(1, device=device)
    torch.cuda.synchronize()
    # Under torchrun the agent may already host the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE).
    host_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, host_store)
    store = dist.PrefixStore("bench-first", store)
    # A store barrier: every rank's clock starts when the last one is ready.
    if store.add("first/arrived", 1) == world:
        store.set("first/go", "1")
    store.wait(["first/go"])
    t0 = time.perf_counter()
    if args.first == "eager":
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    else:
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world)
    dist.all_reduce(tiny)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    assert tiny.item() == world, f"first all_reduce gave {tiny.item()}"
    gathered = [None] * world
    dist.all_gather_object(gathered, ms)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "torch-first.jsonl"), "a") as f:
            f.write(json.dumps({"mode": args.first, "first_collective_ms": max(gathered), "ranks_ms": gathered}) + "\n")
        print(f"torch first all_reduce ({args.first}): {max(gathered):.1f} ms")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cycles-per-ms", type=int, default=1_980_000, help="SM clock (H200: 1.98 GHz)")
    parser.add_argument("--first", choices=["lazy", "eager"],
                        help="instead of the bench: one trial of the time to the first all_reduce")
    parser.add_argument("--profile", choices=PROFILES, default="nvlink",
                        help="sizes and ops per trial (torch_profile.py); network: no CUDA-graph rows")
    args = parser.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "NCCL_NVLS_ENABLE=0 must be set"
    if args.first:
        first_collective(args)
        return
    device = place()
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    tiny = torch.ones(1, device=device)
    dist.all_reduce(tiny)
    rows = []
    for size in all_reduce_sizes(args.profile, args.max_bytes):
        numel = max(size // 4, 1)
        ops = ops_per_trial(args.profile, size)
        t = torch.full((numel,), float(rank + 1), device=device)
        dist.all_reduce(t)
        want = world * (world + 1) / 2
        assert torch.all(t == want).item(), f"wrong sum at {size} B"
        trial(t, tiny, min(ops, 20), args.cycles_per_ms)  # warm-up
        times, ahead, enq, wt = [], [], [], []
        for _ in range(args.trials):
            t = torch.ones(numel, device=device)
            d, a, e, w = trial(t, tiny, ops, args.cycles_per_ms)
            times.append(d)
            ahead.append(a)
            enq += e
            wt += w
        rows.append({
            "contestant": "torch",
            "bytes": size,
            "ops_per_trial": ops,
            "trials": args.trials,
            "time_us": device_time(list(zip(times, ahead))),
            "host_enqueue_us": statistics.median(enq),
            "wait_us": statistics.median(wt),
            "device_us_trials": times,
            "gpu_ahead_trials": ahead,
            "gpu_ahead": all(ahead),
            "host_ops_per_s": throughput(t, tiny, ops),
        })
    sizes = all_reduce_sizes(args.profile, args.max_bytes)
    try:
        graphs = graph_rows(sizes, args, device, rank, world, tiny) if args.profile == "nvlink" else []
        graph_error = None
    except Exception as error:  # keep the eager rows when capture fails; say why
        graphs, graph_error = [], f"{type(error).__name__}: {error}"
        print(f"torch graph contestant failed: {graph_error}")
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    gathered_graphs = [None] * world
    dist.all_gather_object(gathered_graphs, graphs)
    if rank == 0:
        merged = []
        for index, row in enumerate(rows):
            # A rank with no device time (it never had the GPU ahead) makes the row host-bound.
            times = [r[index]["time_us"] for r in gathered]
            slowest = None if None in times else max(times)
            algbw = row["bytes"] / (slowest * 1e-6) / 1e9 if slowest else None
            merged.append(dict(row,
                               time_us=slowest,
                               algbw_gbps=algbw,
                               busbw_gbps=algbw * 2 * (world - 1) / world if algbw else None,
                               host_enqueue_us=max(r[index]["host_enqueue_us"] for r in gathered),
                               wait_us=max(r[index]["wait_us"] for r in gathered),
                               gpu_ahead=all(r[index]["gpu_ahead"] for r in gathered),
                               host_ops_per_s=min(r[index]["host_ops_per_s"] for r in gathered)))
        merged_graphs = []
        for index, row in enumerate(graphs if all(len(g) == len(graphs) for g in gathered_graphs) else []):
            times = [g[index]["time_us"] for g in gathered_graphs]
            merged_graphs.append(dict(row,
                                      time_us=None if None in times else max(times),
                                      host_enqueue_us=max(g[index]["host_enqueue_us"] for g in gathered_graphs),
                                      graph_launch_us=max(g[index]["graph_launch_us"] for g in gathered_graphs),
                                      gpu_ahead=all(g[index]["gpu_ahead"] for g in gathered_graphs),
                                      host_ops_per_s=min(g[index]["host_ops_per_s"] for g in gathered_graphs)))
        versions = {
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "device": torch.cuda.get_device_name(device),
            "cuda": torch.version.cuda,
        }
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "torch.json"), "w") as f:
            json.dump({"task": "bench-torch", "profile": args.profile, "world_size": world, "versions": versions, "rows": merged,
                       "ranks": gathered, "graph_rows": merged_graphs, "graph_ranks": gathered_graphs,
                       "graph_error": graph_error}, f, indent=2)
        print(f"torch all_reduce: {len(merged)} sizes written to {args.out}/torch.json")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

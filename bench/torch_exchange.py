"""PyTorch's dist.all_to_all_single and dist.batch_isend_irecv: the third contestant of pg's all-to-all and
point-to-point benchmarks.

Run with torchrun, one process per GPU, e.g.
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 bench/torch_exchange.py --op all-to-all --out DIR
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 bench/torch_exchange.py --op p2p --out DIR
Same procedure as the Rust contestants (crates/pg-lab/src/bin/pg-nccl-gpu/bench_exchange.rs): per size, per
trial, align the ranks, queue a spin so the host runs ahead, K ops (async_op=True, then wait()), timing events
around them on the current stream; host clocks around the call and the wait. Medians. Sizes are the bytes each
rank sends per op, 1 KiB to --max-bytes (--profile network: 64 KiB to 16 MiB, torch_profile.py). Writes DIR/torch-<op>.json (rank 0, with every rank's numbers).

all-to-all: dist.all_to_all_single, equal splits (no split lists) and skewed splits (split lists), f32.

skewed splits: with n ranks and E f32 elements per rank, rank a gives rank b the weight
w(a,b) = (a + b) % n + 1, except w(0, n-1) = 0 when n >= 2 (rank 0 sends the last rank a zero-length chunk);
rank a sends rank b floor(E * w(a,b) / sum_c w(a,c)) elements, and what the floors leave over goes to rank
a's chunk for itself. Equal splits: E rounded down to a multiple of n, E / n elements to every rank.

p2p: each rank dist.batch_isend_irecv's a send to rank + 1 and a receive from rank - 1 (a ring), f32. At world
size 1 there is no ring: the script writes that it is not applicable and exits 0.
"""

import argparse
import json
import os
import statistics
import time

from torch_profile import PROFILES, exchange_sizes, ops_per_trial

RING_NOT_APPLICABLE = "not applicable at world size 1: a ring needs two ranks"
# The element count whose skewed splits the merge compares with the Rust contestants'.
SPLITS_CHECK_NUMEL = 262_147


def weight(world, a, b):
    if world >= 2 and a == 0 and b == world - 1:
        return 0
    return (a + b) % world + 1


def elements(split, size, world):
    numel = size // 4
    return numel // world * world if split == "equal" else numel


def chunk(split, numel, world, a, b):
    """Elements rank a sends rank b when every rank's input holds numel elements."""
    if split == "equal":
        return numel // world
    total = sum(weight(world, a, c) for c in range(world))

    def share(c):
        return numel * weight(world, a, c) // total

    if a == b:
        return numel - sum(share(c) for c in range(world) if c != a)
    return share(b)


def input_splits(split, numel, world, rank):
    return [chunk(split, numel, world, rank, b) for b in range(world)]


def output_splits(split, numel, world, rank):
    return [chunk(split, numel, world, a, rank) for a in range(world)]


def chunk_value(world, a, b):
    return float(a * world + b + 1)


def spin_cycles(ops, cycles_per_ms):
    """As the Rust side: 100 us per op, at least 5 ms, so the host enqueues every op before the GPU gets there."""
    return int(max(5.0, ops * 0.1) * cycles_per_ms)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=["all-to-all", "p2p"], required=True)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cycles-per-ms", type=int, default=1_980_000, help="SM clock (H200: 1.98 GHz)")
    parser.add_argument("--profile", choices=PROFILES, default="nvlink",
                        help="sizes and ops per trial (torch_profile.py): network for ranks sharing a GPU over sockets")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "NCCL_NVLS_ENABLE=0 must be set"
    from torch_placement import place

    device = place()
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    versions = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "device": torch.cuda.get_device_name(device),
        "cuda": torch.version.cuda,
    }
    out_path = os.path.join(args.out, f"torch-{args.op}.json")
    result = {"task": f"bench-torch-{args.op}", "op": args.op, "world_size": world, "versions": versions,
              "profile": args.profile}
    if args.op == "all-to-all":
        result["skewed_splits_check"] = {
            "numel": SPLITS_CHECK_NUMEL,
            "input_splits": [input_splits("skewed", SPLITS_CHECK_NUMEL, world, r) for r in range(world)],
        }
    if args.op == "p2p" and world < 2:
        if rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(out_path, "w") as f:
                json.dump(dict(result, rows=[], not_applicable=RING_NOT_APPLICABLE), f, indent=2)
            print(f"torch p2p: {RING_NOT_APPLICABLE}; written to {out_path}")
        dist.destroy_process_group()
        return

    tiny = torch.ones(1, device=device)
    dist.all_reduce(tiny)

    def make_case(split, size):
        """(enqueue, check, bytes sent per op) of one exchange at one size."""
        if args.op == "all-to-all":
            numel = elements(split, size, world)
            ins = input_splits(split, numel, world, rank)
            outs = output_splits(split, numel, world, rank)
            inp = torch.cat([torch.full((c,), chunk_value(world, rank, b), device=device) for b, c in enumerate(ins)])
            out = torch.full((sum(outs),), -1.0, device=device)
            lists = (None, None) if split == "equal" else (outs, ins)

            def enqueue():
                return [dist.all_to_all_single(out, inp, lists[0], lists[1], async_op=True)]

            def check():
                for a, part in enumerate(torch.split(out, outs)):
                    want = chunk_value(world, a, rank)
                    assert torch.all(part == want).item(), f"all-to-all {split} {size} B: chunk from {a} is wrong"
                out.fill_(-1.0)

            return enqueue, check, numel * 4
        numel = size // 4
        nxt, prv = (rank + 1) % world, (rank + world - 1) % world
        send = torch.full((numel,), chunk_value(world, rank, nxt), device=device)
        recv = torch.full((numel,), -1.0, device=device)

        def enqueue():
            return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)])

        def check():
            assert torch.all(recv == chunk_value(world, prv, rank)).item(), f"p2p {size} B: wrong message"
            recv.fill_(-1.0)

        return enqueue, check, numel * 4

    def trial(enqueue, ops):
        dist.all_reduce(tiny)
        torch.cuda.current_stream().synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin_cycles(ops, args.cycles_per_ms))
        start.record()
        enq, wt = [], []
        for _ in range(ops):
            t0 = time.perf_counter_ns()
            works = enqueue()
            t1 = time.perf_counter_ns()
            for work in works:
                work.wait()
            t2 = time.perf_counter_ns()
            enq.append((t1 - t0) / 1e3)
            wt.append((t2 - t1) / 1e3)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / ops, enq, wt

    rows = []
    splits = ["equal", "skewed"] if args.op == "all-to-all" else [None]
    for size in exchange_sizes(args.profile, args.max_bytes):
        for split in splits:
            enqueue, check, nbytes = make_case(split, size)
            for work in enqueue():
                work.wait()
            check()
            ops = ops_per_trial(args.profile, nbytes)
            trial(enqueue, min(ops, 20))  # warm-up
            times, enq, wt = [], [], []
            for _ in range(args.trials):
                d, e, w = trial(enqueue, ops)
                times.append(d)
                enq += e
                wt += w
            row = {
                "contestant": "torch",
                "bytes": nbytes,
                "ops_per_trial": ops,
                "trials": args.trials,
                "time_us": statistics.median(times),
                "host_enqueue_us": statistics.median(enq),
                "wait_us": statistics.median(wt),
                "device_us_trials": times,
            }
            if split is not None:
                row["split"] = split
            rows.append(row)
            del enqueue, check
            torch.cuda.empty_cache()
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        merged = []
        for index, row in enumerate(rows):
            slowest = max(r[index]["time_us"] for r in gathered)
            algbw = row["bytes"] / (slowest * 1e-6) / 1e9
            busbw = algbw * (world - 1) / world if args.op == "all-to-all" else algbw
            merged.append(dict(row,
                               time_us=slowest,
                               algbw_gbps=algbw,
                               busbw_gbps=busbw,
                               host_enqueue_us=max(r[index]["host_enqueue_us"] for r in gathered),
                               wait_us=max(r[index]["wait_us"] for r in gathered)))
        os.makedirs(args.out, exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(dict(result, rows=merged, ranks=gathered), f, indent=2)
        print(f"torch {args.op}: {len(merged)} rows written to {out_path}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

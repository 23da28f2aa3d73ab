"""The PyTorch ranks of a mixed group: pg's `pg-nccl-gpu mixed` holds one rank of PyTorch's default NCCL group
(joined with the README's "Join a PyTorch job" code), this script every other rank.

Every rank runs OPS in order and checks each result on its side, as pg's rank does
(crates/pg-lab/src/bin/pg-nccl-gpu/mixed.rs, whose constants these are): broadcasts of 64 MiB and 1 GiB
(PG_MIXED_LARGE_BYTES replaces the 1 GiB) from the lowest PyTorch rank (the source), an all_reduce of 4 MiB (sum of
rank + 1), an all_gather_into_tensor of 4 MiB per rank (chunk r == r + 1), a 4 MiB send from pg's rank to the
source and one back, a barrier. Writes OUT/mixed-rank{rank}.json:
{"side": "torch", "rank", "world_size", "pg_rank", "passed", "checks": [{"op", "result", "detail", "seconds"}]}.

One process per rank with torchrun's variables (ranks beyond the GPUs share them, torch_placement.py), e.g.
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 NCCL_NVLS_ENABLE=0 \\
        python3 torch_mixed.py --pg-rank 0 --out DIR
"""

import argparse
import datetime
import json
import os
import time

OPS = [
    "broadcast_64MiB_from_torch",
    "broadcast_1GiB_from_torch",
    "all_reduce",
    "all_gather",
    "send_pg_to_torch",
    "send_torch_to_pg",
    "barrier",
]
BROADCAST_SMALL = 64 << 20
COLLECTIVE = 4 << 20
MESSAGE = 4 << 20


def source(pg_rank):
    """The PyTorch rank that broadcasts and exchanges messages with pg's rank: the lowest that is not pg's."""
    return 1 if pg_rank == 0 else 0


def broadcast_value(op_index, src):
    return 100.0 * (op_index + 1) + src


def message_value(frm, to):
    return 1000.0 + 10.0 * frm + to


class WrongValue(Exception):
    """The op ran but a value is wrong: the sequence goes on."""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-rank", type=int, required=True, help="the rank pg's process holds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "NCCL_NVLS_ENABLE=0 must be set"

    import torch
    import torch.distributed as dist
    from torch_placement import place

    large = int(os.environ.get("PG_MIXED_LARGE_BYTES", 1 << 30))
    device = place()
    started = time.perf_counter()
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank != args.pg_rank, f"rank {rank} is pg's"
    src = source(args.pg_rank)

    def filled(nbytes, value):
        return torch.full((nbytes // 4,), float(value), dtype=torch.float32, device=device)

    def all_equal(t, want, what):
        wrong = (t != want).nonzero()
        if wrong.numel():
            i = int(wrong[0, 0])
            raise WrongValue(f"{what}: element {i} of {t.numel()} is {t[i].item()}, not {want}")
        return f"{t.numel()} elements == {want}"

    def run(index, op):
        if op.startswith("broadcast"):
            want = broadcast_value(index, src)
            t = filled(BROADCAST_SMALL if index == 0 else large, want if rank == src else -1.0)
            dist.broadcast(t, src)
            return all_equal(t, want, op)
        if op == "all_reduce":
            t = filled(COLLECTIVE, rank + 1)
            dist.all_reduce(t)
            return all_equal(t, world * (world + 1) / 2, op)
        if op == "all_gather":
            inp = filled(COLLECTIVE, rank + 1)
            out = torch.full((inp.numel() * world,), -1.0, dtype=torch.float32, device=device)
            dist.all_gather_into_tensor(out, inp)
            for r, chunk in enumerate(out.chunk(world)):
                all_equal(chunk, r + 1.0, f"chunk of rank {r}")
            return f"{world} chunks of {inp.numel()} elements, chunk r == r + 1"
        if op in ("send_pg_to_torch", "send_torch_to_pg"):
            frm, to = (args.pg_rank, src) if op == "send_pg_to_torch" else (src, args.pg_rank)
            if rank == frm:
                t = filled(MESSAGE, message_value(frm, to))
                dist.send(t, to)
                torch.cuda.synchronize()
                return f"sent {t.numel()} elements to rank {to}"
            if rank == to:
                t = filled(MESSAGE, -1.0)
                dist.recv(t, frm)
                return f"from rank {frm}: " + all_equal(t, message_value(frm, to), op)
            return f"not a party (rank {frm} to rank {to})"
        if op == "barrier":
            dist.barrier(device_ids=[device.index])
            return "passed"
        raise ValueError(f"no op {op}")

    checks = []
    for index, op in enumerate(OPS):
        t0 = time.perf_counter()
        ended = False
        try:
            detail = run(index, op)
            torch.cuda.synchronize()
            result = "pass"
        except WrongValue as wrong:
            result, detail = "fail", str(wrong)
        except Exception as error:  # the op itself failed: the ranks no longer agree on what comes next
            result, detail, ended = "fail", f"{type(error).__name__}: {error}", True
        checks.append({"op": op, "result": result, "detail": detail, "seconds": time.perf_counter() - t0})
        print(f"torch rank {rank}: {op} {result} ({detail})", flush=True)
        if ended:
            break
    passed = len(checks) == len(OPS) and all(c["result"] == "pass" for c in checks)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"mixed-rank{rank}.json"), "w") as f:
        json.dump({"side": "torch", "rank": rank, "world_size": world, "pg_rank": args.pg_rank, "passed": passed,
                   "checks": checks, "seconds": time.perf_counter() - started,
                   "versions": {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}},
                  f, indent=1)
    if passed:
        dist.destroy_process_group()
    raise SystemExit(0 if passed else 1)


if __name__ == "__main__":
    main()

"""PyTorch's side of the lost-rank run (`cargo xtask recovery --backend nccl` is pg's): N ranks all-reduce 64 MiB in a
loop; the last rank SIGKILLs itself during its sixth op; each survivor measures from the kill to the error reaching it
(detection), then to the first correct all_reduce of a group of the survivors (recovery), with the installed version's
best path: `torch.distributed.shrink_group` where it exists, else `destroy_process_group` and `init_process_group` of
the survivors on a fresh store.

The ranks are started by this script, not torchrun: torchrun's agent tears the whole job down when one worker dies.

    python3 torch_recovery.py --world 4 --out DIR            # writes DIR/recovery-torch.json
    python3 torch_recovery.py --report --out DIR --world 4   # joins DIR/recovery-pg.json and it into recovery-nccl-N
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

NUMEL = 16 << 20  # 64 MiB of float32
KILL_AT = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, out):
    port, second = free_port(), free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RECOVERY_PORT=str(second),
                   # No handling: the watchdog neither aborts the failed communicator (shrink_group needs it) nor
                   # ends the process; the error is raised by the wait, and the recovery path deals with it.
                   TORCH_NCCL_ASYNC_ERROR_HANDLING="0")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--out", out], env=env))
    # A rank stuck in PyTorch's recovery (a hung abort or a rendezvous a peer never reaches) is killed and reported.
    deadline = time.time() + 200
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("killed after 200 s")
    rows = []
    for rank in range(world - 1):
        path = os.path.join(out, f"recovery-torch-rank{rank}.json")
        try:
            with open(path) as f:
                rows.append(json.load(f))
        except OSError as e:
            rows.append({"rank": rank, "failure": f"no row: {e} (exit code {codes[rank]})"})
    import torch
    doc = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "world_size": world,
           "exit_codes": codes, "rows": rows}
    with open(os.path.join(out, "recovery-torch.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))


def worker(out):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_placement import place

    device = place()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    victim = world - 1
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=2))
    store = dist.distributed_c10d._get_default_store()
    buffer = torch.empty(NUMEL, dtype=torch.float32, device=device)
    error = None
    for op in range(KILL_AT + 20):
        buffer.fill_(rank + 1)
        if rank == victim and op == KILL_AT:
            dist.all_reduce(buffer, async_op=True)
            store.set("killed_at", str(time.time() * 1e3))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(buffer, async_op=True).wait(timeout=timedelta(seconds=10))
            torch.cuda.current_stream().synchronize()
        except Exception as e:  # the dead peer's error, however this version raises it
            error = f"{type(e).__name__}: {e}"[:300]
            break
    detected = time.time() * 1e3
    survivors = [r for r in range(world) if r != victim]
    new_rank = survivors.index(rank)
    killed_at = float(store.get("killed_at"))
    group = None
    path = "destroy_process_group + init_process_group"
    if hasattr(dist, "shrink_group"):
        # The excluded rank is dead: NCCL_SHRINK_ABORT, where this version names it.
        flags = getattr(dist, "SHRINK_ABORT", getattr(dist.distributed_c10d, "SHRINK_ABORT", None))
        try:
            kwargs = {} if flags is None else {"shrink_flags": flags}
            group = dist.shrink_group([victim], **kwargs)
            path = "shrink_group" + (" (SHRINK_ABORT)" if flags is not None else "")
        except Exception as e:  # then the fallback, timed from the same start
            path = f"shrink_group failed ({type(e).__name__}: {str(e)[:120]}), then destroy + init"
            group = None
    if group is None:
        try:
            dist.destroy_process_group()
        except Exception as e:
            error = f"{error}; destroy: {type(e).__name__}: {e}"[:400]
        new_store = dist.TCPStore("127.0.0.1", int(os.environ["RECOVERY_PORT"]), len(survivors), new_rank == 0,
                                  timeout=timedelta(seconds=60))
        dist.init_process_group("nccl", store=new_store, rank=new_rank, world_size=len(survivors), device_id=device)
    buffer.fill_(rank + 1)
    dist.all_reduce(buffer, group=group)
    torch.cuda.synchronize()
    ready = time.time() * 1e3
    want = float(sum(r + 1 for r in survivors))
    correct = bool(torch.all(buffer == want).item())
    row = {"rank": rank, "new_rank": new_rank, "survivors": survivors, "path": path, "error": error,
           "detect_ms": detected - killed_at, "recover_ms": ready - detected, "correct": correct}
    with open(os.path.join(out, f"recovery-torch-rank{rank}.json"), "w") as f:
        json.dump(row, f)
    dist.destroy_process_group()


def report(out, world):
    def load(name):
        try:
            with open(os.path.join(out, name)) as f:
                return json.load(f)
        except OSError:
            return None

    pg, torch = load("recovery-pg.json"), load("recovery-torch.json")

    def median(rows, key):
        values = sorted(r[key] for r in rows or [] if key in r)
        return values[len(values) // 2] if values else None

    label = os.environ.get("PG_RUN_LABEL", "machine not given (set PG_RUN_LABEL)")
    lines = [f"# A lost rank survived: pg and PyTorch on NCCL, world {world}", "", label, "",
             "The last rank SIGKILLed during its sixth 64 MiB all_reduce; ms of wall-clock time, medians over the survivors.",
             "", "| | detect | recover | total | every survivor correct | path |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for name, doc, path in [("pg", pg, "revoke, agree_survivors, shrink (ncclCommShrink)"),
                            ("PyTorch", torch, (torch or {}).get("rows", [{}])[0].get("path", "-") if torch else "-")]:
        rows = (doc or {}).get("rows", [])
        d, r = median(rows, "detect_ms"), median(rows, "recover_ms")
        total = d + r if d is not None and r is not None else None
        ok = bool(rows) and all(x.get("correct") for x in rows) and len(rows) == world - 1
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        lines.append(f"| {name} | {fmt(d)} | {fmt(r)} | {fmt(total)} | {ok} | {path} |")
    failures = [f"pg: {f}" for f in (pg or {}).get("failures", [])]
    failures += [f"PyTorch rank {r.get('rank')}: {r['failure']}" for r in (torch or {}).get("rows", []) if "failure" in r]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {f}" for f in failures]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, f"recovery-nccl-{world}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, f"recovery-nccl-{world}.json"), "w") as f:
        json.dump({"machine": label, "world_size": world, "pg": pg, "torch": torch}, f, indent=1)
    print(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", default=".")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.out)
    elif args.report:
        report(args.out, args.world)
    else:
        launch(args.world, args.out)

"""PyTorch's side of the lost-rank run (`cargo xtask recovery --backend nccl` is pg's): N ranks all-reduce 64 MiB in a
loop; the last rank SIGKILLs itself during its sixth op; each survivor measures from the kill to the error reaching it
(detection), then to the first correct all_reduce of a group of the survivors (recovery), by one of two paths:

- `documented`: `torch.distributed.shrink_group` where the installed version has it, else `destroy_process_group` and
  `init_process_group` of the survivors on a fresh store (what PyTorch's documentation leads to);
- `best`: the way torchft rebuilds: no `destroy_process_group`; the failed group is aborted on a thread of its own (or
  left alone where it cannot be), and the survivors build a new `ProcessGroupNCCL` at once on a `PrefixStore` of the
  store they already share (no new rendezvous, no new store).

The ranks are started by this script, not torchrun: torchrun's agent tears the whole job down when one worker dies.
A path's ranks get `--limit-s` seconds (default 200, `TORCH_RECOVERY_LIMIT_S` in run.sh): a survivor still recovering
then is killed, and its row keeps its detection and reports the recovery as longer than the limit.

    python3 torch_recovery.py --world 4 --out DIR                    # both paths: DIR/recovery-torch-{best,documented}.json
    python3 torch_recovery.py --world 4 --out DIR --path best        # one path
    python3 torch_recovery.py --report --out DIR --world 4           # joins them with DIR/recovery-pg.json (and
                                                                     # recovery-pg-liveness.json) into recovery-nccl-N
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

NUMEL = 16 << 20  # 64 MiB of float32
KILL_AT = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PATHS = ("best", "documented")
PATH_NAMES = {"best": "new ProcessGroupNCCL on a PrefixStore of the job's store, no destroy",
              "documented": "shrink_group, else destroy_process_group + init_process_group"}


def launch(world, out, path, limit_s):
    port, second = free_port(), free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RECOVERY_PORT=str(second),
                   # No handling: the watchdog neither aborts the failed communicator (shrink_group needs it) nor
                   # ends the process; the error is raised by the wait, and the recovery path deals with it.
                   TORCH_NCCL_ASYNC_ERROR_HANDLING="0")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--out", out, "--path", path], env=env))
    # A rank stuck in PyTorch's recovery (a hung abort or a rendezvous a peer never reaches) is killed and reported.
    started = time.time()
    deadline = started + limit_s
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(f"killed after {limit_s:g} s")
    rows = []
    for rank in range(world - 1):
        row_path = os.path.join(out, f"recovery-torch-{path}-rank{rank}.json")
        try:
            with open(row_path) as f:
                row = json.load(f)
        except OSError as e:
            rows.append({"rank": rank, "failure": f"no row: {e} (exit code {codes[rank]})"})
            continue
        if row.get("unfinished"):
            # Killed at the limit while recovering: the recovery took longer than the rest of the limit.
            row.pop("unfinished")
            row["recover_more_than_ms"] = (deadline - row.pop("detected_at_ms") / 1e3) * 1e3
            row["path"] = f"{row['path']}: still recovering when stopped at the {limit_s:g} s limit"
        rows.append(row)
    import torch
    doc = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "world_size": world,
           "path": path, "exit_codes": codes, "rows": rows}
    with open(os.path.join(out, f"recovery-torch-{path}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))


def abort_on_a_thread(group, device):
    """Aborts the failed group's communicators on a thread of its own (an abort may block on a dead peer's
    connections); returns what it could do, for the row."""

    def abort():
        try:
            backend = group._get_backend(device)
        except Exception:
            backend = group
        try:
            backend.abort()
        except Exception:
            pass

    if not (hasattr(group, "_get_backend") or hasattr(group, "abort")):
        return "failed group left alone"
    threading.Thread(target=abort, daemon=True, name="abort-failed-group").start()
    return "failed group aborted on another thread"


def best_path(store, device, new_rank, survivors):
    """The survivors' new group, made the way torchft makes one: a `ProcessGroupNCCL` built directly on a
    `PrefixStore` of the store the job already shares, its communicator created at once (eager) on this device."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import ProcessGroupNCCL

    prefix = dist.PrefixStore("recovery/survivors.0", store)
    options = ProcessGroupNCCL.Options()
    if hasattr(options, "_timeout"):
        options._timeout = timedelta(seconds=60)
    group = ProcessGroupNCCL(prefix, new_rank, len(survivors), options)
    if hasattr(group, "eager_connect_single_device"):
        group.eager_connect_single_device(device)
    return group


def wait_polling():
    """Blocks until the current stream has run everything enqueued on it, polling every millisecond as pg's blocking
    wait does (a spinning `synchronize()` on every survivor takes the cores NCCL's proxy threads move data with)."""
    import torch

    stream = torch.cuda.current_stream()
    while not stream.query():
        time.sleep(0.001)


def worker(out, path_kind):
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
    # The best path's buffer: the failed group's op may still run on `buffer` until its abort ends it.
    spare = torch.empty_like(buffer)
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
    # The row so far: what the launcher reports if this rank is still recovering at its limit.
    with open(os.path.join(out, f"recovery-torch-{path_kind}-rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "new_rank": new_rank, "survivors": survivors, "error": error, "unfinished": True,
                   "path": PATH_NAMES[path_kind], "detect_ms": detected - killed_at, "detected_at_ms": detected}, f)
    group = None
    path = "destroy_process_group + init_process_group"
    if path_kind == "best":
        failed = dist.group.WORLD
        left = abort_on_a_thread(failed, device)
        new_group = best_path(store, device, new_rank, survivors)
        path = f"new ProcessGroupNCCL on a PrefixStore of the job's store, no destroy; {left}"
        spare.fill_(rank + 1)
        new_group.allreduce([spare]).wait()
        wait_polling()
        ready = time.time() * 1e3
        finish(out, path_kind, rank, new_rank, survivors, path, error, detected, killed_at, ready, spare)
        # The failed group is never destroyed (its destructor may wait on the dead peer): the process ends here.
        sys.stdout.flush()
        os._exit(0)
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
    wait_polling()
    ready = time.time() * 1e3
    finish(out, path_kind, rank, new_rank, survivors, path, error, detected, killed_at, ready, buffer)
    dist.destroy_process_group()


def finish(out, path_kind, rank, new_rank, survivors, path, error, detected, killed_at, ready, buffer):
    """Checks the survivors' sum and writes this rank's row."""
    import torch

    want = float(sum(r + 1 for r in survivors))
    correct = bool(torch.all(buffer == want).item())
    row = {"rank": rank, "new_rank": new_rank, "survivors": survivors, "path": path, "error": error,
           "detect_ms": detected - killed_at, "recover_ms": ready - detected, "correct": correct}
    with open(os.path.join(out, f"recovery-torch-{path_kind}-rank{rank}.json"), "w") as f:
        json.dump(row, f)


def report(out, world):
    def load(name):
        try:
            with open(os.path.join(out, name)) as f:
                return json.load(f)
        except OSError:
            return None

    pg, pg_live = load("recovery-pg.json"), load("recovery-pg-liveness.json")
    best = load("recovery-torch-best.json")
    documented = load("recovery-torch-documented.json") or load("recovery-torch.json")

    def median(rows, key):
        values = sorted(r[key] for r in rows or [] if key in r)
        return values[len(values) // 2] if values else None

    def totals(doc):
        rows = (doc or {}).get("rows", [])
        d, r = median(rows, "detect_ms"), median(rows, "recover_ms")
        return d, r, (d + r if d is not None and r is not None else None), rows

    def at_least(rows):
        """The recovery's lower bound where a survivor was stopped at the limit (the smallest such bound)."""
        bounds = [r["recover_more_than_ms"] for r in rows if "recover_more_than_ms" in r]
        return min(bounds) if bounds else None

    def first_path(doc):
        rows = (doc or {}).get("rows") or [{}]
        return rows[0].get("path", "-")

    label = os.environ.get("PG_RUN_LABEL", "machine not given (set PG_RUN_LABEL)")
    lines = [f"# A lost rank survived: pg and PyTorch on NCCL, world {world}", "", label, "",
             "The last rank SIGKILLed during its sixth 64 MiB all_reduce; ms of wall-clock time, medians over the "
             "survivors. PyTorch's best path is the way torchft rebuilds (a new ProcessGroupNCCL on a PrefixStore of the "
             "job's store, no destroy_process_group); its documented path is shrink_group, else destroy + init.", "",
             "| | detect | recover | total | every survivor correct | path |", "| --- | ---: | ---: | ---: | --- | --- |"]
    contestants = [
        ("pg", pg, "revoke, agree_survivors, shrink"),
        ("pg, liveness", pg_live, "liveness from the store, revoke, agree_survivors, shrink"),
        ("PyTorch, best path", best, first_path(best)),
        ("PyTorch, documented path", documented, first_path(documented)),
    ]
    summary = {}
    for name, doc, path in contestants:
        if doc is None:
            continue
        d, r, total, rows = totals(doc)
        summary[name] = {"detect_ms": d, "recover_ms": r, "total_ms": total}
        ok = bool(rows) and all(x.get("correct") for x in rows) and len(rows) == world - 1
        fmt = lambda v: "-" if v is None else f"{v:,.1f}"
        recover, whole = fmt(r), fmt(total)
        bound = at_least(rows)
        if bound is not None:
            # Stopped at the limit: the medians are not known, only that they exceed the bound.
            summary[name].update({"recover_more_than_ms": bound,
                                  "total_more_than_ms": None if d is None else d + bound})
            recover, whole = f"> {bound:,.0f}", "-" if d is None else f"> {d + bound:,.0f}"
            ok = "stopped at the limit"
        lines.append(f"| {name} | {fmt(d)} | {recover} | {whole} | {ok} | {path} |")
    best_total = (summary.get("PyTorch, best path") or {}).get("total_ms")
    if best_total:
        ratios = [f"{name}: {s['total_ms'] / best_total:.2f}x" for name, s in summary.items()
                  if name.startswith("pg") and s["total_ms"] is not None]
        if ratios:
            lines += ["", "Total against PyTorch's best path: " + "; ".join(ratios) + "."]
    failures = [f"{name}: {f}" for name, doc in (("pg", pg), ("pg, liveness", pg_live)) for f in (doc or {}).get("failures", [])]
    failures += [f"PyTorch ({name}) rank {r.get('rank')}: {r['failure']}"
                 for name, doc in (("best", best), ("documented", documented)) for r in (doc or {}).get("rows", [])
                 if "failure" in r]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {f}" for f in failures]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, f"recovery-nccl-{world}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, f"recovery-nccl-{world}.json"), "w") as f:
        json.dump({"machine": label, "world_size": world, "summary": summary, "pg": pg, "pg_liveness": pg_live,
                   "torch_best": best, "torch_documented": documented}, f, indent=1)
    print(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", default=".")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--path", choices=PATHS + ("both",), default="both")
    parser.add_argument("--limit-s", type=float, default=200.0,
                        help="seconds a path's ranks get before a survivor still recovering is stopped")
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.path)
    elif args.report:
        report(args.out, args.world)
    else:
        for path in PATHS if args.path == "both" else (args.path,):
            launch(args.world, args.out, path, args.limit_s)

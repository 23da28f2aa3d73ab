"""PyTorch's ProcessGroupNCCL in the three experiments pg reproduces (`cargo xtask experiments`), for the side
by side table: the same groups, sizes, sleep and configurations, measured the same way.

Run with torchrun, e.g.
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 4 bench/torch_experiments.py --out DIR
    NCCL_NVLS_ENABLE=0 TORCH_NCCL_BLOCKING_WAIT=1 torchrun --nproc-per-node 4 bench/torch_experiments.py \
        --out DIR --blocking
(ranks beyond the GPUs share them, each its own NCCL host: torch_placement.py). Blocking wait is a process-wide
setting in PyTorch, so work_wait_blocking runs in a launch of its own (--blocking); every launch appends its
rank-0 JSON line to DIR/torch-experiments.jsonl.

- cache: the default group, a clone of it (new_group of every rank) and a high-priority clone
  (ProcessGroupNCCL.Options.is_high_priority_stream), three 1024-float all_reduces each. Communicator creations
  are NCCL's own "Init COMPLETE" lines in this rank's NCCL_DEBUG_FILE (PyTorch does not count them).
- semantics: a 40 ms sleep kernel (torch.cuda._sleep) on the current stream, then a 16 MiB all_reduce; host time
  of the action (nothing, Future.wait, Work.wait), is_completed() after it, Future.done() right after the
  enqueue, whether a fill on another stream finished before the op; every config `--cycles` times.
- streams: four all_reduces behind a sleep, profiled: the stream of every NCCL kernel against the current
  stream's (the sleep kernel's).
"""

import argparse
import glob
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch_placement import place

NUMEL_CACHE = 1024
MESSAGE_BYTES = 16 << 20


def init_count(log_dir):
    """NCCL's "Init COMPLETE" lines in this process's debug file so far: one per communicator created."""
    count = 0
    for path in glob.glob(os.path.join(log_dir, f"nccl-{os.getpid()}*")):
        with open(path, errors="replace") as f:
            count += sum(1 for line in f if "Init COMPLETE" in line)
    return count


def cache(device, rank, world, log_dir):
    rows = []
    default = dist.group.WORLD
    clone = dist.new_group(list(range(world)))
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    high = dist.new_group(list(range(world)), pg_options=options)
    for label, group, high_priority in [("world", default, False), ("standard clone", clone, False),
                                        ("high-priority clone", high, True)]:
        before = init_count(log_dir)
        correct = True
        after_first = 0
        for op in range(3):
            t = torch.full((NUMEL_CACHE,), float(rank + 1 + op), device=device)
            dist.all_reduce(t, group=group)
            correct &= bool((t == sum(r + 1 + op for r in range(world))).all().item())
            if op == 0:
                after_first = init_count(log_dir)
        total = init_count(log_dir)
        rows.append({"group": label, "high_priority": high_priority, "operations": 3, "creations": total - before,
                     "creations_after_first": total - after_first, "correct": correct})
    return rows


def cycles_for(ms, cycles_per_ms):
    return int(ms * cycles_per_ms)


def semantics(device, rank, world, blocking, cycles, sleep_cycles):
    configs = ["work_wait_blocking"] if blocking else ["no_wait_device_sync", "future_wait_nonblocking",
                                                       "work_wait_nonblocking"]
    buffer = torch.empty(MESSAGE_BYTES // 4, device=device)
    marker = torch.empty(1, device=device)
    free = torch.cuda.Stream(device)
    expected = float(sum(r + 1 for r in range(world)))
    dist.barrier()
    samples = []
    for cycle in range(cycles):
        for config in configs:
            dist.barrier()
            torch.cuda.synchronize()
            t = time.perf_counter()
            torch.cuda._sleep(sleep_cycles)
            torch.cuda.current_stream().synchronize()
            sleep_gpu = time.perf_counter() - t
            buffer.fill_(float(rank + 1))
            torch.cuda._sleep(sleep_cycles)
            work = dist.all_reduce(buffer, async_op=True)
            future = work.get_future()
            future_done = future.done()
            t = time.perf_counter()
            if config == "future_wait_nonblocking":
                future.wait()
            elif config != "no_wait_device_sync":
                work.wait()
            action = time.perf_counter() - t
            completed_after_action = work.is_completed()
            with torch.cuda.stream(free):
                marker.fill_(1.0)
            free.synchronize()
            free_first = not work.is_completed()
            t = time.perf_counter()
            torch.cuda.synchronize()
            device_sync = time.perf_counter() - t
            samples.append({"config": config, "cycle": cycle, "rank": rank, "sleep_gpu_us": sleep_gpu * 1e6,
                            "action_host_us": action * 1e6, "device_sync_host_us": device_sync * 1e6,
                            "completed_after_action": completed_after_action, "future_done_after_enqueue": future_done,
                            "free_stream_done_first": free_first,
                            "correct": bool((buffer == expected).all().item())})
    return samples


def streams(device, sleep_cycles):
    buffer = torch.ones(1024, device=device)
    dist.barrier()
    torch.cuda.synchronize()
    trace = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        torch.cuda._sleep(sleep_cycles)
        for _ in range(4):
            dist.all_reduce(buffer, async_op=True).wait()
        torch.cuda.synchronize()
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(trace)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    # torch.cuda._sleep's kernel is "spin_kernel" in PyTorch 2.x.
    is_sleep = lambda e: "sleep" in e["name"].lower() or "spin" in e["name"].lower()
    sleep_streams = {e["args"].get("stream") for e in kernels if is_sleep(e)}
    comm_streams = [e["args"].get("stream") for e in kernels if "nccl" in e["name"].lower()]
    current = next(iter(sleep_streams), None)
    return {"current_stream": current, "comm_streams": sorted(set(comm_streams)), "comm_kernels": len(comm_streams),
            "sleep_kernels": sum(1 for e in kernels if is_sleep(e)),
            "comm_kernels_on_current": sum(1 for s in comm_streams if s == current),
            "disjoint": current is not None and len(comm_streams) > 0 and current not in comm_streams}


def report(out):
    """Reads DIR/torch-experiments.jsonl (every launch) and writes DIR/experiments-torch.{md,json}: the same three
    tables as pg's experiments, summed or averaged over ranks."""
    launches = []
    with open(os.path.join(out, "torch-experiments.jsonl")) as f:
        launches = [json.loads(line) for line in f if line.strip()]
    ranks = [r for launch in launches for r in launch["ranks"]]
    world = max(launch["world_size"] for launch in launches)
    md = [f"PyTorch {ranks[0]['versions']['torch']} (NCCL {ranks[0]['versions']['nccl']}), world size {world}", ""]
    md += ["cache", "| group | high priority | rank operations | comm creations | created after first op | correct |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    cache_rows = {}
    for r in ranks:
        for row in r.get("cache", []):
            agg = cache_rows.setdefault(row["group"], {"high_priority": row["high_priority"], "operations": 0,
                                                       "creations": 0, "creations_after_first": 0, "correct": True})
            agg["operations"] += row["operations"]
            agg["creations"] += row["creations"]
            agg["creations_after_first"] += row["creations_after_first"]
            agg["correct"] &= row["correct"]
    for group, agg in cache_rows.items():
        md.append(f"| {group} | {int(agg['high_priority'])} | {agg['operations']} | {agg['creations']} | "
                  f"{agg['creations_after_first']} | {int(agg['correct'])} |")
    md += ["", "semantics (medians over ranks and cycles; fractions of samples)",
           "| config | samples | sleep GPU us | action host us | device sync host us | completed after action | "
           "future done (enq) | free stream first | correct |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    semantics_rows = {}
    order = ["no_wait_device_sync", "future_wait_nonblocking", "work_wait_blocking", "work_wait_nonblocking"]
    for r in ranks:
        for sample in r.get("semantics", []):
            semantics_rows.setdefault(sample["config"], []).append(sample)
    table = {}
    for config in order:
        samples = semantics_rows.get(config, [])
        if not samples:
            continue
        med = lambda k: sorted(s[k] for s in samples)[len(samples) // 2]
        frac = lambda k: sum(1 for s in samples if s[k]) / len(samples)
        table[config] = {"samples": len(samples), "sleep_gpu_us": med("sleep_gpu_us"),
                         "action_host_us": med("action_host_us"), "device_sync_host_us": med("device_sync_host_us"),
                         "completed_after_action": frac("completed_after_action"),
                         "future_done_after_enqueue": frac("future_done_after_enqueue"),
                         "free_stream_done_first": frac("free_stream_done_first"), "correct": frac("correct")}
        t = table[config]
        md.append(f"| {config} | {t['samples']} | {t['sleep_gpu_us']:.1f} | {t['action_host_us']:.1f} | "
                  f"{t['device_sync_host_us']:.1f} | {t['completed_after_action']:.2f} | "
                  f"{t['future_done_after_enqueue']:.2f} | {t['free_stream_done_first']:.2f} | {t['correct']:.2f} |")
    md += ["", "streams (profiler: the stream of each NCCL kernel against the sleep kernel's)",
           "| rank | comm kernels | sleep kernels | current stream | comm streams | disjoint |",
           "| ---: | ---: | ---: | ---: | --- | ---: |"]
    streams_rows = []
    for r in ranks:
        if "streams" in r:
            s = r["streams"]
            streams_rows.append({"rank": r["rank"], **s})
            md.append(f"| {r['rank']} | {s['comm_kernels']} | {s['sleep_kernels']} | {s['current_stream']} | "
                      f"{s['comm_streams']} | {int(s['disjoint'])} |")
    with open(os.path.join(out, "experiments-torch.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out, "experiments-torch.json"), "w") as f:
        json.dump({"world_size": world, "versions": ranks[0]["versions"], "cache": cache_rows, "semantics": table,
                   "streams": streams_rows}, f, indent=1)
    print("\n".join(md))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--blocking", action="store_true", help="run work_wait_blocking (TORCH_NCCL_BLOCKING_WAIT=1)")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=40.0)
    parser.add_argument("--cycles-per-ms", type=int, default=1_980_000, help="SM clock (H200: 1.98 GHz)")
    parser.add_argument("--report", action="store_true", help="only write DIR/experiments-torch.{md,json}")
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "NCCL_NVLS_ENABLE=0 must be set"
    if args.blocking:
        assert os.environ.get("TORCH_NCCL_BLOCKING_WAIT") == "1", "--blocking needs TORCH_NCCL_BLOCKING_WAIT=1"
    log_dir = tempfile.mkdtemp(prefix="torch-experiments-")
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT"
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(log_dir, "nccl-%p.log")
    device = place()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    sleep_cycles = cycles_for(args.sleep_ms, args.cycles_per_ms)
    result = {"rank": rank, "world_size": world, "blocking": args.blocking,
              "versions": {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}}
    if not args.blocking:
        result["cache"] = cache(device, rank, world, log_dir)
        result["streams"] = streams(device, sleep_cycles)
    result["semantics"] = semantics(device, rank, world, args.blocking, args.cycles, sleep_cycles)
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "torch-experiments.jsonl"), "a") as f:
            f.write(json.dumps({"world_size": world, "ranks": gathered}) + "\n")
        print(f"torch experiments ({'blocking' if args.blocking else 'non-blocking'} wait): {world} ranks done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

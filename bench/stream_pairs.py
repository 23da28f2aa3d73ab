"""What the two waits per op between a current stream and a communication stream cost the device, per pair of
streams: the pattern of pg's collective template, with a fixed ~5 us kernel standing in for the collective.

Per trial, on the current stream: a 25 ms spin (the host enqueues every op meanwhile), a timing event, then 200
times: an input-ready event recorded on the current stream and waited on by the communication stream, the kernel
on the communication stream, an end event recorded there and waited on by the current stream; a timing event.
Device time per op = elapsed / 200. Pairs: the legacy default stream with each of N new streams, and the first
new stream with each of the others; 'same' is the kernel alone on one stream (no waits). Rounds interleave every
pair; medians over rounds. One GPU, no NCCL: python3 bench/stream_pairs.py [--streams 40] [--rounds 4] [--out F]
"""

import argparse
import json
import statistics

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cycles-per-ms", type=int, default=1_980_000, help="SM clock (H200: 1.98 GHz)")
    parser.add_argument("--out")
    args = parser.parse_args()
    cpm = args.cycles_per_ms
    torch.cuda.set_device(0)
    legacy = torch.cuda.default_stream()
    streams = [torch.cuda.Stream() for _ in range(args.streams)]
    kernel = int(5e-3 * cpm)
    input_ready = [torch.cuda.Event() for _ in range(4)]
    ends = [torch.cuda.Event() for _ in range(200)]
    for event in input_ready + ends:
        event.record(streams[0])
    torch.cuda.synchronize()
    host_bound = 0

    def trial(current, comm, ops=200):
        nonlocal host_bound
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(current):
            torch.cuda._sleep(25 * cpm)
            start.record(current)
            for i in range(ops):
                if comm is current:
                    torch.cuda._sleep(kernel)
                    continue
                ready = input_ready[i % 4]
                ready.record(current)
                comm.wait_event(ready)
                with torch.cuda.stream(comm):
                    torch.cuda._sleep(kernel)
                ends[i].record(comm)
                current.wait_event(ends[i])
            host_bound += start.query()
            end.record(current)
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / ops

    same, with_legacy, with_first = [], [[] for _ in streams], [[] for _ in streams]
    for _ in range(args.rounds):
        same.append(trial(streams[0], streams[0]))
        for i, stream in enumerate(streams):
            with_legacy[i].append(trial(legacy, stream))
        for i, stream in enumerate(streams[1:], 1):
            with_first[i].append(trial(streams[0], stream))
    med = lambda values: round(statistics.median(values), 2) if values else None
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "us_per_op_same_stream": med(same),
        "us_per_op_legacy_with_stream_i": [med(v) for v in with_legacy],
        "us_per_op_stream_0_with_stream_i": [med(v) for v in with_first],
        "trials_host_bound": host_bound,
    }
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

"""PyTorch DDP for the model, data and steps of pg's training example (crates/pg-nccl/examples/ddp_mlp): the
step-time comparison, and the same loss curve to float tolerance.

Run with torchrun, one process per GPU, e.g.
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 1 bench/torch_ddp_mlp.py --steps 100 --json torch-train.json
A 2-layer MLP (64 -> 256 -> 16, relu, mean squared error, SGD) learns a teacher network (t = w2 tanh(w1 x)) on
synthetic data. The numbers come from the same counter-based generator as the Rust side (SplitMix64 of
seed, stream and index; 24-bit uniforms in [-1, 1), in plain Python integers), so the initial weights, inputs
and targets are the same (the teacher's sums in another order);
rank 0's weights are broadcast by DDP. Each rank takes rows rank*b .. (rank+1)*b of each global batch.
DDP's buckets match the Rust example's --buckets: two (the default) is a bucket cap of exactly layer 2's
gradients (16448 bytes: DDP closes a bucket once it reaches the cap, and with an explicit bucket_cap_mb its first
bucket has the same cap), so that its rebuilt buckets (in gradient-ready order, from step 1) are layer 2's and then
layer 1's; one is bucket_cap_mb=25, every gradient in one bucket. DDP's own record of its rebuilt bucket sizes is
written beside the curve (ddp_bucket_sizes).
A step's time runs from its batch's upload to its loss on the host; the data are made before the first step.
Writes the JSON on rank 0: {"backend", "world_size", "global_batch", "model", "torch", "steps": [{"step", "loss", "ms"}]}.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_placement import place

MASK = (1 << 64) - 1
KEY_W1, KEY_W2, KEY_TEACHER1, KEY_TEACHER2, KEY_INPUTS = 1, 2, 3, 4, 1 << 32


def splitmix64(x):
    """SplitMix64's output function (wrapping 64-bit arithmetic)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform(seed, key, start, count):
    """Elements start .. start + count of stream `key`: f32 values in [-1, 1) (exact: 24 bits), as train.rs's
    `uniform`."""
    base = ((((seed * 0x100000001B3) & MASK) + key) * 0x9E3779B97F4A7C15) & MASK
    values = [(splitmix64(base ^ i) >> 40) / float(1 << 23) - 1.0 for i in range(start, start + count)]
    return torch.tensor(values, dtype=torch.float32)


def weights(seed, key, shape, scale):
    count = 1
    for side in shape:
        count *= side
    return (uniform(seed, key, 0, count) * scale).reshape(shape)


def f32(value):
    return torch.tensor(value, dtype=torch.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--buckets", type=int, choices=[1, 2], default=2)
    args = parser.parse_args()
    inp, hidden, out, teacher_hidden = 64, 256, 16, 32

    device = place()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.batch % world:
        raise SystemExit(f"a global batch of {args.batch} rows does not split evenly between {world} ranks")
    b = args.batch // world

    w1t = weights(args.seed, KEY_TEACHER1, (teacher_hidden, inp), f32(3.0) / f32(inp).sqrt())
    w2t = weights(args.seed, KEY_TEACHER2, (out, teacher_hidden), (f32(3.0) / f32(teacher_hidden)).sqrt())
    batches = []
    for step in range(args.steps):
        x = uniform(args.seed, KEY_INPUTS + step, rank * b * inp, b * inp).reshape(b, inp)
        t = torch.tanh(x @ w1t.T) @ w2t.T
        batches.append((x, t))

    model = nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, out)).cuda()
    with torch.no_grad():
        for layer, key, fan_in in ((model[0], KEY_W1, inp), (model[2], KEY_W2, hidden)):
            scale = (f32(6.0) / f32(fan_in)).sqrt() / f32(2.0)
            shape = tuple(layer.weight.shape)
            layer.weight.copy_(weights(args.seed, key, shape, scale) if rank == 0 else torch.zeros(shape))
            layer.bias.zero_()
    # Two buckets: the cap is layer 2's gradients (weight and bias, 4 bytes each), which backward makes first.
    layer2_bytes = (hidden * out + out) * 4
    bucket_cap_mb = layer2_bytes / (1024 * 1024) if args.buckets == 2 else 25.0
    ddp = DDP(model, device_ids=[device.index], bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_sum = torch.zeros(1, device="cuda")

    records = []
    for step, (x, t) in enumerate(batches):
        start = time.perf_counter()
        x, t = x.cuda(), t.cuda()
        optimizer.zero_grad(set_to_none=True)
        y = ddp(x)
        loss = nn.functional.mse_loss(y, t)
        loss.backward()
        loss_sum.copy_(loss.detach() * (b * out))
        dist.all_reduce(loss_sum)
        optimizer.step()
        total = loss_sum.item()
        ms = (time.perf_counter() - start) * 1e3
        records.append({"step": step, "loss": total / (args.batch * out), "ms": ms})
        if rank == 0:
            print(f"step {step:4}  loss {records[-1]['loss']:.6f}  {ms:.3f} ms")

    try:
        logging = ddp._get_ddp_logging_data()
        bucket_sizes = logging.get("rebuilt_bucket_sizes") or logging.get("bucket_sizes")
    except Exception as error:  # a private API: say why there is no record rather than fail the run
        bucket_sizes = f"unavailable: {type(error).__name__}: {error}"
    if rank == 0 and args.json:
        report = {
            "backend": "torch",
            "world_size": world,
            "global_batch": args.batch,
            "model": {"input": inp, "hidden": hidden, "output": out, "teacher_hidden": teacher_hidden,
                      "lr": args.lr, "seed": args.seed, "buckets": args.buckets, "bucket_cap_mb": bucket_cap_mb,
                      "ddp_bucket_sizes": bucket_sizes},
            "torch": torch.__version__,
            "steps": records,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

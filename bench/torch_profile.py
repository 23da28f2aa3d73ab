"""What the PyTorch bench contestants are sized for, as the Rust ones (crates/pg-lab/src/bin/pg-nccl-gpu/profile.rs,
whose tests check that these lists are its lists): "nvlink" (sizes up to 1 GiB, hundreds of ops per trial) or
"network" (ranks sharing a GPU over NCCL's socket transport on loopback: sizes up to 16 MiB, ten ops per trial,
five above 1 MiB, no CUDA-graph rows)."""

NVLINK_ALL_REDUCE_SIZES = [8, 64, 1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
NVLINK_EXCHANGE_SIZES = [1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
NETWORK_ALL_REDUCE_SIZES = [8, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
NETWORK_EXCHANGE_SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
PROFILES = ["nvlink", "network"]


def all_reduce_sizes(profile, max_bytes):
    sizes = NETWORK_ALL_REDUCE_SIZES if profile == "network" else NVLINK_ALL_REDUCE_SIZES
    return [s for s in sizes if s <= max_bytes]


def exchange_sizes(profile, max_bytes):
    sizes = NETWORK_EXCHANGE_SIZES if profile == "network" else NVLINK_EXCHANGE_SIZES
    return [s for s in sizes if s <= max_bytes]


def ops_per_trial(profile, size):
    if profile == "network":
        return 10 if size <= 1 << 20 else 5
    if size <= 1 << 20:
        return 200
    if size <= 64 << 20:
        return 20
    if size <= 256 << 20:
        return 10
    return 5

"""Where this PyTorch rank runs, as pg's launchers place their ranks: GPU LOCAL_RANK % the GPU count. With more
ranks than GPUs, each rank poses to NCCL as a host of its own (NCCL_HOSTID), so that NCCL links the ranks that
share a GPU with its network (socket) transport over loopback; call place() before init_process_group."""

import os

import torch


def place():
    """Sets this rank's GPU (and, with ranks sharing GPUs, its NCCL host id) and returns its device."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    gpus = max(torch.cuda.device_count(), 1)
    if world > gpus:
        os.environ.setdefault("NCCL_HOSTID", f"pg-rank-host-{rank}")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
    device = torch.device("cuda", local_rank % gpus)
    torch.cuda.set_device(device)
    return device

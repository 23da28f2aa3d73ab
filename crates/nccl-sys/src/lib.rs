//! Run-time loaded NCCL bindings (filled in by the GPU issue).

//! The NCCL backend of pg (filled in by the GPU issue).

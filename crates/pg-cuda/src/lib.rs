//! CUDA streams, events and memory for pg on cudarc (filled in by the GPU issue).

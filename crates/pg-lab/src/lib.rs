//! The lab around pg, apart from what a user links: the GPU suite binary `pg-nccl-gpu` (conformance, experiments,
//! benchmarks, reports, the mixed and interop tasks), the launcher of rank processes that it and xtask share
//! ([`launch`]), the NCCL backend's conformance harness, the exchange patterns the all-to-all and point-to-point
//! benchmarks time, the typed rows of the benchmark results ([`results`]), and the bundle's `run.sh` ([`RUN_SH`]).
//!
//! It builds pg-core and pg-nccl with their `testing` hooks; the product crates never depend on it.
#![forbid(unsafe_code)]

pub mod bench_exchange;
pub mod conformance;
pub mod launch;
pub mod results;

/// The bundle's `run.sh` (this crate's `run.sh`): runs the GPU suite, the benchmarks, the training example, the mixed
/// groups, the torchrun rehearsal and the fault matrix from a bundle that `cargo xtask gpu-test --bundle DIR`
/// writes, on a machine without cargo.
pub const RUN_SH: &str = include_str!("../run.sh");

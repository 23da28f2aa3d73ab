//! The lab around pg, apart from what a user links: the GPU suite binary `pg-nccl-gpu` (conformance, experiments,
//! benchmarks, reports, its launcher of rank processes, the mixed and interop tasks), the NCCL backend's
//! conformance harness, and the exchange patterns the all-to-all and point-to-point benchmarks time.
//!
//! It builds pg-core and pg-nccl with their `testing` hooks; the product crates never depend on it.
#![forbid(unsafe_code)]

pub mod bench_exchange;
pub mod conformance;

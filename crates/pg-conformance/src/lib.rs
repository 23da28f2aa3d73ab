//! The conformance suite of pg: every semantic the process group promises (streams, events, Work, the
//! communicator cache, buffer lifetimes, the watchdog) and every op's results and bad-input errors, written
//! once, generic over [`pg_core::Backend`].
//!
//! A backend takes part through a [`Harness`]: it makes a world of N ranks and runs a closure on each rank,
//! and it may offer optional [`Capabilities`] (a rank's kernel log, a virtual host clock, a hazard report,
//! fault hooks). A case that needs a capability the harness lacks, or more ranks than the world has, is
//! [`Outcome::NotApplicable`] with the reason; it never counts as a pass.
//!
//! [`cases`] lists every case; [`run_all`] runs them and [`report`] prints the table and the JSON.
//! [`traces`] merges per-rank trace documents and carries pg-core's JSON values to and from serde_json's.
//! [`fault_matrix`] is the fault matrix on the simulated backend (pg-mock's tests and `cargo xtask faults`).
//! [`mock::MockHarness`] runs the suite on the simulated backend; the NCCL backend's harness is in `pg-lab`.
#![forbid(unsafe_code)]

mod case;
mod cases;
mod check;
pub mod fault_matrix;
mod harness;
pub mod mock;
mod registry;
pub mod report;
pub mod traces;
mod values;

pub use case::{Case, Outcome};
pub use check::{Check, Context};
pub use harness::{
    Capabilities, Clock, Fault, Harness, Hazard, HazardKind, HostThread, KernelKind, KernelLaunch, NoCapabilities,
    Offers, Ran, Rank,
};
pub use registry::{
    cases, collective_cases, dtype_cases, recovery_cases, run_all, run_case, subgroup_cases, CaseReport,
};
pub use values::{decode, encode};

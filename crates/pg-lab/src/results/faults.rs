//! The fault matrix's results as types (`faults-*.json`, written by `cargo xtask faults`): a scenario's row on the
//! mock, a rank's row of a scenario on NCCL, and the document around either. Field names are the JSON's; fields
//! are declared in the JSON's (alphabetical) key order.

use serde::{Deserialize, Serialize};

/// One scenario on the mock (virtual time).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MockFaultRow {
    /// From the fault to the error reaching the caller, virtual ms (`None`: the scenario has no latency).
    pub detection_latency_ms: Option<f64>,
    /// What should happen.
    pub expected: String,
    /// The checks that failed.
    pub failures: Vec<String>,
    /// The scenario's number in the issue.
    pub id: String,
    /// The scenario does not apply to the mock.
    pub not_applicable: bool,
    /// What happened.
    pub observed: String,
    /// Every check held.
    pub pass: bool,
    /// The scenario's name.
    pub scenario: String,
    /// Host seconds the scenario took.
    pub wall_s: f64,
}

/// One scenario on NCCL as one rank saw it (also what a rank process hands back to the launcher).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NcclFaultRow {
    /// From the fault (or the op's start) to the error reaching the caller, in ms.
    pub detection_ms: Option<f64>,
    /// What should happen.
    pub expected: String,
    /// What happened.
    pub observed: String,
    /// Whether the observation meets the expectation.
    pub pass: bool,
    /// The rank that observed it.
    pub rank: usize,
    /// The scenario's number in the issue.
    pub scenario: String,
}

/// A fault-matrix result: the settings and a row per scenario (the mock) or per scenario and rank (NCCL).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultsResult<R> {
    /// `mock` or `nccl`.
    pub backend: String,
    /// How the ranks sit on the GPUs (NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The rows.
    pub rows: Vec<R>,
    /// The ops' timeout, ms.
    pub timeout_ms: u64,
    /// The unwaited ops of the pile-up scenario (the mock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwaited_ops: Option<u64>,
    /// The watchdog's period, ms.
    pub watchdog_period_ms: u64,
    /// The ranks (NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// The mock's result (`faults-mock.json`).
pub type MockFaults = FaultsResult<MockFaultRow>;
/// A result on NCCL (`faults-nccl-*.json`).
pub type NcclFaults = FaultsResult<NcclFaultRow>;

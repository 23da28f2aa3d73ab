//! The results of the pass/fail tasks as types: the conformance suite's merged cases (`conformance-*.json`), the
//! interop task's checks (`interop-*.json`) and the mixed task's runs of pg beside PyTorch (`mixed-*.json`), and
//! the rank files the interop and mixed merges read. Field names are the JSON's; fields are declared in the JSON's
//! (alphabetical) key order, so a merged file reads as before.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A side's versions by name (`device`, `nccl`, `nccl_library`, `sm_clock_khz`; PyTorch's ranks: `torch`, `nccl`).
pub type Versions = BTreeMap<String, String>;

/// The outcome words of a case or check.
pub const PASS: &str = "pass";
/// A case or check that failed.
pub const FAIL: &str = "fail";
/// A case or check that does not apply here.
pub const NOT_APPLICABLE: &str = "not_applicable";

/// One conformance case or interop check on one side: its name, outcome word and why (empty for a pass).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Why it failed or does not apply, or the evidence it passed on (empty where there is none).
    #[serde(default)]
    pub detail: String,
    /// The case or check.
    pub name: String,
    /// `pass`, `fail` or `not_applicable`.
    pub result: String,
}

/// The conformance suite's merged result (`conformance-*.json`): a case fails if it failed on any rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConformanceResult {
    /// The backend the suite ran on (`nccl`).
    pub backend: String,
    /// Every case in the suite's order.
    pub cases: Vec<Outcome>,
    /// The command that produced the run, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The commit the run was of, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The machine line (date, GPU, driver, ranks on GPUs, commit, libnccl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Rank 0's versions (`None`: no rank named them).
    #[serde(default)]
    pub versions: Option<Versions>,
    /// The ranks.
    pub world_size: u64,
}

/// One interop check over the ranks (`interop-*.json`, `checks`): it passes if it passed on every rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InteropCheck {
    /// The check.
    pub name: String,
    /// Each rank's outcome, in rank order (a rank that did not report the check is left out).
    pub ranks: Vec<Outcome>,
    /// The merged outcome word.
    pub result: String,
}

/// The interop task's merged result (`interop-*.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InteropResult {
    /// The backend (`nccl`).
    pub backend: String,
    /// The checks in rank 0's order.
    pub checks: Vec<InteropCheck>,
    /// The command that ran the task.
    pub command: String,
    /// The commit the run was of, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The machine line the launcher was given (`PG_RUN_LABEL`).
    pub label: String,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Whether every check passed (or does not apply) on every rank.
    pub passed: bool,
    /// `interop`.
    pub task: String,
    /// Rank 0's versions.
    #[serde(default)]
    pub versions: Option<Versions>,
    /// The ranks.
    pub world_size: u64,
}

/// An interop rank's result as the merge reads it: its checks and versions (other fields are not read).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InteropRank {
    /// Every check this rank ran, in order.
    #[serde(default)]
    pub checks: Vec<Outcome>,
    /// This rank's versions.
    #[serde(default)]
    pub versions: Option<Versions>,
}

/// One op's check on one rank of a mixed run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MixedCheck {
    /// What was checked, or why it failed.
    #[serde(default)]
    pub detail: String,
    /// The op (`all_reduce`, ...; `join` for a pg rank that could not join).
    pub op: String,
    /// `pass` or `fail`.
    pub result: String,
    /// Host seconds the op and its check took.
    #[serde(default)]
    pub seconds: f64,
}

/// One rank of a mixed run (`mixed-rank{r}.json`, written by the pg rank or by `bench/torch_mixed.py`), or a
/// rank that left no file (only `rank` and `missing`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MixedRank {
    /// The rank's checks in the order it ran them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<Vec<MixedCheck>>,
    /// Why there is no result of this rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// Whether every op passed on this rank, as it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// pg's rank in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_rank: Option<u64>,
    /// The rank.
    pub rank: u64,
    /// Host seconds of the whole rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// `pg` or `torch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<String>,
    /// The side's versions (PyTorch's ranks write them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Versions>,
    /// The ranks, as this rank saw them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// One run of a mixed world: pg at one rank, PyTorch at the others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MixedRun {
    /// Whether every rank ran every op and passed.
    pub passed: bool,
    /// pg's rank.
    pub pg_rank: u64,
    /// Every rank, in rank order.
    pub ranks: Vec<MixedRank>,
    /// The ranks.
    pub world_size: u64,
}

/// The mixed task's merged result for one world (`mixed-nccl-N.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MixedResult {
    /// The machine line and the runs.
    pub label: String,
    /// The ops every rank runs, in order.
    pub ops: Vec<String>,
    /// Whether every run passed.
    pub passed: bool,
    /// The runs, by pg's rank.
    pub runs: Vec<MixedRun>,
    /// `mixed`.
    pub task: String,
    /// The ranks.
    pub world_size: u64,
}

//! A rank's result of the GPU binary's `experiments` task as types (the communicator cache, the completion
//! semantics, the streams), which the experiments write and the report reads. Field names are the JSON's; fields
//! are declared in the JSON's (alphabetical) key order. A part a rank did not write reads as its default, so the
//! report's checks fail on it.

use serde::{Deserialize, Serialize};

use crate::results::checks::Versions;

/// One all_reduce of the cache experiment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheOp {
    /// Whether its result was right.
    pub correct: bool,
    /// Communicators it created.
    pub created: u64,
    /// The group (`world`, `clone-1`, `clone-2`).
    pub group: String,
    /// Its index in the group.
    pub op: u64,
}

/// Experiment 1: three groups of one membership, three all_reduces each.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheExperiment {
    /// Communicators created over every op.
    pub comm_creations: u64,
    /// Ops with a right result.
    pub correct_ops: u64,
    /// Communicators created by an op after a group's first.
    pub creations_after_first_op: u64,
    /// The groups.
    pub groups: u64,
    /// The ops of each group.
    pub ops_per_group: u64,
    /// Every op.
    pub rows: Vec<CacheOp>,
}

/// One way to wait of the semantics experiment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SemanticsRow {
    /// 1 if the Work was complete right after the action, else 0.
    pub completed_after_action: u64,
    /// The way to wait (`no wait + device sync`, `Future.wait`, ...).
    pub config: String,
    /// Whether the result was right.
    pub correct: bool,
    /// Whether the Work's Future was done right after the enqueue.
    pub future_done_after_enqueue: bool,
    /// Host time of the action, us (`None`: not a number).
    pub host_action_us: Option<f64>,
}

/// Experiment 2: a long sleep on the current stream, then an all_reduce, waited for four ways.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SemanticsExperiment {
    /// The all_reduce's elements.
    pub numel: u64,
    /// Every way to wait, in order.
    pub rows: Vec<SemanticsRow>,
    /// The sleep in SM cycles.
    pub sleep_cycles: u64,
    /// The sleep at the device's clock, ms (`None`: not a number).
    pub sleep_ms_nominal: Option<f64>,
}

/// Experiment 3: on which streams the comm kernels ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamsExperiment {
    /// The stream of each comm kernel launched.
    pub comm_kernel_streams: Vec<u64>,
    /// Every comm kernel ran on a stream other than the current one.
    pub comm_kernels_on_other_stream: bool,
    /// The Work's comm stream.
    pub comm_stream: u64,
    /// The caller's current stream.
    pub current_stream: u64,
}

/// A rank's result of the `experiments` task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExperimentsRank {
    /// `nccl`.
    pub backend: String,
    /// Experiment 1.
    pub cache: CacheExperiment,
    /// The rank (the launcher adds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Experiment 2.
    pub semantics: SemanticsExperiment,
    /// Experiment 3.
    pub streams: StreamsExperiment,
    /// `experiments`.
    pub task: String,
    /// The rank's versions (the launcher adds them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions: Option<Versions>,
    /// The ranks (the launcher adds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

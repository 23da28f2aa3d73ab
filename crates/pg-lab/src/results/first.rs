//! The time to the first collective as types: a rank's result of one fresh launch (`first-lazy`, `first-eager`),
//! a launch's ranks, the `first` task's merged `first.json`, the PyTorch script's lines (`torch-first.jsonl`) and
//! the comparison the all_reduce result carries (`first_collective`). Field names are the JSON's; fields are
//! declared in the JSON's (alphabetical) key order.

use serde::{Deserialize, Serialize};

use crate::results::checks::Versions;

/// One rank of one launch (`first-*-rank{r}.json`), or a rank that failed (`rank` and `error` only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstRank {
    /// Whether the group was made with `eager_init`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager: Option<bool>,
    /// Why the rank failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// From the ranks' meeting to the first all_reduce's completion on the device, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_collective_ms: Option<f64>,
    /// From the ranks' meeting to the group's creation returning, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_creation_ms: Option<f64>,
    /// The rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// `first-lazy` or `first-eager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The rank's versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Versions>,
    /// The ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// One launch: a fresh set of rank processes in one mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstLaunch {
    /// Whether the launch was of the eager mode.
    pub eager: bool,
    /// Every rank, in rank order.
    pub ranks: Vec<FirstRank>,
}

/// The `first` task's merged result (`first.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstResult {
    /// Every launch, in the order they ran (the modes alternate).
    pub launches: Vec<FirstLaunch>,
    /// Whether both modes have only finite times.
    pub passed: bool,
    /// `first`.
    pub task: String,
    /// The first launch's rank 0's versions.
    pub versions: Option<Versions>,
    /// The ranks of a launch.
    pub world_size: u64,
}

/// One line of the PyTorch script's `--first` runs (`torch-first.jsonl`): the slowest rank's time of one launch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TorchFirst {
    /// The launch's time to its first all_reduce, ms.
    pub first_collective_ms: Option<f64>,
    /// `lazy` or `eager`.
    pub mode: String,
}

/// pg's and PyTorch's time to the first all_reduce in one mode, beside each other.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstSide {
    /// pg's median over its launches, ms (`None`: no launch).
    pub pg_ms: Option<f64>,
    /// pg's median over PyTorch's.
    pub pg_over_torch: Option<f64>,
    /// pg's launches, the slowest rank of each, ms (`None`: a launch with no time).
    pub pg_trials_ms: Vec<Option<f64>>,
    /// PyTorch's median, ms.
    pub torch_ms: Option<f64>,
    /// PyTorch's launches, ms.
    pub torch_trials_ms: Vec<f64>,
    /// pg within 0.8x of PyTorch.
    pub within_0_8: Option<bool>,
}

/// The all_reduce result's `first_collective`: both modes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstCollective {
    /// With `eager_init` (PyTorch: `device_id=`).
    pub eager: FirstSide,
    /// Without: the first op creates the communicator.
    pub lazy: FirstSide,
}

//! The training example's results beside PyTorch DDP as types: a run's curve (`ddp_mlp --json`, which the elastic
//! runs' `elastic-*.json` are; `bench/torch_ddp_mlp.py --json`) and the merged `train-mlp-*.json`, in its two forms (one run per side with a
//! summary, or one pair of runs per gradient-bucket layout). Field names are the JSON's; fields are declared in the
//! JSON's (alphabetical) key order. A figure that could not be had (a loss that is not a number, a median of no
//! steps) is `None` and written `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One training step of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainStep {
    /// The loss after the step (`None`: not a number).
    pub loss: Option<f64>,
    /// The step's wall time, ms.
    pub ms: Option<f64>,
    /// The step's index.
    pub step: u64,
}

/// A recovery of an elastic run: a rank died and the survivors went on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// From the death to its detection, ms.
    pub detect_ms: f64,
    /// The world before.
    pub from: u64,
    /// From the detection to the next step, ms.
    pub recover_ms: f64,
    /// The step it happened at.
    pub step: u64,
    /// The world after.
    pub to: u64,
}

/// A growth of an elastic run: the group grew back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Growth {
    /// The world before.
    pub from: u64,
    /// How long the growth took, ms.
    pub ms: f64,
    /// The step it happened at.
    pub step: u64,
    /// The world after.
    pub to: u64,
}

/// One side's run: the training example's or PyTorch DDP's curve.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainRun {
    /// `nccl`, `mock` (pg) or `torch`.
    pub backend: String,
    /// Samples per step over every rank.
    pub global_batch: u64,
    /// The example's growths (absent from DDP's runs and older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growths: Option<Vec<Growth>>,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The model's and the optimiser's settings as each side names them (pg: `buckets`, `hidden`, ...; DDP adds
    /// `bucket_cap_mb` and `ddp_bucket_sizes`): an open set, kept as written.
    pub model: BTreeMap<String, serde_json::Value>,
    /// The example's recoveries (absent from DDP's runs and older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recoveries: Option<Vec<Recovery>>,
    /// Every step, in order.
    pub steps: Vec<TrainStep>,
    /// PyTorch's version (DDP's runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<String>,
    /// The ranks.
    pub world_size: u64,
}

/// One side's summary in the one-run form (`summary`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    /// `nccl` or `torch`.
    pub backend: String,
    /// The first step's loss.
    pub first_loss: Option<f64>,
    /// The last step's loss.
    pub last_loss: Option<f64>,
    /// The median step after the warm-up steps, ms.
    pub median_step_ms: Option<f64>,
    /// How many steps ran.
    pub steps: u64,
    /// The ranks.
    pub world_size: u64,
}

/// The one-run form of `train-mlp-*.json`: pg's run and DDP's (if it ran), each summarised.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainResult {
    /// The command that produced the run, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The commit the run was of, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The run's label.
    pub label: String,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The largest relative gap between the two loss curves (`None`: no DDP curve).
    pub max_relative_loss_gap: Option<f64>,
    /// Whether each run's loss fell.
    pub passed: bool,
    /// pg's run.
    pub pg: TrainRun,
    /// pg's summary, then DDP's.
    pub summary: Vec<TrainSummary>,
    /// DDP's run, if it ran.
    pub torch: Option<TrainRun>,
}

/// One bucket layout of the per-layout form: both sides' runs and how they compare.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainLayout {
    /// The gradient buckets.
    pub buckets: u64,
    /// The loss curves agree within a relative 1e-5.
    #[serde(rename = "curves_within_1e-5")]
    pub curves_within_1e_5: bool,
    /// DDP's bucket sizes as its script reports them (`None`: DDP did not run or said nothing).
    pub ddp_bucket_sizes: Option<String>,
    /// Both sides' losses fell.
    pub losses_fell: bool,
    /// The largest relative gap between the loss curves (`None`: the curves differ in length).
    pub max_relative_loss_gap: Option<f64>,
    /// Curves within 1e-5 and both losses fell.
    pub passed: bool,
    /// pg's run, if it wrote one.
    pub pg: Option<TrainRun>,
    /// pg's first and last loss.
    pub pg_first_last_loss: [Option<f64>; 2],
    /// pg's median step after the warm-up steps, ms.
    pub pg_median_step_ms: Option<f64>,
    /// pg's median step over DDP's.
    pub pg_over_torch_step: Option<f64>,
    /// pg's median step is at or below DDP's (`None`: a side has no median).
    pub pg_step_at_or_below_torch: Option<bool>,
    /// pg's steps.
    pub steps: u64,
    /// DDP's run, if it wrote one.
    pub torch: Option<TrainRun>,
    /// DDP's first and last loss.
    pub torch_first_last_loss: [Option<f64>; 2],
    /// DDP's median step after the warm-up steps, ms.
    pub torch_median_step_ms: Option<f64>,
}

/// The per-layout form of `train-mlp-*.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainLayoutsResult {
    /// The command that produced the run, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The commit the run was of, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The run's label.
    pub label: String,
    /// Every layout, in the order asked for.
    pub layouts: Vec<TrainLayout>,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Every layout passed.
    pub passed: bool,
}

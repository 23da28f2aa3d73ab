//! The all-to-all and point-to-point benchmarks' per-rank results as types: a rank's rows (one contestant at one
//! size and split) and its result (`bench-<op>-rank{r}.json`), the task's merged `bench-<op>.json`, and what the
//! merge reads of PyTorch's `torch-<op>.json`. Field names are the JSON's; fields are declared in the JSON's
//! (alphabetical) key order. A figure that is not a number is `None` and written `null`.

use serde::{Deserialize, Serialize};

use crate::results::checks::Versions;
use crate::results::RankRow;

/// One contestant at one size (and split) on one rank: the medians of its trials.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExchangeRankRow {
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: Option<f64>,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: Option<f64>,
    /// The bytes each rank sends per op.
    pub bytes: u64,
    /// The contestant (`raw`, `pg`).
    pub contestant: String,
    /// Each trial's device time per op, us, in ascending order.
    #[serde(default)]
    pub device_us_trials: Vec<f64>,
    /// Host enqueue time per op, us.
    pub host_enqueue_us: Option<f64>,
    /// This rank's input splits (the all-to-all only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_splits: Option<Vec<u64>>,
    /// Ops per trial.
    #[serde(default)]
    pub ops_per_trial: u64,
    /// The split (`equal`, `skewed`; the all-to-all only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Device time per op, us (the median of the trials).
    pub time_us: Option<f64>,
    /// Trials.
    #[serde(default)]
    pub trials: u64,
    /// Host time of `wait()` per op, us (`None`: the contestant has no wait).
    pub wait_us: Option<f64>,
}

/// A rank's result of `bench-all-to-all` or `bench-p2p`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExchangeRank {
    /// Why the benchmark has no figures at this world size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_applicable: Option<String>,
    /// What the benchmark was sized for (`nvlink`, `network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The rank (the launcher adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Every contestant at every size and split.
    #[serde(default)]
    pub rows: Vec<ExchangeRankRow>,
    /// The process group's refusal of a send to the sender itself (world size 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_send_refused: Option<String>,
    /// `bench-all-to-all` or `bench-p2p`.
    #[serde(default)]
    pub task: String,
    /// The rank's versions (the launcher adds them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Versions>,
    /// The ranks (the launcher adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// The task's merged result (`bench-all-to-all.json`, `bench-p2p.json`): every rank's result.
pub type ExchangeBench = crate::results::TaskRanks<ExchangeRank>;

/// The skewed splits PyTorch's script cut, for the merge to check against the Rust contestants'.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitsCheck {
    /// Every rank's input splits.
    pub input_splits: Vec<Vec<u64>>,
    /// The element count they split.
    pub numel: u64,
}

/// What the merge reads of PyTorch's result (`torch-<op>.json`, written by `bench/torch_exchange.py`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TorchExchange {
    /// Why the benchmark has no figures at this world size.
    #[serde(default)]
    pub not_applicable: Option<String>,
    /// The rows (the slowest rank's figures).
    #[serde(default)]
    pub rows: Option<Vec<RankRow>>,
    /// The skewed splits the script cut (the all-to-all).
    #[serde(default)]
    pub skewed_splits_check: Option<SplitsCheck>,
    /// PyTorch's versions, as the script names them.
    #[serde(default)]
    pub versions: serde_json::Value,
    /// The ranks.
    #[serde(default)]
    pub world_size: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An all-to-all row writes its split and input splits, a ring row neither; both write every figure, `null`
    /// where there is none.
    #[test]
    fn a_rank_row_writes_its_split_only_where_it_has_one() {
        let ring = ExchangeRankRow { bytes: 1024, contestant: "raw".into(), ..ExchangeRankRow::default() };
        let keys = |row: &ExchangeRankRow| -> Vec<String> {
            serde_json::to_value(row).unwrap().as_object().unwrap().keys().cloned().collect()
        };
        let figures = [
            "algbw_gbps",
            "busbw_gbps",
            "bytes",
            "contestant",
            "device_us_trials",
            "host_enqueue_us",
            "ops_per_trial",
            "time_us",
            "trials",
            "wait_us",
        ];
        assert_eq!(keys(&ring), figures);
        let all_to_all =
            ExchangeRankRow { input_splits: Some(vec![1, 3]), split: Some("skewed".into()), ..ring.clone() };
        let mut with_split: Vec<&str> = figures.to_vec();
        with_split.extend(["input_splits", "split"]);
        with_split.sort_unstable();
        assert_eq!(keys(&all_to_all), with_split);
        assert_eq!(serde_json::to_value(&ring).unwrap()["wait_us"], serde_json::Value::Null);
    }
}

//! The all_reduce benchmark's per-rank results as types: a rank's rows (one contestant at one size), its host
//! costs and trace summary (`bench-rank{r}.json`), the `bench` task's `bench.json` that `merge_bench` reads, and
//! what it reads of PyTorch's `torch.json`.
//! Field names are the JSON's; fields are declared in the JSON's (alphabetical) key order. A figure that is not a
//! number (a host-bound device time) is `None` and written `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::results::checks::Versions;

/// One contestant at one size on one rank: the medians of its trials.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchRankRow {
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: Option<f64>,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: Option<f64>,
    /// The message size in bytes.
    pub bytes: u64,
    /// The contestant (`raw`, `pg`, `raw-with-events`, `pg-graph`, ...).
    pub contestant: String,
    /// Each trial's device time per op, us.
    #[serde(default)]
    pub device_us_trials: Vec<f64>,
    /// Whether the GPU was ahead of the host in every trial.
    pub gpu_ahead: Option<bool>,
    /// Whether the GPU was ahead of the host, trial by trial.
    #[serde(default)]
    pub gpu_ahead_trials: Vec<bool>,
    /// The graph's launch, us (the graph contestants only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_launch_us: Option<f64>,
    /// The captured graph's nodes (the graph contestants only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_nodes: Option<u64>,
    /// Host enqueue time per op, us.
    pub host_enqueue_us: Option<f64>,
    /// Back-to-back ops per second of host time.
    pub host_ops_per_s: Option<f64>,
    /// Host time inside `ncclAllReduce` per op, us (`None`: not timed).
    pub nccl_call_us: Option<f64>,
    /// Ops per trial.
    #[serde(default)]
    pub ops_per_trial: u64,
    /// The process group's own host time per op (enqueue minus the NCCL call), us.
    pub own_host_us: Option<f64>,
    /// The median of each step of the enqueue, us, by step (with `PG_TIME_ENQUEUE=1`).
    pub steps_us: Option<BTreeMap<String, f64>>,
    /// Device time per op, us (`None`: no trial had the GPU ahead).
    pub time_us: Option<f64>,
    /// Trials.
    #[serde(default)]
    pub trials: u64,
    /// Host time of `wait()` per op, us (`None`: the contestant has no wait).
    pub wait_us: Option<f64>,
}

/// The host cost of the primitives the process group calls per op, medians in us.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostCosts {
    /// Reading the current stream.
    pub current_stream: f64,
    /// Creating, recording and dropping an event on the default stream.
    pub event_create_record_drop_on_default_stream: f64,
    /// The same on a pool stream.
    pub event_create_record_drop_on_pool_stream: f64,
    /// `record_stream` of a buffer on the comm stream.
    pub record_stream: f64,
    /// The comm stream waiting for an event.
    pub stream_wait_event: f64,
    /// Reading the clock twice.
    pub timer: f64,
    /// The device's clock (`Device::now`), once.
    #[serde(default)]
    pub clock_read: Option<f64>,
    /// Binding the device's context to the thread (already bound).
    #[serde(default)]
    pub context_bind: Option<f64>,
    /// The capture query of the current stream (the legacy default stream).
    #[serde(default)]
    pub is_capturing_default_stream: Option<f64>,
    /// The capture query of a pool stream.
    #[serde(default)]
    pub is_capturing_pool_stream: Option<f64>,
    /// Recording one event again and again on the comm stream, the GPU idle.
    #[serde(default)]
    pub event_rerecord_one_on_comm_stream: Option<f64>,
    /// Recording each of 256 events in turn on the comm stream, the GPU idle.
    #[serde(default)]
    pub event_record_ring_on_comm_stream: Option<f64>,
    /// Recording each of 4,096 events in turn on the comm stream, the GPU idle (as many as the process group's
    /// pool of Works holds: each record touches an event no record touched for thousands of records).
    #[serde(default)]
    pub event_record_ring_4096_on_comm_stream: Option<f64>,
    /// Recording one event again and again on the comm stream behind a spin (every record pending; 256 records).
    #[serde(default)]
    pub event_rerecord_one_behind_spin: Option<f64>,
    /// Recording each of 256 events in turn on the comm stream behind a spin (every record pending; 256 records).
    #[serde(default)]
    pub event_record_ring_behind_spin: Option<f64>,
}

/// What the traced contestant's trace file held once written, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TraceSummary {
    /// The file could not be read or parsed.
    Unread {
        /// Why.
        error: String,
        /// The file.
        file: String,
    },
    /// The file's size and its groups' op counts.
    Read {
        /// The file's size (`None`: its metadata could not be read).
        bytes: Option<u64>,
        /// The file.
        file: String,
        /// The trace's `otherData.groups`, as the trace writes it.
        groups: serde_json::Value,
    },
}

/// A rank's result of the `bench` task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchRank {
    /// Why the graph contestants failed, if they did.
    #[serde(default)]
    pub graph_error: Option<String>,
    /// The host costs of the primitives.
    #[serde(default)]
    pub host_costs_us: Option<HostCosts>,
    /// What the benchmark was sized for (`nvlink`, `network`).
    #[serde(default)]
    pub profile: Option<String>,
    /// The rank (the launcher adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Every contestant at every size.
    #[serde(default)]
    pub rows: Vec<BenchRankRow>,
    /// `bench`.
    #[serde(default)]
    pub task: String,
    /// The traced contestant's file.
    #[serde(default)]
    pub trace: Option<TraceSummary>,
    /// The rank's versions (the launcher adds them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Versions>,
    /// The ranks (the launcher adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// The `bench` task's merged result (`bench.json`): every rank's result.
pub type BenchResult = crate::results::TaskRanks<BenchRank>;

/// What the merge reads of PyTorch's all_reduce result (`torch.json`, written by `bench/torch_allreduce.py`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TorchBench {
    /// Why the graph contestant failed, if it did.
    #[serde(default)]
    pub graph_error: Option<String>,
    /// The graph contestant's rows (the slowest rank's figures), when the script ran it.
    #[serde(default)]
    pub graph_rows: Option<Vec<crate::results::RankRow>>,
    /// The eager rows (the slowest rank's figures).
    #[serde(default)]
    pub rows: Option<Vec<crate::results::RankRow>>,
    /// PyTorch's versions, as the script names them.
    #[serde(default)]
    pub versions: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An eager row writes every key the rank files have always had (a figure not measured as `null`), a graph
    /// row adds its launch and nodes, and a host-bound device time is written `null`.
    #[test]
    fn a_rank_row_writes_the_keys_of_the_rank_files() {
        let eager = BenchRankRow { contestant: "pg".into(), bytes: 8, time_us: Some(f64::NAN), ..Default::default() };
        let value = serde_json::to_value(&eager).unwrap();
        let keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "algbw_gbps",
                "busbw_gbps",
                "bytes",
                "contestant",
                "device_us_trials",
                "gpu_ahead",
                "gpu_ahead_trials",
                "host_enqueue_us",
                "host_ops_per_s",
                "nccl_call_us",
                "ops_per_trial",
                "own_host_us",
                "steps_us",
                "time_us",
                "trials",
                "wait_us"
            ]
        );
        assert_eq!(value["time_us"], serde_json::Value::Null);
        let graph = BenchRankRow { graph_launch_us: Some(3.0), graph_nodes: Some(64), ..eager };
        let value = serde_json::to_value(&graph).unwrap();
        assert_eq!((value["graph_launch_us"].as_f64(), value["graph_nodes"].as_u64()), (Some(3.0), Some(64)));
    }

    /// A trace summary reads back as what it was: the file's figures, or why it could not be read.
    #[test]
    fn a_trace_summary_reads_back_as_its_kind() {
        let read = TraceSummary::Read { bytes: None, file: "/t/rank0.json".into(), groups: serde_json::json!([1]) };
        let unread = TraceSummary::Unread { error: "gone".into(), file: "/t/rank1.json".into() };
        for summary in [read, unread] {
            let text = serde_json::to_string(&summary).unwrap();
            assert_eq!(serde_json::from_str::<TraceSummary>(&text).unwrap(), summary, "{text}");
        }
    }
}

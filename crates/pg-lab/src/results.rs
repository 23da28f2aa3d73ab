//! The results as types: here the rows by size of the benchmark results (the all_reduce result and the
//! all-to-all and point-to-point results) that the GPU binary's merges write to `bench/results/*.json` and
//! `cargo xtask plot` and the `bench/*.py` scripts read, and a task's merged ranks ([`TaskRanks`]); in the
//! submodules every other kind the lab and xtask write or read. Field names are the JSON's; fields are declared in
//! the JSON's (alphabetical) key order, so a merged file reads as before. A figure that could not be measured (a
//! host-bound device time, a ratio of nothing) is `None` and written `null`. The tests parse every committed result
//! of a typed kind and write it back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod bench;
pub mod checks;
pub mod exchange;
pub mod experiments;
pub mod faults;
pub mod first;
pub mod host;
pub mod store;
pub mod train;

/// One contestant's figures at one size of a merged result (`sizes[i].raw`, `.pg`, `.torch`, ...): the slowest
/// rank's device time and host medians.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    /// Algorithm bandwidth, GB/s (the exchange results only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algbw_gbps: Option<f64>,
    /// Bus bandwidth, GB/s.
    #[serde(default)]
    pub busbw_gbps: Option<f64>,
    /// Host enqueue time per op, us.
    #[serde(default)]
    pub host_enqueue_us: Option<f64>,
    /// Device time per op, us (`None`: no trial had the GPU ahead of the host).
    #[serde(default)]
    pub time_us: Option<f64>,
    /// Host time of `wait()` per op, us (`None`: the contestant has no wait).
    #[serde(default)]
    pub wait_us: Option<f64>,
}

/// A row by message size, as the charts see it: its size, its split (the all-to-all's), and a contestant's
/// figures by the name the charts use (`raw`, `pg`, `torch`).
pub trait SizeRow {
    /// The message size in bytes.
    fn bytes(&self) -> u64;
    /// The split (`equal`, `skewed`), where the benchmark has several.
    fn split(&self) -> Option<&str>;
    /// The figures of `contestant` at this size, if it ran.
    fn contestant(&self, contestant: &str) -> Option<&Measure>;
}

/// One size of the all_reduce result (`allreduce-*.json`, `sizes`): every contestant's figures and the
/// differences between them. Fields that later runs added are absent from older files (`None`, empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReduceSize {
    /// The message size in bytes.
    pub bytes: u64,
    /// Device time per op by contestant (the benchmark's names: `raw-with-events`, `pg-traced`), `None` where
    /// host-bound.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_time_us: BTreeMap<String, Option<f64>>,
    /// Whether the GPU was ahead of the host in every trial, by contestant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_ahead: BTreeMap<String, Option<bool>>,
    /// Back-to-back ops per second of host time, by contestant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_ops_per_s: BTreeMap<String, Option<f64>>,
    /// The process group.
    #[serde(default)]
    pub pg: Option<Measure>,
    /// The process group with the pool's stream current.
    #[serde(default)]
    pub pg_current_pool_stream: Option<Measure>,
    /// The process group's ops captured in a CUDA graph, replayed.
    #[serde(default)]
    pub pg_graph: Option<Measure>,
    /// Same-rank enqueue difference `pg` - `pg-no-watchdog-no-fr`, us.
    #[serde(default)]
    pub pg_minus_pg_no_watchdog_no_fr_enqueue_us_same_rank: Option<f64>,
    /// pg's enqueue minus raw's (slowest-rank medians), us.
    #[serde(default)]
    pub pg_minus_raw_enqueue_us: Option<f64>,
    /// Same-rank enqueue difference `pg` - `raw`, us (the worst rank).
    #[serde(default)]
    pub pg_minus_raw_enqueue_us_same_rank: Option<f64>,
    /// Same-rank enqueue difference `pg` - `raw-with-events`, us: pg's own bookkeeping.
    #[serde(default)]
    pub pg_minus_raw_with_events_enqueue_us_same_rank: Option<f64>,
    /// Same-rank enqueue difference `pg` - `raw-with-events-pg-stream`, us: pg's own bookkeeping against the same
    /// driver calls on pg's own communication stream.
    #[serde(default)]
    pub pg_minus_raw_with_events_pg_stream_enqueue_us_same_rank: Option<f64>,
    /// The process group without watchdog and flight recorder.
    #[serde(default)]
    pub pg_no_watchdog_no_fr: Option<Measure>,
    /// Same-rank enqueue difference `pg-one-input-event` - `pg`, us.
    #[serde(default)]
    pub pg_one_input_event_minus_pg_enqueue_us_same_rank: Option<f64>,
    /// pg's bus bandwidth over raw's.
    #[serde(default)]
    pub pg_over_raw_busbw: Option<f64>,
    /// pg's device time over raw's.
    #[serde(default)]
    pub pg_over_raw_device_time: Option<f64>,
    /// The process group with the op timeline on.
    #[serde(default)]
    pub pg_traced: Option<Measure>,
    /// Same-rank enqueue difference `pg-traced` - `pg`, us.
    #[serde(default)]
    pub pg_traced_minus_pg_enqueue_us_same_rank: Option<f64>,
    /// The raw NCCL loop.
    #[serde(default)]
    pub raw: Option<Measure>,
    /// The raw loop's ops captured in a CUDA graph, replayed.
    #[serde(default)]
    pub raw_graph: Option<Measure>,
    /// The raw loop plus the driver calls of the input-ready wait and the end event.
    #[serde(default)]
    pub raw_with_events: Option<Measure>,
    /// Same-rank enqueue difference `raw-with-events` - `raw`, us.
    #[serde(default)]
    pub raw_with_events_minus_raw_enqueue_us_same_rank: Option<f64>,
    /// Same-rank enqueue difference `raw-with-events` - `raw-with-event-ring`, us.
    #[serde(default)]
    pub raw_with_events_minus_raw_with_event_ring_enqueue_us_same_rank: Option<f64>,
    /// PyTorch.
    #[serde(default)]
    pub torch: Option<Measure>,
    /// PyTorch's ops captured in a CUDA graph, replayed.
    #[serde(default)]
    pub torch_graph: Option<Measure>,
}

impl SizeRow for AllReduceSize {
    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn split(&self) -> Option<&str> {
        None
    }

    fn contestant(&self, contestant: &str) -> Option<&Measure> {
        pick(contestant, [&self.raw, &self.pg, &self.torch])
    }
}

/// The all_reduce result (`allreduce-*.json`): the sizes and the targets checked over them. Fields that later
/// runs added are absent from older files (`None`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReduceResult {
    /// pg's busbw within 2% of raw's at 64 MiB and above.
    pub busbw_within_2_percent_at_64mib_and_above: bool,
    /// The command that produced the run, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The commit the run was of, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The network profile's device-time target.
    #[serde(default)]
    pub device_time_within_3_percent_from_64kib: Option<bool>,
    /// The time to the first all_reduce, lazy and eager, when measured.
    #[serde(default)]
    pub first_collective: Option<first::FirstCollective>,
    /// The network profile's enqueue target.
    #[serde(default)]
    pub host_overhead_within_1_us_same_rank: Option<bool>,
    /// pg's enqueue within 2 us of raw's (median over sizes).
    pub host_overhead_within_2_us: bool,
    /// pg's enqueue within 2 us of raw's, rank by rank.
    #[serde(default)]
    pub host_overhead_within_2_us_same_rank: Option<bool>,
    /// The run's label (machine, commit, command).
    #[serde(default)]
    pub label: String,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// pg's own bookkeeping per op, us (median over sizes).
    #[serde(default)]
    pub pg_bookkeeping_us_same_rank_median: Option<f64>,
    /// pg's own bookkeeping within 0.3 us.
    #[serde(default)]
    pub pg_bookkeeping_within_0_3_us: Option<bool>,
    /// pg's own bookkeeping per op against `raw-with-events-pg-stream`, us (median over sizes).
    #[serde(default)]
    pub pg_bookkeeping_pg_stream_us_same_rank_median: Option<f64>,
    /// The median over sizes of pg's enqueue minus raw's, us.
    pub pg_minus_raw_enqueue_us_median: Option<f64>,
    /// The same, rank by rank.
    #[serde(default)]
    pub pg_minus_raw_enqueue_us_same_rank_median: Option<f64>,
    /// The network profile's worst pg/raw device time from 64 KiB up.
    #[serde(default)]
    pub pg_over_raw_device_time_worst_from_64kib: Option<f64>,
    /// What the benchmark was sized for (`nvlink`, `network`).
    #[serde(default)]
    pub profile: Option<String>,
    /// The Rust side's versions (NCCL, driver, device).
    #[serde(default)]
    pub rust_versions: Option<checks::Versions>,
    /// The rows by size.
    pub sizes: Vec<AllReduceSize>,
    /// Whether the targets of the profile were met.
    pub targets_met: bool,
    /// PyTorch's versions, when it ran.
    #[serde(default)]
    pub torch_versions: Option<serde_json::Value>,
    /// The ranks.
    pub world_size: u64,
}

/// One (size, split) of an exchange result (`all-to-all-*.json`, `p2p-*.json`, `sizes`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExchangeSize {
    /// The message size in bytes.
    pub bytes: u64,
    /// The process group.
    pub pg: Option<Measure>,
    /// pg's enqueue minus raw's, us.
    pub pg_minus_raw_enqueue_us: Option<f64>,
    /// pg's device time over raw's.
    pub pg_over_raw_time: Option<f64>,
    /// The raw NCCL loop.
    pub raw: Option<Measure>,
    /// The split (`equal`, `skewed`; `None` for the ring).
    pub split: Option<String>,
    /// PyTorch.
    pub torch: Option<Measure>,
}

impl SizeRow for ExchangeSize {
    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn split(&self) -> Option<&str> {
        self.split.as_deref()
    }

    fn contestant(&self, contestant: &str) -> Option<&Measure> {
        pick(contestant, [&self.raw, &self.pg, &self.torch])
    }
}

/// An exchange result (`all-to-all-*.json`, `p2p-*.json`): the sizes and the targets checked over them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExchangeResult {
    /// How busbw is defined for this op.
    pub busbw_definition: String,
    /// The command that produced the run, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The commit the run was of, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The network profile's device-time target.
    #[serde(default)]
    pub device_time_within_3_percent_from_64kib: Option<bool>,
    /// pg's enqueue within 1 us of raw's (median over sizes).
    #[serde(default)]
    pub host_overhead_within_1_us: Option<bool>,
    /// The run's label.
    #[serde(default)]
    pub label: String,
    /// The machine line, where the committer added it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Why the benchmark has no figures at this world size.
    pub not_applicable: Option<String>,
    /// `all-to-all` or `p2p`.
    pub op: String,
    /// The median over sizes of pg's enqueue minus raw's, us.
    #[serde(default)]
    pub pg_minus_raw_enqueue_us_median: Option<f64>,
    /// The worst pg/raw device time from 64 KiB up.
    #[serde(default)]
    pub pg_over_raw_time_worst_from_64kib: Option<f64>,
    /// What the benchmark was sized for.
    #[serde(default)]
    pub profile: Option<String>,
    /// The Rust side's versions.
    #[serde(default)]
    pub rust_versions: Option<checks::Versions>,
    /// The process group's refusal of a send to the sender itself, as rank 0 reported it (world size 1).
    #[serde(default)]
    pub self_send_refused: Option<String>,
    /// The rows by size and split.
    pub sizes: Vec<ExchangeSize>,
    /// The all-to-all's splits, defined.
    pub splits_definition: Option<String>,
    /// PyTorch's versions, when it ran.
    #[serde(default)]
    pub torch_versions: Option<serde_json::Value>,
    /// What one op does.
    pub what: String,
    /// The ranks.
    pub world_size: u64,
}

/// A row of the PyTorch scripts' results (`torch.json`'s `rows` and `graph_rows`, `torch-<op>.json`'s `rows`), as
/// the merges read it: one contestant at one size (and split), the slowest rank's medians.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    /// The contestant (`raw`, `pg`, `raw-with-events`, ...; the PyTorch scripts leave it out).
    #[serde(default)]
    pub contestant: String,
    /// The split, where the benchmark has several.
    #[serde(default)]
    pub split: Option<String>,
    /// The message size in bytes.
    pub bytes: u64,
    /// Device time per op, us (`None`: no trial had the GPU ahead).
    #[serde(default)]
    pub time_us: Option<f64>,
    /// Bus bandwidth, GB/s (the PyTorch scripts' rows).
    #[serde(default)]
    pub busbw_gbps: Option<f64>,
    /// Host enqueue time per op, us.
    #[serde(default)]
    pub host_enqueue_us: Option<f64>,
    /// Host time of `wait()` per op, us.
    #[serde(default)]
    pub wait_us: Option<f64>,
    /// Whether the GPU was ahead of the host in every trial.
    #[serde(default)]
    pub gpu_ahead: Option<bool>,
    /// Back-to-back ops per second of host time.
    #[serde(default)]
    pub host_ops_per_s: Option<f64>,
}

/// A task's merged result that keeps every rank's own result (`bench.json`, `bench-<op>.json`,
/// `experiments.json`): whether the task's checks passed, and the ranks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskRanks<R> {
    /// Whether the task's checks passed.
    #[serde(default)]
    pub passed: bool,
    /// Every rank's result, in rank order.
    pub ranks: Vec<R>,
    /// The task.
    #[serde(default)]
    pub task: String,
    /// Rank 0's versions.
    #[serde(default)]
    pub versions: Option<checks::Versions>,
    /// The ranks.
    #[serde(default)]
    pub world_size: u64,
}

/// The result kinds with rows by size, by the start of their file name.
#[derive(Debug, Clone, PartialEq)]
pub enum SizedResult {
    /// `allreduce-*.json`.
    AllReduce(AllReduceResult),
    /// `all-to-all-*.json`, `p2p-*.json`.
    Exchange(ExchangeResult),
}

impl SizedResult {
    /// Parses the result file `name` (its stem, e.g. `allreduce-h200x2`) from `text`; `Ok(None)` for a file of
    /// another kind.
    pub fn parse(name: &str, text: &str) -> Result<Option<Self>, String> {
        let parsed = if name.starts_with("allreduce-") {
            serde_json::from_str(text).map(SizedResult::AllReduce)
        } else if name.starts_with("all-to-all-") || name.starts_with("p2p-") {
            serde_json::from_str(text).map(SizedResult::Exchange)
        } else {
            return Ok(None);
        };
        parsed.map(Some).map_err(|e| format!("{name}.json: {e}"))
    }

    /// The op the rows are of.
    pub fn op(&self) -> &str {
        match self {
            SizedResult::AllReduce(_) => "all_reduce",
            SizedResult::Exchange(result) => &result.op,
        }
    }

    /// The ranks.
    pub fn world_size(&self) -> u64 {
        match self {
            SizedResult::AllReduce(result) => result.world_size,
            SizedResult::Exchange(result) => result.world_size,
        }
    }

    /// The Rust side's versions.
    pub fn rust_versions(&self) -> Option<&checks::Versions> {
        match self {
            SizedResult::AllReduce(result) => result.rust_versions.as_ref(),
            SizedResult::Exchange(result) => result.rust_versions.as_ref(),
        }
    }

    /// Why there are no figures, if the result says so.
    pub fn not_applicable(&self) -> Option<&str> {
        match self {
            SizedResult::AllReduce(_) => None,
            SizedResult::Exchange(result) => result.not_applicable.as_deref(),
        }
    }

    /// The rows by size.
    pub fn rows(&self) -> Vec<&dyn SizeRow> {
        match self {
            SizedResult::AllReduce(result) => result.sizes.iter().map(|row| row as &dyn SizeRow).collect(),
            SizedResult::Exchange(result) => result.sizes.iter().map(|row| row as &dyn SizeRow).collect(),
        }
    }
}

/// The median of `values` (sorted in place; NaN when empty): the one median of the lab's reports.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The row's figures of `contestant` ("raw", "pg" or "torch") among `[raw, pg, torch]`.
fn pick<'a>(contestant: &str, [raw, pg, torch]: [&'a Option<Measure>; 3]) -> Option<&'a Measure> {
    match contestant {
        "raw" => raw.as_ref(),
        "pg" => pg.as_ref(),
        "torch" => torch.as_ref(),
        _ => None,
    }
}

/// One committed result of `bench/results`: its file name, its JSON text and its `.md` text (empty where it has
/// none).
#[derive(Debug, Clone)]
pub struct Committed {
    /// The JSON file's name (`interop-nccl-2.json`).
    pub name: String,
    /// The JSON text.
    pub json: String,
    /// The `.md` beside it.
    pub md: String,
}

/// The committed results whose JSON file name starts with `prefix`, in name order: what the checks that render a
/// result's tables from its JSON alone compare with the committed `.md`.
pub fn committed(prefix: &str) -> Vec<Committed> {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/results"));
    let mut found: Vec<Committed> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            (name.starts_with(prefix) && name.ends_with(".json")).then(|| Committed {
                json: std::fs::read_to_string(&path).unwrap_or_default(),
                md: std::fs::read_to_string(path.with_extension("md")).unwrap_or_default(),
                name,
            })
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed result with rows by size parses into its typed rows, and writing them back gives the same
    /// JSON (no field lost, renamed or added).
    #[test]
    fn the_committed_results_parse_into_typed_rows_and_write_back_the_same() {
        let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
        for Committed { name, json: text, .. } in committed("") {
            let name = name.trim_end_matches(".json").to_owned();
            let Some(parsed) = SizedResult::parse(&name, &text).unwrap_or_else(|e| panic!("{e}")) else { continue };
            let original: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            let written = match &parsed {
                SizedResult::AllReduce(result) => {
                    *kinds.entry("allreduce").or_default() += 1;
                    serde_json::to_value(result)
                }
                SizedResult::Exchange(result) => {
                    *kinds.entry(if result.op == "p2p" { "p2p" } else { "all-to-all" }).or_default() += 1;
                    serde_json::to_value(result)
                }
            }
            .expect("serialize");
            let difference = first_difference(&without_nulls(written), &without_nulls(original), "");
            assert!(
                difference.is_none(),
                "{name}.json does not write back the same: {}",
                difference.unwrap_or_default()
            );
            assert!(parsed.rows().iter().all(|row| row.bytes() > 0), "{name}.json: a row without a size");
        }
        for kind in ["allreduce", "all-to-all", "p2p"] {
            assert!(kinds.get(kind).is_some_and(|n| *n > 0), "no committed {kind} result parsed: {kinds:?}");
        }
    }

    /// `text` parsed as a `T` and written back.
    fn round_trip<T: serde::de::DeserializeOwned + Serialize>(text: &str) -> Result<serde_json::Value, String> {
        let typed: T = serde_json::from_str(text).map_err(|e| e.to_string())?;
        serde_json::to_value(&typed).map_err(|e| e.to_string())
    }

    /// The typed documents by the start of their file name, each parsed and written back.
    type RoundTrip = fn(&str) -> Result<serde_json::Value, String>;
    const DOCUMENTS: [(&str, RoundTrip); 9] = [
        ("conformance-", round_trip::<checks::ConformanceResult>),
        ("interop-", round_trip::<checks::InteropResult>),
        ("mixed-", round_trip::<checks::MixedResult>),
        ("train-mlp-", train_round_trip),
        ("elastic-", round_trip::<train::TrainRun>),
        ("faults-mock", round_trip::<faults::MockFaults>),
        ("faults-nccl-", round_trip::<faults::NcclFaults>),
        ("host.json", round_trip::<host::HostResult>),
        ("store-hostile.json", round_trip::<store::StoreHostileResult>),
    ];

    /// A training result in whichever of its two forms it is (the per-layout one has `layouts`).
    fn train_round_trip(text: &str) -> Result<serde_json::Value, String> {
        match serde_json::from_str::<serde_json::Value>(text).map_err(|e| e.to_string())?.get("layouts") {
            Some(_) => round_trip::<train::TrainLayoutsResult>(text),
            None => round_trip::<train::TrainResult>(text),
        }
    }

    /// Every committed result of a typed document kind parses into its type and writes back exactly the same
    /// JSON value (every key, `null` and number kind kept).
    #[test]
    fn the_committed_documents_parse_into_their_types_and_write_back_exactly() {
        let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
        for Committed { name, json: text, .. } in committed("") {
            let Some((kind, round_trip)) = DOCUMENTS.iter().find(|(prefix, _)| name.starts_with(prefix)) else {
                continue;
            };
            let written = round_trip(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let original: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            let difference = first_difference(&written, &original, "");
            assert!(difference.is_none(), "{name} does not write back the same: {}", difference.unwrap_or_default());
            *kinds.entry(kind).or_default() += 1;
        }
        for (kind, _) in DOCUMENTS {
            assert!(kinds.get(kind).is_some_and(|n| *n > 0), "no committed {kind}*.json parsed: {kinds:?}");
        }
    }

    /// The round trip loses what a type does not declare, so the test above sees a field the types miss.
    #[test]
    fn a_field_the_type_does_not_declare_is_a_difference() {
        let text = r#"{"backend": "nccl", "cases": [], "versions": null, "world_size": 2, "new_field": 1}"#;
        let written = round_trip::<checks::ConformanceResult>(text).expect("parses");
        let original: serde_json::Value = serde_json::from_str(text).expect("JSON");
        assert_eq!(
            first_difference(&written, &original, ""),
            Some("/new_field: written None, committed Some(Number(1))".to_owned())
        );
    }

    /// The first place where `written` and `original` differ, as a path and the two values there.
    fn first_difference(written: &serde_json::Value, original: &serde_json::Value, at: &str) -> Option<String> {
        use serde_json::Value;
        match (written, original) {
            (Value::Object(w), Value::Object(o)) => {
                let keys: std::collections::BTreeSet<&String> = w.keys().chain(o.keys()).collect();
                keys.into_iter().find_map(|key| match (w.get(key), o.get(key)) {
                    (Some(a), Some(b)) => first_difference(a, b, &format!("{at}/{key}")),
                    (a, b) => Some(format!("{at}/{key}: written {a:?}, committed {b:?}")),
                })
            }
            (Value::Array(w), Value::Array(o)) if w.len() == o.len() => {
                w.iter().zip(o).enumerate().find_map(|(i, (a, b))| first_difference(a, b, &format!("{at}/{i}")))
            }
            (a, b) if a == b => None,
            (a, b) => Some(format!("{at}: written {a}, committed {b}")),
        }
    }

    /// `value` without the object members that are `null` (an older file leaves out a field a newer one writes as
    /// `null`; both read as `None`).
    fn without_nulls(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, without_nulls(v))).collect()
            }
            serde_json::Value::Array(items) => items.into_iter().map(without_nulls).collect(),
            // An integer and the same float are one figure.
            serde_json::Value::Number(n) => n.as_f64().map_or(serde_json::Value::Number(n), serde_json::Value::from),
            other => other,
        }
    }
}

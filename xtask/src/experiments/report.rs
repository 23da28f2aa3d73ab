//! Aggregating every rank's results into the experiments' tables and the JSON report.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::semantics::CONFIGS;
use super::streams::StreamsRankRow;
use super::{ExperimentConfig, RankResults};

/// One row of the cache table.
#[derive(Debug, Clone, Serialize)]
pub struct CacheRow {
    /// The group.
    pub group: String,
    /// Whether it asked for high-priority streams.
    pub high_priority: bool,
    /// Ops across all ranks.
    pub rank_operations: usize,
    /// Communicators created across all ranks.
    pub comm_creations: u64,
    /// Whether no rank created a communicator after the group's first op.
    pub reused_after_first: bool,
    /// Whether every op on every rank was right.
    pub correct: bool,
}

/// One row of the semantics table: medians and fractions over every sample of a configuration.
#[derive(Debug, Clone, Serialize)]
pub struct SemanticsRow {
    /// The configuration.
    pub config: String,
    /// Samples (2 orders x cycles x ranks).
    pub samples: usize,
    /// Median host time of the sleep kernel alone.
    pub sleep_gpu_us: f64,
    /// Median host time of the action.
    pub action_host_us: f64,
    /// Median host time of the device synchronize after the action.
    pub device_sync_host_us: f64,
    /// Fraction of samples whose Work was complete right after enqueue.
    pub completed_after_enqueue: f64,
    /// Fraction of samples whose Work was complete right after the action.
    pub completed_after_action: f64,
    /// Fraction of samples whose Future was done right after enqueue.
    pub future_done_after_enqueue: f64,
    /// Fraction of samples where an unrelated stream's kernel finished first.
    pub free_stream_done_first: f64,
    /// Fraction of samples with a right result.
    pub correct_fraction: f64,
}

/// The whole report, as written to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `mock` or `nccl`.
    pub backend: String,
    /// Ranks.
    pub world_size: usize,
    /// Rank 0's device.
    pub device: String,
    /// The backend's versions, and pg's.
    pub versions: BTreeMap<String, String>,
    /// The experiments' settings.
    pub settings: BTreeMap<String, f64>,
    /// The cache table.
    pub cache: Vec<CacheRow>,
    /// The semantics table.
    pub semantics: Vec<SemanticsRow>,
    /// The streams table.
    pub streams: Vec<StreamsRankRow>,
}

/// The median of `values` to one decimal (0 when empty: a table cell).
fn median(mut values: Vec<f64>) -> f64 {
    match values.is_empty() {
        true => 0.0,
        false => (pg_lab::results::median(&mut values) * 10.0).round() / 10.0,
    }
}

fn fraction(flags: impl Iterator<Item = bool>) -> f64 {
    let (hits, total) = flags.fold((0usize, 0usize), |(h, t), f| (h + usize::from(f), t + 1));
    match total {
        0 => 0.0,
        _ => (hits as f64 / total as f64 * 100.0).round() / 100.0,
    }
}

/// Puts every rank's results together.
pub fn aggregate(backend: &str, config: &ExperimentConfig, mut ranks: Vec<RankResults>) -> Result<Report, String> {
    ranks.sort_by_key(|r| r.rank);
    if ranks.len() != config.world_size || ranks.iter().enumerate().any(|(i, r)| r.rank != i) {
        return Err(format!("expected results from ranks 0..{}, got {}", config.world_size, ranks.len()));
    }
    let mut versions: BTreeMap<String, String> = ranks[0].versions.iter().cloned().collect();
    versions.insert("pg".to_owned(), env!("CARGO_PKG_VERSION").to_owned());
    let groups: Vec<_> = ranks[0].cache.iter().map(|row| (row.group.clone(), row.high_priority)).collect();
    let cache = groups
        .into_iter()
        .map(|(group, high_priority)| {
            let rows: Vec<_> = ranks.iter().flat_map(|r| r.cache.iter().filter(|c| c.group == group)).collect();
            CacheRow {
                group,
                high_priority,
                rank_operations: rows.iter().map(|r| r.operations).sum(),
                comm_creations: rows.iter().map(|r| r.creations).sum(),
                reused_after_first: rows.iter().all(|r| r.creations_after_first == 0),
                correct: rows.iter().all(|r| r.correct),
            }
        })
        .collect();
    let semantics = CONFIGS
        .iter()
        .map(|config| {
            let samples: Vec<_> =
                ranks.iter().flat_map(|r| r.semantics.iter().filter(|s| s.config == *config)).collect();
            SemanticsRow {
                config: (*config).to_owned(),
                samples: samples.len(),
                sleep_gpu_us: median(samples.iter().map(|s| s.sleep_gpu_us).collect()),
                action_host_us: median(samples.iter().map(|s| s.action_host_us).collect()),
                device_sync_host_us: median(samples.iter().map(|s| s.device_sync_host_us).collect()),
                completed_after_enqueue: fraction(samples.iter().map(|s| s.completed_after_enqueue)),
                completed_after_action: fraction(samples.iter().map(|s| s.completed_after_action)),
                future_done_after_enqueue: fraction(samples.iter().map(|s| s.future_done_after_enqueue)),
                free_stream_done_first: fraction(samples.iter().map(|s| s.free_stream_done_first)),
                correct_fraction: fraction(samples.iter().map(|s| s.correct)),
            }
        })
        .collect();
    let settings = BTreeMap::from([
        ("sleep_us".to_owned(), config.sleep.as_secs_f64() * 1e6),
        ("cycles".to_owned(), config.cycles as f64),
        ("message_bytes".to_owned(), config.message_bytes as f64),
        ("ops_per_group".to_owned(), config.ops_per_group as f64),
    ]);
    Ok(Report {
        backend: backend.to_owned(),
        world_size: config.world_size,
        device: ranks[0].device.clone(),
        versions,
        settings,
        cache,
        semantics,
        streams: ranks.iter().map(|r| r.streams.clone()).collect(),
    })
}

impl Report {
    /// Whether every result of every experiment was right.
    pub fn all_correct(&self) -> bool {
        self.cache.iter().all(|r| r.correct) && self.semantics.iter().all(|r| r.correct_fraction == 1.0)
    }

    /// The three tables, as text.
    pub fn tables(&self) -> String {
        let mut out = String::new();
        let b = |flag: bool| u8::from(flag);
        let _ = writeln!(out, "backend {}, world size {}, device {}", self.backend, self.world_size, self.device);
        let _ = writeln!(out, "\ncache");
        let _ = writeln!(
            out,
            "{:<22}{:>14}{:>17}{:>16}{:>20}{:>9}",
            "group", "high priority", "rank operations", "comm creations", "reused after first", "correct"
        );
        for r in &self.cache {
            let _ = writeln!(
                out,
                "{:<22}{:>14}{:>17}{:>16}{:>20}{:>9}",
                r.group,
                b(r.high_priority),
                r.rank_operations,
                r.comm_creations,
                b(r.reused_after_first),
                b(r.correct)
            );
        }
        let _ = writeln!(out, "\nsemantics");
        let _ = writeln!(
            out,
            "{:<26}{:>8}{:>15}{:>16}{:>22}{:>24}{:>20}{:>18}{:>9}",
            "config",
            "samples",
            "sleep GPU us",
            "action host us",
            "device sync host us",
            "completed after action",
            "future done (enq)",
            "free stream first",
            "correct"
        );
        for r in &self.semantics {
            let _ = writeln!(
                out,
                "{:<26}{:>8}{:>15.1}{:>16.1}{:>22.1}{:>24.2}{:>20.2}{:>18.2}{:>9.2}",
                r.config,
                r.samples,
                r.sleep_gpu_us,
                r.action_host_us,
                r.device_sync_host_us,
                r.completed_after_action,
                r.future_done_after_enqueue,
                r.free_stream_done_first,
                r.correct_fraction
            );
        }
        let _ = writeln!(out, "\nstreams");
        let _ = writeln!(
            out,
            "{:<6}{:>14}{:>14}{:>16}{:>15}{:>10}",
            "rank", "comm kernels", "sleep kernels", "current stream", "comm stream", "disjoint"
        );
        for r in &self.streams {
            let _ = writeln!(
                out,
                "{:<6}{:>14}{:>14}{:>16}{:>15}{:>10}",
                r.rank,
                r.comm_kernels,
                r.sleep_kernels,
                r.current_stream,
                r.comm_stream,
                b(r.disjoint)
            );
        }
        out
    }
}

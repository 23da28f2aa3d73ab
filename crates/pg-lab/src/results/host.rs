//! pg-core's own host cost per op on the no-op backend as types (`host.json`, written by `cargo xtask bench
//! host`): a row per configuration of the watchdog and flight recorder. Field names are the JSON's; fields are
//! declared in the JSON's (alphabetical) key order.

use serde::{Deserialize, Serialize};

/// One configuration's rounds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostRow {
    /// The median round, ns per op.
    pub median_ns: f64,
    /// Every round, ns per op, in ascending order.
    pub ns_per_op_rounds: Vec<f64>,
    /// The flight recorder's entries (0: off).
    pub trace_buffer: u64,
    /// Whether the watchdog ran.
    pub watchdog: bool,
    /// The watchdog's period, ms.
    pub watchdog_period_ms: u64,
}

/// The host-cost result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostResult {
    /// The command that produced it.
    pub command: String,
    /// The commit it was of.
    pub commit: String,
    /// The machine.
    pub machine: String,
    /// Ops per round.
    pub ops_per_round: u64,
    /// A row per configuration.
    pub results: Vec<HostRow>,
}

//! The simulated timelines that `cargo xtask experiments --trace` and `cargo xtask faults --trace` write: each
//! world's [`pg_mock::Trace`] as Chrome trace-event JSON, and for a fault scenario whose ranks dumped their flight
//! recorders, the dumps' ops and fr-analyze's first divergence on tracks beside the streams (the same tracks
//! `fr-analyze --trace` draws, `fr_trace.rs`), on the same virtual clock.

use std::path::Path;

use pg_core::json::Value;

/// How many timeline records the experiments' worlds keep (a full run of the semantics experiment needs a few
/// thousand per rank).
pub const CAPACITY: usize = 1 << 20;

/// Writes `json` to `path`.
pub fn write(path: &Path, json: &Value) -> Result<(), String> {
    std::fs::write(path, json.to_string()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `trace` with the flight-recorder dumps in `dumps` (files `nccl_trace_rank_*`, if any) added: each rank's
/// groups as tracks of its process, each op a slice, the first divergence marked on the ranks it names.
pub fn with_flight_recorder(trace: &pg_mock::Trace, dumps: &Path) -> Value {
    let mut events = trace.chrome_events();
    let named = crate::fr_analyze::read_dir(dumps, "nccl_trace_rank_").unwrap_or_default();
    if !named.is_empty() {
        let reports = crate::fr_analyze::analyze(&named);
        let ranked: Vec<(usize, serde_json::Value)> = named
            .iter()
            .filter_map(|(file, dump)| crate::fr_analyze::rank_of(file, dump).map(|rank| (rank, dump.clone())))
            .collect();
        crate::fr_trace::add(&mut events, &ranked, &reports, pg_mock::Trace::FREE_TRACKS);
    }
    events.into_json()
}

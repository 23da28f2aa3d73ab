//! `Options`: how a process group behaves, from a builder and from PyTorch's environment variables.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Error, Result};

/// PyTorch's default NCCL process-group timeout: 10 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The default of [`Options::input_ready_events`].
const DEFAULT_INPUT_READY_EVENTS: usize = 4;

/// The most input-ready events a communicator cycles through.
const MAX_INPUT_READY_EVENTS: usize = 64;

/// What the watchdog does when it finds an error (`TORCH_NCCL_ASYNC_ERROR_HANDLING`, default 3).
///
/// In every mode the error is recorded on the failed Work and the group, and the device is poisoned
/// ([`crate::Poison`]): reads and host synchronisations through the device then fail with the error, so the
/// output of an op that never completed cannot be read as if it had.
/// "Tear down" in PyTorch kills the process; in this library it means the group is aborted and every later
/// call returns the error, and the process lives on unless [`Options::end_process_on_error`] is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorHandling {
    /// 0: record the error on the Work and poison the device, nothing else: the communicators are not aborted,
    /// so the group's streams stay blocked behind the failed op.
    NoHandling,
    /// 1: abort the communicators (the streams drain) and tear the group down.
    TearDown,
    /// 2: abort the communicators (the streams drain), keep the group usable for reporting.
    CleanUpOnly,
    /// 3 (default): tear the group down. PyTorch skips aborting the communicators here because it ends the
    /// process; a process that lives on needs its streams to drain, so this library aborts them too.
    SkipCleanUp,
}

impl ErrorHandling {
    /// PyTorch's `SHOULD_CLEAN_UP`: abort the communicators.
    pub fn should_clean_up(self) -> bool {
        !matches!(self, ErrorHandling::NoHandling | ErrorHandling::SkipCleanUp)
    }

    /// Whether the watchdog aborts the group's communicators on an error, so that the streams blocked behind
    /// the failed op drain: every mode but [`ErrorHandling::NoHandling`] (see [`ErrorHandling::SkipCleanUp`]).
    pub fn aborts_communicators(self) -> bool {
        self != ErrorHandling::NoHandling
    }

    /// PyTorch's `SHOULD_TEAR_DOWN`: the group is dead after the error.
    pub fn should_tear_down(self) -> bool {
        !matches!(self, ErrorHandling::NoHandling | ErrorHandling::CleanUpOnly)
    }

    fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => ErrorHandling::NoHandling,
            1 => ErrorHandling::TearDown,
            2 => ErrorHandling::CleanUpOnly,
            3 => ErrorHandling::SkipCleanUp,
            _ => return None,
        })
    }
}

/// The settings of one process group. Build them with [`Options::builder`]: a new setting is a new builder method,
/// never a break of the programs that build them (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Per-Work timeout, from the Work's host start time, and the bound on creating a communicator (its unique
    /// id, the other ranks' joins, a non-blocking init); default 10 min.
    pub timeout: Duration,
    /// Take the communication streams from the high-priority pool (`TORCH_NCCL_HIGH_PRIORITY`).
    pub high_priority_stream: bool,
    /// `wait()` blocks the host until the Work completes or times out (`TORCH_NCCL_BLOCKING_WAIT`).
    pub blocking_wait: bool,
    /// Keep inputs and outputs alive on the Work instead of `record_stream` (`TORCH_NCCL_AVOID_RECORD_STREAMS`).
    pub avoid_record_streams: bool,
    /// Create the collective communicator when the group is created, not at the first op (PyTorch: `device_id`).
    pub eager_init: bool,
    /// Create communicators with non-blocking init (`TORCH_NCCL_USE_COMM_NONBLOCKING`).
    pub nonblocking_init: bool,
    /// What the watchdog does on an error (`TORCH_NCCL_ASYNC_ERROR_HANDLING`).
    pub error_handling: ErrorHandling,
    /// On a failed or dead peer (a Work timeout, a communicator error, a peer's `remote_error` key, a stuck
    /// watchdog), revoke the group instead of what `error_handling` says ([`crate::ProcessGroup::revoke`]): the
    /// Works in flight fail (the failed one with its error, the others with [`crate::Error::Revoked`]), the device
    /// is not poisoned, and the group is left for [`crate::ProcessGroup::agree_survivors`] and
    /// [`crate::ProcessGroup::shrink`] (pg's own; `PG_REVOKE_ON_ERROR`, default off). Such a group also tells
    /// its peers through the store and listens for theirs, as with [`Options::propagate_error`]: on NCCL only the
    /// ranks that exchange data with a dead one see its sockets close, and every survivor must reach the
    /// agreement in time.
    pub revoke_on_error: bool,
    /// Hold a store connection of its own saying this rank is alive, and read the store for peers whose connection
    /// closed (pg's own; `PG_LIVENESS`, default off): with pg's TCP store server a killed rank's death is known to
    /// every rank within [`Options::watchdog_period`] or 10 ms, whichever is shorter, and fails the group as a peer's
    /// [`crate::Error::RankDead`] (revoking it with [`Options::revoke_on_error`]); the survivors' agreement then
    /// waits for no dead rank. A live rank is never declared dead (only a closed connection tells; a connection that
    /// the network cuts while its process lives is taken for a death, which the server cannot tell apart). Off by default
    /// because it costs: one more store connection per group and rank, and a store read every 10 ms from the
    /// watchdog (nothing on the enqueue path). A store that does not publish deaths (PyTorch's server) is logged and
    /// the group runs as without it. A store hosted by a rank that dies goes with it: use a standalone `pgstore`.
    pub liveness: bool,
    /// End the process as PyTorch does (`std::process::abort`, SIGABRT) once the watchdog found an error in a
    /// mode that tears down (1 or 3) and the flight recorder is dumped, or once the heartbeat monitor found the
    /// watchdog stuck (pg's own; `PG_END_PROCESS_ON_ERROR`, default off).
    pub end_process_on_error: bool,
    /// Run the watchdog thread (it never runs with blocking wait, as in PyTorch).
    pub enable_watchdog: bool,
    /// How often the watchdog polls the in-flight Works (PyTorch: 100 ms).
    pub watchdog_period: Duration,
    /// How often a blocking `wait()` polls for completion (PyTorch: 1 ms).
    pub blocking_wait_poll: Duration,
    /// Watchdog heartbeat timeout (`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`, default 480 s).
    pub heartbeat_timeout: Duration,
    /// Run the heartbeat monitor (`TORCH_NCCL_ENABLE_MONITORING`, default on).
    pub enable_monitoring: bool,
    /// Flight-recorder entries kept (`TORCH_NCCL_TRACE_BUFFER_SIZE`, default 2000; 0 disables it).
    pub trace_buffer_size: usize,
    /// Dump the flight recorder on timeout (`TORCH_NCCL_DUMP_ON_TIMEOUT`, default on).
    pub dump_on_timeout: bool,
    /// Where dumps go: the rank is appended (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE`, default `/tmp/nccl_trace_rank_`).
    pub dump_path_prefix: String,
    /// Write the failing rank to the store so peers learn of it (`TORCH_NCCL_PROPAGATE_ERROR`). A group with
    /// [`Options::revoke_on_error`] does so whatever this says (see [`Options::signals_peers`]).
    pub propagate_error: bool,
    /// Desync debugging: trace keys in the store and a desync report on timeout (`TORCH_NCCL_DESYNC_DEBUG`).
    pub desync_debug: bool,
    /// Compare the chunk sizes of every all-to-all and list all-gather/reduce-scatter across ranks through the
    /// store before enqueueing it, and fail on every rank if two ranks disagree (pg's own; `PG_CHECK_CHUNK_SIZES`,
    /// default off: a store round trip per op). Without it, NCCL leaves a rank whose peer sends or expects other
    /// sizes waiting until the timeout, and may complete the peer's op with a truncated chunk.
    pub check_chunk_sizes: bool,
    /// Reuse the memory and end event of completed Works that nothing holds any more (pg's own; `PG_REUSE_WORKS`,
    /// default on): a steady stream of ops then allocates nothing.
    pub reuse_works: bool,
    /// How many input-ready events each communicator cycles through (pg's own; `PG_INPUT_READY_EVENTS`,
    /// default 4, at least 1). PyTorch re-records one event per key every op; with several, an op records one
    /// whose previous record is long complete rather than one that may still be pending (on H200 the bench
    /// measured 0.14 us less per op, within its noise). The stream semantics are the same for any count: the
    /// communication stream waits on the record just made.
    pub input_ready_events: usize,
    /// Record a timeline of the group's ops into this directory (pg's own; `PG_TRACE=DIR`, default none): each
    /// op's host enqueue and its device start and end from timing events recorded around its launch, written as
    /// `DIR/rank{r}.json` (Chrome's trace-event format, one file per world rank with every traced group of it)
    /// at [`crate::ProcessGroup::flush_trace`], shutdown and drop, with times on the wall clock so that the
    /// ranks' files line up (`cargo xtask trace-merge DIR` joins them). Off, the enqueue path records nothing.
    pub trace_dir: Option<PathBuf>,
    /// The group's name (PyTorch's `group_name`, `"0"` for the default group).
    pub group_name: String,
    /// The group's description (PyTorch's `group_desc`, `default_pg` for the default group).
    pub group_desc: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            high_priority_stream: false,
            blocking_wait: false,
            avoid_record_streams: false,
            eager_init: false,
            nonblocking_init: false,
            error_handling: ErrorHandling::SkipCleanUp,
            end_process_on_error: false,
            revoke_on_error: false,
            liveness: false,
            enable_watchdog: true,
            watchdog_period: Duration::from_millis(100),
            blocking_wait_poll: Duration::from_millis(1),
            heartbeat_timeout: Duration::from_secs(480),
            enable_monitoring: true,
            trace_buffer_size: 2000,
            dump_on_timeout: true,
            dump_path_prefix: "/tmp/nccl_trace_rank_".to_owned(),
            propagate_error: false,
            desync_debug: false,
            check_chunk_sizes: false,
            reuse_works: true,
            input_ready_events: DEFAULT_INPUT_READY_EVENTS,
            trace_dir: None,
            group_name: "0".to_owned(),
            group_desc: "default_pg".to_owned(),
        }
    }
}

impl Options {
    /// A builder starting from PyTorch's defaults.
    pub fn builder() -> OptionsBuilder {
        OptionsBuilder { options: Options::default() }
    }

    /// Whether the group writes its failure to the store for its peers and polls for theirs each watchdog pass:
    /// [`Options::propagate_error`], or [`Options::revoke_on_error`] (whose recovery needs every survivor).
    pub fn signals_peers(&self) -> bool {
        self.propagate_error || self.revoke_on_error
    }
}

/// Builds [`Options`]; environment overrides are applied last, as PyTorch reads them in the constructor.
#[derive(Debug, Clone)]
pub struct OptionsBuilder {
    options: Options,
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.options.$name = value;
            self
        }
    };
}

impl OptionsBuilder {
    setter!(/// Sets [`Options::timeout`].
        timeout: Duration);
    setter!(/// Sets [`Options::high_priority_stream`].
        high_priority_stream: bool);
    setter!(/// Sets [`Options::blocking_wait`].
        blocking_wait: bool);
    setter!(/// Sets [`Options::avoid_record_streams`].
        avoid_record_streams: bool);
    setter!(/// Sets [`Options::eager_init`].
        eager_init: bool);
    setter!(/// Sets [`Options::nonblocking_init`].
        nonblocking_init: bool);
    setter!(/// Sets [`Options::error_handling`].
        error_handling: ErrorHandling);
    setter!(/// Sets [`Options::end_process_on_error`].
        end_process_on_error: bool);
    setter!(/// Sets [`Options::revoke_on_error`].
        revoke_on_error: bool);
    setter!(/// Sets [`Options::liveness`].
        liveness: bool);
    setter!(/// Sets [`Options::enable_watchdog`].
        enable_watchdog: bool);
    setter!(/// Sets [`Options::watchdog_period`].
        watchdog_period: Duration);
    setter!(/// Sets [`Options::blocking_wait_poll`].
        blocking_wait_poll: Duration);
    setter!(/// Sets [`Options::heartbeat_timeout`].
        heartbeat_timeout: Duration);
    setter!(/// Sets [`Options::enable_monitoring`].
        enable_monitoring: bool);
    setter!(/// Sets [`Options::trace_buffer_size`].
        trace_buffer_size: usize);
    setter!(/// Sets [`Options::dump_on_timeout`].
        dump_on_timeout: bool);
    setter!(/// Sets [`Options::dump_path_prefix`].
        dump_path_prefix: String);
    setter!(/// Sets [`Options::propagate_error`].
        propagate_error: bool);
    setter!(/// Sets [`Options::desync_debug`].
        desync_debug: bool);
    setter!(/// Sets [`Options::check_chunk_sizes`].
        check_chunk_sizes: bool);
    setter!(/// Sets [`Options::reuse_works`].
        reuse_works: bool);
    setter!(/// Sets [`Options::input_ready_events`] (0 is taken as 1).
        input_ready_events: usize);
    setter!(/// Sets [`Options::trace_dir`].
        trace_dir: Option<PathBuf>);
    setter!(/// Sets [`Options::group_name`].
        group_name: String);
    setter!(/// Sets [`Options::group_desc`].
        group_desc: String);

    /// The options, without looking at the environment.
    pub fn build(self) -> Options {
        self.options
    }

    /// The options with PyTorch's environment variables applied on top (invalid values are errors).
    pub fn build_with_env(self) -> Result<Options> {
        self.build_with_env_from(|name| std::env::var(name).ok())
    }

    /// The options with environment variables read through `lookup` applied on top (for tests and tools).
    pub fn build_with_env_from(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<Options> {
        let env = Env { lookup: &lookup };
        let o = &mut self.options;
        env.bool(&["TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"], &mut o.blocking_wait)?;
        env.bool(&["TORCH_NCCL_HIGH_PRIORITY"], &mut o.high_priority_stream)?;
        env.bool(&["TORCH_NCCL_AVOID_RECORD_STREAMS"], &mut o.avoid_record_streams)?;
        env.bool(&["TORCH_NCCL_USE_COMM_NONBLOCKING"], &mut o.nonblocking_init)?;
        env.bool(&["TORCH_NCCL_ENABLE_MONITORING"], &mut o.enable_monitoring)?;
        env.bool(&["TORCH_NCCL_DUMP_ON_TIMEOUT"], &mut o.dump_on_timeout)?;
        env.bool(&["TORCH_NCCL_PROPAGATE_ERROR"], &mut o.propagate_error)?;
        env.bool(&["TORCH_NCCL_DESYNC_DEBUG", "NCCL_DESYNC_DEBUG"], &mut o.desync_debug)?;
        env.bool(&["PG_REUSE_WORKS"], &mut o.reuse_works)?;
        env.bool(&["PG_CHECK_CHUNK_SIZES"], &mut o.check_chunk_sizes)?;
        env.bool(&["PG_END_PROCESS_ON_ERROR"], &mut o.end_process_on_error)?;
        env.bool(&["PG_REVOKE_ON_ERROR"], &mut o.revoke_on_error)?;
        env.bool(&["PG_LIVENESS"], &mut o.liveness)?;
        if let Some((name, code)) = env.int(&["TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"])? {
            o.error_handling = ErrorHandling::from_code(code)
                .ok_or_else(|| Error::invalid(format!("{name}={code}: expected 0, 1, 2 or 3")))?;
        }
        if let Some((name, secs)) = env.int(&["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"])? {
            let secs = u64::try_from(secs).map_err(|_| Error::invalid(format!("{name}={secs}: must be >= 0")))?;
            o.heartbeat_timeout = Duration::from_secs(secs);
        }
        if let Some((name, size)) = env.int(&["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])? {
            o.trace_buffer_size =
                usize::try_from(size).map_err(|_| Error::invalid(format!("{name}={size}: must be >= 0")))?;
        }
        if let Some((name, count)) = env.int(&["PG_INPUT_READY_EVENTS"])? {
            o.input_ready_events = usize::try_from(count)
                .ok()
                .filter(|count| (1..=MAX_INPUT_READY_EVENTS).contains(count))
                .ok_or_else(|| Error::invalid(format!("{name}={count}: expected 1 to {MAX_INPUT_READY_EVENTS}")))?;
        }
        if let Some(prefix) = env.string(&["TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]) {
            o.dump_path_prefix = prefix;
        }
        if let Some(dir) = env.string(&["PG_TRACE"]) {
            // Set and empty turns tracing off, as unsetting it would.
            o.trace_dir = (!dir.trim().is_empty()).then(|| PathBuf::from(dir));
        }
        if o.blocking_wait {
            // PyTorch starts no watchdog under blocking wait: errors surface in `wait()`.
            o.enable_watchdog = false;
        }
        Ok(self.options)
    }
}

struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    /// The first of `names` that is set, with its value.
    fn first(&self, names: &[&'static str]) -> Option<(&'static str, String)> {
        names.iter().find_map(|name| (self.lookup)(name).map(|value| (*name, value)))
    }

    fn bool(&self, names: &[&'static str], target: &mut bool) -> Result<()> {
        if let Some((name, value)) = self.first(names) {
            *target = match value.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(Error::invalid(format!("{name}={value:?}: expected 0 or 1 (or true/false)"))),
            };
        }
        Ok(())
    }

    fn int(&self, names: &[&'static str]) -> Result<Option<(&'static str, i64)>> {
        match self.first(names) {
            None => Ok(None),
            Some((name, value)) => value
                .trim()
                .parse()
                .map(|parsed| Some((name, parsed)))
                .map_err(|_| Error::invalid(format!("{name}={value:?}: expected an integer"))),
        }
    }

    fn string(&self, names: &[&'static str]) -> Option<String> {
        self.first(names).map(|(_, value)| value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(vars: &[(&str, &str)], expect: impl Fn(Result<Options>)) {
        let lookup = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned());
        expect(Options::builder().build_with_env_from(lookup));
    }

    #[test]
    fn defaults_match_pytorch() {
        check(&[], |o| {
            let o = o.unwrap();
            assert_eq!(o.timeout, Duration::from_secs(600));
            assert!(!o.blocking_wait && !o.high_priority_stream && !o.avoid_record_streams);
            assert_eq!(o.error_handling, ErrorHandling::SkipCleanUp);
            assert_eq!(o.heartbeat_timeout, Duration::from_secs(480));
            assert_eq!(o.trace_buffer_size, 2000);
            assert!(o.enable_watchdog);
        });
    }

    #[test]
    fn env_overrides_builder() {
        check(&[("TORCH_NCCL_BLOCKING_WAIT", "1")], |o| {
            let o = o.unwrap();
            assert!(o.blocking_wait);
            assert!(!o.enable_watchdog, "no watchdog under blocking wait");
        });
        check(&[("NCCL_BLOCKING_WAIT", "true")], |o| assert!(o.unwrap().blocking_wait));
        check(&[("TORCH_NCCL_HIGH_PRIORITY", "1")], |o| assert!(o.unwrap().high_priority_stream));
        check(&[("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")], |o| assert!(o.unwrap().avoid_record_streams));
        check(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")], |o| {
            assert_eq!(o.unwrap().error_handling, ErrorHandling::TearDown)
        });
        check(&[("TORCH_NCCL_TRACE_BUFFER_SIZE", "16")], |o| assert_eq!(o.unwrap().trace_buffer_size, 16));
        check(&[], |o| assert!(o.unwrap().reuse_works, "reuse is on by default"));
        check(&[("PG_REUSE_WORKS", "0")], |o| assert!(!o.unwrap().reuse_works));
        check(&[], |o| assert_eq!(o.unwrap().input_ready_events, 4));
        check(&[("PG_INPUT_READY_EVENTS", "1")], |o| assert_eq!(o.unwrap().input_ready_events, 1));
        check(&[], |o| assert!(!o.unwrap().end_process_on_error, "the process lives on by default"));
        check(&[("PG_END_PROCESS_ON_ERROR", "1")], |o| assert!(o.unwrap().end_process_on_error));
        check(&[], |o| assert!(!o.unwrap().revoke_on_error, "a failed peer tears the group down by default"));
        check(&[("PG_REVOKE_ON_ERROR", "1")], |o| assert!(o.unwrap().revoke_on_error));
        check(&[], |o| assert!(!o.unwrap().liveness, "liveness costs a connection and store reads: off by default"));
        check(&[("PG_LIVENESS", "1")], |o| assert!(o.unwrap().liveness));
        check(&[], |o| assert_eq!(o.unwrap().trace_dir, None, "no trace by default"));
        check(&[("PG_TRACE", "/tmp/pg-trace")], |o| {
            assert_eq!(o.unwrap().trace_dir, Some(PathBuf::from("/tmp/pg-trace")))
        });
        check(&[("PG_TRACE", "")], |o| assert_eq!(o.unwrap().trace_dir, None, "empty is off"));
    }

    #[test]
    fn every_mode_but_no_handling_aborts_the_communicators() {
        assert!(!ErrorHandling::NoHandling.aborts_communicators());
        for mode in [ErrorHandling::TearDown, ErrorHandling::CleanUpOnly, ErrorHandling::SkipCleanUp] {
            assert!(mode.aborts_communicators(), "{mode:?}");
        }
    }

    #[test]
    fn invalid_env_values_are_errors_naming_the_variable() {
        for bad in ["abc", "-1", "2147483647"] {
            check(&[("TORCH_NCCL_BLOCKING_WAIT", bad)], |o| {
                let message = o.unwrap_err().to_string();
                assert!(message.contains("TORCH_NCCL_BLOCKING_WAIT"), "{message}");
            });
        }
        check(&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "7")], |o| {
            assert!(o.unwrap_err().to_string().contains("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
        });
        check(&[("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "soon")], |o| assert!(o.is_err()));
        for bad in ["0", "-2", "100000"] {
            check(&[("PG_INPUT_READY_EVENTS", bad)], |o| {
                assert!(o.unwrap_err().to_string().contains("PG_INPUT_READY_EVENTS="), "{bad}")
            });
        }
    }
}

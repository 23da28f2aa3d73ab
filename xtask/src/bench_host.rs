//! `cargo xtask bench host`: the host cost of pg-core's own per-op work, measured on a no-op backend whose
//! primitives cost nothing, so that what remains is the process group's bookkeeping (no GPU needed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_core::noop::{Noop, NoopDevice};
use pg_core::store::HashStore;
use pg_core::{DType, EnqueueStep, Options, ProcessGroup, ReduceOp};
use pg_lab::results::host::{HostResult, HostRow};

const HELP: &str = "\
cargo xtask bench host [--ops N] [--watchdog on|off] [--watchdog-period-ms N] [--trace-buffer N] [--out DIR]

The host time of ProcessGroup::all_reduce plus WorkHandle::wait on a no-op backend (every device primitive
returns at once): the cost of pg-core's own bookkeeping per op, median of 9 rounds of N ops (default 200000).
Without a configuration flag it measures four: the watchdog on (passes every 100 ms, and passes that never come),
the watchdog off, and the watchdog and flight recorder off. Writes host.md and host.json into --out (default
bench/results). Run it as `cargo run --release -p xtask -- bench host` for figures worth keeping. With PG_TIME_ENQUEUE=1 it also writes where each
enqueue's time goes, step by step (the timers' own clock reads included: time the figures without it).
";

/// One configuration of the group under measurement.
#[derive(Debug, Clone, Copy)]
struct Config {
    watchdog: bool,
    period_ms: u64,
    trace_buffer: usize,
}

impl Config {
    fn describe(&self) -> String {
        match self.watchdog {
            true => format!("watchdog on, pass every {} ms, flight recorder {}", self.period_ms, self.trace_buffer),
            false => format!("watchdog off, flight recorder {}", self.trace_buffer),
        }
    }
}

/// The configurations measured by default: what the watchdog and the flight recorder each cost.
const DEFAULT_CONFIGS: [Config; 4] = [
    Config { watchdog: true, period_ms: 100, trace_buffer: 2000 },
    Config { watchdog: true, period_ms: 100_000, trace_buffer: 2000 },
    Config { watchdog: false, period_ms: 100, trace_buffer: 2000 },
    Config { watchdog: false, period_ms: 100, trace_buffer: 0 },
];

/// Nanoseconds per op of each of 9 rounds, sorted.
fn measure(config: Config, ops: usize) -> std::result::Result<Vec<f64>, String> {
    let device = NoopDevice::default();
    let options = Options::builder()
        .enable_watchdog(config.watchdog)
        .trace_buffer_size(config.trace_buffer)
        .watchdog_period(Duration::from_millis(config.period_ms))
        .build();
    let group = ProcessGroup::<Noop>::new(Arc::new(HashStore::new()), 0, 1, device.clone(), options)
        .map_err(|e| e.to_string())?;
    let buffer = pg_core::Device::alloc(&device, DType::F32, 1024).map_err(|e| e.to_string())?;
    group.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
    let mut rounds = Vec::new();
    for _ in 0..9 {
        let start = Instant::now();
        for _ in 0..ops {
            group.all_reduce(&buffer, ReduceOp::Sum).and_then(|work| work.wait()).map_err(|e| e.to_string())?;
        }
        rounds.push(start.elapsed().as_secs_f64() * 1e9 / ops as f64);
    }
    rounds.sort_by(f64::total_cmp);
    group.shutdown().map_err(|e| e.to_string())?;
    Ok(rounds)
}

/// With `PG_TIME_ENQUEUE=1`: the enqueue template's steps, ns per op over the `ops` measured since `before` (the
/// timers' own clock reads included), as a Markdown paragraph; `None` when timing is off.
fn step_breakdown(before: &[(EnqueueStep, Duration); 7], ops: usize) -> Option<String> {
    let after = pg_core::enqueue_step_totals();
    let steps: Vec<String> = after
        .iter()
        .zip(before)
        .map(|((step, total), (_, earlier))| {
            format!("{} {:.0}", step.name(), total.saturating_sub(*earlier).as_secs_f64() * 1e9 / ops as f64)
        })
        .collect();
    let any = after.iter().zip(before).any(|((_, total), (_, earlier))| total > earlier);
    any.then(|| format!("enqueue steps, ns per op (`PG_TIME_ENQUEUE=1`, timers included): {}", steps.join(", ")))
}

/// The machine in one line: CPU model and count.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']));
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{cpus} CPUs ({})", model.unwrap_or("unknown model"))
}

fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map_or_else(|| "unknown".to_owned(), |out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `cargo xtask bench host`.
pub fn main(args: &[String]) -> std::result::Result<(), String> {
    let mut ops = 200_000usize;
    let mut single = Config { watchdog: true, period_ms: 100, trace_buffer: 2000 };
    let mut chosen = false;
    let mut out = crate::gpu_test::root().join("bench/results");
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut number =
            |what: &str| it.next().and_then(|n| n.parse::<u64>().ok()).ok_or(format!("{what} needs a number"));
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--ops" => ops = usize::try_from(number("--ops")?).map_err(|e| e.to_string())?,
            "--watchdog" => {
                single.watchdog = match it.next().map(String::as_str) {
                    Some("on") => true,
                    Some("off") => false,
                    _ => return Err("--watchdog takes on or off".to_owned()),
                };
                chosen = true;
            }
            "--watchdog-period-ms" => {
                single.period_ms = number("--watchdog-period-ms")?;
                chosen = true;
            }
            "--trace-buffer" => {
                single.trace_buffer = usize::try_from(number("--trace-buffer")?).map_err(|e| e.to_string())?;
                chosen = true;
            }
            "--out" => out = it.next().ok_or("--out needs a directory")?.into(),
            other => return Err(format!("unknown option '{other}'\n\n{HELP}")),
        }
    }
    if ops == 0 {
        return Err("--ops must be at least 1".to_owned());
    }
    let configs = if chosen { vec![single] } else { DEFAULT_CONFIGS.to_vec() };
    // `cargo xtask` builds the dev profile: only a release build's figures are worth keeping, and the file says
    // which one it measured.
    let (runner, build) = match cfg!(debug_assertions) {
        true => ("cargo xtask", "dev build: not figures to keep"),
        false => ("cargo run --release -p xtask --", "release build"),
    };
    let command = format!("{runner} bench host {}", args.join(" ")).trim_end().to_owned();
    let (machine, commit) = (machine(), commit());
    let mut md = format!(
        "# pg-core's own host cost per op (no-op backend)\n\n**Machine:** {machine}. **Commit:** {commit}. \
         **Command:** `{command}` ({build}).\n\nThe no-op backend's primitives return at once, so this is \
         pg-core's bookkeeping alone (template, cache hit, Work, flight recorder, watchdog list) for \
         `all_reduce(..)?.wait()` back to back, {ops} ops a round, 9 rounds.\n\n\
         | configuration | median ns/op | min | max |\n| --- | ---: | ---: | ---: |\n"
    );
    let mut rows = Vec::new();
    let mut breakdowns = Vec::new();
    for config in configs {
        let before = pg_core::enqueue_step_totals();
        let rounds = measure(config, ops)?;
        // The first op (the communicator's creation) is among them: a few microseconds over 1.8 million ops.
        let steps = step_breakdown(&before, 9 * ops + 1);
        let (median, min, max) = (rounds[4], rounds[0], rounds[8]);
        println!(
            "{}: median {median:.0} ns, min {min:.0} ns, max {max:.0} ns over 9 rounds of {ops} ops",
            config.describe()
        );
        md.push_str(&format!("| {} | {median:.0} | {min:.0} | {max:.0} |\n", config.describe()));
        if let Some(steps) = &steps {
            println!("  {steps}");
            breakdowns.push(format!("- {}: {steps}", config.describe()));
        }
        rows.push(HostRow {
            median_ns: median,
            ns_per_op_rounds: rounds,
            trace_buffer: config.trace_buffer as u64,
            watchdog: config.watchdog,
            watchdog_period_ms: config.period_ms,
        });
    }
    if !breakdowns.is_empty() {
        md.push_str(&format!(
            "\nWhere one enqueue's time goes, step by step (the timers cost two clock reads a step):\n\n{}\n",
            breakdowns.join("\n")
        ));
    }
    let result = HostResult { command, commit, machine, ops_per_round: ops as u64, results: rows };
    let json = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, text) in [("host.md", md), ("host.json", format!("{json}\n"))] {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

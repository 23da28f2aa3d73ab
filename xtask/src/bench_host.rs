//! `cargo xtask bench host`: the host cost of pg-core's own per-op work, measured on a no-op backend whose
//! primitives cost nothing, so that what remains is the process group's bookkeeping (no GPU needed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pg_core::store::HashStore;
use pg_core::{Capabilities, Capability, CommConfig, DType, Options, ProcessGroup, ReduceOp, Result, UniqueId};

const HELP: &str = "\
cargo xtask bench host [--ops N] [--watchdog on|off] [--watchdog-period-ms N] [--trace-buffer N] [--out DIR]

The host time of ProcessGroup::all_reduce plus WorkHandle::wait on a no-op backend (every device primitive
returns at once): the cost of pg-core's own bookkeeping per op, median of 9 rounds of N ops (default 200000).
Without a configuration flag it measures four: the watchdog on (passes every 100 ms, and passes that never come),
the watchdog off, and the watchdog and flight recorder off. Writes host.md and host.json into --out (default
bench/results). Build with --release for figures worth keeping.
";

/// The no-op backend: every primitive succeeds at once and does nothing; it declares no optional capability
/// (no split, shrink, grow, revoke, capture, device `PREMUL_SUM`, timing events or host callbacks).
#[derive(Debug)]
pub struct Noop;

impl pg_core::Backend for Noop {
    const NAME: &'static str = "noop";
    type Device = NoopDevice;
    type Stream = NoopStream;
    type Event = NoopEvent;
    type Buffer = NoopBuffer;
    type Communicator = NoopComm;
    type Graph = NoopGraph;
}

/// A graph of the no-op backend (it never captures, so none exists).
#[derive(Debug)]
pub struct NoopGraph(std::convert::Infallible);

impl pg_core::Graph for NoopGraph {
    type B = Noop;

    fn launch(&self, _stream: &NoopStream) -> Result<()> {
        match self.0 {}
    }

    fn node_count(&self) -> usize {
        match self.0 {}
    }
}

/// A device of the no-op backend.
#[derive(Debug, Clone, Default)]
pub struct NoopDevice {
    epoch: Arc<OnceInstant>,
}

#[derive(Debug)]
struct OnceInstant(Instant);

impl Default for OnceInstant {
    fn default() -> Self {
        Self(Instant::now())
    }
}

/// A stream of the no-op backend.
#[derive(Debug, Clone, PartialEq)]
pub struct NoopStream(u64);

/// An event of the no-op backend.
#[derive(Debug, Default)]
pub struct NoopEvent(AtomicBool);

/// A buffer of the no-op backend (a shared handle, like a tensor).
#[derive(Debug, Clone)]
pub struct NoopBuffer(Arc<(DType, usize)>);

/// A communicator of the no-op backend.
#[derive(Debug)]
pub struct NoopComm(usize, usize);

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

impl pg_core::Device for NoopDevice {
    type B = Noop;
    fn index(&self) -> usize {
        0
    }
    fn describe(&self) -> String {
        "no-op device".to_owned()
    }
    fn current_stream(&self) -> NoopStream {
        NoopStream(0)
    }
    fn set_current_stream(&self, _stream: &NoopStream) -> NoopStream {
        NoopStream(0)
    }
    fn stream_from_pool(&self, _high_priority: bool) -> Result<NoopStream> {
        Ok(NoopStream(NEXT_STREAM.fetch_add(1, Ordering::Relaxed)))
    }
    fn create_event(&self) -> NoopEvent {
        NoopEvent::default()
    }
    fn create_timing_event(&self) -> Result<NoopEvent> {
        Err(refused(Capability::TimingEvents, "create_timing_event"))
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
    fn synchronize(&self) -> Result<()> {
        self.poison().check()
    }
    fn poison(&self) -> &pg_core::Poison {
        static RECORD: pg_core::Poison = pg_core::Poison::new();
        &RECORD
    }
    fn alloc(&self, dtype: DType, numel: usize) -> Result<NoopBuffer> {
        Ok(NoopBuffer(Arc::new((dtype, numel))))
    }
    fn record_stream(&self, _buffer: &NoopBuffer, _stream: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn copy_from_host(&self, _buffer: &NoopBuffer, _bytes: &[u8], _stream: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn copy_to_host(&self, buffer: &NoopBuffer, _stream: &NoopStream) -> Result<Vec<u8>> {
        self.poison().check()?;
        Ok(vec![0; buffer.0 .1 * buffer.0 .0.size()])
    }
    fn fill(&self, _buffer: &NoopBuffer, _value: f64, _stream: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn sleep_kernel(&self, _stream: &NoopStream, _duration: Duration) -> Result<()> {
        Ok(())
    }
    fn new_unique_id(&self) -> Result<UniqueId> {
        Ok(UniqueId(vec![0; 128]))
    }
    fn create_communicator(&self, _id: &UniqueId, size: usize, rank: usize, _config: &CommConfig) -> Result<NoopComm> {
        Ok(NoopComm(rank, size))
    }
    fn join_grown(&self, _id: &UniqueId, _size: usize, _rank: usize, _config: &CommConfig) -> Result<NoopComm> {
        Err(refused(Capability::Grow, "join_grown"))
    }
    fn now(&self) -> Duration {
        self.epoch.0.elapsed()
    }
    fn wall_clock(&self) -> Duration {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
    }
    fn versions(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    fn sleep(&self, duration: Duration, interrupt: &AtomicBool) {
        // Coarse and real: only the watchdog sleeps here, between passes.
        let end = Instant::now() + duration;
        while Instant::now() < end && !interrupt.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    fn notify_host_threads(&self) {}
    fn spawn_host_thread(&self, name: &str, body: Box<dyn FnOnce() + Send + 'static>) -> Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(body)
            .map_err(|e| pg_core::Error::Backend(e.to_string()))
    }
}

impl pg_core::Stream for NoopStream {
    type B = Noop;
    fn id(&self) -> u64 {
        self.0
    }
    fn is_high_priority(&self) -> bool {
        false
    }
    fn wait_event(&self, _event: &NoopEvent) -> Result<()> {
        Ok(())
    }
    fn query(&self) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn launch_host_fn(&self, callback: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        drop(callback);
        Err(refused(Capability::HostCallbacks, "launch_host_fn"))
    }
    fn is_capturing(&self) -> Result<bool> {
        Ok(false)
    }
    fn begin_capture(&self, _mode: pg_core::CaptureMode) -> Result<()> {
        Err(refused(Capability::Capture, "begin_capture"))
    }
    fn end_capture(&self) -> Result<NoopGraph> {
        Err(refused(Capability::Capture, "end_capture"))
    }
    fn capture_keep_alive(&self, _buffer: &NoopBuffer) -> Result<()> {
        Err(refused(Capability::Capture, "capture_keep_alive"))
    }
    fn capture_keep_communicator(&self, _comm: &Arc<NoopComm>) -> Result<()> {
        Err(refused(Capability::Capture, "capture_keep_communicator"))
    }
}

impl pg_core::Event for NoopEvent {
    type B = Noop;
    fn record(&self, _stream: &NoopStream) -> Result<()> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
    fn query(&self) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn is_created(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    fn nanos_since(&self, _start: &Self) -> Result<Option<i64>> {
        Err(refused(Capability::TimingEvents, "nanos_since"))
    }
}

impl pg_core::Buffer for NoopBuffer {
    type B = Noop;
    fn dtype(&self) -> DType {
        self.0 .0
    }
    fn numel(&self) -> usize {
        self.0 .1
    }
    fn device_index(&self) -> usize {
        0
    }
}

impl pg_core::Communicator for NoopComm {
    type B = Noop;
    fn rank(&self) -> usize {
        self.0
    }
    fn size(&self) -> usize {
        self.1
    }
    fn all_reduce(&self, _i: &NoopBuffer, _o: &NoopBuffer, _op: ReduceOp, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn all_reduce_pre_mul_sum(&self, _i: &NoopBuffer, _o: &NoopBuffer, _f: &NoopBuffer, _s: &NoopStream) -> Result<()> {
        Err(refused(Capability::DevicePreMulSum, "all_reduce_pre_mul_sum"))
    }
    fn broadcast(&self, _i: &NoopBuffer, _o: &NoopBuffer, _root: usize, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, _i: &NoopBuffer, _o: &NoopBuffer, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter(&self, _i: &NoopBuffer, _o: &NoopBuffer, _op: ReduceOp, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter_pre_mul_sum(
        &self,
        _i: &NoopBuffer,
        _o: &NoopBuffer,
        _f: &NoopBuffer,
        _s: &NoopStream,
    ) -> Result<()> {
        Err(refused(Capability::DevicePreMulSum, "reduce_scatter_pre_mul_sum"))
    }
    fn send(&self, _b: &NoopBuffer, _peer: usize, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn recv(&self, _b: &NoopBuffer, _peer: usize, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn reduce(&self, _i: &NoopBuffer, _o: &NoopBuffer, _root: usize, _op: ReduceOp, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn gather(&self, _i: &NoopBuffer, _o: &[NoopBuffer], _root: usize, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn scatter(&self, _i: &[NoopBuffer], _o: &NoopBuffer, _root: usize, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn all_to_all_single(
        &self,
        _i: &NoopBuffer,
        _o: &NoopBuffer,
        _input_splits: &[usize],
        _output_splits: &[usize],
        _s: &NoopStream,
    ) -> Result<()> {
        Ok(())
    }
    fn all_to_all(&self, _i: &[NoopBuffer], _o: &[NoopBuffer], _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn all_gather_v(&self, _i: &NoopBuffer, _o: &[NoopBuffer], _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter_v(&self, _i: &[NoopBuffer], _o: &NoopBuffer, _op: ReduceOp, _s: &NoopStream) -> Result<()> {
        Ok(())
    }
    fn group_start(&self) -> Result<()> {
        Ok(())
    }
    fn group_end(&self) -> Result<()> {
        Ok(())
    }
    fn split(&self, _color: Option<u32>, _key: usize, _config: &CommConfig) -> Result<Option<NoopComm>> {
        Err(refused(Capability::Split, "split"))
    }
    fn shrink(&self, _excluded: &[usize], _mode: pg_core::ShrinkMode, _config: &CommConfig) -> Result<NoopComm> {
        Err(refused(Capability::Shrink, "shrink"))
    }
    fn grow_unique_id(&self) -> Result<UniqueId> {
        Err(refused(Capability::Grow, "grow_unique_id"))
    }
    fn grow(&self, _added: usize, _id: Option<&UniqueId>, _config: &CommConfig) -> Result<NoopComm> {
        Err(refused(Capability::Grow, "grow"))
    }
    fn revoke(&self, _reason: &str) -> Result<()> {
        Err(refused(Capability::Revoke, "revoke"))
    }
    fn is_revoked(&self) -> bool {
        false
    }
    fn is_ready(&self) -> Result<bool> {
        Ok(true)
    }
    fn async_error(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, _reason: &str) -> Result<()> {
        Ok(())
    }
    fn is_aborted(&self) -> bool {
        false
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    fn is_finalized(&self) -> bool {
        false
    }
}

/// The refusal of `call`, which needs `capability` that the no-op backend declares absent.
fn refused(capability: Capability, call: &str) -> pg_core::Error {
    Capabilities::refusal(<Noop as pg_core::Backend>::NAME, capability, call)
}

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
    let command = format!("cargo xtask bench host {}", args.join(" ")).trim_end().to_owned();
    let (machine, commit) = (machine(), commit());
    let mut md = format!(
        "# pg-core's own host cost per op (no-op backend)\n\n**Machine:** {machine}. **Commit:** {commit}. \
         **Command:** `{command}` (release build).\n\nThe no-op backend's primitives return at once, so this is \
         pg-core's bookkeeping alone (template, cache hit, Work, flight recorder, watchdog list) for \
         `all_reduce(..)?.wait()` back to back, {ops} ops a round, 9 rounds.\n\n\
         | configuration | median ns/op | min | max |\n| --- | ---: | ---: | ---: |\n"
    );
    let mut rows = Vec::new();
    for config in configs {
        let rounds = measure(config, ops)?;
        let (median, min, max) = (rounds[4], rounds[0], rounds[8]);
        println!(
            "{}: median {median:.0} ns, min {min:.0} ns, max {max:.0} ns over 9 rounds of {ops} ops",
            config.describe()
        );
        md.push_str(&format!("| {} | {median:.0} | {min:.0} | {max:.0} |\n", config.describe()));
        rows.push(serde_json::json!({
            "watchdog": config.watchdog,
            "watchdog_period_ms": config.period_ms,
            "trace_buffer": config.trace_buffer,
            "ns_per_op_rounds": rounds,
            "median_ns": median,
        }));
    }
    let json = serde_json::json!({
        "command": command, "machine": machine, "commit": commit, "ops_per_round": ops, "results": rows,
    });
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, text) in [("host.md", md), ("host.json", format!("{json:#}\n"))] {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

//! `cargo xtask bench host`: the host cost of pg-core's own per-op work, measured on a no-op backend whose
//! primitives cost nothing, so that what remains is the process group's bookkeeping (no GPU needed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pg_core::store::HashStore;
use pg_core::{CommConfig, DType, Options, ProcessGroup, ReduceOp, Result, UniqueId};

const HELP: &str = "\
cargo xtask bench host [--ops N] [--watchdog on|off] [--watchdog-period-ms N] [--trace-buffer N]

The host time of ProcessGroup::all_reduce plus WorkHandle::wait on a no-op backend (every device primitive
returns at once): the cost of pg-core's own bookkeeping per op, median of 9 rounds of N ops (default 200000).
";

/// The no-op backend: every primitive succeeds at once and does nothing.
#[derive(Debug)]
pub struct Noop;

impl pg_core::Backend for Noop {
    const NAME: &'static str = "noop";
    type Device = NoopDevice;
    type Stream = NoopStream;
    type Event = NoopEvent;
    type Buffer = NoopBuffer;
    type Communicator = NoopComm;
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
    fn now(&self) -> Duration {
        self.epoch.0.elapsed()
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
}

/// `cargo xtask bench host`.
pub fn main(args: &[String]) -> std::result::Result<(), String> {
    let mut ops = 200_000usize;
    let mut watchdog = true;
    let mut trace_buffer = 2000usize;
    let mut period = 100u64;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--ops" => ops = it.next().and_then(|n| n.parse().ok()).ok_or("--ops needs a number")?,
            "--watchdog" => watchdog = it.next().map(String::as_str) != Some("off"),
            "--watchdog-period-ms" => {
                period = it.next().and_then(|n| n.parse().ok()).ok_or("--watchdog-period-ms needs a number")?
            }
            "--trace-buffer" => {
                trace_buffer = it.next().and_then(|n| n.parse().ok()).ok_or("--trace-buffer needs a number")?
            }
            other => return Err(format!("unknown option '{other}'\n\n{HELP}")),
        }
    }
    let device = NoopDevice::default();
    let options = Options::builder()
        .enable_watchdog(watchdog)
        .trace_buffer_size(trace_buffer)
        .watchdog_period(Duration::from_millis(period))
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
    println!(
        "pg-core host cost per all_reduce + wait on the no-op backend (watchdog {} every {period} ms, flight recorder \
         {trace_buffer}): \
         median {:.0} ns, min {:.0} ns, max {:.0} ns over 9 rounds of {ops} ops",
        if watchdog { "on" } else { "off" },
        rounds[4],
        rounds[0],
        rounds[8]
    );
    group.shutdown().map_err(|e| e.to_string())
}

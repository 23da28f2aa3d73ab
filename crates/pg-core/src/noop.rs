//! The no-op backend: every device primitive and every communicator call succeeds at once and does nothing, so a
//! process group on it costs exactly pg-core's own bookkeeping. For host benchmarks, for checks of the enqueue
//! path (what it allocates, which locks it takes), and for documentation examples that need no device.
//!
//! Buffers carry only their dtype and length; a communicator implements `all_reduce` and refuses the rest, and the
//! device declares no optional capability. Its clock is the host's; its host threads sleep for real, woken without a
//! lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::{Capabilities, Capability, CommConfig, DType, Error, ReduceOp, Result, UniqueId};

/// The no-op backend: every primitive succeeds at once and does nothing; it declares no optional capability
/// (no split, shrink, grow, revoke, capture, device `PREMUL_SUM`, timing events or host callbacks).
#[derive(Debug)]
pub struct Noop;

impl crate::Backend for Noop {
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

impl crate::Graph for NoopGraph {
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
    shared: Arc<DeviceShared>,
}

/// What the clones of one device share: the clock's origin and the host threads asleep.
#[derive(Debug)]
struct DeviceShared {
    epoch: Instant,
    /// The threads in [`crate::Device::sleep`], to unpark when they are notified.
    sleepers: ArrayQueue<std::thread::Thread>,
}

impl Default for DeviceShared {
    fn default() -> Self {
        Self { epoch: Instant::now(), sleepers: ArrayQueue::new(64) }
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

impl crate::Device for NoopDevice {
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
    fn poison(&self) -> &crate::Poison {
        static RECORD: crate::Poison = crate::Poison::new();
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
        self.shared.epoch.elapsed()
    }
    fn wall_clock(&self) -> Duration {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
    }
    fn versions(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    fn sleep(&self, duration: Duration, interrupt: &AtomicBool) {
        // Real time: only the group's host threads sleep here. A sleeper leaves its handle for
        // `notify_host_threads` to unpark, without a lock on either side; with the list full it looks every
        // millisecond.
        let end = Instant::now() + duration;
        while !interrupt.load(Ordering::SeqCst) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.shared.sleepers.push(std::thread::current()) {
                Ok(()) if !interrupt.load(Ordering::SeqCst) => std::thread::park_timeout(left),
                Ok(()) => return,
                Err(_) => std::thread::sleep(left.min(Duration::from_millis(1))),
            }
        }
    }
    fn notify_host_threads(&self) {
        while let Some(sleeper) = self.shared.sleepers.pop() {
            sleeper.unpark();
        }
    }
    fn spawn_host_thread(&self, name: &str, body: Box<dyn FnOnce() + Send + 'static>) -> Result<JoinHandle<()>> {
        std::thread::Builder::new().name(name.to_owned()).spawn(body).map_err(|e| Error::Backend(e.to_string()))
    }
}

impl crate::Stream for NoopStream {
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
    fn begin_capture(&self, _mode: crate::CaptureMode) -> Result<()> {
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

impl crate::Event for NoopEvent {
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

impl crate::Buffer for NoopBuffer {
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

impl crate::Communicator for NoopComm {
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
    fn shrink(&self, _excluded: &[usize], _mode: crate::ShrinkMode, _config: &CommConfig) -> Result<NoopComm> {
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
fn refused(capability: Capability, call: &str) -> crate::Error {
    Capabilities::refusal(<Noop as crate::Backend>::NAME, capability, call)
}

//! The `Backend` trait and the concept traits that point back to it (the wgpu-hal `Api` shape).
//!
//! A backend supplies primitives only: a device with its streams, events, memory and host clock, and a
//! communicator that enqueues collectives on a stream.
//! It never implements Work, the communicator cache or the watchdog: those live once, in
//! [`crate::ProcessGroup`], and run unchanged on the simulated backend and on NCCL.

use std::fmt::Debug;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{CommConfig, DType, ReduceOp, Result, UniqueId};

/// A family of types that together make one backend.
pub trait Backend: Sized + Send + Sync + Debug + 'static {
    /// A short name for logs and result files (`mock`, `nccl`).
    const NAME: &'static str;
    /// One device as one process (or one simulated rank) sees it.
    type Device: Device<B = Self>;
    /// An ordered queue of device work.
    type Stream: Stream<B = Self>;
    /// A marker in a stream that other streams and the host can wait for.
    type Event: Event<B = Self>;
    /// Device memory holding elements of one dtype: a tensor without shape.
    type Buffer: Buffer<B = Self>;
    /// A communicator: the set of ranks that run collectives together.
    type Communicator: Communicator<B = Self>;
    /// The work a stream capture recorded, ready to launch again and again (an instantiated CUDA graph).
    type Graph: Graph<B = Self>;
}

/// Which calls of other host threads a stream capture forbids (CUDA's `cudaStreamCaptureMode`).
///
/// A capture records the work enqueued on the capturing stream (and on streams it joins) instead of running it;
/// calls that would need the device to make progress meanwhile (synchronising, querying) are errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// Unsafe calls fail on every thread while any global-mode capture runs in the process (PyTorch's default
    /// for `torch.cuda.graph`).
    #[default]
    Global,
    /// Unsafe calls fail on the thread that began the capture only.
    ThreadLocal,
    /// No call of another thread is refused; only the capturing streams themselves are.
    Relaxed,
}

/// One device, with its streams, memory, kernels and the host clock its callers live by.
///
/// Cloning gives another handle to the same device.
/// The "current stream" is per host thread, as in PyTorch: set it with [`crate::StreamGuard`].
pub trait Device: Clone + Send + Sync + Debug + 'static {
    /// The backend this device belongs to.
    type B: Backend<Device = Self>;

    /// The local device ordinal (what the collective cache key is made of).
    fn index(&self) -> usize;

    /// A human description, e.g. `NVIDIA H200 (cuda:0)` or `simulated device 0`.
    fn describe(&self) -> String;

    /// The calling thread's current stream on this device (the default stream unless a guard set another).
    fn current_stream(&self) -> <Self::B as Backend>::Stream;

    /// Makes `stream` the calling thread's current stream; returns the previous one.
    fn set_current_stream(&self, stream: &<Self::B as Backend>::Stream) -> <Self::B as Backend>::Stream;

    /// A stream from the device's pool, of normal or high priority (PyTorch's `getStreamFromPool`).
    fn stream_from_pool(&self, high_priority: bool) -> Result<<Self::B as Backend>::Stream>;

    /// A new event handle; the backend's event object is created at its first record (S13).
    fn create_event(&self) -> <Self::B as Backend>::Event;

    /// A new event handle with timing enabled (CUDA's default event flags): two of them recorded on this device
    /// give the device time between their recorded points ([`Event::nanos_since`]). Recording one costs the
    /// device more than a plain event, so the process group makes them only for a traced group
    /// ([`crate::Options::trace_dir`]).
    ///
    /// A backend without [`crate::Capability::TimingEvents`] refuses with [`crate::Error::Unsupported`].
    fn create_timing_event(&self) -> Result<<Self::B as Backend>::Event>;

    /// Blocks the host until all work on every stream of the device is done.
    ///
    /// Fails with the recorded error while the device is poisoned ([`Device::poison`]).
    fn synchronize(&self) -> Result<()>;

    /// The device's failure record: set by a process group that found an error, it makes `copy_to_host` and
    /// every host synchronisation on this device (device, stream, event) fail with that error, waking calls
    /// already blocked, until cleared. Every handle of the device shares it.
    fn poison(&self) -> &crate::Poison;

    /// Allocates `numel` elements of `dtype` for use on the calling thread's current stream.
    ///
    /// Dropping the last handle frees the memory to be reused by later allocations on that stream, at once:
    /// a buffer used on another stream must be protected with [`Device::record_stream`] or kept alive.
    fn alloc(&self, dtype: DType, numel: usize) -> Result<<Self::B as Backend>::Buffer>;

    /// Tells the allocator that `stream` uses `buffer`: its memory is not reused before the work
    /// enqueued on `stream` so far has finished (PyTorch's `recordStream`; S12). This orders nothing.
    fn record_stream(&self, buffer: &<Self::B as Backend>::Buffer, stream: &<Self::B as Backend>::Stream)
        -> Result<()>;

    /// Enqueues a copy of `bytes` from the host into `buffer` on `stream` (the host data is staged, so the
    /// caller may drop `bytes` at once). The length must equal the buffer's size in bytes.
    fn copy_from_host(
        &self,
        buffer: &<Self::B as Backend>::Buffer,
        bytes: &[u8],
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a copy of `buffer` to the host on `stream`, then waits for `stream`; returns the bytes.
    ///
    /// Fails with the recorded error while the device is poisoned ([`Device::poison`]), also when the device
    /// is poisoned while the call waits.
    fn copy_to_host(
        &self,
        buffer: &<Self::B as Backend>::Buffer,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<Vec<u8>>;

    /// Enqueues a kernel on `stream` that sets every element of `buffer` to `value`.
    fn fill(
        &self,
        buffer: &<Self::B as Backend>::Buffer,
        value: f64,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a kernel on `stream` that spins for about `duration` of device time (PyTorch's `_sleep`).
    fn sleep_kernel(&self, stream: &<Self::B as Backend>::Stream, duration: Duration) -> Result<()>;

    /// Creates a new communicator unique id (done by one rank, then shared through the store).
    fn new_unique_id(&self) -> Result<UniqueId>;

    /// Joins communicator `id` as `rank` of `size` (NCCL's `ncclCommInitRankConfig`); blocks until every rank
    /// has joined unless `config.nonblocking`.
    fn create_communicator(
        &self,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<<Self::B as Backend>::Communicator>;

    /// The optional features this device has ([`crate::Capabilities`]), declared up front: the process group asks
    /// it before a call that needs one, and refuses a missing one by name before any store traffic or device work.
    /// A method of a capability declared absent refuses with [`crate::Error::Unsupported`]
    /// ([`crate::Capabilities::refusal`]). The answer does not change while the device exists.
    fn capabilities(&self) -> crate::Capabilities;

    /// Joins a grown communicator as new rank `rank` of `size` with the `id` rank 0 of the existing communicator
    /// passed to [`Communicator::grow`] (NCCL's `ncclCommGrow` with no parent); blocks until every rank, old and
    /// new, has called. `config.timeout` bounds the wait ([`crate::Error::InitTimeout`] past it). Needs
    /// [`crate::Capability::Grow`].
    fn join_grown(
        &self,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<<Self::B as Backend>::Communicator>;

    /// The host's monotonic clock, as a duration since a fixed origin (virtual time on the simulated backend).
    fn now(&self) -> Duration;

    /// The host's wall clock, as a duration since the UNIX epoch: what lines up the timelines of ranks in
    /// different processes ([`crate::Options::trace_dir`]); read next to [`Device::now`], never instead of it.
    ///
    /// On GPUs it is the system clock (0 if it is set before 1970); the simulated backend gives its virtual time,
    /// which every rank of a world shares.
    fn wall_clock(&self) -> Duration;

    /// Blocks the calling host thread for `duration`, returning early once `interrupt` is set and
    /// [`Device::notify_host_threads`] has been called.
    fn sleep(&self, duration: Duration, interrupt: &AtomicBool);

    /// Wakes host threads sleeping in [`Device::sleep`] so they look at their interrupt flags.
    fn notify_host_threads(&self);

    /// Starts a host thread that belongs to this device's world (the watchdog, the heartbeat monitor).
    fn spawn_host_thread(&self, name: &str, body: Box<dyn FnOnce() + Send + 'static>) -> Result<JoinHandle<()>>;

    /// Versions worth recording next to results (driver, runtime, NCCL, ...), as name/value pairs.
    fn versions(&self) -> Vec<(String, String)>;
}

/// An ordered queue of device work. Cloning gives another handle to the same stream.
pub trait Stream: Clone + Send + Sync + Debug + PartialEq + 'static {
    /// The backend this stream belongs to.
    type B: Backend<Stream = Self>;

    /// An id that is unique on its device (what a profiler shows as the stream id).
    fn id(&self) -> u64;

    /// Whether this stream came from the high-priority pool.
    fn is_high_priority(&self) -> bool;

    /// Makes later work on this stream wait until `event`'s recorded point has passed (no host wait).
    fn wait_event(&self, event: &<Self::B as Backend>::Event) -> Result<()>;

    /// Whether all work enqueued on this stream so far has finished.
    fn query(&self) -> Result<bool>;

    /// Blocks the host until all work enqueued on this stream so far has finished.
    ///
    /// Fails with the recorded error while its device is poisoned ([`Device::poison`]).
    fn synchronize(&self) -> Result<()>;

    /// Enqueues `callback`: the host runs it once all work enqueued on this stream so far has finished (CUDA's
    /// `cuLaunchHostFunc`). It runs on a backend thread, must be short, and must not call the backend (no stream,
    /// event, memory or communicator call: CUDA forbids driver calls there). It may never run when the work
    /// before it never finishes. An awaited Work wakes its task through it. Needs
    /// [`crate::Capability::HostCallbacks`].
    fn launch_host_fn(&self, callback: Box<dyn FnOnce() + Send + 'static>) -> Result<()>;

    /// Whether this stream is capturing: its work (and the work of every stream joined into the same capture)
    /// is being recorded into a graph instead of run. A stream joins a capture when it waits on an event
    /// recorded on a capturing stream. While it captures, querying or synchronising it, or an event recorded
    /// on it, is an [`crate::Error::CaptureUnsupported`] error.
    ///
    /// A backend without [`crate::Capability::Capture`] answers `false`.
    fn is_capturing(&self) -> Result<bool>;

    /// Starts capturing this stream in `mode` (CUDA's `cuStreamBeginCapture`): later work enqueued on it is
    /// recorded, not run, until [`Stream::end_capture`].
    /// Needs [`crate::Capability::Capture`].
    fn begin_capture(&self, mode: CaptureMode) -> Result<()>;

    /// Ends the capture this stream began and returns the recorded work as a graph ready to launch. Fails with
    /// [`crate::Error::CaptureUnsupported`] when a stream joined into the capture has not joined back (the
    /// origin stream must wait on an event recorded on it after its last captured work: "unjoined"), when the
    /// capture was invalidated by a forbidden call, or when this stream is not the capture's origin.
    /// Needs [`crate::Capability::Capture`].
    fn end_capture(&self) -> Result<<Self::B as Backend>::Graph>;

    /// Keeps `buffer` alive for as long as the graph of the capture this stream takes part in exists: the
    /// graph holds a handle, so the memory a captured op uses is not reused while the graph can replay it,
    /// whatever the caller drops. Fails with [`crate::Error::InvalidArgument`] when the stream is not capturing.
    /// Needs [`crate::Capability::Capture`].
    fn capture_keep_alive(&self, buffer: &<Self::B as Backend>::Buffer) -> Result<()>;

    /// Keeps `comm`, whose ops the capture this stream takes part in recorded, for as long as the graph exists:
    /// the communicator is not destroyed while the graph can replay its ops, and a launch after the
    /// communicator was aborted or finalized fails with [`crate::Error::Aborted`] instead of running them on
    /// released resources. Fails with [`crate::Error::InvalidArgument`] when the stream is not capturing.
    /// Needs [`crate::Capability::Capture`].
    fn capture_keep_communicator(&self, comm: &std::sync::Arc<<Self::B as Backend>::Communicator>) -> Result<()>;
}

/// The work one stream capture recorded (an instantiated CUDA graph): launching it on a stream runs the
/// recorded work again, on the memory it was captured with, ordered after the work enqueued on that stream
/// before, and later work on that stream waits for all of it. Dropping it releases the buffers the capture
/// kept alive ([`Stream::capture_keep_alive`]).
pub trait Graph: Send + Sync + Debug + 'static {
    /// The backend this graph belongs to.
    type B: Backend<Graph = Self>;

    /// Enqueues one run of the recorded work on `stream` (CUDA's `cuGraphLaunch`); the host does not wait.
    fn launch(&self, stream: &<Self::B as Backend>::Stream) -> Result<()>;

    /// How many operations (graph nodes: kernels, collectives, copies) it holds.
    fn node_count(&self) -> usize;
}

/// A marker in a stream. An event never recorded counts as completed, as in CUDA.
pub trait Event: Send + Sync + Debug + 'static {
    /// The backend this event belongs to.
    type B: Backend<Event = Self>;

    /// Marks the point after all work enqueued on `stream` so far; creates the backend object on first use.
    fn record(&self, stream: &<Self::B as Backend>::Stream) -> Result<()>;

    /// Whether the recorded point has passed.
    fn query(&self) -> Result<bool>;

    /// Blocks the host until the recorded point has passed.
    ///
    /// Fails with the recorded error while the device of its stream is poisoned ([`Device::poison`]).
    fn synchronize(&self) -> Result<()>;

    /// Whether the backend object exists yet (it is made at the first record).
    fn is_created(&self) -> bool;

    /// The device time from `start`'s recorded point to this event's, in nanoseconds (negative when this one
    /// passed first), or `Ok(None)` while either has not passed: it never blocks. Both must be timing events
    /// ([`Device::create_timing_event`]) of one device, each recorded at least once, else an
    /// [`crate::Error::InvalidArgument`]. On CUDA it is `cuEventElapsedTime` once both have passed (a resolution
    /// of about half a microsecond).
    /// Needs [`crate::Capability::TimingEvents`].
    fn nanos_since(&self, start: &Self) -> Result<Option<i64>>
    where
        Self: Sized;
}

/// Device memory of one dtype. Cloning gives another handle to the same memory, like a tensor.
pub trait Buffer: Clone + Send + Sync + Debug + 'static {
    /// The backend this buffer belongs to.
    type B: Backend<Buffer = Self>;

    /// The element type.
    fn dtype(&self) -> DType;

    /// The number of elements.
    fn numel(&self) -> usize;

    /// The size in bytes.
    fn size_bytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype().size())
    }

    /// The ordinal of the device that holds it.
    fn device_index(&self) -> usize;

    /// Whether the memory was made elsewhere (another framework's allocator, a raw pointer) rather than by the
    /// backend's allocator. [`Device::record_stream`] cannot protect such memory, so the process group keeps
    /// a handle of a foreign buffer on the Work until the op's end event has completed (the stash), whatever
    /// the group's `avoid_record_streams` mode, and `wait()` does not release it early.
    fn is_foreign(&self) -> bool {
        false
    }
}

/// A communicator: the ranks that run collectives together, with their operations enqueued on a stream.
///
/// Every operation only enqueues: it returns once the work is on `stream`, not when it has run.
/// Every method is required; the ones of an optional feature ([`crate::Capability`]) that the device declares
/// absent ([`Device::capabilities`]) refuse with [`crate::Error::Unsupported`] ([`crate::Capabilities::refusal`]),
/// though the process group asks the capabilities first and never calls them then.
pub trait Communicator: Send + Sync + Debug + 'static {
    /// The backend this communicator belongs to.
    type B: Backend<Communicator = Self>;

    /// This rank in the communicator.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// Enqueues an all-reduce of `input` into `output` (they may be the same buffer).
    fn all_reduce(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        op: ReduceOp,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues an all-reduce of `input` into `output` with PyTorch's `PREMUL_SUM` whose factor is this rank's
    /// `scalar` (one element of the input's dtype, in device memory, read when the op runs): every rank's
    /// input times its own factor, summed (`_make_nccl_premul_sum(tensor)`). Needs
    /// [`crate::Capability::DevicePreMulSum`].
    fn all_reduce_pre_mul_sum(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        scalar: &<Self::B as Backend>::Buffer,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a broadcast of `root`'s `input` into every rank's `output`.
    fn broadcast(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        root: usize,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues an all-gather of every rank's `input` into `output` (size times larger), in rank order.
    fn all_gather(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a reduce-scatter of `input` (size times larger) into `output`.
    fn reduce_scatter(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        op: ReduceOp,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a reduce-scatter of `input` (size times larger) into `output` with `PREMUL_SUM` whose factor is
    /// this rank's `scalar` (one element of the input's dtype, in device memory, read when the op runs). Needs
    /// [`crate::Capability::DevicePreMulSum`].
    fn reduce_scatter_pre_mul_sum(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        scalar: &<Self::B as Backend>::Buffer,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a send of `buffer` to `peer`.
    fn send(
        &self,
        buffer: &<Self::B as Backend>::Buffer,
        peer: usize,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a receive into `buffer` from `peer`.
    fn recv(
        &self,
        buffer: &<Self::B as Backend>::Buffer,
        peer: usize,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a reduce of every rank's `input` into `root`'s `output` (NCCL's `ncclReduce`).
    fn reduce(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        root: usize,
        op: ReduceOp,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a gather of every rank's `input` into `root`'s `outputs[rank]` (`outputs` is empty elsewhere).
    fn gather(
        &self,
        input: &<Self::B as Backend>::Buffer,
        outputs: &[<Self::B as Backend>::Buffer],
        root: usize,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a scatter of `root`'s `inputs[rank]` into every rank's `output` (`inputs` is empty elsewhere).
    fn scatter(
        &self,
        inputs: &[<Self::B as Backend>::Buffer],
        output: &<Self::B as Backend>::Buffer,
        root: usize,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues an all-to-all of one buffer: chunk `j` of `input` (`input_splits[j]` elements, in order) goes to
    /// rank `j`, and chunk `i` of `output` (`output_splits[i]` elements) comes from rank `i`.
    fn all_to_all_single(
        &self,
        input: &<Self::B as Backend>::Buffer,
        output: &<Self::B as Backend>::Buffer,
        input_splits: &[usize],
        output_splits: &[usize],
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues an all-to-all of lists: `inputs[j]` goes to rank `j`, `outputs[i]` comes from rank `i`.
    fn all_to_all(
        &self,
        inputs: &[<Self::B as Backend>::Buffer],
        outputs: &[<Self::B as Backend>::Buffer],
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues an all-gather into a list: `outputs[i]` receives rank `i`'s `input` (sizes may differ by rank).
    fn all_gather_v(
        &self,
        input: &<Self::B as Backend>::Buffer,
        outputs: &[<Self::B as Backend>::Buffer],
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Enqueues a reduce-scatter from a list: rank `j`'s `output` is the reduction of every rank's `inputs[j]`.
    fn reduce_scatter_v(
        &self,
        inputs: &[<Self::B as Backend>::Buffer],
        output: &<Self::B as Backend>::Buffer,
        op: ReduceOp,
        stream: &<Self::B as Backend>::Stream,
    ) -> Result<()>;

    /// Opens a group of operations that the backend issues together (NCCL's `ncclGroupStart`): sends and
    /// receives inside one group do not wait for each other in issue order. A backend without groups does
    /// nothing here: the process group issues a batch in an order every rank agrees on, so it runs it too.
    fn group_start(&self) -> Result<()>;

    /// Closes the group opened by [`Communicator::group_start`] (NCCL's `ncclGroupEnd`).
    fn group_end(&self) -> Result<()>;

    /// Splits this communicator (NCCL's `ncclCommSplit`): every rank of it calls, ranks passing the same
    /// `Some(color)` form one new communicator, ordered by `key` then by rank here; a rank passing `None` joins
    /// none and gets `None`. Blocks until every rank has called; the new communicator is ready on return.
    ///
    /// `config.description` names the new communicator. With `config.timeout`, a split that not every rank has
    /// joined by then fails with [`crate::Error::InitTimeout`] and leaves this communicator aborted (NCCL can
    /// abandon a split only by aborting the communicator it splits); `config.nonblocking` is not used. Needs
    /// [`crate::Capability::Split`] (without it the process group makes subgroups by a rendezvous).
    fn split(
        &self,
        color: Option<u32>,
        key: usize,
        config: &CommConfig,
    ) -> Result<Option<<Self::B as Backend>::Communicator>>
    where
        Self: Sized;

    /// Shrinks this communicator (NCCL's `ncclCommShrink`, 2.27): every rank of it but the `excluded` ones (ranks of
    /// this communicator, never the caller's own) calls, with the same list; the new communicator holds the
    /// others, ranked in their order here. Blocks until every such rank has called; the new communicator is ready
    /// on return. With [`crate::ShrinkMode::Abort`] the ops of this communicator still in flight are stopped
    /// first and this communicator is unusable afterwards; with [`crate::ShrinkMode::Default`] it stays usable,
    /// and must have nothing in flight unless it was revoked.
    ///
    /// `config.timeout` bounds the wait for the other callers as in [`Communicator::split`] (this communicator
    /// is aborted when it runs out). Needs [`crate::Capability::Shrink`].
    fn shrink(
        &self,
        excluded: &[usize],
        mode: crate::ShrinkMode,
        config: &CommConfig,
    ) -> Result<<Self::B as Backend>::Communicator>
    where
        Self: Sized;

    /// The unique id the new ranks of this communicator's next grow join with (NCCL's `ncclCommGetUniqueId`,
    /// 2.29): rank 0 makes it, passes it to [`Communicator::grow`] and hands it to the new ranks (through the store),
    /// which pass it to [`Device::join_grown`]. One id serves one grow.
    /// Needs [`crate::Capability::Grow`].
    fn grow_unique_id(&self) -> Result<UniqueId>;

    /// Grows this communicator by `added` new ranks (NCCL's `ncclCommGrow`, 2.29): every rank of it calls, rank 0
    /// with `Some(id)` from [`Communicator::grow_unique_id`], the others with `None`, while the new ranks join with
    /// [`Device::join_grown`]; the new communicator keeps these ranks' numbers and gives the new ones the next.
    /// Blocks until every rank, old and new, has called; the new communicator is ready on return. This
    /// communicator must have nothing in flight and must not be revoked, and stays usable afterwards.
    ///
    /// `config.timeout` bounds the wait as in [`Communicator::split`] (this communicator is aborted when it runs
    /// out). Needs [`crate::Capability::Grow`].
    fn grow(
        &self,
        added: usize,
        id: Option<&UniqueId>,
        config: &CommConfig,
    ) -> Result<<Self::B as Backend>::Communicator>
    where
        Self: Sized;

    /// Revokes the communicator (NCCL's `ncclCommRevoke`, 2.28.7): its ops in flight stop without effect (no
    /// host blocks on them), and every later op, and a finalize, is refused with [`crate::Error::Revoked`]; what
    /// is left is shrinking it, splitting it, or destroying it. Callable from any thread. Needs
    /// [`crate::Capability::Revoke`] (the process group aborts a communicator of a device without it instead).
    fn revoke(&self, reason: &str) -> Result<()>;

    /// Whether [`Communicator::revoke`] (or a shrink with [`crate::ShrinkMode::Abort`]) was called.
    fn is_revoked(&self) -> bool;

    /// Whether a non-blocking init has finished (always true for a blocking one).
    fn is_ready(&self) -> Result<bool>;

    /// The communicator's asynchronous error state (NCCL's `ncclCommGetAsyncError`): `Ok` when healthy.
    ///
    /// Safe to call from the watchdog thread while another thread enqueues.
    fn async_error(&self) -> Result<()>;

    /// Aborts the communicator: pending and future operations fail, blocked calls return.
    ///
    /// Safe to call from any thread, including while another thread is blocked in the communicator.
    fn abort(&self, reason: &str) -> Result<()>;

    /// Whether [`Communicator::abort`] was called.
    fn is_aborted(&self) -> bool;

    /// Flushes pending operations before destruction (NCCL's `ncclCommFinalize`). Nothing may be issued on the
    /// communicator afterwards: later calls, and launches of graphs that captured its ops, fail with
    /// [`crate::Error::Aborted`].
    fn finalize(&self) -> Result<()>;

    /// Whether [`Communicator::finalize`] was called.
    fn is_finalized(&self) -> bool;
}

/// `Ok` when `device` declares `capability`, else the refusal of `call` that names it, the backend and the device's
/// versions ([`crate::Capabilities::refusal_with`]): what pg-core asks before a call that needs a capability.
pub(crate) fn require<D: Device>(device: &D, capability: crate::Capability, call: &str) -> Result<()> {
    match device.capabilities().has(capability) {
        true => Ok(()),
        false => Err(crate::Capabilities::refusal_with(<D::B as Backend>::NAME, capability, call, &device.versions())),
    }
}

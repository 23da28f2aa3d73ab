//! The simulated backend of pg: streams, events, kernels and collectives on a virtual clock, with real data,
//! fault injection and hazard detection.
//!
//! A [`World`] is a simulated machine. Rank code runs on registered host threads ([`World::run`],
//! [`World::spawn`], [`pg_core::Device::spawn_host_thread`]); they share one lock over all simulated state.
//! Kernels and collectives take modelled durations and nothing sleeps for real: the clock moves only when every
//! registered thread is blocked in the simulation, to the earliest time at which one can proceed, so the same
//! program gives the same numbers on every run.
//! Buffers hold real bytes and collectives compute real results; a vector-clock race detector reports
//! unordered accesses and memory reused while a stream may still use it.
//!
//! # The model in brief
//!
//! - **Host time.** Each registered thread has a local time: the global time plus the host costs of the calls
//!   it made since it last blocked ([`HostCosts`]). [`pg_core::Device::now`] returns it. Host calls never wait
//!   for other threads; blocking calls (synchronize, `copy_to_host`, a blocking store get, `Device::sleep`,
//!   blocking communicator init) park the thread until the global time reaches both its local time and the
//!   time its condition holds.
//! - **The store** runs its operations in virtual-time order: each waits until the global time reaches the
//!   caller's local time, and operations due at one instant run in the order of their threads' lineage (a
//!   thread's place among the threads its parent registered, not the real order of registration). A key set at
//!   a later virtual time is never seen early, and a poll that finds a key absent does so in every run.
//! - **Device time.** A stream is a FIFO: an operation starts at the latest of its launch time, the end of the
//!   previous operation and the end of what it waits for (`wait_event`); a collective starts when every rank's
//!   part can start. Durations come from [`WorldConfig`]'s cost model.
//! - **Queries** (`Event::query`, `Stream::query`, `Communicator::is_ready`, `async_error`) answer at the global
//!   time, so their answer is deterministic. A polling loop must therefore block between polls
//!   (`Device::sleep`), as the process group's loops do; a loop that spins on a query alone never sees time move.
//! - **The launch queue.** A stream holds at most [`WorldConfig::launch_queue_depth`] operations in flight; a
//!   launch beyond that blocks the host until half have finished (CUDA's launch queue, which also keeps a long
//!   run's memory flat).
//! - **Assertive.** A call from an unregistered thread, a deadlock (every thread blocked, none can ever
//!   proceed), the virtual time limit and (in [`HazardMode::Panic`]) a hazard panic with a report of what every
//!   thread waits for. Bad arguments are `Err(InvalidArgument)`, never panics.
//! - **Real-time blocking.** A registered thread blocked outside the simulation (a real lock, a channel, a
//!   `join` on a thread that waits in the simulation) stops the clock; after [`WorldConfig::stall_limit`] of
//!   real time without progress, the parked threads stop with a report, and [`World::run`] fails with it even
//!   when only a helper thread saw it. `Device::sleep` with an interrupt flag
//!   wakes at once when the flag is set and [`pg_core::Device::notify_host_threads`] is called, so "set the
//!   flag, notify, join" shuts a helper thread down without the clock.
//! - **Helpers.** Threads from `Device::spawn_host_thread` (watchdogs, monitors) move the clock like any other
//!   while a rank or [`World::spawn`] thread is alive; left alone, they wait instead of spinning through virtual
//!   time, until an interrupt wakes them.
//!
//! # Determinism, and its limits
//!
//! Everything decided by blocking waits and by program order is deterministic: virtual times, kernel timelines,
//! collective results, hazard reports (buffer numbers are per device, communicator numbers come from their
//! unique ids), and every store operation, blocking or not (a `check` or `compare_set` racing another rank's `set`
//! at one virtual instant gives the same answer in every run). What depends on the real-time interleaving of
//! threads stays nondeterministic, as it would on a GPU: which of two threads of one device takes a pool stream
//! first, or the store operations of threads the world does not know (unregistered threads run theirs at once).
//!
//! # Hazards and `Future::is_done`
//!
//! The detector sees streams and host synchronisation, not the process group's objects: it cannot tell that a
//! read followed a `Future::is_done()`. Every unordered read of a collective's output therefore carries the hint
//! that `Future::is_done()` only means the outputs were marked, not that the GPU finished.
#![forbid(unsafe_code)]
//!
//! # Looking inside
//!
//! Tests read what a real machine hides: [`World::trace`] (the whole timeline: what each stream ran, waits as
//! arrows between streams, blocked host threads, hazards; [`Trace::to_chrome_json`] opens it in Perfetto),
//! [`World::hazards`], [`World::kernel_log`], [`World::host_threads`] (which
//! helper threads still run), [`World::leftover_threads`] (the host threads that outlive the ranks, once nothing
//! can move them), [`MockDevice::recorded_streams`] (the streams a block waits for before reuse), and
//! [`RecordingStore`], a store over any other that logs which keys a group reads and writes.
//!
//! # Awaiting a Work, and memory from elsewhere
//!
//! A Work is awaitable; its host callback ([`pg_core::Stream::launch_host_fn`]) runs on a registered helper
//! thread when the stream reaches it in virtual time. An executor outside the world (a thread of its own)
//! awaits, while the rank's thread waits for the device as usual, which is what moves the clock. A callback still
//! behind device work when the ranks have gone moves the clock itself, to that work's end, as a device runs on.
//! [`MockDevice::foreign_buffer`] stands for memory another framework made: pg keeps it on the Work until the op
//! has ended.
//!
//! ```
//! use std::sync::Arc;
//!
//! use pg_core::{Device as _, DType, Options, ProcessGroup, ReduceOp};
//!
//! let world = pg_mock::World::new(pg_mock::WorldConfig { devices: 1, ..Default::default() });
//! let store = world.store();
//! world.run(1, |rank, device| {
//!     let pg = ProcessGroup::<pg_mock::Mock>::new(Arc::clone(&store), rank, 1, device.clone(), Options::builder().build())
//!         .unwrap();
//!     let grads = device.foreign_buffer(DType::F32, 1024).unwrap();
//!     device.fill(&grads, 2.0, &device.current_stream()).unwrap();
//!     let work = pg.all_reduce(&grads, ReduceOp::Sum).unwrap();
//!     std::thread::scope(|scope| {
//!         let awaited = scope.spawn(|| futures::executor::block_on(async { (&work).await }));
//!         work.synchronize().unwrap();
//!         awaited.join().unwrap().unwrap();
//!     });
//! });
//! ```

mod allocator;
mod buffer;
mod capture;
mod clock;
mod communicator;
mod config;
mod conv;
mod device;
mod fault;
mod grow;
mod hazard;
mod recorder;
mod recording;
mod sched;
mod state;
mod store;
mod stream;
mod trace;
mod trace_json;
mod world;

pub use buffer::MockBuffer;
pub use communicator::MockCommunicator;
pub use config::{HostCosts, WorldConfig};
pub use conv::{decode, encode};
pub use device::MockDevice;
pub use fault::Fault;
pub use hazard::{Hazard, HazardKind, HazardMode};
pub use recording::RecordingStore;
pub use state::KernelRecord;
pub use store::SimStore;
pub use stream::{MockEvent, MockGraph, MockStream};
pub use trace::{
    CommOp, EventWait, HazardMark, HostBlock, KernelKind, SpanKind, StreamSpan, Trace, TraceStream, TraceThread,
};
pub use world::World;

/// The simulated backend: devices, streams, events, buffers and communicators of a [`World`].
///
/// It lives in the crate root because its `Backend` impl names every concept type, and each of them names it
/// back (`type B = Mock`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Mock;

impl pg_core::Backend for Mock {
    const NAME: &'static str = "mock";
    type Device = MockDevice;
    type Stream = MockStream;
    type Event = MockEvent;
    type Buffer = MockBuffer;
    type Communicator = MockCommunicator;
    type Graph = MockGraph;
}

/// The README's example, compiled and run as a doctest against this backend.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExample;

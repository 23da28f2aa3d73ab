//! The simulated device: streams and their pools, the per-thread current stream, memory, kernels, communicator
//! creation, and the host clock of the calling thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use pg_core::{Buffer as _, CommConfig, DType, Error, Result, UniqueId};

use crate::buffer::{BufferHandle, MockBuffer, WeakBuffer};
use crate::clock::{dur, ns, show_duration, transfer, Cond, OpRef};
use crate::communicator::MockCommunicator;
use crate::hazard::{Accessor, Mode};
use crate::sched::Inner;
use crate::state::{Effect, OpKind, State};
use crate::stream::{sync_streams, MockEvent, MockStream};
use crate::trace::KernelKind;
use crate::Mock;

/// A stream as the thread-local map keeps it: (global index, id, high priority).
type StreamRef = (usize, u64, bool);

thread_local! {
    /// The calling thread's current stream per (world id, device).
    static CURRENT_STREAM: RefCell<HashMap<(u64, usize), StreamRef>> = RefCell::new(HashMap::new());
}

/// A simulated device. Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct MockDevice {
    pub(crate) inner: Arc<Inner>,
    pub(crate) index: usize,
}

impl fmt::Debug for MockDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockDevice").field("index", &self.index).finish()
    }
}

impl MockDevice {
    pub(crate) fn new(inner: Arc<Inner>, index: usize) -> Self {
        Self { inner, index }
    }

    /// A buffer of memory made elsewhere, as another framework's allocator would hand it over (zero copy), on
    /// the calling thread's current stream.
    ///
    /// It behaves as foreign memory does: [`pg_core::Buffer::is_foreign`] is true, `record_stream` on it holds
    /// nothing back (pg's allocator does not own it), and when its last handle goes the memory is free for the
    /// next allocation of its size on that stream at once. The hazard detector then reports any stream that still
    /// used it, which is what a process group that released the handle too early would cause.
    pub fn foreign_buffer(&self, dtype: DType, numel: usize) -> Result<MockBuffer> {
        self.allocate(dtype, numel, true)
    }

    /// The ids of the streams recorded on `buffer`'s memory block (`record_stream`) since it was last handed out,
    /// in ascending order: the streams the allocator waits for before it reuses the block.
    pub fn recorded_streams(&self, buffer: &MockBuffer) -> Vec<u64> {
        let state = self.inner.lock();
        let recorded = state.alloc.blocks.get(&buffer.block()).map(|block| block.recorded.clone()).unwrap_or_default();
        let mut ids: Vec<u64> = recorded.into_iter().map(|index| state.streams[index].id).collect();
        ids.sort_unstable();
        ids
    }

    /// The device's default stream (id 0).
    pub fn default_stream(&self) -> MockStream {
        let state = self.inner.lock();
        MockStream::from_index(&self.inner, &state, state.devices[self.index].default_stream)
    }

    /// Allocates from the caching allocator; `foreign` marks memory that stands for another framework's.
    fn allocate(&self, dtype: DType, numel: usize, foreign: bool) -> Result<MockBuffer> {
        let tid = self.inner.require("Device::alloc");
        let bytes = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid(format!("alloc: {numel} elements of {dtype} overflow the address space")))?;
        let stream = pg_core::Device::current_stream(self);
        let mut state = self.inner.lock();
        let counter = state.alloc.next_buffer.entry(self.index).or_default();
        *counter += 1;
        let id = *counter;
        let block = state.allocate(Some(tid), stream.index, bytes, id);
        self.inner.raise(state);
        let handle =
            BufferHandle { inner: Arc::clone(&self.inner), id, block, dtype, numel, device: self.index, foreign };
        Ok(MockBuffer { handle: Arc::new(handle) })
    }

    fn check_buffer(&self, buffer: &MockBuffer, what: &str) -> Result<()> {
        if !Arc::ptr_eq(buffer.inner(), &self.inner) {
            return Err(Error::invalid(format!("{what}: the buffer belongs to another simulated world")));
        }
        if buffer.device_index() != self.index {
            return Err(Error::invalid(format!(
                "{what}: buffer #{} is on device {}, not device {}",
                buffer.id(),
                buffer.device_index(),
                self.index
            )));
        }
        Ok(())
    }

    /// Launches a kernel that accesses `buffer` (if any) on `stream`; on a capturing stream, records it instead.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        tid: usize,
        stream: &MockStream,
        access: Option<(&MockBuffer, Mode)>,
        kind: KernelKind,
        name: &'static str,
        duration: u64,
        effect: Effect,
    ) {
        let mut captures = self.inner.captures();
        if captures.is_capturing(stream.index) {
            let device = self.clone();
            let weak = access.map(|(buffer, mode)| (WeakBuffer::new(buffer), mode));
            let replay = move |index: usize| -> Result<()> {
                let buffer = weak.as_ref().map(|(w, mode)| w.get(name).map(|b| (b, *mode))).transpose()?;
                let stream = MockStream::at(&device.inner, index);
                let tid = device.inner.require(name);
                let access = buffer.as_ref().map(|(b, mode)| (b, *mode));
                device.launch_now(tid, &stream, access, kind, name, duration, effect.clone());
                Ok(())
            };
            captures.record_op(stream.index, name, Box::new(replay));
            drop(captures);
            self.inner.with(|st| st.charge(Some(tid), self.inner.config.host.kernel_launch));
            return;
        }
        drop(captures);
        self.launch_now(tid, stream, access, kind, name, duration, effect);
    }

    /// Launches a kernel now (not recorded by a capture).
    #[allow(clippy::too_many_arguments)]
    fn launch_now(
        &self,
        tid: usize,
        stream: &MockStream,
        access: Option<(&MockBuffer, Mode)>,
        kind: KernelKind,
        name: &str,
        duration: u64,
        effect: Effect,
    ) -> OpRef {
        let cost = self.inner.config.host.kernel_launch;
        let mut state = self.inner.lock();
        let op = launch_locked(&mut state, tid, stream, access, kind, name, duration, effect, cost);
        self.inner.raise(state);
        self.inner.throttle(tid, stream.index);
        op
    }
}

/// [`MockDevice::launch`] under the lock.
fn launch_locked(
    st: &mut State,
    tid: usize,
    stream: &MockStream,
    access: Option<(&MockBuffer, Mode)>,
    kind: KernelKind,
    name: &str,
    duration: u64,
    effect: Effect,
    cost: Duration,
) -> OpRef {
    st.charge(Some(tid), cost);
    let clock = st.launch_clock(Some(tid), stream.index);
    if let Some((buffer, mode)) = access {
        let who = Accessor {
            actor: stream.index,
            clock,
            device: stream.device,
            buffer: buffer.id(),
            stream_id: stream.id,
            op: name.to_owned(),
            collective: false,
            at: st.local(Some(tid)),
        };
        st.access(buffer.block(), mode, &who);
    }
    let op = st.enqueue(Some(tid), stream.index, OpKind::Kernel { kind, duration, effect }, name, None);
    st.resolve();
    op
}

impl pg_core::Device for MockDevice {
    type B = Mock;

    fn index(&self) -> usize {
        self.index
    }

    fn describe(&self) -> String {
        format!("simulated device {}", self.index)
    }

    fn current_stream(&self) -> MockStream {
        let key = (self.inner.id, self.index);
        match CURRENT_STREAM.with(|c| c.borrow().get(&key).copied()) {
            Some((index, id, high_priority)) => {
                MockStream { inner: Arc::clone(&self.inner), index, device: self.index, id, high_priority }
            }
            None => self.default_stream(),
        }
    }

    fn set_current_stream(&self, stream: &MockStream) -> MockStream {
        let previous = self.current_stream();
        let key = (self.inner.id, stream.device);
        CURRENT_STREAM.with(|c| c.borrow_mut().insert(key, (stream.index, stream.id, stream.high_priority)));
        previous
    }

    fn stream_from_pool(&self, high_priority: bool) -> Result<MockStream> {
        let per_pool = self.inner.config.streams_per_pool.max(1);
        let mut state = self.inner.lock();
        let device = &mut state.devices[self.index];
        let (next, len) = match high_priority {
            false => (&mut device.next_normal, device.normal_pool.len()),
            true => (&mut device.next_high, device.high_pool.len()),
        };
        let slot = *next % per_pool;
        *next += 1;
        let index = if slot < len {
            match high_priority {
                false => state.devices[self.index].normal_pool[slot],
                true => state.devices[self.index].high_pool[slot],
            }
        } else {
            let offset = if high_priority { per_pool } else { 0 };
            let id = u64::try_from(1 + offset + slot).unwrap_or(u64::MAX);
            let index = state.add_stream(self.index, id, high_priority);
            let device = &mut state.devices[self.index];
            match high_priority {
                false => device.normal_pool.push(index),
                true => device.high_pool.push(index),
            }
            index
        };
        Ok(MockStream::from_index(&self.inner, &state, index))
    }

    fn create_event(&self) -> MockEvent {
        MockEvent::new(Arc::clone(&self.inner))
    }

    fn create_timing_event(&self) -> Result<MockEvent> {
        self.inner.require_capability(pg_core::Capability::TimingEvents, "create_timing_event")?;
        Ok(MockEvent::timed(Arc::clone(&self.inner)))
    }

    fn synchronize(&self) -> Result<()> {
        let tid = self.inner.require("Device::synchronize");
        let capturing = self.inner.captures().capturing_on(self.index);
        if let Some(stream) = capturing {
            let label = MockStream::at(&self.inner, stream).label();
            let what = format!("Device::synchronize of device {} while {label} is capturing", self.index);
            return self.inner.captures().refuse_on_stream(stream, || what);
        }
        let poison = pg_core::Device::poison(self);
        poison.check()?;
        let state = self.inner.lock();
        let streams: Vec<usize> = (0..state.streams.len()).filter(|s| state.streams[*s].device == self.index).collect();
        let state = sync_streams(&self.inner, state, tid, &streams, poison);
        self.inner.raise(state);
        poison.check()
    }

    fn poison(&self) -> &pg_core::Poison {
        &self.inner.poison[self.index]
    }

    fn alloc(&self, dtype: DType, numel: usize) -> Result<MockBuffer> {
        self.allocate(dtype, numel, false)
    }

    fn record_stream(&self, buffer: &MockBuffer, stream: &MockStream) -> Result<()> {
        self.check_buffer(buffer, "record_stream")?;
        stream.check(&self.inner, self.index, "record_stream")?;
        if buffer.handle.foreign {
            // Foreign memory is not this allocator's: recording a stream on it protects nothing.
            return Ok(());
        }
        let mut state = self.inner.lock();
        if let Some(block) = state.alloc.blocks.get_mut(&buffer.block()) {
            block.recorded.insert(stream.index);
        }
        Ok(())
    }

    fn copy_from_host(&self, buffer: &MockBuffer, bytes: &[u8], stream: &MockStream) -> Result<()> {
        let tid = self.inner.require("Device::copy_from_host");
        self.check_buffer(buffer, "copy_from_host")?;
        stream.check(&self.inner, self.index, "copy_from_host")?;
        if bytes.len() != buffer.size_bytes() {
            return Err(Error::invalid(format!(
                "copy_from_host: {} bytes given for buffer #{} of {} bytes ({} x {})",
                bytes.len(),
                buffer.id(),
                buffer.size_bytes(),
                buffer.numel(),
                buffer.dtype()
            )));
        }
        let duration = transfer(bytes.len(), self.inner.config.copy_bandwidth);
        let effect = Effect::FromHost { block: buffer.block(), bytes: bytes.to_vec() };
        self.launch(tid, stream, Some((buffer, Mode::Write)), KernelKind::Copy, "copy_from_host", duration, effect);
        Ok(())
    }

    fn copy_to_host(&self, buffer: &MockBuffer, stream: &MockStream) -> Result<Vec<u8>> {
        let tid = self.inner.require("Device::copy_to_host");
        self.check_buffer(buffer, "copy_to_host")?;
        stream.check(&self.inner, self.index, "copy_to_host")?;
        self.inner.captures().refuse_on_stream(stream.index, || {
            format!("copy_to_host of buffer #{} on capturing {} (it waits for the stream)", buffer.id(), stream.label())
        })?;
        let poison = pg_core::Device::poison(self);
        poison.check()?;
        let duration = transfer(buffer.size_bytes(), self.inner.config.copy_bandwidth);
        let cost = self.inner.config.host.kernel_launch;
        let mut state = self.inner.lock();
        let effect = Effect::ToHost { block: buffer.block() };
        let access = Some((buffer, Mode::Read));
        let op =
            launch_locked(&mut state, tid, stream, access, KernelKind::Copy, "copy_to_host", duration, effect, cost);
        let clock = state.streams[stream.index].clock.clone();
        state.pin(op);
        let what = format!("copy_to_host of buffer #{} on stream {}", buffer.id(), stream.id);
        let (mut state, woke) = self.inner.park(state, tid, Cond::OpsDone(vec![op]), None, Some(poison.flag()), what);
        state.unpin(op);
        if woke != crate::clock::Wake::Interrupted {
            state.join_thread_clock(Some(tid), &clock);
        }
        let bytes = match state.to_host.remove(&op) {
            Some(bytes) => bytes,
            None => {
                // Woken by the failure record before the copy ran: its bytes will have no taker.
                state.abandoned_to_host.insert(op);
                Vec::new()
            }
        };
        self.inner.raise(state);
        // Poisoned while it waited (woken early), or the copy read what a failed op left: the error either way.
        poison.check()?;
        Ok(bytes)
    }

    fn fill(&self, buffer: &MockBuffer, value: f64, stream: &MockStream) -> Result<()> {
        let tid = self.inner.require("Device::fill");
        self.check_buffer(buffer, "fill")?;
        stream.check(&self.inner, self.index, "fill")?;
        let duration = transfer(buffer.size_bytes(), self.inner.config.fill_bandwidth);
        let effect = Effect::Fill { block: buffer.block(), dtype: buffer.dtype(), value };
        self.launch(tid, stream, Some((buffer, Mode::Write)), KernelKind::Fill, "fill", duration, effect);
        Ok(())
    }

    fn sleep_kernel(&self, stream: &MockStream, duration: Duration) -> Result<()> {
        let tid = self.inner.require("Device::sleep_kernel");
        stream.check(&self.inner, self.index, "sleep_kernel")?;
        self.launch(tid, stream, None, KernelKind::Sleep, "sleep", ns(duration).max(1), Effect::None);
        Ok(())
    }

    fn new_unique_id(&self) -> Result<UniqueId> {
        Ok(UniqueId(self.inner.lock().comms.new_unique_id()))
    }

    fn create_communicator(
        &self,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<MockCommunicator> {
        let tid = self.inner.require("Device::create_communicator");
        if size == 0 || rank >= size || i32::try_from(size).is_err() {
            return Err(Error::invalid(format!("create_communicator: rank {rank} of size {size}")));
        }
        if id.0.is_empty() {
            return Err(Error::invalid("create_communicator: empty unique id"));
        }
        let mut state = self.inner.lock();
        let time = state.local(Some(tid));
        let (group, never) = state.join_comm(&id.0, size, rank, self.index, time, &config.description)?;
        let comm = MockCommunicator { inner: Arc::clone(&self.inner), group, rank, size, device: self.index };
        if config.nonblocking {
            self.inner.release(state);
            return Ok(comm);
        }
        let cond = if never { Cond::Never } else { Cond::CommReady(group) };
        let what = format!("creating rank {rank} of communicator {} (blocking init)", state.comm_number(group));
        let deadline = config.timeout.map(|timeout| state.local(Some(tid)).saturating_add(ns(timeout)));
        let (mut state, woke) = self.inner.park(state, tid, cond, deadline, None, what);
        if woke == crate::clock::Wake::Deadline {
            // The other ranks did not all join in time: this rank leaves, as an aborted communicator.
            let time = state.local(Some(tid));
            let reason = "blocking init timed out before every rank joined";
            state.abort_rank(group, rank, reason, time);
            self.inner.raise(state);
            return Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout: config.timeout.unwrap_or_default(),
                what: format!("rank {rank} of {size} joined, and not every other rank joined within the timeout"),
            });
        }
        self.inner.raise(state);
        Ok(comm)
    }

    fn capabilities(&self) -> pg_core::Capabilities {
        self.inner.capabilities()
    }

    fn join_grown(&self, id: &UniqueId, size: usize, rank: usize, config: &CommConfig) -> Result<MockCommunicator> {
        self.inner.require_capability(pg_core::Capability::Grow, "join_grown")?;
        self.join_grow(id, size, rank, config)
    }

    fn now(&self) -> Duration {
        let tid = self.inner.current();
        dur(self.inner.lock().local(tid))
    }

    /// The virtual clock, which every rank of the world shares: simulated ranks' timelines line up exactly, and
    /// the same program gives the same times on every run.
    fn wall_clock(&self) -> Duration {
        self.now()
    }

    fn sleep(&self, duration: Duration, interrupt: &AtomicBool) {
        let tid = self.inner.require("Device::sleep");
        if interrupt.load(Ordering::SeqCst) {
            return;
        }
        let state = self.inner.lock();
        let deadline = state.local(Some(tid)).saturating_add(ns(duration));
        let what = format!("sleeping for {}", show_duration(duration));
        let (state, _) = self.inner.park(state, tid, Cond::Never, Some(deadline), Some(interrupt), what);
        drop(state);
    }

    fn notify_host_threads(&self) {
        let mut state = self.inner.lock();
        state.interrupt_epoch += 1;
        state.version += 1;
        drop(state);
        self.inner.notify();
    }

    fn spawn_host_thread(&self, name: &str, body: Box<dyn FnOnce() + Send + 'static>) -> Result<JoinHandle<()>> {
        self.inner
            .spawn(name, true, body)
            .map_err(|e| Error::Backend(format!("cannot spawn host thread '{name}': {e}")))
    }

    fn versions(&self) -> Vec<(String, String)> {
        vec![("pg-mock".to_owned(), env!("CARGO_PKG_VERSION").to_owned())]
    }
}

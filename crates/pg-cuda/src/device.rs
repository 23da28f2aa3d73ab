//! `Device`: one per ordinal per process, shared by every handle.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaStream};

use crate::allocator::{Allocator, AllocatorStats};
use crate::buffer::Buffer;
use crate::error::{CudaError, DriverContext, Result};
use crate::event::{Event, EventPool, TimingEvent};
use crate::ffi;
use crate::kernels::Kernels;
use crate::stream::{self, Stream, StreamPool};

/// Pinned staging buffers of host-to-device copies, freed once their copy has run.
struct Staged {
    ptr: *mut u8,
    done: cudarc::driver::safe::CudaEvent,
}

// SAFETY: `ptr` is page-locked host memory owned by this value alone (no other handle to it exists); it is only
// freed, from whichever thread reaps it, after the copy that reads it has completed.
unsafe impl Send for Staged {}

struct Shared {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    name: String,
    clock_rate_khz: u64,
    priorities: (i32, i32),
    default_stream: Stream,
    pools: [StreamPool; 2],
    events: Arc<EventPool>,
    allocator: Arc<Allocator>,
    kernels: OnceLock<std::result::Result<Kernels, CudaError>>,
    staged: Mutex<Vec<Staged>>,
}

/// One CUDA device as this process sees it (its primary context, so it interoperates with PyTorch).
///
/// `Device::new(n)` returns a handle to the same process-wide state every time: the stream pools, the event
/// pool and the caching allocator exist once per device, as in PyTorch.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
}

/// Whether the CUDA driver can be loaded and initialised here; the error says why not.
pub fn driver_available() -> Result<()> {
    if !ffi::driver_present() {
        return Err(CudaError::DriverNotFound);
    }
    cudarc::driver::result::init().during("cuInit")
}

/// The number of CUDA devices (an error without a driver).
pub fn device_count() -> Result<usize> {
    driver_available()?;
    Ok(CudaContext::device_count().during("cuDeviceGetCount")?.max(0) as usize)
}

fn registry() -> &'static Mutex<Vec<Option<Device>>> {
    static DEVICES: OnceLock<Mutex<Vec<Option<Device>>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(Vec::new()))
}

impl Device {
    /// The device `ordinal`: its primary context retained, its pools made (streams themselves lazily).
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::InvalidArgument(format!("device {ordinal} does not exist ({count} devices)")));
        }
        let mut devices = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(device)) = devices.get(ordinal) {
            return Ok(device.clone());
        }
        let device = Self::open(ordinal)?;
        if devices.len() <= ordinal {
            devices.resize(ordinal + 1, None);
        }
        devices[ordinal] = Some(device.clone());
        Ok(device)
    }

    fn open(ordinal: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).during("cuDevicePrimaryCtxRetain")?;
        ffi::disable_event_tracking(&ctx);
        ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        let name = ctx.name().during("cuDeviceGetName")?;
        let clock_rate_khz =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE).during("cuDeviceGetAttribute")?;
        let priorities = ffi::stream_priority_range()?;
        let events = Arc::new(EventPool::new(ctx.clone()));
        let allocator = Arc::new(Allocator::new(ctx.clone(), events.clone()));
        let default_stream = Stream::new(ctx.default_stream(), 0, ordinal, false);
        Ok(Self {
            shared: Arc::new(Shared {
                ordinal,
                ctx,
                name,
                clock_rate_khz: clock_rate_khz.max(1) as u64,
                priorities,
                default_stream,
                pools: [StreamPool::default(), StreamPool::default()],
                events,
                allocator,
                kernels: OnceLock::new(),
                staged: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    /// The device's name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The SM clock rate the driver reports, in kHz (what the spin kernel's cycles are converted with).
    pub fn clock_rate_khz(&self) -> u64 {
        self.shared.clock_rate_khz
    }

    /// The cudarc context (the primary context of the device).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }

    /// Makes this device's context current on the calling thread (NCCL's init uses the current device).
    pub fn bind_to_thread(&self) -> Result<()> {
        ffi::bind(&self.shared.ctx)
    }

    /// The legacy default stream (id 0).
    pub fn default_stream(&self) -> Stream {
        self.shared.default_stream.clone()
    }

    /// The calling thread's current stream on this device (the default stream unless set).
    pub fn current_stream(&self) -> Stream {
        stream::current(self.shared.ordinal).unwrap_or_else(|| self.default_stream())
    }

    /// Makes `stream` the calling thread's current stream on this device; returns the previous one.
    pub fn set_current_stream(&self, new: &Stream) -> Stream {
        stream::set_current(self.shared.ordinal, new.clone()).unwrap_or_else(|| self.default_stream())
    }

    /// The next stream of the normal or high priority pool (round-robin over 32, made at first use).
    pub fn stream_from_pool(&self, high_priority: bool) -> Result<Stream> {
        self.shared.pools[usize::from(high_priority)].next(|| self.new_stream(high_priority))
    }

    /// A new non-blocking stream outside the pools, of normal or high priority.
    pub fn new_stream(&self, high_priority: bool) -> Result<Stream> {
        let (least, greatest) = self.shared.priorities;
        let priority = if high_priority { greatest } else { least };
        let cuda = self.shared.ctx.new_stream_with_priority(priority).during("cuStreamCreateWithPriority")?;
        Ok(Stream::new(cuda, stream::next_stream_id(), self.shared.ordinal, high_priority))
    }

    /// Wraps a cudarc stream made elsewhere (another library's, or the caller's own), so that pg can use it as
    /// a current stream: ops then order after the work the caller enqueued on it. A stream of another context
    /// (another device, or a context other than the device's primary one) is refused.
    pub fn wrap_stream(&self, cuda: Arc<CudaStream>) -> Result<Stream> {
        self.check_context(cuda.context(), "stream")?;
        Ok(Stream::new(cuda, stream::next_stream_id(), self.shared.ordinal, false))
    }

    /// Refuses an object made elsewhere (`what`: a stream, a slice) whose context is not this device's primary
    /// context: another device, or another context of this one.
    pub fn check_context(&self, ctx: &CudaContext, what: &str) -> Result<()> {
        check_same_context(
            (self.shared.ordinal, self.shared.ctx.cu_ctx() as usize),
            (ctx.ordinal(), ctx.cu_ctx() as usize),
            what,
        )
    }

    /// Wraps a raw `CUstream` another library owns (dropping the result does not destroy it). A stream of
    /// another context is refused with `InvalidArgument`, found through `cuStreamGetCtx`.
    ///
    /// # Safety
    /// `raw` must be a live stream handle (null is the legacy default stream) that its owner keeps alive while the
    /// returned stream, or anything holding it (a current-stream guard, a Work's communication path), may use it.
    pub unsafe fn wrap_raw_stream(&self, raw: cudarc::driver::sys::CUstream) -> Result<Stream> {
        self.bind_to_thread()?;
        // SAFETY: `raw` is live by this function's contract.
        let ctx = unsafe { ffi::stream_context(raw) }?;
        let ordinal = self.shared.ordinal;
        check_same_context((ordinal, self.shared.ctx.cu_ctx() as usize), (ordinal, ctx as usize), "stream")?;
        // SAFETY: `raw` is a live stream of this device's context (checked above), kept alive by its owner as
        // this function's contract requires.
        let cuda = unsafe { ffi::wrap_borrowed_stream(&self.shared.ctx, raw) };
        Ok(Stream::new(cuda, stream::next_stream_id(), ordinal, false))
    }

    /// A new event; its driver object is made at its first record.
    pub fn event(&self) -> Event {
        Event::new(self.shared.events.clone())
    }

    /// A new event with timing enabled ([`Event::nanos_since`]); its driver object is made at its first record
    /// and recycled as a plain event's is.
    pub fn timed_event(&self) -> Event {
        Event::timed(self.shared.events.clone())
    }

    /// A new timing event.
    pub fn timing_event(&self) -> Result<TimingEvent> {
        TimingEvent::new(&self.shared.ctx)
    }

    /// Blocks until all work on every stream of the device is done.
    pub fn synchronize(&self) -> Result<()> {
        self.shared.ctx.synchronize().during("cuCtxSynchronize")
    }

    /// `bytes` of device memory for use on `stream`, from the caching allocator.
    pub fn alloc(&self, bytes: usize, stream: &Stream) -> Result<Buffer> {
        self.check_stream(stream)?;
        let (ptr, block_size) = self.shared.allocator.allocate(bytes, stream)?;
        Ok(Buffer::new(ptr, bytes, block_size, stream.clone(), self.shared.allocator.clone()))
    }

    /// Records that `stream` uses `buffer`: its block is not reused before the work enqueued on `stream` up to
    /// the buffer's free has finished. Orders nothing.
    pub fn record_stream(&self, buffer: &Buffer, stream: &Stream) -> Result<()> {
        self.check_stream(stream)?;
        if buffer.add_use(stream) {
            self.shared.allocator.note_record_stream();
        }
        Ok(())
    }

    /// The allocator's counters.
    pub fn memory_stats(&self) -> AllocatorStats {
        self.shared.allocator.stats()
    }

    /// Returns cached blocks to the driver (synchronises the device).
    pub fn empty_cache(&self) -> Result<()> {
        self.shared.allocator.empty_cache()
    }

    /// Enqueues a copy of `bytes` into `buffer` on `stream`, through a page-locked staging buffer, so the host
    /// neither waits for the stream nor needs `bytes` after the call.
    pub fn copy_from_host(&self, buffer: &Buffer, bytes: &[u8], stream: &Stream) -> Result<()> {
        self.check_stream(stream)?;
        if bytes.len() != buffer.len_bytes() {
            return Err(CudaError::InvalidArgument(format!(
                "copy of {} bytes into a buffer of {} bytes",
                bytes.len(),
                buffer.len_bytes()
            )));
        }
        self.bind_to_thread()?;
        self.reap_staged()?;
        let staging = ffi::host_alloc(bytes.len())?;
        // SAFETY: `staging` was just allocated with `bytes.len()` bytes and nothing else refers to it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), staging, bytes.len()) };
        let done = self.shared.events.take()?;
        // SAFETY: `staging` is page-locked and stays allocated until `done` has completed (reap_staged); the
        // buffer holds `bytes.len()` bytes of this device.
        let copied = unsafe { ffi::copy_htod_async(buffer.ptr(), staging, bytes.len(), stream.cuda()) }
            .and_then(|()| done.record(stream.cuda()).during("cuEventRecord"));
        if let Err(err) = copied {
            // The copy may or may not be queued: wait for the stream before freeing the staging memory.
            let _ = stream.synchronize();
            // SAFETY: the stream is idle, so no copy reads `staging` any more.
            let _ = unsafe { ffi::host_free(staging) };
            return Err(err);
        }
        self.shared.staged.lock().unwrap_or_else(|e| e.into_inner()).push(Staged { ptr: staging, done });
        Ok(())
    }

    /// Frees the staging buffers whose copies have run.
    fn reap_staged(&self) -> Result<()> {
        let mut staged = self.shared.staged.lock().unwrap_or_else(|e| e.into_inner());
        let mut index = 0;
        while index < staged.len() {
            if staged[index].done.try_is_complete().during("cuEventQuery")? {
                let finished = staged.swap_remove(index);
                // SAFETY: the copy reading this memory has completed (its event passed).
                unsafe { ffi::host_free(finished.ptr) }?;
                self.shared.events.give_back(finished.done);
            } else {
                index += 1;
            }
        }
        Ok(())
    }

    /// Enqueues a copy of `buffer` to the host on `stream`, waits for `stream`, and returns the bytes.
    pub fn copy_to_host(&self, buffer: &Buffer, stream: &Stream) -> Result<Vec<u8>> {
        self.check_stream(stream)?;
        self.bind_to_thread()?;
        let mut out = vec![0u8; buffer.len_bytes()];
        // SAFETY: the buffer holds `out.len()` bytes of this device; `out` is not read before the
        // synchronize below.
        unsafe { ffi::copy_dtoh_async(&mut out, buffer.ptr(), stream.cuda()) }?;
        stream.synchronize()?;
        Ok(out)
    }

    /// Enqueues a fill of `buffer` (as `count` elements of `width` bytes) with the bit pattern `pattern`.
    pub fn fill(&self, buffer: &Buffer, width: usize, pattern: u64, stream: &Stream) -> Result<()> {
        self.check_stream(stream)?;
        if !matches!(width, 1 | 2 | 4 | 8) || buffer.len_bytes() % width != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "fill of {width}-byte elements over {} bytes",
                buffer.len_bytes()
            )));
        }
        let count = buffer.len_bytes() / width;
        if count == 0 {
            return Ok(());
        }
        self.bind_to_thread()?;
        if width == 8 {
            let kernels = self.kernels()?;
            // SAFETY: the buffer holds `count * 8` bytes of this device.
            unsafe { ffi::launch_fill64(stream.cuda(), &kernels.fill64, buffer.ptr(), count as u64, pattern) }
        } else {
            // SAFETY: the buffer holds `count * width` bytes of this device.
            unsafe { ffi::memset_async(buffer.ptr(), width, pattern, count, stream.cuda()) }
        }
    }

    /// Enqueues a kernel that spins for `cycles` SM clock ticks.
    pub fn spin_cycles(&self, stream: &Stream, cycles: u64) -> Result<()> {
        self.check_stream(stream)?;
        let kernels = self.kernels()?;
        ffi::launch_spin(stream.cuda(), &kernels.spin, cycles)
    }

    /// The cycles the spin kernel needs for `duration`, from the reported clock rate.
    pub fn cycles_for(&self, duration: Duration) -> u64 {
        (duration.as_secs_f64() * self.shared.clock_rate_khz as f64 * 1e3).round() as u64
    }

    /// Enqueues a kernel that spins for about `duration` (PyTorch's `torch.cuda._sleep`).
    pub fn sleep_kernel(&self, stream: &Stream, duration: Duration) -> Result<()> {
        self.spin_cycles(stream, self.cycles_for(duration))
    }

    fn kernels(&self) -> Result<&Kernels> {
        self.shared.kernels.get_or_init(|| Kernels::load(&self.shared.ctx)).as_ref().map_err(Clone::clone)
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device_ordinal() == self.shared.ordinal {
            Ok(())
        } else {
            Err(CudaError::InvalidArgument(format!("{stream:?} is not a stream of cuda:{}", self.shared.ordinal)))
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device(cuda:{}, {})", self.shared.ordinal, self.shared.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device for a GPU test, or `None` after printing why the test is skipped.
    fn gpu() -> Option<Device> {
        match device_count() {
            Ok(n) if n > 0 => Some(Device::new(0).expect("device 0")),
            Ok(_) => {
                println!("skipped: no CUDA device");
                None
            }
            Err(err) => {
                println!("skipped: {err}");
                None
            }
        }
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match driver_available() {
            Ok(()) => println!("a driver is present; the absence path is not exercised here"),
            Err(err) => {
                assert!(matches!(err, CudaError::DriverNotFound | CudaError::Driver { .. }));
                assert!(Device::new(0).is_err());
                assert!(device_count().is_err());
            }
        }
    }

    #[test]
    fn streams_pools_and_current_stream() {
        let Some(device) = gpu() else { return };
        let first = device.stream_from_pool(false).unwrap();
        assert!(!first.is_high_priority());
        assert!(device.stream_from_pool(true).unwrap().is_high_priority());
        assert_eq!(device.current_stream(), device.default_stream());
        let previous = device.set_current_stream(&first);
        assert_eq!(previous, device.default_stream());
        assert_eq!(device.current_stream(), first);
        let other_thread = {
            let device = device.clone();
            std::thread::spawn(move || device.current_stream()).join().unwrap()
        };
        assert_eq!(other_thread, device.default_stream(), "the current stream is per thread");
        device.set_current_stream(&previous);
    }

    #[test]
    fn fill_copy_and_events() {
        let Some(device) = gpu() else { return };
        let stream = device.stream_from_pool(false).unwrap();
        let buffer = device.alloc(64, &stream).unwrap();
        for (width, pattern) in [(1, 0xabu64), (2, 0x1234), (4, 0xdead_beef), (8, 0x0123_4567_89ab_cdef)] {
            device.fill(&buffer, width, pattern, &stream).unwrap();
            let bytes = device.copy_to_host(&buffer, &stream).unwrap();
            for chunk in bytes.chunks(width) {
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(chunk);
                assert_eq!(u64::from_le_bytes(word), pattern, "width {width}");
            }
        }
        let data: Vec<u8> = (0..64).collect();
        device.copy_from_host(&buffer, &data, &stream).unwrap();
        assert_eq!(device.copy_to_host(&buffer, &stream).unwrap(), data);

        let event = device.event();
        assert!(!event.is_created());
        assert!(event.query().unwrap(), "a never-recorded event counts as complete");
        device.sleep_kernel(&stream, Duration::from_millis(50)).unwrap();
        event.record(&stream).unwrap();
        assert!(event.is_created());
        assert!(!event.query().unwrap(), "the spin kernel is still running");
        event.synchronize().unwrap();
        assert!(event.query().unwrap());
    }

    #[test]
    fn record_stream_keeps_a_block_until_the_other_stream_passes() {
        let Some(device) = gpu() else { return };
        let alloc_stream = device.new_stream(false).unwrap();
        let user = device.new_stream(false).unwrap();
        let buffer = device.alloc(4096, &alloc_stream).unwrap();
        let ptr = buffer.ptr();
        device.sleep_kernel(&user, Duration::from_millis(100)).unwrap();
        device.record_stream(&buffer, &user).unwrap();
        drop(buffer);
        let again = device.alloc(4096, &alloc_stream).unwrap();
        assert_ne!(again.ptr(), ptr, "the block is parked while the user stream runs");
        user.synchronize().unwrap();
        drop(again);
        let third = device.alloc(4096, &alloc_stream).unwrap();
        let stats = device.memory_stats();
        assert!(stats.cache_hits >= 1 && stats.free_events_recorded >= 1, "{stats:?}");
        drop(third);
    }
}

/// Refuses a foreign object (a stream, a slice: `what`) whose context is not the device's: `device` and
/// `other` are (ordinal, context handle).
pub(crate) fn check_same_context(device: (usize, usize), other: (usize, usize), what: &str) -> Result<()> {
    if other.0 != device.0 {
        return Err(CudaError::InvalidArgument(format!("a {what} of cuda:{} given to cuda:{}", other.0, device.0)));
    }
    if other.1 != device.1 {
        return Err(CudaError::InvalidArgument(format!(
            "a {what} of another CUDA context ({:#x}) on cuda:{}, whose primary context pg uses ({:#x})",
            other.1, device.0, device.1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod context_tests {
    use super::check_same_context;

    #[test]
    fn a_foreign_object_of_another_device_or_context_is_refused_by_name() {
        assert!(check_same_context((0, 0x10), (0, 0x10), "stream").is_ok());
        let device = check_same_context((0, 0x10), (1, 0x20), "stream").unwrap_err().to_string();
        assert!(device.contains("a stream of cuda:1 given to cuda:0"), "{device}");
        let context = check_same_context((0, 0x10), (0, 0x30), "slice").unwrap_err().to_string();
        assert!(context.contains("a slice of another CUDA context (0x30) on cuda:0"), "{context}");
    }
}

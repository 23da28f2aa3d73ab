//! `Device`: pg-core's device concept on a pg-cuda device, with NCCL communicator creation.

use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;
use std::time::Duration;

use pg_core::{Buffer as _, CommConfig, DType, Error, UniqueId};

use crate::conv::{cuda_error, fill_pattern, nccl_error};
#[cfg(feature = "testing")]
use crate::launches::{self, KernelKind};
use crate::{Buffer, Communicator, Event, Nccl, Stream};

/// One GPU as this process sees it. Cloning gives another handle to the same device.
#[derive(Debug, Clone)]
pub struct Device {
    cuda: pg_cuda::Device,
}

impl Device {
    /// The GPU `ordinal` (an error, never a panic, without a driver or with too few devices).
    pub fn new(ordinal: usize) -> pg_core::Result<Self> {
        Ok(Self { cuda: pg_cuda::Device::new(ordinal).map_err(cuda_error)? })
    }

    /// The pg-cuda device (pools, allocator statistics, timing events).
    pub fn cuda(&self) -> &pg_cuda::Device {
        &self.cuda
    }

    /// Allocates `numel` elements of `dtype` for use on `stream`.
    pub fn alloc_on(&self, dtype: DType, numel: usize, stream: &Stream) -> pg_core::Result<Buffer> {
        let bytes = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid(format!("{numel} elements of {dtype} overflow the address space")))?;
        let cuda = self.cuda.alloc(bytes, &stream.0).map_err(cuda_error)?;
        Ok(Buffer { cuda, dtype, numel })
    }

    /// Wraps a cudarc stream made elsewhere as a stream of this device: with a [`pg_core::StreamGuard`] it can
    /// be the current stream for a scope, so ops order after the caller's kernels on it and `wait()` orders it
    /// after the op. A stream of another device or context is refused with `InvalidArgument`.
    ///
    /// ```no_run
    /// # fn main() -> pg_core::Result<()> {
    /// use pg_nccl::pg_cuda::cudarc::driver::CudaContext;
    ///
    /// let device = pg_nccl::Device::new(0)?;
    /// let ctx = CudaContext::new(0).map_err(|e| pg_core::Error::Backend(e.to_string()))?;
    /// let theirs = ctx.new_stream().map_err(|e| pg_core::Error::Backend(e.to_string()))?;
    /// let stream = device.wrap_stream(theirs)?;
    /// let _guard = pg_core::StreamGuard::<pg_nccl::Nccl>::new(&device, &stream);
    /// // Ops enqueued here wait for the caller's kernels on `theirs`.
    /// # Ok(())
    /// # }
    /// ```
    pub fn wrap_stream(&self, cuda: std::sync::Arc<pg_cuda::cudarc::driver::CudaStream>) -> pg_core::Result<Stream> {
        self.cuda.wrap_stream(cuda).map(Stream).map_err(cuda_error)
    }

    /// Wraps a raw `CUstream` another library owns as a stream of this device (dropping it destroys nothing); a
    /// stream of another context is refused with `InvalidArgument`.
    ///
    /// # Safety
    /// `raw` must be a live stream handle that its owner keeps alive while the returned stream, or anything that
    /// holds it (a current-stream guard, an op enqueued after it), may use it.
    pub unsafe fn wrap_raw_stream(&self, raw: pg_cuda::cudarc::driver::sys::CUstream) -> pg_core::Result<Stream> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.cuda.wrap_raw_stream(raw) }.map(Stream).map_err(cuda_error)
    }

    fn check_buffer(&self, buffer: &Buffer) -> pg_core::Result<()> {
        if buffer.device_index() == self.cuda.ordinal() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "a buffer of cuda:{} used on cuda:{}",
                buffer.device_index(),
                self.cuda.ordinal()
            )))
        }
    }
}

impl pg_core::Device for Device {
    type B = Nccl;

    fn index(&self) -> usize {
        self.cuda.ordinal()
    }

    fn describe(&self) -> String {
        format!("{} (cuda:{})", self.cuda.name(), self.cuda.ordinal())
    }

    fn current_stream(&self) -> Stream {
        Stream(self.cuda.current_stream())
    }

    fn set_current_stream(&self, stream: &Stream) -> Stream {
        Stream(self.cuda.set_current_stream(&stream.0))
    }

    fn stream_from_pool(&self, high_priority: bool) -> pg_core::Result<Stream> {
        self.cuda.stream_from_pool(high_priority).map(Stream).map_err(cuda_error)
    }

    fn create_event(&self) -> Event {
        Event(self.cuda.event(), self.cuda.ordinal())
    }

    fn create_timing_event(&self) -> pg_core::Result<Event> {
        Ok(Event(self.cuda.timed_event(), self.cuda.ordinal()))
    }

    fn synchronize(&self) -> pg_core::Result<()> {
        // A call already blocked in the driver is not woken by a later failure; in the error-handling modes that
        // abort the communicators the device drains, and the record is read again after the call.
        self.poison().check()?;
        self.cuda.synchronize().map_err(cuda_error)?;
        self.poison().check()
    }

    fn poison(&self) -> &pg_core::Poison {
        crate::stream::poison_of(self.cuda.ordinal())
    }

    fn alloc(&self, dtype: DType, numel: usize) -> pg_core::Result<Buffer> {
        self.alloc_on(dtype, numel, &Stream(self.cuda.current_stream()))
    }

    fn record_stream(&self, buffer: &Buffer, stream: &Stream) -> pg_core::Result<()> {
        self.check_buffer(buffer)?;
        self.cuda.record_stream(&buffer.cuda, &stream.0).map_err(cuda_error)
    }

    fn copy_from_host(&self, buffer: &Buffer, bytes: &[u8], stream: &Stream) -> pg_core::Result<()> {
        self.check_buffer(buffer)?;
        self.cuda.copy_from_host(&buffer.cuda, bytes, &stream.0).map_err(cuda_error)
    }

    fn copy_to_host(&self, buffer: &Buffer, stream: &Stream) -> pg_core::Result<Vec<u8>> {
        self.check_buffer(buffer)?;
        self.poison().check()?;
        let bytes = self.cuda.copy_to_host(&buffer.cuda, &stream.0).map_err(cuda_error)?;
        self.poison().check()?;
        Ok(bytes)
    }

    fn fill(&self, buffer: &Buffer, value: f64, stream: &Stream) -> pg_core::Result<()> {
        self.check_buffer(buffer)?;
        let (width, pattern) = fill_pattern(buffer.dtype, value);
        #[cfg(feature = "testing")]
        let before = launches::before(&self.cuda, &stream.0);
        self.cuda.fill(&buffer.cuda, width, pattern, &stream.0).map_err(cuda_error)?;
        #[cfg(feature = "testing")]
        launches::log(&self.cuda, &stream.0, KernelKind::Fill, "fill", before);
        Ok(())
    }

    fn sleep_kernel(&self, stream: &Stream, duration: Duration) -> pg_core::Result<()> {
        #[cfg(feature = "testing")]
        let before = launches::before(&self.cuda, &stream.0);
        self.cuda.sleep_kernel(&stream.0, duration).map_err(cuda_error)?;
        #[cfg(feature = "testing")]
        launches::log(&self.cuda, &stream.0, KernelKind::Sleep, "sleep", before);
        Ok(())
    }

    fn versions(&self) -> Vec<(String, String)> {
        let mut versions = vec![
            ("device".to_owned(), self.cuda.name().to_owned()),
            ("sm_clock_khz".to_owned(), self.cuda.clock_rate_khz().to_string()),
        ];
        match nccl_sys::library() {
            Ok(lib) => {
                versions.push(("nccl".to_owned(), lib.version().to_string()));
                versions.push(("nccl_library".to_owned(), lib.path().display().to_string()));
            }
            Err(err) => versions.push(("nccl".to_owned(), format!("unavailable: {err}"))),
        }
        versions
    }

    fn new_unique_id(&self) -> pg_core::Result<UniqueId> {
        let library = nccl_sys::library().map_err(nccl_error)?;
        let id = library.get_unique_id().map_err(nccl_error)?;
        Ok(UniqueId(id.to_bytes().to_vec()))
    }

    fn create_communicator(
        &self,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> pg_core::Result<Communicator> {
        Communicator::init(self.cuda.clone(), id, size, rank, config)
    }

    /// As the loaded NCCL allows ([`crate::communicator::capabilities`]); without a loadable NCCL, no
    /// communicator exists and only CUDA's capabilities are declared.
    fn capabilities(&self) -> pg_core::Capabilities {
        match nccl_sys::library() {
            Ok(library) => crate::communicator::capabilities(library),
            Err(_) => pg_core::Capabilities::none()
                .with(pg_core::Capability::Capture)
                .with(pg_core::Capability::TimingEvents)
                .with(pg_core::Capability::HostCallbacks),
        }
    }

    fn join_grown(
        &self,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> pg_core::Result<Communicator> {
        Communicator::join_grown(self.cuda.clone(), id, size, rank, config)
    }

    /// The system clock (0 if it is set before 1970).
    fn wall_clock(&self) -> Duration {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
    }

    fn now(&self) -> Duration {
        pg_cuda::now()
    }

    fn sleep(&self, duration: Duration, interrupt: &AtomicBool) {
        pg_cuda::sleep(duration, interrupt)
    }

    fn notify_host_threads(&self) {
        pg_cuda::notify_host_threads()
    }

    fn spawn_host_thread(
        &self,
        name: &str,
        body: Box<dyn FnOnce() + Send + 'static>,
    ) -> pg_core::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(body)
            .map_err(|err| Error::Backend(format!("spawning host thread {name}: {err}")))
    }
}

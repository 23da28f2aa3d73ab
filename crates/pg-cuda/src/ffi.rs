//! The result level below cudarc's safe API: one small function per driver call we make on raw handles.
//!
//! Every function but [`bind`] binds nothing itself: callers bind the device's context to the thread first
//! (with [`bind`], or `CudaContext::bind_to_thread`), as every driver call below needs the right current context.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::safe::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::driver::{result, sys, CudaContext};

use crate::error::{DriverContext, Result};

/// Whether the driver library can be opened (cudarc would panic at the first call otherwise).
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries `dlopen` on the driver's library names; it calls nothing in the library.
    unsafe { sys::is_culib_present() }
}

/// Makes `ctx` the calling thread's current context unless it already is (`cuCtxGetCurrent`, then
/// `cuCtxSetCurrent` only when it differs). Unlike `CudaContext::bind_to_thread` it does not also take (swap out)
/// the error cudarc stored for the context from a failed release: that read-and-clear is a write to a line every
/// thread using the device shares (the watchdog's event queries included); the next call through cudarc's safe
/// API still reports such an error.
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    if result::ctx::get_current().during("cuCtxGetCurrent")? == Some(ctx.cu_ctx()) {
        return Ok(());
    }
    // SAFETY: `ctx.cu_ctx()` is the live primary context `ctx` holds a reference to.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }.during("cuCtxSetCurrent")
}

/// Turns off cudarc's per-slice event tracking for `ctx`.
pub(crate) fn disable_event_tracking(ctx: &CudaContext) {
    // SAFETY: cudarc's tracking only concerns its `CudaSlice` type, which pg-cuda never creates: all device
    // memory here is raw, and its cross-stream lifetime is the caching allocator's job (record_stream).
    unsafe { ctx.disable_event_tracking() }
}

/// `cuMemAlloc`: `bytes` of device memory on the bound context.
pub(crate) fn mem_alloc(bytes: usize) -> Result<u64> {
    // SAFETY: allocation has no preconditions; the memory is uninitialised, and pg-cuda only hands it out as
    // raw bytes that kernels and copies write before anyone reads them through a typed view.
    unsafe { result::malloc_sync(bytes) }.during("cuMemAlloc")
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` must come from [`mem_alloc`] on the bound context and no queued work may use it any more.
pub(crate) unsafe fn mem_free(ptr: u64) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { result::free_sync(ptr) }.during("cuMemFree")
}

/// `cuMemsetD8Async`/`D16`/`D32`: sets `count` elements of `width` bytes at `ptr` to `pattern`.
///
/// # Safety
/// `ptr` must hold `count * width` bytes of device memory of the stream's context.
pub(crate) unsafe fn memset_async(
    ptr: u64,
    width: usize,
    pattern: u64,
    count: usize,
    stream: &CudaStream,
) -> Result<()> {
    let cu = stream.cu_stream();
    match width {
        // SAFETY: the range is valid by the contract; the stream is live while `stream` is.
        1 => unsafe { result::memset_d8_async(ptr, pattern as u8, count, cu) }.during("cuMemsetD8Async"),
        // SAFETY: as above, for 2-byte elements.
        2 => unsafe { sys::cuMemsetD16Async(ptr, pattern as u16, count, cu) }.result().during("cuMemsetD16Async"),
        // SAFETY: as above, for 4-byte elements.
        4 => unsafe { sys::cuMemsetD32Async(ptr, pattern as u32, count, cu) }.result().during("cuMemsetD32Async"),
        _ => unreachable!("memset_async is called for widths 1, 2 and 4 only"),
    }
}

/// `cuMemAllocHost`: page-locked host memory, for staging copies that must not block the host.
pub(crate) fn host_alloc(bytes: usize) -> Result<*mut u8> {
    // SAFETY: no preconditions; the caller fills the memory before the copy reads it.
    unsafe { result::malloc_host(bytes.max(1), 0) }.map(|p| p.cast::<u8>()).during("cuMemAllocHost")
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` must come from [`host_alloc`] and no queued copy may read it any more.
pub(crate) unsafe fn host_free(ptr: *mut u8) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { result::free_host(ptr.cast::<c_void>()) }.during("cuMemFreeHost")
}

/// `cuMemcpyHtoDAsync` from page-locked memory.
///
/// # Safety
/// `src` must be page-locked host memory of `bytes` bytes that stays valid until the copy has run; `dst` must
/// hold `bytes` bytes of the stream's device.
pub(crate) unsafe fn copy_htod_async(dst: u64, src: *const u8, bytes: usize, stream: &CudaStream) -> Result<()> {
    // SAFETY: `src` is valid for `bytes` by the contract, and so is the slice made of it.
    let src = unsafe { std::slice::from_raw_parts(src, bytes) };
    // SAFETY: ranges valid by the contract; the stream is live.
    unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }.during("cuMemcpyHtoDAsync")
}

/// `cuMemcpyDtoHAsync` into `dst`; the caller synchronises the stream before reading `dst`.
///
/// # Safety
/// `src` must hold `dst.len()` bytes of the stream's device, and `dst` must not be touched until the stream
/// has been synchronised.
pub(crate) unsafe fn copy_dtoh_async(dst: &mut [u8], src: u64, stream: &CudaStream) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }.during("cuMemcpyDtoHAsync")
}

/// The stream priority range of the bound context: `(least, greatest)`, greatest numerically lowest.
pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    result::stream::get_priority_range().during("cuCtxGetStreamPriorityRange")
}

/// Launches the spin kernel: one thread that waits `cycles` clock ticks.
pub(crate) fn launch_spin(stream: &CudaStream, spin: &CudaFunction, cycles: u64) -> Result<()> {
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(spin);
    launch.arg(&cycles);
    // SAFETY: `pg_spin(u64 cycles)` takes exactly this one argument and touches no memory.
    unsafe { launch.launch(cfg) }.map(drop).during("cuLaunchKernel(pg_spin)")
}

/// Launches the 8-byte fill kernel over `count` elements at `ptr`.
///
/// # Safety
/// `ptr` must hold `count * 8` bytes of device memory of the stream's context.
pub(crate) unsafe fn launch_fill64(
    stream: &CudaStream,
    fill: &CudaFunction,
    ptr: u64,
    count: u64,
    pattern: u64,
) -> Result<()> {
    const THREADS: u32 = 256;
    let blocks = count.div_ceil(u64::from(THREADS)).clamp(1, 1024) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(fill);
    launch.arg(&ptr).arg(&count).arg(&pattern);
    // SAFETY: `pg_fill_b64(u64 ptr, u64 count, u64 pattern)` writes `count` 8-byte words from `ptr` (a
    // grid-stride loop), which the contract makes valid.
    unsafe { launch.launch(cfg) }.map(drop).during("cuLaunchKernel(pg_fill_b64)")
}

/// `cuStreamQuery`: whether all work on the stream has finished (`CUDA_ERROR_NOT_READY` means no).
pub(crate) fn stream_query(stream: &CudaStream) -> Result<bool> {
    // SAFETY: the stream is live while `stream` is; the query has no other precondition.
    match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => Err(cudarc::driver::DriverError(other)).during("cuStreamQuery"),
    }
}

/// A host callback as `cuLaunchHostFunc` carries it (boxed once more into a thin pointer for the driver).
pub(crate) type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// The trampoline the driver calls on its own thread: takes the callback back and runs it once. A panic is
/// caught, as unwinding into the driver is undefined.
unsafe extern "C" fn run_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the `Box<HostFn>` that `launch_host_fn` leaked for this one launch; the driver calls the
    // trampoline exactly once with it, so ownership is taken back exactly once.
    let callback = unsafe { Box::from_raw(data.cast::<HostFn>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)).is_err() {
        tracing::error!(target: "pg_cuda", "a host callback panicked; the panic was caught");
    }
}

/// `cuLaunchHostFunc`: the driver runs `callback` on its own thread once all work enqueued on `stream` before it
/// has finished; later work on the stream waits for the callback to return.
pub(crate) fn launch_host_fn(stream: &CudaStream, callback: HostFn) -> Result<()> {
    let data = Box::into_raw(Box::new(callback)).cast::<c_void>();
    // SAFETY: the stream is live while `stream` is; `run_host_fn` has the driver's `CUhostFn` signature and owns
    // `data` from here, which stays valid (leaked) until it runs.
    let launched = unsafe { result::stream::launch_host_function(stream.cu_stream(), run_host_fn, data) };
    if launched.is_err() {
        // SAFETY: the driver refused the launch, so it never calls `run_host_fn` with `data`: take it back once.
        drop(unsafe { Box::from_raw(data.cast::<HostFn>()) });
    }
    launched.during("cuLaunchHostFunc")
}

/// `cuStreamGetCtx`: the context a raw stream belongs to (for the null stream, the bound context).
///
/// # Safety
/// `stream` must be a live stream handle (or null).
pub(crate) unsafe fn stream_context(stream: sys::CUstream) -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the handle is live by the contract; `ctx` is a valid out-pointer for the call's duration.
    unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }.result().during("cuStreamGetCtx")?;
    Ok(ctx)
}

/// Wraps a raw stream of `ctx` that another library owns; dropping the wrapper does not destroy it.
///
/// # Safety
/// `stream` must be a live stream of `ctx` that its owner keeps alive while the wrapper may be used.
pub(crate) unsafe fn wrap_borrowed_stream(ctx: &Arc<CudaContext>, stream: sys::CUstream) -> Arc<CudaStream> {
    // SAFETY: forwarded from this function's contract.
    unsafe { ctx.wrap_borrowed_stream(stream) }
}

/// `cuStreamBeginCapture_v2`.
pub(crate) fn begin_capture(stream: &CudaStream, mode: sys::CUstreamCaptureMode) -> Result<()> {
    // SAFETY: the stream is live while `stream` is; the mode is a valid enum value.
    unsafe { result::stream::begin_capture(stream.cu_stream(), mode) }.during("cuStreamBeginCapture")
}

/// `cuStreamGetCaptureInfo`: the stream's capture status and, while it captures, the capture's unique id.
pub(crate) fn capture_info(stream: &CudaStream) -> Result<(sys::CUstreamCaptureStatus, u64)> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // SAFETY: the stream is live; `status` and `id` are valid out-pointers for the call; the graph, dependency
    // and edge outputs are optional and passed as null.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .during("cuStreamGetCaptureInfo")?;
    Ok((status, id))
}

/// `cuStreamIsCapturing`.
pub(crate) fn is_capturing(stream: &CudaStream) -> Result<sys::CUstreamCaptureStatus> {
    // SAFETY: the stream is live while `stream` is.
    unsafe { result::stream::is_capturing(stream.cu_stream()) }.during("cuStreamIsCapturing")
}

/// `cuStreamEndCapture` then `cuGraphInstantiateWithFlags`: the instantiated graph and its node count. The
/// captured graph itself is destroyed once instantiated (the executable graph does not need it).
pub(crate) fn end_capture(stream: &CudaStream) -> Result<(sys::CUgraphExec, usize)> {
    // SAFETY: the stream is live; the driver returns the graph it captured (null only for an empty capture,
    // which the driver reports as an error on the versions pg supports; checked below all the same).
    let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }.during("cuStreamEndCapture")?;
    if graph.is_null() {
        return Err(crate::CudaError::InvalidArgument("cuStreamEndCapture returned no graph".into()));
    }
    let mut nodes = 0usize;
    // SAFETY: `graph` is the live graph just captured; a null node array asks for the count only.
    let counted = unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }.result();
    // SAFETY: `graph` is live and owned here; instantiation copies what it needs.
    let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
    // SAFETY: `graph` is owned here and nothing uses it after this line (the executable graph is independent).
    let destroyed = unsafe { result::graph::destroy(graph) };
    let exec = exec.during("cuGraphInstantiateWithFlags")?;
    counted.during("cuGraphGetNodes")?;
    destroyed.during("cuGraphDestroy")?;
    Ok((exec, nodes))
}

/// `cuGraphLaunch`.
///
/// # Safety
/// `exec` must be a live executable graph of the stream's context, not launched concurrently from another thread.
pub(crate) unsafe fn graph_launch(exec: sys::CUgraphExec, stream: &CudaStream) -> Result<()> {
    // SAFETY: forwarded from this function's contract; the stream is live.
    unsafe { result::graph::launch(exec, stream.cu_stream()) }.during("cuGraphLaunch")
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// `exec` must be a live executable graph that nothing uses afterwards (a launch still running completes first,
/// as the driver defers the release).
pub(crate) unsafe fn graph_exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { result::graph::exec_destroy(exec) }.during("cuGraphExecDestroy")
}

//! Safe probes of the raw-pointer and caller-kernel paths for the GPU suite's interop task (`testing` feature
//! only): each takes ownership of, or derives every pointer and length from, memory it can see, so its `unsafe`
//! calls hold by construction and the lab needs none of its own.

use std::ops::Range;
use std::sync::Arc;

use pg_core::DType;
use pg_cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use pg_cuda::cudarc::nvrtc::Ptx;

use crate::{Buffer, Device};

/// The slice's device address (no cudarc stream ordering is recorded).
fn address(slice: &CudaSlice<f32>) -> u64 {
    let (ptr, record) = slice.device_ptr(slice.stream());
    drop(record);
    ptr
}

/// A buffer made by [`Buffer::from_raw`] over the whole of `slice`, which becomes its keep-alive.
pub fn raw_over(device: &Device, slice: CudaSlice<f32>) -> pg_core::Result<Buffer> {
    let (ptr, numel) = (address(&slice), slice.len());
    // SAFETY: `ptr..ptr + numel * 4` is `slice`'s live f32 memory on this device, and the slice is the keep-alive.
    unsafe { Buffer::from_raw(ptr, numel, DType::F32, device, Box::new(slice)) }
}

/// The buffer of `range` of `slice` ([`Buffer::from_cuda_slice_range`]) and a raw-pointer buffer over the whole
/// slice that keeps the range's buffer (and so the slice) alive.
pub fn range_and_whole(
    device: &Device,
    slice: CudaSlice<f32>,
    range: Range<usize>,
) -> pg_core::Result<(Buffer, Buffer)> {
    let (base, numel) = (address(&slice), slice.len());
    let part = Buffer::from_cuda_slice_range(device, slice, range)?;
    // SAFETY: `base..base + numel * 4` is the live slice that `part` owns, and `part` is the keep-alive.
    let whole = unsafe { Buffer::from_raw(base, numel, DType::F32, device, Box::new(part.clone())) }?;
    Ok((part, whole))
}

/// [`Buffer::from_raw`] with a null pointer: refused before anything uses it.
pub fn raw_null(device: &Device) -> pg_core::Result<Buffer> {
    // SAFETY: a null pointer is refused before it is used; nothing is read or written.
    unsafe { Buffer::from_raw(0, 16, DType::F32, device, Box::new(())) }
}

/// [`Buffer::from_raw`] two bytes into `slice` (at least 17 elements), not aligned to f32: refused before anything
/// uses it.
pub fn raw_misaligned(device: &Device, slice: CudaSlice<f32>) -> pg_core::Result<Buffer> {
    if slice.len() < 17 {
        return Err(pg_core::Error::invalid("raw_misaligned: the slice needs at least 17 elements"));
    }
    let ptr = address(&slice) + 2;
    // SAFETY: the 16 elements from `ptr` lie inside the slice, which is the keep-alive; the misaligned pointer is
    // refused before it is used.
    unsafe { Buffer::from_raw(ptr, 16, DType::F32, device, Box::new(slice)) }
}

/// Launches on the caller's `stream` pg's spin kernel for `cycles`, then its fill kernel writing `pattern` into every
/// 8-byte word of `slice` (an even number of f32): a caller's own kernels, for the stream-ordering probe.
pub fn spin_then_fill(
    context: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    cycles: u64,
    slice: &CudaSlice<f32>,
    pattern: u64,
) -> Result<(), String> {
    let cuda = |what: &'static str| move |e: pg_cuda::cudarc::driver::DriverError| format!("{what}: {e:?}");
    if slice.len() % 2 != 0 {
        return Err("spin_then_fill: the slice needs an even number of f32 (whole 8-byte words)".to_owned());
    }
    let module = context.load_module(Ptx::from_src(pg_cuda::kernels_ptx())).map_err(cuda("load_module"))?;
    let spin = module.load_function("pg_spin").map_err(cuda("pg_spin"))?;
    let fill = module.load_function("pg_fill_b64").map_err(cuda("pg_fill_b64"))?;
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&spin);
    launch.arg(&cycles);
    // SAFETY: pg_spin takes one u64 and touches no memory.
    unsafe { launch.launch(one) }.map_err(cuda("pg_spin"))?;
    let (base, words) = (address(slice), (slice.len() / 2) as u64);
    let mut launch = stream.launch_builder(&fill);
    launch.arg(&base).arg(&words).arg(&pattern);
    let grid = LaunchConfig { grid_dim: (256, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: pg_fill_b64(ptr, count, pattern) stores `count` u64 words from `ptr`: `words` is half the slice's f32
    // count, all of it live memory the caller keeps until the stream has passed the kernel.
    unsafe { launch.launch(grid) }.map_err(cuda("pg_fill_b64"))?;
    Ok(())
}

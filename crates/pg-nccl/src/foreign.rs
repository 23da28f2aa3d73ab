//! Memory from elsewhere, zero copy: a [`Buffer`] made from a cudarc `CudaSlice` (or a range of it) or from a raw
//! device pointer, owning the caller's handle; and the checks that refuse bad foreign memory before anything is
//! enqueued.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

use pg_core::{DType, Error};
use pg_cuda::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use crate::conv::cuda_error;
use crate::{Buffer, Device};

/// A Rust element type that has a pg dtype: what a cudarc `CudaSlice<T>` may hold to become a [`Buffer`].
pub trait Element: DeviceRepr + Send + Sync + 'static {
    /// The dtype of the elements.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t {
            const DTYPE: DType = DType::$d;
        })*
    };
}
element!(f32 => F32, f64 => F64, i8 => I8, u8 => U8, i32 => I32, i64 => I64);

impl Buffer {
    /// Takes a cudarc `CudaSlice` as a buffer of `device`, zero copy: the buffer owns the slice and drops it
    /// when its last handle goes. A process group keeps a handle until the op's end event has passed (whatever
    /// its `avoid_record_streams` mode), so the caller may drop its own handles at once.
    ///
    /// Refused with `InvalidArgument`, before anything is enqueued: a slice of another device or of a context
    /// other than the device's primary one.
    ///
    /// ```no_run
    /// # fn main() -> pg_core::Result<()> {
    /// use pg_nccl::pg_cuda::cudarc::driver::CudaContext;
    ///
    /// let device = pg_nccl::Device::new(0)?;
    /// let ctx = CudaContext::new(0).map_err(|e| pg_core::Error::Backend(e.to_string()))?;
    /// let grads = ctx.default_stream().alloc_zeros::<f32>(1 << 20).map_err(|e| pg_core::Error::Backend(e.to_string()))?;
    /// let buffer = pg_nccl::Buffer::from_cuda_slice(&device, grads)?;
    /// # let _ = buffer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_cuda_slice<T: Element>(device: &Device, slice: CudaSlice<T>) -> pg_core::Result<Self> {
        let len = slice.len();
        Self::from_cuda_slice_range(device, slice, 0..len)
    }

    /// Like [`Buffer::from_cuda_slice`], for the elements `range` of the slice (what a cudarc `CudaView` of it
    /// would cover); the buffer owns the whole slice. A range outside the slice is refused.
    pub fn from_cuda_slice_range<T: Element>(
        device: &Device,
        slice: CudaSlice<T>,
        range: Range<usize>,
    ) -> pg_core::Result<Self> {
        check_range(&range, slice.len())?;
        device.cuda().check_context(slice.context(), "slice").map_err(cuda_error)?;
        let stream = device.cuda().wrap_stream(Arc::clone(slice.stream())).map_err(cuda_error)?;
        // Ordered on the slice's own stream: it waits for the slice's last write if cudarc tracks it.
        let (base, record) = slice.device_ptr(slice.stream());
        drop(record);
        let size = std::mem::size_of::<T>() as u64;
        let ptr = base + range.start as u64 * size;
        let numel = range.len();
        extent(ptr, numel, T::DTYPE)?;
        // SAFETY: `ptr..ptr + numel * size` lies in the slice (the range was checked), device memory of the
        // stream's context (checked by `wrap_stream`), and the slice is the keep-alive, so it stays valid.
        let cuda = unsafe { pg_cuda::Buffer::foreign(ptr, numel * size as usize, stream, Box::new(slice)) };
        Ok(Self { cuda, dtype: T::DTYPE, numel })
    }

    /// Takes raw device memory as a buffer of `device`, zero copy: `numel` elements of `dtype` at `ptr`, with
    /// `keep_alive` (the owner's handle) dropped when the buffer's last handle goes. A process group keeps a
    /// handle until the op's end event has passed.
    ///
    /// Refused with `InvalidArgument`: a null pointer, a size that overflows, a pointer not aligned to `dtype`.
    ///
    /// # Safety
    /// `ptr..ptr + numel * dtype.size()` must be device memory of `device` (in its primary context, or memory
    /// that context can address), holding `dtype` elements, valid for as long as `keep_alive` lives; and its
    /// owner must not free or reuse it before dropping `keep_alive`.
    pub unsafe fn from_raw(
        ptr: u64,
        numel: usize,
        dtype: DType,
        device: &Device,
        keep_alive: Box<dyn Any + Send + Sync>,
    ) -> pg_core::Result<Self> {
        let bytes = extent(ptr, numel, dtype)?;
        let stream = device.cuda().default_stream();
        // SAFETY: forwarded from this function's contract.
        let cuda = unsafe { pg_cuda::Buffer::foreign(ptr, bytes, stream, keep_alive) };
        Ok(Self { cuda, dtype, numel })
    }
}

/// The byte size of `numel` elements of `dtype` at `ptr`, or why that memory cannot be a buffer.
fn extent(ptr: u64, numel: usize, dtype: DType) -> pg_core::Result<usize> {
    if ptr == 0 {
        return Err(Error::invalid("a foreign buffer at a null device pointer"));
    }
    let bytes = numel
        .checked_mul(dtype.size())
        .filter(|bytes| ptr.checked_add(*bytes as u64).is_some())
        .ok_or_else(|| Error::invalid(format!("a foreign buffer of {numel} x {dtype} at {ptr:#x} overflows")))?;
    if ptr % dtype.size() as u64 != 0 {
        return Err(Error::invalid(format!("a foreign buffer at {ptr:#x} is not aligned to its dtype {dtype}")));
    }
    Ok(bytes)
}

/// Refuses a range that is not inside a slice of `len` elements.
fn check_range(range: &Range<usize>, len: usize) -> pg_core::Result<()> {
    if range.start > range.end || range.end > len {
        return Err(Error::invalid(format!("elements {range:?} of a slice of {len}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_foreign_memory_is_refused_by_name() {
        assert_eq!(extent(0x1000, 4, DType::F32).unwrap(), 16);
        let null = extent(0, 4, DType::F32).unwrap_err();
        assert!(null.to_string().contains("null device pointer"), "{null}");
        let overflow = extent(0x1000, usize::MAX, DType::F64).unwrap_err();
        assert!(overflow.to_string().contains("overflows"), "{overflow}");
        let misaligned = extent(0x1002, 4, DType::F32).unwrap_err();
        assert!(misaligned.to_string().contains("not aligned to its dtype"), "{misaligned}");
        for error in [null, overflow, misaligned] {
            assert_eq!(error.kind(), pg_core::ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn a_range_outside_the_slice_is_refused() {
        assert!(check_range(&(2..6), 6).is_ok());
        assert!(check_range(&(2..7), 6).unwrap_err().to_string().contains("elements 2..7 of a slice of 6"));
        #[allow(clippy::reversed_empty_ranges)] // A reason: the reversed range is the bad input under test.
        let reversed = 4..2;
        assert!(check_range(&reversed, 6).is_err());
    }

    #[test]
    fn element_types_map_to_their_dtypes() {
        assert_eq!((f32::DTYPE, f64::DTYPE, i32::DTYPE, i64::DTYPE), (DType::F32, DType::F64, DType::I32, DType::I64));
        assert_eq!((u8::DTYPE, i8::DTYPE), (DType::U8, DType::I8));
    }
}

//! `Buffer`: device memory of one dtype, from pg-cuda's caching allocator or from elsewhere (`foreign.rs`).

use pg_core::DType;

use crate::Nccl;

/// Device memory holding `numel` elements of `dtype`. Cloning gives another handle to the same memory.
#[derive(Debug, Clone)]
pub struct Buffer {
    pub(crate) cuda: pg_cuda::Buffer,
    pub(crate) dtype: DType,
    pub(crate) numel: usize,
}

impl Buffer {
    /// The pg-cuda buffer (its device pointer, its allocation stream).
    pub fn cuda(&self) -> &pg_cuda::Buffer {
        &self.cuda
    }

    pub(crate) fn ptr(&self) -> *mut std::ffi::c_void {
        self.cuda.ptr() as *mut std::ffi::c_void
    }
}

impl pg_core::Buffer for Buffer {
    type B = Nccl;

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn numel(&self) -> usize {
        self.numel
    }

    fn device_index(&self) -> usize {
        self.cuda.device_ordinal()
    }

    fn is_foreign(&self) -> bool {
        self.cuda.is_foreign()
    }
}

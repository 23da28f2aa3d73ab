//! `Stream`: pg-core's stream concept on a CUDA stream.

use crate::conv::cuda_error;
use crate::{Event, Nccl};

/// A CUDA stream of one device. Cloning gives another handle to the same stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream(pub(crate) pg_cuda::Stream);

impl Stream {
    /// The pg-cuda stream.
    pub fn cuda(&self) -> &pg_cuda::Stream {
        &self.0
    }

    /// Wraps a pg-cuda stream.
    pub fn from_cuda(stream: pg_cuda::Stream) -> Self {
        Self(stream)
    }
}

impl pg_core::Stream for Stream {
    type B = Nccl;

    fn id(&self) -> u64 {
        self.0.id()
    }

    fn is_high_priority(&self) -> bool {
        self.0.is_high_priority()
    }

    fn wait_event(&self, event: &Event) -> pg_core::Result<()> {
        self.0.wait_event(&event.0).map_err(cuda_error)
    }

    fn query(&self) -> pg_core::Result<bool> {
        self.0.query().map_err(cuda_error)
    }

    fn synchronize(&self) -> pg_core::Result<()> {
        let poison = crate::device::poison_of(self.0.device_ordinal());
        poison.check()?;
        self.0.synchronize().map_err(cuda_error)?;
        poison.check()
    }
}

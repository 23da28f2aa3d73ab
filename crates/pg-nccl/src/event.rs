//! `Event`: pg-core's event concept on a lazily created, recycled CUDA event.

use crate::conv::cuda_error;
use crate::{Nccl, Stream};

/// A CUDA event whose driver object is made at its first record (S13).
#[derive(Debug)]
/// The second field is the device ordinal, whose failure record its synchronisation reads.
pub struct Event(pub(crate) pg_cuda::Event, pub(crate) usize);

impl pg_core::Event for Event {
    type B = Nccl;

    fn record(&self, stream: &Stream) -> pg_core::Result<()> {
        self.0.record(&stream.0).map_err(cuda_error)
    }

    fn query(&self) -> pg_core::Result<bool> {
        self.0.query().map_err(cuda_error)
    }

    fn synchronize(&self) -> pg_core::Result<()> {
        let poison = crate::device::poison_of(self.1);
        poison.check()?;
        self.0.synchronize().map_err(cuda_error)?;
        poison.check()
    }

    fn is_created(&self) -> bool {
        self.0.is_created()
    }
}

//! `Stream` and `Event`: pg-core's stream and event concepts on a CUDA stream and a lazily created, recycled
//! CUDA event (one file: each names the other in its trait impl).

use crate::conv::cuda_error;
use crate::Nccl;

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
        let poison = poison_of(self.0.device_ordinal());
        poison.check()?;
        self.0.synchronize().map_err(cuda_error)?;
        poison.check()
    }

    fn launch_host_fn(&self, callback: Box<dyn FnOnce() + Send + 'static>) -> pg_core::Result<()> {
        self.0.launch_host_fn(callback).map_err(cuda_error)
    }
}

/// A CUDA event whose driver object is made at its first record. The second field is the device ordinal,
/// whose failure record its synchronisation reads.
#[derive(Debug)]
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
        let poison = poison_of(self.1);
        poison.check()?;
        self.0.synchronize().map_err(cuda_error)?;
        poison.check()
    }

    fn is_created(&self) -> bool {
        self.0.is_created()
    }
}

/// The failure record of device `ordinal`, shared by every handle of it in this process (ordinals from 64 on,
/// beyond any machine pg runs on, share one record).
pub(crate) fn poison_of(ordinal: usize) -> &'static pg_core::Poison {
    static RECORDS: [pg_core::Poison; 65] = [const { pg_core::Poison::new() }; 65];
    &RECORDS[ordinal.min(64)]
}

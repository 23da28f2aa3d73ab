//! The CUDA-aware Future of a Work: marked complete at once, ordered on streams (S17).

use std::fmt;
use std::sync::Arc;

use crate::{Backend, Device, Event, Result, Stream};

/// The Future of a Work, as PyTorch's CUDA-aware `ivalue::Future`.
///
/// It is created under the communication stream and marked complete with the outputs at once:
/// [`Future::is_done`] is true right after the op is enqueued, while the device may still be running it.
/// `is_done()` is therefore NOT a device-completion signal; [`Future::gpu_completed`] is.
/// [`Future::wait`] orders the caller's current stream after the op and returns the outputs; it does not
/// block the host.
pub struct Future<B: Backend> {
    device: B::Device,
    end_event: Arc<B::Event>,
    outputs: Vec<B::Buffer>,
}

impl<B: Backend> Clone for Future<B> {
    fn clone(&self) -> Self {
        Self { device: self.device.clone(), end_event: Arc::clone(&self.end_event), outputs: self.outputs.clone() }
    }
}

impl<B: Backend> fmt::Debug for Future<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Future").field("outputs", &self.outputs.len()).finish_non_exhaustive()
    }
}

impl<B: Backend> Future<B> {
    pub(crate) fn new(device: B::Device, end_event: Arc<B::Event>, outputs: Vec<B::Buffer>) -> Self {
        Self { device, end_event, outputs }
    }

    /// Always true: the value was marked at enqueue. This says nothing about the device.
    pub fn is_done(&self) -> bool {
        true
    }

    /// Orders the caller's current stream after the op and returns the outputs (no host wait).
    pub fn wait(&self) -> Result<Vec<B::Buffer>> {
        self.device.current_stream().wait_event(&self.end_event)?;
        Ok(self.outputs.clone())
    }

    /// The outputs, without ordering anything: using them on a stream needs [`Future::wait`] first.
    pub fn value(&self) -> &[B::Buffer] {
        &self.outputs
    }

    /// The truthful signal: whether the op has finished on the device.
    pub fn gpu_completed(&self) -> Result<bool> {
        self.end_event.query()
    }
}

//! `StreamGuard`: sets the calling thread's current stream for a scope.

use crate::{Backend, Device};

/// Makes a stream the calling thread's current stream until dropped, then restores the previous one
/// (PyTorch's `CUDAStreamGuard`).
#[derive(Debug)]
#[must_use = "the previous stream is restored when the guard is dropped"]
pub struct StreamGuard<B: Backend> {
    device: B::Device,
    previous: B::Stream,
}

impl<B: Backend> StreamGuard<B> {
    /// Makes `stream` current on `device` for the calling thread.
    pub fn new(device: &B::Device, stream: &B::Stream) -> Self {
        let previous = device.set_current_stream(stream);
        Self { device: device.clone(), previous }
    }
}

impl<B: Backend> Drop for StreamGuard<B> {
    fn drop(&mut self) {
        self.device.set_current_stream(&self.previous);
    }
}

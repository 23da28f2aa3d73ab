//! The CUDA-aware Future of a Work: marked complete at once, ordered on streams (S17).

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::completion::Completion;
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
    /// The Work the Future came from, which [`Future::then`] awaits.
    completion: Arc<dyn Completion>,
}

impl<B: Backend> Clone for Future<B> {
    fn clone(&self) -> Self {
        Self {
            device: self.device.clone(),
            end_event: Arc::clone(&self.end_event),
            outputs: self.outputs.clone(),
            completion: Arc::clone(&self.completion),
        }
    }
}

impl<B: Backend> fmt::Debug for Future<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Future").field("outputs", &self.outputs.len()).finish_non_exhaustive()
    }
}

impl<B: Backend> Future<B> {
    pub(crate) fn new(
        device: B::Device,
        end_event: Arc<B::Event>,
        outputs: Vec<B::Buffer>,
        completion: Arc<dyn Completion>,
    ) -> Self {
        Self { device, end_event, outputs, completion }
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

    /// PyTorch's `Future.then`: a new future that, once the op has finished on the device, runs `callback` with
    /// this Future and resolves with what it returns.
    ///
    /// The op's error (a timeout, an abort, a communicator error) resolves the new future with that error, and
    /// `callback` does not run. Like every Rust future it is lazy: `callback` runs on the task that awaits it,
    /// after the device is done (never inside the backend's host callback, so it may use the device). Awaiting
    /// blocks no host thread and polls nothing (see [`crate::WorkFuture`]).
    ///
    /// ```
    /// use pg_core::{Backend, Buffer as _, ProcessGroup, ReduceOp, Result};
    ///
    /// /// How many elements the all_reduce produced, once the device has produced them.
    /// async fn reduced_len<B: Backend>(pg: &ProcessGroup<B>, grads: &B::Buffer) -> Result<usize> {
    ///     let future = pg.all_reduce(grads, ReduceOp::Sum)?.future();
    ///     future.then(|done| done.value()[0].numel()).await
    /// }
    /// ```
    pub fn then<T, F>(&self, callback: F) -> Then<B, F>
    where
        F: FnOnce(&Future<B>) -> T + Unpin,
    {
        Then { future: self.clone(), callback: Some(callback) }
    }
}

/// The future [`Future::then`] returns: resolves with the callback's value once the op has finished.
#[must_use = "the callback runs only when the future is awaited"]
pub struct Then<B: Backend, F> {
    future: Future<B>,
    callback: Option<F>,
}

impl<B: Backend, F> fmt::Debug for Then<B, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Then").field("future", &self.future).field("ran", &self.callback.is_none()).finish()
    }
}

// Nothing in a Future is pinned in place: it holds handles only, so moving it is always fine.
impl<B: Backend> Unpin for Future<B> {}

impl<B: Backend, T, F> std::future::Future for Then<B, F>
where
    F: FnOnce(&Future<B>) -> T + Unpin,
{
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        match this.future.completion.poll_completion(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Ready(Ok(())) => match this.callback.take() {
                Some(callback) => Poll::Ready(Ok(callback(&this.future))),
                None => panic!("pg_core::Then polled after it resolved"),
            },
        }
    }
}

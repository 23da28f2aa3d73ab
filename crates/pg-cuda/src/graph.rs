//! CUDA graphs: capturing a stream's work (`cuStreamBeginCapture`), instantiating what it recorded
//! (`cuGraphInstantiateWithFlags`) and launching it (`cuGraphLaunch`), with the handles a graph keeps alive.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys::{self, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::CudaContext;

use crate::error::{CudaError, DriverContext, Result};
use crate::stream::Stream;

/// Which calls of other threads a capture forbids (`CUstreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
    Global,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
    ThreadLocal,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`.
    Relaxed,
}

/// A stream's capture status (`cuStreamGetCaptureInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing, into the capture with this unique id.
    Active(u64),
    /// Capturing, but a forbidden call invalidated the capture: ending it fails.
    Invalidated,
}

/// A handle a graph keeps alive, with nothing else to do with it.
type Kept = Box<dyn Any + Send + Sync>;

/// Handles to keep alive, per capture in progress (by capture id), until the capture's graph takes them.
fn kept() -> &'static Mutex<HashMap<u64, Vec<Kept>>> {
    static KEPT: std::sync::OnceLock<Mutex<HashMap<u64, Vec<Kept>>>> = std::sync::OnceLock::new();
    KEPT.get_or_init(Mutex::default)
}

impl Stream {
    /// Starts capturing this stream (`cuStreamBeginCapture`).
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let mode = match mode {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        self.cuda().context().bind_to_thread().during("cuCtxSetCurrent")?;
        crate::ffi::begin_capture(self.cuda(), mode)
    }

    /// Whether this stream is capturing (`cuStreamIsCapturing`; an invalidated capture counts). The legacy default
    /// stream never is (CUDA refuses to begin a capture on it or to join it to one), so its answer needs no call.
    pub fn is_capturing(&self) -> Result<bool> {
        if self.is_legacy_default() {
            return Ok(false);
        }
        crate::ffi::bind(self.cuda().context())?;
        let status = crate::ffi::is_capturing(self.cuda())?;
        Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The capture status with the capture's id (`cuStreamGetCaptureInfo`).
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        crate::ffi::bind(self.cuda().context())?;
        let (status, id) = crate::ffi::capture_info(self.cuda())?;
        Ok(match status {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active(id),
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => CaptureStatus::Invalidated,
        })
    }

    /// Keeps `item` alive for as long as the graph of the capture this stream takes part in (as origin or
    /// joined stream) exists.
    pub fn capture_keep_alive(&self, item: Box<dyn Any + Send + Sync>) -> Result<()> {
        match self.capture_status()? {
            CaptureStatus::Active(id) => {
                kept().lock().unwrap_or_else(PoisonError::into_inner).entry(id).or_default().push(item);
                Ok(())
            }
            _ => Err(CudaError::InvalidArgument(format!("capture_keep_alive: {self:?} is not capturing"))),
        }
    }

    /// Ends the capture this stream began (`cuStreamEndCapture`) and instantiates the graph. The handles kept
    /// for the capture move into the graph; on failure they are dropped (the capture has ended either way).
    pub fn end_capture(&self) -> Result<Graph> {
        self.cuda().context().bind_to_thread().during("cuCtxSetCurrent")?;
        // The id is valid for an active and for an invalidated capture: both may have kept handles.
        let (status, id) = crate::ffi::capture_info(self.cuda())?;
        let id = (status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id);
        let ended = crate::ffi::end_capture(self.cuda());
        let kept = id.and_then(|id| kept().lock().unwrap_or_else(PoisonError::into_inner).remove(&id));
        let (exec, nodes) = ended?;
        Ok(Graph {
            exec: Mutex::new(exec),
            ctx: Arc::clone(self.cuda().context()),
            nodes,
            kept: kept.unwrap_or_default(),
            launched: Mutex::new(Vec::new()),
        })
    }
}

/// An instantiated CUDA graph (`CUgraphExec`) and the handles it keeps alive.
pub struct Graph {
    /// The executable graph; the lock serialises launches (graph objects are not thread safe).
    exec: Mutex<sys::CUgraphExec>,
    ctx: Arc<CudaContext>,
    nodes: usize,
    kept: Vec<Kept>,
    /// The streams it was launched on: dropping the graph waits for them before releasing what it keeps.
    launched: Mutex<Vec<Stream>>,
}

// SAFETY: the executable graph handle is only used under `exec`'s lock (launch) or with exclusive access (drop);
// the driver allows using it from any thread once calls are serialised.
unsafe impl Send for Graph {}
// SAFETY: as above: shared access goes through the lock.
unsafe impl Sync for Graph {}

impl Graph {
    /// Launches the graph on `stream` (`cuGraphLaunch`): ordered after the work enqueued on it so far; later
    /// work waits for the whole graph.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let exec = self.exec.lock().unwrap_or_else(PoisonError::into_inner);
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: `exec` is live until drop and launches are serialised by the lock held here.
        unsafe { crate::ffi::graph_launch(*exec, stream.cuda()) }?;
        let mut launched = self.launched.lock().unwrap_or_else(PoisonError::into_inner);
        if !launched.contains(stream) {
            launched.push(stream.clone());
        }
        Ok(())
    }

    /// The number of nodes the capture recorded.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// The handles the graph keeps alive ([`Stream::capture_keep_alive`]), for a caller to find its own among.
    pub fn kept(&self) -> impl Iterator<Item = &(dyn Any + Send + Sync)> {
        self.kept.iter().map(|item| &**item)
    }
}

impl Drop for Graph {
    /// Waits for the streams it was launched on, so that the memory it kept is not reused while a launch may
    /// still run, then destroys the executable graph and releases what it kept.
    fn drop(&mut self) {
        for stream in self.launched.get_mut().unwrap_or_else(PoisonError::into_inner).drain(..) {
            if let Err(error) = stream.synchronize() {
                tracing::warn!(target: "pg_cuda", "dropping a graph: synchronizing {stream:?} failed: {error}");
            }
        }
        let exec = *self.exec.get_mut().unwrap_or_else(PoisonError::into_inner);
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: exclusive access in drop; nothing uses `exec` after this.
            if let Err(error) = unsafe { crate::ffi::graph_exec_destroy(exec) } {
                tracing::warn!(target: "pg_cuda", "{error}");
            }
        }
        self.kept.clear();
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Graph(cuda:{}, {} nodes)", self.ctx.ordinal(), self.nodes)
    }
}

//! `Stream`, `Event` and `Graph`: pg-core's stream, event and graph concepts on a CUDA stream, a lazily created,
//! recycled CUDA event and an instantiated CUDA graph (one file: each names another in its trait impl).

use std::sync::Arc;

use crate::conv::cuda_error;
use crate::Nccl;

/// The backend's communicator, named through the backend (the communicator's file names this one's types).
type Communicator = <Nccl as pg_core::Backend>::Communicator;

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

    fn is_capturing(&self) -> pg_core::Result<bool> {
        self.0.is_capturing().map_err(cuda_error)
    }

    fn begin_capture(&self, mode: pg_core::CaptureMode) -> pg_core::Result<()> {
        let mode = match mode {
            pg_core::CaptureMode::Global => pg_cuda::CaptureMode::Global,
            pg_core::CaptureMode::ThreadLocal => pg_cuda::CaptureMode::ThreadLocal,
            pg_core::CaptureMode::Relaxed => pg_cuda::CaptureMode::Relaxed,
        };
        self.0.begin_capture(mode).map_err(cuda_error)
    }

    fn end_capture(&self) -> pg_core::Result<Graph> {
        let graph = self.0.end_capture().map_err(cuda_error)?;
        let comms: Vec<Arc<Communicator>> =
            graph.kept().filter_map(|item| item.downcast_ref::<Arc<Communicator>>()).cloned().collect();
        for comm in &comms {
            comm.graph_created();
        }
        Ok(Graph { cuda: Some(graph), comms })
    }

    fn capture_keep_alive(&self, buffer: &crate::Buffer) -> pg_core::Result<()> {
        self.0.capture_keep_alive(Box::new(buffer.clone())).map_err(cuda_error)
    }

    fn capture_keep_communicator(&self, comm: &Arc<Communicator>) -> pg_core::Result<()> {
        self.0.capture_keep_alive(Box::new(Arc::clone(comm))).map_err(cuda_error)
    }
}

/// An instantiated CUDA graph: what a stream capture recorded (NCCL collectives included: an NCCL call on a
/// capturing stream becomes graph nodes), with the buffers and communicators the process group kept alive for
/// it. A launch once one of those communicators is aborted or finalized is refused, since its captured kernels
/// would run on released NCCL resources.
#[derive(Debug)]
pub struct Graph {
    /// The instantiated graph (`None` only while it is dropped).
    cuda: Option<pg_cuda::Graph>,
    /// The communicators of its captured ops, which it holds and counts ([`Communicator::graph_created`]).
    comms: Vec<Arc<Communicator>>,
}

impl Graph {
    /// The pg-cuda graph.
    pub fn cuda(&self) -> &pg_cuda::Graph {
        self.cuda.as_ref().expect("a graph holds its CUDA graph until it is dropped")
    }
}

impl Drop for Graph {
    /// Destroys the CUDA graph first (NCCL's teardown of the communicators waits for that), then uncounts it on
    /// the communicators and lets them go: the last handle of one destroys it.
    fn drop(&mut self) {
        drop(self.cuda.take());
        for comm in &self.comms {
            comm.graph_destroyed();
        }
    }
}

impl pg_core::Graph for Graph {
    type B = Nccl;

    fn launch(&self, stream: &Stream) -> pg_core::Result<()> {
        use pg_core::Communicator as _;
        if let Some(comm) = self.comms.iter().find(|comm| comm.is_aborted() || comm.is_finalized()) {
            let state = if comm.is_aborted() { "aborted" } else { "finalized (its group was shut down)" };
            return Err(pg_core::Error::Aborted {
                reason: format!(
                    "Graph::launch: the graph holds ops of NCCL communicator rank {} of {}, which was {state}",
                    comm.rank(),
                    comm.size()
                ),
            });
        }
        self.cuda().launch(&stream.0).map_err(cuda_error)
    }

    fn node_count(&self) -> usize {
        self.cuda().node_count()
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

    fn nanos_since(&self, start: &Event) -> pg_core::Result<Option<i64>> {
        self.0.nanos_since(&start.0).map_err(cuda_error)
    }
}

/// The failure record of device `ordinal`, shared by every handle of it in this process (ordinals from 64 on,
/// beyond any machine pg runs on, share one record).
pub(crate) fn poison_of(ordinal: usize) -> &'static pg_core::Poison {
    static RECORDS: [pg_core::Poison; 65] = [const { pg_core::Poison::new() }; 65];
    &RECORDS[ordinal.min(64)]
}

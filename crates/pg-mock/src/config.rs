//! How a simulated world is built: its devices, cost model, hazard mode and faults.

use std::time::Duration;

use crate::fault::Fault;
use crate::hazard::HazardMode;

/// The host-side costs of API calls, charged to the calling thread's local time (they never force lockstep).
#[derive(Debug, Clone)]
pub struct HostCosts {
    /// Launching a kernel or a copy (`fill`, `sleep_kernel`, `copy_*`).
    pub kernel_launch: Duration,
    /// Recording an event.
    pub event_record: Duration,
    /// Making a stream wait for an event.
    pub stream_wait: Duration,
    /// Querying an event, a stream or a communicator.
    pub query: Duration,
    /// Enqueuing a collective or a point-to-point operation.
    pub collective_enqueue: Duration,
    /// One store operation.
    pub store_op: Duration,
}

impl Default for HostCosts {
    fn default() -> Self {
        Self {
            kernel_launch: Duration::from_micros(5),
            event_record: Duration::from_nanos(250),
            stream_wait: Duration::from_nanos(250),
            query: Duration::from_nanos(250),
            collective_enqueue: Duration::from_micros(5),
            store_op: Duration::from_micros(10),
        }
    }
}

/// How a [`World`](crate::World) is built: its devices, cost model, hazard mode and faults.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// The number of simulated devices (device `i` is used by rank `i` in [`World::run`](crate::World::run)).
    pub devices: usize,
    /// The fixed latency of every collective.
    pub collective_latency: Duration,
    /// The bus bandwidth of collectives, in bytes per second: an all-reduce of `b` bytes on `n` ranks takes
    /// `latency + 2(n-1)/n * b / bandwidth`.
    pub bus_bandwidth: f64,
    /// The bandwidth of a fill kernel, in bytes per second.
    pub fill_bandwidth: f64,
    /// The bandwidth of host-device copies, in bytes per second.
    pub copy_bandwidth: f64,
    /// The virtual time a communicator takes to initialise once every rank has joined.
    pub comm_init: Duration,
    /// Host-side costs of API calls.
    pub host: HostCosts,
    /// What a detected hazard does.
    pub hazard_mode: HazardMode,
    /// How many operations a stream holds in flight before a launch blocks the host until the oldest finishes
    /// (CUDA's launch queue; it also bounds the simulation's memory when the host runs far ahead).
    pub launch_queue_depth: usize,
    /// Streams per priority in each device's pool (PyTorch has 32).
    pub streams_per_pool: usize,
    /// How many kernel records each device keeps (the oldest are dropped).
    pub kernel_log_capacity: usize,
    /// How many timeline records the world keeps for [`World::trace`](crate::World::trace) (stream spans, waits,
    /// blocked host threads, hazards; the oldest are dropped); 0 records nothing.
    pub trace_capacity: usize,
    /// Virtual time after which the world stops with a report (a livelock guard).
    pub time_limit: Duration,
    /// Real time with no simulated progress after which a parked thread stops with a report (a registered
    /// thread blocked outside the simulation, on a real lock or a join, stops the clock).
    pub stall_limit: Duration,
    /// How long after a rank is killed ([`Fault::KillAt`]) its neighbours on the ring of each communicator it was in
    /// see the connection to it closed: their communicators report an asynchronous remote error, as NCCL's do
    /// (ranks further round the ring see nothing until their ops time out).
    pub peer_loss: Duration,
    /// How long after a rank is killed the store publishes the death of each liveness hold its process had
    /// ([`pg_store::liveness`]): the kernel closing a killed process's sockets and the store server seeing it.
    pub liveness_latency: Duration,
    /// Whether communicators grow (NCCL's `ncclCommGrow`, 2.29): when false the world models an older NCCL, whose
    /// devices declare no [`pg_core::Capability::Grow`] and whose grows are made by a rendezvous.
    pub native_grow: bool,
    /// The capabilities the world's devices declare ([`pg_core::Device::capabilities`]; all by default, less
    /// grow without `native_grow`): a method of one declared absent refuses with [`pg_core::Error::Unsupported`],
    /// as a backend without it does.
    pub capabilities: pg_core::Capabilities,
    /// Injected faults.
    pub faults: Vec<Fault>,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            devices: 4,
            collective_latency: Duration::from_micros(10),
            bus_bandwidth: 300e9,
            fill_bandwidth: 1e12,
            copy_bandwidth: 25e9,
            comm_init: Duration::from_millis(50),
            host: HostCosts::default(),
            hazard_mode: HazardMode::Panic,
            launch_queue_depth: 1024,
            streams_per_pool: 32,
            kernel_log_capacity: 4096,
            trace_capacity: 16_384,
            time_limit: Duration::from_secs(24 * 3600),
            stall_limit: Duration::from_secs(30),
            peer_loss: Duration::from_millis(1),
            liveness_latency: Duration::from_micros(200),
            native_grow: true,
            capabilities: pg_core::Capabilities::all(),
            faults: Vec::new(),
        }
    }
}

impl WorldConfig {
    /// The default configuration with `devices` devices.
    pub fn with_devices(devices: usize) -> Self {
        Self { devices, ..Self::default() }
    }
}

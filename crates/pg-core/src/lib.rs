//! Process groups for Rust: PyTorch's `ProcessGroupNCCL` semantics, written once over a [`Backend`].
//!
//! The crate has two halves.
//! The [`Backend`] trait and its concept traits ([`Device`], [`Stream`], [`Event`], [`Buffer`],
//! [`Communicator`]) are what a backend supplies: streams, events, memory and a communicator, nothing more.
//! A backend declares its optional features up front ([`Device::capabilities`], [`Capabilities`]); a call that
//! needs one it lacks is refused by name before anything runs. The argument rules of every op are [`args`], which
//! the process group and the backends check alike.
//! The process group, its communicator cache, Work, Future, the watchdog and the flight recorder are written once here,
//! generic over the backend, and run unchanged on the simulated backend (`pg-mock`) and on NCCL (`pg-nccl`).
#![forbid(unsafe_code)]

pub mod args;
mod backend;
mod cache;
mod capabilities;
mod chunk_check;
mod completion;
mod desync;
mod enqueue_timing;
mod error;
mod failure;
mod flight_recorder;
pub mod fp8;
mod future;
pub mod half;
mod heartbeat;
mod in_flight;
pub mod json;
mod kernel_log;
mod lifecycle;
mod list_ops;
mod liveness;
mod locks;
pub mod noop;
mod op_trace;
mod op_type;
mod options;
mod poison;
mod process_group;
mod recovery;
mod reuse;
mod rounds;
mod shared;
mod signals;
mod status;
mod stream_guard;
mod subgroup_call;
mod subgroups;
mod tally;
mod torch_compat;
pub mod trace_event;
mod types;
mod watchdog;
mod work;

pub use backend::{Backend, Buffer, CaptureMode, Communicator, Device, Event, Graph, Stream};
pub use cache::CommKey;
pub use capabilities::{Capabilities, Capability};
pub use desync::{DesyncReport, RankPosition, RankTrace};
#[cfg(feature = "testing")]
pub use enqueue_timing::{enqueue_step_totals, EnqueueStep};
pub use error::{Error, ErrorKind, Result};
pub use future::{Future, Then};
pub use kernel_log::{KernelKind, KernelLaunch};
pub use lifecycle::GroupState;
pub use list_ops::{Coalescer, P2PKind, P2POp};
#[cfg(feature = "testing")]
pub use locks::locks_taken_on_this_thread;
#[cfg(feature = "testing")]
pub use op_trace::{trace_file_state, TraceFileState};
pub use op_type::OpType;
pub use options::{ErrorHandling, Options, OptionsBuilder, DEFAULT_TIMEOUT};
pub use poison::Poison;
pub use process_group::ProcessGroup;
#[cfg(feature = "testing")]
pub use process_group::WatchdogHold;
pub use recovery::{AgreeOptions, GrowOptions, ShrinkOptions, Survivors};
pub use status::{ErrorType, GroupStatus};
pub use stream_guard::StreamGuard;
pub use subgroups::DeviceMesh;
pub use tally::Counters;
pub use torch_compat::{
    join_torch_default_group, torch_default_group_store, TorchStoreOrigin, TORCH_DEFAULT_RANKS_PER_ROOT,
};
pub use types::{CommConfig, DType, ReduceOp, ShrinkMode, UniqueId};
pub use work::{Work, WorkFuture, WorkHandle};

pub use pg_store as store;

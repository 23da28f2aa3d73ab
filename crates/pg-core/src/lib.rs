//! Process groups for Rust: PyTorch's `ProcessGroupNCCL` semantics, written once over a [`Backend`].
//!
//! The crate has two halves.
//! The [`Backend`] trait and its concept traits ([`Device`], [`Stream`], [`Event`], [`Buffer`],
//! [`Communicator`]) are what a backend supplies: streams, events, memory and a communicator, nothing more.
//! The process group, its communicator cache, Work, Future, the watchdog and the flight recorder are written once here,
//! generic over the backend, and run unchanged on the simulated backend (`pg-mock`) and on NCCL (`pg-nccl`).
#![forbid(unsafe_code)]

mod backend;
mod cache;
mod desync;
mod enqueue_timing;
mod error;
mod flight_recorder;
mod future;
mod heartbeat;
mod options;
mod process_group;
mod stream_guard;
mod types;
mod watchdog;
mod work;

pub use backend::{Backend, Buffer, Communicator, Device, Event, Stream};
pub use cache::CommKey;
pub use desync::{DesyncReport, RankPosition, RankTrace};
pub use enqueue_timing::{enqueue_step_totals, EnqueueStep};
pub use error::{Error, ErrorKind, Result};
pub use future::Future;
pub use options::{ErrorHandling, Options, OptionsBuilder, DEFAULT_TIMEOUT};
pub use process_group::{Counters, ProcessGroup};
pub use stream_guard::StreamGuard;
pub use types::{CommConfig, DType, OpType, ReduceOp, UniqueId};
pub use watchdog::{ErrorType, GroupStatus};
pub use work::{Work, WorkHandle};

pub use pg_store as store;

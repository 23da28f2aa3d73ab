//! The simulated backend of pg: streams, events, kernels and collectives on a virtual clock, with real data,
//! fault injection and hazard detection.
//!
//! A [`World`] is a simulated machine. Rank code runs on registered host threads ([`World::run`]); they share
//! one lock over all simulated state. Kernels and collectives take modelled durations and nothing sleeps for
//! real: the clock moves only when every registered thread is blocked, to the earliest time one can proceed,
//! so the same program gives the same numbers on every run.
//! Buffers hold real bytes and collectives compute real results; a vector-clock race detector reports
//! unordered accesses and memory reused while a stream may still use it.
#![forbid(unsafe_code)]

mod allocator;
mod backend;
mod buffer;
mod clock;
mod communicator;
mod conv;
mod device;
mod event;
mod fault;
mod hazard;
mod store;
mod stream;
mod world;

pub use backend::Mock;
pub use buffer::MockBuffer;
pub use communicator::MockCommunicator;
pub use conv::{decode, encode};
pub use device::MockDevice;
pub use event::MockEvent;
pub use fault::Fault;
pub use hazard::{Hazard, HazardKind, HazardMode};
pub use store::SimStore;
pub use stream::{KernelKind, KernelRecord, MockStream};
pub use world::{HostCosts, World, WorldConfig};

/// The README's example, compiled and run as a doctest against this backend.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExample;

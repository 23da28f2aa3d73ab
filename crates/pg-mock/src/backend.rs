//! `Mock`: the simulated backend's `Backend` impl, tying its types together.

use crate::buffer::MockBuffer;
use crate::communicator::MockCommunicator;
use crate::device::MockDevice;
use crate::event::MockEvent;
use crate::stream::MockStream;

/// The simulated backend: devices, streams, events, buffers and communicators of a [`crate::World`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Mock;

impl pg_core::Backend for Mock {
    const NAME: &'static str = "mock";
    type Device = MockDevice;
    type Stream = MockStream;
    type Event = MockEvent;
    type Buffer = MockBuffer;
    type Communicator = MockCommunicator;
}

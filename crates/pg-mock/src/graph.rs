//! Simulated stream capture: the graph a capture records.

use std::convert::Infallible;

use pg_core::Result;

use crate::stream::MockStream;
use crate::Mock;

/// The work a capture on a simulated stream recorded.
#[derive(Debug)]
pub struct MockGraph {
    never: Infallible,
}

impl pg_core::Graph for MockGraph {
    type B = Mock;

    fn launch(&self, _stream: &MockStream) -> Result<()> {
        match self.never {}
    }

    fn node_count(&self) -> usize {
        match self.never {}
    }
}

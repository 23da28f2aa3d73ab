//! The one error type of every store.

use std::time::Duration;

/// What went wrong in a store operation.
///
/// The variants keep PyTorch's distinctions: a timeout is not a network failure, and neither is a
/// misuse of the API.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A `get`, `wait` or `barrier` did not see its keys before the store's timeout.
    ///
    /// The message has the shape of PyTorch's: `wait timeout after 300000ms, keys: /a, /b`.
    #[error("wait timeout after {}ms, keys: {}", .timeout.as_millis(), .keys.join(", "))]
    Timeout {
        /// The keys that were awaited, as the store saw them.
        keys: Vec<String>,
        /// How long the caller waited.
        timeout: Duration,
    },
    /// A `barrier` did not complete before its timeout (PyTorch's message shape).
    #[error("barrier timeout after {}ms, key: {key}", .timeout.as_millis())]
    BarrierTimeout {
        /// The barrier's key, as the store saw it.
        key: String,
        /// How long the caller waited.
        timeout: Duration,
    },
    /// The TCP store's server did not see every worker join before the timeout.
    #[error("Timed out after {} seconds waiting for clients. {joined}/{expected} clients joined.", .waited.as_secs())]
    WorkersTimeout {
        /// How many workers had joined.
        joined: i64,
        /// How many were expected.
        expected: usize,
        /// How long the server waited.
        waited: Duration,
    },
    /// env:// rendezvous found a variable missing (PyTorch's message).
    #[error(
        "Error initializing torch.distributed using env:// rendezvous: environment variable {0} expected, but not set"
    )]
    MissingEnv(&'static str),
    /// A rendezvous setting is present but unusable.
    #[error("invalid rendezvous setting {name}={value:?}: {reason}")]
    InvalidEnv {
        /// The variable or URL parameter.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store server could not be reached, or the connection to it broke.
    #[error("store network error: {0}")]
    Network(String),
    /// `queue_pop` without blocking found the queue empty.
    #[error("queue is empty: {key}")]
    QueueEmpty {
        /// The queue's key.
        key: String,
    },
    /// The caller passed something the store cannot take (an oversized key, a non-numeric value to `add`).
    #[error("invalid store argument: {0}")]
    InvalidArgument(String),
    /// This store does not implement the operation.
    #[error("{0} is not supported by this store")]
    Unsupported(&'static str),
    /// The store itself failed (a file store's file, a server's protocol violation).
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Whether this is one of the timeouts of a blocking operation (a wait, a get, a barrier or worker counting).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::BarrierTimeout { .. } | Self::WorkersTimeout { .. })
    }
}

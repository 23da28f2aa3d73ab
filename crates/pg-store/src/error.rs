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

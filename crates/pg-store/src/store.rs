//! The `Store` trait: PyTorch's c10d store operations.

use std::sync::Arc;
use std::time::Duration;

use crate::StoreError;

/// PyTorch's `Store::kDefaultTimeout`: 300 s.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(300);

/// A key-value store shared by the ranks of a job, with PyTorch's c10d operations.
///
/// Keys are strings and values are bytes.
/// Every blocking operation (`get`, `wait`, `multi_get`, a blocking `queue_pop`, `barrier`) is bounded by the
/// store's timeout and returns [`StoreError::Timeout`] when it runs out; the store stays usable after that.
/// Implementations are shared between threads (`Send + Sync`) and are used through `Arc<dyn Store>`.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Sets `key` to `value`, overwriting it, and wakes everyone waiting for it.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// Returns the value of `key`, waiting for it to be set, up to the store's timeout.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;

    /// Adds `delta` to the integer stored as decimal text at `key` (0 when missing) and returns the sum.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;

    /// Sets `key` to `desired` if its value is `expected` (or if it is missing and `expected` is empty), and
    /// returns the value it holds afterwards; a missing key with a non-empty `expected` returns `expected`.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError>;

    /// Whether every key in `keys` is set, without waiting.
    fn check(&self, keys: &[&str]) -> Result<bool, StoreError>;

    /// Waits until every key in `keys` is set, up to `timeout` (the store's timeout when `None`). A zero `timeout`
    /// means "now": the keys are checked once and a missing one is [`StoreError::Timeout`] at once, on every store
    /// (whereas a store's own timeout of zero, for a TCP or file store, means no timeout).
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError>;

    /// Deletes `key`; returns whether it existed.
    fn delete_key(&self, key: &str) -> Result<bool, StoreError>;

    /// The number of keys in the store (a TCP store counts its `init/` worker counter too, as PyTorch's does).
    fn num_keys(&self) -> Result<i64, StoreError>;

    /// Appends `value` to the bytes at `key`, creating it when missing.
    fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut current = if self.check(&[key])? { self.get(key)? } else { Vec::new() };
        current.extend_from_slice(value);
        self.set(key, &current)
    }

    /// Returns the values of `keys`, waiting for all of them.
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        keys.iter().map(|key| self.get(key)).collect()
    }

    /// Sets every key to its value.
    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<(), StoreError> {
        if keys.len() != values.len() {
            return Err(StoreError::InvalidArgument(format!(
                "multi_set got {} keys and {} values",
                keys.len(),
                values.len()
            )));
        }
        keys.iter().zip(values).try_for_each(|(key, value)| self.set(key, value))
    }

    /// Pushes `value` to the back of the queue at `key`, waking one waiting `queue_pop`.
    fn queue_push(&self, _key: &str, _value: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Unsupported("queue_push"))
    }

    /// Pops the front of the queue at `key`; with `block`, waits for an element up to the store's timeout,
    /// otherwise an empty queue is [`StoreError::QueueEmpty`].
    fn queue_pop(&self, _key: &str, _block: bool) -> Result<Vec<u8>, StoreError> {
        Err(StoreError::Unsupported("queue_pop"))
    }

    /// The length of the queue at `key` (0 when there is none).
    fn queue_len(&self, _key: &str) -> Result<i64, StoreError> {
        Err(StoreError::Unsupported("queue_len"))
    }

    /// Every user key in the store.
    fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        Err(StoreError::Unsupported("list_keys"))
    }

    /// Increments the counter at `key` and waits until it reaches `world_size`, up to `timeout` (the store's
    /// timeout when `None`; zero: only an arrival that completes the barrier passes, the others time out at once).
    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<(), StoreError> {
        counted_barrier(self, key, world_size, timeout)
    }

    /// A new handle on the same store (for a TCP store, a new connection), with its own timeout.
    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError>;

    /// The timeout of blocking operations.
    fn timeout(&self) -> Duration;

    /// Changes the timeout of blocking operations on this handle.
    fn set_timeout(&self, timeout: Duration);

    /// What this handle puts before every key, as the store underneath sees the key (empty unless it is a
    /// [`crate::PrefixStore`]): for naming a namespace in messages.
    fn key_prefix(&self) -> String {
        String::new()
    }
}

/// A barrier out of plain operations, for any store: each caller adds one to `key`; the one that brings the count to
/// `world_size` sets `{key}/done`, which every caller waits for (at most `timeout`).
pub(crate) fn counted_barrier<S: Store + ?Sized>(
    store: &S,
    key: &str,
    world_size: i64,
    timeout: Option<Duration>,
) -> Result<(), StoreError> {
    let arrived = store.add(key, 1)?;
    let done_key = format!("{key}/done");
    if arrived >= world_size {
        store.set(&done_key, b"1")?;
    }
    store.wait(&[done_key.as_str()], timeout).map_err(|error| match error {
        StoreError::Timeout { keys, timeout } => {
            let key = keys.first().map_or(key, |done| done.strip_suffix("/done").unwrap_or(done)).to_owned();
            StoreError::BarrierTimeout { key, timeout }
        }
        other => other,
    })
}

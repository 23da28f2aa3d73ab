//! `RecordingStore`: a store that logs the operation and key of every call before passing it on, so that a test
//! can assert which keys a process group reads and writes, in what order, and when it stops touching a store.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pg_store::{Store, StoreError};

/// A store over another one that logs `(operation, key)` for every call: `set`, `get`, `add`, `compare_set`,
/// `check` and `wait` (one entry per key), `delete`.
#[derive(Debug)]
pub struct RecordingStore {
    inner: Arc<dyn Store>,
    log: Mutex<Vec<(&'static str, String)>>,
}

impl RecordingStore {
    /// A recording store over `inner`, with an empty log.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self { inner, log: Mutex::new(Vec::new()) }
    }

    /// The calls so far, oldest first.
    pub fn log(&self) -> Vec<(&'static str, String)> {
        self.lock().clone()
    }

    /// How many calls so far (a test takes a mark, then looks at what came after it with [`Self::log_since`]).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no call was made yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The calls after the first `mark` ones, oldest first.
    pub fn log_since(&self, mark: usize) -> Vec<(&'static str, String)> {
        self.lock().iter().skip(mark).cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, String)>> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, op: &'static str, key: &str) {
        self.lock().push((op, key.to_owned()));
    }
}

impl Store for RecordingStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.note("set", key);
        self.inner.set(key, value)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.note("get", key);
        self.inner.get(key)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.note("add", key);
        self.inner.add(key, delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.note("compare_set", key);
        self.inner.compare_set(key, expected, desired)
    }
    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        keys.iter().for_each(|key| self.note("check", key));
        self.inner.check(keys)
    }
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        keys.iter().for_each(|key| self.note("wait", key));
        self.inner.wait(keys, timeout)
    }
    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        self.note("delete", key);
        self.inner.delete_key(key)
    }
    fn num_keys(&self) -> Result<i64, StoreError> {
        self.inner.num_keys()
    }
    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        self.inner.clone_store()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }
}

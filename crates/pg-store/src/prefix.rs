//! `PrefixStore`: a namespace inside another store.

use std::sync::Arc;
use std::time::Duration;

use crate::{Store, StoreError};

/// Every key becomes `prefix + "/" + key` in the underlying store, as in PyTorch's `PrefixStore`.
///
/// Prefix stores nest; `num_keys` passes through unprefixed, as PyTorch's does.
#[derive(Debug, Clone)]
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// A view of `inner` under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        Self { prefix: prefix.into(), inner }
    }

    /// The prefix this store adds.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store one level down.
    pub fn underlying(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn join(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }

    fn join_all(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|key| self.join(key)).collect()
    }
}

fn as_strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set(&self.join(key), value)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(&self.join(key))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.inner.add(&self.join(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.inner.compare_set(&self.join(key), expected, desired)
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.inner.check(&as_strs(&self.join_all(keys)))
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        self.inner.wait(&as_strs(&self.join_all(keys)), timeout)
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.delete_key(&self.join(key))
    }

    fn num_keys(&self) -> Result<i64, StoreError> {
        self.inner.num_keys()
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.append(&self.join(key), value)
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.inner.multi_get(&as_strs(&self.join_all(keys)))
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<(), StoreError> {
        self.inner.multi_set(&as_strs(&self.join_all(keys)), values)
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.queue_push(&self.join(key), value)
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>, StoreError> {
        self.inner.queue_pop(&self.join(key), block)
    }

    fn queue_len(&self, key: &str) -> Result<i64, StoreError> {
        self.inner.queue_len(&self.join(key))
    }

    fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let own = format!("{}/", self.prefix);
        Ok(self.inner.list_keys()?.into_iter().filter_map(|key| key.strip_prefix(&own).map(str::to_owned)).collect())
    }

    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<(), StoreError> {
        self.inner.barrier(&self.join(key), world_size, timeout)
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        Ok(Arc::new(Self { prefix: self.prefix.clone(), inner: self.inner.clone_store()? }))
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }

    fn key_prefix(&self) -> String {
        format!("{}{}/", self.inner.key_prefix(), self.prefix)
    }
}

//! `HashStore`: an in-process store for ranks that are threads of one process.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::{Store, StoreError, DEFAULT_STORE_TIMEOUT};

#[derive(Debug, Default)]
struct Contents {
    values: HashMap<String, Vec<u8>>,
    queues: HashMap<String, VecDeque<Vec<u8>>>,
}

#[derive(Debug, Default)]
struct Shared {
    contents: Mutex<Contents>,
    changed: Condvar,
}

/// An in-memory store shared by clones of the handle (PyTorch's `HashStore`).
///
/// Waiting uses real time; the simulated backend has its own store that waits in virtual time.
#[derive(Debug, Clone)]
pub struct HashStore {
    shared: Arc<Shared>,
    timeout: Arc<Mutex<Duration>>,
}

impl Default for HashStore {
    fn default() -> Self {
        Self::new()
    }
}

impl HashStore {
    /// An empty store with PyTorch's default timeout of 300 s.
    pub fn new() -> Self {
        Self { shared: Arc::default(), timeout: Arc::new(Mutex::new(DEFAULT_STORE_TIMEOUT)) }
    }

    fn lock(&self) -> MutexGuard<'_, Contents> {
        self.shared.contents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits on the condition variable until `ready` holds or `timeout` passes; returns the guard and
    /// whether `ready` held.
    fn wait_until<'a>(
        &'a self,
        mut guard: MutexGuard<'a, Contents>,
        timeout: Duration,
        ready: impl Fn(&Contents) -> bool,
    ) -> (MutexGuard<'a, Contents>, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(&guard) {
                return (guard, true);
            }
            let now = Instant::now();
            if now >= deadline {
                return (guard, false);
            }
            guard = self.shared.changed.wait_timeout(guard, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn changed(&self) {
        self.shared.changed.notify_all();
    }
}

fn parse_counter(key: &str, value: &[u8]) -> Result<i64, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| StoreError::InvalidArgument(format!("add on key '{key}' whose value is not a decimal integer")))
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock().values.insert(key.to_owned(), value.to_vec());
        self.changed();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let timeout = self.timeout();
        let (guard, ready) = self.wait_until(self.lock(), timeout, |c| c.values.contains_key(key));
        match ready {
            true => Ok(guard.values[key].clone()),
            false => Err(StoreError::Timeout { keys: vec![key.to_owned()], timeout }),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut guard = self.lock();
        let current = match guard.values.get(key) {
            Some(value) => parse_counter(key, value)?,
            None => 0,
        };
        let sum = current.checked_add(delta).ok_or_else(|| {
            StoreError::InvalidArgument(format!("add of {delta} to {current} on key '{key}' overflows"))
        })?;
        guard.values.insert(key.to_owned(), sum.to_string().into_bytes());
        drop(guard);
        self.changed();
        Ok(sum)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let mut guard = self.lock();
        let result = match guard.values.get(key) {
            None if expected.is_empty() => {
                guard.values.insert(key.to_owned(), desired.to_vec());
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(current) if current == expected => {
                guard.values.insert(key.to_owned(), desired.to_vec());
                desired.to_vec()
            }
            Some(current) => current.clone(),
        };
        drop(guard);
        self.changed();
        Ok(result)
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let guard = self.lock();
        Ok(keys.iter().all(|key| guard.values.contains_key(*key)))
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let (_guard, ready) =
            self.wait_until(self.lock(), timeout, |c| keys.iter().all(|key| c.values.contains_key(*key)));
        match ready {
            true => Ok(()),
            false => Err(StoreError::Timeout { keys: keys.iter().map(|k| (*k).to_owned()).collect(), timeout }),
        }
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.lock().values.remove(key).is_some())
    }

    fn num_keys(&self) -> Result<i64, StoreError> {
        Ok(i64::try_from(self.lock().values.len()).unwrap_or(i64::MAX))
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock().values.entry(key.to_owned()).or_default().extend_from_slice(value);
        self.changed();
        Ok(())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock().queues.entry(key.to_owned()).or_default().push_back(value.to_vec());
        self.changed();
        Ok(())
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>, StoreError> {
        let timeout = self.timeout();
        let non_empty = |c: &Contents| c.queues.get(key).is_some_and(|q| !q.is_empty());
        let (mut guard, ready) = match block {
            true => self.wait_until(self.lock(), timeout, non_empty),
            false => {
                let guard = self.lock();
                let ready = non_empty(&guard);
                (guard, ready)
            }
        };
        match (ready, block) {
            (true, _) => Ok(guard.queues.get_mut(key).and_then(VecDeque::pop_front).unwrap_or_default()),
            (false, true) => Err(StoreError::Timeout { keys: vec![key.to_owned()], timeout }),
            (false, false) => Err(StoreError::QueueEmpty { key: key.to_owned() }),
        }
    }

    fn queue_len(&self, key: &str) -> Result<i64, StoreError> {
        let len = self.lock().queues.get(key).map_or(0, VecDeque::len);
        Ok(i64::try_from(len).unwrap_or(i64::MAX))
    }

    fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let mut keys: Vec<String> = self.lock().values.keys().cloned().collect();
        keys.sort();
        Ok(keys)
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        Ok(Arc::new(Self { shared: Arc::clone(&self.shared), timeout: Arc::new(Mutex::new(self.timeout())) }))
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner) = timeout;
    }
}

//! `SimStore`: the world's key-value store, whose blocking operations wait in virtual time.
//!
//! Every entry carries the local time of the thread that set it; a reader that sees it moves its own local time
//! to at least that time (it cannot observe a value before it was written), and a blocked reader wakes at the
//! later of its own time and the entry's. A timeout is virtual time, so "a rank that never arrives" times out
//! deterministically and at once in real time.
//!
//! Operations run in virtual-time order: a registered thread's operation waits until the clock has reached its
//! local time, and operations due at one instant run in the order of their threads' lineage
//! ([`crate::clock::Cond::StoreTurn`]). A thread that ran ahead of the others in virtual time therefore never
//! sees a key they set later in virtual time but earlier in real time, and a poll (`check`) that finds a key
//! absent finds it absent in every run: how many store calls a polling rank makes, and so its virtual time,
//! follows virtual time alone.
//!
//! Liveness ([`pg_store::liveness`]) is modelled as pg's TCP store server does it: a SET of `{P}pg.live/{name}`
//! makes the calling thread's process (its rank thread and the threads it started) the key's holder and sets
//! `{P}pg.watched/{name}`; a DELETE of the key ends the hold; when the process is killed ([`Fault::KillAt`]) each
//! hold's death (`{P}pg.dead/{name}` set, `{P}pg.deaths` counted) is published
//! [`WorldConfig::liveness_latency`](crate::WorldConfig::liveness_latency) later in virtual time: a store operation
//! sees it once its thread's local time has reached that instant (operations run in virtual-time order, so every
//! run sees it at the same point). A wait on a dead key is not woken by the publication: readers poll.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use pg_store::liveness::{death_keys, split_live_key, watched_key_under, DEAD_VALUE};
use pg_store::{Store, StoreError, DEFAULT_STORE_TIMEOUT};

use crate::clock::{ns, Cond, Time, Wake};
use crate::fault::Fault;
use crate::sched::Inner;
use crate::state::{Entry, State};

/// How the store is failing, if it is.
fn store_down(state: &State) -> Option<bool> {
    state.faults.iter().find_map(|f| match f {
        Fault::StoreDown { fail_fast } => Some(*fail_fast),
        _ => None,
    })
}

/// The process of registered thread `tid`: the order of the top thread it descends from.
fn process(state: &State, tid: usize) -> Option<u32> {
    state.threads.get(&tid).and_then(|thread| thread.order.first().copied())
}

/// What the store sees when thread `tid` (on `device`), whose process is killed at `at`, dies: the connections of
/// its process close, publishing each of its liveness holds' deaths a latency later; a store the process hosted
/// ([`Fault::StoreHostedBy`]) goes with it.
pub(crate) fn kill_process(state: &mut State, tid: usize, device: usize, at: Time) {
    if state.faults.iter().any(|f| matches!(f, Fault::StoreHostedBy { rank } if *rank == device)) {
        state.faults.push(Fault::StoreDown { fail_fast: true });
    }
    let Some(dying) = process(state, tid) else { return };
    let when = at + ns(state.config.liveness_latency);
    let (gone, kept) = std::mem::take(&mut state.store.holds).into_iter().partition(|(p, _)| *p == dying);
    state.store.holds = kept;
    let gone: Vec<(u32, String)> = gone;
    state.store.deaths.extend(gone.into_iter().map(|(_, key)| (when, key)));
}

/// Makes the deaths due by `now` visible: each dead key set and its prefix's death counter counted, at the death's
/// time.
fn publish_deaths(state: &mut State, now: Time) {
    if state.store.deaths.iter().all(|(when, _)| *when > now) {
        return;
    }
    let (due, later): (Vec<_>, Vec<_>) =
        std::mem::take(&mut state.store.deaths).into_iter().partition(|(when, _)| *when <= now);
    state.store.deaths = later;
    for (time, key) in due {
        let Some((prefix, name)) = split_live_key(key.as_bytes()) else { continue };
        let (dead, deaths) = death_keys(prefix, name);
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        let count = state
            .store
            .values
            .get(&text(deaths.clone()))
            .and_then(|e| std::str::from_utf8(&e.value).ok()?.parse::<i64>().ok())
            .unwrap_or(0);
        state.store.values.insert(text(dead), Entry { value: DEAD_VALUE.to_vec(), time });
        state.store.values.insert(text(deaths), Entry { value: (count + 1).to_string().into_bytes(), time });
    }
}

/// A handle on the simulated world's store (PyTorch's `HashStore`, in virtual time).
pub struct SimStore {
    inner: Arc<Inner>,
    timeout: Mutex<Duration>,
}

impl fmt::Debug for SimStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimStore").field("timeout", &self.timeout()).finish()
    }
}

impl SimStore {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner, timeout: Mutex::new(DEFAULT_STORE_TIMEOUT) }
    }

    /// Waits until registered thread `tid`'s store operation `api`, at its local time, may run
    /// ([`Cond::StoreTurn`]): until the clock has reached that time and the operations due before it (or at that
    /// instant, of threads of lower order) have run. A store operation thus sees every operation of an earlier
    /// virtual time and none of a later one, and which of two threads at one instant goes first never depends on
    /// the host threads' real order: a thread that polls the store makes the same calls in every run.
    fn turn<'a>(&'a self, state: MutexGuard<'a, State>, tid: usize, api: &str) -> MutexGuard<'a, State> {
        let at = state.local(Some(tid));
        let what = format!("{api} on the store, waiting for the store operations due before it");
        self.inner.park(state, tid, Cond::StoreTurn { tid, at }, None, None, what).0
    }

    /// Runs a store operation: charges its host cost, waits for its turn, honours a store-down fault, then runs
    /// `f` under the lock.
    fn op<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut State, Option<usize>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let tid = self.inner.current();
        let cost = self.inner.config.host.store_op;
        let mut state = self.inner.lock();
        state.charge(tid, cost);
        if let Some(tid) = tid {
            state = self.turn(state, tid, name);
        }
        if let Some(fail_fast) = store_down(&state) {
            let message = format!("the store stopped answering ({name}: injected fault)");
            if let (false, Some(tid)) = (fail_fast, tid) {
                let deadline = state.local(Some(tid)) + ns(self.timeout());
                let what = format!("waiting for the store to answer {name}");
                let (s, _) = self.inner.park(state, tid, Cond::Never, Some(deadline), None, what);
                drop(s);
            }
            return Err(StoreError::Network(message));
        }
        let now = state.local(tid);
        publish_deaths(&mut state, now);
        let result = f(&mut state, tid);
        state.version += 1;
        self.inner.release(state);
        result
    }

    /// Parks until `cond` holds or `timeout` passes (counted from the first call, across `retry` rounds); returns
    /// the locked state, so that the caller reads what the condition promised in the same critical section.
    fn wait_locked(
        &self,
        api: &str,
        cond: Cond,
        keys: &[String],
        timeout: Duration,
        mut ready: impl FnMut(&mut State, usize) -> Option<Result<Vec<u8>, StoreError>>,
    ) -> Result<Vec<u8>, StoreError> {
        let tid = self.inner.require(api);
        let mut state = self.inner.lock();
        let deadline = state.local(Some(tid)).saturating_add(ns(timeout));
        if let Some(fail_fast) = store_down(&state) {
            if !fail_fast {
                let what = format!("waiting for the store to answer {api}");
                let (s, _) = self.inner.park(state, tid, Cond::Never, Some(deadline), None, what);
                drop(s);
            }
            return Err(StoreError::Network(format!("the store stopped answering ({api}: injected fault)")));
        }
        loop {
            let what = format!("{api} on the store, keys: {}", keys.join(", "));
            let (s, why) = self.inner.park(state, tid, cond.clone(), Some(deadline), None, what);
            state = s;
            if why == Wake::Deadline {
                drop(state);
                return Err(StoreError::Timeout { keys: keys.to_vec(), timeout });
            }
            state.charge(Some(tid), self.inner.config.host.store_op);
            state = self.turn(state, tid, api);
            let now = state.local(Some(tid));
            publish_deaths(&mut state, now);
            // Another waiter may have taken what woke this one (a queue element): then wait again.
            if let Some(result) = ready(&mut state, tid) {
                self.inner.release(state);
                return result;
            }
        }
    }
}

impl Store for SimStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.op("set", |st, tid| {
            let time = st.local(tid);
            st.store.values.insert(key.to_owned(), Entry { value: value.to_vec(), time });
            // A live key held by the calling thread's process, as pg's server holds it by the connection.
            if let (Some((prefix, name)), Some(holder)) =
                (split_live_key(key.as_bytes()), tid.and_then(|t| process(st, t)))
            {
                st.store.holds.retain(|(_, held)| held != key);
                st.store.holds.push((holder, key.to_owned()));
                let watched = String::from_utf8_lossy(&watched_key_under(prefix, name)).into_owned();
                st.store.values.insert(watched, Entry { value: b"1".to_vec(), time });
            }
            Ok(())
        })
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let keys = [key.to_owned()];
        self.wait_locked("Store::get", Cond::StoreKeys(keys.to_vec()), &keys, self.timeout(), |st, tid| {
            let entry = st.store.values.get(key).cloned()?;
            st.observe(Some(tid), entry.time);
            Some(Ok(entry.value))
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.op("add", |st, tid| {
            let (current, time) = match st.store.values.get(key) {
                Some(e) => (
                    std::str::from_utf8(&e.value).ok().and_then(|t| t.trim().parse::<i64>().ok()).ok_or_else(|| {
                        StoreError::InvalidArgument(format!("add on key '{key}' whose value is not a decimal integer"))
                    })?,
                    e.time,
                ),
                None => (0, 0),
            };
            let sum = current.checked_add(delta).ok_or_else(|| {
                StoreError::InvalidArgument(format!("add of {delta} to {current} on key '{key}' overflows"))
            })?;
            st.observe(tid, time);
            let time = st.local(tid).max(time);
            st.store.values.insert(key.to_owned(), Entry { value: sum.to_string().into_bytes(), time });
            Ok(sum)
        })
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.op("compare_set", |st, tid| {
            let current = st.store.values.get(key).cloned();
            if let Some(e) = &current {
                st.observe(tid, e.time);
            }
            let time = st.local(tid);
            let swap = match &current {
                None => expected.is_empty(),
                Some(e) => e.value == expected,
            };
            if swap {
                st.store.values.insert(key.to_owned(), Entry { value: desired.to_vec(), time });
                return Ok(desired.to_vec());
            }
            Ok(current.map_or_else(|| expected.to_vec(), |e| e.value))
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.op("check", |st, tid| {
            let owned: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
            match st.store.keys_time(&owned) {
                Some(t) => {
                    st.observe(tid, t);
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let owned: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        self.wait_locked("Store::wait", Cond::StoreKeys(owned.clone()), &owned, timeout, |st, tid| {
            let time = st.store.keys_time(&owned)?;
            st.observe(Some(tid), time);
            Some(Ok(Vec::new()))
        })
        .map(drop)
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        self.op("delete_key", |st, _| {
            st.store.holds.retain(|(_, held)| held != key);
            Ok(st.store.values.remove(key).is_some())
        })
    }

    fn num_keys(&self) -> Result<i64, StoreError> {
        self.op("num_keys", |st, _| Ok(i64::try_from(st.store.values.len()).unwrap_or(i64::MAX)))
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.op("append", |st, tid| {
            let time = st.local(tid);
            let entry = st.store.values.entry(key.to_owned()).or_insert(Entry { value: Vec::new(), time });
            entry.value.extend_from_slice(value);
            entry.time = entry.time.max(time);
            Ok(())
        })
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.op("queue_push", |st, tid| {
            let time = st.local(tid);
            st.store.queues.entry(key.to_owned()).or_default().push_back(Entry { value: value.to_vec(), time });
            Ok(())
        })
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>, StoreError> {
        if block {
            let keys = [key.to_owned()];
            return self.wait_locked(
                "Store::queue_pop",
                Cond::QueueNonEmpty(key.to_owned()),
                &keys,
                self.timeout(),
                |st, tid| {
                    let entry = st.store.queues.get_mut(key).and_then(VecDeque::pop_front)?;
                    st.observe(Some(tid), entry.time);
                    Some(Ok(entry.value))
                },
            );
        }
        self.op("queue_pop", |st, tid| match st.store.queues.get_mut(key).and_then(VecDeque::pop_front) {
            Some(entry) => {
                st.observe(tid, entry.time);
                Ok(entry.value)
            }
            None => Err(StoreError::QueueEmpty { key: key.to_owned() }),
        })
    }

    fn queue_len(&self, key: &str) -> Result<i64, StoreError> {
        self.op("queue_len", |st, _| {
            Ok(i64::try_from(st.store.queues.get(key).map_or(0, VecDeque::len)).unwrap_or(i64::MAX))
        })
    }

    fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        self.op("list_keys", |st, _| {
            let mut keys: Vec<String> = st.store.values.keys().cloned().collect();
            keys.sort();
            Ok(keys)
        })
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        let store = SimStore::new(Arc::clone(&self.inner));
        store.set_timeout(self.timeout());
        Ok(Arc::new(store))
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner) = timeout;
    }
}

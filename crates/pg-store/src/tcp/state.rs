//! The store's state behind the server's one lock (values, queues, waiters, barriers) and the handling of
//! every request: what it changes, and which bytes go to which connection's outbox.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::key_hash::KeyHash;
use super::protocol::{
    parse_stoll, Framed, Limits, Request, CHECK_NOT_READY, CHECK_READY, STOP_WAITING, WAIT_CANCELED,
};
use crate::liveness::{death_keys, split_live_key, watched_key_under, DEAD_VALUE};

/// Locks `mutex`, going on through poisoning: a panicking thread leaves the store usable.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The part of a connection that every thread reaches: its outgoing bytes, appended under the state lock and
/// sent by the owning loop only.
pub(super) struct Outbox {
    /// The connection's id, unique for the server's lifetime.
    pub(super) id: u64,
    /// The event loop that owns the connection.
    pub(super) owner: usize,
    /// The connection's slot in its loop.
    pub(super) slot: usize,
    pub(super) bytes: Mutex<Vec<u8>>,
}

/// The store proper, behind the server's one mutex.
#[derive(Default)]
pub(super) struct State {
    values: HashMap<Vec<u8>, Vec<u8>, KeyHash>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>, KeyHash>,
    /// Connections waiting on each key: registration number (in arrival order) to connection id.
    waiters: HashMap<Vec<u8>, BTreeMap<u64, u64>, KeyHash>,
    /// The number the next wait registration gets.
    next_registration: u64,
    /// Connections blocked in a barrier, by barrier key.
    barrier_waiters: HashMap<Vec<u8>, Vec<u64>, KeyHash>,
    /// Every connection with a pending wait or barrier.
    blocked: HashMap<u64, Blocked>,
    /// The live keys (`{P}pg.live/{name}`, [`crate::liveness`]) each connection holds: its close publishes their
    /// deaths.
    holds: HashMap<u64, Vec<Vec<u8>>>,
}

/// A connection in a wait or a barrier: the only connections another one's request sends bytes to.
struct Blocked {
    outbox: Arc<Outbox>,
    /// How many key registrations of a `WAIT` are still pending.
    awaited: usize,
    /// This connection's registrations by key, oldest first: what its close or `CANCEL_WAIT` removes, each
    /// in logarithmic time, so that dropping many registrations costs linear time in their number.
    waiting_on: HashMap<Vec<u8>, VecDeque<u64>, KeyHash>,
    /// The barrier this connection is blocked in.
    barrier: Option<Vec<u8>>,
}

impl Blocked {
    fn new(outbox: &Arc<Outbox>) -> Self {
        Self { outbox: Arc::clone(outbox), awaited: 0, waiting_on: HashMap::default(), barrier: None }
    }
}

/// The connection whose request is being handled, with its outbox locked.
pub(super) struct Requester<'a> {
    pub(super) outbox: &'a Arc<Outbox>,
    /// The requester's outbox, locked.
    pub(super) out: &'a mut Vec<u8>,
    /// Other connections whose outboxes got bytes: their owners must send them.
    pub(super) woken: &'a mut Vec<Arc<Outbox>>,
    /// Replaced keys and values, to free once the state lock is released.
    pub(super) garbage: &'a mut Vec<Vec<u8>>,
}

impl Requester<'_> {
    fn reply(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn reply_bytes(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.out.extend_from_slice(bytes);
    }
}

impl State {
    fn has_key(&self, key: &[u8]) -> bool {
        self.values.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Handles one request of `me`'s connection, decoded from `buf`: a SET that replaces a value at most twice
    /// its size reuses the old value's memory, and a GET or a SET of a known key copies no key.
    pub(super) fn handle_framed(
        &mut self,
        me: &mut Requester<'_>,
        limits: &Limits,
        request: Framed,
        buf: &[u8],
    ) -> Result<(), String> {
        match request {
            Framed::Set { key, value } => {
                let (key, value) = (&buf[key], &buf[value]);
                self.wake_all(me, key);
                self.put_copy(me, key, value);
                self.note_live(me, key);
            }
            Framed::Get { key } => self.reply_value(me, &buf[key]),
            Framed::Owned(request) => return self.handle(me, limits, request),
        }
        Ok(())
    }

    /// Handles one request of `me`'s connection.
    pub(super) fn handle(&mut self, me: &mut Requester<'_>, limits: &Limits, request: Request) -> Result<(), String> {
        match request {
            // The event loop marks the connection validated before anything reaches the state.
            Request::Validate { .. } => {}
            Request::Ping { nonce } => me.reply(&nonce.to_le_bytes()),
            Request::Set { key, value } => {
                // Waking first saves a copy of the key: a woken client's next request is handled only after
                // this one, when the value is in place.
                self.wake_all(me, &key);
                self.note_live(me, &key);
                self.put(me, key, value);
            }
            Request::CompareSet { key, expected, desired } => {
                // A missing key matches an empty expected value, as in PyTorch's server.
                let current = self.values.get(&key);
                let reply = match current.map_or(expected.is_empty(), |current| *current == expected) {
                    true => {
                        self.values.insert(key.clone(), desired.clone());
                        self.wake_all(me, &key);
                        desired
                    }
                    // A mismatch answers with the current value, or with `expected` when there is none.
                    false => current.cloned().unwrap_or(expected),
                };
                me.reply_bytes(&reply);
            }
            Request::Get { key } => self.reply_value(me, &key),
            Request::Add { key, delta } => {
                let sum = self.add(me, &key, delta)?;
                me.reply(&sum.to_le_bytes());
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|key| self.has_key(key));
                me.reply(&[if ready { CHECK_READY } else { CHECK_NOT_READY }]);
            }
            Request::Wait { keys } => {
                let missing: Vec<Vec<u8>> = keys.into_iter().filter(|key| !self.has_key(key)).collect();
                if missing.is_empty() {
                    me.reply(&[STOP_WAITING]);
                } else {
                    let id = me.outbox.id;
                    let blocked = self.blocked.entry(id).or_insert_with(|| Blocked::new(me.outbox));
                    if blocked.awaited + missing.len() > limits.max_waits_per_connection {
                        return Err(format!(
                            "WAIT would leave {} key registrations pending on this connection; the limit is {}",
                            blocked.awaited + missing.len(),
                            limits.max_waits_per_connection
                        ));
                    }
                    blocked.awaited += missing.len();
                    for key in missing {
                        let registration = self.next_registration;
                        self.next_registration += 1;
                        self.waiters.entry(key.clone()).or_default().insert(registration, id);
                        blocked.waiting_on.entry(key).or_default().push_back(registration);
                    }
                }
            }
            Request::GetNumKeys => {
                let count = i64::try_from(self.values.len()).unwrap_or(i64::MAX);
                me.reply(&count.to_le_bytes());
            }
            Request::DeleteKey { key } => {
                self.release_live(&key);
                let deleted = i64::from(self.values.remove(&key).is_some());
                me.reply(&deleted.to_le_bytes());
            }
            Request::Append { key, value } => {
                self.values.entry(key.clone()).or_default().extend_from_slice(&value);
                self.wake_all(me, &key);
            }
            Request::MultiGet { keys } => {
                let reply_len: usize = keys.iter().map(|key| 8 + self.values.get(key).map_or(0, Vec::len)).sum();
                if reply_len > limits.max_reply_len {
                    return Err(format!(
                        "MULTI_GET reply of {reply_len} bytes exceeds the limit of {}",
                        limits.max_reply_len
                    ));
                }
                for key in keys {
                    self.reply_value(me, &key);
                }
            }
            Request::MultiSet { pairs } => {
                for (key, value) in pairs {
                    self.wake_all(me, &key);
                    self.put(me, key, value);
                }
            }
            Request::CancelWait => {
                self.unregister(me.outbox.id);
                me.reply(&[WAIT_CANCELED]);
            }
            Request::QueuePush { key, value } => {
                self.queues.entry(key.clone()).or_default().push_back(value);
                self.wake_one(me, &key);
            }
            Request::QueuePop { key } => {
                let queue = self.queues.get_mut(&key);
                let len = queue.as_ref().map_or(0, |q| q.len());
                let value = queue.and_then(VecDeque::pop_front);
                me.reply(&i64::try_from(len).unwrap_or(i64::MAX).to_le_bytes());
                if let Some(value) = value {
                    me.reply_bytes(&value);
                }
                if self.queues.get(&key).is_some_and(VecDeque::is_empty) {
                    self.queues.remove(&key);
                }
            }
            Request::QueueLen { key } => {
                let len = self.queues.get(&key).map_or(0, VecDeque::len);
                me.reply(&i64::try_from(len).unwrap_or(i64::MAX).to_le_bytes());
            }
            Request::ListKeys => {
                me.reply(&i64::try_from(self.values.len()).unwrap_or(i64::MAX).to_le_bytes());
                for key in self.values.keys() {
                    me.reply_bytes(key);
                }
            }
            Request::Barrier { key, world_size } => {
                let arrived = self.add(me, &key, 1)?;
                if arrived >= world_size {
                    me.reply(&[STOP_WAITING]);
                    for other in self.barrier_waiters.remove(&key).unwrap_or_default() {
                        if let Some(blocked) = self.blocked.get_mut(&other) {
                            blocked.barrier = None;
                        }
                        self.send(me, other, &[STOP_WAITING]);
                    }
                } else {
                    let id = me.outbox.id;
                    self.barrier_waiters.entry(key.clone()).or_default().push(id);
                    self.blocked.entry(id).or_insert_with(|| Blocked::new(me.outbox)).barrier = Some(key);
                }
            }
        }
        Ok(())
    }

    /// The length of the reply to `request` (decoded from `buf`) for the requests whose replies can be large:
    /// `GET`, `MULTI_GET` and `LIST_KEYS`; `None` for the others.
    pub(super) fn reply_len(&self, request: &Framed, buf: &[u8]) -> Option<usize> {
        let value_reply = |key: &[u8]| 8 + self.values.get(key).map_or(0, Vec::len);
        match request {
            Framed::Get { key } => Some(value_reply(&buf[key.clone()])),
            Framed::Owned(Request::Get { key }) => Some(value_reply(key)),
            Framed::Owned(Request::MultiGet { keys }) => Some(keys.iter().map(|key| value_reply(key)).sum()),
            Framed::Owned(Request::ListKeys) => Some(8 + self.values.keys().map(|key| 8 + key.len()).sum::<usize>()),
            _ => None,
        }
    }

    /// Answers with `key`'s value; PyTorch's libuv server answers a missing key with an empty value.
    fn reply_value(&self, me: &mut Requester<'_>, key: &[u8]) {
        me.reply_bytes(self.values.get(key).map_or(&[][..], Vec::as_slice));
    }

    /// Sets `key` to a copy of `value`, into the old value's memory when that holds it and is at most twice its
    /// size (or 128 bytes); a replaced value is freed after the state lock is released.
    fn put_copy(&mut self, me: &mut Requester<'_>, key: &[u8], value: &[u8]) {
        match self.values.get_mut(key) {
            Some(current) if value.len() <= current.capacity() && current.capacity() <= 2 * value.len().max(64) => {
                current.clear();
                current.extend_from_slice(value);
            }
            Some(current) => me.garbage.push(std::mem::replace(current, value.to_vec())),
            None => {
                self.values.insert(key.to_vec(), value.to_vec());
            }
        }
    }

    /// Sets `key` to `value`; what it replaces is freed after the state lock is released.
    fn put(&mut self, me: &mut Requester<'_>, key: Vec<u8>, value: Vec<u8>) {
        match self.values.get_mut(&key) {
            Some(slot) => me.garbage.extend([std::mem::replace(slot, value), key]),
            None => {
                self.values.insert(key, value);
            }
        }
    }

    fn add(&mut self, me: &mut Requester<'_>, key: &[u8], delta: i64) -> Result<i64, String> {
        let current = match self.values.get(key) {
            None => 0,
            Some(value) => parse_stoll(value)
                .ok_or_else(|| format!("ADD on key {:?} whose value is not a decimal integer", show(key)))?,
        };
        let sum = current
            .checked_add(delta)
            .ok_or_else(|| format!("ADD of {delta} to {current} on key {:?} overflows", show(key)))?;
        self.values.insert(key.to_vec(), sum.to_string().into_bytes());
        self.wake_all(me, key);
        Ok(sum)
    }

    /// Counts one arrival for every registration on `key` and answers the connections whose waits are complete.
    fn wake_all(&mut self, me: &mut Requester<'_>, key: &[u8]) {
        if self.waiters.is_empty() {
            return;
        }
        let Some(registrations) = self.waiters.remove(key) else { return };
        // A connection registered many times on the key is looked up once per registration, in constant time.
        for id in registrations.into_values() {
            let Some(blocked) = self.blocked.get_mut(&id) else { continue };
            // All of a connection's registrations on the key are counted at its first one.
            let Some(mine) = blocked.waiting_on.remove(key) else { continue };
            self.arrived(me, id, mine.len());
        }
    }

    /// Counts one arrival for the oldest registration on `key` (a queue push feeds one pop).
    fn wake_one(&mut self, me: &mut Requester<'_>, key: &[u8]) {
        let Some(registrations) = self.waiters.get_mut(key) else { return };
        let Some((registration, id)) = registrations.pop_first() else { return };
        if registrations.is_empty() {
            self.waiters.remove(key);
        }
        let Some(blocked) = self.blocked.get_mut(&id) else { return };
        if let Some(mine) = blocked.waiting_on.get_mut(key) {
            // The oldest registration on the key is this connection's oldest on it, at the front.
            if let Some(at) = mine.iter().position(|&other| other == registration) {
                mine.remove(at);
            }
            if mine.is_empty() {
                blocked.waiting_on.remove(key);
            }
        }
        self.arrived(me, id, 1);
    }

    /// Counts `count` arrivals for connection `id`'s wait and answers it once nothing is pending.
    fn arrived(&mut self, me: &mut Requester<'_>, id: u64, count: usize) {
        let Some(blocked) = self.blocked.get_mut(&id) else { return };
        blocked.awaited = blocked.awaited.saturating_sub(count);
        if blocked.awaited == 0 {
            self.send(me, id, &[STOP_WAITING]);
        }
    }

    /// Appends `bytes` to connection `id`'s outbox (the requester's own, or a blocked connection's), and
    /// forgets the connection once it is blocked in nothing.
    fn send(&mut self, me: &mut Requester<'_>, id: u64, bytes: &[u8]) {
        let Some(blocked) = self.blocked.get(&id) else { return };
        if id == me.outbox.id {
            me.reply(bytes);
        } else {
            lock(&blocked.outbox.bytes).extend_from_slice(bytes);
            me.woken.push(Arc::clone(&blocked.outbox));
        }
        if blocked.awaited == 0 && blocked.barrier.is_none() {
            self.blocked.remove(&id);
        }
    }

    /// Registers `me`'s connection as the holder of `key` when it is a live key, and says so at its watched key
    /// (which the holder checks next on the same connection). A later SET of the key moves the hold.
    fn note_live(&mut self, me: &mut Requester<'_>, key: &[u8]) {
        let Some((prefix, name)) = split_live_key(key) else { return };
        let watched = watched_key_under(prefix, name);
        self.release_live(key);
        self.holds.entry(me.outbox.id).or_default().push(key.to_vec());
        self.wake_all(me, &watched);
        self.put(me, watched, b"1".to_vec());
    }

    /// Ends the hold of `key` (a DELETE of a live key: its holder leaves on purpose, no death is published).
    fn release_live(&mut self, key: &[u8]) {
        if self.holds.is_empty() || split_live_key(key).is_none() {
            return;
        }
        self.holds.retain(|_, keys| {
            keys.retain(|held| held != key);
            !keys.is_empty()
        });
    }

    /// Publishes the death of every live key the closing connection (`me`) held: `{P}pg.dead/{name}` set and
    /// `{P}pg.deaths` counted, waking their waiters. Returns how many it published.
    pub(super) fn connection_closed(&mut self, me: &mut Requester<'_>) -> usize {
        let Some(keys) = self.holds.remove(&me.outbox.id) else { return 0 };
        for key in &keys {
            let Some((prefix, name)) = split_live_key(key) else { continue };
            let (dead, deaths) = death_keys(prefix, name);
            tracing::info!(key = %show(key), "TCP store: a liveness connection closed; published its death");
            self.wake_all(me, &dead);
            self.put(me, dead, DEAD_VALUE.to_vec());
            if let Err(error) = self.add(me, &deaths, 1) {
                tracing::warn!(%error, "TCP store: could not count a death");
            }
        }
        keys.len()
    }

    /// Drops every wait and barrier registration of a connection.
    pub(super) fn unregister(&mut self, id: u64) {
        let Some(blocked) = self.blocked.remove(&id) else { return };
        for (key, mine) in blocked.waiting_on {
            let Some(registrations) = self.waiters.get_mut(&key) else { continue };
            if registrations.len() == mine.len() {
                // Only this connection waits on the key.
                self.waiters.remove(&key);
                continue;
            }
            for registration in mine {
                registrations.remove(&registration);
            }
        }
        if let Some(key) = blocked.barrier {
            if let Some(ids) = self.barrier_waiters.get_mut(&key) {
                ids.retain(|&other| other != id);
                if ids.is_empty() {
                    self.barrier_waiters.remove(&key);
                }
            }
        }
    }
}

/// A key for a log line: text when it is UTF-8, escaped bytes otherwise.
fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

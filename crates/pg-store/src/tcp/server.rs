//! The TCP store server: one event-driven thread (mio) serving every connection.
//!
//! The server keeps PyTorch's semantics: a connection must open with `VALIDATE`, `WAIT` replies when every
//! awaited key exists, `CANCEL_WAIT` drops the connection's registrations, `QUEUE_PUSH` wakes one waiter and
//! `BARRIER` wakes everyone when the count is reached.
//! A connection that breaks the protocol or a limit is closed with a logged reason; the others go on.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};

use super::protocol::{
    decode_request, parse_stoll, Limits, Request, CHECK_NOT_READY, CHECK_READY, STOP_WAITING, WAIT_CANCELED,
};
use crate::StoreError;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
/// How many bytes one `read` call takes from a socket.
const READ_CHUNK: usize = 64 * 1024;
/// Above this many unsent reply bytes, the server stops reading a connection until the peer reads.
const WRITE_HIGH_WATER: usize = 4 << 20;

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The address to listen on; `None` listens on every interface (`::`, or `0.0.0.0` without IPv6).
    pub host: Option<String>,
    /// The port; 0 picks a free one (see [`TcpStoreServer::port`]).
    pub port: u16,
    /// What one request may carry.
    pub limits: Limits,
    /// After a batch of events that sent a reply, how long the server keeps polling without blocking before
    /// it sleeps in the kernel. The client that got the reply is about to send its next request, which is
    /// then served without the wake-up of a sleeping thread, most of a round trip's latency on a virtual
    /// machine; the cost is at most this much CPU time after each burst of traffic (fire-and-forget SETs do
    /// not start it). Zero turns it off. The default is [`DEFAULT_BUSY_POLL`] on a machine with four or
    /// more CPUs and zero on a smaller one, where the spinning thread would take a CPU from the clients.
    pub busy_poll: Duration,
}

/// The default of [`ServerOptions::busy_poll`] on a machine with a CPU to spare.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// [`DEFAULT_BUSY_POLL`] when this machine has four or more CPUs, else zero.
pub fn default_busy_poll() -> Duration {
    match std::thread::available_parallelism().map_or(1, usize::from) {
        4.. => DEFAULT_BUSY_POLL,
        _ => Duration::ZERO,
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self { host: None, port: super::DEFAULT_PORT, limits: Limits::default(), busy_poll: default_busy_poll() }
    }
}

/// Counters a test or an operator can read while the server runs.
#[derive(Debug, Default)]
struct Counters {
    open_connections: AtomicUsize,
    accepted: AtomicU64,
    protocol_errors: AtomicU64,
    peak_buffered: AtomicUsize,
}

/// A snapshot of the server's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now.
    pub open_connections: usize,
    /// Connections accepted since the start.
    pub accepted: u64,
    /// Connections closed because they broke the protocol or a limit.
    pub protocol_errors: u64,
    /// The most bytes of unparsed requests one connection ever held.
    pub peak_buffered: usize,
}

/// A running TCP store server; dropping it (or [`TcpStoreServer::shutdown`]) stops it and closes every
/// connection, so clients see a network error instead of hanging.
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds and starts serving on a background thread named `pg_tcpstore`.
    pub fn start(options: ServerOptions) -> Result<Self, StoreError> {
        let listener = bind(options.host.as_deref(), options.port)?;
        let addr = listener.local_addr().map_err(|e| StoreError::Network(format!("local_addr: {e}")))?;
        let poll = Poll::new().map_err(|e| StoreError::Network(format!("cannot create a poller: {e}")))?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKER)
                .map_err(|e| StoreError::Network(format!("cannot create a waker: {e}")))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let mut event_loop = EventLoop {
            poll,
            listener,
            limits: options.limits,
            busy_poll: options.busy_poll,
            replied: false,
            conns: Vec::new(),
            free: Vec::new(),
            values: HashMap::new(),
            queues: HashMap::new(),
            waiters: HashMap::new(),
            barrier_waiters: HashMap::new(),
            stop: Arc::clone(&stop),
            counters: Arc::clone(&counters),
            scratch: vec![0; READ_CHUNK],
        };
        let thread = std::thread::Builder::new()
            .name("pg_tcpstore".into())
            .spawn(move || event_loop.run())
            .map_err(|e| StoreError::Other(format!("cannot spawn the store server thread: {e}")))?;
        tracing::debug!(%addr, "TCP store server listening");
        Ok(Self { addr, stop, waker, counters, thread: Some(thread) })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's counters now.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            open_connections: self.counters.open_connections.load(Ordering::Relaxed),
            accepted: self.counters.accepted.load(Ordering::Relaxed),
            protocol_errors: self.counters.protocol_errors.load(Ordering::Relaxed),
            peak_buffered: self.counters.peak_buffered.load(Ordering::Relaxed),
        }
    }

    /// Stops the server, closes every connection, and waits for the thread to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    /// Blocks until the server stops (it stops only through [`TcpStoreServer::shutdown`] or a fatal
    /// poller error).
    pub fn join(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn bind(host: Option<&str>, port: u16) -> Result<TcpListener, StoreError> {
    let candidates: Vec<SocketAddr> = match host {
        None => vec![SocketAddr::from(([0u16; 8], port)), SocketAddr::from(([0u8; 4], port))],
        Some(host) => (host, port)
            .to_socket_addrs()
            .map_err(|e| StoreError::Network(format!("cannot resolve the listen address {host}:{port}: {e}")))?
            .collect(),
    };
    let mut last_error = None;
    for addr in candidates {
        match listen(addr) {
            Ok(listener) => return Ok(listener),
            Err(error) => last_error = Some(format!("{addr}: {error}")),
        }
    }
    Err(StoreError::Network(format!(
        "The server socket has failed to listen on any local network address. port: {port}, {}",
        last_error.unwrap_or_else(|| "no address to bind".into())
    )))
}

/// Opens a listening socket with SO_REUSEADDR and the largest backlog the host allows (`somaxconn`), as
/// PyTorch's libuv server does, so that a connect storm of thousands of workers is not dropped.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let socket = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_reuseaddr(&socket, true)?;
    rustix::net::bind(&socket, &addr)?;
    // A negative backlog means the kernel's maximum.
    rustix::net::listen(&socket, -1)?;
    let listener = std::net::TcpListener::from(socket);
    listener.set_nonblocking(true)?;
    Ok(TcpListener::from_std(listener))
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    /// Received bytes; `rstart..` is not parsed yet.
    rbuf: Vec<u8>,
    rstart: usize,
    /// Reply bytes; `wstart..` is not sent yet.
    wbuf: Vec<u8>,
    wstart: usize,
    validated: bool,
    /// How many key registrations of a `WAIT` are still pending.
    awaited: usize,
    /// The keys this connection is registered on, one entry per registration.
    waiting_on: Vec<Vec<u8>>,
    /// The barrier this connection is blocked in.
    barrier: Option<Vec<u8>>,
    /// Whether the connection is registered for writable events (only while replies are pending).
    write_interest: bool,
}

impl Conn {
    fn pending_write(&self) -> usize {
        self.wbuf.len() - self.wstart
    }
}

/// Why a connection ends.
enum Close {
    Eof,
    Io(io::Error),
    Protocol(String),
}

struct EventLoop {
    poll: Poll,
    listener: TcpListener,
    limits: Limits,
    busy_poll: Duration,
    /// Whether the current batch of events sent a reply: a client that got one is about to send its next
    /// request, which busy polling catches without a wake-up (after fire-and-forget SETs it only costs).
    replied: bool,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    values: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// Connections waiting on each key (one entry per registration).
    waiters: HashMap<Vec<u8>, Vec<usize>>,
    /// Connections blocked in a barrier, by barrier key.
    barrier_waiters: HashMap<Vec<u8>, Vec<usize>>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    scratch: Vec<u8>,
}

impl EventLoop {
    fn run(&mut self) {
        if let Err(error) = self.poll.registry().register(&mut self.listener, LISTENER, Interest::READABLE) {
            tracing::error!(%error, "TCP store server cannot register its listener");
            return;
        }
        let mut events = Events::with_capacity(1024);
        // Until when the loop polls without blocking: set after every batch of events.
        let mut spin_until: Option<Instant> = None;
        while !self.stop.load(Ordering::SeqCst) {
            let timeout = match spin_until {
                Some(until) if Instant::now() < until => Some(Duration::ZERO),
                Some(_) => {
                    // The window is over: an idle loop reads no clock until the next reply starts one.
                    spin_until = None;
                    None
                }
                None => None,
            };
            if let Err(error) = self.poll.poll(&mut events, timeout) {
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(%error, "TCP store server poll failed; stopping");
                break;
            }
            if events.is_empty() {
                continue;
            }
            self.replied = false;
            for event in &events {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    // A peer that closed its side must be read to the end now: no later event will say so.
                    Token(id) => self.drive(id, !event.is_read_closed() && !event.is_error()),
                }
            }
            if self.replied && !self.busy_poll.is_zero() {
                spin_until = Some(Instant::now() + self.busy_poll);
            }
        }
        self.counters.open_connections.store(0, Ordering::Relaxed);
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let id = self.free.pop().unwrap_or_else(|| {
                        self.conns.push(None);
                        self.conns.len() - 1
                    });
                    if let Err(error) = self.poll.registry().register(&mut stream, Token(id), Interest::READABLE) {
                        tracing::warn!(%peer, %error, "TCP store server cannot register a connection");
                        self.free.push(id);
                        continue;
                    }
                    self.conns[id] = Some(Conn {
                        stream,
                        peer: Some(peer),
                        rbuf: Vec::new(),
                        rstart: 0,
                        wbuf: Vec::new(),
                        wstart: 0,
                        validated: false,
                        awaited: 0,
                        waiting_on: Vec::new(),
                        barrier: None,
                        write_interest: false,
                    });
                    self.counters.open_connections.fetch_add(1, Ordering::Relaxed);
                    self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    // Data may already be waiting; edge-triggered readiness would not report it again.
                    self.drive(id, false);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    // Running out of descriptors and similar errors must not stop the server.
                    tracing::warn!(%error, "TCP store server accept failed");
                    return;
                }
            }
        }
    }

    fn conn(&mut self, id: usize) -> Option<&mut Conn> {
        self.conns.get_mut(id).and_then(Option::as_mut)
    }

    /// Serves one connection until its socket would block: handles buffered requests, sends replies and
    /// reads more.
    ///
    /// With `short_read_drains`, a read shorter than the buffer is taken to have drained the socket (bytes
    /// arriving later raise a new edge-triggered event), which saves a system call per request; it must be
    /// false when the peer's end of stream may already be pending.
    fn drive(&mut self, id: usize, short_read_drains: bool) {
        if let Err(reason) = self.drive_inner(id, short_read_drains) {
            self.close(id, reason);
        }
    }

    fn drive_inner(&mut self, id: usize, short_read_drains: bool) -> Result<(), Close> {
        let mut drained = false;
        loop {
            let backlogged = self.handle_buffered(id)?;
            let Some(conn) = self.conns.get_mut(id).and_then(Option::as_mut) else { return Ok(()) };
            self.replied |= conn.pending_write() > 0;
            flush(self.poll.registry(), id, conn)?;
            if conn.pending_write() > WRITE_HIGH_WATER {
                // The peer does not read its replies; a writable event resumes this connection.
                return Ok(());
            }
            if backlogged {
                // Requests wait in the buffer behind replies that are now sent: handle them first.
                continue;
            }
            if drained {
                return Ok(());
            }
            let unparsed = conn.rbuf.len() - conn.rstart;
            if conn.rstart > 0 && (conn.rstart == conn.rbuf.len() || conn.rstart > READ_CHUNK) {
                conn.rbuf.drain(..conn.rstart);
                conn.rstart = 0;
            }
            match conn.stream.read(&mut self.scratch) {
                Ok(0) => return Err(Close::Eof),
                Ok(n) => {
                    conn.rbuf.extend_from_slice(&self.scratch[..n]);
                    self.counters.peak_buffered.fetch_max(unparsed + n, Ordering::Relaxed);
                    drained = short_read_drains && n < READ_CHUNK;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(Close::Io(error)),
            }
        }
    }

    /// Handles every whole request in the connection's buffer; returns `true` when it stopped because too
    /// many reply bytes are pending (requests may remain), `false` when the buffer holds no whole request.
    fn handle_buffered(&mut self, id: usize) -> Result<bool, Close> {
        loop {
            let Some(conn) = self.conns.get(id).and_then(Option::as_ref) else { return Ok(false) };
            if conn.pending_write() > WRITE_HIGH_WATER {
                return Ok(true);
            }
            let decoded = decode_request(&conn.rbuf[conn.rstart..], conn.validated, &self.limits)
                .map_err(|e| Close::Protocol(e.to_string()))?;
            let Some((request, used)) = decoded else { return Ok(false) };
            let conn = self.conns[id].as_mut().expect("checked above");
            conn.rstart += used;
            self.handle(id, request)?;
        }
    }

    fn reply(&mut self, id: usize, bytes: &[u8]) {
        if let Some(conn) = self.conn(id) {
            conn.wbuf.extend_from_slice(bytes);
        }
    }

    fn reply_bytes(&mut self, id: usize, bytes: &[u8]) {
        if let Some(conn) = self.conn(id) {
            conn.wbuf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            conn.wbuf.extend_from_slice(bytes);
        }
    }

    fn has_key(&self, key: &[u8]) -> bool {
        self.values.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    fn handle(&mut self, id: usize, request: Request) -> Result<(), Close> {
        match request {
            Request::Validate { .. } => self.conn(id).expect("live").validated = true,
            Request::Ping { nonce } => self.reply(id, &nonce.to_le_bytes()),
            Request::Set { key, value } => {
                // Waking first saves a copy of the key: a woken client's next request is handled only after
                // this one, when the value is in place.
                self.wake_all(&key);
                self.values.insert(key, value);
            }
            Request::CompareSet { key, expected, desired } => {
                let reply = match self.values.get(&key) {
                    None if expected.is_empty() => {
                        self.values.insert(key.clone(), desired.clone());
                        self.wake_all(&key);
                        desired
                    }
                    None => expected,
                    Some(current) if *current == expected => {
                        self.values.insert(key.clone(), desired.clone());
                        self.wake_all(&key);
                        desired
                    }
                    Some(current) => current.clone(),
                };
                self.reply_bytes(id, &reply);
            }
            Request::Get { key } => {
                // PyTorch's libuv server answers a missing key with an empty value.
                let value = self.values.get(&key).cloned().unwrap_or_default();
                self.reply_bytes(id, &value);
            }
            Request::Add { key, delta } => {
                let sum = self.add(&key, delta)?;
                self.reply(id, &sum.to_le_bytes());
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|key| self.has_key(key));
                self.reply(id, &[if ready { CHECK_READY } else { CHECK_NOT_READY }]);
            }
            Request::Wait { keys } => {
                let missing: Vec<Vec<u8>> = keys.into_iter().filter(|key| !self.has_key(key)).collect();
                if missing.is_empty() {
                    self.reply(id, &[STOP_WAITING]);
                } else {
                    let conn = self.conns[id].as_mut().expect("live");
                    conn.awaited += missing.len();
                    for key in missing {
                        self.waiters.entry(key.clone()).or_default().push(id);
                        self.conns[id].as_mut().expect("live").waiting_on.push(key);
                    }
                }
            }
            Request::GetNumKeys => {
                let count = i64::try_from(self.values.len()).unwrap_or(i64::MAX);
                self.reply(id, &count.to_le_bytes());
            }
            Request::DeleteKey { key } => {
                let deleted = i64::from(self.values.remove(&key).is_some());
                self.reply(id, &deleted.to_le_bytes());
            }
            Request::Append { key, value } => {
                self.values.entry(key.clone()).or_default().extend_from_slice(&value);
                self.wake_all(&key);
            }
            Request::MultiGet { keys } => {
                let reply_len: usize = keys.iter().map(|key| 8 + self.values.get(key).map_or(0, Vec::len)).sum();
                if reply_len > self.limits.max_reply_len {
                    return Err(Close::Protocol(format!(
                        "MULTI_GET reply of {reply_len} bytes exceeds the limit of {}",
                        self.limits.max_reply_len
                    )));
                }
                for key in keys {
                    let value = self.values.get(&key).cloned().unwrap_or_default();
                    self.reply_bytes(id, &value);
                }
            }
            Request::MultiSet { pairs } => {
                for (key, value) in pairs {
                    self.wake_all(&key);
                    self.values.insert(key, value);
                }
            }
            Request::CancelWait => {
                self.unregister(id);
                self.reply(id, &[WAIT_CANCELED]);
            }
            Request::QueuePush { key, value } => {
                self.queues.entry(key.clone()).or_default().push_back(value);
                self.wake_one(&key);
            }
            Request::QueuePop { key } => {
                let queue = self.queues.get_mut(&key);
                let len = queue.as_ref().map_or(0, |q| q.len());
                let value = queue.and_then(VecDeque::pop_front);
                self.reply(id, &i64::try_from(len).unwrap_or(i64::MAX).to_le_bytes());
                if let Some(value) = value {
                    self.reply_bytes(id, &value);
                }
                if self.queues.get(&key).is_some_and(VecDeque::is_empty) {
                    self.queues.remove(&key);
                }
            }
            Request::QueueLen { key } => {
                let len = self.queues.get(&key).map_or(0, VecDeque::len);
                self.reply(id, &i64::try_from(len).unwrap_or(i64::MAX).to_le_bytes());
            }
            Request::ListKeys => {
                let mut reply = Vec::new();
                reply.extend_from_slice(&i64::try_from(self.values.len()).unwrap_or(i64::MAX).to_le_bytes());
                for key in self.values.keys() {
                    reply.extend_from_slice(&(key.len() as u64).to_le_bytes());
                    reply.extend_from_slice(key);
                }
                self.reply(id, &reply);
            }
            Request::Barrier { key, world_size } => {
                let arrived = self.add(&key, 1)?;
                if arrived >= world_size {
                    self.reply(id, &[STOP_WAITING]);
                    for other in self.barrier_waiters.remove(&key).unwrap_or_default() {
                        if let Some(conn) = self.conn(other) {
                            conn.barrier = None;
                        }
                        self.send_now(other, &[STOP_WAITING]);
                    }
                } else {
                    self.barrier_waiters.entry(key.clone()).or_default().push(id);
                    self.conn(id).expect("live").barrier = Some(key);
                }
            }
        }
        Ok(())
    }

    fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, Close> {
        let current = match self.values.get(key) {
            None => 0,
            Some(value) => parse_stoll(value).ok_or_else(|| {
                Close::Protocol(format!("ADD on key {:?} whose value is not a decimal integer", show(key)))
            })?,
        };
        let sum = current
            .checked_add(delta)
            .ok_or_else(|| Close::Protocol(format!("ADD of {delta} to {current} on key {:?} overflows", show(key))))?;
        self.values.insert(key.to_vec(), sum.to_string().into_bytes());
        self.wake_all(key);
        Ok(sum)
    }

    /// Counts one arrival for every connection waiting on `key` and answers those whose waits are complete.
    fn wake_all(&mut self, key: &[u8]) {
        if self.waiters.is_empty() {
            return;
        }
        if let Some(ids) = self.waiters.remove(key) {
            for id in ids {
                self.arrived(id, key);
            }
        }
    }

    /// Counts one arrival for the first connection waiting on `key` (a queue push feeds one pop).
    fn wake_one(&mut self, key: &[u8]) {
        let Some(ids) = self.waiters.get_mut(key) else { return };
        let id = ids.remove(0);
        if ids.is_empty() {
            self.waiters.remove(key);
        }
        self.arrived(id, key);
    }

    fn arrived(&mut self, id: usize, key: &[u8]) {
        let Some(conn) = self.conn(id) else { return };
        if let Some(at) = conn.waiting_on.iter().position(|k| k == key) {
            conn.waiting_on.swap_remove(at);
        }
        conn.awaited = conn.awaited.saturating_sub(1);
        if conn.awaited == 0 {
            self.send_now(id, &[STOP_WAITING]);
        }
    }

    /// Queues `bytes` for another connection and tries to send them at once.
    fn send_now(&mut self, id: usize, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(id).and_then(Option::as_mut) else { return };
        conn.wbuf.extend_from_slice(bytes);
        self.replied = true;
        if let Err(reason) = flush(self.poll.registry(), id, conn) {
            self.close(id, reason);
        }
    }

    /// Drops every wait and barrier registration of a connection.
    fn unregister(&mut self, id: usize) {
        let Some(conn) = self.conn(id) else { return };
        let keys = std::mem::take(&mut conn.waiting_on);
        conn.awaited = 0;
        let barrier = conn.barrier.take();
        for key in keys {
            if let Some(ids) = self.waiters.get_mut(&key) {
                if let Some(at) = ids.iter().position(|&other| other == id) {
                    ids.remove(at);
                }
                if ids.is_empty() {
                    self.waiters.remove(&key);
                }
            }
        }
        if let Some(key) = barrier {
            if let Some(ids) = self.barrier_waiters.get_mut(&key) {
                ids.retain(|&other| other != id);
                if ids.is_empty() {
                    self.barrier_waiters.remove(&key);
                }
            }
        }
    }

    fn close(&mut self, id: usize, reason: Close) {
        self.unregister(id);
        let Some(mut conn) = self.conns.get_mut(id).and_then(Option::take) else { return };
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.free.push(id);
        self.counters.open_connections.fetch_sub(1, Ordering::Relaxed);
        let peer = conn.peer.map_or_else(|| "?".to_owned(), |p| p.to_string());
        match reason {
            Close::Eof => tracing::trace!(%peer, "TCP store client disconnected"),
            Close::Io(error) => tracing::debug!(%peer, %error, "TCP store connection failed"),
            Close::Protocol(reason) => {
                self.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, %reason, "TCP store server closed a connection that broke the protocol");
            }
        }
    }
}

/// Sends what the connection's reply buffer holds, until the socket would block.
///
/// The connection asks for writable events only while replies are pending, as libuv does; otherwise every
/// acknowledgement of sent bytes would wake the loop.
fn flush(registry: &Registry, id: usize, conn: &mut Conn) -> Result<(), Close> {
    while conn.wstart < conn.wbuf.len() {
        match conn.stream.write(&conn.wbuf[conn.wstart..]) {
            Ok(0) => return Err(Close::Eof),
            Ok(n) => conn.wstart += n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                if !conn.write_interest {
                    registry
                        .reregister(&mut conn.stream, Token(id), Interest::READABLE | Interest::WRITABLE)
                        .map_err(Close::Io)?;
                    conn.write_interest = true;
                }
                return Ok(());
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(Close::Io(error)),
        }
    }
    conn.wbuf.clear();
    conn.wstart = 0;
    if conn.write_interest {
        registry.reregister(&mut conn.stream, Token(id), Interest::READABLE).map_err(Close::Io)?;
        conn.write_interest = false;
    }
    Ok(())
}

/// A key for a log line: text when it is UTF-8, escaped bytes otherwise.
fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

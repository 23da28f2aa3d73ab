//! The TCP store client: PyTorch's `TCPStore` as a Rust [`Store`], optionally hosting the server.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::protocol::{
    decode_framed, parse_stoll, Command, Encoder, Limits, CHECK_READY, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use super::server::{ServerOptions, TcpStoreServer};
use super::DEFAULT_PORT;
use crate::store::counted_barrier;
use crate::{Store, StoreError, DEFAULT_STORE_TIMEOUT};

/// Every user key goes over the wire with this prefix, as PyTorch's client sends it.
const KEY_PREFIX: &str = "/";
/// How long explaining a refused request may take (one connection attempt and one GET).
const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// What a read reports when the server closed the connection.
const CLOSED: &str = "the store server closed the connection";
/// The worker counter, sent without the prefix.
const INIT_KEY: &str = "init/";
/// The key of the probe that asks a server whether it has the `BARRIER` request; without the `/` prefix it is no
/// user key, and the probe deletes it at once.
const BARRIER_PROBE_KEY: &str = "pg_store/barrier_probe";
/// The least time the probe gets, so that a barrier with a zero or spent timeout can still tell the servers apart.
const BARRIER_PROBE_MIN: Duration = Duration::from_secs(1);

/// What a handle knows of its server's `BARRIER` request (the values of [`TcpStore::server_barrier`]).
const BARRIER_UNKNOWN: u8 = 0;
/// The server answered a `BARRIER`: it has the request.
const BARRIER_NATIVE: u8 = 1;
/// The server refused a `BARRIER` (PyTorch's): barriers are made of `ADD`, `SET` and `WAIT`.
const BARRIER_MISSING: u8 = 2;

/// How to open a [`TcpStore`] (PyTorch's `TCPStoreOptions`).
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
    /// The server's port; with `is_server` and port 0 the server picks a free one.
    pub port: u16,
    /// Whether this handle starts the server in-process (rank 0 does).
    pub is_server: bool,
    /// With `is_server` and a fixed port, reuse a server this process already runs on that port instead of
    /// binding again (PyTorch's `multi_tenant`); the server stops when its last handle drops.
    pub multi_tenant: bool,
    /// The number of workers that will connect, the server's process included: 1 to `i64::MAX` (the `init/`
    /// counter's range); others are [`StoreError::InvalidArgument`].
    pub num_workers: Option<usize>,
    /// Whether to count this worker in `init/` and, on the server, wait for `num_workers`.
    pub wait_workers: bool,
    /// The timeout of connecting and of every blocking operation; zero means no timeout.
    pub timeout: Duration,
    /// The limits of the in-process server, which the client also checks before sending a request (the
    /// default is PyTorch's: a request its server would refuse is an error here, naming the limit).
    pub limits: Limits,
    /// The in-process server's event-loop threads (pg's own; 0 picks the server's default).
    pub server_threads: usize,
    /// The first pause between connection attempts; it grows 1.5 times per attempt, with jitter, up to 60 s.
    pub initial_backoff: Duration,
}

impl Default for TcpStoreOptions {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            is_server: false,
            multi_tenant: false,
            num_workers: None,
            wait_workers: true,
            timeout: DEFAULT_STORE_TIMEOUT,
            limits: Limits::default(),
            server_threads: 0,
            initial_backoff: Duration::from_millis(500),
        }
    }
}

/// One connection to the server.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    /// Received bytes not consumed yet: `rbuf[rstart..rend]`.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// The socket's current read timeout, to avoid resetting it on every read.
    read_timeout: Option<Duration>,
    encoder: Encoder,
    /// Set when an earlier failure left the byte stream in an unknown state.
    broken: Option<String>,
    /// What the server accepts: a request beyond it is refused here, before it is sent.
    limits: Limits,
}

/// How a `WAIT` or `BARRIER` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    /// The server released it.
    Released,
    /// Its time ran out, and the cancel found it released: the server sent `STOP_WAITING` before `WAIT_CANCELED`.
    ReleasedAtCancel,
    /// Its time ran out and the server cancelled it.
    Canceled,
}

/// Why reading a reply stopped.
enum ReadFailure {
    TimedOut,
    Failed(String),
}

impl Conn {
    fn new(stream: TcpStream, limits: Limits) -> Self {
        Self {
            stream,
            rbuf: vec![0; 16 * 1024],
            rstart: 0,
            rend: 0,
            read_timeout: None,
            encoder: Encoder::new(),
            broken: None,
            limits,
        }
    }

    /// Sends the encoded request, after checking it against the server's limits (a request the server would
    /// refuse is an [`StoreError::InvalidArgument`] naming the limit, and the connection stays usable).
    fn send(&mut self) -> Result<(), StoreError> {
        let mut at = 0;
        while at < self.encoder.as_bytes().len() {
            match decode_framed(&self.encoder.as_bytes()[at..], true, &self.limits) {
                Ok(Some((_, used))) => at += used,
                Ok(None) => break,
                Err(error) => {
                    self.encoder.clear();
                    return Err(StoreError::InvalidArgument(format!(
                        "the store server would refuse this request: {error} (keys count the '/' the client adds)"
                    )));
                }
            }
        }
        let result = self.stream.write_all(self.encoder.as_bytes());
        self.encoder.clear();
        result.map_err(|e| self.fail(format!("cannot send to the store server: {e}")))
    }

    /// [`Conn::fail`] with a read's failure, naming the request whose reply it awaited.
    fn fail_awaiting(&mut self, message: &str, what: Command) -> StoreError {
        self.fail(format!("{message} (awaiting the reply to {what})"))
    }

    fn fail(&mut self, message: String) -> StoreError {
        self.broken = Some(message.clone());
        StoreError::Network(message)
    }

    /// Fills `out` from the connection, waiting at most until `deadline` (forever when `None`).
    fn read_until(&mut self, out: &mut [u8], deadline: Option<Instant>) -> Result<(), ReadFailure> {
        let mut filled = 0;
        while filled < out.len() {
            if self.rstart < self.rend {
                let n = (self.rend - self.rstart).min(out.len() - filled);
                out[filled..filled + n].copy_from_slice(&self.rbuf[self.rstart..self.rstart + n]);
                self.rstart += n;
                filled += n;
                continue;
            }
            let timeout = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(ReadFailure::TimedOut),
                },
            };
            // The socket timeout only needs to change when it is shorter than the one set, or unset.
            // A socket timeout within 20 ms of the wanted one is kept: it saves a system call per read.
            let needs_change = match (timeout, self.read_timeout) {
                (None, None) => false,
                (Some(want), Some(have)) => want.abs_diff(have) > Duration::from_millis(20),
                _ => true,
            };
            if needs_change {
                self.stream.set_read_timeout(timeout).map_err(|e| ReadFailure::Failed(e.to_string()))?;
                self.read_timeout = timeout;
            }
            match self.stream.read(&mut self.rbuf) {
                Ok(0) => return Err(ReadFailure::Failed(CLOSED.into())),
                // A close with unread bytes on either side arrives as a reset: the server closed the connection.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(ReadFailure::Failed(format!("{CLOSED} (reset)")))
                }
                Ok(n) => {
                    self.rstart = 0;
                    self.rend = n;
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(ReadFailure::TimedOut);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadFailure::Failed(format!("cannot read from the store server: {e}"))),
            }
        }
        Ok(())
    }

    /// Reads a reply that must come within `timeout`; a late or missing reply breaks the connection.
    fn read_reply(&mut self, out: &mut [u8], timeout: Duration, what: Command) -> Result<(), StoreError> {
        match self.read_until(out, deadline_after(timeout)) {
            Ok(()) => Ok(()),
            Err(ReadFailure::TimedOut) => {
                Err(self.fail(format!("no reply to {what} from the store server within {}ms", timeout.as_millis())))
            }
            Err(ReadFailure::Failed(message)) => Err(self.fail_awaiting(&message, what)),
        }
    }

    fn read_u8(&mut self, timeout: Duration, what: Command) -> Result<u8, StoreError> {
        let mut byte = [0];
        self.read_reply(&mut byte, timeout, what)?;
        Ok(byte[0])
    }

    fn read_i64(&mut self, timeout: Duration, what: Command) -> Result<i64, StoreError> {
        let mut bytes = [0; 8];
        self.read_reply(&mut bytes, timeout, what)?;
        Ok(i64::from_le_bytes(bytes))
    }

    fn read_bytes(&mut self, timeout: Duration, what: Command) -> Result<Vec<u8>, StoreError> {
        let len = self.read_i64(timeout, what)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= 1 << 40)
            .ok_or_else(|| self.fail(format!("the store server sent an impossible length {len} in reply to {what}")))?;
        // The buffer grows with the bytes that actually arrive, so a bogus length cannot make us allocate it.
        let mut value = Vec::with_capacity(len.min(1 << 20));
        while value.len() < len {
            let start = value.len();
            value.resize(start + (len - start).min(1 << 20), 0);
            self.read_reply(&mut value[start..], timeout, what)?;
        }
        Ok(value)
    }

    /// Waits for the reply byte of a `WAIT` or `BARRIER` until `deadline` (`timeout` from the request; `None`: no
    /// limit), then cancels as PyTorch's client does. The connection stays usable whatever the outcome.
    fn await_stop_waiting(
        &mut self,
        timeout: Duration,
        deadline: Option<Instant>,
        what: Command,
    ) -> Result<Awaited, StoreError> {
        let mut byte = [0];
        match self.read_until(&mut byte, deadline) {
            Ok(()) => return self.expect_stop_waiting(byte[0], what).map(|()| Awaited::Released),
            Err(ReadFailure::Failed(message)) => return Err(self.fail_awaiting(&message, what)),
            Err(ReadFailure::TimedOut) => {}
        }
        self.encoder.command(Command::CancelWait);
        self.send()?;
        // The server answers a cancel at once; a bounded read keeps a dead server from hanging us.
        let cancel_timeout = timeout.max(Duration::from_secs(10));
        let mut reply = self.read_u8(cancel_timeout, Command::CancelWait)?;
        let mut awaited = Awaited::Canceled;
        if reply == STOP_WAITING {
            // The keys arrived while the cancel was on its way: the server sent STOP_WAITING first.
            awaited = Awaited::ReleasedAtCancel;
            reply = self.read_u8(cancel_timeout, Command::CancelWait)?;
        }
        if reply != WAIT_CANCELED {
            return Err(self.fail(format!("the store server answered CANCEL_WAIT with {reply}, not WAIT_CANCELED")));
        }
        Ok(awaited)
    }

    fn expect_stop_waiting(&mut self, byte: u8, what: Command) -> Result<(), StoreError> {
        match byte {
            STOP_WAITING => Ok(()),
            other => Err(self.fail(format!("the store server answered {what} with {other}, not STOP_WAITING"))),
        }
    }
}

fn deadline_after(timeout: Duration) -> Option<Instant> {
    match timeout.is_zero() {
        true => None,
        false => Instant::now().checked_add(timeout),
    }
}

/// A client of a TCP store server, wire-compatible with PyTorch's `TCPStore`; rank 0 may host the server.
///
/// Operations on one handle are serialised (one connection, strictly ordered replies); use
/// [`Store::clone_store`] for a second connection.
#[derive(Debug)]
pub struct TcpStore {
    host: String,
    port: u16,
    conn: Mutex<Conn>,
    timeout: Mutex<Duration>,
    server: Option<Arc<TcpStoreServer>>,
    /// What this handle knows of the server's `BARRIER` request: [`BARRIER_UNKNOWN`], [`BARRIER_NATIVE`] or
    /// [`BARRIER_MISSING`].
    server_barrier: AtomicU8,
}

impl TcpStore {
    /// Connects to `host` (and first starts a server with `options.is_server`), validates, pings and, with
    /// `options.wait_workers` and `options.num_workers`, joins the worker count.
    pub fn new(host: &str, options: TcpStoreOptions) -> Result<Self, StoreError> {
        check_workers(&options)?;
        let start = || TcpStoreServer::start(server_options(&options));
        let server = match (options.is_server, options.multi_tenant && options.port != 0) {
            (false, _) => None,
            (true, false) => Some(Arc::new(start()?)),
            (true, true) => {
                let mut servers = tenant_servers().lock().unwrap_or_else(PoisonError::into_inner);
                match servers.get(&options.port).and_then(Weak::upgrade) {
                    Some(server) => Some(server),
                    None => {
                        let server = Arc::new(start()?);
                        servers.insert(options.port, Arc::downgrade(&server));
                        Some(server)
                    }
                }
            }
        };
        Self::join(host, server, &options)
    }

    /// Hosts the server on `listener`, a socket already bound and listening (PyTorch's
    /// `TCPStore(..., is_master=True, master_listen_fd=fd)`), then connects to `host` and joins as
    /// [`TcpStore::new`] does. `options.port` and `options.is_server` are not used: the port is the
    /// listener's, and this handle hosts the server. With `options.multi_tenant`, later handles on that port
    /// share the server. A socket that is not a listening TCP socket is refused with
    /// [`StoreError::InvalidArgument`].
    pub fn with_listener(
        host: &str,
        listener: std::net::TcpListener,
        options: TcpStoreOptions,
    ) -> Result<Self, StoreError> {
        check_workers(&options)?;
        let server = Arc::new(TcpStoreServer::start_on(listener, server_options(&options))?);
        if options.multi_tenant {
            tenant_servers()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(server.port(), Arc::downgrade(&server));
        }
        Self::join(host, Some(server), &TcpStoreOptions { is_server: true, ..options })
    }

    /// Connects to `host` on the hosted server's port (else `options.port`) and, with `options.wait_workers`
    /// and `options.num_workers`, joins the worker count.
    fn join(host: &str, server: Option<Arc<TcpStoreServer>>, options: &TcpStoreOptions) -> Result<Self, StoreError> {
        let port = server.as_ref().map_or(options.port, |s| s.port());
        let store = Self::connect_with(host, port, options, server)?;
        if options.wait_workers {
            if let Some(workers) = options.num_workers {
                store.wait_for_workers(workers, options.is_server)?;
            }
        }
        Ok(store)
    }

    /// A client of the server at `host:port` that counts itself as one of the `world_size` workers (key `init/`),
    /// as each rank's client does in PyTorch's `init_process_group`: the server's process, which waits until
    /// `world_size` workers have joined, counts this process as a rank. Use it to join a store a PyTorch rank hosts
    /// (`MASTER_ADDR:MASTER_PORT`); [`TcpStore::connect`] does not count, and PyTorch's rank 0 then times out
    /// waiting for its clients.
    pub fn connect_as_worker(host: &str, port: u16, world_size: usize, timeout: Duration) -> Result<Self, StoreError> {
        let options = TcpStoreOptions { port, timeout, num_workers: Some(world_size), ..TcpStoreOptions::default() };
        Self::new(host, options)
    }

    /// Hosts the server on `port` (all interfaces) as PyTorch's rank 0 does (`TCPStore(host, port, world_size,
    /// is_master=True)`, what `init_process_group`'s env:// makes on rank 0): counts itself as one of the
    /// `world_size` workers and returns once the others have joined (PyTorch's clients, or
    /// [`TcpStore::connect_as_worker`]), or fails at `timeout`. Use it when the Rust process is rank 0 of a job
    /// whose other ranks are PyTorch's.
    pub fn serve_as_master(port: u16, world_size: usize, timeout: Duration) -> Result<Self, StoreError> {
        let options = TcpStoreOptions {
            port,
            is_server: true,
            num_workers: Some(world_size),
            timeout,
            ..TcpStoreOptions::default()
        };
        Self::new("127.0.0.1", options)
    }

    /// A plain client of the server at `host:port`, with `timeout` and no worker counting.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with(host, port, &TcpStoreOptions { timeout, ..TcpStoreOptions::default() }, None)
    }

    /// Hosts a server and returns a client of it (PyTorch's `TCPStore(host, port, is_master=True)` without
    /// worker counting).
    pub fn serve(port: u16, timeout: Duration) -> Result<Self, StoreError> {
        Self::serve_on_threads(port, timeout, 0)
    }

    /// As [`TcpStore::serve`], with `threads` server event-loop threads (0 picks the server's default).
    pub fn serve_on_threads(port: u16, timeout: Duration, threads: usize) -> Result<Self, StoreError> {
        let options = TcpStoreOptions {
            port,
            is_server: true,
            wait_workers: false,
            timeout,
            server_threads: threads,
            ..TcpStoreOptions::default()
        };
        Self::new("127.0.0.1", options)
    }

    fn connect_with(
        host: &str,
        port: u16,
        options: &TcpStoreOptions,
        server: Option<Arc<TcpStoreServer>>,
    ) -> Result<Self, StoreError> {
        let conn = connect(host, port, options.timeout, options.initial_backoff, options.limits)?;
        let timeout = Mutex::new(options.timeout);
        // The server this handle hosts is this crate's, which has `BARRIER`.
        let server_barrier = AtomicU8::new(if server.is_some() { BARRIER_NATIVE } else { BARRIER_UNKNOWN });
        Ok(Self { host: host.to_owned(), port, conn: Mutex::new(conn), timeout, server, server_barrier })
    }

    /// The server's host as given.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server this handle hosts, if it hosts one.
    pub fn server(&self) -> Option<&Arc<TcpStoreServer>> {
        self.server.as_ref()
    }

    /// A new connection to this handle's server (validated and pinged), with its timeout and `limits`.
    fn new_conn(&self, limits: Limits) -> Result<Conn, StoreError> {
        connect(&self.host, self.port, self.timeout(), TcpStoreOptions::default().initial_backoff, limits)
    }

    fn lock(&self) -> Result<MutexGuard<'_, Conn>, StoreError> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        match &conn.broken {
            Some(message) => {
                Err(StoreError::Network(format!("the connection to the store server is broken: {message}")))
            }
            None => Ok(conn),
        }
    }

    /// Sends `PING` with `nonce` and checks the echo.
    pub fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.lock()?;
        ping(&mut conn, self.timeout())
    }

    /// Adds `delta` to a key sent exactly as given, without the `/` prefix (the `init/` counter is one).
    pub fn add_raw(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Add).bytes(key.as_bytes()).i64(delta);
        conn.send()?;
        match conn.read_i64(timeout, Command::Add) {
            Err(StoreError::Network(message)) if message.starts_with(CLOSED) => {
                drop(conn);
                Err(self.explain_refused_add(key, delta).unwrap_or(StoreError::Network(message)))
            }
            result => result,
        }
    }

    /// Why the server refused an `ADD` (the protocol has no error reply: it closes the connection): on a new
    /// connection, which replaces the closed one so that this handle stays usable, reads the key's value and
    /// says whether it is not a number or the sum overflows. `None` when neither explains the refusal.
    fn explain_refused_add(&self, key: &str, delta: i64) -> Option<StoreError> {
        // One attempt, briefly: a server that is gone must not turn the error into a long retry.
        let timeout = match self.timeout() {
            forever if forever.is_zero() => EXPLAIN_TIMEOUT,
            timeout => timeout.min(EXPLAIN_TIMEOUT),
        };
        let limits = self.conn.lock().unwrap_or_else(PoisonError::into_inner).limits;
        let deadline = deadline_after(timeout);
        let mut fresh = try_connect(&self.host, self.port, timeout, deadline, limits).ok()?;
        fresh.encoder.command(Command::Get).bytes(key.as_bytes());
        fresh.send().ok()?;
        let value = fresh.read_bytes(timeout, Command::Get).ok()?;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        let shown = key.strip_prefix(KEY_PREFIX).unwrap_or(key);
        let reason = match parse_stoll(&value) {
            None => format!("its value {:?} is not a decimal integer", String::from_utf8_lossy(&value)),
            Some(current) if current.checked_add(delta).is_none() => format!("{current} + {delta} overflows i64"),
            Some(_) => return None,
        };
        Some(StoreError::InvalidArgument(format!("the store server refused ADD of {delta} to key '{shown}': {reason}")))
    }

    /// Every key of the server as raw bytes, the `init/` counter included.
    pub fn list_raw_keys(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::ListKeys);
        conn.send()?;
        let count = conn.read_i64(timeout, Command::ListKeys)?;
        let count = usize::try_from(count)
            .map_err(|_| conn.fail(format!("the store server sent a negative key count {count}")))?;
        (0..count).map(|_| conn.read_bytes(timeout, Command::ListKeys)).collect()
    }

    /// PyTorch's `waitForWorkers`: every worker counts itself in `init/`; the server's worker then polls
    /// the count every 10 ms until it reaches `workers` or the timeout passes.
    fn wait_for_workers(&self, workers: usize, is_server: bool) -> Result<(), StoreError> {
        // `check_workers` refused counts beyond i64 before anything connected.
        let expected = i64::try_from(workers).unwrap_or(i64::MAX);
        self.add_raw(INIT_KEY, 1)?;
        if !is_server {
            return Ok(());
        }
        let timeout = self.timeout();
        let start = Instant::now();
        loop {
            let joined = self.add_raw(INIT_KEY, 0)?;
            if joined >= expected {
                return Ok(());
            }
            if !timeout.is_zero() && start.elapsed() > timeout {
                return Err(StoreError::WorkersTimeout { joined, expected: workers, waited: timeout });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A `BARRIER` whose connection failed before any reply, on a server not known to have the request. PyTorch's
    /// server closes the connection on it before counting anything; this crate's counts the arrival first. A probe
    /// on a new connection tells them apart, within what is left of the barrier's timeout. On a server with
    /// `BARRIER` the arrival may have been counted: a network error. On one without, the barrier is made of `ADD`,
    /// `SET` and `WAIT` on another new connection, as every later barrier of this handle is.
    fn barrier_after_failure(
        &self,
        key: &str,
        world_size: i64,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
        message: String,
    ) -> Result<(), StoreError> {
        let wire_key = prefixed(key);
        let failed =
            |detail: String| StoreError::Network(format!("{message}, in the barrier on key '{wire_key}'; {detail}"));
        let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        let budget = left.unwrap_or(EXPLAIN_TIMEOUT).max(BARRIER_PROBE_MIN);
        let limits = self.conn.lock().unwrap_or_else(PoisonError::into_inner).limits;
        match self.probe_barrier(budget, limits) {
            Err(error) => Err(failed(format!("asking the store server whether it has BARRIER failed: {error}"))),
            Ok(true) => {
                self.server_barrier.store(BARRIER_NATIVE, Ordering::Relaxed);
                Err(failed(
                    "the server has BARRIER, so it may have counted this arrival: the barrier is not made again".into(),
                ))
            }
            Ok(false) => {
                let fresh = try_connect(&self.host, self.port, budget, Instant::now().checked_add(budget), limits)
                    .map_err(|error| failed(format!("no new connection to make it of ADD, SET and WAIT: {error}")))?;
                *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
                self.server_barrier.store(BARRIER_MISSING, Ordering::Relaxed);
                tracing::debug!(target: "pg_store", host = %self.host, port = self.port, "the store server has no BARRIER request: barriers are made of ADD, SET and WAIT");
                // What is left of the barrier's own timeout bounds the rest; its error names the whole timeout.
                let rest = timeout.map(|timeout| left.unwrap_or(timeout));
                counted_barrier(self, key, world_size, rest).map_err(|error| match (error, timeout) {
                    (StoreError::BarrierTimeout { key, .. }, Some(timeout)) => {
                        StoreError::BarrierTimeout { key, timeout }
                    }
                    (error, _) => error,
                })
            }
        }
    }

    /// Whether the server has the `BARRIER` request, asked on a new connection (one attempt within `budget`): a
    /// one-way `BARRIER` on a key of its own passes at once on a server that has it, and a `DELETE_KEY` removes the
    /// key; a server without it closes the connection, as PyTorch's does on every request it does not know.
    fn probe_barrier(&self, budget: Duration, limits: Limits) -> Result<bool, String> {
        let deadline = Instant::now().checked_add(budget);
        let mut conn = try_connect(&self.host, self.port, budget, deadline, limits)?;
        conn.encoder.command(Command::Barrier).bytes(BARRIER_PROBE_KEY.as_bytes()).i64(1);
        conn.encoder.command(Command::DeleteKey).bytes(BARRIER_PROBE_KEY.as_bytes());
        conn.send().map_err(|error| error.to_string())?;
        let mut byte = [0];
        match conn.read_until(&mut byte, deadline) {
            Ok(()) if byte[0] == STOP_WAITING => {}
            Ok(()) => return Err(format!("the store server answered BARRIER with {}, not STOP_WAITING", byte[0])),
            Err(ReadFailure::Failed(message)) if message.starts_with(CLOSED) => return Ok(false),
            Err(ReadFailure::Failed(message)) => return Err(message),
            Err(ReadFailure::TimedOut) => return Err(format!("no reply to BARRIER within {}ms", budget.as_millis())),
        }
        conn.read_i64(budget, Command::DeleteKey).map_err(|error| error.to_string())?;
        Ok(true)
    }

    fn wait_prefixed(&self, keys: &[String], timeout: Duration) -> Result<(), StoreError> {
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Wait).keys(keys);
        conn.send()?;
        // A wait that ran out of time fails even if the cancel found the keys there, as PyTorch's client does.
        match conn.await_stop_waiting(timeout, deadline_after(timeout), Command::Wait)? {
            Awaited::Released => Ok(()),
            Awaited::ReleasedAtCancel | Awaited::Canceled => Err(StoreError::Timeout { keys: keys.to_vec(), timeout }),
        }
    }

    fn check_prefixed(&self, keys: &[String]) -> Result<bool, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Check).keys(keys);
        conn.send()?;
        Ok(conn.read_u8(timeout, Command::Check)? == CHECK_READY)
    }
}

/// PyTorch's refusal of a world size of 0, and of one that the `init/` counter (an i64 on the wire and in the
/// server) cannot reach, which would wrap negative and let the server's worker pass at once.
fn check_workers(options: &TcpStoreOptions) -> Result<(), StoreError> {
    match options.num_workers {
        Some(0) => Err(StoreError::InvalidArgument("world_size (num_workers) must be greater than 0".into())),
        Some(workers) if i64::try_from(workers).is_err() => Err(StoreError::InvalidArgument(format!(
            "world_size (num_workers) {workers} is beyond the store's worker counter: at most {} (i64::MAX)",
            i64::MAX
        ))),
        _ => Ok(()),
    }
}

/// The in-process server's options for a store opened with `options`.
fn server_options(options: &TcpStoreOptions) -> ServerOptions {
    ServerOptions {
        host: None,
        port: options.port,
        limits: options.limits,
        threads: options.server_threads,
        ..ServerOptions::default()
    }
}

/// The servers started with `multi_tenant`, by port: PyTorch's per-process cache of shared servers.
fn tenant_servers() -> &'static Mutex<HashMap<u16, Weak<TcpStoreServer>>> {
    static SERVERS: OnceLock<Mutex<HashMap<u16, Weak<TcpStoreServer>>>> = OnceLock::new();
    SERVERS.get_or_init(Mutex::default)
}

fn prefixed(key: &str) -> String {
    format!("{KEY_PREFIX}{key}")
}

fn prefixed_all(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|key| prefixed(key)).collect()
}

fn ping(conn: &mut Conn, timeout: Duration) -> Result<(), StoreError> {
    let nonce = std::process::id();
    conn.encoder.command(Command::Ping).u32(nonce);
    conn.send()?;
    let mut echo = [0; 4];
    conn.read_reply(&mut echo, timeout, Command::Ping)?;
    let echo = u32::from_le_bytes(echo);
    if echo != nonce {
        return Err(
            conn.fail(format!("Ping failed, invalid value returned from server. Expected: {nonce}, Got: {echo}"))
        );
    }
    Ok(())
}

/// A small pseudo-random number for backoff jitter; quality does not matter here.
fn jitter_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^ (x >> 33)
}

/// Connects, validates and pings, retrying with exponential backoff and jitter until `timeout` passes.
fn connect(
    host: &str,
    port: u16,
    timeout: Duration,
    initial_backoff: Duration,
    limits: Limits,
) -> Result<Conn, StoreError> {
    let deadline = deadline_after(timeout);
    let mut backoff = initial_backoff;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let error = match try_connect(host, port, timeout, deadline, limits) {
            Ok(conn) => return Ok(conn),
            Err(error) => error,
        };
        let now = Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if left.is_some_and(|left| left.is_zero()) {
            return Err(StoreError::Network(format!(
                "The client socket has timed out after {}ms while trying to connect to ({host}, {port}) after {attempt} attempts; last error: {error}",
                timeout.as_millis()
            )));
        }
        // Jitter of plus or minus half the backoff, as PyTorch's ExponentialBackoffWithJitter.
        let factor = 0.5 + (jitter_seed() % 1000) as f64 / 1000.0;
        let pause = backoff.mul_f64(factor);
        std::thread::sleep(left.map_or(pause, |left| pause.min(left)));
        backoff = backoff.mul_f64(1.5).min(Duration::from_secs(60));
    }
}

fn try_connect(
    host: &str,
    port: u16,
    timeout: Duration,
    deadline: Option<Instant>,
    limits: Limits,
) -> Result<Conn, String> {
    let addrs = (host, port).to_socket_addrs().map_err(|e| format!("cannot resolve {host}: {e}"))?;
    let mut last = format!("{host} resolves to no address");
    for addr in addrs {
        let left = deadline.map_or(Duration::from_secs(60), |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            break;
        }
        let stream = match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => stream,
            Err(e) => {
                last = format!("{addr}: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let mut conn = Conn::new(stream, limits);
        conn.encoder.command(Command::Validate).u32(VALIDATION_MAGIC);
        let handshake = conn.send().and_then(|()| ping(&mut conn, if timeout.is_zero() { left } else { timeout }));
        match handshake {
            Ok(()) => return Ok(conn),
            Err(e) => {
                let _ = conn.stream.shutdown(Shutdown::Both);
                last = format!("{addr}: {e}");
            }
        }
    }
    Err(last)
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Set).bytes(prefixed(key).as_bytes()).bytes(value);
        conn.send()
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let key = prefixed(key);
        let timeout = self.timeout();
        self.wait_prefixed(std::slice::from_ref(&key), timeout)?;
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Get).bytes(key.as_bytes());
        conn.send()?;
        conn.read_bytes(timeout, Command::Get)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.add_raw(&prefixed(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::CompareSet).bytes(prefixed(key).as_bytes()).bytes(expected).bytes(desired);
        conn.send()?;
        conn.read_bytes(timeout, Command::CompareSet)
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.check_prefixed(&prefixed_all(keys))
    }

    /// A zero `timeout` means "now", as in `HashStore`: one `CHECK`, and a missing key is a timeout at once. (The
    /// store's own timeout of zero, used when `timeout` is `None`, means no timeout.)
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        let keys = prefixed_all(keys);
        match timeout {
            Some(now) if now.is_zero() => match self.check_prefixed(&keys)? {
                true => Ok(()),
                false => Err(StoreError::Timeout { keys, timeout: now }),
            },
            timeout => self.wait_prefixed(&keys, timeout.unwrap_or_else(|| self.timeout())),
        }
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::DeleteKey).bytes(prefixed(key).as_bytes());
        conn.send()?;
        Ok(conn.read_i64(timeout, Command::DeleteKey)? == 1)
    }

    fn num_keys(&self) -> Result<i64, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::GetNumKeys);
        conn.send()?;
        conn.read_i64(timeout, Command::GetNumKeys)
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Append).bytes(prefixed(key).as_bytes()).bytes(value);
        conn.send()
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        let keys = prefixed_all(keys);
        let timeout = self.timeout();
        self.wait_prefixed(&keys, timeout)?;
        let mut conn = self.lock()?;
        conn.encoder.command(Command::MultiGet).keys(&keys);
        conn.send()?;
        keys.iter().map(|_| conn.read_bytes(timeout, Command::MultiGet)).collect()
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<(), StoreError> {
        if keys.len() != values.len() {
            return Err(StoreError::InvalidArgument(format!(
                "multi_set got {} keys and {} values",
                keys.len(),
                values.len()
            )));
        }
        let mut conn = self.lock()?;
        conn.encoder.command(Command::MultiSet).i64(keys.len() as i64);
        for (key, value) in keys.iter().zip(values) {
            conn.encoder.bytes(prefixed(key).as_bytes()).bytes(value);
        }
        conn.send()
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut conn = self.lock()?;
        conn.encoder.command(Command::QueuePush).bytes(prefixed(key).as_bytes()).bytes(value);
        conn.send()
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>, StoreError> {
        let key = prefixed(key);
        let timeout = self.timeout();
        let deadline = deadline_after(timeout);
        loop {
            if block {
                let left = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
                if deadline.is_some() && left.is_zero() {
                    return Err(StoreError::Timeout { keys: vec![key], timeout });
                }
                self.wait_prefixed(std::slice::from_ref(&key), left).map_err(|error| match error {
                    StoreError::Timeout { keys, .. } => StoreError::Timeout { keys, timeout },
                    other => other,
                })?;
            }
            let mut conn = self.lock()?;
            conn.encoder.command(Command::QueuePop).bytes(key.as_bytes());
            conn.send()?;
            let len = conn.read_i64(timeout, Command::QueuePop)?;
            if len > 0 {
                return conn.read_bytes(timeout, Command::QueuePop);
            }
            if !block {
                return Err(StoreError::QueueEmpty { key: key[KEY_PREFIX.len()..].to_owned() });
            }
            // Another client popped the element that ended our wait; wait again.
        }
    }

    fn queue_len(&self, key: &str) -> Result<i64, StoreError> {
        let timeout = self.timeout();
        let mut conn = self.lock()?;
        conn.encoder.command(Command::QueueLen).bytes(prefixed(key).as_bytes());
        conn.send()?;
        conn.read_i64(timeout, Command::QueueLen)
    }

    fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let mut keys: Vec<String> = self
            .list_raw_keys()?
            .into_iter()
            .filter_map(|key| String::from_utf8(key).ok())
            .filter_map(|key| key.strip_prefix(KEY_PREFIX).map(str::to_owned))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// With a server that has the `BARRIER` request (this crate's), one request; with one that does not (PyTorch's
    /// closes the connection on it, as torchrun's agent store does), the same barrier out of `ADD`, `SET` and
    /// `WAIT` on a new connection, and from then on at once. A connection that fails during a `BARRIER` on a
    /// server that has the request is a [`StoreError::Network`]: the server may have counted the arrival, so the
    /// barrier is never made again (it could pass without one of its participants).
    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<(), StoreError> {
        if self.server_barrier.load(Ordering::Relaxed) == BARRIER_MISSING {
            return counted_barrier(self, key, world_size, timeout);
        }
        let wire_key = prefixed(key);
        let wait = timeout.unwrap_or_else(|| self.timeout());
        // A timeout given for this call bounds it even when zero ("now": the barrier passes only if this arrival
        // completes it); the store's own timeout of zero means no timeout.
        let deadline = match timeout {
            Some(timeout) => Instant::now().checked_add(timeout),
            None => deadline_after(wait),
        };
        let mut conn = self.lock()?;
        conn.encoder.command(Command::Barrier).bytes(wire_key.as_bytes()).i64(world_size);
        let outcome = conn.send().and_then(|()| conn.await_stop_waiting(wait, deadline, Command::Barrier));
        drop(conn);
        match outcome {
            Ok(awaited) => {
                self.server_barrier.store(BARRIER_NATIVE, Ordering::Relaxed);
                match awaited {
                    // A barrier released before its cancel was handled passed: every participant arrived.
                    Awaited::Released | Awaited::ReleasedAtCancel => Ok(()),
                    Awaited::Canceled => Err(StoreError::BarrierTimeout { key: wire_key, timeout: wait }),
                }
            }
            Err(StoreError::Network(message)) => match self.server_barrier.load(Ordering::Relaxed) {
                BARRIER_UNKNOWN => self.barrier_after_failure(key, world_size, timeout, deadline, message),
                _ => Err(StoreError::Network(format!("{message}, in the barrier on key '{wire_key}'"))),
            },
            Err(error) => Err(error),
        }
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        let timeout = self.timeout();
        let conn = self.new_conn(self.conn.lock().unwrap_or_else(PoisonError::into_inner).limits)?;
        Ok(Arc::new(Self {
            host: self.host.clone(),
            port: self.port,
            conn: Mutex::new(conn),
            timeout: Mutex::new(timeout),
            // A clone is a client only, as in PyTorch: the server lives as long as the handle that started it.
            server: None,
            server_barrier: AtomicU8::new(self.server_barrier.load(Ordering::Relaxed)),
        }))
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner) = timeout;
    }
}

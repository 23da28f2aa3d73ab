//! The TCP store server: event-driven threads (mio), each serving its share of the connections.
//!
//! The server keeps PyTorch's semantics: a connection must open with `VALIDATE`, `WAIT` replies when every
//! awaited key exists, `CANCEL_WAIT` drops the connection's registrations, `QUEUE_PUSH` wakes one waiter and
//! `BARRIER` wakes everyone when the count is reached.
//! A connection that breaks the protocol or a limit is refused: the refusal is logged with the peer and the
//! reason, the requests it sent before the offending one are answered, and it is closed once those replies are
//! sent. The other connections go on.
//!
//! With several threads the store's state sits behind one mutex. Every request is handled under it, and every
//! byte it sends is appended to the receiving connection's outbox under it, so a connection receives its bytes
//! in the order the state decided them: a `STOP_WAITING` decided by a `SET` on another thread always precedes
//! the `WAIT_CANCELED` of a `CANCEL_WAIT` handled after it. Only the thread that owns a connection reads or
//! writes its socket; a thread that appends to another thread's connection asks the owner to send.
//!
//! Memory a client can make the server hold is bounded: a request by [`Limits`], the unsent replies of one
//! connection by a high-water mark plus one reply (the server stops reading a connection past it), and the
//! large replies of all connections together by [`Limits::max_queued_reply_bytes`].

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::protocol::{decode_framed, Framed, Limits, Request};
use super::state::{lock, Outbox, Requester, State};
use crate::StoreError;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
const COALESCE_TIMER: Token = Token(usize::MAX - 3);
/// What a connection is registered for, edge-triggered: a writable event comes only after a send found the
/// socket full, so it costs nothing while replies fit.
const CONNECTION_INTEREST: Interest = Interest::READABLE.add(Interest::WRITABLE);
/// How many batches of fire-and-forget requests in a row, each less than [`STREAM_GAP`] after the one before,
/// make a connection a stream that [`ServerOptions::coalesce`] reads late.
const STREAM_BATCHES: u8 = 2;
/// The longest pause between two batches of fire-and-forget requests of one stream (or twice the coalescing
/// interval, when that is longer): a client whose SETs come further apart, as a rank setting its rendezvous keys
/// does, is read at once, and only a flood waits for coalescing.
const STREAM_GAP: Duration = Duration::from_millis(1);
/// How many bytes one `read` call takes from a socket.
const READ_CHUNK: usize = 64 * 1024;
/// Above this many unsent reply bytes, the server stops reading and handling a connection until the peer
/// reads: a connection's queued replies stay below this plus one reply.
const WRITE_HIGH_WATER: usize = 4 << 20;
/// Replies at least this long draw on the server-wide [`Limits::max_queued_reply_bytes`].
const LARGE_REPLY: usize = 64 * 1024;
/// The most requests handled in one hold of the state lock, so that one busy connection cannot keep the
/// other threads out for long.
const REQUESTS_PER_LOCK: usize = 256;
/// The most bytes read and dropped from a refused connection before it is closed (its unread input would
/// make the close a reset, which can discard the replies it is owed).
const DISCARD_ON_CLOSE: usize = 1 << 20;

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The address to listen on; `None` listens on every interface (`::`, or `0.0.0.0` without IPv6).
    pub host: Option<String>,
    /// The port; 0 picks a free one (see [`TcpStoreServer::port`]).
    pub port: u16,
    /// What one request may carry, and the bounds on waits and queued replies.
    pub limits: Limits,
    /// After a batch of events that sent a reply, how long a server thread keeps polling without blocking
    /// before it sleeps, so that the client's next request is served without a thread wake-up; zero turns it
    /// off. Default: 50 us on a machine with four or more CPUs, else off (the spinning thread would take a
    /// CPU from the clients).
    pub busy_poll: Duration,
    /// How many event-loop threads serve the connections (new connections are dealt out in turn); 0 picks
    /// the default: one per eight CPUs, one or two, and one where the host's TCP congestion control is not
    /// `bbr`. PyTorch's libuv server has one.
    pub threads: usize,
    /// Receive coalescing; zero turns it off. A connection whose last batches held only fire-and-forget
    /// requests (a flood of SETs) is read this long after its data arrived, so that one read takes many
    /// requests and the sender's SETs share TCP segments; the first request with a reply after such a flood
    /// waits up to this long. Default: 200 us on a machine with four or more CPUs, else off.
    pub coalesce: Duration,
}

/// The number of CPUs this process may use.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `interval` on a machine with a CPU to spare (four or more), else zero (off).
fn with_a_cpu_to_spare(interval: Duration) -> Duration {
    match cpus() {
        4.. => interval,
        _ => Duration::ZERO,
    }
}

/// The default of [`ServerOptions::threads`].
pub(super) fn default_threads() -> usize {
    // Senders with any other congestion control grow their window without bound on loopback, and a second
    // thread then acknowledges a SET flood so fast that each SET leaves as its own TCP segment.
    let bbr = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").is_ok_and(|cc| cc.trim() == "bbr");
    match bbr {
        true => (cpus() / 8).clamp(1, 2),
        false => 1,
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            host: None,
            port: super::DEFAULT_PORT,
            limits: Limits::default(),
            busy_poll: with_a_cpu_to_spare(Duration::from_micros(50)),
            threads: 0,
            coalesce: with_a_cpu_to_spare(Duration::from_micros(200)),
        }
    }
}

/// Counters a test or an operator can read while the server runs.
#[derive(Debug, Default)]
struct Counters {
    open_connections: AtomicUsize,
    accepted: AtomicU64,
    protocol_errors: AtomicU64,
    peak_buffered: AtomicUsize,
    coalesced_reads: AtomicU64,
    peak_queued_reply_bytes: AtomicUsize,
    reply_waits: AtomicU64,
}

/// A snapshot of the server's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now.
    pub open_connections: usize,
    /// Connections accepted since the start.
    pub accepted: u64,
    /// Connections refused because they broke the protocol or a limit.
    pub protocol_errors: u64,
    /// The most bytes of unparsed requests one connection ever held.
    pub peak_buffered: usize,
    /// Times a streaming connection left the poll to be read late ([`ServerOptions::coalesce`]).
    pub coalesced_reads: u64,
    /// Bytes of large replies queued now and not yet sent ([`Limits::max_queued_reply_bytes`]).
    pub queued_reply_bytes: usize,
    /// The most bytes of large replies ever queued at once.
    pub peak_queued_reply_bytes: usize,
    /// Times a request with a large reply waited for other connections to read theirs.
    pub reply_waits: u64,
}

/// A running TCP store server; dropping it (or [`TcpStoreServer::shutdown`]) stops it and closes every
/// connection, so clients see a network error instead of hanging.
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds and starts serving on background threads named `pg_tcpstore` (`pg_tcpstore_N` past the first).
    pub fn start(options: ServerOptions) -> Result<Self, StoreError> {
        let listener = bind(options.host.as_deref(), options.port)?;
        Self::serve(listener, options)
    }

    /// Starts serving on `listener`, a TCP socket already bound and listening, which the server owns from
    /// here on and closes when it stops (PyTorch's `master_listen_fd`: a launcher that bound the port first
    /// hands it over, so that no other process can take the port between choosing and binding it).
    /// `options.host` and `options.port` are not used. A socket that is not a listening TCP socket is refused
    /// with [`StoreError::InvalidArgument`].
    pub fn start_on(listener: std::net::TcpListener, options: ServerOptions) -> Result<Self, StoreError> {
        check_listening(&listener)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| StoreError::Network(format!("cannot make the listening socket non-blocking: {e}")))?;
        Self::serve(TcpListener::from_std(listener), options)
    }

    /// Serves on `listener` with `options`.
    fn serve(listener: TcpListener, options: ServerOptions) -> Result<Self, StoreError> {
        let addr = listener.local_addr().map_err(|e| StoreError::Network(format!("local_addr: {e}")))?;
        let count = match options.threads {
            0 => default_threads(),
            n => n,
        };
        let mut polls = Vec::with_capacity(count);
        let mut handles = Vec::with_capacity(count);
        for _ in 0..count {
            let poll = Poll::new().map_err(|e| StoreError::Network(format!("cannot create a poller: {e}")))?;
            let waker = Waker::new(poll.registry(), WAKER)
                .map_err(|e| StoreError::Network(format!("cannot create a waker: {e}")))?;
            handles.push(LoopHandle { waker, inbox: Mutex::new(Inbox::default()), woken: AtomicBool::new(false) });
            polls.push(poll);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            loops: handles,
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            limits: options.limits,
            busy_poll: options.busy_poll,
            coalesce: options.coalesce,
            stream_gap: STREAM_GAP.max(options.coalesce.saturating_mul(2)),
            budget: Mutex::new(ReplyBudget::default()),
            next_conn_id: AtomicU64::new(0),
        });
        let mut listener = Some(listener);
        let mut threads = Vec::with_capacity(count);
        for (index, poll) in polls.into_iter().enumerate() {
            let mut event_loop = EventLoop {
                index,
                poll,
                listener: listener.take(),
                shared: Arc::clone(&shared),
                conns: Vec::new(),
                free: Vec::new(),
                scratch: vec![0; READ_CHUNK],
                replied: false,
                next_owner: 0,
                woken: Vec::new(),
                batch: Vec::with_capacity(REQUESTS_PER_LOCK),
                garbage: Vec::new(),
                timer: None,
                timer_armed: false,
                deferred: VecDeque::new(),
            };
            let name = match index {
                0 => "pg_tcpstore".to_owned(),
                n => format!("pg_tcpstore_{n}"),
            };
            let spawned = std::thread::Builder::new().name(name).spawn(move || event_loop.run());
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(error) => {
                    // The threads already started stop with the server that is dropped here.
                    drop(Self { addr, shared, threads });
                    return Err(StoreError::Other(format!("cannot spawn a store server thread: {error}")));
                }
            }
        }
        tracing::debug!(%addr, threads = count, "TCP store server listening");
        Ok(Self { addr, shared, threads })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many event-loop threads serve the connections.
    pub fn threads(&self) -> usize {
        self.shared.loops.len()
    }

    /// The server's counters now.
    pub fn stats(&self) -> ServerStats {
        let counters = &self.shared.counters;
        ServerStats {
            open_connections: counters.open_connections.load(Ordering::Relaxed),
            accepted: counters.accepted.load(Ordering::Relaxed),
            protocol_errors: counters.protocol_errors.load(Ordering::Relaxed),
            peak_buffered: counters.peak_buffered.load(Ordering::Relaxed),
            coalesced_reads: counters.coalesced_reads.load(Ordering::Relaxed),
            queued_reply_bytes: lock(&self.shared.budget).queued,
            peak_queued_reply_bytes: counters.peak_queued_reply_bytes.load(Ordering::Relaxed),
            reply_waits: counters.reply_waits.load(Ordering::Relaxed),
        }
    }

    /// Stops the server, closes every connection, and waits for the threads to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    /// Blocks until the server stops (it stops only through [`TcpStoreServer::shutdown`] or a fatal
    /// poller error).
    pub fn join(mut self) {
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    fn stop_and_join(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for handle in &self.shared.loops {
            let _ = handle.waker.wake();
        }
        for thread in self.threads.drain(..) {
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

/// Whether `listener` can serve: a TCP (stream) socket in the listening state. A `std::net::TcpListener`
/// made from an arbitrary file descriptor may be neither.
fn check_listening(listener: &std::net::TcpListener) -> Result<(), StoreError> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let refuse = |what: String| Err(StoreError::InvalidArgument(format!("the listener handed to the server {what}")));
    match sockopt::socket_domain(listener) {
        Ok(AddressFamily::INET | AddressFamily::INET6) => {}
        Ok(other) => return refuse(format!("is not an IP socket (address family {})", other.as_raw())),
        Err(error) => return refuse(format!("is not a socket ({error})")),
    }
    match sockopt::socket_type(listener) {
        Ok(SocketType::STREAM) => {}
        Ok(other) => return refuse(format!("is not a stream socket (type {})", other.as_raw())),
        Err(error) => return refuse(format!("has no socket type ({error})")),
    }
    match sockopt::socket_acceptconn(listener) {
        Ok(true) => Ok(()),
        Ok(false) => refuse("is not listening (bind and listen first, as std::net::TcpListener::bind does)".into()),
        Err(error) => refuse(format!("cannot be queried: {error}")),
    }
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

/// What every event loop of one server shares.
struct Shared {
    state: Mutex<State>,
    loops: Vec<LoopHandle>,
    stop: AtomicBool,
    counters: Counters,
    limits: Limits,
    busy_poll: Duration,
    coalesce: Duration,
    /// [`STREAM_GAP`] or twice `coalesce`, whichever is longer.
    stream_gap: Duration,
    /// Large replies queued, and the connections waiting for room (server-wide).
    budget: Mutex<ReplyBudget>,
    next_conn_id: AtomicU64,
}

/// The large replies of all connections that are queued and not yet sent.
#[derive(Debug, Default)]
struct ReplyBudget {
    /// Their bytes.
    queued: usize,
    /// Connections whose next request waits for room: (owning loop, slot, connection id).
    waiting: Vec<(usize, usize, u64)>,
}

impl Shared {
    /// Takes room for a reply of `len` bytes for connection `outbox`; when there is none, puts the connection
    /// on the waiting list (unless `listed`: it is on it already) and returns false.
    fn charge(&self, len: usize, outbox: &Outbox, listed: bool) -> bool {
        let mut budget = lock(&self.budget);
        if budget.queued > 0 && budget.queued + len > self.limits.max_queued_reply_bytes {
            if !listed {
                budget.waiting.push((outbox.owner, outbox.slot, outbox.id));
                self.counters.reply_waits.fetch_add(1, Ordering::Relaxed);
            }
            return false;
        }
        budget.queued += len;
        self.counters.peak_queued_reply_bytes.fetch_max(budget.queued, Ordering::Relaxed);
        true
    }

    /// Gives back room for `len` bytes of sent (or dropped) replies and asks the owners of the waiting
    /// connections to try again.
    fn release(&self, len: usize) {
        let waiting = {
            let mut budget = lock(&self.budget);
            budget.queued -= len;
            std::mem::take(&mut budget.waiting)
        };
        for (owner, slot, id) in waiting {
            let handle = &self.loops[owner];
            lock(&handle.inbox).to_resume.push((slot, id));
            handle.notify();
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("threads", &self.loops.len()).field("counters", &self.counters).finish()
    }
}

/// How the other threads reach one event loop.
struct LoopHandle {
    waker: Waker,
    inbox: Mutex<Inbox>,
    /// Whether the loop was woken and has not emptied its inbox since (one wake-up serves many messages).
    woken: AtomicBool,
}

impl LoopHandle {
    fn notify(&self) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            if let Err(error) = self.waker.wake() {
                tracing::error!(%error, "TCP store server cannot wake one of its threads");
            }
        }
    }
}

/// Messages for one event loop.
#[derive(Default)]
struct Inbox {
    /// Connections accepted by the first loop for this one.
    accepted: Vec<(TcpStream, SocketAddr)>,
    /// This loop's connections whose outboxes another loop appended to: (slot, connection id).
    to_flush: Vec<(usize, u64)>,
    /// This loop's connections whose requests wait for room for their replies, now that some was given back.
    to_resume: Vec<(usize, u64)>,
}

/// A connection, owned by one event loop.
struct Conn {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    /// Received bytes; `rstart..` is not parsed yet.
    rbuf: Vec<u8>,
    rstart: usize,
    /// Bytes taken from the outbox; `wstart..` is not sent yet.
    wbuf: Vec<u8>,
    wstart: usize,
    validated: bool,
    /// Decoded requests that wait behind unsent replies.
    pending: VecDeque<Request>,
    /// How many batches in a row held only fire-and-forget requests, each within [`Shared::stream_gap`] of the
    /// one before (saturating).
    stream_batches: u8,
    /// When the last batch of fire-and-forget requests was handled (kept only while coalescing is on).
    last_stream_batch: Option<Instant>,
    /// Whether the connection is on its loop's deferred list.
    deferred: bool,
    /// Bytes of large replies this connection holds room for; given back once its replies are all sent.
    charged: usize,
    /// Whether its next request waits for room for its reply (the connection is not read meanwhile).
    starved: bool,
    /// Why the connection was refused: it is closed once the replies it is owed are sent.
    refused: Option<String>,
    /// Whether the peer closed its sending side: the connection is closed once every reply is sent.
    eof: bool,
    outbox: Arc<Outbox>,
}

impl Conn {
    /// Reply bytes not sent yet, given the outbox's length.
    fn unsent(&self, outbox_len: usize) -> usize {
        self.wbuf.len() - self.wstart + outbox_len
    }

    /// Whether the connection reads no more requests and is closed once its replies are sent.
    fn ending(&self) -> bool {
        self.eof || self.refused.is_some()
    }

    /// Refuses the connection for `reason` (the first reason counts): it reads no more requests.
    fn refuse(&mut self, counters: &Counters, reason: String) {
        if self.refused.is_some() {
            return;
        }
        counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
        let peer = self.peer.map_or_else(|| "?".to_owned(), |p| p.to_string());
        tracing::warn!(%peer, %reason, "TCP store server refused a connection that broke the protocol or a limit");
        self.refused = Some(reason);
    }
}

/// Why a connection ends.
enum Close {
    /// The peer closed it, or closed its sending side and got every reply.
    Eof,
    Io(io::Error),
    /// It was refused (the reason was logged then) and got every reply owed.
    Protocol(String),
}

/// How handling a connection's buffered requests stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// No whole request is left to handle.
    Done,
    /// Requests wait behind more unsent replies than the high-water mark.
    Backlogged,
    /// A request waits for room in the server-wide reply budget.
    Starved,
}

struct EventLoop {
    index: usize,
    poll: Poll,
    /// The listening socket: the first loop accepts and deals connections out to every loop in turn.
    listener: Option<TcpListener>,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    scratch: Vec<u8>,
    /// Whether the current batch of events sent a reply: a client that got one is about to send its next
    /// request, which busy polling catches without a wake-up (after fire-and-forget SETs it only costs).
    replied: bool,
    /// The loop that gets the next accepted connection.
    next_owner: usize,
    /// Other connections that handling a request appended to (a scratch list).
    woken: Vec<Arc<Outbox>>,
    /// Requests decoded for one hold of the state lock (a scratch list); their positions are in the
    /// connection's receive buffer.
    batch: Vec<Framed>,
    /// Keys and values replaced under the state lock, freed after it (a scratch list).
    garbage: Vec<Vec<u8>>,
    /// The timer of receive coalescing (with [`ServerOptions::coalesce`]).
    timer: Option<rustix::fd::OwnedFd>,
    timer_armed: bool,
    /// Connections out of the poll, in the order their reads fall due: (slot, connection id, due); the timer
    /// wakes the loop for the first.
    deferred: VecDeque<(usize, u64, Instant)>,
}

impl EventLoop {
    fn run(&mut self) {
        if let Some(listener) = &mut self.listener {
            if let Err(error) = self.poll.registry().register(listener, LISTENER, Interest::READABLE) {
                tracing::error!(%error, "TCP store server cannot register its listener");
                return;
            }
        }
        if !self.shared.coalesce.is_zero() {
            self.timer = self.start_timer();
        }
        let mut events = Events::with_capacity(1024);
        // Until when the loop polls without blocking: set after every batch of events that sent a reply.
        let mut spin_until: Option<Instant> = None;
        while !self.shared.stop.load(Ordering::SeqCst) {
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
                    WAKER => self.read_inbox(),
                    COALESCE_TIMER => self.read_due(),
                    Token(slot) if event.is_readable() && self.defers(slot, event) => {}
                    // A peer that closed its side must be read to the end now: no later event will say so.
                    Token(slot) => self.drive(slot, !event.is_read_closed() && !event.is_error()),
                }
            }
            if self.replied && !self.shared.busy_poll.is_zero() {
                spin_until = Some(Instant::now() + self.shared.busy_poll);
            }
        }
        self.shared.counters.open_connections.store(0, Ordering::Relaxed);
    }

    /// Creates and registers the receive-coalescing timer; without one, connections are read at once.
    fn start_timer(&mut self) -> Option<rustix::fd::OwnedFd> {
        use rustix::time::{timerfd_create, TimerfdClockId, TimerfdFlags};
        let created = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC);
        let timer = created
            .map_err(io::Error::from)
            .and_then(|timer| {
                let fd = std::os::fd::AsRawFd::as_raw_fd(&timer);
                self.poll.registry().register(&mut mio::unix::SourceFd(&fd), COALESCE_TIMER, Interest::READABLE)?;
                Ok(timer)
            })
            .inspect_err(|error| tracing::warn!(%error, "TCP store server: no receive-coalescing timer"));
        timer.ok()
    }

    /// Whether a readable connection that streams fire-and-forget requests is to be read late (it then leaves
    /// the poll for the deferred list).
    fn defers(&mut self, slot: usize, event: &mio::event::Event) -> bool {
        // The loop has a timer exactly when coalescing is on and the timer could be made.
        if self.timer.is_none() {
            return false;
        }
        if event.is_read_closed() || event.is_error() {
            return false;
        }
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return false };
        if conn.stream_batches < STREAM_BATCHES || conn.wstart < conn.wbuf.len() || conn.ending() {
            return false;
        }
        if conn.deferred {
            return true;
        }
        // Out of the poll until its read is due: more data from the sender then wakes nothing here, and the
        // sender's send does not have to wake this thread.
        if self.poll.registry().deregister(&mut conn.stream).is_err() {
            return false;
        }
        conn.deferred = true;
        self.deferred.push_back((slot, conn.outbox.id, Instant::now() + self.shared.coalesce));
        self.shared.counters.coalesced_reads.fetch_add(1, Ordering::Relaxed);
        if !self.timer_armed && !self.arm_timer(self.shared.coalesce) {
            // No timer, no waiting: read what is deferred now.
            self.read_due();
        }
        true
    }

    /// Arms the coalescing timer (when the loop has one) to fire `after` from now; false when it cannot.
    fn arm_timer(&mut self, after: Duration) -> bool {
        use rustix::time::{timerfd_settime, Itimerspec, TimerfdTimerFlags, Timespec};
        let Some(timer) = &self.timer else { return false };
        let when = Itimerspec {
            it_interval: Timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: Timespec { tv_sec: after.as_secs() as _, tv_nsec: after.subsec_nanos().max(1) as _ },
        };
        self.timer_armed = timerfd_settime(timer, TimerfdTimerFlags::empty(), &when).is_ok();
        self.timer_armed
    }

    /// Reads the deferred connections whose reads are due (or fall due within a quarter of the interval, so
    /// that one wake-up serves several) and puts them back in the poll; re-arms the timer for the next one.
    fn read_due(&mut self) {
        if let Some(timer) = &self.timer {
            let mut expirations = [0u8; 8];
            let _ = rustix::io::read(timer, &mut expirations);
        }
        self.timer_armed = false;
        let mut horizon = Instant::now() + self.shared.coalesce / 4;
        while let Some(&(slot, id, due)) = self.deferred.front() {
            if due > horizon {
                if self.arm_timer(due.saturating_duration_since(Instant::now())) {
                    break;
                }
                // No timer, no waiting: read every deferred connection now.
                horizon = due;
            }
            self.deferred.pop_front();
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { continue };
            if conn.outbox.id != id {
                continue;
            }
            conn.deferred = false;
            self.drive(slot, true);
            // Registering reports whatever is ready at that moment, so data that arrived after the read above
            // raises an event (which starts the next wait if the connection still streams).
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { continue };
            if let Err(error) = self.poll.registry().register(&mut conn.stream, Token(slot), CONNECTION_INTEREST) {
                self.close(slot, Close::Io(error));
            }
        }
    }

    fn accept(&mut self) {
        // Taken out while accepting, so that a connection this loop keeps can be adopted on the way.
        let Some(listener) = self.listener.take() else { return };
        loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    self.shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    let owner = self.next_owner;
                    self.next_owner = (owner + 1) % self.shared.loops.len();
                    if owner == self.index {
                        self.adopt(stream, peer);
                    } else {
                        let handle = &self.shared.loops[owner];
                        lock(&handle.inbox).accepted.push((stream, peer));
                        handle.notify();
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    // Running out of descriptors and similar errors must not stop the server.
                    tracing::warn!(%error, "TCP store server accept failed");
                    break;
                }
            }
        }
        self.listener = Some(listener);
    }

    /// Takes an accepted connection into this loop.
    fn adopt(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(error) = self.poll.registry().register(&mut stream, Token(slot), CONNECTION_INTEREST) {
            tracing::warn!(%peer, %error, "TCP store server cannot register a connection");
            self.free.push(slot);
            return;
        }
        let id = self.shared.next_conn_id.fetch_add(1, Ordering::Relaxed);
        let outbox = Arc::new(Outbox { id, owner: self.index, slot, bytes: Mutex::new(Vec::new()) });
        self.conns[slot] = Some(Conn {
            stream,
            peer: Some(peer),
            rbuf: Vec::new(),
            rstart: 0,
            wbuf: Vec::new(),
            wstart: 0,
            validated: false,
            pending: VecDeque::new(),
            stream_batches: 0,
            last_stream_batch: None,
            deferred: false,
            charged: 0,
            starved: false,
            refused: None,
            eof: false,
            outbox,
        });
        self.shared.counters.open_connections.fetch_add(1, Ordering::Relaxed);
        // Data may already be waiting; edge-triggered readiness would not report it again.
        self.drive(slot, false);
    }

    /// Handles what other loops sent: connections to adopt and outboxes to send.
    fn read_inbox(&mut self) {
        let handle = &self.shared.loops[self.index];
        // Cleared before the inbox is emptied, so a message that arrives after this wakes the loop again.
        handle.woken.store(false, Ordering::Release);
        let inbox = std::mem::take(&mut *lock(&handle.inbox));
        for (stream, peer) in inbox.accepted {
            self.adopt(stream, peer);
        }
        for (slot, id) in inbox.to_flush {
            self.flush_if(slot, id);
        }
        for (slot, id) in inbox.to_resume {
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { continue };
            if conn.outbox.id == id {
                conn.starved = false;
                self.drive(slot, false);
            }
        }
    }

    /// Sends connection `id`'s outbox if it still sits in `slot` (it may have closed since).
    fn flush_if(&mut self, slot: usize, id: u64) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        if conn.outbox.id != id {
            return;
        }
        match flush(conn, &self.shared) {
            Ok(sent) => self.replied |= sent,
            Err(reason) => return self.close(slot, reason),
        }
        // A connection that ends once its replies are sent may have just sent the last.
        if conn.ending() {
            self.drive(slot, false);
        }
    }

    /// Asks the owners of the outboxes that handling appended to to send them.
    fn deliver_woken(&mut self) {
        let woken = std::mem::take(&mut self.woken);
        for outbox in &woken {
            if outbox.owner == self.index {
                self.flush_if(outbox.slot, outbox.id);
            } else {
                let handle = &self.shared.loops[outbox.owner];
                lock(&handle.inbox).to_flush.push((outbox.slot, outbox.id));
                handle.notify();
                self.replied = true;
            }
        }
        self.woken = woken;
        self.woken.clear();
    }

    /// Serves one connection until its socket would block: handles buffered requests, sends replies and
    /// reads more.
    ///
    /// With `short_read_drains`, a read shorter than the buffer is taken to have drained the socket (bytes
    /// arriving later raise a new edge-triggered event), which saves a system call per request; it must be
    /// false when the peer's end of stream may already be pending.
    fn drive(&mut self, slot: usize, short_read_drains: bool) {
        if let Err(reason) = self.drive_inner(slot, short_read_drains) {
            self.close(slot, reason);
        }
    }

    fn drive_inner(&mut self, slot: usize, short_read_drains: bool) -> Result<(), Close> {
        let mut drained = false;
        loop {
            let handled = self.handle_buffered(slot);
            self.deliver_woken();
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return Ok(()) };
            self.replied |= flush(conn, &self.shared)?;
            let unsent = conn.unsent(lock(&conn.outbox.bytes).len());
            if unsent > WRITE_HIGH_WATER || handled == Handled::Starved {
                // The peer does not read its replies, or others do not read theirs: a writable event, or room
                // given back, resumes this connection. It is not read meanwhile.
                return Ok(());
            }
            if handled == Handled::Backlogged {
                // Requests wait in the buffer behind replies that are now sent: handle them first.
                continue;
            }
            if conn.ending() {
                if unsent > 0 {
                    // A writable event comes once the peer reads; the connection closes after its last reply.
                    return Ok(());
                }
                if conn.refused.is_some() {
                    discard_input(conn);
                }
                return Err(conn.refused.take().map_or(Close::Eof, Close::Protocol));
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
                // The peer sends no more: what it sent is handled and answered first.
                Ok(0) => conn.eof = true,
                Ok(n) => {
                    conn.rbuf.extend_from_slice(&self.scratch[..n]);
                    // Read first: every loop reads this counter, and a write on every read would make its
                    // cache line travel between the loops' CPUs.
                    let peak = &self.shared.counters.peak_buffered;
                    if unparsed + n > peak.load(Ordering::Relaxed) {
                        peak.fetch_max(unparsed + n, Ordering::Relaxed);
                    }
                    drained = short_read_drains && n < READ_CHUNK;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(Close::Io(error)),
            }
        }
    }

    /// Handles the whole requests in the connection's buffer (those that waited first), until none is left,
    /// too many reply bytes are pending, or a large reply must wait for room.
    ///
    /// Requests are decoded outside the state lock, up to [`REQUESTS_PER_LOCK`] at a time, and handled under
    /// one hold of it; the values they replace are freed after it is released. A request that breaks the
    /// protocol or a limit refuses the connection: the requests before it are answered, none after it.
    fn handle_buffered(&mut self, slot: usize) -> Handled {
        let EventLoop { shared, conns, woken, batch, garbage, .. } = self;
        let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else { return Handled::Done };
        loop {
            // Requests left by a batch that stopped early go first.
            batch.extend(conn.pending.drain(..).map(Framed::Owned));
            while batch.len() < REQUESTS_PER_LOCK && conn.refused.is_none() {
                // A SET's or GET's bytes stay in the buffer (which does not change until the batch is handled) and
                // are named by their positions in it.
                match decode_framed(&conn.rbuf[conn.rstart..], conn.validated, &shared.limits) {
                    Ok(Some((request, used))) => {
                        let request = request.shifted(conn.rstart);
                        conn.rstart += used;
                        match request {
                            Framed::Owned(Request::Validate { .. }) => conn.validated = true,
                            request => batch.push(request),
                        }
                    }
                    Ok(None) => break,
                    Err(error) => conn.refuse(&shared.counters, error.to_string()),
                }
            }
            let full = batch.len() == REQUESTS_PER_LOCK;
            let mut outcome = Handled::Done;
            if !batch.is_empty() {
                conn.stream_batches = match batch.iter().any(Framed::has_reply) {
                    true => 0,
                    false if shared.coalesce.is_zero() => conn.stream_batches.saturating_add(1),
                    false => {
                        let now = Instant::now();
                        let close = conn.last_stream_batch.is_some_and(|last| now - last <= shared.stream_gap);
                        conn.last_stream_batch = Some(now);
                        match close {
                            true => conn.stream_batches.saturating_add(1),
                            false => 1,
                        }
                    }
                };
                let mut state = lock(&shared.state);
                let mut out = lock(&conn.outbox.bytes);
                let mut requests = batch.drain(..);
                let mut refusal = None;
                for request in requests.by_ref() {
                    if conn.unsent(out.len()) > WRITE_HIGH_WATER {
                        outcome = Handled::Backlogged;
                    } else {
                        let large = state.reply_len(&request, &conn.rbuf).filter(|&len| len >= LARGE_REPLY);
                        match large {
                            Some(len) if !shared.charge(len, &conn.outbox, conn.starved) => {
                                conn.starved = true;
                                outcome = Handled::Starved;
                            }
                            Some(len) => conn.charged += len,
                            None => {}
                        }
                    }
                    if outcome != Handled::Done {
                        conn.pending.push_back(request.into_request(&conn.rbuf));
                        break;
                    }
                    conn.starved = false;
                    let mut me =
                        Requester { outbox: &conn.outbox, out: &mut out, woken: &mut *woken, garbage: &mut *garbage };
                    if let Err(reason) = state.handle_framed(&mut me, &shared.limits, request, &conn.rbuf) {
                        refusal = Some(reason);
                        break;
                    }
                }
                drop((out, state));
                match refusal {
                    // Nothing after the refused request is handled.
                    Some(reason) => {
                        requests.for_each(drop);
                        conn.pending.clear();
                        conn.refuse(&shared.counters, reason);
                    }
                    None => conn.pending.extend(requests.map(|request| request.into_request(&conn.rbuf))),
                }
            }
            garbage.clear();
            if outcome != Handled::Done || !full || conn.refused.is_some() {
                return outcome;
            }
        }
    }

    fn close(&mut self, slot: usize, reason: Close) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::take) else { return };
        let deaths = {
            let mut state = lock(&self.shared.state);
            state.unregister(conn.outbox.id);
            // The connection's own replies go nowhere now; what its close sets may wake other connections.
            let mut out = Vec::new();
            let mut me =
                Requester { outbox: &conn.outbox, out: &mut out, woken: &mut self.woken, garbage: &mut self.garbage };
            state.connection_closed(&mut me)
        };
        self.garbage.clear();
        if deaths > 0 {
            self.deliver_woken();
        }
        if conn.charged > 0 {
            self.shared.release(conn.charged);
        }
        let mut stream = conn.stream;
        let _ = self.poll.registry().deregister(&mut stream);
        self.free.push(slot);
        self.shared.counters.open_connections.fetch_sub(1, Ordering::Relaxed);
        let peer = conn.peer.map_or_else(|| "?".to_owned(), |p| p.to_string());
        match reason {
            Close::Eof => tracing::trace!(%peer, "TCP store client disconnected"),
            Close::Io(error) => tracing::debug!(%peer, %error, "TCP store connection failed"),
            // Logged when it was refused.
            Close::Protocol(reason) => tracing::debug!(%peer, %reason, "TCP store server closed a refused connection"),
        }
    }
}

/// Reads and drops what a refused peer sent after its refused request, up to [`DISCARD_ON_CLOSE`] bytes, so
/// that closing the socket sends a FIN after the replies rather than a reset that may discard them.
fn discard_input(conn: &mut Conn) {
    let mut scratch = [0u8; 16 * 1024];
    let mut dropped = 0;
    while dropped < DISCARD_ON_CLOSE {
        match conn.stream.read(&mut scratch) {
            Ok(0) => return,
            Ok(n) => dropped += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Sends the connection's unsent bytes and then its outbox, until the socket would block; returns whether
/// anything was sent. A socket that would block raises a writable event once it drains. Once every reply is
/// sent, the room the connection held for large replies is given back.
fn flush(conn: &mut Conn, shared: &Shared) -> Result<bool, Close> {
    let mut sent = false;
    loop {
        if conn.wstart == conn.wbuf.len() {
            conn.wbuf.clear();
            conn.wstart = 0;
            let mut outbox = lock(&conn.outbox.bytes);
            if outbox.is_empty() {
                drop(outbox);
                if conn.charged > 0 {
                    shared.release(std::mem::take(&mut conn.charged));
                }
                return Ok(sent);
            }
            // Swapping keeps both allocations: the outbox gets the emptied buffer back.
            std::mem::swap(&mut conn.wbuf, &mut *outbox);
        }
        match conn.stream.write(&conn.wbuf[conn.wstart..]) {
            Ok(0) => return Err(Close::Eof),
            Ok(n) => {
                conn.wstart += n;
                sent = true;
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(sent),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(Close::Io(error)),
        }
    }
}

//! The store benchmark behind `cargo xtask bench store`: one Rust client load against our server and
//! against PyTorch's, side by side, in one run.
//!
//! Both servers run as separate processes on 127.0.0.1 (`pgstore serve`, and a Python `TCPStore` master);
//! the clients are this process's threads, one blocking `TcpStore` connection each, identical for both.
//! Results go to `<out>/store.json` and `<out>/store.md`.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use pg_store::{Store, TcpStore};

const TIMEOUT: Duration = Duration::from_secs(120);
const OPS: [&str; 4] = ["set", "get", "add", "wait-wakeup"];

/// Flags that say where things are rather than what is measured: the reproducing command leaves them out
/// (`cargo xtask bench store` finds the binaries and Python itself).
const LOCATIONS: [&str; 3] = ["--pgstore", "--python", "--out"];

struct Options {
    pgstore: String,
    python: Option<String>,
    out: String,
    clients: Vec<usize>,
    total_ops: usize,
    reps: usize,
    /// The operations to measure (default: all of [`OPS`]).
    only: Vec<&'static str>,
    /// `pgstore serve --threads` (default: pgstore's own default for this machine).
    pgstore_threads: Option<usize>,
    /// `pgstore serve --busy-poll-us` (default: pgstore's own default for this machine).
    pgstore_busy_poll_us: Option<u64>,
    /// `pgstore serve --coalesce-us` (default: pgstore's own default for this machine).
    pgstore_coalesce_us: Option<u64>,
    /// `pgstore serve --flood-rcvbuf-bytes` (default: 0, the kernel's autotuning).
    pgstore_flood_rcvbuf_bytes: u64,
    /// Whether servers and clients run on fixed CPUs (`--pin-cpus on`), see [`pin_server`].
    pin_cpus: bool,
    /// Whether every run opens its own client connections (closed after it; the default, `--fresh-connections
    /// on`), so that every run starts from the same TCP state and the runs are independent samples. With
    /// `--fresh-connections off`, one pool per server and client count serves all of its runs in turn: a run's
    /// place in the order is then its connections' age, and on a SET flood both servers slow down run after run
    /// as the clients' congestion control settles (`bench/results/store-session12/`), so that the median
    /// depends on how many runs were asked for.
    fresh_connections: bool,
}

/// The value of an `on|off` flag.
fn on_off(flag: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{flag} {other}: expected on or off")),
    }
}

/// One server's client connections, in the order they connected.
#[derive(Default)]
struct Pool {
    connections: Vec<Arc<TcpStore>>,
    /// Each connection's local port (0 where it could not be told), to find its TCP state after a run; told
    /// apart in `/proc/net/tcp` as the connection that was not there before; empty for more than
    /// [`MAX_TRACED_CLIENTS`] clients.
    local_ports: Vec<u16>,
}

/// The most clients whose connections are told apart (each connection reads `/proc/net/tcp` once) and whose
/// figures each run lists one by one.
const MAX_TRACED_CLIENTS: usize = 64;

/// `clients` new connections to the server on `port`.
fn connect_pool(port: u16, clients: usize) -> Pool {
    let connect = || Arc::new(TcpStore::connect("127.0.0.1", port, TIMEOUT).expect("connect to the server"));
    let mut pool = Pool::default();
    if clients > MAX_TRACED_CLIENTS {
        pool.connections = (0..clients).map(|_| connect()).collect();
        return pool;
    }
    let mut seen: Vec<u16> = client_sockets(port).iter().map(|socket| socket.local_port).collect();
    for _ in 0..clients {
        pool.connections.push(connect());
        let new: Vec<u16> =
            client_sockets(port).iter().map(|socket| socket.local_port).filter(|port| !seen.contains(port)).collect();
        pool.local_ports.push(match new[..] {
            [only] => only,
            _ => 0,
        });
        seen.extend(new);
    }
    pool
}

/// What `--help` prints; `cargo xtask bench store --help` says what each flag measures.
const USAGE: &str = "\
store_bench --pgstore PATH [--python PATH] [--out DIR] [--clients 1,8,64,1024] [--ops N] [--reps R]
            [--only set,get,add,wait-wakeup] [--pgstore-threads N] [--pgstore-busy-poll-us N]
            [--pgstore-coalesce-us N] [--pgstore-flood-rcvbuf-bytes N] [--pin-cpus on|off]
            [--fresh-connections on|off]

The driver behind `cargo xtask bench store` (which builds PATH and finds Python itself; its --help says what
each flag does). Client counts, operations per run and runs per configuration are at least 1.
";

/// The options in `args` (the command line after the program's name).
fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        pgstore: String::new(),
        python: None,
        out: "bench/results".into(),
        clients: vec![1, 8, 64, 1024],
        total_ops: 10_000,
        reps: 5,
        only: OPS.to_vec(),
        pgstore_threads: None,
        pgstore_busy_poll_us: None,
        pgstore_coalesce_us: None,
        pgstore_flood_rcvbuf_bytes: 0,
        pin_cpus: false,
        fresh_connections: true,
    };
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let mut value = || iter.next().cloned().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--pgstore" => options.pgstore = value()?,
            "--python" => options.python = Some(value()?),
            "--out" => options.out = value()?,
            "--clients" => {
                options.clients = value()?
                    .split(',')
                    .map(|n| n.trim().parse().map_err(|_| format!("--clients: bad number {n}")))
                    .collect::<Result<_, _>>()?
            }
            "--ops" => options.total_ops = value()?.parse().map_err(|_| "--ops: bad number".to_owned())?,
            "--reps" => options.reps = value()?.parse().map_err(|_| "--reps: bad number".to_owned())?,
            "--only" => {
                options.only = value()?
                    .split(',')
                    .map(|name| {
                        OPS.iter()
                            .copied()
                            .find(|op| *op == name.trim())
                            .ok_or_else(|| format!("--only: unknown operation {name:?} (one of {})", OPS.join(", ")))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--pgstore-threads" => {
                options.pgstore_threads =
                    Some(value()?.parse().map_err(|_| "--pgstore-threads: bad number".to_owned())?)
            }
            "--pgstore-busy-poll-us" => {
                options.pgstore_busy_poll_us =
                    Some(value()?.parse().map_err(|_| "--pgstore-busy-poll-us: bad number".to_owned())?)
            }
            "--fresh-connections" => options.fresh_connections = on_off(arg, &value()?)?,
            "--pin-cpus" => options.pin_cpus = on_off(arg, &value()?)?,
            "--pgstore-coalesce-us" => {
                options.pgstore_coalesce_us =
                    Some(value()?.parse().map_err(|_| "--pgstore-coalesce-us: bad number".to_owned())?)
            }
            "--pgstore-flood-rcvbuf-bytes" => {
                options.pgstore_flood_rcvbuf_bytes =
                    value()?.parse().map_err(|_| "--pgstore-flood-rcvbuf-bytes: bad number".to_owned())?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if options.pgstore.is_empty() {
        return Err("--pgstore PATH is required".into());
    }
    if options.clients.contains(&0) {
        return Err("--clients: every client count must be at least 1".into());
    }
    if options.total_ops == 0 {
        return Err("--ops: must be at least 1".into());
    }
    if options.reps == 0 {
        return Err("--reps: must be at least 1 (the results are medians over the runs)".into());
    }
    Ok(options)
}

/// A server process; dropping it ends the process.
struct ServerProcess {
    child: Child,
    port: u16,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Closing stdin ends the Python server; the Rust one is killed by its id.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(mut command: Command, marker: &str) -> Result<ServerProcess, String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).map_err(|e| e.to_string())?;
    let port = line
        .trim()
        .strip_prefix(marker)
        .and_then(|rest| rest.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .ok_or_else(|| format!("{command:?} did not announce a port: {line:?}"))?;
    Ok(ServerProcess { child, port })
}

const PYTORCH_SERVER: &str = r#"
import sys, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=600), wait_for_workers=False)
print("PORT 127.0.0.1:%d" % s.port, flush=True)
sys.stdin.read()
"#;

/// A server under test.
struct Server {
    name: &'static str,
    port: u16,
    pid: u32,
}

struct Measurement {
    server: &'static str,
    op: &'static str,
    clients: usize,
    ops: usize,
    seconds: f64,
    /// The throughput of each run, sorted.
    rates: Vec<f64>,
    /// The server process's CPU time (user and system) per operation, over all runs.
    server_cpu_us_per_op: f64,
    p50_us: f64,
    p99_us: f64,
    /// The mean latency: unlike the percentiles, it counts the rare long stalls (a client thread that loses
    /// its CPU), which decide the throughput of a fast operation.
    mean_us: f64,
    /// Per 1,000 operations: the client threads' sleeps and preemptions, and the server's threads' sleeps.
    client_sleeps_per_kop: f64,
    client_preemptions_per_kop: f64,
    server_sleeps_per_kop: f64,
    /// The slowest client's time over the mean client's, averaged over the runs.
    client_spread: f64,
    /// TCP segments the machine sent per operation (requests, replies and acknowledgements).
    segments_per_op: f64,
    /// The clients' congestion windows (packets) after the runs: median and largest, and the share still in
    /// their initial slow start (`/proc/net/tcp`; 0 where it cannot be read).
    client_cwnd_p50: u32,
    client_cwnd_max: u32,
    client_slow_start_share: f64,
    /// Every run, in the order they were made.
    runs: Vec<Run>,
}

/// One run of one server: what varies from run to run, to tell what a slow run had in common with others.
struct Run {
    ops_per_second: f64,
    /// Whether this server ran before the other one in this repetition.
    went_first: bool,
    segments_per_op: f64,
    mean_us: f64,
    client_spread: f64,
    /// Each client's time in seconds, in the order the clients connected (a server that deals connections out
    /// to its threads in turn gives client `i` to thread `(i + k) % threads`).
    client_seconds: Vec<f64>,
    /// The part of each client's time spent inside its timed operations, in the same order.
    client_op_seconds: Vec<f64>,
    /// Each client's TCP congestion window after the run, in the same order (0 where it was not found): a
    /// sender whose window grew sends more of its requests as segments of their own.
    client_cwnds: Vec<u32>,
}

/// What the runs of one server for one measurement add up to.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    rates: Vec<f64>,
    seconds: f64,
    ops: usize,
    cpu_ticks: u64,
    server_sleeps: u64,
    segments: u64,
    /// The client threads' context switches over the runs: sleeps and preemptions.
    client_sleeps: u64,
    client_preemptions: u64,
    /// The clients' congestion windows after each run, and whether each was in its initial slow start.
    cwnds: Vec<(u32, bool)>,
    runs: Vec<Run>,
}

impl Measurement {
    /// The median throughput of the runs.
    fn throughput(&self) -> f64 {
        self.rates.get(self.rates.len() / 2).copied().unwrap_or(0.0)
    }
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    let at = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(at).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// What the client threads of one run went through besides their latencies.
#[derive(Default)]
struct ClientCounts {
    /// Context switches of the client threads while they worked: voluntary ones are sleeps (a send that
    /// waited for buffer space, a reply that was not there yet), involuntary ones are preemptions.
    voluntary: u64,
    involuntary: u64,
    /// Each client's time in seconds, in client order.
    client_seconds: Vec<f64>,
    /// The part of each client's time spent inside its timed operations (for SET: sending, without the round
    /// trip that ends the run), in client order.
    client_op_seconds: Vec<f64>,
}

impl ClientCounts {
    /// The slowest client's time over the mean client's time (1.0: every client took as long).
    fn spread(&self) -> f64 {
        let total: f64 = self.client_seconds.iter().sum();
        let longest = self.client_seconds.iter().copied().fold(0.0, f64::max);
        match total > 0.0 {
            true => longest / (total / self.client_seconds.len() as f64),
            false => 1.0,
        }
    }
}

/// The calling thread's context switches so far (voluntary, involuntary), from `/proc/thread-self/status`.
fn thread_switches() -> (u64, u64) {
    switches_in(&std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default())
}

/// The context switches in the text of a `/proc/.../status` file.
fn switches_in(status: &str) -> (u64, u64) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("voluntary_ctxt_switches:"), field("nonvoluntary_ctxt_switches:"))
}

/// The voluntary context switches of every thread of process `pid` so far: how often its threads slept.
fn process_sleeps(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(Result::ok)
        .map(|task| switches_in(&std::fs::read_to_string(task.path().join("status")).unwrap_or_default()).0)
        .sum()
}

/// The TCP segments this machine has sent so far (data and acknowledgements), from `/proc/net/snmp`.
fn tcp_segments_sent() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut tcp = snmp.lines().filter(|line| line.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (tcp.next(), tcp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "OutSegs")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0)
}

/// The client side of an established TCP connection to a server, from `/proc/net/tcp`.
struct ClientSocket {
    local_port: u16,
    cwnd: u32,
    /// Whether the connection is still in its initial slow start (ssthresh shown as -1).
    slow_start: bool,
}

/// This machine's established IPv4 TCP connections to `port` (the clients' side), from `/proc/net/tcp`.
fn client_sockets(port: u16) -> Vec<ClientSocket> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl, local, remote, state, tx:rx, tr:when, retransmits, uid, timeout, inode, refcount, pointer,
            // rto, ato, quick/pingpong, snd_cwnd, ssthresh.
            let (Some(local), Some(rem), Some(&"01"), Some(cwnd), Some(ssthresh)) =
                (fields.get(1), fields.get(2), fields.get(3), fields.get(15), fields.get(16))
            else {
                return None;
            };
            if !rem.ends_with(&remote) {
                return None;
            }
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            Some(ClientSocket { local_port, cwnd: cwnd.parse().ok()?, slow_start: *ssthresh == "-1" })
        })
        .collect()
}

/// With `--pin-cpus on`, the servers' threads share the first `SERVER_CPUS` CPUs and client thread `i` runs
/// alone on CPU `SERVER_CPUS + i` (modulo the rest), so that every run places its threads the same way.
const SERVER_CPUS: usize = 4;
static PIN_CPUS: AtomicBool = AtomicBool::new(false);

fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn cpu_set(cpus: impl IntoIterator<Item = usize>) -> rustix::thread::CpuSet {
    let mut set = rustix::thread::CpuSet::new();
    for cpu in cpus {
        set.set(cpu);
    }
    set
}

/// Pins every thread of server process `pid` to the server CPUs (threads it starts later inherit that).
fn pin_server(pid: u32) {
    let set = cpu_set(0..SERVER_CPUS);
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    for task in tasks {
        let name = task.file_name();
        let Some(tid) = name.to_string_lossy().parse::<i32>().ok().and_then(rustix::process::Pid::from_raw) else {
            continue;
        };
        if let Err(error) = rustix::thread::sched_setaffinity(Some(tid), &set) {
            eprintln!("store_bench: cannot pin server {pid}'s thread {tid:?}: {error}");
        }
    }
}

/// Pins the calling client thread (the `index`-th client) to its CPU, when pinning is on.
fn pin_client(index: usize) {
    if PIN_CPUS.load(Ordering::Relaxed) {
        let cpu = SERVER_CPUS + index % (cpu_count() - SERVER_CPUS);
        if let Err(error) = rustix::thread::sched_setaffinity(None, &cpu_set([cpu])) {
            eprintln!("store_bench: cannot pin client {index} to CPU {cpu}: {error}");
        }
    }
}

/// Runs `work` on every client at once; returns every latency, the wall time from the first start to the
/// last end, and what the client threads went through.
fn drive<F>(clients: &[Arc<TcpStore>], work: F) -> (Vec<Duration>, f64, ClientCounts)
where
    F: Fn(usize, &TcpStore, &mut Vec<Duration>) + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let start_line = Arc::new(Barrier::new(clients.len()));
    let threads: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(index, client)| {
            let (client, work, start_line) = (Arc::clone(client), Arc::clone(&work), Arc::clone(&start_line));
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    pin_client(index);
                    let mut latencies = Vec::new();
                    start_line.wait();
                    let switches = thread_switches();
                    let start = Instant::now();
                    work(index, &client, &mut latencies);
                    let end = Instant::now();
                    let after = thread_switches();
                    (start, end, latencies, (after.0.saturating_sub(switches.0), after.1.saturating_sub(switches.1)))
                })
                .expect("spawn a client thread")
        })
        .collect();
    let mut all = Vec::new();
    let mut first = None::<Instant>;
    let mut last = None::<Instant>;
    let mut counts = ClientCounts::default();
    for thread in threads {
        let (start, end, latencies, (voluntary, involuntary)) = thread.join().expect("client thread");
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        counts.voluntary += voluntary;
        counts.involuntary += involuntary;
        counts.client_seconds.push((end - start).as_secs_f64());
        counts.client_op_seconds.push(latencies.iter().map(Duration::as_secs_f64).sum());
        all.extend(latencies);
    }
    let seconds = match (first, last) {
        (Some(first), Some(last)) => (last - first).as_secs_f64(),
        _ => 0.0,
    };
    (all, seconds, counts)
}

fn timed(latencies: &mut Vec<Duration>, op: impl FnOnce()) {
    let start = Instant::now();
    op();
    latencies.push(start.elapsed());
}

/// The mean of `latencies` in microseconds (0 for none).
fn mean_us(latencies: &[Duration]) -> f64 {
    latencies.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e6 / latencies.len().max(1) as f64
}

/// One run of one operation by every client; returns the latencies, the wall time and the operation count.
fn run_op(
    server: &str,
    op: &str,
    connections: &[Arc<TcpStore>],
    port: u16,
    per_client: usize,
) -> (Vec<Duration>, f64, usize, ClientCounts) {
    let clients = connections.len();
    let value = Arc::new(vec![b'v'; 64]);
    match op {
        "set" => {
            let (latencies, seconds, counts) = drive(connections, move |c, s, lat| {
                for i in 0..per_client {
                    timed(lat, || s.set(&format!("set/{c}/{}", i % 64), &value).expect("set"));
                }
                // SET has no reply: one round trip proves the server has handled every set.
                s.check(&["nothing"]).expect("check");
            });
            (latencies, seconds, clients * per_client, counts)
        }
        "get" => {
            for (c, s) in connections.iter().enumerate() {
                s.set(&format!("get/{c}"), &value).expect("set");
            }
            let (latencies, seconds, counts) = drive(connections, move |c, s, lat| {
                let key = format!("get/{c}");
                for _ in 0..per_client {
                    timed(lat, || assert_eq!(s.get(&key).expect("get").len(), 64));
                }
            });
            (latencies, seconds, clients * per_client, counts)
        }
        "add" => {
            let base = connections[0].add("add/counter", 0).expect("add");
            let (latencies, seconds, counts) = drive(connections, move |_, s, lat| {
                for _ in 0..per_client {
                    timed(lat, || {
                        s.add("add/counter", 1).expect("add");
                    });
                }
            });
            let total = connections[0].add("add/counter", 0).expect("add") - base;
            assert_eq!(total as usize, clients * per_client, "{server}: lost adds");
            (latencies, seconds, clients * per_client, counts)
        }
        _ => wait_wakeup(connections, port, clients),
    }
}

/// The CPU time a process has used so far (user plus system), in clock ticks, from `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) start at field 3; utime and stime are 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

/// Clock ticks per second for `/proc` CPU times.
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Measures every operation with `clients` clients on every server, the servers taking turns to go first, so that
/// both see the same background load; the throughput reported is the median of `reps` runs.
fn measure(servers: &[Server], options: &Options, clients: usize) -> Vec<Measurement> {
    let Options { only: ref ops, total_ops, reps, fresh_connections: fresh, .. } = *options;
    let per_client = (total_ops / clients).max(20);
    let ticks_per_second = clock_ticks();
    let pools: Vec<Pool> = match fresh {
        true => servers.iter().map(|_| Pool::default()).collect(),
        false => servers.iter().map(|server| connect_pool(server.port, clients)).collect(),
    };
    let mut results = Vec::new();
    for &op in ops {
        let mut tallies: Vec<Tally> = (0..servers.len()).map(|_| Tally::default()).collect();
        for rep in 0..reps {
            // The servers take turns going first, so that neither always runs on the heels of the other.
            let order: Vec<usize> = match rep % 2 {
                0 => (0..servers.len()).collect(),
                _ => (0..servers.len()).rev().collect(),
            };
            for (position, index) in order.into_iter().enumerate() {
                let Server { name: server, port, pid } = servers[index];
                let (cpu_before, sleeps_before, segments_before) =
                    (cpu_ticks(pid), process_sleeps(pid), tcp_segments_sent());
                // A SET has no reply and costs little: ten times as many make a run long enough to time.
                let count = if op == "set" { per_client * 10 } else { per_client };
                let own_pool;
                let pool = match fresh {
                    true => {
                        own_pool = connect_pool(port, clients);
                        &own_pool
                    }
                    false => &pools[index],
                };
                let (latencies, seconds, ops, counts) = run_op(server, op, &pool.connections, port, count);
                let sockets = client_sockets(port);
                let tally = &mut tallies[index];
                let segments = tcp_segments_sent().saturating_sub(segments_before);
                tally.cpu_ticks += cpu_ticks(pid).saturating_sub(cpu_before);
                tally.server_sleeps += process_sleeps(pid).saturating_sub(sleeps_before);
                tally.segments += segments;
                tally.client_sleeps += counts.voluntary;
                tally.client_preemptions += counts.involuntary;
                // Per-client figures of more clients would make the JSON megabytes long.
                let traced = clients <= MAX_TRACED_CLIENTS;
                let listed = |values: Vec<f64>| if traced { values } else { Vec::new() };
                tally.runs.push(Run {
                    ops_per_second: ops as f64 / seconds,
                    went_first: position == 0,
                    segments_per_op: segments as f64 / ops.max(1) as f64,
                    mean_us: mean_us(&latencies),
                    client_spread: counts.spread(),
                    client_seconds: listed(counts.client_seconds),
                    client_op_seconds: listed(counts.client_op_seconds),
                    client_cwnds: pool
                        .local_ports
                        .iter()
                        .map(|&local| {
                            sockets.iter().find(|s| s.local_port == local && local != 0).map_or(0, |s| s.cwnd)
                        })
                        .collect(),
                });
                tally.latencies.extend(latencies);
                tally.rates.push(ops as f64 / seconds);
                tally.seconds += seconds;
                tally.ops += ops;
                tally.cwnds.extend(sockets.iter().map(|socket| (socket.cwnd, socket.slow_start)));
            }
        }
        for (server, tally) in servers.iter().zip(tallies) {
            let Tally {
                mut latencies,
                mut rates,
                seconds,
                ops,
                cpu_ticks,
                server_sleeps,
                segments,
                client_sleeps,
                client_preemptions,
                mut cwnds,
                runs,
            } = tally;
            cwnds.sort_unstable();
            let in_slow_start = cwnds.iter().filter(|&&(_, slow)| slow).count();
            let server = server.name;
            latencies.sort_unstable();
            rates.sort_by(f64::total_cmp);
            let per_kop = |count: u64| count as f64 * 1000.0 / ops.max(1) as f64;
            let m = Measurement {
                server,
                op,
                clients,
                ops,
                seconds,
                rates,
                server_cpu_us_per_op: cpu_ticks as f64 / ticks_per_second * 1e6 / ops as f64,
                p50_us: percentile(&latencies, 50),
                p99_us: percentile(&latencies, 99),
                mean_us: mean_us(&latencies),
                client_sleeps_per_kop: per_kop(client_sleeps),
                client_preemptions_per_kop: per_kop(client_preemptions),
                client_spread: runs.iter().map(|run| run.client_spread).sum::<f64>() / runs.len().max(1) as f64,
                server_sleeps_per_kop: per_kop(server_sleeps),
                segments_per_op: segments as f64 / ops.max(1) as f64,
                client_cwnd_p50: cwnds.get(cwnds.len() / 2).map_or(0, |&(cwnd, _)| cwnd),
                client_cwnd_max: cwnds.last().map_or(0, |&(cwnd, _)| cwnd),
                client_slow_start_share: in_slow_start as f64 / cwnds.len().max(1) as f64,
                runs,
            };
            eprintln!(
                "{server:>8} {op:>11} clients={clients:<5} ops={ops:<6} {:>10.0} ops/s (median of {reps})  p50 {:>8.1} us  p99 {:>8.1} us  mean {:>8.2} us  server CPU {:>6.2} us/op  per 1k ops: client sleeps {:.1}, preemptions {:.1}, server sleeps {:.1}; spread {:.2}; segments/op {:.2}; client cwnd p50 {} max {}",
                m.throughput(),
                m.p50_us,
                m.p99_us,
                m.mean_us,
                m.server_cpu_us_per_op,
                m.client_sleeps_per_kop,
                m.client_preemptions_per_kop,
                m.server_sleeps_per_kop,
                m.client_spread,
                m.segments_per_op,
                m.client_cwnd_p50,
                m.client_cwnd_max
            );
            results.push(m);
        }
    }
    results
}

/// Every client waits for a key that one setter sets; latency is from the moment the set is sent to the
/// moment each waiter's `wait` returns.
fn wait_wakeup(connections: &[Arc<TcpStore>], port: u16, clients: usize) -> (Vec<Duration>, f64, usize, ClientCounts) {
    let rounds = (2000 / clients).max(10);
    let setter = TcpStore::connect("127.0.0.1", port, TIMEOUT).expect("setter connects");
    let stamp = format!("{:?}", Instant::now());
    let set_at: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; rounds]));
    let seen = Arc::clone(&set_at);
    let stamp_for_waiters = stamp.clone();
    let run = std::thread::spawn({
        let connections = connections.to_vec();
        move || {
            drive(&connections, move |_, s, lat| {
                for round in 0..rounds {
                    let ready = format!("ww/{stamp_for_waiters}/ready/{round}");
                    if s.add(&ready, 1).expect("add") == clients as i64 {
                        s.set(&format!("{ready}/all"), b"1").expect("set");
                    }
                    s.wait(&[&format!("ww/{stamp_for_waiters}/go/{round}")], None).expect("wait");
                    let returned = Instant::now();
                    let sent = seen.lock().unwrap()[round].expect("the set time is stored before the set");
                    lat.push(returned.saturating_duration_since(sent));
                }
            })
        }
    });
    for round in 0..rounds {
        setter.wait(&[&format!("ww/{stamp}/ready/{round}/all")], None).expect("everyone is ready");
        set_at.lock().unwrap()[round] = Some(Instant::now());
        setter.set(&format!("ww/{stamp}/go/{round}"), b"1").expect("set");
    }
    let (latencies, seconds, counts) = run.join().expect("waiters");
    (latencies, seconds, clients * rounds, counts)
}

/// The items of a JSON array of numbers, each written by `format`.
fn json_numbers<T>(values: &[T], format: impl Fn(&T) -> String) -> String {
    values.iter().map(format).collect::<Vec<_>>().join(", ")
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({cpu}), Linux {}", kernel.trim())
}

fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "-h" || arg == "--help") {
        print!("{USAGE}");
        return;
    }
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("store_bench: {message}");
            std::process::exit(2);
        }
    };
    let ours = start(
        {
            let mut c = Command::new(&options.pgstore);
            c.args(["serve", "--host", "127.0.0.1", "--port", "0"]);
            if let Some(threads) = options.pgstore_threads {
                c.args(["--threads", &threads.to_string()]);
            }
            if let Some(micros) = options.pgstore_busy_poll_us {
                c.args(["--busy-poll-us", &micros.to_string()]);
            }
            if let Some(micros) = options.pgstore_coalesce_us {
                c.args(["--coalesce-us", &micros.to_string()]);
            }
            if options.pgstore_flood_rcvbuf_bytes > 0 {
                c.args(["--flood-rcvbuf-bytes", &options.pgstore_flood_rcvbuf_bytes.to_string()]);
            }
            c
        },
        "pgstore: listening on ",
    )
    .expect("pgstore serve starts");
    let (theirs, torch_version) = match &options.python {
        Some(python) => {
            let version = Command::new(python)
                .args(["-W", "ignore", "-c", "import torch; print(torch.__version__)"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            let mut c = Command::new(python);
            c.args(["-W", "ignore", "-u", "-c", PYTORCH_SERVER]);
            (Some(start(c, "PORT ").expect("PyTorch's TCPStore server starts")), Some(version))
        }
        None => (None, None),
    };
    let mut servers = vec![Server { name: "pg-store", port: ours.port, pid: ours.child.id() }];
    if let Some(theirs) = &theirs {
        servers.push(Server { name: "pytorch", port: theirs.port, pid: theirs.child.id() });
    }
    if options.pin_cpus {
        if cpu_count() > SERVER_CPUS {
            servers.iter().for_each(|server| pin_server(server.pid));
            PIN_CPUS.store(true, Ordering::Relaxed);
        } else {
            eprintln!("store_bench: --pin-cpus needs more than {SERVER_CPUS} CPUs; running unpinned");
        }
    }
    let mut results = Vec::new();
    for &clients in &options.clients {
        results.extend(measure(&servers, &options, clients));
    }
    drop(ours);
    drop(theirs);

    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let machine = machine();
    // SET floods depend on the host's congestion control (`pg_store::tcp::threads_for` says how).
    let congestion = pg_store::tcp::host_congestion_control().unwrap_or_else(|| "unknown".into());
    let pytorch = torch_version
        .clone()
        .map_or("not measured (no Python with torch)".to_owned(), |v| format!("torch {v}, libuv TCPStore server"));
    // Every measuring flag, so that the command shown reproduces this run.
    let mut command = "cargo xtask bench store".to_owned();
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        if let [flag, value] = pair {
            if !LOCATIONS.contains(&flag.as_str()) {
                let _ = write!(command, " {flag} {value}");
            }
        }
    }

    let mut json = String::new();
    let _ = writeln!(json, "{{");
    let _ = writeln!(json, "  \"command\": {},", json_string(&command));
    let _ = writeln!(json, "  \"date\": {},", json_string(&date));
    let _ = writeln!(json, "  \"machine\": {},", json_string(&machine));
    let _ = writeln!(json, "  \"tcp_congestion_control\": {},", json_string(&congestion));
    let _ = writeln!(json, "  \"pytorch\": {},", json_string(&pytorch));
    let _ = writeln!(json, "  \"client\": \"pg-store TcpStore (Rust), one blocking connection per client thread, identical for both servers\",");
    let busy_poll_us =
        options.pgstore_busy_poll_us.map_or_else(|| pg_store::tcp::default_busy_poll().as_micros(), u128::from);
    let threads = options.pgstore_threads.unwrap_or_else(pg_store::tcp::default_threads);
    let _ = writeln!(json, "  \"pgstore_busy_poll_us\": {busy_poll_us},");
    let _ = writeln!(json, "  \"pgstore_threads\": {threads},");
    let coalesce_us =
        options.pgstore_coalesce_us.map_or_else(|| pg_store::tcp::default_coalesce().as_micros(), u128::from);
    let _ = writeln!(json, "  \"pgstore_coalesce_us\": {coalesce_us},");
    let _ = writeln!(json, "  \"pgstore_flood_rcvbuf_bytes\": {},", options.pgstore_flood_rcvbuf_bytes);
    let pinned = PIN_CPUS.load(Ordering::Relaxed);
    let _ = writeln!(json, "  \"pin_cpus\": {pinned},");
    let fresh = options.fresh_connections;
    let _ = writeln!(json, "  \"fresh_connections\": {fresh},");
    let _ = writeln!(json, "  \"results\": [");
    for (i, m) in results.iter().enumerate() {
        let _ = writeln!(
            json,
            "    {{\"server\": {}, \"op\": {}, \"clients\": {}, \"ops\": {}, \"seconds\": {:.6}, \"ops_per_second\": {:.1}, \"runs_ops_per_second\": [{}], \"server_cpu_us_per_op\": {:.3}, \"p50_us\": {:.2}, \"p99_us\": {:.2}, \"mean_us\": {:.3}, \"client_sleeps_per_kop\": {:.2}, \"client_preemptions_per_kop\": {:.2}, \"client_spread\": {:.3}, \"server_sleeps_per_kop\": {:.2}, \"segments_per_op\": {:.3}, \"client_cwnd_p50\": {}, \"client_cwnd_max\": {}, \"client_slow_start_share\": {:.2}, \"runs\": [{}]}}{}",
            json_string(m.server),
            json_string(m.op),
            m.clients,
            m.ops,
            m.seconds,
            m.throughput(),
            json_numbers(&m.rates, |r| format!("{r:.1}")),
            m.server_cpu_us_per_op,
            m.p50_us,
            m.p99_us,
            m.mean_us,
            m.client_sleeps_per_kop,
            m.client_preemptions_per_kop,
            m.client_spread,
            m.server_sleeps_per_kop,
            m.segments_per_op,
            m.client_cwnd_p50,
            m.client_cwnd_max,
            m.client_slow_start_share,
            m.runs
                .iter()
                .map(|run| format!(
                    "{{\"ops_per_second\": {:.1}, \"went_first\": {}, \"segments_per_op\": {:.3}, \"mean_us\": {:.3}, \"client_spread\": {:.3}, \"client_seconds\": [{}], \"client_op_seconds\": [{}], \"client_cwnds\": [{}]}}",
                    run.ops_per_second,
                    run.went_first,
                    run.segments_per_op,
                    run.mean_us,
                    run.client_spread,
                    json_numbers(&run.client_seconds, |s| format!("{s:.6}")),
                    json_numbers(&run.client_op_seconds, |s| format!("{s:.6}")),
                    json_numbers(&run.client_cwnds, u32::to_string)
                ))
                .collect::<Vec<_>>()
                .join(", "),
            if i + 1 < results.len() { "," } else { "" }
        );
    }
    let _ = writeln!(json, "  ]");
    let _ = writeln!(json, "}}");

    let mut md = String::new();
    let _ = writeln!(md, "# TCP store benchmark\n");
    let _ = writeln!(md, "- Command: `{command}`");
    let _ = writeln!(md, "- Date: {date}");
    let _ = writeln!(md, "- Machine: {machine}; TCP congestion control: {congestion}");
    let _ = writeln!(md, "- PyTorch: {pytorch}");
    let _ =
        writeln!(md, "- Servers: `pgstore serve` and a Python `TCPStore` master, each its own process on 127.0.0.1.");
    let _ = writeln!(
        md,
        "- pgstore's busy polling after each burst of requests: {busy_poll_us} us (its default on this machine: 50 us with 4 or more CPUs, else off)."
    );
    let _ = writeln!(
        md,
        "- pgstore's event-loop threads: {threads} (its default on this machine: {}, one per 8 CPUs from 1 to 2 where the TCP congestion control is bbr, else 1; PyTorch's libuv server has one).",
        pg_store::tcp::default_threads()
    );
    let _ = writeln!(
        md,
        "- pgstore's receive coalescing of SET streams: {coalesce_us} us (`--coalesce-us`; its default on this machine: {} us, 200 with 4 or more CPUs, else off).",
        pg_store::tcp::default_coalesce().as_micros()
    );
    if options.pgstore_flood_rcvbuf_bytes > 0 {
        let _ = writeln!(
            md,
            "- pgstore's fixed receive buffer for flooding connections: {} bytes (`--flood-rcvbuf-bytes`; its default: 0, the kernel's autotuning).",
            options.pgstore_flood_rcvbuf_bytes
        );
    }
    let _ = writeln!(
        md,
        "- Client connections: {}.",
        if fresh {
            "new ones for every run (`--fresh-connections on`), so that every run starts from the same TCP state"
        } else {
            "one pool per server and client count, used by all of its runs in turn (a run's place in the order is its connections' age)"
        }
    );
    if pinned {
        let _ = writeln!(
            md,
            "- CPUs pinned (`--pin-cpus on`): both servers' threads on CPUs 0-{}, client thread i alone on CPU {} + i (modulo the rest).",
            SERVER_CPUS - 1,
            SERVER_CPUS
        );
    }
    let _ = writeln!(
        md,
        "- Runs: {} per configuration, the servers taking turns to go first; ops/s is the median run, latencies are over all runs, server CPU is the server process's user+system time (from /proc) per operation over all runs, a figure that background load disturbs less than wall time (it counts busy polling too); TCP segments/op are the machine's sent segments (requests, replies, acknowledgements; `/proc/net/snmp`) per operation, which show how many SETs a sender's segment carries; the JSON adds the mean latency, the clients' sleeps and preemptions and the server's sleeps per 1,000 operations, the slowest client's time over the mean, the clients' TCP congestion windows after the runs (`/proc/net/tcp`), and every run in order (`runs`: its throughput, which server went first, segments per operation, mean latency, spread, and each client's time, the part of it inside the timed operations, and its TCP congestion window after the run, in the order the clients connected, for up to {} clients); {} operations per run (at least 20 per client; ten times as many for `set`).",
        options.reps, MAX_TRACED_CLIENTS, options.total_ops
    );
    let _ = writeln!(md, "- Clients: pg-store's Rust `TcpStore`, one blocking connection per client thread, the same for both servers, in one process that shares the machine with the servers.");
    let _ = writeln!(md, "- `set`: SET has no reply, so its latency is the client's send time; its throughput includes one closing round trip per client. `get` is WAIT then GET (two round trips), as PyTorch's client does. `add`: every client adds to one counter (checked exact). `wait-wakeup`: every client waits on one key that another client sets; latency runs from the moment the set is sent to each `wait` returning (a waiter whose WAIT reaches the server after the set is answered at once).\n");
    let _ = writeln!(
        md,
        "| op | clients | pg-store ops/s | PyTorch ops/s | pg-store p50 / p99 (µs) | PyTorch p50 / p99 (µs) | server CPU µs/op, pg-store / PyTorch | TCP segments/op, pg-store / PyTorch |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &op in &options.only {
        for &clients in &options.clients {
            let find = |server: &str| results.iter().find(|m| m.server == server && m.op == op && m.clients == clients);
            let ours = find("pg-store");
            let theirs = find("pytorch");
            let rate = |m: Option<&Measurement>| m.map_or("-".to_owned(), |m| format!("{:.0}", m.throughput()));
            let cpu = |m: Option<&Measurement>| m.map_or("-".to_owned(), |m| format!("{:.2}", m.server_cpu_us_per_op));
            let segments = |m: Option<&Measurement>| m.map_or("-".to_owned(), |m| format!("{:.2}", m.segments_per_op));
            let lat =
                |m: Option<&Measurement>| m.map_or("-".to_owned(), |m| format!("{:.1} / {:.1}", m.p50_us, m.p99_us));
            let _ = writeln!(
                md,
                "| {op} | {clients} | {} | {} | {} | {} | {} / {} | {} / {} |",
                rate(ours),
                rate(theirs),
                lat(ours),
                lat(theirs),
                cpu(ours),
                cpu(theirs),
                segments(ours),
                segments(theirs)
            );
        }
    }
    std::fs::create_dir_all(&options.out).expect("create the results directory");
    let json_path = format!("{}/store.json", options.out);
    let md_path = format!("{}/store.md", options.out);
    std::fs::File::create(&json_path).and_then(|mut f| f.write_all(json.as_bytes())).expect("write JSON");
    std::fs::File::create(&md_path).and_then(|mut f| f.write_all(md.as_bytes())).expect("write Markdown");
    print!("{md}");
    eprintln!("wrote {json_path} and {md_path}");
}

#[cfg(test)]
mod tests {
    use super::parse;

    /// Parses `command` (the flags after `--pgstore p`) and checks the error, or `Ok` for none.
    fn check(command: &str, expected: Result<(), &str>) {
        let args: Vec<String> =
            ["--pgstore", "p"].into_iter().chain(command.split_whitespace()).map(String::from).collect();
        assert_eq!(
            parse(&args).map(|_| ()).map_err(|message| message.split(':').next().unwrap().to_owned()),
            expected.map_err(String::from),
            "{command}"
        );
    }

    #[test]
    fn flags_out_of_range_are_refused_by_name() {
        check("", Ok(()));
        check("--clients 1,8 --ops 1 --reps 1", Ok(()));
        check("--clients 0", Err("--clients"));
        check("--clients 8,0", Err("--clients"));
        check("--clients 8,x", Err("--clients"));
        check("--ops 0", Err("--ops"));
        check("--reps 0", Err("--reps"));
        check("--only put", Err("--only"));
        check("--pin-cpus yes", Err("--pin-cpus yes"));
        check("--reps", Err("--reps needs a value"));
        check("--nonsense 1", Err("unknown argument --nonsense"));
    }

    #[test]
    fn the_server_binary_is_required() {
        assert_eq!(parse(&[]).err().as_deref(), Some("--pgstore PATH is required"));
    }
}

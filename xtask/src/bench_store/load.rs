//! The comparison's load: the two servers as processes, client threads driving one operation at a time, and
//! the figures of each configuration.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use pg_store::{Store, TcpStore};

use super::Options;

const TIMEOUT: Duration = Duration::from_secs(120);

/// PyTorch's TCPStore master, printing its port and serving until its stdin closes.
const PYTORCH_SERVER: &str = r#"
import sys, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=600), wait_for_workers=False)
print("PORT 127.0.0.1:%d" % s.port, flush=True)
sys.stdin.read()
"#;

/// A server process; dropping it ends the process.
pub struct ServerProcess {
    child: Child,
    pub port: u16,
}

impl ServerProcess {
    /// Starts `command` and reads the port from its first line of output, which starts with `marker`.
    pub fn start(mut command: Command, marker: &str) -> Result<Self, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {command:?}: {e}"))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
        let port = line
            .trim()
            .strip_prefix(marker)
            .and_then(|rest| rest.rsplit(':').next())
            .and_then(|port| port.parse().ok());
        match port {
            Some(port) => Ok(Self { child, port }),
            None => Err(format!("{command:?} did not announce a port: {line:?}")),
        }
    }

    /// `pgstore serve` on a free port of 127.0.0.1 with `flags`.
    pub fn pgstore(path: &Path, flags: &[(&str, String)]) -> Result<Self, String> {
        let mut command = Command::new(path);
        command.args(["serve", "--host", "127.0.0.1", "--port", "0"]);
        for (flag, value) in flags {
            command.args([flag, value.as_str()]);
        }
        Self::start(command, "pgstore: listening on ")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Closing stdin ends the Python server; pgstore is killed.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The figures of one server, operation and client count over all its runs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measurement {
    pub server: &'static str,
    pub op: &'static str,
    pub clients: usize,
    /// Operations over all runs.
    pub ops: usize,
    /// The median run's throughput.
    pub ops_per_second: f64,
    /// Every run's throughput, sorted.
    pub runs_ops_per_second: Vec<f64>,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// What [`measure_all`] found.
pub struct Measured {
    pub results: Vec<Measurement>,
    /// The PyTorch version measured, if any.
    pub torch: Option<String>,
}

/// Starts the servers and measures every operation and client count of `options`.
pub fn measure_all(pgstore: &Path, python: Option<&str>, options: &Options) -> Result<Measured, String> {
    let ours = ServerProcess::pgstore(pgstore, &options.pgstore_flags)?;
    let mut servers = vec![("pg-store", ours)];
    let mut torch = None;
    if let Some(python) = python {
        let version = Command::new(python)
            .args(["-W", "ignore", "-c", "import torch; print(torch.__version__)"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let mut command = Command::new(python);
        command.args(["-W", "ignore", "-u", "-c", PYTORCH_SERVER]);
        servers.push(("pytorch", ServerProcess::start(command, "PORT ")?));
        torch = Some(version);
    }
    let mut results = Vec::new();
    for &clients in &options.clients {
        for &op in &options.only {
            results.extend(measure(&servers, op, clients, options));
        }
    }
    Ok(Measured { results, torch })
}

/// Measures `op` with `clients` clients on every server, `options.reps` times each, the servers taking turns
/// to go first so that both see the same background load.
fn measure(
    servers: &[(&'static str, ServerProcess)],
    op: &'static str,
    clients: usize,
    options: &Options,
) -> Vec<Measurement> {
    let per_client = (options.ops / clients).max(20);
    // A SET has no reply and costs little: ten times as many make a run long enough to time.
    let per_client = if op == "set" { per_client * 10 } else { per_client };
    let mut tallies: Vec<(Vec<Duration>, Vec<f64>, usize)> = servers.iter().map(|_| Default::default()).collect();
    for rep in 0..options.reps {
        let mut order: Vec<usize> = (0..servers.len()).collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        for index in order {
            // New connections for every run, so that every run starts from the same TCP state.
            let port = servers[index].1.port;
            let connections: Vec<Arc<TcpStore>> = (0..clients)
                .map(|_| TcpStore::connect("127.0.0.1", port, TIMEOUT).map(Arc::new))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("connecting to {}: {e}", servers[index].0));
            let (latencies, seconds, ops) = run_op(op, &connections, port, per_client);
            let (all, rates, total) = &mut tallies[index];
            all.extend(latencies);
            rates.push(ops as f64 / seconds);
            *total += ops;
        }
    }
    servers
        .iter()
        .zip(tallies)
        .map(|((server, _), (mut latencies, mut rates, ops))| {
            latencies.sort_unstable();
            rates.sort_by(f64::total_cmp);
            let m = Measurement {
                server,
                op,
                clients,
                ops,
                ops_per_second: rates[rates.len() / 2],
                runs_ops_per_second: rates,
                p50_us: percentile(&latencies, 50),
                p99_us: percentile(&latencies, 99),
            };
            eprintln!(
                "{server:>8} {op:>11} clients={clients:<5} {:>10.0} ops/s  p50 {:>8.1} us  p99 {:>8.1} us",
                m.ops_per_second, m.p50_us, m.p99_us
            );
            m
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    let at = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(at).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Runs `work` on every client at once, each on its own thread; returns every latency it recorded and the
/// wall time from the first start to the last end.
fn drive<F>(clients: &[Arc<TcpStore>], work: F) -> (Vec<Duration>, f64)
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
                    let mut latencies = Vec::new();
                    start_line.wait();
                    let start = Instant::now();
                    work(index, &client, &mut latencies);
                    (start, Instant::now(), latencies)
                })
                .expect("spawn a client thread")
        })
        .collect();
    let mut all = Vec::new();
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for thread in threads {
        let (start, end, latencies) = thread.join().expect("a client thread panicked");
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        all.extend(latencies);
    }
    let seconds = match (first, last) {
        (Some(first), Some(last)) => (last - first).as_secs_f64(),
        _ => 0.0,
    };
    (all, seconds)
}

fn timed(latencies: &mut Vec<Duration>, op: impl FnOnce()) {
    let start = Instant::now();
    op();
    latencies.push(start.elapsed());
}

/// One run of `op` by every client; returns the latencies, the wall time and the operation count.
fn run_op(op: &str, connections: &[Arc<TcpStore>], port: u16, per_client: usize) -> (Vec<Duration>, f64, usize) {
    let clients = connections.len();
    let value = Arc::new(vec![b'v'; 64]);
    let (latencies, seconds) = match op {
        "set" => drive(connections, move |c, s, lat| {
            for i in 0..per_client {
                timed(lat, || s.set(&format!("set/{c}/{}", i % 64), &value).expect("set"));
            }
            // SET has no reply: one round trip shows that the server has handled every set.
            s.check(&["nothing"]).expect("check");
        }),
        "get" => {
            for (c, s) in connections.iter().enumerate() {
                s.set(&format!("get/{c}"), &value).expect("set");
            }
            drive(connections, move |c, s, lat| {
                let key = format!("get/{c}");
                for _ in 0..per_client {
                    timed(lat, || assert_eq!(s.get(&key).expect("get").len(), 64));
                }
            })
        }
        "add" => {
            let base = connections[0].add("add/counter", 0).expect("add");
            let result = drive(connections, move |_, s, lat| {
                for _ in 0..per_client {
                    timed(lat, || {
                        s.add("add/counter", 1).expect("add");
                    });
                }
            });
            let total = connections[0].add("add/counter", 0).expect("add") - base;
            assert_eq!(total as usize, clients * per_client, "lost adds");
            result
        }
        _ => return wait_wakeup(connections, port),
    };
    (latencies, seconds, clients * per_client)
}

/// Every client waits for a key that one more client sets; a latency runs from the moment the set is sent to
/// the moment a waiter's `wait` returns.
fn wait_wakeup(connections: &[Arc<TcpStore>], port: u16) -> (Vec<Duration>, f64, usize) {
    let clients = connections.len();
    let rounds = (2000 / clients).max(10);
    let setter = TcpStore::connect("127.0.0.1", port, TIMEOUT).expect("the setter connects");
    // Keys unique to this run: the server keeps those of earlier runs.
    let run = format!("{:?}", Instant::now());
    let set_at: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; rounds]));
    let waiters = std::thread::spawn({
        let (connections, set_at, run) = (connections.to_vec(), Arc::clone(&set_at), run.clone());
        move || {
            drive(&connections, move |_, s, lat| {
                for round in 0..rounds {
                    let ready = format!("ww/{run}/ready/{round}");
                    if s.add(&ready, 1).expect("add") == clients as i64 {
                        s.set(&format!("{ready}/all"), b"1").expect("set");
                    }
                    s.wait(&[&format!("ww/{run}/go/{round}")], None).expect("wait");
                    let returned = Instant::now();
                    let sent = set_at.lock().unwrap()[round].expect("the set time is stored before the set");
                    lat.push(returned.saturating_duration_since(sent));
                }
            })
        }
    });
    for round in 0..rounds {
        setter.wait(&[&format!("ww/{run}/ready/{round}/all")], None).expect("everyone is ready");
        set_at.lock().unwrap()[round] = Some(Instant::now());
        setter.set(&format!("ww/{run}/go/{round}"), b"1").expect("set");
    }
    let (latencies, seconds) = waiters.join().expect("a waiter panicked");
    (latencies, seconds, clients * rounds)
}

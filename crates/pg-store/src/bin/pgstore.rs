//! `pgstore`: serve a TCP store, or talk to a live one (PyTorch's or ours) from the shell.

use std::process::ExitCode;
use std::time::Duration;

use pg_store::{ServerOptions, Store, StoreError, TcpStore, TcpStoreServer, DEFAULT_PORT};

/// The `serve` usage line, shared by the help text and the error for a malformed `serve`.
macro_rules! serve_usage {
    () => {
        "pgstore serve [--host H] [--port P] [--busy-poll-us N] [--threads N] [--coalesce-us N]"
    };
}

const HELP: &str = concat!(
    "\
pgstore: a TCP store (wire-compatible with PyTorch's TCPStore) and a client for a live one

Usage:
  ",
    serve_usage!(),
    "
                                           run a server until stopped (port 0 picks a free one); after
                                           each burst of requests it polls N us before sleeping, which
                                           answers the next request without a wake-up (default 50 on a
                                           machine with 4 or more CPUs, else 0: never); N event-loop
                                           threads serve the connections (default one per 8 CPUs,
                                           1 to 2, where the host's TCP congestion control is bbr,
                                           else 1; PyTorch's server has one); --coalesce-us N reads a
                                           flood of SETs N us late, many at a time (default 200
                                           on a machine with 4 or more CPUs, else 0: off). Refused
                                           connections are logged on stderr with the peer and the
                                           reason (RUST_LOG sets the level; default warn)
  pgstore [--addr HOST:PORT] [--timeout S] <command>

Commands (keys are the user keys PyTorch's clients see; they go over the wire with a leading '/'):
  ping                  check that the server answers (VALIDATE, then PING)
  set K V               set K to the text V
  get K                 print K's value, waiting for it up to the timeout
  add K N               add N to the counter K and print the sum
  check K...            print 'ready' (exit 0) when every K exists, else 'not ready' (exit 1)
  wait K...             wait until every K exists, up to the timeout
  del K                 delete K; print 'deleted' or 'absent'
  num-keys              print the number of keys, the init/ worker counter included
  list                  print every key, one a line

Options:
  --addr HOST:PORT      the server (default 127.0.0.1:29500)
  --timeout S           seconds for connecting and waiting (default 300; 0 waits forever)

Values and keys that are not printable UTF-8 text are printed with \\xNN escapes.
",
);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("pgstore: {message}");
            ExitCode::from(2)
        }
    }
}

/// Splits `--name value` options from the positional arguments.
struct Args {
    positional: Vec<String>,
    /// `-h` or `--help` anywhere on the line.
    help: bool,
    addr: Option<String>,
    timeout: Option<String>,
    host: Option<String>,
    port: Option<String>,
    busy_poll_us: Option<String>,
    threads: Option<String>,
    coalesce_us: Option<String>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        positional: Vec::new(),
        help: false,
        addr: None,
        timeout: None,
        host: None,
        port: None,
        busy_poll_us: None,
        threads: None,
        coalesce_us: None,
    };
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let slot = match arg.as_str() {
            "--addr" => &mut parsed.addr,
            "--timeout" => &mut parsed.timeout,
            "--host" => &mut parsed.host,
            "--port" => &mut parsed.port,
            "--busy-poll-us" => &mut parsed.busy_poll_us,
            "--threads" => &mut parsed.threads,
            "--coalesce-us" => &mut parsed.coalesce_us,
            "--" => {
                parsed.positional.extend(iter.by_ref().cloned());
                break;
            }
            "-h" | "--help" => {
                parsed.help = true;
                continue;
            }
            option if option.starts_with("--") => return Err(format!("unknown option {option}\n\n{HELP}")),
            _ => {
                parsed.positional.push(arg.clone());
                continue;
            }
        };
        *slot = Some(iter.next().ok_or_else(|| format!("{arg} needs a value"))?.clone());
    }
    Ok(parsed)
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let args = parse_args(args)?;
    let Some((command, rest)) = args.positional.split_first() else {
        print!("{HELP}");
        return Ok(ExitCode::SUCCESS);
    };
    if args.help || command == "help" {
        print!("{HELP}");
        return Ok(ExitCode::SUCCESS);
    }
    if command == "serve" {
        return serve(&args);
    }
    let timeout = match &args.timeout {
        None => Duration::from_secs(300),
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| format!("--timeout {text}: expected a number of seconds"))?,
    };
    let addr = args.addr.clone().unwrap_or_else(|| format!("127.0.0.1:{DEFAULT_PORT}"));
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("--addr {addr}: expected HOST:PORT"))?;
    let port: u16 = port.parse().map_err(|_| format!("--addr {addr}: bad port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let arity = |n: usize, usage: &str| match rest.len() == n {
        true => Ok(()),
        false => Err(format!("usage: pgstore {usage}")),
    };
    let at_least_one = |usage: &str| match rest.is_empty() {
        true => Err(format!("usage: pgstore {usage}")),
        false => Ok(()),
    };
    match command.as_str() {
        "ping" | "set" | "get" | "add" | "check" | "wait" | "del" | "num-keys" | "list" => {}
        other => return Err(format!("unknown command '{other}'\n\n{HELP}")),
    }
    let store = TcpStore::connect(host, port, timeout).map_err(|e| e.to_string())?;
    let failed = |e: StoreError| e.to_string();
    let keys: Vec<&str> = rest.iter().map(String::as_str).collect();
    match command.as_str() {
        "ping" => {
            arity(0, "ping")?;
            store.ping().map_err(failed)?;
            println!("pong from {host}:{port}");
        }
        "set" => {
            arity(2, "set K V")?;
            store.set(&rest[0], rest[1].as_bytes()).map_err(failed)?;
            // SET has no reply: a round trip after it shows that the server took it and kept the connection.
            store.ping().map_err(|e| format!("the server did not accept the SET: {e}"))?;
        }
        "get" => {
            arity(1, "get K")?;
            println!("{}", printable(&store.get(&rest[0]).map_err(failed)?));
        }
        "add" => {
            arity(2, "add K N")?;
            let delta: i64 = rest[1].parse().map_err(|_| format!("add: {} is not an integer", rest[1]))?;
            println!("{}", store.add(&rest[0], delta).map_err(failed)?);
        }
        "check" => {
            at_least_one("check K...")?;
            let ready = store.check(&keys).map_err(failed)?;
            println!("{}", if ready { "ready" } else { "not ready" });
            if !ready {
                return Ok(ExitCode::from(1));
            }
        }
        "wait" => {
            at_least_one("wait K... [--timeout S]")?;
            store.wait(&keys, Some(timeout)).map_err(failed)?;
            println!("ready");
        }
        "del" => {
            arity(1, "del K")?;
            println!("{}", if store.delete_key(&rest[0]).map_err(failed)? { "deleted" } else { "absent" });
        }
        "num-keys" => {
            arity(0, "num-keys")?;
            println!("{}", store.num_keys().map_err(failed)?);
        }
        "list" => {
            arity(0, "list")?;
            let mut keys = store.list_raw_keys().map_err(failed)?;
            keys.sort();
            for key in keys {
                // User keys carry the client's '/' prefix; others (init/) are shown raw.
                println!("{}", printable(key.strip_prefix(b"/").unwrap_or(&key)));
            }
        }
        _ => unreachable!("commands were checked above"),
    }
    Ok(ExitCode::SUCCESS)
}

fn serve(args: &Args) -> Result<ExitCode, String> {
    if args.positional.len() != 1 {
        return Err(concat!("usage: ", serve_usage!()).into());
    }
    let port = match &args.port {
        None => DEFAULT_PORT,
        Some(text) => text.parse().map_err(|_| format!("--port {text}: expected 0..=65535"))?,
    };
    // Options not given keep the server's own defaults for this machine.
    let mut options = ServerOptions { host: args.host.clone(), port, ..ServerOptions::default() };
    if let Some(text) = &args.busy_poll_us {
        let micros = text.parse().map_err(|_| format!("--busy-poll-us {text}: expected microseconds"))?;
        options.busy_poll = Duration::from_micros(micros);
    }
    if let Some(text) = &args.threads {
        options.threads = match text.parse() {
            Ok(n @ 1..=256) => n,
            _ => return Err(format!("--threads {text}: expected 1 to 256")),
        };
    }
    if let Some(text) = &args.coalesce_us {
        options.coalesce = match text.parse() {
            Ok(micros @ 0..=1_000_000) => Duration::from_micros(micros),
            _ => return Err(format!("--coalesce-us {text}: expected 0 to 1000000 microseconds")),
        };
    }
    // Refusals and failures are logged: without a subscriber they would be lost.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let server = TcpStoreServer::start(options).map_err(|e| e.to_string())?;
    println!("pgstore: listening on {}", server.local_addr());
    server.join();
    Ok(ExitCode::SUCCESS)
}

/// Text when the bytes are printable UTF-8, otherwise `\xNN` escapes (never raw control bytes).
fn printable(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => bytes.escape_ascii().to_string(),
    }
}

//! What hostile clients cost `pgstore serve`: the stall other clients see while a connection with very many
//! pending WAITs closes, and the server's memory while connections that never read ask for large replies.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lab::results::store::{MultiGet, StoreHostileResult, WaitCleanup};
use pg_store::wire::{encode_request, Request, VALIDATION_MAGIC};
use pg_store::{Store, TcpStore};

use super::load::ServerProcess;
use super::report::{date_and_commit, machine, write_file};
use crate::interop::workspace_root;

const TIMEOUT: Duration = Duration::from_secs(120);
/// How long the other client keeps pinging after the close.
const PING_WINDOW: Duration = Duration::from_secs(2);
/// The value the large replies repeat.
const VALUE: usize = 8 << 20;

/// What to measure.
#[derive(Debug)]
pub struct Options {
    waits: usize,
    readers: usize,
    keys: usize,
    out: PathBuf,
}

pub fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options { waits: 200_000, readers: 6, keys: 30, out: workspace_root().join("bench/results") };
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let value = iter.next().ok_or_else(|| format!("{arg} needs a value"))?;
        let count = || value.parse::<usize>().ok().filter(|&n| n > 0).ok_or(format!("{arg}: expected a count"));
        match arg.as_str() {
            "--waits" => options.waits = count()?,
            "--readers" => options.readers = count()?,
            "--keys" => options.keys = count()?,
            "--out" => options.out = PathBuf::from(value),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

/// A raw connection that has sent `VALIDATE`.
fn validated(port: u16) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    stream.write_all(&encode_request(&Request::Validate { magic: VALIDATION_MAGIC })).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// The longest ping round trip another client sees while a connection holding `waits` WAITs on one key
/// closes, in seconds.
fn wait_cleanup_stall(pgstore: &Path, waits: usize) -> Result<f64, String> {
    let server = ServerProcess::pgstore(pgstore, &[])?;
    let mut hog = validated(server.port)?;
    let wait = encode_request(&Request::Wait { keys: vec![b"/never".to_vec()] });
    let mut bytes: Vec<u8> = wait.iter().copied().cycle().take(wait.len() * waits).collect();
    bytes.extend(encode_request(&Request::Ping { nonce: 1 }));
    hog.write_all(&bytes).map_err(|e| format!("sending the WAITs: {e}"))?;
    // The ping's echo follows the last WAIT: every registration is in place.
    let mut echo = [0; 4];
    hog.read_exact(&mut echo).map_err(|e| format!("the server did not take the WAITs: {e}"))?;
    let pinger = TcpStore::connect("127.0.0.1", server.port, TIMEOUT).map_err(|e| e.to_string())?;
    let closed = Arc::new(AtomicBool::new(false));
    let pinging = std::thread::spawn({
        let closed = Arc::clone(&closed);
        move || {
            let mut longest = Duration::ZERO;
            let mut since: Option<Instant> = None;
            while since.is_none_or(|since| since.elapsed() < PING_WINDOW) {
                if since.is_none() && closed.load(Ordering::Acquire) {
                    since = Some(Instant::now());
                }
                let start = Instant::now();
                pinger.ping().map_err(|e| e.to_string())?;
                longest = longest.max(start.elapsed());
            }
            Ok::<Duration, String>(longest)
        }
    });
    drop(hog);
    closed.store(true, Ordering::Release);
    let longest = pinging.join().map_err(|_| "the pinging thread panicked".to_owned())??;
    Ok(longest.as_secs_f64())
}

/// A process's resident memory now and at its peak, in bytes, from `/proc/PID/status`.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The server's resident memory (bytes) with one 8 MiB value stored, and its peak once `readers` connections
/// that never read have each asked for that value `keys` times in one MULTI_GET.
fn multi_get_memory(pgstore: &Path, readers: usize, keys: usize) -> Result<(u64, u64), String> {
    let server = ServerProcess::pgstore(pgstore, &[])?;
    let store = TcpStore::connect("127.0.0.1", server.port, TIMEOUT).map_err(|e| e.to_string())?;
    store.set("big", &vec![b'v'; VALUE]).map_err(|e| e.to_string())?;
    store.wait(&["big"], None).map_err(|e| e.to_string())?;
    let (before, _) = memory(server.pid());
    let request = encode_request(&Request::MultiGet { keys: vec![b"/big".to_vec(); keys] });
    let mut connections = Vec::new();
    for _ in 0..readers {
        let mut reader = validated(server.port)?;
        reader.write_all(&request).map_err(|e| e.to_string())?;
        connections.push(reader);
    }
    // The server handles the requests in its own time: sample its memory until it has not grown for a second.
    let (mut peak, mut grew) = (0, Instant::now());
    while grew.elapsed() < Duration::from_secs(1) {
        let (_, high_water) = memory(server.pid());
        if high_water > peak {
            (peak, grew) = (high_water, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(connections);
    Ok((before, peak))
}

/// Measures both and writes `store-hostile.{json,md}`.
pub fn run(pgstore: &Path, options: &Options) -> Result<(), String> {
    let stall = wait_cleanup_stall(pgstore, options.waits)?;
    eprintln!("wait clean-up: longest ping {:.1} ms while {} WAITs were dropped", stall * 1e3, options.waits);
    let (before, peak) = multi_get_memory(pgstore, options.readers, options.keys)?;
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    eprintln!("MULTI_GET: server resident memory {:.0} MiB before, peak {:.0} MiB", mib(before), mib(peak));
    let (date, commit) = date_and_commit();
    let machine = machine();
    let command = format!(
        "cargo xtask bench store-hostile --waits {} --readers {} --keys {}",
        options.waits, options.readers, options.keys
    );
    let result = StoreHostileResult {
        command: command.clone(),
        commit: commit.clone(),
        date: date.clone(),
        machine: machine.clone(),
        multi_get: MultiGet {
            keys_per_request: options.keys as u64,
            readers: options.readers as u64,
            rss_before_bytes: before,
            rss_peak_bytes: peak,
            value_bytes: VALUE as u64,
        },
        wait_cleanup: WaitCleanup { longest_ping_ms: stall * 1e3, waits: options.waits as u64 },
    };
    let json = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())? + "\n";
    let md = format!(
        "# TCP store under hostile clients\n\n\
         - Command: `{command}`\n- Date: {date}; commit {commit}\n- Machine: {machine}\n\n\
         | measurement | result |\n| --- | ---: |\n\
         | longest ping of another client while a connection with {} WAITs on one key closes | {:.1} ms |\n\
         | server resident memory with one 8 MiB value stored | {:.0} MiB |\n\
         | peak after {} non-reading connections each send one MULTI_GET of {} x that value | {:.0} MiB |\n",
        options.waits,
        stall * 1e3,
        mib(before),
        options.readers,
        options.keys,
        mib(peak)
    );
    write_file(&options.out, "store-hostile.json", &json)?;
    write_file(&options.out, "store-hostile.md", &md)?;
    print!("{md}");
    Ok(())
}

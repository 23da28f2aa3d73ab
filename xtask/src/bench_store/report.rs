//! The comparison's results as `store.json` and `store.md`, and the facts every results file names.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use super::load::{Measured, Measurement};
use super::Options;
use crate::interop::workspace_root;

/// The machine: CPU count and model, and the kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split(':').nth(1))
        .map_or("unknown CPU", str::trim);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({model}), Linux {}", kernel.trim())
}

/// The output of `program args` in the workspace, trimmed (empty when it fails).
fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The date (UTC) and the commit measured.
pub fn date_and_commit() -> (String, String) {
    (output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]), output("git", &["rev-parse", "--short", "HEAD"]))
}

/// Writes `text` to `dir/name`.
pub fn write_file(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Writes `store.json` and `store.md` under `options.out` and prints the Markdown.
pub fn write(options: &Options, command: &str, measured: &Measured) -> Result<(), String> {
    let (date, commit) = date_and_commit();
    let machine = machine();
    let pytorch = measured
        .torch
        .as_ref()
        .map_or("not measured (no Python with torch)".to_owned(), |v| format!("torch {v}, libuv TCPStore server"));
    let flags: serde_json::Map<String, serde_json::Value> =
        options.pgstore_flags.iter().map(|(flag, value)| ((*flag).to_owned(), value.clone().into())).collect();
    let json = serde_json::json!({
        "command": command,
        "date": date,
        "commit": commit,
        "machine": machine,
        "pytorch": pytorch,
        "pgstore_serve_flags": flags,
        "client": "pg-store TcpStore (Rust), one blocking connection per client thread, the same for both servers",
        "results": measured.results,
    });
    let json = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())? + "\n";

    let mut md = String::new();
    let _ = writeln!(md, "# TCP store benchmark\n");
    let _ = writeln!(md, "- Command: `{command}`");
    let _ = writeln!(md, "- Date: {date}; commit {commit}");
    let _ = writeln!(md, "- Machine: {machine}");
    let _ = writeln!(md, "- PyTorch: {pytorch}");
    let shown: Vec<String> = options.pgstore_flags.iter().map(|(flag, value)| format!("{flag} {value}")).collect();
    let theirs = match measured.torch {
        Some(_) => " and a Python `TCPStore` master, each its own process",
        None => ", its own process",
    };
    let _ = writeln!(
        md,
        "- Servers: `pgstore serve{}` (its defaults for this machine otherwise){theirs} on 127.0.0.1.",
        shown.iter().map(|flag| format!(" {flag}")).collect::<String>()
    );
    let _ = writeln!(
        md,
        "- Clients: pg-store's Rust `TcpStore`, one blocking connection per client thread, new connections every run, the same for both servers. {} runs per configuration, the servers taking turns to go first; ops/s is the median run, latencies are over all runs.",
        options.reps
    );
    let _ = writeln!(md, "- `set`: SET has no reply, so its latency is the send; its throughput includes one closing round trip per client. `get` is WAIT then GET, as PyTorch's client does. `add`: every client adds to one counter (checked exact). `wait-wakeup`: every client waits on a key another client sets; the latency runs from the set to each wait returning.\n");
    let _ = writeln!(
        md,
        "| op | clients | pg-store ops/s | PyTorch ops/s | ratio | pg-store p50 / p99 (µs) | PyTorch p50 / p99 (µs) |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &op in &options.only {
        for &clients in &options.clients {
            let find = |server: &str| {
                measured.results.iter().find(|m| m.server == server && m.op == op && m.clients == clients)
            };
            let (ours, theirs) = (find("pg-store"), find("pytorch"));
            let rate = |m: Option<&Measurement>| m.map_or("-".to_owned(), |m| format!("{:.0}", m.ops_per_second));
            let lat =
                |m: Option<&Measurement>| m.map_or("-".to_owned(), |m| format!("{:.1} / {:.1}", m.p50_us, m.p99_us));
            let ratio = match (ours, theirs) {
                (Some(ours), Some(theirs)) => format!("{:.2}x", ours.ops_per_second / theirs.ops_per_second),
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                md,
                "| {op} | {clients} | {} | {} | {ratio} | {} | {} |",
                rate(ours),
                rate(theirs),
                lat(ours),
                lat(theirs)
            );
        }
    }
    write_file(&options.out, "store.json", &json)?;
    write_file(&options.out, "store.md", &md)?;
    print!("{md}");
    Ok(())
}

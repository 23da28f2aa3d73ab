//! The rank processes of one task: started as torchrun would start them, watched until they exit, stall or run
//! out of time, stopped with their stacks written down, and their results read back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::Settings;

/// How a set of rank processes ended.
#[derive(Debug)]
pub enum Ended {
    /// Every process exited, with these statuses (by rank).
    Exited(Vec<ExitStatus>),
    /// No watched file changed for the stall limit while some process still ran.
    Stalled,
    /// The deadline passed while some process still ran.
    TimedOut,
}

/// Starts the `nproc` rank processes of `task` (with `env` added to each), rank r on GPU r % GPUs, on a fresh
/// port.
pub fn start_ranks(
    settings: &Settings,
    task: &str,
    nproc: usize,
    env: &[(&str, String)],
) -> Result<Vec<Child>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = crate::free_port()?;
    let gpus = pg_nccl::available().map_err(|err| format!("no GPU to test on: {err}"))?;
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..nproc {
        // Rank r on GPU r % gpus; several ranks on one GPU each pose as a host of their own to NCCL.
        let placement = pg_nccl::placement::place(rank, nproc, gpus);
        let started = Command::new(&exe)
            .args(["rank", "--task", task, "--out"])
            .arg(&settings.out)
            .args(["--bench-max-bytes", &settings.bench_max_bytes.to_string()])
            .args(["--bench-trials", &settings.bench_trials.to_string()])
            .args(["--bench-profile", settings.bench_profile.name()])
            .env("RANK", rank.to_string())
            .envs(placement.env)
            .env("WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            .envs(env.iter().map(|(name, value)| (*name, value)))
            .spawn();
        match started {
            Ok(child) => children.push(child),
            Err(e) => {
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    Ok(children)
}

/// Waits for `children` until every one exits or `deadline` passes, or, with `stall = Some((files, limit))`,
/// until none of `files` (nor the start) is newer than `limit` while some child still runs. A child still
/// running when this returns is left to the caller to stop.
pub fn wait_ranks(
    children: &mut [Child],
    deadline: Instant,
    stall: Option<(&[PathBuf], Duration)>,
) -> Result<Ended, String> {
    let started = SystemTime::now();
    let mut statuses = vec![None; children.len()];
    loop {
        for (status, child) in statuses.iter_mut().zip(children.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait().map_err(|e| e.to_string())?;
            }
        }
        if statuses.iter().all(Option::is_some) {
            return Ok(Ended::Exited(statuses.into_iter().flatten().collect()));
        }
        if Instant::now() > deadline {
            return Ok(Ended::TimedOut);
        }
        if let Some((files, limit)) = stall {
            let newest = files.iter().filter_map(|f| f.metadata().and_then(|m| m.modified()).ok()).max();
            let last = newest.map_or(started, |newest| newest.max(started));
            if last.elapsed().unwrap_or_default() > limit {
                return Ok(Ended::Stalled);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each rank's result file of `task`, once every process exited with these `statuses`: a rank that wrote an error,
/// or no result, fails the task; one that wrote its result and then exited badly is reported and kept.
pub fn collect_ranks(settings: &Settings, task: &str, statuses: Vec<ExitStatus>) -> Result<Vec<Value>, String> {
    let mut results = Vec::new();
    for (rank, status) in statuses.into_iter().enumerate() {
        let path = crate::rank_file(&settings.out, task, rank);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("rank {rank} ({status}) left no result at {}: {e}", path.display()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !value["error"].is_null() {
            return Err(format!("rank {rank} exited with {status}: {}", value["error"]));
        }
        if !status.success() {
            // The rank's body finished and wrote its result; what failed came after (NCCL's teardown at exit).
            println!("[{task}] rank {rank} exited with {status} after writing its result; the result stands");
        }
        results.push(value);
    }
    Ok(results)
}

/// Stops every child still running.
pub fn stop(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// [`stop_with_stacks`] for every child at once (a debugger attached to a process of many threads takes seconds),
/// child `i`'s stacks to `paths[i]`.
pub fn stop_all_with_stacks(children: &mut [Child], paths: &[PathBuf]) {
    std::thread::scope(|scope| {
        for (child, path) in children.iter_mut().zip(paths) {
            scope.spawn(move || stop_with_stacks(child, path));
        }
    });
}

/// How long one debugger may take to print a process's stacks.
const STACKS_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes the stacks of every thread of `child` to `path` (with gdb or cuda-gdb where one is installed, else the
/// threads' names and kernel wait channels from /proc), then stops it. A child that already exited is left as
/// it is.
pub fn stop_with_stacks(child: &mut Child, path: &Path) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    let pid = child.id().to_string();
    let mut text = String::new();
    for debugger in ["gdb", "cuda-gdb", "/usr/local/cuda/bin/cuda-gdb"] {
        let args = ["-p", &pid, "-batch", "-ex", "thread apply all bt"];
        if let Some(out) = bounded_output(Command::new(debugger).args(args), STACKS_TIMEOUT) {
            text = format!("{debugger} -p {pid} -batch -ex 'thread apply all bt'\n{out}");
            break;
        }
    }
    if text.is_empty() {
        text = proc_threads(&pid);
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(path, text);
    let _ = child.kill();
    let _ = child.wait();
}

/// The standard output of `command`, if it starts, exits with success within `limit` and prints something.
fn bounded_output(command: &mut Command, limit: Duration) -> Option<String> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let out = reader.join().ok()?;
    (status.success() && !out.trim().is_empty()).then_some(out)
}

/// Each thread of process `pid`: its id, name and kernel wait channel (what a process shows without a debugger).
fn proc_threads(pid: &str) -> String {
    let mut text = format!("no debugger printed the stacks of process {pid}; its threads from /proc:\n");
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return text + "(unreadable)\n";
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default().trim().to_owned();
        text += &format!("{} {} wchan={}\n", task.file_name().to_string_lossy(), read("comm"), read("wchan"));
    }
    text
}

/// Writes `value` to `path` whole: to a file beside it first, then renamed over it, so a reader never sees a
/// part of it.
pub fn write_atomically(path: &Path, value: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).map_err(|e| format!("{}: {e}", partial.display()))?;
    std::fs::rename(&partial, path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> Child {
        Command::new("sleep").arg("600").spawn().expect("sleep starts")
    }

    #[test]
    fn ranks_that_write_nothing_stall_and_are_stopped_with_their_threads_written_down() {
        let dir = std::env::temp_dir().join(format!("pg-procs-{}", std::process::id()));
        let mut children = vec![sleeper(), sleeper()];
        let never = [dir.join("never-written.json")];
        let far = Instant::now() + Duration::from_secs(600);
        let ended = wait_ranks(&mut children, far, Some((&never, Duration::from_millis(1)))).unwrap();
        assert!(matches!(ended, Ended::Stalled), "{ended:?}");
        let stacks = [dir.join("stalls/rank0.txt"), dir.join("stalls/rank1.txt")];
        stop_all_with_stacks(&mut children, &stacks);
        for (child, path) in children.iter_mut().zip(&stacks) {
            assert!(child.try_wait().unwrap().is_some(), "the rank was stopped");
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.contains(&child.id().to_string()), "{text}");
        }
        let ended = wait_ranks(&mut children, far, Some((&never, Duration::from_millis(1)))).unwrap();
        assert!(matches!(ended, Ended::Exited(ref statuses) if statuses.len() == 2), "{ended:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_value_is_replaced_whole() {
        let path = std::env::temp_dir().join(format!("pg-progress-{}.json", std::process::id()));
        write_atomically(&path, &serde_json::json!({ "cases": [1] })).unwrap();
        write_atomically(&path, &serde_json::json!({ "cases": [1, 2] })).unwrap();
        let back: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back["cases"], serde_json::json!([1, 2]));
        assert!(!path.with_extension("partial").exists());
        let _ = std::fs::remove_file(path);
    }
}

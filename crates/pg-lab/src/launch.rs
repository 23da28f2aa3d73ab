//! Starting the rank processes of a job and watching them: the one launcher of pg-lab's `pg-nccl-gpu` and xtask's
//! GPU tasks. Ranks start as torchrun would start them (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT` on 127.0.0.1), rank r on GPU r % GPUs with the environment of `pg_nccl::placement`; they are watched
//! until they exit, stall or run out of time, and stopped with their stacks written down.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// A TCP port free on the loopback right now (the OS picks it; rank 0's store server binds it next).
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// One job's rank processes, before they start.
#[derive(Debug, Clone)]
pub struct Job {
    /// The program every rank runs.
    pub exe: PathBuf,
    /// A tool each rank runs under (`gdb -batch -ex run -ex bt --args`, say), or nothing.
    pub wrapper: Vec<String>,
    /// The number of ranks.
    pub world: usize,
    /// The GPUs of the machine.
    pub gpus: usize,
    /// The port of the job's store on 127.0.0.1 (rank 0 hosts it).
    pub port: u16,
}

impl Job {
    /// Starts every rank: rank r runs `exe` with `args(r)`, torchrun's variables, its placement, `NCCL_NVLS_ENABLE=0`
    /// unless the environment sets it, then `env`. If a rank cannot start, those started are stopped.
    pub fn start(&self, args: &dyn Fn(usize) -> Vec<OsString>, env: &[(&str, String)]) -> Result<Vec<Child>, String> {
        let mut children: Vec<Child> = Vec::new();
        for rank in 0..self.world {
            let mut command = match self.wrapper.split_first() {
                Some((tool, tool_args)) => {
                    let mut command = Command::new(tool);
                    command.args(tool_args).arg(&self.exe);
                    command
                }
                None => Command::new(&self.exe),
            };
            command
                .args(args(rank))
                .env("RANK", rank.to_string())
                // Rank r on GPU r % gpus; several ranks on one GPU each pose as a host of their own to NCCL.
                .envs(pg_nccl::placement::place(rank, self.world, self.gpus).env)
                .env("WORLD_SIZE", self.world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", self.port.to_string());
            if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
                command.env("NCCL_NVLS_ENABLE", "0");
            }
            command.envs(env.iter().map(|(name, value)| (*name, value)));
            match command.spawn() {
                Ok(child) => children.push(child),
                Err(e) => {
                    stop(&mut children);
                    return Err(format!("starting rank {rank}: {e}"));
                }
            }
        }
        Ok(children)
    }
}

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
}

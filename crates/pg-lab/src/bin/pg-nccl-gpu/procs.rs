//! The rank processes of one task: started and watched through `pg_lab::launch` (the one launcher, which xtask's
//! GPU tasks use too), and their results read back.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, ExitStatus};

use pg_lab::launch::{self, Job};
pub use pg_lab::launch::{stop, stop_all_with_stacks, wait_ranks, Ended};
use serde_json::Value;

use crate::Settings;

/// Starts the `nproc` rank processes of `task` (with `env` added to each), rank r on GPU r % GPUs, on a fresh
/// port.
pub fn start_ranks(
    settings: &Settings,
    task: &str,
    nproc: usize,
    env: &[(&str, String)],
) -> Result<Vec<Child>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = launch::free_port()?;
    let gpus = pg_nccl::available().map_err(|err| format!("no GPU to test on: {err}"))?;
    let job = Job { exe, wrapper: Vec::new(), world: nproc, gpus, port };
    let args = |_rank: usize| -> Vec<OsString> {
        let mut args: Vec<OsString> = ["rank", "--task", task, "--out"].map(OsString::from).into();
        args.push(settings.out.clone().into());
        args.extend(["--bench-max-bytes".into(), settings.bench_max_bytes.to_string().into()]);
        args.extend(["--bench-trials".into(), settings.bench_trials.to_string().into()]);
        args.extend(["--bench-profile".into(), settings.bench_profile.name().into()]);
        args
    };
    // Every rank of the suite runs without NVLink SHARP, whatever the environment says.
    let mut env = env.to_vec();
    env.insert(0, ("NCCL_NVLS_ENABLE", "0".to_owned()));
    job.start(&args, &env)
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

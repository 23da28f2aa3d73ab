//! `cargo xtask conformance`: the conformance suite on the simulated backend (in this process) or on NCCL (one
//! process per GPU, through the GPU binary); prints the table and writes the JSON.

use std::path::PathBuf;
use std::process::Command;

use pg_conformance::mock::MockHarness;
use pg_conformance::report;

const HELP: &str = "\
cargo xtask conformance --backend mock|nccl [--world-size N] [--only TEXT] [--json PATH]

Runs every case of the conformance suite (crates/pg-conformance): the semantics of streams, events, Work, the
communicator cache, buffer lifetimes and the watchdog, and every op's results and bad-input errors. Prints a
table (case, ranks, result, detail) and, with --json, writes
  {\"backend\", \"world_size\", \"cases\": [{\"name\", \"result\", \"detail\"}]}
with result one of pass, fail, not_applicable (with why; never counted as a pass). Exits non-zero if a case
failed.

Options:
  --backend mock|nccl  the simulated backend (default), or real GPUs: builds pg-nccl-gpu (release) and runs one
                       process per GPU over env:// on loopback
  --world-size N       ranks (default 4 on the mock; every GPU on nccl)
  --only TEXT          only the cases whose name contains TEXT
  --json PATH          also write the results as JSON to PATH
";

struct Args {
    backend: String,
    world_size: Option<usize>,
    only: String,
    json: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let mut parsed = Args { backend: "mock".to_owned(), world_size: None, only: String::new(), json: None };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value\n\n{HELP}"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--backend" => parsed.backend = value("--backend")?,
            "--only" => parsed.only = value("--only")?,
            "--json" => parsed.json = Some(PathBuf::from(value("--json")?)),
            "--world-size" => {
                let n = value("--world-size")?;
                let n: usize = n.parse().map_err(|_| format!("--world-size {n}: not a number"))?;
                if n == 0 {
                    return Err("--world-size must be at least 1".to_owned());
                }
                parsed.world_size = Some(n);
            }
            other => return Err(format!("unknown option '{other}'\n\n{HELP}")),
        }
    }
    Ok(Some(parsed))
}

/// `cargo xtask conformance`.
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(args) = parse(args)? else {
        print!("{HELP}");
        return Ok(());
    };
    let document = match args.backend.as_str() {
        "mock" => {
            let world_size = args.world_size.unwrap_or(4);
            let reports = pg_conformance::run_all(&MockHarness::new(world_size), |name| name.contains(&args.only));
            print!("{}", report::table(&reports));
            report::json("mock", world_size, &reports)
        }
        "nccl" => run_nccl(&args)?,
        other => return Err(format!("unknown backend '{other}' (expected mock or nccl)")),
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let cases = document["cases"].as_array().cloned().unwrap_or_default();
    let failed = cases.iter().filter(|c| c["result"] == "fail").count();
    match (failed, cases.is_empty()) {
        (0, false) => Ok(()),
        (0, true) => Err("no case ran".to_owned()),
        (n, _) => Err(format!("{n} conformance case(s) failed")),
    }
}

/// Builds the GPU binary and runs its conformance task; returns the merged report it wrote.
fn run_nccl(args: &Args) -> Result<serde_json::Value, String> {
    let binary = crate::gpu_test::build_suite()?;
    let out = std::env::temp_dir().join(format!("pg-conformance-{}", std::process::id()));
    let mut command = Command::new(binary);
    command.args(["run", "--tasks", "conformance", "--out"]).arg(&out).env("NCCL_NVLS_ENABLE", "0");
    if let Some(n) = args.world_size {
        command.args(["--nproc", &n.to_string()]);
    }
    if !args.only.is_empty() {
        command.env("PG_CONFORMANCE_ONLY", &args.only);
    }
    let status = command.status().map_err(|e| format!("pg-nccl-gpu: {e}"))?;
    let path = out.join("conformance.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("pg-nccl-gpu exited with {status} and wrote no {}: {e}", path.display()))?;
    let _ = std::fs::remove_dir_all(&out);
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

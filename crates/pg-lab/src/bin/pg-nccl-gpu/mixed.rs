//! The mixed-group task (`pg-nccl-gpu mixed`): this process is one rank of PyTorch's default NCCL group, the
//! other ranks PyTorch's (`bench/torch_mixed.py`), joined with the "Join a PyTorch job" code of docs/torch-job.md: a store
//! client counted as a worker (`TcpStore::connect_as_worker`; on rank 0 the store's host,
//! `TcpStore::serve_as_master`, as PyTorch's rank 0 is), then `join_torch_default_group`.
//!
//! Every rank, pg's and PyTorch's, runs [`OPS`] in that order and checks each result on its side:
//! broadcasts of 64 MiB and 1 GiB from a PyTorch rank (the source, [`source`]), an all_reduce (sum of rank + 1),
//! an all_gather (rank r's chunk holds r + 1), a send from pg's rank to the source and one back, and a barrier.
//! Each rank writes `{"side", "rank", "world_size", "pg_rank", "checks": [{"op", "result", "detail", "seconds"}]}`
//! to `OUT/mixed-rank{rank}.json`; `merge-mixed` joins the ranks of one or more runs into a table with a row per
//! op and a column per rank and side.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_core::{Backend, DType, Device as _, ProcessGroup, ReduceOp};
use pg_lab::results::checks::{MixedCheck, MixedRank, MixedResult, MixedRun};

/// The ops, in the order every rank runs them; PyTorch's script runs the same list.
pub const OPS: [&str; 7] = [
    "broadcast_64MiB_from_torch",
    "broadcast_1GiB_from_torch",
    "all_reduce",
    "all_gather",
    "send_pg_to_torch",
    "send_torch_to_pg",
    "barrier",
];

/// Bytes of the two broadcasts, of the all_reduce, of each rank's all_gather input and of each message.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub broadcast_small: usize,
    pub broadcast_large: usize,
    pub collective: usize,
    pub message: usize,
}

/// The sizes of the real run (64 MiB and 1 GiB broadcasts, 4 MiB for the rest).
pub const REAL: Sizes =
    Sizes { broadcast_small: 64 << 20, broadcast_large: 1 << 30, collective: 4 << 20, message: 4 << 20 };

/// The PyTorch rank that broadcasts and exchanges messages with pg's rank: the lowest rank that is not pg's.
pub fn source(pg_rank: usize) -> usize {
    if pg_rank == 0 {
        1
    } else {
        0
    }
}

/// The value every element of each op's result holds (broadcasts, messages) or starts from.
pub fn broadcast_value(op_index: usize, src: usize) -> f32 {
    100.0 * (op_index as f32 + 1.0) + src as f32
}

/// What the message from `from` to `to` holds.
pub fn message_value(from: usize, to: usize) -> f32 {
    1000.0 + 10.0 * from as f32 + to as f32
}

/// One check's outcome on this rank.
fn check(op: &str, started: Instant, outcome: Result<String, String>) -> MixedCheck {
    let (result, detail) = match outcome {
        Ok(detail) => ("pass", detail),
        Err(detail) => ("fail", detail),
    };
    MixedCheck { detail, op: op.to_owned(), result: result.to_owned(), seconds: started.elapsed().as_secs_f64() }
}

/// Whether every f32 of `bytes` is `want`; else where the first one that is not is.
fn all_f32(bytes: &[u8], want: f32, what: &str) -> Result<String, String> {
    let want_bytes = want.to_le_bytes();
    match bytes.chunks_exact(4).position(|c| c != want_bytes) {
        None => Ok(format!("{} elements == {want}", bytes.len() / 4)),
        Some(i) => {
            let got = f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
            Err(format!("{what}: element {i} of {} is {got}, not {want}", bytes.len() / 4))
        }
    }
}

/// Runs [`OPS`] as rank `rank` of `world` (pg's rank being `pg_rank`) on `pg`, checking each result; an op that
/// returns an error ends the sequence there (the ranks would no longer agree on what comes next).
pub fn run_ops<B: Backend>(
    pg: &ProcessGroup<B>,
    device: &B::Device,
    rank: usize,
    world: usize,
    pg_rank: usize,
    sizes: Sizes,
) -> Vec<MixedCheck> {
    let src = source(pg_rank);
    let stream = device.current_stream();
    let e = |err: pg_core::Error| err.to_string();
    let filled = |numel: usize, value: f32| -> Result<B::Buffer, String> {
        let buffer = device.alloc(DType::F32, numel).map_err(e)?;
        device.fill(&buffer, f64::from(value), &stream).map_err(e)?;
        Ok(buffer)
    };
    let read = |buffer: &B::Buffer| device.copy_to_host(buffer, &stream).map_err(e);
    let mut checks = Vec::new();
    for (index, op) in OPS.iter().enumerate() {
        let started = Instant::now();
        // Err: the op itself failed (the sequence ends there); Ok(Err): it ran but a value is wrong.
        let outcome: Result<Result<String, String>, String> = (|| match *op {
            "broadcast_64MiB_from_torch" | "broadcast_1GiB_from_torch" => {
                let bytes = if index == 0 { sizes.broadcast_small } else { sizes.broadcast_large };
                let want = broadcast_value(index, src);
                let buffer = filled(bytes / 4, if rank == src { want } else { -1.0 })?;
                pg.broadcast(&buffer, src).and_then(|w| w.wait()).map_err(e)?;
                Ok(all_f32(&read(&buffer)?, want, op))
            }
            "all_reduce" => {
                let buffer = filled(sizes.collective / 4, rank as f32 + 1.0)?;
                pg.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).map_err(e)?;
                Ok(all_f32(&read(&buffer)?, (world * (world + 1) / 2) as f32, op))
            }
            "all_gather" => {
                let numel = sizes.collective / 4;
                let input = filled(numel, rank as f32 + 1.0)?;
                let output = filled(numel * world, -1.0)?;
                pg.all_gather(&input, &output).and_then(|w| w.wait()).map_err(e)?;
                let bytes = read(&output)?;
                Ok(bytes
                    .chunks(numel * 4)
                    .enumerate()
                    .try_for_each(|(r, chunk)| all_f32(chunk, r as f32 + 1.0, &format!("chunk of rank {r}")).map(drop))
                    .map(|()| format!("{world} chunks of {numel} elements, chunk r == r + 1")))
            }
            "send_pg_to_torch" | "send_torch_to_pg" => {
                let (from, to) = if *op == "send_pg_to_torch" { (pg_rank, src) } else { (src, pg_rank) };
                let numel = sizes.message / 4;
                if rank == from {
                    let buffer = filled(numel, message_value(from, to))?;
                    pg.send(&buffer, to).and_then(|w| w.wait()).map_err(e)?;
                    device.synchronize().map_err(e)?;
                    Ok(Ok(format!("sent {numel} elements to rank {to}")))
                } else if rank == to {
                    let buffer = filled(numel, -1.0)?;
                    pg.recv(&buffer, from).and_then(|w| w.wait()).map_err(e)?;
                    Ok(all_f32(&read(&buffer)?, message_value(from, to), op).map(|d| format!("from rank {from}: {d}")))
                } else {
                    Ok(Ok(format!("not a party (rank {from} to rank {to})")))
                }
            }
            "barrier" => pg.barrier().and_then(|w| w.wait()).map(|()| Ok("passed".to_owned())).map_err(e),
            other => Err(format!("no op {other}")),
        })();
        let ended = outcome.is_err();
        checks.push(check(op, started, outcome.and_then(|checked| checked)));
        if ended {
            break;
        }
    }
    checks
}

/// The `mixed` command on NCCL: pg's rank is this process's, from torchrun's variables (`RANK`, `WORLD_SIZE`,
/// `MASTER_ADDR`, `MASTER_PORT`; its GPU `gpu`). Joins with the code of docs/torch-job.md, runs the ops and writes
/// `OUT/mixed-rank{rank}.json`. `PG_MIXED_LARGE_BYTES` replaces the 1 GiB of the large broadcast (PyTorch's
/// script reads the same variable).
pub fn run_nccl(out: &Path, rank: usize, gpu: usize) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let world: usize = var("WORLD_SIZE")?.parse().map_err(|e| format!("WORLD_SIZE: {e}"))?;
    let addr = var("MASTER_ADDR")?;
    let port: u16 = var("MASTER_PORT")?.parse().map_err(|e| format!("MASTER_PORT: {e}"))?;
    let large = match std::env::var("PG_MIXED_LARGE_BYTES") {
        Ok(v) => v.parse().map_err(|e| format!("PG_MIXED_LARGE_BYTES: {e}"))?,
        Err(_) => REAL.broadcast_large,
    };
    let sizes = Sizes { broadcast_large: large, ..REAL };
    let started = Instant::now();
    let checks = join_and_run(&addr, port, rank, world, gpu, sizes);
    let checks = match checks {
        Ok(checks) => checks,
        Err(why) => vec![check("join", started, Err(why))],
    };
    let passed = checks.len() == OPS.len() && checks.iter().all(|c| c.result == "pass");
    let value = MixedRank {
        checks: Some(checks),
        passed: Some(passed),
        pg_rank: Some(rank as u64),
        rank: rank as u64,
        seconds: Some(started.elapsed().as_secs_f64()),
        side: Some("pg".to_owned()),
        world_size: Some(world as u64),
        ..MixedRank::default()
    };
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let path = out.join(format!("mixed-rank{rank}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("pg rank {rank} of {world}: {}", if passed { "every op passed" } else { "FAILED" });
    match passed {
        true => Ok(()),
        false => Err(format!("see {}", path.display())),
    }
}

/// The "Join a PyTorch job" code of docs/torch-job.md, then the ops.
fn join_and_run(
    addr: &str,
    port: u16,
    rank: usize,
    world: usize,
    gpu: usize,
    sizes: Sizes,
) -> Result<Vec<MixedCheck>, String> {
    use pg_core::store::{Store, TcpStore};
    use pg_core::{join_torch_default_group, Options, TorchStoreOrigin, TORCH_DEFAULT_RANKS_PER_ROOT};

    let device = pg_nccl::Device::new(gpu).map_err(|e| format!("device {gpu}: {e}"))?;
    let timeout = Duration::from_secs(300);
    // Rank 0 hosts the store as PyTorch's rank 0 would; every other rank is a client counted as a worker.
    let store: Arc<dyn Store> = match rank {
        0 => Arc::new(TcpStore::serve_as_master(port, world, timeout).map_err(|e| format!("hosting the store: {e}"))?),
        _ => Arc::new(
            TcpStore::connect_as_worker(addr, port, world, timeout)
                .map_err(|e| format!("joining {addr}:{port}: {e}"))?,
        ),
    };
    let options = Options::builder().timeout(Duration::from_secs(120)).build();
    let pg = join_torch_default_group::<pg_nccl::Nccl>(
        store,
        TorchStoreOrigin::Rendezvous,
        rank,
        world,
        TORCH_DEFAULT_RANKS_PER_ROOT,
        device.clone(),
        options,
    )
    .map_err(|e| format!("join_torch_default_group: {e}"))?;
    let checks = run_ops(&pg, &device, rank, world, rank, sizes);
    pg.shutdown().map_err(|e| format!("shutdown: {e}"))?;
    Ok(checks)
}

/// `merge-mixed --out DIR`: every run directory `DIR/mixed-N-pgR` of world `N` (pg at rank `R`) with its ranks'
/// `mixed-rank*.json`, into `DIR/mixed-nccl-N.{md,json}` per world; returns whether every check of every rank
/// of every run passed.
pub fn merge(dir: &Path, label: &str) -> Result<bool, String> {
    let mut runs: Vec<(usize, usize, std::path::PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let (world, pg) = name.strip_prefix("mixed-")?.split_once("-pg")?;
            Some((world.parse().ok()?, pg.parse().ok()?, entry.path()))
        })
        .collect();
    if runs.is_empty() {
        return Err(format!("no mixed-N-pgR run directory in {}", dir.display()));
    }
    runs.sort();
    let mut worlds: Vec<usize> = runs.iter().map(|r| r.0).collect();
    worlds.dedup();
    let mut all_passed = true;
    for world in worlds {
        let mut md = String::new();
        let _ = writeln!(md, "# Mixed groups on NCCL: pg and PyTorch ranks in one default group, world {world}\n");
        let _ = writeln!(md, "{label}\n");
        let _ = writeln!(
            md,
            "pg's rank joins with the \"Join a PyTorch job\" code of docs/torch-job.md (`TcpStore::connect_as_worker`, or \
             `TcpStore::serve_as_master` at rank 0, then `join_torch_default_group`); the other ranks are PyTorch's \
             `init_process_group(\"nccl\")` (bench/torch_mixed.py). Every rank checks every result on its side: \
             broadcasts from the lowest PyTorch rank, all_reduce (sum of rank + 1), all_gather (chunk r == r + 1), a \
             send from pg's rank to that PyTorch rank and one back, a barrier.\n"
        );
        let mut json_runs = Vec::new();
        for (_, pg_rank, path) in runs.iter().filter(|r| r.0 == world) {
            let ranks: Vec<MixedRank> = (0..world).map(|r| read_rank(path, r)).collect();
            let (passed, table) = run_table(&ranks, *pg_rank);
            all_passed &= passed;
            let _ = writeln!(
                md,
                "## pg at rank {pg_rank} (PyTorch at {}): {}\n",
                (0..world).filter(|r| r != pg_rank).map(|r| r.to_string()).collect::<Vec<_>>().join(", "),
                if passed { "every check passed" } else { "FAILED" }
            );
            md.push_str(&table);
            json_runs.push(MixedRun { passed, pg_rank: *pg_rank as u64, ranks, world_size: world as u64 });
        }
        let merged = MixedResult {
            label: label.to_owned(),
            ops: OPS.iter().map(|op| (*op).to_owned()).collect(),
            passed: json_runs.iter().all(|r| r.passed),
            runs: json_runs,
            task: "mixed".to_owned(),
            world_size: world as u64,
        };
        crate::report::write_pair(dir, &format!("mixed-nccl-{world}"), &merged, &md)?;
        print!("{md}");
    }
    Ok(all_passed)
}

/// Rank `rank`'s file in the run directory `run`, or a rank that says why there is none.
fn read_rank(run: &Path, rank: usize) -> MixedRank {
    let file = run.join(format!("mixed-rank{rank}.json"));
    let missing = |why: String| MixedRank { missing: Some(why), rank: rank as u64, ..MixedRank::default() };
    match std::fs::read_to_string(&file) {
        Err(_) => missing(format!("no {}", file.display())),
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| missing(format!("{}: {e}", file.display()))),
    }
}

/// One run's table: a row per op and a column per rank (side), each cell the result and seconds; whether every
/// rank ran every op and passed.
fn run_table(ranks: &[MixedRank], pg_rank: usize) -> (bool, String) {
    let mut md = String::new();
    let side = |r: usize| if r == pg_rank { "pg" } else { "torch" };
    let header: Vec<String> = (0..ranks.len()).map(|r| format!("rank {r} ({})", side(r))).collect();
    let _ = writeln!(md, "| op | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(ranks.len()));
    let mut passed = true;
    for op in OPS {
        let cells: Vec<String> = ranks
            .iter()
            .map(|rank| {
                let checks = rank.checks.as_deref().unwrap_or_default();
                match checks.iter().find(|c| c.op == op) {
                    Some(c) if c.result == "pass" => format!("pass ({:.2} s)", c.seconds),
                    Some(c) => {
                        passed = false;
                        format!("FAIL: {}", c.detail)
                    }
                    None => {
                        passed = false;
                        let why = rank
                            .missing
                            .as_deref()
                            .or_else(|| checks.last().filter(|c| c.result != "pass").map(|c| c.detail.as_str()));
                        format!("not run{}", why.map(|w| format!(" ({w})")).unwrap_or_default())
                    }
                }
            })
            .collect();
        let _ = writeln!(md, "| {op} | {} |", cells.join(" | ").replace('\n', " "));
    }
    for (r, rank) in ranks.iter().enumerate() {
        if let Some(said) = rank.side.as_deref().filter(|s| *s != side(r)) {
            passed = false;
            let _ = writeln!(md, "\nrank {r} says it is {said:?}, not {}", side(r));
        }
    }
    md.push('\n');
    (passed, md)
}

#[cfg(test)]
mod tests {
    use pg_core::{join_torch_default_group, Options, TorchStoreOrigin, TORCH_DEFAULT_RANKS_PER_ROOT};
    use pg_mock::{Mock, World, WorldConfig};
    use serde_json::{json, Value};

    use super::*;

    const SMALL: Sizes =
        Sizes { broadcast_small: 4 << 10, broadcast_large: 64 << 10, collective: 1 << 10, message: 512 };

    /// Every rank on the simulated backend through the same join and ops (there every rank is pg's): at worlds 2
    /// and 3 with "pg's rank" at 0 and in the middle, every check passes on every rank.
    #[test]
    fn every_op_checks_out_on_every_rank_at_worlds_2_and_3() {
        for (world, pg_rank) in [(2, 0), (3, 1), (3, 0)] {
            let sim = World::new(WorldConfig { devices: world, ..Default::default() });
            let store = sim.store();
            let results = sim.run(world, |rank, device| {
                let pg = join_torch_default_group::<Mock>(
                    Arc::clone(&store),
                    TorchStoreOrigin::Rendezvous,
                    rank,
                    world,
                    TORCH_DEFAULT_RANKS_PER_ROOT,
                    device.clone(),
                    Options::default(),
                )
                .expect("join");
                let checks = run_ops(&pg, &device, rank, world, pg_rank, SMALL);
                pg.shutdown().expect("shutdown");
                checks
            });
            for (rank, checks) in results.iter().enumerate() {
                assert_eq!(checks.len(), OPS.len(), "world {world} rank {rank}: {checks:?}");
                for c in checks {
                    assert_eq!(c.result, "pass", "world {world}, pg at {pg_rank}, rank {rank}: {c:?}");
                }
            }
        }
    }

    /// PyTorch's side (bench/torch_mixed.py) runs the same ops in the same order with the same values.
    #[test]
    fn the_torch_script_runs_the_same_ops_with_the_same_values() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/torch_mixed.py");
        let text = std::fs::read_to_string(path).expect("bench/torch_mixed.py");
        let list = text.split_once("OPS = [").unwrap().1.split_once(']').unwrap().0;
        let ops: Vec<&str> = list.split(',').map(|s| s.trim().trim_matches('"')).filter(|s| !s.is_empty()).collect();
        assert_eq!(ops, OPS);
        assert!(text.contains("return 100.0 * (op_index + 1) + src"));
        assert_eq!(broadcast_value(1, 0), 200.0);
        assert!(text.contains("return 1000.0 + 10.0 * frm + to"));
        assert_eq!(message_value(2, 0), 1020.0);
        assert!(text.contains("return 1 if pg_rank == 0 else 0"));
        assert!(text.contains(&format!("COLLECTIVE = {} << 20", REAL.collective >> 20)));
        assert!(text.contains(&format!("MESSAGE = {} << 20", REAL.message >> 20)));
        assert!(text.contains(&format!("BROADCAST_SMALL = {} << 20", REAL.broadcast_small >> 20)));
    }

    #[test]
    fn merge_writes_a_row_per_op_and_a_column_per_rank_and_side() {
        let dir = std::env::temp_dir().join(format!("pg-mixed-merge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let write = |run: &str, rank: usize, side: &str, fail: Option<&str>| {
            let run_dir = dir.join(run);
            std::fs::create_dir_all(&run_dir).unwrap();
            let checks: Vec<Value> = OPS
                .iter()
                .map(|op| {
                    let result = if Some(*op) == fail { "fail" } else { "pass" };
                    json!({ "op": op, "result": result, "detail": "element 3 of 16 is -1, not 101", "seconds": 0.5 })
                })
                .collect();
            let value = json!({ "side": side, "rank": rank, "checks": checks });
            std::fs::write(run_dir.join(format!("mixed-rank{rank}.json")), value.to_string()).unwrap();
        };
        write("mixed-2-pg0", 0, "pg", None);
        write("mixed-2-pg0", 1, "torch", None);
        write("mixed-3-pg1", 0, "torch", None);
        write("mixed-3-pg1", 1, "pg", None);
        write("mixed-3-pg1", 2, "torch", Some("all_gather"));
        assert!(!merge(&dir, "3 ranks on 1 GPU").unwrap(), "a failed check fails the merge");
        let md2 = std::fs::read_to_string(dir.join("mixed-nccl-2.md")).unwrap();
        assert!(md2.contains("| op | rank 0 (pg) | rank 1 (torch) |"), "{md2}");
        assert!(md2.contains("| barrier | pass (0.50 s) | pass (0.50 s) |"), "{md2}");
        let md3 = std::fs::read_to_string(dir.join("mixed-nccl-3.md")).unwrap();
        assert!(md3.contains("| all_gather | pass (0.50 s) | pass (0.50 s) | FAIL: element 3"), "{md3}");
        let json3: MixedResult =
            serde_json::from_str(&std::fs::read_to_string(dir.join("mixed-nccl-3.json")).unwrap()).unwrap();
        assert!(!json3.passed);
        assert_eq!(json3.runs[0].ranks[2].checks.as_ref().map(Vec::len), Some(OPS.len()));
        let json2: MixedResult =
            serde_json::from_str(&std::fs::read_to_string(dir.join("mixed-nccl-2.json")).unwrap()).unwrap();
        assert!(json2.passed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rank that left no file, or one that is not a rank's result, is a column of "not run" with the reason.
    #[test]
    fn a_missing_or_unreadable_rank_file_is_not_run() {
        let dir = std::env::temp_dir().join(format!("pg-mixed-missing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("mixed-rank1.json"), "{\"side\": \"torch\"}").unwrap();
        let ranks = [read_rank(&dir, 0), read_rank(&dir, 1)];
        assert!(ranks[0].missing.as_deref().is_some_and(|m| m.starts_with("no ")), "{:?}", ranks[0]);
        assert!(ranks[1].missing.as_deref().is_some_and(|m| m.contains("rank")), "{:?}", ranks[1]);
        let (passed, table) = run_table(&ranks, 0);
        assert!(!passed);
        assert!(table.contains("| barrier | not run (no "), "{table}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every run's table of every committed mixed result, rendered from its JSON alone, is in the committed .md.
    #[test]
    fn the_committed_tables_render_from_the_committed_json() {
        let mut seen = 0;
        for pg_lab::results::Committed { name, json, md } in pg_lab::results::committed("mixed-") {
            let result: MixedResult = serde_json::from_str(&json).expect("a mixed result");
            for run in &result.runs {
                let (passed, table) = run_table(&run.ranks, run.pg_rank as usize);
                assert_eq!(passed, run.passed, "{name}: pg at {}", run.pg_rank);
                assert!(md.contains(&table), "{name}: the rendered table\n{table}\nis not in its .md");
                seen += 1;
            }
        }
        assert!(seen > 0, "no committed mixed run");
    }
}

//! `cargo xtask`: the project's tasks in one binary (the cargo-xtask pattern).
#![forbid(unsafe_code)]

use std::process::ExitCode;

mod bench_allreduce;
mod bench_exchange;
mod bench_host;
mod bench_store;
mod conformance;
mod experiments;
mod faults;
mod fr_analyze;
mod fr_trace;
mod gpu;
mod gpu_faults;
mod gpu_recovery;
mod gpu_test;
mod interop;
mod mock_trace;
mod plot;
mod plot_timeline;
mod tidy;
mod trace_merge;

const HELP: &str = "\
cargo xtask <task> [options]

Tasks:
  experiments [--backend mock|nccl] [--world-size N] [--json PATH] [--trace DIR]
                         three experiments: the communicator cache, completion semantics, streams
  conformance --backend mock|nccl [--world-size N] [--json PATH]
                         the conformance suite: every promised semantic and every op, pass/fail/not_applicable
  gpu-test [--bundle DIR] build and run the real-GPU suite, one process per GPU
  bench [store|store-hostile|all-reduce|all-to-all|p2p|host] [options]
                         benchmarks; results go to bench/results/
  interop                store interop tests against PyTorch (sets up a virtual environment)
  faults [--backend mock|nccl] [--json PATH] [--trace DIR]
                         the fault matrix: hangs, errors, aborts, dead peers
  recovery --backend nccl [--world-size N] [--liveness] [--json PATH] [--md PATH]
                         a rank SIGKILLed mid-all_reduce; the survivors revoke, agree, shrink and go on
  fr-analyze DIR [--trace OUT.json]
                         reads every rank's flight-recorder dump and reports the first divergence
  trace-merge DIR [--out OUT.json]
                         joins a traced run's rank files (PG_TRACE=DIR) into one trace on one clock
  plot [--results DIR] | plot --timeline TRACE.json --out PICTURE.svg
                         SVG charts of the benchmark results (next to their JSON), or a trace as a picture
  tidy                   repository checks (also run by cargo test)

Run `cargo xtask <task> --help` for a task's options. With RUST_LOG set (RUST_LOG=pg=info, say), pg's own events
go to stderr: errors found, revokes, agreements, shrinks, communicators made.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    };
    if std::env::var_os("RUST_LOG").is_some() {
        // pg's own events (errors found, revokes, agreements, shrinks, communicators made) on stderr, with times.
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_thread_names(true)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let result = match task.as_str() {
        "-h" | "--help" | "help" => {
            print!("{HELP}");
            Ok(())
        }
        "experiments" => experiments::main(rest),
        "conformance" => conformance::run(rest),
        "tidy" => tidy::main(),
        "interop" => interop::main(rest),
        "bench" if rest.first().is_some_and(|sub| sub == "store") => bench_store::main(&rest[1..]),
        "bench" if rest.first().is_some_and(|sub| sub == "store-hostile") => bench_store::hostile_main(&rest[1..]),
        bench_store::RUN_TASK => bench_store::run_main(rest),
        bench_store::HOSTILE_TASK => bench_store::hostile_run_main(rest),
        "bench" if rest.first().is_some_and(|sub| sub == "host") => bench_host::main(&rest[1..]),
        "bench" if rest.first().is_some_and(|sub| sub == "all-to-all" || sub == "p2p") => bench_exchange::run(rest),
        "gpu-test" => gpu_test::run(rest),
        gpu::RANK_TASK => gpu::rank_main(rest),
        gpu_faults::RANK_TASK => gpu_faults::rank_main(rest),
        gpu_recovery::RANK_TASK => gpu_recovery::rank_main(rest),
        "recovery" => gpu_recovery::run(rest),
        "bench" => bench_allreduce::run(rest),
        "faults" => faults::run(rest),
        "fr-analyze" => fr_analyze::run(rest),
        "trace-merge" => trace_merge::run(rest),
        "plot" => plot::run(rest),
        other => Err(format!("unknown task '{other}'\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

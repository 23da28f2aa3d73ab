//! The fault matrix of issue 5 on the simulated backend, one test per scenario (`cargo xtask faults` prints
//! the same scenarios as a table).
#![forbid(unsafe_code)]

#[path = "faults/matrix.rs"]
mod matrix;

/// Runs scenario `id` in its own dump directory and fails with every check that did not hold.
fn check(id: &str) {
    let scenario = matrix::scenarios().into_iter().find(|s| s.id == id).expect("a scenario with this id");
    let dir = std::env::temp_dir().join(format!("pg-faults-test-{}-{id}", std::process::id()));
    // The debug-built mock runs a few thousand collectives a second: the test issues a tenth of the issue's
    // 50,000 unwaited ops, `cargo xtask faults` all of them.
    let outcome = (scenario.run)(&matrix::Env { dir: dir.clone(), unwaited_ops: 5_000 });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        outcome.pass(),
        "scenario {id} ({}): expected {}\nobserved: {}\nlatency: {:?}\nfailed checks:\n  {}",
        scenario.name,
        scenario.expected,
        outcome.observed,
        outcome.latency,
        outcome.failures.join("\n  ")
    );
}

#[test]
fn s1_a_rank_skips_one_collective() {
    check("1");
}

#[test]
fn s1b_the_error_propagates_through_the_store() {
    check("1b");
}

#[test]
fn s2_an_async_communicator_error_under_each_error_handling_mode() {
    check("2");
}

#[test]
fn s3_blocking_wait_on_a_hung_op_times_out_and_aborts() {
    check("3");
}

#[test]
fn s4_the_store_dies_during_rendezvous() {
    check("4");
}

#[test]
fn s5_a_wedged_watchdog_is_a_heartbeat_timeout() {
    check("5");
}

#[test]
fn s6_abort_from_a_second_thread_releases_the_waiter() {
    check("6");
}

#[test]
fn s7_fifty_thousand_unwaited_ops_keep_the_books_flat() {
    check("7");
}

#[test]
fn s8_is_gpu_only() {
    let scenario = matrix::scenarios().into_iter().find(|s| s.id == "8").expect("scenario 8");
    let outcome = (scenario.run)(&matrix::Env { dir: std::env::temp_dir(), unwaited_ops: 0 });
    assert!(outcome.not_applicable && !outcome.pass(), "the mock must not claim the GPU scenario");
}

#[test]
fn s9_a_new_group_on_a_fresh_prefix_works_after_an_error() {
    check("9");
}

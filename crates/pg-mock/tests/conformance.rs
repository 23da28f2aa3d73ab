//! The whole conformance suite on the simulated backend, at world sizes 1, 2, 4 and 8: each test fails listing
//! every case that failed; a case that does not apply must say why, and at these sizes only cases that need
//! more ranks than the world has may be not applicable.

use pg_conformance::mock::MockHarness;
use pg_conformance::{run_all, Outcome};

fn conformance_at(world_size: usize) {
    let reports = run_all(&MockHarness::new(world_size), |_| true);
    print!("{}", pg_conformance::report::table(&reports));
    let failed: Vec<String> = reports
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Pass => None,
            Outcome::Fail(detail) => Some(format!("{}: {detail}", r.name)),
            Outcome::NotApplicable(_) if r.min_ranks > world_size => None,
            Outcome::NotApplicable(why) => Some(format!("{}: not applicable on the mock: {why}", r.name)),
        })
        .collect();
    assert!(failed.is_empty(), "{} case(s) failed at world size {world_size}:\n{}", failed.len(), failed.join("\n"));
}

#[test]
fn conformance_world_1() {
    conformance_at(1);
}

#[test]
fn conformance_world_2() {
    conformance_at(2);
}

#[test]
fn conformance_world_4() {
    conformance_at(4);
}

#[test]
fn conformance_world_8() {
    conformance_at(8);
}

//! The whole conformance suite on the simulated backend, at world sizes 1, 2, 4 and 8, the collective cases also
//! at 3, the subgroup cases also at 3 and 5 (odd worlds leave a rank without a neighbour of the other parity),
//! and the cases whose values depend on the world size (the dtype cases, the Work-reuse case's n^42) also at 16:
//! each test fails listing every case that failed; a case that does not apply must say why, and at these sizes
//! only cases that need more ranks than the world has may be not applicable.

use pg_conformance::mock::MockHarness;
use pg_conformance::Harness as _;
use pg_conformance::{cases, collective_cases, dtype_cases, recovery_cases, run_all, subgroup_cases, Case, Outcome};

fn conformance_at(world_size: usize) {
    conformance_of(world_size, |_| true);
}

/// Runs `cases` alone at `world_size`.
fn only_at(world_size: usize, cases: Vec<Case<MockHarness>>) {
    let names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    conformance_of(world_size, |name| names.contains(&name));
}

/// Runs the dtype cases and the Work-reuse case, whose sums grow with the world, at `world_size`.
fn arithmetic_at(world_size: usize) {
    let reuse = "completed_works_nobody_holds_are_reused_and_held_ones_never_are";
    assert!(cases::<MockHarness>().iter().any(|c| c.name == reuse), "no case {reuse}");
    let mut names: Vec<&str> = dtype_cases::<MockHarness>().iter().map(|c| c.name).collect();
    names.push(reuse);
    conformance_of(world_size, |name| names.contains(&name));
}

fn conformance_of(world_size: usize, filter: impl Fn(&str) -> bool) {
    conformance_on(&MockHarness::new(world_size), filter);
}

fn conformance_on(harness: &MockHarness, filter: impl Fn(&str) -> bool) {
    let world_size = harness.world_size();
    let reports = run_all(harness, filter);
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
fn collectives_world_3() {
    only_at(3, collective_cases());
}

#[test]
fn subgroups_world_3() {
    only_at(3, subgroup_cases());
}

#[test]
fn subgroups_world_5() {
    only_at(5, subgroup_cases());
}

#[test]
fn conformance_world_8() {
    conformance_at(8);
}

#[test]
fn arithmetic_world_16() {
    arithmetic_at(16);
}

#[test]
fn recovery_world_3() {
    only_at(3, recovery_cases());
}

/// The grow cases where communicators cannot grow (NCCL before 2.29): every grow is made by a rendezvous of the
/// ranks, old and new, and passes the same cases (at world 6, which the sibling grows need).
#[test]
fn grow_by_rendezvous_world_6() {
    let names: Vec<&str> =
        recovery_cases::<MockHarness>().iter().map(|c| c.name).filter(|name| name.contains("grow")).collect();
    assert_eq!(names.len(), 4, "the grow cases: {names:?}");
    conformance_on(&MockHarness::new(6).without_native_grow(), |name| names.contains(&name));
}

/// The capability case where the devices declare none, then each capability alone missing: every call that needs
/// a missing one is refused by name before its store sees anything.
#[test]
fn capability_refusals_world_2() {
    let name = "a_call_needing_a_capability_the_backend_lacks_is_refused_by_name_before_any_store_key";
    assert!(cases::<MockHarness>().iter().any(|c| c.name == name), "no case {name}");
    conformance_on(&MockHarness::new(2).with_capabilities(pg_core::Capabilities::none()), |case| case == name);
    for capability in pg_core::Capability::ALL {
        let declared = pg_core::Capabilities::all().without(capability);
        conformance_on(&MockHarness::new(2).with_capabilities(declared), |case| case == name);
    }
}

//! The crate's collectives through a process group on the mock at several world sizes, and the NCCL choice
//! running or saying why it cannot, as a user's test would check them.
#![forbid(unsafe_code)]

use pg_downstream::{run, Choice, Ran, Seen};

fn ranks(ran: Ran) -> Vec<Seen> {
    match ran {
        Ran::Ranks(seen) => seen,
        Ran::NotApplicable(why) => panic!("the mock always applies: {why}"),
    }
}

#[test]
fn all_reduce_and_broadcast_on_the_mock() {
    for world in [1, 2, 3, 4] {
        let seen = ranks(run(Choice::Mock, world).expect("the mock runs"));
        let sum = (world * (world + 1) / 2) as f32;
        let want: Vec<Seen> = (0..world).map(|rank| Seen { rank, sum, broadcast: 42.0 }).collect();
        assert_eq!(seen, want, "world {world}");
    }
}

#[test]
fn the_backend_is_picked_by_name() {
    assert_eq!("mock".parse::<Choice>(), Ok(Choice::Mock));
    assert_eq!("nccl".parse::<Choice>(), Ok(Choice::Nccl));
    assert!("gloo".parse::<Choice>().unwrap_err().contains("mock or nccl"));
}

#[test]
fn nccl_runs_or_says_why_not() {
    if std::env::var_os("WORLD_SIZE").is_some() {
        println!("skipped: WORLD_SIZE is set, so NCCL would wait for a torchrun job's other ranks");
        return;
    }
    match run(Choice::Nccl, 1) {
        Ok(Ran::Ranks(seen)) => assert_eq!(seen, [Seen { rank: 0, sum: 1.0, broadcast: 42.0 }]),
        Ok(Ran::NotApplicable(why)) => {
            assert!(pg_nccl::available().is_err(), "not applicable only without a GPU or libnccl: {why}");
            println!("not applicable: {why}");
        }
        Err(error) => panic!("NCCL failed on a machine that has it: {error}"),
    }
    match run(Choice::Nccl, 2) {
        Ok(Ran::NotApplicable(_)) => {}
        other => panic!("a world of 2 without torchrun's variables is not applicable: {other:?}"),
    }
}

//! The store traffic of a pg rank that joins PyTorch's default NCCL group: the exact keys PyTorch's
//! `ProcessGroupNCCL` reads and writes, in the same order, with 128-byte-or-backend-sized ids under them.

use std::sync::Arc;

use pg_core::store::Store;
use pg_core::{
    join_torch_default_group, DType, Device, ErrorKind, Options, ReduceOp, TorchStoreOrigin,
    TORCH_DEFAULT_RANKS_PER_ROOT,
};
use pg_mock::{Mock, RecordingStore, World, WorldConfig};

/// Each rank's own log (one recording store per rank over the shared simulated store).
fn run_ranks(origin: TorchStoreOrigin) -> Vec<Vec<(&'static str, String)>> {
    let world = World::new(WorldConfig { devices: 2, ..Default::default() });
    let shared = world.store();
    world.run(2, |rank, device| {
        let recording = Arc::new(RecordingStore::new(Arc::clone(&shared)));
        let options = Options::builder().build();
        let group = join_torch_default_group::<Mock>(
            Arc::clone(&recording) as Arc<dyn Store>,
            origin,
            rank,
            2,
            TORCH_DEFAULT_RANKS_PER_ROOT,
            device.clone(),
            options,
        )
        .expect("join");
        assert_eq!((group.options().group_name.as_str(), group.options().group_desc.as_str()), ("0", "default_pg"));
        let buffer = device.alloc(DType::F32, 8).unwrap();
        group.all_reduce_sync(&buffer, ReduceOp::Sum).expect("all_reduce");
        match rank {
            0 => group.send(&buffer, 1).and_then(|work| work.wait()).expect("send"),
            _ => group.recv(&buffer, 0).and_then(|work| work.wait()).expect("recv"),
        }
        group.shutdown().expect("shutdown");
        // Non-blocking reads (the watchdog's `check` for a dump request) need nothing from a peer: left out.
        let log = recording.log().iter().filter(|(op, _)| *op != "check").cloned().collect();
        log
    })
}

#[test]
fn a_pg_rank_uses_pytorchs_keys_for_the_default_group() {
    let logs = run_ranks(TorchStoreOrigin::Rendezvous);
    let expected =
        |op: &'static str| vec![(op, "default_pg/0//cuda//0".to_owned()), (op, "default_pg/0//cuda//0:1".to_owned())];
    // Rank 0 of each communicator publishes the id, the other reads it; nothing else is written or waited for while
    // no error happens (no key that a PyTorch peer would never write).
    assert_eq!(logs[0], expected("set"));
    assert_eq!(logs[1], expected("get"));
}

#[test]
fn a_user_store_is_not_wrapped_in_default_pg() {
    let logs = run_ranks(TorchStoreOrigin::UserStore);
    assert_eq!(logs[0], vec![("set", "0//cuda//0".to_owned()), ("set", "0//cuda//0:1".to_owned())]);
}

#[test]
fn worlds_above_one_root_are_refused_with_the_reason() {
    let world = World::new(WorldConfig { devices: 1, ..Default::default() });
    let store = world.store();
    world.run(1, |_, device| {
        let error = join_torch_default_group::<Mock>(
            Arc::clone(&store),
            TorchStoreOrigin::Rendezvous,
            0,
            129,
            TORCH_DEFAULT_RANKS_PER_ROOT,
            device,
            Options::builder().build(),
        )
        .expect_err("refused");
        assert_eq!(error.kind(), ErrorKind::Unsupported);
        assert!(error.to_string().contains("TORCH_NCCL_RANKS_PER_ROOT=128"), "{error}");
    });
}

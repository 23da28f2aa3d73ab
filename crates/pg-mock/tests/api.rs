//! The API rules on the simulated backend: a capability the devices declare absent (`WorldConfig::capabilities`) is
//! refused by name before the group's store sees anything, or, for split and revoke, takes its other path; and the
//! torch-named forms of the NCCL-named ops run the same ops.

use std::sync::Arc;

use pg_core::store::Store;
use pg_core::{
    Capabilities, Capability, CaptureMode, DType, Device, ErrorKind, Options, ProcessGroup, ReduceOp, Result,
    ShrinkOptions, Stream,
};
use pg_mock::{Mock, MockDevice, RecordingStore, World, WorldConfig};

/// A world of `devices` devices that declare every capability but `missing`.
fn world_without(devices: usize, missing: &[Capability]) -> World {
    let capabilities = missing.iter().fold(Capabilities::all(), |caps, &c| caps.without(c));
    World::new(WorldConfig { devices, capabilities, ..Default::default() })
}

/// One row of the table: the capability, and the call that needs it on a one-rank group (its device and a
/// factory of fresh recording stores at hand).
type Row =
    (Capability, &'static str, fn(&ProcessGroup<Mock>, &MockDevice, &dyn Fn() -> Arc<RecordingStore>) -> Result<()>);

fn table() -> Vec<Row> {
    vec![
        (Capability::Shrink, "shrink", |group, _, _| group.shrink(&[], &ShrinkOptions::default()).map(drop)),
        (Capability::DevicePreMulSum, "all_reduce_pre_mul_sum", |group, device, _| {
            let (buffer, factor) = (device.alloc(DType::F32, 4)?, device.alloc(DType::F32, 1)?);
            group.all_reduce_pre_mul_sum(&buffer, &factor).map(drop)
        }),
        (Capability::DevicePreMulSum, "reduce_scatter_pre_mul_sum", |group, device, _| {
            let (buffer, factor) = (device.alloc(DType::F32, 4)?, device.alloc(DType::F32, 1)?);
            group.reduce_scatter_pre_mul_sum(&buffer, &buffer, &factor).map(drop)
        }),
        (Capability::TimingEvents, "a traced group", |_, device, store| {
            let recording = store();
            let options = Options::builder().trace_dir(Some(std::env::temp_dir().join("pg-api-traced"))).build();
            let made =
                ProcessGroup::<Mock>::new(Arc::clone(&recording) as Arc<dyn Store>, 0, 1, device.clone(), options);
            assert!(recording.is_empty(), "the traced group touched its store: {:?}", recording.log());
            made.map(drop)
        }),
        (Capability::Capture, "begin_capture", |_, device, _| {
            device.stream_from_pool(false)?.begin_capture(CaptureMode::ThreadLocal)
        }),
        (Capability::HostCallbacks, "launch_host_fn", |_, device, _| {
            device.current_stream().launch_host_fn(Box::new(|| ()))
        }),
    ]
}

#[test]
fn each_missing_capability_is_refused_by_name_before_any_store_key() {
    for (capability, call, run) in table() {
        let world = world_without(1, &[capability]);
        let shared = world.store();
        world.run(1, |_, device| {
            assert!(!device.capabilities().has(capability));
            let log = Arc::new(RecordingStore::new(Arc::clone(&shared)));
            let group = ProcessGroup::<Mock>::new(
                Arc::clone(&log) as Arc<dyn Store>,
                0,
                1,
                device.clone(),
                Options::builder().build(),
            )
            .expect("group");
            assert_eq!(group.capabilities(), device.capabilities());
            let mark = log.len();
            let fresh = || Arc::new(RecordingStore::new(Arc::clone(&shared)));
            let error = run(&group, &device, &fresh).expect_err(call);
            assert_eq!(error.kind(), ErrorKind::Unsupported, "{call}: {error}");
            let text = error.to_string();
            assert!(text.contains(call) && text.contains(capability.name()) && text.contains("mock"), "{text}");
            assert!(log.log_since(mark).is_empty(), "{call}: the store saw {:?}", log.log_since(mark));
            assert_eq!(group.counters().ops_issued, 0, "{call}");
            group.shutdown().expect("shutdown");
        });
    }
}

#[test]
fn without_split_a_subgroup_makes_its_communicator_by_a_rendezvous() {
    for missing in [&[][..], &[Capability::Split][..]] {
        let world = world_without(2, missing);
        let store = world.store();
        let sums = world.run(2, |rank, device| {
            let options = Options::builder().eager_init(true).build();
            let parent =
                ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 2, device.clone(), options).expect("group");
            let child = parent.new_group(&[0, 1], Options::default()).expect("new_group").expect("a member");
            let buffer = device.alloc(DType::F32, 4).expect("alloc");
            device.fill(&buffer, rank as f64 + 1.0, &device.current_stream()).expect("fill");
            child.all_reduce_sync(&buffer, ReduceOp::Sum).expect("all_reduce");
            let bytes = device.copy_to_host(&buffer, &device.current_stream()).expect("read");
            child.shutdown().expect("shutdown");
            parent.shutdown().expect("shutdown");
            f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
        });
        assert_eq!(sums, vec![3.0, 3.0], "without {missing:?}");
    }
}

#[test]
fn without_revoke_a_revoked_group_refuses_ops_as_revoked() {
    let world = world_without(1, &[Capability::Revoke]);
    let store = world.store();
    world.run(1, |_, device| {
        let options = Options::builder().eager_init(true).build();
        let group = ProcessGroup::<Mock>::new(Arc::clone(&store), 0, 1, device.clone(), options).expect("group");
        group.revoke("the test revokes");
        assert!(group.is_revoked());
        let buffer = device.alloc(DType::F32, 4).expect("alloc");
        let refused = group.all_reduce(&buffer, ReduceOp::Sum).expect_err("a revoked group refuses ops");
        assert_eq!(refused.kind(), ErrorKind::Revoked, "{refused}");
    });
}

#[test]
fn the_torch_named_forms_run_the_nccl_named_ops() {
    let world = World::new(WorldConfig { devices: 2, ..Default::default() });
    let store = world.store();
    let outputs = world.run(2, |rank, device| {
        let group =
            ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 2, device.clone(), Options::default()).expect("group");
        let stream = device.current_stream();
        let read = |buffer| -> Vec<f32> {
            let bytes = device.copy_to_host(buffer, &stream).expect("read");
            bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        };
        let input = device.alloc(DType::F32, 2).expect("alloc");
        device.fill(&input, rank as f64 + 1.0, &stream).expect("fill");
        let (gathered, by_torch) =
            (device.alloc(DType::F32, 4).expect("alloc"), device.alloc(DType::F32, 4).expect("alloc"));
        group.all_gather(&input, &gathered).and_then(|w| w.wait()).expect("all_gather");
        group.all_gather_into_tensor(&by_torch, &input).and_then(|w| w.wait()).expect("all_gather_into_tensor");
        let (scattered, by_torch_rs) =
            (device.alloc(DType::F32, 2).expect("alloc"), device.alloc(DType::F32, 2).expect("alloc"));
        group.reduce_scatter(&gathered, &scattered, ReduceOp::Sum).and_then(|w| w.wait()).expect("reduce_scatter");
        group
            .reduce_scatter_tensor(&by_torch_rs, &gathered, ReduceOp::Sum)
            .and_then(|w| w.wait())
            .expect("reduce_scatter_tensor");
        let seen = (read(&gathered), read(&by_torch), read(&scattered), read(&by_torch_rs));
        group.shutdown().expect("shutdown");
        seen
    });
    for (rank, (gathered, by_torch, scattered, by_torch_rs)) in outputs.into_iter().enumerate() {
        assert_eq!(gathered, vec![1.0, 1.0, 2.0, 2.0]);
        assert_eq!(by_torch, gathered);
        let want = if rank == 0 { 2.0 } else { 4.0 };
        assert_eq!(scattered, vec![want, want]);
        assert_eq!(by_torch_rs, scattered);
    }
}

//! Subgroups on the simulated backend: `new_group`, `split_by_color`, the rank maps and a 2 x 4 `DeviceMesh`,
//! each checked with real data.

use std::sync::Arc;

use pg_core::store::{PrefixStore, Store};
use pg_core::{DType, Device, DeviceMesh, ErrorKind, Options, ProcessGroup, ReduceOp};
use pg_mock::{HazardMode, Mock, MockBuffer, MockDevice, World, WorldConfig};

fn world(n: usize) -> World {
    World::new(WorldConfig { devices: n, hazard_mode: HazardMode::Panic, ..Default::default() })
}

fn group(store: &Arc<dyn Store>, rank: usize, size: usize, device: &MockDevice) -> ProcessGroup<Mock> {
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new("world", Arc::clone(store)));
    ProcessGroup::new(store, rank, size, device.clone(), Options::builder().build()).expect("world group")
}

fn filled(device: &MockDevice, value: f64) -> MockBuffer {
    let buffer = device.alloc(DType::F32, 16).expect("alloc");
    device.fill(&buffer, value, &device.current_stream()).expect("fill");
    buffer
}

fn first(device: &MockDevice, buffer: &MockBuffer) -> f32 {
    let bytes = device.copy_to_host(buffer, &device.current_stream()).expect("copy_to_host");
    let values: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert!(values.iter().all(|v| *v == values[0]), "every element reduced alike: {values:?}");
    values[0]
}

/// The sum over `ranks` of `rank + 1`.
fn sum_of(ranks: &[usize]) -> f32 {
    ranks.iter().map(|rank| (rank + 1) as f32).sum()
}

#[test]
fn new_group_gives_members_a_group_and_others_none() {
    let w = world(4);
    let store = w.store();
    let results = w.run(4, |rank, device| {
        let world = group(&store, rank, 4, &device);
        // Unsorted on purpose: group ranks follow ascending world ranks.
        let odd = world.new_group(&[3, 1], Options::builder().build()).expect("new_group");
        let even = world.new_group(&[0, 2], Options::builder().build()).expect("new_group");
        let mine = odd.as_ref().or(even.as_ref()).expect("a member of one of the two");
        assert_eq!(odd.is_some(), rank % 2 == 1);
        assert_eq!(even.is_some(), rank % 2 == 0);
        assert_eq!(mine.size(), 2);
        assert_eq!(mine.rank(), rank / 2, "group rank = position among the sorted members");
        assert_eq!(mine.global_rank(mine.rank()).unwrap(), rank);
        assert_eq!(mine.group_rank(rank), Some(rank / 2));
        assert_eq!(mine.group_rank((rank + 1) % 4), None, "a rank of the other parity is not a member");
        assert_eq!(mine.global_ranks(), if rank % 2 == 1 { vec![1, 3] } else { vec![0, 2] });
        assert_ne!(mine.options().group_name, world.options().group_name, "a subgroup gets a name of its own");
        let buffer = filled(&device, (rank + 1) as f64);
        mine.all_reduce_sync(&buffer, ReduceOp::Sum).expect("all_reduce in the subgroup");
        let parity: Vec<usize> = (0..4).filter(|r| r % 2 == rank % 2).collect();
        assert_eq!(first(&device, &buffer), sum_of(&parity));
        assert_eq!(world.counters().comms_created, 0, "the parent created nothing");
        mine.counters().comms_created
    });
    assert_eq!(results, vec![1; 4], "one communicator per member, created at the first op");
}

#[test]
fn a_subgroup_of_a_subgroup_maps_to_world_ranks() {
    let w = world(4);
    let store = w.store();
    w.run(4, |rank, device| {
        let world = group(&store, rank, 4, &device);
        let upper = world.new_group(&[1, 2, 3], Options::builder().build()).expect("new_group");
        let Some(upper) = upper else {
            assert_eq!(rank, 0);
            return;
        };
        let pair = upper.new_group(&[1, 2], Options::builder().build()).expect("nested new_group");
        if let Some(pair) = pair {
            assert_eq!(pair.global_ranks(), vec![2, 3], "group ranks 1 and 2 of [1, 2, 3] are world ranks 2 and 3");
            let buffer = filled(&device, (rank + 1) as f64);
            pair.all_reduce_sync(&buffer, ReduceOp::Sum).expect("all_reduce");
            assert_eq!(first(&device, &buffer), sum_of(&[2, 3]));
        } else {
            assert_eq!(rank, 1);
        }
    });
}

#[test]
fn split_by_color_groups_ranks_of_the_same_color() {
    let w = world(4);
    let store = w.store();
    w.run(4, |rank, device| {
        let world = group(&store, rank, 4, &device);
        // Ranks 0 and 3 together, rank 1 alone, rank 2 in no group.
        let color = match rank {
            0 | 3 => Some(7),
            1 => Some(1),
            _ => None,
        };
        let split = world.split_by_color(color, Options::builder().build()).expect("split");
        match rank {
            2 => assert!(split.is_none()),
            1 => assert_eq!(split.expect("a group").size(), 1),
            _ => {
                let split = split.expect("a group");
                assert_eq!(split.global_ranks(), vec![0, 3]);
                let buffer = filled(&device, (rank + 1) as f64);
                split.all_reduce_sync(&buffer, ReduceOp::Sum).expect("all_reduce");
                assert_eq!(first(&device, &buffer), sum_of(&[0, 3]));
            }
        }
    });
}

#[test]
fn a_2x4_mesh_gives_each_rank_its_row_and_column() {
    let w = world(8);
    let store = w.store();
    w.run(8, |rank, device| {
        let world = group(&store, rank, 8, &device);
        let mesh = DeviceMesh::new(&world, &[("dp", 2), ("tp", 4)], &Options::builder().build()).expect("mesh");
        assert_eq!(mesh.coordinate(), [rank / 4, rank % 4]);
        let tp = mesh.group_named("tp").expect("tp");
        let dp = mesh.group_named("dp").expect("dp");
        let row: Vec<usize> = (0..4).map(|c| rank / 4 * 4 + c).collect();
        let column: Vec<usize> = (0..2).map(|r| r * 4 + rank % 4).collect();
        assert_eq!(tp.global_ranks(), row);
        assert_eq!(dp.global_ranks(), column);
        assert_eq!((tp.rank(), dp.rank()), (rank % 4, rank / 4));
        for (group, members) in [(tp, &row), (dp, &column)] {
            let buffer = filled(&device, (rank + 1) as f64);
            group.all_reduce_sync(&buffer, ReduceOp::Sum).expect("all_reduce");
            assert_eq!(first(&device, &buffer), sum_of(members));
        }
        // The whole world still works beside its subgroups.
        let buffer = filled(&device, (rank + 1) as f64);
        world.all_reduce_sync(&buffer, ReduceOp::Sum).expect("world all_reduce");
        assert_eq!(first(&device, &buffer), sum_of(&(0..8).collect::<Vec<_>>()));
    });
}

#[test]
fn bad_subgroup_arguments_are_refused_by_name() {
    let w = world(2);
    let store = w.store();
    w.run(2, |rank, device| {
        let world = group(&store, rank, 2, &device);
        let cases: [(&[usize], &str); 3] = [(&[], "empty"), (&[0, 2], "out of range"), (&[1, 1], "listed twice")];
        for (ranks, words) in cases {
            let error = world.new_group(ranks, Options::builder().build()).expect_err("refused");
            assert_eq!(error.kind(), ErrorKind::InvalidArgument);
            assert!(error.to_string().contains(words), "{error}");
        }
        assert!(world.global_rank(2).unwrap_err().to_string().contains("out of range"));
        assert_eq!(world.group_rank(5), None);
        let bad_shapes: [&[(&str, usize)]; 4] = [&[], &[("dp", 3)], &[("dp", 0), ("tp", 2)], &[("x", 1), ("x", 2)]];
        for dims in bad_shapes {
            let error = DeviceMesh::new(&world, dims, &Options::builder().build()).expect_err("refused");
            assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{dims:?}: {error}");
        }
        let mesh = DeviceMesh::new(&world, &[("dp", 2)], &Options::builder().build()).expect("mesh");
        assert!(mesh.group(1).is_err() && mesh.group_named("tp").is_err());
    });
}

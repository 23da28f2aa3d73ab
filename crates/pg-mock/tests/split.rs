//! `Communicator::split` on the simulated backend: ranks of one color form a communicator ordered by key, a
//! rank with no color gets none, and the children reduce real data over their members only.

use pg_core::{Communicator as _, DType, Device as _, ReduceOp, UniqueId};
use pg_mock::{decode, encode, HazardMode, World, WorldConfig};

#[test]
fn split_orders_each_color_by_key_and_leaves_no_color_out() {
    let w = World::new(WorldConfig { devices: 4, hazard_mode: HazardMode::Panic, ..Default::default() });
    let store = w.store();
    let results = w.run(4, |rank, device| {
        let id = match rank {
            0 => {
                let id = device.new_unique_id().expect("unique id");
                store.set("id", &id.0).expect("set");
                id
            }
            _ => UniqueId(store.get("id").expect("get")),
        };
        let parent = device.create_communicator(&id, 4, rank, &Default::default()).expect("communicator");
        // Ranks 0, 1 and 3 share a color; rank 2 has none. Keys run backwards, so the child's order is 3, 1, 0.
        let color = (rank != 2).then_some(9);
        let child = parent.split(color, 10 - rank, &Default::default()).expect("split");
        let stream = device.current_stream();
        // The parent still works after the split, on every rank.
        let one = device.alloc(DType::F32, 1).expect("alloc");
        device.fill(&one, 1.0, &stream).expect("fill");
        parent.all_reduce(&one, &one, ReduceOp::Sum, &stream).expect("all_reduce on the parent");
        let parent_sum = decode(DType::F32, &device.copy_to_host(&one, &stream).expect("read"))[0];
        assert_eq!(parent_sum, 4.0);
        let Some(child) = child else {
            assert_eq!(rank, 2, "only the rank with no color gets no communicator");
            return None;
        };
        let buffer = device.alloc(DType::F32, 1).expect("alloc");
        device.copy_from_host(&buffer, &encode(DType::F32, &[(rank + 1) as f64]), &stream).expect("copy");
        child.all_reduce(&buffer, &buffer, ReduceOp::Sum, &stream).expect("all_reduce on the child");
        let sum = decode(DType::F32, &device.copy_to_host(&buffer, &stream).expect("read"))[0];
        Some((child.rank(), child.size(), sum))
    });
    let sum = 1.0 + 2.0 + 4.0;
    assert_eq!(
        results,
        vec![Some((2, 3, sum)), Some((1, 3, sum)), None, Some((0, 3, sum))],
        "child rank by descending key, size 3, a sum over ranks 0, 1 and 3 only"
    );
}

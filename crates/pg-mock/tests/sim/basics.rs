//! Smoke tests: an all-reduce across four ranks with real data and virtual time.

use pg_core::{Communicator as _, DType, Device as _, ReduceOp};

use crate::common::{buffer, comm, read, world};

#[test]
fn all_reduce_sums_across_ranks() {
    let w = world(4);
    let store = w.store();
    let out = w.run(4, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 4);
        let b = buffer(&device, DType::F32, &[rank as f64, 1.0]);
        let s = device.current_stream();
        c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
        (read(&device, &b, &s), device.now())
    });
    for (values, _) in &out {
        assert_eq!(values, &vec![6.0, 4.0]);
    }
    println!("{out:?}");
}

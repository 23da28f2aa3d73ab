//! Long runs keep memory flat: finished operations nobody refers to are pruned, freed blocks are reused, and a
//! host that runs far ahead is held back by the launch queue.

use std::time::Duration;

use pg_core::{Communicator as _, DType, Device as _, Event as _, ReduceOp, Stream as _};
use pg_mock::{World, WorldConfig};

use crate::common::comm;

const STEPS: usize = 5_000;
const DEPTH: usize = 64;

#[test]
fn fifty_thousand_never_waited_ops_keep_memory_flat() {
    let w = World::new(WorldConfig { launch_queue_depth: DEPTH, ..WorldConfig::with_devices(2) });
    let store = w.store();
    let probe = w.clone();
    let peaks = w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let comm_stream = device.stream_from_pool(false).unwrap();
        let current = device.current_stream();
        let mut peaks = Vec::new();
        let mut peak = 0;
        // Five operations per step (fill, wait, all_reduce, wait, sleep), two ranks: 50,000 operations.
        for i in 0..STEPS {
            let b = device.alloc(DType::F32, 64).unwrap();
            device.fill(&b, i as f64, &current).unwrap();
            let ready = device.create_event();
            ready.record(&current).unwrap();
            comm_stream.wait_event(&ready).unwrap();
            c.all_reduce(&b, &b, ReduceOp::Sum, &comm_stream).unwrap();
            device.record_stream(&b, &comm_stream).unwrap();
            let end = device.create_event();
            end.record(&comm_stream).unwrap();
            current.wait_event(&end).unwrap();
            device.sleep_kernel(&current, Duration::from_micros(1)).unwrap();
            if i % 500 == 499 {
                peak = peak.max(probe.retained_ops()).max(probe.memory_blocks());
                peaks.push(peak);
            }
        }
        device.synchronize().unwrap();
        peaks
    });
    for peaks in &peaks {
        // Bounded by the launch-queue depth, whatever the number of steps (how close the bound is reached
        // depends on how far one rank's host runs ahead of the other's, in real time).
        assert!(peaks.iter().all(|p| *p < 8 * DEPTH), "memory grew: {peaks:?}");
    }
    assert!(w.kernel_log(0).len() <= w.config().kernel_log_capacity);
    assert!(w.retained_ops() <= 8, "after the final synchronize only the streams' last ops stay");
}

//! The process group's lifetime guard as the allocator sees it: which streams it records on a buffer's block.

use std::sync::Arc;

use pg_core::{DType, Device as _, Options, ProcessGroup, ReduceOp, Stream as _};
use pg_mock::{Mock, MockDevice};
use pg_store::PrefixStore;

use crate::common::{buffer, world};

/// The streams recorded on a buffer after an all_reduce and after a send or a receive, on rank `rank`.
fn recorded_after_ops(avoid_record_streams: bool) -> Vec<(Vec<u64>, Vec<u64>, u64)> {
    let w = world(2);
    let store = w.store();
    w.run(2, move |rank, device: MockDevice| {
        let options = Options::builder().avoid_record_streams(avoid_record_streams).build();
        let store = Arc::new(PrefixStore::new("guard", Arc::clone(&store)));
        let pg = ProcessGroup::<Mock>::new(store, rank, 2, device.clone(), options).unwrap();
        let collective = buffer(&device, DType::F32, &[1.0; 8]);
        let work = pg.all_reduce(&collective, ReduceOp::Sum).unwrap();
        work.wait().unwrap();
        let comm_stream = work.comm_stream().id();
        let p2p = buffer(&device, DType::F32, &[1.0; 8]);
        let work = match rank {
            0 => pg.send(&p2p, 1).unwrap(),
            _ => pg.recv(&p2p, 0).unwrap(),
        };
        work.wait().unwrap();
        device.synchronize().unwrap();
        (device.recorded_streams(&collective), device.recorded_streams(&p2p), comm_stream)
    })
}

#[test]
fn collectives_record_the_communication_stream_on_their_buffers() {
    for (rank, (collective, _, comm_stream)) in recorded_after_ops(false).into_iter().enumerate() {
        assert_eq!(collective, vec![comm_stream], "rank {rank}");
    }
}

#[test]
fn avoiding_record_streams_stashes_collective_buffers_but_point_to_point_still_records() {
    // As PyTorch's TORCH_NCCL_AVOID_RECORD_STREAMS: the Work keeps a collective's buffers instead; a send or a
    // receive still records the stream it runs on.
    for (rank, (collective, p2p, _)) in recorded_after_ops(true).into_iter().enumerate() {
        assert!(collective.is_empty(), "rank {rank}: a collective recorded {collective:?}");
        assert_eq!(p2p.len(), 1, "rank {rank}: a point-to-point op recorded {p2p:?}");
    }
}

#[test]
fn a_premul_sum_factor_records_the_communication_stream() {
    // The factor is read on the communication stream: its block waits for that stream before reuse, however
    // soon the caller drops it.
    let w = world(1);
    let store = w.store();
    let seen = w.run(1, move |rank, device: MockDevice| {
        let store = Arc::new(PrefixStore::new("factor", Arc::clone(&store)));
        let pg = ProcessGroup::<Mock>::new(store, rank, 1, device.clone(), Options::builder().build()).unwrap();
        let data = buffer(&device, DType::F32, &[1.0; 8]);
        let factor = buffer(&device, DType::F32, &[0.5]);
        let work = pg.all_reduce_pre_mul_sum(&data, &factor).unwrap();
        work.wait().unwrap();
        device.synchronize().unwrap();
        (device.recorded_streams(&factor), work.comm_stream().id())
    });
    let (recorded, comm_stream) = &seen[0];
    assert_eq!(recorded, &vec![*comm_stream]);
}

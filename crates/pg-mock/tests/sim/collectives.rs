//! What only the simulator does with collectives: a mismatch between ranks becomes the communicator's async
//! error, and an op takes the cost model's time. (Each op's results and bad-input errors are conformance cases.)

use pg_core::{Communicator as _, DType, Device as _, ErrorKind, ReduceOp};
use pg_mock::MockCommunicator;

use crate::common::{comm, world};

/// What one rank does in a mismatch case.
type Body = fn(&MockCommunicator, usize, &pg_mock::MockDevice);

#[test]
fn a_mismatch_becomes_the_communicators_async_error() {
    let cases: &[(&str, Body, &str)] = &[
        (
            "different ops",
            |c, rank, d| {
                let b = d.alloc(DType::F32, 4).unwrap();
                let s = d.current_stream();
                match rank {
                    0 => c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap(),
                    _ => c.broadcast(&b, &b, 0, &s).unwrap(),
                }
            },
            "rank 0 called all_reduce(Float, 4 -> 4 elements, SUM) but rank 1 called broadcast(Float, 4 -> 4 elements, root 0)",
        ),
        (
            "different sizes",
            |c, rank, d| {
                let b = d.alloc(DType::F32, 4 + rank).unwrap();
                c.all_reduce(&b, &b, ReduceOp::Sum, &d.current_stream()).unwrap();
            },
            "rank 0 called all_reduce(Float, 4 -> 4 elements, SUM) but rank 1 called all_reduce(Float, 5 -> 5 elements, SUM)",
        ),
        (
            "different dtypes",
            |c, rank, d| {
                let b = d.alloc(if rank == 0 { DType::F32 } else { DType::I32 }, 4).unwrap();
                c.all_reduce(&b, &b, ReduceOp::Max, &d.current_stream()).unwrap();
            },
            "but rank 1 called all_reduce(Int, 4 -> 4 elements, MAX)",
        ),
    ];
    for (name, body, expected) in cases {
        let w = world(2);
        let store = w.store();
        let body = *body;
        let errors = w.run(2, move |rank, device| {
            let c = comm(&store, "id", &device, rank, 2);
            body(&c, rank, &device);
            // Let some time pass, then look at the error as a watchdog would, and release the op.
            device.sleep(std::time::Duration::from_millis(1), &Default::default());
            let error = c.async_error().unwrap_err();
            c.abort("mismatch").unwrap();
            device.current_stream();
            device.synchronize().unwrap();
            assert!(c.async_error().is_ok(), "an aborted communicator reports no async error");
            (error.kind(), error.to_string())
        });
        for (kind, message) in errors {
            assert_eq!(kind, ErrorKind::Communicator, "{name}");
            assert!(message.contains(expected), "{name}: {message}");
        }
    }
}

#[test]
fn an_all_reduce_takes_the_cost_model_time() {
    // 1 MiB on 4 ranks: 10 us + 2 * 3/4 * 1 MiB / 300 GB/s = 10 us + 5.243 us.
    let w = world(4);
    let store = w.store();
    w.run(4, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 4);
        let b = device.alloc(DType::F32, 1 << 18).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Sum, &device.current_stream()).unwrap();
        device.synchronize().unwrap();
    });
    let log = w.kernel_log(0);
    let k = log.iter().find(|k| k.name == "all_reduce").unwrap();
    assert_eq!(k.end - k.start, std::time::Duration::from_nanos(10_000 + 5_243));
}

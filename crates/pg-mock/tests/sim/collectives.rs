//! Collectives compute real results across ranks, for every op and dtype; mismatches become async errors.

use pg_core::{Communicator as _, DType, Device as _, ErrorKind, ReduceOp};
use pg_mock::MockCommunicator;

use crate::common::{buffer, comm, read, world};

/// What one rank does in a case.
#[derive(Clone, Copy)]
enum Op {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
    /// Rank 0 sends to the last rank.
    SendRecv,
}

/// Runs `op` on `n` ranks whose inputs are `input(rank)` and compares every rank's output with `expected(rank)`.
fn check(n: usize, dtype: DType, op: Op, input: fn(usize) -> Vec<f64>, expected: &[Vec<f64>]) {
    let w = world(n);
    let store = w.store();
    let numels: Vec<usize> = expected.iter().map(Vec::len).collect();
    let got = w.run(n, move |rank, device| {
        let c: MockCommunicator = comm(&store, "id", &device, rank, n);
        let s = device.current_stream();
        let inp = buffer(&device, dtype, &input(rank));
        let out = device.alloc(dtype, numels[rank]).unwrap();
        match op {
            Op::AllReduce(r) => c.all_reduce(&inp, &out, r, &s).unwrap(),
            Op::Broadcast(root) => c.broadcast(&inp, &out, root, &s).unwrap(),
            Op::AllGather => c.all_gather(&inp, &out, &s).unwrap(),
            Op::ReduceScatter(r) => c.reduce_scatter(&inp, &out, r, &s).unwrap(),
            Op::SendRecv if rank == 0 => c.send(&inp, n - 1, &s).unwrap(),
            Op::SendRecv if rank == n - 1 => c.recv(&out, 0, &s).unwrap(),
            Op::SendRecv => {}
        }
        read(&device, &out, &s)
    });
    for (rank, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g, e, "{dtype} rank {rank}");
    }
}

fn same(n: usize, values: &[f64]) -> Vec<Vec<f64>> {
    vec![values.to_vec(); n]
}

#[test]
fn all_reduce_every_op_and_dtype() {
    let input = |rank: usize| vec![rank as f64 + 1.0, 2.0, -(rank as f64)];
    let cases: &[(DType, ReduceOp, [f64; 3])] = &[
        (DType::F32, ReduceOp::Sum, [10.0, 8.0, -6.0]),
        (DType::F32, ReduceOp::Avg, [2.5, 2.0, -1.5]),
        (DType::F32, ReduceOp::Product, [24.0, 16.0, 0.0]),
        (DType::F32, ReduceOp::Min, [1.0, 2.0, -3.0]),
        (DType::F32, ReduceOp::Max, [4.0, 2.0, 0.0]),
        (DType::F64, ReduceOp::Sum, [10.0, 8.0, -6.0]),
        (DType::F64, ReduceOp::Avg, [2.5, 2.0, -1.5]),
        (DType::F16, ReduceOp::Sum, [10.0, 8.0, -6.0]),
        (DType::BF16, ReduceOp::Max, [4.0, 2.0, 0.0]),
        (DType::I32, ReduceOp::Sum, [10.0, 8.0, -6.0]),
        (DType::I32, ReduceOp::Avg, [2.0, 2.0, -1.0]),
        (DType::I64, ReduceOp::Product, [24.0, 16.0, 0.0]),
        (DType::I64, ReduceOp::Min, [1.0, 2.0, -3.0]),
        (DType::I8, ReduceOp::Max, [4.0, 2.0, 0.0]),
        (DType::U8, ReduceOp::Sum, [10.0, 8.0, 0.0]),
        (DType::Bool, ReduceOp::Sum, [1.0, 1.0, 1.0]),
        (DType::Bool, ReduceOp::Product, [1.0, 1.0, 0.0]),
        (DType::Bool, ReduceOp::Min, [1.0, 1.0, 0.0]),
    ];
    for (dtype, op, expected) in cases {
        check(4, *dtype, Op::AllReduce(*op), input, &same(4, expected));
    }
}

#[test]
fn other_collectives() {
    check(3, DType::F32, Op::Broadcast(1), |r| vec![r as f64; 2], &same(3, &[1.0, 1.0]));
    check(3, DType::I64, Op::AllGather, |r| vec![r as f64, 10.0], &same(3, &[0.0, 10.0, 1.0, 10.0, 2.0, 10.0]));
    check(
        2,
        DType::F64,
        Op::ReduceScatter(ReduceOp::Sum),
        |r| vec![r as f64, 1.0, 2.0, 3.0],
        &[vec![1.0, 2.0], vec![4.0, 6.0]],
    );
    check(3, DType::F32, Op::SendRecv, |r| vec![r as f64 + 5.0; 3], &[vec![0.0; 3], vec![0.0; 3], vec![5.0, 5.0, 5.0]]);
    check(1, DType::F32, Op::AllReduce(ReduceOp::Sum), |_| vec![3.0], &[vec![3.0]]);
}

#[test]
fn invalid_arguments_are_errors_not_panics() {
    let w = world(2);
    let store = w.store();
    let errors = w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let s = device.current_stream();
        let a = device.alloc(DType::F32, 4).unwrap();
        let b = device.alloc(DType::F32, 3).unwrap();
        let i = device.alloc(DType::I32, 4).unwrap();
        let bool4 = device.alloc(DType::Bool, 4).unwrap();
        let mut errors = vec![
            c.all_reduce(&a, &b, ReduceOp::Sum, &s).unwrap_err(),
            c.all_reduce(&a, &i, ReduceOp::Sum, &s).unwrap_err(),
            c.all_reduce(&a, &a, ReduceOp::BitAnd, &s).unwrap_err(),
            c.all_reduce(&bool4, &bool4, ReduceOp::Avg, &s).unwrap_err(),
            c.all_gather(&a, &a, &s).unwrap_err(),
            c.broadcast(&a, &a, 5, &s).unwrap_err(),
            c.send(&a, rank, &s).unwrap_err(),
            device.copy_from_host(&a, &[0u8; 3], &s).unwrap_err(),
        ];
        let other = device.world().device(1 - rank).stream_from_pool(false).unwrap();
        errors.push(device.fill(&a, 1.0, &other).unwrap_err());
        errors.into_iter().map(|e| (e.kind(), e.to_string())).collect::<Vec<_>>()
    });
    for (kind, message) in &errors[0] {
        assert_eq!(*kind, ErrorKind::InvalidArgument, "{message}");
    }
    let messages: Vec<&str> = errors[0].iter().map(|(_, m)| m.as_str()).collect();
    assert!(messages[0].contains("output has 3 elements, expected 4"), "{}", messages[0]);
    assert!(messages[1].contains("input dtype Float differs from output dtype Int"), "{}", messages[1]);
    assert!(messages[2].contains("Cannot use ReduceOp.BAND with NCCL"), "{}", messages[2]);
    assert!(messages[7].contains("3 bytes given for buffer"), "{}", messages[7]);
    assert!(messages[8].contains("belongs to device"), "{}", messages[8]);
}

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

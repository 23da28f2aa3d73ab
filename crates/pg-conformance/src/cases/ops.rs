//! Every op's results, on the backend's communicator and through the process group, and the backend's
//! bad-input errors.

use pg_core::{Backend, Buffer as _, Communicator as _, DType, Device as _, ErrorKind, Options, ReduceOp};

use super::{all_equal, case, communicator, on_each_rank, triangle};
use crate::case::{pass, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(all_reduce_every_op_and_dtype, 1),
        case!(broadcast_all_gather_reduce_scatter_and_send_recv_move_the_right_data, 1),
        case!(backend_refuses_bad_arguments_with_typed_errors, 1),
        case!(all_gather_and_reduce_scatter_succeed_through_the_group, 1),
        case!(broadcast_and_send_recv_succeed_through_the_group, 1),
    ]
}

/// What rank `rank` contributes in the all_reduce cases: the last element is negative for signed types.
fn input(rank: usize, dtype: DType) -> Vec<f64> {
    let third = match dtype {
        DType::U8 | DType::Bool => (rank % 2) as f64,
        _ => -(rank as f64),
    };
    vec![rank as f64 + 1.0, 2.0, third]
}

/// The element-wise reduction of the ranks' inputs, as the dtype computes it.
fn reference(n: usize, dtype: DType, op: ReduceOp) -> Vec<f64> {
    let integer = matches!(dtype, DType::I8 | DType::U8 | DType::I32 | DType::I64);
    let columns = input(0, dtype).len();
    (0..columns)
        .map(|c| {
            let values: Vec<f64> = (0..n).map(|rank| input(rank, dtype)[c]).collect();
            let values: Vec<f64> = match dtype {
                DType::Bool => values.iter().map(|v| f64::from(u8::from(*v != 0.0))).collect(),
                _ => values,
            };
            let sum: f64 = values.iter().sum();
            let value = match op {
                ReduceOp::Sum => sum,
                ReduceOp::Avg if integer => (sum / n as f64).trunc(),
                ReduceOp::Avg => sum / n as f64,
                ReduceOp::Product => values.iter().product(),
                ReduceOp::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor | ReduceOp::PreMulSum(_) => f64::NAN,
            };
            match dtype {
                DType::Bool => f64::from(u8::from(value != 0.0)),
                _ => value,
            }
        })
        .collect()
}

/// Whether `got` is `want` to the dtype's precision.
fn close(dtype: DType, got: &[f64], want: &[f64]) -> bool {
    let tolerance = match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-6,
        // NCCL averages floats as a sum of each input times 1/n (PREMUL_SUM), so an f64 average may differ from the
        // sum divided by n in the last bit (6/3 gives 1.9999999999999998 at world 3).
        DType::F64 => 1e-15,
        _ => 0.0,
    };
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= tolerance * w.abs().max(1.0))
}

fn all_reduce_every_op_and_dtype<H: Harness>(h: &H) -> Check<Outcome> {
    let cases: &[(DType, ReduceOp)] = &[
        (DType::F32, ReduceOp::Sum),
        (DType::F32, ReduceOp::Avg),
        (DType::F32, ReduceOp::Product),
        (DType::F32, ReduceOp::Min),
        (DType::F32, ReduceOp::Max),
        (DType::F64, ReduceOp::Sum),
        (DType::F64, ReduceOp::Avg),
        (DType::F16, ReduceOp::Sum),
        (DType::BF16, ReduceOp::Max),
        (DType::I32, ReduceOp::Sum),
        (DType::I32, ReduceOp::Avg),
        (DType::I64, ReduceOp::Product),
        (DType::I64, ReduceOp::Min),
        (DType::I8, ReduceOp::Max),
        (DType::U8, ReduceOp::Sum),
        (DType::Bool, ReduceOp::Sum),
        (DType::Bool, ReduceOp::Product),
        (DType::Bool, ReduceOp::Min),
    ];
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let comm = communicator(r, "all_reduce")?;
        let stream = r.device.current_stream();
        for &(dtype, op) in cases {
            let inp = r.holding(dtype, &input(r.rank, dtype))?;
            let out = r.device.alloc(dtype, 3).ctx("alloc")?;
            comm.all_reduce(&inp, &out, op, &stream).ctx(&format!("{dtype} {}", op.torch_name()))?;
            let got = r.read(&out)?;
            let want = reference(n, dtype, op);
            ensure!(close(dtype, &got, &want), "{dtype} {}: got {got:?}, want {want:?}", op.torch_name());
        }
        Ok(())
    })
}

fn broadcast_all_gather_reduce_scatter_and_send_recv_move_the_right_data<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let comm = communicator(r, "others")?;
        let stream = r.device.current_stream();
        let rank = r.rank as f64;
        // Broadcast from the last rank.
        let root = n - 1;
        let inp = r.holding(DType::F32, &[rank; 2])?;
        let out = r.device.alloc(DType::F32, 2).ctx("alloc")?;
        comm.broadcast(&inp, &out, root, &stream).ctx("broadcast")?;
        ensure_eq!(r.read(&out)?, vec![root as f64; 2], "broadcast from rank {root}");
        // All-gather: every rank's [rank, 10], in rank order.
        let inp = r.holding(DType::I64, &[rank, 10.0])?;
        let out = r.device.alloc(DType::I64, 2 * n).ctx("alloc")?;
        comm.all_gather(&inp, &out, &stream).ctx("all_gather")?;
        let want: Vec<f64> = (0..n).flat_map(|k| [k as f64, 10.0]).collect();
        ensure_eq!(r.read(&out)?, want, "all_gather");
        // Reduce-scatter: element j of every rank is rank + j; rank k gets the sums of block k.
        let inp = r.holding(DType::F64, &(0..2 * n).map(|j| rank + j as f64).collect::<Vec<_>>())?;
        let out = r.device.alloc(DType::F64, 2).ctx("alloc")?;
        comm.reduce_scatter(&inp, &out, ReduceOp::Sum, &stream).ctx("reduce_scatter")?;
        let sum_of_ranks = triangle(n) - n as f64;
        let want: Vec<f64> = (0..2).map(|i| sum_of_ranks + (n * (2 * r.rank + i)) as f64).collect();
        ensure_eq!(r.read(&out)?, want, "reduce_scatter");
        // Send/recv: rank 0 sends to the last rank; the others' buffers stay as they were.
        if n > 1 {
            let inp = r.holding(DType::F32, &[rank + 5.0; 3])?;
            let out = r.holding(DType::F32, &[0.0; 3])?;
            match r.rank {
                0 => comm.send(&inp, n - 1, &stream).ctx("send")?,
                k if k == n - 1 => comm.recv(&out, 0, &stream).ctx("recv")?,
                _ => {}
            }
            let want = if r.rank == n - 1 { 5.0 } else { 0.0 };
            all_equal(&r.read(&out)?, want).map_err(|e| format!("send/recv: {e}"))?;
        }
        Ok(())
    })
}

fn refused<T>(what: &str, result: pg_core::Result<T>) -> Check {
    match result {
        Ok(_) => Err(format!("{what}: accepted")),
        Err(error) if error.kind() == ErrorKind::InvalidArgument => Ok(()),
        Err(error) => Err(format!("{what}: {:?} instead of InvalidArgument: {error}", error.kind())),
    }
}

fn backend_refuses_bad_arguments_with_typed_errors<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let other_device = h.offers().other_device;
    on_each_rank(h, n, |r| {
        let comm = communicator(r, "bad")?;
        let s = r.device.current_stream();
        let a = r.device.alloc(DType::F32, 4).ctx("alloc")?;
        let b = r.device.alloc(DType::F32, 3).ctx("alloc")?;
        let i = r.device.alloc(DType::I32, 4).ctx("alloc")?;
        let bool4 = r.device.alloc(DType::Bool, 4).ctx("alloc")?;
        refused("all_reduce into a smaller output", comm.all_reduce(&a, &b, ReduceOp::Sum, &s))?;
        refused("all_reduce across dtypes", comm.all_reduce(&a, &i, ReduceOp::Sum, &s))?;
        refused("all_reduce with BAND", comm.all_reduce(&a, &a, ReduceOp::BitAnd, &s))?;
        refused("all_reduce AVG on bool", comm.all_reduce(&bool4, &bool4, ReduceOp::Avg, &s))?;
        if n > 1 {
            refused("all_gather into an output of the input's size", comm.all_gather(&a, &a, &s))?;
        }
        refused("broadcast from a root out of range", comm.broadcast(&a, &a, n + 4, &s))?;
        refused("send to itself", comm.send(&a, r.rank, &s))?;
        refused("copy_from_host of the wrong length", r.device.copy_from_host(&a, &[0u8; 3], &s))?;
        if let Some(other) = r.caps.other_device(r.rank).filter(|_| other_device) {
            let foreign = other.stream_from_pool(false).ctx("stream")?;
            refused("fill on another device's stream", r.device.fill(&a, 1.0, &foreign))?;
            let theirs = other.alloc(DType::F32, 4).ctx("alloc")?;
            ensure!(theirs.device_index() != r.device.index(), "the other device has this device's index");
            refused("all_reduce of another device's buffer", comm.all_reduce(&theirs, &theirs, ReduceOp::Sum, &s))?;
        }
        // After every refusal the communicator still works.
        let ok = r.holding(DType::F32, &[1.0; 4])?;
        comm.all_reduce(&ok, &ok, ReduceOp::Sum, &s).ctx("all_reduce after the refusals")?;
        all_equal(&r.read(&ok)?, n as f64)
    })
}

/// Reads `buffer` through a group-op check: `want` element-wise.
fn expect<B: Backend>(r: &Rank<B>, what: &str, buffer: &B::Buffer, want: &[f64]) -> Check {
    let got = r.read(buffer)?;
    ensure!(got == want, "{what}: got {got:?}, want {want:?}");
    Ok(())
}

fn all_gather_and_reduce_scatter_succeed_through_the_group<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("0", Options::builder())?;
        let rank = r.rank as f64;
        let input = r.holding(DType::F32, &[rank, rank + 0.5])?;
        let gathered = r.device.alloc(DType::F32, 2 * n).ctx("alloc")?;
        let work = group.all_gather(&input, &gathered).ctx("all_gather")?;
        ensure_eq!(work.op_type(), pg_core::OpType::AllGatherBase, "the all_gather's op type");
        work.wait().ctx("wait")?;
        let want: Vec<f64> = (0..n).flat_map(|k| [k as f64, k as f64 + 0.5]).collect();
        expect(r, "all_gather", &gathered, &want)?;
        let input = r.holding(DType::F32, &(0..3 * n).map(|j| (j + r.rank) as f64).collect::<Vec<_>>())?;
        let scattered = r.device.alloc(DType::F32, 3).ctx("alloc")?;
        let work = group.reduce_scatter(&input, &scattered, ReduceOp::Sum).ctx("reduce_scatter")?;
        ensure_eq!(work.op_type(), pg_core::OpType::ReduceScatterBase, "the reduce_scatter's op type");
        work.wait().ctx("wait")?;
        let sum_of_ranks = triangle(n) - n as f64;
        let want: Vec<f64> = (0..3).map(|i| sum_of_ranks + (n * (3 * r.rank + i)) as f64).collect();
        expect(r, "reduce_scatter", &scattered, &want)?;
        ensure_eq!(work.seq(), 2, "collectives count from 1 in the group");
        ensure_eq!(group.counters().ops_issued, 2, "ops issued");
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn broadcast_and_send_recv_succeed_through_the_group<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("0", Options::builder())?;
        let root = n - 1;
        let buffer = r.holding(DType::F32, &[r.rank as f64 + 1.0; 8])?;
        group.broadcast(&buffer, root).and_then(|w| w.wait()).ctx("broadcast")?;
        expect(r, "broadcast", &buffer, &[n as f64; 8])?;
        if n > 1 && r.rank < 2 {
            let data = r.holding(DType::I64, &[r.rank as f64 * 10.0 + 3.0; 5])?;
            let work = match r.rank {
                0 => group.send(&data, 1).ctx("send")?,
                _ => group.recv(&data, 0).ctx("recv")?,
            };
            ensure_eq!(work.seq(), 1, "point-to-point ops count apart from collectives, from 1");
            work.wait().ctx("wait")?;
            expect(r, "send/recv", &data, &[3.0; 5])?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

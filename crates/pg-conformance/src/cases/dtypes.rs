//! Every dtype through the group's ops (unsigned and fp8 included) and `PREMUL_SUM` with host and device
//! factors.
//!
//! Every case holds at any world size: its values fit the dtype whatever the number of ranks and whatever order
//! the backend adds them in, or its expectation is computed in the dtype's own arithmetic (integer sums wrap).

use pg_core::{Backend, DType, Device as _, Error, ErrorKind, Options, ProcessGroup, ReduceOp};

use super::case;
use crate::case::{not_applicable, pass, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(every_dtype_moves_through_broadcast_and_all_gather, 1),
        case!(every_dtype_but_fp8_all_reduces_with_real_values, 1),
        case!(fp8_all_reduce_rounds_and_saturates_as_nccl_or_is_refused_with_the_version, 1),
        case!(pre_mul_sum_scales_each_rank_by_its_host_or_device_factor, 1),
        case!(pre_mul_sum_casts_a_host_factor_to_the_dtype_first, 1),
        case!(pre_mul_sum_refuses_bad_dtypes_and_factors, 1),
    ]
}

/// What rank `rank` holds: values every dtype stores exactly, fp8 included, at any rank (no negatives, as unsigned
/// and bool take them); the first and third element tell 64 ranks apart.
fn values(rank: usize, dtype: DType) -> Vec<f64> {
    if dtype == DType::Bool {
        return vec![1.0, 0.0, (rank % 2) as f64, 1.0];
    }
    let fraction = if dtype.is_float() { 0.5 } else { 0.0 };
    vec![(rank % 8) as f64 + 1.0, fraction, ((rank / 8) % 8) as f64, 3.0]
}

/// Whether two read values are the same, NaN included.
fn same(got: f64, want: f64) -> bool {
    got == want || (got.is_nan() && want.is_nan())
}

/// Reads `buffer` and checks it is `want` exactly.
fn expect<B: Backend>(r: &Rank<B>, what: &str, buffer: &B::Buffer, want: &[f64]) -> Check {
    let got = r.read(buffer)?;
    let equal = got.len() == want.len() && got.iter().zip(want).all(|(&g, &w)| same(g, w));
    ensure!(equal, "{what}: got {got:?}, want {want:?}");
    Ok(())
}

fn every_dtype_moves_through_broadcast_and_all_gather<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("dtypes_move", Options::builder())?;
        for dtype in DType::ALL {
            let root = n - 1;
            let buffer = r.holding(dtype, &values(r.rank, dtype))?;
            group.broadcast(&buffer, root).and_then(|w| w.wait()).ctx(&format!("broadcast of {dtype}"))?;
            expect(r, &format!("broadcast of {dtype}"), &buffer, &values(root, dtype))?;
            let input = r.holding(dtype, &values(r.rank, dtype))?;
            let gathered = r.device.alloc(dtype, 4 * n).ctx("alloc")?;
            group.all_gather(&input, &gathered).and_then(|w| w.wait()).ctx(&format!("all_gather of {dtype}"))?;
            let want: Vec<f64> = (0..n).flat_map(|k| values(k, dtype)).collect();
            expect(r, &format!("all_gather of {dtype}"), &gathered, &want)?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// The integer sum `sum` as the dtype's own (wrapping) arithmetic leaves it, as NCCL and PyTorch add integers.
fn wrapped(dtype: DType, sum: i128) -> f64 {
    match dtype {
        DType::I8 => f64::from(sum as i8),
        DType::U8 => f64::from(sum as u8),
        DType::I32 => f64::from(sum as i32),
        DType::U32 => f64::from(sum as u32),
        DType::I64 => sum as i64 as f64,
        DType::U64 => sum as u64 as f64,
        _ => sum as f64,
    }
}

/// What rank `rank` adds in the all_reduce of `dtype`. Integers: values up to 100 on every rank, summed with
/// wrapping. Floats: only the first 8 ranks hold non-zero values, so every partial sum (at most 36) is exact in
/// every float dtype whatever the order of the additions.
fn summands(rank: usize, dtype: DType) -> Vec<f64> {
    if dtype.is_float() {
        return match rank < 8 {
            true => vec![rank as f64 + 1.0, 0.5, (rank % 2) as f64, 3.0],
            false => vec![0.0; 4],
        };
    }
    vec![(rank % 100) as f64 + 1.0, 0.0, (rank % 2) as f64, 3.0]
}

fn every_dtype_but_fp8_all_reduces_with_real_values<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let nf = n as f64;
    let ran = h.run(n, |r| -> Check {
        let group = r.group("dtypes_reduce", Options::builder())?;
        let rank = r.rank as f64;
        for dtype in DType::ALL.into_iter().filter(|d| !d.is_fp8()) {
            let op = if dtype == DType::Bool { ReduceOp::Max } else { ReduceOp::Sum };
            let held = if dtype == DType::Bool { values(r.rank, dtype) } else { summands(r.rank, dtype) };
            let buffer = r.holding(dtype, &held)?;
            group.all_reduce_sync(&buffer, op).ctx(&format!("all_reduce of {dtype}"))?;
            let want = match dtype {
                DType::Bool => vec![1.0, 0.0, f64::from(u8::from(n > 1)), 1.0],
                dtype if dtype.is_float() => {
                    let m = n.min(8);
                    vec![(m * (m + 1) / 2) as f64, 0.5 * m as f64, (m / 2) as f64, 3.0 * m as f64]
                }
                dtype => (0..4)
                    .map(|i| {
                        let sum = (0..n).map(|k| summands(k, dtype)[i] as i128).sum();
                        wrapped(dtype, sum)
                    })
                    .collect(),
            };
            expect(r, &format!("{op:?} of {dtype}"), &buffer, &want)?;
        }
        // Values past the signed range: unsigned types must not read them as negative.
        let big32 = 3_000_000_000.0;
        let buffer = r.holding(DType::U32, &[big32 + rank, big32 + rank])?;
        group.all_reduce_sync(&buffer, ReduceOp::Max).ctx("MAX of UInt32")?;
        group.all_reduce_sync(&buffer, ReduceOp::Min).ctx("MIN of UInt32")?;
        expect(r, "MAX then MIN of UInt32 past 2^31", &buffer, &[big32 + nf - 1.0; 2])?;
        let big64 = 2f64.powi(63);
        let buffer = r.holding(DType::U64, &[big64 + 2048.0 * rank])?;
        group.all_reduce_sync(&buffer, ReduceOp::Max).ctx("MAX of UInt64")?;
        expect(r, "MAX of UInt64 past 2^63", &buffer, &[big64 + 2048.0 * (nf - 1.0)])?;
        let buffer = r.holding(DType::U64, &[2f64.powi(12) * (rank + 1.0)])?;
        group.all_reduce_sync(&buffer, ReduceOp::Product).ctx("PRODUCT of UInt64")?;
        let want = (1..=n).map(|k| 2f64.powi(12) * k as f64).product::<f64>();
        if want < 2f64.powi(64) {
            expect(r, "PRODUCT of UInt64", &buffer, &[want])?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// Whether `error` is the backend saying it cannot reduce `dtype`: the reason the case does not apply.
fn refused_fp8(error: &Error) -> Option<String> {
    (error.kind() == ErrorKind::Unsupported).then(|| error.to_string())
}

/// What rank `rank` of `n` adds in the fp8 sums of `dtype`, and the sums NCCL's arithmetic gives. NCCL adds fp8 in
/// half and converts each partial sum back with CUDA's saturating conversion: to nearest, ties to even, past the
/// largest finite value (448 for e4m3fn, 57344 for e5m2) that value, NaN kept. Every sum here is the same in any
/// order of the additions and at any world size: at most 8 ranks add non-zero values whose partial sums are fp8
/// values, two ranks add the pairs that round, and the overflowing sums stay at the saturated value.
fn fp8_summands(rank: usize, n: usize, dtype: DType) -> (Vec<f64>, Vec<f64>) {
    let (max, ties_up, ties_down) = match dtype {
        DType::F8E4M3 => (448.0, 0.1875, 0.0625),
        _ => (57344.0, 0.375, 0.125),
    };
    let first8 = if rank < 8 { 1.0 } else { 0.0 };
    let sign = if rank % 2 == 0 { 1.0 } else { -1.0 };
    let second = |value: f64| if rank == 1 { value } else { 0.0 };
    let nan = if rank == 0 { f64::NAN } else { 1.0 };
    let held = vec![
        first8,
        0.25 * sign * first8,
        if rank == 0 { 1.0 } else { second(ties_up) },
        if rank == 0 { 1.0 } else { second(ties_down) },
        max,
        -max,
        nan,
    ];
    let m = n.min(8);
    let rounded_up = match (dtype, n) {
        (_, 1) => 1.0,
        (DType::F8E4M3, _) => 1.25,
        _ => 1.5,
    };
    let want = vec![m as f64, 0.25 * (m % 2) as f64, rounded_up, 1.0, max, -max, f64::NAN];
    (held, want)
}

fn fp8_all_reduce_rounds_and_saturates_as_nccl_or_is_refused_with_the_version<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check<Option<String>> {
        let group = r.group("fp8_reduce", Options::builder())?;
        for dtype in [DType::F8E4M3, DType::F8E5M2] {
            let (held, want) = fp8_summands(r.rank, n, dtype);
            let buffer = r.holding(dtype, &held)?;
            match group.all_reduce(&buffer, ReduceOp::Sum) {
                Ok(work) => work.wait().ctx(&format!("SUM of {dtype}"))?,
                Err(error) => match refused_fp8(&error) {
                    Some(why) => {
                        ensure!(why.contains(&dtype.to_string()), "the refusal does not name {dtype}: {why}");
                        return Ok(Some(why));
                    }
                    None => return Err(format!("SUM of {dtype}: {error}")),
                },
            }
            // In order: ones from the first 8 ranks, +-0.25 from them, 1 + a second rank's value that ties up
            // to even, one that ties down, n x max and n x -max (saturated), and a NaN that stays NaN.
            expect(r, &format!("SUM of {dtype} (n x max saturates at max, as NCCL)"), &buffer, &want)?;
        }
        Ok(None)
    })?;
    ran.no_hazards()?;
    let reasons: Vec<String> = ran.all_ok()?.into_iter().filter_map(|(_, why)| why).collect();
    match reasons.first() {
        Some(why) => not_applicable(format!("the backend refuses fp8 reductions: {why}")),
        None => pass(),
    }
}

/// Runs an all_reduce of `buffer` with a device factor through `group`, waited on.
fn device_factor<B: Backend>(group: &ProcessGroup<B>, buffer: &B::Buffer, factor: &B::Buffer) -> Check {
    group.all_reduce_pre_mul_sum(buffer, factor).and_then(|w| w.wait()).ctx("all_reduce with a device factor")
}

fn pre_mul_sum_scales_each_rank_by_its_host_or_device_factor<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("premul", Options::builder())?;
        let k = r.rank as f64 + 1.0;
        // Only the first 8 ranks hold non-zero data, so that every partial sum (at most 240) is exact in bf16
        // whatever the order of the additions; every rank still scales by its own factor.
        let data = if r.rank < 8 { 1.0 } else { 0.0 };
        let m = n.min(8);
        let squares: f64 = (1..=m).map(|j| (j * j) as f64).sum();
        let ones: f64 = (1..=m).map(|j| j as f64).sum();
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            // Host factor: rank k-1 contributes k * (k / 2).
            let buffer = r.holding(dtype, &[k * data, 2.0 * data])?;
            group.all_reduce_sync(&buffer, ReduceOp::PreMulSum(k / 2.0)).ctx(&format!("host PREMUL_SUM {dtype}"))?;
            expect(r, &format!("host PREMUL_SUM of {dtype}"), &buffer, &[squares / 2.0, ones])?;
            // Device factor: rank k-1 contributes k * (k + 1), its factor read from device memory.
            let buffer = r.holding(dtype, &[k * data, data])?;
            let factor = r.holding(dtype, &[k + 1.0])?;
            device_factor(&group, &buffer, &factor)?;
            let want = [squares + ones, (2..=m + 1).map(|j| j as f64).sum()];
            expect(r, &format!("device PREMUL_SUM of {dtype}"), &buffer, &want)?;
        }
        // The host form also reduces-scatters: every block is the factor-weighted sum.
        let input = r.holding(DType::F32, &vec![k * data; n])?;
        let output = r.device.alloc(DType::F32, 1).ctx("alloc")?;
        group.reduce_scatter(&input, &output, ReduceOp::PreMulSum(0.5)).and_then(|w| w.wait()).ctx("reduce_scatter")?;
        expect(r, "reduce_scatter with PREMUL_SUM", &output, &[ones / 2.0])?;
        // And with a device factor: rank k-1 scales by k, so every block is the sum of squares.
        let factor = r.holding(DType::F32, &[k])?;
        let work = group.reduce_scatter_pre_mul_sum(&input, &output, &factor).ctx("reduce_scatter, device factor")?;
        work.wait().ctx("wait")?;
        expect(r, "reduce_scatter with a device PREMUL_SUM factor", &output, &[squares])?;
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// `value` as the backend stores it in `dtype`: written to a buffer and read back.
fn stored<B: Backend>(r: &Rank<B>, dtype: DType, value: f64) -> Check<f64> {
    Ok(r.read(&r.holding(dtype, &[value])?)?[0])
}

fn pre_mul_sum_casts_a_host_factor_to_the_dtype_first<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("premul_cast", Options::builder())?;
        // A factor past the dtype's range is an infinity in it (PyTorch casts a host factor to the input's dtype,
        // and NCCL's op holds it as one), even where each product would fit: +-tiny x factor is +-infinity.
        for (dtype, factor, tiny) in [(DType::F16, 1e6, 2f64.powi(-12)), (DType::BF16, 1e39, 2f64.powi(-100))]
            .into_iter()
            .chain([(DType::F32, 1e39, 2f64.powi(-100))])
        {
            let buffer = r.holding(dtype, &[tiny, -tiny])?;
            group
                .all_reduce_sync(&buffer, ReduceOp::PreMulSum(factor))
                .ctx(&format!("PREMUL_SUM {dtype} x {factor}"))?;
            let want = [f64::INFINITY, f64::NEG_INFINITY];
            expect(r, &format!("all_reduce, PREMUL_SUM of {dtype} x {factor:e}"), &buffer, &want)?;
            let input = r.holding(dtype, &vec![tiny; n])?;
            let output = r.device.alloc(dtype, 1).ctx("alloc")?;
            let work = group.reduce_scatter(&input, &output, ReduceOp::PreMulSum(factor));
            work.and_then(|w| w.wait()).ctx(&format!("reduce_scatter, PREMUL_SUM {dtype}"))?;
            expect(r, &format!("reduce_scatter, PREMUL_SUM of {dtype} x {factor:e}"), &output, &[f64::INFINITY])?;
        }
        // f64 holds such a factor: n x (1 x 2^200), exact.
        let buffer = r.holding(DType::F64, &[1.0])?;
        group.all_reduce_sync(&buffer, ReduceOp::PreMulSum(2f64.powi(200))).ctx("PREMUL_SUM Double x 2^200")?;
        expect(r, "PREMUL_SUM of Double x 2^200", &buffer, &[n as f64 * 2f64.powi(200)])?;
        // A factor inside the range rounds to the dtype first: rank 0's 3 x 0.1 is 3 x (0.1 in the dtype),
        // rounded to the dtype (f16: 0.2998046875, where 3 x 0.1 rounded once would be 0.300048828125).
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let buffer = r.holding(dtype, &[if r.rank == 0 { 3.0 } else { 0.0 }])?;
            group.all_reduce_sync(&buffer, ReduceOp::PreMulSum(0.1)).ctx(&format!("PREMUL_SUM {dtype} x 0.1"))?;
            let want = stored(r, dtype, 3.0 * stored(r, dtype, 0.1)?)?;
            expect(r, &format!("PREMUL_SUM of {dtype} x 0.1"), &buffer, &[want])?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// Checks that `result` is an `InvalidArgument` error.
fn refused<T>(what: &str, result: pg_core::Result<T>) -> Check {
    match result {
        Ok(_) => Err(format!("{what}: accepted")),
        Err(error) if error.kind() == ErrorKind::InvalidArgument => Ok(()),
        Err(error) => Err(format!("{what}: {:?} instead of InvalidArgument: {error}", error.kind())),
    }
}

fn pre_mul_sum_refuses_bad_dtypes_and_factors<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("premul_bad", Options::builder())?;
        for dtype in [DType::I32, DType::U8, DType::U64, DType::Bool, DType::F8E4M3] {
            let buffer = r.holding(dtype, &[1.0])?;
            refused(&format!("host PREMUL_SUM on {dtype}"), group.all_reduce(&buffer, ReduceOp::PreMulSum(2.0)))?;
            refused(&format!("device PREMUL_SUM on {dtype}"), group.all_reduce_pre_mul_sum(&buffer, &buffer))?;
        }
        let buffer = r.holding(DType::F32, &[1.0, 2.0])?;
        let two = r.holding(DType::F32, &[1.0, 1.0])?;
        refused("a two-element device factor", group.all_reduce_pre_mul_sum(&buffer, &two))?;
        let wrong = r.holding(DType::F64, &[1.0])?;
        refused("a device factor of another dtype", group.all_reduce_pre_mul_sum(&buffer, &wrong))?;
        let input = r.holding(DType::F32, &vec![1.0; n])?;
        let output = r.device.alloc(DType::F32, 1).ctx("alloc")?;
        refused("a reduce_scatter device factor of two", group.reduce_scatter_pre_mul_sum(&input, &output, &two))?;
        let ints = r.holding(DType::I64, &vec![1.0; n])?;
        let int_out = r.device.alloc(DType::I64, 1).ctx("alloc")?;
        let int_factor = r.holding(DType::I64, &[1.0])?;
        refused("a reduce_scatter PREMUL_SUM on Long", group.reduce_scatter_pre_mul_sum(&ints, &int_out, &int_factor))?;
        // Ops that do not carry the factor refuse it rather than drop it.
        refused("reduce with PREMUL_SUM", group.reduce(&buffer, 0, ReduceOp::PreMulSum(2.0)))?;
        let shares: Vec<_> = (0..n).map(|_| r.holding(DType::F32, &[1.0])).collect::<Check<_>>()?;
        let share_out = r.device.alloc(DType::F32, 1).ctx("alloc")?;
        let scattered = group.reduce_scatter_from(&share_out, &shares, ReduceOp::PreMulSum(2.0));
        refused("reduce_scatter_from with PREMUL_SUM", scattered)?;
        // Nothing was enqueued, nothing created: the next op is the group's first, and it works.
        ensure_eq!(group.counters().comms_created, 0, "communicators created by the refused calls");
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce after the refusals")?;
        ensure_eq!(group.counters().ops_issued, 1, "ops issued after the refusals");
        ensure_eq!(group.status().last_enqueued_seq, Some(1), "the first op's seq after the refusals");
        expect(r, "all_reduce after the refusals", &buffer, &[n as f64, 2.0 * n as f64])?;
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

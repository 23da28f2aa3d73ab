//! Dtype and reduction arithmetic on raw little-endian bytes: fills, reductions, and the host conversions tests
//! use (`encode`, `decode`).

use pg_core::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use pg_core::{DType, Error, ReduceOp, Result};

/// One element type: how it is stored and how reductions combine it.
trait Elem: Copy {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Self;
    fn write(self, out: &mut [u8]);
    fn from_f64(value: f64) -> Self;
    fn to_f64(self) -> f64;
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    fn average(sum: Self, n: usize) -> Self;
    /// Whether NCCL averages this dtype as PREMUL_SUM by 1/n (each input scaled in the dtype, then summed), as it
    /// does the floating types; the integer types sum, then divide.
    const AVERAGES_BY_PREMUL: bool = false;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            const AVERAGES_BY_PREMUL: bool = true;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element size"))
            }
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            #[allow(clippy::cast_possible_truncation)] // A reason: narrowing to the dtype is the point.
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Product => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    _ => a + b,
                }
            }
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)] // A reason: rank counts are tiny.
            fn average(sum: Self, n: usize) -> Self {
                sum / (n as $t)
            }
        }
    };
}

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element size"))
            }
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // A reason: `as` saturates, as wanted.
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            #[allow(clippy::cast_precision_loss, clippy::cast_lossless)] // A reason: only for tests' decoding.
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Product => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    _ => a.wrapping_add(b),
                }
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)] // A reason: rank counts are tiny.
            fn average(sum: Self, n: usize) -> Self {
                sum / (n as $t)
            }
        }
    };
}

float_elem!(f32);
float_elem!(f64);
int_elem!(i8);
int_elem!(u8);
int_elem!(i32);
int_elem!(i64);
int_elem!(u32);
int_elem!(u64);

/// A bool element: one byte, sum = or, product = and (as PyTorch maps them).
#[derive(Clone, Copy)]
struct Bool(bool);

impl Elem for Bool {
    const SIZE: usize = 1;
    fn read(bytes: &[u8]) -> Self {
        Bool(bytes[0] != 0)
    }
    fn write(self, out: &mut [u8]) {
        out[0] = u8::from(self.0);
    }
    fn from_f64(value: f64) -> Self {
        Bool(value != 0.0)
    }
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self.0))
    }
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Product | ReduceOp::Min => Bool(a.0 && b.0),
            _ => Bool(a.0 || b.0),
        }
    }
    fn average(sum: Self, _n: usize) -> Self {
        sum
    }
}

/// IEEE half, computed in f32.
#[derive(Clone, Copy)]
struct Half(f32);

/// bfloat16, computed in f32.
#[derive(Clone, Copy)]
struct Brain(f32);

/// An element stored as 16 bits and computed in f32, rounded back to the dtype after every step through `$to` /
/// `$from`.
macro_rules! narrow_float_elem {
    ($t:ident, $bits:ty, $to:path, $from:path) => {
        impl Elem for $t {
            const AVERAGES_BY_PREMUL: bool = true;
            const SIZE: usize = std::mem::size_of::<$bits>();
            fn read(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$bits>()];
                raw.copy_from_slice(&bytes[..Self::SIZE]);
                $t($from(<$bits>::from_le_bytes(raw)))
            }
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&$to(self.0).to_le_bytes());
            }
            #[allow(clippy::cast_possible_truncation)] // A reason: narrowing to the dtype is the point.
            fn from_f64(value: f64) -> Self {
                $t(value as f32)
            }
            fn to_f64(self) -> f64 {
                f64::from(self.0)
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                $t(f32::combine(op, a.0, b.0))
            }
            fn average(sum: Self, n: usize) -> Self {
                $t(f32::average(sum.0, n))
            }
        }
    };
}

narrow_float_elem!(Half, u16, f32_to_f16, f16_to_f32);
narrow_float_elem!(Brain, u16, f32_to_bf16, bf16_to_f32);

/// `float8_e4m3fn`: converted from f32 as PyTorch converts (saturating), reduced as NCCL's kernels do.
#[derive(Clone, Copy)]
struct E4M3(f32);

/// `float8_e5m2`: converted from f32 as PyTorch converts (infinity past the range), reduced as NCCL's kernels do.
#[derive(Clone, Copy)]
struct E5M2(f32);

/// One step of an fp8 reduction as NCCL's kernels compute it on sm_90: both operands widened to half (exactly),
/// the op in half (`__hadd`, `__hmul`, `__hmax`, `__hmin`: rounded to half), the result converted back with
/// `__NV_SATFINITE` (`round_back`): an overflow, or an infinity, becomes the largest finite value, NaN stays NaN.
/// f32 arithmetic rounded to half equals half arithmetic for these operations (f32 keeps at least twice half's
/// precision plus two bits, so the double rounding is innocuous). `__hmax` and `__hmin` order -0 below +0.
fn fp8_combine(op: ReduceOp, a: f32, b: f32, round_back: fn(f32) -> f32) -> f32 {
    let value = match op {
        ReduceOp::Max if a == b => {
            if a.is_sign_positive() {
                a
            } else {
                b
            }
        }
        ReduceOp::Min if a == b => {
            if a.is_sign_negative() {
                a
            } else {
                b
            }
        }
        op => f32::combine(op, a, b),
    };
    round_back(f16_to_f32(f32_to_f16(value)))
}

macro_rules! fp8_elem {
    ($t:ident, $to:path, $from:path, $satfinite:path) => {
        impl Elem for $t {
            const AVERAGES_BY_PREMUL: bool = true;
            const SIZE: usize = 1;
            fn read(bytes: &[u8]) -> Self {
                $t($from(bytes[0]))
            }
            fn write(self, out: &mut [u8]) {
                out[0] = $to(self.0);
            }
            #[allow(clippy::cast_possible_truncation)] // A reason: narrowing to the dtype is the point.
            fn from_f64(value: f64) -> Self {
                $t(value as f32)
            }
            fn to_f64(self) -> f64 {
                f64::from(self.0)
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                $t(fp8_combine(op, a.0, b.0, |x| $from($satfinite(x))))
            }
            fn average(sum: Self, n: usize) -> Self {
                $t(f32::average(sum.0, n))
            }
        }
    };
}

fp8_elem!(E4M3, pg_core::fp8::to_e4m3fn, pg_core::fp8::from_e4m3fn, pg_core::fp8::to_e4m3fn);
fp8_elem!(E5M2, pg_core::fp8::to_e5m2, pg_core::fp8::from_e5m2, pg_core::fp8::to_e5m2_satfinite);

fn fill_typed<T: Elem>(value: f64, out: &mut [u8]) {
    let element = T::from_f64(value);
    for chunk in out.chunks_exact_mut(T::SIZE) {
        element.write(chunk);
    }
}

fn encode_typed<T: Elem>(values: &[f64]) -> Vec<u8> {
    let mut out = vec![0; values.len() * T::SIZE];
    for (chunk, v) in out.chunks_exact_mut(T::SIZE).zip(values) {
        T::from_f64(*v).write(chunk);
    }
    out
}

fn decode_typed<T: Elem>(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(T::SIZE).map(|c| T::read(c).to_f64()).collect()
}

fn reduce_typed<T: Elem>(op: ReduceOp, inputs: &[&[u8]], out: &mut [u8]) {
    let Some((first, rest)) = inputs.split_first() else { return };
    if op == ReduceOp::Avg && T::AVERAGES_BY_PREMUL {
        // As NCCL: a floating average is a PREMUL_SUM by 1/n, the factor and every product in the dtype.
        let factor = T::from_f64(1.0 / inputs.len() as f64);
        let scaled = |bytes: &[u8]| T::combine(ReduceOp::Product, T::read(bytes), factor);
        for (k, acc) in out.chunks_exact_mut(T::SIZE).enumerate() {
            let at = k * T::SIZE..(k + 1) * T::SIZE;
            let sum = rest.iter().fold(scaled(&first[at.clone()]), |sum, input| {
                T::combine(ReduceOp::Sum, sum, scaled(&input[at.clone()]))
            });
            sum.write(acc);
        }
        return;
    }
    out.copy_from_slice(first);
    for input in rest {
        for (acc, x) in out.chunks_exact_mut(T::SIZE).zip(input.chunks_exact(T::SIZE)) {
            T::combine(op, T::read(acc), T::read(x)).write(acc);
        }
    }
    if op == ReduceOp::Avg {
        for acc in out.chunks_exact_mut(T::SIZE) {
            T::average(T::read(acc), inputs.len()).write(acc);
        }
    }
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<Half>($($arg),*),
            DType::BF16 => $f::<Brain>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => $f::<Bool>($($arg),*),
            DType::U32 => $f::<u32>($($arg),*),
            DType::U64 => $f::<u64>($($arg),*),
            DType::F8E4M3 => $f::<E4M3>($($arg),*),
            DType::F8E5M2 => $f::<E5M2>($($arg),*),
        }
    };
}

/// Sets every element of `out` to `value` converted to `dtype` (saturating for integers, `!= 0` for bool).
pub(crate) fn fill(dtype: DType, value: f64, out: &mut [u8]) {
    dispatch!(dtype, fill_typed, value, out);
}

/// `value` rounded to an element of `T` and back.
fn in_dtype<T: Elem>(value: f64) -> f64 {
    let mut bytes = [0u8; 8];
    T::from_f64(value).write(&mut bytes[..T::SIZE]);
    T::read(&bytes[..T::SIZE]).to_f64()
}

fn scale_typed<T: Elem>(factor: f64, bytes: &mut [u8]) {
    let factor = in_dtype::<T>(factor);
    for chunk in bytes.chunks_exact_mut(T::SIZE) {
        // The product of two f16, bf16 or f32 elements is exact in f64, so rounding it once to the dtype is the
        // dtype's own multiplication (and f64's is f64's).
        T::from_f64(T::read(chunk).to_f64() * factor).write(chunk);
    }
}

/// Multiplies every element of `bytes` (of `dtype`) by `factor` as `PREMUL_SUM`'s step does: the factor is first
/// an element of `dtype` (PyTorch casts a host factor to the input's dtype and NCCL's op holds it as one, so
/// f16 x 1e6 is an infinity), then each product is rounded to the dtype.
pub(crate) fn scale(dtype: DType, factor: f64, bytes: &mut [u8]) {
    dispatch!(dtype, scale_typed, factor, bytes);
}

/// Reduces `inputs` (one per rank, equal lengths) element-wise into `out`.
pub(crate) fn reduce(dtype: DType, op: ReduceOp, inputs: &[&[u8]], out: &mut [u8]) -> Result<()> {
    op.check(dtype)?;
    if inputs.iter().any(|i| i.len() != out.len()) {
        return Err(Error::invalid("reduction inputs differ in length"));
    }
    dispatch!(dtype, reduce_typed, op, inputs, out);
    Ok(())
}

/// The bytes of `values` as elements of `dtype` (what `Device::copy_from_host` takes).
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    dispatch!(dtype, encode_typed, values)
}

/// The elements of `bytes` (of `dtype`) as f64 (what `Device::copy_to_host` returns, decoded).
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    dispatch!(dtype, decode_typed, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips() {
        for v in [0.0f32, 1.0, -2.5, 65504.0, 6.1e-5, 1e-7, 3.25] {
            let back = f16_to_f32(f32_to_f16(v));
            assert!((back - v).abs() <= v.abs() * 1e-3 + 1e-7, "{v} -> {back}");
        }
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(bf16_to_f32(f32_to_bf16(1.5)), 1.5);
    }

    #[test]
    fn new_dtypes_reduce_with_real_values() {
        let sum = |dtype: DType, a: &[f64], b: &[f64]| {
            let (a, b) = (encode(dtype, a), encode(dtype, b));
            let mut out = vec![0; a.len()];
            reduce(dtype, ReduceOp::Sum, &[&a, &b], &mut out).unwrap();
            decode(dtype, &out)
        };
        assert_eq!(sum(DType::U32, &[4_000_000_000.0, 1.0], &[1.0, 2.0]), [4_000_000_001.0, 3.0]);
        assert_eq!(sum(DType::U64, &[1e18, 0.0], &[1e18, 7.0]), [2e18, 7.0]);
        assert_eq!(sum(DType::F8E4M3, &[1.5, 200.0], &[0.25, 100.0]), [1.75, 288.0]);
        assert_eq!(decode(DType::F8E4M3, &encode(DType::F8E4M3, &[0.3])), [0.3125]);
    }

    #[test]
    fn fp8_sums_saturate_as_nccl_and_conversions_follow_pytorch() {
        let reduce_pair = |dtype: DType, op: ReduceOp, a: f64, b: f64| {
            let (a, b) = (encode(dtype, &[a]), encode(dtype, &[b]));
            let mut out = vec![0; 1];
            reduce(dtype, op, &[&a, &b], &mut out).unwrap();
            decode(dtype, &out)[0]
        };
        assert_eq!(reduce_pair(DType::F8E4M3, ReduceOp::Sum, 400.0, 100.0), 448.0, "500 saturates");
        assert_eq!(reduce_pair(DType::F8E4M3, ReduceOp::Sum, 448.0, 448.0), 448.0);
        assert_eq!(reduce_pair(DType::F8E4M3, ReduceOp::Sum, -448.0, -448.0), -448.0);
        assert_eq!(reduce_pair(DType::F8E4M3, ReduceOp::Product, 448.0, -448.0), -448.0);
        assert!(reduce_pair(DType::F8E4M3, ReduceOp::Sum, f64::NAN, 1.0).is_nan(), "NaN stays NaN");
        assert_eq!(reduce_pair(DType::F8E5M2, ReduceOp::Sum, 40000.0, 40000.0), 57344.0, "NCCL saturates e5m2 too");
        assert_eq!(reduce_pair(DType::F8E5M2, ReduceOp::Sum, -57344.0, -57344.0), -57344.0);
        assert!(reduce_pair(DType::F8E5M2, ReduceOp::Sum, f64::NAN, 1.0).is_nan());
        // The conversions are PyTorch's: e4m3fn saturates, e5m2 overflows to infinity.
        assert_eq!(decode(DType::F8E4M3, &encode(DType::F8E4M3, &[1e6, f64::NEG_INFINITY])), [448.0, -448.0]);
        assert_eq!(decode(DType::F8E5M2, &encode(DType::F8E5M2, &[1e9])), [f64::INFINITY]);
        let mut filled = [0u8; 2];
        fill(DType::F8E4M3, f64::INFINITY, &mut filled);
        assert_eq!(filled, [0x7e, 0x7e]);
    }

    /// Floating averages are NCCL's PREMUL_SUM by 1/n, summed here in rank order (NCCL's ring adds in another
    /// order per chunk: 6/3 in f64 gave 1.9999999999999998 on NCCL at world 3); integer averages sum, then divide.
    #[test]
    fn floating_averages_scale_each_input_by_one_over_n_as_nccl() {
        let average = |dtype: DType, values: &[f64]| {
            let inputs: Vec<Vec<u8>> = values.iter().map(|v| encode(dtype, &[*v])).collect();
            let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let mut out = vec![0; dtype.size()];
            reduce(dtype, ReduceOp::Avg, &inputs, &mut out).unwrap();
            decode(dtype, &out)[0]
        };
        let third = 1.0 / 3.0;
        assert_eq!(average(DType::F64, &[1.0, 2.0, 3.0]), 1.0 * third + 2.0 * third + 3.0 * third);
        assert_eq!(average(DType::I32, &[1.0, 2.0, 4.0]), 2.0);
        assert_eq!(average(DType::F32, &[2.0, 4.0]), 3.0);
    }

    #[test]
    fn a_pre_mul_sum_factor_is_cast_to_the_dtype_first() {
        let scaled = |dtype: DType, value: f64, factor: f64| {
            let mut bytes = encode(dtype, &[value, -value]);
            scale(dtype, factor, &mut bytes);
            decode(dtype, &bytes)
        };
        assert_eq!(scaled(DType::F16, 2f64.powi(-12), 1e6), [f64::INFINITY, f64::NEG_INFINITY], "1e6 is inf in f16");
        assert_eq!(scaled(DType::F32, 2f64.powi(-100), 1e39), [f64::INFINITY, f64::NEG_INFINITY]);
        assert_eq!(scaled(DType::BF16, 2f64.powi(-100), 1e39), [f64::INFINITY, f64::NEG_INFINITY]);
        assert_eq!(scaled(DType::F64, 1.0, 1e39), [1e39, -1e39]);
        // 0.1 in f16 is 0.0999755859375; 3 x that, 0.2999267578125, ties to the even f16 0.2998046875 (3 x 0.1
        // rounded once would be 0.300048828125).
        assert_eq!(scaled(DType::F16, 3.0, 0.1), [0.2998046875, -0.2998046875]);
    }

    /// FNV-1a of the results of `op` on every pair of `dtype` codes (first operand in the high byte), NaNs
    /// written as `0x7f` so that only values count.
    fn pair_table_digest(dtype: DType, op: ReduceOp) -> u64 {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for pair in 0..=u16::MAX {
            let [a, b] = pair.to_be_bytes();
            let mut out = [0u8];
            reduce(dtype, op, &[&[a], &[b]], &mut out).unwrap();
            let byte = if decode(dtype, &out)[0].is_nan() { 0x7f } else { out[0] };
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }

    /// The digests of the same tables computed on an H200 (sm_90, CUDA 13.0) with the expressions of NCCL's fp8
    /// kernels: `__nv_fp8_e4m3(__hadd(__half(x), __half(y)))`, and `__hmul`, `__hmax`, `__hmin` alike, for both
    /// formats (the two-element `__hadd2` form gave the same sums).
    #[test]
    fn fp8_reductions_match_nccls_kernels_on_every_pair_of_values() {
        let h200 = [
            (DType::F8E4M3, ReduceOp::Sum, 0x318c_a484_3988_6f11),
            (DType::F8E4M3, ReduceOp::Product, 0xeb80_33bc_da7f_b14d),
            (DType::F8E4M3, ReduceOp::Max, 0x74dd_341d_a9ef_0025),
            (DType::F8E4M3, ReduceOp::Min, 0x622b_2ed1_c076_a225),
            (DType::F8E5M2, ReduceOp::Sum, 0xa65f_7900_aaff_6db5),
            (DType::F8E5M2, ReduceOp::Product, 0xfd31_cd42_16d5_f005),
            (DType::F8E5M2, ReduceOp::Max, 0xd41c_1716_aebb_3235),
            (DType::F8E5M2, ReduceOp::Min, 0x499f_bdae_1660_26c5),
        ];
        for (dtype, op, want) in h200 {
            assert_eq!(pair_table_digest(dtype, op), want, "{dtype} {op:?}");
        }
    }
}

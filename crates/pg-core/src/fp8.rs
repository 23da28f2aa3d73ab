//! The two 8-bit float formats (`float8_e4m3fn`, `float8_e5m2`): PyTorch's conversions from f32, rounding to
//! nearest, ties to even, and the saturating conversion CUDA's fp8 types make (what NCCL's reductions round with).
//!
//! PyTorch (2.15) converts to e4m3fn saturating: a magnitude that rounds past its largest finite value (448) and
//! an infinity become 448 with the sign (`0x7e`/`0xfe`); a NaN stays NaN (`0x7f` with the sign), as e4m3fn has no
//! infinities. e5m2 is IEEE-like in PyTorch's conversion: a magnitude that rounds past 57344 becomes an infinity,
//! a NaN stays NaN.
//!
//! CUDA's `__NV_SATFINITE` conversion (the one `__nv_fp8_e4m3(__half)` and `__nv_fp8_e5m2(__half)` make, which
//! NCCL's fp8 kernels round every step with) clamps an overflow or an infinity to the largest finite value in both
//! formats and keeps NaN: [`to_e4m3fn`] is that conversion for e4m3fn, [`to_e5m2_satfinite`] for e5m2.

/// One 8-bit float layout: exponent bias and mantissa width.
#[derive(Clone, Copy)]
struct Format {
    bias: i32,
    mantissa_bits: u32,
    /// The code above the largest finite one: NaN for e4m3fn (`0x7f`), infinity for e5m2 (`0x7c`).
    overflow: u8,
}

const E4M3FN: Format = Format { bias: 7, mantissa_bits: 3, overflow: 0x7f };
const E5M2: Format = Format { bias: 15, mantissa_bits: 2, overflow: 0x7c };

/// What a conversion makes of a magnitude past the largest finite value (an infinity included).
#[derive(Clone, Copy, PartialEq)]
enum Overflow {
    /// The format's overflow code (NaN for e4m3fn, infinity for e5m2).
    Special,
    /// The largest finite value, with the sign.
    Saturate,
}

fn encode(format: Format, value: f32, overflow: Overflow) -> u8 {
    let sign = if value.is_sign_negative() { 0x80 } else { 0 };
    let limit = match overflow {
        Overflow::Special => format.overflow,
        Overflow::Saturate => format.overflow - 1,
    };
    if value.is_nan() {
        return sign | 0x7f;
    }
    if value.is_infinite() {
        return sign | limit;
    }
    let magnitude = f64::from(value.abs());
    if magnitude == 0.0 {
        return sign;
    }
    // Every finite f32 is a normal f64, so the exponent field gives floor(log2(magnitude)).
    let exponent = i32::try_from((magnitude.to_bits() >> 52) & 0x7ff).unwrap_or(0) - 1023;
    let min_normal = 1 - format.bias;
    let mantissa_bits = i32::try_from(format.mantissa_bits).unwrap_or(0);
    let code = if exponent < min_normal {
        // Subnormal: a multiple of the smallest subnormal (rounding may reach the smallest normal, whose code
        // is the next integer, as wanted).
        let steps = (magnitude * 2f64.powi(format.bias - 1 + mantissa_bits)).round_ties_even();
        steps_to_code(steps)
    } else {
        let scaled = (magnitude * 2f64.powi(mantissa_bits - exponent)).round_ties_even();
        // `scaled` is in [2^m, 2^(m+1)]; its excess over 2^m is the mantissa field, a carry bumps the exponent.
        let biased = u32::try_from(exponent + format.bias).unwrap_or(u32::MAX);
        let base = biased.saturating_mul(1 << format.mantissa_bits);
        base.saturating_add(steps_to_code(scaled).saturating_sub(1 << format.mantissa_bits))
    };
    sign | u8::try_from(code.min(u32::from(limit))).unwrap_or(limit)
}

/// An exactly integral, non-negative f64 below 2^32 as u32 (larger values saturate, which the caller clamps).
fn steps_to_code(steps: f64) -> u32 {
    if steps >= 4_294_967_295.0 {
        u32::MAX
    } else {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // A reason: checked range, integral.
        let code = steps as u32;
        code
    }
}

fn decode(format: Format, code: u8) -> f32 {
    let negative = code & 0x80 != 0;
    let magnitude = code & 0x7f;
    let exponent_field = i32::from(magnitude >> format.mantissa_bits);
    let mantissa = f64::from(magnitude & ((1 << format.mantissa_bits) - 1));
    let mantissa_bits = i32::try_from(format.mantissa_bits).unwrap_or(0);
    let max_field = 0x7f >> format.mantissa_bits;
    let value = if format.overflow == 0x7f && magnitude == 0x7f {
        f64::NAN
    } else if format.overflow != 0x7f && exponent_field == max_field {
        if mantissa == 0.0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if exponent_field == 0 {
        mantissa * 2f64.powi(1 - format.bias - mantissa_bits)
    } else {
        (1.0 + mantissa * 2f64.powi(-mantissa_bits)) * 2f64.powi(exponent_field - format.bias)
    };
    #[allow(clippy::cast_possible_truncation)] // A reason: every fp8 value is exact in f32.
    let value = value as f32;
    if negative {
        -value
    } else {
        value
    }
}

/// `value` as `float8_e4m3fn` bits, as PyTorch converts it: saturating to +-448, NaN kept.
pub fn to_e4m3fn(value: f32) -> u8 {
    encode(E4M3FN, value, Overflow::Saturate)
}

/// The value of `float8_e4m3fn` bits.
pub fn from_e4m3fn(bits: u8) -> f32 {
    decode(E4M3FN, bits)
}

/// `value` as `float8_e5m2` bits, as PyTorch converts it: past 57344 an infinity, NaN kept.
pub fn to_e5m2(value: f32) -> u8 {
    encode(E5M2, value, Overflow::Special)
}

/// `value` as `float8_e5m2` bits with CUDA's `__NV_SATFINITE`: past 57344, infinities included, +-57344; NaN kept.
pub fn to_e5m2_satfinite(value: f32) -> u8 {
    encode(E5M2, value, Overflow::Saturate)
}

/// The value of `float8_e5m2` bits.
pub fn from_e5m2(bits: u8) -> f32 {
    decode(E5M2, bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3fn_values() {
        assert_eq!(to_e4m3fn(1.0), 0x38);
        assert_eq!(to_e4m3fn(-2.0), 0xc0);
        assert_eq!(to_e4m3fn(448.0), 0x7e, "largest finite");
        assert_eq!(to_e4m3fn(464.0), 0x7e, "halfway to NaN, ties to the even 448");
        assert_eq!(to_e4m3fn(2f32.powi(-9)), 0x01, "smallest subnormal");
        assert_eq!(to_e4m3fn(2f32.powi(-10)), 0x00, "half the smallest subnormal ties to even zero");
        assert_eq!(to_e4m3fn(3.0 * 2f32.powi(-10)), 0x02, "1.5 steps ties to the even 2");
        assert_eq!(to_e4m3fn(1.0625), 0x38, "1 + 1/16 ties to even 1.0");
        assert_eq!(to_e4m3fn(1.1875), 0x3a, "1 + 3/16 ties to even 1.25");
        assert_eq!(to_e4m3fn(0.0), 0);
        assert_eq!(to_e4m3fn(-0.0), 0x80);
        assert!(from_e4m3fn(0x7f).is_nan() && from_e4m3fn(0xff).is_nan());
        assert_eq!(from_e4m3fn(0x7e), 448.0);
        assert_eq!(from_e4m3fn(0x01), 2f32.powi(-9));
        assert_eq!(from_e4m3fn(0xc0), -2.0);
    }

    #[test]
    fn e4m3fn_saturates_past_448_and_keeps_nan_as_pytorch_2_15() {
        assert_eq!(to_e4m3fn(449.0), 0x7e, "rounds down to 448 anyway");
        assert_eq!(to_e4m3fn(464.0), 0x7e, "halfway ties to the even 448");
        assert_eq!(to_e4m3fn(464.5), 0x7e, "rounds past 448: saturates");
        assert_eq!(to_e4m3fn(470.0), 0x7e);
        assert_eq!(to_e4m3fn(-470.0), 0xfe);
        assert_eq!(to_e4m3fn(1e6), 0x7e);
        assert_eq!(to_e4m3fn(f32::MAX), 0x7e);
        assert_eq!(to_e4m3fn(f32::INFINITY), 0x7e, "+inf saturates");
        assert_eq!(to_e4m3fn(f32::NEG_INFINITY), 0xfe, "-inf saturates");
        assert_eq!(to_e4m3fn(f32::NAN), 0x7f, "NaN stays NaN");
        assert_eq!(to_e4m3fn(-f32::NAN), 0xff, "with its sign");
        assert_eq!(from_e4m3fn(to_e4m3fn(-1e6)), -448.0);
    }

    #[test]
    fn e5m2_satfinite_saturates_past_57344_and_keeps_nan() {
        assert_eq!(to_e5m2_satfinite(57344.0), 0x7b);
        assert_eq!(to_e5m2_satfinite(61440.0), 0x7b, "halfway: the infinity it would tie to saturates");
        assert_eq!(to_e5m2_satfinite(1e9), 0x7b);
        assert_eq!(to_e5m2_satfinite(-1e9), 0xfb);
        assert_eq!(to_e5m2_satfinite(f32::INFINITY), 0x7b);
        assert_eq!(to_e5m2_satfinite(f32::NEG_INFINITY), 0xfb);
        assert!(from_e5m2(to_e5m2_satfinite(f32::NAN)).is_nan());
        for code in 0..=255u8 {
            let value = from_e5m2(code);
            if value.is_finite() {
                assert_eq!(to_e5m2_satfinite(value), code, "finite values convert as PyTorch's {code:#04x}");
            }
        }
    }

    #[test]
    fn e5m2_values() {
        assert_eq!(to_e5m2(1.0), 0x3c);
        assert_eq!(to_e5m2(57344.0), 0x7b, "largest finite");
        assert_eq!(to_e5m2(61440.0), 0x7c, "halfway ties up to infinity");
        assert_eq!(to_e5m2(1e9), 0x7c);
        assert_eq!(to_e5m2(-1e9), 0xfc);
        assert_eq!(to_e5m2(f32::NAN), 0x7f);
        assert_eq!(to_e5m2(2f32.powi(-16)), 0x01, "smallest subnormal");
        assert_eq!(to_e5m2(1.125), 0x3c, "ties to even 1.0");
        assert_eq!(to_e5m2(1.375), 0x3e, "ties to even 1.5");
        assert_eq!(from_e5m2(0x7c), f32::INFINITY);
        assert!(from_e5m2(0x7d).is_nan());
        assert_eq!(from_e5m2(0x7b), 57344.0);
        assert_eq!(from_e5m2(0x01), 2f32.powi(-16));
    }

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            for (to, from) in [(to_e4m3fn as fn(f32) -> u8, from_e4m3fn as fn(u8) -> f32), (to_e5m2, from_e5m2)] {
                let value = from(code);
                if value.is_nan() {
                    assert!(from(to(value)).is_nan());
                } else {
                    assert_eq!(to(value), code, "{code:#04x} = {value}");
                }
            }
        }
    }
}

//! The two 16-bit float formats as bits: IEEE binary16 and bfloat16 from and to f32, rounding to nearest even, as CUDA
//! and PyTorch convert. The one implementation every backend and the conformance suite use.

/// Rounds an f32 to the nearest IEEE half (ties to even).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = u16::try_from((bits >> 16) & 0x8000).unwrap_or(0);
    let exp = i32::try_from((bits >> 23) & 0xff).unwrap_or(0);
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let round = |value: u32, rem: u32, half: u32| -> u32 {
        if rem > half || (rem == half && value & 1 == 1) {
            value + 1
        } else {
            value
        }
    };
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let man = man | 0x80_0000;
        let shift = u32::try_from(14 - e).unwrap_or(24);
        let value = round(man >> shift, man & ((1 << shift) - 1), 1 << (shift - 1));
        return sign | u16::try_from(value).unwrap_or(0x400);
    }
    let e = u32::try_from(e).unwrap_or(0);
    let value = round((e << 10) | (man >> 13), man & 0x1fff, 0x1000);
    sign | u16::try_from(value).unwrap_or(0x7c00)
}

/// The f32 of an IEEE half (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            #[allow(clippy::cast_precision_loss)] // A reason: a 10-bit mantissa is exact.
            let value = man as f32 / 16_777_216.0;
            return if sign != 0 { -value } else { value };
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Rounds an f32 to the nearest bfloat16 (ties to even).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return u16::try_from(bits >> 16).unwrap_or(0x7fc0) | 0x40;
    }
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    u16::try_from(rounded >> 16).unwrap_or(0)
}

/// The f32 of a bfloat16 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_round_trips_through_f32() {
        for bits in 0..=u16::MAX {
            let value = f16_to_f32(bits);
            match value.is_nan() {
                true => assert!(f16_to_f32(f32_to_f16(value)).is_nan(), "{bits:#06x}"),
                false => assert_eq!(f32_to_f16(value), bits, "{bits:#06x} ({value})"),
            }
        }
    }

    #[test]
    fn every_bfloat16_round_trips_through_f32() {
        for bits in 0..=u16::MAX {
            let value = bf16_to_f32(bits);
            match value.is_nan() {
                true => assert!(bf16_to_f32(f32_to_bf16(value)).is_nan(), "{bits:#06x}"),
                false => assert_eq!(f32_to_bf16(value), bits, "{bits:#06x} ({value})"),
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even_with_overflow_and_subnormals() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "halfway past the largest half rounds to infinity");
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001, "smallest subnormal");
        assert_eq!(f32_to_f16(2.980_232_2e-8), 0x0000, "half the smallest subnormal ties to even zero");
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00, "a tie rounds to the even neighbour");
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80, "a tie rounds to the even neighbour");
        assert_eq!(f32_to_bf16(-0.5), 0xbf00);
    }
}

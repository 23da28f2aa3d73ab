//! Element values to and from the bytes a buffer holds, for every dtype (what cases write and read back).

use pg_core::half::{f16_to_f32, f32_to_bf16, f32_to_f16};
use pg_core::DType;

/// The bytes of `values` as elements of `dtype` (integers saturate, bool is `!= 0`, half floats round).
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend(v.to_le_bytes()),
            DType::F16 => out.extend(f32_to_f16(v as f32).to_le_bytes()),
            DType::BF16 => out.extend(f32_to_bf16(v as f32).to_le_bytes()),
            DType::I8 => out.extend((v as i8).to_le_bytes()),
            DType::U8 => out.extend((v as u8).to_le_bytes()),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I64 => out.extend((v as i64).to_le_bytes()),
            DType::Bool => out.push(u8::from(v != 0.0)),
            DType::U32 => out.extend((v as u32).to_le_bytes()),
            DType::U64 => out.extend((v as u64).to_le_bytes()),
            DType::F8E4M3 => out.push(pg_core::fp8::to_e4m3fn(v as f32)),
            DType::F8E5M2 => out.push(pg_core::fp8::to_e5m2(v as f32)),
        }
    }
    out
}

/// The elements of `bytes` (of `dtype`) as f64.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size())
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::F64 => f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
            DType::F16 => f64::from(f16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
            DType::BF16 => f64::from(f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)),
            DType::I8 => f64::from(c[0] as i8),
            DType::U8 => f64::from(c[0]),
            DType::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
            DType::Bool => f64::from(u8::from(c[0] != 0)),
            DType::U32 => f64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::U64 => u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
            DType::F8E4M3 => f64::from(pg_core::fp8::from_e4m3fn(c[0])),
            DType::F8E5M2 => f64::from(pg_core::fp8::from_e5m2(c[0])),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_small_values() {
        let values = [0.0, 1.0, -2.0, 3.5, 96.0];
        for dtype in
            [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::F8E4M3, DType::F8E5M2]
        {
            let back = decode(dtype, &encode(dtype, &values));
            let want: Vec<f64> = match dtype {
                DType::I32 | DType::I64 => values.iter().map(|v| v.trunc()).collect(),
                _ => values.to_vec(),
            };
            assert_eq!(back, want, "{dtype}");
        }
        assert_eq!(decode(DType::U8, &encode(DType::U8, &[3.0, 300.0])), [3.0, 255.0]);
        assert_eq!(decode(DType::U32, &encode(DType::U32, &[-1.0, 4e9])), [0.0, 4e9]);
        assert_eq!(decode(DType::U64, &encode(DType::U64, &[1e19])), [1e19]);
        assert_eq!(decode(DType::Bool, &encode(DType::Bool, &[0.0, 2.0])), [0.0, 1.0]);
        assert_eq!(decode(DType::F16, &encode(DType::F16, &[6.1e-5])).len(), 1);
    }
}

//! Conversions between pg-core's values and NCCL's and pg-cuda's: the only module that matches on NCCL enums.

use nccl_sys::{sys, Version, FP8_VERSION};
use pg_core::half::{f32_to_bf16, f32_to_f16};
use pg_core::{DType, Error, ReduceOp};

/// The loaded NCCL's version (a communicator exists only once the library loaded; the oldest supported
/// version stands in otherwise, which only narrows what is allowed).
fn loaded_version() -> Version {
    nccl_sys::library().map_or(nccl_sys::MIN_VERSION, nccl_sys::Library::version)
}

/// NCCL's data type for `dtype` on the loaded NCCL (see [`data_type_for`]).
pub(crate) fn data_type(dtype: DType) -> sys::DataType {
    data_type_for(dtype, loaded_version())
}

/// NCCL's data type for `dtype` on NCCL `version`: bool travels as uint8, as in PyTorch, and so does fp8 on an
/// NCCL older than [`FP8_VERSION`] (moving it is fine, reducing it is refused by [`red_op_for`]).
pub(crate) fn data_type_for(dtype: DType, version: Version) -> sys::DataType {
    match dtype {
        DType::F8E4M3 if version >= FP8_VERSION => sys::ncclFloat8e4m3,
        DType::F8E5M2 if version >= FP8_VERSION => sys::ncclFloat8e5m2,
        DType::F8E4M3 | DType::F8E5M2 => sys::ncclUint8,
        DType::U32 => sys::ncclUint32,
        DType::U64 => sys::ncclUint64,
        DType::F32 => sys::ncclFloat32,
        DType::F64 => sys::ncclFloat64,
        DType::F16 => sys::ncclFloat16,
        DType::BF16 => sys::ncclBfloat16,
        DType::I8 => sys::ncclInt8,
        DType::U8 | DType::Bool => sys::ncclUint8,
        DType::I32 => sys::ncclInt32,
        DType::I64 => sys::ncclInt64,
    }
}

/// NCCL's reduction for `op` on `dtype` on the loaded NCCL (see [`red_op_for`]).
pub(crate) fn red_op(op: ReduceOp, dtype: DType) -> pg_core::Result<sys::RedOp> {
    red_op_for(op, dtype, loaded_version())
}

/// NCCL's reduction for `op` on `dtype` on NCCL `version` (PyTorch's mapping: a sum of bools is a max, i.e. a
/// logical or); a reduction on fp8 needs [`FP8_VERSION`].
pub(crate) fn red_op_for(op: ReduceOp, dtype: DType, version: Version) -> pg_core::Result<sys::RedOp> {
    op.check(dtype)?;
    if dtype.is_fp8() && version < FP8_VERSION {
        return Err(Error::unsupported(format!(
            "a reduction on {dtype} needs NCCL {FP8_VERSION} or newer; the loaded NCCL is {version}"
        )));
    }
    Ok(match (op, dtype) {
        (ReduceOp::Sum, DType::Bool) => sys::ncclMax,
        (ReduceOp::Product, DType::Bool) => sys::ncclMin,
        (ReduceOp::Sum, _) => sys::ncclSum,
        (ReduceOp::Product, _) => sys::ncclProd,
        (ReduceOp::Max, _) => sys::ncclMax,
        (ReduceOp::Min, _) => sys::ncclMin,
        (ReduceOp::Avg, _) => sys::ncclAvg,
        (ReduceOp::PreMulSum(_), _) => {
            return Err(Error::unsupported("PREMUL_SUM as a built-in NCCL reduction: it is an op made per call"))
        }
        (ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor, _) => {
            return Err(Error::unsupported(format!("ReduceOp.{} on NCCL", op.torch_name())))
        }
    })
}

/// The bit pattern of `value` as one element of `dtype`, and the element width (what `fill` writes).
pub(crate) fn fill_pattern(dtype: DType, value: f64) -> (usize, u64) {
    match dtype {
        DType::F32 => (4, u64::from((value as f32).to_bits())),
        DType::F64 => (8, value.to_bits()),
        DType::F16 => (2, u64::from(f32_to_f16(value as f32))),
        DType::BF16 => (2, u64::from(f32_to_bf16(value as f32))),
        DType::I8 => (1, u64::from(value as i8 as u8)),
        DType::U8 => (1, u64::from(value as u8)),
        DType::Bool => (1, u64::from(value != 0.0)),
        DType::I32 => (4, u64::from(value as i32 as u32)),
        DType::I64 => (8, value as i64 as u64),
        DType::U32 => (4, u64::from(value as u32)),
        DType::U64 => (8, value as u64),
        DType::F8E4M3 => (1, u64::from(pg_core::fp8::to_e4m3fn(value as f32))),
        DType::F8E5M2 => (1, u64::from(pg_core::fp8::to_e5m2(value as f32))),
    }
}

/// A CUDA error as pg-core's backend error.
pub(crate) fn cuda_error(err: pg_cuda::CudaError) -> Error {
    match err {
        pg_cuda::CudaError::InvalidArgument(message) => Error::InvalidArgument(message),
        pg_cuda::CudaError::Driver { ref source, .. } if is_capture_error(source.0) => Error::capture(err.to_string()),
        other => Error::Backend(other.to_string()),
    }
}

/// Whether a driver result is one of the stream-capture errors (`CUDA_ERROR_STREAM_CAPTURE_*`, 900 to 908).
fn is_capture_error(code: pg_cuda::cudarc::driver::sys::CUresult) -> bool {
    (900..=908).contains(&(code as u32))
}

/// An NCCL error as pg-core's: a failed call is a communicator error, a loading problem a backend error.
pub(crate) fn nccl_error(err: nccl_sys::Error) -> Error {
    match err {
        nccl_sys::Error::Call { status, .. } => Error::communicator_code(status.0, err.to_string()),
        nccl_sys::Error::InvalidArgument { .. } => Error::invalid(err.to_string()),
        // A call the loaded NCCL lacks: the message names the call and the versions.
        nccl_sys::Error::TooOld { .. } | nccl_sys::Error::Unavailable { .. } => Error::unsupported(err.to_string()),
        other => Error::Backend(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_capture_results_are_capture_errors() {
        use pg_cuda::cudarc::driver::sys::CUresult;
        assert!(is_capture_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        assert!(is_capture_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        assert!(is_capture_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED));
        assert!(is_capture_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD));
        assert!(!is_capture_error(CUresult::CUDA_ERROR_NOT_READY));
        assert!(!is_capture_error(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
    }

    #[test]
    fn reductions() {
        assert_eq!(red_op(ReduceOp::Sum, DType::F32).unwrap(), sys::ncclSum);
        assert_eq!(red_op(ReduceOp::Sum, DType::Bool).unwrap(), sys::ncclMax);
        assert_eq!(red_op(ReduceOp::Avg, DType::BF16).unwrap(), sys::ncclAvg);
        assert!(red_op(ReduceOp::Avg, DType::Bool).is_err());
        assert!(red_op(ReduceOp::BitXor, DType::I32).is_err());
    }

    #[test]
    fn data_types() {
        assert_eq!(data_type(DType::F32), 7);
        assert_eq!(data_type(DType::BF16), 9);
        assert_eq!(data_type(DType::Bool), data_type(DType::U8));
        assert_eq!(data_type(DType::U32), sys::ncclUint32);
        assert_eq!(data_type(DType::U64), sys::ncclUint64);
        let old = Version::new(2, 21, 5);
        assert_eq!(data_type_for(DType::F8E4M3, FP8_VERSION), sys::ncclFloat8e4m3);
        assert_eq!(data_type_for(DType::F8E5M2, Version::new(2, 27, 3)), sys::ncclFloat8e5m2);
        assert_eq!(data_type_for(DType::F8E4M3, old), sys::ncclUint8, "fp8 still moves as bytes");
        assert_eq!(data_type_for(DType::F8E5M2, old), sys::ncclUint8);
    }

    #[test]
    fn fp8_reductions_need_a_new_enough_nccl() {
        let old = Version::new(2, 21, 5);
        let err = red_op_for(ReduceOp::Sum, DType::F8E4M3, old).unwrap_err();
        assert_eq!(err.kind(), pg_core::ErrorKind::Unsupported);
        let text = err.to_string();
        assert!(text.contains("2.21.5") && text.contains("2.24.0") && text.contains("Float8_e4m3fn"), "{text}");
        assert_eq!(red_op_for(ReduceOp::Max, DType::F8E5M2, FP8_VERSION).unwrap(), sys::ncclMax);
        assert_eq!(red_op_for(ReduceOp::Sum, DType::U64, old).unwrap(), sys::ncclSum);
    }

    #[test]
    fn half_conversions() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(f32_to_f16(0.0), 0);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001, "smallest subnormal");
        assert_eq!(f32_to_f16(0.333_333_34), 0x3555);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(3.0), 0x4040);
        assert_eq!(f32_to_bf16(-0.5), 0xbf00);
    }

    #[test]
    fn patterns() {
        assert_eq!(fill_pattern(DType::F32, 1.5), (4, 0x3fc0_0000));
        assert_eq!(fill_pattern(DType::I64, -1.0), (8, u64::MAX));
        assert_eq!(fill_pattern(DType::Bool, 2.0), (1, 1));
        assert_eq!(fill_pattern(DType::F64, 2.0), (8, 2.0f64.to_bits()));
        assert_eq!(fill_pattern(DType::U32, 3e9), (4, 3_000_000_000));
        assert_eq!(fill_pattern(DType::F8E4M3, 1.0), (1, 0x38));
        assert_eq!(fill_pattern(DType::F8E5M2, -1.0), (1, 0xbc));
    }

    #[test]
    fn error_kinds() {
        let call = nccl_sys::Error::Call { call: "ncclAllReduce", status: nccl_sys::Status(6), detail: String::new() };
        let converted = nccl_error(call);
        assert_eq!(converted.kind(), pg_core::ErrorKind::Communicator);
        assert_eq!(converted.result_code(), Some(6), "the NCCL result code is kept as a field: {converted:?}");
        let missing = nccl_sys::Error::LibraryNotFound { tried: vec![] };
        assert_eq!(nccl_error(missing).kind(), pg_core::ErrorKind::Backend);
        assert_eq!(cuda_error(pg_cuda::CudaError::DriverNotFound).kind(), pg_core::ErrorKind::Backend);
    }
}

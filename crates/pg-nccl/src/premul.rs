//! The NCCL reduction of one op: a built-in one, or a `PREMUL_SUM` op made for that call and destroyed right
//! after it is enqueued, as PyTorch does (`ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy`).

use nccl_sys::{sys, Library, Status};
use pg_core::{DType, ReduceOp};

use crate::conv::{data_type, fill_pattern, red_op};

/// What one op reduces with.
pub(crate) enum OpPlan {
    /// A built-in NCCL reduction.
    Builtin(sys::RedOp),
    /// `PREMUL_SUM` with a host factor, already in the op's dtype (little-endian, in the first bytes).
    HostScalar { bytes: [u8; 8] },
    /// `PREMUL_SUM` with a factor NCCL reads from this device address when the op runs.
    DeviceScalar(*mut std::ffi::c_void),
}

/// The plan for `op` on `dtype`, checked before anything is enqueued.
pub(crate) fn plan(op: ReduceOp, dtype: DType) -> pg_core::Result<OpPlan> {
    match op {
        ReduceOp::PreMulSum(factor) => {
            ReduceOp::check_pre_mul_sum(dtype)?;
            let (_, bits) = fill_pattern(dtype, factor);
            Ok(OpPlan::HostScalar { bytes: bits.to_le_bytes() })
        }
        op => red_op(op, dtype).map(OpPlan::Builtin),
    }
}

/// The plan for a device factor at `scalar` (one element of `dtype` on the communicator's device).
pub(crate) fn device_plan(scalar: *mut std::ffi::c_void, dtype: DType) -> pg_core::Result<OpPlan> {
    ReduceOp::check_pre_mul_sum(dtype)?;
    Ok(OpPlan::DeviceScalar(scalar))
}

/// Runs `enqueue` with the plan's NCCL reduction: a `PREMUL_SUM` op is created first and destroyed after
/// `enqueue` returns (ops already enqueued keep what they need), also when `enqueue` failed.
///
/// # Safety
/// `comm` must be live and the caller must hold its issue lock; a device plan's address must hold one element
/// of `dtype` on `comm`'s device until the enqueued op has run.
pub(crate) unsafe fn with_op(
    lib: &Library,
    comm: nccl_sys::Comm,
    plan: &OpPlan,
    dtype: DType,
    enqueue: impl FnOnce(sys::RedOp) -> nccl_sys::Result<Status>,
) -> nccl_sys::Result<Status> {
    let mut host = match plan {
        OpPlan::HostScalar { bytes } => *bytes,
        _ => [0; 8],
    };
    let (scalar, residence) = match plan {
        OpPlan::Builtin(op) => return enqueue(*op),
        OpPlan::HostScalar { .. } => (host.as_mut_ptr().cast::<std::ffi::c_void>(), sys::ncclScalarHostImmediate),
        OpPlan::DeviceScalar(ptr) => (*ptr, sys::ncclScalarDevice),
    };
    // SAFETY: `comm` is live and issued from this thread only (the caller's contract); a host factor points at
    // `host`, which outlives the call and holds one element of `dtype` (`fill_pattern`) that NCCL copies during
    // it, and a device factor meets the caller's contract.
    let op = unsafe { lib.red_op_create_pre_mul_sum(scalar, data_type(dtype), residence, comm) }?;
    let result = enqueue(op);
    // SAFETY: `op` was made for `comm` just above and nothing issues with it after this.
    let destroyed = unsafe { lib.red_op_destroy(op, comm) };
    let status = result?;
    destroyed?;
    Ok(status)
}

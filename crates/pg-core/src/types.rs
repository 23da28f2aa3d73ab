//! Plain value types shared by every backend: dtypes, reductions, op types, unique ids.

use std::fmt;

use crate::{Error, Result};

/// The element type of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Signed byte.
    I8,
    /// Unsigned byte.
    U8,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// Bool, one byte (NCCL sends it as uint8).
    Bool,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// 8-bit float with 4 exponent and 3 mantissa bits, no infinities (PyTorch's `float8_e4m3fn`).
    F8E4M3,
    /// 8-bit float with 5 exponent and 2 mantissa bits (PyTorch's `float8_e5m2`).
    F8E5M2,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// PyTorch's name of the dtype (`Float`, `Long`, ...), as the flight recorder writes it.
    pub const fn torch_name(self) -> &'static str {
        match self {
            DType::F32 => "Float",
            DType::F64 => "Double",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::I8 => "Char",
            DType::U8 => "Byte",
            DType::I32 => "Int",
            DType::I64 => "Long",
            DType::Bool => "Bool",
            DType::U32 => "UInt32",
            DType::U64 => "UInt64",
            DType::F8E4M3 => "Float8_e4m3fn",
            DType::F8E5M2 => "Float8_e5m2",
        }
    }

    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::U32,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Whether this is one of the 8-bit float types.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

/// A reduction, as PyTorch's `ReduceOp` (the bitwise ones are refused, as NCCL has none).
///
/// The value stays `Copy` and comparable: `PreMulSum` here carries a host factor. PyTorch's other form, a factor
/// in a one-element device tensor, is a buffer, neither `Copy` nor comparable, so it has entry points of its own
/// (`ProcessGroup::all_reduce_pre_mul_sum`, `Communicator::all_reduce_pre_mul_sum`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceOp {
    /// Sum (on bool: logical or, as PyTorch maps it to max).
    Sum,
    /// Average (not on bool).
    Avg,
    /// Product.
    Product,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and: not supported by NCCL.
    BitAnd,
    /// Bitwise or: not supported by NCCL.
    BitOr,
    /// Bitwise xor: not supported by NCCL.
    BitXor,
    /// PyTorch's `PREMUL_SUM` with a host factor (`_make_nccl_premul_sum(factor)`): every rank's input times
    /// its own factor, summed. Only on f16, bf16, f32 and f64, as PyTorch.
    PreMulSum(f64),
}

impl ReduceOp {
    /// Checks that this reduction can run on `dtype`, with PyTorch's error texts.
    pub fn check(self, dtype: DType) -> Result<()> {
        match (self, dtype) {
            (ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor, _) => {
                Err(Error::invalid(format!("Cannot use ReduceOp.{} with NCCL", self.torch_name())))
            }
            (ReduceOp::Avg, DType::Bool) => Err(Error::invalid("Cannot use ReduceOp.AVG with boolean inputs")),
            (ReduceOp::PreMulSum(_), dtype) => Self::check_pre_mul_sum(dtype),
            _ => Ok(()),
        }
    }

    /// Checks that `PREMUL_SUM` can run on `dtype` (f16, bf16, f32, f64), with PyTorch's error text.
    pub fn check_pre_mul_sum(dtype: DType) -> Result<()> {
        match dtype {
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Ok(()),
            other => {
                Err(Error::invalid(format!("PreMulSum Data type must be half, float, bfloat16 or double, not {other}")))
            }
        }
    }

    /// PyTorch's name (`SUM`, `AVG`, ...).
    pub const fn torch_name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Avg => "AVG",
            ReduceOp::Product => "PRODUCT",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
            ReduceOp::BitAnd => "BAND",
            ReduceOp::BitOr => "BOR",
            ReduceOp::BitXor => "BXOR",
            ReduceOp::PreMulSum(_) => "PREMUL_SUM",
        }
    }
}

/// The opaque id that lets the ranks of one communicator find each other (NCCL's 128-byte `ncclUniqueId`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UniqueId(pub Vec<u8>);

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head: String = self.0.iter().take(8).map(|b| format!("{b:02x}")).collect();
        write!(f, "UniqueId({} bytes, {head}..)", self.0.len())
    }
}

/// How a communicator is created.
#[derive(Debug, Clone, Default)]
pub struct CommConfig {
    /// Non-blocking init (NCCL's `config.blocking = 0`): creation returns at once and the communicator
    /// becomes ready later; the process group waits for it before its first use.
    pub nonblocking: bool,
    /// A description for the backend's logs (PyTorch sets `pg_desc:pg_uid`).
    pub description: String,
    /// How long a blocking init may wait for the other ranks to join; past it creation fails with
    /// [`crate::Error::InitTimeout`] (`None`: no bound). A non-blocking init returns at once and ignores it.
    pub timeout: Option<std::time::Duration>,
}

/// How a communicator is shrunk ([`crate::Communicator::shrink`], NCCL's `shrinkFlags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ShrinkMode {
    /// `NCCL_SHRINK_DEFAULT`: the parent is healthy (or revoked, so nothing of it runs): it stays usable, and
    /// an op of it still in flight is an error (NCCL would wait for it).
    Default,
    /// `NCCL_SHRINK_ABORT`: the excluded ranks are dead and the parent's ops in flight may never end: they are
    /// stopped first. The parent is unusable afterwards (only dropping it is left).
    #[default]
    Abort,
}

impl ShrinkMode {
    /// `excluded`, sorted, checked as the ranks a shrink of rank `rank`'s communicator of `size` may leave out:
    /// distinct ranks of the communicator, not the caller's, and not every rank.
    pub fn checked_exclusion(excluded: &[usize], size: usize, rank: usize) -> Result<Vec<usize>> {
        let mut sorted = excluded.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != excluded.len() || sorted.iter().any(|&r| r >= size) || sorted.contains(&rank) {
            return Err(Error::invalid(format!(
                "shrink: excluded ranks {excluded:?} must be distinct ranks of a communicator of {size}, without the \
                 caller's rank {rank}"
            )));
        }
        if sorted.len() >= size {
            return Err(Error::invalid("shrink: every rank is excluded"));
        }
        Ok(sorted)
    }

    /// NCCL's flag value (`NCCL_SHRINK_DEFAULT` 0, `NCCL_SHRINK_ABORT` 1).
    pub const fn nccl_flag(self) -> i32 {
        match self {
            ShrinkMode::Default => 0,
            ShrinkMode::Abort => 1,
        }
    }
}

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
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
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
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

/// A reduction, as PyTorch's `ReduceOp` (the bitwise ones are refused, as NCCL has none).
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
}

impl ReduceOp {
    /// Checks that this reduction can run on `dtype`, with PyTorch's error texts.
    pub fn check(self, dtype: DType) -> Result<()> {
        match (self, dtype) {
            (ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor, _) => {
                Err(Error::invalid(format!("Cannot use ReduceOp.{} with NCCL", self.torch_name())))
            }
            (ReduceOp::Avg, DType::Bool) => Err(Error::invalid("Cannot use ReduceOp.AVG with boolean inputs")),
            _ => Ok(()),
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
        }
    }
}

/// What a Work is, with PyTorch's `OpType` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpType {
    /// broadcast
    Broadcast,
    /// all_reduce
    AllReduce,
    /// reduce
    Reduce,
    /// all_gather_into_tensor
    AllGatherBase,
    /// reduce_scatter_tensor
    ReduceScatterBase,
    /// all_to_all_single
    AllToAllBase,
    /// send
    Send,
    /// recv
    Recv,
    /// barrier
    Barrier,
    /// a coalesced group of ops
    Coalesced,
}

impl OpType {
    /// Every op type, in declaration order (`ALL[op as usize] == op`).
    pub const ALL: [OpType; 10] = [
        OpType::Broadcast,
        OpType::AllReduce,
        OpType::Reduce,
        OpType::AllGatherBase,
        OpType::ReduceScatterBase,
        OpType::AllToAllBase,
        OpType::Send,
        OpType::Recv,
        OpType::Barrier,
        OpType::Coalesced,
    ];

    /// PyTorch's `OpType` name (`ALLREDUCE`, ...).
    pub const fn torch_name(self) -> &'static str {
        match self {
            OpType::Broadcast => "BROADCAST",
            OpType::AllReduce => "ALLREDUCE",
            OpType::Reduce => "REDUCE",
            OpType::AllGatherBase => "_ALLGATHER_BASE",
            OpType::ReduceScatterBase => "_REDUCE_SCATTER_BASE",
            OpType::AllToAllBase => "ALLTOALL_BASE",
            OpType::Send => "SEND",
            OpType::Recv => "RECV",
            OpType::Barrier => "BARRIER",
            OpType::Coalesced => "COALESCED",
        }
    }

    /// The profiling name PyTorch gives the op (`nccl:all_reduce`, ...).
    pub const fn profiling_name(self) -> &'static str {
        match self {
            OpType::Broadcast => "nccl:broadcast",
            OpType::AllReduce => "nccl:all_reduce",
            OpType::Reduce => "nccl:reduce",
            OpType::AllGatherBase => "nccl:_all_gather_base",
            OpType::ReduceScatterBase => "nccl:_reduce_scatter_base",
            OpType::AllToAllBase => "nccl:all_to_all",
            OpType::Send => "nccl:send",
            OpType::Recv => "nccl:recv",
            OpType::Barrier => "nccl:all_reduce_barrier",
            OpType::Coalesced => "nccl:coalesced",
        }
    }

    /// Whether this is a point-to-point op.
    pub const fn is_p2p(self) -> bool {
        matches!(self, OpType::Send | OpType::Recv)
    }
}

impl fmt::Display for OpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
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
}

//! `OpType`: what a Work is, with PyTorch's names (its own file: errors name it, and types' checks return errors).

use std::fmt;

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

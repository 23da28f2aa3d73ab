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
    /// gather
    Gather,
    /// scatter
    Scatter,
    /// all_to_all (the list form)
    AllToAll,
    /// all_gather (the list form)
    AllGather,
    /// reduce_scatter (the list form)
    ReduceScatter,
    /// batch_isend_irecv: a batch of point-to-point ops on the group's communicator
    BatchP2p,
}

impl OpType {
    /// Every op type, in declaration order (`ALL[op as usize] == op`).
    pub const ALL: [OpType; 16] = [
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
        OpType::Gather,
        OpType::Scatter,
        OpType::AllToAll,
        OpType::AllGather,
        OpType::ReduceScatter,
        OpType::BatchP2p,
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
            OpType::Gather => "GATHER",
            OpType::Scatter => "SCATTER",
            OpType::AllToAll => "ALLTOALL",
            OpType::AllGather => "ALLGATHER",
            OpType::ReduceScatter => "REDUCE_SCATTER",
            OpType::BatchP2p => "COALESCED",
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
            OpType::Gather => "nccl:gather",
            OpType::Scatter => "nccl:scatter",
            OpType::AllToAll => "nccl:all_to_all",
            OpType::AllGather => "nccl:all_gather",
            OpType::ReduceScatter => "nccl:reduce_scatter",
            OpType::BatchP2p => "nccl:batch_p2p",
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

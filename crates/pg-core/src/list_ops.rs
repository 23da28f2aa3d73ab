//! The collectives beyond the one-buffer set: reduce, gather, scatter, all-to-all, the list forms of all-gather
//! and reduce-scatter, batched point-to-point and coalesced blocks, each through the one collective template.
//!
//! Every check that one rank can make runs before anything is enqueued and fails with
//! [`Error::InvalidArgument`] naming the op and what was wrong. What only another rank can see (different
//! split sizes on two ranks) is compared across ranks when the group checks chunk sizes
//! ([`crate::Options::check_chunk_sizes`], `chunk_check.rs`); otherwise it is the backend's mismatch, which
//! hangs a rank until the watchdog's `WorkTimeout`.

use crate::args;
use crate::process_group::{Bufs, OpSpec};
use crate::{Backend, Buffer, Communicator, Error, OpType, ProcessGroup, ReduceOp, Result, WorkHandle};

/// Whether a point-to-point op of a batch sends or receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2PKind {
    /// `isend`
    Send,
    /// `irecv`
    Recv,
}

/// One point-to-point op of [`ProcessGroup::batch_isend_irecv`] (torch's `P2POp`).
#[derive(Debug, Clone)]
pub struct P2POp<B: Backend> {
    /// Send or receive.
    pub kind: P2PKind,
    /// What is sent, or where the message lands.
    pub buffer: B::Buffer,
    /// The other rank, as a rank of the group.
    pub peer: usize,
}

impl<B: Backend> P2POp<B> {
    /// A send of `buffer` to `peer`.
    pub fn send(buffer: &B::Buffer, peer: usize) -> Self {
        Self { kind: P2PKind::Send, buffer: buffer.clone(), peer }
    }

    /// A receive into `buffer` from `peer`.
    pub fn recv(buffer: &B::Buffer, peer: usize) -> Self {
        Self { kind: P2PKind::Recv, buffer: buffer.clone(), peer }
    }
}

/// One collective recorded in a coalesced block.
#[derive(Debug)]
enum Coalesced<B: Backend> {
    AllReduce(B::Buffer, ReduceOp),
    Broadcast(B::Buffer, usize),
    Reduce(B::Buffer, usize, ReduceOp),
    AllGather(B::Buffer, B::Buffer),
    ReduceScatter(B::Buffer, B::Buffer, ReduceOp),
}

/// The collectives of a coalesced block ([`ProcessGroup::coalesced`]): each call checks its arguments at once
/// and records the op; the block enqueues them all as one Work when it ends.
#[derive(Debug)]
pub struct Coalescer<'g, B: Backend> {
    group: &'g ProcessGroup<B>,
    ops: Vec<Coalesced<B>>,
}

impl<B: Backend> Coalescer<'_, B> {
    /// Records an all-reduce of `buffer` in place (see [`ProcessGroup::all_reduce`]).
    pub fn all_reduce(&mut self, buffer: &B::Buffer, op: ReduceOp) -> Result<()> {
        self.group.check_devices("all_reduce", &[buffer])?;
        op.check(buffer.dtype())?;
        args::no_pre_mul_sum("coalesced all_reduce", op)?;
        self.ops.push(Coalesced::AllReduce(buffer.clone(), op));
        Ok(())
    }

    /// Records a broadcast of `root`'s `buffer` (see [`ProcessGroup::broadcast`]).
    pub fn broadcast(&mut self, buffer: &B::Buffer, root: usize) -> Result<()> {
        self.group.check_devices("broadcast", &[buffer])?;
        args::rank_in_range("broadcast", "root", root, self.group.size())?;
        self.ops.push(Coalesced::Broadcast(buffer.clone(), root));
        Ok(())
    }

    /// Records a reduce into `root`'s `buffer` (see [`ProcessGroup::reduce`]).
    pub fn reduce(&mut self, buffer: &B::Buffer, root: usize, op: ReduceOp) -> Result<()> {
        self.group.check_devices("reduce", &[buffer])?;
        args::rank_in_range("reduce", "root", root, self.group.size())?;
        op.check(buffer.dtype())?;
        args::no_pre_mul_sum("coalesced reduce", op)?;
        self.ops.push(Coalesced::Reduce(buffer.clone(), root, op));
        Ok(())
    }

    /// Records an all-gather of `input` into `output` (see [`ProcessGroup::all_gather`]).
    pub fn all_gather(&mut self, input: &B::Buffer, output: &B::Buffer) -> Result<()> {
        self.group.check_scaled("all_gather", input, output, (self.group.size(), 1))?;
        self.ops.push(Coalesced::AllGather(input.clone(), output.clone()));
        Ok(())
    }

    /// Records a reduce-scatter of `input` into `output` (see [`ProcessGroup::reduce_scatter`]).
    pub fn reduce_scatter(&mut self, input: &B::Buffer, output: &B::Buffer, op: ReduceOp) -> Result<()> {
        self.group.check_scaled("reduce_scatter", input, output, (1, self.group.size()))?;
        op.check(input.dtype())?;
        args::no_pre_mul_sum("coalesced reduce_scatter", op)?;
        self.ops.push(Coalesced::ReduceScatter(input.clone(), output.clone(), op));
        Ok(())
    }
}

impl<B: Backend> ProcessGroup<B> {
    /// Reduces every rank's `buffer` into `root`'s `buffer` (torch's `dist.reduce`); the other ranks' buffers
    /// are left as they were.
    pub fn reduce(&self, buffer: &B::Buffer, root: usize, op: ReduceOp) -> Result<WorkHandle<B>> {
        self.check_devices("reduce", &[buffer])?;
        args::rank_in_range("reduce", "root", root, self.size())?;
        op.check(buffer.dtype())?;
        args::no_pre_mul_sum("reduce", op)?;
        let spec = OpSpec { in_place: true, ..OpSpec::lists(OpType::Reduce, Bufs::One(buffer), Bufs::One(buffer)) };
        self.run(spec, |comm, stream| comm.reduce(buffer, buffer, root, op, stream))
    }

    /// Gathers every rank's `input` into `root`'s `outputs` (torch's `dist.gather`; `outputs` is its
    /// `gather_list`): on the root one buffer per rank, each of `input`'s size and dtype; elsewhere empty.
    pub fn gather(&self, input: &B::Buffer, outputs: &[B::Buffer], root: usize) -> Result<WorkHandle<B>> {
        self.check_devices("gather", &[input])?;
        args::rank_in_range("gather", "root", root, self.size())?;
        self.check_root_list("gather", "outputs", outputs, root, input)?;
        let spec = OpSpec::lists(OpType::Gather, Bufs::One(input), Bufs::List(outputs));
        self.run(spec, |comm, stream| comm.gather(input, outputs, root, stream))
    }

    /// Scatters `root`'s `inputs[i]` into rank `i`'s `output` (torch's `dist.scatter`; `inputs` is its
    /// `scatter_list`): on the root one buffer per rank, each of `output`'s size and dtype; elsewhere empty.
    pub fn scatter(&self, output: &B::Buffer, inputs: &[B::Buffer], root: usize) -> Result<WorkHandle<B>> {
        self.check_devices("scatter", &[output])?;
        args::rank_in_range("scatter", "root", root, self.size())?;
        self.check_root_list("scatter", "inputs", inputs, root, output)?;
        let spec = OpSpec::lists(OpType::Scatter, Bufs::List(inputs), Bufs::One(output));
        self.run(spec, |comm, stream| comm.scatter(inputs, output, root, stream))
    }

    /// Exchanges chunks of one buffer with every rank (torch's `dist.all_to_all_single`): chunk `j` of `input`
    /// goes to rank `j`, and chunk `i` of `output` comes from rank `i`. Splits count elements, one per rank, and
    /// must sum to the buffer's length; `None` means equal chunks. Rank `i`'s `input_splits[j]` must equal rank
    /// `j`'s `output_splits[i]`: a difference is seen only by the other rank and ends as a `WorkTimeout`.
    pub fn all_to_all_single(
        &self,
        output: &B::Buffer,
        input: &B::Buffer,
        output_splits: Option<&[usize]>,
        input_splits: Option<&[usize]>,
    ) -> Result<WorkHandle<B>> {
        const WHAT: &str = "all_to_all_single";
        let (input_splits, output_splits) = self.checked_sizes(WHAT, || {
            self.check_devices(WHAT, &[input, output])?;
            args::same_dtype(WHAT, input.dtype(), output.dtype())?;
            let size = self.size();
            let input_splits = args::splits(WHAT, "input", input.numel(), input_splits, size)?;
            Ok((input_splits, args::splits(WHAT, "output", output.numel(), output_splits, size)?))
        })?;
        let spec = OpSpec::lists(OpType::AllToAllBase, Bufs::One(input), Bufs::One(output));
        self.run(spec, |comm, stream| comm.all_to_all_single(input, output, &input_splits, &output_splits, stream))
    }

    /// Exchanges lists of buffers with every rank (torch's `dist.all_to_all`): `inputs[j]` goes to rank `j`
    /// and `outputs[i]` comes from rank `i`; one buffer per rank on each side, all of one dtype, sizes free.
    pub fn all_to_all(&self, outputs: &[B::Buffer], inputs: &[B::Buffer]) -> Result<WorkHandle<B>> {
        const WHAT: &str = "all_to_all";
        self.checked_sizes(WHAT, || {
            self.check_list(WHAT, "inputs", inputs)?;
            self.check_list(WHAT, "outputs", outputs)?;
            args::uniform_dtype(WHAT, inputs[0].dtype(), inputs.iter().chain(outputs))?;
            let rank = self.rank();
            if inputs[rank].numel() != outputs[rank].numel() {
                return Err(Error::invalid(format!(
                    "{WHAT}: this rank ({rank}) sends itself {} elements (inputs[{rank}]) but outputs[{rank}] holds {}",
                    inputs[rank].numel(),
                    outputs[rank].numel()
                )));
            }
            Ok((sizes(inputs), sizes(outputs)))
        })?;
        let spec = OpSpec::lists(OpType::AllToAll, Bufs::List(inputs), Bufs::List(outputs));
        self.run(spec, |comm, stream| comm.all_to_all(inputs, outputs, stream))
    }

    /// Gathers every rank's `input` into `outputs[rank]` on every rank (torch's `dist.all_gather` with a
    /// tensor list): one output per rank, of that rank's input size (sizes may differ by rank), one dtype.
    pub fn all_gather_into(&self, outputs: &[B::Buffer], input: &B::Buffer) -> Result<WorkHandle<B>> {
        const WHAT: &str = "all_gather_into";
        self.checked_sizes(WHAT, || {
            self.check_devices(WHAT, &[input])?;
            self.check_list(WHAT, "outputs", outputs)?;
            args::uniform_dtype(WHAT, input.dtype(), outputs)?;
            args::own_chunk(WHAT, "outputs", self.rank(), &outputs[self.rank()], input)?;
            Ok((vec![input.numel(); self.size()], sizes(outputs)))
        })?;
        let spec = OpSpec::lists(OpType::AllGather, Bufs::One(input), Bufs::List(outputs));
        self.run(spec, |comm, stream| comm.all_gather_v(input, outputs, stream))
    }

    /// Reduces every rank's `inputs[j]` into rank `j`'s `output` (torch's `dist.reduce_scatter` with a tensor
    /// list): one input per rank, `inputs[j]` of rank `j`'s output size (sizes may differ by rank), one dtype.
    pub fn reduce_scatter_from(&self, output: &B::Buffer, inputs: &[B::Buffer], op: ReduceOp) -> Result<WorkHandle<B>> {
        const WHAT: &str = "reduce_scatter_from";
        self.checked_sizes(WHAT, || {
            self.check_devices(WHAT, &[output])?;
            self.check_list(WHAT, "inputs", inputs)?;
            args::uniform_dtype(WHAT, output.dtype(), inputs)?;
            op.check(output.dtype())?;
            args::no_pre_mul_sum(WHAT, op)?;
            args::own_chunk(WHAT, "inputs", self.rank(), &inputs[self.rank()], output)?;
            Ok((sizes(inputs), vec![output.numel(); self.size()]))
        })?;
        let spec = OpSpec::lists(OpType::ReduceScatter, Bufs::List(inputs), Bufs::One(output));
        self.run(spec, |comm, stream| comm.reduce_scatter_v(inputs, output, op, stream))
    }

    /// Runs a batch of sends and receives as one Work on the group's communicator (torch's
    /// `dist.batch_isend_irecv`), inside one backend group.
    ///
    /// The batch is issued in an order every rank agrees on (by rank pair, then direction, keeping the order
    /// of the messages between two ranks), so that it cannot deadlock on a backend that runs point-to-point
    /// ops in issue order, whatever order the caller listed them in.
    pub fn batch_isend_irecv(&self, ops: &[P2POp<B>]) -> Result<WorkHandle<B>> {
        const WHAT: &str = "batch_isend_irecv";
        if ops.is_empty() {
            return Err(Error::invalid(format!("{WHAT}: the batch is empty (it needs at least one op)")));
        }
        let rank = self.rank();
        for op in ops {
            self.check_devices(WHAT, &[&op.buffer])?;
            args::peer(WHAT, op.peer, rank, self.size())?;
        }
        let mut order: Vec<&P2POp<B>> = ops.iter().collect();
        // Messages from the lower rank of a pair first: both ranks of a pair then list its messages alike.
        order.sort_by_key(|op| (rank.min(op.peer), rank.max(op.peer), (op.kind == P2PKind::Send) != (rank < op.peer)));
        let sends: Vec<B::Buffer> =
            ops.iter().filter(|op| op.kind == P2PKind::Send).map(|op| op.buffer.clone()).collect();
        let recvs: Vec<B::Buffer> =
            ops.iter().filter(|op| op.kind == P2PKind::Recv).map(|op| op.buffer.clone()).collect();
        let spec = OpSpec::lists(OpType::BatchP2p, Bufs::List(&sends), Bufs::List(&recvs));
        self.run(spec, |comm, stream| {
            grouped(comm, || {
                order.iter().try_for_each(|op| match op.kind {
                    P2PKind::Send => comm.send(&op.buffer, op.peer, stream),
                    P2PKind::Recv => comm.recv(&op.buffer, op.peer, stream),
                })
            })
        })
    }

    /// Runs the collectives that `block` records as one Work (torch's `_coalescing_manager`): each call on the
    /// [`Coalescer`] checks its arguments at once, and when `block` returns `Ok` they are enqueued together,
    /// in order, inside one backend group. An error from `block` enqueues nothing; an empty block is an error.
    pub fn coalesced(&self, block: impl FnOnce(&mut Coalescer<'_, B>) -> Result<()>) -> Result<WorkHandle<B>> {
        let mut coalescer = Coalescer { group: self, ops: Vec::new() };
        block(&mut coalescer)?;
        let ops = coalescer.ops;
        if ops.is_empty() {
            return Err(Error::invalid("coalesced: the block recorded no collective"));
        }
        let (mut inputs, mut outputs) = (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()));
        for op in &ops {
            match op {
                Coalesced::AllReduce(b, _) | Coalesced::Broadcast(b, _) | Coalesced::Reduce(b, _, _) => {
                    outputs.push(b.clone())
                }
                Coalesced::AllGather(i, o) | Coalesced::ReduceScatter(i, o, _) => {
                    inputs.push(i.clone());
                    outputs.push(o.clone());
                }
            }
        }
        let spec = OpSpec::lists(OpType::Coalesced, Bufs::List(&inputs), Bufs::List(&outputs));
        self.run(spec, |comm, stream| {
            grouped(comm, || {
                ops.iter().try_for_each(|op| match op {
                    Coalesced::AllReduce(b, op) => comm.all_reduce(b, b, *op, stream),
                    Coalesced::Broadcast(b, root) => comm.broadcast(b, b, *root, stream),
                    Coalesced::Reduce(b, root, op) => comm.reduce(b, b, *root, *op, stream),
                    Coalesced::AllGather(i, o) => comm.all_gather(i, o, stream),
                    Coalesced::ReduceScatter(i, o, op) => comm.reduce_scatter(i, o, *op, stream),
                })
            })
        })
    }

    // ===== checks =====

    /// A list with one buffer per rank, each on this rank's device.
    fn check_list(&self, what: &str, which: &str, list: &[B::Buffer]) -> Result<()> {
        args::per_rank(what, which, list.len(), self.size())?;
        list.iter().try_for_each(|buffer| self.check_devices(what, &[buffer]))
    }

    /// Gather's outputs or scatter's inputs: one buffer per rank like `like` on the root, none elsewhere; each on
    /// this rank's device.
    fn check_root_list(
        &self,
        what: &str,
        which: &str,
        list: &[B::Buffer],
        root: usize,
        like: &B::Buffer,
    ) -> Result<()> {
        args::root_list(what, which, list, (root, self.rank(), self.size()), like)?;
        list.iter().try_for_each(|buffer| self.check_devices(what, &[buffer]))
    }

    /// Two buffers of one dtype on this device whose sizes relate as `output * inp == input * out`.
    fn check_scaled(&self, what: &str, input: &B::Buffer, output: &B::Buffer, factors: (usize, usize)) -> Result<()> {
        self.check_devices(what, &[input, output])?;
        args::scaled(what, input, output, factors, self.size())
    }
}

/// Runs `body` between the backend's group start and end; the group is closed also when `body` fails.
fn grouped<C: Communicator>(comm: &C, body: impl FnOnce() -> Result<()>) -> Result<()> {
    comm.group_start()?;
    let result = body();
    let ended = comm.group_end();
    result.and(ended)
}

/// The element count of each buffer of a list.
fn sizes<B: Buffer>(list: &[B]) -> Vec<usize> {
    list.iter().map(Buffer::numel).collect()
}

//! The one generic process group: the collective template, the lazy communicator cache, stream
//! synchronisation and Work (S1-S20, S27), written once for every backend.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pg_store::Store;

use crate::args;
use crate::cache::{CommCache, CommEntry, CommShared};
use crate::desync::DesyncReport;
use crate::enqueue_timing::{EnqueueStep, StepTimer};
use crate::failure;
use crate::flight_recorder::{current_thread_number, ListSizes};
use crate::lifecycle::{Call, GroupState};
#[cfg(feature = "testing")]
use crate::locks::lock;
use crate::op_trace::{Identity, OpInfo, Tracer};
use crate::shared::{Membership, Shared};
use crate::status::{ErrorType, GroupStatus};
use crate::tally::Counters;
use crate::work::WorkState;
use crate::{
    Backend, Buffer, Capabilities, Capability, CommConfig, CommKey, Communicator, DType, Device, Error, Event, OpType,
    Options, ReduceOp, Result, Stream, UniqueId, WorkHandle,
};

/// Process-wide counter of groups: PyTorch's "PG ID".
static NEXT_LOCAL_ID: AtomicU64 = AtomicU64::new(0);

/// The most ranks a group may have: NCCL counts ranks in a C `int`.
const MAX_WORLD_SIZE: usize = i32::MAX as usize;

/// The store key (under the group's store, then `/{rank}`) that counts the groups each rank created on it.
const GROUP_INSTANCE_KEY: &str = "pg_group_instance";

/// The suffix of the store key beside each unique-id key that names the group instance that published it.
const ID_OWNER_SUFFIX: &str = "/pg_group_instance";

/// What kind of group is made: its place in the world and how it uses the store around its unique ids.
pub(crate) enum Kind {
    /// A group that is its own world; each id key is claimed for this group instance beside it (see
    /// [`GROUP_INSTANCE_KEY`]).
    World,
    /// A subgroup (`subgroups.rs`), which knows its members' world ranks; it claims its id keys too.
    Subgroup(Membership),
    /// A group that speaks PyTorch's store protocol exactly (`torch_compat.rs`): the id is set by the root and
    /// read by the others, with no group-instance keys, so that PyTorch's ranks and this one form one
    /// communicator.
    Torch,
}

/// A process group: this rank's view of a set of ranks that run collectives together.
///
/// It is PyTorch's `ProcessGroupNCCL`, generic over the [`Backend`]: it creates communicators lazily on the
/// first op of each key (one cache per group instance, never shared between groups), exchanges their unique
/// ids through the store, runs every op on a dedicated communication stream ordered after the caller's
/// current stream, and returns a [`WorkHandle`].
/// Cloning gives another handle to the same group.
pub struct ProcessGroup<B: Backend> {
    inner: Arc<Shared<B>>,
}

impl<B: Backend> ProcessGroup<B> {
    /// Runs `local`, the one-rank checks of op `what` that give its chunk sizes (elements sent to and expected
    /// from each rank), then, when the group checks them ([`Options::check_chunk_sizes`]), compares the sizes across
    /// ranks. An op refused by `local` still takes its turn in the cross-rank check, saying it was refused, so that
    /// the peers fail the same op and every rank's next checked op is the same one.
    pub(crate) fn checked_sizes(
        &self,
        what: &str,
        local: impl FnOnce() -> Result<(Vec<usize>, Vec<usize>)>,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        match local() {
            Ok((sends, recvs)) => {
                crate::chunk_check::check(&self.inner, what, &sends, &recvs)?;
                Ok((sends, recvs))
            }
            Err(error) => {
                crate::chunk_check::refuse(&self.inner, what, &error);
                Err(error)
            }
        }
    }
}

impl<B: Backend> Clone for ProcessGroup<B> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<B: Backend> fmt::Debug for ProcessGroup<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &B::NAME)
            .field("name", &self.inner.options.group_name)
            .field("desc", &self.inner.options.group_desc)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .finish_non_exhaustive()
    }
}

/// The buffers on one side of an op: one buffer (the fast form: nothing is allocated for it) or a list.
pub(crate) enum Bufs<'a, B: Backend> {
    /// A single buffer.
    One(&'a B::Buffer),
    /// A list of buffers (possibly empty, e.g. gather's outputs on a rank that is not the root).
    List(&'a [B::Buffer]),
}

impl<B: Backend> Clone for Bufs<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Bufs<'_, B> {}

impl<'a, B: Backend> Bufs<'a, B> {
    /// The buffers as a slice (one buffer is a slice of one, without allocating).
    pub(crate) fn as_slice(self) -> &'a [B::Buffer] {
        match self {
            Bufs::One(buffer) => std::slice::from_ref(buffer),
            Bufs::List(list) => list,
        }
    }
}

/// What the template needs to know about one op. A one-buffer op names its buffers directly, so nothing here
/// allocates on its path; a list op names slices of buffers.
pub(crate) struct OpSpec<'a, B: Backend> {
    pub(crate) op: OpType,
    /// The peer of a single point-to-point op (its pair's communicator); `None` for the group's collective one.
    pub(crate) peer: Option<usize>,
    pub(crate) input: Bufs<'a, B>,
    pub(crate) output: Bufs<'a, B>,
    pub(crate) is_barrier: bool,
    /// The input is the output (all_reduce, broadcast, send, recv).
    pub(crate) in_place: bool,
}

impl<'a, B: Backend> OpSpec<'a, B> {
    /// A collective with these input and output buffers on the group's collective communicator.
    pub(crate) fn lists(op: OpType, input: Bufs<'a, B>, output: Bufs<'a, B>) -> Self {
        OpSpec { op, peer: None, input, output, is_barrier: false, in_place: false }
    }

    /// The element count and dtype a Work reports for each side, and for a list op every buffer's.
    #[allow(clippy::type_complexity)]
    fn sizes(&self) -> ((usize, DType), (usize, DType), Option<Arc<ListSizes>>) {
        if let (Bufs::One(input), Bufs::One(output)) = (self.input, self.output) {
            return ((input.numel(), input.dtype()), (output.numel(), output.dtype()), None);
        }
        let (inputs, outputs) = (self.input.as_slice(), self.output.as_slice());
        let fallback = inputs.iter().chain(outputs).next().map_or(DType::F32, |b| b.dtype());
        let each = |list: &[B::Buffer]| list.iter().map(|b| (b.numel(), b.dtype())).collect::<Vec<_>>();
        let total = |list: &[B::Buffer]| {
            let numel = list.iter().map(|b| b.numel()).fold(0usize, usize::saturating_add);
            (numel, list.first().map_or(fallback, |b| b.dtype()))
        };
        let lists = ListSizes { inputs: each(inputs), outputs: each(outputs) };
        (total(inputs), total(outputs), Some(Arc::new(lists)))
    }
}

/// Where a new Work's memory and end event come from.
enum WorkSource<B: Backend> {
    /// A completed Work that nothing holds any more, to overwrite in place.
    Recycled(Arc<WorkState<B>>),
    /// A new end event; the Work is allocated.
    Fresh(Arc<B::Event>),
}

impl<B: Backend> ProcessGroup<B> {
    /// Creates this rank's handle of a group of `size` ranks that rendezvous through `store`.
    ///
    /// Creates no communicator unless `options.eager_init` (S3). It counts the group in the store
    /// (`pg_group_instance/{rank}`): the n-th group a rank creates on a store is told apart from the others by
    /// that number, so every group needs a store prefix of its own ([`Error::PrefixCollision`] otherwise).
    /// A size of 0 or above NCCL's `int` range, or a rank out of range, is an [`Error::InvalidArgument`].
    pub fn new(store: Arc<dyn Store>, rank: usize, size: usize, device: B::Device, options: Options) -> Result<Self> {
        Self::build(store, (rank, size), device, options, Kind::World, None)
    }

    /// [`ProcessGroup::new`] for a group of another kind: a subgroup, or a group on PyTorch's keys; `adopt` is
    /// a ready communicator of exactly this group's ranks (a split of the parent's) to use as its collective one.
    pub(crate) fn build(
        store: Arc<dyn Store>,
        (rank, size): (usize, usize),
        device: B::Device,
        options: Options,
        kind: Kind,
        adopt: Option<B::Communicator>,
    ) -> Result<Self> {
        if size == 0 {
            return Err(Error::invalid("a process group needs at least one rank (size was 0)"));
        }
        if size > MAX_WORLD_SIZE {
            return Err(Error::invalid(format!(
                "a process group of size {size} is larger than the most ranks a communicator can have \
                 ({MAX_WORLD_SIZE}, NCCL's int)"
            )));
        }
        if rank >= size {
            return Err(Error::invalid(format!("rank {rank} is out of range for a group of size {size}")));
        }
        if options.trace_dir.is_some() {
            crate::backend::require(&device, Capability::TimingEvents, "a traced group (Options::trace_dir)")?;
        }
        // Groups are told apart by creation order on each rank: the n-th group this rank creates on a store is
        // instance n, on every rank. The unique-id exchange checks it, so that two groups sharing one store
        // prefix fail instead of pairing their ranks across groups.
        let (claims, membership) = match kind {
            Kind::World => (true, None),
            Kind::Subgroup(membership) => (true, Some(membership)),
            Kind::Torch => (false, None),
        };
        let instance = match claims {
            true => Some(store.add(&format!("{GROUP_INSTANCE_KEY}/{rank}"), 1)?),
            false => None,
        };
        let local_id = NEXT_LOCAL_ID.fetch_add(1, Ordering::Relaxed);
        let tracer = match &options.trace_dir {
            None => None,
            Some(dir) => {
                let world_rank = membership.as_ref().map_or(rank, |m| m.global_ranks[rank]);
                let who = Identity {
                    name: &options.group_name,
                    desc: &options.group_desc,
                    pg_id: local_id,
                    rank,
                    size,
                    world_rank,
                };
                Some(Tracer::new(dir, &device, who)?)
            }
        };
        let hold = match options.liveness {
            true => crate::liveness::Hold::register(&store, rank, &options.group_name)?,
            false => None,
        };
        let shared = Shared::new(store, (rank, size), device, options, (local_id, instance), membership, tracer);
        if let Some(hold) = hold {
            shared.store_link.hold_liveness(hold);
        }
        let group = Self { inner: Arc::new(shared) };
        start_threads(&group.inner)?;
        if let Some(comm) = adopt {
            group.adopt_collective(comm)?;
        }
        tracing::info!(
            target: "pg",
            backend = B::NAME,
            pg_id = local_id,
            group = %group.inner.options.group_name,
            desc = %group.inner.options.group_desc,
            rank,
            size,
            "created process group"
        );
        if group.inner.options.eager_init {
            group.get_comm(&group.collective_key())?;
        }
        Ok(group)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The device this rank runs on.
    pub fn device(&self) -> &B::Device {
        &self.inner.device
    }

    /// The group's options.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// The store the group rendezvouses through.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The process-wide id of this group instance (PyTorch's "PG ID").
    pub fn local_id(&self) -> u64 {
        self.inner.local_id
    }

    /// The state this group's handles share (for the recovery steps in `recovery.rs`).
    pub(crate) fn shared(&self) -> &Arc<Shared<B>> {
        &self.inner
    }

    /// The group's place in the world, for a subgroup.
    pub(crate) fn membership(&self) -> Option<&Membership> {
        self.inner.membership.as_ref()
    }

    /// The number of the next subgroup made from this group (every call that makes one takes a number, on
    /// members and non-members alike).
    pub(crate) fn next_subgroup_index(&self) -> u64 {
        self.inner.rounds.next_subgroup()
    }

    /// The store the world group of this group's lineage was made with: subgroups, shrunk and grown groups keep
    /// their world's (new ranks of a grow find it announced there).
    pub(crate) fn root_store(&self) -> Arc<dyn Store> {
        match self.membership() {
            Some(membership) => Arc::clone(&membership.root),
            None => Arc::clone(&self.inner.store),
        }
    }

    /// This group's store as a path of prefixes under [`ProcessGroup::root_store`] (empty for a world group).
    pub(crate) fn store_path(&self) -> String {
        let root = self.root_store().key_prefix();
        let mine = self.inner.store.key_prefix();
        let path = mine.strip_prefix(&root).unwrap_or(&mine);
        path.strip_suffix('/').unwrap_or(path).to_owned()
    }

    /// This group's collective communicator, made now when the group has none yet (as its first op would: every
    /// rank of the group must call).
    pub(crate) fn collective_comm(&self) -> Result<Arc<B::Communicator>> {
        Ok(Arc::clone(&self.get_comm(&self.collective_key())?.comm))
    }

    /// This group's collective communicator, if it exists (aborted or not).
    pub(crate) fn collective(&self) -> Option<Arc<B::Communicator>> {
        self.inner.collective.get().map(|entry| Arc::clone(&entry.comm))
    }

    /// This group's collective communicator, if it exists and is not aborted (what a subgroup splits from).
    pub(crate) fn live_collective(&self) -> Option<Arc<B::Communicator>> {
        self.inner.collective.get().filter(|entry| !entry.comm.is_aborted()).map(|entry| Arc::clone(&entry.comm))
    }

    /// Makes `comm`, ready and of exactly this group's ranks, the group's collective communicator, with its own
    /// stream and input-ready events, as if its first op had created it (but with no unique-id exchange).
    fn adopt_collective(&self, comm: B::Communicator) -> Result<()> {
        let inner = &self.inner;
        if comm.rank() != inner.rank || comm.size() != inner.size {
            return Err(Error::Backend(format!(
                "a split gave rank {} of {} for rank {} of a group of {}",
                comm.rank(),
                comm.size(),
                inner.rank,
                inner.size
            )));
        }
        let stream = inner.device.stream_from_pool(inner.options.high_priority_stream)?;
        let entry = Arc::new(self.comm_entry(Arc::new(comm), stream));
        let _ = inner.collective.set(entry.clone());
        self.lock_cache().ready.insert(self.collective_key().cache_key(), entry);
        inner.tally.comm_created();
        tracing::info!(target: "pg", pg_id = inner.local_id, group = %inner.options.group_name, rank = inner.rank,
            size = inner.size, "adopted a communicator split from the parent's");
        Ok(())
    }

    /// What the group has done so far.
    pub fn counters(&self) -> Counters {
        Counters { intake_overflows: self.inner.in_flight.overflows(), ..self.inner.tally.counters() }
    }

    /// The cache keys of the ready communicators, sorted (`testing` feature).
    #[cfg(feature = "testing")]
    pub fn comm_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock_cache().ready.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The cache keys of communicators being created right now (S7), sorted (`testing` feature).
    #[cfg(feature = "testing")]
    pub fn initializing_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock_cache().initializing.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The dedicated communication stream of a ready cache key (`testing` feature).
    #[cfg(feature = "testing")]
    pub fn comm_stream(&self, cache_key: &str) -> Option<B::Stream> {
        self.lock_cache().ready.get(cache_key).map(|entry| entry.stream.clone())
    }

    /// The value the collective store-key counter will give the next collective communicator (S6; `testing`
    /// feature).
    #[cfg(feature = "testing")]
    pub fn next_comm_counter(&self) -> u64 {
        self.lock_cache().counter
    }

    /// The optional features of the group's backend ([`Device::capabilities`]): a call that needs one the
    /// backend lacks is refused by name ([`Error::Unsupported`]) before any store traffic or device work.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.device.capabilities()
    }

    /// The first fatal error of the group, if any.
    pub fn error(&self) -> Option<Error> {
        self.inner.error()
    }

    // ===== ops =====

    /// All-reduce `buffer` in place across the group.
    pub fn all_reduce(&self, buffer: &B::Buffer, op: ReduceOp) -> Result<WorkHandle<B>> {
        self.check_devices("all_reduce", &[buffer])?;
        op.check(buffer.dtype())?;
        let spec = self.in_place_spec(OpType::AllReduce, buffer);
        self.run(spec, |comm, stream| comm.all_reduce(buffer, buffer, op, stream))
    }

    /// [`ProcessGroup::all_reduce`] followed by [`WorkHandle::wait`]: exactly that, nothing more (S1).
    pub fn all_reduce_sync(&self, buffer: &B::Buffer, op: ReduceOp) -> Result<()> {
        self.all_reduce(buffer, op)?.wait()
    }

    /// All-reduce `buffer` in place with `PREMUL_SUM` whose factor is this rank's `scalar`, a one-element buffer
    /// of `buffer`'s dtype on the same device, read when the op runs (torch's
    /// `all_reduce(t, op=_make_nccl_premul_sum(factor_tensor))`). The host-factor form is
    /// `all_reduce(buffer, ReduceOp::PreMulSum(factor))`.
    pub fn all_reduce_pre_mul_sum(&self, buffer: &B::Buffer, scalar: &B::Buffer) -> Result<WorkHandle<B>> {
        crate::backend::require(self.device(), Capability::DevicePreMulSum, "all_reduce_pre_mul_sum")?;
        self.check_devices("all_reduce", &[buffer])?;
        args::pre_mul_sum_factor("all_reduce", buffer, scalar)?;
        let device = self.inner.device.clone();
        let spec = self.in_place_spec(OpType::AllReduce, buffer);
        self.run(spec, |comm, stream| {
            // The factor is read on the communication stream: keep its memory until that stream passes the op.
            guard_factor::<B>(&device, scalar, stream)?;
            comm.all_reduce_pre_mul_sum(buffer, buffer, scalar, stream)
        })
    }

    /// [`ProcessGroup::reduce_scatter`] with `PREMUL_SUM` whose factor is this rank's `scalar`, as in
    /// [`ProcessGroup::all_reduce_pre_mul_sum`] (what FSDP's gradient reduce-scatter uses).
    pub fn reduce_scatter_pre_mul_sum(
        &self,
        input: &B::Buffer,
        output: &B::Buffer,
        scalar: &B::Buffer,
    ) -> Result<WorkHandle<B>> {
        crate::backend::require(self.device(), Capability::DevicePreMulSum, "reduce_scatter_pre_mul_sum")?;
        self.check_devices("reduce_scatter", &[input, output])?;
        args::scaled("reduce_scatter", input, output, (1, self.size()), self.size())?;
        args::pre_mul_sum_factor("reduce_scatter", input, scalar)?;
        let device = self.inner.device.clone();
        let spec = self.spec(OpType::ReduceScatterBase, input, output);
        self.run(spec, |comm, stream| {
            guard_factor::<B>(&device, scalar, stream)?;
            comm.reduce_scatter_pre_mul_sum(input, output, scalar, stream)
        })
    }

    /// Broadcasts `root`'s `buffer` into every rank's `buffer`.
    pub fn broadcast(&self, buffer: &B::Buffer, root: usize) -> Result<WorkHandle<B>> {
        self.check_devices("broadcast", &[buffer])?;
        args::rank_in_range("broadcast", "root", root, self.size())?;
        let spec = self.in_place_spec(OpType::Broadcast, buffer);
        self.run(spec, |comm, stream| comm.broadcast(buffer, buffer, root, stream))
    }

    /// Gathers every rank's `input` into `output` (size times larger), in rank order.
    pub fn all_gather(&self, input: &B::Buffer, output: &B::Buffer) -> Result<WorkHandle<B>> {
        self.check_devices("all_gather", &[input, output])?;
        args::scaled("all_gather", input, output, (self.size(), 1), self.size())?;
        let spec = self.spec(OpType::AllGatherBase, input, output);
        self.run(spec, |comm, stream| comm.all_gather(input, output, stream))
    }

    /// Reduces `input` (size times larger than `output`) across ranks and scatters the blocks.
    pub fn reduce_scatter(&self, input: &B::Buffer, output: &B::Buffer, op: ReduceOp) -> Result<WorkHandle<B>> {
        self.check_devices("reduce_scatter", &[input, output])?;
        args::scaled("reduce_scatter", input, output, (1, self.size()), self.size())?;
        op.check(input.dtype())?;
        let spec = self.spec(OpType::ReduceScatterBase, input, output);
        self.run(spec, |comm, stream| comm.reduce_scatter(input, output, op, stream))
    }

    /// [`ProcessGroup::all_gather`] under torch's name and argument order (`all_gather_into_tensor(output,
    /// input)`): the same op, Work and flight-recorder entry.
    pub fn all_gather_into_tensor(&self, output: &B::Buffer, input: &B::Buffer) -> Result<WorkHandle<B>> {
        self.all_gather(input, output)
    }

    /// [`ProcessGroup::reduce_scatter`] under torch's name and argument order (`reduce_scatter_tensor(output,
    /// input, op)`): the same op, Work and flight-recorder entry.
    pub fn reduce_scatter_tensor(&self, output: &B::Buffer, input: &B::Buffer, op: ReduceOp) -> Result<WorkHandle<B>> {
        self.reduce_scatter(input, output, op)
    }

    /// Sends `buffer` to `peer` over a two-rank communicator keyed by the rank pair (S4, S6).
    pub fn send(&self, buffer: &B::Buffer, peer: usize) -> Result<WorkHandle<B>> {
        self.check_devices("send", &[buffer])?;
        args::peer("send", peer, self.rank(), self.size())?;
        let spec = self.p2p_spec(OpType::Send, buffer, peer);
        self.run(spec, |comm, stream| comm.send(buffer, 1 - comm.rank(), stream))
    }

    /// Receives into `buffer` from `peer` over a two-rank communicator keyed by the rank pair.
    pub fn recv(&self, buffer: &B::Buffer, peer: usize) -> Result<WorkHandle<B>> {
        self.check_devices("recv", &[buffer])?;
        args::peer("recv", peer, self.rank(), self.size())?;
        let spec = self.p2p_spec(OpType::Recv, buffer, peer);
        self.run(spec, |comm, stream| comm.recv(buffer, 1 - comm.rank(), stream))
    }

    /// A barrier: a one-element all-reduce whose `wait()` also synchronises the current stream with the host
    /// (not the device), even without blocking wait (S16).
    pub fn barrier(&self) -> Result<WorkHandle<B>> {
        let device = &self.inner.device;
        if device.current_stream().is_capturing()? {
            return Err(Error::capture("barrier: a barrier synchronises the host, which a capture forbids"));
        }
        let zeros = device.alloc(DType::F32, 1)?;
        device.fill(&zeros, 0.0, &device.current_stream())?;
        let mut spec = self.in_place_spec(OpType::Barrier, &zeros);
        spec.is_barrier = true;
        self.run(spec, |comm, stream| comm.all_reduce(&zeros, &zeros, ReduceOp::Sum, stream))
    }

    /// [`ProcessGroup::barrier`] followed by [`WorkHandle::wait`]: returns when every rank has arrived and the
    /// caller's current stream has drained.
    pub fn barrier_sync(&self) -> Result<()> {
        self.barrier()?.wait()
    }

    // ===== lifecycle =====

    /// Aborts the group: every communicator (ready or being created) is aborted, blocked waits return, and
    /// every later call returns [`Error::Aborted`]. Callable from any thread. It returns once the backend's abort
    /// of each communicator has (NCCL's, at most a bound the backend sets, also when the watchdog started it) and
    /// the group's threads have stopped, so a program may exit right after it: nothing of the group still runs
    /// while the process tears CUDA down.
    pub fn abort(&self, reason: &str) {
        let error = Error::Aborted { reason: format!("rank {}: {reason}", self.inner.rank) };
        // An abort is refused in no state; a group shut down stays so.
        let _ = self.inner.transition(Call::Abort, Some(error.clone()));
        self.inner.abort_all_and_settle(reason, &error);
        self.inner.stop_threads();
    }

    /// Revokes the group (NCCL's `ncclCommRevoke` on each communicator, or `ncclCommAbort` where the loaded NCCL
    /// is older than 2.28.7): the Works in flight whose op had not finished fail with [`Error::Revoked`] (at once:
    /// no host blocks), every later op fails with it, and nothing of the group runs afterwards (its watchdog and
    /// heartbeat monitor stop). A revoked group cannot be finalized ([`ProcessGroup::shutdown`] refuses); what is
    /// left is [`ProcessGroup::agree_survivors`] and [`ProcessGroup::shrink`], or dropping it. Callable from any
    /// thread; revoking twice keeps the first reason.
    pub fn revoke(&self, reason: &str) {
        self.inner.revoke(&Error::Revoked { reason: format!("rank {}: {reason}", self.inner.rank) });
    }

    /// Whether the group was revoked ([`ProcessGroup::revoke`], the watchdog with `Options::revoke_on_error`, or
    /// a shrink of it with [`crate::ShrinkMode::Abort`]).
    pub fn is_revoked(&self) -> bool {
        self.inner.state().is_revoked()
    }

    /// Where the group is in its life: what its calls do (the table in `docs/semantics.md`).
    pub fn state(&self) -> GroupState {
        self.inner.state()
    }

    /// Shuts the group down cleanly: finalizes every communicator; later calls return [`Error::Aborted`].
    ///
    /// The ops in flight end first, each waited for at most until its timeout (from its enqueue, as the
    /// watchdog counts): one that has not ended by then (a peer never joined it), or whose communicator failed, is
    /// not left to a finalize, which would wait for it without a bound; the communicators are aborted instead, the
    /// op's Work fails, and the call returns its error ([`Error::WorkTimeout`] naming the op).
    ///
    /// A revoked group is not finalized (NCCL refuses a finalize after a revoke): its threads stop and its
    /// communicators are released without it, and the call returns [`Error::Revoked`] saying so.
    pub fn shutdown(&self) -> Result<()> {
        let comms = self.inner.all_comms();
        let revoked = self.is_revoked();
        // The ops in flight end first, each within its timeout: a finalize would wait for one that never ends.
        let stuck = if revoked { None } else { self.inner.drain_in_flight() };
        // A shutdown is refused in no state; a group aborted stays so. `error()` says it was shut down.
        let shut = Error::Aborted { reason: "the process group was shut down".to_owned() };
        let _ = self.inner.transition(Call::Shutdown, Some(shut));
        let finalized = match (revoked, stuck) {
            (false, None) => comms.iter().try_for_each(|comm| comm.finalize()),
            (false, Some(error)) => {
                // Not finalized: aborted, so that nothing waits for the op; the caller gets its timeout error.
                let reason = format!("rank {}: shutdown with an op that never finished: {error}", self.inner.rank);
                self.inner.abort_all_and_settle(&reason, &error);
                Err(error)
            }
            (true, _) => Err(Error::Revoked {
                reason: format!(
                    "rank {}: shutdown of a revoked group: its communicators cannot be finalized (NCCL refuses \
                     ncclCommFinalize after ncclCommRevoke); they were released without it",
                    self.inner.rank
                ),
            }),
        };
        // Then destroy: the watchdog is stopped, the in-flight list released, and the communicators dropped.
        self.inner.stop_threads();
        // Finalizing ran every op to its end (or failed): a Work whose op did not finish fails.
        self.inner.fail_unfinished_in_flight(&Error::Aborted { reason: "the process group was shut down".to_owned() });
        self.inner.retire_in_flight();
        // Every op has run (or failed): the trace gets each one's device times.
        self.inner.flush_trace_logged();
        let mut cache = self.lock_cache();
        cache.ready.clear();
        cache.initializing.clear();
        finalized
    }

    // ===== reliability =====

    /// The watchdog's view of the group: sticky error state, last enqueued/started/completed sequence numbers.
    pub fn status(&self) -> GroupStatus {
        let mut status = self.inner.status();
        status.aborted_comms = self.inner.all_comms().iter().filter(|comm| comm.is_aborted()).count();
        status
    }

    /// The sticky error state (PyTorch's `getError()`).
    pub fn error_type(&self) -> ErrorType {
        self.inner.errors.error_type()
    }

    /// The desync report written at the first timeout (with desync debugging on).
    pub fn desync_report(&self) -> Option<DesyncReport> {
        self.inner.errors.desync_report()
    }

    /// The flight recorder as JSON text, with PyTorch's field names.
    pub fn flight_recorder_json(&self) -> String {
        failure::dump_json(self.inner.as_ref()).to_string()
    }

    /// Writes the flight recorder to `{dump_path_prefix}{rank}` and returns the path (a dump on request).
    pub fn dump_flight_recorder(&self) -> Result<std::path::PathBuf> {
        failure::dump(self.inner.as_ref())
    }

    /// Writes this rank's trace file now (`Options::trace_dir`, `PG_TRACE`): every traced group of the rank in
    /// this process, each op with its host enqueue and, once it has finished, its device start and end (an op
    /// still running is written with its host times, and with its device times at a later flush). Returns the
    /// file's path, or `None` when the group is not traced. Shutdown and dropping the group flush too.
    pub fn flush_trace(&self) -> Result<Option<std::path::PathBuf>> {
        self.inner.tracer.as_ref().map(Tracer::flush).transpose()
    }

    /// Changes the timeout of the ops enqueued and the communicators created from now on (PyTorch's
    /// `_set_default_timeout`); the group's `Options::timeout` stays what it was built with.
    pub fn set_timeout(&self, timeout: std::time::Duration) {
        self.inner.set_timeout(timeout);
    }

    /// Fault injection (`testing` feature): aborts the communicator of `cache_key` directly, as a backend does on
    /// its own (a split that timed out aborts its parent) or a holder of the communicator outside the group would,
    /// without telling the group. Returns whether the key had a ready communicator.
    #[cfg(feature = "testing")]
    pub fn abort_communicator_behind_the_group(&self, cache_key: &str, reason: &str) -> bool {
        let comm = self.lock_cache().ready.get(cache_key).map(|entry| Arc::clone(&entry.comm));
        comm.map(|comm| comm.abort(reason)).is_some()
    }

    /// Runs one watchdog pass on the calling thread now (`testing` feature), as the watchdog's own passes between
    /// its periods do: the intake taken in, finished Works retired into the reuse pool. Never at the same time as
    /// the watchdog's own pass.
    #[cfg(feature = "testing")]
    pub fn watchdog_pass_now(&self) {
        crate::watchdog::pass(&self.inner, false);
    }

    /// Fault injection (`testing` feature): the watchdog's next pass blocks for `duration`, as if wedged in a
    /// driver call.
    #[cfg(feature = "testing")]
    pub fn inject_watchdog_stall(&self, duration: std::time::Duration) {
        *lock(&self.inner.stall) = Some(duration);
    }

    /// Holds the group's watchdog between two passes until the returned guard is dropped (`testing` feature): it
    /// runs no pass meanwhile, whatever wakes it. Returns once the watchdog is held (at once for a group without
    /// one, or whose threads stopped).
    #[cfg(feature = "testing")]
    pub fn hold_watchdog(&self) -> WatchdogHold<'_, B> {
        use crate::watchdog::hold;
        let inner = &self.inner;
        inner.watchdog_hold.store(hold::ASKED, Ordering::SeqCst);
        inner.signals.wake(&inner.device);
        while self.inner.options.enable_watchdog
            && inner.watchdog_hold.load(Ordering::SeqCst) != hold::HELD
            && !inner.signals.terminate.load(Ordering::SeqCst)
        {
            std::thread::yield_now();
        }
        WatchdogHold { group: self }
    }

    // ===== the template =====

    pub(crate) fn collective_key(&self) -> CommKey {
        CommKey::Collective(vec![self.inner.device.index()])
    }

    fn spec<'a>(&self, op: OpType, input: &'a B::Buffer, output: &'a B::Buffer) -> OpSpec<'a, B> {
        OpSpec::lists(op, Bufs::One(input), Bufs::One(output))
    }

    fn in_place_spec<'a>(&self, op: OpType, buffer: &'a B::Buffer) -> OpSpec<'a, B> {
        OpSpec { in_place: true, ..self.spec(op, buffer, buffer) }
    }

    fn p2p_spec<'a>(&self, op: OpType, buffer: &'a B::Buffer, peer: usize) -> OpSpec<'a, B> {
        OpSpec { peer: Some(peer), ..self.in_place_spec(op, buffer) }
    }

    /// The collective template (S2): communicator from the cache, input-ready event from the current stream to
    /// the communication stream, lifetime guard, the op, the end event, and the Work. A traced group's ops go
    /// through [`ProcessGroup::run_traced`]; that is the only thing tracing adds to the path when it is off.
    pub(crate) fn run(
        &self,
        spec: OpSpec<'_, B>,
        enqueue: impl FnOnce(&B::Communicator, &B::Stream) -> Result<()>,
    ) -> Result<WorkHandle<B>> {
        match &self.inner.tracer {
            None => self.run_op(spec, enqueue),
            Some(tracer) => self.run_traced(tracer, spec, enqueue),
        }
    }

    /// The template of a traced group: the op's host start and end around [`ProcessGroup::run_op`], and a timing
    /// event on the communication stream right before and right after its launch, handed to the tracer, which
    /// resolves them once they have passed. An op under stream capture is not traced (its events would be graph
    /// nodes, recorded at each replay and never queryable here). Never inlined into [`ProcessGroup::run`], so that
    /// an untraced group's path stays the check and the template.
    #[inline(never)]
    fn run_traced(
        &self,
        tracer: &Tracer<B>,
        spec: OpSpec<'_, B>,
        enqueue: impl FnOnce(&B::Communicator, &B::Stream) -> Result<()>,
    ) -> Result<WorkHandle<B>> {
        let device = &self.inner.device;
        let host_start = device.now();
        if device.current_stream().is_capturing()? {
            return self.run_op(spec, enqueue);
        }
        let peer = spec.peer;
        // A timing event that cannot be made or recorded leaves the op untraced, never failed.
        let timed = |stream: &B::Stream| device.create_timing_event().ok().filter(|event| event.record(stream).is_ok());
        let mut events = None;
        let work = self.run_op(spec, |comm, stream| {
            let start = timed(stream);
            enqueue(comm, stream)?;
            events = start.zip(timed(stream)).map(|(start, end)| (start, end, stream.id()));
            Ok(())
        })?;
        let host_end = device.now();
        if let Some((start, end, stream)) = events {
            let state = &work.state;
            let info = OpInfo {
                seq: state.seq,
                op: state.op,
                peer,
                stream,
                input: state.input,
                output: state.output,
                lists: state.lists.clone(),
                host_start,
                host_end,
            };
            tracer.push(info, start, end);
        }
        Ok(work)
    }

    /// The template itself (see [`ProcessGroup::run`]).
    fn run_op(
        &self,
        spec: OpSpec<'_, B>,
        enqueue: impl FnOnce(&B::Communicator, &B::Stream) -> Result<()>,
    ) -> Result<WorkHandle<B>> {
        let mut timer = StepTimer::start();
        self.check_usable()?;
        // The Work holds the caller's output (the first one of a list; the input when there is none).
        let held = spec.output.as_slice().first().or(spec.input.as_slice().first());
        let held = held.ok_or_else(|| Error::invalid(format!("{}: the op has no buffers", spec.op)))?;
        // The hot path borrows the group's collective entry; only the Work's own handles are cloned from it.
        let device = &self.inner.device;
        let current = device.current_stream();
        // The op's one capture check: under capture every step below is recorded into the capture's graph.
        let captured = current.is_capturing()?;
        let looked_up;
        let entry = match (spec.peer, self.inner.collective.get()) {
            (None, Some(entry)) => entry,
            (None, None) => {
                let key = self.collective_key();
                self.refuse_creation_under_capture(captured, spec.op, &key)?;
                looked_up = self.get_comm(&key)?;
                &looked_up
            }
            (Some(peer), _) => {
                let key = CommKey::SingleP2p { rank: self.inner.rank, peer };
                self.refuse_creation_under_capture(captured, spec.op, &key)?;
                looked_up = self.get_comm(&key)?;
                &looked_up
            }
        };
        let (seq, unissued) = self.inner.tally.next_seq(spec.op.is_p2p());
        let start_time = device.now();
        timer.lap(EnqueueStep::Lookup);

        // S9: the communication stream waits until the inputs are ready on the caller's current stream.
        entry.input_ready.order(device, &current, &entry.stream)?;
        timer.lap(EnqueueStep::InputReady);

        // S12: the allocator must not reuse the buffers before the communication stream is done with them.
        let mut stash = Vec::new();
        // An in-place op passes one buffer as input and output: guard it once.
        let inputs = if spec.in_place { &[][..] } else { spec.input.as_slice() };
        for buffer in inputs.iter().chain(spec.output.as_slice()) {
            if captured {
                // The graph replays the op on these buffers for as long as it exists: it holds them, whatever
                // the caller drops (no record_stream: its event would be recorded into the capture).
                current.capture_keep_alive(buffer)?;
                continue;
            }
            // Foreign memory is not the allocator's: only the stash keeps it until the end event has passed.
            match buffer.is_foreign() || (self.inner.options.avoid_record_streams && !spec.op.is_p2p()) {
                true => stash.push(buffer.clone()),
                false => device.record_stream(buffer, &entry.stream)?,
            }
        }
        if captured {
            // The graph holds the communicator and refuses to launch once it is aborted or finalized.
            current.capture_keep_communicator(&entry.comm)?;
        }
        timer.lap(EnqueueStep::RecordStream);

        // Desync debugging needs to tell a started op from a scheduled one, as PyTorch's timing events do.
        let start_event = match self.inner.options.desync_debug && !captured {
            true => {
                let event = Arc::new(device.create_event());
                event.record(&entry.stream)?;
                Some(event)
            }
            false => None,
        };

        enqueue(&entry.comm, &entry.stream)?;
        timer.lap(EnqueueStep::Op);

        // S10: the end event marks the op's completion on the communication stream. A completed Work that the
        // watchdog retired and nothing holds brings its own event and memory: nothing is allocated then.
        let source = match self.inner.reuse.take() {
            Some(work) => WorkSource::Recycled(work),
            None => WorkSource::Fresh(Arc::new(device.create_event())),
        };
        let end_event = match &source {
            WorkSource::Recycled(work) => &work.end_event,
            WorkSource::Fresh(event) => event,
        };
        end_event.record(&entry.stream)?;
        if captured {
            // The communication stream joined the capture through the input-ready wait: the current stream
            // waits on the end event so that the capture joins back and can end (PyTorch's behaviour).
            current.wait_event(end_event)?;
        }
        timer.lap(EnqueueStep::EndEvent);

        unissued.issued();
        tracing::trace!(target: "pg", pg_id = self.inner.local_id, seq, op = %spec.op, "enqueued");
        let options = &self.inner.options;
        let (input_size, output_size, lists) = spec.sizes();
        let timeout = self.inner.timeout();
        let state = match source {
            WorkSource::Recycled(mut work) => {
                let slot = Arc::get_mut(&mut work).expect("a recycled Work is held by nobody else");
                // Overwritten in place, every field named (a new field fails to compile here until it is set). The
                // communicator entry and the thread's name are kept when they are the same, so that reusing a Work
                // touches no counter another thread touches.
                let WorkState {
                    entry: slot_entry,
                    end_event: _,
                    start_event: slot_start_event,
                    fr_id,
                    retired,
                    seq: slot_seq,
                    op,
                    input,
                    output,
                    lists: slot_lists,
                    start_time: slot_start_time,
                    timeout: slot_timeout,
                    blocking_wait,
                    blocking_wait_poll,
                    is_barrier,
                    captured: slot_captured,
                    exception,
                    failed,
                    ended,
                    stash: slot_stash,
                    stashed,
                    waiters,
                    thread,
                } = slot;
                if !Arc::ptr_eq(slot_entry, entry) {
                    *slot_entry = Arc::clone(entry);
                }
                *slot_start_event = start_event;
                *fr_id.get_mut() = u64::MAX;
                *retired.get_mut() = false;
                *slot_seq = seq;
                *op = spec.op;
                *input = input_size;
                *output = output_size;
                *slot_lists = lists;
                *slot_start_time = start_time;
                *slot_timeout = timeout;
                *blocking_wait = options.blocking_wait;
                *blocking_wait_poll = options.blocking_wait_poll;
                *is_barrier = spec.is_barrier;
                *slot_captured = captured;
                *exception.get_mut().unwrap_or_else(PoisonError::into_inner) = None;
                *failed.get_mut() = false;
                *ended.get_mut() = false;
                *stashed = !stash.is_empty();
                *slot_stash.get_mut().unwrap_or_else(PoisonError::into_inner) = stash;
                *waiters = std::sync::OnceLock::new();
                *thread = current_thread_number();
                work
            }
            WorkSource::Fresh(end_event) => {
                self.inner.tally.work_made();
                Arc::new(WorkState {
                    entry: Arc::clone(entry),
                    end_event,
                    start_event,
                    fr_id: AtomicU64::new(u64::MAX),
                    retired: AtomicBool::new(false),
                    seq,
                    op: spec.op,
                    input: input_size,
                    output: output_size,
                    lists,
                    start_time,
                    timeout,
                    blocking_wait: options.blocking_wait,
                    blocking_wait_poll: options.blocking_wait_poll,
                    is_barrier: spec.is_barrier,
                    captured,
                    exception: Mutex::new(None),
                    failed: AtomicBool::new(false),
                    ended: AtomicBool::new(false),
                    stashed: !stash.is_empty(),
                    stash: Mutex::new(stash),
                    waiters: std::sync::OnceLock::new(),
                    thread: current_thread_number(),
                })
            }
        };
        let work = WorkHandle { state, output: held.clone() };
        timer.lap(EnqueueStep::Work);
        match captured {
            // Nothing to watch: the op runs only inside the graph's launches (PyTorch does not time captured Works).
            true => self.inner.record_captured(&work.state),
            false => self.inner.track(&work.state),
        }
        // An abort that ran while this op was being enqueued did not see it on the in-flight list: the abort may
        // have drained the op unrun.
        if let Some(error) = self.error() {
            work.state.set_exception(error);
        } else if entry.aborting.load(Ordering::SeqCst) {
            work.state.set_exception(Error::Aborted {
                reason: format!("{} (seq {seq}) was enqueued while its communicator was being aborted", spec.op),
            });
        }
        timer.lap(EnqueueStep::Track);
        Ok(work)
    }

    /// Refuses to create a communicator while the current stream captures (creation is collective and blocks on
    /// the store and the device, which a capture forbids; PyTorch refuses too): an error naming the op, unless
    /// the communicator already exists.
    fn refuse_creation_under_capture(&self, captured: bool, op: OpType, key: &CommKey) -> Result<()> {
        if !captured || self.lock_cache().ready.contains_key(&key.cache_key()) {
            return Ok(());
        }
        Err(Error::capture(format!(
            "{op}: communicator '{}' does not exist yet and cannot be created while the current stream is \
             capturing; create it before the capture (Options::eager_init, or one op of the same kind before it)",
            key.cache_key()
        )))
    }

    /// Looks the key up in this group's cache; on a miss, creates the communicator (S3-S8). The enqueue path
    /// reads a created collective communicator from `Inner::collective` without coming here.
    fn get_comm(&self, key: &CommKey) -> Result<CommEntry<B>> {
        let cache_key = key.cache_key();
        let never = AtomicBool::new(false);
        let mut deadline = None;
        let store_key = loop {
            let mut cache = self.lock_cache();
            if let Some(entry) = cache.ready.get(&cache_key) {
                return Ok(entry.clone());
            }
            if !cache.initializing.contains_key(&cache_key) {
                // S6: collectives take the next counter value; a single P2P pair uses its own key.
                let store_key = match key.is_single_p2p() {
                    true => cache_key.clone(),
                    false => {
                        cache.counter += 1;
                        (cache.counter - 1).to_string()
                    }
                };
                cache.initializing.insert(cache_key.clone(), None);
                break store_key;
            }
            // Another thread of this rank is creating it: wait for it, bounded by the group's timeout.
            drop(cache);
            let now = self.inner.device.now();
            let timeout = self.inner.timeout();
            if now > *deadline.get_or_insert(now.saturating_add(timeout)) {
                return Err(Error::InitTimeout {
                    cache_key,
                    timeout,
                    what: "another thread of this rank was creating it and did not finish".to_owned(),
                });
            }
            self.inner.device.sleep(self.inner.options.blocking_wait_poll, &never);
        };
        let created = self.create_comm(key, &cache_key, &store_key);
        let mut cache = self.lock_cache();
        cache.initializing.remove(&cache_key);
        if let Err(error @ (Error::PrefixCollision { .. } | Error::SubgroupMismatch { .. })) = &created {
            // Every later op of this group would read keys of another group: the group is unusable.
            self.inner.fail(error.clone());
        }
        let entry = created?;
        if *key == self.collective_key() {
            // Never replaced: like PyTorch's cache, an aborted communicator stays until the group is dropped.
            let _ = self.inner.collective.set(entry.clone());
        }
        cache.ready.insert(cache_key, entry.clone());
        Ok(entry)
    }

    fn create_comm(&self, key: &CommKey, cache_key: &str, store_key: &str) -> Result<CommEntry<B>> {
        let inner = &self.inner;
        let (comm_rank, comm_size) = match *key {
            CommKey::Collective(_) => (inner.rank, inner.size),
            CommKey::SingleP2p { rank, peer } => (usize::from(rank > peer), 2),
        };
        // Every wait of the creation (the unique id, the other ranks' joins, a non-blocking init) ends by this.
        let timeout = inner.timeout();
        let deadline = inner.device.now().saturating_add(timeout);
        let init_timeout = |what: String| Error::InitTimeout { cache_key: cache_key.to_owned(), timeout, what };
        if let Some(call) = inner.membership.as_ref().and_then(|membership| membership.call.as_ref()) {
            // A subgroup made by a rendezvous: every rank of the parent must have made the same subgroup call,
            // else its members would meet ranks of another group under this group's keys.
            call.check(&inner.device, deadline, &init_timeout)?;
        }
        let id = self.exchange_unique_id(comm_rank, cache_key, store_key, deadline, &init_timeout)?;
        let remaining = deadline.saturating_sub(inner.device.now());
        let config = CommConfig {
            nonblocking: inner.options.nonblocking_init,
            description: format!("{}:{}", inner.options.group_desc, inner.options.group_name),
            timeout: Some(remaining),
        };
        let comm = match inner.device.create_communicator(&id, comm_size, comm_rank, &config) {
            Ok(comm) => Arc::new(comm),
            // The backend names the communicator by its description; the group knows its cache key.
            Err(Error::InitTimeout { what, .. }) => return Err(init_timeout(what)),
            Err(error) => return Err(error),
        };
        // S7: visible as initializing until ready (a non-blocking init finishes in the background).
        self.lock_cache().initializing.insert(cache_key.to_owned(), Some(Arc::clone(&comm)));
        let never = AtomicBool::new(false);
        while !comm.is_ready()? {
            comm.async_error()?;
            if inner.device.now() > deadline {
                let error = init_timeout("the non-blocking init never became ready".to_owned());
                comm.abort(&error.to_string())?;
                return Err(error);
            }
            inner.device.sleep(inner.options.blocking_wait_poll, &never);
        }
        // S8: a dedicated stream from the pool; high priority only changes scheduling priority.
        // Each op makes this stream wait for the current stream (input-ready) and the current stream wait for it
        // (`wait()`). What those two waits cost the device depends on the hardware queues the driver gave the two
        // streams (in creation order), not on this library: nothing when they share a queue, under a microsecond
        // for most pairs, and over a microsecond more than that for some pairs on an H200. So a group's device time
        // per op beside the raw loop can differ from another group's with the same options only by which stream it
        // got (`bench/results/stream-pairs-h200x1.md`; the all_reduce bench's `pg-twin`, a second group of the same
        // options, tells it apart on NCCL).
        let stream = inner.device.stream_from_pool(inner.options.high_priority_stream)?;
        inner.tally.comm_created();
        tracing::info!(
            target: "pg",
            pg_id = inner.local_id,
            group = %inner.options.group_name,
            key = %cache_key,
            store_key,
            rank = inner.rank,
            comm_rank,
            comm_size,
            stream = stream.id(),
            high_priority = stream.is_high_priority(),
            "created communicator"
        );
        Ok(Arc::new(self.comm_entry(comm, stream)))
    }

    /// The cache entry of a ready communicator of this group, on `stream`.
    fn comm_entry(&self, comm: Arc<B::Communicator>, stream: B::Stream) -> CommShared<B> {
        let owner: std::sync::Weak<Shared<B>> = Arc::downgrade(&self.inner);
        CommShared::new(&self.inner.device, comm, stream, self.inner.options.input_ready_events, owner)
    }

    /// S6: rank 0 of the communicator creates the unique id and publishes it under `store_key`; the others read
    /// it, waiting at most until `deadline`.
    ///
    /// Beside the id (except in a group that speaks PyTorch's keys alone), the publisher claims
    /// `{store_key}/pg_group_instance` for its group instance, and a reader checks the claim: a key already claimed by another group instance, or an id published by another one,
    /// means two groups share the store prefix, and both fail with [`Error::PrefixCollision`].
    fn exchange_unique_id(
        &self,
        comm_rank: usize,
        cache_key: &str,
        store_key: &str,
        deadline: std::time::Duration,
        init_timeout: &dyn Fn(String) -> Error,
    ) -> Result<UniqueId> {
        let inner = &self.inner;
        let store = inner.store.as_ref();
        let rendezvous = |source| Error::Rendezvous {
            rank: inner.rank,
            cache_key: cache_key.to_owned(),
            store_key: store_key.to_owned(),
            source: Box::new(source),
        };
        let Some(instance) = inner.instance else {
            // PyTorch's protocol, key for key: the read waits for as long as the store's timeout.
            if comm_rank == 0 {
                let id = inner.device.new_unique_id()?;
                store.set(store_key, &id.0)?;
                return Ok(id);
            }
            return store.get(store_key).map(UniqueId).map_err(rendezvous);
        };
        let owner_key = format!("{store_key}{ID_OWNER_SUFFIX}");
        let instance = instance.to_string();
        let collision = |detail: String| Error::PrefixCollision {
            group: inner.options.group_name.clone(),
            rank: inner.rank,
            prefix: store.key_prefix(),
            store_key: store_key.to_owned(),
            detail,
        };
        let owner_of = |value: &[u8]| String::from_utf8_lossy(value).into_owned();
        if comm_rank == 0 {
            let owner = store.compare_set(&owner_key, b"", instance.as_bytes())?;
            if owner != instance.as_bytes() {
                return Err(collision(format!(
                    "this is group instance {instance} of rank {} on the store, and instance {} already published \
                     a unique id under this key",
                    inner.rank,
                    owner_of(&owner)
                )));
            }
            let id = inner.device.new_unique_id()?;
            let published = store.compare_set(store_key, b"", &id.0)?;
            if published != id.0 {
                return Err(collision("another writer had already published a unique id under this key".to_owned()));
            }
            return Ok(id);
        }
        let remaining = deadline.saturating_sub(inner.device.now());
        let store_timeout = crate::subgroup_call::store_bound(store);
        let limit = remaining.min(store_timeout);
        match store.wait(&[store_key, &owner_key], Some(limit)) {
            Ok(()) => {}
            Err(source) if source.is_timeout() && remaining <= store_timeout => {
                return Err(init_timeout(format!(
                    "the unique id never appeared under store key '{store_key}': the communicator's root rank may \
                     have crashed or skipped this op"
                )))
            }
            Err(source) => return Err(rendezvous(source)),
        }
        let id = store.get(store_key).map_err(rendezvous)?;
        let owner = store.get(&owner_key).map_err(rendezvous)?;
        if owner != instance.as_bytes() {
            return Err(collision(format!(
                "this is group instance {instance} of rank {} on the store, but the unique id was published by \
                 instance {}",
                inner.rank,
                owner_of(&owner)
            )));
        }
        Ok(UniqueId(id))
    }

    // ===== checks and helpers =====

    fn check_usable(&self) -> Result<()> {
        self.inner.check(Call::Op)
    }

    /// Every one of `buffers` is on this rank's device ([`args::on_device`]).
    pub(crate) fn check_devices(&self, what: &str, buffers: &[&B::Buffer]) -> Result<()> {
        let device = self.inner.device.index();
        buffers.iter().try_for_each(|buffer| args::on_device(what, *buffer, device))
    }

    fn lock_cache(&self) -> MutexGuard<'_, CommCache<B>> {
        self.inner.lock_cache()
    }
}

/// Keeps a device `PREMUL_SUM` factor's memory until `stream` has read it: `record_stream`, or under capture a
/// handle the graph holds.
fn guard_factor<B: Backend>(device: &B::Device, scalar: &B::Buffer, stream: &B::Stream) -> Result<()> {
    match stream.is_capturing()? {
        true => stream.capture_keep_alive(scalar),
        false => device.record_stream(scalar, stream),
    }
}

/// Starts the watchdog and, when monitoring is on, the heartbeat monitor of `group`; each holds the group
/// weakly, with its own handles of the device and the signals.
fn start_threads<B: Backend>(group: &Arc<Shared<B>>) -> Result<()> {
    let options = &group.options;
    if !options.enable_watchdog {
        return Ok(());
    }
    let tag = format!("pg{} rank {}", group.local_id, group.rank);
    let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| -> Result<()> {
        group.threads.push(group.device.spawn_host_thread(&format!("{name} ({tag})"), body)?);
        Ok(())
    };
    let handles = || (Arc::downgrade(group), group.device.clone(), Arc::clone(&group.signals));
    let period = match crate::watchdog::reads_liveness(group) {
        true => options.watchdog_period.min(crate::liveness::LIVENESS_POLL),
        false => options.watchdog_period,
    };
    let (weak, device, signals) = handles();
    spawn("pt_nccl_watchdg", Box::new(move || crate::watchdog::watchdog_loop(&weak, &device, &signals, period)))?;
    if options.enable_monitoring {
        let ((weak, device, signals), timeout) = (handles(), options.heartbeat_timeout);
        spawn("pt_nccl_heartbt", Box::new(move || crate::heartbeat::monitor_loop(&weak, &device, &signals, timeout)))?;
    }
    Ok(())
}

/// The watchdog of a group held between passes ([`ProcessGroup::hold_watchdog`], `testing` feature); dropping it
/// lets the watchdog go on.
#[cfg(feature = "testing")]
#[must_use = "the watchdog goes on as soon as the hold is dropped"]
pub struct WatchdogHold<'a, B: Backend> {
    group: &'a ProcessGroup<B>,
}

#[cfg(feature = "testing")]
impl<B: Backend> std::fmt::Debug for WatchdogHold<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchdogHold").field("rank", &self.group.rank()).finish()
    }
}

#[cfg(feature = "testing")]
impl<B: Backend> Drop for WatchdogHold<'_, B> {
    fn drop(&mut self) {
        let inner = &self.group.inner;
        inner.watchdog_hold.store(crate::watchdog::hold::FREE, Ordering::SeqCst);
        inner.signals.wake(&inner.device);
    }
}

//! Joining the NCCL group that PyTorch's `init_process_group("nccl")` forms, from a Rust process on the same
//! store: the store layout PyTorch's ranks read and write, and the group options that match theirs.
//!
//! PyTorch wraps the rendezvous store three times before its `ProcessGroupNCCL` sees it: `default_pg` (only
//! when `init_process_group` made the store itself from `init_method`/`env://`), then the group's name and a
//! slash (`0/` for the default group), then the device type and a slash (`cuda/`). Inside, rank 0 of each
//! communicator publishes NCCL's 128-byte unique id under the group's communicator counter (`0` for the first
//! collective communicator) or, for a lone point-to-point pair, under `lo:hi`, and the others read it. pg's
//! process group does exactly that under the same wrapping, so a pg rank and PyTorch ranks form one
//! communicator in one rank order.

use std::sync::Arc;

use pg_store::{PrefixStore, Store};

use crate::process_group::Kind;
use crate::{Backend, Error, Options, ProcessGroup, Result};

/// The largest world PyTorch forms with one unique id: above `TORCH_NCCL_RANKS_PER_ROOT` ranks (default 128)
/// its NCCL init gathers one id per root (`UniqueNCCLID:{r}` keys, `ncclCommInitRankScalable`), which pg does not
/// speak.
pub const TORCH_DEFAULT_RANKS_PER_ROOT: usize = 128;

/// How PyTorch's side made its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchStoreOrigin {
    /// `init_process_group(init_method=...)` or `env://`: PyTorch made the store and wrapped it in `default_pg`.
    Rendezvous,
    /// `init_process_group(store=...)`: the caller's store, not wrapped in `default_pg`.
    UserStore,
}

/// The store PyTorch's `ProcessGroupNCCL` of the default group uses, over the rendezvous store `store`
/// (the TCP store both sides connect to).
pub fn torch_default_group_store(store: Arc<dyn Store>, origin: TorchStoreOrigin) -> Arc<dyn Store> {
    let base: Arc<dyn Store> = match origin {
        TorchStoreOrigin::Rendezvous => Arc::new(PrefixStore::new("default_pg", store)),
        TorchStoreOrigin::UserStore => store,
    };
    let group: Arc<dyn Store> = Arc::new(PrefixStore::new("0/", base));
    Arc::new(PrefixStore::new("cuda/", group))
}

/// This rank's handle of PyTorch's default NCCL group (world `size`, this process's `rank`), formed with
/// PyTorch's ranks on the rendezvous store `store`.
///
/// `options` keep everything but the group's name and description, which become PyTorch's (`0`,
/// `default_pg`): timeouts, blocking wait and the watchdog are each side's own business. Refused, with an error
/// that says why: a world larger than `ranks_per_root` (PyTorch's `TORCH_NCCL_RANKS_PER_ROOT`, 128 unless its
/// side sets it otherwise), where PyTorch exchanges several ids.
///
/// Both sides must load the same NCCL (point `PG_NCCL_LIBRARY` at PyTorch's `libnccl.so.2`) and PyTorch must
/// not turn off `TORCH_NCCL_BCAST_UNIQUEID`. Subgroups made on either side with `new_group` do not meet: PyTorch
/// names them by a process-wide counter and may split them from the parent communicator.
pub fn join_torch_default_group<B: Backend>(
    store: Arc<dyn Store>,
    origin: TorchStoreOrigin,
    rank: usize,
    size: usize,
    ranks_per_root: usize,
    device: B::Device,
    mut options: Options,
) -> Result<ProcessGroup<B>> {
    if size > ranks_per_root {
        return Err(Error::unsupported(format!(
            "joining PyTorch's default group of {size} ranks: above TORCH_NCCL_RANKS_PER_ROOT={ranks_per_root} \
             ranks PyTorch exchanges one unique id per root (scalable init), which pg does not speak; raise \
             TORCH_NCCL_RANKS_PER_ROOT on the PyTorch side to at least {size}"
        )));
    }
    options.group_name = "0".to_owned();
    options.group_desc = "default_pg".to_owned();
    ProcessGroup::build(torch_default_group_store(store, origin), (rank, size), device, options, Kind::Torch, None)
}

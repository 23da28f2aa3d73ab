//! Subgroups of a process group: `new_group`, a split by color, the rank maps between a group and the
//! world, and a `DeviceMesh` of one group per dimension (PyTorch's `new_group`, `split_group` and
//! `init_device_mesh`).
//!
//! A subgroup is a process group of its own, with its own communicator cache, store prefix and sequence
//! numbers. Making one is collective over the parent: every rank of the parent makes the same calls in the
//! same order, with the same ranks (as PyTorch requires), members get the group and the others `None`. Each
//! call takes the next number of the parent's subgroup counter, which names the subgroup's store prefix
//! (`group.{n}` under the parent's store), so ranks that made the same calls agree on the keys without talking.
//!
//! Ranks that broke the rule would meet under one prefix with different members, so each call is checked:
//! every rank of the parent publishes what its call `n` was (`subgroup.{n}/{rank}` under the parent's store:
//! `new_group` and its ranks, or `split_by_color`), and before any communicator of the subgroup is made the
//! ranks that take part read every rank's and fail with [`Error::SubgroupMismatch`] if one differs, so no data
//! moves. A rank that never makes the call makes the others fail with [`Error::InitTimeout`] at the new group's
//! timeout.
//!
//! When the parent's collective communicator exists and is not aborted, every rank of the parent checks the
//! call, then splits it ([`crate::Communicator::split`], NCCL's `ncclCommSplit`; non-members pass no color,
//! and the split gives up at the new group's timeout) and the subgroup adopts its part as its collective
//! communicator: no unique-id exchange. Otherwise the members check the call when the subgroup's first
//! communicator is created, and that one is made by a fresh rendezvous under the subgroup's store prefix. The
//! prefix is the same either way. Ranks decide alike when they ran the same ops on the parent, as the
//! collective-call rule already requires; a backend without a split falls back to the rendezvous on every rank.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use pg_store::{PrefixStore, Store};

use crate::process_group::Kind;
use crate::shared::Membership;
use crate::subgroup_call::{color_of, ranks_text, split_view, SubgroupCall};
use crate::{Backend, CommConfig, Communicator as _, Device as _, Error, Options, ProcessGroup, Result};

impl<B: Backend> ProcessGroup<B> {
    /// A group of the parent's ranks `ranks` (PyTorch's `dist.new_group(ranks)`); every rank of the parent
    /// calls it with the same `ranks`, in the same order among its `new_group` and `split_by_color` calls;
    /// members get `Some(group)`, the others `None`.
    ///
    /// Ranks are this group's ranks, in any order, without repeats; a member's rank in the new group is its
    /// position among them in ascending order, as in PyTorch. Options whose `group_name` is the default get the
    /// name `{parent}.{n}`, `n` counting the subgroups made from this parent. Like every group, it creates no
    /// communicator before its first op unless `options.eager_init` or the parent's communicator is split.
    ///
    /// A rank whose call differs from another rank's (other ranks, or a `split_by_color` there) gets
    /// [`Error::SubgroupMismatch`] from the call when the parent's communicator is split, else from the
    /// subgroup's first op; a rank that never makes the call makes the others fail with
    /// [`Error::InitTimeout`] at `options.timeout`.
    pub fn new_group(&self, ranks: &[usize], options: Options) -> Result<Option<ProcessGroup<B>>> {
        let members = self.checked_members("new_group", ranks)?;
        let deadline = self.device().now().saturating_add(options.timeout);
        let call = self.subgroup_call(format!("new_group(ranks {})", ranks_text(&members)))?;
        self.make_subgroup(call, None, &members, options, deadline)
    }

    /// Splits this group by color (NCCL's `ncclCommSplit`, PyTorch's `split_group`): every rank of this group
    /// calls it, in the same order among its `new_group` and `split_by_color` calls; ranks that pass the same
    /// `Some(color)` form one new group, in the order of this group's ranks; a rank that passes `None` joins no
    /// group and gets `None`.
    ///
    /// The colors are exchanged through the store, so the call returns once every rank of this group has made
    /// it, or fails with [`Error::InitTimeout`] at `options.timeout` naming the ranks that did not; a rank that
    /// made `new_group` as this call is an [`Error::SubgroupMismatch`].
    pub fn split_by_color(&self, color: Option<u32>, options: Options) -> Result<Option<ProcessGroup<B>>> {
        let deadline = self.device().now().saturating_add(options.timeout);
        let call = self.subgroup_call(split_view(color))?;
        let views = call.views(self.device(), deadline, &|what| self.subgroup_timeout(&options, what))?;
        let mut members = Vec::new();
        for (rank, view) in views.iter().enumerate() {
            match color_of(view) {
                Some(theirs) => {
                    if color.is_some() && theirs == color {
                        members.push(rank);
                    }
                }
                None if view.starts_with("new_group(") => return Err(call.mismatch(rank, view)),
                None => {
                    return Err(Error::invalid(format!(
                        "split_by_color: rank {rank} published '{view}' under '{}': not a subgroup call; is another \
                         program using this store prefix?",
                        call.key(rank)
                    )))
                }
            }
        }
        call.mark_checked();
        self.make_subgroup(call, color, &members, options, deadline)
    }

    /// This group's rank of the world rank `global`, or `None` when `global` is not a member (PyTorch's
    /// `get_group_rank`). A group made with [`ProcessGroup::new`] is its own world.
    pub fn group_rank(&self, global: usize) -> Option<usize> {
        match self.membership() {
            Some(membership) => membership.global_ranks.iter().position(|&rank| rank == global),
            None => (global < self.size()).then_some(global),
        }
    }

    /// The world rank of this group's rank `group_rank` (PyTorch's `get_global_rank`).
    pub fn global_rank(&self, group_rank: usize) -> Result<usize> {
        if group_rank >= self.size() {
            return Err(Error::invalid(format!(
                "global_rank: rank {group_rank} is out of range for a group of size {}",
                self.size()
            )));
        }
        Ok(match self.membership() {
            Some(membership) => membership.global_ranks[group_rank],
            None => group_rank,
        })
    }

    /// The members of this group as world ranks, in group-rank order.
    pub fn global_ranks(&self) -> Vec<usize> {
        match self.membership() {
            Some(membership) => membership.global_ranks.to_vec(),
            None => (0..self.size()).collect(),
        }
    }

    fn checked_members(&self, what: &str, ranks: &[usize]) -> Result<Vec<usize>> {
        if ranks.is_empty() {
            return Err(Error::invalid(format!("{what}: a group needs at least one rank (the list was empty)")));
        }
        let mut seen = BTreeSet::new();
        for &rank in ranks {
            if rank >= self.size() {
                return Err(Error::invalid(format!(
                    "{what}: rank {rank} is out of range for a parent group of size {}",
                    self.size()
                )));
            }
            if !seen.insert(rank) {
                return Err(Error::invalid(format!("{what}: rank {rank} is listed twice")));
            }
        }
        Ok(seen.into_iter().collect())
    }

    /// Takes the number of this group's next subgroup call and publishes this rank's `view` of it.
    fn subgroup_call(&self, view: String) -> Result<SubgroupCall> {
        self.shared().check_named(crate::lifecycle::Call::Subgroup, &view)?;
        let (parent, number) = (self.options().group_name.clone(), self.next_subgroup_index());
        SubgroupCall::publish(Arc::clone(self.store()), parent, (self.rank(), self.size()), number, view)
    }

    /// The [`Error::InitTimeout`] of a subgroup made with `options` that waited for `what`.
    fn subgroup_timeout(&self, options: &Options, what: String) -> Error {
        Error::InitTimeout { cache_key: self.collective_key().cache_key(), timeout: options.timeout, what }
    }

    /// Makes the subgroup of `call` with these members (this group's ranks, ascending or in split order), under
    /// the store prefix `group.{n}`, or `group.{n}.{color}` for one color of a split: the groups of one split
    /// exchange their unique ids under keys of their own. A split of the parent gives up at `deadline` (the
    /// device's clock).
    fn make_subgroup(
        &self,
        call: SubgroupCall,
        color: Option<u32>,
        members: &[usize],
        mut options: Options,
        deadline: Duration,
    ) -> Result<Option<ProcessGroup<B>>> {
        let index = call.number();
        let position = members.iter().position(|&rank| rank == self.rank());
        let child = self.split_parent(&call, position.map(|_| color.unwrap_or(0)), &options, deadline)?;
        let Some(group_rank) = position else {
            return Ok(None);
        };
        if options.group_name == Options::default().group_name {
            options.group_name = format!("{}.{index}", self.options().group_name);
        }
        let global_ranks = members.iter().map(|&rank| self.global_rank(rank)).collect::<Result<Arc<[usize]>>>()?;
        let prefix = match color {
            Some(color) => format!("group.{index}.{color}"),
            None => format!("group.{index}"),
        };
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(prefix, Arc::clone(self.store())));
        // A call not checked yet is checked when the subgroup's first communicator is created.
        let unchecked = !call.is_checked();
        let membership = Membership { global_ranks, call: unchecked.then_some(call), root: self.root_store() };
        let kind = Kind::Subgroup(membership);
        ProcessGroup::build(store, (group_rank, members.len()), self.device().clone(), options, kind, child).map(Some)
    }

    /// Splits the parent's collective communicator if it is live, this rank joining `color`'s part (ordered by
    /// this group's rank), once every rank's view of `call` agrees; `None` when there is nothing to split or the
    /// backend has no split. Every wait ends by `deadline`.
    fn split_parent(
        &self,
        call: &SubgroupCall,
        color: Option<u32>,
        options: &Options,
        deadline: Duration,
    ) -> Result<Option<B::Communicator>> {
        // Without a split capability the subgroup rendezvouses for its communicator at its first op.
        let Some(parent) = self.live_collective().filter(|_| self.capabilities().split) else {
            return Ok(None);
        };
        let timed_out = |what| self.subgroup_timeout(options, what);
        // Every rank of the parent takes part in a split: ranks whose calls differ stop here, before any of them
        // joins it.
        call.check(self.device(), deadline, &timed_out)?;
        let config = CommConfig {
            nonblocking: false,
            description: format!(
                "{}:{} subgroup {}",
                self.options().group_desc,
                self.options().group_name,
                call.number()
            ),
            timeout: Some(deadline.saturating_sub(self.device().now())),
        };
        match parent.split(color, self.rank(), &config) {
            Ok(child) => Ok(child),
            // The backend names the split by its description; the subgroup's key is its collective key.
            Err(Error::InitTimeout { what, .. }) => Err(timed_out(what)),
            Err(error) => Err(error),
        }
    }
}

/// An N-dimensional mesh of the world's ranks with one group per dimension (PyTorch's `init_device_mesh`):
/// for a 2 x 4 mesh named `("dp", "tp")`, rank r sits at `(r / 4, r % 4)`, its `tp` group holds the 4 ranks of
/// its row and its `dp` group the 2 ranks of its column.
///
/// Every rank of the world makes the mesh with the same shape; it makes every slice's group in the same order on
/// every rank (ranks outside a slice take part in naming it only), so creation costs one store write per slice
/// and waits for no other rank (unless the world's communicator exists and is split).
pub struct DeviceMesh<B: Backend> {
    names: Vec<String>,
    shape: Vec<usize>,
    coordinate: Vec<usize>,
    groups: Vec<ProcessGroup<B>>,
}

impl<B: Backend> std::fmt::Debug for DeviceMesh<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMesh")
            .field("names", &self.names)
            .field("shape", &self.shape)
            .field("coordinate", &self.coordinate)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> DeviceMesh<B> {
    /// Lays `world`'s ranks out row-major over `dims` (name, size) and makes one group per dimension; every
    /// group gets `options` (its name made unique per slice).
    pub fn new(world: &ProcessGroup<B>, dims: &[(&str, usize)], options: &Options) -> Result<Self> {
        if dims.is_empty() {
            return Err(Error::invalid("DeviceMesh: a mesh needs at least one dimension"));
        }
        let mut names = Vec::with_capacity(dims.len());
        for (name, size) in dims {
            if *size == 0 {
                return Err(Error::invalid(format!("DeviceMesh: dimension '{name}' has size 0")));
            }
            if names.iter().any(|seen: &String| seen == name) {
                return Err(Error::invalid(format!("DeviceMesh: dimension '{name}' is named twice")));
            }
            names.push((*name).to_owned());
        }
        let shape: Vec<usize> = dims.iter().map(|(_, size)| *size).collect();
        let total = shape.iter().try_fold(1usize, |acc, &size| acc.checked_mul(size));
        if total != Some(world.size()) {
            return Err(Error::invalid(format!(
                "DeviceMesh: a mesh of shape {shape:?} does not hold a world of {} ranks",
                world.size()
            )));
        }
        let strides: Vec<usize> = (0..shape.len()).map(|dim| shape[dim + 1..].iter().product()).collect();
        let coordinate: Vec<usize> = (0..shape.len()).map(|dim| world.rank() / strides[dim] % shape[dim]).collect();
        let mut groups = Vec::with_capacity(shape.len());
        for dim in 0..shape.len() {
            let mut mine = None;
            // Every slice along `dim`: the ranks whose other coordinates are fixed, in order of their start.
            for start in (0..world.size()).filter(|rank| rank / strides[dim] % shape[dim] == 0) {
                let slice: Vec<usize> = (0..shape[dim]).map(|step| start + step * strides[dim]).collect();
                let mut slice_options = options.clone();
                slice_options.group_desc = format!("mesh_{}", names[dim]);
                if let Some(group) = world.new_group(&slice, slice_options)? {
                    mine = Some(group);
                }
            }
            groups.push(mine.ok_or_else(|| Error::invalid("DeviceMesh: this rank is in no slice (a bug)"))?);
        }
        Ok(Self { names, shape, coordinate, groups })
    }

    /// This mesh laid out again over `world`, a group shrunk from the one it was made on
    /// ([`ProcessGroup::shrink`]): the first dimension (the outermost, data-parallel one by convention) takes
    /// what is left, the others keep their sizes and names, and every group is made anew on `world` with
    /// `options`. Refused by name when the others' sizes do not divide `world`'s ranks (a mesh `("dp", 2),
    /// ("tp", 4)` survives 8 -> 4, not 8 -> 6), as [`Error::InvalidArgument`] naming the dimensions; the
    /// groups of this mesh belong to the old world and stay as they are (revoke or drop them).
    pub fn after_shrink(&self, world: &ProcessGroup<B>, options: &Options) -> Result<Self> {
        self.laid_over(world, options, ("after_shrink", "shrunk"))
    }

    /// This mesh laid out again over `world`, the group a grow of the mesh's world returned
    /// ([`ProcessGroup::grow`]), as [`DeviceMesh::after_shrink`] does: the first dimension takes the ranks there are
    /// now, the others keep their sizes and names. Refused by name when the others' sizes do not divide the grown
    /// world. The new ranks make the same mesh with [`DeviceMesh::new`] and the shape this one has after the grow
    /// ([`DeviceMesh::shape`] of the result), on the group [`ProcessGroup::join_grown`] gave them.
    pub fn after_grow(&self, world: &ProcessGroup<B>, options: &Options) -> Result<Self> {
        self.laid_over(world, options, ("after_grow", "grown"))
    }

    /// This mesh over `world` with its first dimension resized; `(call, world_kind)` name the caller and the world
    /// in the refusal.
    fn laid_over(&self, world: &ProcessGroup<B>, options: &Options, (call, world_kind): (&str, &str)) -> Result<Self> {
        let inner: usize = self.shape[1..].iter().product();
        if world.size() % inner != 0 || world.size() < inner {
            let dims: Vec<String> = self.names.iter().zip(&self.shape).map(|(n, s)| format!("{n}={s}")).collect();
            return Err(Error::invalid(format!(
                "DeviceMesh::{call}: the mesh ({}) keeps every dimension but '{}', whose {inner} ranks per index do \
                 not divide the {} ranks of the {world_kind} world",
                dims.join(", "),
                self.names[0],
                world.size()
            )));
        }
        let dims: Vec<(&str, usize)> = self
            .names
            .iter()
            .zip(&self.shape)
            .enumerate()
            .map(|(dim, (name, size))| (name.as_str(), if dim == 0 { world.size() / inner } else { *size }))
            .collect();
        DeviceMesh::new(world, &dims, options)
    }

    /// The mesh's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The dimensions' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// This rank's coordinate in the mesh.
    pub fn coordinate(&self) -> &[usize] {
        &self.coordinate
    }

    /// This rank's group along dimension `dim`.
    pub fn group(&self, dim: usize) -> Result<&ProcessGroup<B>> {
        self.groups.get(dim).ok_or_else(|| {
            Error::invalid(format!(
                "DeviceMesh: dimension {dim} is out of range for a mesh of {} dimensions",
                self.shape.len()
            ))
        })
    }

    /// This rank's group along the dimension called `name`.
    pub fn group_named(&self, name: &str) -> Result<&ProcessGroup<B>> {
        match self.names.iter().position(|known| known == name) {
            Some(dim) => self.group(dim),
            None => Err(Error::invalid(format!(
                "DeviceMesh: no dimension is called '{name}' (the mesh has {:?})",
                self.names
            ))),
        }
    }
}

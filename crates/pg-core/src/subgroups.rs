//! Subgroups of a process group: `new_group`, a split by color, the rank maps between a group and the
//! world, and a `DeviceMesh` of one group per dimension (PyTorch's `new_group`, `split_group` and
//! `init_device_mesh`).
//!
//! A subgroup is a process group of its own, with its own communicator cache, store prefix and sequence
//! numbers. Making one is collective over the parent: every rank of the parent makes the same calls in the
//! same order (as PyTorch requires), members get the group and the others `None`. Each call takes the next
//! number of the parent's subgroup counter, which names the subgroup's store prefix (`group.{n}` under the
//! parent's store), so ranks that made the same calls agree on the keys without talking.
//!
//! When the parent's collective communicator exists and is not aborted, every rank of the parent splits it
//! ([`crate::Communicator::split`], NCCL's `ncclCommSplit`; non-members pass no color) and the subgroup adopts
//! its part as its collective communicator: no unique-id exchange. Otherwise the subgroup's first op creates
//! one by a fresh rendezvous under its store prefix. The prefix is the same either way. Ranks decide alike
//! when they ran the same ops on the parent, as the collective-call rule already requires; a backend without
//! a split falls back to the rendezvous on every rank.

use std::collections::BTreeSet;
use std::sync::Arc;

use pg_store::{PrefixStore, Store};

use crate::process_group::Kind;
use crate::shared::Membership;
use crate::{Backend, Communicator as _, Error, Options, ProcessGroup, Result};

impl<B: Backend> ProcessGroup<B> {
    /// A group of the parent's ranks `ranks` (PyTorch's `dist.new_group(ranks)`); every rank of the parent
    /// calls it with the same `ranks`, members get `Some(group)`, the others `None`.
    ///
    /// Ranks are this group's ranks, in any order, without repeats; a member's rank in the new group is its
    /// position among them in ascending order, as in PyTorch. Options whose `group_name` is the default get the
    /// name `{parent}.{n}`, `n` counting the subgroups made from this parent. Like every group, it creates no
    /// communicator before its first op unless `options.eager_init`.
    pub fn new_group(&self, ranks: &[usize], options: Options) -> Result<Option<ProcessGroup<B>>> {
        let members = self.checked_members("new_group", ranks)?;
        let index = self.next_subgroup_index();
        self.make_subgroup(index, None, &members, options)
    }

    /// Splits this group by color (NCCL's `ncclCommSplit`, PyTorch's `split_group`): every rank of this group
    /// calls it, ranks that pass the same `Some(color)` form one new group, in the order of this group's ranks;
    /// a rank that passes `None` joins no group and gets `None`.
    ///
    /// The colors are exchanged through the store, so the call returns once every rank of this group has made
    /// it (or fails with the store's timeout naming the rank that did not).
    pub fn split_by_color(&self, color: Option<u32>, options: Options) -> Result<Option<ProcessGroup<B>>> {
        let index = self.next_subgroup_index();
        let store = self.store();
        let key = |rank: usize| format!("split.{index}/color/{rank}");
        let mine = match color {
            Some(color) => color.to_string(),
            None => "none".to_owned(),
        };
        store.set(&key(self.rank()), mine.as_bytes())?;
        let Some(color) = color else {
            return self.make_subgroup(index, None, &[], options);
        };
        let mut members = Vec::new();
        for rank in 0..self.size() {
            let value = match rank == self.rank() {
                true => mine.clone().into_bytes(),
                false => store.get(&key(rank))?,
            };
            let theirs = String::from_utf8_lossy(&value);
            if theirs == color.to_string() {
                members.push(rank);
            } else if theirs != "none" && theirs.parse::<u32>().is_err() {
                return Err(Error::invalid(format!(
                    "split_by_color: rank {rank} published color '{theirs}' under '{}': not a color; is another \
                     program using this store prefix?",
                    key(rank)
                )));
            }
        }
        self.make_subgroup(index, Some(color), &members, options)
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

    /// Makes subgroup number `index` of these members (this group's ranks, ascending or in split order), under
    /// the store prefix `group.{index}`, or `group.{index}.{color}` for one color of a split: the groups of one
    /// split exchange their unique ids under keys of their own.
    fn make_subgroup(
        &self,
        index: u64,
        color: Option<u32>,
        members: &[usize],
        mut options: Options,
    ) -> Result<Option<ProcessGroup<B>>> {
        let position = members.iter().position(|&rank| rank == self.rank());
        let child = self.split_parent(position.map(|_| color.unwrap_or(0)))?;
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
        let membership = Membership { global_ranks };
        let kind = Kind::Subgroup(membership);
        ProcessGroup::build(store, (group_rank, members.len()), self.device().clone(), options, kind, child).map(Some)
    }

    /// Splits the parent's collective communicator if it is live, this rank joining `color`'s part (ordered by
    /// this group's rank); `None` when there is nothing to split or the backend has no split.
    fn split_parent(&self, color: Option<u32>) -> Result<Option<B::Communicator>> {
        let Some(parent) = self.live_collective() else {
            return Ok(None);
        };
        match parent.split(color, self.rank()) {
            Ok(child) => Ok(child),
            Err(Error::Unsupported(_)) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// An N-dimensional mesh of the world's ranks with one group per dimension (PyTorch's `init_device_mesh`):
/// for a 2 x 4 mesh named `("dp", "tp")`, rank r sits at `(r / 4, r % 4)`, its `tp` group holds the 4 ranks of
/// its row and its `dp` group the 2 ranks of its column.
///
/// Every rank of the world makes the mesh with the same shape; it makes every slice's group in the same order on
/// every rank (ranks outside a slice take part in naming it only), so creation costs no communication.
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

//! Subgroups: `new_group`, `split_by_color`, the rank maps and `DeviceMesh`, each made both ways (split from the
//! parent's live communicator, and by a fresh rendezvous when the parent has none) and checked with real data;
//! subgroup calls that differ between ranks or that a rank never makes, and a split a rank never joins.

use std::time::Duration;

use pg_core::{Backend, CommConfig, Communicator as _, DType, Device as _, DeviceMesh, ErrorKind, Options};
use pg_core::{ProcessGroup, ReduceOp};

use super::{case, clock_of, communicator, need};
use crate::case::{pass, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(new_group_gives_members_a_group_and_non_members_none_split_or_rendezvous, 2),
        case!(split_by_color_forms_one_group_per_color_split_or_rendezvous, 2),
        case!(a_subgroup_of_a_subgroup_maps_to_world_ranks, 4),
        case!(every_group_of_2x4_4x2_and_2x2x2_meshes_reduces_over_its_slice, 8),
        case!(bad_subgroup_arguments_are_refused_by_name, 1),
        case!(new_group_called_in_different_orders_fails_on_every_rank_split_or_rendezvous, 2),
        case!(a_new_group_call_a_rank_never_makes_times_out_split_or_rendezvous, 2),
        case!(a_split_a_rank_never_joins_times_out_and_aborts_the_parent, 2),
    ]
}

/// How a case makes the parent: with no communicator yet (subgroups rendezvous), or after a barrier (subgroups
/// split the parent's communicator).
#[derive(Clone, Copy, Debug)]
enum Path {
    Rendezvous,
    Split,
}

const PATHS: [Path; 2] = [Path::Rendezvous, Path::Split];

/// `group`, kept by `r` until the world ends (a member that finished first must not abort a communicator its
/// peers still use).
fn kept<B: Backend>(r: &Rank<B>, group: Option<ProcessGroup<B>>) -> Option<ProcessGroup<B>> {
    group.map(|group| r.keep(group))
}

fn parent<B: Backend>(r: &Rank<B>, name: &str, path: Path) -> Check<ProcessGroup<B>> {
    match path {
        Path::Rendezvous => r.group(name, Options::builder()),
        Path::Split => r.ready_group(name, Options::builder()),
    }
}

/// Checks that a subgroup made on `path` has its communicator already (split) or not yet (rendezvous).
fn made_by<B: Backend>(group: &ProcessGroup<B>, path: Path) -> Check {
    let want = match path {
        Path::Rendezvous => 0,
        Path::Split => 1,
    };
    ensure_eq!(group.counters().comms_created, want, "communicators of a subgroup just made on the {path:?} path");
    Ok(())
}

/// All-reduces `rank + 1` (of the world) over `group` and checks the sum over its members' world ranks.
fn sums_over_members<B: Backend>(r: &Rank<B>, group: &ProcessGroup<B>, what: &str) -> Check {
    let buffer = r.holding(DType::F32, &[r.rank as f64 + 1.0; 4])?;
    group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx(&format!("all_reduce in {what}"))?;
    let want: f64 = group.global_ranks().iter().map(|&k| k as f64 + 1.0).sum();
    let got = r.read(&buffer)?;
    ensure!(got == [want; 4], "{what} ({:?}): got {got:?}, want {want}", group.global_ranks());
    Ok(())
}

fn new_group_gives_members_a_group_and_non_members_none_split_or_rendezvous<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        for path in PATHS {
            let world = parent(r, &format!("new_group_{path:?}"), path)?;
            // Listed high to low on purpose: group ranks follow ascending parent ranks.
            let odd: Vec<usize> = (0..n).rev().filter(|k| k % 2 == 1).collect();
            let even: Vec<usize> = (0..n).rev().filter(|k| k % 2 == 0).collect();
            let odd_group = kept(r, world.new_group(&odd, Options::builder().build()).ctx("new_group of odd ranks")?);
            let even_group =
                kept(r, world.new_group(&even, Options::builder().build()).ctx("new_group of even ranks")?);
            ensure_eq!(odd_group.is_some(), r.rank % 2 == 1, "{path:?}: membership of the odd group");
            ensure_eq!(even_group.is_some(), r.rank % 2 == 0, "{path:?}: membership of the even group");
            let mine = odd_group.or(even_group).ok_or("a member of neither group")?;
            made_by(&mine, path)?;
            let parity: Vec<usize> = (0..n).filter(|k| k % 2 == r.rank % 2).collect();
            ensure_eq!(mine.size(), parity.len(), "{path:?}: group size");
            ensure_eq!(mine.rank(), r.rank / 2, "{path:?}: group rank = position among the sorted members");
            ensure_eq!(mine.global_rank(mine.rank()).ctx("global_rank")?, r.rank, "{path:?}: global_rank");
            ensure_eq!(mine.group_rank(r.rank), Some(r.rank / 2), "{path:?}: group_rank");
            // A neighbour of the other parity, where the world has one.
            let other = if r.rank % 2 == 0 { r.rank + 1 } else { r.rank - 1 };
            if other < n {
                ensure_eq!(mine.group_rank(other), None, "{path:?}: group_rank of the other parity");
            }
            ensure_eq!(mine.global_ranks(), parity, "{path:?}: global_ranks");
            ensure!(mine.options().group_name != world.options().group_name, "a subgroup gets a name of its own");
            sums_over_members(r, &mine, &format!("the {path:?} subgroup"))?;
            ensure_eq!(mine.counters().comms_created, 1, "{path:?}: one communicator after the first op");
            if let Path::Rendezvous = path {
                ensure_eq!(world.counters().comms_created, 0, "a parent with no op of its own created nothing");
            }
            // The parent still works beside its subgroups.
            sums_over_members(r, &world, "the parent")?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn split_by_color_forms_one_group_per_color_split_or_rendezvous<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        for path in PATHS {
            let world = parent(r, &format!("split_{path:?}"), path)?;
            // Rank 1 joins no group; the others split by parity into colors 5 and 6.
            let color_of = |k: usize| (k != 1).then_some(5 + (k % 2) as u32);
            let split =
                kept(r, world.split_by_color(color_of(r.rank), Options::builder().build()).ctx("split_by_color")?);
            let Some(split) = split else {
                ensure_eq!(r.rank, 1, "{path:?}: only rank 1 gets no group");
                continue;
            };
            made_by(&split, path)?;
            let members: Vec<usize> =
                (0..n).filter(|&k| color_of(k).is_some() && color_of(k) == color_of(r.rank)).collect();
            ensure_eq!(split.global_ranks(), members, "{path:?}: the members of color {:?}", color_of(r.rank));
            sums_over_members(r, &split, &format!("the {path:?} split"))?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn a_subgroup_of_a_subgroup_maps_to_world_ranks<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        for path in PATHS {
            let world = parent(r, &format!("nested_{path:?}"), path)?;
            let upper = kept(r, world.new_group(&[1, 2, 3], Options::builder().build()).ctx("new_group")?);
            let Some(upper) = upper else {
                ensure!(r.rank == 0 || r.rank > 3, "{path:?}: rank {} left out of [1, 2, 3]", r.rank);
                continue;
            };
            if let Path::Split = path {
                upper.barrier_sync().ctx("barrier of the middle group")?;
            }
            let pair = kept(r, upper.new_group(&[1, 2], Options::builder().build()).ctx("nested new_group")?);
            match pair {
                Some(pair) => {
                    made_by(&pair, path)?;
                    ensure_eq!(pair.global_ranks(), vec![2, 3], "{path:?}: group ranks 1 and 2 of [1, 2, 3]");
                    sums_over_members(r, &pair, "the nested group")?;
                }
                None => ensure_eq!(r.rank, 1, "{path:?}: only world rank 1 is left out of the nested group"),
            }
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn every_group_of_2x4_4x2_and_2x2x2_meshes_reduces_over_its_slice<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let shapes: [&[(&str, usize)]; 3] =
        [&[("dp", 2), ("tp", 4)], &[("pp", 4), ("tp", 2)], &[("x", 2), ("y", 2), ("z", 2)]];
    let ran = h.run(n, |r| -> Check {
        for path in PATHS {
            for (i, dims) in shapes.iter().enumerate() {
                if dims.iter().map(|(_, size)| size).product::<usize>() != n {
                    continue;
                }
                let world = parent(r, &format!("mesh_{i}_{path:?}"), path)?;
                let mesh = DeviceMesh::new(&world, dims, &Options::builder().build()).ctx("DeviceMesh::new")?;
                for dim in 0..dims.len() {
                    r.keep(mesh.group(dim).ctx("a mesh dimension's group")?.clone());
                }
                let strides: Vec<usize> =
                    (0..dims.len()).map(|d| dims[d + 1..].iter().map(|(_, s)| s).product()).collect();
                let coordinate: Vec<usize> = (0..dims.len()).map(|d| r.rank / strides[d] % dims[d].1).collect();
                ensure_eq!(mesh.coordinate(), coordinate.as_slice(), "{dims:?} {path:?}: coordinate");
                for (d, (name, size)) in dims.iter().enumerate() {
                    let group = mesh.group_named(name).ctx("group_named")?;
                    made_by(group, path)?;
                    let base = r.rank - coordinate[d] * strides[d];
                    let slice: Vec<usize> = (0..*size).map(|step| base + step * strides[d]).collect();
                    ensure_eq!(group.global_ranks(), slice, "{dims:?} {path:?}: the '{name}' slice");
                    ensure_eq!(group.rank(), coordinate[d], "{dims:?} {path:?}: rank in the '{name}' slice");
                    sums_over_members(r, group, &format!("the '{name}' group of {dims:?}"))?;
                }
                sums_over_members(r, &world, "the world beside its mesh")?;
            }
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// Checks that `result` is an `InvalidArgument` error whose text contains `words`.
fn refused<T>(what: &str, result: pg_core::Result<T>, words: &str) -> Check {
    match result {
        Ok(_) => Err(format!("{what}: accepted")),
        Err(error) if error.kind() == ErrorKind::InvalidArgument && error.to_string().contains(words) => Ok(()),
        Err(error) => Err(format!("{what}: {:?} not naming '{words}': {error}", error.kind())),
    }
}

fn bad_subgroup_arguments_are_refused_by_name<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let world = r.ready_group("bad_subgroups", Options::builder())?;
        let options = || Options::builder().build();
        refused("an empty new_group", world.new_group(&[], options()), "empty")?;
        refused("a rank out of range", world.new_group(&[0, n], options()), "out of range")?;
        refused("a rank listed twice", world.new_group(&[0, 0], options()), "listed twice")?;
        refused("global_rank out of range", world.global_rank(n), "out of range")?;
        ensure_eq!(world.group_rank(n + 3), None, "group_rank of a rank outside the world");
        let too_big: &[(&str, usize)] = &[("dp", n + 1)];
        let shapes: [(&[(&str, usize)], &str); 4] = [
            (&[], "at least one dimension"),
            (too_big, "does not hold"),
            (&[("dp", 0), ("tp", n)], "size 0"),
            (&[("x", 1), ("x", n)], "named twice"),
        ];
        for (dims, words) in shapes {
            refused(&format!("a mesh of {dims:?}"), DeviceMesh::new(&world, dims, &options()), words)?;
        }
        let mesh = DeviceMesh::new(&world, &[("dp", n)], &options()).ctx("a one-dimensional mesh")?;
        refused("a mesh dimension out of range", mesh.group(1), "out of range")?;
        refused("an unknown mesh dimension", mesh.group_named("tp"), "no dimension")?;
        // The refusals made no subgroup: the group still works, and so does the mesh's one group.
        sums_over_members(r, &world, "the group after the refusals")?;
        let dp = r.keep(mesh.group(0).ctx("dp")?.clone());
        sums_over_members(r, &dp, "the mesh's group")?;
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// Checks that `result` is a [`ErrorKind::SubgroupMismatch`] naming `new_group` and the order rule.
fn mismatched<T>(what: &str, result: pg_core::Result<T>) -> Check {
    match result {
        Ok(_) => Err(format!("{what}: succeeded")),
        Err(error) => {
            let text = error.to_string();
            ensure_eq!(error.kind(), ErrorKind::SubgroupMismatch, "{what}: {error}");
            ensure!(
                text.contains("new_group") && text.contains("same order") && text.contains("same ranks"),
                "{what}: the error does not name new_group and the order rule: {text}"
            );
            Ok(())
        }
    }
}

/// Ranks 0 and 1 make `new_group([0, 1])` then `new_group([2, 3])`, ranks 2 and 3 the other order (the others
/// the first order): every rank that takes part in a group gets a `SubgroupMismatch`, and no data moves. On the
/// split path the calls themselves fail on every rank, before any rank splits; on the rendezvous path the
/// groups' first ops do, and the error sticks to the group.
fn new_group_called_in_different_orders_fails_on_every_rank_split_or_rendezvous<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        for path in PATHS {
            let world = parent(r, &format!("order_{path:?}"), path)?;
            let options = || Options::builder().timeout(Duration::from_secs(30)).build();
            // The lower half of the world makes its own group first, the upper half its own: every rank calls
            // new_group for both halves, in different orders (at world 2, [0] and [1]).
            let (lower, upper): (Vec<usize>, Vec<usize>) = (0..n).partition(|&rank| rank < n / 2);
            let order: [&[usize]; 2] = match r.rank < n / 2 {
                true => [&lower, &upper],
                false => [&upper, &lower],
            };
            if let Path::Split = path {
                mismatched(&format!("{path:?}: the first new_group"), world.new_group(order[0], options()))?;
                sums_over_members(r, &world, "the parent after the refused split")?;
                continue;
            }
            let first = kept(r, world.new_group(order[0], options()).ctx("the first new_group")?);
            let second = kept(r, world.new_group(order[1], options()).ctx("the second new_group")?);
            ensure!(second.is_none(), "{path:?}: rank {} is a member of its second group", r.rank);
            if let Some(group) = first {
                let buffer = r.holding(DType::F32, &[1000.0 + r.rank as f64; 4])?;
                mismatched(
                    &format!("{path:?}: all_reduce in {:?}", group.global_ranks()),
                    group.all_reduce(&buffer, ReduceOp::Sum),
                )?;
                mismatched(&format!("{path:?}: a second all_reduce"), group.all_reduce(&buffer, ReduceOp::Sum))?;
                ensure_eq!(group.counters().comms_created, 0, "{path:?}: communicators of the refused group");
                let got = r.read(&buffer)?;
                ensure!(got == [1000.0 + r.rank as f64; 4], "{path:?}: the refused all_reduce moved data: {got:?}");
            }
            sums_over_members(r, &world, "the parent beside the refused group")?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// Every rank but 1 makes `new_group([0, 1])` with a short timeout; rank 1 never does. Where the parent's
/// communicator exists every caller waits for rank 1's call and fails with `InitTimeout` at the timeout; on the
/// rendezvous path rank 0 gets its group and its first op fails so. The parent still works afterwards.
fn a_new_group_call_a_rank_never_makes_times_out_split_or_rendezvous<H: Harness>(h: &H) -> Check<Outcome> {
    // The missing call is found in the store before any communicator is split: a wall clock serves as well.
    need!(clock_of(h));
    let n = h.world_size();
    let timeout = Duration::from_secs(3);
    let ran = h.run(n, |r| -> Check {
        for path in PATHS {
            let world = parent(r, &format!("absent_{path:?}"), path)?;
            if r.rank != 1 {
                gives_up_without_rank_1(r, &world, path, timeout)?;
            }
            sums_over_members(r, &world, "the parent after the timed-out subgroup")?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

/// On the backend's communicator: rank 0 splits with a timeout and no other rank ever calls the split. The split
/// fails with `InitTimeout` at the timeout and leaves the parent aborted.
fn a_split_a_rank_never_joins_times_out_and_aborts_the_parent<H: Harness>(h: &H) -> Check<Outcome> {
    need!(clock_of(h));
    let n = h.world_size();
    let timeout = Duration::from_secs(2);
    let done = "split_alone/done";
    let ran = h.run(n, |r| -> Check {
        let parent = communicator(r, "split_alone")?;
        if r.rank != 0 {
            // The other ranks keep their communicator until rank 0 is done: a peer that let go of it would end rank
            // 0's split with a remote error (NCCL's network transport sees the connection close), not the timeout.
            r.store.wait(&[done], Some(timeout * 30)).ctx("waiting for rank 0's split")?;
            return Ok(());
        }
        let config =
            CommConfig { description: "lonely split".to_owned(), timeout: Some(timeout), ..Default::default() };
        let start = r.device.now();
        let result = parent.split(Some(0), 0, &config);
        let took = r.device.now() - start;
        r.store.set(done, b"1").ctx("saying rank 0's split is over")?;
        match result {
            Ok(_) => return Err("the split returned without the other ranks".into()),
            Err(error) => ensure_eq!(error.kind(), ErrorKind::InitTimeout, "the split's error: {error}"),
        }
        ensure!(took >= timeout && took < timeout * 2, "gave up after {took:?}, not {timeout:?}");
        ensure!(parent.is_aborted(), "the parent of a split that timed out is not aborted");
        Ok(())
    })?;
    ran.all_ok()?;
    pass()
}

/// Rank `r`'s part of [`a_new_group_call_a_rank_never_makes_times_out_split_or_rendezvous`]: `new_group([0, 1])`
/// and, on the rendezvous path, the group's first op, end in `InitTimeout` at `timeout` naming rank 1 (a
/// non-member on the rendezvous path just gets `None`).
fn gives_up_without_rank_1<B: Backend>(r: &Rank<B>, world: &ProcessGroup<B>, path: Path, timeout: Duration) -> Check {
    let start = r.device.now();
    let result = match world.new_group(&[0, 1], Options::builder().timeout(timeout).build()) {
        Ok(Some(group)) => {
            let buffer = r.holding(DType::F32, &[1.0; 4])?;
            group.all_reduce(&buffer, ReduceOp::Sum).map(|_| ())
        }
        Ok(None) => {
            ensure!(r.rank > 1 && matches!(path, Path::Rendezvous), "{path:?}: rank {} got no group", r.rank);
            return Ok(());
        }
        Err(error) => Err(error),
    };
    let took = r.device.now() - start;
    let error = match result {
        Ok(()) => return Err(format!("{path:?}: rank {} went on without rank 1", r.rank)),
        Err(error) => error,
    };
    ensure_eq!(error.kind(), ErrorKind::InitTimeout, "{path:?}: {error}");
    ensure!(error.to_string().contains("rank(s) 1 "), "{path:?}: the error does not name rank 1: {error}");
    ensure!(took >= timeout && took < timeout * 2, "{path:?}: gave up after {took:?}, not {timeout:?}");
    Ok(())
}

//! Simulated communicators: ranks that join a unique id, collectives matched across ranks by their order, and
//! their real results.
//!
//! The k-th collective of every rank on a communicator belongs together (as in NCCL); point-to-point operations
//! are matched per (sender, receiver) pair in order. A part waits on its stream like any operation; the
//! collective starts when every part can start and lasts the cost model's time. A mismatch (other op, dtype or
//! size) becomes the communicator's asynchronous error on every rank, and the operation never completes (NCCL
//! would hang); an abort releases it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use pg_core::{args, Buffer as _, CommConfig, Error, ReduceOp, Result, UniqueId};

use crate::buffer::{MockBuffer, WeakBuffer};
use crate::clock::{ns, transfer, Cond, OpRef, ShrinkKey, Time, Wake};
use crate::fault::Fault;
use crate::hazard::{Accessor, Mode};
use crate::sched::Inner;
use crate::state::{CollKind, CommGroup, OpKind, Part, RankComm, Scale, SlotKey, State, View, Views};
use crate::stream::MockStream;
use crate::Mock;

fn show(numel: Option<usize>) -> String {
    numel.map_or_else(|| "no buffer".to_owned(), |n| n.to_string())
}

fn join_ranks(ranks: impl Iterator<Item = usize>) -> String {
    ranks.map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

impl State {
    fn cost(&self, group: usize, part: &Part) -> Time {
        let n = self.comms.groups[group].size;
        let latency = crate::clock::ns(self.config.collective_latency);
        let bw = self.config.bus_bandwidth;
        let size = part.dtype.size();
        let (bytes_in, bytes_out) = (part.numel_in * size, part.numel_out * size);
        let wire = match part.kind {
            CollKind::AllReduce(_) => 2 * (n - 1) * bytes_in / n.max(1),
            CollKind::AllGather => (n - 1) * bytes_out / n.max(1),
            CollKind::ReduceScatter(_) => (n - 1) * bytes_in / n.max(1),
            _ => bytes_in.max(bytes_out),
        };
        (latency + if wire == 0 { 0 } else { transfer(wire, bw) }).max(1)
    }

    fn expected_parts(&self, group: usize, key: SlotKey) -> usize {
        match key {
            SlotKey::Coll(_) => self.comms.groups[group].size,
            SlotKey::P2p { src, dst, .. } => 1 + usize::from(src != dst),
        }
    }

    /// Fires the collective in `key` if every part can start; returns whether it did.
    pub(crate) fn try_fire(&mut self, group: usize, key: SlotKey) -> bool {
        let expected = self.expected_parts(group, key);
        let g = &self.comms.groups[group];
        let Some(slot) = g.slots.get(&key) else { return false };
        if slot.stuck.is_some() || slot.parts.len() < expected {
            return false;
        }
        let mut start = g.ready_time.unwrap_or(0);
        for part in slot.parts.values() {
            let s = &self.streams[part.op.stream];
            if s.first_unresolved != part.op.seq {
                return false;
            }
            match s.ops.get(&part.op.seq).and_then(|o| o.ready_at) {
                Some(t) => start = start.max(t),
                None => return false,
            }
        }
        if start > self.now {
            // Matched, but not started until the clock reaches `start`: a rank that aborts or revokes its
            // communicator before then takes its part out, and the collective never runs on any rank (an aborted
            // NCCL communicator's queued kernel exits without moving data, and its peers never receive it).
            self.pending_starts.insert(start);
            return false;
        }
        let slot = self.comms.groups[group].slots.remove(&key).expect("present");
        let parts: Vec<(usize, Part)> = slot.parts.into_iter().collect();
        let finish = start + self.cost(group, &parts[0].1);
        self.apply_collective(&parts);
        for (rank, part) in &parts {
            self.complete_op(part.op, start, finish);
            let device = self.comms.groups[group].ranks[*rank].device;
            let rc = &mut self.comms.groups[group].ranks[*rank];
            rc.completed += 1;
            let completed = rc.completed;
            let faulted = self.faults.iter().any(
                |f| matches!(f, Fault::AsyncError { rank: r, after_ops } if Some(*r) == device && *after_ops == completed),
            );
            let rc = &mut self.comms.groups[group].ranks[*rank];
            if faulted && rc.error.is_none() {
                rc.error = Some((
                    finish,
                    format!(
                        "NCCL error: unhandled system error (injected fault: rank {rank} after {completed} operations)"
                    ),
                ));
            }
        }
        true
    }

    /// Computes the real results of a matched operation into the output blocks.
    fn apply_collective(&mut self, parts: &[(usize, Part)]) {
        let read = |st: &State, block: u64| st.alloc.blocks.get(&block).map(|b| b.data.clone()).unwrap_or_default();
        let mut inputs: Vec<Vec<u8>> = parts.iter().map(|(_, p)| read(self, p.input)).collect();
        for ((_, part), input) in parts.iter().zip(&mut inputs) {
            let factor = match part.scale {
                None => continue,
                Some(Scale::Host(factor)) => factor,
                Some(Scale::Device(block)) => {
                    crate::conv::decode(part.dtype, &read(self, block)).first().copied().unwrap_or(f64::NAN)
                }
            };
            crate::conv::scale(part.dtype, factor, input);
        }
        let first = &parts[0].1;
        if first.views.is_some() || matches!(first.kind, CollKind::Reduce { .. }) {
            let outputs = self.apply_views(parts, &inputs);
            self.write_outputs(outputs);
            return;
        }
        let mut outputs: Vec<(u64, Vec<u8>)> = Vec::new();
        match first.kind {
            CollKind::AllReduce(op) => {
                let mut out = vec![0; inputs[0].len()];
                let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                if crate::conv::reduce(first.dtype, op, &refs, &mut out).is_ok() {
                    outputs.extend(parts.iter().map(|(_, p)| (p.output, out.clone())));
                }
            }
            CollKind::Broadcast { root } => {
                if let Some(i) = parts.iter().position(|(r, _)| *r == root) {
                    outputs.extend(parts.iter().map(|(_, p)| (p.output, inputs[i].clone())));
                }
            }
            CollKind::AllGather => {
                let all: Vec<u8> = inputs.concat();
                outputs.extend(parts.iter().map(|(_, p)| (p.output, all.clone())));
            }
            CollKind::ReduceScatter(op) => {
                let mut out = vec![0; inputs[0].len()];
                let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                if crate::conv::reduce(first.dtype, op, &refs, &mut out).is_ok() {
                    let chunk = out.len() / parts.len().max(1);
                    for (i, (_, p)) in parts.iter().enumerate() {
                        outputs.push((p.output, out[i * chunk..(i + 1) * chunk].to_vec()));
                    }
                }
            }
            CollKind::Send { .. } | CollKind::Recv { .. } => {
                let sender = parts.iter().position(|(_, p)| matches!(p.kind, CollKind::Send { .. }));
                let receiver = parts.iter().position(|(_, p)| matches!(p.kind, CollKind::Recv { .. }));
                if let (Some(s), Some(r)) = (sender, receiver) {
                    outputs.push((parts[r].1.output, inputs[s].clone()));
                }
            }
            // Reduce and the ops over views returned above.
            _ => {}
        }
        self.write_outputs(outputs.into_iter().map(|(block, bytes)| (block, 0, bytes)).collect());
    }

    /// Writes each `(block, byte offset, bytes)`, clipped to the block.
    fn write_outputs(&mut self, outputs: Vec<(u64, usize, Vec<u8>)>) {
        for (block, offset, bytes) in outputs {
            if let Some(b) = self.alloc.blocks.get_mut(&block) {
                let end = b.data.len().min(offset.saturating_add(bytes.len()));
                if offset < end {
                    b.data[offset..end].copy_from_slice(&bytes[..end - offset]);
                }
            }
        }
    }

    /// The results of reduce and of the ops over views (lists of buffers or chunks of one), as
    /// `(block, byte offset, bytes)`; `inputs` holds every part's whole input block, for reduce.
    fn apply_views(&self, parts: &[(usize, Part)], inputs: &[Vec<u8>]) -> Vec<(u64, usize, Vec<u8>)> {
        let first = &parts[0].1;
        let size = first.dtype.size();
        let read = |v: &View| -> Vec<u8> {
            let data = self.alloc.blocks.get(&v.block).map(|b| b.data.as_slice()).unwrap_or_default();
            let (start, end) = (v.offset * size, (v.offset + v.numel) * size);
            data.get(start..end).map(<[u8]>::to_vec).unwrap_or_default()
        };
        let write = |v: &View, bytes: Vec<u8>| (v.block, v.offset * size, bytes);
        let views = |p: &Part| p.views.clone().unwrap_or_default();
        let all: Vec<Arc<Views>> = parts.iter().map(|(_, p)| views(p)).collect();
        let mut out = Vec::new();
        match first.kind {
            CollKind::Reduce { root, op } => {
                let mut result = vec![0; inputs[0].len()];
                let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let root_part = parts.iter().find(|(r, _)| *r == root);
                if let (Ok(()), Some((_, p))) = (crate::conv::reduce(first.dtype, op, &refs, &mut result), root_part) {
                    out.push((p.output, 0, result));
                }
            }
            CollKind::Gather { root } => {
                for (i, v) in all[root].outputs.iter().enumerate() {
                    if let Some(input) = all.get(i).and_then(|a| a.inputs.first()) {
                        out.push(write(v, read(input)));
                    }
                }
            }
            CollKind::Scatter { root } => {
                for (j, a) in all.iter().enumerate() {
                    if let (Some(v), Some(input)) = (a.outputs.first(), all[root].inputs.get(j)) {
                        out.push(write(v, read(input)));
                    }
                }
            }
            CollKind::AllToAll => {
                // Read every chunk before writing any, so that an output that overlaps an input sees the input.
                for (j, a) in all.iter().enumerate() {
                    for (i, v) in a.outputs.iter().enumerate() {
                        if let Some(input) = all.get(i).and_then(|src| src.inputs.get(j)) {
                            out.push(write(v, read(input)));
                        }
                    }
                }
            }
            CollKind::AllGatherV => {
                for a in &all {
                    for (i, v) in a.outputs.iter().enumerate() {
                        if let Some(input) = all.get(i).and_then(|src| src.inputs.first()) {
                            out.push(write(v, read(input)));
                        }
                    }
                }
            }
            CollKind::ReduceScatterV(op) => {
                for (j, a) in all.iter().enumerate() {
                    let Some(v) = a.outputs.first() else { continue };
                    let chunks: Vec<Vec<u8>> = all.iter().filter_map(|src| src.inputs.get(j)).map(read).collect();
                    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
                    let mut result = vec![0; v.numel * size];
                    if crate::conv::reduce(first.dtype, op, &refs, &mut result).is_ok() {
                        out.push(write(v, result));
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// For an op over views: the first pair of ranks whose chunk sizes disagree, described.
    fn views_mismatch(parts: &[(usize, Part)]) -> Option<String> {
        let first = &parts[0].1;
        let empty = Arc::new(Views::default());
        let all: Vec<Arc<Views>> =
            parts.iter().map(|(_, p)| p.views.clone().unwrap_or_else(|| empty.clone())).collect();
        let len = |list: &[View], i: usize| list.get(i).map(|v| v.numel);
        let differ = |what: String, a: Option<usize>, b: Option<usize>| match a == b {
            true => None,
            false => Some(format!("{what}: {} vs {} elements", show(a), show(b))),
        };
        let n = all.len();
        for i in 0..n {
            for j in 0..n {
                let found = match first.kind {
                    CollKind::Gather { root } if j == root => differ(
                        format!("rank {i} sends {} but root {root} expects", "its input"),
                        len(&all[i].inputs, 0),
                        len(&all[root].outputs, i),
                    ),
                    CollKind::Scatter { root } if i == root => differ(
                        format!("root {root} sends rank {j} inputs[{j}] but rank {j} expects"),
                        len(&all[root].inputs, j),
                        len(&all[j].outputs, 0),
                    ),
                    CollKind::AllToAll => differ(
                        format!("rank {i} sends rank {j} a chunk but rank {j} expects"),
                        len(&all[i].inputs, j),
                        len(&all[j].outputs, i),
                    ),
                    CollKind::AllGatherV => differ(
                        format!("rank {i}'s input goes to rank {j}'s outputs[{i}]"),
                        len(&all[i].inputs, 0),
                        len(&all[j].outputs, i),
                    ),
                    CollKind::ReduceScatterV(_) => differ(
                        format!("rank {i}'s inputs[{j}] is reduced into rank {j}'s output"),
                        len(&all[i].inputs, j),
                        len(&all[j].outputs, 0),
                    ),
                    _ => None,
                };
                if found.is_some() {
                    return found;
                }
            }
        }
        None
    }

    /// Checks that the parts of a full slot agree; a mismatch sticks the slot and sets every rank's error.
    fn validate_slot(&mut self, group: usize, key: SlotKey) {
        let g = &self.comms.groups[group];
        let Some(slot) = g.slots.get(&key) else { return };
        let parts: Vec<(usize, Part)> = slot.parts.iter().map(|(r, p)| (*r, p.clone())).collect();
        let Some((r0, p0)) = parts.first() else { return };
        let number = g.number;
        let mismatch = match key {
            SlotKey::Coll(k) => parts
                .iter()
                .find(|(_, p)| {
                    let sized = p0.views.is_none() && (p.numel_in != p0.numel_in || p.numel_out != p0.numel_out);
                    p.kind != p0.kind || p.dtype != p0.dtype || p.views.is_some() != p0.views.is_some() || sized
                })
                .map(|(r, p)| {
                    format!(
                        "collective mismatch on communicator {number} at operation {k}: rank {r0} called {} but rank {r} \
                         called {}",
                        p0.describe(),
                        p.describe()
                    )
                }),
            SlotKey::P2p { src, dst, n } => parts
                .iter()
                .find(|(_, p)| p.dtype != p0.dtype || p.numel_in != p0.numel_in)
                .map(|(r, p)| {
                    format!(
                        "point-to-point mismatch on communicator {number} (message {n} from rank {src} to rank {dst}): \
                         rank {r0} called {} but rank {r} called {}",
                        p0.describe(),
                        p.describe()
                    )
                }),
        };
        if let (None, SlotKey::Coll(k)) = (&mismatch, key) {
            // Chunk sizes that disagree between ranks are what NCCL cannot see: the op never completes, with no
            // error, until the watchdog's timeout ends it.
            if let Some(why) = Self::views_mismatch(&parts) {
                let calls = parts.iter().map(|(r, p)| format!("rank {r}: {}", p.describe()));
                let message = format!(
                    "chunk sizes disagree on communicator {number} at operation {k} ({}): {why} ({})",
                    p0.kind.name(),
                    calls.collect::<Vec<_>>().join("; ")
                );
                tracing::error!(target: "pg_mock", "{message}");
                if let Some(slot) = self.comms.groups[group].slots.get_mut(&key) {
                    slot.stuck = Some(message);
                }
                return;
            }
        }
        let Some(message) = mismatch else { return };
        let at = parts.iter().map(|(_, p)| p.enqueue).max().unwrap_or(0);
        tracing::error!(target: "pg_mock", "{message}");
        let g = &mut self.comms.groups[group];
        if let Some(slot) = g.slots.get_mut(&key) {
            slot.stuck = Some(message.clone());
        }
        for rc in &mut g.ranks {
            if rc.error.is_none() {
                rc.error = Some((at, message.clone()));
            }
        }
    }

    /// The host time an abort or a revoke of device `device`'s communicators takes ([`Fault::SlowTeardown`]; the
    /// longest injected, zero without one).
    pub(crate) fn teardown(&self, device: usize) -> std::time::Duration {
        let slow = |f: &Fault| match f {
            Fault::SlowTeardown { rank, duration } if *rank == device => Some(*duration),
            _ => None,
        };
        self.faults.iter().filter_map(slow).max().unwrap_or_default()
    }

    /// What NCCL's ring neighbours of a killed rank see: `rank` of `group` died at `at`, and
    /// [`WorldConfig::peer_loss`](crate::WorldConfig::peer_loss) later the ranks one below and one above it report
    /// the closed connection as an asynchronous remote error (unless an error came first).
    pub(crate) fn lose_peer(&mut self, group: usize, rank: usize, at: Time) {
        let g = &mut self.comms.groups[group];
        let size = g.ranks.len();
        let when = at + crate::clock::ns(self.config.peer_loss);
        let message = format!(
            "NCCL error: remote process exited or there was a network error (ncclRemoteError): connection closed \
             by remote peer rank {rank} of communicator {} (injected fault: rank {rank} killed)",
            g.number
        );
        for neighbour in [(rank + size - 1) % size, (rank + 1) % size] {
            let rc = &mut g.ranks[neighbour];
            if neighbour != rank && rc.error.is_none() {
                rc.error = Some((when, message.clone()));
            }
        }
    }

    /// Applies an injected abort of rank `rank` of `group` once the global time has reached it.
    pub(crate) fn apply_scheduled_abort(&mut self, group: usize, rank: usize) {
        let rc = &self.comms.groups[group].ranks[rank];
        if let Some((time, reason)) = rc.scheduled_abort.clone().filter(|(t, _)| *t <= self.now) {
            if rc.aborted.is_none() {
                self.abort_rank(group, rank, &reason, time);
            }
        }
    }

    /// Aborts rank `rank` of `group` at `time`: its pending operations finish then, without effect.
    pub(crate) fn abort_rank(&mut self, group: usize, rank: usize, reason: &str, time: Time) {
        let g = &mut self.comms.groups[group];
        if g.ranks[rank].aborted.is_some() {
            return;
        }
        g.ranks[rank].aborted = Some(reason.to_owned());
        self.release_rank(group, rank, time);
    }

    /// Revokes rank `rank` of `group` at `time` (NCCL's `ncclCommRevoke`): its pending operations finish then,
    /// without effect; it stays a communicator that can be shrunk or split, on which nothing else may run.
    pub(crate) fn revoke_rank(&mut self, group: usize, rank: usize, reason: &str, time: Time) {
        let rc = &mut self.comms.groups[group].ranks[rank];
        if rc.revoked.is_some() || rc.aborted.is_some() {
            return;
        }
        rc.revoked = Some(reason.to_owned());
        self.release_rank(group, rank, time);
    }

    /// Takes rank `rank`'s parts out of `group`'s pending operations: they finish at `time`, without effect.
    fn release_rank(&mut self, group: usize, rank: usize, time: Time) {
        let g = &mut self.comms.groups[group];
        let mut released = Vec::new();
        g.slots.retain(|_, slot| {
            if let Some(part) = slot.parts.remove(&rank) {
                released.push(part.op);
            }
            !slot.parts.is_empty()
        });
        for op in released {
            if let Some(o) = self.streams[op.stream].ops.get_mut(&op.seq) {
                if let OpKind::Comm { abort_at, .. } = &mut o.kind {
                    *abort_at = Some(time);
                }
            }
            self.active.insert(op.stream);
        }
        self.resolve();
    }

    /// What a slot waits for, for deadlock reports.
    pub(crate) fn slot_status(&self, group: usize, key: SlotKey) -> String {
        let g = &self.comms.groups[group];
        let number = g.number;
        let Some(slot) = g.slots.get(&key) else { return format!("communicator {number}: aborted") };
        let what = match key {
            SlotKey::Coll(k) => format!("operation {k} on communicator {number}"),
            SlotKey::P2p { src, dst, n } => {
                format!("message {n} from rank {src} to rank {dst} on communicator {number}")
            }
        };
        if let Some(why) = &slot.stuck {
            return format!("{what} never completes: {why}");
        }
        let expected: Vec<usize> = match key {
            SlotKey::Coll(_) => (0..g.size).collect(),
            SlotKey::P2p { src, dst, .. } => vec![src, dst],
        };
        let missing: Vec<usize> = expected.into_iter().filter(|r| !slot.parts.contains_key(r)).collect();
        if missing.is_empty() {
            format!("{what} waits for the other ranks' streams to reach it")
        } else {
            format!("{what} waits for rank(s) {} to enqueue their part", join_ranks(missing.into_iter()))
        }
    }

    /// The number messages give communicator group `group`.
    pub(crate) fn comm_number(&self, group: usize) -> u64 {
        self.comms.groups[group].number
    }

    /// Which ranks a communicator still waits for, for reports.
    pub(crate) fn comm_status(&self, group: usize) -> String {
        let g = &self.comms.groups[group];
        let missing = join_ranks(g.ranks.iter().enumerate().filter(|(_, r)| r.joined.is_none()).map(|(i, _)| i));
        format!("communicator {} ('{}') waits for rank(s) {missing} to join", g.number, g.description)
    }

    /// Which ranks a split still waits for, for reports.
    pub(crate) fn split_status(&self, group: usize, n: u64) -> String {
        let g = &self.comms.groups[group];
        let asked = self.comms.splits.get(&(group, n)).map(|round| &round.asked);
        let missing = join_ranks((0..g.size).filter(|rank| asked.is_none_or(|a| !a.contains_key(rank))));
        format!("split {n} of communicator {} waits for rank(s) {missing} to call it", g.number)
    }

    /// Which ranks a shrink still waits for, for reports.
    pub(crate) fn shrink_status(&self, key: &ShrinkKey) -> String {
        let (group, excluded, n) = key;
        let g = &self.comms.groups[*group];
        let round = self.comms.shrinks.get(key);
        let missing =
            (0..g.size).filter(|rank| !excluded.contains(rank) && round.is_none_or(|r| !r.asked.contains(rank)));
        format!(
            "shrink {n} excluding {excluded:?} of communicator {} waits for rank(s) {} to call it",
            g.number,
            join_ranks(missing)
        )
    }

    /// Records `rank`'s part of the next shrink of `group` that excludes `excluded` (ascending); the last rank not
    /// excluded to call makes the child, its ranks the others in order.
    fn shrink_part(&mut self, group: usize, rank: usize, excluded: &[usize], time: Time) -> Result<ShrinkKey> {
        let counter = self.comms.groups[group].ranks[rank].shrinks.entry(excluded.to_vec()).or_default();
        let key: ShrinkKey = (group, excluded.to_vec(), *counter);
        *counter += 1;
        let size = self.comms.groups[group].size;
        let description = self.comms.groups[group].description.clone();
        let round = self.comms.shrinks.entry(key.clone()).or_default();
        round.asked.insert(rank);
        // The child is made at the latest caller's time, whichever caller came last in real time.
        round.latest = round.latest.max(time);
        let time = round.latest;
        if round.asked.len() + excluded.len() < size {
            return Ok(key);
        }
        let members: Vec<usize> = (0..size).filter(|r| !excluded.contains(r)).collect();
        let id = self.comms.new_unique_id();
        let description = format!("{description} shrink {} excluding {excluded:?}", key.2);
        let mut children = HashMap::new();
        for (child_rank, &parent_rank) in members.iter().enumerate() {
            let device = self.comms.groups[group].ranks[parent_rank].device.unwrap_or(usize::MAX);
            let (child, _) = self.join_comm(&id, members.len(), child_rank, device, time, &description)?;
            children.insert(parent_rank, (child, child_rank, members.len()));
        }
        let round = self.comms.shrinks.get_mut(&key).expect("inserted above");
        round.children = children;
        round.done = Some(time + crate::clock::ns(self.config.comm_init));
        Ok(key)
    }

    /// Records `rank`'s part of split `n` of `group`; the last rank to call makes the children (one per color,
    /// its ranks ordered by key, then by parent rank), each a communicator of its own joined by its members.
    fn split_part(&mut self, group: usize, rank: usize, part: (Option<u32>, usize, usize), time: Time) -> Result<u64> {
        let rc = &mut self.comms.groups[group].ranks[rank];
        let n = rc.splits;
        rc.splits += 1;
        let size = self.comms.groups[group].size;
        let description = self.comms.groups[group].description.clone();
        let round = self.comms.splits.entry((group, n)).or_default();
        round.asked.insert(rank, part);
        // The children are made at the latest caller's time, whichever caller came last in real time.
        round.latest = round.latest.max(time);
        let time = round.latest;
        if round.asked.len() < size {
            return Ok(n);
        }
        let mut by_color: BTreeMap<u32, Vec<(usize, usize, usize)>> = BTreeMap::new();
        for (&parent_rank, &(color, key, device)) in &round.asked {
            if let Some(color) = color {
                by_color.entry(color).or_default().push((key, parent_rank, device));
            }
        }
        let mut children = std::collections::HashMap::new();
        for (color, mut members) in by_color {
            members.sort_unstable();
            let id = self.comms.new_unique_id();
            let description = format!("{description} split {n} color {color}");
            for (child_rank, &(_, parent_rank, device)) in members.iter().enumerate() {
                let (child, _) = self.join_comm(&id, members.len(), child_rank, device, time, &description)?;
                children.insert(parent_rank, (child, child_rank, members.len()));
            }
        }
        let round = self.comms.splits.get_mut(&(group, n)).expect("inserted above");
        round.children = children;
        round.done = Some(time + crate::clock::ns(self.config.comm_init));
        Ok(n)
    }

    /// Joins `rank` (on `device`) to the communicator with `id`; returns the group index.
    pub(crate) fn join_comm(
        &mut self,
        id: &[u8],
        size: usize,
        rank: usize,
        device: usize,
        time: Time,
        description: &str,
    ) -> Result<(usize, bool)> {
        let group = match self.comms.by_id.get(id) {
            Some(g) => *g,
            None => {
                let index = self.comms.groups.len();
                let number = match id.get(..16) {
                    Some(head) if head.starts_with(b"pg-mock\0") => {
                        let counter = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
                        counter.saturating_sub(1)
                    }
                    _ => u64::try_from(index).unwrap_or(u64::MAX),
                };
                self.comms.groups.push(CommGroup {
                    number,
                    size,
                    description: description.to_owned(),
                    ready_time: None,
                    ranks: (0..size).map(|_| RankComm::default()).collect(),
                    slots: BTreeMap::new(),
                });
                self.comms.by_id.insert(id.to_vec(), index);
                index
            }
        };
        let g = &mut self.comms.groups[group];
        if g.size != size {
            return Err(Error::invalid(format!(
                "create_communicator: rank {rank} joined with size {size}, but the communicator has size {}",
                g.size
            )));
        }
        if g.ranks[rank].device.is_some() {
            return Err(Error::invalid(format!("create_communicator: rank {rank} already joined this communicator")));
        }
        g.ranks[rank].device = Some(device);
        let never = self.faults.iter().any(|f| matches!(f, Fault::NeverJoin { rank: r } if *r == device));
        self.comms.created += 1;
        let g = &mut self.comms.groups[group];
        if !never {
            g.ranks[rank].joined = Some(time);
            if g.ranks.iter().all(|r| r.joined.is_some()) {
                let last = g.ranks.iter().filter_map(|r| r.joined).max().unwrap_or(0);
                g.ready_time = Some(last + crate::clock::ns(self.config.comm_init));
            }
        }
        tracing::debug!(target: "pg_mock", communicator = g.number, rank, size, device, "communicator created");
        if self.faults.iter().any(|f| matches!(f, Fault::AsyncError { rank: r, after_ops: 0 } if *r == device)) {
            g.ranks[rank].error =
                Some((time, format!("NCCL error: unhandled system error (injected fault: rank {rank})")));
        }
        Ok((group, never))
    }
}

/// What one rank's part holds: dtype, element counts, blocks and views.
#[derive(Clone)]
struct Shape {
    dtype: pg_core::DType,
    /// Input and output elements (totals over the views of a list op).
    numel: (usize, usize),
    /// The input and output blocks (the first views' for a list op; `u64::MAX` for none).
    blocks: (u64, u64),
    views: Option<Arc<Views>>,
    /// This rank's `PREMUL_SUM` factor, if the op is one.
    scale: Option<Scale>,
}

/// A simulated communicator: one rank's handle.
pub struct MockCommunicator {
    pub(crate) inner: Arc<Inner>,
    pub(crate) group: usize,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: usize,
}

impl fmt::Debug for MockCommunicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockCommunicator")
            .field("group", &self.group)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .finish()
    }
}

impl MockCommunicator {
    /// The communicator's number in its world, as messages name it (the counter of its mock unique id, from 0).
    pub fn number(&self) -> u64 {
        self.inner.lock().comms.groups[self.group].number
    }

    fn check_buffer(&self, buffer: &MockBuffer, what: &str) -> Result<()> {
        if !Arc::ptr_eq(buffer.inner(), &self.inner) {
            return Err(Error::invalid(format!("{what}: the buffer belongs to another simulated world")));
        }
        args::on_device(what, buffer, self.device)
    }

    /// A list (`which`) with one whole buffer per rank.
    fn per_rank<'a>(
        &self,
        list: &'a [MockBuffer],
        what: &str,
        which: &str,
    ) -> Result<Vec<(&'a MockBuffer, usize, usize)>> {
        args::per_rank(what, which, list.len(), self.size)?;
        Ok(list.iter().map(whole).collect())
    }

    /// Gather's outputs or scatter's inputs (`which`): one whole buffer per rank like `like` on the root, none
    /// elsewhere.
    fn root_list<'a>(
        &self,
        list: &'a [MockBuffer],
        root: usize,
        (what, which): (&str, &str),
        like: &MockBuffer,
    ) -> Result<Vec<(&'a MockBuffer, usize, usize)>> {
        args::rank_in_range(what, "root", root, self.size)?;
        args::root_list(what, which, list, (root, self.rank, self.size), like)?;
        Ok(list.iter().map(whole).collect())
    }

    /// Enqueues this rank's part of an operation on one input and one output buffer; `modes` says whether the
    /// part reads the input and writes the output.
    fn enqueue(
        &self,
        kind: CollKind,
        input: &MockBuffer,
        output: &MockBuffer,
        stream: &MockStream,
        modes: (bool, bool),
    ) -> Result<()> {
        self.enqueue_scaled(kind, input, output, None, stream, modes)
    }

    /// Enqueues this rank's part of an operation, with the device `PREMUL_SUM` factor it reads, if any. A host
    /// factor leaves the reduction's kind as `PREMUL_SUM` with a placeholder factor of 1, so that ranks with
    /// different factors still match, and travels in the part.
    fn enqueue_scaled(
        &self,
        kind: CollKind,
        input: &MockBuffer,
        output: &MockBuffer,
        scalar: Option<&MockBuffer>,
        stream: &MockStream,
        modes: (bool, bool),
    ) -> Result<()> {
        let name = kind.name();
        self.check_buffer(input, name)?;
        self.check_buffer(output, name)?;
        let mut accesses = Vec::with_capacity(3);
        if modes.0 {
            accesses.push((input, Mode::Read));
        }
        if let Some(scalar) = scalar {
            self.check_buffer(scalar, name)?;
            accesses.push((scalar, Mode::Read));
        }
        if modes.1 {
            accesses.push((output, Mode::Write));
        }
        let (kind, scale) = match (kind, scalar) {
            (_, Some(scalar)) => (kind, Some(Scale::Device(scalar.block()))),
            (CollKind::AllReduce(ReduceOp::PreMulSum(f)), None) => {
                (CollKind::AllReduce(ReduceOp::PreMulSum(1.0)), Some(Scale::Host(f)))
            }
            (CollKind::ReduceScatter(ReduceOp::PreMulSum(f)), None) => {
                (CollKind::ReduceScatter(ReduceOp::PreMulSum(1.0)), Some(Scale::Host(f)))
            }
            (kind, None) => (kind, None),
        };
        let shape = Shape {
            dtype: input.dtype(),
            numel: (input.numel(), output.numel()),
            blocks: (input.block(), output.block()),
            views: None,
            scale,
        };
        self.enqueue_part(kind, shape, &accesses, stream)
    }

    /// Enqueues this rank's part of an operation over chunks (`(buffer, first element, elements)`) of buffers:
    /// it reads every input chunk and writes every output chunk.
    fn enqueue_views(
        &self,
        kind: CollKind,
        dtype: pg_core::DType,
        inputs: &[(&MockBuffer, usize, usize)],
        outputs: &[(&MockBuffer, usize, usize)],
        stream: &MockStream,
    ) -> Result<()> {
        let name = kind.name();
        let mut accesses = Vec::with_capacity(inputs.len() + outputs.len());
        for (list, mode) in [(inputs, Mode::Read), (outputs, Mode::Write)] {
            for &(buffer, offset, numel) in list {
                self.check_buffer(buffer, name)?;
                args::same_dtype(name, dtype, buffer.dtype())?;
                args::chunk_inside(name, offset, numel, buffer.numel())?;
                accesses.push((buffer, mode));
            }
        }
        let view =
            |&(buffer, offset, numel): &(&MockBuffer, usize, usize)| View { block: buffer.block(), offset, numel };
        let views = Views { inputs: inputs.iter().map(view).collect(), outputs: outputs.iter().map(view).collect() };
        let total = |list: &[View]| list.iter().map(|v| v.numel).sum::<usize>();
        let first_block = |list: &[View]| list.first().map_or(u64::MAX, |v| v.block);
        let shape = Shape {
            dtype,
            numel: (total(&views.inputs), total(&views.outputs)),
            blocks: (first_block(&views.inputs), first_block(&views.outputs)),
            views: Some(Arc::new(views)),
            scale: None,
        };
        self.enqueue_part(kind, shape, &accesses, stream)
    }

    /// Enqueues this rank's part: the hazard detector sees every access, then the part joins its slot.
    fn enqueue_part(
        &self,
        kind: CollKind,
        shape: Shape,
        accesses: &[(&MockBuffer, Mode)],
        stream: &MockStream,
    ) -> Result<()> {
        let name = kind.name();
        let tid = self.inner.require(name);
        stream.check(&self.inner, self.device, name)?;
        let cost = self.inner.config.host.collective_enqueue;
        let mut captures = self.inner.captures();
        if captures.is_capturing(stream.index) {
            // Recorded, not run: a launch of the graph issues the part again, matched with the other ranks'
            // parts in order like any collective.
            let comm = MockCommunicator { inner: Arc::clone(&self.inner), ..*self };
            let weak: Vec<(WeakBuffer, Mode)> = accesses.iter().map(|&(b, mode)| (WeakBuffer::new(b), mode)).collect();
            let replay = move |index: usize| -> Result<()> {
                let buffers =
                    weak.iter().map(|(w, mode)| w.get(name).map(|b| (b, *mode))).collect::<Result<Vec<_>>>()?;
                let accesses: Vec<(&MockBuffer, Mode)> = buffers.iter().map(|(b, mode)| (b, *mode)).collect();
                comm.enqueue_part(kind, shape.clone(), &accesses, &MockStream::at(&comm.inner, index))
            };
            captures.record_op(stream.index, name, Box::new(replay));
            drop(captures);
            self.inner.with(|st| st.charge(Some(tid), cost));
            return Ok(());
        }
        drop(captures);
        self.inner.with(|st| {
            st.apply_scheduled_abort(self.group, self.rank);
            let g = &st.comms.groups[self.group];
            if let Some(reason) = &g.ranks[self.rank].aborted {
                return Err(Error::Aborted { reason: format!("{name} on an aborted communicator: {reason}") });
            }
            if let Some(reason) = &g.ranks[self.rank].revoked {
                return Err(Error::Revoked { reason: format!("{name} on a revoked communicator: {reason}") });
            }
            if g.ranks[self.rank].finalized {
                return Err(Error::Aborted {
                    reason: format!("{name} on a finalized communicator (its group was shut down)"),
                });
            }
            if g.ranks[self.rank].joined.is_none() {
                return Err(Error::communicator(format!(
                    "{name}: this rank never joined communicator {} (injected fault)",
                    g.number
                )));
            }
            let slow: std::time::Duration = st
                .faults
                .iter()
                .filter_map(|f| match f {
                    Fault::SlowRank { rank, extra } if *rank == self.device => Some(*extra),
                    _ => None,
                })
                .sum();
            st.charge(Some(tid), cost + slow);
            let rc = &mut st.comms.groups[self.group].ranks[self.rank];
            let key = match kind {
                CollKind::Send { peer } => {
                    let n = rc.sent.entry(peer).or_default();
                    *n += 1;
                    SlotKey::P2p { src: self.rank, dst: peer, n: *n - 1 }
                }
                CollKind::Recv { peer } => {
                    let n = rc.received.entry(peer).or_default();
                    *n += 1;
                    SlotKey::P2p { src: peer, dst: self.rank, n: *n - 1 }
                }
                _ => {
                    rc.next_coll += 1;
                    SlotKey::Coll(rc.next_coll - 1)
                }
            };
            let op_index = rc.next_coll + rc.sent.values().sum::<u64>() + rc.received.values().sum::<u64>() - 1;
            let number = st.comms.groups[self.group].number;
            let label = match key {
                SlotKey::Coll(k) => format!("{name} (op {k} on communicator {number})"),
                SlotKey::P2p { src, dst, n } => {
                    format!("{name} (message {n} from rank {src} to rank {dst} on communicator {number})")
                }
            };
            let clock = st.launch_clock(Some(tid), stream.index);
            let s = &st.streams[stream.index];
            let mut who = Accessor {
                actor: stream.index,
                clock,
                device: self.device,
                buffer: 0,
                stream_id: s.id,
                op: label,
                collective: true,
                at: st.local(Some(tid)),
            };
            for &(buffer, mode) in accesses {
                who.buffer = buffer.id();
                st.access(buffer.block(), mode, &who);
            }
            let op = st.enqueue(
                Some(tid),
                stream.index,
                OpKind::Comm { group: self.group, slot: key, abort_at: None },
                name,
                None,
            );
            st.comms.groups[self.group].ranks[self.rank].last_ops.insert(op.stream, op.seq);
            let part = Part {
                op,
                kind,
                dtype: shape.dtype,
                numel_in: shape.numel.0,
                numel_out: shape.numel.1,
                input: shape.blocks.0,
                output: shape.blocks.1,
                enqueue: st.local(Some(tid)),
                views: shape.views.clone(),
                scale: shape.scale,
            };
            let hang = st.faults.iter().find_map(|f| match f {
                Fault::HangAt { rank, op } if *rank == self.device && *op == op_index => {
                    Some(format!("injected fault: rank {rank} hangs at operation {op}"))
                }
                Fault::AsyncError { rank, after_ops } if *rank == self.device && *after_ops <= op_index => {
                    Some(format!("injected fault: rank {rank}'s communicator failed after {after_ops} operations"))
                }
                _ => None,
            });
            let abort_during = st.faults.iter().find_map(|f| match f {
                Fault::AbortDuringOp { rank, op, after } if *rank == self.device && *op == op_index => {
                    Some((*after, "aborted"))
                }
                Fault::KillAt { rank, op } if *rank == self.device && *op == op_index => {
                    Some((std::time::Duration::ZERO, "killed"))
                }
                _ => None,
            });
            if abort_during.is_some_and(|(_, how)| how == "killed") {
                // A process dies once: a replacement on the same device runs on.
                st.faults.retain(|f| !matches!(f, Fault::KillAt { rank, .. } if *rank == self.device));
                st.lose_peer(self.group, self.rank, part.enqueue);
                crate::store::kill_process(st, tid, self.device, part.enqueue);
            }
            let hang = match abort_during {
                Some((after, how)) => {
                    let at = part.enqueue + crate::clock::ns(after);
                    let reason = format!("injected fault: rank {} {how} during operation {op_index}", self.device);
                    st.comms.groups[self.group].ranks[self.rank].scheduled_abort.get_or_insert((at, reason.clone()));
                    if let Some(o) = st.streams[op.stream].ops.get_mut(&op.seq) {
                        if let OpKind::Comm { abort_at, .. } = &mut o.kind {
                            *abort_at = Some(at);
                        }
                    }
                    Some(reason)
                }
                None => hang,
            };
            let expected = st.expected_parts(self.group, key);
            let slot = st.comms.groups[self.group].slots.entry(key).or_default();
            slot.parts.insert(self.rank, part);
            if let Some(why) = hang {
                slot.stuck.get_or_insert(why);
            }
            if slot.parts.len() == expected {
                st.validate_slot(self.group, key);
            }
            st.resolve();
            Ok(())
        })?;
        self.inner.throttle(tid, stream.index);
        Ok(())
    }
}

impl pg_core::Communicator for MockCommunicator {
    type B = Mock;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(&self, input: &MockBuffer, output: &MockBuffer, op: ReduceOp, stream: &MockStream) -> Result<()> {
        args::scaled("all_reduce", input, output, (1, 1), self.size)?;
        op.check(input.dtype())?;
        self.enqueue(CollKind::AllReduce(op), input, output, stream, (true, true))
    }

    fn all_reduce_pre_mul_sum(
        &self,
        input: &MockBuffer,
        output: &MockBuffer,
        scalar: &MockBuffer,
        stream: &MockStream,
    ) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::DevicePreMulSum, "all_reduce_pre_mul_sum")?;
        args::scaled("all_reduce", input, output, (1, 1), self.size)?;
        args::pre_mul_sum_factor("all_reduce", input, scalar)?;
        let kind = CollKind::AllReduce(ReduceOp::PreMulSum(1.0));
        self.enqueue_scaled(kind, input, output, Some(scalar), stream, (true, true))
    }

    fn split(&self, color: Option<u32>, key: usize, config: &CommConfig) -> Result<Option<MockCommunicator>> {
        self.inner.require_capability(pg_core::Capability::Split, "split")?;
        let tid = self.inner.require("split");
        let mut state = self.inner.lock();
        state.apply_scheduled_abort(self.group, self.rank);
        if let Some(reason) = &state.comms.groups[self.group].ranks[self.rank].aborted {
            return Err(Error::Aborted { reason: format!("split of an aborted communicator: {reason}") });
        }
        let time = state.local(Some(tid));
        let n = state.split_part(self.group, self.rank, (color, key, self.device), time)?;
        let what = format!("splitting communicator {} (split {n}, color {color:?})", state.comm_number(self.group));
        let deadline = config.timeout.map(|timeout| time.saturating_add(ns(timeout)));
        let (mut state, woke) = self.inner.park(state, tid, Cond::SplitDone(self.group, n), deadline, None, what);
        if woke == Wake::Deadline {
            // Not every rank called in time: this rank leaves the split as NCCL does, by aborting the parent.
            let waiting = state.split_status(self.group, n);
            let time = state.local(Some(tid));
            state.abort_rank(self.group, self.rank, "a split of this communicator timed out", time);
            self.inner.raise(state);
            return Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout: config.timeout.unwrap_or_default(),
                what: format!("{waiting}; the parent communicator was aborted"),
            });
        }
        let child = state.comms.splits.get(&(self.group, n)).and_then(|round| round.children.get(&self.rank).copied());
        self.inner.raise(state);
        Ok(child.map(|(group, rank, size)| MockCommunicator {
            inner: Arc::clone(&self.inner),
            group,
            rank,
            size,
            device: self.device,
        }))
    }

    fn shrink(&self, excluded: &[usize], mode: pg_core::ShrinkMode, config: &CommConfig) -> Result<MockCommunicator> {
        self.inner.require_capability(pg_core::Capability::Shrink, "shrink")?;
        let sorted = pg_core::ShrinkMode::checked_exclusion(excluded, self.size, self.rank)?;
        let tid = self.inner.require("shrink");
        let mut state = self.inner.lock();
        state.apply_scheduled_abort(self.group, self.rank);
        let time = state.local(Some(tid));
        let rc = &state.comms.groups[self.group].ranks[self.rank];
        if let Some(reason) = &rc.aborted {
            return Err(Error::Aborted { reason: format!("shrink of an aborted communicator: {reason}") });
        }
        if rc.finalized {
            return Err(Error::Aborted { reason: "shrink of a finalized communicator".to_owned() });
        }
        if let Some((_, message)) = rc.error.as_ref().filter(|(at, _)| *at <= state.now) {
            // As NCCL's: a communicator that lost a peer's connection (or failed otherwise) cannot be shrunk.
            return Err(Error::communicator(format!("ncclCommShrink failed: {message}")));
        }
        if rc.revoked.is_none() {
            match mode {
                pg_core::ShrinkMode::Abort => {
                    let reason = "the communicator was shrunk with NCCL_SHRINK_ABORT";
                    state.revoke_rank(self.group, self.rank, reason, time);
                }
                pg_core::ShrinkMode::Default => {
                    // NCCL's default shrink waits for the parent's ops; one that never ends would hang it.
                    let pending =
                        state.comms.groups[self.group].slots.values().any(|s| s.parts.contains_key(&self.rank));
                    if pending {
                        return Err(Error::invalid(
                            "shrink: the communicator has ops in flight; revoke it first, or shrink with \
                             ShrinkMode::Abort",
                        ));
                    }
                }
            }
        }
        let key = state.shrink_part(self.group, self.rank, &sorted, time)?;
        let what = format!("shrinking communicator {} ({key:?})", state.comm_number(self.group));
        let deadline = config.timeout.map(|timeout| time.saturating_add(ns(timeout)));
        let (mut state, woke) = self.inner.park(state, tid, Cond::ShrinkDone(key.clone()), deadline, None, what);
        if woke == Wake::Deadline {
            // Not every survivor called in time: this rank leaves the shrink as NCCL does, by aborting the parent.
            let waiting = state.shrink_status(&key);
            let time = state.local(Some(tid));
            state.abort_rank(self.group, self.rank, "a shrink of this communicator timed out", time);
            self.inner.raise(state);
            return Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout: config.timeout.unwrap_or_default(),
                what: format!("{waiting}; the parent communicator was aborted"),
            });
        }
        let round = state.comms.shrinks.get(&key);
        let child = round.and_then(|r| r.children.get(&self.rank).copied());
        self.inner.raise(state);
        let (group, rank, size) =
            child.ok_or_else(|| Error::Backend("shrink: the shrink ended without a child for this rank".to_owned()))?;
        Ok(MockCommunicator { inner: Arc::clone(&self.inner), group, rank, size, device: self.device })
    }

    fn grow_unique_id(&self) -> Result<UniqueId> {
        self.native_grow("grow_unique_id")?;
        self.grow_id()
    }

    fn grow(&self, added: usize, id: Option<&UniqueId>, config: &CommConfig) -> Result<MockCommunicator> {
        self.native_grow("grow")?;
        self.grow_to(added, id, config)
    }

    fn revoke(&self, reason: &str) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::Revoke, "revoke")?;
        let tid = self.inner.current();
        self.inner.with(|st| {
            let time = st.local(tid);
            tracing::info!(target: "pg_mock", group = self.group, rank = self.rank, reason, "communicator revoked");
            st.revoke_rank(self.group, self.rank, reason, time);
            let teardown = st.teardown(self.device);
            st.charge(tid, teardown);
            Ok(())
        })
    }

    fn is_revoked(&self) -> bool {
        self.inner.lock().comms.groups[self.group].ranks[self.rank].revoked.is_some()
    }

    fn broadcast(&self, input: &MockBuffer, output: &MockBuffer, root: usize, stream: &MockStream) -> Result<()> {
        args::scaled("broadcast", input, output, (1, 1), self.size)?;
        args::rank_in_range("broadcast", "root", root, self.size)?;
        self.enqueue(CollKind::Broadcast { root }, input, output, stream, (self.rank == root, true))
    }

    fn all_gather(&self, input: &MockBuffer, output: &MockBuffer, stream: &MockStream) -> Result<()> {
        args::scaled("all_gather", input, output, (self.size, 1), self.size)?;
        self.enqueue(CollKind::AllGather, input, output, stream, (true, true))
    }

    fn reduce_scatter(&self, input: &MockBuffer, output: &MockBuffer, op: ReduceOp, stream: &MockStream) -> Result<()> {
        args::scaled("reduce_scatter", input, output, (1, self.size), self.size)?;
        op.check(input.dtype())?;
        self.enqueue(CollKind::ReduceScatter(op), input, output, stream, (true, true))
    }

    fn reduce_scatter_pre_mul_sum(
        &self,
        input: &MockBuffer,
        output: &MockBuffer,
        scalar: &MockBuffer,
        stream: &MockStream,
    ) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::DevicePreMulSum, "reduce_scatter_pre_mul_sum")?;
        args::scaled("reduce_scatter", input, output, (1, self.size), self.size)?;
        args::pre_mul_sum_factor("reduce_scatter", input, scalar)?;
        let kind = CollKind::ReduceScatter(ReduceOp::PreMulSum(1.0));
        self.enqueue_scaled(kind, input, output, Some(scalar), stream, (true, true))
    }

    fn send(&self, buffer: &MockBuffer, peer: usize, stream: &MockStream) -> Result<()> {
        args::peer("send", peer, self.rank, self.size)?;
        self.enqueue(CollKind::Send { peer }, buffer, buffer, stream, (true, false))
    }

    fn recv(&self, buffer: &MockBuffer, peer: usize, stream: &MockStream) -> Result<()> {
        args::peer("recv", peer, self.rank, self.size)?;
        self.enqueue(CollKind::Recv { peer }, buffer, buffer, stream, (false, true))
    }

    fn reduce(
        &self,
        input: &MockBuffer,
        output: &MockBuffer,
        root: usize,
        op: ReduceOp,
        stream: &MockStream,
    ) -> Result<()> {
        args::scaled("reduce", input, output, (1, 1), self.size)?;
        args::rank_in_range("reduce", "root", root, self.size)?;
        op.check(input.dtype())?;
        self.enqueue(CollKind::Reduce { root, op }, input, output, stream, (true, self.rank == root))
    }

    fn gather(&self, input: &MockBuffer, outputs: &[MockBuffer], root: usize, stream: &MockStream) -> Result<()> {
        let outputs = self.root_list(outputs, root, ("gather", "outputs"), input)?;
        self.enqueue_views(CollKind::Gather { root }, input.dtype(), &[whole(input)], &outputs, stream)
    }

    fn scatter(&self, inputs: &[MockBuffer], output: &MockBuffer, root: usize, stream: &MockStream) -> Result<()> {
        let inputs = self.root_list(inputs, root, ("scatter", "inputs"), output)?;
        self.enqueue_views(CollKind::Scatter { root }, output.dtype(), &inputs, &[whole(output)], stream)
    }

    fn all_to_all_single(
        &self,
        input: &MockBuffer,
        output: &MockBuffer,
        input_splits: &[usize],
        output_splits: &[usize],
        stream: &MockStream,
    ) -> Result<()> {
        let chunks = |buffer, splits: &[usize], which: &str| -> Result<Vec<(&MockBuffer, usize, usize)>> {
            args::split_count("all_to_all_single", which, splits.len(), self.size)?;
            let mut offset = 0usize;
            let mut list = Vec::with_capacity(splits.len());
            for &numel in splits {
                list.push((buffer, offset, numel));
                offset = offset.saturating_add(numel);
            }
            Ok(list)
        };
        let inputs = chunks(input, input_splits, "input")?;
        let outputs = chunks(output, output_splits, "output")?;
        self.enqueue_views(CollKind::AllToAll, input.dtype(), &inputs, &outputs, stream)
    }

    fn all_to_all(&self, inputs: &[MockBuffer], outputs: &[MockBuffer], stream: &MockStream) -> Result<()> {
        let inputs = self.per_rank(inputs, "all_to_all", "inputs")?;
        let outputs = self.per_rank(outputs, "all_to_all", "outputs")?;
        let dtype = inputs.first().map_or(pg_core::DType::F32, |(b, _, _)| b.dtype());
        self.enqueue_views(CollKind::AllToAll, dtype, &inputs, &outputs, stream)
    }

    fn all_gather_v(&self, input: &MockBuffer, outputs: &[MockBuffer], stream: &MockStream) -> Result<()> {
        let outputs = self.per_rank(outputs, "all_gather_v", "outputs")?;
        self.enqueue_views(CollKind::AllGatherV, input.dtype(), &[whole(input)], &outputs, stream)
    }

    fn reduce_scatter_v(
        &self,
        inputs: &[MockBuffer],
        output: &MockBuffer,
        op: ReduceOp,
        stream: &MockStream,
    ) -> Result<()> {
        op.check(output.dtype())?;
        let inputs = self.per_rank(inputs, "reduce_scatter_v", "inputs")?;
        self.enqueue_views(CollKind::ReduceScatterV(op), output.dtype(), &inputs, &[whole(output)], stream)
    }

    /// Nothing to open: the simulated backend has no groups, and the process group issues a batch in an order every
    /// rank agrees on, so it runs without one.
    fn group_start(&self) -> Result<()> {
        Ok(())
    }

    /// Nothing to close (see [`pg_core::Communicator::group_start`] here).
    fn group_end(&self) -> Result<()> {
        Ok(())
    }

    fn is_ready(&self) -> Result<bool> {
        let tid = self.inner.current();
        let cost = self.inner.config.host.query;
        self.inner.with(|st| {
            st.charge(tid, cost);
            st.apply_scheduled_abort(self.group, self.rank);
            let g = &st.comms.groups[self.group];
            if let Some(reason) = &g.ranks[self.rank].aborted {
                return Err(Error::Aborted { reason: reason.clone() });
            }
            Ok(g.ready_time.is_some_and(|t| t <= st.now))
        })
    }

    fn async_error(&self) -> Result<()> {
        let tid = self.inner.current();
        let cost = self.inner.config.host.query;
        self.inner.with(|st| {
            st.charge(tid, cost);
            st.apply_scheduled_abort(self.group, self.rank);
            let rc = &st.comms.groups[self.group].ranks[self.rank];
            match &rc.error {
                Some((t, message)) if *t <= st.now && rc.aborted.is_none() && rc.revoked.is_none() => {
                    Err(Error::communicator(message.clone()))
                }
                _ => Ok(()),
            }
        })
    }

    fn abort(&self, reason: &str) -> Result<()> {
        let tid = self.inner.current();
        self.inner.with(|st| {
            let time = st.local(tid);
            tracing::info!(target: "pg_mock", group = self.group, rank = self.rank, reason, "communicator aborted");
            st.abort_rank(self.group, self.rank, reason, time);
            let teardown = st.teardown(self.device);
            st.charge(tid, teardown);
            Ok(())
        })
    }

    fn is_aborted(&self) -> bool {
        let mut state = self.inner.lock();
        state.apply_scheduled_abort(self.group, self.rank);
        state.comms.groups[self.group].ranks[self.rank].aborted.is_some()
    }

    fn finalize(&self) -> Result<()> {
        let tid = self.inner.require("Communicator::finalize");
        let mut state = self.inner.lock();
        if let Some(reason) = state.comms.groups[self.group].ranks[self.rank].revoked.clone() {
            // NCCL answers ncclInvalidUsage: a revoked communicator's ops were stopped, there is nothing to flush.
            self.inner.release(state);
            return Err(Error::Revoked {
                reason: format!(
                    "finalize after revoke is invalid (NCCL: ncclInvalidUsage); destroy it instead: {reason}"
                ),
            });
        }
        let mut pending: Vec<OpRef> = state.comms.groups[self.group].ranks[self.rank]
            .last_ops
            .iter()
            .map(|(stream, seq)| OpRef { stream: *stream, seq: *seq })
            .collect();
        pending.sort();
        if !pending.is_empty() {
            for op in &pending {
                state.pin(*op);
            }
            let number = state.comms.groups[self.group].number;
            let what = format!("finalizing rank {} of communicator {number}", self.rank);
            let (s, _) = self.inner.park(state, tid, Cond::OpsDone(pending.clone()), None, None, what);
            state = s;
            for op in &pending {
                state.unpin(*op);
            }
        }
        state.comms.groups[self.group].ranks[self.rank].finalized = true;
        self.inner.raise(state);
        Ok(())
    }

    fn is_finalized(&self) -> bool {
        self.inner.lock().comms.groups[self.group].ranks[self.rank].finalized
    }
}

/// A whole buffer as a chunk.
fn whole(buffer: &MockBuffer) -> (&MockBuffer, usize, usize) {
    (buffer, 0, buffer.numel())
}

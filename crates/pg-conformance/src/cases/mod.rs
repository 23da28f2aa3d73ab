//! The cases, by concern: the stream/event/Work/cache semantics, each op's results and bad-input errors, the
//! group's life cycle and error paths, and awaiting Work from async code.

pub(crate) mod capture;
pub(crate) mod collectives;
pub(crate) mod dtypes;
pub(crate) mod interop;
pub(crate) mod lifecycle;
pub(crate) mod ops;
pub(crate) mod recovery;
pub(crate) mod semantics;
pub(crate) mod subgroups;
pub(crate) mod trace;

use std::time::Duration;

use crate::case::Outcome;
use crate::check::{Check, Context};
use crate::harness::{Clock, Harness, Rank};
use pg_core::{Backend, CommConfig, Device as _, UniqueId};
use pg_core::{OptionsBuilder, ProcessGroup, ReduceOp, WorkHandle};

/// The sleep kernel that keeps the device busy while a case looks at the host.
pub(crate) const SLEEP: Duration = Duration::from_millis(40);

/// Registers a case function under its own name.
macro_rules! case {
    ($f:ident, $min:expr) => {
        $crate::case::Case { name: stringify!($f), min_ranks: $min, run: $f::<H> }
    };
}
pub(crate) use case;

/// Unwraps a capability lookup inside a case: a missing one makes the case not applicable.
macro_rules! need {
    ($e:expr) => {
        match $e {
            Ok(value) => value,
            Err(outcome) => return Ok(outcome),
        }
    };
}
pub(crate) use need;

pub(crate) fn needs_log<H: Harness>(h: &H, spans: bool) -> Result<(), Outcome> {
    let offers = h.offers();
    match (offers.kernel_log, offers.kernel_spans || !spans) {
        (true, true) => Ok(()),
        (false, _) => Err(Outcome::NotApplicable("the harness keeps no kernel log".into())),
        (true, false) => Err(Outcome::NotApplicable("the kernel log has no device times".into())),
    }
}

pub(crate) fn needs_hazards<H: Harness>(h: &H) -> Result<(), Outcome> {
    match h.offers().hazards {
        true => Ok(()),
        false => Err(Outcome::NotApplicable("the backend has no stream-hazard detector".into())),
    }
}

pub(crate) fn needs_faults<H: Harness>(h: &H) -> Result<(), Outcome> {
    match h.offers().faults {
        true => Ok(()),
        false => Err(Outcome::NotApplicable("the harness cannot inject faults".into())),
    }
}

/// The sum of rank + 1 over `n` ranks.
pub(crate) fn triangle(n: usize) -> f64 {
    (n * (n + 1) / 2) as f64
}

/// The longest a host call may take and still count as "returned at once": exact on a virtual clock, loose on
/// the wall clock (a real driver call takes microseconds; the sleep kernel 40 ms).
pub(crate) fn at_once(clock: Clock) -> Duration {
    match clock {
        Clock::Virtual => SLEEP / 100,
        Clock::Wall => SLEEP / 4,
    }
}

/// The harness's host clock, or the reason the case cannot measure host time.
pub(crate) fn clock_of<H: Harness>(h: &H) -> Result<Clock, Outcome> {
    h.offers().clock.ok_or_else(|| Outcome::NotApplicable("the harness cannot measure host time".into()))
}

/// Whether every element equals `want`, else which one differs.
pub(crate) fn all_equal(values: &[f64], want: f64) -> Check {
    match values.iter().position(|v| *v != want) {
        None => Ok(()),
        Some(i) => Err(format!("element {i} of {} is {} instead of {want}", values.len(), values[i])),
    }
}

/// Joins a communicator of every rank of the world directly (no process group): rank 0 makes the unique id and
/// publishes it under `key`; the others read it.
pub(crate) fn communicator<B: Backend>(r: &Rank<B>, key: &str) -> Check<B::Communicator> {
    let id = match r.rank {
        0 => {
            let id = r.device.new_unique_id().ctx("new_unique_id")?;
            r.store.set(key, &id.0).ctx("publishing the unique id")?;
            id
        }
        _ => UniqueId(r.store.get(key).ctx("reading the unique id")?),
    };
    r.device.create_communicator(&id, r.size, r.rank, &CommConfig::default()).ctx("create_communicator")
}

/// A send from rank 0 to rank 1 (and the matching receive), waited on: `None` on the other ranks and in a world
/// of one.
pub(crate) fn pair_p2p<B: Backend>(
    r: &Rank<B>,
    group: &ProcessGroup<B>,
    buffer: &B::Buffer,
) -> Check<Option<WorkHandle<B>>> {
    let work = match r.rank {
        _ if r.size < 2 => return Ok(None),
        0 => group.send(buffer, 1),
        1 => group.recv(buffer, 0),
        _ => return Ok(None),
    };
    let work = work.ctx("p2p")?;
    work.wait().ctx("p2p wait")?;
    Ok(Some(work))
}

/// A group named `name`, a barrier so its communicator exists, then an all_reduce of `buffer` held back on the
/// device behind a sleep kernel on the current stream: the op is enqueued but cannot have finished.
pub(crate) fn held_all_reduce<B: Backend>(
    r: &Rank<B>,
    name: &str,
    options: OptionsBuilder,
    buffer: &B::Buffer,
) -> Check<(ProcessGroup<B>, WorkHandle<B>)> {
    let group = r.ready_group(name, options)?;
    // Cases abort or time out the held op: no rank may do so while a peer is still in the ready barrier.
    r.barrier(&format!("held {name}"))?;
    r.sleep_current(SLEEP)?;
    let work = group.all_reduce(buffer, ReduceOp::Sum).ctx("all_reduce")?;
    Ok((group, work))
}

/// Runs `body` on every rank of a world of `n`: the case passes if every rank's checks held.
pub(crate) fn on_each_rank<H: Harness>(h: &H, n: usize, body: impl Fn(&Rank<H::B>) -> Check + Sync) -> Check<Outcome> {
    h.run(n, body)?.all_ok()?;
    Ok(Outcome::Pass)
}

//! The cases, by concern: the stream/event/Work/cache semantics, each op's results and bad-input errors, and
//! the group's life cycle and error paths.

pub(crate) mod lifecycle;
pub(crate) mod ops;
pub(crate) mod semantics;

use std::time::Duration;

use crate::check::{Check, Context};
use crate::harness::{Clock, Harness, Rank};
use crate::registry::Outcome;
use pg_core::{Backend, CommConfig, Device as _, UniqueId};

/// The sleep kernel that keeps the device busy while a case looks at the host.
pub(crate) const SLEEP: Duration = Duration::from_millis(40);

/// Registers a case function under its own name.
macro_rules! case {
    ($f:ident, $min:expr) => {
        $crate::registry::Case { name: stringify!($f), min_ranks: $min, run: $f::<H> }
    };
}
pub(crate) use case;

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

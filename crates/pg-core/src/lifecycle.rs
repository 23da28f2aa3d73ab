//! A group's lifecycle as one explicit state ([`GroupState`]): every public call of a group is checked against it
//! here, in [`decide`], and every change of state is a transition of this module. Nothing else in the crate keeps a
//! flag that says what a group may still do.
//!
//! The states and what each call does in them is the table `docs/semantics.md` shows (the test
//! `the_documented_table_is_the_one_the_code_decides` keeps the two the same).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::locks::lock;
use crate::Error;

/// Where a group is in its life: what its calls do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupState {
    /// Every call works.
    Healthy,
    /// The watchdog, the heartbeat monitor or a store check found a fatal error: ops return it; the survivors'
    /// agreement, a revoke and a shrink are still open.
    Failed,
    /// Revoked ([`crate::ProcessGroup::revoke`], the watchdog with `Options::revoke_on_error`, or a failed shrink
    /// with abort): ops return [`Error::Revoked`]; what is left is the agreement, a shrink, or dropping it.
    Revoked,
    /// A shrink with [`crate::ShrinkMode::Abort`] is under way: ops return [`Error::Revoked`]; once it ends the
    /// group is superseded (it succeeded) or revoked (it failed, and may be shrunk again).
    Shrinking,
    /// Shrunk with abort into another group: every call but a shutdown, an abort or a revoke (which changes
    /// nothing) is refused, naming the group to use instead.
    Superseded,
    /// Shut down with [`crate::ProcessGroup::shutdown`]: every call returns [`Error::Aborted`].
    ShutDown,
    /// Aborted ([`crate::ProcessGroup::abort`]): every call returns [`Error::Aborted`].
    Aborted,
}

impl GroupState {
    /// Every state, in the order of the documented table.
    pub const ALL: [GroupState; 7] = [
        GroupState::Healthy,
        GroupState::Failed,
        GroupState::Revoked,
        GroupState::Shrinking,
        GroupState::Superseded,
        GroupState::ShutDown,
        GroupState::Aborted,
    ];

    fn from_tag(tag: u8) -> Self {
        Self::ALL[usize::from(tag)]
    }

    fn tag(self) -> u8 {
        Self::ALL.iter().position(|state| *state == self).map_or(0, |at| at as u8)
    }

    /// Whether the group was revoked: revoked, shrinking or superseded.
    pub fn is_revoked(self) -> bool {
        matches!(self, GroupState::Revoked | GroupState::Shrinking | GroupState::Superseded)
    }
}

impl fmt::Display for GroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            GroupState::Healthy => "healthy",
            GroupState::Failed => "failed",
            GroupState::Revoked => "revoked",
            GroupState::Shrinking => "shrinking",
            GroupState::Superseded => "superseded",
            GroupState::ShutDown => "shut down",
            GroupState::Aborted => "aborted",
        };
        f.write_str(name)
    }
}

/// What is asked of a group: its public calls, and the events its own threads and calls bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// Any op (collective, point-to-point, barrier, a chunk-size check) and the creation of a communicator.
    Op,
    /// `new_group`, `split_by_color`, a mesh.
    Subgroup,
    /// `agree_survivors`.
    Agree,
    /// `shrink` with `ShrinkMode::Default`.
    Shrink,
    /// `shrink` with `ShrinkMode::Abort`.
    ShrinkAbort,
    /// `grow`.
    Grow,
    /// `revoke` (or the watchdog's revoke).
    Revoke,
    /// `shutdown`.
    Shutdown,
    /// `abort`.
    Abort,
    /// A fatal error found by the group's threads or checks (event).
    Fail,
    /// The shrink with abort under way returned its group (event).
    ShrinkSucceeded,
    /// The shrink with abort under way failed (event).
    ShrinkFailed,
}

impl Call {
    /// Every call, in the order of the documented table's columns.
    #[cfg(test)]
    pub(crate) const ALL: [Call; 12] = [
        Call::Op,
        Call::Subgroup,
        Call::Agree,
        Call::Shrink,
        Call::ShrinkAbort,
        Call::Grow,
        Call::Revoke,
        Call::Shutdown,
        Call::Abort,
        Call::Fail,
        Call::ShrinkSucceeded,
        Call::ShrinkFailed,
    ];

    fn name(self) -> &'static str {
        match self {
            Call::Op => "an op",
            Call::Subgroup => "a subgroup",
            Call::Agree => "agree_survivors",
            Call::Shrink => "shrink",
            Call::ShrinkAbort => "shrink (abort)",
            Call::Grow => "grow",
            Call::Revoke => "revoke",
            Call::Shutdown => "shutdown",
            Call::Abort => "abort",
            Call::Fail => "a failure",
            Call::ShrinkSucceeded => "shrink returns",
            Call::ShrinkFailed => "shrink fails",
        }
    }
}

/// Why a call is refused in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The group's own error (the failure, the revoke or the abort that put it in this state).
    Its,
    /// [`Error::Revoked`], saying what to do instead.
    Revoked,
    /// [`Error::Aborted`]: the group was shut down.
    ShutDown,
    /// [`Error::InvalidArgument`]: a shrink with abort of the group is under way.
    Busy,
}

/// What a call does in a state: it goes on (and the group moves to the given state), or it is refused.
pub(crate) type Decision = std::result::Result<GroupState, Refusal>;

/// The table: what `call` does to a group in `state`. The one place that says what a group may still do.
pub(crate) fn decide(state: GroupState, call: Call) -> Decision {
    use GroupState as S;
    match (state, call) {
        // Events that end or give up an aborting shrink only happen while one is under way.
        (S::Shrinking, Call::ShrinkSucceeded) => Ok(S::Superseded),
        (S::Shrinking, Call::ShrinkFailed) => Ok(S::Revoked),
        (other, Call::ShrinkSucceeded | Call::ShrinkFailed) => Ok(other),
        // Aborting and shutting down are always possible; the first of them stays.
        (S::ShutDown | S::Aborted, Call::Abort | Call::Shutdown | Call::Revoke | Call::Fail) => Ok(state),
        (_, Call::Abort) => Ok(S::Aborted),
        (_, Call::Shutdown) => Ok(S::ShutDown),
        (S::ShutDown, _) => Err(Refusal::ShutDown),
        (S::Aborted, _) => Err(Refusal::Its),
        (S::Healthy, Call::Fail) => Ok(S::Failed),
        (_, Call::Fail) => Ok(state),
        (S::Healthy | S::Failed, Call::Revoke) => Ok(S::Revoked),
        (_, Call::Revoke) => Ok(state),
        (S::Healthy, Call::Op | Call::Subgroup | Call::Agree | Call::Shrink | Call::Grow) => Ok(state),
        (S::Healthy | S::Failed | S::Revoked, Call::ShrinkAbort) => Ok(S::Shrinking),
        (S::Failed | S::Revoked, Call::Agree | Call::Shrink) => Ok(state),
        (S::Failed, Call::Op | Call::Subgroup | Call::Grow) => Err(Refusal::Its),
        (S::Revoked, Call::Op) => Err(Refusal::Its),
        (S::Revoked, Call::Subgroup | Call::Grow) => Err(Refusal::Revoked),
        (S::Shrinking, Call::Op) => Err(Refusal::Its),
        (S::Shrinking, _) => Err(Refusal::Busy),
        (S::Superseded, _) => Err(Refusal::Revoked),
    }
}

/// Who asks, for the words of a refusal.
pub(crate) struct Asker<'a> {
    pub(crate) rank: usize,
    pub(crate) group: &'a str,
    /// The call as the caller made it (`new_group(ranks [0, 1])`), where it says more than the call's kind.
    pub(crate) call: Option<&'a str>,
}

/// A group's state and the error that put it there, with a copy of the state's tag that the enqueue path reads
/// without the lock.
pub(crate) struct Lifecycle {
    state: Mutex<Current>,
    tag: AtomicU8,
    /// Whether a communicator of the group reported an asynchronous error (on NCCL, a peer's connection lost): such
    /// a communicator cannot be shrunk, and a shrink of the group makes its communicator by a rendezvous. A fact
    /// about the communicators, kept beside the state because a shrink reads both.
    comm_failed: AtomicBool,
}

/// The state with its payload: the error ops return in it (none while healthy), and the group a superseded one
/// was shrunk into.
struct Current {
    state: GroupState,
    error: Option<Error>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            state: Mutex::new(Current { state: GroupState::Healthy, error: None }),
            tag: AtomicU8::new(GroupState::Healthy.tag()),
            comm_failed: AtomicBool::new(false),
        }
    }
}

impl Lifecycle {
    fn locked(&self) -> MutexGuard<'_, Current> {
        lock(&self.state)
    }

    /// The state now.
    pub(crate) fn state(&self) -> GroupState {
        GroupState::from_tag(self.tag.load(Ordering::Acquire))
    }

    /// The error ops of the group return now, if any (none while it is healthy).
    pub(crate) fn error(&self) -> Option<Error> {
        match self.state() {
            GroupState::Healthy => None,
            _ => self.locked().error.clone(),
        }
    }

    /// Checks `call` against the state: `Ok` when it may go on (the state is left as it is), else the refusal's
    /// error. An op of a healthy group reads one atomic.
    pub(crate) fn check(&self, call: Call, who: &Asker<'_>) -> Result<(), Error> {
        if self.state() == GroupState::Healthy && call == Call::Op {
            return Ok(());
        }
        let current = self.locked();
        match decide(current.state, call) {
            Ok(_) => Ok(()),
            Err(refusal) => Err(refusal_error(refusal, &current, call, who)),
        }
    }

    /// Applies `call` to the state: the new state, or the refusal's error (the state is left as it is). `error` is
    /// what ops return in the new state when it is the first error of the group (an earlier one stays).
    pub(crate) fn apply(&self, call: Call, error: Option<Error>, who: &Asker<'_>) -> Result<GroupState, Error> {
        let mut current = self.locked();
        let next = decide(current.state, call).map_err(|refusal| refusal_error(refusal, &current, call, who))?;
        if next != current.state {
            tracing::debug!(target: "pg", rank = who.rank, group = who.group, from = %current.state, to = %next,
                call = call.name(), "group state");
            current.state = next;
            if let Some(error) = error {
                // A superseded group's ops name the group that replaced it; otherwise the first error stays.
                if current.error.is_none() || next == GroupState::Superseded || next == GroupState::Aborted {
                    current.error = Some(error);
                }
            }
            self.tag.store(next.tag(), Ordering::Release);
        }
        Ok(next)
    }

    /// Marks that a communicator of the group reported an asynchronous error.
    pub(crate) fn note_comm_failed(&self) {
        self.comm_failed.store(true, Ordering::SeqCst);
    }

    /// Whether a communicator of the group reported an asynchronous error.
    pub(crate) fn comm_failed(&self) -> bool {
        self.comm_failed.load(Ordering::SeqCst)
    }
}

/// The error of `refusal` for `call` in `current`.
fn refusal_error(refusal: Refusal, current: &Current, call: Call, who: &Asker<'_>) -> Error {
    let (rank, group, state) = (who.rank, who.group, current.state);
    let called = who.call.unwrap_or(call.name());
    match refusal {
        Refusal::Its => current.error.clone().unwrap_or_else(|| Error::Aborted {
            reason: format!("rank {rank}: {} of group '{group}', which is {state}", called),
        }),
        Refusal::ShutDown => {
            Error::Aborted { reason: format!("rank {rank}: {} of group '{group}', which was shut down", called) }
        }
        Refusal::Busy => Error::invalid(format!(
            "{} of group '{group}' on rank {rank} while a shrink with abort of it is under way: wait for that \
             shrink; if it fails, shrink again",
            called
        )),
        Refusal::Revoked => {
            let instead = match state {
                GroupState::Superseded => {
                    let by = current.error.as_ref().map(ToString::to_string).unwrap_or_default();
                    format!("it was already shrunk with abort ({by}): use the group that shrink returned")
                }
                _ => "it was revoked: agree on the survivors, shrink the group to them, then use the shrunk group"
                    .to_owned(),
            };
            Error::Revoked { reason: format!("rank {rank}: {} of group '{group}': {instead}", called) }
        }
    }
}

/// The table as `docs/semantics.md` shows it: a row per state, a column per call; each cell the state the call
/// leaves the group in, or the error it is refused with.
#[cfg(test)]
pub(crate) fn table_markdown() -> String {
    let mut text = String::from("| state |");
    for call in Call::ALL {
        text.push_str(&format!(" {} |", call.name()));
    }
    text.push_str("\n| --- |");
    text.push_str(&" --- |".repeat(Call::ALL.len()));
    for state in GroupState::ALL {
        text.push_str(&format!("\n| {state} |"));
        for call in Call::ALL {
            let cell = match decide(state, call) {
                Ok(next) if next == state => "ok".to_owned(),
                Ok(next) => format!("→ {next}"),
                Err(Refusal::Its) => "its error".to_owned(),
                Err(Refusal::Revoked) => "`Revoked`".to_owned(),
                Err(Refusal::ShutDown) => "`Aborted`".to_owned(),
                Err(Refusal::Busy) => "`InvalidArgument`".to_owned(),
            };
            text.push_str(&format!(" {cell} |"));
        }
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asker() -> Asker<'static> {
        Asker { rank: 0, group: "g", call: None }
    }

    /// A lifecycle put in `state` through calls, as a group gets there.
    fn in_state(state: GroupState) -> Lifecycle {
        let life = Lifecycle::default();
        let failure = || Some(Error::Backend("the failure".to_owned()));
        let path: &[Call] = match state {
            GroupState::Healthy => &[],
            GroupState::Failed => &[Call::Fail],
            GroupState::Revoked => &[Call::Revoke],
            GroupState::Shrinking => &[Call::ShrinkAbort],
            GroupState::Superseded => &[Call::ShrinkAbort, Call::ShrinkSucceeded],
            GroupState::ShutDown => &[Call::Shutdown],
            GroupState::Aborted => &[Call::Abort],
        };
        for &call in path {
            life.apply(call, failure(), &asker()).expect("the path is allowed");
        }
        assert_eq!(life.state(), state);
        life
    }

    /// Every (state, call) pair: the documented outcome, the state it leaves, and the error kind of a refusal.
    #[test]
    fn every_state_and_call_has_the_documented_outcome() {
        use crate::ErrorKind as K;
        use Call as C;
        use GroupState as S;
        // (state, call, Ok(next) or Err(kind)); the table below is written out by hand, independent of `decide`.
        let expected: &[(S, C, std::result::Result<S, K>)] = &[
            (S::Healthy, C::Op, Ok(S::Healthy)),
            (S::Healthy, C::Subgroup, Ok(S::Healthy)),
            (S::Healthy, C::Agree, Ok(S::Healthy)),
            (S::Healthy, C::Shrink, Ok(S::Healthy)),
            (S::Healthy, C::ShrinkAbort, Ok(S::Shrinking)),
            (S::Healthy, C::Grow, Ok(S::Healthy)),
            (S::Healthy, C::Revoke, Ok(S::Revoked)),
            (S::Healthy, C::Shutdown, Ok(S::ShutDown)),
            (S::Healthy, C::Abort, Ok(S::Aborted)),
            (S::Healthy, C::Fail, Ok(S::Failed)),
            (S::Healthy, C::ShrinkSucceeded, Ok(S::Healthy)),
            (S::Healthy, C::ShrinkFailed, Ok(S::Healthy)),
            (S::Failed, C::Op, Err(K::Backend)),
            (S::Failed, C::Subgroup, Err(K::Backend)),
            (S::Failed, C::Agree, Ok(S::Failed)),
            (S::Failed, C::Shrink, Ok(S::Failed)),
            (S::Failed, C::ShrinkAbort, Ok(S::Shrinking)),
            (S::Failed, C::Grow, Err(K::Backend)),
            (S::Failed, C::Revoke, Ok(S::Revoked)),
            (S::Failed, C::Shutdown, Ok(S::ShutDown)),
            (S::Failed, C::Abort, Ok(S::Aborted)),
            (S::Failed, C::Fail, Ok(S::Failed)),
            (S::Failed, C::ShrinkSucceeded, Ok(S::Failed)),
            (S::Failed, C::ShrinkFailed, Ok(S::Failed)),
            (S::Revoked, C::Op, Err(K::Backend)),
            (S::Revoked, C::Subgroup, Err(K::Revoked)),
            (S::Revoked, C::Agree, Ok(S::Revoked)),
            (S::Revoked, C::Shrink, Ok(S::Revoked)),
            (S::Revoked, C::ShrinkAbort, Ok(S::Shrinking)),
            (S::Revoked, C::Grow, Err(K::Revoked)),
            (S::Revoked, C::Revoke, Ok(S::Revoked)),
            (S::Revoked, C::Shutdown, Ok(S::ShutDown)),
            (S::Revoked, C::Abort, Ok(S::Aborted)),
            (S::Revoked, C::Fail, Ok(S::Revoked)),
            (S::Revoked, C::ShrinkSucceeded, Ok(S::Revoked)),
            (S::Revoked, C::ShrinkFailed, Ok(S::Revoked)),
            (S::Shrinking, C::Op, Err(K::Backend)),
            (S::Shrinking, C::Subgroup, Err(K::InvalidArgument)),
            (S::Shrinking, C::Agree, Err(K::InvalidArgument)),
            (S::Shrinking, C::Shrink, Err(K::InvalidArgument)),
            (S::Shrinking, C::ShrinkAbort, Err(K::InvalidArgument)),
            (S::Shrinking, C::Grow, Err(K::InvalidArgument)),
            (S::Shrinking, C::Revoke, Ok(S::Shrinking)),
            (S::Shrinking, C::Shutdown, Ok(S::ShutDown)),
            (S::Shrinking, C::Abort, Ok(S::Aborted)),
            (S::Shrinking, C::Fail, Ok(S::Shrinking)),
            (S::Shrinking, C::ShrinkSucceeded, Ok(S::Superseded)),
            (S::Shrinking, C::ShrinkFailed, Ok(S::Revoked)),
            (S::Superseded, C::Op, Err(K::Revoked)),
            (S::Superseded, C::Subgroup, Err(K::Revoked)),
            (S::Superseded, C::Agree, Err(K::Revoked)),
            (S::Superseded, C::Shrink, Err(K::Revoked)),
            (S::Superseded, C::ShrinkAbort, Err(K::Revoked)),
            (S::Superseded, C::Grow, Err(K::Revoked)),
            (S::Superseded, C::Revoke, Ok(S::Superseded)),
            (S::Superseded, C::Shutdown, Ok(S::ShutDown)),
            (S::Superseded, C::Abort, Ok(S::Aborted)),
            (S::Superseded, C::Fail, Ok(S::Superseded)),
            (S::Superseded, C::ShrinkSucceeded, Ok(S::Superseded)),
            (S::Superseded, C::ShrinkFailed, Ok(S::Superseded)),
        ];
        let closed = |state: S| -> Vec<(S, C, std::result::Result<S, K>)> {
            let refusal = if state == S::ShutDown { K::Aborted } else { K::Backend };
            C::ALL
                .iter()
                .map(|&call| {
                    let kept = matches!(
                        call,
                        C::Revoke | C::Shutdown | C::Abort | C::Fail | C::ShrinkSucceeded | C::ShrinkFailed
                    );
                    (state, call, if kept { Ok(state) } else { Err(refusal) })
                })
                .collect()
        };
        let mut all = expected.to_vec();
        // Shut down and aborted groups refuse every call but those that change nothing.
        all.extend(closed(S::ShutDown));
        all.extend(closed(S::Aborted));
        assert_eq!(all.len(), S::ALL.len() * C::ALL.len(), "every pair is listed once");
        for (state, call, outcome) in all {
            let life = in_state(state);
            let applied = life.apply(call, Some(Error::Backend("the call's error".to_owned())), &asker());
            match (outcome, applied) {
                (Ok(next), Ok(got)) => {
                    assert_eq!(got, next, "{state} + {call:?}");
                    assert_eq!(life.state(), next, "{state} + {call:?}");
                }
                (Err(kind), Err(error)) => {
                    assert_eq!(error.kind(), kind, "{state} + {call:?}: {error}");
                    assert_eq!(life.state(), state, "a refused call leaves the state: {state} + {call:?}");
                    assert_eq!(life.check(call, &asker()).map_err(|e| e.kind()), Err(kind), "{state} + {call:?}");
                }
                (want, got) => panic!("{state} + {call:?}: expected {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn ops_return_the_first_error_and_a_superseded_group_names_its_replacement() {
        let life = Lifecycle::default();
        assert!(life.error().is_none());
        life.apply(Call::Fail, Some(Error::Backend("first".to_owned())), &asker()).unwrap();
        life.apply(Call::Fail, Some(Error::Backend("second".to_owned())), &asker()).unwrap();
        life.apply(Call::Revoke, Some(Error::Revoked { reason: "revoked".to_owned() }), &asker()).unwrap();
        assert_eq!(life.check(Call::Op, &asker()).unwrap_err().to_string(), "backend error: first");
        life.apply(Call::ShrinkAbort, None, &asker()).unwrap();
        life.apply(Call::ShrinkSucceeded, Some(Error::Revoked { reason: "into 'g.shrink'".to_owned() }), &asker())
            .unwrap();
        let refused = life.check(Call::Shrink, &asker()).unwrap_err().to_string();
        assert!(
            refused.contains("into 'g.shrink'") && refused.contains("use the group that shrink returned"),
            "{refused}"
        );
    }

    #[test]
    fn a_failed_shrink_with_abort_leaves_the_group_shrinkable() {
        let life = in_state(GroupState::Healthy);
        life.apply(Call::ShrinkAbort, Some(Error::Revoked { reason: "shrinking".to_owned() }), &asker()).unwrap();
        life.apply(Call::ShrinkFailed, None, &asker()).unwrap();
        assert_eq!(life.state(), GroupState::Revoked);
        assert!(life.check(Call::ShrinkAbort, &asker()).is_ok());
    }

    #[test]
    fn the_documented_table_is_the_one_the_code_decides() {
        let docs = include_str!("../../../docs/semantics.md");
        let table = table_markdown();
        assert!(docs.contains(&table), "docs/semantics.md must show this table:\n{table}");
    }
}

//! The heartbeat monitor (S22): a second host thread that detects a watchdog that stopped making progress.
//!
//! Every `heartbeat_timeout` (`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`, default 480 s) it compares the watchdog's
//! heartbeat with the one it saw last time.
//! A watchdog that has not moved is stuck (in a driver call, on a lock): the monitor reports
//! [`Error::HeartbeatTimeout`], a kind of its own, dumps the flight recorder, fails the in-flight Works, and
//! aborts the communicators so that a call wedged in the communication library can return.
//! PyTorch ends the process at this point; this library tears the group down instead and poisons the device,
//! unless `Options::end_process_on_error` asks for PyTorch's behaviour.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use crate::failure::{dump_once, end_process, poison_device, record_first_error};
use crate::liveness::LIVENESS_POLL;
use crate::shared::Shared;
use crate::signals::Signals;
use crate::watchdog::check_dead_ranks;
use crate::{Backend, Device, Error};

/// The monitor's thread body: it holds the group only weakly while it sleeps. With liveness on it also reads the
/// store for dead ranks every [`LIVENESS_POLL`]: it makes no device call, so the news of a death never waits behind
/// a watchdog held in a query of a communicator that lost its peer.
pub(crate) fn monitor_loop<B: Backend>(
    group: &Weak<Shared<B>>,
    device: &B::Device,
    signals: &Signals,
    timeout: Duration,
) {
    let terminate = &signals.terminate;
    let Some((mut last_beat, liveness)) =
        group.upgrade().map(|g| (g.threads.heartbeat.load(Ordering::Relaxed), g.store_link.has_liveness()))
    else {
        return;
    };
    let poll = if liveness { timeout.min(LIVENESS_POLL) } else { timeout };
    let mut last_change = device.now();
    let mut next_look = last_change.saturating_add(timeout);
    loop {
        device.sleep(poll, terminate);
        if terminate.load(Ordering::SeqCst) {
            return;
        }
        let Some(group) = group.upgrade() else { return };
        if liveness {
            check_dead_ranks(group.as_ref());
        }
        let now = device.now();
        if now < next_look {
            continue;
        }
        next_look = now.saturating_add(timeout);
        let beat = group.threads.heartbeat.load(Ordering::Relaxed);
        // An idle watchdog sleeps longer than its period, by design: that is not a stuck one.
        if beat != last_beat || signals.idle.load(Ordering::SeqCst) {
            (last_beat, last_change) = (beat, now);
            continue;
        }
        report_stuck(group.as_ref(), now.saturating_sub(last_change));
        return;
    }
}

/// What the monitor does once it found the watchdog stuck for `elapsed`.
fn report_stuck<B: Backend>(group: &Shared<B>, elapsed: Duration) {
    let error = Error::HeartbeatTimeout { elapsed };
    tracing::error!(
        target: "pg",
        pg_id = group.local_id,
        rank = group.rank,
        "the process group's watchdog got stuck for {} s without making progress; tearing the group down",
        elapsed.as_secs()
    );
    group.threads.mark_stuck();
    if group.options.dump_on_timeout {
        dump_once(group);
    }
    if group.options.end_process_on_error {
        end_process(group.rank, &error);
    }
    // The watchdog cannot do its job, so the monitor does it: sticky state, failed Works, aborted
    // communicators (which also unblocks a watchdog wedged in the communication library).
    record_first_error(group, &error);
    group.fail(error.clone());
    poison_device(&group.device, &error);
    group.fail_in_flight(&error);
    group.abort_comms(&error.to_string());
    group.signals.stop(&group.device);
}

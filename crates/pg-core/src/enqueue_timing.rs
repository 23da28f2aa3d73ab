//! Optional timing of the collective template's steps, to find where host time goes on a real device, where
//! no profiler may run: with the `testing` feature and `PG_TIME_ENQUEUE=1`. Without the feature the timer is an
//! empty type whose calls compile to nothing; with it and the variable unset, it costs one flag read per op.

#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "testing")]
use std::sync::OnceLock;
#[cfg(feature = "testing")]
use std::time::{Duration, Instant};

/// The steps of the collective template, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueStep {
    /// Usability check, communicator lookup, sequence number, clock and current stream.
    Lookup,
    /// Recording the input-ready event on the current stream and making the communication stream wait (S9).
    InputReady,
    /// The allocator guard of the buffers (S12).
    RecordStream,
    /// The backend's op call (for NCCL, the library call and its wrapper).
    Op,
    /// Creating and recording the end event (S10).
    EndEvent,
    /// Building the Work.
    Work,
    /// Flight recorder, in-flight list and the error re-check.
    Track,
}

#[cfg(feature = "testing")]
impl EnqueueStep {
    /// Every step, in order.
    pub const ALL: [EnqueueStep; 7] = [
        EnqueueStep::Lookup,
        EnqueueStep::InputReady,
        EnqueueStep::RecordStream,
        EnqueueStep::Op,
        EnqueueStep::EndEvent,
        EnqueueStep::Work,
        EnqueueStep::Track,
    ];

    /// A short name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            EnqueueStep::Lookup => "lookup",
            EnqueueStep::InputReady => "input_ready",
            EnqueueStep::RecordStream => "record_stream",
            EnqueueStep::Op => "op",
            EnqueueStep::EndEvent => "end_event",
            EnqueueStep::Work => "work",
            EnqueueStep::Track => "track",
        }
    }
}

#[cfg(feature = "testing")]
static NANOS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

#[cfg(feature = "testing")]
fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("PG_TIME_ENQUEUE").as_deref() == Ok("1"))
}

/// Times one op's steps when timing is on; does nothing otherwise.
#[cfg(feature = "testing")]
pub(crate) struct StepTimer {
    last: Option<Instant>,
}

/// Without the `testing` feature: nothing to time, nothing recorded.
#[cfg(not(feature = "testing"))]
pub(crate) struct StepTimer;

#[cfg(not(feature = "testing"))]
impl StepTimer {
    #[inline(always)]
    pub(crate) fn start() -> Self {
        StepTimer
    }

    #[inline(always)]
    pub(crate) fn lap(&mut self, _step: EnqueueStep) {}
}

#[cfg(feature = "testing")]
impl StepTimer {
    pub(crate) fn start() -> Self {
        Self { last: enabled().then(Instant::now) }
    }

    /// Ends `step`: the time since the previous lap goes to it. Inlined, so that with timing off a lap is one
    /// branch on the template's path.
    #[inline]
    pub(crate) fn lap(&mut self, step: EnqueueStep) {
        if let Some(last) = self.last {
            let now = Instant::now();
            let nanos = u64::try_from((now - last).as_nanos()).unwrap_or(u64::MAX);
            NANOS[step as usize].fetch_add(nanos, Ordering::Relaxed);
            self.last = Some(now);
        }
    }
}

/// The host time spent in each step so far, process-wide (all zero unless `PG_TIME_ENQUEUE=1`).
#[cfg(feature = "testing")]
pub fn enqueue_step_totals() -> [(EnqueueStep, Duration); 7] {
    EnqueueStep::ALL.map(|step| (step, Duration::from_nanos(NANOS[step as usize].load(Ordering::Relaxed))))
}

#[cfg(all(test, not(feature = "testing")))]
mod without_testing {
    use super::*;

    #[test]
    fn without_the_testing_feature_the_timer_holds_and_records_nothing() {
        assert_eq!(std::mem::size_of::<StepTimer>(), 0);
        let mut timer = StepTimer::start();
        timer.lap(EnqueueStep::Lookup);
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

    #[test]
    fn steps_are_listed_in_template_order_with_distinct_names() {
        for (index, step) in EnqueueStep::ALL.iter().enumerate() {
            assert_eq!(*step as usize, index, "{step:?} is out of place");
        }
        let mut names: Vec<&str> = EnqueueStep::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EnqueueStep::ALL.len());
    }

    #[test]
    fn a_timer_that_is_off_records_nothing() {
        // Timing is off unless PG_TIME_ENQUEUE=1, which the test run does not set.
        if enabled() {
            return;
        }
        let before = enqueue_step_totals();
        let mut timer = StepTimer::start();
        timer.lap(EnqueueStep::Lookup);
        assert!(timer.last.is_none());
        assert_eq!(enqueue_step_totals(), before);
    }
}

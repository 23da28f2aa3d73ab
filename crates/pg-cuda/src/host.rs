//! The host side: a process-wide monotonic clock and interruptible sleeps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Time since a fixed, process-wide origin (the first call).
pub fn now() -> Duration {
    origin().elapsed()
}

struct Wakeup {
    generation: Mutex<u64>,
    condvar: Condvar,
}

fn wakeup() -> &'static Wakeup {
    static WAKEUP: OnceLock<Wakeup> = OnceLock::new();
    WAKEUP.get_or_init(|| Wakeup { generation: Mutex::new(0), condvar: Condvar::new() })
}

/// Sleeps for `duration`, or less once `interrupt` is set and [`notify_host_threads`] is called.
pub fn sleep(duration: Duration, interrupt: &AtomicBool) {
    let deadline = Instant::now() + duration;
    let wakeup = wakeup();
    let mut generation = wakeup.generation.lock().unwrap_or_else(|e| e.into_inner());
    while !interrupt.load(Ordering::Acquire) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        generation = wakeup.condvar.wait_timeout(generation, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// Wakes every thread in [`sleep`] so that it looks at its interrupt flag.
pub fn notify_host_threads() {
    let wakeup = wakeup();
    *wakeup.generation.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    wakeup.condvar.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn clock_is_monotonic() {
        let a = now();
        let b = now();
        assert!(b >= a);
    }

    #[test]
    fn sleep_runs_its_course_without_interrupt() {
        let start = Instant::now();
        sleep(Duration::from_millis(20), &AtomicBool::new(false));
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn sleep_is_interrupted() {
        let flag = Arc::new(AtomicBool::new(false));
        let sleeper = {
            let flag = flag.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                sleep(Duration::from_secs(30), &flag);
                start.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::Release);
        notify_host_threads();
        assert!(sleeper.join().unwrap() < Duration::from_secs(10));
    }
}

//! Interop. Foreign memory: a buffer another framework made is kept on the Work until its op has ended, in either
//! lifetime mode. Awaitable Work: a Work awaited from an async executor resolves once the device has finished the op, or with
//! its error (abort, timeout), without a blocked host thread per Work and without busy polling; `Future::then`.
//!
//! The executor runs on a thread of its own, outside the backend's world, while the rank's thread waits for the
//! device (or sleeps, or aborts) as it would in a real program: on the simulated backend the rank's wait is what
//! moves the virtual clock, and the backend's host callback wakes the executor.

use std::future::{Future as _, IntoFuture as _};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt as _};
use pg_core::{Backend, Buffer as _, DType, Device as _, ErrorHandling, ErrorKind, Options, ReduceOp, WorkHandle};

use super::{all_equal, case, clock_of, held_all_reduce, need, needs_hazards, on_each_rank, triangle, SLEEP};
use crate::case::{not_applicable, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Clock, Harness};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(awaited_works_resolve_once_the_device_finished_without_busy_polling, 1),
        case!(an_awaited_work_of_an_aborted_group_resolves_aborted, 1),
        case!(an_awaited_work_that_times_out_resolves_work_timeout, 1),
        case!(future_then_runs_the_callback_once_the_device_finished, 1),
        case!(dropping_an_awaited_work_cancels_nothing, 1),
        case!(foreign_buffers_are_kept_until_the_op_ends_in_either_mode, 1),
        case!(a_foreign_buffer_on_another_device_is_refused_before_anything_is_enqueued, 1),
    ]
}

/// How many Works the join case awaits at once.
const JOINED: usize = 8;

/// The most polls one awaited Work may take: the first (pending), the one its wake-up causes, and one spare for
/// a wake-up that raced with the completion. A busy-polling future would take many more.
const MAX_POLLS: usize = 3;

/// What awaiting one Work gave: its index, its result, how often it was polled, and whether the device had
/// finished the op when it resolved.
struct Awaited {
    index: usize,
    result: pg_core::Result<()>,
    polls: usize,
    gpu_done: pg_core::Result<bool>,
}

/// A Work's future that counts its polls and, when it resolves, asks the device whether the op has finished.
struct Counted<B: Backend> {
    index: usize,
    inner: pg_core::WorkFuture<B>,
    gpu: pg_core::Future<B>,
    polls: usize,
}

impl<B: Backend> std::future::Future for Counted<B> {
    type Output = Awaited;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Awaited> {
        let this = self.get_mut();
        this.polls += 1;
        match Pin::new(&mut this.inner).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => Poll::Ready(Awaited {
                index: this.index,
                result,
                polls: this.polls,
                gpu_done: this.gpu.gpu_completed(),
            }),
        }
    }
}

/// A waker that only counts its wake-ups.
#[derive(Default)]
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the first poll of every Work found: how many were pending, and how often they woke their task at once.
#[derive(Debug, PartialEq)]
struct FirstPoll {
    pending: usize,
    woken: usize,
    /// The Works that were ready at their first poll, with their results and host times since the first poll
    /// began, for the failure message (empty when every Work was pending).
    ready: Vec<String>,
}

/// Polls every Work once with a counting waker and reports on `first` (the op cannot finish meanwhile: the
/// rank's thread waits for the report); then awaits them all at once under `futures::executor::block_on`.
/// The results come in completion order.
fn await_all<B: Backend>(works: &[WorkHandle<B>], first: &mpsc::Sender<FirstPoll>) -> Vec<Awaited> {
    let counter = std::sync::Arc::new(CountingWaker::default());
    let waker = std::task::Waker::from(std::sync::Arc::clone(&counter));
    let mut cx = TaskContext::from_waker(&waker);
    let mut done = Vec::with_capacity(works.len());
    let mut pending = FuturesUnordered::new();
    let mut ready = Vec::new();
    let began = std::time::Instant::now();
    for (index, work) in works.iter().enumerate() {
        let mut counted = Counted { index, inner: work.into_future(), gpu: work.future(), polls: 0 };
        match Pin::new(&mut counted).poll(&mut cx) {
            Poll::Ready(awaited) => {
                ready.push(format!("Work {index}: {:?} after {:?}", awaited.result, began.elapsed()));
                done.push(awaited);
            }
            Poll::Pending => pending.push(counted),
        }
    }
    let _ = first.send(FirstPoll { pending: pending.len(), woken: counter.0.load(Ordering::SeqCst), ready });
    futures::executor::block_on(async move {
        while let Some(awaited) = pending.next().await {
            done.push(awaited);
        }
        done
    })
}

/// Polls `future` once with the calling task's waker.
async fn poll_once<F: std::future::Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

/// On an executor thread: polls the Work's future once, says on `first` whether it was pending, then awaits it.
fn await_after_first_poll<B: Backend>(work: &WorkHandle<B>, first: &mpsc::Sender<bool>) -> pg_core::Result<()> {
    futures::executor::block_on(async {
        let mut future = work.into_future();
        match poll_once(&mut future).await {
            Poll::Ready(result) => {
                let _ = first.send(false);
                result
            }
            Poll::Pending => {
                let _ = first.send(true);
                future.await
            }
        }
    })
}

fn awaited_works_resolve_once_the_device_finished_without_busy_polling<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    // The ops must still be held behind the sleep when the executor first polls them. In real time that poll
    // can come late (a new thread's first driver calls), so a real device holds them far longer.
    let hold = match need!(clock_of(h)) {
        Clock::Virtual => SLEEP,
        Clock::Wall => SLEEP * 25,
    };
    on_each_rank(h, n, |r| {
        let group = r.ready_group("0", Options::builder())?;
        let buffers = (0..JOINED).map(|_| r.filled((r.rank + 1) as f64, 64)).collect::<Check<Vec<_>>>()?;
        r.sleep_current(hold)?;
        let works = buffers
            .iter()
            .map(|buffer| group.all_reduce(buffer, ReduceOp::Sum))
            .collect::<pg_core::Result<Vec<_>>>()
            .ctx("all_reduce")?;
        let last = works.last().ok_or("no Work")?;
        let (sender, first) = mpsc::channel();
        let (first, synced, awaited) = std::thread::scope(|scope| {
            let works = &works;
            let executor = scope.spawn(move || await_all(works, &sender));
            let first = first.recv();
            // The rank's own thread waits for the device; the executor's tasks are woken by the completions.
            let synced = last.synchronize();
            (first, synced, executor.join())
        });
        // A future that wakes its own task while the op runs is a busy poll, whatever the thread timing.
        let first = first.map_err(|_| "the executor thread sent no first-poll report".to_owned())?;
        ensure!(
            first.pending == JOINED && first.woken == 0,
            "the first poll of each Work: {} of {JOINED} pending, {} wakes; ready at once: {:?}",
            first.pending,
            first.woken,
            first.ready
        );
        synced.ctx("synchronize")?;
        let awaited = awaited.map_err(|_| "the executor thread panicked".to_owned())?;
        ensure_eq!(awaited.len(), JOINED, "Works resolved");
        for a in &awaited {
            a.result.clone().map_err(|e| format!("Work {} resolved with an error: {e}", a.index))?;
            ensure!(
                matches!(a.gpu_done, Ok(true)),
                "Work {} resolved before the device finished it ({:?})",
                a.index,
                a.gpu_done
            );
            ensure!(a.polls <= MAX_POLLS, "Work {} was polled {} times: the future busy-polls", a.index, a.polls);
        }
        for buffer in &buffers {
            all_equal(&r.read(buffer)?, triangle(n))?;
        }
        Ok(())
    })
}

fn an_awaited_work_of_an_aborted_group_resolves_aborted<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let buffer = r.filled(1.0, 64)?;
        let (group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let (first, polled) = mpsc::channel();
        let (pending, result) = std::thread::scope(|scope| {
            let executor = scope.spawn(move || await_after_first_poll(&work, &first));
            let pending = polled.recv();
            group.abort("the case aborts");
            (pending, executor.join())
        });
        ensure_eq!(pending, Ok(true), "the first poll before the abort was pending");
        let result = result.map_err(|_| "the executor thread panicked".to_owned())?;
        let error = result.err().ok_or("the awaited Work of an aborted group resolved Ok")?;
        ensure_eq!(error.kind(), ErrorKind::Aborted, "the awaited Work's error: {error}");
        Ok(())
    })
}

fn an_awaited_work_that_times_out_resolves_work_timeout<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        let options = Options::builder()
            .error_handling(ErrorHandling::CleanUpOnly)
            .watchdog_period(Duration::from_millis(5))
            .dump_on_timeout(false)
            .timeout(Duration::from_secs(60));
        let group = r.ready_group("0", options)?;
        let buffer = r.filled(1.0, 64)?;
        // The op times out behind a long kernel; the watchdog records the timeout and wakes the awaiting tasks.
        group.set_timeout(Duration::from_millis(10));
        r.sleep_current(SLEEP * 5)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let ran = AtomicBool::new(false);
        let then = work.future().then(|_| ran.store(true, Ordering::SeqCst));
        let shown = format!("{then:?}");
        ensure!(shown.starts_with("Then") && shown.contains("ran: false"), "then()'s Debug: {shown}");
        let shown = format!("{:?}", std::future::IntoFuture::into_future(&work));
        ensure!(shown.starts_with("WorkFuture") && shown.contains("AllReduce"), "the Work's future's Debug: {shown}");
        let (first, polled) = mpsc::channel();
        let (pending, result, chained) = std::thread::scope(|scope| {
            let executor = scope.spawn(|| await_after_first_poll(&work, &first));
            let chained = scope.spawn(|| futures::executor::block_on(then));
            let pending = polled.recv();
            r.host_sleep(match clock {
                Clock::Virtual => SLEEP * 2,
                Clock::Wall => SLEEP * 4,
            });
            (pending, executor.join(), chained.join())
        });
        ensure_eq!(pending, Ok(true), "the first poll before the timeout was pending");
        let result = result.map_err(|_| "the executor thread panicked".to_owned())?;
        let error = result.err().ok_or("the awaited Work that timed out resolved Ok")?;
        ensure_eq!(error.kind(), ErrorKind::WorkTimeout, "the awaited Work's error: {error}");
        let chained = chained.map_err(|_| "the executor thread of then() panicked".to_owned())?;
        let error = chained.err().ok_or("then() of a Work that timed out resolved Ok")?;
        ensure_eq!(error.kind(), ErrorKind::WorkTimeout, "then()'s error: {error}");
        ensure!(!ran.load(Ordering::SeqCst), "then()'s callback ran although the Work failed");
        Ok(())
    })
}

fn future_then_runs_the_callback_once_the_device_finished<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let buffer = r.filled((r.rank + 1) as f64, 64)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let future = work.future();
        ensure!(!future.gpu_completed().ctx("gpu_completed")?, "the op finished before the case awaited it");
        // The callback sees the device done and returns a value of its own type.
        let then = future.then(|f| (f.gpu_completed(), f.value().len()));
        let (synced, value) = std::thread::scope(|scope| {
            let executor = scope.spawn(|| futures::executor::block_on(then));
            let synced = work.synchronize();
            (synced, executor.join())
        });
        synced.ctx("synchronize")?;
        let value = value.map_err(|_| "the executor thread panicked".to_owned())?.ctx("then")?;
        ensure!(matches!(value.0, Ok(true)), "the callback ran before the device finished: {:?}", value.0);
        ensure_eq!(value.1, 1, "outputs the callback saw");
        all_equal(&r.read(&buffer)?, triangle(n))
    })
}

fn dropping_an_awaited_work_cancels_nothing<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let buffer = r.filled((r.rank + 1) as f64, 64)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let first = futures::executor::block_on(async {
            let mut future = (&work).into_future();
            poll_once(&mut future).await.is_pending()
            // The future is dropped here, pending.
        });
        ensure!(first, "the op finished before the case polled it");
        work.synchronize().ctx("synchronize")?;
        ensure!(work.is_success(), "the Work failed after its future was dropped: {:?}", work.exception());
        all_equal(&r.read(&buffer)?, triangle(n))
    })
}

fn foreign_buffers_are_kept_until_the_op_ends_in_either_mode<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_hazards(h));
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        for avoid_record_streams in [false, true] {
            let name = if avoid_record_streams { "stash" } else { "record_stream" };
            let group = r.ready_group(name, Options::builder().avoid_record_streams(avoid_record_streams))?;
            let foreign = r
                .caps
                .foreign_buffer(&r.device, DType::F32, 64)
                .ok_or("the harness has a hazard detector but makes no foreign buffers")?
                .ctx("foreign buffer")?;
            ensure!(foreign.is_foreign(), "{name}: the foreign buffer does not say it is foreign");
            r.device.fill(&foreign, (r.rank + 1) as f64, &r.device.current_stream()).ctx("fill")?;
            // The op is held behind a kernel; its caller lets go of the Work and of its own handle at once, and
            // its framework reuses the memory for the next tensor on the same stream: only pg's handle, kept
            // until the end event passes, stops that reuse while the communication stream still uses it.
            r.sleep_current(SLEEP)?;
            let work = group.all_reduce(&foreign, ReduceOp::Sum).ctx("all_reduce")?;
            drop(work);
            drop(foreign);
            let next = r.filled(7.0, 64)?;
            all_equal(&r.read(&next)?, 7.0).map_err(|e| format!("{name}: {e}"))?;
            r.device.synchronize().ctx("synchronize")?;
        }
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    Ok(Outcome::Pass)
}

fn a_foreign_buffer_on_another_device_is_refused_before_anything_is_enqueued<H: Harness>(h: &H) -> Check<Outcome> {
    if !h.offers().other_device {
        return not_applicable("the harness has no second device");
    }
    need!(needs_hazards(h));
    on_each_rank(h, h.world_size(), |r| {
        let other = r.caps.other_device(r.rank).ok_or("no other device")?;
        let group = r.group("0", Options::builder())?;
        let theirs = r
            .caps
            .foreign_buffer(&other, DType::F32, 16)
            .ok_or("the harness has a hazard detector but makes no foreign buffers")?
            .ctx("foreign buffer")?;
        let error =
            group.all_reduce(&theirs, ReduceOp::Sum).err().ok_or("a foreign buffer of another device was accepted")?;
        ensure_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
        ensure!(error.to_string().contains("device"), "the error does not name the device: {error}");
        ensure_eq!(group.counters().ops_issued, 0, "a refused call enqueued something");
        Ok(())
    })
}

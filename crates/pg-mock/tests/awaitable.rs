//! Awaiting Works under tokio on the simulated backend: many Works joined as tokio tasks resolve once the device
//! has finished them, with the reduced values, and a host callback runs at its op's virtual completion time (also
//! once the ranks have left).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_core::{Device as _, Options, ProcessGroup, ReduceOp, Result, Stream as _};
use pg_mock::{Mock, World, WorldConfig};

const WORKS: usize = 16;
const SLEEP: Duration = Duration::from_millis(40);

fn read_f32(device: &pg_mock::MockDevice, buffer: &pg_mock::MockBuffer) -> Result<Vec<f32>> {
    let bytes = device.copy_to_host(buffer, &device.current_stream())?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[test]
fn many_works_joined_as_tokio_tasks_resolve_once_the_device_finished() {
    let world = World::new(WorldConfig { devices: 2, ..Default::default() });
    let store = world.store();
    let results = world.run(2, |rank, device| -> Result<()> {
        let pg = ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 2, device.clone(), Options::builder().build())?;
        pg.barrier_sync()?;
        let buffers = (0..WORKS)
            .map(|_| {
                let buffer = device.alloc(pg_core::DType::F32, 32)?;
                device.fill(&buffer, (rank + 1) as f64, &device.current_stream())?;
                Ok(buffer)
            })
            .collect::<Result<Vec<_>>>()?;
        device.sleep_kernel(&device.current_stream(), SLEEP)?;
        let works = buffers.iter().map(|b| pg.all_reduce(b, ReduceOp::Sum)).collect::<Result<Vec<_>>>()?;
        let last = works.last().cloned().expect("works");
        let futures = works.iter().map(|w| (w.future(), w.clone())).collect::<Vec<_>>();
        let resolved = std::thread::scope(|scope| {
            let executor = scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a tokio runtime");
                runtime.block_on(async move {
                    let tasks: Vec<_> = futures
                        .into_iter()
                        .map(|(future, work)| {
                            tokio::spawn(async move {
                                let result = work.await;
                                (result, future.gpu_completed())
                            })
                        })
                        .collect();
                    let mut out = Vec::new();
                    for task in tasks {
                        out.push(task.await.expect("the task ran"));
                    }
                    out
                })
            });
            last.synchronize()?;
            Ok::<_, pg_core::Error>(executor.join().expect("the executor thread"))
        })?;
        assert_eq!(resolved.len(), WORKS);
        for (result, gpu_done) in resolved {
            result?;
            assert!(gpu_done?, "a Work resolved before the device finished it");
        }
        for buffer in &buffers {
            assert!(read_f32(&device, buffer)?.iter().all(|v| *v == 3.0));
        }
        Ok(())
    });
    for result in results {
        result.expect("rank");
    }
}

#[test]
fn tokio_join_of_two_awaited_works() {
    let world = World::new(WorldConfig { devices: 1, ..Default::default() });
    let store = world.store();
    let results = world.run(1, |rank, device| -> Result<()> {
        let pg = ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 1, device.clone(), Options::builder().build())?;
        let a = device.alloc(pg_core::DType::F32, 8)?;
        let b = device.alloc(pg_core::DType::F32, 8)?;
        device.sleep_kernel(&device.current_stream(), SLEEP)?;
        let (wa, wb) = (pg.all_reduce(&a, ReduceOp::Sum)?, pg.all_reduce(&b, ReduceOp::Sum)?);
        let (ra, rb) = std::thread::scope(|scope| {
            let executor = scope.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a tokio runtime");
                runtime.block_on(async { tokio::join!(&wa, &wb) })
            });
            wb.synchronize().expect("synchronize");
            executor.join().expect("the executor thread")
        });
        ra?;
        rb?;
        assert!(wa.is_success() && wb.is_success());
        Ok(())
    });
    for result in results {
        result.expect("rank");
    }
}

#[test]
fn a_host_callback_runs_when_the_stream_reaches_it_in_virtual_time() {
    let world = World::new(WorldConfig { devices: 1, ..Default::default() });
    let clock = world.clone();
    let ran_at = world.run(1, move |_, device| {
        let stream = device.current_stream();
        device.sleep_kernel(&stream, SLEEP).expect("sleep kernel");
        let (tx, rx) = std::sync::mpsc::channel();
        let ran = Arc::new(AtomicBool::new(false));
        let (set, clock) = (Arc::clone(&ran), clock.clone());
        stream
            .launch_host_fn(Box::new(move || {
                set.store(true, Ordering::SeqCst);
                let _ = tx.send(clock.now());
            }))
            .expect("launch_host_fn");
        assert!(!ran.load(Ordering::SeqCst), "the callback ran before its stream reached it");
        stream.synchronize().expect("synchronize");
        // The clock stands still while this thread runs: the callback, due now, reports when it ran.
        rx.recv().expect("the callback ran")
    });
    assert!(ran_at[0] >= SLEEP, "the callback ran at {:?}, before the kernel ahead of it ended", ran_at[0]);
}

/// The ranks leave while a host callback still waits behind a kernel (an awaited Work whose group gave up on it):
/// the device runs on, so the clock moves to the kernel's end for the callback, which runs at that time, and the
/// world ends with no host thread left.
#[test]
fn a_host_callback_behind_a_kernel_runs_after_the_ranks_have_left() {
    let world = World::new(WorldConfig { devices: 1, ..Default::default() });
    let clock = world.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    world.run(1, move |_, device| {
        let stream = device.current_stream();
        device.sleep_kernel(&stream, SLEEP).expect("sleep kernel");
        let (clock, tx) = (clock.clone(), tx.clone());
        stream.launch_host_fn(Box::new(move || tx.send(clock.now()).expect("send"))).expect("launch_host_fn");
    });
    assert_eq!(world.leftover_threads(), Vec::<String>::new(), "host threads outlived the ranks");
    let ran_at = rx.try_recv().expect("the callback ran before the world ended");
    assert!(ran_at >= SLEEP, "the callback ran at {ran_at:?}, before the kernel ahead of it ended");
}

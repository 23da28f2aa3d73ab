//! The training example's tests, which `cargo test` runs (the example is built with `test = true`): its CUDA half
//! where a CPU can check it (its PTX, its cuBLAS arguments against a reference column-major GEMM), and its step on the simulated backend: world 1, 2 and 4 (one thread per rank) follow the same
//! loss curve to float tolerance (which they would not if a bucket's all_reduce were missing or wrong: each
//! rank would then train on its own share), the loss falls, and a batch that does not split evenly is refused.
//! The elastic loop loses a rank of 4 mid-run and goes on at 3 on the same curve.

use std::sync::Arc;

use pg_core::{Options, ProcessGroup};

use crate::train::{Config, StepRecord};
use crate::{cuda, elastic, host, train};

fn config() -> Config {
    Config { batch: 64, steps: 25, ..Config::default() }
}

/// Every rank's curve of a simulated world of `world` ranks.
fn curves(world: usize, config: &Config) -> Vec<pg_core::Result<Vec<StepRecord>>> {
    let sim = pg_mock::World::new(pg_mock::WorldConfig { devices: world, ..Default::default() });
    let store = sim.store();
    sim.run(world, |rank, device| {
        let pg = ProcessGroup::<pg_mock::Mock>::new(
            Arc::clone(&store),
            rank,
            world,
            device.clone(),
            Options::builder().build(),
        )?;
        let math = host::HostMath::new(device);
        let records = train::train(&math, &pg, config);
        pg.shutdown()?;
        records
    })
}

/// One bucket (both layers' gradients in one all_reduce after backward) trains as two do: the same curve.
#[test]
fn one_bucket_follows_the_two_bucket_curve() {
    let two = config();
    let one = Config { buckets: 1, ..two };
    for world in [1, 2] {
        let a: Vec<f64> = curves(world, &two).remove(0).unwrap().iter().map(|r| r.loss).collect();
        let b: Vec<f64> = curves(world, &one).remove(0).unwrap().iter().map(|r| r.loss).collect();
        assert_eq!(a.len(), b.len());
        for (step, (a, b)) in a.iter().zip(&b).enumerate() {
            assert!((a - b).abs() <= 1e-6 * a.abs(), "world {world} step {step}: one bucket {b}, two {a}");
        }
    }
    let three = Config { buckets: 3, ..two };
    assert!(curves(1, &three).remove(0).is_err(), "1 or 2 buckets");
}

#[test]
fn world_n_follows_world_1s_loss_curve_and_the_loss_falls() {
    let config = config();
    let one: Vec<f64> = curves(1, &config).remove(0).unwrap().iter().map(|r| r.loss).collect();
    assert_eq!(one.len(), config.steps);
    let (first, last) = (one[0], one[one.len() - 1]);
    assert!(last < 0.8 * first, "the loss did not fall: {first} -> {last}");
    for world in [2, 4] {
        for (rank, curve) in curves(world, &config).into_iter().enumerate() {
            let curve: Vec<f64> = curve.unwrap().iter().map(|r| r.loss).collect();
            for (step, (a, b)) in one.iter().zip(&curve).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs(),
                    "world {world} rank {rank} step {step}: {b} against world 1's {a}"
                );
            }
        }
    }
}

#[test]
fn the_buckets_are_enqueued_in_backward_order_after_the_initial_broadcasts() {
    let config = Config { steps: 2, ..config() };
    let sim = pg_mock::World::new(pg_mock::WorldConfig { devices: 2, ..Default::default() });
    let store = sim.store();
    let recorded = sim.run(2, |rank, device| {
        let pg =
            ProcessGroup::<pg_mock::Mock>::new(Arc::clone(&store), rank, 2, device.clone(), Options::builder().build())
                .unwrap();
        train::train(&host::HostMath::new(device), &pg, &config).unwrap();
        let dump: serde_json::Value = serde_json::from_str(&pg.flight_recorder_json()).unwrap();
        pg.shutdown().unwrap();
        dump["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["profiling_name"].as_str().unwrap().to_owned(), e["input_sizes"][0][0].as_u64().unwrap()))
            .collect::<Vec<_>>()
    });
    let (layer1, layer2) = ((64 * 256 + 256) as u64, (256 * 16 + 16) as u64);
    let mut want = vec![("nccl:broadcast".to_owned(), layer1), ("nccl:broadcast".to_owned(), layer2)];
    for _ in 0..config.steps {
        // Layer 2's bucket first (backward produces it first), then layer 1's, then the one-element loss.
        want.extend([layer2, layer1, 1].map(|n| ("nccl:all_reduce".to_owned(), n)));
    }
    for ops in recorded {
        assert_eq!(ops, want);
    }
}

#[test]
fn a_global_batch_that_does_not_split_evenly_is_refused() {
    let config = Config { batch: 30, steps: 1, ..config() };
    for result in curves(4, &config) {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), pg_core::ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("does not split evenly between 4 ranks"), "{err}");
    }
}

#[test]
fn the_kernels_ptx_declares_each_entry_once_with_its_own_labels_and_plain_register_names() {
    for entry in ["mlp_bias_act(", "mlp_relu_backward(", "mlp_mse(", "mlp_sgd("] {
        assert_eq!(cuda::PTX.matches(&format!(".visible .entry {entry}")).count(), 1, "{entry}");
    }
    for line in cuda::PTX.lines().filter(|l| l.trim_start().starts_with(".reg")) {
        assert!(!line.contains('%'), "a declared register clashes with PTX's %-names: {line}");
    }
    let labels: Vec<&str> = cuda::PTX.lines().filter(|l| l.ends_with(':')).collect();
    let unique: std::collections::BTreeSet<&str> = labels.iter().copied().collect();
    assert_eq!((labels.len(), unique.len()), (4, 4), "{labels:?}");
}

/// A column-major `C = op(A) op(B)` as cuBLAS defines it (`op` by the flags, leading dimensions given).
fn reference_sgemm(
    transposed: (bool, bool),
    (m, n, k): (usize, usize, usize),
    (a, b): (&[f32], &[f32]),
    ld: (usize, usize, usize),
) -> Vec<f32> {
    let mut c = vec![0.0f32; ld.2 * n];
    for j in 0..n {
        for i in 0..m {
            let mut sum = 0.0;
            for p in 0..k {
                let x = if transposed.0 { a[p + i * ld.0] } else { a[i + p * ld.0] };
                let y = if transposed.1 { b[j + p * ld.1] } else { b[p + j * ld.1] };
                sum += x * y;
            }
            c[i + j * ld.2] = sum;
        }
    }
    c
}

#[test]
fn the_cublas_arguments_compute_the_row_major_product_the_host_math_computes() {
    use train::Math as _;
    let (m, n, k) = (3, 5, 4);
    let a: Vec<f32> = (0..m * k).map(|i| train::uniform(7, 1, i as u64)).collect();
    let b: Vec<f32> = (0..k * n).map(|i| train::uniform(7, 2, i as u64)).collect();
    let world = pg_mock::World::new(pg_mock::WorldConfig { devices: 1, ..Default::default() });
    let checked = world.run(1, |_, device| {
        let math = host::HostMath::new(device);
        let (ha, hb, hc) = (math.zeros(m * k).unwrap(), math.zeros(k * n).unwrap(), math.zeros(m * n).unwrap());
        math.upload(&ha, &a).unwrap();
        math.upload(&hb, &b).unwrap();
        for transposed in [(false, false), (false, true), (true, false), (true, true)] {
            math.gemm(
                transposed,
                (m, n, k),
                1.0,
                train::all(&ha, m * k),
                train::all(&hb, k * n),
                0.0,
                train::all(&hc, m * n),
            )
            .unwrap();
            let want = math.download(&hc).unwrap();
            let call = cuda::column_major(transposed, (m, n, k));
            // cuBLAS gets B first, then A, and writes C^T column-major: the row-major C.
            let got = reference_sgemm(call.transposed, call.dims, (&b, &a), call.ld);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{transposed:?}: {got:?} against {want:?}");
            }
        }
        true
    });
    assert_eq!(checked, vec![true]);
}

#[test]
fn the_generator_gives_the_numbers_the_pytorch_script_computes() {
    // Computed by bench/torch_ddp_mlp.py's `uniform` in Python integers: the two sides train on the same data.
    let first: Vec<f32> = (0..4).map(|i| train::uniform(0, 1, i)).collect();
    assert_eq!(first, [-0.13694406, 0.82519436, 0.49829936, 0.49156344]);
    let inputs: Vec<f32> = (100..102).map(|i| train::uniform(5, (1 << 32) + 3, i)).collect();
    assert_eq!(inputs, [-0.47416627, -0.16909039]);
}

/// Every rank's elastic run of a simulated world of `world` ranks in which world rank `kill.0` dies at step `kill.1`.
fn elastic_runs(world: usize, config: &Config, kill: (usize, usize)) -> Vec<elastic::ElasticRun> {
    elastic_runs_with(world, config, kill, None, true)
}

/// [`elastic_runs`] in which the dead rank's replacement joins at step `rejoin`, in a world whose communicators
/// grow (`native_grow`, NCCL 2.29) or not (the grow is then a rendezvous).
fn elastic_runs_with(
    world: usize,
    config: &Config,
    kill: (usize, usize),
    rejoin: Option<usize>,
    native_grow: bool,
) -> Vec<elastic::ElasticRun> {
    let sim = pg_mock::World::new(pg_mock::WorldConfig { devices: world, native_grow, ..Default::default() });
    let store = sim.store();
    let options = Options::builder()
        .timeout(std::time::Duration::from_secs(2))
        .revoke_on_error(true)
        .dump_on_timeout(false)
        .watchdog_period(std::time::Duration::from_millis(10))
        .build();
    let settings = elastic::Elastic { agree_timeout: std::time::Duration::from_millis(500), death: Some(kill), rejoin };
    sim.run(world, |rank, device| {
        let pg = ProcessGroup::<pg_mock::Mock>::new(Arc::clone(&store), rank, world, device.clone(), options.clone())
            .unwrap();
        elastic::train_elastic(&host::HostMath::new(device), &pg, config, &settings).unwrap()
    })
}

#[test]
fn elastic_training_loses_a_rank_of_4_goes_on_at_3_and_follows_world_1s_curve() {
    let config = config();
    let one: Vec<f64> = curves(1, &config).remove(0).unwrap().iter().map(|r| r.loss).collect();
    let (victim, step) = (2, 10);
    let runs = elastic_runs(4, &config, (victim, step));
    for (rank, run) in runs.iter().enumerate() {
        if rank == victim {
            assert!(run.died, "the victim ran on");
            assert_eq!(run.records.len(), step, "the victim's steps before it died");
            continue;
        }
        assert!(!run.died);
        let curve: Vec<f64> = run.records.iter().map(|r| r.loss).collect();
        assert_eq!(curve.len(), config.steps, "rank {rank}: every step ran once");
        for (i, (a, b)) in one.iter().zip(&curve).enumerate() {
            assert!((a - b).abs() <= 1e-4 * a.abs(), "rank {rank} step {i}: {b} against world 1's {a}");
        }
        let [recovery] = run.recoveries[..] else { panic!("rank {rank}: recoveries {:?}", run.recoveries) };
        assert_eq!((recovery.step, recovery.from, recovery.to), (step, 4, 3), "rank {rank}");
        // Detection is the op timeout (2 s) plus a watchdog period; recovery is the agreement's timeout (500 ms,
        // waiting for the dead rank) plus the shrink.
        assert!((2000.0..2100.0).contains(&recovery.detect_ms), "rank {rank}: detection {recovery:?}");
        assert!((500.0..1000.0).contains(&recovery.recover_ms), "rank {rank}: recovery {recovery:?}");
    }
    // The same run gives the same recoveries, to the nanosecond of virtual time: the mock orders the survivors'
    // store operations by virtual time (ties by thread), never by the host threads' real order.
    let again = elastic_runs(4, &config, (victim, step));
    for (a, b) in runs.iter().zip(&again) {
        assert_eq!(a.recoveries, b.recoveries);
    }
}

#[test]
fn elastic_training_goes_4_to_3_and_back_to_4_when_a_replacement_joins_and_follows_world_1s_curve() {
    let config = config();
    let one: Vec<f64> = curves(1, &config).remove(0).unwrap().iter().map(|r| r.loss).collect();
    let (victim, death, rejoin) = (2, 8, 16);
    // With ncclCommGrow (NCCL 2.29) and without it (the grow a rendezvous): the same steps and curve.
    for native_grow in [true, false] {
        elastic_grows_back(&config, &one, (victim, death, rejoin), native_grow);
    }
}

/// Checks one elastic run in which `victim` dies at step `death` and its replacement joins at step `rejoin`.
fn elastic_grows_back(config: &Config, one: &[f64], (victim, death, rejoin): (usize, usize, usize), native_grow: bool) {
    let runs = elastic_runs_with(4, config, (victim, death), Some(rejoin), native_grow);
    for (rank, run) in runs.iter().enumerate() {
        let steps: Vec<usize> = run.records.iter().map(|r| r.step).collect();
        if rank == victim {
            // The dead rank's steps, then its replacement's from the rejoin on.
            assert!(run.died, "the victim ran on");
            let want: Vec<usize> = (0..death).chain(rejoin..config.steps).collect();
            assert_eq!(steps, want, "the victim's and its replacement's steps");
            assert!(run.recoveries.is_empty() && run.growths.is_empty(), "the replacement joined, it did not grow");
        } else {
            assert!(!run.died);
            assert_eq!(steps, (0..config.steps).collect::<Vec<_>>(), "rank {rank}: every step ran once");
            let [recovery] = run.recoveries[..] else { panic!("rank {rank}: recoveries {:?}", run.recoveries) };
            assert_eq!((recovery.step, recovery.from, recovery.to), (death, 4, 3), "rank {rank}");
            let [growth] = run.growths[..] else { panic!("rank {rank}: growths {:?}", run.growths) };
            assert_eq!((growth.step, growth.from, growth.to), (rejoin, 3, 4), "rank {rank}");
            assert!(growth.ms < 100.0, "rank {rank}: the grow took {growth:?}");
        }
        // At 4, at 3 and at 4 again, every rank (the replacement included) is on world 1's curve.
        for record in &run.records {
            let want = one[record.step];
            let got = record.loss;
            assert!((want - got).abs() <= 1e-4 * want.abs(), "rank {rank} step {}: {got} against {want}", record.step);
        }
    }
    // The same run gives the same recoveries and grows, to the nanosecond of virtual time.
    let again = elastic_runs_with(4, config, (victim, death), Some(rejoin), native_grow);
    for (a, b) in runs.iter().zip(&again) {
        assert_eq!((&a.recoveries, &a.growths), (&b.recoveries, &b.growths));
    }
}

#[test]
fn the_global_batch_is_redistributed_over_the_survivors_row_for_row() {
    for world in 1..=8 {
        let shares: Vec<_> = (0..world).map(|rank| elastic::rows(64, rank, world)).collect();
        assert_eq!(shares.first().unwrap().start, 0);
        assert_eq!(shares.last().unwrap().end, 64);
        for pair in shares.windows(2) {
            assert_eq!(pair[0].end, pair[1].start, "world {world}: {shares:?}");
        }
        let (min, max) = shares.iter().map(|r| r.len()).fold((usize::MAX, 0), |(a, b), n| (a.min(n), b.max(n)));
        assert!(max - min <= 1, "world {world}: {shares:?}");
    }
}

//! The training example's step on the simulated backend: world 1, 2 and 4 (one thread per rank) follow the same
//! loss curve to float tolerance (which they would not if a bucket's all_reduce were missing or wrong: each
//! rank would then train on its own share), the loss falls, and a batch that does not split evenly is refused.

#![forbid(unsafe_code)]

#[path = "../examples/ddp_mlp/host.rs"]
mod host;
#[path = "../examples/ddp_mlp/train.rs"]
mod train;

use std::sync::Arc;

use pg_core::{Options, ProcessGroup};
use train::{Config, StepRecord};

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
fn a_global_batch_that_does_not_split_evenly_is_refused() {
    let config = Config { batch: 30, steps: 1, ..config() };
    for result in curves(4, &config) {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), pg_core::ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("does not split evenly between 4 ranks"), "{err}");
    }
}

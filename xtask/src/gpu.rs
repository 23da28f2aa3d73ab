//! Real-GPU runs: one process per GPU over env:// (wired by the GPU issue).

use super::experiments::{ExperimentConfig, RankResults};

/// Runs the experiments on the NCCL backend, one process per GPU, and collects every rank's results.
pub fn run_experiments(_config: &ExperimentConfig) -> Result<Vec<RankResults>, String> {
    Err("the nccl backend is not wired into `cargo xtask experiments` yet (see `cargo xtask gpu-test`)".to_owned())
}

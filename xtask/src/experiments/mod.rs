//! The three experiments (communicator cache, completion semantics, streams), generic over the backend.

mod cache;
mod report;
mod run;
mod semantics;
mod streams;

pub use report::aggregate;
pub use run::{main, run_rank, ExperimentConfig, RankContext, RankResults};

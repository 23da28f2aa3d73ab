//! The seed's three experiments (cache, semantics, streams), generic over the backend.

mod cache;
mod report;
mod run;
mod semantics;
mod streams;

pub use report::aggregate;
pub use run::{main, ExperimentConfig, RankResults};
#[allow(unused_imports, reason = "used by the GPU worker once it is wired")]
pub use run::{run_rank, RankContext};

//! A crate downstream of pg, built as its users build it: the product crates with their default features (no
//! `testing`), code written once over [`pg_core::Backend`], and the backend picked at run time ([`Choice`]).
//!
//! [`collectives`] is the generic part: an all_reduce and a broadcast through a process group, read back on the
//! host. [`run`] makes the world for the chosen backend: simulated ranks as threads of this process on the mock,
//! or this process's rank on a GPU over NCCL, which says "not applicable" with the reason where there is no GPU
//! or no libnccl.
//!
//! The test hooks of the `testing` feature are absent here; each of these fails to compile for that reason alone
//! (pg-nccl's own docs compile the same lines when the feature is on):
//!
//! ```compile_fail
//! let _launches: Vec<pg_nccl::launches::KernelLaunch> = pg_nccl::launches::for_device(0);
//! ```
//!
//! ```compile_fail
//! let (_calls, _time) = pg_nccl::call_timing::totals();
//! ```
//!
//! ```compile_fail
//! let _: Option<pg_nccl::raw::RawComm> = None;
//! ```
//!
//! while the same crate's public items resolve:
//!
//! ```
//! let _: Option<pg_nccl::Communicator> = None;
//! let _ = pg_nccl::available;
//! ```
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use pg_core::store::{HashStore, Store};
use pg_core::{Backend, DType, Device as _, Options, ProcessGroup, ReduceOp, Result};

/// What one rank read back after [`collectives`].
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The rank.
    pub rank: usize,
    /// Its buffer after an all_reduce (sum) of `rank + 1` from every rank: `n (n + 1) / 2`.
    pub sum: f32,
    /// Its buffer after a broadcast from rank 0 of the value 42 (every other rank held `-1`).
    pub broadcast: f32,
}

/// The collectives, written once for every backend: an all_reduce of `rank + 1` and a broadcast from rank 0, each
/// waited for on the current stream, then read back.
pub fn collectives<B: Backend>(pg: &ProcessGroup<B>, device: &B::Device) -> Result<Seen> {
    let stream = device.current_stream();
    let buffer = device.alloc(DType::F32, 256)?;
    device.fill(&buffer, (pg.rank() + 1) as f64, &stream)?;
    pg.all_reduce(&buffer, ReduceOp::Sum)?.wait()?;
    let sum = first(&device.copy_to_host(&buffer, &stream)?);
    device.fill(&buffer, if pg.rank() == 0 { 42.0 } else { -1.0 }, &stream)?;
    pg.broadcast(&buffer, 0)?.wait()?;
    let broadcast = first(&device.copy_to_host(&buffer, &stream)?);
    Ok(Seen { rank: pg.rank(), sum, broadcast })
}

fn first(bytes: &[u8]) -> f32 {
    f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// The backend, picked at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The simulated backend: every rank a thread of this process.
    Mock,
    /// Real GPUs: this process is one rank.
    Nccl,
}

impl std::str::FromStr for Choice {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<Self, String> {
        match name {
            "mock" => Ok(Choice::Mock),
            "nccl" => Ok(Choice::Nccl),
            other => Err(format!("unknown backend {other:?}: mock or nccl")),
        }
    }
}

/// What a run gave.
#[derive(Debug)]
pub enum Ran {
    /// Each rank this process ran, in rank order.
    Ranks(Vec<Seen>),
    /// The backend cannot run here, and why (no GPU, no libnccl).
    NotApplicable(String),
}

/// Runs [`collectives`] on `choice` in a world of `world` ranks. On NCCL this process is every rank of a world
/// of one, or, with torchrun's variables set (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...), its rank of theirs.
pub fn run(choice: Choice, world: usize) -> Result<Ran> {
    match choice {
        Choice::Mock => {
            let sim = pg_mock::World::new(pg_mock::WorldConfig { devices: world, ..Default::default() });
            let store = sim.store();
            let seen = sim.run(world, |rank, device| -> Result<Seen> {
                let options = Options::builder().build();
                let pg = ProcessGroup::<pg_mock::Mock>::new(Arc::clone(&store), rank, world, device.clone(), options)?;
                let seen = collectives(&pg, &device)?;
                pg.shutdown()?;
                Ok(seen)
            });
            Ok(Ran::Ranks(seen.into_iter().collect::<Result<_>>()?))
        }
        Choice::Nccl => {
            if let Err(why) = pg_nccl::available() {
                return Ok(Ran::NotApplicable(why.to_string()));
            }
            let (store, rank, world, local): (Arc<dyn Store>, usize, usize, usize) =
                match std::env::var_os("WORLD_SIZE") {
                    Some(_) => {
                        let rdzv = pg_core::store::rendezvous::env_rendezvous(Duration::from_secs(300))
                            .map_err(|e| pg_core::Error::Backend(e.to_string()))?;
                        let local = rdzv.local_rank.unwrap_or(rdzv.rank);
                        (rdzv.store, rdzv.rank, rdzv.world_size, local)
                    }
                    None if world == 1 => (Arc::new(HashStore::new()), 0, 1, 0),
                    None => {
                        let why = format!("a world of {world} on NCCL is one process per rank: start it with torchrun");
                        return Ok(Ran::NotApplicable(why));
                    }
                };
            let device = pg_nccl::Device::new(local)?;
            let pg =
                ProcessGroup::<pg_nccl::Nccl>::new(store, rank, world, device.clone(), Options::builder().build())?;
            let seen = collectives(&pg, &device)?;
            pg.shutdown()?;
            Ok(Ran::Ranks(vec![seen]))
        }
    }
}

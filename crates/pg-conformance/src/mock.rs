//! The harness of the simulated backend: each world is a fresh [`pg_mock::World`] with one spare device (for
//! the wrong-device checks), hazards recorded, and every capability offered.

use std::sync::Arc;

use pg_core::DType;
use pg_mock::{Mock, MockBuffer, MockDevice, World, WorldConfig};

use crate::harness::{Capabilities, Clock, Fault, Harness, Hazard, KernelLaunch, Offers, Ran, Rank};

/// How long a rank waits at the end of a world for its peers (virtual time) before it lets go of the world's
/// groups.
const WORLD_END_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs the suite on the simulated backend at a given world size.
#[derive(Debug, Clone)]
pub struct MockHarness {
    world_size: usize,
    native_grow: bool,
    capabilities: pg_core::Capabilities,
}

impl MockHarness {
    /// A harness whose worlds have up to `world_size` ranks.
    pub fn new(world_size: usize) -> Self {
        Self { world_size, native_grow: true, capabilities: pg_core::Capabilities::all() }
    }

    /// This harness with worlds whose devices declare `capabilities` ([`WorldConfig::capabilities`]): the calls
    /// that need one of the others are refused.
    pub fn with_capabilities(self, capabilities: pg_core::Capabilities) -> Self {
        Self { capabilities, ..self }
    }

    /// This harness with worlds that model an NCCL without `ncclCommGrow` (before 2.29): grows are made by a
    /// rendezvous ([`WorldConfig::native_grow`]).
    pub fn without_native_grow(self) -> Self {
        Self { native_grow: false, ..self }
    }
}

/// The capabilities of one simulated world.
struct MockCaps(World);

impl Capabilities<Mock> for MockCaps {
    fn kernel_log(&self, rank: usize) -> Option<Vec<KernelLaunch>> {
        Some(kernel_log(&self.0, rank))
    }

    fn clock(&self) -> Option<Clock> {
        Some(Clock::Virtual)
    }

    fn other_device(&self, rank: usize) -> Option<MockDevice> {
        let devices = self.0.config().devices;
        Some(self.0.device((rank + 1) % devices))
    }

    fn inject(&self, fault: Fault) -> bool {
        self.0.inject(match fault {
            Fault::AsyncError { rank, after_ops } => pg_mock::Fault::AsyncError { rank, after_ops },
            Fault::NeverJoin { rank } => pg_mock::Fault::NeverJoin { rank },
            // The simulated rank's death closes its store connections too.
            Fault::KillAt { rank, op } | Fault::KillProcessAt { rank, op } => pg_mock::Fault::KillAt { rank, op },
            Fault::StoreHostedBy { rank } => pg_mock::Fault::StoreHostedBy { rank },
            Fault::SlowTeardown { rank, duration } => pg_mock::Fault::SlowTeardown { rank, duration },
        });
        true
    }

    fn hazards(&self) -> Option<Vec<Hazard>> {
        let hazards = self.0.hazards().into_iter().map(|h| Hazard { kind: h.kind, rank: h.device, message: h.message });
        Some(hazards.collect())
    }

    fn foreign_buffer(&self, device: &MockDevice, dtype: DType, numel: usize) -> Option<pg_core::Result<MockBuffer>> {
        Some(device.foreign_buffer(dtype, numel))
    }
}

/// The capabilities of `world`: its kernel logs, virtual clock, spare device, faults and hazard report.
pub fn capabilities(world: &World) -> Arc<dyn Capabilities<Mock>> {
    Arc::new(MockCaps(world.clone()))
}

/// The kernels device `rank` of `world` ran, by start time, as the suite sees them.
pub fn kernel_log(world: &World, rank: usize) -> Vec<KernelLaunch> {
    world
        .kernel_log(rank)
        .into_iter()
        .map(|k| KernelLaunch { stream_id: k.stream_id, kind: k.kind, name: k.name, span: Some((k.start, k.end)) })
        .collect()
}

impl Harness for MockHarness {
    type B = Mock;

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn offers(&self) -> Offers {
        Offers {
            kernel_log: true,
            kernel_spans: true,
            clock: Some(Clock::Virtual),
            hazards: true,
            faults: true,
            process_kills: true,
            slow_teardown: true,
            other_device: true,
        }
    }

    fn run<T: Send>(&self, n: usize, body: impl Fn(&Rank<Mock>) -> T + Sync) -> Result<Ran<Mock, T>, String> {
        if n == 0 || n > self.world_size {
            return Err(format!("a world of {n} ranks asked of a harness of {}", self.world_size));
        }
        let world = World::new(WorldConfig {
            devices: n + 1,
            hazard_mode: pg_mock::HazardMode::Record,
            native_grow: self.native_grow,
            capabilities: self.capabilities,
            ..WorldConfig::default()
        });
        let caps = capabilities(&world);
        let store = world.store();
        let results = world.run(n, |rank, device| {
            let rank = Rank::new(rank, n, device, Arc::clone(&store), Arc::clone(&caps));
            let result = body(&rank);
            // The world ends as on real GPUs: once every rank is done, its groups are shut down or let go.
            if let Err(error) = rank.finish_world(WORLD_END_TIMEOUT) {
                tracing::warn!(target: "pg", "{error}");
            }
            result
        });
        // A world ends with its host threads: one left behind (a host callback never run, a helper of a group
        // nobody let go) would outlive the case and fail later in another's time.
        let left = world.leftover_threads();
        if let Some(first) = left.first() {
            return Err(format!(
                "the world ended with {} simulated host thread(s) left; the first: {first}",
                left.len()
            ));
        }
        Ok(Ran { results: results.into_iter().enumerate().collect(), caps })
    }
}

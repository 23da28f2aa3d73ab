//! Helpers shared by the test modules: worlds, communicators through the store, reading buffers back.

use std::sync::Arc;

use pg_core::{Buffer as _, CommConfig, DType, Device as _};
use pg_mock::{MockBuffer, MockCommunicator, MockDevice, MockStream, World, WorldConfig};
use pg_store::Store;

/// A world of `n` devices with the default costs.
pub fn world(n: usize) -> World {
    World::new(WorldConfig::with_devices(n))
}

/// Rank 0 makes a unique id and shares it under `key`; every rank joins (blocking init).
pub fn comm(store: &Arc<dyn Store>, key: &str, device: &MockDevice, rank: usize, size: usize) -> MockCommunicator {
    let id = if rank == 0 {
        let id = device.new_unique_id().unwrap();
        store.set(key, &id.0).unwrap();
        id
    } else {
        pg_core::UniqueId(store.get(key).unwrap())
    };
    device.create_communicator(&id, size, rank, &CommConfig::default()).unwrap()
}

/// A buffer of `values` on the current stream.
pub fn buffer(device: &MockDevice, dtype: DType, values: &[f64]) -> MockBuffer {
    let b = device.alloc(dtype, values.len()).unwrap();
    device.copy_from_host(&b, &pg_mock::encode(dtype, values), &device.current_stream()).unwrap();
    b
}

/// The values of `buffer`, read on `stream`.
pub fn read(device: &MockDevice, buffer: &MockBuffer, stream: &MockStream) -> Vec<f64> {
    pg_mock::decode(buffer.dtype(), &device.copy_to_host(buffer, stream).unwrap())
}

//! Helpers the experiments and the benchmark share: groups under their own store prefix, filled buffers, reads.

use std::sync::Arc;

use pg_core::store::PrefixStore;
use pg_core::{Buffer as _, DType, Device as _, Options, OptionsBuilder, ProcessGroup};
use pg_nccl::{Buffer, Nccl};

use crate::Rank;

pub type Group = ProcessGroup<Nccl>;

/// A group named `name` whose store keys live under `name/` (so groups never read each other's ids).
pub fn group(ctx: &Rank, name: &str, options: OptionsBuilder) -> Result<Group, String> {
    let store = Arc::new(PrefixStore::new(name.to_owned(), ctx.store.clone()));
    // PyTorch's environment variables (and PG_REUSE_WORKS) apply, as they would in a user's program.
    let options: Options =
        options.group_name(name.to_owned()).group_desc(name.to_owned()).build_with_env().map_err(|e| e.to_string())?;
    ProcessGroup::new(store, ctx.rank, ctx.world, ctx.device.clone(), options).map_err(|e| e.to_string())
}

/// `numel` elements of `dtype` set to `value`, on the current stream.
pub fn filled(ctx: &Rank, dtype: DType, numel: usize, value: f64) -> Result<Buffer, String> {
    let device = &ctx.device;
    let buffer = device.alloc(dtype, numel).map_err(|e| e.to_string())?;
    device.fill(&buffer, value, &device.current_stream()).map_err(|e| e.to_string())?;
    Ok(buffer)
}

/// The buffer's elements as f64, read on the current stream (waits for it).
pub fn read(ctx: &Rank, buffer: &Buffer) -> Result<Vec<f64>, String> {
    let device = &ctx.device;
    let bytes = device.copy_to_host(buffer, &device.current_stream()).map_err(|e| e.to_string())?;
    let values = match buffer.dtype() {
        DType::F32 => bytes.chunks(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
        DType::F64 => bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::I64 => bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::I32 => bytes.chunks(4).map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect(),
        DType::BF16 => bytes
            .chunks(2)
            .map(|c| f64::from(f32::from_bits(u32::from(u16::from_le_bytes(c.try_into().unwrap())) << 16)))
            .collect(),
        other => return Err(format!("read of {other} not supported here")),
    };
    Ok(values)
}

/// Whether every element equals `want`.
pub fn all_equal(values: &[f64], want: f64) -> Result<(), String> {
    match values.iter().position(|v| *v != want) {
        None => Ok(()),
        Some(i) => Err(format!("element {i} is {} instead of {want} ({} elements)", values[i], values.len())),
    }
}

/// The sum of rank + 1 over the world.
pub fn rank_sum(world: usize) -> f64 {
    (world * (world + 1) / 2) as f64
}

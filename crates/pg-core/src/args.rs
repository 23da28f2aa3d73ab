//! The argument rules of every op, written once: the process group checks them before anything is enqueued, and
//! the backends' communicators (pg-mock, pg-nccl) check the same rules on the calls they receive.
//!
//! Each rule takes the op's name (`what`), plain values (ranks, sizes) and buffers, and fails with
//! [`Error::InvalidArgument`] naming the op and what was wrong. The process group speaks of "a group of size n"
//! and a communicator is the group's: the messages are the same at both layers.

use crate::{Buffer, DType, Error, ReduceOp, Result};

/// `buffer` is on device `device`.
pub fn on_device(what: &str, buffer: &impl Buffer, device: usize) -> Result<()> {
    match buffer.device_index() == device {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "{what}: a buffer is on device {} but this rank runs on device {device}",
            buffer.device_index()
        ))),
    }
}

/// Two buffers of an op hold one dtype.
pub fn same_dtype(what: &str, expected: DType, found: DType) -> Result<()> {
    match expected == found {
        true => Ok(()),
        false => Err(Error::invalid(format!("{what}: the buffers mix dtypes {expected} and {found}"))),
    }
}

/// `rank` (a `root` or a `peer`, as `which` says) is a rank of a group of `size`.
pub fn rank_in_range(what: &str, which: &str, rank: usize, size: usize) -> Result<()> {
    match rank < size {
        true => Ok(()),
        false => Err(Error::invalid(format!("{what}: {which} {rank} is out of range for a group of size {size}"))),
    }
}

/// `peer` is another rank than `rank` of a group of `size` (point-to-point to itself is not supported).
pub fn peer(what: &str, peer: usize, rank: usize, size: usize) -> Result<()> {
    rank_in_range(what, "peer", peer, size)?;
    match peer == rank {
        true => Err(Error::invalid(format!(
            "{what}: peer {peer} is this rank; a send or receive to itself is not supported"
        ))),
        false => Ok(()),
    }
}

/// An input and an output of one dtype whose sizes relate as `output * inp == input * out` in a group of `size`
/// (`(size, 1)` for an all-gather, `(1, size)` for a reduce-scatter, `(1, 1)` for the same size); a product past
/// the address space is named as such.
pub fn scaled(
    what: &str,
    input: &impl Buffer,
    output: &impl Buffer,
    (out, inp): (usize, usize),
    size: usize,
) -> Result<()> {
    same_dtype(what, input.dtype(), output.dtype())?;
    let overflow = |which: &str, numel: usize| {
        Error::invalid(format!(
            "{what}: the {which} of {numel} elements times {size} ranks overflows the address space"
        ))
    };
    let lhs = input.numel().checked_mul(out).ok_or_else(|| overflow("input", input.numel()))?;
    let rhs = output.numel().checked_mul(inp).ok_or_else(|| overflow("output", output.numel()))?;
    match lhs == rhs {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "{what}: sizes do not fit a group of {size} ranks (input {} elements, output {} elements)",
            input.numel(),
            output.numel()
        ))),
    }
}

/// A list (`which`: `inputs`, `outputs`) of `len` buffers has one per rank of a group of `size`.
pub fn per_rank(what: &str, which: &str, len: usize, size: usize) -> Result<()> {
    match len == size {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "{what}: {which} has {len} buffers, but the group has {size} ranks (one per rank)"
        ))),
    }
}

/// Every buffer of `buffers` holds `dtype`.
pub fn uniform_dtype<'a, B: Buffer + 'a>(
    what: &str,
    dtype: DType,
    buffers: impl IntoIterator<Item = &'a B>,
) -> Result<()> {
    buffers.into_iter().try_for_each(|buffer| same_dtype(what, dtype, buffer.dtype()))
}

/// Gather's outputs or scatter's inputs (`which`): on the root one buffer per rank, each of `like`'s dtype and
/// size; on any other rank none.
pub fn root_list<B: Buffer>(
    what: &str,
    which: &str,
    list: &[B],
    (root, rank, size): (usize, usize, usize),
    like: &B,
) -> Result<()> {
    if rank != root {
        return match list.is_empty() {
            true => Ok(()),
            false => Err(Error::invalid(format!(
                "{what}: {which} must be empty on a rank that is not the root (rank {rank} of root {root} was given \
                 {} buffers)",
                list.len()
            ))),
        };
    }
    per_rank(what, which, list.len(), size)?;
    for (i, buffer) in list.iter().enumerate() {
        same_dtype(what, like.dtype(), buffer.dtype())?;
        if buffer.numel() != like.numel() {
            return Err(Error::invalid(format!(
                "{what}: {which}[{i}] has {} elements, but every one must have {} (this rank's buffer)",
                buffer.numel(),
                like.numel()
            )));
        }
    }
    Ok(())
}

/// The chunk (`which[rank]`) of a list that this rank exchanges with itself matches its own buffer's size.
pub fn own_chunk(what: &str, which: &str, rank: usize, chunk: &impl Buffer, own: &impl Buffer) -> Result<()> {
    match chunk.numel() == own.numel() {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "{what}: {which}[{rank}] has {} elements, but this rank's (rank {rank}) own buffer has {}",
            chunk.numel(),
            own.numel()
        ))),
    }
}

/// The splits of a buffer (`which`: `input`, `output`) of `numel` elements over a group of `size`: one per rank,
/// summing to `numel`; `None` is equal chunks, which `numel` must divide into.
pub fn splits(what: &str, which: &str, numel: usize, splits: Option<&[usize]>, size: usize) -> Result<Vec<usize>> {
    let Some(splits) = splits else {
        if size == 0 || numel % size != 0 {
            return Err(Error::invalid(format!(
                "{what}: the {which} of {numel} elements does not split into {size} equal chunks (give {which}_splits)"
            )));
        }
        return Ok(vec![numel / size; size]);
    };
    split_count(what, which, splits.len(), size)?;
    let sum = splits.iter().try_fold(0usize, |sum, &s| sum.checked_add(s));
    if sum != Some(numel) {
        let sum = sum.map_or_else(|| "more than the address space".to_owned(), |s| s.to_string());
        return Err(Error::invalid(format!(
            "{what}: {which}_splits {splits:?} sum to {sum} elements, but the {which} has {numel}"
        )));
    }
    Ok(splits.to_vec())
}

/// The splits of a buffer (`which`: `input`, `output`) count `len` entries, one per rank of a group of `size`.
pub fn split_count(what: &str, which: &str, len: usize, size: usize) -> Result<()> {
    match len == size {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "{what}: {which}_splits has {len} entries, but the group has {size} ranks (one per rank)"
        ))),
    }
}

/// The `count` elements from element `offset` of a buffer of `numel` lie inside it.
pub fn chunk_inside(what: &str, offset: usize, count: usize, numel: usize) -> Result<()> {
    match offset.checked_add(count) {
        Some(end) if end <= numel => Ok(()),
        _ => Err(Error::invalid(format!(
            "{what}: elements {offset}..{} are outside a buffer of {numel} elements",
            offset.saturating_add(count)
        ))),
    }
}

/// `scalar` can be the `PREMUL_SUM` factor of an op on `input`: `input`'s dtype takes `PREMUL_SUM`, and the factor
/// is one element of it on `input`'s device.
pub fn pre_mul_sum_factor(what: &str, input: &impl Buffer, scalar: &impl Buffer) -> Result<()> {
    ReduceOp::check_pre_mul_sum(input.dtype())?;
    if scalar.numel() != 1 || scalar.dtype() != input.dtype() || scalar.device_index() != input.device_index() {
        return Err(Error::invalid(format!(
            "{what}: a PREMUL_SUM factor is one element of the input's dtype {} on device {}; got {} of {} on device {}",
            input.dtype(),
            input.device_index(),
            scalar.numel(),
            scalar.dtype(),
            scalar.device_index()
        )));
    }
    Ok(())
}

/// `op` is not `PREMUL_SUM` where the op carries no factor (only all_reduce and reduce_scatter take one), so that
/// a factor is never silently dropped.
pub fn no_pre_mul_sum(what: &str, op: ReduceOp) -> Result<()> {
    match op {
        ReduceOp::PreMulSum(_) => Err(Error::invalid(format!(
            "{what} with PREMUL_SUM: only all_reduce and reduce_scatter take a PREMUL_SUM factor"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_peers_are_checked_against_the_group() {
        assert!(rank_in_range("broadcast", "root", 3, 4).is_ok());
        let error = rank_in_range("broadcast", "root", 4, 4).expect_err("out of range");
        assert_eq!(error.to_string(), "invalid argument: broadcast: root 4 is out of range for a group of size 4");
        assert!(peer("send", 1, 0, 2).is_ok());
        assert!(peer("send", 0, 0, 2).expect_err("itself").to_string().contains("itself"));
        assert!(peer("send", 2, 0, 2).expect_err("out of range").to_string().contains("out of range"));
    }

    #[test]
    fn splits_are_one_per_rank_and_sum_to_the_buffer() {
        assert_eq!(splits("a2a", "input", 6, None, 3).expect("equal"), vec![2, 2, 2]);
        assert!(splits("a2a", "input", 7, None, 3).expect_err("uneven").to_string().contains("equal chunks"));
        assert_eq!(splits("a2a", "input", 6, Some(&[0, 5, 1]), 3).expect("given"), vec![0, 5, 1]);
        assert!(splits("a2a", "input", 6, Some(&[1, 5]), 3).expect_err("short").to_string().contains("entries"));
        assert!(splits("a2a", "input", 6, Some(&[1, 1, 1]), 3).expect_err("sum").to_string().contains("sum to 3"));
        let huge = splits("a2a", "input", 6, Some(&[usize::MAX, 1, 0]), 3).expect_err("overflow");
        assert!(huge.to_string().contains("more than the address space"), "{huge}");
    }

    #[test]
    fn dtypes_and_factors_are_named() {
        assert!(same_dtype("all_to_all", DType::F32, DType::F32).is_ok());
        assert!(same_dtype("all_to_all", DType::F32, DType::I32).expect_err("mixed").to_string().contains("dtypes"));
        assert!(no_pre_mul_sum("reduce", ReduceOp::Sum).is_ok());
        assert!(no_pre_mul_sum("reduce", ReduceOp::PreMulSum(2.0)).is_err());
    }
}

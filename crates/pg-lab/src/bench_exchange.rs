//! The exchange patterns of the all-to-all and point-to-point benchmarks, written once over a backend: the
//! split definitions, the buffers each rank sends and expects, the process group's enqueue call, and the check
//! of what arrived.
//!
//! The GPU benchmark (`pg-nccl-gpu bench-all-to-all`, `bench-p2p`) times these calls on NCCL; the tests run the
//! same calls on the simulated backend, so the split and ring logic the benchmark relies on is checked without
//! a GPU. Buffers hold f32; every element rank `a` sends rank `b` is [`chunk_value`]`(world, a, b)`, so a chunk
//! that lands in the wrong place, or not at all, is seen.

use std::time::Instant;

use pg_core::{Backend, Buffer as _, DType, Device as _, Error, P2POp, ProcessGroup, Result, WorkHandle};

/// What the point-to-point ring benchmark says at world size 1, in its results and in place of figures.
pub const RING_NOT_APPLICABLE: &str = "not applicable at world size 1: a ring needs two ranks";

/// The skewed split, in words: for `--help` texts and the result files.
pub const SKEWED_DEFINITION: &str = "\
skewed splits: with n ranks and E f32 elements per rank, rank a gives rank b the weight
w(a,b) = (a + b) % n + 1, except w(0, n-1) = 0 when n >= 2 (rank 0 sends the last rank a zero-length
chunk); rank a sends rank b floor(E * w(a,b) / sum_c w(a,c)) elements, and what the floors leave over
goes to rank a's chunk for itself. Every rank sends exactly E elements; what a rank receives depends on
its rank. equal splits: E rounded down to a multiple of n, E / n elements to every rank.";

/// How each rank's input of an all-to-all is cut into chunks, one per destination rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every chunk the same size (torch's `all_to_all_single` without split lists).
    Equal,
    /// Chunks of different sizes, one of them empty (see [`SKEWED_DEFINITION`]).
    Skewed,
}

impl Split {
    /// Both splits, in the order the benchmark runs them.
    pub const ALL: [Split; 2] = [Split::Equal, Split::Skewed];

    /// The name used on the command line and in the result files.
    pub fn name(self) -> &'static str {
        match self {
            Split::Equal => "equal",
            Split::Skewed => "skewed",
        }
    }

    /// The split named `text` (`equal` or `skewed`).
    pub fn parse(text: &str) -> std::result::Result<Split, String> {
        Split::ALL
            .into_iter()
            .find(|split| split.name() == text)
            .ok_or_else(|| format!("unknown split '{text}' (expected equal or skewed)"))
    }
}

/// The f32 elements of each rank's input for a benchmark size of `bytes`: `bytes / 4`, rounded down to a
/// multiple of `world` for equal splits (as nccl-tests does).
pub fn elements(split: Split, bytes: usize, world: usize) -> usize {
    let numel = bytes / 4;
    match split {
        Split::Equal => numel / world.max(1) * world.max(1),
        Split::Skewed => numel,
    }
}

fn weight(world: usize, from: usize, to: usize) -> usize {
    if world >= 2 && from == 0 && to == world - 1 {
        0
    } else {
        (from + to) % world + 1
    }
}

/// The elements rank `from` sends rank `to` when every rank's input holds `numel` elements.
pub fn chunk(split: Split, numel: usize, world: usize, from: usize, to: usize) -> usize {
    match split {
        Split::Equal => numel / world,
        Split::Skewed => {
            let total: usize = (0..world).map(|c| weight(world, from, c)).sum();
            let share = |c: usize| (numel as u128 * weight(world, from, c) as u128 / total as u128) as usize;
            if to == from {
                numel - (0..world).filter(|&c| c != from).map(share).sum::<usize>()
            } else {
                share(to)
            }
        }
    }
}

/// Rank `rank`'s input splits: what it sends each rank, in elements.
pub fn input_splits(split: Split, numel: usize, world: usize, rank: usize) -> Vec<usize> {
    (0..world).map(|to| chunk(split, numel, world, rank, to)).collect()
}

/// Rank `rank`'s output splits: what it receives from each rank, in elements.
pub fn output_splits(split: Split, numel: usize, world: usize, rank: usize) -> Vec<usize> {
    (0..world).map(|from| chunk(split, numel, world, from, rank)).collect()
}

/// The value of every element rank `from` sends rank `to` (exact in f32 for worlds up to 4096 ranks).
pub fn chunk_value(world: usize, from: usize, to: usize) -> f32 {
    (from * world + to + 1) as f32
}

/// One rank's side of an exchange the benchmarks time: what the process group contestant enqueues, and how
/// what arrived is checked.
pub trait Exchange<B: Backend> {
    /// The bytes each rank sends per op (the size the bandwidths are computed from).
    fn bytes(&self) -> usize;

    /// The process group's call for one op.
    fn enqueue(&self, pg: &ProcessGroup<B>) -> Result<WorkHandle<B>>;

    /// Sets every element this rank receives into to -1 on the current stream, so that a check sees only what
    /// the next exchange writes.
    fn clear(&self, device: &B::Device) -> Result<()>;

    /// Reads what this rank received on the current stream and checks that every element came from the right
    /// rank.
    fn check(&self, device: &B::Device) -> Result<()>;
}

/// Host times of one timed loop, per op, in microseconds.
#[derive(Debug, Clone, Default)]
pub struct HostTimes {
    /// The enqueue call alone.
    pub enqueue_us: Vec<f64>,
    /// `wait()` on its Work.
    pub wait_us: Vec<f64>,
}

/// The process group contestant's timed loop: `ops` times, the exchange's call (timed alone), then `wait()`
/// on its Work (timed alone), as PyTorch code runs an op synchronously. The caller times the device around it.
pub fn pg_loop<B: Backend>(pg: &ProcessGroup<B>, exchange: &dyn Exchange<B>, ops: usize) -> Result<HostTimes> {
    let mut times = HostTimes { enqueue_us: Vec::with_capacity(ops), wait_us: Vec::with_capacity(ops) };
    for _ in 0..ops {
        let start = Instant::now();
        let work = exchange.enqueue(pg)?;
        times.enqueue_us.push(start.elapsed().as_secs_f64() * 1e6);
        let start = Instant::now();
        work.wait()?;
        times.wait_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(times)
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

/// Checks that `bytes` (f32, little-endian) hold `chunks` in order, each a `(from rank, count, value)`.
fn check_chunks(what: &str, bytes: &[u8], chunks: impl Iterator<Item = (usize, usize, f32)>) -> Result<()> {
    let mut at = 0usize;
    for (from, count, want) in chunks {
        let end = at + count;
        if end * 4 > bytes.len() {
            return Err(Error::invalid(format!("{what}: the buffer is shorter than the chunks it should hold")));
        }
        let bad =
            bytes[at * 4..end * 4].chunks_exact(4).position(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) != want);
        if let Some(i) = bad {
            let c = &bytes[(at + i) * 4..(at + i) * 4 + 4];
            return Err(Error::invalid(format!(
                "{what}: element {} (element {i} of the chunk from rank {from}) is {} instead of {want}",
                at + i,
                f32::from_le_bytes([c[0], c[1], c[2], c[3]])
            )));
        }
        at = end;
    }
    Ok(())
}

/// One rank's buffers of an all-to-all: the input cut by its input splits, each chunk holding its
/// [`chunk_value`], and an output sized by its output splits.
#[derive(Debug)]
pub struct AllToAll<B: Backend> {
    /// How the chunks are cut.
    pub split: Split,
    /// What this rank sends.
    pub input: B::Buffer,
    /// Where the chunks from every rank land.
    pub output: B::Buffer,
    /// Elements sent to each rank.
    pub input_splits: Vec<usize>,
    /// Elements received from each rank.
    pub output_splits: Vec<usize>,
    rank: usize,
    world: usize,
}

impl<B: Backend> AllToAll<B> {
    /// Allocates and fills rank `rank`'s buffers for a size of `bytes` per rank, on the current stream.
    pub fn new(device: &B::Device, split: Split, bytes: usize, rank: usize, world: usize) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(Error::invalid(format!("all-to-all bench: rank {rank} of a world of {world}")));
        }
        let numel = elements(split, bytes, world);
        if numel == 0 {
            return Err(Error::invalid(format!("all-to-all bench: {bytes} B holds no f32 element per rank")));
        }
        let input_splits = input_splits(split, numel, world, rank);
        let output_splits = output_splits(split, numel, world, rank);
        let stream = device.current_stream();
        let input = device.alloc(DType::F32, numel)?;
        let values = input_splits
            .iter()
            .enumerate()
            .flat_map(|(to, &count)| std::iter::repeat_n(chunk_value(world, rank, to), count));
        device.copy_from_host(&input, &f32_bytes(values), &stream)?;
        let output = device.alloc(DType::F32, output_splits.iter().sum())?;
        let case = Self { split, input, output, input_splits, output_splits, rank, world };
        case.clear(device)?;
        Ok(case)
    }
}

impl<B: Backend> Exchange<B> for AllToAll<B> {
    fn bytes(&self) -> usize {
        self.input.size_bytes()
    }

    /// `all_to_all_single` with the split lists, or with none for equal splits (as torch's
    /// `all_to_all_single` is called for equal chunks).
    fn enqueue(&self, pg: &ProcessGroup<B>) -> Result<WorkHandle<B>> {
        match self.split {
            Split::Equal => pg.all_to_all_single(&self.output, &self.input, None, None),
            Split::Skewed => {
                pg.all_to_all_single(&self.output, &self.input, Some(&self.output_splits), Some(&self.input_splits))
            }
        }
    }

    fn clear(&self, device: &B::Device) -> Result<()> {
        device.fill(&self.output, -1.0, &device.current_stream())
    }

    /// Checks that the chunk from each rank holds that rank's value.
    fn check(&self, device: &B::Device) -> Result<()> {
        let bytes = device.copy_to_host(&self.output, &device.current_stream())?;
        let (rank, world) = (self.rank, self.world);
        let what = format!("all_to_all_single ({} splits) on rank {rank}", self.split.name());
        let chunks =
            self.output_splits.iter().enumerate().map(|(from, &count)| (from, count, chunk_value(world, from, rank)));
        check_chunks(&what, &bytes, chunks)
    }
}

/// One rank's buffers of the point-to-point ring: it sends its buffer to rank + 1 and receives from
/// rank - 1 (modulo the world), in one `batch_isend_irecv`.
#[derive(Debug)]
pub struct Ring<B: Backend> {
    /// What this rank sends to [`Ring::next`].
    pub send: B::Buffer,
    /// Where the message from [`Ring::prev`] lands.
    pub recv: B::Buffer,
    /// The rank this one sends to.
    pub next: usize,
    /// The rank this one receives from.
    pub prev: usize,
    rank: usize,
    world: usize,
}

impl<B: Backend> Ring<B> {
    /// Allocates and fills rank `rank`'s buffers, `bytes` each; at world size 1 an `InvalidArgument` saying
    /// [`RING_NOT_APPLICABLE`].
    pub fn new(device: &B::Device, bytes: usize, rank: usize, world: usize) -> Result<Self> {
        if world < 2 {
            return Err(Error::invalid(format!("p2p ring bench: {RING_NOT_APPLICABLE}")));
        }
        if rank >= world {
            return Err(Error::invalid(format!("p2p ring bench: rank {rank} of a world of {world}")));
        }
        let numel = bytes / 4;
        if numel == 0 {
            return Err(Error::invalid(format!("p2p ring bench: {bytes} B holds no f32 element")));
        }
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        let send = device.alloc(DType::F32, numel)?;
        device.fill(&send, f64::from(chunk_value(world, rank, next)), &device.current_stream())?;
        let recv = device.alloc(DType::F32, numel)?;
        let ring = Self { send, recv, next, prev, rank, world };
        ring.clear(device)?;
        Ok(ring)
    }

    /// The batch: a send to [`Ring::next`] and a receive from [`Ring::prev`].
    pub fn ops(&self) -> Vec<P2POp<B>> {
        vec![P2POp::send(&self.send, self.next), P2POp::recv(&self.recv, self.prev)]
    }
}

impl<B: Backend> Exchange<B> for Ring<B> {
    fn bytes(&self) -> usize {
        self.send.size_bytes()
    }

    /// `batch_isend_irecv` of [`Ring::ops`].
    fn enqueue(&self, pg: &ProcessGroup<B>) -> Result<WorkHandle<B>> {
        pg.batch_isend_irecv(&self.ops())
    }

    fn clear(&self, device: &B::Device) -> Result<()> {
        device.fill(&self.recv, -1.0, &device.current_stream())
    }

    /// Checks that the receive buffer holds rank - 1's message.
    fn check(&self, device: &B::Device) -> Result<()> {
        let bytes = device.copy_to_host(&self.recv, &device.current_stream())?;
        let what = format!("batch_isend_irecv ring on rank {}", self.rank);
        let want = chunk_value(self.world, self.prev, self.rank);
        check_chunks(&what, &bytes, std::iter::once((self.prev, self.recv.numel(), want)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pg_core::{Options, ProcessGroup};
    use pg_mock::{Mock, World, WorldConfig};

    use super::*;

    #[test]
    fn skewed_splits_send_every_element_and_include_an_empty_chunk() {
        for world in 1..=9 {
            for numel in [1usize, 7, 256, 1000, 1 << 20] {
                for rank in 0..world {
                    let sent = input_splits(Split::Skewed, numel, world, rank);
                    assert_eq!(sent.iter().sum::<usize>(), numel, "world {world}, {numel} elements, rank {rank}");
                }
                let all: usize =
                    (0..world).map(|r| output_splits(Split::Skewed, numel, world, r).iter().sum::<usize>()).sum();
                assert_eq!(all, numel * world, "what is received is what is sent, world {world}");
            }
            if world >= 2 {
                assert_eq!(chunk(Split::Skewed, 1 << 20, world, 0, world - 1), 0, "the empty chunk, world {world}");
            }
        }
    }

    #[test]
    fn skewed_splits_agree_between_sender_and_receiver() {
        for world in 1..=8 {
            for a in 0..world {
                for b in 0..world {
                    let sent = input_splits(Split::Skewed, 262_144, world, a)[b];
                    let expected = output_splits(Split::Skewed, 262_144, world, b)[a];
                    assert_eq!(sent, expected, "rank {a} to rank {b} at world {world}");
                }
            }
        }
    }

    #[test]
    fn skewed_splits_follow_the_weights() {
        // World 3, 600 elements: rank 1's weights are 2, 3, 1 (sum 6), so 200, 300 and 100 elements; rank 0's
        // are 1, 2 and 0 (the empty chunk to the last rank), so 200 to itself and 400 to rank 1.
        assert_eq!(input_splits(Split::Skewed, 600, 3, 1), vec![200, 300, 100]);
        assert_eq!(input_splits(Split::Skewed, 600, 3, 0), vec![200, 400, 0]);
        assert_eq!(input_splits(Split::Skewed, 601, 3, 2), vec![300, 100, 201], "the remainder stays home");
        assert_eq!(input_splits(Split::Skewed, 5, 1, 0), vec![5], "world 1 sends everything to itself");
    }

    #[test]
    fn equal_splits_round_down_to_a_multiple_of_the_world() {
        assert_eq!(elements(Split::Equal, 1024, 3), 255);
        assert_eq!(input_splits(Split::Equal, 255, 3, 2), vec![85, 85, 85]);
        assert_eq!(elements(Split::Skewed, 1024, 3), 256);
        assert_eq!(Split::parse("skewed"), Ok(Split::Skewed));
        assert!(Split::parse("uneven").unwrap_err().contains("uneven"));
    }

    /// Runs `body` on every rank of a simulated world of `n`, each with a process group.
    fn on_mock<T: Send>(n: usize, body: impl Fn(&ProcessGroup<Mock>) -> T + Send + Sync) -> Vec<T> {
        let world = World::new(WorldConfig { devices: n, ..Default::default() });
        let store = world.store();
        world.run(n, |rank, device| {
            let pg = ProcessGroup::<Mock>::new(Arc::clone(&store), rank, n, device, Options::builder().build())
                .expect("a process group");
            let out = body(&pg);
            pg.shutdown().expect("shutdown");
            out
        })
    }

    #[test]
    fn the_pg_all_to_all_loop_exchanges_every_chunk_on_the_mock() {
        for world in [1, 2, 3] {
            for split in Split::ALL {
                let results = on_mock(world, |pg| -> Result<usize> {
                    let device = pg.device();
                    let case = AllToAll::<Mock>::new(device, split, 4096, pg.rank(), world)?;
                    assert!(case.check(device).is_err(), "a cleared output fails the check");
                    let times = pg_loop(pg, &case, 3)?;
                    assert_eq!((times.enqueue_us.len(), times.wait_us.len()), (3, 3), "one time per op");
                    case.check(device)?;
                    Ok(case.bytes())
                });
                for (rank, result) in results.into_iter().enumerate() {
                    let bytes = result.unwrap_or_else(|e| panic!("world {world}, {split:?}, rank {rank}: {e}"));
                    assert_eq!(bytes, elements(split, 4096, world) * 4);
                }
            }
        }
    }

    #[test]
    fn the_pg_ring_loop_passes_each_message_to_the_next_rank_on_the_mock() {
        for world in [2, 3] {
            let results = on_mock(world, |pg| -> Result<(usize, usize)> {
                let device = pg.device();
                let ring = Ring::<Mock>::new(device, 4096, pg.rank(), world)?;
                assert!(ring.check(device).is_err(), "a cleared receive buffer fails the check");
                let times = pg_loop(pg, &ring, 3)?;
                assert_eq!((times.enqueue_us.len(), times.wait_us.len()), (3, 3), "one time per op");
                ring.check(device)?;
                Ok((ring.next, ring.prev))
            });
            for (rank, result) in results.into_iter().enumerate() {
                let (next, prev) = result.unwrap_or_else(|e| panic!("world {world}, rank {rank}: {e}"));
                assert_eq!((next, prev), ((rank + 1) % world, (rank + world - 1) % world));
            }
        }
    }

    #[test]
    fn bad_sizes_and_ranks_are_invalid_arguments() {
        let results = on_mock(2, |pg| {
            let device = pg.device();
            let errors = [
                AllToAll::<Mock>::new(device, Split::Skewed, 3, pg.rank(), 2).map(drop),
                AllToAll::<Mock>::new(device, Split::Equal, 4, pg.rank(), 2).map(drop),
                AllToAll::<Mock>::new(device, Split::Equal, 1024, 2, 2).map(drop),
                Ring::<Mock>::new(device, 2, pg.rank(), 2).map(drop),
                Ring::<Mock>::new(device, 1024, 5, 2).map(drop),
            ];
            errors.map(|result| match result {
                Err(Error::InvalidArgument(message)) => message,
                other => panic!("expected an InvalidArgument, got {other:?}"),
            })
        });
        let messages = &results[0];
        assert!(messages[0].contains("3 B holds no f32 element"), "{}", messages[0]);
        assert!(messages[1].contains("4 B holds no f32 element per rank"), "one element cannot be split in two");
        assert!(messages[2].contains("rank 2 of a world of 2"), "{}", messages[2]);
        assert!(messages[3].contains("2 B holds no f32 element"), "{}", messages[3]);
        assert!(messages[4].contains("rank 5 of a world of 2"), "{}", messages[4]);
    }

    #[test]
    fn the_ring_is_refused_at_world_size_one() {
        let results = on_mock(1, |pg| Ring::<Mock>::new(pg.device(), 4096, 0, 1).map(drop));
        let message = results[0].as_ref().unwrap_err().to_string();
        assert!(message.contains(RING_NOT_APPLICABLE), "{message}");
        // And the process group refuses the self-send the ring would be at world size 1.
        let refused = on_mock(1, |pg| {
            let buffer = pg.device().alloc(DType::F32, 4).expect("alloc");
            pg.batch_isend_irecv(&[P2POp::send(&buffer, 0), P2POp::recv(&buffer, 0)]).map(drop)
        });
        assert!(matches!(refused[0], Err(Error::InvalidArgument(_))), "{:?}", refused[0]);
    }
}

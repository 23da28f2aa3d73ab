//! What the benchmarks are sized for: `nvlink` (the default; sizes up to 1 GiB, hundreds of ops per trial, every
//! contestant and the CUDA-graph rows) or `network` (ranks sharing a GPU over NCCL's socket transport on
//! loopback, where an op costs milliseconds and a few GB/s is the ceiling: sizes up to 16 MiB, ten ops per trial,
//! the raw loop, the raw loop with events and pg only, so that the three benchmarks at worlds 2 and 4 fit one
//! device call of a few minutes). `bench/torch_profile.py` holds the same lists for the PyTorch contestants.

/// A benchmark profile (`--bench-profile`, `BENCH_PROFILE` in the bundle's run.sh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Nvlink,
    Network,
}

/// The all_reduce sizes of the network profile, bytes.
pub const NETWORK_ALL_REDUCE_SIZES: [usize; 6] = [8, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// The all-to-all and p2p sizes of the network profile, bytes each rank sends per op.
pub const NETWORK_EXCHANGE_SIZES: [usize; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// The sizes from which the network profile's device-time target applies (pg within 3% of raw).
pub const NETWORK_TARGET_FROM_BYTES: u64 = 64 << 10;

impl Profile {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "nvlink" => Ok(Profile::Nvlink),
            "network" => Ok(Profile::Network),
            other => Err(format!("unknown bench profile {other} (nvlink, network)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Nvlink => "nvlink",
            Profile::Network => "network",
        }
    }

    /// The all_reduce sizes up to `max` bytes.
    pub fn all_reduce_sizes(self, max: usize) -> Vec<usize> {
        let all: &[usize] = match self {
            Profile::Nvlink => &[
                8,
                64,
                1 << 10,
                8 << 10,
                64 << 10,
                256 << 10,
                1 << 20,
                4 << 20,
                16 << 20,
                64 << 20,
                256 << 20,
                1 << 30,
            ],
            Profile::Network => &NETWORK_ALL_REDUCE_SIZES,
        };
        all.iter().copied().filter(|&s| s <= max).collect()
    }

    /// The all-to-all and p2p sizes up to `max` bytes.
    pub fn exchange_sizes(self, max: usize) -> Vec<usize> {
        let all: &[usize] = match self {
            Profile::Nvlink => {
                &[1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
            }
            Profile::Network => &NETWORK_EXCHANGE_SIZES,
        };
        all.iter().copied().filter(|&s| s <= max).collect()
    }

    /// Ops per timed trial: enough to amortise the spin for small messages, few for large ones; over the network
    /// transport an op costs milliseconds whatever its size, so ten (five above 1 MiB) amortise the spin.
    pub fn ops_per_trial(self, bytes: usize) -> usize {
        match (self, bytes) {
            (Profile::Nvlink, 0..=1_048_576) => 200,
            (Profile::Nvlink, 1_048_577..=67_108_864) => 20,
            (Profile::Nvlink, 67_108_865..=268_435_456) => 10,
            (Profile::Nvlink, _) => 5,
            (Profile::Network, 0..=1_048_576) => 10,
            (Profile::Network, _) => 5,
        }
    }

    /// Whether the all_reduce bench runs its one-setting variant groups, the pool-stream contestant and the
    /// CUDA-graph rows (the nvlink profile's breakdown of pg's overhead; the network profile skips them).
    pub fn full_breakdown(self) -> bool {
        self == Profile::Nvlink
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_the_network_one_stops_at_16_mib() {
        assert_eq!(Profile::parse("network"), Ok(Profile::Network));
        assert_eq!(Profile::parse("nvlink").map(Profile::name), Ok("nvlink"));
        assert!(Profile::parse("nvls").is_err());
        assert_eq!(Profile::Network.all_reduce_sizes(1 << 30).last(), Some(&(16 << 20)));
        assert_eq!(Profile::Network.exchange_sizes(1 << 20).last(), Some(&(1 << 20)));
        assert_eq!(Profile::Nvlink.all_reduce_sizes(1 << 30).len(), 12);
        assert_eq!(Profile::Network.ops_per_trial(8), 10);
        assert_eq!(Profile::Nvlink.ops_per_trial(8), 200);
    }

    /// The PyTorch scripts' lists (bench/torch_profile.py) are these.
    #[test]
    fn the_python_profile_holds_the_same_lists() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/torch_profile.py");
        let text = std::fs::read_to_string(path).expect("bench/torch_profile.py");
        let list = |name: &str| -> Vec<usize> {
            let line = text.lines().find(|l| l.starts_with(&format!("{name} = ["))).expect(name);
            let inner = line.split_once('[').unwrap().1.split_once(']').unwrap().0;
            inner
                .split(',')
                .map(|item| match item.trim().split_once("<<") {
                    Some((a, b)) => a.trim().parse::<usize>().unwrap() << b.trim().parse::<usize>().unwrap(),
                    None => item.trim().parse().unwrap(),
                })
                .collect()
        };
        assert_eq!(list("NETWORK_ALL_REDUCE_SIZES"), NETWORK_ALL_REDUCE_SIZES);
        assert_eq!(list("NETWORK_EXCHANGE_SIZES"), NETWORK_EXCHANGE_SIZES);
    }
}

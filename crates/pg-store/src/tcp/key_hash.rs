//! The hash of the server's key tables: a keyed multiply-and-fold hash, several times cheaper than the
//! standard library's SipHash on short keys.
//!
//! Each process draws its keys at random (from the standard library's `RandomState`), so a client cannot
//! compute which keys collide; the function is not cryptographic, the same trade made by `foldhash` and
//! `ahash`. PyTorch's server hashes keys with an unkeyed `std::hash`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// Multiplies two words as one 128-bit product and folds its halves together.
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// The process's hash keys, drawn once.
fn process_keys() -> [u64; 2] {
    static KEYS: OnceLock<[u64; 2]> = OnceLock::new();
    *KEYS.get_or_init(|| {
        let random = RandomState::new();
        [random.hash_one(0x243F_6A88_85A3_08D3u64), random.hash_one(0x1319_8A2E_0370_7344u64)]
    })
}

/// Builds [`KeyHasher`]s with the process's keys.
#[derive(Clone, Copy, Debug)]
pub(super) struct KeyHash {
    keys: [u64; 2],
}

impl Default for KeyHash {
    fn default() -> Self {
        Self { keys: process_keys() }
    }
}

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher { state: self.keys[0], key: self.keys[1] }
    }
}

/// Hashes one key: every eight bytes are folded into the state with a multiplication by the secret key.
pub(super) struct KeyHasher {
    state: u64,
    key: u64,
}

impl KeyHasher {
    fn absorb(&mut self, word: u64) {
        // An odd multiplier keeps every bit of `state ^ word` in the product.
        self.state = fold(self.state ^ word, self.key | 1).rotate_left(23);
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.absorb(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            // The length of the tail goes into the top byte, so that trailing zeros are not lost.
            self.absorb(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.absorb(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.absorb(n as u64);
    }

    fn finish(&self) -> u64 {
        fold(self.state, self.key.rotate_left(32) | 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(bytes: &[u8]) -> u64 {
        KeyHash::default().hash_one(bytes)
    }

    #[test]
    fn keys_that_differ_anywhere_hash_apart() {
        let keys: [&[u8]; 9] = [b"", b"\0", b"\0\0", b"a", b"a\0", b"set/1/2", b"set/2/1", b"12345678", b"123456789"];
        let mut hashes: Vec<u64> = keys.iter().map(|k| hash(k)).collect();
        assert_eq!(hash(b"set/1/2"), hash(b"set/1/2"), "a key hashes the same every time");
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), keys.len(), "no two of {keys:?} collide");
    }

    #[test]
    fn similar_keys_spread_over_the_buckets() {
        // 4,096 keys of one shape over 64 buckets (the low six bits): every bucket gets some, none a quarter.
        let mut buckets = [0usize; 64];
        for i in 0..4096 {
            buckets[(hash(format!("/worker/{i}").as_bytes()) & 63) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| n > 20 && n < 1024), "{buckets:?}");
    }
}

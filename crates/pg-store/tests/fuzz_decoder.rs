//! Property tests of the request decoder and of the server under random, truncated and oversized frames:
//! no panic, bounded buffering, the offending connection closed, other clients unaffected.
//!
//! The inputs come from a fixed-seed generator, so every run checks the same cases.
//! For a longer search, set `PG_FUZZ_SEED` (a number mixed into every seed) and `PG_FUZZ_SCALE` (a
//! multiplier of the round counts); a failure message names the random seed to replay.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use pg_store::wire::{decode_request, encode_request, Request, VALIDATION_MAGIC};
use pg_store::{Limits, ServerOptions, TcpStoreServer};
use pg_store::{Store, TcpStore};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }

    fn keys(&mut self) -> Vec<Vec<u8>> {
        (0..self.below(4)).map(|_| self.bytes(12)).collect()
    }

    fn request(&mut self) -> Request {
        match self.below(19) {
            0 => Request::Validate { magic: VALIDATION_MAGIC },
            1 => Request::Set { key: self.bytes(16), value: self.bytes(64) },
            2 => Request::CompareSet { key: self.bytes(16), expected: self.bytes(8), desired: self.bytes(8) },
            3 => Request::Get { key: self.bytes(16) },
            4 => Request::Add { key: self.bytes(16), delta: self.next() as i64 },
            5 => Request::Check { keys: self.keys() },
            6 => Request::Wait { keys: self.keys() },
            7 => Request::GetNumKeys,
            8 => Request::DeleteKey { key: self.bytes(16) },
            9 => Request::Append { key: self.bytes(16), value: self.bytes(32) },
            10 => Request::MultiGet { keys: self.keys() },
            11 => Request::MultiSet { pairs: self.keys().into_iter().map(|k| (k, vec![1, 2])).collect() },
            12 => Request::CancelWait,
            13 => Request::Ping { nonce: self.next() as u32 },
            14 => Request::QueuePush { key: self.bytes(16), value: self.bytes(16) },
            15 => Request::QueuePop { key: self.bytes(16) },
            16 => Request::QueueLen { key: self.bytes(16) },
            17 => Request::ListKeys,
            _ => Request::Barrier { key: self.bytes(16), world_size: self.next() as i64 },
        }
    }
}

/// One test's random seed: fixed unless `PG_FUZZ_SEED` asks for another search.
fn seed(base: u64) -> u64 {
    let extra = std::env::var("PG_FUZZ_SEED").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    (base ^ extra.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1
}

/// How many rounds to run: `base` times `PG_FUZZ_SCALE` (1 by default).
fn rounds(base: usize) -> usize {
    base * std::env::var("PG_FUZZ_SCALE").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(1).max(1)
}

fn small_limits() -> Limits {
    Limits {
        max_key_len: 64,
        max_value_len: 1024,
        max_key_count: 16,
        max_message_len: 4096,
        max_reply_len: 8192,
        ..Limits::default()
    }
}

#[test]
fn valid_requests_round_trip_and_every_prefix_is_incomplete() {
    let mut rng = Rng(seed(0x5EED_0001));
    eprintln!("seed {}", rng.0);
    let limits = small_limits();
    for _ in 0..rounds(2000) {
        let request = rng.request();
        let bytes = encode_request(&request);
        assert_eq!(decode_request(&bytes, true, &limits), Ok(Some((request.clone(), bytes.len()))));
        let cut = rng.below(bytes.len());
        assert_eq!(decode_request(&bytes[..cut], true, &limits), Ok(None), "{request:?} cut at {cut}");
        // Two requests back to back decode one at a time.
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes);
        assert_eq!(decode_request(&two, true, &limits), Ok(Some((request, bytes.len()))));
    }
}

#[test]
fn random_and_mutated_bytes_never_panic_nor_overrun() {
    let mut rng = Rng(seed(0x5EED_0002));
    eprintln!("seed {}", rng.0);
    let limits = small_limits();
    for round in 0..rounds(20_000) {
        let mut bytes = match round % 2 {
            0 => rng.bytes(96),
            _ => encode_request(&rng.request()),
        };
        // Mutate a few bytes, sometimes a length field into something huge.
        for _ in 0..rng.below(4) {
            if !bytes.is_empty() {
                let at = rng.below(bytes.len());
                bytes[at] = rng.next() as u8;
            }
        }
        if rng.below(8) == 0 && bytes.len() > 9 {
            bytes[1..9].copy_from_slice(&u64::MAX.to_le_bytes());
        }
        for validated in [false, true] {
            match decode_request(&bytes, validated, &limits) {
                Ok(Some((request, used))) => {
                    assert!(used <= bytes.len() && used <= limits.max_message_len);
                    assert_eq!(encode_request(&request), bytes[..used], "decoding is exact");
                }
                Ok(None) => {
                    // More bytes are needed: the prefix must still be within the limits.
                    assert!(bytes.len() <= limits.max_message_len);
                }
                Err(error) => assert!(!error.to_string().is_empty()),
            }
        }
    }
}

/// Sends `bytes`, closes the sending half, and reads until the server closes the connection.
fn hit(port: u16, bytes: &[u8]) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The server may close before reading everything; a failed write is part of the game.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = Vec::new();
    match stream.read_to_end(&mut sink) {
        Ok(_) => {}
        Err(e) => assert!(
            matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe),
            "the server did not close the connection: {e}"
        ),
    }
}

#[test]
fn the_server_survives_hostile_connections() {
    the_server_survives_hostile_connections_on(1);
}

/// The same with three server threads: hostile connections land on every thread, the good one on the first.
#[test]
fn a_multithreaded_server_survives_hostile_connections() {
    the_server_survives_hostile_connections_on(3);
}

fn the_server_survives_hostile_connections_on(threads: usize) {
    let limits = small_limits();
    let server = TcpStoreServer::start(ServerOptions { port: 0, limits, threads, ..ServerOptions::default() }).unwrap();
    let port = server.port();
    let good = TcpStore::connect("127.0.0.1", port, Duration::from_secs(20)).unwrap();
    good.set("sentinel", b"intact").unwrap();
    let mut rng = Rng(seed(0x5EED_0003));
    eprintln!("seed {}", rng.0);
    let validate = encode_request(&Request::Validate { magic: VALIDATION_MAGIC });
    for round in 0..rounds(300) {
        let mut bytes = match round % 3 {
            0 => Vec::new(),
            _ => validate.clone(),
        };
        match round % 5 {
            // Pure garbage.
            0 => bytes.extend(rng.bytes(200)),
            // A truncated valid request.
            1 => {
                let request = encode_request(&rng.request());
                let cut = rng.below(request.len());
                bytes.extend_from_slice(&request[..cut]);
            }
            // An oversized value, announced and partly sent.
            2 => {
                bytes.push(1);
                bytes.extend_from_slice(&4u64.to_le_bytes());
                bytes.extend_from_slice(b"/big");
                bytes.extend_from_slice(&(1u64 << 33).to_le_bytes());
                bytes.extend(std::iter::repeat_n(7, 10_000));
            }
            // A request whose fields are each allowed but whose sum is too long.
            3 => {
                let pairs = (0..8).map(|i| (vec![i], vec![0; 1000])).collect();
                bytes.extend(encode_request(&Request::MultiSet { pairs }));
            }
            // Valid requests with random bytes after them.
            _ => {
                bytes.extend(encode_request(&rng.request()));
                bytes.extend(rng.bytes(50));
            }
        }
        hit(port, &bytes);
        if round % 50 == 0 {
            assert_eq!(good.get("sentinel").unwrap(), b"intact", "round {round}");
        }
    }
    let stats = server.stats();
    assert!(stats.protocol_errors >= 150, "hostile connections were closed for their errors: {stats:?}");
    assert!(
        stats.peak_buffered <= limits.max_message_len + 64 * 1024,
        "one connection never made the server buffer more than a request's limit plus a read: {stats:?}"
    );
    assert_eq!(good.get("sentinel").unwrap(), b"intact");
    good.set("after", b"fine").unwrap();
    assert_eq!(good.get("after").unwrap(), b"fine");
    assert_eq!(stats.open_connections, 1, "every hostile connection is gone: {stats:?}");
}

//! The TCP store server against careless and hostile clients: pipelined waits it never collects, replies it
//! never reads, malformed bytes after valid requests, half-closed connections, requests over the limits. Each
//! ends in a bounded, logged refusal or in every reply delivered; the other clients go on.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use pg_store::wire::{encode_request, Request, VALIDATION_MAGIC};
use pg_store::{Limits, ServerOptions, Store, StoreError, TcpStore, TcpStoreOptions, TcpStoreServer};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Server thread counts each scenario runs with: one event loop, and several.
const THREADS: [usize; 2] = [1, 3];

fn start(threads: usize, limits: Limits) -> TcpStoreServer {
    TcpStoreServer::start(ServerOptions { port: 0, threads, limits, ..ServerOptions::default() }).unwrap()
}

fn client(server: &TcpStoreServer) -> TcpStore {
    TcpStore::connect("127.0.0.1", server.port(), TIMEOUT).unwrap()
}

/// A raw connection that has sent `VALIDATE`.
fn validated(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.write_all(&encode_request(&Request::Validate { magic: VALIDATION_MAGIC })).unwrap();
    stream
}

fn encode_all(requests: impl IntoIterator<Item = Request>) -> Vec<u8> {
    requests.into_iter().flat_map(|request| encode_request(&request)).collect()
}

fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

/// Reads a GET reply: a u64 length and the value.
fn read_value(stream: &mut TcpStream) -> Vec<u8> {
    let len = u64::from_le_bytes(read_n(stream, 8).try_into().unwrap());
    read_n(stream, usize::try_from(len).unwrap())
}

/// Reads until the server closes the connection; panics if it sends anything or does not close in time.
fn expect_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "expected nothing more before the close, got {} bytes", rest.len()),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "expected a close, got {e}"),
    }
}

/// Sends a PING and checks its echo: every request sent before it on this connection has been handled.
fn ping(stream: &mut TcpStream, nonce: u32) {
    stream.write_all(&encode_request(&Request::Ping { nonce })).unwrap();
    assert_eq!(read_n(stream, 4), nonce.to_le_bytes());
}

/// Polls the server's counters until `done` holds (a bounded number of yields, never a sleep).
fn until(server: &TcpStoreServer, done: impl Fn(&pg_store::ServerStats) -> bool) -> pg_store::ServerStats {
    let start = Instant::now();
    loop {
        let stats = server.stats();
        if done(&stats) {
            return stats;
        }
        assert!(start.elapsed() < TIMEOUT, "the server never reached the expected state: {stats:?}");
        std::thread::yield_now();
    }
}

fn wait_on(key: &str) -> Request {
    Request::Wait { keys: vec![format!("/{key}").into_bytes()] }
}

#[test]
fn a_connection_past_its_wait_limit_is_refused_and_the_others_go_on() {
    for threads in THREADS {
        let limits = Limits { max_waits_per_connection: 1000, ..Limits::default() };
        let server = start(threads, limits);
        let store = client(&server);
        let waiter = client(&server);
        let waiting = std::thread::spawn(move || waiter.get("k"));
        let mut hog = validated(server.port());
        // Exactly the limit is accepted: the ping after the waits is answered.
        hog.write_all(&encode_all((0..1000).map(|_| wait_on("k")))).unwrap();
        ping(&mut hog, 7);
        // One more registration is refused by closing the connection.
        hog.write_all(&encode_request(&wait_on("k"))).unwrap();
        expect_closed(&mut hog);
        assert_eq!(server.stats().protocol_errors, 1);
        store.set("k", b"v").unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), b"v", "{threads} threads");
        assert_eq!(store.get("k").unwrap(), b"v");
    }
}

/// One `WAIT` naming more keys than the limit is refused as a whole.
#[test]
fn a_single_wait_over_the_limit_is_refused() {
    let limits = Limits { max_waits_per_connection: 10, ..Limits::default() };
    let server = start(1, limits);
    let mut hog = validated(server.port());
    let keys = (0..11).map(|i| format!("/k{i}").into_bytes()).collect();
    hog.write_all(&encode_request(&Request::Wait { keys })).unwrap();
    expect_closed(&mut hog);
    assert_eq!(server.stats().protocol_errors, 1);
}

/// Many registrations on one key, dropped by a close or by `CANCEL_WAIT`: the other waiters on the key stay
/// registered, in their order (a queue push feeds the oldest remaining one), and the dropped ones get nothing.
#[test]
fn dropping_many_waits_keeps_the_other_waiters_in_order() {
    for threads in THREADS {
        let server = start(threads, Limits::default());
        let store = client(&server);
        let mut closing = validated(server.port());
        let mut cancelling = validated(server.port());
        let many = |key: &str| encode_all((0..50_000).map(|_| wait_on(key)));
        closing.write_all(&many("q")).unwrap();
        closing.write_all(&many("k")).unwrap();
        ping(&mut closing, 1);
        cancelling.write_all(&many("q")).unwrap();
        ping(&mut cancelling, 2);
        // A popper registered after both: the oldest registrations on `q` are the two raw connections'.
        let popper = client(&server);
        let popping = std::thread::spawn(move || popper.queue_pop("q", true));
        let waiter = client(&server);
        let waiting = std::thread::spawn(move || waiter.wait(&["k"], Some(TIMEOUT)));
        drop(closing);
        cancelling.write_all(&encode_request(&Request::CancelWait)).unwrap();
        assert_eq!(read_n(&mut cancelling, 1), [1], "WAIT_CANCELED");
        until(&server, |stats| stats.open_connections == 4);
        store.queue_push("q", b"x").unwrap();
        assert_eq!(popping.join().unwrap().unwrap(), b"x", "{threads} threads");
        store.set("k", b"v").unwrap();
        waiting.join().unwrap().unwrap();
        // The cancelled connection got nothing from the push or the set: its next reply is its ping.
        ping(&mut cancelling, 3);
        assert_eq!(server.stats().protocol_errors, 0);
    }
}

/// Two connections that never read ask for large replies: the server queues one of them and makes the other
/// wait for room (a server-wide bound), while small requests of other clients go on; once the first is read,
/// the second follows, and every byte is right.
#[test]
fn large_replies_wait_for_room_in_a_server_wide_bound() {
    const VALUE: usize = 4 << 20;
    const KEYS: usize = 16;
    let reply_len = KEYS * (8 + VALUE);
    for threads in THREADS {
        let limits = Limits { max_queued_reply_bytes: 1 << 20, ..Limits::default() };
        let server = start(threads, limits);
        let store = client(&server);
        let value: Vec<u8> = (0..VALUE).map(|i| (i % 251) as u8).collect();
        store.set("big", &value).unwrap();
        store.set("small", b"s").unwrap();
        // SET has no reply: a wait on the same connection orders them before the raw connections' requests.
        store.wait(&["big", "small"], Some(TIMEOUT)).unwrap();
        let multi_get = encode_request(&Request::MultiGet { keys: vec![b"/big".to_vec(); KEYS] });
        let mut readers: Vec<TcpStream> = (0..2).map(|_| validated(server.port())).collect();
        for reader in &mut readers {
            reader.write_all(&multi_get).unwrap();
        }
        let stats = until(&server, |stats| stats.reply_waits >= 1 && stats.queued_reply_bytes > 0);
        assert_eq!(stats.queued_reply_bytes, reply_len, "one reply queued, the other waits: {stats:?}");
        assert_eq!(store.get("small").unwrap(), b"s", "small replies do not wait");
        let drains: Vec<_> = readers
            .into_iter()
            .map(|mut reader| {
                std::thread::spawn(move || (0..KEYS).map(|_| read_value(&mut reader)).collect::<Vec<_>>())
            })
            .collect();
        let expected = value.clone();
        for drain in drains {
            assert!(drain.join().unwrap().iter().all(|got| *got == expected), "{threads} threads: a reply differs");
        }
        let stats = until(&server, |stats| stats.queued_reply_bytes == 0);
        assert!(stats.peak_queued_reply_bytes <= reply_len, "{threads} threads: {stats:?}");
        assert_eq!(store.multi_get(&["big", "small"]).unwrap(), vec![expected, b"s".to_vec()]);
    }
}

/// Valid requests followed by a malformed byte in the same write: every request before it is answered, then
/// the connection closes.
#[test]
fn requests_before_a_malformed_byte_are_answered_before_the_close() {
    for threads in THREADS {
        let server = start(threads, Limits::default());
        let mut stream = validated(server.port());
        let mut bytes = encode_all([
            Request::Set { key: b"/a".to_vec(), value: b"1".to_vec() },
            Request::Get { key: b"/a".to_vec() },
            Request::Add { key: b"/n".to_vec(), delta: 5 },
            Request::Ping { nonce: 0xABCD },
        ]);
        bytes.push(0xEE);
        bytes.extend(encode_request(&Request::Ping { nonce: 1 }));
        stream.write_all(&bytes).unwrap();
        assert_eq!(read_value(&mut stream), b"1", "{threads} threads");
        assert_eq!(read_n(&mut stream, 8), 5i64.to_le_bytes());
        assert_eq!(read_n(&mut stream, 4), 0xABCDu32.to_le_bytes());
        expect_closed(&mut stream);
        assert_eq!(server.stats().protocol_errors, 1);
    }
}

/// A request the server refuses while handling it (an ADD on a value that is not a number): the requests
/// before it are answered, none after it.
#[test]
fn requests_before_a_refused_add_are_answered_and_none_after() {
    let server = start(1, Limits::default());
    let mut stream = validated(server.port());
    stream
        .write_all(&encode_all([
            Request::Set { key: b"/w".to_vec(), value: b"word".to_vec() },
            Request::Ping { nonce: 9 },
            Request::Add { key: b"/w".to_vec(), delta: 1 },
            Request::Set { key: b"/after".to_vec(), value: b"1".to_vec() },
            Request::Ping { nonce: 10 },
        ]))
        .unwrap();
    assert_eq!(read_n(&mut stream, 4), 9u32.to_le_bytes());
    expect_closed(&mut stream);
    assert!(!client(&server).check(&["after"]).unwrap(), "nothing after the refused request is handled");
}

/// 64 GETs of a 1 MiB value, then the client closes its sending side before reading anything: all 64 replies
/// arrive, then the close.
#[test]
fn a_half_closed_client_gets_every_reply() {
    const GETS: usize = 64;
    for threads in THREADS {
        let server = start(threads, Limits::default());
        let store = client(&server);
        let value: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
        store.set("v", &value).unwrap();
        // SET has no reply: a wait on the same connection orders it before the raw connections' GETs.
        store.wait(&["v"], Some(TIMEOUT)).unwrap();
        for round in 0..4 {
            let mut stream = validated(server.port());
            stream.write_all(&encode_all((0..GETS).map(|_| Request::Get { key: b"/v".to_vec() }))).unwrap();
            stream.shutdown(Shutdown::Write).unwrap();
            for i in 0..GETS {
                assert!(read_value(&mut stream) == value, "{threads} threads, round {round}: reply {i} differs");
            }
            expect_closed(&mut stream);
        }
        assert_eq!(server.stats().protocol_errors, 0);
    }
}

/// The client checks PyTorch's limits before sending: an over-limit key, value or key count is an
/// `InvalidArgument` naming the limit, nothing reaches the server, and the handle stays usable.
#[test]
fn the_client_refuses_over_limit_requests_by_name() {
    let store = TcpStore::new("127.0.0.1", TcpStoreOptions { port: 0, is_server: true, ..Default::default() }).unwrap();
    let long_key = "k".repeat(8 * 1024);
    let check = |result: Result<(), StoreError>, limit: &str| match result {
        Err(StoreError::InvalidArgument(message)) => assert!(message.contains(limit), "{message}"),
        other => panic!("expected a refusal naming {limit:?}, got {other:?}"),
    };
    // 8 KiB is PyTorch's key limit, and the client's '/' makes this key one byte longer.
    check(store.set(&long_key, b"v"), "key limit of 8192 bytes");
    check(store.get(&long_key).map(drop), "key limit of 8192 bytes");
    check(store.add(&long_key, 1).map(drop), "key limit of 8192 bytes");
    check(store.set("k", &vec![0; (8 << 20) + 1]), "value limit of 8388608 bytes");
    let many: Vec<String> = (0..128 * 1024 + 1).map(|i| i.to_string()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    check(store.wait(&many, Some(TIMEOUT)), "limit of 131072 keys per request");
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
    assert_eq!(store.server().unwrap().stats().protocol_errors, 0);
}

/// A refused ADD says why, and the handle that sent it stays usable.
#[test]
fn a_refused_add_names_the_reason_and_the_client_stays_usable() {
    let store = TcpStore::serve(0, TIMEOUT).unwrap();
    store.set("word", b"abc").unwrap();
    match store.add("word", 1) {
        Err(StoreError::InvalidArgument(message)) => {
            assert!(message.contains("key 'word'") && message.contains("not a decimal integer"), "{message}")
        }
        other => panic!("expected the refusal's reason, got {other:?}"),
    }
    store.set("n", &i64::MAX.to_string().into_bytes()).unwrap();
    match store.add("n", 1) {
        Err(StoreError::InvalidArgument(message)) => assert!(message.contains("overflows"), "{message}"),
        other => panic!("expected the refusal's reason, got {other:?}"),
    }
    assert_eq!(store.add("counter", 2).unwrap(), 2);
    assert_eq!(store.get("word").unwrap(), b"abc");
}

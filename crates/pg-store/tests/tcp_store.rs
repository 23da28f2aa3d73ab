//! The TCP store end to end: our client against our server, raw protocol checks, timeouts, the
//! cancel race, limits and dead servers.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_store::wire::{encode_request, Request, VALIDATION_MAGIC};
use pg_store::{Limits, ServerOptions, TcpStoreServer};
use pg_store::{Store, StoreError, TcpStore, TcpStoreOptions};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Server thread counts each scenario runs with: one event loop, and several, where a request on one
/// thread answers a waiter on another.
const THREADS: [usize; 2] = [1, 3];

fn server() -> TcpStore {
    TcpStore::serve(0, TIMEOUT).expect("server starts")
}

fn server_with(threads: usize) -> TcpStore {
    let store = TcpStore::serve_on_threads(0, TIMEOUT, threads).expect("server starts");
    assert_eq!(store.server().unwrap().threads(), threads);
    store
}

fn raw(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream
}

fn send(stream: &mut TcpStream, request: &Request) {
    stream.write_all(&encode_request(request)).unwrap();
}

fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

/// Reads until the server closes the connection; panics if it sends anything or does not close in time.
fn expect_closed(stream: &mut TcpStream) {
    let mut buf = [0; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
}

/// A one-connection server played by `script` on a thread, after it has checked and answered the client's
/// handshake (VALIDATE, then PING); returns its port and the thread.
fn scripted_server(script: impl FnOnce(TcpStream) + Send + 'static) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let thread = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut handshake = [0; 10];
        socket.read_exact(&mut handshake).unwrap();
        assert_eq!(handshake[..5], [0x00, 0xCE, 0xF7, 0x85, 0x3C]);
        assert_eq!(handshake[5], 13, "PING follows VALIDATE");
        socket.write_all(&handshake[6..10]).unwrap();
        script(socket);
    });
    (port, thread)
}

fn validated(port: u16) -> TcpStream {
    let mut stream = raw(port);
    send(&mut stream, &Request::Validate { magic: VALIDATION_MAGIC });
    stream
}

#[test]
fn every_operation_round_trips() {
    for threads in THREADS {
        every_operation_round_trips_on(threads);
    }
}

fn every_operation_round_trips_on(threads: usize) {
    let store = server_with(threads);
    store.set("a", b"1").unwrap();
    assert_eq!(store.get("a").unwrap(), b"1");
    assert_eq!(store.add("n", 5).unwrap(), 5);
    assert_eq!(store.add("n", -2).unwrap(), 3);
    assert_eq!(store.get("n").unwrap(), b"3", "ADD stores decimal text");
    assert_eq!(store.compare_set("cs", b"x", b"y").unwrap(), b"x", "missing key, non-empty expected");
    assert!(!store.check(&["cs"]).unwrap());
    assert_eq!(store.compare_set("cs", b"", b"y").unwrap(), b"y", "missing key, empty expected sets");
    assert_eq!(store.compare_set("cs", b"z", b"w").unwrap(), b"y", "wrong expected returns current");
    assert_eq!(store.compare_set("cs", b"y", b"w").unwrap(), b"w");
    assert!(store.check(&["a", "n"]).unwrap());
    assert!(!store.check(&["a", "nope"]).unwrap());
    store.wait(&["a", "n"], None).unwrap();
    store.append("ap", b"he").unwrap();
    store.append("ap", b"llo").unwrap();
    assert_eq!(store.get("ap").unwrap(), b"hello");
    store.multi_set(&["m1", "m2"], &[b"v1", b"v2"]).unwrap();
    assert_eq!(store.multi_get(&["m2", "m1"]).unwrap(), vec![b"v2".to_vec(), b"v1".to_vec()]);
    assert!(matches!(store.multi_set(&["x"], &[]), Err(StoreError::InvalidArgument(_))));
    assert_eq!(store.list_keys().unwrap(), ["a", "ap", "cs", "m1", "m2", "n"]);
    // The server counts the raw `init/` key only when a worker counted itself; this store did not.
    assert_eq!(store.num_keys().unwrap(), 6);
    assert!(store.delete_key("a").unwrap());
    assert!(!store.delete_key("a").unwrap());
    assert_eq!(store.num_keys().unwrap(), 5);
    store.ping().unwrap();
    let raw_keys = store.list_raw_keys().unwrap();
    assert!(raw_keys.contains(&b"/ap".to_vec()), "keys go over the wire with a leading slash: {raw_keys:?}");
}

#[test]
fn queues_push_pop_and_len() {
    for threads in THREADS {
        queues_push_pop_and_len_on(threads);
    }
}

fn queues_push_pop_and_len_on(threads: usize) {
    let store = server_with(threads);
    assert_eq!(store.queue_len("q").unwrap(), 0);
    assert!(matches!(store.queue_pop("q", false), Err(StoreError::QueueEmpty { key }) if key == "q"));
    store.queue_push("q", b"1").unwrap();
    store.queue_push("q", b"2").unwrap();
    assert_eq!(store.queue_len("q").unwrap(), 2);
    assert!(store.check(&["q"]).unwrap(), "a non-empty queue counts as an existing key");
    assert_eq!(store.queue_pop("q", false).unwrap(), b"1");
    assert_eq!(store.queue_pop("q", true).unwrap(), b"2");
    assert_eq!(store.queue_len("q").unwrap(), 0);

    // A blocking pop is woken by a push from another connection.
    let other = store.clone_store().unwrap();
    let popper = std::thread::spawn(move || other.queue_pop("q2", true));
    // The pop registers its wait on the server before the push arrives, or finds the element: both work.
    store.queue_push("q2", b"late").unwrap();
    assert_eq!(popper.join().unwrap().unwrap(), b"late");

    store.set_timeout(Duration::from_millis(100));
    let error = store.queue_pop("empty", true).unwrap_err();
    assert!(error.is_timeout(), "{error}");
    store.queue_push("empty", b"after").unwrap();
    assert_eq!(store.queue_pop("empty", true).unwrap(), b"after", "the client is usable after a timeout");
}

#[test]
fn a_get_waits_for_a_set_from_another_client() {
    for threads in THREADS {
        a_get_waits_for_a_set_from_another_client_on(threads);
    }
}

fn a_get_waits_for_a_set_from_another_client_on(threads: usize) {
    let store = server_with(threads);
    let other = store.clone_store().unwrap();
    let getter = std::thread::spawn(move || other.get("later"));
    store.set("later", b"here").unwrap();
    assert_eq!(getter.join().unwrap().unwrap(), b"here");
}

#[test]
fn a_timed_out_wait_has_pytorchs_message_and_leaves_the_client_usable() {
    for threads in THREADS {
        a_timed_out_wait_has_pytorchs_message_and_leaves_the_client_usable_on(threads);
    }
}

fn a_timed_out_wait_has_pytorchs_message_and_leaves_the_client_usable_on(threads: usize) {
    let store = server_with(threads);
    store.set_timeout(Duration::from_millis(100));
    let start = Instant::now();
    let error = store.get("nonexistent key").unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(error.to_string(), "wait timeout after 100ms, keys: /nonexistent key");
    let error = store.wait(&["a", "b"], Some(Duration::from_millis(30))).unwrap_err();
    assert_eq!(error.to_string(), "wait timeout after 30ms, keys: /a, /b");
    store.set("a", b"x").unwrap();
    assert_eq!(store.get("a").unwrap(), b"x");
    // The cancelled wait left no registration behind: a later set produces no stray byte.
    store.set("b", b"y").unwrap();
    assert_eq!(store.num_keys().unwrap(), 2);
}

#[test]
fn cancel_wait_after_the_keys_arrived_gets_stop_waiting_then_wait_canceled() {
    for threads in THREADS {
        cancel_wait_after_the_keys_arrived_gets_stop_waiting_then_wait_canceled_on(threads);
    }
}

fn cancel_wait_after_the_keys_arrived_gets_stop_waiting_then_wait_canceled_on(threads: usize) {
    let store = server_with(threads);
    let port = store.port();
    let mut waiter = validated(port);
    send(&mut waiter, &Request::Wait { keys: vec![b"/k".to_vec()] });
    // A ping round trip on the waiting connection proves the server registered the wait.
    send(&mut waiter, &Request::Ping { nonce: 7 });
    assert_eq!(read_n(&mut waiter, 4), 7u32.to_le_bytes());
    store.set("k", b"v").unwrap();
    store.ping().unwrap();
    send(&mut waiter, &Request::CancelWait);
    assert_eq!(read_n(&mut waiter, 2), [0, 1], "STOP_WAITING first, then WAIT_CANCELED");
}

#[test]
fn the_client_handles_stop_waiting_racing_its_cancel() {
    // A scripted server: it holds the WAIT, and answers CANCEL_WAIT with both bytes.
    let (port, script) = scripted_server(|mut socket| {
        let mut wait = [0; 1 + 8 + 8 + 2];
        socket.read_exact(&mut wait).unwrap();
        assert_eq!(wait[0], 6, "WAIT");
        let mut cancel = [0; 1];
        socket.read_exact(&mut cancel).unwrap();
        assert_eq!(cancel[0], 12, "CANCEL_WAIT");
        socket.write_all(&[0, 1]).unwrap();
        let mut ping = [0; 5];
        socket.read_exact(&mut ping).unwrap();
        assert_eq!(ping[0], 13);
        socket.write_all(&ping[1..]).unwrap();
    });
    let store = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    let error = store.wait(&["k"], Some(Duration::from_millis(20))).unwrap_err();
    assert!(matches!(error, StoreError::Timeout { .. }), "{error}");
    store.ping().expect("the stray STOP_WAITING was consumed");
    script.join().unwrap();
}

#[test]
fn barrier_releases_everyone_at_world_size_and_times_out_otherwise() {
    for threads in THREADS {
        barrier_releases_everyone_at_world_size_and_times_out_otherwise_on(threads);
    }
}

fn barrier_releases_everyone_at_world_size_and_times_out_otherwise_on(threads: usize) {
    let store = server_with(threads);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let client = store.clone_store().unwrap();
            std::thread::spawn(move || client.barrier("b", 4, None))
        })
        .collect();
    for handle in handles {
        handle.join().unwrap().unwrap();
    }
    let error = store.barrier("lonely", 2, Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(error.to_string(), "barrier timeout after 50ms, key: /lonely");
    store.ping().unwrap();
}

#[test]
fn worker_counting_matches_pytorch() {
    let options = |is_server: bool, port: u16| TcpStoreOptions {
        port,
        is_server,
        num_workers: Some(3),
        timeout: TIMEOUT,
        initial_backoff: Duration::from_millis(10),
        ..TcpStoreOptions::default()
    };
    // The server's worker waits; a lonely server times out with PyTorch's message.
    let lonely = TcpStore::new("127.0.0.1", TcpStoreOptions { timeout: Duration::from_millis(50), ..options(true, 0) })
        .unwrap_err();
    assert!(
        lonely.to_string().starts_with("Timed out after 0 seconds waiting for clients. 1/3 clients joined."),
        "{lonely}"
    );

    let host = TcpStoreServer::start(ServerOptions { port: 0, ..ServerOptions::default() }).unwrap();
    let port = host.port();
    drop(host);
    // Workers connect first and retry with backoff until the server is up.
    let workers: Vec<_> =
        (0..2).map(|_| std::thread::spawn(move || TcpStore::new("127.0.0.1", options(false, port)))).collect();
    let master = TcpStore::new("127.0.0.1", options(true, port)).unwrap();
    for worker in workers {
        worker.join().unwrap().unwrap();
    }
    assert_eq!(master.num_keys().unwrap(), 1, "num_keys counts the init/ counter");
    assert_eq!(master.add_raw("init/", 0).unwrap(), 3);
}

/// A process joining a store that a PyTorch rank hosts counts itself as a worker with `connect_as_worker`, so the
/// host's wait for its clients ends; a plain `connect` does not count.
#[test]
fn connect_as_worker_counts_itself_where_connect_does_not() {
    let hosting =
        TcpStoreOptions { is_server: true, num_workers: Some(2), timeout: TIMEOUT, ..TcpStoreOptions::default() };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let host = std::thread::spawn(move || TcpStore::with_listener("127.0.0.1", listener, hosting));
    let plain = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    let worker = TcpStore::connect_as_worker("127.0.0.1", port, 2, TIMEOUT).unwrap();
    let host = host.join().unwrap().expect("the host's wait for 2 workers ends");
    assert_eq!(plain.add_raw("init/", 0).unwrap(), 2, "the host and the worker joined; the plain client did not");
    worker.set("k", b"v").unwrap();
    assert_eq!(host.get("k").unwrap(), b"v");
    let zero = TcpStore::connect_as_worker("127.0.0.1", port, 0, TIMEOUT).unwrap_err();
    assert!(matches!(zero, StoreError::InvalidArgument(_)), "{zero}");
}

/// A Rust rank 0 hosting for PyTorch's ranks: `serve_as_master` returns once the other workers have counted
/// themselves in.
#[test]
fn serve_as_master_waits_for_the_other_workers() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let master = std::thread::spawn(move || TcpStore::serve_as_master(port, 3, TIMEOUT));
    let workers: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || TcpStore::connect_as_worker("127.0.0.1", port, 3, TIMEOUT)))
        .collect();
    let workers: Vec<TcpStore> = workers.into_iter().map(|w| w.join().unwrap().unwrap()).collect();
    let master = master.join().unwrap().expect("the master's wait for 3 workers ends");
    assert_eq!(master.add_raw("init/", 0).unwrap(), 3);
    workers[1].set("k", b"v").unwrap();
    assert_eq!(master.get("k").unwrap(), b"v");
}

#[test]
fn a_dead_server_is_an_error_not_a_hang() {
    let store = server();
    let waiter = store.clone_store().unwrap();
    let blocked = std::thread::spawn(move || {
        waiter.set_timeout(Duration::ZERO);
        waiter.get("never")
    });
    let host_port = store.port();
    // Clones do not own the server, as in PyTorch: dropping the hosting handle stops it and closes every
    // connection, whether the getter's WAIT is registered yet or not.
    drop(store);
    let error = blocked.join().unwrap().unwrap_err();
    assert!(matches!(error, StoreError::Network(_)), "{error}");
    let error = TcpStore::connect("127.0.0.1", host_port, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(error, StoreError::Network(_)), "{error}");
}

#[test]
fn clients_that_break_the_protocol_are_disconnected_and_others_keep_working() {
    let server = TcpStoreServer::start(ServerOptions {
        port: 0,
        limits: Limits { max_key_len: 16, max_value_len: 64, max_reply_len: 1 << 20, ..Limits::default() },
        ..ServerOptions::default()
    })
    .unwrap();
    let port = server.port();
    let good = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    good.set("k", b"v").unwrap();
    // SET has no reply: a round trip proves the server holds the value before the bad ADD below.
    good.ping().unwrap();

    // Garbage before VALIDATE, such as a port scanner's probe.
    let mut scanner = raw(port);
    scanner.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    expect_closed(&mut scanner);
    // A wrong magic.
    let mut wrong = raw(port);
    send(&mut wrong, &Request::Validate { magic: 0xDEAD_BEEF });
    expect_closed(&mut wrong);
    // An unknown command after validating.
    let mut unknown = validated(port);
    unknown.write_all(&[19]).unwrap();
    expect_closed(&mut unknown);
    // An oversized key: the header alone is enough, the server does not wait for the bytes it announces.
    let mut big_key = validated(port);
    big_key.write_all(&[1]).unwrap();
    big_key.write_all(&(1u64 << 40).to_le_bytes()).unwrap();
    expect_closed(&mut big_key);
    // An oversized value.
    let mut big_value = validated(port);
    send(&mut big_value, &Request::Set { key: b"/x".to_vec(), value: vec![0; 65] });
    expect_closed(&mut big_value);
    // ADD on a value that is not a number.
    let mut bad_add = validated(port);
    send(&mut bad_add, &Request::Add { key: b"/k".to_vec(), delta: 1 });
    expect_closed(&mut bad_add);
    // A MULTI_GET naming one value so many times that the reply would pass the limit.
    good.set("v", &[7; 64]).unwrap();
    good.ping().unwrap();
    let mut amplifier = validated(port);
    send(&mut amplifier, &Request::MultiGet { keys: vec![b"/v".to_vec(); 20_000] });
    expect_closed(&mut amplifier);

    assert_eq!(server.stats().protocol_errors, 7);
    assert_eq!(good.get("k").unwrap(), b"v", "the well-behaved client is unaffected");
    // The largest request was the 200 KB MULTI_GET; the oversized ones were refused from their headers.
    assert!(server.stats().peak_buffered < 256 * 1024, "nothing large was buffered: {:?}", server.stats());
}

#[test]
fn a_value_split_across_many_writes_is_reassembled() {
    let store = server();
    let value: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let mut stream = validated(store.port());
    let bytes = encode_request(&Request::Set { key: b"/big".to_vec(), value: value.clone() });
    for chunk in bytes.chunks(1440) {
        stream.write_all(chunk).unwrap();
    }
    assert_eq!(store.get("big").unwrap(), value);
}

/// One pipelined stream of SETs that replace one key's value by values of `sizes` in turn, each followed by a
/// GET of it: every GET sees the value set just before it, whether the server replaced it in place, grew it or
/// shrank it. With `behind_a_big_reply`, the stream opens with a GET whose 5 MiB reply passes the server's
/// high-water mark, so that the requests after it wait (copied out of the receive buffer) until it is sent.
fn check_replacements(threads: usize, sizes: &[usize], behind_a_big_reply: bool) {
    let store = server_with(threads);
    let big: Vec<u8> = (0..5 << 20).map(|i| (i % 249) as u8).collect();
    store.set("big", &big).unwrap();
    store.ping().unwrap();
    let mut stream = validated(store.port());
    let values: Vec<Vec<u8>> =
        sizes.iter().enumerate().map(|(n, &len)| (0..len).map(|i| (i * 7 + n) as u8).collect()).collect();
    let rounds = 4;
    let mut bytes = Vec::new();
    if behind_a_big_reply {
        bytes.extend(encode_request(&Request::Get { key: b"/big".to_vec() }));
    }
    for _ in 0..rounds {
        for value in &values {
            bytes.extend(encode_request(&Request::Set { key: b"/k".to_vec(), value: value.clone() }));
            bytes.extend(encode_request(&Request::Get { key: b"/k".to_vec() }));
        }
    }
    // Written from another thread: the server stops reading while its replies wait to be read.
    let mut writer = stream.try_clone().unwrap();
    let writing = std::thread::spawn(move || writer.write_all(&bytes).unwrap());
    if behind_a_big_reply {
        assert_eq!(read_n(&mut stream, 8), (big.len() as u64).to_le_bytes());
        assert!(read_n(&mut stream, big.len()) == big, "the big reply reads back intact");
    }
    for round in 0..rounds {
        for (value, &size) in values.iter().zip(sizes) {
            assert_eq!(read_n(&mut stream, 8), (size as u64).to_le_bytes(), "round {round}, size {size}");
            assert!(read_n(&mut stream, size) == *value, "round {round}: the {size}-byte value reads back intact");
        }
    }
    writing.join().unwrap();
}

#[test]
fn replaced_values_of_every_size_read_back_in_order() {
    for threads in THREADS {
        check_replacements(threads, &[64, 64, 10, 200, 0, 130, 8 * 1024, 3, 64], false);
        check_replacements(threads, &[64, 64, 10, 200, 0, 130, 8 * 1024, 3, 64], true);
        check_replacements(threads, &[1 << 20, 64, 2 << 20, 2 << 20, 1, 1 << 20], false);
    }
}

#[test]
fn a_client_that_reads_its_replies_late_gets_them_all() {
    for threads in THREADS {
        a_client_that_reads_its_replies_late_gets_them_all_on(threads);
    }
}

fn a_client_that_reads_its_replies_late_gets_them_all_on(threads: usize) {
    let store = server_with(threads);
    let value: Vec<u8> = (0..1024 * 1024).map(|i| (i % 253) as u8).collect();
    store.set("big", &value).unwrap();
    // SET has no reply: a round trip on the same connection proves the server holds the value.
    store.ping().unwrap();
    let mut stream = validated(store.port());
    // 24 MiB of replies pile up behind a peer that does not read: the server stops reading it, waits for
    // writable events, and resumes.
    let requests = 24;
    for _ in 0..requests {
        send(&mut stream, &Request::Get { key: b"/big".to_vec() });
    }
    for _ in 0..requests {
        assert_eq!(read_n(&mut stream, 8), (value.len() as u64).to_le_bytes());
        assert!(read_n(&mut stream, value.len()) == value, "reply bytes intact");
    }
    send(&mut stream, &Request::Ping { nonce: 9 });
    assert_eq!(read_n(&mut stream, 4), 9u32.to_le_bytes());
    assert_eq!(store.get("big").unwrap().len(), value.len(), "other clients were served meanwhile");
}

#[test]
fn a_server_that_announces_a_huge_value_and_dies_is_a_network_error() {
    let (port, script) = scripted_server(|mut socket| {
        // WAIT {"/k"}: 1 + 8 + 8 + 2 bytes; answer STOP_WAITING.
        let mut wait = [0; 19];
        socket.read_exact(&mut wait).unwrap();
        socket.write_all(&[0]).unwrap();
        // GET "/k": announce 512 GiB, send a few bytes, and hang up.
        let mut get = [0; 11];
        socket.read_exact(&mut get).unwrap();
        socket.write_all(&(1u64 << 39).to_le_bytes()).unwrap();
        socket.write_all(b"abc").unwrap();
    });
    let store = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    let error = store.get("k").unwrap_err();
    assert!(matches!(error, StoreError::Network(_)), "{error}");
    let again = store.ping().unwrap_err();
    assert!(again.to_string().contains("broken"), "a broken connection says so: {again}");
    script.join().unwrap();
}

#[test]
fn multi_tenant_handles_share_one_server_until_the_last_drops() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options = TcpStoreOptions {
        port,
        is_server: true,
        multi_tenant: true,
        wait_workers: false,
        timeout: TIMEOUT,
        ..TcpStoreOptions::default()
    };
    let first = TcpStore::new("127.0.0.1", options.clone()).unwrap();
    let second = TcpStore::new("127.0.0.1", options.clone()).expect("the second handle reuses the server");
    assert!(Arc::ptr_eq(first.server().unwrap(), second.server().unwrap()));
    first.set("k", b"v").unwrap();
    assert_eq!(second.get("k").unwrap(), b"v");
    // Without multi_tenant a second server on the port fails with PyTorch's message.
    let error = TcpStore::new("127.0.0.1", TcpStoreOptions { multi_tenant: false, ..options.clone() }).unwrap_err();
    assert!(error.to_string().contains("failed to listen on any local network address"), "{error}");
    drop(first);
    assert_eq!(second.get("k").unwrap(), b"v", "the server lives while a handle holds it");
    drop(second);
    let fresh = TcpStore::new("127.0.0.1", options).expect("the port is free again");
    assert!(!fresh.check(&["k"]).unwrap(), "a new server starts empty");
}

#[test]
fn a_server_takes_over_a_listening_socket() {
    // PyTorch's `master_listen_fd`: the port is bound before the store exists, so workers may connect to it
    // at once (the kernel queues them) and no other process can take it in between.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let options = TcpStoreOptions {
        port: 1,
        num_workers: Some(2),
        timeout: TIMEOUT,
        initial_backoff: Duration::from_millis(10),
        ..TcpStoreOptions::default()
    };
    let early = {
        let options = TcpStoreOptions { port, ..options.clone() };
        std::thread::spawn(move || TcpStore::new("127.0.0.1", options))
    };
    let master = TcpStore::with_listener("127.0.0.1", listener, options).unwrap();
    let worker = early.join().unwrap().unwrap();
    assert_eq!((master.port(), master.server().unwrap().port()), (port, port), "options.port is not used");
    assert_eq!(master.add_raw("init/", 0).unwrap(), 2, "both workers joined");
    worker.set("k", b"v").unwrap();
    assert_eq!(master.get("k").unwrap(), b"v");
    // The server owns the socket: once it stops, nothing listens on the port.
    drop((worker, master));
    let error = TcpStore::connect("127.0.0.1", port, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(error, StoreError::Network(_)), "{error}");
}

/// Hands `socket` to a server as its listener and checks that it is refused with `expected` in the message.
fn check_refused_listener(socket: impl Into<std::os::fd::OwnedFd>, expected: &str) {
    let listener = TcpListener::from(socket.into());
    match TcpStoreServer::start_on(listener, ServerOptions::default()) {
        Err(StoreError::InvalidArgument(message)) => assert!(message.contains(expected), "{message}"),
        other => panic!("expected an invalid-argument error with {expected:?}, got {other:?}"),
    }
}

#[test]
fn a_socket_that_cannot_listen_is_refused_by_name() {
    use rustix::net::{AddressFamily, SocketType};
    let bound = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    rustix::net::bind(&bound, &std::net::SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    check_refused_listener(bound, "is not listening");
    check_refused_listener(std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), "is not a stream socket");
    let dir = std::env::temp_dir().join(format!("pg-store-listener-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unix = std::os::unix::net::UnixListener::bind(dir.join("socket")).unwrap();
    check_refused_listener(unix, "is not an IP socket");
    std::fs::remove_dir_all(&dir).unwrap();
    check_refused_listener(std::fs::File::open("/dev/null").unwrap(), "is not a socket");
}

#[test]
fn a_busy_polling_server_serves_every_operation_and_wakes_waiters() {
    for threads in THREADS {
        a_busy_polling_server_serves_every_operation_and_wakes_waiters_on(threads);
    }
}

fn a_busy_polling_server_serves_every_operation_and_wakes_waiters_on(threads: usize) {
    // Busy polling is off by default on small machines (CI's), so this test turns it on explicitly.
    let server = TcpStoreServer::start(ServerOptions {
        port: 0,
        busy_poll: Duration::from_micros(200),
        threads,
        ..ServerOptions::default()
    })
    .unwrap();
    let port = server.port();
    let a = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    let b = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    a.set("k", b"v").unwrap();
    assert_eq!(b.get("k").unwrap(), b"v");
    for expected in 1..=50 {
        assert_eq!(a.add("n", 1).unwrap(), expected);
    }
    // A waiter and a setter racing: whichever reaches the server first, the wait ends with the value there.
    let waiter = std::thread::spawn(move || b.wait(&["late"], Some(TIMEOUT)).map(|()| b.get("late").unwrap()));
    a.set("late", b"1").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"1");
    assert_eq!(a.compare_set("k", b"v", b"w").unwrap(), b"w");
    assert!(a.delete_key("k").unwrap());
    assert_eq!(server.stats().protocol_errors, 0);
}

/// Sends `request` and then a PING on one connection: the first bytes back are the ping's nonce exactly when
/// the request has no reply.
fn check_reply_presence(port: u16, request: Request) {
    let mut stream = validated(port);
    let expects_reply = request.has_reply();
    send(&mut stream, &request);
    send(&mut stream, &Request::Ping { nonce: 0x5A5A_5A5A });
    let first = read_n(&mut stream, 4);
    assert_eq!(first == 0x5A5A_5A5Au32.to_le_bytes(), !expects_reply, "{request:?}: reply {first:?}");
}

#[test]
fn fire_and_forget_requests_get_no_reply_and_the_others_do() {
    let store = server();
    let port = store.port();
    let kv = |k: &[u8]| (k.to_vec(), b"0".to_vec());
    check_reply_presence(port, Request::Set { key: b"/a".to_vec(), value: b"1".to_vec() });
    check_reply_presence(port, Request::Append { key: b"/a".to_vec(), value: b"2".to_vec() });
    check_reply_presence(port, Request::MultiSet { pairs: vec![kv(b"/m1"), kv(b"/m2")] });
    check_reply_presence(port, Request::QueuePush { key: b"/q".to_vec(), value: b"x".to_vec() });
    check_reply_presence(port, Request::Get { key: b"/a".to_vec() });
    check_reply_presence(port, Request::Add { key: b"/n".to_vec(), delta: 1 });
    check_reply_presence(port, Request::Check { keys: vec![b"/a".to_vec()] });
    check_reply_presence(port, Request::Wait { keys: vec![b"/a".to_vec()] });
    check_reply_presence(port, Request::GetNumKeys);
    check_reply_presence(port, Request::QueueLen { key: b"/q".to_vec() });
}

/// A server on `threads` threads that reads floods of SETs `coalesce` late, busy polling for `busy_poll`.
fn coalescing_server(threads: usize, coalesce: Duration, busy_poll: Duration) -> TcpStoreServer {
    TcpStoreServer::start(ServerOptions { port: 0, threads, coalesce, busy_poll, ..ServerOptions::default() }).unwrap()
}

/// `count` SETs of `prefix/i` to `i`, encoded back to back, for one write.
fn set_flood(prefix: &str, range: std::ops::Range<usize>) -> Vec<u8> {
    range
        .flat_map(|i| {
            encode_request(&Request::Set {
                key: format!("/{prefix}/{i}").into_bytes(),
                value: i.to_string().into_bytes(),
            })
        })
        .collect()
}

/// The interval the coalescing tests use: long enough that the batches of one buffered flood, handled back to
/// back, are always within a stream's longest pause (twice this), so that the connection counts as flooding
/// without depending on how fast the machine is.
const FLOOD_COALESCE: Duration = Duration::from_millis(20);

/// A client on the same server thread as the connection opened just before it: the server deals accepted
/// connections to its `threads` threads in turn, so `threads - 1` connections opened in between make the next
/// one land on the same thread. A round trip of this client then shows that the thread has finished the work
/// it was doing for the other connection (it handles one connection's events at a time): the data that other
/// connection sends next reaches the thread as a new readable event.
fn loop_mate(port: u16, threads: usize) -> TcpStore {
    for _ in 1..threads {
        drop(raw(port));
    }
    TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap()
}

/// Runs `check` with every thread count of [`THREADS`], with busy polling off and on.
fn on_every_loop_setup(check: impl Fn(usize, Duration)) {
    for threads in THREADS {
        for busy_poll in [Duration::ZERO, Duration::from_micros(50)] {
            check(threads, busy_poll);
        }
    }
}

/// A connection that floods SETs (2,000 in one write: several batches handled back to back) is read late
/// when more arrive, exactly when coalescing is on; nothing is lost or reordered, and a waiter on another
/// connection is woken by a SET inside the late read.
fn check_coalescing(threads: usize, coalesce: Duration, busy_poll: Duration) {
    let server = coalescing_server(threads, coalesce, busy_poll);
    let port = server.port();
    let waiter = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    let mut flood = validated(port);
    let observer = loop_mate(port, threads);
    flood.write_all(&set_flood("k", 0..2000)).unwrap();
    observer.wait(&["k/1999"], Some(TIMEOUT)).unwrap();
    observer.ping().unwrap();
    let waiting = std::thread::spawn(move || waiter.get("k/2500"));
    flood.write_all(&set_flood("k", 2000..3000)).unwrap();
    assert_eq!(waiting.join().unwrap().unwrap(), b"2500");
    observer.wait(&["k/2999"], Some(TIMEOUT)).unwrap();
    assert_eq!(observer.get("k/1500").unwrap(), b"1500");
    assert_eq!(observer.num_keys().unwrap(), 3000);
    let stats = server.stats();
    assert_eq!(stats.protocol_errors, 0);
    let context = format!("{threads} threads, {coalesce:?}, busy polling {busy_poll:?}: {stats:?}");
    assert_eq!(stats.coalesced_reads > 0, !coalesce.is_zero(), "{context}");
}

#[test]
fn a_coalescing_server_reads_set_floods_late_and_loses_nothing() {
    on_every_loop_setup(|threads, busy_poll| {
        check_coalescing(threads, Duration::ZERO, busy_poll);
        check_coalescing(threads, FLOOD_COALESCE, busy_poll);
    });
}

/// A client that sets keys and reads others', as a rank in a rendezvous does, is never read late: each of its
/// batches holds a request with a reply or follows one.
fn check_request_reply_clients_are_read_at_once(threads: usize, busy_poll: Duration) {
    let server = coalescing_server(threads, FLOOD_COALESCE, busy_poll);
    let store = TcpStore::connect("127.0.0.1", server.port(), TIMEOUT).unwrap();
    for i in 0..300 {
        store.set(&format!("rank/{i}"), b"1").unwrap();
        assert_eq!(store.get(&format!("rank/{i}")).unwrap(), b"1");
    }
    let stats = server.stats();
    assert_eq!(stats.coalesced_reads, 0, "{threads} threads, busy polling {busy_poll:?}: {stats:?}");
}

#[test]
fn clients_that_await_replies_are_read_at_once() {
    on_every_loop_setup(check_request_reply_clients_are_read_at_once);
}

/// Flooding connections that close while their reads wait: every SET they sent is applied, every connection
/// closes, and connections opened after them (which may reuse their slots) work normally.
fn check_streams_closing_while_deferred(threads: usize, busy_poll: Duration) {
    let server = coalescing_server(threads, FLOOD_COALESCE, busy_poll);
    let port = server.port();
    let observer = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
    for round in 0..3 {
        let mut streams: Vec<(TcpStream, TcpStore)> =
            (0..threads * 2).map(|_| (validated(port), loop_mate(port, threads))).collect();
        for (s, (stream, mate)) in streams.iter_mut().enumerate() {
            // A flood in one write makes the connection a stream; what follows is read late.
            stream.write_all(&set_flood(&format!("r{round}/s{s}"), 0..2000)).unwrap();
            mate.wait(&[&format!("r{round}/s{s}/1999")], Some(TIMEOUT)).unwrap();
            mate.ping().unwrap();
            stream.write_all(&set_flood(&format!("r{round}/s{s}"), 2000..2200)).unwrap();
        }
        // Closed with SETs unread on the server.
        drop(streams);
        for s in 0..threads * 2 {
            observer.wait(&[&format!("r{round}/s{s}/2199")], Some(TIMEOUT)).unwrap();
            assert_eq!(observer.get(&format!("r{round}/s{s}/2150")).unwrap(), b"2150");
        }
        // The server notices each end of stream once the deferred read is done: only the observer stays.
        let start = Instant::now();
        while server.stats().open_connections != 1 {
            assert!(start.elapsed() < TIMEOUT, "closed streams stay open: {:?}", server.stats());
            std::thread::yield_now();
        }
    }
    assert_eq!(observer.num_keys().unwrap(), 3 * threads as i64 * 2 * 2200, "every SET applied");
    let stats = server.stats();
    assert_eq!(stats.protocol_errors, 0);
    assert!(stats.coalesced_reads > 0, "{threads} threads, busy polling {busy_poll:?}: {stats:?}");
}

#[test]
fn streams_that_close_while_their_reads_wait_lose_nothing() {
    on_every_loop_setup(check_streams_closing_while_deferred);
}

/// Waiters that time out and cancel while SETs on other connections (on other server threads) release them:
/// every wait ends released or timed out, every connection stays in step (a ping after each wait), and the
/// server reports no protocol error.
#[test]
fn cancel_races_across_server_threads_leave_every_connection_in_step() {
    const KEYS: usize = 4;
    let server = TcpStoreServer::start(ServerOptions { port: 0, threads: 3, ..ServerOptions::default() }).unwrap();
    let port = server.port();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let setters: Vec<_> = (0..2)
        .map(|s| {
            let stop = Arc::clone(&stop);
            let store = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
            std::thread::spawn(move || {
                let mut i = s;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = format!("race/{}", i % KEYS);
                    store.set(&key, b"1").unwrap();
                    store.delete_key(&key).unwrap();
                    // Round trips pace the setter, so that the keys are absent most of the time and a good
                    // share of the waits time out, some of them as a SET releases them.
                    for _ in 0..300 {
                        store.ping().unwrap();
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let waiters: Vec<_> = (0..8)
        .map(|w| {
            let store = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
            std::thread::spawn(move || {
                let (mut released, mut timed_out) = (0, 0);
                for i in 0..150 {
                    let key = format!("race/{}", (w + i) % KEYS);
                    match store.wait(&[&key], Some(Duration::from_micros(300))) {
                        Ok(()) => released += 1,
                        Err(error) if error.is_timeout() => timed_out += 1,
                        Err(error) => panic!("waiter {w}, wait {i}: {error}"),
                    }
                    store.ping().unwrap_or_else(|e| panic!("waiter {w} out of step after wait {i}: {e}"));
                }
                (released, timed_out)
            })
        })
        .collect();
    let outcomes: Vec<(usize, usize)> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for setter in setters {
        setter.join().unwrap();
    }
    eprintln!("released, timed out per waiter: {outcomes:?}");
    assert!(outcomes.iter().all(|(released, timed_out)| released + timed_out == 150), "{outcomes:?}");
    assert_eq!(server.stats().protocol_errors, 0);
}

/// A proxy to our server on `upstream` that behaves as a server without the `BARRIER` request (PyTorch 2.11's): it
/// closes the client's connection when one arrives. Returns its port and the count of barriers it refused.
fn proxy_without_barrier(upstream: u16) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let refused = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&refused);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let refused = Arc::clone(&counted);
            std::thread::spawn(move || {
                let mut server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                let (mut replies, mut back) = (server.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut replies, &mut back);
                    let _ = back.shutdown(std::net::Shutdown::Both);
                });
                let (mut pending, mut validated, mut chunk) = (Vec::new(), false, [0u8; 4096]);
                loop {
                    let n = match client.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&chunk[..n]);
                    while let Ok(Some((request, used))) =
                        pg_store::wire::decode_request(&pending, validated, &Limits::default())
                    {
                        if matches!(request, Request::Barrier { .. }) {
                            refused.fetch_add(1, Ordering::SeqCst);
                            let _ = client.shutdown(std::net::Shutdown::Both);
                            let _ = server.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        validated = true;
                        server.write_all(&pending[..used]).unwrap();
                        pending.drain(..used);
                    }
                }
                let _ = server.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (port, refused)
}

#[test]
fn a_server_without_barrier_gets_barriers_made_of_add_set_and_wait() {
    use std::sync::atomic::Ordering;
    let server = TcpStoreServer::start(ServerOptions { port: 0, ..ServerOptions::default() }).unwrap();
    let (port, refused) = proxy_without_barrier(server.port());
    let ranks: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let store = TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap();
                store.barrier("b", 2, Some(TIMEOUT)).unwrap();
                store
            })
        })
        .collect();
    let stores: Vec<TcpStore> = ranks.into_iter().map(|rank| rank.join().unwrap()).collect();
    // Each handle asked once, had its connection closed, asked again on a new connection to tell a server without
    // BARRIER from a failed connection (closed again), and made the barrier on a third connection.
    assert_eq!(refused.load(Ordering::SeqCst), 4);
    // From then on it makes its barriers itself at once, with the BARRIER request's timeout error, and stays usable.
    stores[0].barrier("alone", 1, None).unwrap();
    let error = stores[0].barrier("late", 2, Some(Duration::from_millis(100))).unwrap_err();
    assert_eq!(error.to_string(), "barrier timeout after 100ms, key: /late");
    assert_eq!(refused.load(Ordering::SeqCst), 4, "no more BARRIER requests");
    stores[1].set("k", b"v").unwrap();
    assert_eq!(stores[0].get("k").unwrap(), b"v");
}

/// A world size the store's i64 counter cannot hold is refused by name, not wrapped negative.
#[test]
fn a_world_size_beyond_i64_is_refused_by_name() {
    for world_size in [usize::MAX, 1 << 63] {
        let error = TcpStore::serve_as_master(0, world_size, Duration::from_secs(1)).err();
        match &error {
            Some(StoreError::InvalidArgument(message)) => {
                assert!(message.contains(&world_size.to_string()), "{message}");
                assert!(message.contains(&i64::MAX.to_string()), "{message}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        let error = TcpStore::connect_as_worker("127.0.0.1", 1, world_size, Duration::from_secs(1)).err();
        assert!(matches!(error, Some(StoreError::InvalidArgument(_))), "{error:?}");
    }
    let largest = TcpStoreOptions { num_workers: Some(i64::MAX as usize), ..TcpStoreOptions::default() };
    let error =
        TcpStore::new("127.0.0.1", TcpStoreOptions { port: 1, timeout: Duration::from_millis(1), ..largest }).err();
    assert!(matches!(error, Some(StoreError::Network(_))), "i64::MAX workers is a valid count: {error:?}");
}

/// Runs `call` on a thread and returns its result with how long it took; panics if it takes longer than `bound`
/// (a hang is a failure, not a stuck test).
fn bounded<T: Send + 'static>(bound: Duration, call: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        let result = call();
        let _ = done.send((result, start.elapsed()));
    });
    outcome.recv_timeout(bound).unwrap_or_else(|_| panic!("the call did not return within {bound:?}"))
}

/// A store opened with timeout 0 (no timeout for its own blocking operations) still honours the timeout a caller
/// passes to `wait` or `barrier`, and a zero one means "now".
#[test]
fn a_store_without_a_timeout_honours_each_calls_timeout() {
    let store = Arc::new(TcpStore::serve(0, Duration::ZERO).unwrap());
    let short = Duration::from_millis(200);
    let waiter = Arc::clone(&store);
    let (error, took) = bounded(TIMEOUT, move || waiter.wait(&["never"], Some(short)).unwrap_err());
    assert_eq!(error.to_string(), "wait timeout after 200ms, keys: /never");
    assert!(took >= short, "{took:?}");
    let waiter = Arc::clone(&store);
    let (error, _) = bounded(TIMEOUT, move || waiter.wait(&["never"], Some(Duration::ZERO)).unwrap_err());
    assert_eq!(error.to_string(), "wait timeout after 0ms, keys: /never");
    let waiter = Arc::clone(&store);
    let (error, took) = bounded(TIMEOUT, move || waiter.barrier("never", 2, Some(short)).unwrap_err());
    assert_eq!(error.to_string(), "barrier timeout after 200ms, key: /never");
    assert!(took >= short, "{took:?}");
    store.set("never", b"now").unwrap();
    assert_eq!(store.get("never").unwrap(), b"now");
}

/// A proxy to `upstream` that forwards every connection unchanged; returns its port and the proxy's client-side
/// sockets, which a test shuts down to close a client's connection under it.
fn forwarding_proxy(upstream: u16) -> (u16, Arc<std::sync::Mutex<Vec<TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let clients = Arc::new(std::sync::Mutex::new(Vec::new()));
    let accepted = Arc::clone(&clients);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            accepted.lock().unwrap().push(client.try_clone().unwrap());
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server.try_clone().unwrap(), client.try_clone().unwrap()),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = from.shutdown(std::net::Shutdown::Both);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    (port, clients)
}

/// A client whose connection closes while it waits in a barrier that the server already counted it in gets a
/// network error naming the barrier: it does not count itself again (as a server without `BARRIER` would need) and
/// pass alone, and barriers go on meeting the other clients' native ones. Both for a handle whose first barrier this
/// is (it asks the server on a new connection whether it has `BARRIER`) and for one that made a barrier before.
#[test]
fn a_barrier_whose_connection_closes_fails_and_never_passes_alone() {
    for earlier_barrier in [false, true] {
        check_barrier_connection_closing(earlier_barrier);
    }
}

fn check_barrier_connection_closing(earlier_barrier: bool) {
    let server = TcpStoreServer::start(ServerOptions { port: 0, ..ServerOptions::default() }).unwrap();
    let (port, proxied) = forwarding_proxy(server.port());
    let other = Arc::new(TcpStore::connect("127.0.0.1", server.port(), TIMEOUT).unwrap());
    let closing = Arc::new(TcpStore::connect("127.0.0.1", port, TIMEOUT).unwrap());
    if earlier_barrier {
        closing.barrier("first", 1, Some(TIMEOUT)).unwrap();
    }
    let waiter = Arc::clone(&closing);
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(waiter.barrier("b", 2, Some(TIMEOUT)));
    });
    // The server has counted the arrival once the barrier's counter exists.
    other.wait(&["b"], None).unwrap();
    for client in proxied.lock().unwrap().iter() {
        client.shutdown(std::net::Shutdown::Both).unwrap();
    }
    let result = outcome.recv_timeout(TIMEOUT).expect("the barrier returns");
    match result {
        Err(StoreError::Network(message)) => assert!(message.contains("barrier on key '/b'"), "{message}"),
        other => panic!("earlier barrier {earlier_barrier}: expected a network error, got {other:?}"),
    }
    assert_eq!(other.get("b").unwrap(), b"1", "the closed client was counted once");
    // The second participant meets the first one's counted arrival.
    other.barrier("b", 2, Some(TIMEOUT)).unwrap();
    // A new connection of the failed handle still makes native barriers, which meet the other client's.
    let again = closing.clone_store().unwrap();
    let native = std::thread::spawn(move || again.barrier("again", 2, Some(TIMEOUT)));
    other.barrier("again", 2, Some(TIMEOUT)).unwrap();
    native.join().unwrap().unwrap();
    assert!(!other.check(&["again/done"]).unwrap(), "no barrier made of ADD, SET and WAIT");
    let raw_keys = other.list_raw_keys().unwrap();
    assert!(raw_keys.iter().all(|key| key.starts_with(b"/")), "the probe left no key: {raw_keys:?}");
    assert_eq!(server.stats().protocol_errors, 0);
}

/// A barrier whose server dies while it waits returns a network error within the barrier's own timeout, not the
/// store's.
#[test]
fn a_barrier_whose_server_dies_fails_within_its_own_timeout() {
    let host = TcpStore::serve(0, TIMEOUT).unwrap();
    let client = TcpStore::connect("127.0.0.1", host.port(), TIMEOUT).unwrap();
    let barrier_timeout = Duration::from_secs(1);
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        let result = client.barrier("b", 2, Some(barrier_timeout));
        let _ = done.send((result, start.elapsed()));
    });
    host.wait(&["b"], None).unwrap();
    drop(host);
    let (result, took) = outcome.recv_timeout(TIMEOUT).expect("the barrier returns");
    assert!(matches!(result, Err(StoreError::Network(_))), "{result:?}");
    assert!(took < barrier_timeout + Duration::from_secs(3), "took {took:?}");
}

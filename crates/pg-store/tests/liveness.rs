//! Liveness through pg's TCP store server ([`pg_store::liveness`]): a connection that set a live key and then
//! closes has its death published at once; one that deleted its key first leaves without a death; a holder that
//! stays connected (however idle) is never declared dead; a client that speaks PyTorch's protocol and never sets a
//! live key sees nothing change.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use pg_store::liveness::{dead_key, live_key, watched_key, DEAD_VALUE, DEATHS_KEY};
use pg_store::wire::{encode_request, Request, VALIDATION_MAGIC};
use pg_store::{PrefixStore, Store, TcpStore, TcpStoreServer};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Server thread counts: one event loop, and several, where the holder's close wakes a waiter on another loop.
const THREADS: [usize; 2] = [1, 3];

fn prefixed(store: &TcpStore, prefix: &str) -> PrefixStore {
    PrefixStore::new(prefix, store.clone_store().expect("connects"))
}

/// Waits (bounded) until the server has `open` connections: its closes have been handled.
fn until_open(server: &TcpStoreServer, open: usize) {
    let start = Instant::now();
    while server.stats().open_connections != open {
        assert!(start.elapsed() < TIMEOUT, "connections stay open: {:?}", server.stats());
        std::thread::yield_now();
    }
}

#[test]
fn a_closed_liveness_connection_publishes_its_death_and_a_live_one_is_never_declared_dead() {
    for threads in THREADS {
        let store = TcpStore::serve_on_threads(0, TIMEOUT, threads).expect("server starts");
        let watcher = prefixed(&store, "group");
        let dying = prefixed(&store, "group");
        let staying = prefixed(&store, "group");
        dying.set(&live_key("1"), b"pid").unwrap();
        staying.set(&live_key("2"), b"pid").unwrap();
        // The server acknowledges each hold on the holder's own connection, after its SET.
        assert!(dying.check(&[&watched_key("1")]).unwrap(), "{threads} threads: hold not acknowledged");
        assert!(staying.check(&[&watched_key("2")]).unwrap());
        assert!(!watcher.check(&[DEATHS_KEY]).unwrap(), "nobody died yet");
        // A watcher already blocked on the death is woken by the close (on another event loop with 3 threads).
        let waiting = {
            let watcher = prefixed(&store, "group");
            std::thread::spawn(move || watcher.wait(&[&dead_key("1")], Some(TIMEOUT)))
        };
        drop(dying);
        waiting.join().unwrap().expect("the death is published when the connection closes");
        assert_eq!(watcher.get(&dead_key("1")).unwrap(), DEAD_VALUE);
        assert_eq!(watcher.get(DEATHS_KEY).unwrap(), b"1");
        // The holder that stays connected, idle all along, is not dead.
        assert!(!watcher.check(&[&dead_key("2")]).unwrap(), "{threads} threads: a live holder declared dead");
        staying.set("still", b"here").unwrap();
        assert!(!watcher.check(&[&dead_key("2")]).unwrap());
    }
}

#[test]
fn a_holder_that_deletes_its_live_key_leaves_without_a_death() {
    let store = TcpStore::serve(0, TIMEOUT).expect("server starts");
    let server = std::sync::Arc::clone(store.server().unwrap());
    let watcher = prefixed(&store, "g");
    {
        let leaving = prefixed(&store, "g");
        leaving.set(&live_key("0"), b"pid").unwrap();
        assert!(leaving.check(&[&watched_key("0")]).unwrap());
        assert!(leaving.delete_key(&live_key("0")).unwrap());
    }
    // The store's own handle and the watcher stay.
    until_open(&server, 2);
    assert!(!watcher.check(&[&dead_key("0")]).unwrap(), "a holder that left on purpose was declared dead");
    assert!(!watcher.check(&[DEATHS_KEY]).unwrap());
}

#[test]
fn a_client_speaking_pytorchs_protocol_sees_nothing_change() {
    let store = TcpStore::serve(0, TIMEOUT).expect("server starts");
    let server = std::sync::Arc::clone(store.server().unwrap());
    let send = |stream: &mut TcpStream, request: &Request| stream.write_all(&encode_request(request)).unwrap();
    let before = store.num_keys().unwrap();
    {
        let mut torch = TcpStream::connect(("127.0.0.1", store.port())).unwrap();
        torch.set_read_timeout(Some(TIMEOUT)).unwrap();
        send(&mut torch, &Request::Validate { magic: VALIDATION_MAGIC });
        send(&mut torch, &Request::Set { key: b"default_pg/0//cuda//0".to_vec(), value: b"id".to_vec() });
        send(&mut torch, &Request::Get { key: b"default_pg/0//cuda//0".to_vec() });
        let mut len = [0u8; 8];
        torch.read_exact(&mut len).unwrap();
        let mut value = vec![0u8; u64::from_le_bytes(len) as usize];
        torch.read_exact(&mut value).unwrap();
        assert_eq!(value, b"id");
        send(&mut torch, &Request::GetNumKeys);
        let mut count = [0u8; 8];
        torch.read_exact(&mut count).unwrap();
        // Its one key and nothing else: no liveness key was added.
        assert_eq!(i64::from_le_bytes(count), before + 1);
    }
    until_open(&server, 1);
    let keys = store.list_keys().unwrap();
    assert!(keys.iter().all(|key| !key.contains("pg.")), "a PyTorch client's close published something: {keys:?}");
}

//! 1,024 concurrent clients doing set, get, add, append, queue and wait on one server; every counter must
//! come out exact.

use std::sync::Arc;
use std::time::Duration;

use pg_store::{Store, TcpStore};

const CLIENTS: usize = 1024;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Makes sure the process may open a socket per client on both ends.
fn ensure_descriptors() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let needed = (CLIENTS * 2 + 256) as u64;
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|current| current < needed) {
        limit.current = Some(limit.maximum.map_or(needed, |max| max.min(needed)));
        setrlimit(Resource::Nofile, limit).expect("raise the open-file limit");
    }
}

#[test]
fn a_thousand_clients_lose_nothing() {
    a_thousand_clients_lose_nothing_on(1);
}

/// The same on four server threads: one set wakes waiters on every thread, pops and pushes cross threads.
#[test]
fn a_thousand_clients_lose_nothing_on_four_server_threads() {
    a_thousand_clients_lose_nothing_on(4);
}

fn a_thousand_clients_lose_nothing_on(threads: usize) {
    ensure_descriptors();
    let host = Arc::new(TcpStore::serve_on_threads(0, TIMEOUT, threads).unwrap());
    assert_eq!(host.server().unwrap().threads(), threads);
    let port = host.port();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || -> Result<(), pg_store::StoreError> {
                    let s = TcpStore::connect("127.0.0.1", port, TIMEOUT)?;
                    s.set(&format!("k/{i}"), i.to_string().as_bytes())?;
                    s.add("counter", 1)?;
                    s.append("log", b"x")?;
                    s.queue_push("jobs", i.to_string().as_bytes())?;
                    // The neighbour's key may not be there yet: get waits for it.
                    let neighbour = (i + 1) % CLIENTS;
                    assert_eq!(s.get(&format!("k/{neighbour}"))?, neighbour.to_string().as_bytes());
                    if s.add("arrived", 1)? == CLIENTS as i64 {
                        s.set("all_arrived", b"1")?;
                    }
                    // Every client waits for one key set by the host: one set wakes 1,024 waiters.
                    s.wait(&["go"], None)?;
                    let job = s.queue_pop("jobs", true)?;
                    s.add(&format!("seen/{}", String::from_utf8_lossy(&job)), 1)?;
                    s.add("done", 1)?;
                    Ok(())
                })
                .expect("spawn a client thread")
        })
        .collect();
    host.wait(&["all_arrived"], Some(TIMEOUT)).unwrap();
    host.set("go", b"1").unwrap();
    for client in clients {
        client.join().expect("client thread").expect("client operations");
    }
    let n = CLIENTS as i64;
    assert_eq!(host.add("counter", 0).unwrap(), n);
    assert_eq!(host.add("done", 0).unwrap(), n);
    assert_eq!(host.get("log").unwrap().len(), CLIENTS, "every append landed");
    assert_eq!(host.queue_len("jobs").unwrap(), 0);
    let seen: Vec<String> = (0..CLIENTS).map(|i| format!("seen/{i}")).collect();
    let seen: Vec<&str> = seen.iter().map(String::as_str).collect();
    let counts = host.multi_get(&seen).unwrap();
    assert!(counts.iter().all(|count| count == b"1"), "every job was popped exactly once");
    // k/0..k/1023, seen/0..seen/1023, counter, log, arrived, all_arrived, go, done.
    assert_eq!(host.num_keys().unwrap(), 2 * n + 6);
    let stats = host.server().unwrap().stats();
    assert_eq!(stats.accepted, CLIENTS as u64 + 1);
    assert_eq!(stats.protocol_errors, 0);
}

//! One suite of operations run against every store: hash, file, TCP, and prefix stores over them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_store::{FileStore, HashStore, PrefixStore, Store, StoreError, TcpStore};

struct Case {
    name: &'static str,
    store: Arc<dyn Store>,
    queues: bool,
}

/// A fresh path per call: tests run in parallel threads of one process.
fn temp_file(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("pg-store-suite-{}-{name}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn cases() -> Vec<Case> {
    let tcp: Arc<dyn Store> = Arc::new(TcpStore::serve(0, Duration::from_secs(20)).unwrap());
    let hash: Arc<dyn Store> = Arc::new(HashStore::new());
    let file: Arc<dyn Store> = Arc::new(FileStore::new(temp_file("file"), 1).unwrap());
    let prefixed_file: Arc<dyn Store> = Arc::new(FileStore::new(temp_file("prefixed"), 1).unwrap());
    vec![
        Case { name: "tcp", store: Arc::clone(&tcp), queues: true },
        Case { name: "prefix(tcp)", store: Arc::new(PrefixStore::new("p", tcp)), queues: true },
        Case { name: "hash", store: Arc::clone(&hash), queues: true },
        Case {
            name: "prefix(prefix(hash))",
            store: Arc::new(PrefixStore::new("b", Arc::new(PrefixStore::new("a", hash)))),
            queues: true,
        },
        Case { name: "file", store: file, queues: false },
        Case { name: "prefix(file)", store: Arc::new(PrefixStore::new("p", prefixed_file)), queues: false },
    ]
}

fn exercise(case: &Case) {
    let s = &*case.store;
    let name = case.name;
    s.set("key0", b"value0").unwrap();
    assert_eq!(s.get("key0").unwrap(), b"value0", "{name}");
    for delta in [1, 2, 3] {
        s.add("key", delta).unwrap();
    }
    assert_eq!(s.get("key").unwrap(), b"6", "{name}: add stores decimal text");
    assert_eq!(s.add("key", 0).unwrap(), 6, "{name}");
    assert_eq!(s.compare_set("cs", b"wrong", b"new").unwrap(), b"wrong", "{name}");
    assert_eq!(s.compare_set("cs", b"", b"first").unwrap(), b"first", "{name}");
    assert_eq!(s.compare_set("cs", b"first", b"second").unwrap(), b"second", "{name}");
    assert_eq!(s.compare_set("cs", b"first", b"third").unwrap(), b"second", "{name}");
    assert!(s.check(&["key0", "key"]).unwrap(), "{name}");
    assert!(!s.check(&["key0", "missing"]).unwrap(), "{name}");
    s.wait(&["key0"], Some(Duration::from_millis(10))).unwrap();
    let error = s.wait(&["missing"], Some(Duration::from_millis(30))).unwrap_err();
    assert!(matches!(error, StoreError::Timeout { .. }), "{name}: {error}");
    assert!(error.to_string().contains("imeout"), "{name}: {error}");
    s.append("ap", b"a").unwrap();
    s.append("ap", b"b").unwrap();
    assert_eq!(s.get("ap").unwrap(), b"ab", "{name}");
    s.multi_set(&["m1", "m2"], &[b"1", b"2"]).unwrap();
    assert_eq!(s.multi_get(&["m1", "m2"]).unwrap(), [b"1".to_vec(), b"2".to_vec()], "{name}");
    let mut keys = s.list_keys().unwrap();
    keys.retain(|k| !k.starts_with("q"));
    assert_eq!(keys, ["ap", "cs", "key", "key0", "m1", "m2"], "{name}");
    let before = s.num_keys().unwrap();
    assert!(s.delete_key("key0").unwrap(), "{name}");
    assert!(!s.check(&["key0"]).unwrap(), "{name}");
    assert_eq!(s.num_keys().unwrap(), before - 1, "{name}");

    s.set_timeout(Duration::from_millis(40));
    let error = s.get("still missing").unwrap_err();
    assert!(error.is_timeout(), "{name}: {error}");
    s.set("still missing", b"now").unwrap();
    assert_eq!(s.get("still missing").unwrap(), b"now", "{name}: usable after a timeout");
    s.set_timeout(Duration::from_secs(20));

    let clone = s.clone_store().unwrap();
    assert_eq!(clone.get("ap").unwrap(), b"ab", "{name}: a clone sees the same data");

    if case.queues {
        s.queue_push("q", b"x").unwrap();
        s.queue_push("q", b"y").unwrap();
        assert_eq!(s.queue_len("q").unwrap(), 2, "{name}");
        assert_eq!(clone.queue_pop("q", true).unwrap(), b"x", "{name}: queues are FIFO");
        assert_eq!(s.queue_pop("q", false).unwrap(), b"y", "{name}");
        assert!(matches!(s.queue_pop("q", false), Err(StoreError::QueueEmpty { .. })), "{name}");
    } else {
        assert!(matches!(s.queue_push("q", b"x"), Err(StoreError::Unsupported(_))), "{name}");
    }
}

#[test]
fn every_store_implements_every_operation() {
    for case in cases() {
        exercise(&case);
    }
}

#[test]
fn barriers_release_every_rank_on_every_store() {
    for case in cases() {
        let ranks: Vec<_> = (0..3)
            .map(|_| {
                let store = case.store.clone_store().unwrap();
                std::thread::spawn(move || store.barrier("bar", 3, Some(Duration::from_secs(20))))
            })
            .collect();
        for rank in ranks {
            rank.join().unwrap().unwrap_or_else(|e| panic!("{}: {e}", case.name));
        }
    }
}

#[test]
fn prefixes_nest_and_reach_the_underlying_store() {
    let base: Arc<dyn Store> = Arc::new(TcpStore::serve(0, Duration::from_secs(20)).unwrap());
    let outer = Arc::new(PrefixStore::new("default_pg", Arc::clone(&base)));
    let inner = PrefixStore::new("0/", outer.clone());
    let device = PrefixStore::new("cuda/", Arc::new(inner));
    device.set("0", b"unique id").unwrap();
    assert_eq!(base.get("default_pg/0//cuda//0").unwrap(), b"unique id", "PyTorch's key for the first unique id");
    assert_eq!(base.list_keys().unwrap(), ["default_pg/0//cuda//0"]);
    assert_eq!(outer.list_keys().unwrap(), ["0//cuda//0"]);
    assert_eq!(device.num_keys().unwrap(), 1, "num_keys passes through unprefixed");
    assert!(Arc::ptr_eq(outer.underlying(), &base));
    assert_eq!(device.key_prefix(), "default_pg/0//cuda//", "the whole namespace, as the base store sees it");
    assert_eq!(base.key_prefix(), "");
}

#[test]
fn the_last_file_store_handle_of_the_last_worker_deletes_the_file() {
    let path = temp_file("cleanup");
    let first = FileStore::new(&path, 2).unwrap();
    let second = FileStore::new(&path, 2).unwrap();
    first.set("k", b"v").unwrap();
    assert_eq!(second.num_keys().unwrap(), 2, "refcount/ counts as a key, as in PyTorch");
    drop(first);
    assert!(path.exists(), "one worker is still there");
    drop(second);
    assert!(!path.exists(), "the last worker removed the file");
}

#[test]
fn file_store_adds_from_many_handles_are_exact() {
    let path = temp_file("adds");
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let store = FileStore::new(&path, 4).unwrap();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    store.add("n", 1).unwrap();
                }
                store
            })
        })
        .collect();
    let stores: Vec<FileStore> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(stores[0].add("n", 0).unwrap(), 200, "flock serialises every read-modify-write");
    drop(stores);
    assert!(!path.exists(), "the last of the four workers removed the file");
}

/// A zero timeout passed to `wait` or `barrier` means "now" on every store, as in `HashStore`: the keys are checked
/// once, and a missing key is a timeout at once (a store's own zero timeout, the TCP store's "no timeout", is another
/// thing: it is never a per-call timeout).
#[test]
fn a_zero_timeout_wait_or_barrier_checks_once_on_every_store() {
    for case in cases() {
        let name = case.name;
        let store = Arc::clone(&case.store);
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            store.set("present", b"v").unwrap();
            let present = store.wait(&["present"], Some(Duration::ZERO));
            let missing = store.wait(&["present", "absent"], Some(Duration::ZERO));
            let alone = store.barrier("zero-alone", 1, Some(Duration::ZERO));
            let short = store.barrier("zero-short", 2, Some(Duration::ZERO));
            let _ = done.send((present, missing, alone, short));
        });
        let (present, missing, alone, short) = outcome
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{name}: a wait or barrier with a zero timeout did not return"));
        present.unwrap_or_else(|e| panic!("{name}: {e}"));
        match missing {
            Err(StoreError::Timeout { keys, timeout }) => {
                assert!(timeout.is_zero(), "{name}: {timeout:?}");
                assert!(keys.iter().any(|key| key.ends_with("absent")), "{name}: {keys:?}");
            }
            other => panic!("{name}: expected a timeout at once, got {other:?}"),
        }
        alone.unwrap_or_else(|e| panic!("{name}: the last arrival of a barrier passes: {e}"));
        match short {
            Err(StoreError::BarrierTimeout { key, timeout }) => {
                assert!(timeout.is_zero(), "{name}: {timeout:?}");
                assert!(key.ends_with("zero-short"), "{name}: {key}");
            }
            other => panic!("{name}: expected a barrier timeout at once, got {other:?}"),
        }
        case.store.set("after", b"a").unwrap();
        assert_eq!(case.store.get("after").unwrap(), b"a", "{name}: usable after a zero-timeout wait");
    }
}

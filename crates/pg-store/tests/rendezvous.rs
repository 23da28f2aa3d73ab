//! env://, tcp:// and file:// rendezvous, PyTorch's errors for missing variables, and torchrun's agent store.

use std::collections::HashMap;
use std::time::Duration;

use pg_store::rendezvous::{rendezvous_with, Rendezvous};
use pg_store::{ServerOptions, TcpStoreServer};
use pg_store::{Store, StoreError, TcpStore};

const TIMEOUT: Duration = Duration::from_secs(20);

fn run(url: &str, vars: &[(&str, String)]) -> Result<Rendezvous, StoreError> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    rendezvous_with(url, TIMEOUT, &move |name| map.get(name).cloned())
}

/// A port nobody listens on now: bind, read it, release it.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn missing_variables_give_pytorchs_errors() {
    let all = [
        ("RANK", "0".to_owned()),
        ("WORLD_SIZE", "1".to_owned()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", "1".to_owned()),
    ];
    for missing in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
        let vars: Vec<_> = all.iter().filter(|(k, _)| *k != missing).cloned().collect();
        let error = run("env://", &vars).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("Error initializing torch.distributed using env:// rendezvous: environment variable {missing} expected, but not set")
        );
    }
    let error = run("env://", &[("RANK", "x".into())]).unwrap_err();
    assert!(matches!(error, StoreError::InvalidEnv { ref name, .. } if name == "RANK"), "{error}");
    let error = run("tcp://127.0.0.1?rank=0&world_size=1", &[]).unwrap_err();
    assert!(error.to_string().contains("port number missing"), "{error}");
    let error = run("tcp://127.0.0.1:5?world_size=1", &[]).unwrap_err();
    assert!(error.to_string().contains("rank parameter missing"), "{error}");
    let error = run("tcp://127.0.0.1:5?rank=0", &[]).unwrap_err();
    assert!(error.to_string().contains("world size parameter missing"), "{error}");
    let error = run(
        "env://",
        &[
            ("MASTER_PORT", "70000".into()),
            ("MASTER_ADDR", "h".into()),
            ("RANK", "0".into()),
            ("WORLD_SIZE", "1".into()),
        ],
    )
    .unwrap_err();
    assert!(error.to_string().contains("0..=65535"), "{error}");
}

#[test]
fn env_rendezvous_rank_zero_hosts_and_query_overrides_env() {
    let port = free_port();
    let vars = |rank: usize| {
        vec![
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "3".to_owned()),
            ("MASTER_ADDR", "127.0.0.1".to_owned()),
            ("MASTER_PORT", port.to_string()),
            ("LOCAL_RANK", rank.to_string()),
        ]
    };
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            let vars = vars(rank);
            std::thread::spawn(move || {
                // Rank 2 takes its rank from the URL's query instead of RANK, which says 1 here.
                let (url, vars) = match rank {
                    2 => (
                        "env://?rank=2",
                        vars.into_iter().map(|(k, v)| if k == "RANK" { (k, "1".to_owned()) } else { (k, v) }).collect(),
                    ),
                    _ => ("env://", vars),
                };
                let rdzv = run(url, &vars).unwrap();
                assert_eq!((rdzv.rank, rdzv.world_size), (rank, 3));
                rdzv.store.set(&format!("rank{}", rdzv.rank), b"here").unwrap();
                rdzv.store.wait(&["rank0", "rank1", "rank2"], None).unwrap();
                rdzv
            })
        })
        .collect();
    let rendezvous: Vec<Rendezvous> = ranks.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(rendezvous[1].local_rank, Some(1));
    // Every rank counted itself in init/, so the store holds the three rank keys and the counter.
    assert_eq!(rendezvous[0].store.num_keys().unwrap(), 4);
}

#[test]
fn the_agent_store_is_client_only_and_unprefixed_as_pytorchs() {
    let agent = TcpStoreServer::start(ServerOptions { port: 0, ..ServerOptions::default() }).unwrap();
    let vars = vec![
        ("RANK", "0".to_owned()),
        ("WORLD_SIZE", "2".to_owned()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", agent.port().to_string()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".to_owned()),
        ("TORCHELASTIC_RESTART_COUNT", "2".to_owned()),
    ];
    // Rank 0 does not try to host (the agent already listens on the port) and does not wait for workers.
    let rdzv = run("env://", &vars).unwrap();
    rdzv.store.set("k", b"v").unwrap();
    let observer = TcpStore::connect("127.0.0.1", agent.port(), TIMEOUT).unwrap();
    assert_eq!(observer.get("k").unwrap(), b"v", "the key as PyTorch's ranks see it");
    assert_eq!(observer.add_raw("init/", 0).unwrap(), 1, "the rank counted itself");
}

#[test]
fn file_and_tcp_urls_work() {
    let path = std::env::temp_dir().join(format!("pg-store-rdzv-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let url = format!("file://{}?rank=0&world_size=1", path.display());
    let rdzv = run(&url, &[]).unwrap();
    rdzv.store.set("k", b"v").unwrap();
    assert_eq!(rdzv.store.get("k").unwrap(), b"v");
    drop(rdzv);
    assert!(!path.exists(), "the only worker removed the file");

    let port = free_port();
    let rdzv = run(&format!("tcp://127.0.0.1:{port}?rank=0&world_size=1"), &[]).unwrap();
    assert_eq!(rdzv.store.add("n", 2).unwrap(), 2);
}

/// A world size the stores' i64 counters cannot hold is refused by name in every URL, not wrapped negative.
#[test]
fn a_world_size_beyond_i64_is_refused_by_name() {
    let path = std::env::temp_dir().join(format!("pg-store-rdzv-huge-{}", std::process::id()));
    let huge = (1u64 << 63).to_string();
    let port = free_port();
    for url in [
        format!("file://{}?rank=0&world_size={huge}", path.display()),
        format!("tcp://127.0.0.1:{port}?rank=0&world_size={huge}"),
        "env://".to_owned(),
    ] {
        let vars = [
            ("RANK", "0".to_owned()),
            ("WORLD_SIZE", huge.clone()),
            ("MASTER_ADDR", "127.0.0.1".to_owned()),
            ("MASTER_PORT", port.to_string()),
        ];
        match run(&url, &vars) {
            Err(StoreError::InvalidEnv { name, value, reason }) => {
                assert!(name.eq_ignore_ascii_case("world_size"), "{url}: {name}");
                assert_eq!(value, huge, "{url}");
                assert!(reason.contains(&i64::MAX.to_string()), "{url}: {reason}");
            }
            other => panic!("{url}: expected InvalidEnv, got {other:?}"),
        }
    }
    let _ = std::fs::remove_file(&path);
}

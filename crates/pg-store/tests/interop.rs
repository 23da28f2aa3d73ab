//! Interop with real PyTorch: its TCPStore client against our server, our client against its server, and
//! our FileStore and its FileStore on one file.
//!
//! The Python interpreter is `$PG_INTEROP_PYTHON` (`cargo xtask interop` sets it to a virtual environment
//! with torch from PyPI), else `python3`. Without an importable torch every test prints "skipped: ..." and
//! passes.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pg_store::{FileStore, Store, TcpStore};

const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// Writes a line to the real standard error: the test harness captures `println!` and `eprintln!` of
/// passing tests, and a skip must be seen.
fn loud(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The interpreter to use, or `None` (after saying so) when torch cannot be imported.
///
/// With `PG_INTEROP_REQUIRE=1` (set by `cargo xtask interop`) a missing torch is a failure, not a skip.
fn python(test: &str) -> Option<String> {
    let python = std::env::var("PG_INTEROP_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let probe = Command::new(&python).args(["-W", "ignore", "-c", "import torch.distributed"]).output();
    let required = std::env::var("PG_INTEROP_REQUIRE").is_ok_and(|v| v == "1");
    if required && !probe.as_ref().is_ok_and(|output| output.status.success()) {
        panic!("{test}: PG_INTEROP_REQUIRE=1 but `{python} -c 'import torch.distributed'` failed: {probe:?}");
    }
    match probe {
        Ok(output) if output.status.success() => Some(python),
        Ok(output) => {
            let why = String::from_utf8_lossy(&output.stderr);
            let why = why.lines().last().unwrap_or("import failed");
            loud(&format!(
                "skipped: {test}: `{python} -c 'import torch.distributed'` failed ({why}); run `cargo xtask interop`"
            ));
            None
        }
        Err(error) => {
            loud(&format!("skipped: {test}: cannot run {python} ({error}); run `cargo xtask interop`"));
            None
        }
    }
}

fn spawn(python: &str, script: &str, args: &[String]) -> Child {
    Command::new(python)
        .args(["-W", "ignore", "-u", "-c", script])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts")
}

/// Waits for the child with a bounded deadline; returns its exit success, stdout and stderr.
fn finish(mut child: Child, mut stdout: impl Read) -> (bool, String, String) {
    let deadline = Instant::now() + CHILD_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    stdout.read_to_string(&mut out).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.is_some_and(|s| s.success()), out, err)
}

const PYTORCH_CLIENT: &str = r#"
import sys, datetime
import torch.distributed as dist
T = datetime.timedelta
def ok(name):
    print("OK", name, flush=True)
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), world_size=2, is_master=False, timeout=T(seconds=20))
ok("VALIDATE PING")
s.set("py_key", "py_value"); ok("SET")
assert s.get("py_key") == b"py_value"; assert s.get("rust_key") == b"rust_value"; ok("GET")
assert s.add("cnt", 5) == 5 and s.add("cnt", 2) == 7; ok("ADD")
assert s.compare_set("cs", "x", "y") == b"x"
assert s.compare_set("cs", "", "y") == b"y"
assert s.compare_set("cs", "y", "z") == b"z" and s.compare_set("cs", "y", "w") == b"z"; ok("COMPARE_SET")
assert s.check(["py_key", "cnt"]) and not s.check(["nope"]); ok("CHECK")
s.wait(["py_key"]); s.wait(["py_key", "cnt"], T(seconds=5)); ok("WAIT")
try:
    s.wait(["missing"], T(milliseconds=100))
    sys.exit("wait did not time out")
except dist.DistStoreError as e:
    assert "wait timeout after 100ms, keys: /missing" in str(e), str(e)
s.set("after_timeout", "1"); assert s.get("after_timeout") == b"1"; ok("CANCEL_WAIT")
print("NUMKEYS", s.num_keys(), flush=True); ok("GETNUMKEYS")
assert s.delete_key("after_timeout") and not s.delete_key("after_timeout"); ok("DELETE_KEY")
s.append("ap", "a"); s.append("ap", b"b\x00\xff"); assert s.get("ap") == b"ab\x00\xff"; ok("APPEND")
s.multi_set(["m1", "m2"], ["1", "2"]); ok("MULTI_SET")
assert s.multi_get(["m1", "m2"]) == [b"1", b"2"]; ok("MULTI_GET")
s.queue_push("q", "a"); s.queue_push("q", "b"); ok("QUEUE_PUSH")
assert s.queue_len("q") == 2; ok("QUEUE_LEN")
assert s.queue_pop("q") == b"a" and s.queue_pop("q", False) == b"b"
try:
    s.queue_pop("q", False)
    sys.exit("queue_pop on an empty queue did not raise")
except dist.QueueEmptyError:
    pass
ok("QUEUE_POP")
keys = s.list_keys(); assert "py_key" in keys and "rust_key" in keys and "init/" not in keys, keys; ok("LIST_KEYS")
if hasattr(s, "barrier"):
    s.barrier("bar", 1); ok("BARRIER")
    try:
        s.barrier("bar2", 2, T(milliseconds=100))
        sys.exit("barrier did not time out")
    except dist.DistStoreError as e:
        assert "timeout" in str(e), str(e)
    assert s.get("py_key") == b"py_value"; ok("BARRIER timeout")
else:
    print("not applicable: BARRIER: this PyTorch's TCPStore has no barrier", flush=True)
c = s.clone(); assert c.get("py_key") == b"py_value"; ok("clone")
"#;

#[test]
fn pytorch_client_against_our_server() {
    let Some(python) = python("pytorch_client_against_our_server") else { return };
    // One server thread, and three: PyTorch's client and its clone then sit on different threads.
    for threads in [1, 3] {
        pytorch_client_against_our_server_on(&python, threads);
    }
}

fn pytorch_client_against_our_server_on(python: &str, threads: usize) {
    let store = TcpStore::serve_on_threads(0, Duration::from_secs(20), threads).unwrap();
    store.set("rust_key", b"rust_value").unwrap();
    let mut child = spawn(python, PYTORCH_CLIENT, &[store.port().to_string()]);
    let stdout = child.stdout.take().unwrap();
    let (success, out, err) = finish(child, stdout);
    println!("{out}");
    assert!(success, "the PyTorch client failed:\n{out}\n{err}");
    for command in [
        "VALIDATE PING",
        "SET",
        "GET",
        "ADD",
        "COMPARE_SET",
        "CHECK",
        "WAIT",
        "CANCEL_WAIT",
        "GETNUMKEYS",
        "DELETE_KEY",
        "APPEND",
        "MULTI_SET",
        "MULTI_GET",
        "QUEUE_PUSH",
        "QUEUE_LEN",
        "QUEUE_POP",
        "LIST_KEYS",
        "BARRIER",
        "BARRIER timeout",
        "clone",
    ] {
        // A PyTorch client without `barrier` (2.11, say) says so.
        let unavailable = command.starts_with("BARRIER") && out.contains("not applicable: BARRIER");
        assert!(unavailable || out.lines().any(|line| line == format!("OK {command}")), "no OK for {command}:\n{out}");
    }
    // init/, rust_key, py_key, cnt, cs and after_timeout when PyTorch counted.
    assert!(out.contains("NUMKEYS 6"), "{out}");
    assert_eq!(store.add_raw("init/", 0).unwrap(), 1, "the PyTorch worker counted itself in init/");
    assert_eq!(store.get("ap").unwrap(), b"ab\x00\xff");
    assert_eq!(store.get("cnt").unwrap(), b"7");
}

const PYTORCH_SERVER: &str = r#"
import sys, datetime
import torch.distributed as dist
T = datetime.timedelta
s = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=T(seconds=60), wait_for_workers=False)
s.set("from_py", b"\x00py\xff")
print("PORT", s.port, flush=True)
s.wait(["rust_done"])
assert s.get("from_rust") == b"hello", s.get("from_rust")
assert s.get("cnt") == b"7", s.get("cnt")
assert s.get("ap") == b"ab"
assert s.get("m2") == b"2"
assert s.queue_len("q") == 0
print("PY_OK", flush=True)
"#;

#[test]
fn our_client_against_pytorch_server() {
    let Some(python) = python("our_client_against_pytorch_server") else { return };
    let mut child = spawn(&python, PYTORCH_SERVER, &[]);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let port: u16 = match line.trim().strip_prefix("PORT ") {
        Some(port) => port.parse().unwrap(),
        None => {
            let (_, out, err) = finish(child, stdout);
            panic!("the PyTorch server did not start: {line}{out}\n{err}");
        }
    };
    let s = TcpStore::connect("127.0.0.1", port, Duration::from_secs(20)).unwrap();
    s.ping().unwrap();
    assert_eq!(s.get("from_py").unwrap(), b"\x00py\xff");
    s.set("from_rust", b"hello").unwrap();
    assert_eq!(s.add("cnt", 5).unwrap(), 5);
    assert_eq!(s.add("cnt", 2).unwrap(), 7);
    assert_eq!(s.compare_set("cs", b"x", b"y").unwrap(), b"x");
    assert_eq!(s.compare_set("cs", b"", b"y").unwrap(), b"y");
    assert_eq!(s.compare_set("cs", b"q", b"z").unwrap(), b"y");
    assert!(s.check(&["from_py", "cnt"]).unwrap());
    assert!(!s.check(&["nope"]).unwrap());
    s.wait(&["from_py"], None).unwrap();
    let error = s.wait(&["missing"], Some(Duration::from_millis(100))).unwrap_err();
    assert_eq!(error.to_string(), "wait timeout after 100ms, keys: /missing");
    s.set("t", b"1").unwrap();
    assert_eq!(s.get("t").unwrap(), b"1", "usable after CANCEL_WAIT against PyTorch's server");
    assert!(s.delete_key("t").unwrap());
    assert!(!s.delete_key("t").unwrap());
    s.append("ap", b"a").unwrap();
    s.append("ap", b"b").unwrap();
    s.multi_set(&["m1", "m2"], &[b"1", b"2"]).unwrap();
    assert_eq!(s.multi_get(&["m1", "m2"]).unwrap(), [b"1".to_vec(), b"2".to_vec()]);
    s.queue_push("q", b"a").unwrap();
    assert_eq!(s.queue_len("q").unwrap(), 1);
    assert_eq!(s.queue_pop("q", true).unwrap(), b"a");
    assert!(matches!(s.queue_pop("q", false), Err(pg_store::StoreError::QueueEmpty { .. })));
    let keys = s.list_keys().unwrap();
    assert!(keys.contains(&"from_py".to_owned()) && keys.contains(&"cnt".to_owned()), "{keys:?}");
    // A PyTorch server without the BARRIER request (2.11, say) closes the connection on it: the client makes the
    // barrier of ADD, SET and WAIT on a new connection instead, with the same timeout error, and stays usable.
    s.barrier("bar", 1, None).unwrap();
    let error = s.barrier("bar2", 2, Some(Duration::from_millis(100))).unwrap_err();
    assert_eq!(error.to_string(), "barrier timeout after 100ms, key: /bar2");
    assert_eq!(s.get("from_rust").unwrap(), b"hello", "usable after the barriers");
    // from_py, from_rust, cnt, cs, ap, m1, m2, bar, bar2 (PyTorch's server holds no init/ here), and bar/done where
    // the client made the barriers itself.
    let counted = s.list_keys().unwrap().contains(&"bar/done".to_owned());
    assert_eq!(s.num_keys().unwrap(), 9 + i64::from(counted));
    let clone = s.clone_store().unwrap();
    assert_eq!(clone.get("from_rust").unwrap(), b"hello");
    // The CLI inspects PyTorch's live store too, printing binary values escaped.
    let cli = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_pgstore"))
            .args(["--addr", &format!("127.0.0.1:{port}"), "--timeout", "20"])
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "pgstore {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(cli(&["get", "from_py"]), "\\x00py\\xff\n");
    assert!(cli(&["list"]).lines().any(|line| line == "from_rust"));
    assert_eq!(cli(&["add", "cnt", "0"]), "7\n");
    s.set("rust_done", b"1").unwrap();
    let (success, out, err) = finish(child, stdout);
    assert!(success && out.contains("PY_OK"), "the PyTorch server's checks failed:\n{out}\n{err}");
}

const PYTORCH_FILE: &str = r#"
import sys
import torch.distributed as dist
fs = dist.FileStore(sys.argv[1], -1)
assert fs.get("rk") == b"rv"
assert fs.add("cnt", 4) == 7
assert fs.check(["rk", "cnt"])
fs.set("pk", b"p\x00v")
assert fs.delete_key("rk")
assert fs.compare_set("cs", "", "x") == b"x"
print("NUM", fs.num_keys(), flush=True)
del fs
"#;

#[test]
fn our_file_store_and_pytorchs_share_a_file() {
    let Some(python) = python("our_file_store_and_pytorchs_share_a_file") else { return };
    let path: PathBuf = std::env::temp_dir().join(format!("pg-store-interop-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = FileStore::new(&path, -1).unwrap();
    store.set("rk", b"rv").unwrap();
    assert_eq!(store.add("cnt", 3).unwrap(), 3);
    let mut child = spawn(&python, PYTORCH_FILE, &[path.display().to_string()]);
    let stdout = child.stdout.take().unwrap();
    let (success, out, err) = finish(child, stdout);
    assert!(success, "PyTorch's FileStore failed:\n{out}\n{err}");
    // refcount/, /cnt, /pk and /cs: the deleted key is gone for both.
    assert!(out.contains("NUM 4"), "{out}");
    assert_eq!(store.get("pk").unwrap(), b"p\x00v");
    assert!(!store.check(&["rk"]).unwrap());
    assert_eq!(store.add("cnt", 0).unwrap(), 7);
    assert_eq!(store.get("cs").unwrap(), b"x");
    // PyTorch's handle was destroyed (`del fs`): it added cleanup/ and took its reference back.
    assert_eq!(store.num_keys().unwrap(), 5);
    drop(store);
    let _ = std::fs::remove_file(&path);
}

/// A port nobody listens on now: bind, read it, release it.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

const PYTORCH_RANK0: &str = r#"
import sys, datetime
import torch.distributed as dist
# Rank 0 of a world of 2: hosts the server and waits for the other worker (ours) to count itself in init/.
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), world_size=2, is_master=True, timeout=datetime.timedelta(seconds=60))
s.set("from_rank0", "hello")
assert s.get("from_rank1") == b"hi"
assert s.get("agent/k") == b"v"
print("PY_RANK0_OK", flush=True)
"#;

#[test]
fn a_pytorch_rank0_hosts_and_a_rust_rank1_joins() {
    let Some(python) = python("a_pytorch_rank0_hosts_and_a_rust_rank1_joins") else { return };
    let port = free_port();
    let mut child = spawn(&python, PYTORCH_RANK0, &[port.to_string()]);
    let stdout = child.stdout.take().unwrap();
    // Our worker connects with backoff until PyTorch's server listens, counts itself, and the master's
    // waitForWorkers returns.
    let vars: std::collections::HashMap<&str, String> = [
        ("RANK", "1".to_owned()),
        ("WORLD_SIZE", "2".to_owned()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", port.to_string()),
    ]
    .into();
    let rdzv =
        pg_store::rendezvous::rendezvous_with("env://", Duration::from_secs(60), &|name| vars.get(name).cloned())
            .expect("env:// rendezvous against PyTorch's rank 0");
    assert_eq!(rdzv.store.get("from_rank0").unwrap(), b"hello");
    rdzv.store.set("from_rank1", b"hi").unwrap();
    // torchrun's agent store: the same server, used as PyTorch's ranks use it (no prefix).
    let agent_vars: std::collections::HashMap<&str, String> = vars
        .iter()
        .map(|(k, v)| (*k, v.clone()))
        .chain([("TORCHELASTIC_USE_AGENT_STORE", "True".to_owned()), ("TORCHELASTIC_RESTART_COUNT", "0".to_owned())])
        .collect();
    let agent =
        pg_store::rendezvous::rendezvous_with("env://", Duration::from_secs(60), &|name| agent_vars.get(name).cloned())
            .unwrap();
    agent.store.set("k", b"v").unwrap();
    assert_eq!(rdzv.store.get("k").unwrap(), b"v");
    rdzv.store.set("agent/k", b"v").unwrap();
    let (success, out, err) = finish(child, stdout);
    assert!(success && out.contains("PY_RANK0_OK"), "PyTorch's rank 0 failed:\n{out}\n{err}");
}

const PYTORCH_RANK1: &str = r#"
import sys, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), world_size=2, is_master=False, timeout=datetime.timedelta(seconds=60))
assert s.get("from_rank0") == b"hello"
s.set("from_rank1", "hi")
print("PY_RANK1_OK", flush=True)
"#;

#[test]
fn a_rust_rank0_hosts_and_a_pytorch_rank1_joins() {
    let Some(python) = python("a_rust_rank0_hosts_and_a_pytorch_rank1_joins") else { return };
    let port = free_port();
    let mut child = spawn(&python, PYTORCH_RANK1, &[port.to_string()]);
    let stdout = child.stdout.take().unwrap();
    // Our rank 0 hosts the server and waits until PyTorch's worker has counted itself in init/.
    let store = TcpStore::new(
        "127.0.0.1",
        pg_store::TcpStoreOptions {
            port,
            is_server: true,
            num_workers: Some(2),
            timeout: Duration::from_secs(60),
            ..pg_store::TcpStoreOptions::default()
        },
    )
    .expect("the PyTorch worker joined");
    store.set("from_rank0", b"hello").unwrap();
    assert_eq!(store.get("from_rank1").unwrap(), b"hi");
    assert_eq!(store.add_raw("init/", 0).unwrap(), 2);
    let (success, out, err) = finish(child, stdout);
    assert!(success && out.contains("PY_RANK1_OK"), "PyTorch's rank 1 failed:\n{out}\n{err}");
}

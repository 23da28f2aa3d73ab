//! The `pgstore` command against a live server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use pg_store::{Store, TcpStore};

/// `pgstore --addr ADDR --timeout 20` with `args`: (exit code, stdout, stderr).
fn pgstore(addr: &str, args: &[&str]) -> (i32, String, String) {
    pgstore_alone(&[&["--addr", addr, "--timeout", "20"], args].concat())
}

#[test]
fn client_commands_work_on_a_live_store() {
    let store = TcpStore::serve(0, Duration::from_secs(20)).unwrap();
    let addr = format!("127.0.0.1:{}", store.port());
    let ok = |args: &[&str]| {
        let (code, out, err) = pgstore(&addr, args);
        assert_eq!(code, 0, "pgstore {args:?}: {err}");
        out
    };
    assert!(ok(&["ping"]).starts_with("pong"));
    ok(&["set", "greeting", "hello"]);
    assert_eq!(store.get("greeting").unwrap(), b"hello");
    assert_eq!(ok(&["get", "greeting"]), "hello\n");
    assert_eq!(ok(&["add", "n", "41"]), "41\n");
    assert_eq!(ok(&["add", "n", "1"]), "42\n");
    store.set("bin", &[0, 0xff, b'a', b'\n']).unwrap();
    assert_eq!(ok(&["get", "bin"]), "\\x00\\xffa\\n\n", "non-UTF-8 values are escaped");
    assert_eq!(ok(&["check", "greeting", "n"]), "ready\n");
    let (code, out, _) = pgstore(&addr, &["check", "greeting", "nope"]);
    assert_eq!((code, out.as_str()), (1, "not ready\n"));
    assert_eq!(ok(&["wait", "greeting"]), "ready\n");
    let (code, _, err) = pgstore(&addr, &["--timeout", "0.05", "wait", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("wait timeout after 50ms, keys: /nope"), "{err}");
    assert_eq!(ok(&["num-keys"]), "3\n");
    assert_eq!(ok(&["list"]), "bin\ngreeting\nn\n");
    assert_eq!(ok(&["del", "n"]), "deleted\n");
    assert_eq!(ok(&["del", "n"]), "absent\n");
    let (code, _, err) = pgstore(&addr, &["frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown command"), "{err}");
}

/// `pgstore` with `args` and nothing else: (exit code, stdout, stderr).
fn pgstore_alone(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_pgstore")).args(args).output().expect("pgstore runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Help wherever it is asked for: printed on stdout, exit code 0, no server contacted.
fn check_help(args: &[&str]) {
    let (code, out, err) = pgstore_alone(args);
    assert_eq!(code, 0, "pgstore {args:?}: {err}");
    assert!(out.contains("Usage:") && out.contains("pgstore serve [--host H]"), "pgstore {args:?}: {out}");
}

#[test]
fn help_is_printed_however_it_is_asked_for() {
    check_help(&[]);
    check_help(&["help"]);
    check_help(&["-h"]);
    check_help(&["--help"]);
    check_help(&["serve", "--help"]);
    check_help(&["--addr", "127.0.0.1:1", "get", "k", "--help"]);
}

#[test]
fn a_dead_address_is_an_error_not_a_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, _, err) = pgstore(&format!("127.0.0.1:{port}"), &["--timeout", "0.2", "ping"]);
    assert_eq!(code, 2);
    assert!(err.contains("timed out"), "{err}");
}

#[test]
fn serve_runs_a_server_that_clients_can_use() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgstore"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--coalesce-us", "1000", "--flood-rcvbuf-bytes", "65536"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("pgstore serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("pgstore: listening on ").expect("announces its address").to_owned();
    let (code, out, err) = pgstore(&addr, &["add", "k", "3"]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!((code, out.as_str()), (0, "3\n"), "{err}");
}

/// `pgstore serve` with a bad option value exits with status 2 and names the option; it never starts.
fn check_bad_serve_option(option: &str, value: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_pgstore"))
        .args(["serve", "--port", "0", option, value])
        .output()
        .expect("pgstore runs");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{option} {value}: {err}");
    assert!(err.contains(&format!("{option} {value}")), "{option} {value}: {err}");
}

#[test]
fn serve_rejects_bad_option_values() {
    check_bad_serve_option("--threads", "0");
    check_bad_serve_option("--threads", "many");
    check_bad_serve_option("--coalesce-us", "-1");
    check_bad_serve_option("--coalesce-us", "2000000");
    check_bad_serve_option("--flood-rcvbuf-bytes", "-1");
    check_bad_serve_option("--flood-rcvbuf-bytes", "100000000");
    check_bad_serve_option("--busy-poll-us", "soon");
    check_bad_serve_option("--port", "70000");
}

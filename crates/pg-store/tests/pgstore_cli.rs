//! The `pgstore` command against a live server.

use std::io::{BufRead, BufReader, Read, Write};
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

/// `pgstore serve` on a free port of 127.0.0.1 with `options`, its stderr piped, without `RUST_LOG`: the
/// process and the address it announced.
fn serve(options: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgstore"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(options)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgstore serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("pgstore: listening on ").expect("announces its address").to_owned();
    (child, addr)
}

#[test]
fn serve_runs_a_server_that_clients_can_use() {
    let (mut child, addr) = serve(&["--coalesce-us", "1000"]);
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
    check_bad_serve_option("--busy-poll-us", "soon");
    check_bad_serve_option("--port", "70000");
}

#[test]
fn an_over_limit_key_or_value_fails_with_the_limit_named() {
    let store = TcpStore::serve(0, Duration::from_secs(20)).unwrap();
    let addr = format!("127.0.0.1:{}", store.port());
    let key = "k".repeat(9 * 1024);
    let (code, _, err) = pgstore(&addr, &["set", &key, "v"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("key limit of 8192 bytes"), "{err}");
    let (code, _, err) = pgstore(&addr, &["get", &key]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("key limit of 8192 bytes"), "{err}");
    assert_eq!(store.num_keys().unwrap(), 0, "nothing was stored");
    assert_eq!(store.server().unwrap().stats().protocol_errors, 0, "nothing over the limit was sent");
}

#[test]
fn a_refused_add_fails_with_the_reason() {
    let store = TcpStore::serve(0, Duration::from_secs(20)).unwrap();
    let addr = format!("127.0.0.1:{}", store.port());
    store.set("word", b"abc").unwrap();
    let (code, _, err) = pgstore(&addr, &["add", "word", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("refused ADD of 1 to key 'word'") && err.contains("not a decimal integer"), "{err}");
}

/// `pgstore serve` logs a refused connection on stderr with the peer's address and the reason.
#[test]
fn serve_logs_each_refusal_with_the_peer_and_the_reason() {
    let (mut child, addr) = serve(&[]);
    let mut socket = std::net::TcpStream::connect(&addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // A command byte that is not VALIDATE first.
    socket.write_all(&[0xEE]).unwrap();
    let peer = socket.local_addr().unwrap().to_string();
    let mut rest = Vec::new();
    let _ = socket.read_to_end(&mut rest);
    assert!(rest.is_empty(), "a refused connection gets no bytes: {rest:?}");
    // The log line is written before the connection is closed, so it is there once the close was seen.
    child.kill().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    child.wait().unwrap();
    assert!(err.contains("refused") && err.contains(&peer) && err.contains("not VALIDATE"), "{err}");
}

//! The typed_kv example as a user runs it: a typed server process and an
//! `async` client process over kernel UDP on loopback, 2 000 keys put and
//! read back with 8 calls in flight, every answer checked by the client,
//! and the server exiting when the client tells it to. No clock decides
//! anything: the test waits for the server's "listening" line and for
//! both processes to exit.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The example binary, built next to this test (cargo builds examples
/// with the tests; a filtered run may not, so build it then).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = profile_dir.join("examples").join("typed_kv");
    if !path.is_file() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "erpc-typed", "--example", "typed_kv"])
            .status()
            .expect("run cargo");
        assert!(status.success(), "cargo build --example typed_kv failed");
    }
    path
}

/// Kills the server if the test fails before it exits.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn typed_server_and_async_client_processes_over_udp() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let uri = format!("127.0.0.1:{port}");
    let mut server = Reap(
        Command::new(example())
            .args(["server", &uri])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server"),
    );
    let mut lines = BufReader::new(server.0.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    assert_eq!(first, format!("server: listening on {uri}"));
    let out = Command::new(example())
        .args(["client", &uri])
        .env_remove("RUST_LOG")
        .output()
        .expect("run the client");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "client: {stdout}{stderr}");
    assert!(
        stdout.contains(
            "client: 2000 puts and 2000 gets, 4000 answers right, 8 in flight; the server served 4000"
        ),
        "{stdout}"
    );
    let status = server.0.wait().expect("server exit");
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert_eq!(rest, ["server: served 4000 requests; exiting"]);
}

#[test]
fn bad_arguments_print_usage_and_exit_2() {
    for args in [
        &["bogus"][..],
        &["server"],
        &["client"],
        &["client", "127.0.0.1:1", "--window", "0"],
        &["client", "127.0.0.1:1", "--keys"],
    ] {
        let out = Command::new(example()).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("usage:"), "{stderr}");
    }
    // A malformed server URI fails at once, typed, naming what is wrong.
    let out = Command::new(example())
        .args(["client", "garbage"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("port is missing"), "{stderr}");
}

//! The hello_world example as a new user runs it: each mode says hello in
//! plain words (no Debug formatting, no test-only text), and bad arguments
//! print the usage and exit 2.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The example binary, built next to this test (cargo builds examples
/// with the tests; a filtered run may not, so build it then).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/hello_world-<hash> -> target/<profile>/examples/hello_world
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = profile_dir.join("examples").join("hello_world");
    if !path.is_file() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "erpc", "--example", "hello_world"])
            .status()
            .expect("run cargo");
        assert!(status.success(), "cargo build --example hello_world failed");
    }
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(example())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run hello_world")
}

#[test]
fn every_mode_says_hello_like_a_tool() {
    for mode in [&[][..], &["device-model"], &["sim"], &["udp"]] {
        let out = run(mode);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{mode:?}: {stdout}{stderr}");
        assert!(stdout.contains("session 0: connected"), "{stdout}");
        assert!(stdout.contains("hello, eRPC!"), "{stdout}");
        // Human output: no Debug formatting of arrays, tuples or enums.
        for debug in ["[2, 0", "(16, ", "Connected", "Some("] {
            assert!(!stdout.contains(debug), "{mode:?}: {debug:?} in {stdout}");
        }
        assert!(!stderr.contains("this test"), "{stderr}");
        assert!(stderr.matches("note:").count() <= 1, "{stderr}");
    }
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("NIC 1: firmware ") && stdout.contains("MAC 02:00:00:00:00:01"),
        "{stdout}"
    );
}

#[test]
fn bad_arguments_print_usage_and_exit_2() {
    for args in [&["bogus"][..], &["udp", "extra"], &["--verbose"]] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: hello_world"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    let out = run(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("usage: hello_world"));
}

//! Every binary of erpc-apps refuses bad and contradictory flags as a
//! usage error: exit status 2, the flag and its limit named, no panic, no
//! hang (the harness is erpc-tools' tools/tests/support/bad_flags.rs); and
//! ends quietly when its reader goes away (`ordered-kv | head -1`).

#[path = "../../tests/support/bad_flags.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::{Case, case, check};

const EXES: &[(&str, &str)] = &[
    ("raft-kv", env!("CARGO_BIN_EXE_raft-kv")),
    ("ordered-kv", env!("CARGO_BIN_EXE_ordered-kv")),
    ("dispatch-bench", env!("CARGO_BIN_EXE_dispatch-bench")),
    ("herd-kv", env!("CARGO_BIN_EXE_herd-kv")),
    ("sequencer", env!("CARGO_BIN_EXE_sequencer")),
];

/// A replica and a client address, for the client subcommand's cases.
const CLIENT: [&str; 5] = [
    "client",
    "--listen",
    "127.0.0.1:1",
    "--replica",
    "1=127.0.0.1:2",
];

const CASES: &[Case] = &[
    // Panicked (remainder by zero), or ran against --help.
    case(
        "raft-kv",
        &["--keys", "0", "--ops", "10", "--pings", "10"],
        &["--keys", "must be 1 to 100000000"],
    ),
    case(
        "raft-kv",
        &["--replicas", "4"],
        &["--replicas", "3, 5 or 7"],
    ),
    case("raft-kv", &["--ops", "0"], &["--ops", "must be 1 to"]),
    case("raft-kv", &["--transport", "rdma"], &["--transport", "sim"]),
    case(
        "raft-kv",
        &["replica", "--id", "0", "--listen", "127.0.0.1:1"],
        &["--id", "must be 1 to"],
    ),
    case(
        "raft-kv",
        &["client", "--listen", "127.0.0.1:1"],
        &["--replica"],
    ),
    case(
        "raft-kv",
        &[
            CLIENT[0], CLIENT[1], CLIENT[2], CLIENT[3], CLIENT[4], "--lanes", "0",
        ],
        &["--lanes", "must be 1 to 1024"],
    ),
    case(
        "raft-kv",
        &[
            CLIENT[0], CLIENT[1], CLIENT[2], CLIENT[3], CLIENT[4], "--keys", "4",
        ],
        &["--keys 4 is below --lanes 8"],
    ),
    case(
        "raft-kv",
        &[
            "replica",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:1",
            "--tick-ms",
            "0",
        ],
        &["--tick-ms", "must be 1 to 10000"],
    ),
    // ordered-kv: panics, and NaN printed as "all correct".
    case(
        "ordered-kv",
        &["--keys", "0"],
        &["--keys", "must be 1 to 100000000"],
    ),
    case(
        "ordered-kv",
        &["--secs", "NaN"],
        &["--secs", "above 0 and at most 86400"],
    ),
    case(
        "ordered-kv",
        &["--secs", "0"],
        &["--secs", "above 0 and at most 86400"],
    ),
    case("ordered-kv", &["--rounds", "0"], &["--rounds", "1 to 1000"]),
    case("ordered-kv", &["--window", "0"], &["--window", "1 to 1024"]),
    case(
        "ordered-kv",
        &["--scans-per-mille", "1001"],
        &["--scans-per-mille", "0 to 1000"],
    ),
    case("ordered-kv", &["--workers", "0"], &["--workers", "1 to 64"]),
    // dispatch-bench: a hang, "achieved inf", a panic, exit status 1.
    case(
        "dispatch-bench",
        &["--loads", "0"],
        &["--loads", "above 0 and below 1"],
    ),
    case(
        "dispatch-bench",
        &["--loads=-0.5"],
        &["--loads", "above 0 and below 1"],
    ),
    case(
        "dispatch-bench",
        &["--loads", "0.5,NaN"],
        &["--loads", "above 0 and below 1"],
    ),
    case(
        "dispatch-bench",
        &["--secs", "NaN"],
        &["--secs", "above 0 and at most 86400"],
    ),
    case(
        "dispatch-bench",
        &["--sessions", "256"],
        &["--sessions", "1 to 255"],
    ),
    case(
        "dispatch-bench",
        &["--workers", "0"],
        &["--workers", "1 to 64"],
    ),
    case(
        "dispatch-bench",
        &["--policies", "rr,fifo"],
        &["--policies", "sq2"],
    ),
    case(
        "dispatch-bench",
        &["--long-ppm", "1000001"],
        &["--long-ppm", "0 to 1000000"],
    ),
    // Options of the other transport.
    case(
        "dispatch-bench",
        &["--transport", "sim", "--secs", "2"],
        &["--secs applies to --transport dev only"],
    ),
    case(
        "dispatch-bench",
        &["--sim-step-ns", "50"],
        &["--sim-step-ns applies to --transport sim only"],
    ),
    // The issue-35 applications: the same kinds of values.
    case(
        "herd-kv",
        &["--keys", "0"],
        &["--keys", "must be 1 to 100000000"],
    ),
    case("herd-kv", &["--secs", "NaN"], &["--secs", "0.1 to 600"]),
    case("herd-kv", &["--zipf", "0"], &["--zipf", "above 0"]),
    case("herd-kv", &["--window", "0"], &["--window", "1 to 1024"]),
    case("herd-kv", &["--threads", "0"], &["--threads", "1 to 16"]),
    case("herd-kv", &["--rate=-1"], &["--rate", "above 0"]),
    case(
        "herd-kv",
        &["--puts-per-mille", "1001"],
        &["--puts-per-mille", "0 to 1000"],
    ),
    case(
        "herd-kv",
        &["--handlers", "x"],
        &["--handlers", "per-request, burst or both"],
    ),
    case("sequencer", &["--secs", "NaN"], &["--secs", "0.1 to 600"]),
    case("sequencer", &["--window", "0"], &["--window", "1 to 1024"]),
    case(
        "sequencer",
        &["--sessions", "0"],
        &["--sessions", "1 to 64"],
    ),
    case("sequencer", &["--rounds", "0"], &["--rounds", "1 to 20"]),
    case(
        "sequencer",
        &["--transport", "rdma"],
        &["--transport", "dev"],
    ),
];

#[test]
fn every_binary_refuses_bad_flags_with_exit_2_naming_the_limit() {
    check(env!("CARGO_MANIFEST_DIR"), EXES, CASES);
}

/// `ordered-kv | head -1`: the first line read, the pipe closed; the
/// program must end with status 0 and no panic at its next line.
#[test]
fn a_closed_stdout_ends_the_programs_quietly() {
    for (exe, args) in [
        (
            env!("CARGO_BIN_EXE_ordered-kv"),
            &["--keys", "1000", "--secs", "0.05", "--rounds", "1"][..],
        ),
        (
            env!("CARGO_BIN_EXE_raft-kv"),
            &[
                "--transport",
                "sim",
                "--keys",
                "100",
                "--ops",
                "10",
                "--pings",
                "10",
            ][..],
        ),
        (
            env!("CARGO_BIN_EXE_dispatch-bench"),
            &[
                "--transport",
                "sim",
                "--loads",
                "0.5",
                "--policies",
                "rr",
                "--sim-secs",
                "0.01",
            ][..],
        ),
    ] {
        let mut child = Command::new(exe)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty(), "{exe}: no first line");
        // The reader is dropped: the pipe is closed.
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{exe}: {err}");
        assert_eq!(out.status.code(), Some(0), "{exe}: {err}");
    }
}

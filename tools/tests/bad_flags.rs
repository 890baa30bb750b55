//! Every binary of erpc-tools refuses bad and contradictory flags as a
//! usage error: exit status 2, the flag and its limit named, no panic, no
//! hang (see support/bad_flags.rs). erpc-apps has the same test for its
//! binaries (tools/apps/tests/bad_flags.rs).

#[path = "support/bad_flags.rs"]
mod support;

use support::{Case, case, check};

const EXES: &[(&str, &str)] = &[
    ("erpc-bench", env!("CARGO_BIN_EXE_erpc-bench")),
    ("erpc-inspect", env!("CARGO_BIN_EXE_erpc-inspect")),
    ("erpc-vfio", env!("CARGO_BIN_EXE_erpc-vfio")),
    (
        "erpc-vfio-guest-test",
        env!("CARGO_BIN_EXE_erpc-vfio-guest-test"),
    ),
];

const CASES: &[Case] = &[
    // Values out of range.
    case(
        "erpc-bench",
        &["--window", "0"],
        &["--window 0", "1 to 1024"],
    ),
    case("erpc-bench", &["--secs", "NaN"], &["--secs", "86400"]),
    case("erpc-bench", &["--loss", "0.5"], &["--loss", "below 0.5"]),
    case("erpc-bench", &["--size", "x"], &["--size"]),
    case(
        "erpc-bench",
        &["scale", "--sessions-per-client", "70000"],
        &["--sessions-per-client 70000", "1 to 65000"],
    ),
    case(
        "erpc-bench",
        &["factors", "--rounds", "101"],
        &["--rounds 101", "1 to 100"],
    ),
    // Options the job does not take (clap's refusal).
    case("erpc-bench", &["incast", "--batch", "3"], &["--batch"]),
    case("erpc-bench", &["--trials", "5"], &["--trials"]),
    case("erpc-bench", &["--batch", "3", "incast"], &["--batch"]),
    // The experiments were `--experiment NAME` before they were
    // subcommands: old scripts are told the new command.
    case(
        "erpc-bench",
        &["--experiment", "loss"],
        &["--experiment loss", "`erpc-bench loss`"],
    ),
    case(
        "erpc-bench",
        &["--controller", "swift"],
        &["--controller", "--cc on"],
    ),
    case(
        "erpc-bench",
        &["scale", "--transport", "udp"],
        &["--transport"],
    ),
    // A reference that cannot recover from loss.
    case(
        "erpc-bench",
        &["--only", "raw-echo", "--loss", "0.001"],
        &["--loss applies to the eRPC points", "--only raw-echo"],
    ),
    case(
        "erpc-inspect",
        &["1", "--timeout-ms", "0"],
        &["--timeout-ms 0", "1 to 10000"],
    ),
    case(
        "erpc-inspect",
        &["1", "--json", "--cqe", "1"],
        &["--json", "--cqe"],
    ),
    case(
        "erpc-inspect",
        &["1", "--count", "3"],
        &["--count", "--watch"],
    ),
    case(
        "erpc-inspect",
        &["1", "--interval", "2"],
        &["--interval", "--watch"],
    ),
    case("erpc-inspect", &["1", "--cqe=-1"], &["--cqe"]),
    case("erpc-vfio", &["bind", "not-a-bdf"], &["not-a-bdf"]),
    case("erpc-vfio", &["status"], &["<BDF>"]),
    case("erpc-vfio", &["list", "--bogus"], &["--bogus"]),
    case(
        "erpc-vfio-guest-test",
        &["--bogus"],
        &["takes no arguments", "tools/vm/run.sh"],
    ),
];

#[test]
fn every_binary_refuses_bad_flags_with_exit_2_naming_the_limit() {
    check(env!("CARGO_MANIFEST_DIR"), EXES, CASES);
}

/// The table check itself: the manifest's binaries are found, and one
/// without a row fails the test.
#[test]
fn a_binary_without_a_row_fails_the_check() {
    let bins = support::bins_of(env!("CARGO_MANIFEST_DIR"));
    let names: Vec<&str> = EXES.iter().map(|(n, _)| *n).collect();
    assert_eq!(bins.iter().map(String::as_str).collect::<Vec<_>>(), {
        let mut n = names.clone();
        n.sort_unstable();
        n
    });
    let r = std::panic::catch_unwind(|| check(env!("CARGO_MANIFEST_DIR"), &EXES[1..], &[]));
    let msg = r.expect_err("a missing row must fail");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("binary erpc-bench has no entry in this test's table"),
        "{msg}"
    );
}

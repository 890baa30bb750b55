//! Leader failover across processes: three replica processes and a client
//! process in two network namespaces (two per namespace) joined by a veth
//! pair, eRPC over kernel UDP; the leader's process is killed (SIGKILL)
//! after a third of the PUTs, a new leader takes over, the client retries,
//! and every acknowledged key is read back (`raft-kv netns-failover`).
//!
//! Needs root and `ip`; reported as ignored with the reason otherwise,
//! except in CI (`ERPC_CI=1`), where it must run.

use std::process::Command;

fn main() -> std::process::ExitCode {
    use libtest_mimic::{Arguments, Trial};
    let args = Arguments::from_args();
    let name = "leader_process_killed_in_namespaces_over_udp_loses_no_acknowledged_write";
    let trial = match missing_prerequisite() {
        None => Trial::test(name, || {
            let out = Command::new(env!("CARGO_BIN_EXE_raft-kv"))
                .args(["netns-failover", "--keys", "3000", "--ops", "1500"])
                .output()
                .map_err(|e| format!("run raft-kv: {e}"))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && stdout.contains("no acknowledged write lost") {
                Ok(())
            } else {
                Err(format!(
                    "raft-kv netns-failover: {}\n{stdout}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
                .into())
            }
        }),
        Some(why) if std::env::var_os("ERPC_CI").is_some() => Trial::test(name, move || {
            Err(format!("ERPC_CI is set but the namespace test cannot run: {why}").into())
        }),
        Some(why) => {
            if !args.list {
                eprintln!("{name}: ignored: {why}");
            }
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    };
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Why two namespaces cannot be made here, if they cannot.
fn missing_prerequisite() -> Option<String> {
    if !is_root() {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` command (iproute2) is missing".into());
    }
    let probe = format!("raftkv-probe-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &probe])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Some("cannot create a network namespace".into());
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    None
}

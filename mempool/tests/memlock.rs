//! A process whose locked-memory limit (`RLIMIT_MEMLOCK`) is too small
//! for a region is told about that limit, not about hugepages.
//!
//! The test runs itself again in a child with a 64 KiB limit (`prlimit`)
//! and, when run as root, without `CAP_IPC_LOCK` (`setpriv` drops it from
//! the bounding set, so the child's root has none): the limit applies
//! only to processes without that capability.

use mempool::{Fallback, HUGE_2M, HugepageRegion, RegionError, RegionOptions};

const CHILD: &str = "MEMPOOL_MEMLOCK_CHILD";

fn child() {
    for fallback in [Fallback::Never, Fallback::SmallPages] {
        let err = HugepageRegion::reserve(
            2 * HUGE_2M,
            RegionOptions {
                fallback,
                ..Default::default()
            },
        )
        .expect_err("64 KiB of locked memory cannot hold 4 MiB");
        match &err {
            // Without free hugepages and without the fallback, the pool's
            // shortage is met first (mmap); that is the right message.
            RegionError::HugepagesUnavailable { .. } if fallback == Fallback::Never => continue,
            RegionError::LockedMemoryLimit { limit_bytes, .. } => {
                assert_eq!(*limit_bytes, Some(64 << 10), "{err}");
            }
            other => panic!("{fallback:?}: expected LockedMemoryLimit, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("64 KiB") && msg.contains("ulimit -l"), "{msg}");
        assert!(!msg.contains("nr_hugepages"), "{msg}");
        println!("{fallback:?}: {msg}");
    }
}

#[test]
fn a_small_locked_memory_limit_is_named_with_how_to_raise_it() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let exe = std::env::current_exe().unwrap();
    let root = euid() == 0;
    let mut cmd = if root {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--bounding-set=-ipc_lock", "--", "prlimit"]);
        c
    } else {
        std::process::Command::new("prlimit")
    };
    cmd.args(["--memlock=65536:65536", "--"])
        .arg(&exe)
        .args([
            "--exact",
            "a_small_locked_memory_limit_is_named_with_how_to_raise_it",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1");
    let out = cmd
        .output()
        .expect("run the child under setpriv/prlimit (util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("SmallPages: cannot lock"), "{text}");
}

/// The effective uid, from /proc (no extra dependency for one number).
fn euid() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("Uid:")).unwrap();
    l.split_whitespace().nth(2).unwrap().parse().unwrap()
}

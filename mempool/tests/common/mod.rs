//! Shared helpers for the mempool integration tests.
#![allow(dead_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use mempool::{DmaError, DmaMapper, DmaMapping};

/// True when this run must not skip hugepage tests (CI sets `ERPC_CI=1`
/// after reserving hugepages).
pub fn required() -> bool {
    std::env::var_os("ERPC_CI").is_some_and(|v| v == "1")
}

/// Why a test that needs `pages` free 2 MiB hugepages cannot run here, if
/// it cannot (with the command that reserves them).
pub fn missing_hugepages(pages: u64) -> Option<String> {
    if mempool::hugepages_available(pages) {
        return None;
    }
    let info = mempool::meminfo::HugepageInfo::read().unwrap_or_default();
    Some(format!(
        "needs {pages} free 2 MiB hugepages, {} available; reserve with `{}`",
        info.available(),
        mempool::meminfo::reserve_command(&info, pages)
    ))
}

/// A test of this binary's `main` (a libtest-mimic harness): runs `f`,
/// or, when `missing` names a missing prerequisite, is reported as
/// ignored (and fails in CI, `ERPC_CI=1`, where nothing may be skipped).
pub fn trial(name: &str, f: fn(), missing: Option<String>) -> libtest_mimic::Trial {
    use libtest_mimic::Trial;
    match missing {
        None => Trial::test(name, move || {
            f();
            Ok(())
        }),
        Some(why) if required() => Trial::test(name, move || {
            Err(format!("{why} (ERPC_CI=1: hugepage tests may not be skipped)").into())
        }),
        Some(why) => {
            let args: Vec<String> = std::env::args().collect();
            if !args.iter().any(|a| a == "--list") {
                eprintln!("{name}: ignored: {why}");
            }
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    }
}

/// Returns true if `pages` 2 MiB hugepages are available; otherwise prints
/// why the test is skipped, or panics when running in CI.
pub fn have_hugepages(test: &str, pages: u64) -> bool {
    if mempool::hugepages_available(pages) {
        return true;
    }
    let info = mempool::meminfo::HugepageInfo::read().unwrap_or_default();
    let msg = format!(
        "{test}: needs {pages} free 2 MiB hugepages, {} available; reserve with `{}`",
        info.available(),
        mempool::meminfo::reserve_command(&info, pages)
    );
    if required() {
        panic!("{msg} (ERPC_CI=1: hugepage tests may not be skipped)");
    }
    eprintln!("SKIPPED {msg}");
    false
}

/// A mapper that hands out IOVAs from a bump pointer far from the virtual
/// addresses, so translation bugs cannot hide behind an identity mapping, and
/// records every live mapping.
#[derive(Debug)]
pub struct BumpMapper {
    next: AtomicU64,
    pub live: Mutex<Vec<(usize, DmaMapping)>>,
    pub unmapped: AtomicU64,
}

impl Default for BumpMapper {
    fn default() -> Self {
        Self::new()
    }
}

impl BumpMapper {
    pub fn new() -> Self {
        BumpMapper {
            next: AtomicU64::new(0x10_0000_0000),
            live: Mutex::new(Vec::new()),
            unmapped: AtomicU64::new(0),
        }
    }
}

impl DmaMapper for BumpMapper {
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError> {
        let iova = self
            .next
            .fetch_add(len as u64 + (2 << 20), Ordering::Relaxed);
        let m = DmaMapping {
            iova,
            len,
            lkey: 0xabc,
        };
        self.live.lock().unwrap().push((va, m));
        Ok(m)
    }

    fn unmap(&self, va: usize, mapping: &DmaMapping) -> Result<(), DmaError> {
        let mut live = self.live.lock().unwrap();
        let idx = live
            .iter()
            .position(|(v, m)| *v == va && m == mapping)
            .expect("unmap of unknown mapping");
        live.swap_remove(idx);
        self.unmapped.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

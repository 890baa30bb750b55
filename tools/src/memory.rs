//! How much hugepage memory the tools need, and the one note they print
//! when it is not there.
//!
//! Every DMA buffer of a run lives in 2 MiB hugepages: the NICs' queues and
//! firmware pages, and each node's message buffers. `erpc-bench` reserves
//! each node's buffers up front (one region, sized for the point), so the
//! need is known before the run starts: [`bench_pages`]. When fewer pages
//! are free, [`MemoryPlan::decide`] falls back to 4 KiB pages and says so
//! once, with the number of pages and the command that reserves them.

use erpc::msgbuf_bytes;
use mempool::meminfo::{HugepageInfo, reserve_command};
use mempool::{Fallback, HUGE_2M, RegionOptions, class_size};
use transport::MAX_DATA_PER_PKT;

/// The default point of `erpc-bench` (32-byte messages, 60 in flight).
pub const DEFAULT_SIZE: usize = 32;
/// See [`DEFAULT_SIZE`].
pub const DEFAULT_WINDOW: usize = 60;

/// Hugepage memory of the NICs of one run (two device-model NICs, or the
/// queue sets of one real NIC): queues, RX rings, firmware pages.
/// Measured with `Private_Hugetlb` in `/proc/PID/smaps_rollup`.
const NIC_BYTES: usize = 16 << 20;
/// Buffers a node needs besides the benchmark's own: preallocated
/// responses, control packets, the raw echo's packet buffers.
const NODE_BASE_BYTES: usize = 8 << 20;

/// Bytes of message buffers one node reserves for a point, rounded up to
/// whole hugepages: as a client, a request and a response buffer per
/// request in flight; as a server of multi-packet messages, a request
/// (reassembly) and a response buffer per busy session slot (single-packet
/// requests are read in place and answered from the slot's preallocated
/// buffer); plus 8 MiB for the rest (preallocated responses, control
/// packets, the raw echo).
pub fn node_bytes(size: usize, window: usize) -> usize {
    let per_buffer = class_size(mempool::class_for(msgbuf_bytes(size)).unwrap_or(0));
    // The benchmark opens enough sessions for its window
    // (`bench::sessions_per_node`): every request can be busy at the server.
    let server = if size > MAX_DATA_PER_PKT {
        2 * window
    } else {
        0
    };
    let bytes = window
        .saturating_mul(2)
        .saturating_add(server)
        .saturating_mul(per_buffer)
        .saturating_add(NODE_BASE_BYTES);
    bytes.div_ceil(HUGE_2M).saturating_mul(HUGE_2M)
}

/// 2 MiB hugepages a run of `erpc-bench` at (`size`, `window`) needs: two
/// nodes' buffers, plus the NICs' memory when `nics` (the mlx5 transport;
/// kernel UDP has none).
pub fn bench_pages(size: usize, window: usize, nics: bool) -> u64 {
    let nic_bytes = if nics { NIC_BYTES } else { 0 };
    ((nic_bytes + 2 * node_bytes(size, window)) / HUGE_2M) as u64
}

/// The page count README, `erpc-bench` and `erpc-vfio status` give for a
/// default run (on the device model or a NIC).
pub fn default_bench_pages() -> u64 {
    bench_pages(DEFAULT_SIZE, DEFAULT_WINDOW, true)
}

/// Where a tool's DMA memory comes from, decided once per run.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    /// Pages the run needs.
    pub pages: u64,
    /// Options for every region of the run.
    pub region: RegionOptions,
    /// The note to print once when falling back to 4 KiB pages.
    pub note: Option<String>,
}

impl MemoryPlan {
    /// Hugepages if `pages` are free, otherwise 4 KiB pages with a note
    /// naming `tool`, the need, what is free and the command to run.
    pub fn decide(tool: &str, pages: u64) -> MemoryPlan {
        let info = HugepageInfo::read().unwrap_or_default();
        Self::decide_with(tool, pages, &info)
    }

    /// [`MemoryPlan::decide`] against given counters (for tests).
    pub fn decide_with(tool: &str, pages: u64, info: &HugepageInfo) -> MemoryPlan {
        let enough = info.page_size_bytes == HUGE_2M as u64 && info.available() >= pages;
        let (fallback, note) = if enough {
            (Fallback::Never, None)
        } else {
            let note = format!(
                "note: {tool} needs {pages} free 2 MiB hugepages for this run and {} are \
                 free; using 4 KiB pages, so the numbers are not representative. Reserve them \
                 with `{}`",
                info.available(),
                reserve_command(info, pages)
            );
            (Fallback::SmallPages, Some(note))
        };
        MemoryPlan {
            pages,
            region: RegionOptions {
                fallback,
                ..Default::default()
            },
            note,
        }
    }

    /// True if the run uses 4 KiB pages.
    pub fn is_fallback(&self) -> bool {
        self.note.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(total: u64, free: u64) -> HugepageInfo {
        HugepageInfo::parse(&format!(
            "HugePages_Total: {total}\nHugePages_Free: {free}\nHugePages_Rsvd: 0\n\
             Hugepagesize: 2048 kB\n"
        ))
    }

    #[test]
    fn default_run_needs_a_few_dozen_pages() {
        // 60 × 2 × 128 B of buffers + 8 MiB per node, 16 MiB of NICs.
        assert_eq!(node_bytes(32, 60), 10 << 20);
        assert_eq!(default_bench_pages(), 18);
        // Large messages scale with the window.
        // 500 000 bytes + 517 packet headers of 56 bytes: the 1 MiB class;
        // 16 buffers as a client, 16 as a server (8 slots).
        assert_eq!(node_bytes(500_000, 8), (32 << 20) + (8 << 20));
        assert_eq!(bench_pages(500_000, 8, true), 8 + 2 * 20);
        assert_eq!(bench_pages(32, 60, false), 10);
    }

    /// README gives the same number, for the default run, in the command
    /// and in the sample note.
    #[test]
    fn readme_gives_the_default_runs_number() {
        let readme = include_str!("../../README.md");
        let n = default_bench_pages();
        let cmd = format!("echo {n} | sudo tee /proc/sys/vm/nr_hugepages");
        assert!(readme.contains(&cmd), "README lacks `{cmd}`");
        assert!(
            readme.contains(&format!("a default run needs {n} free 2 MiB pages")),
            "README states another number than {n}"
        );
        let note = MemoryPlan::decide_with("erpc-bench", n, &info(0, 0))
            .note
            .unwrap();
        assert!(
            readme.contains(&note),
            "README's sample note differs from\n{note}"
        );
    }

    #[test]
    fn shortage_gives_one_note_with_the_need_and_the_command() {
        let p = MemoryPlan::decide_with("erpc-bench", 18, &info(0, 0));
        assert!(p.is_fallback());
        assert_eq!(p.region.fallback, Fallback::SmallPages);
        let note = p.note.unwrap();
        assert!(note.contains("needs 18 free 2 MiB hugepages"), "{note}");
        assert!(note.contains("and 0 are free"), "{note}");
        assert!(
            note.contains("`echo 18 | sudo tee /proc/sys/vm/nr_hugepages`"),
            "{note}"
        );
        // On a machine with some pages in use, the command grows the pool
        // by the shortfall.
        let note = MemoryPlan::decide_with("erpc-bench", 18, &info(100, 10))
            .note
            .unwrap();
        assert!(note.contains("echo 108 |"), "{note}");
        let p = MemoryPlan::decide_with("erpc-bench", 18, &info(18, 18));
        assert!(!p.is_fallback());
        assert_eq!(p.region.fallback, Fallback::Never);
    }
}

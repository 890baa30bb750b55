//! Hugepage regions: contiguous virtual ranges of locked hugepages that a
//! device reaches through one IOVA range.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::dma::{DmaError, DmaMapper, DmaMapping};
use crate::meminfo::{self, HugepageInfo};
use crate::sys::{HUGE_2M, MapFailure, Mapping, PageSize};

/// What to do when hugepages cannot be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Fail with [`RegionError::HugepagesUnavailable`] (the default).
    #[default]
    Never,
    /// Use ordinary 4 KiB pages, log a warning, and mark the region (see
    /// [`HugepageRegion::is_fallback`]). Only for development machines: the
    /// IOMMU then needs 512 times more entries per byte.
    SmallPages,
}

/// How a region is reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionOptions {
    /// Preferred page size: [`PageSize::Huge2M`] (default) or [`PageSize::Huge1G`].
    pub page_size: PageSize,
    /// Behaviour when the preferred pages are missing.
    pub fallback: Fallback,
}

impl Default for RegionOptions {
    fn default() -> Self {
        RegionOptions {
            page_size: PageSize::Huge2M,
            fallback: Fallback::Never,
        }
    }
}

/// Reserving or registering a region failed.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Not enough free hugepages; the message says what to run.
    #[error(
        "cannot reserve {bytes} bytes in {page_kib} KiB hugepages: {needed} pages needed, \
         {available} available (HugePages_Total {total}, HugePages_Free {free}, HugePages_Rsvd {reserved}); \
         reserve more with `{command}`, or opt in to the 4 KiB fallback (Fallback::SmallPages)"
    )]
    HugepagesUnavailable {
        /// Bytes requested.
        bytes: usize,
        /// Page size tried, in KiB.
        page_kib: usize,
        /// Pages the request needed.
        needed: u64,
        /// Pages a new mapping could still obtain.
        available: u64,
        /// `HugePages_Total`.
        total: u64,
        /// `HugePages_Free`.
        free: u64,
        /// `HugePages_Rsvd`.
        reserved: u64,
        /// The command that makes room.
        command: String,
    },
    /// `mmap`/`mlock` failed for another reason.
    #[error("cannot map {bytes} bytes of {page_kib} KiB pages: {source}")]
    Map {
        /// Bytes requested.
        bytes: usize,
        /// Page size tried, in KiB.
        page_kib: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `mlock` refused: the process may not lock that much memory (its
    /// locked-memory limit, `RLIMIT_MEMLOCK`, and no `CAP_IPC_LOCK`).
    /// More hugepages would not help; the message says how to raise the
    /// limit.
    #[error(
        "cannot lock {bytes} bytes of {page_kib} KiB pages in memory: the locked-memory limit \
         (RLIMIT_MEMLOCK, `ulimit -l`) is {}{}; this is not a shortage of hugepages. Raise the \
         limit: `ulimit -l unlimited` in the shell that starts the program (as root, or up to \
         the hard limit), a `memlock` line in /etc/security/limits.conf (e.g. `USER - memlock \
         unlimited`, then log in again), `LimitMEMLOCK=infinity` for a systemd service, or give \
         the program CAP_IPC_LOCK (`sudo setcap cap_ipc_lock+ep PROGRAM`) ({source})",
        limit_text(*.limit_bytes),
        locked_text(*.locked_bytes)
    )]
    LockedMemoryLimit {
        /// Bytes requested.
        bytes: usize,
        /// Page size tried, in KiB.
        page_kib: usize,
        /// The soft limit, bytes (`None`: unlimited or unknown).
        limit_bytes: Option<u64>,
        /// Memory this process had locked already, bytes (`VmLck`), if known.
        locked_bytes: Option<u64>,
        /// The OS error (`ENOMEM`, or `EPERM` with a limit of 0).
        #[source]
        source: io::Error,
    },
    /// A zero or unaligned size.
    #[error("region size {bytes} is not a non-zero multiple of the {page_kib} KiB page size")]
    BadSize {
        /// Bytes requested.
        bytes: usize,
        /// Page size in KiB.
        page_kib: usize,
    },
    /// The region is already registered with a mapper.
    #[error("region at VA {va:#x} is already registered for DMA at IOVA {iova:#x}")]
    AlreadyRegistered {
        /// Region start.
        va: usize,
        /// Its IOVA.
        iova: u64,
    },
    /// The DMA mapper refused.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

/// A locked, populated virtual range in hugepages (or, on explicit request,
/// ordinary pages), optionally registered for DMA.
///
/// Once registered, translating an address inside the region to an IOVA is a
/// subtraction and an addition ([`HugepageRegion::iova_of`]). The mapping is
/// removed from the device and the memory released on drop.
#[derive(Debug)]
pub struct HugepageRegion {
    mapping: Mapping,
    page_size: PageSize,
    fallback: bool,
    dma: Option<(Arc<dyn DmaMapper>, DmaMapping)>,
}

impl HugepageRegion {
    /// Reserves `bytes` (a multiple of 2 MiB, or of 1 GiB for 1 GiB pages),
    /// aligned to 2 MiB whatever the backing pages.
    pub fn reserve(bytes: usize, opts: RegionOptions) -> Result<HugepageRegion, RegionError> {
        let page = opts.page_size;
        let page_kib = page.bytes() / 1024;
        if bytes == 0 || !bytes.is_multiple_of(page.bytes()) || !bytes.is_multiple_of(HUGE_2M) {
            return Err(RegionError::BadSize { bytes, page_kib });
        }
        match Mapping::new(bytes, page, HUGE_2M) {
            Ok(mapping) => Ok(HugepageRegion {
                mapping,
                page_size: page,
                fallback: false,
                dma: None,
            }),
            // The locked-memory limit: 4 KiB pages would be refused too.
            Err(MapFailure::Lock(source)) => Err(lock_error(bytes, page, source)),
            Err(MapFailure::Map(err)) if page != PageSize::Small4K && is_out_of_hugepages(&err) => {
                let info = HugepageInfo::read().unwrap_or_default();
                let needed = (bytes / page.bytes()) as u64;
                if opts.fallback == Fallback::SmallPages {
                    note_fallback(&FALLBACK_NOTED, bytes, needed, info.available());
                    let mapping =
                        Mapping::new(bytes, PageSize::Small4K, HUGE_2M).map_err(|f| match f {
                            MapFailure::Lock(source) => {
                                lock_error(bytes, PageSize::Small4K, source)
                            }
                            MapFailure::Map(source) => RegionError::Map {
                                bytes,
                                page_kib: 4,
                                source,
                            },
                        })?;
                    return Ok(HugepageRegion {
                        mapping,
                        page_size: PageSize::Small4K,
                        fallback: true,
                        dma: None,
                    });
                }
                Err(unavailable(bytes, page, needed, &info))
            }
            Err(MapFailure::Map(source)) => Err(RegionError::Map {
                bytes,
                page_kib,
                source,
            }),
        }
    }

    /// Registers the whole region with `mapper`; from now on it has an IOVA.
    pub fn register(&mut self, mapper: Arc<dyn DmaMapper>) -> Result<DmaMapping, RegionError> {
        if let Some((_, m)) = &self.dma {
            return Err(RegionError::AlreadyRegistered {
                va: self.va(),
                iova: m.iova,
            });
        }
        // SAFETY: the region owns this locked range and keeps it allocated
        // until Drop, which unmaps first (and leaks it if unmapping fails).
        let mapping = unsafe { mapper.map(self.va(), self.len()) }?;
        self.dma = Some((mapper, mapping));
        Ok(mapping)
    }

    /// Start of the region.
    pub fn ptr(&self) -> NonNull<u8> {
        self.mapping.ptr()
    }

    /// Start of the region as an integer.
    pub fn va(&self) -> usize {
        self.mapping.ptr().as_ptr() as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mapping.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Page size backing the region.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// True if hugepages were missing and the caller allowed 4 KiB pages.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// The DMA registration, if any.
    pub fn dma(&self) -> Option<DmaMapping> {
        self.dma.as_ref().map(|(_, m)| *m)
    }

    /// True if `addr` lies inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.va()) < self.len()
    }

    /// IOVA of `addr`, if the region is registered and contains it. O(1).
    pub fn iova_of(&self, addr: usize) -> Option<u64> {
        let (_, m) = self.dma.as_ref()?;
        self.contains(addr)
            .then(|| m.iova + (addr - self.va()) as u64)
    }
}

impl Drop for HugepageRegion {
    fn drop(&mut self) {
        if let Some((mapper, m)) = self.dma.take()
            && let Err(err) = mapper.unmap(self.va(), &m)
        {
            // The device may still reach these pages through the IOMMU:
            // giving them back to the kernel could let a later DMA
            // scribble over someone else's memory. Leak them instead.
            tracing::error!(%err, "DMA unmap of a hugepage region failed; leaking the region");
            let mapping = std::mem::replace(&mut self.mapping, Mapping::empty());
            std::mem::forget(mapping);
        }
    }
}

/// Whether this process has said it falls back to 4 KiB pages: a process
/// reserves many regions (one per Rpc, per device, per allocator growth),
/// and the note says the same each time.
static FALLBACK_NOTED: AtomicBool = AtomicBool::new(false);

/// The fallback note: a warning the first time `noted` is set (once per
/// process with [`FALLBACK_NOTED`]), a debug event after that.
fn note_fallback(noted: &AtomicBool, bytes: usize, needed: u64, available: u64) {
    if !noted.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            bytes,
            needed,
            available,
            "hugepages unavailable; falling back to 4 KiB pages as requested \
             (slower IOMMU translation, visible in region stats; said once per process)"
        );
    } else {
        tracing::debug!(
            bytes,
            needed,
            available,
            "hugepages unavailable; another region in 4 KiB pages"
        );
    }
}

/// `mlock` failed with `source`: the locked-memory limit when the error
/// says so (`ENOMEM`: over a non-zero limit; `EPERM`: a limit of 0),
/// otherwise a plain mapping error.
fn lock_error(bytes: usize, page: PageSize, source: io::Error) -> RegionError {
    let page_kib = page.bytes() / 1024;
    match source.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::EPERM) => RegionError::LockedMemoryLimit {
            bytes,
            page_kib,
            limit_bytes: crate::sys::memlock_limit(),
            locked_bytes: meminfo::locked_bytes(),
            source,
        },
        _ => RegionError::Map {
            bytes,
            page_kib,
            source,
        },
    }
}

fn limit_text(limit: Option<u64>) -> String {
    match limit {
        Some(b) => format!("{} KiB", b / 1024),
        None => "unlimited or unknown".into(),
    }
}

fn locked_text(locked: Option<u64>) -> String {
    locked.map_or(String::new(), |b| {
        format!(", {} KiB of it already locked by this process", b / 1024)
    })
}

/// `MAP_HUGETLB` reports an empty pool as ENOMEM (reservation failed), and on
/// some kernels as EINVAL when no pool of that size exists at all.
fn is_out_of_hugepages(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EINVAL))
}

fn unavailable(bytes: usize, page: PageSize, needed: u64, info: &HugepageInfo) -> RegionError {
    let command = if page == PageSize::Huge1G {
        format!(
            "echo {needed} | sudo tee /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
        )
    } else {
        meminfo::reserve_command(info, needed)
    };
    RegionError::HugepagesUnavailable {
        bytes,
        page_kib: page.bytes() / 1024,
        needed,
        available: if page == PageSize::Huge1G {
            0
        } else {
            info.available()
        },
        total: info.total,
        free: info.free,
        reserved: info.reserved,
        command,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_message_names_counts_and_command() {
        let info = HugepageInfo {
            total: 10,
            free: 3,
            reserved: 1,
            page_size_bytes: HUGE_2M as u64,
        };
        let err = unavailable(16 * HUGE_2M, PageSize::Huge2M, 16, &info);
        let msg = err.to_string();
        assert!(msg.contains("16 pages needed"), "{msg}");
        assert!(msg.contains("2 available"), "{msg}");
        assert!(
            msg.contains("echo 24 | sudo tee /proc/sys/vm/nr_hugepages"),
            "{msg}"
        );
    }

    #[test]
    fn an_mlock_refusal_names_the_locked_memory_limit_not_hugepages() {
        for errno in [libc::ENOMEM, libc::EPERM] {
            let e = lock_error(
                4 * HUGE_2M,
                PageSize::Huge2M,
                io::Error::from_raw_os_error(errno),
            );
            assert!(matches!(e, RegionError::LockedMemoryLimit { .. }), "{e:?}");
            let msg = e.to_string();
            for want in [
                "locked-memory limit",
                "RLIMIT_MEMLOCK",
                "ulimit -l",
                "/etc/security/limits.conf",
                "CAP_IPC_LOCK",
                "not a shortage of hugepages",
            ] {
                assert!(msg.contains(want), "{want:?} missing from {msg}");
            }
            assert!(!msg.contains("nr_hugepages"), "{msg}");
        }
        assert_eq!(limit_text(Some(8 << 20)), "8192 KiB");
        assert_eq!(limit_text(None), "unlimited or unknown");
        // Another mlock error is no limit.
        let e = lock_error(
            HUGE_2M,
            PageSize::Huge2M,
            io::Error::from_raw_os_error(libc::EAGAIN),
        );
        assert!(matches!(e, RegionError::Map { .. }), "{e:?}");
    }

    /// Counts the events at each level.
    #[derive(Default)]
    struct Levels(std::sync::Mutex<Vec<tracing::Level>>);

    impl tracing::Subscriber for Levels {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, e: &tracing::Event<'_>) {
            self.0.lock().unwrap().push(*e.metadata().level());
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn the_fallback_note_is_a_warning_once_per_process() {
        let levels = std::sync::Arc::new(Levels::default());
        let noted = AtomicBool::new(false);
        tracing::subscriber::with_default(levels.clone(), || {
            for _ in 0..44 {
                note_fallback(&noted, HUGE_2M, 1, 0);
            }
        });
        let l = levels.0.lock().unwrap();
        assert_eq!(l.len(), 44);
        assert_eq!(
            l.iter().filter(|&&x| x == tracing::Level::WARN).count(),
            1,
            "{l:?}"
        );
        assert_eq!(l[0], tracing::Level::WARN);
    }

    #[test]
    fn rejects_bad_sizes() {
        for bytes in [0, 4096, HUGE_2M + 4096] {
            let err = HugepageRegion::reserve(bytes, RegionOptions::default()).unwrap_err();
            assert!(matches!(err, RegionError::BadSize { .. }), "{err}");
        }
    }
}

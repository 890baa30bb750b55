//! The only place in this crate that talks to the kernel about memory:
//! anonymous mappings backed by hugepages (or, when asked, ordinary pages),
//! populated and locked so that the physical pages stay put while a device
//! holds their IOVA.

use std::io;
use std::ptr::NonNull;

/// 2 MiB, the hugepage size this crate reserves in.
pub const HUGE_2M: usize = 2 << 20;
/// 1 GiB, the optional large hugepage size.
pub const HUGE_1G: usize = 1 << 30;

/// Backing page size of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// Ordinary 4 KiB pages (the explicit fallback).
    Small4K,
    /// 2 MiB hugepages.
    Huge2M,
    /// 1 GiB hugepages.
    Huge1G,
}

impl PageSize {
    /// Page size in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            PageSize::Small4K => 4096,
            PageSize::Huge2M => HUGE_2M,
            PageSize::Huge1G => HUGE_1G,
        }
    }
}

/// Why [`Mapping::new`] failed: the mapping itself (`mmap`: for hugepages,
/// an empty pool), or locking it (`mlock`: the locked-memory limit).
#[derive(Debug)]
pub(crate) enum MapFailure {
    /// `mmap` failed.
    Map(io::Error),
    /// `mlock` failed (the mapping was released).
    Lock(io::Error),
}

/// The soft locked-memory limit (`RLIMIT_MEMLOCK`) in bytes; `None` when
/// unlimited or unreadable.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid, exclusive
    // pointer to a local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// An owned, populated, locked anonymous mapping. Unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The whole mapping, which may be larger than `len` when it was
    /// over-reserved to reach an alignment.
    raw_ptr: NonNull<u8>,
    raw_len: usize,
}

// SAFETY: a `Mapping` exclusively owns its pages; moving the owner between
// threads moves nothing but the pointer.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes (a multiple of the page size) backed by `page`,
    /// aligned to `align` (a power of two, at most the size of the mapping's
    /// pages or 2 MiB), prefaulted and locked.
    pub(crate) fn new(len: usize, page: PageSize, align: usize) -> Result<Mapping, MapFailure> {
        debug_assert!(len > 0 && len.is_multiple_of(page.bytes()));
        debug_assert!(align.is_power_of_two());
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        // Hugepage mappings are naturally aligned to their page size; small
        // pages need slack to cut an aligned window out of.
        let slack = if align > page.bytes() { align } else { 0 };
        match page {
            PageSize::Small4K => {}
            PageSize::Huge2M => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageSize::Huge1G => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        }
        let raw_len = len + slack;
        // SAFETY: an anonymous mapping with a null hint aliases no existing
        // Rust object; the result is checked for MAP_FAILED before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MapFailure::Map(io::Error::last_os_error()));
        }
        let raw_ptr =
            NonNull::new(raw.cast::<u8>()).expect("mmap returned null without MAP_FAILED");
        let offset = raw_ptr.as_ptr().align_offset(align);
        // SAFETY: `offset < align <= slack` when slack is non-zero, and 0
        // otherwise, so the window stays inside the mapping.
        let ptr = unsafe { NonNull::new_unchecked(raw_ptr.as_ptr().add(offset)) };
        let mapping = Mapping {
            ptr,
            len,
            raw_ptr,
            raw_len,
        };
        // SAFETY: the range lies inside the mapping we just created.
        if unsafe { libc::mlock(ptr.as_ptr().cast(), len) } != 0 {
            // `mapping` is dropped here: unmapped.
            return Err(MapFailure::Lock(io::Error::last_os_error()));
        }
        Ok(mapping)
    }

    /// A placeholder that owns nothing (used to leak a mapping on purpose).
    pub(crate) fn empty() -> Mapping {
        Mapping {
            ptr: NonNull::dangling(),
            len: 0,
            raw_ptr: NonNull::dangling(),
            raw_len: 0,
        }
    }

    /// Start of the usable window.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the usable window.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.raw_len == 0 {
            return;
        }
        // SAFETY: this object created the mapping and nothing borrows it any
        // more (regions hand out raw buffers only while they are alive and
        // leak themselves if buffers are still out, see `Allocator::drop`).
        let rc = unsafe { libc::munmap(self.raw_ptr.as_ptr().cast(), self.raw_len) };
        if rc != 0 {
            tracing::error!(
                addr = ?self.raw_ptr,
                len = self.raw_len,
                err = %io::Error::last_os_error(),
                "munmap of a DMA region failed"
            );
        }
    }
}

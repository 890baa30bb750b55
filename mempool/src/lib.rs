//! Hugepage DMA memory for the eRPC stack (the role of eRPC's `HugeAlloc`).
//!
//! * [`HugepageRegion`]: a locked, populated range of 2 MiB (or 1 GiB)
//!   hugepages with an O(1) virtual-to-IOVA translation once registered.
//! * [`DmaMapper`]: how a region becomes visible to a device. The VFIO
//!   container and the device model implement it; [`IdentityMapper`] is for
//!   unit tests.
//! * [`Allocator`]: the per-thread (`!Send`) buffer allocator with
//!   power-of-two size classes, used for message buffers, packet buffers and
//!   rings. Each [`Buffer`] carries its virtual address, IOVA, lkey and class.
//!
//! Missing hugepages are an error that names the shortfall and the command
//! that fixes it; 4 KiB pages are used only when the caller opts in with
//! [`Fallback::SmallPages`], and then show up in [`AllocStats`].
//!
//! Unsafe code lives in `sys` (mmap/mlock/munmap) and `buffer` (slices over
//! owned blocks), plus pointer offsets in the allocator's split and carve
//! steps.

mod alloc;
mod buffer;
mod dma;
pub mod meminfo;
mod region;
mod sys;

pub use alloc::{
    AllocError, AllocStats, Allocator, AllocatorConfig, ClassStats, MAX_ALLOC, MAX_CLASS_SHIFT,
    MIN_CLASS_SHIFT, NUM_CLASSES, class_for, class_size,
};
pub use buffer::Buffer;
pub use dma::{DmaError, DmaMapper, DmaMapping, IdentityMapper};
pub use region::{Fallback, HugepageRegion, RegionError, RegionOptions};
pub use sys::{HUGE_1G, HUGE_2M, PageSize};

/// True if at least `pages` 2 MiB hugepages can be reserved right now.
pub fn hugepages_available(pages: u64) -> bool {
    meminfo::HugepageInfo::read()
        .is_some_and(|i| i.page_size_bytes == HUGE_2M as u64 && i.available() >= pages)
}

/// The allocator is bound to its thread:
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<mempool::Allocator>();
/// ```
#[doc(hidden)]
pub fn _allocator_is_not_send() {}

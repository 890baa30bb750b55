//! The per-thread buffer allocator (the role of eRPC's `HugeAlloc`).
//!
//! Power-of-two size classes from 64 bytes to 16 MiB, each with a free list.
//! An empty class is refilled by splitting a larger free block in halves;
//! when no larger block is free either, a new hugepage region is reserved
//! (twice as large as the previous one), registered for DMA and carved into
//! blocks. Blocks are never merged back: like eRPC, the workload recycles the
//! same sizes.
//!
//! Fast path (`alloc` with a non-empty class, `free`): a `Vec` pop or push
//! and a few counter updates. No lock, no syscall; a free list grows (an
//! amortised heap allocation) only when more blocks of its class are free
//! at once than ever before, so a steady state allocates nothing, and
//! blocks that stay in use cost no free-list room.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::buffer::{Buffer, DEDICATED_CLASS};
use crate::dma::DmaMapper;
use crate::region::{HugepageRegion, RegionError, RegionOptions};
use crate::sys::HUGE_2M;

/// log2 of the smallest class (64 B: a cache line, the smallest packet buffer).
pub const MIN_CLASS_SHIFT: u32 = 6;
/// log2 of the largest class (16 MiB: an 8 MiB message plus the headers of
/// all its packets after the data).
pub const MAX_CLASS_SHIFT: u32 = 24;
/// Number of size classes.
pub const NUM_CLASSES: usize = (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1) as usize;
/// Largest size `alloc` serves.
pub const MAX_ALLOC: usize = 1 << MAX_CLASS_SHIFT;
/// Largest region reserved in one growth step.
const MAX_GROWTH_BYTES: usize = 1 << 30;

const _: () = assert!(
    MAX_ALLOC >= 8 << 20,
    "eRPC messages up to 8 MiB must fit one class"
);
const _: () = assert!(NUM_CLASSES < DEDICATED_CLASS as usize);

/// Size class index of a request, or `None` if it is larger than [`MAX_ALLOC`].
#[inline]
pub const fn class_for(size: usize) -> Option<usize> {
    if size > MAX_ALLOC {
        return None;
    }
    let size = if size < (1 << MIN_CLASS_SHIFT) {
        1 << MIN_CLASS_SHIFT
    } else {
        size
    };
    Some((usize::BITS - (size - 1).leading_zeros() - MIN_CLASS_SHIFT) as usize)
}

/// Bytes in class `class`.
#[inline]
pub const fn class_size(class: usize) -> usize {
    1 << (class as u32 + MIN_CLASS_SHIFT)
}

/// Allocator settings.
#[derive(Debug, Clone, Copy)]
pub struct AllocatorConfig {
    /// Size of the first region (rounded up to the page size). Default 8 MiB.
    pub initial_bytes: usize,
    /// Never reserve more than this in total. Default: no limit other than
    /// what the hugepage pool holds.
    pub max_bytes: usize,
    /// Page size and fallback policy for every region.
    pub region: RegionOptions,
    /// Test and debug aid: when set, [`Allocator::free`] fills every freed
    /// block with this byte (the whole class size), so that whatever still
    /// reads it (a NIC that was not drained, a dangling copy) sees the
    /// pattern instead of the old bytes. `None` (the default) costs one
    /// branch per free. The simulated transports' deferred-DMA mode uses it
    /// to show a buffer given back while a send still referred to it.
    pub poison_on_free: Option<u8>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            initial_bytes: 8 << 20,
            max_bytes: usize::MAX,
            region: RegionOptions::default(),
            poison_on_free: None,
        }
    }
}

/// Allocation failed.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// Larger than the largest size class.
    #[error("allocation of {size} bytes exceeds the largest size class ({MAX_ALLOC} bytes)")]
    TooLarge {
        /// Requested bytes.
        size: usize,
    },
    /// Growing would exceed the configured limit.
    #[error(
        "allocator exhausted: {size} bytes requested, {reserved} of {limit} bytes already reserved \
         ({in_use} in use); raise AllocatorConfig::max_bytes or free buffers"
    )]
    Exhausted {
        /// Requested bytes (rounded to the class).
        size: usize,
        /// Bytes reserved so far.
        reserved: usize,
        /// The configured limit.
        limit: usize,
        /// Bytes handed out right now.
        in_use: usize,
    },
    /// Reserving or registering a new region failed (e.g. no hugepages).
    #[error(transparent)]
    Region(#[from] RegionError),
}

/// Counters for one size class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Block size in bytes.
    pub size: usize,
    /// Blocks handed out.
    pub in_use: u64,
    /// Blocks on the free list.
    pub free: u64,
}

/// A snapshot of the allocator's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes reserved from the OS, all regions.
    pub reserved_bytes: usize,
    /// Regions reserved.
    pub regions: usize,
    /// Regions that fell back to 4 KiB pages (only with `Fallback::SmallPages`).
    pub fallback_regions: usize,
    /// Bytes handed out (class sizes, plus dedicated rings).
    pub in_use_bytes: usize,
    /// Largest `in_use_bytes` seen.
    pub high_water_bytes: usize,
    /// Bytes in rings that got a region of their own.
    pub dedicated_ring_bytes: usize,
    /// Per size class.
    pub classes: [ClassStats; NUM_CLASSES],
}

static NEXT_OWNER: AtomicU16 = AtomicU16::new(1);

/// A per-thread allocator of DMA-registered buffers. `!Send` and `!Sync` by
/// construction: one `Rpc` (one thread) owns it.
#[derive(Debug)]
pub struct Allocator {
    free: [Vec<Buffer>; NUM_CLASSES],
    in_use: [u64; NUM_CLASSES],
    in_use_bytes: usize,
    high_water_bytes: usize,
    regions: Vec<HugepageRegion>,
    dedicated: Vec<HugepageRegion>,
    reserved_bytes: usize,
    next_region_bytes: usize,
    mapper: Arc<dyn DmaMapper>,
    config: AllocatorConfig,
    owner: u16,
    _not_send: PhantomData<*mut ()>,
}

impl Allocator {
    /// Creates an allocator and reserves its first region.
    pub fn new(
        mapper: Arc<dyn DmaMapper>,
        config: AllocatorConfig,
    ) -> Result<Allocator, AllocError> {
        let mut a = Allocator {
            free: std::array::from_fn(|_| Vec::new()),
            in_use: [0; NUM_CLASSES],
            in_use_bytes: 0,
            high_water_bytes: 0,
            regions: Vec::new(),
            dedicated: Vec::new(),
            reserved_bytes: 0,
            next_region_bytes: config.initial_bytes.max(HUGE_2M),
            mapper,
            config,
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            _not_send: PhantomData,
        };
        let first = a.next_region_bytes;
        a.grow(first)?;
        Ok(a)
    }

    /// Allocates at least `size` bytes (`size` may be 0). The block is
    /// aligned to its class size, up to 2 MiB.
    #[inline]
    pub fn alloc(&mut self, size: usize) -> Result<Buffer, AllocError> {
        let Some(class) = class_for(size) else {
            return Err(AllocError::TooLarge { size });
        };
        match self.free[class].pop() {
            Some(buf) => {
                self.note_alloc(class);
                Ok(buf)
            }
            None => self.alloc_slow(class),
        }
    }

    /// Returns a buffer to its free list.
    ///
    /// # Panics
    /// If the buffer came from another allocator.
    #[inline]
    pub fn free(&mut self, mut buf: Buffer) {
        buf.tag = 0;
        assert_eq!(
            buf.owner, self.owner,
            "buffer freed into an allocator that did not allocate it"
        );
        if buf.class == DEDICATED_CLASS {
            return self.free_dedicated(buf);
        }
        let class = buf.class as usize;
        self.in_use[class] -= 1;
        self.in_use_bytes -= class_size(class);
        if let Some(byte) = self.config.poison_on_free {
            poison(&mut buf, byte);
        }
        // Grows (amortised) only when more blocks of the class are free at
        // once than ever before: in a steady state, never.
        self.free[class].push(buf);
    }

    /// Allocates a physically contiguous (in IOVA space) ring of `bytes`,
    /// e.g. the 4 MiB striding RX ring. Rings up to the largest class come
    /// from the size classes; larger ones get a region of their own, which is
    /// released when the ring is freed with [`Allocator::free`].
    pub fn alloc_ring(&mut self, bytes: usize) -> Result<Buffer, AllocError> {
        if bytes <= MAX_ALLOC {
            return self.alloc(bytes.max(4096));
        }
        let page = self.config.region.page_size.bytes().max(HUGE_2M);
        let len = bytes.div_ceil(page) * page;
        self.check_limit(len)?;
        let mut region = HugepageRegion::reserve(len, self.config.region)?;
        let dma = region.register(self.mapper.clone())?;
        self.reserved_bytes += len;
        let buf = Buffer {
            ptr: region.ptr(),
            iova: dma.iova,
            lkey: dma.lkey,
            class: DEDICATED_CLASS,
            owner: self.owner,
            len: u32::try_from(len).map_err(|_| AllocError::TooLarge { size: bytes })?,
            tag: 0,
        };
        self.dedicated.push(region);
        self.in_use_bytes += len;
        self.high_water_bytes = self.high_water_bytes.max(self.in_use_bytes);
        Ok(buf)
    }

    /// IOVA of any address inside this allocator's regions (slow path: scans
    /// the few regions; each translation itself is O(1)).
    pub fn iova_of(&self, addr: usize) -> Option<u64> {
        self.regions
            .iter()
            .chain(&self.dedicated)
            .find_map(|r| r.iova_of(addr))
    }

    /// The mapper every region is registered with.
    pub fn mapper(&self) -> &Arc<dyn DmaMapper> {
        &self.mapper
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            reserved_bytes: self.reserved_bytes,
            regions: self.regions.len() + self.dedicated.len(),
            fallback_regions: self
                .regions
                .iter()
                .chain(&self.dedicated)
                .filter(|r| r.is_fallback())
                .count(),
            in_use_bytes: self.in_use_bytes,
            high_water_bytes: self.high_water_bytes,
            dedicated_ring_bytes: self.dedicated.iter().map(|r| r.len()).sum(),
            classes: std::array::from_fn(|c| ClassStats {
                size: class_size(c),
                in_use: self.in_use[c],
                free: self.free[c].len() as u64,
            }),
        }
    }

    #[inline]
    fn note_alloc(&mut self, class: usize) {
        self.in_use[class] += 1;
        self.in_use_bytes += class_size(class);
        if self.in_use_bytes > self.high_water_bytes {
            self.high_water_bytes = self.in_use_bytes;
        }
    }

    #[cold]
    fn alloc_slow(&mut self, class: usize) -> Result<Buffer, AllocError> {
        if let Some(larger) = (class + 1..NUM_CLASSES).find(|&c| !self.free[c].is_empty()) {
            self.split_down(larger, class);
        } else {
            let want = self.next_region_bytes.max(class_size(class));
            self.grow(want)?;
            self.next_region_bytes = (self.next_region_bytes * 2).min(MAX_GROWTH_BYTES);
            if self.free[class].is_empty() {
                let larger = (class + 1..NUM_CLASSES)
                    .find(|&c| !self.free[c].is_empty())
                    .expect("a fresh region holds a block at least as large as the request");
                self.split_down(larger, class);
            }
        }
        let buf = self.free[class].pop().expect("refilled above");
        self.note_alloc(class);
        Ok(buf)
    }

    /// Splits one free block of class `from` into halves until class `to`
    /// has a free block.
    fn split_down(&mut self, from: usize, to: usize) {
        let mut block = self.free[from].pop().expect("caller checked");
        for class in (to..from).rev() {
            let half = class_size(class);
            // SAFETY: `block` spans `2 * half` bytes of one region, so its
            // second half starts inside the same allocation.
            let upper_ptr = unsafe { block.ptr.add(half) };
            let upper = Buffer {
                ptr: upper_ptr,
                iova: block.iova + half as u64,
                lkey: block.lkey,
                class: class as u8,
                owner: self.owner,
                len: half as u32,
                tag: 0,
            };
            block.class = class as u8;
            block.len = half as u32;
            self.push_new(upper);
            if class == to {
                self.push_new(block);
                return;
            }
        }
        unreachable!("from > to");
    }

    /// Adds a newly created block to its free list. The lists keep room
    /// for the most blocks ever free at once, not for every block made:
    /// blocks that stay in use (a server session's preallocated responses,
    /// thousands of them at scale) cost no heap here.
    fn push_new(&mut self, buf: Buffer) {
        self.free[buf.class as usize].push(buf);
    }

    fn check_limit(&self, bytes: usize) -> Result<(), AllocError> {
        if self.reserved_bytes.saturating_add(bytes) > self.config.max_bytes {
            return Err(AllocError::Exhausted {
                size: bytes,
                reserved: self.reserved_bytes,
                limit: self.config.max_bytes,
                in_use: self.in_use_bytes,
            });
        }
        Ok(())
    }

    /// Reserves, registers and carves a region of at least `bytes`.
    fn grow(&mut self, bytes: usize) -> Result<(), AllocError> {
        let page = self.config.region.page_size.bytes().max(HUGE_2M);
        let mut len = bytes.div_ceil(page) * page;
        // Stay under the limit if a smaller region still serves the request.
        let room = self.config.max_bytes.saturating_sub(self.reserved_bytes);
        if len > room {
            let floor = bytes.min(MAX_ALLOC).div_ceil(page) * page;
            len = floor.max(room / page * page);
        }
        self.check_limit(len)?;
        let mut region = HugepageRegion::reserve(len, self.config.region)?;
        let dma = region.register(self.mapper.clone())?;
        // Carve in descending powers of two from offset 0, so every block is
        // aligned to its own size relative to the 2 MiB-aligned region start.
        let mut offset = 0usize;
        while offset < len {
            let remaining = len - offset;
            let shift = (usize::BITS - 1 - remaining.leading_zeros()).min(MAX_CLASS_SHIFT);
            let size = 1usize << shift;
            // SAFETY: `offset + size <= len`, inside the region.
            let ptr = unsafe { region.ptr().add(offset) };
            self.push_new(Buffer {
                ptr,
                iova: dma.iova + offset as u64,
                lkey: dma.lkey,
                class: (shift - MIN_CLASS_SHIFT) as u8,
                owner: self.owner,
                len: size as u32,
                tag: 0,
            });
            offset += size;
        }
        self.reserved_bytes += len;
        self.regions.push(region);
        Ok(())
    }

    #[cold]
    fn free_dedicated(&mut self, buf: Buffer) {
        let idx = self
            .dedicated
            .iter()
            .position(|r| r.va() == buf.va())
            .expect("dedicated ring belongs to this allocator");
        let region = self.dedicated.swap_remove(idx);
        self.in_use_bytes -= region.len();
        self.reserved_bytes -= region.len();
        drop(region);
    }
}

/// Fills a freed block with `byte` (the allocator's poison option).
#[cold]
#[inline(never)]
fn poison(buf: &mut Buffer, byte: u8) {
    buf.as_mut_slice().fill(byte);
}

impl Drop for Allocator {
    fn drop(&mut self) {
        let outstanding: u64 = self.in_use.iter().sum::<u64>() + self.dedicated.len() as u64;
        if outstanding != 0 {
            // Buffers still point into the regions: keep the memory (and its
            // DMA mapping) alive rather than leave dangling handles.
            tracing::error!(
                outstanding,
                bytes = self.in_use_bytes,
                "allocator dropped with buffers outstanding; leaking its regions to keep them valid"
            );
            std::mem::forget(std::mem::take(&mut self.regions));
            std::mem::forget(std::mem::take(&mut self.dedicated));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fallback, IdentityMapper};

    fn small(poison_on_free: Option<u8>) -> Allocator {
        Allocator::new(
            Arc::new(IdentityMapper::new()),
            AllocatorConfig {
                initial_bytes: 2 << 20,
                region: RegionOptions {
                    fallback: Fallback::SmallPages,
                    ..RegionOptions::default()
                },
                poison_on_free,
                ..AllocatorConfig::default()
            },
        )
        .expect("allocator")
    }

    #[test]
    fn freed_blocks_are_poisoned_only_when_asked() {
        for poison in [None, Some(0xa5)] {
            let mut a = small(poison);
            let mut b = a.alloc(100).unwrap();
            b.as_mut_slice().fill(7);
            let p = b.as_ptr();
            let cap = b.capacity();
            a.free(b);
            // The same block comes back (a LIFO free list).
            let b = a.alloc(100).unwrap();
            assert_eq!(b.as_ptr(), p);
            assert_eq!(b.capacity(), cap);
            let want = poison.unwrap_or(7);
            assert!(
                b.as_slice().iter().all(|&x| x == want),
                "poison {poison:?}: {:?}",
                &b.as_slice()[..8]
            );
            a.free(b);
        }
    }

    #[test]
    fn class_boundaries() {
        assert_eq!(class_for(0), Some(0));
        assert_eq!(class_for(1), Some(0));
        assert_eq!(class_for(64), Some(0));
        assert_eq!(class_for(65), Some(1));
        assert_eq!(class_for(1024), Some(4));
        assert_eq!(class_for(MAX_ALLOC), Some(NUM_CLASSES - 1));
        assert_eq!(class_for(MAX_ALLOC + 1), None);
        for c in 0..NUM_CLASSES {
            assert_eq!(class_for(class_size(c)), Some(c));
            assert_eq!(class_for(class_size(c) + 1).unwrap_or(NUM_CLASSES), c + 1);
        }
    }
}

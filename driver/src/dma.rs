//! Device-owned DMA memory: command queue, mailboxes, EQ/CQ/SQ/RQ rings,
//! doorbell records, receive buffers and the pages handed to firmware.
//!
//! [`DmaPool`] carves 4 KiB pages out of hugepage regions registered with
//! the backend's IOMMU (first fit over a bitmap; slow path only, behind a
//! mutex). [`DmaMem`] is one contiguous allocation, returned on drop.
//!
//! This is the only module of the driver that dereferences pointers into
//! memory the device also reads and writes. Rules it follows:
//! * no `&`/`&mut` is ever formed over device-visible memory; every access
//!   is a volatile access (through the `volatile` crate's `VolatilePtr`) or
//!   an atomic one, of a plain integer at a checked offset;
//! * ownership bytes the device writes last (CQE `op_own`, EQE `owner`,
//!   command `status_own`) and the overrun CQ's `wqe_id`/`wqe_counter` are
//!   read with atomic loads, and the caller then issues
//!   [`crate::barrier::from_device`] before reading the rest of the entry;
//! * bulk copies (`read_bytes`/`write_bytes`) are used only while the
//!   device does not own the range (a command it has completed, a WQE slot
//!   it has not been told about).

use std::ptr::NonNull;

use std::sync::atomic::{AtomicU8, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use volatile::VolatilePtr;

use mempool::{DmaMapper, HUGE_2M, HugepageRegion, RegionOptions};

use crate::error::Error;

/// Bytes in an adapter page.
pub const PAGE: usize = 4096;

struct PoolRegion {
    region: HugepageRegion,
    iova: u64,
    /// One bit per 4 KiB page, set = in use.
    used: Vec<u64>,
    pages: usize,
    in_use: usize,
}

impl PoolRegion {
    fn find_run(&self, n: usize) -> Option<usize> {
        let mut run = 0;
        for p in 0..self.pages {
            if self.used[p / 64] & (1 << (p % 64)) == 0 {
                run += 1;
                if run == n {
                    return Some(p + 1 - n);
                }
            } else {
                run = 0;
            }
        }
        None
    }

    fn mark(&mut self, first: usize, n: usize, used: bool) {
        for p in first..first + n {
            let bit = 1u64 << (p % 64);
            debug_assert_eq!(
                self.used[p / 64] & bit != 0,
                !used,
                "page {p} double {}",
                if used { "alloc" } else { "free" }
            );
            if used {
                self.used[p / 64] |= bit;
            } else {
                self.used[p / 64] &= !bit;
            }
        }
        if used {
            self.in_use += n;
        } else {
            self.in_use -= n;
        }
    }
}

struct PoolInner {
    regions: Vec<Option<PoolRegion>>,
}

impl PoolInner {
    fn release_unused(&mut self) -> usize {
        let mut released = 0;
        for r in self.regions.iter_mut() {
            if r.as_ref().is_some_and(|r| r.in_use == 0) {
                *r = None;
                released += 1;
            }
        }
        released
    }
}

/// A pool of registered 4 KiB pages for device-owned memory.
pub struct DmaPool {
    inner: Mutex<PoolInner>,
    mapper: Arc<dyn DmaMapper>,
    opts: RegionOptions,
}

impl std::fmt::Debug for DmaPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.stats();
        write!(
            f,
            "DmaPool({} regions, {} of {} pages in use)",
            s.regions, s.pages_in_use, s.pages_total
        )
    }
}

/// Pool counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Regions reserved.
    pub regions: usize,
    /// Pages across all regions.
    pub pages_total: usize,
    /// Pages handed out.
    pub pages_in_use: usize,
}

impl DmaPool {
    /// An empty pool that registers its regions with `mapper`.
    pub fn new(mapper: Arc<dyn DmaMapper>, opts: RegionOptions) -> Arc<DmaPool> {
        Arc::new(DmaPool {
            inner: Mutex::new(PoolInner {
                regions: Vec::new(),
            }),
            mapper,
            opts,
        })
    }

    /// Allocates `bytes` (rounded up to whole pages) of zeroed, page-aligned,
    /// IOVA-contiguous memory.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DmaMem, Error> {
        let n = bytes.max(1).div_ceil(PAGE);
        let mut inner = self.inner.lock().expect("DMA pool poisoned");
        let found = inner
            .regions
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().and_then(|r| r.find_run(n)).map(|p| (i, p)));
        let (ri, first) = match found {
            Some(x) => x,
            None => {
                let len = (n * PAGE).div_ceil(HUGE_2M) * HUGE_2M;
                let reserve = |opts| -> Result<_, mempool::RegionError> {
                    let mut region = HugepageRegion::reserve(len, opts)?;
                    let dma = region.register(self.mapper.clone())?;
                    Ok((region, dma))
                };
                let (region, dma) = match reserve(self.opts) {
                    Ok(x) => x,
                    // Empty 2 MiB regions kept for reuse still hold
                    // hugepages and IOMMU mappings (and count against the
                    // locked-memory limit): give them back and try again.
                    Err(e) => {
                        if inner.release_unused() == 0 {
                            return Err(Error::Memory(e));
                        }
                        reserve(self.opts).map_err(Error::Memory)?
                    }
                };
                let pages = len / PAGE;
                let r = PoolRegion {
                    iova: dma.iova,
                    used: vec![0; pages.div_ceil(64)],
                    pages,
                    in_use: 0,
                    region,
                };
                let slot = match inner.regions.iter().position(Option::is_none) {
                    Some(i) => {
                        inner.regions[i] = Some(r);
                        i
                    }
                    None => {
                        inner.regions.push(Some(r));
                        inner.regions.len() - 1
                    }
                };
                (slot, 0)
            }
        };
        let r = inner.regions[ri].as_mut().expect("region present");
        r.mark(first, n, true);
        let offset = first * PAGE;
        // SAFETY: `first + n <= pages`, so the range lies inside the region.
        let ptr = unsafe { r.region.ptr().add(offset) };
        let mem = DmaMem {
            ptr,
            iova: r.iova + offset as u64,
            len: n * PAGE,
            pool: Some((self.clone(), ri, first)),
        };
        drop(inner);
        mem.zero();
        Ok(mem)
    }

    fn free(&self, ri: usize, first: usize, len: usize) {
        let mut inner = self.inner.lock().expect("DMA pool poisoned");
        let r = inner.regions[ri]
            .as_mut()
            .expect("region of a live allocation");
        r.mark(first, len / PAGE, false);
        // Give dedicated large regions back as soon as they are empty; keep
        // ordinary 2 MiB ones for reuse.
        if r.in_use == 0 && r.pages * PAGE > HUGE_2M {
            inner.regions[ri] = None;
        }
    }

    /// Gives back every region none of whose pages is in use (their
    /// hugepages and IOMMU mappings, which count against the locked-memory
    /// limit); returns how many.
    pub fn release_unused(&self) -> usize {
        self.inner
            .lock()
            .expect("DMA pool poisoned")
            .release_unused()
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        let inner = self.inner.lock().expect("DMA pool poisoned");
        let mut s = PoolStats::default();
        for r in inner.regions.iter().flatten() {
            s.regions += 1;
            s.pages_total += r.pages;
            s.pages_in_use += r.in_use;
        }
        s
    }
}

/// One contiguous allocation of device-visible memory.
pub struct DmaMem {
    ptr: NonNull<u8>,
    iova: u64,
    len: usize,
    pool: Option<(Arc<DmaPool>, usize, usize)>,
}

impl std::fmt::Debug for DmaMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DmaMem(iova {:#x}, {} bytes)", self.iova, self.len)
    }
}

// SAFETY: a DmaMem owns its pages exclusively (the pool hands each page to
// one allocation); all accesses are volatile/atomic through `&self` methods,
// so sharing a handle across threads cannot create Rust-level data races on
// non-atomic places beyond what the device itself does to the memory.
unsafe impl Send for DmaMem {}
// SAFETY: as above.
unsafe impl Sync for DmaMem {}

impl Drop for DmaMem {
    fn drop(&mut self) {
        if let Some((pool, ri, first)) = self.pool.take() {
            pool.free(ri, first, self.len);
        }
    }
}

impl DmaMem {
    /// Device address of byte 0.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Device address of byte `off`.
    #[inline]
    pub fn iova_at(&self, off: usize) -> u64 {
        debug_assert!(off <= self.len);
        self.iova + off as u64
    }

    /// Bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// CPU address of byte `off`, for handing out zero-copy views.
    #[inline]
    pub fn va_at(&self, off: usize) -> *const u8 {
        assert!(off <= self.len);
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.as_ptr().add(off) }
    }

    #[inline(always)]
    fn at(&self, off: usize, width: usize) -> *mut u8 {
        if off + width > self.len {
            out_of_bounds(off, width, self.len);
        }
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.as_ptr().add(off) }
    }

    /// Zeroes the whole allocation.
    pub fn zero(&self) {
        for off in (0..self.len).step_by(8) {
            self.write_u64_raw(off, 0);
        }
    }

    /// A volatile pointer to the `T` at `off` (in bounds, aligned).
    #[inline(always)]
    fn vol<T: Copy>(&self, off: usize) -> VolatilePtr<'_, T> {
        debug_assert!(off.is_multiple_of(align_of::<T>()));
        let p = self.at(off, size_of::<T>()).cast::<T>();
        // SAFETY: `at` checked the bounds and derives `p` from the
        // allocation's non-null base; the allocation is page aligned and
        // `off` a multiple of T's alignment (callers use natural offsets).
        // The memory is only ever accessed volatilely or atomically, one
        // access per pointer, and no reference into it exists.
        unsafe { VolatilePtr::new(NonNull::new_unchecked(p)) }
    }

    /// Reads a byte.
    #[inline]
    pub fn read_u8(&self, off: usize) -> u8 {
        self.vol::<u8>(off).read()
    }

    /// Writes a byte.
    #[inline]
    pub fn write_u8(&self, off: usize, v: u8) {
        self.vol::<u8>(off).write(v)
    }

    /// Reads a big-endian u32 (4-byte aligned).
    #[inline]
    pub fn read_be32(&self, off: usize) -> u32 {
        u32::from_be(self.vol::<u32>(off).read())
    }

    /// Writes a big-endian u32 (4-byte aligned).
    #[inline]
    pub fn write_be32(&self, off: usize, v: u32) {
        self.vol::<u32>(off).write(v.to_be())
    }

    /// Writes a big-endian u64 (8-byte aligned).
    #[inline]
    pub fn write_be64(&self, off: usize, v: u64) {
        self.write_u64_raw(off, v.to_be());
    }

    /// Reads a big-endian u64 (8-byte aligned).
    #[inline]
    pub fn read_be64(&self, off: usize) -> u64 {
        u64::from_be(self.vol::<u64>(off).read())
    }

    #[inline]
    fn write_u64_raw(&self, off: usize, raw: u64) {
        self.vol::<u64>(off).write(raw)
    }

    /// Atomically loads a byte the device writes last (an ownership byte).
    /// Follow it with [`crate::barrier::from_device`].
    #[inline]
    pub fn load_owner(&self, off: usize) -> u8 {
        let p = self.at(off, 1);
        // SAFETY: in bounds; `AtomicU8` has the alignment of `u8`; the
        // memory is only accessed atomically or volatilely.
        unsafe { AtomicU8::from_ptr(p) }.load(Ordering::Relaxed)
    }

    /// Atomically stores an ownership byte after the rest of an entry.
    #[inline]
    pub fn store_owner(&self, off: usize, v: u8) {
        let p = self.at(off, 1);
        // SAFETY: as in `load_owner`.
        unsafe { AtomicU8::from_ptr(p) }.store(v, Ordering::Release)
    }

    /// Atomically loads a big-endian u16 (2-byte aligned) that the device
    /// may be rewriting (the overrun CQ snapshot).
    #[inline]
    pub fn load_be16(&self, off: usize) -> u16 {
        assert!(off.is_multiple_of(2));
        let p = self.at(off, 2).cast::<u16>();
        // SAFETY: in bounds and 2-byte aligned (checked), accessed only
        // atomically or volatilely.
        u16::from_be(unsafe { AtomicU16::from_ptr(p) }.load(Ordering::Relaxed))
    }

    /// Copies bytes in. Only for ranges the device does not own right now.
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        let p = self.at(off, src.len());
        // SAFETY: in bounds; the device does not access the range (caller's
        // contract, see the module doc); `src` cannot overlap device memory
        // handed out only as raw pointers.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) }
    }

    /// [`DmaMem::write_bytes`] of a fixed size (one bounds check, a copy
    /// the compiler sizes at build time).
    #[inline]
    pub fn write_array<const N: usize>(&self, off: usize, src: &[u8; N]) {
        let p = self.at(off, N);
        // SAFETY: as in `write_bytes`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, N) }
    }

    /// The allocation as a ring of `slots` entries of `WORDS` 64-bit words
    /// each, bounds checked once here: `slots` must be a power of two and
    /// the ring must fit (panics otherwise). Every write through the
    /// returned handle masks its index, so it stays inside without a check
    /// of its own.
    #[inline]
    pub fn ring_slots<const WORDS: usize>(&self, slots: u32) -> RingSlots<'_, WORDS> {
        let bytes = slots as usize * 8 * WORDS;
        if !slots.is_power_of_two() || bytes > self.len {
            out_of_bounds(0, bytes, self.len);
        }
        RingSlots {
            base: self.ptr,
            mask: slots - 1,
            _mem: std::marker::PhantomData,
        }
    }

    /// Copies bytes out. Only for ranges the device has finished writing.
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        let p = self.at(off, dst.len());
        // SAFETY: as in `write_bytes`.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) }
    }

    /// A read-only byte view of a range the device has finished writing and
    /// will not write again until the caller gives it back (an RX ring
    /// slot that has not been reposted).
    ///
    /// # Safety
    /// The caller guarantees the device does not write `off..off+len` while
    /// the returned slice is alive.
    #[inline]
    pub unsafe fn slice(&self, off: usize, len: usize) -> &[u8] {
        let p = self.at(off, len);
        // SAFETY: in bounds; quiescence is the caller's contract.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// A ring of fixed-size slots in a [`DmaMem`] (see [`DmaMem::ring_slots`]).
#[derive(Debug, Clone, Copy)]
pub struct RingSlots<'a, const WORDS: usize> {
    base: NonNull<u8>,
    mask: u32,
    _mem: std::marker::PhantomData<&'a DmaMem>,
}

impl<const WORDS: usize> RingSlots<'_, WORDS> {
    /// Copies `words`, each already in the byte order the device reads,
    /// into slot `idx & (slots - 1)`. Only for slots the device does not
    /// own right now (a WQE slot it has not been told about).
    #[inline(always)]
    pub fn write(&self, idx: u32, words: &[u64; WORDS]) {
        let off = (idx & self.mask) as usize * 8 * WORDS;
        // SAFETY: `off + 8 * WORDS <= slots * 8 * WORDS <= len`, checked
        // by `ring_slots` for the allocation this handle borrows; the
        // allocation is page aligned, so the slot is 8-byte aligned. The
        // device does not access the slot (caller's contract, see the
        // module doc) and `words` is ordinary memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                words.as_ptr().cast::<u8>(),
                self.base.as_ptr().add(off),
                8 * WORDS,
            )
        }
    }
}

/// The panic of an access outside a DMA allocation, out of line so that the
/// checked accessors stay a compare and a branch in the datapath.
#[cold]
#[inline(never)]
#[track_caller]
fn out_of_bounds(off: usize, width: usize, len: usize) -> ! {
    panic!("DMA access at {off:#x}+{width} past {len:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mempool::{Fallback, IdentityMapper};

    fn pool() -> Arc<DmaPool> {
        DmaPool::new(
            Arc::new(IdentityMapper::new()),
            RegionOptions {
                fallback: Fallback::SmallPages,
                ..Default::default()
            },
        )
    }

    #[test]
    fn allocations_are_disjoint_zeroed_and_reused() {
        let p = pool();
        let a = p.alloc(100).unwrap();
        let b = p.alloc(3 * PAGE).unwrap();
        assert_eq!(a.len(), PAGE);
        assert_eq!(b.iova(), a.iova() + PAGE as u64);
        a.write_be32(0, 0xdeadbeef);
        assert_eq!(a.read_be32(0), 0xdeadbeef);
        assert_eq!(a.read_u8(0), 0xde);
        let a_iova = a.iova();
        drop(a);
        let c = p.alloc(PAGE).unwrap();
        assert_eq!(c.iova(), a_iova, "first fit reuses the freed page");
        assert_eq!(c.read_be32(0), 0, "zeroed");
        assert_eq!(p.stats().pages_in_use, 4);
        // A 4 MiB ring gets its own region, released when freed.
        let big = p.alloc(4 << 20).unwrap();
        assert_eq!(p.stats().regions, 2);
        drop(big);
        assert_eq!(p.stats().regions, 1);
        drop((b, c));
        assert_eq!(p.stats().pages_in_use, 0);
    }

    #[test]
    #[should_panic(expected = "past")]
    fn out_of_bounds_access_panics() {
        let p = pool();
        let a = p.alloc(PAGE).unwrap();
        a.read_be32(PAGE);
    }
}

//! The model's IOMMU, and the only unsafe code in the crate.
//!
//! Every byte the device model reads or writes in host memory goes through
//! [`Iommu`]: an IOVA is translated through the table of mappings made by
//! [`SimMapper`] (the model's [`DmaMapper`]), and an access that is not
//! entirely inside mapped IOVA space is a [`DmaFault`], reported and
//! counted, that touches nothing. Accesses are also refused (and counted)
//! while PCI bus mastering is off.
//!
//! IOVAs are assigned from [`IOVA_BASE`] upwards, deliberately unlike the
//! virtual addresses, with an unmapped guard page after every mapping, so a
//! driver that confuses the two, or runs off the end of a buffer, faults.
//!
//! [`HostMem`] is the other side: page-aligned host memory for tests (the
//! "driver" side of the raw-command tests) with accessors that never form a
//! reference to memory the device writes.
//!
//! # Soundness argument
//!
//! * A mapping's memory stays valid from `map` until `unmap`: that is the
//!   contract of [`DmaMapper`] (the region or [`HostMem`] that mapped it
//!   unmaps before releasing the memory).
//! * Every access holds the table's read lock for its whole duration, and
//!   `unmap` takes the write lock, so no access is in flight into memory
//!   whose mapping has gone.
//! * The model never creates references into host memory; it copies with
//!   raw pointers. Memory shared with a concurrently running driver is
//!   handed over by the PRM's ownership protocol (owner bits, doorbell
//!   records), exactly as with a real device; the bytes a driver polls
//!   (`op_own`, EQE `owner`, command `status_own`, the overrun CQ's
//!   `wqe_id`/`wqe_counter`) are written with atomic release stores.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use mempool::{DmaError, DmaMapper, DmaMapping};
use smallvec::SmallVec;

/// First IOVA the model hands out (far from any user-space virtual address).
pub const IOVA_BASE: u64 = 0x1_0000_0000;
/// Unmapped gap left after every mapping.
pub const IOVA_GUARD: u64 = 4096;
/// IOMMU page size.
pub const PAGE: usize = 4096;

/// Why a DMA access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Part of the range is not inside any mapping.
    Unmapped,
    /// PCI bus mastering is disabled.
    BusMasterDisabled,
    /// An atomic access at an address not aligned to its size.
    Misaligned,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::Unmapped => "not mapped",
            FaultKind::BusMasterDisabled => "bus mastering disabled",
            FaultKind::Misaligned => "misaligned atomic access",
        })
    }
}

/// A refused DMA access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DMA {} of {len} bytes at IOVA {iova:#x} refused: {kind}", if *.write { "write" } else { "read" })]
pub struct DmaFault {
    /// First byte of the access.
    pub iova: u64,
    /// Bytes.
    pub len: usize,
    /// True for a device write into host memory.
    pub write: bool,
    /// Why.
    pub kind: FaultKind,
}

/// Why the model's mapper refused a map or unmap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// `va` or `len` is not a non-zero multiple of 4 KiB.
    #[error("VA {va:#x} / length {len:#x} is not a non-zero multiple of 4 KiB")]
    Unaligned {
        /// Virtual address.
        va: usize,
        /// Length.
        len: usize,
    },
    /// The IOVA space is exhausted.
    #[error("no IOVA space left for {len:#x} bytes")]
    Exhausted {
        /// Length.
        len: usize,
    },
    /// Mapping it would exceed the locked-memory limit (what
    /// `VFIO_IOMMU_MAP_DMA` refuses with ENOMEM when RLIMIT_MEMLOCK is
    /// below the DMA memory).
    #[error(
        "mapping {len:#x} more bytes would lock {total:#x} bytes, over the locked-memory limit of {limit:#x} (raise `ulimit -l`)"
    )]
    LockLimit {
        /// Length asked for.
        len: usize,
        /// Bytes mapped with it.
        total: u64,
        /// The limit.
        limit: u64,
    },
    /// Nothing is mapped at that IOVA.
    #[error("nothing is mapped at IOVA {iova:#x}")]
    NotMapped {
        /// IOVA.
        iova: u64,
    },
    /// The mapping at that IOVA has another VA or length.
    #[error("mapping at IOVA {iova:#x} is VA {va:#x} + {len:#x}, not the one given")]
    Mismatch {
        /// IOVA.
        iova: u64,
        /// Recorded VA.
        va: usize,
        /// Recorded length.
        len: usize,
    },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    va: usize,
    len: usize,
}

/// Slots of [`Hints`].
const HINT_SLOTS: usize = 16;

/// Where recent lookups found their mapping: per slot (picked by the
/// address's 4 KiB page), an index into [`Table::entries`]. Only a hint,
/// read and written with relaxed atomics by concurrent lookups under the
/// table's read lock: an entry is taken from it only if it contains the
/// address looked up, and since mappings never overlap that is the entry
/// the search would find. A slot left stale by a map or unmap (or out of
/// range) simply misses and is rewritten.
#[derive(Debug, Default)]
struct Hints([AtomicUsize; HINT_SLOTS]);

impl Hints {
    #[inline]
    fn slot(iova: u64) -> usize {
        // Fibonacci hashing of the page number: neighbouring pages (a
        // ring's, a buffer's) spread over the slots.
        ((iova >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % HINT_SLOTS
    }
}

/// The IOVA table: mappings sorted by IOVA. They never overlap (IOVAs are
/// handed out upwards, each mapping with a guard after it), so the mapping
/// that may hold an address is the last one starting at or below it.
#[derive(Debug, Default)]
struct Table {
    entries: Vec<(u64, Entry)>,
}

impl Table {
    /// The mapping containing `iova`, as (its IOVA, entry), trying the
    /// one `hints` remembers for addresses like it before searching.
    #[inline]
    fn find(&self, hints: &Hints, iova: u64) -> Option<(u64, Entry)> {
        let slot = &hints.0[Hints::slot(iova)];
        if let Some(&(base, e)) = self.entries.get(slot.load(Ordering::Relaxed))
            && base <= iova
            && iova - base < e.len as u64
        {
            return Some((base, e));
        }
        let i = self.entries.partition_point(|&(base, _)| base <= iova);
        let i = i.checked_sub(1)?;
        let (base, e) = self.entries[i];
        if iova - base < e.len as u64 {
            slot.store(i, Ordering::Relaxed);
            Some((base, e))
        } else {
            None
        }
    }

    /// The host address of `iova` if all of `[iova, iova + len)` lies
    /// inside the one mapping that holds `iova` (`len` > 0), else `None`
    /// (unmapped, or spread over several mappings).
    #[inline]
    fn within(&self, hints: &Hints, iova: u64, len: usize) -> Option<usize> {
        if len == 0 {
            return None;
        }
        let (base, e) = self.find(hints, iova)?;
        let off = iova - base;
        (off + len as u64 <= e.len as u64).then(|| e.va + off as usize)
    }

    /// Index of the mapping that starts exactly at `iova`.
    fn position(&self, iova: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&iova, |&(b, _)| b).ok()
    }

    fn insert(&mut self, iova: u64, e: Entry) {
        let i = self.entries.partition_point(|&(b, _)| b < iova);
        self.entries.insert(i, (iova, e));
    }

    fn iter(&self) -> impl Iterator<Item = &(u64, Entry)> {
        self.entries.iter()
    }
}

/// One mapping, for introspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingInfo {
    /// Device address.
    pub iova: u64,
    /// Host virtual address.
    pub va: usize,
    /// Bytes.
    pub len: usize,
}

/// IOMMU counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IommuStats {
    /// Successful maps.
    pub maps: u64,
    /// Successful unmaps.
    pub unmaps: u64,
    /// Accesses refused because the range was not mapped (or misaligned).
    pub faults: u64,
    /// Accesses refused because bus mastering was off.
    pub blocked_no_bus_master: u64,
    /// Bytes read from host memory.
    pub bytes_read: u64,
    /// Bytes written to host memory.
    pub bytes_written: u64,
}

/// The model's IOMMU: the IOVA → host memory table of one PCI function.
#[derive(Debug)]
pub struct Iommu {
    table: RwLock<Table>,
    hints: Hints,
    next_iova: Mutex<u64>,
    bus_master: AtomicBool,
    maps: AtomicU64,
    unmaps: AtomicU64,
    faults: AtomicU64,
    blocked: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    last_fault: Mutex<Option<DmaFault>>,
    lock_limit: AtomicU64,
}

impl Default for Iommu {
    fn default() -> Self {
        Iommu::new()
    }
}

/// A translated piece of an access: host address and length.
type Piece = (usize, usize);

/// The host pieces of one access: one when it lies inside one mapping (the
/// usual case), one per mapping it crosses otherwise; only an access over
/// more than two mappings spills to the heap.
type Pieces = SmallVec<[Piece; 2]>;

impl Iommu {
    /// An empty IOMMU with bus mastering off.
    pub fn new() -> Iommu {
        Iommu {
            table: RwLock::new(Table::default()),
            hints: Hints::default(),
            next_iova: Mutex::new(IOVA_BASE),
            bus_master: AtomicBool::new(false),
            maps: AtomicU64::new(0),
            unmaps: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            last_fault: Mutex::new(None),
            lock_limit: AtomicU64::new(u64::MAX),
        }
    }

    /// Limits the bytes mapped at once (`u64::MAX`: no limit).
    pub fn set_lock_limit(&self, bytes: u64) {
        self.lock_limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> u64 {
        read_table(&self.table)
            .iter()
            .map(|(_, e)| e.len as u64)
            .sum()
    }

    /// Turns bus mastering on or off (PCI COMMAND bit 2).
    pub fn set_bus_master(&self, on: bool) {
        self.bus_master.store(on, Ordering::Release);
    }

    /// Whether the function may master the bus.
    pub fn bus_master(&self) -> bool {
        self.bus_master.load(Ordering::Acquire)
    }

    /// Counters.
    pub fn stats(&self) -> IommuStats {
        IommuStats {
            maps: self.maps.load(Ordering::Relaxed),
            unmaps: self.unmaps.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
            blocked_no_bus_master: self.blocked.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }

    /// The most recent fault.
    pub fn last_fault(&self) -> Option<DmaFault> {
        *lock(&self.last_fault)
    }

    /// Every live mapping, by IOVA.
    pub fn mappings(&self) -> Vec<MappingInfo> {
        read_table(&self.table)
            .iter()
            .map(|&(iova, e)| MappingInfo {
                iova,
                va: e.va,
                len: e.len,
            })
            .collect()
    }

    /// True if `[iova, iova + len)` is entirely mapped (no access is made).
    pub fn is_mapped(&self, iova: u64, len: usize) -> bool {
        let t = read_table(&self.table);
        translate(&t, &self.hints, iova, len, &mut Pieces::new())
    }

    fn map(&self, va: usize, len: usize) -> Result<u64, MapError> {
        if len == 0 || !va.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(MapError::Unaligned { va, len });
        }
        let limit = self.lock_limit.load(Ordering::Relaxed);
        if limit != u64::MAX {
            let total = self.mapped_bytes() + len as u64;
            if total > limit {
                return Err(MapError::LockLimit { len, total, limit });
            }
        }
        let mut next = lock(&self.next_iova);
        let align: u64 = if len >= 2 << 20 { 2 << 20 } else { PAGE as u64 };
        let iova = next.div_ceil(align) * align;
        let end = iova
            .checked_add(len as u64)
            .and_then(|e| e.checked_add(IOVA_GUARD))
            .filter(|e| *e < 1 << 56)
            .ok_or(MapError::Exhausted { len })?;
        *next = end;
        write_table(&self.table).insert(iova, Entry { va, len });
        self.maps.fetch_add(1, Ordering::Relaxed);
        Ok(iova)
    }

    fn unmap(&self, va: usize, iova: u64, len: usize) -> Result<(), MapError> {
        let mut t = write_table(&self.table);
        match t.position(iova) {
            None => Err(MapError::NotMapped { iova }),
            Some(i) if t.entries[i].1.va != va || t.entries[i].1.len != len => {
                let e = t.entries[i].1;
                Err(MapError::Mismatch {
                    iova,
                    va: e.va,
                    len: e.len,
                })
            }
            Some(i) => {
                t.entries.remove(i);
                self.unmaps.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn fault(&self, iova: u64, len: usize, write: bool, kind: FaultKind) -> DmaFault {
        let f = DmaFault {
            iova,
            len,
            write,
            kind,
        };
        if kind == FaultKind::BusMasterDisabled {
            self.blocked.fetch_add(1, Ordering::Relaxed);
        } else {
            self.faults.fetch_add(1, Ordering::Relaxed);
        }
        *lock(&self.last_fault) = Some(f);
        tracing::debug!(%f, "device model DMA fault");
        f
    }

    /// Runs `f` on the host pieces of `[iova, iova + len)` in the locked
    /// table `t`, or reports the fault. Counts nothing.
    fn pieces_in<R>(
        &self,
        t: &Table,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&[Piece]) -> R,
    ) -> Result<R, DmaFault> {
        if !self.bus_master() {
            return Err(self.fault(iova, len, write, FaultKind::BusMasterDisabled));
        }
        // The usual case: the access lies inside one mapping (one piece,
        // no vector). Otherwise the general split, which may fault.
        match t.within(&self.hints, iova, len) {
            Some(va) => Ok(f(&[(va, len)])),
            None => {
                let mut pieces = Pieces::new();
                if !translate(t, &self.hints, iova, len, &mut pieces) {
                    return Err(self.fault(iova, len, write, FaultKind::Unmapped));
                }
                Ok(f(&pieces))
            }
        }
    }

    fn count(&self, write: bool, len: u64) {
        let c = if write {
            &self.bytes_written
        } else {
            &self.bytes_read
        };
        c.fetch_add(len, Ordering::Relaxed);
    }

    /// Runs `f` on the host pieces of `[iova, iova + len)` with the table
    /// locked (a session of one access), or reports the fault.
    fn with_pieces<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&[Piece]) -> R,
    ) -> Result<R, DmaFault> {
        self.session().pieces(iova, len, write, f)
    }

    /// Runs `f` on `[iova, iova + len)` as one [`DmaSpan`], under one
    /// translation, if bus mastering is on and the range lies inside one
    /// mapping; `None` (nothing touched, nothing counted) otherwise, for
    /// the caller to fall back to single accesses, which fault (and count)
    /// as usual. For a sequence of accesses into one small structure (a
    /// CQE: body, then the fields a reader polls, in order) that firmware
    /// makes into one page.
    pub fn with_span<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&DmaSpan) -> R,
    ) -> Option<R> {
        self.session().with_span(iova, len, write, f)
    }

    /// Copies `buf.len()` bytes from device address `iova` into `buf`.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.session().read(iova, buf)
    }

    /// Copies `data` to device address `iova`.
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.session().write(iova, data)
    }

    /// Fills `len` bytes at `iova` with `byte`.
    pub fn fill(&self, iova: u64, len: usize, byte: u8) -> Result<(), DmaFault> {
        self.with_pieces(iova, len, true, |pieces| {
            for &(va, n) in pieces {
                // SAFETY: the range lies inside a live mapping while the
                // table lock is held.
                unsafe { std::ptr::write_bytes(va as *mut u8, byte, n) };
            }
        })
    }

    fn atomic_ptr(&self, iova: u64, size: usize, write: bool) -> Result<(), DmaFault> {
        if !iova.is_multiple_of(size as u64) {
            return Err(self.fault(iova, size, write, FaultKind::Misaligned));
        }
        Ok(())
    }

    /// Stores one byte with release ordering (ownership bytes: written last).
    pub fn store_u8_release(&self, iova: u64, v: u8) -> Result<(), DmaFault> {
        self.session().store_u8_release(iova, v)
    }

    /// Stores a big-endian u16 atomically with release ordering (the
    /// overrun CQ's `wqe_counter`/`wqe_id`, which a reader snapshots).
    pub fn store_be16_release(&self, iova: u64, v: u16) -> Result<(), DmaFault> {
        self.session().store_be16_release(iova, v)
    }

    /// Loads a big-endian u32 atomically with acquire ordering (doorbell
    /// records).
    pub fn load_be32_acquire(&self, iova: u64) -> Result<u32, DmaFault> {
        self.session().load_be32_acquire(iova)
    }

    /// Loads one byte with acquire ordering.
    pub fn load_u8_acquire(&self, iova: u64) -> Result<u8, DmaFault> {
        self.with_pieces(iova, 1, false, |p| {
            // SAFETY: one byte inside a live mapping.
            unsafe { AtomicU8::from_ptr(p[0].0 as *mut u8) }.load(Ordering::Acquire)
        })
    }

    /// A session: the table read-locked for a sequence of accesses (one
    /// doorbell's WQEs, one frame's delivery), which are translated and
    /// checked one by one exactly as single accesses are, without taking
    /// the lock for each. Unmapping waits for the session to end, as it
    /// waits for any access in flight. Byte counts are added when it ends.
    ///
    /// Lock order: the function's object table, then an SQ's lock (TX),
    /// then the session, then an RQ's lock (RX), then a CQ's, then an
    /// EQ's. No single access (which takes the table lock itself) is made
    /// while a session is open on this thread, and none while holding a
    /// queue lock that a session holder may wait for — the engines pass
    /// the session down instead. std's `RwLock` queues a new reader behind
    /// a waiting unmap, so either would deadlock.
    pub(crate) fn session(&self) -> DmaSession<'_> {
        DmaSession {
            io: self,
            table: read_table(&self.table),
            read: Cell::new(0),
            written: Cell::new(0),
        }
    }
}

/// Copies from the pieces into `buf` (the pieces sum to `buf.len()`).
///
/// # Safety
/// The pieces must come from the table under a lock still held.
unsafe fn copy_out(pieces: &[Piece], buf: &mut [u8]) {
    // SAFETY: `buf` is valid for writes of its length, which the pieces
    // sum to; the rest is the caller's contract.
    unsafe { copy_out_raw(pieces, buf.as_mut_ptr()) }
}

/// Copies from the pieces to `dst`.
///
/// # Safety
/// As [`copy_out`]; `dst` must be valid for writes of the pieces' total
/// length and must not be DMA memory.
unsafe fn copy_out_raw(pieces: &[Piece], dst: *mut u8) {
    let mut done = 0;
    for &(va, n) in pieces {
        // SAFETY: `va..va + n` lies inside a live mapping (the caller's
        // contract), so it is valid host memory by the DmaMapper contract;
        // `dst + done..dst + done + n` is in bounds since the pieces sum to
        // what `dst` can hold; the ranges cannot overlap because `dst` is
        // Rust-owned memory, not DMA memory.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, dst.add(done), n) };
        done += n;
    }
}

/// Copies `data` into the pieces (which sum to `data.len()`).
///
/// # Safety
/// As [`copy_out`].
unsafe fn copy_in(pieces: &[Piece], data: &[u8]) {
    let mut done = 0;
    for &(va, n) in pieces {
        // SAFETY: as in `copy_out`: the destination is inside a live
        // mapping, the source range is in bounds of `data`, and the two
        // cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(done), va as *mut u8, n) };
        done += n;
    }
}

/// Release-stores `v` into the one-byte piece.
///
/// # Safety
/// As [`copy_out`], for a one-byte access.
unsafe fn store_u8(p: &[Piece], v: u8) {
    // SAFETY: one byte inside a live mapping (the caller's contract); any
    // address is aligned for AtomicU8, and the atomic is only used for
    // this store.
    unsafe { AtomicU8::from_ptr(p[0].0 as *mut u8) }.store(v, Ordering::Release);
}

/// Release-stores big-endian `v` into the two-byte piece.
///
/// # Safety
/// As [`copy_out`], for a two-byte access at a 2-byte aligned IOVA.
unsafe fn store_be16(p: &[Piece], v: u16) {
    debug_assert_eq!(p.len(), 1, "an aligned u16 never spans mappings");
    // SAFETY: two bytes inside one live mapping (IOVA and VA are both
    // page-aligned at mapping start, so the 2-byte IOVA alignment carries
    // over to the VA).
    unsafe { AtomicU16::from_ptr(p[0].0 as *mut u16) }.store(v.to_be(), Ordering::Release);
}

/// Acquire-loads a big-endian u32 from the four-byte piece.
///
/// # Safety
/// As [`copy_out`], for a four-byte access at a 4-byte aligned IOVA.
unsafe fn load_be32(p: &[Piece]) -> u32 {
    // SAFETY: four bytes inside one live mapping, 4-byte aligned (see
    // `store_be16`).
    u32::from_be(unsafe { AtomicU32::from_ptr(p[0].0 as *mut u32) }.load(Ordering::Acquire))
}

/// The accesses the TX and RX engines make, on the [`Iommu`] itself (the
/// table locked per access: doorbells and commands outside the
/// datapath) or on a [`DmaSession`] (locked once for a doorbell or a
/// frame). The same checks, faults and counts either way.
pub(crate) trait Dma {
    /// [`Iommu::read`].
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// [`Iommu::write`].
    fn write(&self, iova: u64, data: &[u8]) -> Result<(), DmaFault>;
    /// [`Iommu::store_u8_release`].
    fn store_u8_release(&self, iova: u64, v: u8) -> Result<(), DmaFault>;
    /// [`Iommu::store_be16_release`].
    fn store_be16_release(&self, iova: u64, v: u16) -> Result<(), DmaFault>;
    /// [`Iommu::load_be32_acquire`].
    fn load_be32_acquire(&self, iova: u64) -> Result<u32, DmaFault>;
    /// [`Iommu::with_span`].
    fn with_span<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&DmaSpan) -> R,
    ) -> Option<R>;
}

impl Dma for Iommu {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        Iommu::read(self, iova, buf)
    }
    fn write(&self, iova: u64, data: &[u8]) -> Result<(), DmaFault> {
        Iommu::write(self, iova, data)
    }
    fn store_u8_release(&self, iova: u64, v: u8) -> Result<(), DmaFault> {
        Iommu::store_u8_release(self, iova, v)
    }
    fn store_be16_release(&self, iova: u64, v: u16) -> Result<(), DmaFault> {
        Iommu::store_be16_release(self, iova, v)
    }
    fn load_be32_acquire(&self, iova: u64) -> Result<u32, DmaFault> {
        Iommu::load_be32_acquire(self, iova)
    }
    fn with_span<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&DmaSpan) -> R,
    ) -> Option<R> {
        Iommu::with_span(self, iova, len, write, f)
    }
}

/// The table read-locked for a sequence of accesses ([`Iommu::session`]).
pub(crate) struct DmaSession<'a> {
    io: &'a Iommu,
    table: RwLockReadGuard<'a, Table>,
    read: Cell<u64>,
    written: Cell<u64>,
}

impl fmt::Debug for DmaSession<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DmaSession(read {}, written {})",
            self.read.get(),
            self.written.get()
        )
    }
}

impl DmaSession<'_> {
    /// Appends the `len` bytes at `iova` to `out` without zeroing them
    /// first (a gather into a frame); on a fault `out` is unchanged.
    pub(crate) fn read_append(
        &self,
        iova: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), DmaFault> {
        out.reserve(len);
        let start = out.len();
        let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        // SAFETY: the pieces come from the table, locked for the session,
        // and sum to `len`; `dst` has room for `len` bytes (reserved above)
        // and is the vector's own memory.
        let r = self.pieces(iova, len, false, |p| unsafe { copy_out_raw(p, dst) });
        if r.is_ok() {
            // SAFETY: the `len` bytes after `start` were just written and
            // are within the capacity reserved above.
            unsafe { out.set_len(start + len) };
        }
        r
    }

    /// Runs `f` on the host pieces of `[iova, iova + len)`, or reports
    /// the fault; counts the bytes if it ran.
    fn pieces<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&[Piece]) -> R,
    ) -> Result<R, DmaFault> {
        let r = self.io.pieces_in(&self.table, iova, len, write, f);
        if r.is_ok() {
            self.count(write, len);
        }
        r
    }

    fn count(&self, write: bool, len: usize) {
        let c = if write { &self.written } else { &self.read };
        c.set(c.get() + len as u64);
    }
}

impl Dma for DmaSession<'_> {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        // SAFETY: the pieces come from the table, locked for the session.
        self.pieces(iova, buf.len(), false, |p| unsafe { copy_out(p, buf) })
    }
    fn write(&self, iova: u64, data: &[u8]) -> Result<(), DmaFault> {
        // SAFETY: as in `read`.
        self.pieces(iova, data.len(), true, |p| unsafe { copy_in(p, data) })
    }
    fn store_u8_release(&self, iova: u64, v: u8) -> Result<(), DmaFault> {
        // SAFETY: as in `read`; one piece of one byte.
        self.pieces(iova, 1, true, |p| unsafe { store_u8(p, v) })
    }
    fn store_be16_release(&self, iova: u64, v: u16) -> Result<(), DmaFault> {
        self.io.atomic_ptr(iova, 2, true)?;
        // SAFETY: as in `read`; the IOVA is 2-byte aligned (checked).
        self.pieces(iova, 2, true, |p| unsafe { store_be16(p, v) })
    }
    fn load_be32_acquire(&self, iova: u64) -> Result<u32, DmaFault> {
        self.io.atomic_ptr(iova, 4, false)?;
        // SAFETY: as in `read`; the IOVA is 4-byte aligned (checked).
        self.pieces(iova, 4, false, |p| unsafe { load_be32(p) })
    }
    fn with_span<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(&DmaSpan) -> R,
    ) -> Option<R> {
        if !self.io.bus_master() {
            return None;
        }
        let va = self.table.within(&self.io.hints, iova, len)?;
        let r = f(&DmaSpan { va, len });
        self.count(write, len);
        Some(r)
    }
}

impl Drop for DmaSession<'_> {
    fn drop(&mut self) {
        for (n, write) in [(self.read.get(), false), (self.written.get(), true)] {
            if n != 0 {
                self.io.count(write, n);
            }
        }
    }
}

/// A range of host memory inside one live mapping, lent to the closure of
/// [`Iommu::with_span`] while the table is read-locked (it cannot outlive
/// the call: it is neither `Clone` nor handed out by value). Offsets are
/// the model's own constants; one outside the span is a bug in the model
/// and panics.
#[derive(Debug)]
pub struct DmaSpan {
    va: usize,
    len: usize,
}

impl DmaSpan {
    fn check(&self, off: usize, n: usize, align: usize) -> *mut u8 {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len)
                && (self.va + off).is_multiple_of(align),
            "DMA span access of {n} bytes at {off:#x} outside {} bytes (or misaligned)",
            self.len
        );
        (self.va + off) as *mut u8
    }

    /// Copies `data` to byte `off` of the span.
    pub fn write(&self, off: usize, data: &[u8]) {
        let dst = self.check(off, data.len(), 1);
        // SAFETY: `dst..dst + data.len()` is inside the span (checked),
        // which lies inside a live mapping while the table lock taken by
        // `with_span` is held (the span cannot outlive it); `data` is a
        // Rust slice, not DMA memory, so they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }

    /// Stores one byte at `off` with release ordering (an ownership byte).
    pub fn store_u8_release(&self, off: usize, v: u8) {
        let p = self.check(off, 1, 1);
        // SAFETY: one byte inside the span (checked), inside a live mapping
        // while the table lock is held; any address is aligned for AtomicU8.
        unsafe { AtomicU8::from_ptr(p) }.store(v, Ordering::Release);
    }

    /// Stores a big-endian u16 at `off` atomically with release ordering.
    /// The host address must be 2-byte aligned (it is whenever the IOVA
    /// is: mappings start page-aligned on both sides).
    pub fn store_be16_release(&self, off: usize, v: u16) {
        let p = self.check(off, 2, 2);
        // SAFETY: two bytes inside the span, 2-byte aligned (checked),
        // inside a live mapping while the table lock is held.
        unsafe { AtomicU16::from_ptr(p as *mut u16) }.store(v.to_be(), Ordering::Release);
    }
}

/// Splits `[iova, iova + len)` into host pieces, or false if any byte is
/// unmapped (then nothing may be accessed: the caller touches memory only
/// after the whole range translated).
/// The pieces go into the caller's `pieces` (empty on entry), not a
/// returned value: they stay in the caller's frame, never copied.
fn translate(t: &Table, hints: &Hints, iova: u64, len: usize, pieces: &mut Pieces) -> bool {
    debug_assert!(pieces.is_empty());
    let mut cur = iova;
    let Some(end) = iova.checked_add(len as u64) else {
        return false;
    };
    while cur < end {
        let Some((base, e)) = t.find(hints, cur) else {
            return false;
        };
        let off = cur - base;
        let n = (e.len as u64 - off).min(end - cur);
        pieces.push((e.va + off as usize, n as usize));
        cur += n;
    }
    true
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read_table<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write_table<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// The model's [`DmaMapper`]: assigns IOVAs and records them in the IOMMU.
#[derive(Debug, Clone)]
pub struct SimMapper {
    iommu: Arc<Iommu>,
}

impl SimMapper {
    /// A mapper that fills `iommu`.
    pub fn new(iommu: Arc<Iommu>) -> SimMapper {
        SimMapper { iommu }
    }
}

impl DmaMapper for SimMapper {
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError> {
        match self.iommu.map(va, len) {
            Ok(iova) => Ok(DmaMapping { iova, len, lkey: 0 }),
            Err(e) => Err(DmaError {
                op: "map",
                va,
                iova: 0,
                len,
                source: Box::new(e),
            }),
        }
    }

    fn unmap(&self, va: usize, mapping: &DmaMapping) -> Result<(), DmaError> {
        self.iommu
            .unmap(va, mapping.iova, mapping.len)
            .map_err(|e| DmaError {
                op: "unmap",
                va,
                iova: mapping.iova,
                len: mapping.len,
                source: Box::new(e),
            })
    }
}

/// Page-aligned, zeroed host memory mapped for DMA through a mapper: what a
/// test (playing the driver) gives the device model.
///
/// All accessors take `&self`: the memory is shared with the device. They
/// copy through raw pointers and never hand out references into it.
/// Offsets out of range are a bug in the test and panic with the numbers.
pub struct HostMem {
    ptr: NonNull<u8>,
    layout: Layout,
    mapper: Arc<dyn DmaMapper>,
    mapping: DmaMapping,
}

// SAFETY: HostMem owns its allocation (like a Box<[u8]>); all access goes
// through raw-pointer copies and atomics, and concurrent use from several
// threads is the same shared-memory situation as device DMA (callers follow
// an ownership protocol for the bytes they share).
unsafe impl Send for HostMem {}
// SAFETY: see `Send`; `&self` methods never create references into the
// allocation.
unsafe impl Sync for HostMem {}

impl fmt::Debug for HostMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HostMem(va {:#x}, iova {:#x}, {} bytes)",
            self.ptr.as_ptr() as usize,
            self.mapping.iova,
            self.layout.size()
        )
    }
}

/// Allocating or mapping host memory failed.
#[derive(Debug, thiserror::Error)]
pub enum HostMemError {
    /// The size is zero or overflows.
    #[error("cannot allocate {len} bytes of page-aligned memory")]
    Alloc {
        /// Requested bytes.
        len: usize,
    },
    /// The mapper refused.
    #[error(transparent)]
    Map(#[from] DmaError),
}

impl HostMem {
    /// Allocates `len` bytes (rounded up to 4 KiB), zeroed, and maps them.
    pub fn new(mapper: Arc<dyn DmaMapper>, len: usize) -> Result<HostMem, HostMemError> {
        let size = len.max(1).div_ceil(PAGE) * PAGE;
        let layout =
            Layout::from_size_align(size, PAGE).map_err(|_| HostMemError::Alloc { len })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(HostMemError::Alloc { len })?;
        // SAFETY: the allocation is ours, only accessed through raw
        // pointers, and freed only after the mapping is removed (Drop).
        match unsafe { mapper.map(ptr.as_ptr() as usize, size) } {
            Ok(mapping) => Ok(HostMem {
                ptr,
                layout,
                mapper,
                mapping,
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout, never shared.
                unsafe { std::alloc::dealloc(raw, layout) };
                Err(e.into())
            }
        }
    }

    /// Device address of byte 0.
    pub fn iova(&self) -> u64 {
        self.mapping.iova
    }

    /// Device address of byte `off`.
    pub fn iova_at(&self, off: usize) -> u64 {
        self.mapping.iova + off as u64
    }

    /// Host virtual address of byte 0.
    pub fn va(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn check(&self, off: usize, n: usize, align: usize) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len()) && off.is_multiple_of(align),
            "HostMem access of {n} bytes at offset {off:#x} outside {} bytes (or misaligned)",
            self.len()
        );
    }

    /// Copies `data` to offset `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len(), 1);
        // SAFETY: in bounds of the owned allocation (checked); `data` is a
        // Rust slice that cannot overlap memory we own exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }

    /// Copies from offset `off` into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        self.check(off, buf.len(), 1);
        // SAFETY: in bounds of the owned allocation (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
        };
    }

    /// `len` bytes from `off`.
    pub fn read_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read(off, &mut v);
        v
    }

    /// Fills `len` bytes from `off` with `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        self.check(off, len, 1);
        // SAFETY: in bounds of the owned allocation (checked).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(off), byte, len) };
    }

    /// Big-endian u32 at `off`.
    pub fn read_be32(&self, off: usize) -> u32 {
        let mut b = [0; 4];
        self.read(off, &mut b);
        u32::from_be_bytes(b)
    }

    /// Writes a big-endian u32 at `off`.
    pub fn write_be32(&self, off: usize, v: u32) {
        self.write(off, &v.to_be_bytes());
    }

    /// Writes a big-endian u64 at `off`.
    pub fn write_be64(&self, off: usize, v: u64) {
        self.write(off, &v.to_be_bytes());
    }

    /// Stores a big-endian u32 at `off` (4-byte aligned) with release
    /// ordering: a doorbell record update.
    pub fn store_be32_release(&self, off: usize, v: u32) {
        self.check(off, 4, 4);
        // SAFETY: in bounds and 4-byte aligned (checked; the allocation is
        // page aligned).
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off) as *mut u32) }
            .store(v.to_be(), Ordering::Release);
    }

    /// Loads one byte at `off` with acquire ordering: an ownership byte.
    pub fn load_u8_acquire(&self, off: usize) -> u8 {
        self.check(off, 1, 1);
        // SAFETY: in bounds (checked).
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }.load(Ordering::Acquire)
    }

    /// Stores one byte at `off` with release ordering.
    pub fn store_u8_release(&self, off: usize, v: u8) {
        self.check(off, 1, 1);
        // SAFETY: in bounds (checked).
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }.store(v, Ordering::Release);
    }

    /// Loads a big-endian u16 at `off` (2-byte aligned) atomically with
    /// acquire ordering (the overrun CQ snapshot).
    pub fn load_be16_acquire(&self, off: usize) -> u16 {
        self.check(off, 2, 2);
        // SAFETY: in bounds and aligned (checked).
        u16::from_be(
            unsafe { AtomicU16::from_ptr(self.ptr.as_ptr().add(off) as *mut u16) }
                .load(Ordering::Acquire),
        )
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        let va = self.va();
        if let Err(e) = self.mapper.unmap(va, &self.mapping) {
            // The device may still reach the memory: leak it rather than
            // free memory a mapping points at.
            tracing::error!(%e, "HostMem unmap failed; leaking the allocation");
            return;
        }
        // SAFETY: allocated in `new` with `self.layout`; the mapping is gone
        // (unmap waited for in-flight accesses under the IOMMU write lock),
        // so nothing can reach the memory any more.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Arc<Iommu>, Arc<dyn DmaMapper>) {
        let iommu = Arc::new(Iommu::new());
        iommu.set_bus_master(true);
        let m: Arc<dyn DmaMapper> = Arc::new(SimMapper::new(iommu.clone()));
        (iommu, m)
    }

    #[test]
    fn iovas_differ_from_vas_and_have_guards() {
        let (iommu, m) = setup();
        let a = HostMem::new(m.clone(), 4096).unwrap();
        let b = HostMem::new(m.clone(), 8192).unwrap();
        assert!(a.iova() >= IOVA_BASE);
        assert_ne!(a.iova(), a.va() as u64);
        assert_eq!(b.iova(), a.iova() + 4096 + IOVA_GUARD);
        // The guard page faults.
        let mut x = [0u8; 1];
        let f = iommu.read(a.iova() + 4096, &mut x).unwrap_err();
        assert_eq!(f.kind, FaultKind::Unmapped);
        // A straddling access faults and writes nothing.
        assert!(iommu.write(a.iova() + 4090, &[7; 10]).is_err());
        assert_eq!(a.read_vec(4090, 6), vec![0; 6]);
        assert_eq!(iommu.stats().faults, 2);
    }

    #[test]
    fn round_trip_and_atomics() {
        let (iommu, m) = setup();
        let a = HostMem::new(m, 4096).unwrap();
        iommu.write(a.iova_at(10), b"hello").unwrap();
        assert_eq!(a.read_vec(10, 5), b"hello");
        a.store_be32_release(64, 0x1234_5678);
        assert_eq!(iommu.load_be32_acquire(a.iova_at(64)).unwrap(), 0x1234_5678);
        iommu.store_be16_release(a.iova_at(2), 0xbeef).unwrap();
        assert_eq!(a.load_be16_acquire(2), 0xbeef);
        assert_eq!(
            iommu.store_be16_release(a.iova_at(3), 1).unwrap_err().kind,
            FaultKind::Misaligned
        );
        iommu.store_u8_release(a.iova_at(63), 0xf1).unwrap();
        assert_eq!(a.load_u8_acquire(63), 0xf1);
    }

    #[test]
    fn bus_master_gates_dma_and_unmap_removes() {
        let (iommu, m) = setup();
        let a = HostMem::new(m, 4096).unwrap();
        let iova = a.iova();
        iommu.set_bus_master(false);
        assert_eq!(
            iommu.write(iova, &[1]).unwrap_err().kind,
            FaultKind::BusMasterDisabled
        );
        assert_eq!(iommu.stats().blocked_no_bus_master, 1);
        iommu.set_bus_master(true);
        drop(a);
        assert!(iommu.read(iova, &mut [0]).is_err());
        assert_eq!(iommu.stats().unmaps, 1);
    }

    /// Adds a mapping at a chosen IOVA (the mapper never places two
    /// mappings back to back; the table must still handle it).
    fn add_raw(iommu: &Iommu, iova: u64, mem: &HostMem) {
        write_table(&iommu.table).insert(
            iova,
            Entry {
                va: mem.va(),
                len: mem.len(),
            },
        );
    }

    /// `n` pages of host memory mapped back to back from `iova`.
    fn adjacent_raw(iommu: &Iommu, m: &Arc<dyn DmaMapper>, iova: u64, n: usize) -> Vec<HostMem> {
        let mems: Vec<HostMem> = (0..n)
            .map(|_| HostMem::new(m.clone(), 4096).unwrap())
            .collect();
        for (i, mem) in mems.iter().enumerate() {
            add_raw(iommu, iova + 4096 * i as u64, mem);
        }
        mems
    }

    fn remove_raw(iommu: &Iommu, iova: u64) {
        let mut t = write_table(&iommu.table);
        let i = t.position(iova).expect("raw mapping present");
        t.entries.remove(i);
    }

    #[test]
    fn access_across_adjacent_mappings_and_into_a_hole() {
        let (iommu, m) = setup();
        // Three back-to-back mappings at X, then a hole at X + 3 pages.
        let x = 0x80_0000_0000u64;
        let mems = adjacent_raw(&iommu, &m, x, 3);
        // Across the first boundary: split between the two mappings.
        iommu.write(x + 4090, b"0123456789").unwrap();
        assert_eq!(mems[0].read_vec(4090, 6), b"012345");
        assert_eq!(mems[1].read_vec(0, 4), b"6789");
        let mut back = [0u8; 10];
        iommu.read(x + 4090, &mut back).unwrap();
        assert_eq!(&back, b"0123456789");
        // Across all three (more pieces than the inline room).
        let long: Vec<u8> = (0..8200u32).map(|i| i as u8).collect();
        iommu.write(x + 2000, &long).unwrap();
        let mut got = vec![0u8; long.len()];
        iommu.read(x + 2000, &mut got).unwrap();
        assert_eq!(got, long);
        assert_eq!(mems[1].read_vec(0, 4096), long[2096..6192]);
        assert!(iommu.is_mapped(x, 3 * 4096));
        // Into the hole: faults, counted, and writes nothing at all.
        let before = iommu.stats();
        let f = iommu.write(x + 3 * 4096 - 4, &[0xaa; 8]).unwrap_err();
        assert_eq!(
            f,
            DmaFault {
                iova: x + 3 * 4096 - 4,
                len: 8,
                write: true,
                kind: FaultKind::Unmapped
            }
        );
        // The four bytes inside the third mapping stay as they were.
        assert_eq!(mems[2].read_vec(4092, 4), vec![0; 4]);
        // A longer one from the first mapping runs through all three into
        // the hole: nothing changes anywhere.
        let snapshot: Vec<Vec<u8>> = mems.iter().map(|h| h.read_vec(0, 4096)).collect();
        assert!(iommu.fill(x + 100, 3 * 4096, 0x55).is_err());
        let after: Vec<Vec<u8>> = mems.iter().map(|h| h.read_vec(0, 4096)).collect();
        assert_eq!(after, snapshot);
        assert!(iommu.read(x + 3 * 4096 - 1, &mut [0; 2]).is_err());
        assert!(!iommu.is_mapped(x + 1, 3 * 4096));
        let s = iommu.stats();
        assert_eq!(s.faults, before.faults + 3);
        assert_eq!(s.bytes_written, before.bytes_written);
        // A hole before the first mapping.
        assert!(iommu.read(x - 1, &mut [0; 2]).is_err());
        for i in 0..3 {
            remove_raw(&iommu, x + 4096 * i);
        }
        assert!(iommu.read(x + 4090, &mut back).is_err());
    }

    #[test]
    fn a_span_is_lent_only_inside_one_mapping_and_counts_like_a_write() {
        let (iommu, m) = setup();
        let x = 0x90_0000_0000u64;
        let mems = adjacent_raw(&iommu, &m, x, 2);
        let before = iommu.stats();
        iommu
            .with_span(x + 64, 64, true, |s| {
                s.write(0, &[1, 2]);
                s.store_be16_release(2, 0x0304);
                s.store_u8_release(63, 0x3f);
            })
            .unwrap();
        assert_eq!(mems[0].read_vec(64, 4), [1, 2, 3, 4]);
        assert_eq!(mems[0].load_u8_acquire(127), 0x3f);
        assert_eq!(iommu.stats().bytes_written, before.bytes_written + 64);
        // Across two mappings, into a hole, or without bus mastering: no
        // span, nothing touched, nothing counted (the caller falls back).
        assert!(iommu.with_span(x + 4096 - 32, 64, true, |_| ()).is_none());
        assert!(
            iommu
                .with_span(x + 2 * 4096 - 32, 64, true, |_| ())
                .is_none()
        );
        assert!(iommu.with_span(x + 8192, 1, false, |_| ()).is_none());
        iommu.set_bus_master(false);
        assert!(iommu.with_span(x, 64, true, |_| ()).is_none());
        iommu.set_bus_master(true);
        let after = iommu.stats();
        assert_eq!(
            (
                after.faults,
                after.bytes_written,
                after.blocked_no_bus_master
            ),
            (
                before.faults,
                before.bytes_written + 64,
                before.blocked_no_bus_master
            )
        );
        for i in 0..2 {
            remove_raw(&iommu, x + 4096 * i);
        }
    }

    #[test]
    fn a_session_appends_a_gather_or_nothing() {
        let (iommu, m) = setup();
        let a = HostMem::new(m, 4096).unwrap();
        a.write(4000, &[9; 96]);
        let mut out = vec![1, 2];
        {
            let io = iommu.session();
            io.read_append(a.iova_at(4000), 96, &mut out).unwrap();
            // Runs into the guard page: faults, appends nothing.
            let f = io.read_append(a.iova_at(4000), 97, &mut out).unwrap_err();
            assert_eq!(f.kind, FaultKind::Unmapped);
        }
        assert_eq!(out.len(), 98);
        assert_eq!(&out[..2], &[1, 2]);
        assert!(out[2..].iter().all(|&b| b == 9));
        let s = iommu.stats();
        assert_eq!((s.bytes_read, s.faults), (96, 1));
    }

    #[test]
    #[should_panic(expected = "outside 8 bytes")]
    fn a_span_access_past_its_end_is_a_model_bug() {
        let (iommu, m) = setup();
        let a = HostMem::new(m, 4096).unwrap();
        iommu.with_span(a.iova(), 8, true, |s| s.write(6, &[0; 4]));
    }

    /// The pre-change translation (a BTreeMap range lookup into a Vec), as
    /// the reference for `translate`.
    fn reference(
        t: &std::collections::BTreeMap<u64, Entry>,
        iova: u64,
        len: usize,
    ) -> Option<Vec<Piece>> {
        let mut pieces = Vec::new();
        let mut cur = iova;
        let end = iova.checked_add(len as u64)?;
        while cur < end {
            let (&base, e) = t.range(..=cur).next_back()?;
            let off = cur - base;
            if off >= e.len as u64 {
                return None;
            }
            let n = (e.len as u64 - off).min(end - cur);
            pieces.push((e.va + off as usize, n as usize));
            cur += n;
        }
        Some(pieces)
    }

    fn tables(
        layout: &[(u64, usize)],
        va0: usize,
    ) -> (Table, std::collections::BTreeMap<u64, Entry>) {
        let mut table = Table::default();
        let mut reference_table = std::collections::BTreeMap::new();
        let mut at = 0x1_0000_0000u64;
        for (i, &(gap, pages)) in layout.iter().enumerate() {
            at += gap * 4096;
            let e = Entry {
                va: va0 + i * 0x10_0000,
                len: pages * 4096,
            };
            table.insert(at, e);
            reference_table.insert(at, e);
            at += e.len as u64;
        }
        (table, reference_table)
    }

    proptest::proptest! {
        /// Same pieces as the reference for any table and access, with the
        /// hints carried over from earlier accesses and from another table
        /// (as after maps and unmaps).
        #[test]
        fn translate_matches_the_reference(
            // (gap before, pages) per mapping; gap 0 makes them adjacent.
            layouts in proptest::collection::vec(
                proptest::collection::vec((0u64..3, 1usize..4), 0..6), 1..3),
            accesses in proptest::collection::vec((0u64..24 * 4096, 0usize..6 * 4096), 1..12),
        ) {
            let hints = Hints::default();
            for (n, layout) in layouts.iter().enumerate() {
                let (table, reference_table) = tables(layout, 0x7000_0000 * (n + 1));
                for &(start, len) in &accesses {
                    let iova = 0x1_0000_0000 + start;
                    let mut pieces = Pieces::new();
                    let got = translate(&table, &hints, iova, len, &mut pieces)
                        .then(|| pieces.to_vec());
                    proptest::prop_assert_eq!(got, reference(&reference_table, iova, len));
                }
            }
        }
    }

    #[test]
    fn mapper_rejects_unaligned_and_bad_unmap() {
        let (_, m) = setup();
        // SAFETY: both requests are invalid and refused before any mapping exists.
        unsafe {
            assert!(m.map(0x1001, 4096).is_err());
            assert!(m.map(0x1000, 0).is_err());
        }
        let bogus = DmaMapping {
            iova: 0x42,
            len: 4096,
            lkey: 0,
        };
        assert!(m.unmap(0x1000, &bogus).is_err());
    }
}

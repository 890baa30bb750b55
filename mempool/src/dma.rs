//! DMA registration: making a virtual range visible to a device at an IOVA.
//!
//! The VFIO container (production) and the device model (tests) implement
//! [`DmaMapper`]; [`IdentityMapper`] is the trivial one for unit tests.
//! Registration is a slow-path operation (it happens when a region is
//! reserved), so the trait is object safe and used through `Arc<dyn _>`.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a device needs to reach a registered range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaMapping {
    /// Device-visible address of the first byte.
    pub iova: u64,
    /// Bytes mapped.
    pub len: usize,
    /// Memory key the NIC wants in data segments for this range (the lkey of
    /// the mlx5 mkey that covers it); 0 where keys do not apply.
    pub lkey: u32,
}

/// A failed map or unmap, with the numbers needed to understand it.
#[derive(Debug, thiserror::Error)]
#[error("DMA {op} of {len:#x} bytes (VA {va:#x}, IOVA {iova:#x}) failed: {source}")]
pub struct DmaError {
    /// "map" or "unmap".
    pub op: &'static str,
    /// Virtual address of the range.
    pub va: usize,
    /// IOVA involved (0 when none was assigned yet).
    pub iova: u64,
    /// Length of the range.
    pub len: usize,
    /// The backend's reason.
    #[source]
    pub source: Box<dyn StdError + Send + Sync>,
}

/// Makes host memory reachable by a device.
///
/// Implementations must keep a mapping valid until [`DmaMapper::unmap`] is
/// called for it, and may assume the memory stays allocated and locked for
/// that whole time (the caller's obligation, see [`DmaMapper::map`]).
pub trait DmaMapper: Send + Sync + std::fmt::Debug {
    /// Maps `len` bytes starting at virtual address `va` and returns where the
    /// device sees them. `va` and `len` are multiples of 4 KiB.
    ///
    /// # Safety
    /// A mapped device may read and write the range at any time. The caller
    /// guarantees that `[va, va + len)` is memory it owns, that stays
    /// allocated (and is not handed to anyone else) until the mapping is
    /// removed with [`DmaMapper::unmap`], and that it is prepared for the
    /// device writing into it (no Rust references over the parts the device
    /// writes). [`crate::HugepageRegion::register`] is the safe way to do this.
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError>;

    /// Undoes a mapping returned by [`DmaMapper::map`] on this mapper.
    fn unmap(&self, va: usize, mapping: &DmaMapping) -> Result<(), DmaError>;
}

/// IOVA = virtual address, lkey 0. Counts maps and unmaps so tests can check
/// that every region is unregistered.
#[derive(Debug, Default)]
pub struct IdentityMapper {
    maps: AtomicU64,
    unmaps: AtomicU64,
}

impl IdentityMapper {
    /// A new mapper with zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of successful `map` calls.
    pub fn maps(&self) -> u64 {
        self.maps.load(Ordering::Relaxed)
    }

    /// Number of successful `unmap` calls.
    pub fn unmaps(&self) -> u64 {
        self.unmaps.load(Ordering::Relaxed)
    }
}

impl DmaMapper for IdentityMapper {
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError> {
        self.maps.fetch_add(1, Ordering::Relaxed);
        Ok(DmaMapping {
            iova: va as u64,
            len,
            lkey: 0,
        })
    }

    fn unmap(&self, _va: usize, _mapping: &DmaMapping) -> Result<(), DmaError> {
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

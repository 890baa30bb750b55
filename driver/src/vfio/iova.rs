//! IOVA space: the usable ranges the IOMMU reports, and an allocator that
//! hands out naturally aligned pieces of them.
//!
//! `VFIO_IOMMU_GET_INFO` returns a `vfio_iommu_type1_info` followed by a
//! chain of capabilities; [`IommuInfo::parse`] reads the IOVA-range and
//! DMA-available capabilities from those bytes. Kernels without the IOVA
//! capability get the legacy x86 ranges ([`LEGACY_RANGES`]), which leave out
//! the MSI window at 0xfee0_0000.

#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;

/// Lowest IOVA ever handed out: nothing is mapped at IOVA 0 or its
/// neighbourhood, so a zero or small DMA address is always a bug that the
/// IOMMU catches.
pub const IOVA_FLOOR: u64 = 0x1_0000;

/// Largest alignment the allocator uses: the largest IOMMU page (1 GiB);
/// aligning bigger ranges further buys nothing.
pub const MAX_NATURAL_ALIGN: u64 = 1 << 30;

/// Ranges used when the kernel does not report any (inclusive bounds):
/// everything from 64 KiB to 2^39-1 except the x86 MSI window.
pub const LEGACY_RANGES: [IovaRange; 2] = [
    IovaRange {
        start: 0x1_0000,
        last: 0xfedf_ffff,
    },
    IovaRange {
        start: 0xfef0_0000,
        last: (1 << 39) - 1,
    },
];

/// An inclusive IOVA range, as the kernel reports it (`start..=last`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IovaRange {
    /// First usable IOVA.
    pub start: u64,
    /// Last usable IOVA (inclusive).
    pub last: u64,
}

impl IovaRange {
    /// Bytes in the range (saturating at `u64::MAX` for the full space).
    pub fn len(&self) -> u64 {
        (self.last - self.start).saturating_add(1)
    }

    /// Never empty: `last >= start` by construction.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// True if `[iova, iova+len)` lies inside.
    pub fn contains(&self, iova: u64, len: u64) -> bool {
        len > 0 && iova >= self.start && iova.checked_add(len - 1).is_some_and(|e| e <= self.last)
    }
}

impl fmt::Display for IovaRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}, {:#x}]", self.start, self.last)
    }
}

/// What `VFIO_IOMMU_GET_INFO` says about the container's IOMMU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IommuInfo {
    /// Bitmap of supported IOMMU page sizes (bit n = 2^n bytes).
    pub pgsizes: u64,
    /// Usable IOVA ranges, sorted.
    pub ranges: Vec<IovaRange>,
    /// True if the ranges came from the kernel's IOVA-range capability,
    /// false if they are [`LEGACY_RANGES`].
    pub ranges_from_kernel: bool,
    /// Mappings the container may still create (`DMA_AVAIL` capability).
    pub dma_avail: Option<u32>,
}

/// Why a `VFIO_IOMMU_GET_INFO` answer is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed VFIO_IOMMU_GET_INFO answer: {0}")]
pub struct InfoParseError(pub String);

const INFO_LEN: usize = 24; // struct vfio_iommu_type1_info
const FLAG_PGSIZES: u32 = vfio_bindings::bindings::vfio::VFIO_IOMMU_INFO_PGSIZES;
const FLAG_CAPS: u32 = vfio_bindings::bindings::vfio::VFIO_IOMMU_INFO_CAPS;
const CAP_IOVA_RANGE: u16 =
    vfio_bindings::bindings::vfio::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u16;
const CAP_DMA_AVAIL: u16 = vfio_bindings::bindings::vfio::VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL as u16;
/// Bound on the capability chain walk (the kernel defines three).
const MAX_CAPS: usize = 32;

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

impl IommuInfo {
    /// Parses the bytes the kernel filled in (native endian, as ioctls are).
    pub fn parse(buf: &[u8]) -> Result<IommuInfo, InfoParseError> {
        let short = || InfoParseError(format!("{} bytes, shorter than the header", buf.len()));
        let flags = u32_at(buf, 4).ok_or_else(short)?;
        let pgsizes = if flags & FLAG_PGSIZES != 0 {
            u64_at(buf, 8).ok_or_else(short)?
        } else {
            4096
        };
        let mut info = IommuInfo {
            pgsizes,
            ranges: Vec::new(),
            ranges_from_kernel: false,
            dma_avail: None,
        };
        let cap_offset = if flags & FLAG_CAPS != 0 && buf.len() >= INFO_LEN {
            u32_at(buf, 16).ok_or_else(short)? as usize
        } else {
            0
        };
        let mut offset = cap_offset;
        let mut seen = 0;
        while offset != 0 {
            seen += 1;
            if seen > MAX_CAPS {
                return Err(InfoParseError(format!(
                    "more than {MAX_CAPS} capabilities (a loop?)"
                )));
            }
            if offset < INFO_LEN || offset % 4 != 0 {
                return Err(InfoParseError(format!("capability at bad offset {offset}")));
            }
            let id = u16_at(buf, offset).ok_or_else(|| {
                InfoParseError(format!("capability header at {offset} past the end"))
            })?;
            let next = u32_at(buf, offset + 4).unwrap_or(0) as usize;
            match id {
                CAP_IOVA_RANGE => {
                    let count = u32_at(buf, offset + 8).ok_or_else(|| {
                        InfoParseError(format!("IOVA-range capability at {offset} truncated"))
                    })? as usize;
                    for i in 0..count {
                        let at = offset + 16 + i * 16;
                        let (Some(start), Some(last)) = (u64_at(buf, at), u64_at(buf, at + 8))
                        else {
                            return Err(InfoParseError(format!(
                                "IOVA range {i} of {count} lies past the end ({} bytes)",
                                buf.len()
                            )));
                        };
                        if last < start {
                            return Err(InfoParseError(format!(
                                "IOVA range {i} ends ({last:#x}) before it starts ({start:#x})"
                            )));
                        }
                        info.ranges.push(IovaRange { start, last });
                    }
                    info.ranges_from_kernel = true;
                }
                CAP_DMA_AVAIL => info.dma_avail = u32_at(buf, offset + 8),
                _ => {}
            }
            if next != 0 && next <= offset {
                return Err(InfoParseError(format!(
                    "capability chain goes backwards ({offset} -> {next})"
                )));
            }
            offset = next;
        }
        if !info.ranges_from_kernel {
            info.ranges = LEGACY_RANGES.to_vec();
        }
        info.ranges.sort_by_key(|r| r.start);
        Ok(info)
    }

    /// Smallest IOMMU page size at or above 4 KiB.
    pub fn min_page(&self) -> u64 {
        let usable = self.pgsizes & !0xfff;
        if usable == 0 {
            4096
        } else {
            1 << usable.trailing_zeros()
        }
    }
}

/// First-fit allocator of naturally aligned IOVA ranges.
///
/// Free space is a map from start to inclusive end, coalesced on free. A
/// request of `len` bytes is aligned to `len` rounded up to a power of two
/// (at least the IOMMU page, at most [`MAX_NATURAL_ALIGN`]), so that a 2 MiB
/// hugepage lands on a 2 MiB IOVA boundary and the IOMMU can use one large
/// page for it.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    free: BTreeMap<u64, u64>,
    page: u64,
    limit: u64,
}

impl IovaAllocator {
    /// Space from `ranges` (above [`IOVA_FLOOR`]), in units of `page` bytes.
    pub fn new(ranges: &[IovaRange], page: u64) -> IovaAllocator {
        assert!(
            page.is_power_of_two() && page >= 4096,
            "IOMMU page {page:#x}"
        );
        let mut alloc = IovaAllocator {
            free: BTreeMap::new(),
            page,
            limit: u64::MAX,
        };
        for r in ranges {
            let start = r.start.max(IOVA_FLOOR).next_multiple_of(page);
            // First byte past the last whole page of the range.
            let end = r.last.saturating_add(1) & !(page - 1);
            if end > start {
                alloc.insert(start, end - 1);
            }
        }
        alloc
    }

    /// New allocations end at or below `limit` (exclusive), e.g. for a
    /// device with a narrow DMA mask. Existing allocations are unaffected.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// The exclusive upper bound of new allocations.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The alignment used for a request of `len` bytes.
    pub fn natural_align(&self, len: u64) -> u64 {
        len.checked_next_power_of_two()
            .unwrap_or(MAX_NATURAL_ALIGN)
            .clamp(self.page, MAX_NATURAL_ALIGN)
    }

    /// Allocates `len` bytes (a multiple of the page) at its natural
    /// alignment; `None` if no free range fits.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        if len == 0 || !len.is_multiple_of(self.page) {
            return None;
        }
        let align = self.natural_align(len);
        let mut hit = None;
        for (&start, &last) in &self.free {
            let Some(at) = start.checked_next_multiple_of(align) else {
                continue;
            };
            let Some(end) = at.checked_add(len) else {
                continue;
            };
            if end > self.limit {
                break; // ranges are sorted: later ones lie higher still
            }
            if end - 1 <= last {
                hit = Some((start, last, at));
                break;
            }
        }
        let (start, last, at) = hit?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - 1);
        }
        if at + len - 1 < last {
            self.free.insert(at + len, last);
        }
        Some(at)
    }

    /// Takes `[iova, iova+len)` out of the free space; false if any of it is
    /// not free.
    pub fn reserve(&mut self, iova: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let Some(end) = iova.checked_add(len - 1) else {
            return false;
        };
        let Some((&start, &last)) = self.free.range(..=iova).next_back() else {
            return false;
        };
        if end > last {
            return false;
        }
        self.free.remove(&start);
        if iova > start {
            self.free.insert(start, iova - 1);
        }
        if end < last {
            self.free.insert(end + 1, last);
        }
        true
    }

    /// Returns `[iova, iova+len)` to the free space, merging neighbours.
    ///
    /// # Panics
    /// If any of it is already free (a double free is a bookkeeping bug).
    pub fn free(&mut self, iova: u64, len: u64) {
        assert!(len > 0, "freeing an empty IOVA range at {iova:#x}");
        self.insert(iova, iova + len - 1);
    }

    fn insert(&mut self, mut start: u64, mut last: u64) {
        if let Some((&ps, &pl)) = self.free.range(..=last).next_back() {
            assert!(
                pl < start || ps > last,
                "IOVA [{start:#x}, {last:#x}] overlaps free range [{ps:#x}, {pl:#x}]"
            );
            if pl.checked_add(1) == Some(start) {
                self.free.remove(&ps);
                start = ps;
            }
        }
        if let Some(ns) = last.checked_add(1)
            && let Some(nl) = self.free.remove(&ns)
        {
            last = nl;
        }
        self.free.insert(start, last);
    }

    /// Free bytes in total.
    pub fn free_bytes(&self) -> u64 {
        self.free
            .iter()
            .map(|(s, l)| (l - s).saturating_add(1))
            .fold(0, u64::saturating_add)
    }

    /// Size of the largest free range.
    pub fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .map(|(s, l)| (l - s).saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// The free ranges, sorted.
    pub fn free_ranges(&self) -> Vec<IovaRange> {
        self.free
            .iter()
            .map(|(&start, &last)| IovaRange { start, last })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn info_bytes(flags: u32, pgsizes: u64, caps: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut buf = vec![0u8; INFO_LEN];
        buf[4..8].copy_from_slice(&flags.to_ne_bytes());
        buf[8..16].copy_from_slice(&pgsizes.to_ne_bytes());
        let mut offset = INFO_LEN;
        if !caps.is_empty() {
            buf[16..20].copy_from_slice(&(offset as u32).to_ne_bytes());
        }
        for (i, (id, body)) in caps.iter().enumerate() {
            let len = 8 + body.len();
            let next = if i + 1 < caps.len() { offset + len } else { 0 };
            buf.extend_from_slice(&id.to_ne_bytes());
            buf.extend_from_slice(&1u16.to_ne_bytes());
            buf.extend_from_slice(&(next as u32).to_ne_bytes());
            buf.extend_from_slice(body);
            offset += len;
        }
        let argsz = buf.len() as u32;
        buf[0..4].copy_from_slice(&argsz.to_ne_bytes());
        buf
    }

    fn range_cap(ranges: &[(u64, u64)]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&(ranges.len() as u32).to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        for (s, e) in ranges {
            body.extend_from_slice(&s.to_ne_bytes());
            body.extend_from_slice(&e.to_ne_bytes());
        }
        body
    }

    #[test]
    fn parses_the_iova_range_and_dma_avail_capabilities() {
        // What an Intel IOMMU guest reports: everything but the MSI window.
        let buf = info_bytes(
            FLAG_PGSIZES | FLAG_CAPS,
            0x4020_1000,
            &[
                (
                    CAP_IOVA_RANGE,
                    range_cap(&[(0xfef0_0000, (1 << 48) - 1), (0, 0xfedf_ffff)]),
                ),
                (CAP_DMA_AVAIL, 65535u32.to_ne_bytes().to_vec()),
            ],
        );
        let info = IommuInfo::parse(&buf).unwrap();
        assert!(info.ranges_from_kernel);
        assert_eq!(info.pgsizes, 0x4020_1000);
        assert_eq!(info.min_page(), 4096);
        assert_eq!(info.dma_avail, Some(65535));
        assert_eq!(
            info.ranges,
            [
                IovaRange {
                    start: 0,
                    last: 0xfedf_ffff
                },
                IovaRange {
                    start: 0xfef0_0000,
                    last: (1 << 48) - 1
                }
            ]
        );
    }

    #[test]
    fn falls_back_to_legacy_ranges_without_the_capability() {
        let info = IommuInfo::parse(&info_bytes(0, 0, &[])).unwrap();
        assert!(!info.ranges_from_kernel);
        assert_eq!(info.ranges, LEGACY_RANGES);
        assert_eq!(info.min_page(), 4096);
        let info =
            IommuInfo::parse(&info_bytes(FLAG_PGSIZES, 0x20_0000 | 0x4000_0000, &[])).unwrap();
        assert_eq!(info.min_page(), 0x20_0000);
    }

    #[test]
    fn rejects_malformed_chains() {
        assert!(IommuInfo::parse(&[0u8; 6]).is_err());
        // Chain pointing at itself.
        let mut buf = info_bytes(FLAG_CAPS, 0, &[(CAP_DMA_AVAIL, vec![0; 4])]);
        buf[INFO_LEN + 4..INFO_LEN + 8].copy_from_slice(&(INFO_LEN as u32).to_ne_bytes());
        let err = IommuInfo::parse(&buf).unwrap_err();
        assert!(err.0.contains("backwards"), "{err}");
        // Range count larger than the buffer.
        let mut body = range_cap(&[(0, 0xffff)]);
        body[0..4].copy_from_slice(&5u32.to_ne_bytes());
        let err =
            IommuInfo::parse(&info_bytes(FLAG_CAPS, 0, &[(CAP_IOVA_RANGE, body)])).unwrap_err();
        assert!(err.0.contains("past the end"), "{err}");
        // Inverted range.
        let body = range_cap(&[(0x2000, 0x1000)]);
        assert!(IommuInfo::parse(&info_bytes(FLAG_CAPS, 0, &[(CAP_IOVA_RANGE, body)])).is_err());
        // Capability offset inside the header.
        let mut buf = info_bytes(FLAG_CAPS, 0, &[(CAP_DMA_AVAIL, vec![0; 4])]);
        buf[16..20].copy_from_slice(&8u32.to_ne_bytes());
        assert!(IommuInfo::parse(&buf).is_err());
    }

    #[test]
    fn allocations_are_naturally_aligned_and_skip_the_floor_and_holes() {
        let mut a = IovaAllocator::new(&LEGACY_RANGES, 4096);
        let first = a.alloc(4096).unwrap();
        assert_eq!(first, IOVA_FLOOR);
        let huge = a.alloc(2 * MIB).unwrap();
        assert_eq!(huge % (2 * MIB), 0);
        assert!(huge >= IOVA_FLOOR + 4096);
        let odd = a.alloc(3 * 4096).unwrap();
        assert_eq!(odd % (4 * 4096), 0);
        // A 1 GiB request is 1 GiB aligned; a 3 GiB one too (capped).
        let g = a.alloc(1 << 30).unwrap();
        assert_eq!(g % (1 << 30), 0);
        let g3 = a.alloc(3 << 30).unwrap();
        assert_eq!(g3 % (1 << 30), 0);
        // Nothing lands in the MSI window.
        for r in [first, huge, odd, g, g3] {
            assert!(!(0xfee0_0000..0xfef0_0000).contains(&r));
        }
    }

    #[test]
    fn never_crosses_a_hole_between_ranges() {
        let ranges = [
            IovaRange {
                start: 0,
                last: 4 * MIB - 1,
            },
            IovaRange {
                start: 5 * MIB,
                last: 9 * MIB - 1,
            },
        ];
        let mut a = IovaAllocator::new(&ranges, 4096);
        // 2 MiB at 2 MiB fits in the first range (the floor rules out 0).
        assert_eq!(a.alloc(2 * MIB), Some(2 * MIB));
        // The next 2 MiB-aligned slot is 6 MiB, in the second range.
        assert_eq!(a.alloc(2 * MIB), Some(6 * MIB));
        // 4 MiB needs 4 MiB alignment: 8 MiB would cross the end: none.
        assert_eq!(a.alloc(4 * MIB), None);
    }

    #[test]
    fn free_coalesces_and_space_is_conserved() {
        let ranges = [IovaRange {
            start: 0,
            last: 64 * MIB - 1,
        }];
        let mut a = IovaAllocator::new(&ranges, 4096);
        let total = a.free_bytes();
        assert_eq!(total, 64 * MIB - IOVA_FLOOR);
        let mut got = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pages = 1 + seed % 300;
            if seed.is_multiple_of(3) && !got.is_empty() {
                let (iova, len) = got.swap_remove((seed as usize / 3) % got.len());
                a.free(iova, len);
            } else if let Some(iova) = a.alloc(pages * 4096) {
                // No overlap with anything live.
                for &(o, ol) in &got {
                    assert!(iova + pages * 4096 <= o || o + ol <= iova);
                }
                got.push((iova, pages * 4096));
            }
            let live: u64 = got.iter().map(|g| g.1).sum();
            assert_eq!(a.free_bytes() + live, total);
        }
        for (iova, len) in got.drain(..) {
            a.free(iova, len);
        }
        assert_eq!(
            a.free_ranges(),
            [IovaRange {
                start: IOVA_FLOOR,
                last: 64 * MIB - 1
            }]
        );
    }

    #[test]
    fn limit_and_reserve() {
        let mut a = IovaAllocator::new(&LEGACY_RANGES, 4096);
        a.set_limit(256 * MIB);
        let mut n = 0;
        while let Some(iova) = a.alloc(2 * MIB) {
            assert!(iova + 2 * MIB <= 256 * MIB);
            n += 1;
        }
        assert_eq!(n, 127); // 2 MiB .. 256 MiB
        a.set_limit(u64::MAX);
        assert!(a.reserve(0x1_0000_0000, 4096));
        assert!(!a.reserve(0x1_0000_0000, 4096), "already taken");
        assert!(
            !a.reserve(0xfee0_0000, 4096),
            "MSI window is not free space"
        );
        a.free(0x1_0000_0000, 4096);
        assert!(a.reserve(0x1_0000_0000, 8192));
    }

    #[test]
    #[should_panic(expected = "overlaps free range")]
    fn double_free_panics() {
        let mut a = IovaAllocator::new(&LEGACY_RANGES, 4096);
        let iova = a.alloc(4096).unwrap();
        a.free(iova, 4096);
        a.free(iova, 4096);
    }

    #[test]
    fn rejects_unaligned_or_empty_requests() {
        let mut a = IovaAllocator::new(&LEGACY_RANGES, 4096);
        assert_eq!(a.alloc(0), None);
        assert_eq!(a.alloc(100), None);
    }
}

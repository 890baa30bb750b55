//! The VFIO container: one IOMMU address space shared by the groups attached
//! to it. It owns the IOVA allocator and implements [`mempool::DmaMapper`],
//! so hugepage regions register with it directly.

#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use mempool::{DmaError, DmaMapper, DmaMapping, HugepageRegion, RegionOptions};
use vfio_bindings::bindings::vfio::{VFIO_API_VERSION, VFIO_TYPE1v2_IOMMU};

use super::error::dma_map_hint;
use super::group::Group;
use super::iova::{IommuInfo, IovaAllocator};
use super::{VfioError, sys};

/// One live DMA mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LiveMapping {
    /// Device-visible address.
    pub iova: u64,
    /// Virtual address.
    pub va: usize,
    /// Bytes.
    pub len: usize,
}

#[derive(Debug)]
enum Fd {
    Real(File),
    #[cfg(test)]
    Fake(Arc<tests::FakeIommu>),
}

#[derive(Debug)]
struct State {
    iommu: Option<IommuInfo>,
    alloc: Option<IovaAllocator>,
    limit: u64,
    mappings: BTreeMap<u64, LiveMapping>,
    groups: Vec<Arc<Group>>,
}

/// A VFIO container (`/dev/vfio/vfio`) with the type1v2 IOMMU.
///
/// Groups attached with [`Container::attach`] stay attached (and open) for
/// the container's lifetime, so DMA mappings never outlive their IOMMU
/// domain: regions hold the container through their `Arc<dyn DmaMapper>`.
#[derive(Debug)]
pub struct Container {
    path: PathBuf,
    fd: Fd,
    state: Mutex<State>,
}

impl Container {
    /// Default container node.
    pub const DEFAULT_PATH: &'static str = "/dev/vfio/vfio";

    /// Opens the container at `path` and checks the API version and type1v2
    /// support.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<Container>, VfioError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::PermissionDenied => VfioError::Permission {
                    path: path.clone(),
                    source,
                },
                _ => VfioError::ContainerUnavailable {
                    path: path.clone(),
                    source,
                },
            })?;
        let version = sys::api_version(file.as_fd()).map_err(|source| VfioError::Ioctl {
            op: "VFIO_GET_API_VERSION",
            target: format!("container {}", path.display()),
            source,
        })?;
        if version != VFIO_API_VERSION as i32 {
            return Err(VfioError::ApiVersion {
                path,
                got: version,
                want: VFIO_API_VERSION,
            });
        }
        let has_v2 = sys::check_extension(file.as_fd(), VFIO_TYPE1v2_IOMMU).map_err(|source| {
            VfioError::Ioctl {
                op: "VFIO_CHECK_EXTENSION",
                target: format!("container {}", path.display()),
                source,
            }
        })?;
        if has_v2 != 1 {
            return Err(VfioError::NoType1v2 { path });
        }
        Ok(Arc::new(Container {
            path,
            fd: Fd::Real(file),
            state: Mutex::new(State {
                iommu: None,
                alloc: None,
                limit: u64::MAX,
                mappings: BTreeMap::new(),
                groups: Vec::new(),
            }),
        }))
    }

    /// The container node.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the bookkeeping consistent
        // (every update is a single insert or remove), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `group` to the container. The first group selects the type1v2
    /// IOMMU and reads the usable IOVA ranges.
    pub fn attach(&self, group: Group) -> Result<Arc<Group>, VfioError> {
        // Irrefutable outside unit tests, which have a fake fd and no groups.
        #[allow(clippy::infallible_destructuring_match)]
        let file = match &self.fd {
            Fd::Real(file) => file,
            #[cfg(test)]
            Fd::Fake(_) => unreachable!("test containers have no groups"),
        };
        let mut state = self.state();
        let target = || format!("group {}", group.path().display());
        sys::group_set_container(group.fd(), file.as_fd()).map_err(|source| VfioError::Ioctl {
            op: "VFIO_GROUP_SET_CONTAINER",
            target: target(),
            source,
        })?;
        if state.iommu.is_none() {
            sys::set_iommu(file.as_fd(), VFIO_TYPE1v2_IOMMU).map_err(|source| {
                VfioError::Ioctl {
                    op: "VFIO_SET_IOMMU(TYPE1v2)",
                    target: format!("container {}", self.path.display()),
                    source,
                }
            })?;
            let raw = sys::iommu_info(file.as_fd()).map_err(|source| VfioError::Ioctl {
                op: "VFIO_IOMMU_GET_INFO",
                target: format!("container {}", self.path.display()),
                source,
            })?;
            let info = IommuInfo::parse(&raw).map_err(|e| VfioError::Ioctl {
                op: "VFIO_IOMMU_GET_INFO",
                target: format!("container {}", self.path.display()),
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            })?;
            tracing::debug!(
                container = %self.path.display(),
                ranges = ?info.ranges,
                pgsizes = format_args!("{:#x}", info.pgsizes),
                "type1v2 IOMMU selected"
            );
            let mut alloc = IovaAllocator::new(&info.ranges, info.min_page());
            alloc.set_limit(state.limit);
            state.alloc = Some(alloc);
            state.iommu = Some(info);
        }
        let group = Arc::new(group);
        state.groups.push(group.clone());
        Ok(group)
    }

    /// What the IOMMU reported (`None` before the first group is attached).
    pub fn iommu_info(&self) -> Option<IommuInfo> {
        self.state().iommu.clone()
    }

    /// Groups attached so far.
    pub fn groups(&self) -> Vec<Arc<Group>> {
        self.state().groups.clone()
    }

    /// Limits new IOVAs to end at or below `limit` (exclusive), for devices
    /// with a narrow DMA mask.
    pub fn set_iova_limit(&self, limit: u64) {
        let mut state = self.state();
        state.limit = limit;
        if let Some(alloc) = state.alloc.as_mut() {
            alloc.set_limit(limit);
        }
    }

    /// Live mappings, by IOVA.
    pub fn mappings(&self) -> Vec<LiveMapping> {
        self.state().mappings.values().copied().collect()
    }

    /// The live mapping that contains `[iova, iova+len)`, if any.
    pub fn lookup(&self, iova: u64, len: usize) -> Option<LiveMapping> {
        let state = self.state();
        let (_, m) = state.mappings.range(..=iova).next_back()?;
        let end = iova.checked_add(len as u64)?;
        (end <= m.iova + m.len as u64).then_some(*m)
    }

    /// Maps `[va, va+len)` at a fresh, naturally aligned IOVA.
    ///
    /// This is [`DmaMapper::map`] with the typed error.
    ///
    /// # Safety
    /// As for [`DmaMapper::map`]: the device may read and write the range
    /// until it is unmapped, so it must be memory the caller owns and keeps
    /// allocated until then (`HugepageRegion` does this).
    #[allow(unsafe_code)] // an unsafe contract, forwarded from DmaMapper::map
    pub unsafe fn map_dma(&self, va: usize, len: usize) -> Result<DmaMapping, VfioError> {
        let mut state = self.state();
        let page = state
            .iommu
            .as_ref()
            .map(IommuInfo::min_page)
            .ok_or_else(|| VfioError::ContainerNotReady {
                path: self.path.clone(),
            })?;
        if len == 0 || !(va as u64).is_multiple_of(page) || !(len as u64).is_multiple_of(page) {
            return Err(VfioError::BadDmaRange { va, len, page });
        }
        let alloc = state
            .alloc
            .as_mut()
            .expect("allocator exists once the IOMMU is set");
        let Some(iova) = alloc.alloc(len as u64) else {
            return Err(VfioError::IovaExhausted {
                len: len as u64,
                align: alloc.natural_align(len as u64),
                limit: alloc.limit(),
                free_bytes: alloc.free_bytes(),
                largest: alloc.largest_free(),
            });
        };
        let result = match &self.fd {
            // SAFETY: the DmaMapper contract: the caller keeps `[va, va+len)`
            // allocated and locked until it is unmapped (HugepageRegion
            // unmaps before it releases its memory).
            #[allow(unsafe_code)]
            Fd::Real(file) => unsafe { sys::map_dma(file.as_fd(), va, iova, len) },
            #[cfg(test)]
            Fd::Fake(fake) => fake.map(va, iova, len),
        };
        if let Err(source) = result {
            alloc.free(iova, len as u64);
            let hint = dma_map_hint(&source);
            return Err(VfioError::DmaMap {
                va,
                iova,
                len,
                source,
                hint,
            });
        }
        state.mappings.insert(iova, LiveMapping { iova, va, len });
        tracing::debug!(
            va = format_args!("{va:#x}"),
            iova = format_args!("{iova:#x}"),
            len,
            "DMA mapped"
        );
        Ok(DmaMapping { iova, len, lkey: 0 })
    }

    /// Unmaps a mapping made by [`Container::map_dma`] and frees its IOVA.
    pub fn unmap_dma(&self, va: usize, iova: u64, len: usize) -> Result<(), VfioError> {
        let mut state = self.state();
        match state.mappings.get(&iova) {
            Some(m) if m.len == len && m.va == va => {}
            _ => return Err(VfioError::IovaNotMapped { iova, len, va }),
        }
        let result = match &self.fd {
            Fd::Real(file) => sys::unmap_dma(file.as_fd(), iova, len),
            #[cfg(test)]
            Fd::Fake(fake) => fake.unmap(iova, len),
        };
        let unmapped = result.map_err(|source| VfioError::DmaUnmap { iova, len, source })?;
        state.mappings.remove(&iova);
        if unmapped != len as u64 {
            // The kernel's view differs from ours: keep the IOVA out of the
            // allocator rather than hand out an address in an unknown state.
            return Err(VfioError::UnmapSizeMismatch {
                iova,
                len,
                unmapped,
            });
        }
        if let Some(alloc) = state.alloc.as_mut() {
            alloc.free(iova, len as u64);
        }
        Ok(())
    }

    /// Reserves a hugepage region of `bytes` (a multiple of 2 MiB) and maps
    /// it for DMA. Missing hugepages give [`VfioError::Region`], whose
    /// message says how many to reserve.
    pub fn dma_region(self: &Arc<Self>, bytes: usize) -> Result<HugepageRegion, VfioError> {
        let mut region = HugepageRegion::reserve(bytes, RegionOptions::default())?;
        region.register(self.clone() as Arc<dyn DmaMapper>)?;
        Ok(region)
    }
}

fn dma_error(op: &'static str, va: usize, iova: u64, len: usize, err: VfioError) -> DmaError {
    DmaError {
        op,
        va,
        iova,
        len,
        source: Box::new(err),
    }
}

impl DmaMapper for Container {
    #[allow(unsafe_code)] // the DmaMapper contract
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError> {
        // SAFETY: forwarded obligation (same contract).
        unsafe { self.map_dma(va, len) }.map_err(|e| {
            let iova = match &e {
                VfioError::DmaMap { iova, .. } => *iova,
                _ => 0,
            };
            dma_error("map", va, iova, len, e)
        })
    }

    fn unmap(&self, va: usize, mapping: &DmaMapping) -> Result<(), DmaError> {
        self.unmap_dma(va, mapping.iova, mapping.len)
            .map_err(|e| dma_error("unmap", va, mapping.iova, mapping.len, e))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let state = self.state();
        if !state.mappings.is_empty() {
            tracing::debug!(
                container = %self.path.display(),
                live = state.mappings.len(),
                "closing a container with live mappings; the kernel removes them"
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::vfio::iova::{IOVA_FLOOR, IovaRange, LEGACY_RANGES};

    /// The test twin of the container ioctls: an IOMMU page table in a map,
    /// with error injection.
    #[derive(Debug, Default)]
    pub(crate) struct FakeIommu {
        table: Mutex<BTreeMap<u64, (usize, usize)>>,
        fail_next_map: Mutex<Option<i32>>,
    }

    impl FakeIommu {
        pub(crate) fn map(&self, va: usize, iova: u64, len: usize) -> io::Result<()> {
            if let Some(errno) = self.fail_next_map.lock().unwrap().take() {
                return Err(io::Error::from_raw_os_error(errno));
            }
            let mut t = self.table.lock().unwrap();
            for (&i, &(_, l)) in t.iter() {
                if iova < i + l as u64 && i < iova + len as u64 {
                    return Err(io::Error::from_raw_os_error(libc::EEXIST));
                }
            }
            t.insert(iova, (va, len));
            Ok(())
        }

        pub(crate) fn unmap(&self, iova: u64, len: usize) -> io::Result<u64> {
            // type1v2 unmaps whole mappings inside the range; none is not an error.
            let mut t = self.table.lock().unwrap();
            match t.get(&iova) {
                Some(&(_, l)) if l == len => {
                    t.remove(&iova);
                    Ok(len as u64)
                }
                Some(_) => Err(io::Error::from_raw_os_error(libc::EINVAL)),
                None => Ok(0),
            }
        }
    }

    fn fake(ranges: &[IovaRange]) -> (Arc<Container>, Arc<FakeIommu>) {
        let iommu = Arc::new(FakeIommu::default());
        let info = IommuInfo {
            pgsizes: 0x4020_1000,
            ranges: ranges.to_vec(),
            ranges_from_kernel: true,
            dma_avail: None,
        };
        let c = Container {
            path: "/fake/vfio".into(),
            fd: Fd::Fake(iommu.clone()),
            state: Mutex::new(State {
                alloc: Some(IovaAllocator::new(&info.ranges, info.min_page())),
                iommu: Some(info),
                limit: u64::MAX,
                mappings: BTreeMap::new(),
                groups: Vec::new(),
            }),
        };
        (Arc::new(c), iommu)
    }

    const MIB: usize = 1 << 20;

    /// Maps on the fake IOMMU: no device exists, so nothing ever accesses
    /// these (made-up) addresses.
    #[allow(unsafe_code)]
    fn map(c: &Container, va: usize, len: usize) -> Result<DmaMapping, VfioError> {
        // SAFETY: a fake container has no device behind it.
        unsafe { c.map_dma(va, len) }
    }

    #[test]
    fn maps_at_aligned_iovas_and_unmaps() {
        let (c, iommu) = fake(&LEGACY_RANGES);
        let a = map(&c, 0x7f00_0020_0000, 2 * MIB).unwrap();
        assert_eq!(a.iova % (2 * MIB as u64), 0);
        assert!(a.iova >= IOVA_FLOOR);
        let b = map(&c, 0x7f00_0000_1000, 4096).unwrap();
        assert_ne!(a.iova, b.iova);
        assert_eq!(iommu.table.lock().unwrap().len(), 2);
        assert_eq!(c.lookup(a.iova + 4096, 64).unwrap().va, 0x7f00_0020_0000);
        assert!(
            c.lookup(a.iova + 2 * MIB as u64 - 8, 64).is_none(),
            "crosses the end"
        );
        c.unmap_dma(0x7f00_0020_0000, a.iova, 2 * MIB).unwrap();
        c.unmap_dma(0x7f00_0000_1000, b.iova, 4096).unwrap();
        assert!(iommu.table.lock().unwrap().is_empty());
        assert!(c.mappings().is_empty());
        // The space is reused.
        let again = map(&c, 0x7f00_0020_0000, 2 * MIB).unwrap();
        assert_eq!(again.iova, a.iova);
    }

    #[test]
    fn a_failed_map_names_everything_and_returns_the_iova() {
        let (c, iommu) = fake(&LEGACY_RANGES);
        *iommu.fail_next_map.lock().unwrap() = Some(libc::ENOMEM);
        let err = map(&c, 0x7f00_0020_0000, 2 * MIB).unwrap_err();
        let VfioError::DmaMap { iova, len, va, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!((*va, *len), (0x7f00_0020_0000, 2 * MIB));
        let text = err.to_string();
        for needle in [
            "0x7f0000200000",
            "0x200000 bytes",
            &format!("IOVA {iova:#x}"),
            "ulimit -l",
        ] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
        // The IOVA went back: the next map gets the same address.
        let ok = map(&c, 0x7f00_0020_0000, 2 * MIB).unwrap();
        assert_eq!(ok.iova, *iova);
    }

    #[test]
    fn unmapping_what_is_not_mapped_is_a_typed_error() {
        let (c, _) = fake(&LEGACY_RANGES);
        let m = map(&c, 0x40_0000, 4096).unwrap();
        let err = c.unmap_dma(0x40_0000, m.iova + 4096, 4096).unwrap_err();
        assert!(matches!(err, VfioError::IovaNotMapped { .. }), "{err:?}");
        let err = c.unmap_dma(0x40_0000, m.iova, 8192).unwrap_err();
        assert!(
            matches!(err, VfioError::IovaNotMapped { len: 8192, .. }),
            "{err:?}"
        );
        c.unmap_dma(0x40_0000, m.iova, 4096).unwrap();
        let err = c.unmap_dma(0x40_0000, m.iova, 4096).unwrap_err();
        assert!(err.to_string().contains("is not mapped"), "{err}");
    }

    #[test]
    fn misaligned_ranges_and_exhaustion_are_reported() {
        let (c, _) = fake(&[IovaRange {
            start: 0,
            last: 4 * MIB as u64 - 1,
        }]);
        let err = map(&c, 0x1234, 4096).unwrap_err();
        assert!(matches!(err, VfioError::BadDmaRange { .. }), "{err:?}");
        map(&c, 0x20_0000, 2 * MIB).unwrap();
        let err = map(&c, 0x40_0000, 2 * MIB).unwrap_err();
        let VfioError::IovaExhausted { len, align, .. } = err else {
            panic!("{err:?}");
        };
        assert_eq!((len, align), (2 * MIB as u64, 2 * MIB as u64));
    }

    #[test]
    fn the_iova_limit_applies_to_new_mappings() {
        let (c, _) = fake(&LEGACY_RANGES);
        c.set_iova_limit(8 * MIB as u64);
        let mut n = 0;
        while let Ok(m) = map(&c, 0x7f00_0000_0000 + n * 2 * MIB, 2 * MIB) {
            assert!(m.iova + 2 * MIB as u64 <= 8 * MIB as u64);
            n += 1;
        }
        assert_eq!(n, 3); // 2, 4 and 6 MiB
    }

    #[test]
    fn registers_mempool_regions_through_dma_mapper() {
        let (c, iommu) = fake(&LEGACY_RANGES);
        let opts = RegionOptions {
            fallback: mempool::Fallback::SmallPages,
            ..RegionOptions::default()
        };
        let mut region = HugepageRegion::reserve(2 * MIB, opts).unwrap();
        let m = region.register(c.clone() as Arc<dyn DmaMapper>).unwrap();
        assert_eq!(m.iova % (2 * MIB as u64), 0);
        assert_eq!(region.iova_of(region.va() + 100), Some(m.iova + 100));
        assert_eq!(
            iommu.table.lock().unwrap().get(&m.iova),
            Some(&(region.va(), 2 * MIB))
        );
        drop(region);
        assert!(iommu.table.lock().unwrap().is_empty(), "region drop unmaps");
        assert!(c.mappings().is_empty());
    }

    #[test]
    fn dma_mapper_errors_carry_the_vfio_error() {
        let (c, iommu) = fake(&LEGACY_RANGES);
        *iommu.fail_next_map.lock().unwrap() = Some(libc::EFAULT);
        #[allow(unsafe_code)]
        // SAFETY: a fake container has no device behind it.
        let err = unsafe { DmaMapper::map(&*c, 0x10_0000, 4096) }.unwrap_err();
        assert_eq!(err.op, "map");
        assert_ne!(err.iova, 0);
        let inner = err.source.downcast_ref::<VfioError>().unwrap();
        assert!(
            inner.to_string().contains("not mapped in this process"),
            "{inner}"
        );
    }
}

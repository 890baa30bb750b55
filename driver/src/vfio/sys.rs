//! Every system call of the VFIO layer that needs `unsafe`: the VFIO ioctls,
//! `mmap`/`munmap` of device regions, and volatile access to the mapped
//! device memory ([`Mmio`], the single choke point for BAR access).
//!
//! The structures come from `vfio-bindings` (rust-vmm's bindgen output of
//! `linux/vfio.h`); the ioctl numbers are `_IO(';', 100 + n)` as that header
//! defines them. Functions here return `io::Error`; callers add the BDF,
//! path, IOVA and length to make a [`super::VfioError`].
//!
//! Nothing here hands out a Rust reference into device memory: [`Mmio`]
//! only offers volatile loads and stores, through the `volatile` crate's
//! read-only and write-only pointers.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use volatile::VolatilePtr;
use volatile::access::WriteOnly;

use vfio_bindings::bindings::vfio::{
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, vfio_device_info, vfio_group_status,
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, vfio_irq_info, vfio_region_info,
};

const VFIO_TYPE: u64 = b';' as u64;
const VFIO_BASE: u64 = 100;

/// `_IO(VFIO_TYPE, VFIO_BASE + n)`: VFIO ioctls carry no size or direction bits.
const fn vfio_io(n: u64) -> u64 {
    (VFIO_TYPE << 8) | (VFIO_BASE + n)
}

const VFIO_GET_API_VERSION: u64 = vfio_io(0);
const VFIO_CHECK_EXTENSION: u64 = vfio_io(1);
const VFIO_SET_IOMMU: u64 = vfio_io(2);
const VFIO_GROUP_GET_STATUS: u64 = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: u64 = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: u64 = vfio_io(6);
const VFIO_DEVICE_GET_INFO: u64 = vfio_io(7);
const VFIO_DEVICE_GET_REGION_INFO: u64 = vfio_io(8);
const VFIO_DEVICE_GET_IRQ_INFO: u64 = vfio_io(9);
const VFIO_DEVICE_SET_IRQS: u64 = vfio_io(10);
const VFIO_DEVICE_RESET: u64 = vfio_io(11);
const VFIO_IOMMU_GET_INFO: u64 = vfio_io(12);
const VFIO_IOMMU_MAP_DMA: u64 = vfio_io(13);
const VFIO_IOMMU_UNMAP_DMA: u64 = vfio_io(14);

// The numbers the kernel header produces (checked against rust-vmm's table).
const _: () = assert!(VFIO_GET_API_VERSION == 15204);
const _: () = assert!(VFIO_DEVICE_GET_INFO == 15211);
const _: () = assert!(VFIO_IOMMU_UNMAP_DMA == 15218);
const _: () = assert!(VFIO_DEVICE_SET_IRQS == 15214);

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// An ioctl whose argument is an integer (or nothing); returns its result.
/// Private: only the requests below, which take their argument by value,
/// may go through it.
fn ioctl_int(fd: BorrowedFd<'_>, request: u64, arg: libc::c_ulong) -> io::Result<i32> {
    // SAFETY: callers pass only GET_API_VERSION, CHECK_EXTENSION, SET_IOMMU
    // and DEVICE_RESET, which take their argument by value and touch no
    // user memory; `fd` is a live descriptor.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) })
}

/// `VFIO_GET_API_VERSION` on a container.
pub(crate) fn api_version(container: BorrowedFd<'_>) -> io::Result<i32> {
    ioctl_int(container, VFIO_GET_API_VERSION, 0)
}

/// `VFIO_CHECK_EXTENSION`: 1 if the container supports IOMMU type `ext`.
pub(crate) fn check_extension(container: BorrowedFd<'_>, ext: u32) -> io::Result<i32> {
    ioctl_int(container, VFIO_CHECK_EXTENSION, libc::c_ulong::from(ext))
}

/// `VFIO_SET_IOMMU`: selects IOMMU type `ty` (after a group is attached).
pub(crate) fn set_iommu(container: BorrowedFd<'_>, ty: u32) -> io::Result<()> {
    ioctl_int(container, VFIO_SET_IOMMU, libc::c_ulong::from(ty)).map(drop)
}

/// `VFIO_DEVICE_RESET`.
pub(crate) fn device_reset(device: BorrowedFd<'_>) -> io::Result<()> {
    ioctl_int(device, VFIO_DEVICE_RESET, 0).map(drop)
}

/// An ioctl that reads and writes `*arg`, a plain-data structure whose
/// first field is `argsz`.
///
/// # Safety
/// `T` must be the structure `request` expects (with `argsz` set to no more
/// than `size_of::<T>()`), so the kernel reads and writes only within it.
unsafe fn ioctl_struct<T>(fd: BorrowedFd<'_>, request: u64, arg: &mut T) -> io::Result<i32> {
    // SAFETY: the caller guarantees `T` matches `request`; `arg` is a valid
    // exclusive pointer for the duration of the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) })
}

/// `VFIO_GROUP_GET_STATUS`: the group's flags.
pub(crate) fn group_status(group: BorrowedFd<'_>) -> io::Result<u32> {
    let mut status = vfio_group_status {
        argsz: size_of::<vfio_group_status>() as u32,
        flags: 0,
    };
    // SAFETY: GROUP_GET_STATUS takes a `vfio_group_status` of `argsz` bytes.
    unsafe { ioctl_struct(group, VFIO_GROUP_GET_STATUS, &mut status) }?;
    Ok(status.flags)
}

/// `VFIO_GROUP_SET_CONTAINER`.
pub(crate) fn group_set_container(
    group: BorrowedFd<'_>,
    container: BorrowedFd<'_>,
) -> io::Result<()> {
    let fd: libc::c_int = container.as_raw_fd();
    // SAFETY: GROUP_SET_CONTAINER reads one `int` (the container fd) from
    // the pointer; `fd` lives on this stack frame for the call.
    check(unsafe {
        libc::ioctl(
            group.as_raw_fd(),
            VFIO_GROUP_SET_CONTAINER as _,
            &fd as *const libc::c_int,
        )
    })?;
    Ok(())
}

/// `VFIO_GROUP_GET_DEVICE_FD`: opens the device called `name` (its BDF).
pub(crate) fn group_get_device_fd(group: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: GROUP_GET_DEVICE_FD reads a NUL-terminated string, which
    // `name` is, and returns a new descriptor or -1.
    let fd = check(unsafe {
        libc::ioctl(
            group.as_raw_fd(),
            VFIO_GROUP_GET_DEVICE_FD as _,
            name.as_ptr(),
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor the kernel just created for us,
    // owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `VFIO_DEVICE_GET_INFO`.
pub(crate) fn device_info(device: BorrowedFd<'_>) -> io::Result<vfio_device_info> {
    let mut info = vfio_device_info {
        argsz: size_of::<vfio_device_info>() as u32,
        ..Default::default()
    };
    // SAFETY: DEVICE_GET_INFO takes a `vfio_device_info` of `argsz` bytes.
    unsafe { ioctl_struct(device, VFIO_DEVICE_GET_INFO, &mut info) }?;
    Ok(info)
}

/// `VFIO_DEVICE_GET_REGION_INFO` for region `index` (capabilities not read).
pub(crate) fn region_info(device: BorrowedFd<'_>, index: u32) -> io::Result<vfio_region_info> {
    let mut info = vfio_region_info {
        argsz: size_of::<vfio_region_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: DEVICE_GET_REGION_INFO takes a `vfio_region_info` of `argsz`
    // bytes; with that argsz the kernel writes no capability chain past it.
    unsafe { ioctl_struct(device, VFIO_DEVICE_GET_REGION_INFO, &mut info) }?;
    Ok(info)
}

/// `VFIO_DEVICE_GET_IRQ_INFO` for interrupt `index` (INTx, MSI, MSI-X, ...).
pub(crate) fn irq_info(device: BorrowedFd<'_>, index: u32) -> io::Result<vfio_irq_info> {
    let mut info = vfio_irq_info {
        argsz: size_of::<vfio_irq_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: DEVICE_GET_IRQ_INFO takes a `vfio_irq_info` of `argsz` bytes.
    unsafe { ioctl_struct(device, VFIO_DEVICE_GET_IRQ_INFO, &mut info) }?;
    Ok(info)
}

/// `VFIO_DEVICE_SET_IRQS` with eventfds: vectors `start..start+fds.len()`
/// of interrupt `index` trigger `fds` (-1: that vector is left unrouted).
/// The first call sets the number of vectors the kernel enables.
pub(crate) fn set_irq_eventfds(
    device: BorrowedFd<'_>,
    index: u32,
    start: u32,
    fds: &[i32],
) -> io::Result<()> {
    // struct vfio_irq_set { argsz, flags, index, start, count; s32 data[] },
    // built as u32 words so the buffer is aligned for it.
    let count = u32::try_from(fds.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let mut words = vec![0u32; 5 + fds.len()];
    words[0] = (words.len() * 4) as u32;
    words[1] = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    words[2] = index;
    words[3] = start;
    words[4] = count;
    for (w, fd) in words[5..].iter_mut().zip(fds) {
        *w = *fd as u32;
    }
    // SAFETY: the buffer is a `vfio_irq_set` followed by `count` s32 file
    // descriptors, `argsz` bytes in all; the kernel only reads it.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            VFIO_DEVICE_SET_IRQS as _,
            words.as_mut_ptr(),
        )
    })?;
    Ok(())
}

/// `VFIO_DEVICE_SET_IRQS` with no data and count 0: disables interrupt
/// `index` (every vector) and releases the eventfds the kernel held.
pub(crate) fn disable_irqs(device: BorrowedFd<'_>, index: u32) -> io::Result<()> {
    let mut words = [
        20u32,
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
        index,
        0,
        0,
    ];
    // SAFETY: a bare `vfio_irq_set` (20 bytes, no data); the kernel only
    // reads it.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            VFIO_DEVICE_SET_IRQS as _,
            words.as_mut_ptr(),
        )
    })?;
    Ok(())
}

/// A non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes plain integers and returns a new descriptor.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: `fd` is a fresh descriptor the kernel just created for us,
    // owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads and clears an eventfd's counter (0 if nothing was signalled).
pub(crate) fn eventfd_take(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into `v`, which is 8 bytes long.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(v)
}

/// `VFIO_IOMMU_GET_INFO` with its capability chain: the raw bytes, grown to
/// the `argsz` the kernel asks for (parsed by `IommuInfo::parse`).
pub(crate) fn iommu_info(container: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    // u64 words keep the buffer aligned for the structure; 3 words are
    // sizeof(vfio_iommu_type1_info).
    let mut words = vec![0u64; 3];
    for _ in 0..4 {
        let bytes = words.len() * 8;
        let argsz = u32::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
        // `argsz` is the first u32 of the structure, in native byte order.
        let mut head = words[0].to_ne_bytes();
        head[..4].copy_from_slice(&argsz.to_ne_bytes());
        words[0] = u64::from_ne_bytes(head);
        // SAFETY: the buffer holds `argsz` writable bytes, aligned for
        // `vfio_iommu_type1_info`; the kernel writes at most `argsz` bytes.
        check(unsafe {
            libc::ioctl(
                container.as_raw_fd(),
                VFIO_IOMMU_GET_INFO as _,
                words.as_mut_ptr(),
            )
        })?;
        let out: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let wanted = u32::from_ne_bytes([out[0], out[1], out[2], out[3]]) as usize;
        if wanted <= bytes {
            return Ok(out);
        }
        words = vec![0u64; wanted.div_ceil(8)];
    }
    Err(io::Error::other(
        "VFIO_IOMMU_GET_INFO kept asking for a larger buffer",
    ))
}

/// `VFIO_IOMMU_MAP_DMA` of `[va, va+len)` at `iova`, readable and writable
/// by the device.
///
/// # Safety
/// The device may read and write the range at any time until it is
/// unmapped: the caller must keep it allocated (and never access it through
/// Rust references that assume exclusivity) until [`unmap_dma`] succeeds for
/// it. A `mempool::HugepageRegion` registered through `DmaMapper` does this.
pub(crate) unsafe fn map_dma(
    container: BorrowedFd<'_>,
    va: usize,
    iova: u64,
    len: usize,
) -> io::Result<()> {
    let mut map = vfio_iommu_type1_dma_map {
        argsz: size_of::<vfio_iommu_type1_dma_map>() as u32,
        flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
        vaddr: va as u64,
        iova,
        size: len as u64,
    };
    // SAFETY: MAP_DMA takes a `vfio_iommu_type1_dma_map` of `argsz` bytes;
    // the lifetime of the mapped memory is the caller's obligation.
    unsafe { ioctl_struct(container, VFIO_IOMMU_MAP_DMA, &mut map) }?;
    Ok(())
}

/// `VFIO_IOMMU_UNMAP_DMA` of `[iova, iova+len)`; returns the bytes the
/// kernel unmapped.
pub(crate) fn unmap_dma(container: BorrowedFd<'_>, iova: u64, len: usize) -> io::Result<u64> {
    let mut unmap = vfio_iommu_type1_dma_unmap {
        argsz: size_of::<vfio_iommu_type1_dma_unmap>() as u32,
        flags: 0,
        iova,
        size: len as u64,
        data: Default::default(),
    };
    // SAFETY: UNMAP_DMA takes a `vfio_iommu_type1_dma_unmap` of `argsz`
    // bytes (no dirty bitmap is requested, so nothing follows it).
    unsafe { ioctl_struct(container, VFIO_IOMMU_UNMAP_DMA, &mut unmap) }?;
    Ok(unmap.size)
}

/// A device region mapped with `mmap(MAP_SHARED)`, accessed only with
/// volatile loads and stores after a bounds and alignment check.
#[derive(Debug)]
pub(crate) struct Mmio {
    ptr: NonNull<u8>,
    len: usize,
    label: String,
}

// SAFETY: `Mmio` owns its mapping; every access is a volatile load or store
// through a raw pointer, which has no aliasing requirements, so the mapping
// may be used from any thread and from several at once (the device defines
// what concurrent register accesses mean).
unsafe impl Send for Mmio {}
// SAFETY: see `Send`: shared access is volatile raw-pointer access only.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// Maps `len` bytes of `fd` at `offset` (a region of a VFIO device).
    /// `label` names it in panic messages (`0000:03:00.0 BAR0`).
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        label: String,
    ) -> io::Result<Mmio> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: a fresh shared mapping chosen by the kernel (no MAP_FIXED),
        // so no existing memory is replaced; failure is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mmio { ptr, len, label })
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of `width` bytes at `offset`, after checking that they
    /// lie inside the mapping and are naturally aligned. The one bounds
    /// check every access goes through.
    #[inline(always)]
    fn at(&self, offset: usize, width: usize) -> *mut u8 {
        if offset.checked_add(width).is_none_or(|end| end > self.len)
            || !offset.is_multiple_of(width)
        {
            self.out_of_bounds(offset, width);
        }
        // SAFETY: `offset + width <= len` was checked, so the pointer stays
        // inside the mapping.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    #[cold]
    #[inline(never)]
    fn out_of_bounds(&self, offset: usize, width: usize) -> ! {
        panic!(
            "{}: {width}-byte access at offset {offset:#x} is outside the {:#x}-byte mapping or not \
             {width}-byte aligned",
            self.label, self.len
        )
    }

    /// A register of type `T` at `offset` (bounds and alignment checked).
    #[inline(always)]
    fn reg<T>(&self, offset: usize) -> NonNull<T> {
        let p = self.at(offset, size_of::<T>()).cast::<T>();
        // SAFETY: `at` derives `p` from the mapping's non-null base plus an
        // in-bounds offset, so it is not null.
        unsafe { NonNull::new_unchecked(p) }
    }

    /// Volatile 32-bit load, bytes as the device holds them (no swap).
    #[inline]
    pub(crate) fn load32(&self, offset: usize) -> u32 {
        // SAFETY: the register lies inside the mapping, aligned (`reg`);
        // device memory is only ever accessed volatile, one access per
        // pointer, and no reference to it exists.
        unsafe { VolatilePtr::new_read_only(self.reg::<u32>(offset)) }.read()
    }

    /// Volatile 64-bit load, bytes as the device holds them.
    #[inline]
    pub(crate) fn load64(&self, offset: usize) -> u64 {
        // SAFETY: as in `load32`, with 8-byte alignment.
        unsafe { VolatilePtr::new_read_only(self.reg::<u64>(offset)) }.read()
    }

    /// Volatile 32-bit store of bytes in memory order (no swap).
    #[inline]
    pub(crate) fn store32(&self, offset: usize, raw: u32) {
        // SAFETY: as in `load32`; the store touches only device memory.
        unsafe { VolatilePtr::new_restricted(WriteOnly, self.reg::<u32>(offset)) }.write(raw)
    }

    /// Volatile 64-bit store (one 8-byte bus write on x86-64 and aarch64).
    #[inline]
    pub(crate) fn store64(&self, offset: usize, raw: u64) {
        // SAFETY: as in `store32`, with 8-byte alignment.
        unsafe { VolatilePtr::new_restricted(WriteOnly, self.reg::<u64>(offset)) }.write(raw)
    }

    /// Copies `data` (a multiple of 8 bytes) to `offset` with 8-byte
    /// volatile stores in ascending order, bytes in memory order.
    #[inline]
    pub(crate) fn store_words(&self, offset: usize, data: &[u8]) {
        assert!(
            data.len().is_multiple_of(8),
            "{}: word copy of {} bytes",
            self.label,
            data.len()
        );
        // Check the whole span once, then each word.
        let _ = self.at(offset, 8);
        let _ = data
            .len()
            .checked_sub(8)
            .map(|last| self.at(offset + last, 8));
        for (i, chunk) in data.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.store64(offset + i * 8, u64::from_ne_bytes(word));
        }
    }
}

impl Drop for Mmio {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping `map` created, and no
        // reference into it can outlive `self` (none is ever handed out).
        let ret = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if ret != 0 {
            tracing::error!(
                label = %self.label,
                err = %io::Error::last_os_error(),
                "munmap of a device region failed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// An anonymous shared file stands in for a device fd: same mmap path.
    fn fake_region(len: usize) -> Mmio {
        let file = tempfile_like(len);
        Mmio::map(file.as_fd(), 0, len, "test BAR0".into()).unwrap()
    }

    fn tempfile_like(len: usize) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("erpc-mmio-{}-{len}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(len as u64).unwrap();
        let _ = std::fs::remove_file(&path);
        file
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        // _IO(';', 100 + n) from include/uapi/linux/vfio.h.
        assert_eq!(VFIO_CHECK_EXTENSION, 0x3b65);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3b70);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
    }

    #[test]
    fn loads_and_stores_reach_the_mapping_in_memory_order() {
        let m = fake_region(8192);
        m.store32(0x10, 0x1122_3344);
        assert_eq!(m.load32(0x10), 0x1122_3344);
        m.store64(0x18, u64::from_ne_bytes(*b"ABCDEFGH"));
        assert_eq!(m.load64(0x18).to_ne_bytes(), *b"ABCDEFGH");
        let data: Vec<u8> = (0..64u8).collect();
        m.store_words(0x40, &data);
        for i in 0..8 {
            assert_eq!(m.load64(0x40 + i * 8).to_ne_bytes(), data[i * 8..i * 8 + 8]);
        }
    }

    #[test]
    #[should_panic(expected = "test BAR0: 4-byte access at offset 0x2000")]
    fn access_past_the_end_panics_with_the_label() {
        fake_region(8192).load32(0x2000);
    }

    #[test]
    #[should_panic(expected = "not 8-byte aligned")]
    fn unaligned_access_panics() {
        fake_region(8192).store64(4, 0);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn word_copy_past_the_end_panics_before_writing() {
        fake_region(4096).store_words(4096 - 32, &[0u8; 64]);
    }

    #[test]
    fn map_of_zero_bytes_fails() {
        let f = tempfile_like(4096);
        assert!(Mmio::map(f.as_fd(), 0, 0, "x".into()).is_err());
    }
}

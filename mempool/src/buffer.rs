//! [`Buffer`]: one allocation from the hugepage pool, with everything a
//! device needs to reach it.

use std::ptr::NonNull;

/// A block of registered memory handed out by [`crate::Allocator`].
///
/// A buffer is a move-only handle: it is returned to its allocator with
/// [`crate::Allocator::free`], which consumes it, so a double free does not
/// compile. Dropping a buffer without freeing it leaks the block (never
/// unsafe: the allocator keeps its regions alive while buffers are out).
#[derive(Debug)]
pub struct Buffer {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) iova: u64,
    pub(crate) lkey: u32,
    pub(crate) class: u8,
    pub(crate) owner: u16,
    pub(crate) len: u32,
    /// The holder's own 32 bits (see [`Buffer::tag`]); in the struct's
    /// padding, so a buffer stays 32 bytes.
    pub(crate) tag: u32,
}

const _: () = assert!(std::mem::size_of::<Buffer>() == 32);

// SAFETY: a buffer is the only handle to its block, so moving it to another
// thread cannot create shared mutable access. It can only be freed through
// its allocator, which is `!Send` and checks ownership, so a buffer sent away
// must come back to the owner thread to be recycled. The allocator never
// unmaps a region while buffers are outstanding.
unsafe impl Send for Buffer {}

/// Class marker for a ring that got a region of its own (larger than the
/// largest size class).
pub(crate) const DEDICATED_CLASS: u8 = u8::MAX;

impl Buffer {
    /// First byte, for the CPU.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Byte `offset` (at most the capacity: one past the end is allowed),
    /// for the CPU, e.g. for a TX queue entry that outlives a borrow of
    /// the buffer.
    ///
    /// # Panics
    /// If `offset` is beyond the capacity.
    #[inline]
    pub fn ptr_at(&self, offset: usize) -> NonNull<u8> {
        assert!(offset <= self.capacity(), "offset beyond the buffer");
        // SAFETY: within the block (or one past its end), which is one
        // allocation, so the offset pointer is in bounds and not null.
        unsafe { self.ptr.add(offset) }
    }

    /// First byte as an integer virtual address.
    #[inline]
    pub fn va(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// First byte, for the device.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Memory key of the registration covering this buffer.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Usable bytes (the size class, or the ring size).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.len as usize
    }

    /// 32 bits the holder of the buffer may use for its own bookkeeping
    /// (e.g. where to return it). 0 when the allocator hands it out; the
    /// allocator never reads it.
    #[inline]
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// Sets [`Buffer::tag`].
    #[inline]
    pub fn set_tag(&mut self, tag: u32) {
        self.tag = tag;
    }

    /// Size-class index (0 = 64 bytes), or `None` for a dedicated ring region.
    #[inline]
    pub fn class(&self) -> Option<u8> {
        (self.class != DEDICATED_CLASS).then_some(self.class)
    }

    /// IOVA of byte `offset` of this buffer.
    #[inline]
    pub fn iova_at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.capacity());
        self.iova + offset as u64
    }

    /// The whole block as bytes, for memory the CPU owns (message buffers,
    /// TX frames). Memory a device writes into while it is borrowed, such as
    /// an RX ring, must be read through [`Buffer::as_ptr`] instead.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block is `len` bytes of initialised (zero-filled by the
        // kernel, or previously written) memory that this handle owns
        // exclusively and that outlives it (see the `Send` impl).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity()) }
    }

    /// The whole block as mutable bytes. Same caveat as [`Buffer::as_slice`].
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity()) }
    }
}

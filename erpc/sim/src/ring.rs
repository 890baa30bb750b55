//! The simulated NIC's RX ring: slots the "NIC" (the simulated network)
//! writes and the Rpc reads in place, like DMA memory.
//!
//! One of the crate's three `unsafe` modules (with the TSC read and the TX
//! batch, `rpc::tx`). A ring
//! slot is owned either by the NIC (free, may be written) or by software
//! (holds a received packet, may be read). `write` requires NIC ownership
//! and `packet` software ownership, both checked at run time, so the two
//! never touch the same slot. A packet slice cannot outlive its slot's
//! software ownership: it borrows the transport's one `SimRing` handle, and
//! `repost` is reached only through `SimTransport::post_recvs`, which takes
//! that handle mutably (the ownership rule of [`transport::RxRing`]).

#![allow(unsafe_code)]

use std::cell::{Cell, UnsafeCell};
use std::rc::Rc;

/// Bytes per slot (a whole MTU frame fits).
pub const SLOT_BYTES: usize = transport::MTU;

struct Slot {
    data: UnsafeCell<[u8; SLOT_BYTES]>,
    len: Cell<u16>,
    /// True while software owns the slot (a packet is in it).
    sw_owned: Cell<bool>,
    /// True if the frame in it was malformed (the packet reads as `None`).
    bad: Cell<bool>,
}

pub(crate) struct RingMem {
    slots: Box<[Slot]>,
}

impl RingMem {
    pub(crate) fn new(entries: usize) -> Rc<RingMem> {
        // Zeroed memory from the allocator: a large ring's pages are
        // touched only when packets reach them (a ring sized for thousands
        // of sessions costs what its traffic uses).
        let layout = std::alloc::Layout::array::<Slot>(entries).expect("ring size overflows");
        let slots: Box<[Slot]> = if layout.size() == 0 {
            Box::new([])
        } else {
            // SAFETY: `layout` has a non-zero size. All-zero bytes are a
            // valid `Slot` (an empty frame buffer of zeros, length 0 in a
            // `Cell<u16>`, two `false` flags in `Cell<bool>`s), so the
            // zeroed allocation holds `entries` initialised slots, laid
            // out as `Layout::array` says; the box takes ownership of it
            // with the same layout it will free it with.
            unsafe {
                let p = std::alloc::alloc_zeroed(layout).cast::<Slot>();
                if p.is_null() {
                    std::alloc::handle_alloc_error(layout);
                }
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, entries))
            }
        };
        Rc::new(RingMem { slots })
    }

    pub(crate) fn entries(&self) -> usize {
        self.slots.len()
    }

    /// The NIC fills slot `idx` and hands it to software.
    ///
    /// # Panics
    /// If software still owns the slot, or `data` is larger than a slot.
    pub(crate) fn write(&self, idx: usize, data: Option<&[u8]>) {
        let s = &self.slots[idx];
        assert!(
            !s.sw_owned.get(),
            "NIC wrote ring slot {idx} that software owns"
        );
        match data {
            Some(d) => {
                assert!(d.len() <= SLOT_BYTES);
                // SAFETY: software does not own this slot (checked above), so
                // by the ownership protocol no `&[u8]` into it is alive; the
                // ring is `!Sync`, so nobody else writes concurrently.
                let buf = unsafe { &mut *s.data.get() };
                buf[..d.len()].copy_from_slice(d);
                s.len.set(d.len() as u16);
                s.bad.set(false);
            }
            None => {
                s.len.set(0);
                s.bad.set(true);
            }
        }
        s.sw_owned.set(true);
    }

    /// Software gives slot `idx` back to the NIC.
    pub(crate) fn repost(&self, idx: usize) {
        let s = &self.slots[idx];
        assert!(s.sw_owned.get(), "ring slot {idx} reposted twice");
        s.sw_owned.set(false);
    }

    #[inline]
    pub(crate) fn packet(&self, idx: usize) -> Option<&[u8]> {
        let s = self.slots.get(idx)?;
        assert!(
            s.sw_owned.get(),
            "read of ring slot {idx}, which holds no packet"
        );
        if s.bad.get() {
            return None;
        }
        // SAFETY: software owns the slot (checked above), so the NIC side
        // (`write`) will not touch it until `repost`. `repost` is called
        // only from `SimTransport::post_recvs`, which borrows the one
        // `SimRing` handle mutably, and this slice borrows that handle: the
        // slice is gone before the slot can be reposted.
        let buf = unsafe { &*s.data.get() };
        Some(&buf[..usize::from(s.len.get())])
    }
}

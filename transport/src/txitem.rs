//! [`TxItem`]: one packet handed to [`crate::Transport::tx_burst`].
//!
//! An item borrows its route and its bytes for `'a`, like the references
//! it replaces, but holds them as addresses. That lets a sender keep items
//! queued between bursts ([`TxItem::from_raw`]: eRPC's TX batch, which
//! guarantees by its own rules that what a queued item points at stays
//! alive and unchanged) and hand them to the transport without building
//! them again. Everything else builds items from references with the safe
//! constructors, and every reader goes through accessors that give the
//! references back for `'a`.

#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::wire::HEADROOM_BYTES;

/// One packet to send: where its bytes are, and to whom.
///
/// `pkt` starts at the packet header slot (headroom + eRPC header, already
/// filled) and either covers the data too (packet 0 of a message, whose
/// header sits right before the data; `data` is then empty) or covers only
/// the [`crate::PKTHDR_BYTES`] header (later packets, whose headers sit
/// after the message data; `data` is the packet's slice of the message).
///
/// The memory must stay unchanged until the transport has sent it: until a
/// later [`crate::Transport::tx_flush`], or until the response to a
/// request arrives (which implies the request left the NIC).
pub struct TxItem<'a, R> {
    route: NonNull<R>,
    pkt: NonNull<u8>,
    data: NonNull<u8>,
    pkt_iova: u64,
    data_iova: u64,
    pkt_len: u32,
    data_len: u32,
    lkey: u32,
    drop: bool,
    /// Borrows like `&'a R`, `&'a [u8]`, `&'a [u8]` would.
    _borrows: PhantomData<(&'a [u8], *const R)>,
}

const _: () = assert!(std::mem::size_of::<TxItem<'static, u64>>() == 56);

// SAFETY: an item is the three shared borrows it stands for (`&'a R`,
// `&'a [u8]` twice), which may cross threads exactly when `R: Sync`.
unsafe impl<R: Sync> Send for TxItem<'_, R> {}
// SAFETY: as for `Send`: shared access to `R` and to bytes.
unsafe impl<R: Sync> Sync for TxItem<'_, R> {}

impl<R> Clone for TxItem<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R> Copy for TxItem<'_, R> {}

impl<R: fmt::Debug> fmt::Debug for TxItem<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxItem")
            .field("route", self.route())
            .field("pkt_len", &self.pkt_len)
            .field("pkt_iova", &self.pkt_iova)
            .field("data_len", &self.data_len)
            .field("data_iova", &self.data_iova)
            .field("lkey", &self.lkey)
            .field("drop", &self.drop)
            .finish()
    }
}

/// A slice's length as an item stores it (frames are far below 4 GiB).
#[inline(always)]
fn len32(b: &[u8]) -> u32 {
    u32::try_from(b.len()).expect("a packet part is shorter than 4 GiB")
}

impl<'a, R> TxItem<'a, R> {
    /// A packet: header slot `pkt` at IOVA `pkt_iova`, then `data` (empty
    /// when `pkt` holds everything) at `data_iova`, both in memory
    /// registered under `lkey`, to `route`; `drop` is fault injection
    /// (account for the packet as sent but do not send it).
    #[inline]
    pub fn new(
        route: &'a R,
        pkt: &'a [u8],
        pkt_iova: u64,
        data: &'a [u8],
        data_iova: u64,
        lkey: u32,
        drop: bool,
    ) -> Self {
        TxItem {
            route: NonNull::from(route),
            pkt: NonNull::from(pkt).cast(),
            data: NonNull::from(data).cast(),
            pkt_iova,
            data_iova,
            pkt_len: len32(pkt),
            data_len: len32(data),
            lkey,
            drop,
            _borrows: PhantomData,
        }
    }

    /// One contiguous frame (headroom, eRPC header and data) at IOVA
    /// `pkt_iova` in memory registered under `lkey`.
    #[inline]
    pub fn contiguous(route: &'a R, pkt: &'a [u8], pkt_iova: u64, lkey: u32) -> Self {
        Self::new(route, pkt, pkt_iova, &[], 0, lkey, false)
    }

    /// A frame in memory no NIC reads (for transports that copy it, such as
    /// kernel sockets): header slot `pkt` and the `data` that follows it on
    /// the wire (empty if `pkt` holds everything), without IOVAs or key.
    #[inline]
    pub fn unregistered(route: &'a R, pkt: &'a [u8], data: &'a [u8]) -> Self {
        Self::new(route, pkt, 0, data, 0, 0, false)
    }

    /// An item from addresses, as [`TxItem::new`] would make it from
    /// references. An empty `data` may have any non-null, dangling address.
    ///
    /// # Safety
    /// For all of `'a`: `route` points to a live `R`, `pkt` to `pkt_len`
    /// and `data` to `data_len` initialised bytes, and none of them is
    /// written or freed (what `&'a R` and `&'a [u8]` would guarantee). A
    /// holder that keeps items longer than it can promise this (a queue)
    /// must hand them out only for as long as it can.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub unsafe fn from_raw(
        route: NonNull<R>,
        pkt: NonNull<u8>,
        pkt_len: u32,
        pkt_iova: u64,
        data: NonNull<u8>,
        data_len: u32,
        data_iova: u64,
        lkey: u32,
        drop: bool,
    ) -> Self {
        TxItem {
            route,
            pkt,
            data,
            pkt_iova,
            data_iova,
            pkt_len,
            data_len,
            lkey,
            drop,
            _borrows: PhantomData,
        }
    }

    /// Resolved destination.
    #[inline(always)]
    pub fn route(&self) -> &'a R {
        // SAFETY: made from `&'a R` (or promised as good as one).
        unsafe { self.route.as_ref() }
    }

    /// Header slot (and, for packet 0, the data that follows it).
    #[inline(always)]
    pub fn pkt(&self) -> &'a [u8] {
        // SAFETY: made from `&'a [u8]` (or promised as good as one).
        unsafe { std::slice::from_raw_parts(self.pkt.as_ptr(), self.pkt_len as usize) }
    }

    /// Data that is not contiguous with the header (empty otherwise).
    #[inline(always)]
    pub fn data(&self) -> &'a [u8] {
        // SAFETY: made from `&'a [u8]` (or promised as good as one).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.data_len as usize) }
    }

    /// IOVA of `pkt()[0]` (for DMA-based transports).
    #[inline(always)]
    pub fn pkt_iova(&self) -> u64 {
        self.pkt_iova
    }

    /// IOVA of `data()[0]`.
    #[inline(always)]
    pub fn data_iova(&self) -> u64 {
        self.data_iova
    }

    /// Memory key covering both ranges.
    #[inline(always)]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Fault injection: account for the packet as sent but do not send it.
    #[inline(always)]
    pub fn drop(&self) -> bool {
        self.drop
    }

    /// The same item with fault injection's `drop` set to `drop`.
    #[inline]
    pub fn with_drop(mut self, drop: bool) -> Self {
        self.drop = drop;
        self
    }

    /// Length of the header slot part.
    #[inline(always)]
    pub fn pkt_len(&self) -> usize {
        self.pkt_len as usize
    }

    /// Length of the separate data part.
    #[inline(always)]
    pub fn data_len(&self) -> usize {
        self.data_len as usize
    }

    /// Bytes on the wire after the Ethernet/IP/UDP headers (eRPC header + data).
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.pkt_len() - HEADROOM_BYTES + self.data_len()
    }

    /// Whole frame length (headroom + eRPC header + data).
    #[inline]
    pub fn frame_len(&self) -> usize {
        self.pkt_len() + self.data_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_give_back_what_the_constructors_took() {
        let route = 7u64;
        let pkt = [1u8; 60];
        let data = [2u8; 5];
        let it = TxItem::new(&route, &pkt, 0x1000, &data, 0x2000, 9, true);
        assert_eq!(*it.route(), 7);
        assert_eq!(it.pkt(), &pkt[..]);
        assert_eq!(it.data(), &data[..]);
        assert_eq!(
            (it.pkt_iova(), it.data_iova(), it.lkey()),
            (0x1000, 0x2000, 9)
        );
        assert!(it.drop());
        assert!(!it.with_drop(false).drop());
        assert_eq!(it.frame_len(), 65);
        assert_eq!(it.payload_len(), 65 - HEADROOM_BYTES);
        let c = TxItem::contiguous(&route, &pkt, 0x1000, 3);
        assert!(c.data().is_empty() && c.data_len() == 0 && !c.drop());
        // SAFETY: the same borrows as `it`, alive for the whole test.
        let r = unsafe {
            TxItem::from_raw(
                NonNull::from(&route),
                NonNull::from(&pkt).cast(),
                60,
                0x1000,
                NonNull::dangling(),
                0,
                0,
                3,
                false,
            )
        };
        assert_eq!(r.pkt(), c.pkt());
        assert!(r.data().is_empty());
        assert_eq!(format!("{r:?}"), format!("{c:?}"));
    }
}

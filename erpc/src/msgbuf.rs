//! Message buffers in hugepage memory, laid out as in the paper (Figure 2):
//!
//! ```text
//! | pkthdr 0 | data (max_data_bytes, rounded up to 8) | pkthdr 1 | ... | pkthdr N-1 |
//! ```
//!
//! Packet 0's header sits right before the data, so a single-packet
//! message is one contiguous frame (one gather entry); the headers of later
//! packets follow the data, so the data itself stays contiguous for the
//! application. The whole thing is one DMA-registered [`mempool::Buffer`].
//! A header slot is [`PKTHDR_BYTES`] long: the transport's headroom
//! (Ethernet/IPv4/UDP) followed by the 14-byte eRPC header.
//!
//! Header positions depend only on the capacity, so resizing never moves
//! them.

use std::fmt;

use mempool::Buffer;
use transport::{MAX_DATA_PER_PKT, PKTHDR_BYTES};

use crate::consts::MAX_MSG_BYTES;

/// Packets needed for `data_bytes` of data (a message always has at least one).
#[inline]
pub(crate) const fn data_size_to_num_pkts(data_bytes: usize) -> usize {
    // Most messages are one packet: a compare instead of the division.
    if data_bytes <= MAX_DATA_PER_PKT {
        1
    } else {
        data_bytes.div_ceil(MAX_DATA_PER_PKT)
    }
}

/// Bytes of memory a msgbuf of capacity `max_data_bytes` occupies.
#[inline]
pub const fn msgbuf_bytes(max_data_bytes: usize) -> usize {
    PKTHDR_BYTES
        + max_data_bytes.next_multiple_of(8)
        + (data_size_to_num_pkts(max_data_bytes) - 1) * PKTHDR_BYTES
}

/// Data bytes in packet `pkt_idx` of a `data_bytes` message.
#[inline]
pub(crate) const fn pkt_data_bytes(data_bytes: usize, pkt_idx: usize) -> usize {
    let start = pkt_idx * MAX_DATA_PER_PKT;
    let rest = data_bytes.saturating_sub(start);
    if rest < MAX_DATA_PER_PKT {
        rest
    } else {
        MAX_DATA_PER_PKT
    }
}

/// Packet bytes of a msgbuf as addresses ([`MsgBuf::tx_raw_parts`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxRawParts {
    /// Header slot (and, for packet 0, the data after it).
    pub pkt: std::ptr::NonNull<u8>,
    pub pkt_iova: u64,
    pub pkt_len: u32,
    /// Data not contiguous with the header (empty for packet 0).
    pub data: std::ptr::NonNull<u8>,
    pub data_iova: u64,
    pub data_len: u32,
}

/// Where a msgbuf's memory came from, so the Rpc knows how to recycle it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Allocated for the application or for a large message.
    Dynamic,
    /// A server slot's preallocated MTU-size response buffer.
    PreallocResp {
        /// Server session.
        session: u16,
        /// Slot index.
        slot: u8,
    },
}

/// Bit of [`Buffer::tag`] that marks a preallocated response buffer; the
/// low 24 bits then hold its session (bits 8..24) and slot (bits 0..8).
const PREALLOC_TAG: u32 = 1 << 31;

impl Origin {
    #[inline]
    fn to_tag(self) -> u32 {
        match self {
            Origin::Dynamic => 0,
            Origin::PreallocResp { session, slot } => {
                PREALLOC_TAG | (u32::from(session) << 8) | u32::from(slot)
            }
        }
    }

    #[inline]
    fn from_tag(tag: u32) -> Origin {
        if tag & PREALLOC_TAG == 0 {
            Origin::Dynamic
        } else {
            Origin::PreallocResp {
                session: (tag >> 8) as u16,
                slot: tag as u8,
            }
        }
    }
}

/// A message buffer: contiguous data in DMA memory with packet-header
/// slots around it. Move-only; freed with [`crate::Rpc::free_msg_buffer`]
/// or handed to the Rpc (`enqueue_request`, `enqueue_response`), which
/// gives request buffers back in the continuation.
///
/// Msgbufs move by value through every request (into slots, the backlog,
/// completions), so the handle is kept to 40 bytes: the buffer (whose tag
/// holds the origin), the data size and the capacity; packet counts are
/// derived from the sizes.
pub struct MsgBuf {
    buf: Buffer,
    max_data_bytes: u32,
    data_bytes: u32,
}

const _: () = assert!(std::mem::size_of::<MsgBuf>() == 40);
const _: () = assert!(std::mem::size_of::<Option<MsgBuf>>() == 40);

impl fmt::Debug for MsgBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MsgBuf {{ va {:#x}, data {} of {} bytes, {} of {} pkts, {:?} }}",
            self.buf.va(),
            self.data_bytes,
            self.max_data_bytes,
            self.num_pkts(),
            data_size_to_num_pkts(self.max_data_bytes as usize),
            self.origin()
        )
    }
}

/// A msgbuf could not be made or resized.
#[derive(Debug, thiserror::Error)]
pub enum MsgBufError {
    /// Larger than the protocol allows.
    #[error("message of {size} bytes exceeds the maximum of {MAX_MSG_BYTES} bytes")]
    TooLarge {
        /// Requested size.
        size: usize,
    },
    /// Resize beyond the capacity the buffer was allocated with.
    #[error("cannot resize a msgbuf of capacity {max} bytes to {size} bytes")]
    BeyondCapacity {
        /// Requested size.
        size: usize,
        /// Capacity.
        max: usize,
    },
    /// The hugepage allocator failed.
    #[error(transparent)]
    Alloc(#[from] mempool::AllocError),
}

impl MsgBuf {
    /// Wraps `buf` as a msgbuf of capacity `max_data_bytes`.
    pub(crate) fn from_buffer(mut buf: Buffer, max_data_bytes: usize, origin: Origin) -> MsgBuf {
        assert!(max_data_bytes <= MAX_MSG_BYTES);
        assert!(buf.capacity() >= msgbuf_bytes(max_data_bytes));
        buf.set_tag(origin.to_tag());
        MsgBuf {
            buf,
            max_data_bytes: max_data_bytes as u32,
            data_bytes: max_data_bytes as u32,
        }
    }

    /// Where the memory came from.
    #[inline]
    pub(crate) fn origin(&self) -> Origin {
        Origin::from_tag(self.buf.tag())
    }

    /// Allocates a msgbuf of capacity `max_data_bytes` from `alloc`.
    pub(crate) fn alloc(
        alloc: &mut mempool::Allocator,
        max_data_bytes: usize,
        origin: Origin,
    ) -> Result<MsgBuf, MsgBufError> {
        if max_data_bytes > MAX_MSG_BYTES {
            return Err(MsgBufError::TooLarge {
                size: max_data_bytes,
            });
        }
        let buf = alloc.alloc(msgbuf_bytes(max_data_bytes))?;
        Ok(MsgBuf::from_buffer(buf, max_data_bytes, origin))
    }

    /// Gives the memory back.
    pub(crate) fn into_buffer(self) -> Buffer {
        self.buf
    }

    /// Current data size in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.data_bytes as usize
    }

    /// True if the current data size is zero.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.data_bytes == 0
    }

    /// Capacity in data bytes.
    #[inline]
    pub fn max_len(&self) -> usize {
        self.max_data_bytes as usize
    }

    /// Packets the current data size needs.
    #[inline]
    pub fn num_pkts(&self) -> usize {
        data_size_to_num_pkts(self.data_bytes as usize)
    }

    /// True if packet `i` is one of the current data size's packets
    /// (`i < num_pkts()`, without the division).
    #[inline]
    pub(crate) fn has_pkt(&self, i: usize) -> bool {
        i == 0 || i * MAX_DATA_PER_PKT < self.data_bytes as usize
    }

    /// The data (current size).
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[PKTHDR_BYTES..PKTHDR_BYTES + self.data_bytes as usize]
    }

    /// The data (current size), writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let n = self.data_bytes as usize;
        &mut self.buf.as_mut_slice()[PKTHDR_BYTES..PKTHDR_BYTES + n]
    }

    /// Changes the data size without moving anything (the C++
    /// `resize_msg_buffer`). Bytes past the old size keep whatever they held.
    #[inline]
    pub fn resize(&mut self, new_data_bytes: usize) -> Result<(), MsgBufError> {
        if new_data_bytes > self.max_data_bytes as usize {
            return Err(MsgBufError::BeyondCapacity {
                size: new_data_bytes,
                max: self.max_data_bytes as usize,
            });
        }
        self.data_bytes = new_data_bytes as u32;
        Ok(())
    }

    /// [`MsgBuf::resize`] where the caller has checked the capacity: no
    /// `Result` to build and unwrap on the datapath.
    ///
    /// # Panics
    /// If `new_data_bytes` exceeds the capacity (a bug in the caller).
    #[inline]
    pub(crate) fn resize_checked(&mut self, new_data_bytes: usize) {
        assert!(
            new_data_bytes <= self.max_data_bytes as usize,
            "resize beyond capacity"
        );
        self.data_bytes = new_data_bytes as u32;
    }

    /// Byte offset of packet `i`'s header slot in the buffer.
    #[inline]
    pub(crate) fn pkthdr_offset(&self, i: usize) -> usize {
        debug_assert!(i < data_size_to_num_pkts(self.max_data_bytes as usize));
        if i == 0 {
            0
        } else {
            PKTHDR_BYTES
                + (self.max_data_bytes as usize).next_multiple_of(8)
                + (i - 1) * PKTHDR_BYTES
        }
    }

    /// Packet `i`'s header slot (headroom + eRPC header), as last written
    /// for transmission.
    #[inline]
    pub fn pkthdr(&self, i: usize) -> &[u8] {
        let o = self.pkthdr_offset(i);
        &self.buf.as_slice()[o..o + PKTHDR_BYTES]
    }

    /// Packet `i`'s header slot, writable.
    #[inline]
    pub(crate) fn pkthdr_mut(&mut self, i: usize) -> &mut [u8; PKTHDR_BYTES] {
        let o = self.pkthdr_offset(i);
        self.buf.as_mut_slice()[o..]
            .first_chunk_mut::<PKTHDR_BYTES>()
            .expect("a header slot lies within its msgbuf")
    }

    /// Data range of packet `i` (offsets into the buffer).
    #[inline]
    pub(crate) fn pkt_data_range(&self, i: usize) -> std::ops::Range<usize> {
        let start = PKTHDR_BYTES + i * MAX_DATA_PER_PKT;
        start..start + pkt_data_bytes(self.data_bytes as usize, i)
    }

    /// Writes `data` as packet `i`'s payload (reassembly). Callers have
    /// checked that `data` is exactly packet `i`'s share of the message
    /// (`pkt_data_bytes` of the current size), so its length is not
    /// recomputed here; the copy is bounds-checked against the buffer
    /// either way.
    #[inline]
    pub(crate) fn write_pkt_data(&mut self, i: usize, data: &[u8]) {
        debug_assert_eq!(self.pkt_data_range(i).len(), data.len());
        let start = PKTHDR_BYTES + i * MAX_DATA_PER_PKT;
        self.buf.as_mut_slice()[start..start + data.len()].copy_from_slice(data);
    }

    /// Where packet `i`'s bytes are, for a TX queue entry that outlives
    /// this borrow (see `rpc::tx`): the header slot (for packet 0 with the
    /// data that follows it) and, for later packets, the packet's slice of
    /// the data, as addresses and IOVAs. Computing them reads nothing
    /// through them. An empty data range has a dangling, non-null address.
    #[inline]
    pub(crate) fn tx_raw_parts(&self, i: usize) -> TxRawParts {
        if i == 0 {
            let len = PKTHDR_BYTES + pkt_data_bytes(self.data_bytes as usize, 0);
            // The frame lies within the buffer (capacity ≥ msgbuf_bytes).
            debug_assert!(len <= self.buf.capacity());
            TxRawParts {
                pkt: self.buf.ptr_at(0),
                pkt_iova: self.buf.iova(),
                pkt_len: len as u32,
                data: std::ptr::NonNull::dangling(),
                data_iova: 0,
                data_len: 0,
            }
        } else {
            let h = self.pkthdr_offset(i);
            let d = self.pkt_data_range(i);
            debug_assert!(h + PKTHDR_BYTES <= self.buf.capacity());
            TxRawParts {
                pkt: self.buf.ptr_at(h),
                pkt_iova: self.buf.iova_at(h),
                pkt_len: PKTHDR_BYTES as u32,
                data: self.buf.ptr_at(d.start),
                data_iova: self.buf.iova_at(d.start),
                data_len: d.len() as u32,
            }
        }
    }

    /// Memory key of the buffer.
    #[inline]
    pub(crate) fn lkey(&self) -> u32 {
        self.buf.lkey()
    }

    /// Virtual address of the first header slot (for tests of the layout).
    pub fn buffer_va(&self) -> usize {
        self.buf.va()
    }

    /// Virtual address of the first data byte.
    pub fn data_va(&self) -> usize {
        self.buf.va() + PKTHDR_BYTES
    }

    /// Virtual address of packet `i`'s header slot.
    pub fn pkthdr_va(&self, i: usize) -> usize {
        self.buf.va() + self.pkthdr_offset(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::MAX_MSG_PKTS;

    #[cfg(feature = "testing")]
    #[test]
    fn layout_matches_figure_2() {
        let mut a = crate::test_allocator(16 << 20);
        for &max in &[0usize, 1, 968, 969, 5000, MAX_MSG_BYTES] {
            let mut m = MsgBuf::alloc(&mut a, max, Origin::Dynamic).unwrap();
            let n = m.num_pkts();
            assert_eq!(n, data_size_to_num_pkts(max));
            // Packet 0's header immediately precedes the data.
            assert_eq!(m.data_va(), m.buffer_va() + PKTHDR_BYTES);
            assert_eq!(m.pkthdr_va(0), m.buffer_va());
            // Later headers follow the data (rounded up to 8), back to back.
            for i in 1..n.min(50) {
                assert_eq!(
                    m.pkthdr_va(i),
                    m.data_va() + max.next_multiple_of(8) + (i - 1) * PKTHDR_BYTES
                );
                assert_eq!(m.pkthdr_va(i) % 8, 0);
            }
            if n > 1 {
                assert_eq!(
                    m.pkthdr_va(n - 1) + PKTHDR_BYTES,
                    m.buffer_va() + msgbuf_bytes(max)
                );
            }
            // Writing headers never touches data, and vice versa.
            m.data_mut().fill(0xaa);
            for i in 0..n {
                m.pkthdr_mut(i).fill(0x55);
            }
            assert!(m.data().iter().all(|&b| b == 0xaa));
            // Packet 0 is one contiguous frame; later packets are header +
            // data, at the addresses (and IOVAs) of the layout.
            let iova_of = |va: usize| m.buf.iova() + (va - m.buffer_va()) as u64;
            let p0 = m.tx_raw_parts(0);
            assert_eq!(p0.pkt.as_ptr() as usize, m.buffer_va());
            assert_eq!(p0.pkt_iova, iova_of(m.buffer_va()));
            assert_eq!(p0.pkt_len as usize, PKTHDR_BYTES + pkt_data_bytes(max, 0));
            assert_eq!(p0.data_len, 0);
            for i in 1..n.min(50) {
                let p = m.tx_raw_parts(i);
                assert_eq!(p.pkt.as_ptr() as usize, m.pkthdr_va(i));
                assert_eq!(p.pkt_iova, iova_of(m.pkthdr_va(i)));
                assert_eq!(p.pkt_len as usize, PKTHDR_BYTES);
                let data_va = m.data_va() + i * MAX_DATA_PER_PKT;
                assert_eq!(p.data.as_ptr() as usize, data_va);
                assert_eq!(p.data_iova, iova_of(data_va));
                assert_eq!(p.data_len as usize, pkt_data_bytes(max, i));
            }
            // Resizing keeps the headers where they were.
            let h = m.pkthdr_va(n - 1);
            m.resize(max / 2).unwrap();
            assert_eq!(m.pkthdr_va(n - 1), h);
            assert!(m.resize(max + 1).is_err());
            a.free(m.into_buffer());
        }
        assert!(MsgBuf::alloc(&mut a, MAX_MSG_BYTES + 1, Origin::Dynamic).is_err());
    }

    #[cfg(feature = "testing")]
    #[test]
    fn packet_counts_and_origin_follow_the_sizes() {
        let mut a = crate::test_allocator(16 << 20);
        let origins = [
            Origin::Dynamic,
            Origin::PreallocResp {
                session: 0xbeef,
                slot: 7,
            },
            Origin::PreallocResp {
                session: 0,
                slot: 0,
            },
        ];
        let mut m = MsgBuf::alloc(&mut a, 3 * MAX_DATA_PER_PKT + 5, origins[1]).unwrap();
        assert_eq!(m.origin(), origins[1]);
        for size in [0, 1, 967, 968, 969, 1936, 1937, 2904, 2905, 2909] {
            m.resize(size).unwrap();
            let n = m.num_pkts();
            assert_eq!(n, data_size_to_num_pkts(size), "size {size}");
            for i in 0..n + 3 {
                assert_eq!(m.has_pkt(i), i < n, "size {size}, packet {i}");
            }
        }
        a.free(m.into_buffer());
        for o in origins {
            let m = MsgBuf::alloc(&mut a, 100, o).unwrap();
            assert_eq!(m.origin(), o);
            let b = m.into_buffer();
            a.free(b);
        }
        // The allocator hands buffers out untagged, whatever they carried.
        let b = a.alloc(64).unwrap();
        assert_eq!(b.tag(), 0);
        a.free(b);
    }

    #[test]
    fn sizes_and_packet_counts() {
        assert_eq!(data_size_to_num_pkts(0), 1);
        assert_eq!(data_size_to_num_pkts(1), 1);
        assert_eq!(data_size_to_num_pkts(968), 1);
        assert_eq!(data_size_to_num_pkts(969), 2);
        assert_eq!(data_size_to_num_pkts(MAX_MSG_BYTES), MAX_MSG_PKTS);
        assert_eq!(msgbuf_bytes(0), 56);
        assert_eq!(msgbuf_bytes(968), 56 + 968);
        assert_eq!(msgbuf_bytes(969), 56 + 976 + 56);
        assert!(msgbuf_bytes(MAX_MSG_BYTES) <= 8 << 20);
        assert_eq!(pkt_data_bytes(2000, 0), 968);
        assert_eq!(pkt_data_bytes(2000, 1), 968);
        assert_eq!(pkt_data_bytes(2000, 2), 64);
        assert_eq!(pkt_data_bytes(2000, 3), 0);
    }
}

//! Deferred DMA on the simulated network: a NIC that reads the bytes of a
//! sent packet some time after `tx_burst` handed it over, as a real one may
//! (sends are unsignaled; only [`transport::Transport::tx_flush`] says that
//! nothing is held any more), and an IOMMU ([`SimIommu`]) that says which
//! memory the NIC may still read.
//!
//! Off by default: [`super::SimTransport`] then copies a packet inside
//! `tx_burst`, so a buffer that eRPC frees or rewrites while a real NIC
//! could still read it goes unnoticed. With [`super::SimConfig::deferred_dma`]
//! set, each packet handed over with registered memory is *posted*: its
//! bytes are copied as they are at `tx_burst` (the snapshot), its addresses
//! are kept, and the NIC reads the memory again later — at the endpoint's
//! next `tx_flush` or when its transport is dropped (every pending send),
//! at a later `tx_burst` once the
//! send's draw of later sends has been posted, or at the first
//! [`super::SimNet::advance`] past the send's draw of delay; never inside
//! the `tx_burst` that posted it, and always in posting order. What it
//! reads then is what goes on the wire. If the bytes differ from the
//! snapshot, the buffer was rewritten (or freed and poisoned, see
//! [`DeferredDma::poison`]) while the NIC still owned it: a missing TX
//! drain. That is counted ([`super::NetStats::dma_mismatches`]) and, by
//! default, panics with a message that names the packet. A read of memory
//! that is no longer registered (its allocator's region was unmapped) is a
//! DMA fault ([`super::NetStats::dma_faults`]), reported the same way.
//!
//! Memory registered with a [`SimIommu`] is what [`super::SimNet::allocator`]
//! hands out (poisoned on free in this mode); a packet in memory with no
//! IOVA ([`transport::TxItem::unregistered`]) is copied at `tx_burst` as
//! before, and one whose IOVA this network's IOMMU does not know is a DMA
//! fault at `tx_burst`.
//!
//! One of the crate's `unsafe` modules: the NIC's later read goes through
//! the addresses of the items it was given, and is sound only because the
//! IOMMU's table is checked, and held, for the whole copy: a range in the
//! table is mapped memory (`mempool` unregisters a region before it unmaps
//! it), and the simulated network is single-threaded.

#![allow(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use mempool::{DmaError, DmaMapper, DmaMapping};
use transport::{ERPC_HDR_BYTES, HEADROOM_BYTES, TxItem};

use erpc::wire::PktHdr;
use netsim::Rng;

/// Settings of the deferred-DMA mode ([`super::SimConfig::deferred_dma`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferredDma {
    /// Each send is read once at most this many later sends were posted
    /// (drawn per send, uniformly in `0..=max_later_sends`, from the
    /// network's seed), at a later `tx_burst`.
    pub max_later_sends: u32,
    /// ... or once the clock passed its posting by a delay drawn per send
    /// in `1..=max_delay_ns` (at a [`super::SimNet::advance`]). 0: no time
    /// bound, so a send waits for later sends or a flush (a lone request
    /// then leaves only with the loss scan's drain).
    pub max_delay_ns: u64,
    /// Panic at the first mismatch or fault (the default), naming the
    /// packet; otherwise only count them (and keep the first message,
    /// [`super::SimNet::dma_first_error`]).
    pub panic: bool,
    /// The byte [`super::SimNet::allocator`]'s allocators fill freed
    /// blocks with.
    pub poison: u8,
}

impl Default for DeferredDma {
    fn default() -> Self {
        DeferredDma {
            max_later_sends: 64,
            max_delay_ns: 20_000,
            panic: true,
            poison: 0xa5,
        }
    }
}

/// The simulated network's IOMMU: the memory ranges registered with it
/// (identity IOVAs, lkey 0, as [`mempool::IdentityMapper`]), which a
/// deferred read checks before it touches a byte.
#[derive(Debug, Default)]
pub struct SimIommu {
    /// Start → end of each registered range.
    ranges: Mutex<BTreeMap<usize, usize>>,
    maps: AtomicU64,
    unmaps: AtomicU64,
}

impl SimIommu {
    /// An empty table.
    pub fn new() -> SimIommu {
        SimIommu::default()
    }

    fn table(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `[addr, addr + len)` lies inside one registered range.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        covered(&self.table(), addr, len)
    }

    /// Ranges registered now.
    pub fn ranges(&self) -> usize {
        self.table().len()
    }

    /// Successful maps and unmaps so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.maps.load(Ordering::Relaxed),
            self.unmaps.load(Ordering::Relaxed),
        )
    }

    /// Appends the `len` bytes at `addr` to `out`, if they lie inside one
    /// registered range (the table stays locked for the copy).
    fn read_append(&self, addr: *const u8, len: usize, out: &mut Vec<u8>) -> bool {
        if len == 0 {
            return true;
        }
        let t = self.table();
        if !covered(&t, addr as usize, len) {
            return false;
        }
        out.reserve(len);
        let at = out.len();
        // SAFETY: `addr..addr + len` lies inside a registered range, which
        // is mapped memory until it is unregistered (mempool unmaps a
        // region only after unregistering it), and the table is locked
        // until the copy is done, so it cannot be unregistered meanwhile.
        // The destination has `len` bytes of spare capacity (reserved
        // above), now initialised, so the length may grow by `len`. The
        // source is read as a device reads host memory, through no
        // reference.
        unsafe {
            std::ptr::copy_nonoverlapping(addr, out.as_mut_ptr().add(at), len);
            out.set_len(at + len);
        }
        true
    }
}

fn covered(t: &BTreeMap<usize, usize>, addr: usize, len: usize) -> bool {
    match t.range(..=addr).next_back() {
        Some((_, &end)) => addr.checked_add(len).is_some_and(|e| e <= end),
        None => false,
    }
}

impl DmaMapper for SimIommu {
    unsafe fn map(&self, va: usize, len: usize) -> Result<DmaMapping, DmaError> {
        let mut t = self.table();
        let overlaps = t
            .range(..va.saturating_add(len))
            .next_back()
            .is_some_and(|(_, &e)| e > va);
        if overlaps || len == 0 {
            return Err(DmaError {
                op: "map",
                va,
                iova: 0,
                len,
                source: "empty, or overlaps a registered range".into(),
            });
        }
        t.insert(va, va + len);
        self.maps.fetch_add(1, Ordering::Relaxed);
        Ok(DmaMapping {
            iova: va as u64,
            len,
            lkey: 0,
        })
    }

    fn unmap(&self, va: usize, mapping: &DmaMapping) -> Result<(), DmaError> {
        let mut t = self.table();
        if t.get(&va) != Some(&(va + mapping.len)) {
            return Err(DmaError {
                op: "unmap",
                va,
                iova: mapping.iova,
                len: mapping.len,
                source: "not registered".into(),
            });
        }
        t.remove(&va);
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// One send the NIC has not read yet.
pub(super) struct Pending {
    /// Destination endpoint.
    pub dst: usize,
    pkt: *const u8,
    pkt_len: usize,
    data: *const u8,
    data_len: usize,
    /// The frame as it was at `tx_burst`.
    pub snapshot: Vec<u8>,
    pub posted_ns: u64,
    /// The sending endpoint's send number (from 0).
    pub seq: u64,
    burst: u64,
    read_at_send: u64,
    due_ns: u64,
}

/// Why a deferred read found something wrong.
pub(super) enum ReadError {
    /// The bytes changed since `tx_burst`.
    Mismatch(String),
    /// The memory is no longer registered: nothing was read.
    Fault(String),
}

/// One endpoint's sends that the NIC has not read yet.
pub(super) struct DmaQueue {
    cfg: DeferredDma,
    rng: Rng,
    pending: VecDeque<Pending>,
    /// Sends posted so far.
    sends: u64,
    /// `tx_burst` calls so far.
    bursts: u64,
}

impl DmaQueue {
    pub(super) fn new(cfg: DeferredDma, seed: u64) -> DmaQueue {
        DmaQueue {
            cfg,
            rng: Rng::new(seed),
            pending: VecDeque::new(),
            sends: 0,
            bursts: 0,
        }
    }

    pub(super) fn cfg(&self) -> &DeferredDma {
        &self.cfg
    }

    /// A `tx_burst` starts.
    pub(super) fn start_burst(&mut self) {
        self.bursts += 1;
    }

    /// Posts `it` (to endpoint `dst`) for a later read; `snapshot` is an
    /// empty frame buffer, filled with the bytes as they are now. Returns
    /// the buffer back with a message if the item's memory is not
    /// registered with `iommu`.
    pub(super) fn post<R>(
        &mut self,
        iommu: &SimIommu,
        it: &TxItem<'_, R>,
        dst: usize,
        now_ns: u64,
        mut snapshot: Vec<u8>,
    ) -> Result<(), (Vec<u8>, String)> {
        let (pkt, data) = (it.pkt(), it.data());
        let seq = self.sends;
        if !iommu.read_append(pkt.as_ptr(), pkt.len(), &mut snapshot)
            || !iommu.read_append(data.as_ptr(), data.len(), &mut snapshot)
        {
            let msg = format!(
                "deferred DMA: send #{seq} ({} + {} bytes at VA {:p} / {:p}) is not in memory \
                 registered with this network's IOMMU (make its allocator with \
                 SimNet::allocator)",
                pkt.len(),
                data.len(),
                pkt.as_ptr(),
                data.as_ptr()
            );
            return Err((snapshot, msg));
        }
        self.sends += 1;
        let later = self.rng.below(u64::from(self.cfg.max_later_sends) + 1);
        let due_ns = match self.cfg.max_delay_ns {
            0 => u64::MAX,
            d => now_ns.saturating_add(1 + self.rng.below(d)),
        };
        self.pending.push_back(Pending {
            dst,
            pkt: pkt.as_ptr(),
            pkt_len: pkt.len(),
            data: data.as_ptr(),
            data_len: data.len(),
            snapshot,
            posted_ns: now_ns,
            seq,
            burst: self.bursts,
            read_at_send: self.sends + later,
            due_ns,
        });
        Ok(())
    }

    /// The oldest pending send, if the NIC reads it now: at a flush,
    /// always; at the end of a `tx_burst` (`at_burst`), one posted by an
    /// earlier burst whose later sends or delay have come; at a clock
    /// advance, one whose delay has come.
    pub(super) fn pop_due(&mut self, now_ns: u64, at_burst: bool, flush: bool) -> Option<Pending> {
        let p = self.pending.front()?;
        let due = flush
            || p.due_ns <= now_ns
            || (at_burst && p.burst < self.bursts && p.read_at_send <= self.sends);
        if due { self.pending.pop_front() } else { None }
    }

    /// When the oldest pending send is read if nothing else happens.
    pub(super) fn next_due_ns(&self) -> Option<u64> {
        self.pending
            .front()
            .map(|p| p.due_ns)
            .filter(|&t| t != u64::MAX)
    }

    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Forgets every pending send (the queue was destroyed), returning the
    /// snapshots' buffers.
    pub(super) fn clear(&mut self) -> impl Iterator<Item = Vec<u8>> + '_ {
        self.pending.drain(..).map(|p| p.snapshot)
    }
}

/// Reads pending send `p` of endpoint `ep` now, into `out` (empty): what
/// the NIC puts on the wire. An error says what went wrong; on a mismatch
/// `out` holds what was read.
pub(super) fn read(
    iommu: &SimIommu,
    ep: usize,
    p: &Pending,
    now_ns: u64,
    poison: u8,
    out: &mut Vec<u8>,
) -> Result<(), ReadError> {
    if !iommu.read_append(p.pkt, p.pkt_len, out) || !iommu.read_append(p.data, p.data_len, out) {
        out.clear();
        return Err(ReadError::Fault(format!(
            "deferred DMA: endpoint {ep} {}: its memory was unregistered (the allocator's \
             region unmapped) before the NIC read it at {now_ns} ns. A TX drain is missing \
             before the memory was given back.",
            describe(p)
        )));
    }
    if *out == p.snapshot {
        return Ok(());
    }
    let differ = out.iter().zip(&p.snapshot).filter(|(a, b)| a != b).count();
    let first = out
        .iter()
        .zip(&p.snapshot)
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let changed: Vec<u8> = out
        .iter()
        .zip(&p.snapshot)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| *a)
        .collect();
    let why = if changed.iter().all(|&b| b == poison) {
        format!("freed (it now holds the allocator's poison {poison:#04x})")
    } else {
        "rewritten".to_string()
    };
    Err(ReadError::Mismatch(format!(
        "deferred DMA: endpoint {ep} {}: {differ} of {} bytes changed before the NIC read \
         them at {now_ns} ns, first at byte {first} ({:#04x} -> {:#04x}): the buffer was {why} \
         while the NIC still owned it. A TX drain (Transport::tx_flush) is missing between this \
         send and the buffer's reuse.",
        describe(p),
        out.len(),
        p.snapshot[first],
        out[first],
    )))
}

/// "send #N to endpoint D (eRPC header ..., handed over at T ns)".
fn describe(p: &Pending) -> String {
    let hdr = p
        .snapshot
        .get(HEADROOM_BYTES..HEADROOM_BYTES + ERPC_HDR_BYTES)
        .map(PktHdr::decode);
    let hdr = match hdr {
        Some(Ok(h)) => format!(
            "{:?} req_num {} pkt_num {} to session {}, req_type {}, msg_size {}",
            h.pkt_type, h.req_num, h.pkt_num, h.dest_session_num, h.req_type, h.msg_size
        ),
        _ => "no eRPC header".to_string(),
    };
    format!(
        "send #{} to endpoint {} ({hdr}; {} bytes, handed to tx_burst at {} ns)",
        p.seq,
        p.dst,
        p.snapshot.len(),
        p.posted_ns
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_iommu_tracks_ranges_and_refuses_overlaps() {
        let m = SimIommu::new();
        let buf = vec![0u8; 8192];
        let va = buf.as_ptr() as usize;
        // SAFETY: nothing reads through the mapping in this test.
        let d = unsafe { m.map(va, 4096) }.unwrap();
        assert_eq!(d.iova, va as u64);
        assert!(m.covers(va, 4096));
        assert!(m.covers(va + 100, 10));
        assert!(!m.covers(va + 4000, 100), "runs past the end");
        assert!(!m.covers(va + 4096, 1));
        // SAFETY: as above.
        assert!(unsafe { m.map(va + 1000, 4096) }.is_err(), "overlap");
        m.unmap(va, &d).unwrap();
        assert!(!m.covers(va, 1));
        assert!(m.unmap(va, &d).is_err(), "twice");
        assert_eq!(m.counts(), (1, 1));
    }
}

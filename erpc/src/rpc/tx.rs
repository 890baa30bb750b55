//! The TX path. Every packet eRPC sends is queued in the [`TxBatch`]
//! (the one place a rate limiter intercepts) and leaves through
//! [`Rpc::flush_tx`] (the one place that calls the transport).
//!
//! # Entries are resolved when they are queued
//! A batch entry is the transport's [`TxItem`] itself, built when the
//! packet is queued: where its bytes are (virtual address and IOVA of the
//! header slot and of the data), its memory key and its route; beside it,
//! for a client packet under congestion control, where its TX timestamp
//! goes. So a flush only stamps the timestamps and hands a slice of the
//! items to the transport: it never looks a session, slot or buffer up
//! again (the C++ `tx_burst_arr` holds message-buffer pointers the same
//! way).
//!
//! That makes this module one of the crate's few places with `unsafe`
//! code: a queued item holds addresses ([`TxItem::from_raw`]), which the
//! transport turns back into slices and references only during a
//! `tx_burst` call. They stay valid because of one rule, the **batch
//! invariant**: *every entry refers to a live session's
//! route (and timestamp cells) and to the control buffer or to the
//! `tx_msgbuf` its slot holds; nothing that an entry refers to is freed,
//! moved out of its slot or rewritten while the entry is queued.* What
//! keeps it:
//!
//! * Routes and timestamp cells live behind an `Rc` in their session, only
//!   ever read through shared references after the session is connected,
//!   so their addresses are stable for the session's life.
//! * Message bytes are in hugepage memory that the Rpc's allocator never
//!   unmaps while the Rpc lives (every msgbuf fits a size class, see
//!   `consts`), and eRPC writes a message's header slots only before its
//!   packets are queued.
//! * Before a message leaves its slot (a request completes, a server slot
//!   takes its next request) the slot's entries are forgotten
//!   ([`TxBatch::forget_slot`]). Each slot remembers the batch epoch in
//!   which it last queued a packet, and the epoch moves on whenever the
//!   batch is empty, so in the common case (the packets left in an
//!   earlier iteration) this is one comparison, and the scan of the batch
//!   runs only when an entry of the slot may still be queued.
//! * Before a session's buffers are taken out or the session is freed
//!   (resets, teardown), every entry of the session is forgotten
//!   ([`TxBatch::forget_session`]); the batch is cleared before the Rpc's
//!   sessions are dropped.
//!
//! Forgotten entries are counted in `RpcStats::tx_stale`; loss recovery
//! treats them like packets lost on the wire.
//!
//! Packets the transport refuses (its queue is full) stay in the batch, in
//! order, for the next flush. Only when the batch is full, the transport
//! still refuses after [`TX_REFUSED_TRIES`] flushes of its queue, and a
//! new packet must be queued, is the oldest packet given up — counted in
//! `tx_given_up` and resent by loss recovery like a packet lost on the
//! wire (the client's retransmission timeout; the server answers the
//! retransmitted request again). Nothing vanishes uncounted.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use transport::{ERPC_HDR_BYTES, HEADROOM_BYTES, PKTHDR_BYTES, Transport, TxItem};

use super::{CTRL_SLOT_BYTES, Rpc};
use crate::consts::{MAX_TX_BATCH, TX_REFUSED_TRIES};
use crate::msgbuf::{MsgBuf, pkt_data_bytes};
use crate::pkthdr::{PktHdr, PktType};
use crate::session::Session;

/// Owner slot number of a control packet (its header is in the control
/// buffer, not in a slot's message).
const CTRL_SLOT: u8 = u8::MAX;

/// Who queued an entry: the session, and the slot ([`CTRL_SLOT`] for a
/// control packet). What [`TxBatch::forget_slot`] and
/// [`TxBatch::forget_session`] match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    session: u16,
    slot: u8,
}

/// Packets queued for the next transport burst: the transport's items
/// themselves, resolved when queued, with each one's TX timestamp cell and
/// owner alongside (see the module doc).
pub(crate) struct TxBatch<R> {
    /// The first `len` are initialised. `'static` stands for "as long as
    /// the batch invariant keeps them valid": they are handed out only for
    /// the length of a `tx_burst` call.
    items: [MaybeUninit<TxItem<'static, R>>; MAX_TX_BATCH],
    /// Each item's TX timestamp cell (client packets under congestion
    /// control), or null.
    ts: [*const Cell<u64>; MAX_TX_BATCH],
    owners: [Owner; MAX_TX_BATCH],
    len: usize,
    /// Moves on whenever the batch is empty: a slot whose `tx_epoch` is
    /// older has no entry queued (see the module doc).
    epoch: u64,
}

impl<R> std::fmt::Debug for TxBatch<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TxBatch {{ {} queued, epoch {} }}", self.len, self.epoch)
    }
}

/// Largest burst handed to the transport at once (the mlx5 postlist).
const MAX_TX_CHUNK: usize = 16;
const _: () = assert!(MAX_TX_CHUNK <= MAX_TX_BATCH);

impl<R> TxBatch<R> {
    pub(crate) fn new() -> TxBatch<R> {
        TxBatch {
            items: [const { MaybeUninit::uninit() }; MAX_TX_BATCH],
            ts: [std::ptr::null(); MAX_TX_BATCH],
            owners: [Owner {
                session: 0,
                slot: 0,
            }; MAX_TX_BATCH],
            len: 0,
            epoch: 1,
        }
    }

    /// Room left.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        MAX_TX_BATCH - self.len
    }

    /// Queues one packet. The caller makes room first (`tx_make_room`).
    #[inline(always)]
    fn push(&mut self, item: TxItem<'static, R>, ts: *const Cell<u64>, owner: Owner) {
        let j = self.len;
        debug_assert!(j < MAX_TX_BATCH);
        self.items[j].write(item);
        self.ts[j] = ts;
        self.owners[j] = owner;
        self.len = j + 1;
    }

    /// Items `from..from + k`, for one `tx_burst` call.
    #[inline(always)]
    fn items(&self, from: usize, k: usize) -> &[TxItem<'_, R>] {
        let part = &self.items[from..from + k];
        assert!(from + k <= self.len);
        // SAFETY: the first `len` items are initialised, and
        // `MaybeUninit<T>` has the layout of `T`. The items are valid for
        // the borrow of the batch (the batch invariant: nothing they point
        // at is freed or written while they are queued, and a caller that
        // borrows the batch cannot change what is queued meanwhile); the
        // shorter lifetime is all the transport sees.
        unsafe { std::slice::from_raw_parts(part.as_ptr().cast::<TxItem<'_, R>>(), k) }
    }

    /// The batch lost its first `n` entries (sent, or given up).
    #[inline(always)]
    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        if n == self.len {
            // Everything went (the usual case): nothing to move.
            self.len = 0;
            self.epoch += 1;
            return;
        }
        self.items.copy_within(n..self.len, 0);
        self.ts.copy_within(n..self.len, 0);
        self.owners.copy_within(n..self.len, 0);
        self.len -= n;
        if self.len == 0 {
            self.epoch += 1;
        }
    }

    /// Forgets every entry whose owner matches `f`, keeping the others in
    /// order. Returns how many were forgotten.
    fn forget(&mut self, f: impl Fn(Owner) -> bool) -> usize {
        let mut kept = 0;
        for j in 0..self.len {
            if !f(self.owners[j]) {
                self.items[kept] = self.items[j];
                self.ts[kept] = self.ts[j];
                self.owners[kept] = self.owners[j];
                kept += 1;
            }
        }
        let gone = self.len - kept;
        self.len = kept;
        if kept == 0 {
            self.epoch += 1;
        }
        gone
    }

    /// Forgets the queued packets of slot `slot` of session `session`
    /// (its message is about to leave the slot), adding them to `stale`.
    /// One comparison unless the slot queued something in this epoch.
    #[inline(always)]
    pub(crate) fn forget_slot(&mut self, slot_epoch: u64, session: u16, slot: u8, stale: &mut u64) {
        if slot_epoch == self.epoch {
            self.forget_slot_now(session, slot, stale);
        }
    }

    #[cold]
    #[inline(never)]
    fn forget_slot_now(&mut self, session: u16, slot: u8, stale: &mut u64) {
        let o = Owner { session, slot };
        *stale += self.forget(|x| x == o) as u64;
    }

    /// Forgets every queued packet of session `session` (its buffers are
    /// about to be taken out, or it is about to be freed), adding them to
    /// `stale`.
    pub(crate) fn forget_session(&mut self, session: u16, stale: &mut u64) {
        if self.len != 0 {
            *stale += self.forget(|x| x.session == session) as u64;
        }
    }

    /// Forgets everything queued (the Rpc is going away).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.epoch += 1;
    }
}

/// Writes the header slot of every packet of `m`: the eRPC header `hdr`
/// with packet `k` numbered `hdr.pkt_num + k` and the size of `m`, and the
/// transport's headroom for `route`. Packet 0 first, outside the loop: most
/// messages have only that one.
#[inline]
pub(crate) fn write_msg_hdrs<T: Transport>(
    transport: &T,
    route: &T::Route,
    m: &mut MsgBuf,
    mut hdr: PktHdr,
) {
    let msg_size = m.len();
    hdr.msg_size = msg_size as u32;
    let first = hdr.pkt_num;
    let write = |m: &mut MsgBuf, k: usize, hdr: &PktHdr| {
        let (head, erpc) = m
            .pkthdr_mut(k)
            .split_first_chunk_mut::<HEADROOM_BYTES>()
            .expect("56 >= 42");
        let erpc: &mut [u8; ERPC_HDR_BYTES] = erpc.try_into().expect("56 - 42 = 14");
        // Sizes of at most MAX_MSG_BYTES, request numbers kept in 44 bits
        // and request plus response packets within 14 bits always fit.
        hdr.write_in_range(erpc);
        transport.fill_headroom(route, head, PKTHDR_BYTES + pkt_data_bytes(msg_size, k));
    };
    write(m, 0, &hdr);
    for k in 1..m.num_pkts() {
        hdr.pkt_num = first + k as u16;
        write(m, k, &hdr);
    }
}

/// Fault injection: whether the session's next packet is dropped (and
/// the drop counted down). One predictable branch when unused.
#[inline(always)]
fn fault_drop<T: Transport, C>(s: &Session<T, C>) -> bool {
    let n = s.fault_drop_tx.get();
    if n == 0 {
        return false;
    }
    s.fault_drop_tx.set(n - 1);
    true
}

impl<T: Transport, C> Rpc<T, C> {
    /// Makes room for at least one entry.
    #[inline]
    pub(crate) fn tx_make_room(&mut self) {
        if self.tx.room() == 0 {
            self.tx_make_room_slow();
        }
    }

    #[cold]
    fn tx_make_room_slow(&mut self) {
        self.flush_tx();
        for _ in 0..TX_REFUSED_TRIES {
            if self.tx.room() != 0 {
                return;
            }
            // The transport's queue is full: wait for it to drain.
            self.transport.tx_flush();
            self.stats.tx_flushes += 1;
            self.flush_tx();
        }
        if self.tx.room() == 0 {
            // Give the oldest packet up to loss recovery.
            self.tx.consume(1);
            self.stats.tx_given_up += 1;
        }
    }

    /// Queues packet `pkt_idx` of slot `slot` of session `s`, whose
    /// `tx_msgbuf` holds it (request packets at a client, response packets
    /// at a server). The caller has made room and holds the session; the
    /// slot records the batch epoch. `ts_at` is the index of the packet's
    /// TX timestamp cell (a client packet under congestion control).
    #[inline(always)]
    pub(crate) fn tx_push_msg(
        tx: &mut TxBatch<T::Route>,
        stats: &mut crate::stats::RpcStats,
        s: &mut Session<T, C>,
        slot: u8,
        pkt_idx: u32,
        ts_at: Option<usize>,
    ) {
        debug_assert!(tx.room() != 0, "the caller makes room first");
        let drop = fault_drop(s);
        if drop {
            stats.tx_fault_dropped += 1;
        }
        let Some(route) = s.route.as_ref() else {
            // Only connected sessions send, and they have a route.
            stats.tx_stale += 1;
            return;
        };
        let route = NonNull::from(&**route);
        let ts = match ts_at {
            Some(at) => s.tx_ts.get(at).map_or(std::ptr::null(), |c| c as *const _),
            None => std::ptr::null(),
        };
        let owner = Owner {
            session: s.local_num,
            slot,
        };
        let sl = &mut s.slots[usize::from(slot)];
        let Some(m) = sl.tx_msgbuf.as_ref() else {
            stats.tx_stale += 1;
            return;
        };
        sl.tx_epoch = tx.epoch;
        let p = m.tx_raw_parts(pkt_idx as usize);
        // SAFETY: the route lives in the session's `Rc` and the bytes in
        // the slot's message, in registered hugepage memory; both stay as
        // they are while the item is queued (the batch invariant, module
        // doc), which is as long as it is valid for.
        let item = unsafe {
            TxItem::from_raw(
                route,
                p.pkt,
                p.pkt_len,
                p.pkt_iova,
                p.data,
                p.data_len,
                p.data_iova,
                m.lkey(),
                drop,
            )
        };
        tx.push(item, ts, owner);
    }

    /// Queues packet `pkt_idx` of the slot's `tx_msgbuf` if the slot still
    /// carries request `req_num` (otherwise the packet is stale: counted,
    /// not sent).
    pub(crate) fn enqueue_msg_pkt(&mut self, session: u16, slot: u8, pkt_idx: u32, req_num: u64) {
        self.tx_make_room();
        let cc = self.pacing.cc_on();
        let cap = self.tx_ts_cap;
        let Some(s) = self.sessions.session_mut(session) else {
            self.stats.tx_stale += 1;
            return;
        };
        let sl = &s.slots[usize::from(slot)];
        let live = sl.cur_req_num == req_num
            && sl
                .tx_msgbuf
                .as_ref()
                .is_some_and(|m| m.has_pkt(pkt_idx as usize));
        if !live {
            self.stats.tx_stale += 1;
            return;
        }
        let ts_at = (cc && s.role == crate::session::Role::Client)
            .then(|| super::cc::ts_index(cap, usize::from(slot), pkt_idx));
        Self::tx_push_msg(&mut self.tx, &mut self.stats, s, slot, pkt_idx, ts_at);
    }

    /// Writes the header of a control packet (`pkt_type` CR or RFR, or a
    /// status packet's response header; no data) for slot `slot` of `session` into the next control slot and
    /// queues it; the destination session number is the session's peer.
    /// `session` must exist and have a route.
    #[inline]
    pub(crate) fn enqueue_ctrl(
        &mut self,
        session: u16,
        slot: u8,
        pkt_type: PktType,
        req_type: u8,
        pkt_num: u16,
        req_num: u64,
    ) {
        self.enqueue_ctrl_sized(session, slot, pkt_type, req_type, pkt_num, req_num, 0);
    }

    /// [`Rpc::enqueue_ctrl`] with message size `msg_size` in the header:
    /// 0, or a status packet's size (`rpc/status.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_ctrl_sized(
        &mut self,
        session: u16,
        slot: u8,
        pkt_type: PktType,
        req_type: u8,
        pkt_num: u16,
        req_num: u64,
        msg_size: u32,
    ) {
        self.tx_make_room();
        debug_assert!(
            self.sessions
                .session(session)
                .is_some_and(|s| s.route.is_some()),
            "a control packet goes to a session {session} that exists and has a route"
        );
        let Some(s) = self.sessions.session(session) else {
            return;
        };
        let Some(route) = s.route.as_ref() else {
            return;
        };
        let hdr = PktHdr {
            req_type,
            msg_size,
            dest_session_num: s.remote_num,
            pkt_type,
            pkt_num,
            req_num,
        };
        let n = self.ctrl_next;
        self.ctrl_next = (n + 1) & (self.ctrl_bufs - 1);
        let buf = self.ctrl.as_ref().expect("control buffer lives until drop");
        let o = n * CTRL_SLOT_BYTES;
        assert!(
            o + CTRL_SLOT_BYTES <= buf.capacity(),
            "the control buffer holds ctrl_bufs slots"
        );
        // SAFETY: the slot's bytes lie within the control buffer (checked
        // above, so the offset pointer is in bounds), which lives as long
        // as the Rpc. Nothing else refers to them: queued entries hold raw
        // addresses of other slots (a slot is reused only after ctrl_bufs
        // more control packets, and the batch holds fewer), and no
        // reference to the buffer's bytes is kept. So the header is
        // written through a reference to this slot alone, never one to
        // the whole buffer under the queued entries.
        let h: &mut [u8; PKTHDR_BYTES] = unsafe { &mut *buf.as_ptr().add(o).cast() };
        let (head, erpc) = h
            .split_first_chunk_mut::<HEADROOM_BYTES>()
            .expect("56 >= 42");
        let erpc: &mut [u8; ERPC_HDR_BYTES] = erpc.try_into().expect("56 - 42 = 14");
        // A CR repeats a received header's type and numbers (decoded
        // within their wire widths); an RFR's packet number is below
        // `2 * MAX_MSG_PKTS - 1`, which fits (`consts`); a status packet's
        // size is below 2^24 (`pkthdr::STATUS_SIZE_BASE`).
        hdr.write_in_range(erpc);
        self.transport.fill_headroom(route, head, PKTHDR_BYTES);
        let pkt = NonNull::from(h).cast::<u8>();
        // An RFR is a client packet: it gets a TX timestamp (its RTT
        // sample comes with the response packet it asks for).
        let ts = if self.pacing.cc_on() && s.role == crate::session::Role::Client {
            let at = super::cc::ts_index(self.tx_ts_cap, usize::from(slot), u32::from(hdr.pkt_num));
            s.tx_ts.get(at).map_or(std::ptr::null(), |c| c as *const _)
        } else {
            std::ptr::null()
        };
        let drop = fault_drop(s);
        if drop {
            self.stats.tx_fault_dropped += 1;
        }
        // SAFETY: the route lives in the session's `Rc`; the header is in
        // the control buffer, which lives as long as the Rpc. Control
        // slots are reused only after ctrl_bufs more control packets: more
        // than the batch holds (`consts`) and at least twice what the
        // transport may hold unread (`RpcBuilder::build`), so a control header is
        // never rewritten while queued or under the NIC.
        let item = unsafe {
            TxItem::from_raw(
                NonNull::from(&**route),
                pkt,
                PKTHDR_BYTES as u32,
                buf.iova_at(o),
                NonNull::dangling(),
                0,
                0,
                buf.lkey(),
                drop,
            )
        };
        let owner = Owner {
            session,
            slot: CTRL_SLOT,
        };
        self.tx.push(item, ts, owner);
    }

    /// Sends everything queued, in bursts of at most `tx_burst_max`.
    /// Packets the transport refuses stay queued, in order.
    #[inline]
    pub(crate) fn flush_tx(&mut self) {
        // Most event-loop iterations have nothing queued: decide that
        // before paying for the call.
        if self.tx.len != 0 {
            self.flush_tx_queued();
        }
    }

    #[inline(never)]
    fn flush_tx_queued(&mut self) {
        debug_assert_eq!(
            self.batch_invariant(),
            Ok(()),
            "TX batch invariant at flush"
        );
        let n = self.tx.len;
        let chunk = self.tx_burst_max.min(MAX_TX_CHUNK);
        // Congestion control: the TX timestamps of client packets, one
        // clock read per flush with batched timestamps.
        if self.pacing.cc_on() {
            let batch_ts = self.config.cc.batch_timestamps;
            let now = self.clock.now_ns();
            for &ts in &self.tx.ts[..n] {
                if !ts.is_null() {
                    let at = if batch_ts { now } else { self.clock.now_ns() };
                    // SAFETY: a non-null cell pointer points into its
                    // session's `Rc`'d timestamp slice, alive while the
                    // entry is queued (batch invariant); the cells are
                    // only ever reached through shared references.
                    unsafe { (*ts).set(at) };
                }
            }
        }
        let mut done = 0;
        while done < n {
            let k = chunk.min(n - done);
            let sent = self.transport.tx_burst(self.tx.items(done, k)).min(k);
            self.stats.tx_bursts += 1;
            self.stats.tx_pkts += sent as u64;
            done += sent;
            if sent < k {
                break;
            }
        }
        if done < n {
            self.stats.tx_refused += (n - done) as u64;
        }
        self.tx.consume(done);
    }
}

impl<T: Transport, C> Rpc<T, C> {
    /// The batch invariant (module doc) as far as the owners tell it, for
    /// debug assertions: every queued entry's session is live and has its
    /// route; a message entry's slot still holds its message, and queued
    /// it in this epoch (the epoch moves only when the batch is empty, so
    /// an entry of an earlier one would have outlived a `forget_slot`).
    /// The first violation, described.
    fn batch_invariant(&self) -> Result<(), String> {
        for (j, o) in self.tx.owners[..self.tx.len].iter().enumerate() {
            let Some(s) = self.sessions.session(o.session) else {
                return Err(format!("entry {j}: session {} is gone", o.session));
            };
            if s.route.is_none() {
                return Err(format!("entry {j}: session {} has no route", o.session));
            }
            if o.slot == CTRL_SLOT {
                continue;
            }
            let sl = &s.slots[usize::from(o.slot)];
            if sl.tx_msgbuf.is_none() {
                return Err(format!(
                    "entry {j}: slot {} of session {} holds no message",
                    o.slot, o.session
                ));
            }
            if sl.tx_epoch != self.tx.epoch {
                return Err(format!(
                    "entry {j}: slot {} of session {} queued in epoch {}, the batch is in {}",
                    o.slot, o.session, sl.tx_epoch, self.tx.epoch
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static ROUTE: u32 = 7;
    static BYTES: [u8; 64] = [0; 64];

    /// An item whose length names it (so order can be checked).
    fn item(n: usize) -> TxItem<'static, u32> {
        TxItem::contiguous(&ROUTE, &BYTES[..n], 0, 0)
    }

    fn push(b: &mut TxBatch<u32>, n: usize, session: u16, slot: u8) {
        b.push(item(n), std::ptr::null(), Owner { session, slot });
    }

    fn lens(b: &TxBatch<u32>) -> Vec<usize> {
        b.items(0, b.len).iter().map(|i| i.pkt_len()).collect()
    }

    #[test]
    fn forgetting_keeps_the_others_in_order_and_the_epoch_moves_when_empty() {
        let mut b = TxBatch::new();
        let e0 = b.epoch;
        push(&mut b, 1, 3, 0);
        push(&mut b, 2, 3, CTRL_SLOT);
        push(&mut b, 3, 4, 0);
        push(&mut b, 4, 3, 0);
        push(&mut b, 5, 3, 1);
        // A slot that queued nothing in this epoch: nothing to scan.
        let mut stale = 0;
        b.forget_slot(e0 - 1, 3, 0, &mut stale);
        assert_eq!(stale, 0);
        assert_eq!(lens(&b), [1, 2, 3, 4, 5]);
        b.forget_slot(e0, 3, 0, &mut stale);
        assert_eq!(stale, 2);
        assert_eq!(lens(&b), [2, 3, 5]);
        assert_eq!(b.epoch, e0, "not empty yet");
        b.consume(1);
        assert_eq!(lens(&b), [3, 5]);
        b.forget_session(3, &mut stale);
        assert_eq!(stale, 3);
        assert_eq!(lens(&b), [3]);
        b.forget_session(4, &mut stale);
        assert_eq!(stale, 4);
        assert_eq!(b.room(), MAX_TX_BATCH);
        assert_eq!(b.epoch, e0 + 1, "emptied: a new epoch");
        // Whatever a slot recorded before, it has nothing queued now.
        b.forget_slot(e0, 3, 1, &mut stale);
        assert_eq!(stale, 4);
        push(&mut b, 6, 1, 1);
        b.consume(1);
        assert_eq!(b.epoch, e0 + 2);
        b.clear();
        assert_eq!(b.epoch, e0 + 3);
        b.forget_session(1, &mut stale);
        assert_eq!(stale, 4);
    }
}

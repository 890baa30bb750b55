//! The TX path. Every packet eRPC sends goes through [`TxBatch::push`]
//! (the one place a rate limiter will intercept) and leaves through
//! [`Rpc::flush_tx`] (the one place that calls the transport).
//!
//! A batch entry names a packet rather than pointing at it (session,
//! slot, packet index, request number), like the C++ `tx_burst_arr`;
//! `flush_tx` resolves the names into [`TxItem`]s, skipping (and counting)
//! any whose message is gone.
//!
//! Packets the transport refuses (its queue is full) stay in the batch, in
//! order, for the next flush. Only when the batch is full, the transport
//! still refuses after [`TX_REFUSED_TRIES`] flushes of its queue, and a
//! new packet must be queued, is the oldest packet given up — counted in
//! `tx_given_up` and resent by loss recovery like a packet lost on the
//! wire (the client's retransmission timeout; the server answers the
//! retransmitted request again). Nothing vanishes uncounted.

use arrayvec::ArrayVec;
use transport::{HEADROOM_BYTES, PKTHDR_BYTES, Transport, TxItem};

use super::{CTRL_SLOT_BYTES, Rpc};
use crate::consts::{CTRL_BUFS, TX_BATCH_MAX, TX_REFUSED_TRIES};
use crate::msgbuf::{MsgBuf, pkt_data_bytes};
use crate::pkthdr::PktHdr;

/// What a batch entry sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxKind {
    /// Packet `pkt_idx` of the slot's `tx_msgbuf` (request at a client,
    /// response at a server).
    Msg,
    /// A control packet whose header is in control slot `n`.
    Ctrl(u16),
}

/// One queued packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxEntry {
    pub session: u16,
    pub slot: u8,
    pub kind: TxKind,
    pub pkt_idx: u32,
    pub req_num: u64,
}

/// Packets queued for the next transport burst.
#[derive(Debug)]
pub(crate) struct TxBatch {
    entries: [TxEntry; TX_BATCH_MAX],
    len: usize,
}

/// Largest burst handed to the transport at once (the mlx5 postlist).
const TX_CHUNK_MAX: usize = 16;
const _: () = assert!(TX_CHUNK_MAX <= TX_BATCH_MAX);

impl TxBatch {
    pub(crate) fn new() -> TxBatch {
        TxBatch {
            entries: [TxEntry {
                session: 0,
                slot: 0,
                kind: TxKind::Msg,
                pkt_idx: 0,
                req_num: 0,
            }; TX_BATCH_MAX],
            len: 0,
        }
    }

    /// Room left.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        TX_BATCH_MAX - self.len
    }

    /// Queues one packet. The caller makes room first (`flush_tx`).
    #[inline]
    pub(crate) fn push(&mut self, e: TxEntry) {
        debug_assert!(self.len < TX_BATCH_MAX);
        self.entries[self.len] = e;
        self.len += 1;
    }

    /// Forgets everything queued (the Rpc is going away).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
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
        let b = m.pkthdr_mut(k);
        // Sizes of at most MAX_MSG_BYTES, request numbers kept in 44 bits
        // and request plus response packets within 14 bits always fit.
        hdr.write_to(&mut b[HEADROOM_BYTES..])
            .expect("message headers fit their wire widths");
        transport.fill_headroom(
            route,
            &mut b[..HEADROOM_BYTES],
            PKTHDR_BYTES + pkt_data_bytes(msg_size, k),
        );
    };
    write(m, 0, &hdr);
    for k in 1..m.num_pkts() {
        hdr.pkt_num = first + k as u16;
        write(m, k, &hdr);
    }
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
            self.tx.entries.copy_within(1..self.tx.len, 0);
            self.tx.len -= 1;
            self.stats.tx_given_up += 1;
        }
    }

    /// Writes a control packet (CR or RFR) header into the next control
    /// slot and queues it. `session` must exist and have a route.
    pub(crate) fn enqueue_ctrl(&mut self, session: u16, slot: u8, hdr: PktHdr) {
        self.tx_make_room();
        let n = self.ctrl_next;
        self.ctrl_next = (n + 1) % CTRL_BUFS;
        let Some(s) = self
            .sessions
            .get(usize::from(session))
            .and_then(|s| s.as_deref())
        else {
            return;
        };
        let Some(route) = s.route.as_ref() else {
            return;
        };
        let buf = self.ctrl.as_mut().expect("control buffer lives until drop");
        let h = &mut buf.as_mut_slice()[n * CTRL_SLOT_BYTES..n * CTRL_SLOT_BYTES + PKTHDR_BYTES];
        hdr.write_to(&mut h[HEADROOM_BYTES..])
            .expect("control headers carry numbers taken from valid headers");
        self.transport
            .fill_headroom(route, &mut h[..HEADROOM_BYTES], PKTHDR_BYTES);
        self.tx.push(TxEntry {
            session,
            slot,
            kind: TxKind::Ctrl(n as u16),
            pkt_idx: u32::from(hdr.pkt_num),
            req_num: hdr.req_num,
        });
    }

    /// Queues packet `pkt_idx` of the slot's `tx_msgbuf`.
    #[inline]
    pub(crate) fn enqueue_msg_pkt(&mut self, session: u16, slot: u8, pkt_idx: u32, req_num: u64) {
        self.tx_make_room();
        self.tx.push(TxEntry {
            session,
            slot,
            kind: TxKind::Msg,
            pkt_idx,
            req_num,
        });
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
        let n = self.tx.len;
        let chunk = self.tx_burst_max.min(TX_CHUNK_MAX);
        let mut done = 0;
        while done < n {
            let end = (done + chunk).min(n);
            let consumed = self.flush_range(done, end);
            done += consumed;
            if done < end {
                break;
            }
        }
        if done < n {
            self.stats.tx_refused += (n - done) as u64;
            self.tx.entries.copy_within(done..n, 0);
        }
        self.tx.len = n - done;
    }

    /// Hands entries `start..end` to the transport. Returns how many
    /// entries, from `start`, were consumed (sent or skipped as stale); the
    /// rest were refused.
    fn flush_range(&mut self, start: usize, end: usize) -> usize {
        debug_assert!(end - start <= TX_CHUNK_MAX);
        let ctrl = self.ctrl.as_ref().expect("control buffer lives until drop");
        let ctrl_bytes = ctrl.as_slice();
        let mut burst: ArrayVec<TxItem<'_, T::Route>, TX_CHUNK_MAX> = ArrayVec::new();
        // Entry index of each item, to know what a partial burst consumed.
        let mut entry_of = [0u8; TX_CHUNK_MAX];
        // Congestion control: TX timestamps of client packets, one clock
        // read per burst with batched timestamps.
        let cc = self.wheel.is_some();
        let batch_ts = self.config.cc.batch_timestamps;
        let ts = if cc && batch_ts {
            self.clock.now_ns()
        } else {
            0
        };
        let ts_mask = self.tx_ts_cap - 1;
        for (j, e) in self.tx.entries[start..end].iter().enumerate() {
            let Some(s) = self
                .sessions
                .get(usize::from(e.session))
                .and_then(|s| s.as_deref())
            else {
                self.stats.tx_stale += 1;
                continue;
            };
            let Some(route) = s.route.as_ref() else {
                self.stats.tx_stale += 1;
                continue;
            };
            if cc && s.role == crate::session::Role::Client {
                let at = usize::from(e.slot) * self.tx_ts_cap + (e.pkt_idx as usize & ts_mask);
                if let Some(c) = s.tx_ts.get(at) {
                    c.set(if batch_ts { ts } else { self.clock.now_ns() });
                }
            }
            // Fault injection: one predictable branch when unused.
            let drop = s.fault_drop_tx.get() != 0;
            if drop {
                s.fault_drop_tx.set(s.fault_drop_tx.get() - 1);
                self.stats.tx_fault_dropped += 1;
            }
            let item = match e.kind {
                TxKind::Ctrl(c) => {
                    let o = usize::from(c) * CTRL_SLOT_BYTES;
                    TxItem {
                        route,
                        pkt: &ctrl_bytes[o..o + PKTHDR_BYTES],
                        pkt_iova: ctrl.iova_at(o),
                        data: &[],
                        data_iova: 0,
                        lkey: ctrl.lkey(),
                        drop,
                    }
                }
                TxKind::Msg => {
                    let slot = &s.slots[usize::from(e.slot)];
                    let Some(m) = slot.tx_msgbuf.as_ref() else {
                        self.stats.tx_stale += 1;
                        continue;
                    };
                    if slot.cur_req_num != e.req_num || !m.has_pkt(e.pkt_idx as usize) {
                        self.stats.tx_stale += 1;
                        continue;
                    }
                    let (pkt, pkt_iova, data, data_iova) = m.tx_parts(e.pkt_idx as usize);
                    TxItem {
                        route,
                        pkt,
                        pkt_iova,
                        data,
                        data_iova,
                        lkey: m.lkey(),
                        drop,
                    }
                }
            };
            entry_of[burst.len()] = j as u8;
            burst.push(item);
        }
        let k = burst.len();
        if k == 0 {
            return end - start;
        }
        let sent = self.transport.tx_burst(&burst).min(k);
        self.stats.tx_bursts += 1;
        self.stats.tx_pkts += sent as u64;
        if sent == k {
            end - start
        } else {
            usize::from(entry_of[sent])
        }
    }
}

//! A networked sequencer behind eRPC (the RDMA design guidelines' second
//! system, Kalia et al., ATC'16): client sessions ask for the next number;
//! the server hands out consecutive numbers from one counter shared by its
//! Rpcs (one per thread; a cache-line-padded atomic).
//!
//! Per-request handlers add 1 per request. Burst handlers (`burst`
//! feature) add N once for a burst of N requests and hand out x … x+N−1 in
//! the burst's order: one atomic read-modify-write per burst instead of
//! one per request.
//!
//! ```text
//! NEXT request  client u32 | seq u64    response  x u64
//! ```
//!
//! **Exactly once**, precisely: every number below the counter's final
//! value was taken by exactly one execution of a request at the server
//! (eRPC runs a request's handler at most once, however often the client
//! retransmits it, and answers duplicates from the kept response), and is
//! delivered to at most one client, the one that sent that request. A
//! number whose response never reached its client, because the request
//! failed there (its session failed or was reset) or the client crashed
//! while it was outstanding, is a *gap*: lost to everyone, never handed
//! out again. So the check is: no number is received twice, none is at or
//! above the counter, and the gaps are at most the requests that failed
//! or were outstanding at a crash (none when nothing failed). The tests
//! check more with the server's log ([`SeqServer::log`]): each gap is the
//! number of one such request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;

use erpc::{Completion, NexusBuilder, Request, Rpc, SessionNum};
use transport::Transport;

/// Request type.
pub mod req {
    /// NEXT.
    pub const NEXT: u8 = 60;
}

/// Request bytes: client number, request sequence number.
pub const REQ_BYTES: usize = 12;
/// Response bytes: the number.
pub const RESP_BYTES: usize = 8;

/// The counter the server's Rpcs share (on its own cache line).
pub type Counter = Arc<CachePadded<AtomicU64>>;

/// A fresh counter at 0.
pub fn counter() -> Counter {
    Arc::new(CachePadded::new(AtomicU64::new(0)))
}

/// One number handed out (the server's log, for the tests' audit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Client that asked.
    pub client: u32,
    /// Its request's sequence number.
    pub seq: u64,
    /// The number.
    pub x: u64,
}

/// Which handlers the server registers.
pub use crate::herd::Handlers;

/// A server Rpc's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Numbers handed out by this Rpc.
    pub handed: u64,
    /// Malformed requests (answered empty, no number taken).
    pub bad: u64,
    /// Bursts handed to the burst handler.
    pub bursts: u64,
    /// Responses eRPC refused.
    pub respond_errors: u64,
}

/// A server Rpc's state.
#[derive(Debug)]
pub struct SeqServer {
    /// The shared counter.
    pub counter: Counter,
    /// Counters.
    pub stats: ServerStats,
    /// Every number handed out, when `Some` (tests; preallocate it: a push
    /// past its capacity allocates in the handler).
    pub log: Option<Vec<Grant>>,
}

impl SeqServer {
    /// A server Rpc's state over `counter`.
    pub fn new(counter: Counter) -> SeqServer {
        SeqServer {
            counter,
            stats: ServerStats::default(),
            log: None,
        }
    }
}

/// (client, seq) of a well-formed request.
#[inline]
fn parse(d: &[u8]) -> Option<(u32, u64)> {
    if d.len() != REQ_BYTES {
        return None;
    }
    Some((
        u32::from_le_bytes(d[..4].try_into().expect("4 bytes")),
        u64::from_le_bytes(d[4..].try_into().expect("8 bytes")),
    ))
}

#[inline]
fn grant<T: Transport>(
    rpc: &mut Rpc<T, SeqServer>,
    st: &mut SeqServer,
    h: erpc::ReqHandle,
    who: Option<(u32, u64)>,
    x: u64,
) {
    let r = match who {
        Some((client, seq)) => {
            st.stats.handed += 1;
            if let Some(log) = &mut st.log {
                log.push(Grant { client, seq, x });
            }
            rpc.respond(h, &x.to_le_bytes())
        }
        None => {
            st.stats.bad += 1;
            rpc.respond(h, &[])
        }
    };
    if r.is_err() {
        st.stats.respond_errors += 1;
    }
}

fn on_next<T: Transport>(rpc: &mut Rpc<T, SeqServer>, st: &mut SeqServer, r: Request<'_>) {
    let who = parse(r.data);
    // Relaxed: the numbers only need to be distinct, which every
    // read-modify-write of one location guarantees.
    let x = if who.is_some() {
        st.counter.fetch_add(1, Ordering::Relaxed)
    } else {
        0
    };
    grant(rpc, st, r.handle, who, x);
}

fn on_next_burst<T: Transport>(
    rpc: &mut Rpc<T, SeqServer>,
    st: &mut SeqServer,
    b: &mut erpc::Burst<'_>,
) {
    st.stats.bursts += 1;
    let n = (0..b.len()).filter(|&i| parse(b.data(i)).is_some()).count() as u64;
    // One add for the whole burst (Relaxed, as above).
    let mut x = st.counter.fetch_add(n, Ordering::Relaxed);
    for i in 0..b.len() {
        let who = parse(b.data(i));
        let h = b.take(i);
        grant(rpc, st, h, who, x);
        x += u64::from(who.is_some());
    }
}

/// Registers the server's handler.
pub fn register<T: Transport + 'static>(b: NexusBuilder, h: Handlers) -> NexusBuilder {
    match h {
        Handlers::PerRequest => b.handler::<T, SeqServer>(req::NEXT, on_next::<T>),
        Handlers::Burst => b.burst_handler::<T, SeqServer>(req::NEXT, on_next_burst::<T>),
    }
}

/// A client Rpc's state: `window` requests in flight over its sessions
/// (round robin), every number it gets recorded.
#[derive(Debug)]
pub struct SeqClient {
    /// This client's number.
    pub id: u32,
    sessions: Vec<SessionNum>,
    window: usize,
    next_session: usize,
    next_seq: u64,
    in_flight: usize,
    /// Keep issuing.
    pub running: bool,
    /// (seq, number) of every answer.
    pub got: Vec<(u64, u64)>,
    /// Sequence numbers of the requests that failed.
    pub failed: Vec<u64>,
    /// Malformed answers.
    pub wrong: u64,
    /// Requests that could not be sent.
    pub errors: u64,
    /// Latency, ns (from the send).
    pub latency: Histogram<u64>,
}

impl SeqClient {
    /// Client `id` over `sessions`, `window` in flight.
    pub fn new(id: u32, sessions: Vec<SessionNum>, window: usize) -> SeqClient {
        SeqClient {
            id,
            sessions,
            window,
            next_session: 0,
            next_seq: 0,
            in_flight: 0,
            running: true,
            got: Vec::new(),
            failed: Vec::new(),
            wrong: 0,
            errors: 0,
            latency: crate::stats::histogram(),
        }
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Requests sent (sequence numbers `0..sent`).
    pub fn sent(&self) -> u64 {
        self.next_seq
    }

    /// Tops the window up.
    pub fn drive<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, SeqClient>) {
        while self.running && self.in_flight < self.window && !self.sessions.is_empty() {
            let sn = self.sessions[self.next_session];
            self.next_session = (self.next_session + 1) % self.sessions.len();
            let Some((mut q, r)) = crate::alloc_pair(rpc, REQ_BYTES, RESP_BYTES) else {
                self.errors += 1;
                return;
            };
            let d = q.data_mut();
            d[..4].copy_from_slice(&self.id.to_le_bytes());
            d[4..].copy_from_slice(&self.next_seq.to_le_bytes());
            let tag = rpc.now_ns() as usize;
            match rpc.enqueue_request(sn, req::NEXT, q, r, on_got::<T>, tag) {
                Ok(()) => {
                    self.in_flight += 1;
                    self.next_seq += 1;
                }
                Err(e) => {
                    tracing::warn!(kind = ?e.kind, "cannot enqueue a request");
                    rpc.free_msg_buffer(e.req);
                    rpc.free_msg_buffer(e.resp);
                    self.errors += 1;
                    // A session that is gone would fail every later
                    // request too: the load stops.
                    self.running = false;
                    return;
                }
            }
        }
    }
}

fn on_got<T: Transport + 'static>(rpc: &mut Rpc<T, SeqClient>, st: &mut SeqClient, c: Completion) {
    st.in_flight -= 1;
    let seq = u64::from_le_bytes(c.req.data()[4..].try_into().expect("our request"));
    match c.result {
        Ok(()) => match <[u8; RESP_BYTES]>::try_from(c.resp.data()) {
            Ok(x) => {
                st.got.push((seq, u64::from_le_bytes(x)));
                let _ = st
                    .latency
                    .record(rpc.now_ns().saturating_sub(c.tag as u64).max(1));
            }
            Err(_) => st.wrong += 1,
        },
        Err(e) => {
            tracing::debug!(error = %e, seq, "request failed");
            st.failed.push(seq);
        }
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

/// What the audit of a run found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audit {
    /// The counter's final value: numbers taken.
    pub taken: u64,
    /// Numbers the clients received.
    pub received: u64,
    /// Numbers received more than once (each extra time).
    pub duplicates: u64,
    /// Numbers received at or above the counter.
    pub out_of_range: u64,
    /// Numbers taken and received by no one.
    pub gaps: u64,
    /// Requests that failed or were outstanding when their client
    /// crashed: the most gaps there may be.
    pub lost_requests: u64,
}

impl Audit {
    /// Exactly once, as the module defines it.
    pub fn ok(&self) -> bool {
        self.duplicates == 0 && self.out_of_range == 0 && self.gaps <= self.lost_requests
    }
}

impl std::fmt::Display for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} numbers taken, {} received, {} duplicates, {} out of range, {} gaps ({} requests \
             failed or lost to a crash)",
            self.taken,
            self.received,
            self.duplicates,
            self.out_of_range,
            self.gaps,
            self.lost_requests
        )
    }
}

/// Audits the numbers the clients received (`got` of each) against the
/// counter's final value `taken`; `lost_requests` are the requests that
/// failed or were outstanding at a crash.
pub fn audit<'a>(
    taken: u64,
    got: impl IntoIterator<Item = &'a [(u64, u64)]>,
    lost_requests: u64,
) -> Audit {
    let mut all: Vec<u64> = got
        .into_iter()
        .flat_map(|g| g.iter().map(|&(_, x)| x))
        .collect();
    all.sort_unstable();
    let received = all.len() as u64;
    let duplicates = all.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    let out_of_range = all.iter().filter(|&&x| x >= taken).count() as u64;
    all.dedup();
    let distinct_in_range = all.iter().filter(|&&x| x < taken).count() as u64;
    Audit {
        taken,
        received,
        duplicates,
        out_of_range,
        gaps: taken - distinct_in_range,
        lost_requests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_finds_duplicates_gaps_and_strays() {
        let a = [(0, 0), (1, 1), (2, 2)];
        let b = [(0, 3), (1, 4)];
        let clean = audit(5, [&a[..], &b[..]], 0);
        assert!(clean.ok(), "{clean}");
        assert_eq!((clean.received, clean.gaps), (5, 0));
        let dup = audit(5, [&a[..], &[(0, 2), (1, 4)][..]], 3);
        assert_eq!(dup.duplicates, 1);
        assert!(!dup.ok());
        let gap = audit(6, [&a[..], &b[..]], 0);
        assert_eq!(gap.gaps, 1);
        assert!(!gap.ok(), "a gap with no failed request");
        assert!(audit(6, [&a[..], &b[..]], 1).ok());
        let stray = audit(4, [&a[..], &b[..]], 5);
        assert_eq!(stray.out_of_range, 1);
        assert!(!stray.ok());
        assert_eq!(parse(&[0; 11]), None);
        assert_eq!(parse(&[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]), Some((1, 2)));
    }
}

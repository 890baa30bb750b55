//! An ordered key-value store behind eRPC, the paper's Masstree case
//! study: an ordered concurrent index (crossbeam's lock-free skip list)
//! shared by the dispatch thread and the worker threads. GET and PUT are
//! short and run in the dispatch thread (a GET reads its key in the RX
//! ring, zero copy); SCAN(start, n) reads up to 128 consecutive entries
//! (10 KiB of response) and runs on a background worker, so that a long
//! request never holds up the short ones queued behind it in the
//! dispatch thread. [`ScanMode::Dispatch`] runs scans in the dispatch
//! thread instead, for the comparison.
//!
//! ```text
//! GET  request  key [16]                    response  found u8 | value [64]
//! PUT  request  key [16] | value [64]       response  (empty)
//! SCAN request  start [16] | count u16      response  n u16 | (key [16] | value [64]) * n
//! ```
//!
//! Values are a function of their key ([`value_of`]), so every answer the
//! benchmark client gets is checked.

use std::ops::Bound;
use std::sync::Arc;

use crossbeam_skiplist::SkipMap;
use hdrhistogram::Histogram;

use erpc::{BgResponse, Completion, NexusBuilder, Request, Rpc};
use transport::Transport;

use crate::raftkv::client::key;
use crate::raftkv::wire::{KEY_BYTES, Key, VALUE_BYTES, Value};

/// Request types.
pub mod req {
    /// GET (dispatch thread).
    pub const GET: u8 = 40;
    /// PUT (dispatch thread).
    pub const PUT: u8 = 41;
    /// SCAN (a worker, or the dispatch thread in [`super::ScanMode::Dispatch`]).
    pub const SCAN: u8 = 42;
}

/// Most entries one SCAN returns.
pub const MAX_SCAN: usize = 128;
/// Bytes per scanned entry.
pub const ENTRY_BYTES: usize = KEY_BYTES + VALUE_BYTES;
/// SCAN response size for `n` entries.
pub const fn scan_resp_bytes(n: usize) -> usize {
    2 + n * ENTRY_BYTES
}

/// The index.
pub type Index = SkipMap<Key, Value>;

/// Where SCANs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// On the Nexus's worker threads (background handler).
    Workers,
    /// In the dispatch thread, like GET and PUT.
    Dispatch,
}

impl std::fmt::Display for ScanMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScanMode::Workers => "scans on workers",
            ScanMode::Dispatch => "scans in dispatch",
        })
    }
}

/// The value stored at key number `i` (checkable by readers).
pub fn value_of(k: &Key) -> Value {
    let mut v = [0u8; VALUE_BYTES];
    for (i, b) in v.iter_mut().enumerate() {
        *b = k[i % KEY_BYTES] ^ (i as u8).wrapping_mul(37);
    }
    v
}

/// An index holding keys `0..n` ([`key`]) with their [`value_of`].
pub fn load(n: u64) -> Arc<Index> {
    let m = SkipMap::new();
    for i in 0..n {
        let k = key(i);
        m.insert(k, value_of(&k));
    }
    Arc::new(m)
}

/// Parses a SCAN request: start key and count (1 to [`MAX_SCAN`]).
pub fn parse_scan(b: &[u8]) -> Option<(Key, usize)> {
    if b.len() != KEY_BYTES + 2 {
        return None;
    }
    let start: Key = b[..KEY_BYTES].try_into().ok()?;
    let n = usize::from(u16::from_le_bytes(b[KEY_BYTES..].try_into().ok()?));
    (1..=MAX_SCAN).contains(&n).then_some((start, n))
}

/// Runs a scan into `buf` (at least [`scan_resp_bytes`]`(n)` long);
/// returns the bytes written.
pub fn scan(index: &Index, start: &Key, n: usize, buf: &mut [u8]) -> usize {
    let mut count = 0usize;
    for e in index
        .range::<Key, _>((Bound::Included(start), Bound::Unbounded))
        .take(n)
    {
        let at = 2 + count * ENTRY_BYTES;
        buf[at..at + KEY_BYTES].copy_from_slice(e.key());
        buf[at + KEY_BYTES..at + ENTRY_BYTES].copy_from_slice(e.value());
        count += 1;
    }
    buf[..2].copy_from_slice(&(count as u16).to_le_bytes());
    scan_resp_bytes(count)
}

/// The server's per-Rpc state.
#[derive(Debug)]
pub struct ServerState {
    /// The index (shared with the workers).
    pub index: Arc<Index>,
    /// Malformed requests.
    pub bad: u64,
    scratch: Vec<u8>,
}

impl ServerState {
    /// State for a server Rpc over `index`.
    pub fn new(index: Arc<Index>) -> ServerState {
        ServerState {
            index,
            bad: 0,
            scratch: vec![0; scan_resp_bytes(MAX_SCAN)],
        }
    }
}

fn on_get<T: Transport>(rpc: &mut Rpc<T, ServerState>, st: &mut ServerState, r: Request<'_>) {
    let mut out = [0u8; 1 + VALUE_BYTES];
    match <&Key>::try_from(r.data) {
        Ok(k) => {
            if let Some(e) = st.index.get(k) {
                out[0] = 1;
                out[1..].copy_from_slice(e.value());
            }
        }
        Err(_) => st.bad += 1,
    }
    let _ = rpc.respond(r.handle, &out);
}

fn on_put<T: Transport>(rpc: &mut Rpc<T, ServerState>, st: &mut ServerState, r: Request<'_>) {
    if r.data.len() == ENTRY_BYTES {
        let k: Key = r.data[..KEY_BYTES].try_into().expect("length checked");
        let v: Value = r.data[KEY_BYTES..].try_into().expect("length checked");
        st.index.insert(k, v);
    } else {
        st.bad += 1;
    }
    let _ = rpc.respond(r.handle, &[]);
}

fn on_scan_dispatch<T: Transport>(
    rpc: &mut Rpc<T, ServerState>,
    st: &mut ServerState,
    r: Request<'_>,
) {
    let len = match parse_scan(r.data) {
        Some((start, n)) => scan(&st.index, &start, n, &mut st.scratch),
        None => {
            st.bad += 1;
            st.scratch[..2].fill(0);
            2
        }
    };
    let _ = rpc.respond(r.handle, &st.scratch[..len]);
}

/// Registers the server's handlers: GET and PUT in dispatch, SCAN per
/// `mode` (the background handler holds its own reference to `index`).
pub fn register<T: Transport + 'static>(
    b: NexusBuilder,
    index: Arc<Index>,
    mode: ScanMode,
) -> NexusBuilder {
    let b = b
        .handler::<T, ServerState>(req::GET, on_get::<T>)
        .handler::<T, ServerState>(req::PUT, on_put::<T>);
    match mode {
        ScanMode::Dispatch => b.handler::<T, ServerState>(req::SCAN, on_scan_dispatch::<T>),
        ScanMode::Workers => b.bg_handler(req::SCAN, move |data, resp: &mut BgResponse<'_>| {
            match parse_scan(data) {
                Some((start, n)) => {
                    let buf = resp.buf(scan_resp_bytes(n));
                    let len = scan(&index, &start, n, buf);
                    if len < buf.len() {
                        // Fewer entries (the end of the index): the
                        // response shrinks to them (a copy, rare).
                        let kept = buf[..len].to_vec();
                        resp.write(&kept);
                    }
                }
                None => resp.write(&[0, 0]),
            }
        }),
    }
}

/// The benchmark client's settings.
#[derive(Debug, Clone, Copy)]
pub struct LoadConfig {
    /// Keys in the index (`0..keys`).
    pub keys: u64,
    /// Requests kept in flight.
    pub window: usize,
    /// SCANs per 1000 requests.
    pub scans_per_mille: u64,
    /// PUTs per 1000 requests (each writes its key's [`value_of`], so
    /// reads stay checkable); the rest are GETs.
    pub puts_per_mille: u64,
    /// Entries per SCAN.
    pub scan_len: usize,
    /// Seed.
    pub seed: u64,
}

/// The benchmark client's state: a closed loop of `window` requests, each
/// answer checked against [`value_of`].
#[derive(Debug)]
pub struct LoadState {
    cfg: LoadConfig,
    session: Option<u16>,
    in_flight: usize,
    rng: netsim::Rng,
    /// Keep issuing requests.
    pub running: bool,
    /// GET latency, ns.
    pub get_latency: Histogram<u64>,
    /// SCAN latency, ns.
    pub scan_latency: Histogram<u64>,
    /// PUT latency, ns.
    pub put_latency: Histogram<u64>,
    /// Answers that were wrong (a checked value or order did not match).
    pub wrong: u64,
    /// Requests that failed in eRPC.
    pub errors: u64,
}

impl LoadState {
    /// A client over `cfg`.
    pub fn new(cfg: LoadConfig) -> LoadState {
        LoadState {
            cfg,
            session: None,
            in_flight: 0,
            rng: netsim::Rng::new(cfg.seed),
            running: true,
            get_latency: crate::stats::histogram(),
            scan_latency: crate::stats::histogram(),
            put_latency: crate::stats::histogram(),
            wrong: 0,
            errors: 0,
        }
    }

    /// Uses session `sn` (connected, to the server).
    pub fn set_session(&mut self, sn: u16) {
        self.session = Some(sn);
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Clears the histograms (after a warm-up).
    pub fn reset(&mut self) {
        self.get_latency.reset();
        self.scan_latency.reset();
        self.put_latency.reset();
    }

    /// Tops the window up.
    pub fn drive<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, LoadState>) {
        let Some(sn) = self.session else { return };
        while self.running && self.in_flight < self.cfg.window {
            let k = key(self.rng.next_u64() % self.cfg.keys);
            let dice = self.rng.next_u64() % 1000;
            let scan = dice < self.cfg.scans_per_mille;
            let put = !scan && dice < self.cfg.scans_per_mille + self.cfg.puts_per_mille;
            let (t, req_len, resp_len) = if scan {
                (req::SCAN, KEY_BYTES + 2, scan_resp_bytes(self.cfg.scan_len))
            } else if put {
                (req::PUT, ENTRY_BYTES, 0)
            } else {
                (req::GET, KEY_BYTES, 1 + VALUE_BYTES)
            };
            let Some((mut req, resp)) = crate::alloc_pair(rpc, req_len, resp_len) else {
                self.errors += 1;
                return;
            };
            let d = req.data_mut();
            d[..KEY_BYTES].copy_from_slice(&k);
            if scan {
                d[KEY_BYTES..].copy_from_slice(&(self.cfg.scan_len as u16).to_le_bytes());
            } else if put {
                d[KEY_BYTES..].copy_from_slice(&value_of(&k));
            }
            let now = rpc.now_ns() as usize;
            match rpc.enqueue_request(sn, t, req, resp, on_done::<T>, now) {
                Ok(()) => self.in_flight += 1,
                Err(e) => {
                    tracing::warn!(kind = ?e.kind, "cannot enqueue a request");
                    rpc.free_msg_buffer(e.req);
                    rpc.free_msg_buffer(e.resp);
                    self.errors += 1;
                    return;
                }
            }
        }
    }
}

/// Checks a SCAN answer: sorted, starting at or after `start`, values
/// matching their keys, `n` entries unless the index ended.
fn scan_ok(start: &[u8], resp: &[u8], n: usize) -> bool {
    if resp.len() < 2 {
        return false;
    }
    let count = usize::from(u16::from_le_bytes([resp[0], resp[1]]));
    if resp.len() != scan_resp_bytes(count) || count > n || count == 0 {
        return false;
    }
    let mut prev: &[u8] = start;
    for (i, e) in resp[2..].chunks_exact(ENTRY_BYTES).enumerate() {
        let (k, v) = e.split_at(KEY_BYTES);
        let k: &Key = k.try_into().expect("exact chunk");
        let in_order = if i == 0 {
            k.as_slice() >= prev
        } else {
            k.as_slice() > prev
        };
        if !in_order || v != value_of(k) {
            return false;
        }
        prev = k;
    }
    true
}

fn on_done<T: Transport + 'static>(rpc: &mut Rpc<T, LoadState>, st: &mut LoadState, c: Completion) {
    st.in_flight -= 1;
    let lat = rpc.now_ns().saturating_sub(c.tag as u64).max(1);
    match c.result {
        Ok(()) => {
            let r = c.resp.data();
            let q = c.req.data();
            if q.len() == ENTRY_BYTES {
                if !r.is_empty() {
                    st.wrong += 1;
                }
                let _ = st.put_latency.record(lat);
            } else if q.len() == KEY_BYTES {
                let k: &Key = q.try_into().expect("a GET request");
                if r.len() != 1 + VALUE_BYTES || r[0] != 1 || r[1..] != value_of(k)[..] {
                    st.wrong += 1;
                }
                let _ = st.get_latency.record(lat);
            } else {
                if !scan_ok(&q[..KEY_BYTES], r, st.cfg.scan_len) {
                    st.wrong += 1;
                }
                let _ = st.scan_latency.record(lat);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "request failed");
            st.errors += 1;
        }
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_are_ordered_and_checked() {
        let idx = load(1000);
        let mut buf = vec![0u8; scan_resp_bytes(MAX_SCAN)];
        let start = key(500);
        let len = scan(&idx, &start, 128, &mut buf);
        assert_eq!(len, scan_resp_bytes(128));
        assert!(scan_ok(&start, &buf[..len], 128));
        // Keys are ordered by their big-endian index: the last ones end early.
        let len = scan(&idx, &key(990), 128, &mut buf);
        assert_eq!(len, scan_resp_bytes(10));
        assert!(scan_ok(&key(990), &buf[..len], 128));
        // Damage is caught.
        let len = scan(&idx, &start, 4, &mut buf);
        let mut bad = buf[..len].to_vec();
        bad[2 + KEY_BYTES] ^= 1;
        assert!(!scan_ok(&start, &bad, 4));
        assert!(parse_scan(&[0; 18]).is_none(), "count 0");
        let mut r = [0u8; 18];
        r[16] = 129;
        assert!(parse_scan(&r).is_none(), "count above 128");
        r[16] = 128;
        assert_eq!(parse_scan(&r).unwrap().1, 128);
    }
}

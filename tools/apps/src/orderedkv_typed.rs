//! The ordered key-value store of [`crate::orderedkv`] on the typed API
//! (`erpc-typed`): the same index, the same handlers' work (GET and PUT in
//! the dispatch thread, SCAN on a background worker or in dispatch), the
//! same checked closed-loop client; requests and responses are serde
//! types instead of hand-laid bytes, handlers are closures, and the
//! client is `window` async tasks, each awaiting its calls.
//!
//! ```text
//! Get  { key }            -> Option<Value>
//! Put  { key, value }     -> ()
//! Scan { start, count }   -> Vec<Entry>      (at most MAX_SCAN, sorted)
//! ```
//!
//! Keys and values are byte arrays, sent as bytes (`serde_bytes`).
//! `ordered-kv` runs this store and the raw one in the same run.

use std::cell::RefCell;
use std::ops::Bound;
use std::rc::Rc;
use std::sync::Arc;

use erpc_typed::{CallError, Client, Endpoint, Method, Service};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use transport::Transport;

use crate::orderedkv::{Index, LoadConfig, MAX_SCAN, ScanMode, value_of};
use crate::raftkv::client::key;
use crate::raftkv::wire::{KEY_BYTES, Key, VALUE_BYTES, Value};

/// Request types (distinct from the raw store's, so that both may share
/// a Nexus).
pub mod req {
    /// GET.
    pub const GET: u8 = 50;
    /// PUT.
    pub const PUT: u8 = 51;
    /// SCAN.
    pub const SCAN: u8 = 52;
}

/// GET: the value at `key`, if any.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Get {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Key,
}

/// A value, sent as bytes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Val(#[serde(with = "serde_bytes")] pub Value);

impl Method for Get {
    const REQ_TYPE: u8 = req::GET;
    type Resp = Option<Val>;
}

/// PUT: stores `value` at `key`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Put {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Key,
    /// The value.
    #[serde(with = "serde_bytes")]
    pub value: Value,
}

impl Method for Put {
    const REQ_TYPE: u8 = req::PUT;
    type Resp = ();
}

/// SCAN: up to `count` entries from `start` on, in key order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Scan {
    /// The first key (or the next one present).
    #[serde(with = "serde_bytes")]
    pub start: Key,
    /// Entries wanted, 1 to [`MAX_SCAN`].
    pub count: u16,
}

/// One scanned entry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Entry {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Key,
    /// Its value.
    #[serde(with = "serde_bytes")]
    pub value: Value,
}

impl Method for Scan {
    const REQ_TYPE: u8 = req::SCAN;
    type Resp = Vec<Entry>;
    // A length, then per entry two lengths, the key and the value.
    const MAX_RESP_BYTES: usize = 3 + MAX_SCAN * (2 + KEY_BYTES + VALUE_BYTES);
}

/// A scan, typed: an empty list for a count out of range.
pub fn scan(index: &Index, s: &Scan) -> Vec<Entry> {
    let n = usize::from(s.count);
    if !(1..=MAX_SCAN).contains(&n) {
        return Vec::new();
    }
    index
        .range::<Key, _>((Bound::Included(&s.start), Bound::Unbounded))
        .take(n)
        .map(|e| Entry {
            key: *e.key(),
            value: *e.value(),
        })
        .collect()
}

/// The server's per-Rpc state.
#[derive(Debug)]
pub struct Server {
    /// The index (shared with the workers).
    pub index: Arc<Index>,
}

/// The store's service: GET and PUT in the event loop, SCAN per `mode`.
pub fn service<T: Transport + 'static>(index: Arc<Index>, mode: ScanMode) -> Service<T, Server> {
    let s = Service::<T, Server>::new()
        .handle(|ctx, g: Get| ctx.index.get(&g.key).map(|e| Val(*e.value())))
        .handle(|ctx, p: Put| {
            ctx.index.insert(p.key, p.value);
        });
    match mode {
        ScanMode::Dispatch => s.handle(|ctx, sc: Scan| scan(&ctx.index, &sc)),
        ScanMode::Workers => s.handle_background(move |sc: Scan| scan(&index, &sc)),
    }
}

/// What the client measured.
#[derive(Debug)]
pub struct LoadStats {
    /// GET latency, ns.
    pub get_latency: Histogram<u64>,
    /// SCAN latency, ns.
    pub scan_latency: Histogram<u64>,
    /// PUT latency, ns.
    pub put_latency: Histogram<u64>,
    /// Answers that were wrong.
    pub wrong: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Keep issuing requests.
    pub running: bool,
    /// Tasks still running.
    pub tasks: usize,
    rng: netsim::Rng,
}

impl LoadStats {
    /// Clears the histograms (after a warm-up).
    pub fn reset(&mut self) {
        self.get_latency.reset();
        self.scan_latency.reset();
        self.put_latency.reset();
    }

    /// Requests measured.
    pub fn count(&self) -> u64 {
        self.get_latency.len() + self.scan_latency.len() + self.put_latency.len()
    }
}

/// The client endpoint's context (the load lives in tasks).
#[derive(Debug, Default)]
pub struct ClientCtx;

/// Checks a typed SCAN answer: sorted, from `start` on, values matching
/// their keys, `n` entries unless the index ended (never none).
fn scan_ok(start: &Key, r: &[Entry], n: usize) -> bool {
    if r.is_empty() || r.len() > n {
        return false;
    }
    let mut prev = *start;
    for (i, e) in r.iter().enumerate() {
        let ordered = if i == 0 { e.key >= prev } else { e.key > prev };
        if !ordered || e.value != value_of(&e.key) {
            return false;
        }
        prev = e.key;
    }
    true
}

/// Starts `cfg.window` tasks on `ep`, each calling the store on
/// `session` in a closed loop (the mix of [`LoadConfig`]) and checking
/// every answer, until [`LoadStats::running`] is cleared.
pub fn start_load<T: Transport + 'static>(
    ep: &Endpoint<T, ClientCtx>,
    session: u16,
    cfg: LoadConfig,
) -> Rc<RefCell<LoadStats>> {
    let stats = Rc::new(RefCell::new(LoadStats {
        get_latency: crate::stats::histogram(),
        scan_latency: crate::stats::histogram(),
        put_latency: crate::stats::histogram(),
        wrong: 0,
        errors: 0,
        running: true,
        tasks: cfg.window,
        rng: netsim::Rng::new(cfg.seed),
    }));
    for _ in 0..cfg.window {
        let (api, st) = (ep.client(), stats.clone());
        ep.spawn(async move {
            while st.borrow().running {
                one_call(&api, session, &cfg, &st).await;
            }
            st.borrow_mut().tasks -= 1;
        });
    }
    stats
}

async fn one_call<T: Transport + 'static>(
    api: &Client<T, ClientCtx>,
    session: u16,
    cfg: &LoadConfig,
    st: &RefCell<LoadStats>,
) {
    let (k, dice) = {
        let mut s = st.borrow_mut();
        let k = key(s.rng.next_u64() % cfg.keys);
        (k, s.rng.next_u64() % 1000)
    };
    let scan = dice < cfg.scans_per_mille;
    let put = !scan && dice < cfg.scans_per_mille + cfg.puts_per_mille;
    let now = || api.with(|ctx| ctx.rpc().now_ns());
    let t0 = now();
    // The answer's verdict (None: the call failed) and its histogram.
    let (ok, which): (Result<bool, CallError>, u8) = if scan {
        let r = api
            .call(
                session,
                Scan {
                    start: k,
                    count: cfg.scan_len as u16,
                },
            )
            .await;
        (r.map(|v| scan_ok(&k, &v, cfg.scan_len)), 1)
    } else if put {
        let r = api
            .call(
                session,
                Put {
                    key: k,
                    value: value_of(&k),
                },
            )
            .await;
        (r.map(|()| true), 2)
    } else {
        let r = api.call(session, Get { key: k }).await;
        (r.map(|v| v == Some(Val(value_of(&k)))), 0)
    };
    let lat = now().saturating_sub(t0).max(1);
    let mut s = st.borrow_mut();
    match ok {
        Ok(true) => {}
        Ok(false) => s.wrong += 1,
        Err(e) => {
            tracing::warn!(error = %e, "call failed");
            s.errors += 1;
        }
    }
    let h = match which {
        0 => &mut s.get_latency,
        1 => &mut s.scan_latency,
        _ => &mut s.put_latency,
    };
    let _ = h.record(lat);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_scans_are_ordered_and_checked() {
        let idx = crate::orderedkv::load(300);
        let r = scan(
            &idx,
            &Scan {
                start: key(250),
                count: 128,
            },
        );
        assert_eq!(r.len(), 50, "what is left after key 250");
        assert!(scan_ok(&key(250), &r, 128));
        let mut bad = r.clone();
        bad[3].value[0] ^= 1;
        assert!(!scan_ok(&key(250), &bad, 128));
        assert!(
            scan(
                &idx,
                &Scan {
                    start: key(0),
                    count: 0
                }
            )
            .is_empty()
        );
        // The largest answer fits the room the client makes for it.
        let full = scan(
            &idx,
            &Scan {
                start: key(0),
                count: 128,
            },
        );
        let bytes = erpc_typed::codec::to_vec(&full).unwrap();
        assert!(bytes.len() <= Scan::MAX_RESP_BYTES, "{}", bytes.len());
    }
}

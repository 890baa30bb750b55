//! A HERD-style key-value store behind eRPC (Kalia et al., the RDMA design
//! guidelines, ATC'16; HERD, SIGCOMM'14): 16-byte keys, 32-byte values in
//! a bucketised hash table ([`table`]), GET and PUT in the dispatch
//! thread, the keys partitioned over the server's Rpcs (one per thread,
//! exclusive-read exclusive-write as in HERD/MICA: a client sends a key to
//! the Rpc that owns it, so no Rpc takes a lock).
//!
//! Two ways to serve, chosen when the Nexus is built ([`Handlers`]):
//! per-request handlers (a lookup each, one cache miss after another) and
//! burst handlers ([`erpc::BurstHandler`]) that prefetch every
//! bucket of an RX burst before reading any, so that the misses overlap.
//!
//! ```text
//! GET request  key [16]                response  status u8 | value [32]
//! PUT request  key [16] | value [32]   response  status u8
//! ```
//!
//! The answers are checked against a model ([`KvClient`]): a value names
//! its key, its version and its writer ([`value_for`]); only a key's owner
//! (client `key index % clients`) PUTs it, with increasing versions and
//! never two PUTs of one key in flight, so the owner knows which versions
//! a GET may return: at least the last one acknowledged before the GET was
//! sent, at most the last one sent (a failed PUT leaves that range open).
//! Other clients' keys are checked for form (key, writer, checksum).
//! After the load, every client reads back every key it wrote.

pub mod table;

use hdrhistogram::Histogram;
use rand_distr::{Distribution, Zipf};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

use erpc::{Completion, NexusBuilder, Request, Rpc, SessionNum};
use transport::Transport;

pub use table::{Table, hash, mix64};

/// Key bytes.
pub const KEY_BYTES: usize = 16;
/// Value bytes.
pub const VALUE_BYTES: usize = 32;
/// A key.
pub type Key = [u8; KEY_BYTES];
/// A value.
pub type Value = [u8; VALUE_BYTES];
/// GET response bytes.
pub const GET_RESP: usize = 1 + VALUE_BYTES;
/// PUT request bytes.
pub const PUT_REQ: usize = KEY_BYTES + VALUE_BYTES;

/// Request types.
pub mod req {
    /// GET.
    pub const GET: u8 = 50;
    /// PUT.
    pub const PUT: u8 = 51;
}

/// Response status.
pub mod status {
    /// GET: found (the value follows); PUT: stored.
    pub const OK: u8 = 1;
    /// GET: no such key.
    pub const NOT_FOUND: u8 = 0;
    /// PUT: the table is full.
    pub const FULL: u8 = 2;
    /// Malformed request.
    pub const BAD: u8 = 3;
}

/// Key number `i`: a scrambled half (so keys do not share prefixes) and
/// `i + 1` (so no key is all zeros, the table's empty mark).
pub fn key(i: u64) -> Key {
    let mut k = [0u8; KEY_BYTES];
    k[..8].copy_from_slice(&mix64(i ^ 0x4845_5244).to_le_bytes());
    k[8..].copy_from_slice(&(i + 1).to_le_bytes());
    k
}

/// The key number of a key made by [`key`].
pub fn key_index(k: &Key) -> Option<u64> {
    let i = u64::from_le_bytes(k[8..].try_into().expect("8 bytes")).checked_sub(1)?;
    (key(i) == *k).then_some(i)
}

/// The server Rpc (of `parts`) that owns `k`: from the hash's low half
/// (the table's home bucket uses the high half).
#[inline]
pub fn partition(k: &Key, parts: usize) -> usize {
    ((u64::from(hash(k) as u32) * parts as u64) >> 32) as usize
}

fn check_word(fp: u64, version: u64, writer: u64) -> u64 {
    mix64(fp ^ version.rotate_left(17) ^ writer.rotate_left(41) ^ 0x7631)
}

/// The value version `version` of `k` written by `writer` (0 with version
/// 0: the preload; else client id + 1): the key's hash, the version, the
/// writer and a check word over the three.
pub fn value_for(k: &Key, version: u64, writer: u64) -> Value {
    let fp = hash(k);
    let mut v = [0u8; VALUE_BYTES];
    v[..8].copy_from_slice(&fp.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v[16..24].copy_from_slice(&writer.to_le_bytes());
    v[24..].copy_from_slice(&check_word(fp, version, writer).to_le_bytes());
    v
}

/// (version, writer) of a value that is well formed for `k`.
pub fn check_value(k: &Key, v: &[u8]) -> Option<(u64, u64)> {
    let w = |i: usize| u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    if v.len() != VALUE_BYTES || w(0) != hash(k) {
        return None;
    }
    let (version, writer) = (w(1), w(2));
    (w(3) == check_word(w(0), version, writer)).then_some((version, writer))
}

/// The server's tables, one per partition, holding keys `0..items` at
/// version 0. Each is sized for its share with room for the hash's
/// imbalance.
pub fn preload(items: u64, parts: usize) -> Vec<Table> {
    let share = items as usize / parts.max(1);
    let room = share + share / 8 + 1024;
    let mut tables: Vec<Table> = (0..parts.max(1))
        .map(|_| Table::with_capacity(room))
        .collect();
    let n = tables.len();
    for i in 0..items {
        let k = key(i);
        tables[partition(&k, n)]
            .put(&k, &value_for(&k, 0, 0))
            .expect("a partition sized with room for the hash's imbalance");
    }
    tables
}

/// Which handlers the server registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handlers {
    /// One request at a time.
    PerRequest,
    /// A burst of requests of one type at a time, every bucket prefetched
    /// before any is read.
    Burst,
}

impl std::fmt::Display for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handlers::PerRequest => "per-request",
            Handlers::Burst => "burst",
        })
    }
}

/// What a server Rpc counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// GETs served.
    pub gets: u64,
    /// PUTs served.
    pub puts: u64,
    /// Malformed requests.
    pub bad: u64,
    /// PUTs refused (table full).
    pub full: u64,
    /// Bursts handed to burst handlers.
    pub bursts: u64,
    /// Requests in them.
    pub burst_reqs: u64,
    /// Responses eRPC refused (stale handle, no memory).
    pub respond_errors: u64,
}

/// A server Rpc's state: its partition of the table.
#[derive(Debug)]
pub struct KvServer {
    /// The partition this Rpc owns.
    pub table: Table,
    /// Counters.
    pub stats: ServerStats,
}

impl KvServer {
    /// A server over `table`.
    pub fn new(table: Table) -> KvServer {
        KvServer {
            table,
            stats: ServerStats::default(),
        }
    }
}

/// Serves a GET into `out` (status, value).
#[inline]
fn serve_get(st: &mut KvServer, data: &[u8], out: &mut [u8; GET_RESP]) {
    st.stats.gets += 1;
    out[0] = match <&Key>::try_from(data) {
        Ok(k) => match st.table.get(k) {
            Some(v) => {
                out[1..].copy_from_slice(v);
                status::OK
            }
            None => status::NOT_FOUND,
        },
        Err(_) => {
            st.stats.bad += 1;
            status::BAD
        }
    };
}

/// Serves a PUT: its status.
#[inline]
fn serve_put(st: &mut KvServer, data: &[u8]) -> u8 {
    st.stats.puts += 1;
    if data.len() != PUT_REQ {
        st.stats.bad += 1;
        return status::BAD;
    }
    let k: &Key = data[..KEY_BYTES].try_into().expect("length checked");
    let v: &Value = data[KEY_BYTES..].try_into().expect("length checked");
    match st.table.put(k, v) {
        Ok(()) => status::OK,
        Err(table::PutError::Full) => {
            st.stats.full += 1;
            status::FULL
        }
        Err(table::PutError::ZeroKey) => {
            st.stats.bad += 1;
            status::BAD
        }
    }
}

fn on_get<T: Transport>(rpc: &mut Rpc<T, KvServer>, st: &mut KvServer, r: Request<'_>) {
    let mut out = [0u8; GET_RESP];
    serve_get(st, r.data, &mut out);
    let len = if out[0] == status::OK { GET_RESP } else { 1 };
    if rpc.respond(r.handle, &out[..len]).is_err() {
        st.stats.respond_errors += 1;
    }
}

fn on_put<T: Transport>(rpc: &mut Rpc<T, KvServer>, st: &mut KvServer, r: Request<'_>) {
    let s = serve_put(st, r.data);
    if rpc.respond(r.handle, &[s]).is_err() {
        st.stats.respond_errors += 1;
    }
}

/// The burst handlers: every bucket of the burst prefetched, then each
/// request served and answered.
mod burst {
    use super::*;
    use erpc::Burst;

    pub(super) fn on_get_burst<T: Transport>(
        rpc: &mut Rpc<T, KvServer>,
        st: &mut KvServer,
        b: &mut Burst<'_>,
    ) {
        for i in 0..b.len() {
            if let Ok(k) = <&Key>::try_from(b.data(i)) {
                st.table.prefetch(k);
            }
        }
        st.stats.bursts += 1;
        st.stats.burst_reqs += b.len() as u64;
        for i in 0..b.len() {
            let mut out = [0u8; GET_RESP];
            serve_get(st, b.data(i), &mut out);
            let len = if out[0] == status::OK { GET_RESP } else { 1 };
            let h = b.take(i);
            if rpc.respond(h, &out[..len]).is_err() {
                st.stats.respond_errors += 1;
            }
        }
    }

    pub(super) fn on_put_burst<T: Transport>(
        rpc: &mut Rpc<T, KvServer>,
        st: &mut KvServer,
        b: &mut Burst<'_>,
    ) {
        for i in 0..b.len() {
            let d = b.data(i);
            if d.len() == PUT_REQ {
                st.table
                    .prefetch(d[..KEY_BYTES].try_into().expect("length checked"));
            }
        }
        st.stats.bursts += 1;
        st.stats.burst_reqs += b.len() as u64;
        for i in 0..b.len() {
            let s = serve_put(st, b.data(i));
            let h = b.take(i);
            if rpc.respond(h, &[s]).is_err() {
                st.stats.respond_errors += 1;
            }
        }
    }
}

/// Registers the server's handlers.
pub fn register<T: Transport + 'static>(b: NexusBuilder, h: Handlers) -> NexusBuilder {
    match h {
        Handlers::PerRequest => b
            .handler::<T, KvServer>(req::GET, on_get::<T>)
            .handler::<T, KvServer>(req::PUT, on_put::<T>),
        Handlers::Burst => b
            .burst_handler::<T, KvServer>(req::GET, burst::on_get_burst::<T>)
            .burst_handler::<T, KvServer>(req::PUT, burst::on_put_burst::<T>),
    }
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDist {
    /// Uniform over the keys.
    Uniform,
    /// Zipf with this exponent over the keys (key `r - 1` has rank `r`).
    Zipf(f64),
}

impl std::fmt::Display for KeyDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyDist::Uniform => f.write_str("uniform"),
            KeyDist::Zipf(s) => write!(f, "zipf {s}"),
        }
    }
}

/// Draws key numbers below `n`.
#[derive(Debug)]
pub struct KeyGen {
    rng: Xoshiro256PlusPlus,
    zipf: Option<Zipf<f64>>,
    n: u64,
}

impl KeyGen {
    /// A generator over `0..n` (`n` at least 1) from `seed`.
    pub fn new(n: u64, dist: KeyDist, seed: u64) -> Result<KeyGen, String> {
        if n == 0 {
            return Err("no keys to draw from".into());
        }
        let zipf = match dist {
            KeyDist::Uniform => None,
            KeyDist::Zipf(s) => {
                Some(Zipf::new(n as f64, s).map_err(|e| format!("zipf({n}, {s}): {e}"))?)
            }
        };
        Ok(KeyGen {
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            zipf,
            n,
        })
    }

    /// The next key number.
    #[inline]
    pub fn next_key(&mut self) -> u64 {
        match &self.zipf {
            // Ranks are 1..=n.
            Some(z) => (z.sample(&mut self.rng) as u64).clamp(1, self.n) - 1,
            None => self.rng.next_u64() % self.n,
        }
    }

    /// A number below 1000.
    pub fn per_mille(&mut self) -> u64 {
        self.rng.next_u64() % 1000
    }
}

/// A client's settings.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// This client's number (`0..clients`): it PUTs the keys whose number
    /// is this modulo `clients`.
    pub id: u32,
    /// Clients in all (across threads and processes).
    pub clients: u32,
    /// Keys preloaded (`0..keys`); at least `clients`.
    pub keys: u64,
    /// Key distribution.
    pub dist: KeyDist,
    /// PUTs per 1000 requests (the rest are GETs).
    pub puts_per_mille: u64,
    /// Most requests in flight.
    pub window: usize,
    /// Offered load, requests per second (0: closed loop, `window` in
    /// flight; latency from the send). With a rate, requests are due on a
    /// fixed schedule and latency counts from when each was due.
    pub rate: f64,
    /// Seed.
    pub seed: u64,
}

/// What the model knows of a key this client owns.
#[derive(Debug, Clone, Copy, Default)]
struct Owned {
    /// Lowest version the store may hold (the last acknowledged PUT).
    lo: u64,
    /// Highest (the last PUT sent).
    hi: u64,
    /// A PUT of it is in flight.
    putting: bool,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    due_ns: u64,
    key: u64,
    put: bool,
    /// For an owned key: its `lo` when the request was sent.
    lo: u64,
}

/// A client Rpc's state: the load generator and the model.
#[derive(Debug)]
pub struct KvClient {
    cfg: ClientConfig,
    /// Sessions to each server partition (index = partition), used in
    /// turn (a session has 8 slots: a window above 8 needs more).
    sessions: Vec<Vec<SessionNum>>,
    next_session: usize,
    keys: KeyGen,
    owned: std::collections::HashMap<u64, Owned>,
    pending: Vec<Pending>,
    free: Vec<usize>,
    in_flight: usize,
    start_ns: Option<u64>,
    /// Requests scheduled so far (offered-load mode).
    scheduled: u64,
    readback: Vec<u64>,
    /// Keep issuing load.
    pub running: bool,
    /// Latency of every request (ns; from when it was due).
    pub latency: Histogram<u64>,
    /// GETs answered.
    pub gets: u64,
    /// PUTs answered.
    pub puts: u64,
    /// Answers that broke the model.
    pub wrong: u64,
    /// The first such answer, described.
    pub first_wrong: Option<String>,
    /// Requests that failed in eRPC (or could not be sent).
    pub errors: u64,
    /// Read-back GETs checked.
    pub read_back: u64,
}

impl KvClient {
    /// A client over `cfg`, sending partition `p`'s keys on the sessions
    /// `sessions[p]`.
    pub fn new(cfg: ClientConfig, sessions: Vec<Vec<SessionNum>>) -> Result<KvClient, String> {
        if cfg.clients == 0 || cfg.id >= cfg.clients || cfg.keys < u64::from(cfg.clients) {
            return Err(format!(
                "client {} of {} over {} keys: need id < clients <= keys",
                cfg.id, cfg.clients, cfg.keys
            ));
        }
        if sessions.is_empty() || sessions.iter().any(Vec::is_empty) || cfg.window == 0 {
            return Err("a client needs a session and a window of at least 1".into());
        }
        Ok(KvClient {
            keys: KeyGen::new(cfg.keys, cfg.dist, cfg.seed)?,
            cfg,
            sessions,
            next_session: 0,
            owned: std::collections::HashMap::new(),
            pending: Vec::with_capacity(cfg.window),
            free: Vec::with_capacity(cfg.window),
            in_flight: 0,
            start_ns: None,
            scheduled: 0,
            readback: Vec::new(),
            running: true,
            latency: crate::stats::histogram(),
            gets: 0,
            puts: 0,
            wrong: 0,
            first_wrong: None,
            errors: 0,
            read_back: 0,
        })
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Answers so far.
    pub fn answered(&self) -> u64 {
        self.gets + self.puts
    }

    /// Clears the latency histogram and restarts the schedule (after a
    /// warm-up).
    pub fn reset(&mut self) {
        self.latency.reset();
        self.start_ns = None;
        self.scheduled = 0;
    }

    /// Starts another round of load on new `sessions` (a new Nexus) at
    /// offered `rate` (0: closed loop); the model carries over.
    pub fn resume(&mut self, sessions: Vec<Vec<SessionNum>>, rate: f64) {
        assert_eq!(self.in_flight, 0, "resumed with requests in flight");
        self.sessions = sessions;
        self.cfg.rate = rate;
        self.running = true;
        self.readback.clear();
        self.reset();
    }

    /// Stops the load and queues a GET of every key this client wrote
    /// (sent by [`KvClient::drive`] once the load's requests are done).
    pub fn start_read_back(&mut self) {
        self.running = false;
        self.readback = self.owned.keys().copied().collect();
    }

    /// Read-back GETs still to send or answer.
    pub fn reading_back(&self) -> bool {
        !self.readback.is_empty() || self.in_flight > 0
    }

    fn wrong(&mut self, what: impl FnOnce() -> String) {
        self.wrong += 1;
        if self.first_wrong.is_none() {
            self.first_wrong = Some(what());
        }
    }

    /// The key this client PUTs near key number `i` (one it owns).
    fn own_near(&self, i: u64) -> u64 {
        let c = u64::from(self.cfg.clients);
        let k = i - i % c + u64::from(self.cfg.id);
        if k < self.cfg.keys { k } else { k - c }
    }

    /// Sends what is due.
    pub fn drive<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, KvClient>) {
        let now = rpc.now_ns();
        if !self.running {
            while self.in_flight < self.cfg.window {
                let Some(i) = self.readback.pop() else { return };
                if !self.send(rpc, i, false, now) {
                    // Counted in `errors`; the key is not read back.
                    return;
                }
            }
            return;
        }
        let start = *self.start_ns.get_or_insert(now);
        while self.in_flight < self.cfg.window {
            let due = if self.cfg.rate > 0.0 {
                let due = start + (self.scheduled as f64 * 1e9 / self.cfg.rate) as u64;
                if due > now {
                    return;
                }
                due
            } else {
                now
            };
            let mut i = self.keys.next_key();
            let mut put = self.keys.per_mille() < self.cfg.puts_per_mille;
            if put {
                i = self.own_near(i);
                // Never two PUTs of one key in flight: the model could not
                // tell which the store applied last.
                put = !self.owned.get(&i).is_some_and(|o| o.putting);
            }
            if !self.send(rpc, i, put, due) {
                // Counted in `errors`: the load stops (a session that is
                // gone would fail every later request too).
                self.running = false;
                return;
            }
            self.scheduled += 1;
        }
    }

    /// Sends a GET or PUT of key number `i`; false if it could not.
    fn send<T: Transport + 'static>(
        &mut self,
        rpc: &mut Rpc<T, KvClient>,
        i: u64,
        put: bool,
        due_ns: u64,
    ) -> bool {
        let k = key(i);
        let part = &self.sessions[partition(&k, self.sessions.len())];
        self.next_session = self.next_session.wrapping_add(1);
        let sn = part[self.next_session % part.len()];
        let (req_len, resp_len) = if put {
            (PUT_REQ, 1)
        } else {
            (KEY_BYTES, GET_RESP)
        };
        let Some((mut q, r)) = crate::alloc_pair(rpc, req_len, resp_len) else {
            self.errors += 1;
            return false;
        };
        let owner = i % u64::from(self.cfg.clients) == u64::from(self.cfg.id);
        let mut lo = 0;
        let d = q.data_mut();
        d[..KEY_BYTES].copy_from_slice(&k);
        if put {
            let o = self.owned.entry(i).or_default();
            o.hi += 1;
            o.putting = true;
            d[KEY_BYTES..].copy_from_slice(&value_for(&k, o.hi, u64::from(self.cfg.id) + 1));
        } else if owner {
            lo = self.owned.get(&i).map_or(0, |o| o.lo);
        }
        let p = Pending {
            due_ns,
            key: i,
            put,
            lo,
        };
        let tag = match self.free.pop() {
            Some(t) => {
                self.pending[t] = p;
                t
            }
            None => {
                self.pending.push(p);
                self.pending.len() - 1
            }
        };
        let t = if put { req::PUT } else { req::GET };
        match rpc.enqueue_request(sn, t, q, r, on_done::<T>, tag) {
            Ok(()) => {
                self.in_flight += 1;
                true
            }
            Err(e) => {
                tracing::warn!(kind = ?e.kind, "cannot enqueue a request");
                rpc.free_msg_buffer(e.req);
                rpc.free_msg_buffer(e.resp);
                self.free.push(tag);
                if put && let Some(o) = self.owned.get_mut(&i) {
                    // Not sent: the version was never written.
                    o.hi -= 1;
                    o.putting = false;
                }
                self.errors += 1;
                false
            }
        }
    }

    /// Checks a GET's answer for key number `i`.
    fn check_get(&mut self, i: u64, lo: u64, resp: &[u8]) {
        let k = key(i);
        if resp.first() != Some(&status::OK) || resp.len() != GET_RESP {
            return self.wrong(|| format!("GET key {i}: answer {resp:?}, not a value"));
        }
        let Some((version, writer)) = check_value(&k, &resp[1..]) else {
            return self.wrong(|| format!("GET key {i}: a value of another key or damaged"));
        };
        let c = u64::from(self.cfg.clients);
        let owner = i % c;
        if !(version == 0 && writer == 0 || version > 0 && writer == owner + 1) {
            return self.wrong(|| {
                format!("GET key {i}: version {version} by writer {writer}, owner {owner}")
            });
        }
        if owner == u64::from(self.cfg.id) {
            let hi = self.owned.get(&i).map_or(0, |o| o.hi);
            if !(lo..=hi).contains(&version) {
                self.wrong(|| {
                    format!("GET key {i}: version {version}, the model allows {lo} to {hi}")
                });
            }
        }
    }
}

fn on_done<T: Transport + 'static>(rpc: &mut Rpc<T, KvClient>, st: &mut KvClient, c: Completion) {
    st.in_flight -= 1;
    let p = st.pending[c.tag];
    st.free.push(c.tag);
    let now = rpc.now_ns();
    match c.result {
        Ok(()) => {
            let r = c.resp.data();
            if p.put {
                st.puts += 1;
                let o = st.owned.get_mut(&p.key).expect("a PUT key is owned");
                o.putting = false;
                match r {
                    [status::OK] => o.lo = o.hi,
                    _ => {
                        let r = r.to_vec();
                        st.wrong(|| format!("PUT key {}: answer {r:?}", p.key));
                    }
                }
            } else {
                st.gets += 1;
                st.check_get(p.key, p.lo, r);
                if !st.running {
                    st.read_back += 1;
                }
            }
            if st.running {
                let _ = st.latency.record(now.saturating_sub(p.due_ns).max(1));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, key = p.key, put = p.put, "request failed");
            st.errors += 1;
            if p.put {
                // It may or may not have been applied: lo..=hi stays open.
                if let Some(o) = st.owned.get_mut(&p.key) {
                    o.putting = false;
                }
            }
        }
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_name_their_key_version_and_writer() {
        let k = key(42);
        assert_eq!(key_index(&k), Some(42));
        let v = value_for(&k, 7, 3);
        assert_eq!(check_value(&k, &v), Some((7, 3)));
        assert_eq!(check_value(&key(43), &v), None, "another key's value");
        for byte in 0..VALUE_BYTES {
            let mut bad = v;
            bad[byte] ^= 0x10;
            assert_eq!(check_value(&k, &bad), None, "byte {byte} damaged");
        }
        assert_ne!(key(0), [0; KEY_BYTES]);
    }

    #[test]
    fn preload_partitions_every_key_once() {
        let tables = preload(10_000, 3);
        assert_eq!(tables.iter().map(Table::len).sum::<usize>(), 10_000);
        for i in 0..10_000 {
            let k = key(i);
            let v = tables[partition(&k, 3)].get(&k).expect("preloaded");
            assert_eq!(check_value(&k, v), Some((0, 0)));
        }
    }

    #[test]
    fn zipf_keys_are_skewed_and_in_range() {
        let mut g = KeyGen::new(1000, KeyDist::Zipf(0.99), 1).unwrap();
        let mut hits = [0u32; 1000];
        for _ in 0..100_000 {
            hits[g.next_key() as usize] += 1;
        }
        // Rank 1 takes about 1 / H(1000, 0.99) ≈ 13 % of the draws.
        assert!(hits[0] > 10_000 && hits[0] < 16_000, "{}", hits[0]);
        assert!(hits[0] > 5 * hits[9]);
        let mut u = KeyGen::new(1000, KeyDist::Uniform, 1).unwrap();
        assert!((0..10_000).all(|_| u.next_key() < 1000));
        assert!(KeyGen::new(0, KeyDist::Uniform, 1).is_err());
        assert!(KeyGen::new(10, KeyDist::Zipf(-1.0), 1).is_err());
        assert!(KeyGen::new(10, KeyDist::Zipf(f64::NAN), 1).is_err());
    }
}

//! The key-value client: `lanes` operations in flight, each retried until
//! it succeeds — at the leader it was told of, or at the next replica —
//! with PUTs deduplicated by (client, sequence number) at the replicas, so
//! a retry after a failover applies at most once.
//!
//! What to do comes from a [`Workload`]; what happened goes back to it
//! (and, optionally, into a history for the linearizability checker). A
//! request that sees no answer for `op_timeout_ms` resets its session
//! (its requests complete with `SessionReset` and are retried elsewhere):
//! eRPC's own failure detection would answer only after the failure
//! timeout.

use std::collections::HashMap;
use std::sync::Arc;

use hdrhistogram::Histogram;

use erpc::{
    Completion, Nexus, Rpc, RpcConfig, RpcError, SessionEnd, SessionEvent, SessionEventKind,
    SessionNum,
};
use transport::Transport;

use super::replica::PeerAddr;
use super::wire::{self, Key, Put, Status, Value, req};
use crate::lincheck::{HistOp, RegOp};

/// An operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Write `value` at `key`.
    Put {
        /// Key.
        key: Key,
        /// Value.
        value: Value,
    },
    /// Read keys (linearizable; all at one point).
    Get {
        /// Keys, 1 to [`wire::MAX_GET_KEYS`].
        keys: Vec<Key>,
    },
    /// An empty request to the leader (no Raft): the eRPC round trip.
    Ping,
}

/// A finished operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// Lane that ran it.
    pub lane: usize,
    /// The operation.
    pub op: Op,
    /// For a GET, the values read (in key order).
    pub values: Vec<Option<Value>>,
    /// When it was first sent.
    pub invoked_ns: u64,
    /// When its answer arrived.
    pub done_ns: u64,
    /// Attempts (1 if the first succeeded).
    pub attempts: u32,
}

/// The source of operations and the sink of results.
pub trait Workload: std::any::Any {
    /// The next operation for `lane`, or `None` if the lane is done (it is
    /// asked again later).
    fn next(&mut self, lane: usize) -> Option<Op>;
    /// An operation finished.
    fn done(&mut self, d: &Done);
    /// The workload as `Any`, to read its results back
    /// ([`ClientState::workload_as`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Client id; lane `l` deduplicates as `(id << 16) | l`.
    pub id: u64,
    /// The replicas.
    pub replicas: Vec<PeerAddr>,
    /// Operations in flight.
    pub lanes: usize,
    /// A request unanswered this long resets its session.
    pub op_timeout_ms: u64,
    /// Wait before retrying after `Retry`, an unknown leader, or an error.
    pub backoff_us: u64,
    /// Wait before re-creating a failed session.
    pub reconnect_ms: u64,
    /// Record every operation for [`crate::lincheck`].
    pub record_history: bool,
}

impl ClientConfig {
    /// Defaults: 1 lane, 200 ms request timeout, 1 ms backoff.
    pub fn new(id: u64, replicas: Vec<PeerAddr>) -> ClientConfig {
        ClientConfig {
            id,
            replicas,
            lanes: 1,
            op_timeout_ms: 200,
            backoff_us: 1_000,
            reconnect_ms: 50,
            record_history: false,
        }
    }
}

/// Client counters and latency histograms.
#[derive(Clone)]
pub struct ClientStats {
    /// PUTs acknowledged.
    pub puts: u64,
    /// GETs answered.
    pub gets: u64,
    /// Answers `NotLeader` (redirects).
    pub redirects: u64,
    /// Answers `Retry`.
    pub retries: u64,
    /// Requests that failed in eRPC (session reset, peer failed, ...).
    pub rpc_errors: u64,
    /// Sessions reset for an unanswered request.
    pub timeouts: u64,
    /// Malformed answers.
    pub bad: u64,
    /// PUT latency, first send to acknowledgment, ns.
    pub put_latency: Histogram<u64>,
    /// GET latency, ns.
    pub get_latency: Histogram<u64>,
    /// PING round trips.
    pub pings: u64,
    /// PING latency, ns.
    pub ping_latency: Histogram<u64>,
}

impl std::fmt::Debug for ClientStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "puts {}, gets {}, pings {}, redirects {}, retries {}, rpc errors {}, timeouts {}, \
             bad {}; PUT {}; GET {}",
            self.puts,
            self.gets,
            self.pings,
            self.redirects,
            self.retries,
            self.rpc_errors,
            self.timeouts,
            self.bad,
            crate::stats::Percentiles::of(&self.put_latency),
            crate::stats::Percentiles::of(&self.get_latency),
        )
    }
}

impl Default for ClientStats {
    fn default() -> Self {
        let h = crate::stats::histogram;
        ClientStats {
            puts: 0,
            gets: 0,
            redirects: 0,
            retries: 0,
            rpc_errors: 0,
            timeouts: 0,
            bad: 0,
            put_latency: h(),
            get_latency: h(),
            pings: 0,
            ping_latency: h(),
        }
    }
}

#[derive(Debug)]
struct Lane {
    op: Option<Op>,
    seq: u64,
    invoked_ns: u64,
    sent_ns: u64,
    attempts: u32,
    in_flight: Option<SessionNum>,
    retry_at_ns: u64,
}

/// The application state of a client's Rpc.
pub struct ClientState {
    cfg: ClientConfig,
    sessions: Vec<Option<SessionNum>>,
    connected: Vec<bool>,
    reconnect_at_ns: Vec<u64>,
    leader: usize,
    lanes: Vec<Lane>,
    workload: Box<dyn Workload>,
    /// The workload was asked for work since it was set.
    asked: bool,
    history: Vec<HistOp>,
    /// Counters and latencies.
    pub stats: ClientStats,
}

impl std::fmt::Debug for ClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client {} ({} lanes, {} puts, {} gets)",
            self.cfg.id,
            self.lanes.len(),
            self.stats.puts,
            self.stats.gets
        )
    }
}

/// A client: its Rpc and state. Call [`Client::poll`] in a loop.
pub struct Client<T: Transport> {
    /// The eRPC endpoint.
    pub rpc: Rpc<T, ClientState>,
    /// The client.
    pub state: ClientState,
}

impl<T: Transport> std::fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}

/// The numeric id of a key (its first 8 bytes) and of a value (likewise),
/// for histories.
pub fn id_of(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("at least 8 bytes"))
}

impl<T: Transport + 'static> Client<T> {
    /// A client on Rpc `rpc_id` of `nexus` (no handlers needed).
    pub fn new(
        nexus: &Arc<Nexus>,
        rpc_id: u8,
        transport: T,
        alloc: mempool::Allocator,
        rpc_cfg: RpcConfig,
        cfg: ClientConfig,
        workload: Box<dyn Workload>,
    ) -> Result<Client<T>, erpc::CreateError> {
        let rpc = Rpc::builder(nexus, transport, alloc)
            .id(rpc_id)
            .config(rpc_cfg)
            .session_handler(on_session::<T>)
            .build()?;
        let n = cfg.replicas.len();
        let lanes = (0..cfg.lanes)
            .map(|_| Lane {
                op: None,
                seq: 0,
                invoked_ns: 0,
                sent_ns: 0,
                attempts: 0,
                in_flight: None,
                retry_at_ns: 0,
            })
            .collect();
        Ok(Client {
            rpc,
            state: ClientState {
                sessions: vec![None; n],
                connected: vec![false; n],
                reconnect_at_ns: vec![0; n],
                leader: 0,
                lanes,
                workload,
                asked: false,
                history: Vec::new(),
                stats: ClientStats::default(),
                cfg,
            },
        })
    }

    /// One iteration: eRPC's event loop, then new operations, retries and
    /// timeouts.
    pub fn poll(&mut self) {
        self.rpc.run_event_loop_once(&mut self.state);
        if self.state.drive(&mut self.rpc) {
            // Send what drive enqueued now (eRPC transmits at the end of
            // an event-loop iteration).
            self.rpc.run_event_loop_once(&mut self.state);
        }
    }
}

impl ClientState {
    /// True if no lane has an operation and the workload had nothing more
    /// when last asked.
    pub fn idle(&self) -> bool {
        self.asked && self.lanes.iter().all(|l| l.op.is_none())
    }

    /// The recorded history (if `record_history`).
    pub fn history(&self) -> &[HistOp] {
        &self.history
    }

    /// The workload, if it is a `W`, to read its results.
    pub fn workload_as<W: Workload>(&self) -> Option<&W> {
        self.workload.as_any().downcast_ref::<W>()
    }

    /// Clears the counters and histograms (e.g. after a warm-up phase).
    pub fn reset_stats(&mut self) {
        self.stats = ClientStats::default();
    }

    /// Replaces the workload (e.g. for a read-back phase).
    pub fn set_workload(&mut self, w: Box<dyn Workload>) {
        self.workload = w;
        self.asked = false;
    }

    /// The lanes' operations in flight now, as history entries without an
    /// answer (for a history cut at the end of a run).
    pub fn unanswered(&self) -> Vec<HistOp> {
        self.lanes
            .iter()
            .filter_map(|l| match &l.op {
                Some(Op::Put { key, value }) => Some(HistOp {
                    key: id_of(key),
                    op: RegOp::Put(id_of(value)),
                    call_ns: l.invoked_ns,
                    ret_ns: None,
                }),
                _ => None,
            })
            .collect()
    }

    /// Drives the lanes: new operations, due retries, timeouts, sessions.
    /// True if it enqueued a request.
    pub fn drive<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ClientState>) -> bool {
        let mut sent = false;
        let now = rpc.now_ns();
        for i in 0..self.sessions.len() {
            if self.sessions[i].is_none() && now >= self.reconnect_at_ns[i] {
                let r = &self.cfg.replicas[i];
                match rpc.create_session(&r.uri, r.rpc_id) {
                    Ok(sn) => self.sessions[i] = Some(sn),
                    Err(e) => {
                        tracing::warn!(replica = r.id, error = %e, "cannot create a session");
                        self.reconnect_at_ns[i] = now + self.cfg.reconnect_ms * 1_000_000;
                    }
                }
            }
        }
        let timeout = self.cfg.op_timeout_ms * 1_000_000;
        for l in 0..self.lanes.len() {
            let lane = &self.lanes[l];
            if let Some(sn) = lane.in_flight {
                if now.saturating_sub(lane.sent_ns) > timeout {
                    // Every request on the session completes with
                    // SessionReset and is retried.
                    self.stats.timeouts += 1;
                    let _ = rpc.reset_session(sn);
                }
                continue;
            }
            if lane.op.is_none() {
                match self.workload.next(l) {
                    Some(op) => {
                        let lane = &mut self.lanes[l];
                        if matches!(op, Op::Put { .. }) {
                            lane.seq += 1;
                        }
                        lane.op = Some(op);
                        lane.invoked_ns = now;
                        lane.attempts = 0;
                        lane.retry_at_ns = now;
                    }
                    None => continue,
                }
            }
            if now >= self.lanes[l].retry_at_ns {
                self.send(rpc, l, now);
                sent |= self.lanes[l].in_flight.is_some();
            }
        }
        self.asked = true;
        sent
    }

    fn send<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ClientState>, l: usize, now: u64) {
        let n = self.sessions.len();
        // The leader guess if its session exists, else the next one that does.
        let Some(target) = (0..n)
            .map(|k| (self.leader + k) % n)
            .find(|&i| self.sessions[i].is_some())
        else {
            self.lanes[l].retry_at_ns = now + self.cfg.backoff_us * 1_000;
            return;
        };
        self.leader = target;
        let sn = self.sessions[target].expect("just found");
        let client = (self.cfg.id << 16) | l as u64;
        let lane = &mut self.lanes[l];
        let op = lane.op.as_ref().expect("caller checked");
        let (req_type, req_len, resp_len) = match op {
            Op::Put { .. } => (req::PUT, wire::PUT_BYTES, wire::RESP_HDR_BYTES),
            Op::Get { keys } => (
                req::GET,
                wire::get_req_bytes(keys.len()),
                wire::get_resp_bytes(keys.len()),
            ),
            Op::Ping => (req::PING, 1, wire::RESP_HDR_BYTES),
        };
        let Some((mut req, resp)) = crate::alloc_pair(rpc, req_len, resp_len) else {
            tracing::warn!("client: no message buffers; retrying later");
            lane.retry_at_ns = now + self.cfg.backoff_us * 1_000;
            return;
        };
        match op {
            Op::Put { key, value } => Put {
                client,
                seq: lane.seq,
                key: *key,
                value: *value,
            }
            .write(req.data_mut()),
            Op::Get { keys } => wire::write_get(req.data_mut(), keys),
            Op::Ping => req.data_mut()[0] = 0,
        }
        match rpc.enqueue_request(sn, req_type, req, resp, on_resp::<T>, l) {
            Ok(()) => {
                lane.attempts += 1;
                lane.sent_ns = now;
                lane.in_flight = Some(sn);
            }
            Err(e) => {
                rpc.free_msg_buffer(e.req);
                rpc.free_msg_buffer(e.resp);
                lane.retry_at_ns = now + self.cfg.backoff_us * 1_000;
                self.leader = (target + 1) % n;
            }
        }
    }

    fn index_of(&self, raft_id: u64) -> Option<usize> {
        self.cfg.replicas.iter().position(|r| r.id == raft_id)
    }

    fn finish(&mut self, l: usize, now: u64, values: Vec<Option<Value>>) {
        let lane = &mut self.lanes[l];
        let op = lane.op.take().expect("in flight");
        let lat = now.saturating_sub(lane.invoked_ns).max(1);
        let d = Done {
            lane: l,
            op,
            values,
            invoked_ns: lane.invoked_ns,
            done_ns: now,
            attempts: lane.attempts,
        };
        match &d.op {
            Op::Put { key, value } => {
                self.stats.puts += 1;
                let _ = self.stats.put_latency.record(lat);
                if self.cfg.record_history {
                    self.history.push(HistOp {
                        key: id_of(key),
                        op: RegOp::Put(id_of(value)),
                        call_ns: d.invoked_ns,
                        ret_ns: Some(now),
                    });
                }
            }
            Op::Ping => {
                self.stats.pings += 1;
                let _ = self.stats.ping_latency.record(lat);
            }
            Op::Get { keys } => {
                self.stats.gets += 1;
                let _ = self.stats.get_latency.record(lat);
                if self.cfg.record_history {
                    for (k, v) in keys.iter().zip(&d.values) {
                        self.history.push(HistOp {
                            key: id_of(k),
                            op: RegOp::Get(v.as_ref().map(|v| id_of(v))),
                            call_ns: d.invoked_ns,
                            ret_ns: Some(now),
                        });
                    }
                }
            }
        }
        self.workload.done(&d);
    }
}

fn on_resp<T: Transport + 'static>(
    rpc: &mut Rpc<T, ClientState>,
    st: &mut ClientState,
    c: Completion,
) {
    let now = rpc.now_ns();
    let l = c.tag;
    st.lanes[l].in_flight = None;
    let backoff = now + st.cfg.backoff_us * 1_000;
    let n = st.sessions.len();
    match c.result {
        Ok(()) => match wire::parse_resp(c.resp.data()) {
            Some((Status::Ok, _, payload)) => {
                let values = match &st.lanes[l].op {
                    Some(Op::Get { keys }) => wire::parse_get_items(payload, keys.len()),
                    _ => Some(Vec::new()),
                };
                match values {
                    Some(v) => st.finish(l, now, v),
                    None => {
                        st.stats.bad += 1;
                        st.lanes[l].retry_at_ns = backoff;
                    }
                }
            }
            Some((Status::NotLeader, hint, _)) => {
                st.stats.redirects += 1;
                match st.index_of(hint).filter(|&i| i != st.leader) {
                    Some(i) => {
                        st.leader = i;
                        st.lanes[l].retry_at_ns = now;
                    }
                    None => {
                        st.leader = (st.leader + 1) % n;
                        st.lanes[l].retry_at_ns = backoff;
                    }
                }
            }
            Some((Status::Retry, _, _)) => {
                st.stats.retries += 1;
                st.lanes[l].retry_at_ns = backoff;
            }
            Some((Status::Bad, _, _)) | None => {
                st.stats.bad += 1;
                st.lanes[l].retry_at_ns = backoff;
            }
        },
        Err(e) => {
            st.stats.rpc_errors += 1;
            tracing::debug!(lane = l, error = %e, "request failed; retrying elsewhere");
            if matches!(
                e,
                RpcError::SessionEnded {
                    why: SessionEnd::PeerFailed
                        | SessionEnd::Reset
                        | SessionEnd::ConnectFailed(_)
                        | SessionEnd::ConnectTimedOut,
                    ..
                }
            ) && st.sessions.get(st.leader).copied().flatten() == Some(c.session)
            {
                st.leader = (st.leader + 1) % n;
            }
            st.lanes[l].retry_at_ns = backoff;
        }
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

fn on_session<T: Transport + 'static>(
    rpc: &mut Rpc<T, ClientState>,
    st: &mut ClientState,
    ev: SessionEvent,
) {
    let Some(i) = st.sessions.iter().position(|&s| s == Some(ev.session)) else {
        return;
    };
    match ev.kind {
        SessionEventKind::Connected => st.connected[i] = true,
        _ => {
            st.sessions[i] = None;
            st.connected[i] = false;
            st.reconnect_at_ns[i] = rpc.now_ns() + st.cfg.reconnect_ms * 1_000_000;
        }
    }
}

/// PUTs over a key space, each lane writing its own keys (key `k` belongs
/// to lane `k % lanes`), so per key the writes are sequential and the last
/// acknowledged value is what a later read must return. Sequential keys
/// (a preload) or uniformly random ones, `ops` per lane.
#[derive(Debug)]
pub struct PutWorkload {
    keys: u64,
    lanes: u64,
    random: bool,
    left: Vec<u64>,
    next_key: Vec<u64>,
    rng: netsim::Rng,
    version: u64,
    /// The last acknowledged value of every key written.
    pub acked: HashMap<Key, Value>,
}

/// Key number `i` as a 16-byte key (big-endian index, then a mix of it).
pub fn key(i: u64) -> Key {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.to_be_bytes());
    k[8..].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    k
}

/// A 64-byte value whose first 8 bytes are `id` (unique per write).
pub fn value(id: u64) -> Value {
    let mut v = [0u8; 64];
    v[..8].copy_from_slice(&id.to_be_bytes());
    for (i, b) in v[8..].iter_mut().enumerate() {
        *b = (id.wrapping_mul(31).wrapping_add(i as u64) >> 3) as u8;
    }
    v
}

impl PutWorkload {
    /// Writes every key `0..keys` once (lane `l` writes `l, l + lanes, ...`).
    pub fn preload(keys: u64, lanes: usize) -> PutWorkload {
        let lanes = lanes as u64;
        PutWorkload {
            keys,
            lanes,
            random: false,
            left: (0..lanes)
                .map(|l| keys / lanes + u64::from(l < keys % lanes))
                .collect(),
            next_key: (0..lanes).collect(),
            rng: netsim::Rng::new(1),
            version: 1 << 40,
            acked: HashMap::new(),
        }
    }

    /// `ops` PUTs per lane to uniformly random keys of the lane's share.
    pub fn random(keys: u64, lanes: usize, ops: u64, seed: u64) -> PutWorkload {
        let lanes = lanes as u64;
        PutWorkload {
            keys,
            lanes,
            random: true,
            left: vec![ops; lanes as usize],
            next_key: vec![0; lanes as usize],
            rng: netsim::Rng::new(seed),
            version: 2 << 40,
            acked: HashMap::new(),
        }
    }

    /// Operations not yet issued.
    pub fn remaining(&self) -> u64 {
        self.left.iter().sum()
    }
}

impl Workload for PutWorkload {
    fn next(&mut self, lane: usize) -> Option<Op> {
        if self.left[lane] == 0 {
            return None;
        }
        self.left[lane] -= 1;
        let k = if self.random {
            let share = (self.keys - lane as u64).div_ceil(self.lanes);
            lane as u64 + (self.rng.next_u64() % share) * self.lanes
        } else {
            let k = self.next_key[lane];
            self.next_key[lane] += self.lanes;
            k
        };
        self.version += 1;
        Some(Op::Put {
            key: key(k),
            value: value(self.version),
        })
    }

    fn done(&mut self, d: &Done) {
        if let Op::Put { key, value } = &d.op {
            self.acked.insert(*key, *value);
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Reads back expected values in GETs of up to `batch` keys; counts keys
/// found with the expected value, with another value, and missing.
#[derive(Debug)]
pub struct ReadBack {
    todo: Vec<(Key, Value)>,
    batch: usize,
    expected: HashMap<Key, Value>,
    /// Keys read with the expected value.
    pub matched: u64,
    /// Keys read with another value (listed up to 16).
    pub wrong: Vec<Key>,
    /// Keys absent.
    pub missing: Vec<Key>,
    /// Count of wrong and missing beyond the lists.
    pub mismatches: u64,
}

impl ReadBack {
    /// Reads every key of `expected`.
    pub fn new(expected: &HashMap<Key, Value>, batch: usize) -> ReadBack {
        let mut todo: Vec<(Key, Value)> = expected.iter().map(|(k, v)| (*k, *v)).collect();
        todo.sort_unstable();
        ReadBack {
            todo,
            batch: batch.clamp(1, wire::MAX_GET_KEYS),
            expected: expected.clone(),
            matched: 0,
            wrong: Vec::new(),
            missing: Vec::new(),
            mismatches: 0,
        }
    }

    /// Keys not yet asked for.
    pub fn remaining(&self) -> usize {
        self.todo.len()
    }

    /// Keys checked so far.
    pub fn checked(&self) -> u64 {
        self.matched + self.mismatches
    }
}

impl Workload for ReadBack {
    fn next(&mut self, _lane: usize) -> Option<Op> {
        if self.todo.is_empty() {
            return None;
        }
        let n = self.batch.min(self.todo.len());
        let keys = self.todo.split_off(self.todo.len() - n);
        Some(Op::Get {
            keys: keys.into_iter().map(|(k, _)| k).collect(),
        })
    }

    fn done(&mut self, d: &Done) {
        let Op::Get { keys } = &d.op else { return };
        for (k, v) in keys.iter().zip(&d.values) {
            match v {
                Some(v) if Some(v) == self.expected.get(k) => self.matched += 1,
                Some(_) => {
                    self.mismatches += 1;
                    if self.wrong.len() < 16 {
                        self.wrong.push(*k);
                    }
                }
                None => {
                    self.mismatches += 1;
                    if self.missing.len() < 16 {
                        self.missing.push(*k);
                    }
                }
            }
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `n` PINGs on one lane (the eRPC round trip to the leader, no Raft).
#[derive(Debug)]
pub struct PingWorkload {
    /// PINGs left.
    pub left: u64,
}

impl Workload for PingWorkload {
    fn next(&mut self, _lane: usize) -> Option<Op> {
        (self.left > 0).then(|| {
            self.left -= 1;
            Op::Ping
        })
    }

    fn done(&mut self, _d: &Done) {}

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A random mix of single-key PUTs and GETs on a few keys (every lane on
/// every key), `ops` per lane, for the linearizability check.
#[derive(Debug)]
pub struct MixedWorkload {
    keys: u64,
    get_percent: u64,
    left: Vec<u64>,
    rng: netsim::Rng,
    next_value: u64,
}

impl MixedWorkload {
    /// `ops` operations per lane over keys `0..keys`, `get_percent` % GETs.
    pub fn new(keys: u64, lanes: usize, ops: u64, get_percent: u64, seed: u64) -> MixedWorkload {
        MixedWorkload {
            keys,
            get_percent,
            left: vec![ops; lanes],
            rng: netsim::Rng::new(seed),
            next_value: seed << 32,
        }
    }
}

impl Workload for MixedWorkload {
    fn next(&mut self, lane: usize) -> Option<Op> {
        if self.left[lane] == 0 {
            return None;
        }
        self.left[lane] -= 1;
        let k = key(self.rng.next_u64() % self.keys);
        if self.rng.next_u64() % 100 < self.get_percent {
            Some(Op::Get { keys: vec![k] })
        } else {
            self.next_value += 1;
            Some(Op::Put {
                key: k,
                value: value(self.next_value),
            })
        }
    }

    fn done(&mut self, _d: &Done) {}

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

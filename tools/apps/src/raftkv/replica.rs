//! One replica: a raft-rs `RawNode` driven from an eRPC event loop.
//!
//! * Raft messages to a peer go as one eRPC request per peer per `Ready`
//!   (a batch). The receiver steps them at once and keeps the request
//!   handle (a deferred response): the replies its next `Ready` produces
//!   for that peer — append and heartbeat responses, votes — travel back
//!   in that response, so a replication round trip is one eRPC round trip.
//!   What does not fit, or has no request to ride on, goes as a request of
//!   its own.
//! * A snapshot message larger than one chunk (default 1 MiB) goes as a
//!   series of chunk requests (each a multi-packet eRPC message), two in
//!   flight; the receiver reassembles it, checks that the state machine in
//!   it decodes, and steps it. raft learns the outcome through
//!   `report_snapshot`.
//! * Client PUTs are proposed on the leader (the request itself is the
//!   entry), and answered when the entry is applied; GETs use raft's
//!   ReadIndex (a heartbeat round confirms leadership, then the read waits
//!   until the state machine has applied the read index). Requests held
//!   while leadership is lost are answered `Retry`; a replica that is not
//!   the leader answers `NotLeader` with the leader it knows.
//! * Peers are eRPC client sessions; a failed session (peer failure
//!   detection, reset) is re-created after `reconnect_ms`. Messages to a
//!   peer whose session is down are dropped and raft is told
//!   (`report_unreachable`): raft retransmits by itself.
//!
//! Persistence is in memory ([`super::store::KvStore`]): like the paper's
//! Raft experiment, a replica that crashes loses its state and does not
//! come back under the same id.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use hdrhistogram::Histogram;
use protobuf::Message as _;
use raft::eraftpb::{EntryType, Message, MessageType};
use raft::{Config, RawNode, ReadOnlyOption, SnapshotStatus, StateRole};

use erpc::{
    Completion, Nexus, NexusBuilder, ReqHandle, Request, Rpc, RpcConfig, SessionEvent,
    SessionEventKind, SessionNum,
};
use transport::Transport;

use super::sm::{Applied, StateMachine};
use super::store::KvStore;
use super::wire::{self, Key, Put, Status, req};

/// Where a peer replica listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddr {
    /// Raft id (1, 2, 3, ...).
    pub id: u64,
    /// Its Nexus URI.
    pub uri: String,
    /// Its Rpc id.
    pub rpc_id: u8,
}

/// Replica settings.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// This replica's raft id.
    pub id: u64,
    /// The other replicas.
    pub peers: Vec<PeerAddr>,
    /// Raft's logical clock period.
    pub tick_us: u64,
    /// Election timeout in ticks (randomized by raft in `[e, 2e)`).
    pub election_ticks: usize,
    /// Heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// A snapshot of the state machine every this many applied entries.
    pub snapshot_every: u64,
    /// Entries kept behind a snapshot (followers that far behind catch up
    /// from the log, not a snapshot).
    pub snapshot_keep: u64,
    /// Snapshot messages larger than this go in chunks of this size.
    pub snap_chunk_bytes: usize,
    /// Delay before a failed peer session is created again.
    pub reconnect_ms: u64,
    /// A client request held this long (no commit, no read confirmation)
    /// is answered `Retry`.
    pub op_timeout_ms: u64,
    /// raft's limit on one append message.
    pub max_append_bytes: u64,
}

impl ReplicaConfig {
    /// Defaults for replica `id` among `peers`: 1 ms ticks, elections after
    /// 10–20 ms of silence, heartbeats every 2 ms.
    pub fn new(id: u64, peers: Vec<PeerAddr>) -> ReplicaConfig {
        ReplicaConfig {
            id,
            peers,
            tick_us: 1_000,
            election_ticks: 10,
            heartbeat_ticks: 2,
            snapshot_every: 200_000,
            snapshot_keep: 20_000,
            snap_chunk_bytes: 1 << 20,
            reconnect_ms: 50,
            op_timeout_ms: 100,
            max_append_bytes: 1 << 20,
        }
    }
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// raft refused the configuration.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// eRPC could not create the Rpc.
    #[error("eRPC: {0}")]
    Rpc(#[from] erpc::CreateError),
}

/// Counters and timers of one replica.
#[derive(Clone)]
pub struct ReplicaStats {
    /// PUTs applied for the first time.
    pub puts_applied: u64,
    /// PUT retries found already applied (at apply or on arrival).
    pub puts_duplicate: u64,
    /// GETs answered (requests, not keys).
    pub gets_served: u64,
    /// Client requests answered `NotLeader`.
    pub not_leader: u64,
    /// Client requests answered `Retry` (leadership lost, timeout).
    pub retry: u64,
    /// Malformed requests and messages.
    pub bad: u64,
    /// Raft messages received and stepped.
    pub msgs_in: u64,
    /// Raft messages sent.
    pub msgs_out: u64,
    /// ... of which in a response to the peer's request.
    pub msgs_piggybacked: u64,
    /// eRPC requests carrying Raft messages.
    pub raft_requests: u64,
    /// Raft messages dropped (peer session down or backed up).
    pub msgs_dropped: u64,
    /// Raft message requests that failed (session error).
    pub raft_request_errors: u64,
    /// Snapshots made locally.
    pub snapshots_made: u64,
    /// Snapshot messages sent in chunks / chunks sent.
    pub snapshots_sent: u64,
    /// Chunks sent.
    pub snap_chunks_sent: u64,
    /// Snapshots received and applied.
    pub snapshots_applied: u64,
    /// Times this replica became leader.
    pub became_leader: u64,
    /// Leader: PUT arrival to apply (the commit latency), ns.
    pub commit_latency: Histogram<u64>,
    /// Time in raft-rs calls (step, propose, read_index, tick, ready,
    /// advance), ns.
    pub raft_ns: u64,
    /// Time encoding and decoding Raft messages (protobuf), ns.
    pub codec_ns: u64,
    /// Time appending to the log and saving the hard state, ns.
    pub store_ns: u64,
    /// Time applying entries to the state machine and making snapshots, ns.
    pub sm_ns: u64,
}

impl std::fmt::Debug for ReplicaStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "puts {} (+{} dup), gets {}, not-leader {}, retry {}, bad {}, msgs in {} out {} \
             (piggybacked {}, dropped {}), raft requests {} ({} failed), snapshots made {} \
             sent {} ({} chunks) applied {}, leader {}x, commit {}",
            self.puts_applied,
            self.puts_duplicate,
            self.gets_served,
            self.not_leader,
            self.retry,
            self.bad,
            self.msgs_in,
            self.msgs_out,
            self.msgs_piggybacked,
            self.msgs_dropped,
            self.raft_requests,
            self.raft_request_errors,
            self.snapshots_made,
            self.snapshots_sent,
            self.snap_chunks_sent,
            self.snapshots_applied,
            self.became_leader,
            crate::stats::Percentiles::of(&self.commit_latency),
        )
    }
}

impl Default for ReplicaStats {
    fn default() -> Self {
        ReplicaStats {
            puts_applied: 0,
            puts_duplicate: 0,
            gets_served: 0,
            not_leader: 0,
            retry: 0,
            bad: 0,
            msgs_in: 0,
            msgs_out: 0,
            msgs_piggybacked: 0,
            raft_requests: 0,
            msgs_dropped: 0,
            raft_request_errors: 0,
            snapshots_made: 0,
            snapshots_sent: 0,
            snap_chunks_sent: 0,
            snapshots_applied: 0,
            became_leader: 0,
            commit_latency: crate::stats::histogram(),
            raft_ns: 0,
            codec_ns: 0,
            store_ns: 0,
            sm_ns: 0,
        }
    }
}

/// Response capacity of a Raft message request (the replies riding back).
const RAFT_RESP_BYTES: usize = 16 << 10;
/// Largest batch in one request (raft's appends are at most
/// `max_append_bytes` each).
const MAX_BATCH_BYTES: usize = 4 << 20;
/// Requests queued to one peer before further messages are dropped.
const MAX_PEER_OUTSTANDING: usize = 64;
/// Snapshot chunks in flight per transfer.
const SNAP_WINDOW: usize = 2;

#[derive(Debug)]
struct SnapOut {
    id: u64,
    bytes: Vec<u8>,
    next: usize,
    in_flight: usize,
}

#[derive(Debug)]
struct SnapIn {
    id: u64,
    buf: Vec<u8>,
    got: u64,
}

#[derive(Debug)]
struct Peer {
    addr: PeerAddr,
    session: Option<SessionNum>,
    connected: bool,
    retry_at_ns: u64,
    snap_out: Option<SnapOut>,
    snap_in: Option<SnapIn>,
}

#[derive(Debug)]
struct PendingPut {
    handle: ReqHandle,
    arrived_ns: u64,
    deadline_ns: u64,
}

#[derive(Debug)]
struct PendingRead {
    handle: ReqHandle,
    deadline_ns: u64,
}

/// The application state of a replica's Rpc (the `C` of `Rpc<T, C>`).
pub struct ReplicaState {
    cfg: ReplicaConfig,
    node: RawNode<KvStore>,
    sm: StateMachine,
    applied: u64,
    role: StateRole,
    leader: u64,
    term: u64,
    peers: Vec<Peer>,
    next_tick_ns: u64,
    pending_puts: BTreeMap<(u64, u64), PendingPut>,
    pending_reads: BTreeMap<u64, PendingRead>,
    ready_reads: VecDeque<(u64, PendingRead)>,
    next_read_id: u64,
    /// Requests from peers awaiting our replies, in arrival order.
    raft_handles: Vec<(u64, ReqHandle)>,
    /// A validated snapshot's state machine, waiting for raft to hand the
    /// snapshot back in a `Ready`.
    incoming_sm: Option<(u64, StateMachine)>,
    next_snap_id: u64,
    keys: Vec<Key>,
    /// Counters and timers.
    pub stats: ReplicaStats,
}

impl std::fmt::Debug for ReplicaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Replica {} ({:?}, term {}, leader {}, applied {}, {} keys)",
            self.cfg.id,
            self.role,
            self.term,
            self.leader,
            self.applied,
            self.sm.len()
        )
    }
}

/// A replica: its Rpc and its state. Call [`Replica::poll`] in a loop.
pub struct Replica<T: Transport> {
    /// The eRPC endpoint.
    pub rpc: Rpc<T, ReplicaState>,
    /// The replica.
    pub state: ReplicaState,
}

impl<T: Transport> std::fmt::Debug for Replica<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}

impl<T: Transport + 'static> Replica<T> {
    /// Registers the replica's request handlers on a Nexus builder.
    pub fn register(b: NexusBuilder) -> NexusBuilder {
        b.handler::<T, ReplicaState>(req::RAFT, on_raft::<T>)
            .handler::<T, ReplicaState>(req::SNAP_CHUNK, on_snap_chunk::<T>)
            .handler::<T, ReplicaState>(req::PUT, on_put::<T>)
            .handler::<T, ReplicaState>(req::GET, on_get::<T>)
            .handler::<T, ReplicaState>(req::PING, on_ping::<T>)
    }

    /// Starts replica `cfg.id` on Rpc `rpc_id` of `nexus` (built with
    /// [`Replica::register`]).
    pub fn new(
        nexus: &Arc<Nexus>,
        rpc_id: u8,
        transport: T,
        alloc: mempool::Allocator,
        rpc_cfg: RpcConfig,
        cfg: ReplicaConfig,
    ) -> Result<Replica<T>, ReplicaError> {
        let mut voters: Vec<u64> = cfg.peers.iter().map(|p| p.id).collect();
        voters.push(cfg.id);
        voters.sort_unstable();
        let raft_cfg = Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            max_size_per_msg: cfg.max_append_bytes,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            ..Default::default()
        };
        let node = RawNode::new(
            &raft_cfg,
            KvStore::new(&voters),
            &super::log::logger(cfg.id),
        )?;
        let rpc = Rpc::builder(nexus, transport, alloc)
            .id(rpc_id)
            .config(rpc_cfg)
            .session_handler(on_session::<T>)
            .build()?;
        let peers = cfg
            .peers
            .iter()
            .map(|a| Peer {
                addr: a.clone(),
                session: None,
                connected: false,
                retry_at_ns: 0,
                snap_out: None,
                snap_in: None,
            })
            .collect();
        let state = ReplicaState {
            node,
            sm: StateMachine::new(),
            applied: 0,
            role: StateRole::Follower,
            leader: 0,
            term: 0,
            peers,
            next_tick_ns: 0,
            pending_puts: BTreeMap::new(),
            pending_reads: BTreeMap::new(),
            ready_reads: VecDeque::new(),
            next_read_id: 1,
            raft_handles: Vec::new(),
            incoming_sm: None,
            next_snap_id: cfg.id << 48,
            keys: Vec::with_capacity(wire::MAX_GET_KEYS),
            stats: ReplicaStats::default(),
            cfg,
        };
        Ok(Replica { rpc, state })
    }

    /// One iteration: the eRPC event loop (handlers, continuations), then
    /// raft (ticks, `Ready`, replies). eRPC transmits what is enqueued at
    /// the end of an event-loop iteration, so when raft produced messages
    /// the loop runs once more to send them now rather than one poll later.
    pub fn poll(&mut self) {
        self.rpc.run_event_loop_once(&mut self.state);
        if self.state.drive(&mut self.rpc) {
            self.rpc.run_event_loop_once(&mut self.state);
        }
    }
}

impl ReplicaState {
    /// Raft id.
    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    /// Role now.
    pub fn role(&self) -> StateRole {
        self.role
    }

    /// True if this replica is the leader.
    pub fn is_leader(&self) -> bool {
        self.role == StateRole::Leader
    }

    /// Current term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The leader this replica knows (0: none).
    pub fn leader(&self) -> u64 {
        self.leader
    }

    /// Index of the last applied entry.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Commit index.
    pub fn committed(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The state machine.
    pub fn state_machine(&self) -> &StateMachine {
        &self.sm
    }

    /// Log entries held in memory.
    pub fn log_len(&self) -> usize {
        self.node.store().len()
    }

    /// Index of the latest snapshot.
    pub fn snapshot_index(&self) -> u64 {
        self.node.store().snapshot_index()
    }

    /// Clears the counters and timers (e.g. after a warm-up phase).
    pub fn reset_stats(&mut self) {
        self.stats = ReplicaStats::default();
    }

    /// Ticks raft as the clock passes tick boundaries, expires held
    /// requests, handles a `Ready`, and answers peers' requests. True if
    /// it enqueued requests or responses.
    pub fn drive<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>) -> bool {
        let now = rpc.now_ns();
        self.reconnect(rpc, now);
        let tick_ns = self.cfg.tick_us * 1_000;
        if now >= self.next_tick_ns {
            // A stalled loop skips ticks rather than firing a burst (raft's
            // clock then runs slow, which only delays timeouts).
            self.next_tick_ns = if self.next_tick_ns + tick_ns > now {
                self.next_tick_ns + tick_ns
            } else {
                now + tick_ns
            };
            let t = rpc.now_ns();
            self.node.tick();
            self.stats.raft_ns += rpc.now_ns() - t;
            self.expire(rpc, now);
        }
        let mut sent = !self.raft_handles.is_empty();
        if self.node.has_ready() {
            self.handle_ready(rpc);
            sent = true;
        }
        // Requests whose replies did not need to ride back: empty batches.
        for (_, h) in self.raft_handles.drain(..) {
            let _ = rpc.respond(h, &0u32.to_le_bytes());
        }
        sent
    }

    fn reconnect<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>, now: u64) {
        for p in &mut self.peers {
            if p.session.is_none() && now >= p.retry_at_ns {
                match rpc.create_session(&p.addr.uri, p.addr.rpc_id) {
                    Ok(sn) => p.session = Some(sn),
                    Err(e) => {
                        tracing::warn!(peer = p.addr.id, error = %e, "cannot create a session");
                        p.retry_at_ns = now + self.cfg.reconnect_ms * 1_000_000;
                    }
                }
            }
        }
    }

    /// Answers `Retry` to client requests held past their deadline.
    fn expire<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>, now: u64) {
        let late: Vec<(u64, u64)> = self
            .pending_puts
            .iter()
            .filter(|(_, p)| p.deadline_ns <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            let p = self.pending_puts.remove(&k).expect("just seen");
            self.answer(rpc, p.handle, Status::Retry);
        }
        let late: Vec<u64> = self
            .pending_reads
            .iter()
            .filter(|(_, r)| r.deadline_ns <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            let r = self.pending_reads.remove(&k).expect("just seen");
            self.answer(rpc, r.handle, Status::Retry);
        }
        while self
            .ready_reads
            .front()
            .is_some_and(|r| r.1.deadline_ns <= now)
        {
            let (_, r) = self.ready_reads.pop_front().expect("just seen");
            self.answer(rpc, r.handle, Status::Retry);
        }
    }

    fn answer<T: Transport + 'static>(
        &mut self,
        rpc: &mut Rpc<T, ReplicaState>,
        h: ReqHandle,
        status: Status,
    ) {
        match status {
            Status::NotLeader => self.stats.not_leader += 1,
            Status::Retry => self.stats.retry += 1,
            Status::Bad => self.stats.bad += 1,
            Status::Ok => {}
        }
        let mut hdr = [0u8; wire::RESP_HDR_BYTES];
        wire::write_resp_hdr(&mut hdr, status, self.leader);
        // Fails only if the client's session is gone: nothing to tell.
        let _ = rpc.respond(h, &hdr);
    }

    fn handle_ready<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>) {
        let t = rpc.now_ns();
        let mut rd = self.node.ready();
        self.stats.raft_ns += rpc.now_ns() - t;
        if let Some(ss) = rd.ss() {
            self.set_role(rpc, ss.raft_state, ss.leader_id);
        }
        if let Some(hs) = rd.hs() {
            self.term = hs.term;
        }
        let mut out = rd.take_messages();
        if !rd.snapshot().is_empty() {
            let t = rpc.now_ns();
            let snap = rd.snapshot().clone();
            let index = snap.get_metadata().index;
            let sm = match self.incoming_sm.take() {
                Some((i, sm)) if i == index => Some(sm),
                _ => StateMachine::decode(snap.get_data()),
            };
            // Snapshots are checked before they are stepped, so this holds
            // unless the leader's own state is corrupt.
            self.sm = sm.expect("a snapshot checked on arrival decodes");
            self.applied = index;
            self.node.mut_store().apply_snapshot(snap);
            self.stats.snapshots_applied += 1;
            self.stats.sm_ns += rpc.now_ns() - t;
        }
        let committed = rd.take_committed_entries();
        self.apply(rpc, &committed);
        let t = rpc.now_ns();
        self.node.mut_store().append(rd.entries());
        if let Some(hs) = rd.hs() {
            self.node.mut_store().set_hard_state(hs.clone());
        }
        self.stats.store_ns += rpc.now_ns() - t;
        for rs in rd.take_read_states() {
            let Ok(ctx) = <[u8; 8]>::try_from(&rs.request_ctx[..]) else {
                continue;
            };
            if let Some(r) = self.pending_reads.remove(&u64::from_le_bytes(ctx)) {
                self.ready_reads.push_back((rs.index, r));
            }
        }
        out.extend(rd.take_persisted_messages());
        let t = rpc.now_ns();
        let mut light = self.node.advance(rd);
        self.stats.raft_ns += rpc.now_ns() - t;
        if let Some(c) = light.commit_index() {
            self.node.mut_store().set_commit(c);
        }
        out.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(rpc, &committed);
        let t = rpc.now_ns();
        self.node.advance_apply();
        self.stats.raft_ns += rpc.now_ns() - t;
        self.serve_reads(rpc);
        self.maybe_snapshot(rpc);
        self.send(rpc, out);
    }

    fn set_role<T: Transport + 'static>(
        &mut self,
        rpc: &mut Rpc<T, ReplicaState>,
        role: StateRole,
        leader: u64,
    ) {
        let was_leader = self.role == StateRole::Leader;
        self.role = role;
        self.leader = leader;
        if role == StateRole::Leader && !was_leader {
            self.stats.became_leader += 1;
            tracing::info!(id = self.cfg.id, "became leader");
        }
        if was_leader && role != StateRole::Leader {
            // Held requests cannot complete here: the client retries at the
            // new leader (PUTs are deduplicated there).
            let puts: Vec<PendingPut> = std::mem::take(&mut self.pending_puts)
                .into_values()
                .collect();
            for p in puts {
                self.answer(rpc, p.handle, Status::Retry);
            }
            let reads: Vec<PendingRead> = std::mem::take(&mut self.pending_reads)
                .into_values()
                .chain(self.ready_reads.drain(..).map(|(_, r)| r))
                .collect();
            for r in reads {
                self.answer(rpc, r.handle, Status::Retry);
            }
        }
    }

    fn apply<T: Transport + 'static>(
        &mut self,
        rpc: &mut Rpc<T, ReplicaState>,
        entries: &[raft::eraftpb::Entry],
    ) {
        for e in entries {
            self.applied = e.index;
            if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
                continue;
            }
            let t = rpc.now_ns();
            let Some(p) = Put::parse(&e.data) else {
                self.stats.bad += 1;
                continue;
            };
            match self.sm.apply(&p) {
                Applied::Written => self.stats.puts_applied += 1,
                Applied::Duplicate => self.stats.puts_duplicate += 1,
            }
            let done = rpc.now_ns();
            self.stats.sm_ns += done - t;
            if let Some(w) = self.pending_puts.remove(&(p.client, p.seq)) {
                let _ = self
                    .stats
                    .commit_latency
                    .record(done.saturating_sub(w.arrived_ns).max(1));
                self.answer(rpc, w.handle, Status::Ok);
            }
        }
    }

    fn serve_reads<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>) {
        let mut i = 0;
        while i < self.ready_reads.len() {
            if self.ready_reads[i].0 > self.applied {
                i += 1;
                continue;
            }
            let (_, r) = self.ready_reads.remove(i).expect("in range");
            self.keys.clear();
            let Some(keys) = rpc.request_data(&r.handle).and_then(wire::parse_get) else {
                // The client's session went away; the handle is stale.
                let _ = rpc.respond(r.handle, &[]);
                continue;
            };
            self.keys.extend(keys.copied());
            let n = self.keys.len();
            let Ok(mut m) = rpc.response_buffer(&r.handle, wire::get_resp_bytes(n)) else {
                self.answer(rpc, r.handle, Status::Retry);
                continue;
            };
            let b = m.data_mut();
            wire::write_resp_hdr(b, Status::Ok, self.cfg.id);
            for (j, k) in self.keys.iter().enumerate() {
                let at = wire::RESP_HDR_BYTES + j * wire::GET_ITEM_BYTES;
                wire::write_get_item(&mut b[at..at + wire::GET_ITEM_BYTES], self.sm.get(k));
            }
            self.stats.gets_served += 1;
            let _ = rpc.enqueue_response(r.handle, m);
        }
    }

    fn maybe_snapshot<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>) {
        let store = self.node.store();
        if self.applied < store.snapshot_index() + self.cfg.snapshot_every {
            return;
        }
        let t = rpc.now_ns();
        let data = self.sm.encode();
        let keep = self.cfg.snapshot_keep;
        self.node
            .mut_store()
            .snapshot_and_compact(self.applied, data, keep);
        self.stats.snapshots_made += 1;
        self.stats.sm_ns += rpc.now_ns() - t;
    }

    fn peer_index(&self, id: u64) -> Option<usize> {
        self.peers.iter().position(|p| p.addr.id == id)
    }

    /// Sends a `Ready`'s messages: per peer, one batch in the response to
    /// that peer's request if one is waiting and it fits, else requests;
    /// large snapshots in chunks.
    fn send<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>, out: Vec<Message>) {
        if out.is_empty() {
            return;
        }
        self.stats.msgs_out += out.len() as u64;
        for pi in 0..self.peers.len() {
            let id = self.peers[pi].addr.id;
            let mut batch: Vec<&Message> = Vec::new();
            for m in out.iter().filter(|m| m.to == id) {
                if m.get_msg_type() == MessageType::MsgSnapshot {
                    self.send_snapshot(rpc, pi, m);
                } else {
                    batch.push(m);
                }
            }
            if batch.is_empty() {
                continue;
            }
            let t = rpc.now_ns();
            let len = wire::batch_bytes(&batch);
            self.stats.codec_ns += rpc.now_ns() - t;
            if len <= RAFT_RESP_BYTES
                && let Some(pos) = self.raft_handles.iter().position(|(f, _)| *f == id)
            {
                let (_, h) = self.raft_handles.remove(pos);
                if let Ok(mut m) = rpc.response_buffer(&h, len) {
                    let t = rpc.now_ns();
                    wire::write_batch(m.data_mut(), &batch).expect("sized buffer");
                    self.stats.codec_ns += rpc.now_ns() - t;
                    if rpc.enqueue_response(h, m).is_ok() {
                        self.stats.msgs_piggybacked += batch.len() as u64;
                    }
                    continue;
                }
                let _ = rpc.respond(h, &0u32.to_le_bytes());
            }
            // Split into requests of at most MAX_BATCH_BYTES.
            let mut start = 0;
            while start < batch.len() {
                let mut end = start + 1;
                let mut size = 8 + batch[start].get_cached_size() as usize;
                while end < batch.len() {
                    let s = size + 4 + batch[end].get_cached_size() as usize;
                    if s > MAX_BATCH_BYTES {
                        break;
                    }
                    size = s;
                    end += 1;
                }
                self.send_request(rpc, pi, &batch[start..end], size);
                start = end;
            }
        }
    }

    /// The peer's session if it can take another request now.
    fn usable_session<T: Transport + 'static>(
        &self,
        rpc: &Rpc<T, ReplicaState>,
        pi: usize,
    ) -> Option<SessionNum> {
        let p = &self.peers[pi];
        let sn = p.session.filter(|_| p.connected)?;
        (rpc.outstanding_requests(sn)? < MAX_PEER_OUTSTANDING).then_some(sn)
    }

    fn send_request<T: Transport + 'static>(
        &mut self,
        rpc: &mut Rpc<T, ReplicaState>,
        pi: usize,
        batch: &[&Message],
        len: usize,
    ) {
        let id = self.peers[pi].addr.id;
        let Some(sn) = self.usable_session(rpc, pi) else {
            self.stats.msgs_dropped += batch.len() as u64;
            self.node.report_unreachable(id);
            return;
        };
        let Some((mut req, resp)) = crate::alloc_pair(rpc, len, RAFT_RESP_BYTES) else {
            tracing::warn!(peer = id, len, "no message buffers for a Raft request");
            self.stats.msgs_dropped += batch.len() as u64;
            return;
        };
        let t = rpc.now_ns();
        // The callers computed every message's size (cached in it).
        wire::write_batch(req.data_mut(), batch).expect("sized buffer");
        self.stats.codec_ns += rpc.now_ns() - t;
        match rpc.enqueue_request(sn, req::RAFT, req, resp, on_raft_done::<T>, id as usize) {
            Ok(()) => self.stats.raft_requests += 1,
            Err(e) => {
                self.stats.msgs_dropped += batch.len() as u64;
                rpc.free_msg_buffer(e.req);
                rpc.free_msg_buffer(e.resp);
            }
        }
    }

    fn send_snapshot<T: Transport + 'static>(
        &mut self,
        rpc: &mut Rpc<T, ReplicaState>,
        pi: usize,
        m: &Message,
    ) {
        let id = self.peers[pi].addr.id;
        let t = rpc.now_ns();
        let len = m.compute_size() as usize;
        self.stats.codec_ns += rpc.now_ns() - t;
        if len + 8 <= self.cfg.snap_chunk_bytes {
            self.send_request(rpc, pi, &[m], len + 8);
            return;
        }
        if self.usable_session(rpc, pi).is_none() {
            self.stats.msgs_dropped += 1;
            self.node.report_snapshot(id, SnapshotStatus::Failure);
            return;
        }
        let t = rpc.now_ns();
        let bytes = match m.write_to_bytes() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(peer = id, error = %e, "cannot encode a snapshot");
                self.node.report_snapshot(id, SnapshotStatus::Failure);
                return;
            }
        };
        self.stats.codec_ns += rpc.now_ns() - t;
        self.next_snap_id += 1;
        self.peers[pi].snap_out = Some(SnapOut {
            id: self.next_snap_id,
            bytes,
            next: 0,
            in_flight: 0,
        });
        self.stats.snapshots_sent += 1;
        self.pump_snapshot(rpc, pi);
    }

    /// Sends chunks of peer `pi`'s snapshot transfer up to the window.
    fn pump_snapshot<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, ReplicaState>, pi: usize) {
        let me = self.cfg.id;
        let chunk = self.cfg.snap_chunk_bytes;
        let id = self.peers[pi].addr.id;
        let Some(sn) = self.peers[pi].session else {
            return self.fail_snapshot(pi);
        };
        loop {
            let Some(s) = self.peers[pi].snap_out.as_mut() else {
                return;
            };
            if s.in_flight >= SNAP_WINDOW || s.next >= s.bytes.len() {
                return;
            }
            let end = (s.next + chunk).min(s.bytes.len());
            let n = end - s.next;
            let Some((mut req, resp)) = crate::alloc_pair(rpc, wire::CHUNK_HDR_BYTES + n, 8) else {
                tracing::warn!(peer = id, "no message buffers for a snapshot chunk");
                return self.fail_snapshot(pi);
            };
            let b = req.data_mut();
            wire::ChunkHdr {
                from: me,
                snap_id: s.id,
                offset: s.next as u64,
                total: s.bytes.len() as u64,
            }
            .write(b);
            b[wire::CHUNK_HDR_BYTES..].copy_from_slice(&s.bytes[s.next..end]);
            let tag = (pi << 32) | (s.id as u32 as usize);
            match rpc.enqueue_request(sn, req::SNAP_CHUNK, req, resp, on_chunk_done::<T>, tag) {
                Ok(()) => {
                    s.next = end;
                    s.in_flight += 1;
                    self.stats.snap_chunks_sent += 1;
                }
                Err(e) => {
                    rpc.free_msg_buffer(e.req);
                    rpc.free_msg_buffer(e.resp);
                    return self.fail_snapshot(pi);
                }
            }
        }
    }

    fn fail_snapshot(&mut self, pi: usize) {
        if self.peers[pi].snap_out.take().is_some() {
            self.node
                .report_snapshot(self.peers[pi].addr.id, SnapshotStatus::Failure);
        }
    }

    /// Steps messages from peer `from` (checked: addressed to us, from a
    /// known peer, a snapshot whose state machine decodes).
    fn step_msgs<T: Transport + 'static>(
        &mut self,
        rpc: &Rpc<T, ReplicaState>,
        from: u64,
        msgs: Vec<Message>,
    ) {
        for m in msgs {
            if m.to != self.cfg.id || m.from != from {
                self.stats.bad += 1;
                continue;
            }
            if m.get_msg_type() == MessageType::MsgSnapshot {
                let t = rpc.now_ns();
                let snap = m.get_snapshot();
                let Some(sm) = StateMachine::decode(snap.get_data()) else {
                    tracing::warn!(from, "a snapshot whose state machine does not decode");
                    self.stats.bad += 1;
                    continue;
                };
                self.incoming_sm = Some((snap.get_metadata().index, sm));
                self.stats.sm_ns += rpc.now_ns() - t;
            }
            self.stats.msgs_in += 1;
            let t = rpc.now_ns();
            if let Err(e) = self.node.step(m) {
                tracing::debug!(from, error = %e, "raft refused a message");
            }
            self.stats.raft_ns += rpc.now_ns() - t;
        }
    }
}

fn on_raft<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    req: Request<'_>,
) {
    let t = rpc.now_ns();
    let msgs = wire::parse_batch(req.data);
    st.stats.codec_ns += rpc.now_ns() - t;
    let Some(msgs) = msgs else {
        st.stats.bad += 1;
        let _ = rpc.respond(req.handle, &0u32.to_le_bytes());
        return;
    };
    let Some(from) = msgs
        .first()
        .map(|m| m.from)
        .filter(|&f| st.peer_index(f).is_some())
    else {
        if !msgs.is_empty() {
            st.stats.bad += 1;
        }
        let _ = rpc.respond(req.handle, &0u32.to_le_bytes());
        return;
    };
    st.step_msgs(rpc, from, msgs);
    // Answered in drive(), with our replies to `from` if any.
    st.raft_handles.push((from, req.handle));
}

fn on_raft_done<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    c: Completion,
) {
    let peer = c.tag as u64;
    match c.result {
        Ok(()) => {
            let t = rpc.now_ns();
            let msgs = wire::parse_batch(c.resp.data());
            st.stats.codec_ns += rpc.now_ns() - t;
            match msgs {
                Some(msgs) => st.step_msgs(rpc, peer, msgs),
                None => st.stats.bad += 1,
            }
        }
        Err(_) => {
            st.stats.raft_request_errors += 1;
            st.node.report_unreachable(peer);
        }
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

fn on_snap_chunk<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    req: Request<'_>,
) {
    let ok = (|| {
        let (h, data) = wire::ChunkHdr::parse(req.data)?;
        let pi = st.peer_index(h.from)?;
        let p = &mut st.peers[pi];
        if p.snap_in.as_ref().is_none_or(|s| s.id != h.snap_id) {
            p.snap_in = Some(SnapIn {
                id: h.snap_id,
                buf: vec![0; h.total as usize],
                got: 0,
            });
        }
        let s = p.snap_in.as_mut().expect("just set");
        if s.buf.len() as u64 != h.total {
            return None;
        }
        let at = h.offset as usize;
        s.buf[at..at + data.len()].copy_from_slice(data);
        s.got += data.len() as u64;
        if s.got >= h.total {
            let s = p.snap_in.take().expect("present");
            let t = rpc.now_ns();
            let m = Message::parse_from_bytes(&s.buf).ok();
            st.stats.codec_ns += rpc.now_ns() - t;
            st.step_msgs(rpc, h.from, vec![m?]);
        }
        Some(())
    })();
    if ok.is_none() {
        st.stats.bad += 1;
    }
    let _ = rpc.respond(req.handle, &[]);
}

fn on_chunk_done<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    c: Completion,
) {
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
    let (pi, id32) = (c.tag >> 32, c.tag as u32);
    let Some(p) = st.peers.get_mut(pi) else {
        return;
    };
    let Some(s) = p.snap_out.as_mut().filter(|s| s.id as u32 == id32) else {
        return; // a transfer already given up
    };
    if c.result.is_err() {
        return st.fail_snapshot(pi);
    }
    s.in_flight -= 1;
    if s.next >= s.bytes.len() && s.in_flight == 0 {
        let id = p.addr.id;
        p.snap_out = None;
        st.node.report_snapshot(id, SnapshotStatus::Finish);
        return;
    }
    st.pump_snapshot(rpc, pi);
}

fn on_put<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    req: Request<'_>,
) {
    let Some(p) = Put::parse(req.data) else {
        return st.answer(rpc, req.handle, Status::Bad);
    };
    if st.role != StateRole::Leader {
        return st.answer(rpc, req.handle, Status::NotLeader);
    }
    if st.sm.is_applied(p.client, p.seq) {
        st.stats.puts_duplicate += 1;
        return st.answer(rpc, req.handle, Status::Ok);
    }
    let now = rpc.now_ns();
    let r = st.node.propose(Vec::new(), req.data.to_vec());
    st.stats.raft_ns += rpc.now_ns() - now;
    if r.is_err() {
        return st.answer(rpc, req.handle, Status::NotLeader);
    }
    let held = PendingPut {
        handle: req.handle,
        arrived_ns: now,
        deadline_ns: now + st.cfg.op_timeout_ms * 1_000_000,
    };
    if let Some(old) = st.pending_puts.insert((p.client, p.seq), held) {
        // The client retried while its first copy was still held.
        st.answer(rpc, old.handle, Status::Retry);
    }
}

fn on_get<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    req: Request<'_>,
) {
    if wire::parse_get(req.data).is_none() {
        return st.answer(rpc, req.handle, Status::Bad);
    }
    if st.role != StateRole::Leader {
        return st.answer(rpc, req.handle, Status::NotLeader);
    }
    let id = st.next_read_id;
    st.next_read_id += 1;
    let now = rpc.now_ns();
    st.node.read_index(id.to_le_bytes().to_vec());
    st.stats.raft_ns += rpc.now_ns() - now;
    st.pending_reads.insert(
        id,
        PendingRead {
            handle: req.handle,
            deadline_ns: now + st.cfg.op_timeout_ms * 1_000_000,
        },
    );
}

fn on_ping<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    req: Request<'_>,
) {
    st.answer(rpc, req.handle, Status::Ok);
}

fn on_session<T: Transport + 'static>(
    rpc: &mut Rpc<T, ReplicaState>,
    st: &mut ReplicaState,
    ev: SessionEvent,
) {
    let now = rpc.now_ns();
    let Some(pi) = st.peers.iter().position(|p| p.session == Some(ev.session)) else {
        return; // a client's or peer's session to us
    };
    match ev.kind {
        SessionEventKind::Connected => st.peers[pi].connected = true,
        kind => {
            tracing::debug!(peer = st.peers[pi].addr.id, %kind, "peer session down");
            let p = &mut st.peers[pi];
            p.session = None;
            p.connected = false;
            p.retry_at_ns = now + st.cfg.reconnect_ms * 1_000_000;
            st.fail_snapshot(pi);
            st.node.report_unreachable(st.peers[pi].addr.id);
        }
    }
}

//! The Rpc endpoint: one per thread, generic over the transport `T` and
//! the application context `C`.
//!
//! The public surface: `api` (every public method of [`Rpc`], in the
//! order an application uses them, as the C++ `rpc.h` lists them),
//! `builder` ([`RpcBuilder`] and the steps of making an Rpc), `types`
//! (handler types, requests, completions, session events and snapshots),
//! `errors`, `config` ([`RpcConfig`]) and `testing` (test hooks: fault
//! injection and probes). This file holds the [`Rpc`] struct and its drop.
//!
//! The mechanisms, one file each, as in the C++ eRPC: `req` (requests,
//! both sides), `resp` (responses), `cr` (explicit credit returns and the
//! credit invariant), `rfr` (requests for response), `tx` (the single TX
//! path), `rx` (packet dispatch and validation), `ev_loop`, `loss`
//! (retransmission timeout and go-back-N), `reset` (failed peers, session
//! reset and teardown with requests outstanding), `sm_handlers` (session
//! management), `admission` (connect limits and reclaiming server
//! sessions), `active` (the active client sessions), `cc` (congestion
//! control and pacing), `resolve` (host names that do not resolve), `bg`
//! (worker-thread handlers), `burst` (burst handlers), `status` (the
//! server's error answers), `tokens` (retired session tokens).

// Rustdoc lists an Rpc's methods impl block by impl block, child modules
// first in the order they are declared: the public API (`api`), then the
// test hooks (`testing`). Every other impl block of `Rpc` is crate-private.
// (One group each: rustfmt would sort a group.)
mod api;

#[cfg(feature = "testing")]
mod testing;

mod config;
mod errors;
mod types;

mod active;
mod admission;
mod bg;
mod builder;
mod burst;
mod cc;
mod cr;
mod ev_loop;
mod loss;
mod req;
mod reset;
mod resolve;
mod resp;
mod rfr;
mod rx;
mod sm_handlers;
mod status;
mod tokens;
mod tx;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use mempool::{Allocator, Buffer};
use transport::Transport;

use crate::clock::Clock;
use crate::msgbuf::{MsgBuf, Origin};
use crate::nexus::{BgLinks, Job, Nexus, SmQueue};
use crate::session::{self, Session, SessionState};
use crate::stats::RpcStats;

pub use builder::RpcBuilder;
pub use burst::{Burst, BurstHandler};
pub use config::RpcConfig;
pub use errors::{
    CreateError, EnqueueError, EnqueueErrorKind, RespondError, RpcError, ServerError, SessionEnd,
    SessionError,
};
pub(crate) use tx::TxBatch;
#[cfg(feature = "testing")]
pub use types::ActivePools;
pub use types::{
    Completion, Continuation, ReqHandle, ReqHandler, Request, SessionEvent, SessionEventKind,
    SessionHandler, SessionInfo, SessionNum, SlotInfo,
};

enum HandlerSlot<T: Transport, C> {
    None,
    Dispatch(ReqHandler<T, C>),
    Background,
    /// Requests gathered per RX burst (`burst.rs`).
    Burst(BurstHandler<T, C>),
}

// Manual impls: a fn pointer is `Copy` whatever `T` and `C` are.
impl<T: Transport, C> Clone for HandlerSlot<T, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Transport, C> Copy for HandlerSlot<T, C> {}

/// State for background handlers.
struct BgState {
    /// This Rpc's links to the Nexus's workers (`nexus::workers`): where
    /// jobs go and come back, and how many are out.
    links: BgLinks,
    /// Jobs no worker could take yet (or inline jobs to run).
    backlog: VecDeque<Job>,
    /// Recycled heap buffers for large background responses (boxed as
    /// they travel in jobs, see `nexus::Job::large`).
    #[allow(clippy::vec_box)]
    scratch: Vec<Box<Vec<u8>>>,
}

/// An eRPC endpoint: one per thread, made with [`Rpc::builder`]. See the crate
/// documentation.
///
/// Its methods, in the order below (the order an application uses them):
/// creation; message buffers ([`Rpc::alloc_msg_buffer`]); sessions
/// ([`Rpc::create_session`], [`Rpc::destroy_session`],
/// [`Rpc::session_info`]); requests ([`Rpc::enqueue_request`], completed
/// in continuations) and responses ([`Rpc::respond`],
/// [`Rpc::enqueue_response`]); the event loop
/// ([`Rpc::run_event_loop_once`]); then settings, counters and probes;
/// last the test hooks (`fault_*`).
pub struct Rpc<T: Transport, C> {
    transport: T,
    /// The RX ring reader; taken out while the RX loop runs.
    ring: Option<T::Ring>,
    ring_entries: usize,
    rx_head: usize,
    alloc: Allocator,
    nexus: Arc<Nexus>,
    rpc_id: u8,
    clock: Clock,
    now_ns: u64,
    config: RpcConfig,
    sessions: session::SessionTable<Session<T, C>>,
    free_session_nums: VecDeque<(u16, u64)>,
    open_sessions: usize,
    ring_entries_available: usize,
    /// One entry per request type: indexed by a `u8`, no bounds check.
    handlers: Box<[HandlerSlot<T, C>; 256]>,
    /// Single-packet requests of burst types queued during the current RX
    /// burst (`burst.rs`); its capacity, allocated once, is fixed (none
    /// without a burst handler).
    burst_pending: Vec<burst::Pending>,
    sm_handler: Option<SessionHandler<T, C>>,
    sm_queue: Arc<SmQueue>,
    /// Client sessions with an SM request outstanding.
    sm_pending: Vec<u16>,
    /// Server sessions by the client's unique token.
    token_map: HashMap<u64, u16>,
    /// Tokens of server sessions freed recently.
    retired_tokens: tokens::RetiredTokens,
    /// Client connects that timed out, cleaned up at the server if it
    /// answers late.
    abandoned: Vec<sm_handlers::AbandonedConnect>,
    tx: TxBatch<T::Route>,
    /// Header slots of control packets (always `Some` until drop).
    ctrl: Option<Buffer>,
    ctrl_next: usize,
    /// Control header slots (a power of two; see `builder::ctrl_buffer`).
    ctrl_bufs: usize,
    tx_burst_max: usize,
    /// Client slots waiting for credits: (session, slot).
    stallq: Vec<(u16, u8)>,
    /// Client sessions with requests (what the loss scan visits), and
    /// what only they need (`active.rs`).
    active: active::Active,
    /// Session events and error continuations owed to the application,
    /// paid at the next event-loop iteration.
    owed: VecDeque<reset::Owed<T, C>>,
    /// Connect requests per source (`admission.rs`).
    connect_limiter: admission::ConnectLimiter,
    /// The burst of that limiter (0: no limit; see
    /// `RpcConfig::connect_burst_per_source`).
    connect_burst: u32,
    /// The server sessions of each source host (admission).
    source_shares: admission::SourceShares,
    /// Ring entries one source's server sessions may hold (0: no limit).
    ring_share_per_source: usize,
    /// Server sessions ended without their erpc-rs client's disconnect
    /// (reclaimed ones with their numbers reserved for a while): the
    /// notices their clients get again (`admission.rs`).
    notices: VecDeque<admission::Notice>,
    /// Server slots that began a multi-packet request, as (session, slot,
    /// request number): the sweep frees a reassembly whose packets
    /// stopped coming (`req.rs`, `expire_reassembly`).
    reassembling: Vec<(SessionNum, u8, u64)>,
    /// Idle served sessions that may be reclaimed, as (last request,
    /// session, token), least recently used last (`admission.rs`).
    idle_candidates: Vec<(u64, SessionNum, u64)>,
    /// When the sessions were last walked for those (0: never).
    last_idle_walk_ns: u64,
    /// Server sessions that may not have served a request yet, in
    /// creation order, as (session, client token, probes sent)
    /// (`admission.rs`).
    unserved: VecDeque<(SessionNum, u64, u8)>,
    /// When `probe_unserved` looks at them next.
    next_probe_round_ns: u64,
    /// Test hook: request-number base of sessions made from now on
    /// (`Rpc::fault_set_req_base`).
    req_base_override: Option<u64>,
    /// When the loss scan runs next (a scan interval after the last one:
    /// a deadline is one compare per iteration).
    next_loss_scan_ns: u64,
    /// The drop counts last logged (`rpc/loss.rs`, `log_drops`).
    drops_logged: crate::stats::DropCounts,
    rto_ns: u64,
    loss_scan_ns: u64,
    /// The last loss scan was put off because the event loop had not run
    /// for a scan interval (`ev_loop.rs`, `defer_late_scan`): the next one
    /// runs whenever it is due.
    loss_scan_deferred: bool,
    /// The timing wheel (congestion control on).
    wheel: Option<crate::cc::TimingWheel>,
    /// The controller parameters every session shares.
    cc_shared: crate::cc::CcShared,
    /// How bursts are paced (from the configuration; `cc_on` exactly when
    /// `wheel` is `Some`): one byte for the hot paths to test.
    pacing: cc::Pacing,
    /// TX timestamps per client slot (a power of two ≥ the credits).
    tx_ts_cap: usize,
    bg: BgState,
    /// Which of the credit-stall queue, background jobs and the timing
    /// wheel may have work ([`ev_loop::PENDING_STALLQ`] and co.): set
    /// where work is queued, recomputed from the queues after the event
    /// loop has looked at them, so that an idle iteration tests one byte
    /// instead of each queue. A bit may be set with nothing to do (one
    /// wasted call), never clear with something to do (debug builds
    /// check it at every iteration).
    pending: u8,
    /// [`ev_loop::GATE_IN_LOOP`] and [`ev_loop::GATE_OWED`]: what an
    /// iteration's start must look at besides RX (one byte tested).
    gate: u8,
    stats: RpcStats,
    /// Debug-endpoint publication (`crate::inspect`), if the Nexus is exposed.
    pub(crate) inspect: Option<debug_endpoint::Publisher<crate::inspect::RpcRaw>>,
    _not_send: PhantomData<*const ()>,
}

impl<T: Transport, C> fmt::Debug for Rpc<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Rpc {{ id {}, uri {}, {} sessions, {} }}",
            self.rpc_id,
            self.nexus.uri(),
            self.open_sessions,
            self.stats
        )
    }
}

/// Bytes per control-packet header slot in the control buffer.
const CTRL_SLOT_BYTES: usize = 64;
const _: () = assert!(CTRL_SLOT_BYTES >= transport::PKTHDR_BYTES);

/// Message buffers back to where they came from, and session lookup.
impl<T: Transport, C> Rpc<T, C> {
    /// Frees a msgbuf ([`Rpc::free_msg_buffer`]): a server slot's
    /// preallocated response buffer goes back to its slot, any other to
    /// the allocator.
    pub(crate) fn recycle(&mut self, m: MsgBuf) {
        if let Origin::PreallocResp { session, slot } = m.origin()
            && let Some(s) = self.sessions.session_mut(session)
            && let Some(sv) = s
                .half
                .as_server_mut()
                .and_then(|a| a.get_mut(usize::from(slot)))
            && sv.pre_resp.is_none()
        {
            sv.pre_resp = Some(m);
            return;
        }
        self.alloc.free(m.into_buffer());
    }

    /// RX ring entries not reserved by sessions, and the ring's size.
    pub(crate) fn ring_reservation(&self) -> (usize, usize) {
        (self.ring_entries_available, self.ring_entries)
    }

    #[inline]
    pub(crate) fn session(&self, sn: SessionNum) -> Option<&Session<T, C>> {
        self.sessions.session(sn)
    }

    #[inline]
    pub(crate) fn session_mut(&mut self, sn: SessionNum) -> Option<&mut Session<T, C>> {
        self.sessions.session_mut(sn)
    }
}

impl<T: Transport, C> Drop for Rpc<T, C> {
    /// Gives everything back: sessions stop being pinged, connected (or
    /// disconnecting) client sessions get one best-effort disconnect
    /// request, which the Nexus repeats a few times (the server frees
    /// its end if it arrives; otherwise its keep-alive notices this Rpc is
    /// gone), background jobs still at workers are waited for (those not
    /// started come back unrun; a running handler is waited for at most
    /// [`crate::NexusBuilder::worker_drop_wait`], then abandoned with its
    /// buffers), and every other buffer returns to the allocator. Owed continuations do not run (there
    /// is no context); their buffers are freed.
    fn drop(&mut self) {
        let connected: Vec<u16> = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| {
                // A disconnect under way too: its request (or the answer)
                // may have been lost, and this Rpc retries it no more.
                s.role == session::Role::Client
                    && matches!(
                        s.state,
                        SessionState::Connected | SessionState::DisconnectInProgress
                    )
            })
            .filter(|s| s.remote_incarnation != 0 || s.busy_slots() == 0)
            .map(|s| s.local_num)
            .collect();
        // (Not to a C++ server with requests of the session unfinished:
        // it cannot take one then. Its own failure detection frees them.)
        // The Nexus sends each again a few times (this Rpc cannot).
        let mut orphans = Vec::with_capacity(connected.len());
        for sn in connected {
            if let Some(p) = self.disconnect_pkt(sn) {
                self.stats.sm_tx += 1;
                self.nexus.sm_send(&p.0, &p.1);
                orphans.push(p);
            }
        }
        // A connect still unanswered may have made a server session: its
        // request goes again, and the answer, reaching the next Rpc with
        // this id, gets that session disowned (`disown_server_session`;
        // erpc-rs servers only).
        if self.nexus.sm_extensions() {
            let connecting: Vec<u16> = self
                .sessions
                .iter()
                .flatten()
                .filter(|s| s.state == SessionState::ConnectInProgress)
                .map(|s| s.local_num)
                .collect();
            orphans.extend(connecting.into_iter().filter_map(|sn| self.sm_req_pkt(sn)));
        }
        // The SM requests this Rpc was still repeating for sessions it
        // already freed (disconnects unanswered, connects given up): the
        // Nexus takes them over too, or a lost one would leave a server
        // session behind.
        orphans.extend(self.abandoned_pkts());
        let now = self.clock.now_ns();
        self.nexus
            .adopt_disconnects(orphans, now, self.config.sm_retry_ms * 1_000_000);
        self.nexus.unregister_rpc(self.rpc_id);
        // Let the transport let go of every buffer before they are freed.
        self.tx.clear();
        self.transport.tx_flush();
        let sessions = self.sessions.take_all();
        for s in sessions {
            let s = *s;
            if s.tracked {
                self.nexus
                    .router()
                    .untrack(&s.remote_uri, s.remote_rpc_id(), s.remote_incarnation);
            }
            let alloc = &mut self.alloc;
            s.into_buffers(|m| alloc.free(m.into_buffer()));
        }
        for o in std::mem::take(&mut self.owed) {
            if let reset::Owed::Failed(f) = o {
                self.alloc.free(f.req.into_buffer());
                self.alloc.free(f.resp.into_buffer());
            }
        }
        for j in std::mem::take(&mut self.bg.backlog) {
            self.alloc.free(j.req.into_buffer());
            self.alloc.free(j.resp.into_buffer());
        }
        // Jobs at workers come back (unrun if not started); a handler
        // still running after the Nexus's drop wait is abandoned, so this
        // never blocks forever.
        let alloc = &mut self.alloc;
        let left = self.bg.links.retire(self.nexus.workers(), |j| {
            alloc.free(j.req.into_buffer());
            alloc.free(j.resp.into_buffer());
        });
        if left != 0 {
            tracing::error!(
                jobs = left,
                "background handlers still running after the drop wait; abandoning their buffers"
            );
        }
        if let Some(ctrl) = self.ctrl.take() {
            self.alloc.free(ctrl);
        }
    }
}

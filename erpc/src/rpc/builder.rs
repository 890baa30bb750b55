//! Making an Rpc: [`RpcBuilder`] and the steps of `build`, in order.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use mempool::{Allocator, Buffer};
use transport::{RxRing, Transport};

use super::{
    BgState, BurstHandler, CTRL_SLOT_BYTES, CreateError, HandlerSlot, ReqHandler, Rpc, RpcConfig,
    SessionHandler, TxBatch, active, admission, cc, tokens,
};
use crate::consts::{CONNECT_BURST_PER_SOURCE, CTRL_BUFS};
use crate::nexus::{HandlerEntry, Nexus, SmQueue};
use crate::session;
use crate::stats::RpcStats;

/// Builds an [`Rpc`]: made with [`Rpc::builder`], which takes what an Rpc
/// cannot do without (its Nexus, the transport it owns and the allocator
/// its message buffers come from); the rest has defaults.
///
/// | Setting | Default |
/// |---|---|
/// | [`id`](Self::id): the Rpc's id within its Nexus, what a client names in [`Rpc::create_session`] | 0 |
/// | [`config`](Self::config): timeouts, credits, congestion control, admission | [`RpcConfig::default`] |
/// | [`session_handler`](Self::session_handler): the callback for session events | none (events are only logged) |
pub struct RpcBuilder<T: Transport, C> {
    nexus: Arc<Nexus>,
    transport: T,
    alloc: Allocator,
    rpc_id: u8,
    config: RpcConfig,
    sm_handler: Option<SessionHandler<T, C>>,
}

impl<T: Transport, C> fmt::Debug for RpcBuilder<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcBuilder")
            .field("nexus", &self.nexus.uri())
            .field("rpc_id", &self.rpc_id)
            .field("config", &self.config)
            .field("session_handler", &self.sm_handler.is_some())
            .finish_non_exhaustive()
    }
}

impl<T: Transport + 'static, C: 'static> RpcBuilder<T, C> {
    pub(crate) fn new(nexus: &Arc<Nexus>, transport: T, alloc: Allocator) -> Self {
        RpcBuilder {
            nexus: nexus.clone(),
            transport,
            alloc,
            rpc_id: 0,
            config: RpcConfig::default(),
            sm_handler: None,
        }
    }

    /// The Rpc's id within its Nexus (default 0; at most
    /// [`MAX_RPC_ID`](crate::consts::MAX_RPC_ID)), unique there: clients
    /// connect to a Nexus's URI and an Rpc id. One Rpc per thread, so a
    /// process with several threads gives each its own id.
    pub fn id(mut self, rpc_id: u8) -> Self {
        self.rpc_id = rpc_id;
        self
    }

    /// The Rpc's settings (default [`RpcConfig::default`]).
    pub fn config(mut self, config: RpcConfig) -> Self {
        self.config = config;
        self
    }

    /// The callback the event loop calls with each [`SessionEvent`](crate::SessionEvent)
    /// (connected, failed, reset, ...); without one, events are only
    /// logged.
    pub fn session_handler(mut self, handler: SessionHandler<T, C>) -> Self {
        self.sm_handler = Some(handler);
        self
    }

    /// Makes the Rpc: checks the settings against the transport, copies
    /// the Nexus's handler table (each dispatch and burst handler must
    /// have been registered for this `T` and `C`), registers the id with
    /// the Nexus and allocates the control-packet headers.
    pub fn build(mut self) -> Result<Rpc<T, C>, CreateError> {
        cc_for_transport(&self.transport, &mut self.config, self.rpc_id);
        let ring = self
            .transport
            .take_rx_ring()
            .ok_or(CreateError::RingTaken)?;
        check_config(&self.config, ring.entries(), self.transport.tx_burst_max())?;
        let handlers = handler_table::<T, C>(&self.nexus)?;
        let sm_queue = self
            .nexus
            .register_rpc(self.rpc_id)
            .ok_or(CreateError::RpcId(self.rpc_id))?;
        let ctrl = match ctrl_buffer(&mut self.alloc, self.transport.tx_depth()) {
            Ok(c) => c,
            Err(e) => {
                self.nexus.unregister_rpc(self.rpc_id);
                return Err(e.into());
            }
        };
        Ok(self.assemble(ring, handlers, sm_queue, ctrl))
    }

    /// The Rpc, from the builder and what `build` acquired (its RX ring,
    /// handler table, SM queue and control buffer): every queue empty, its
    /// timers starting now.
    fn assemble(
        self,
        ring: T::Ring,
        handlers: Box<[HandlerSlot<T, C>; 256]>,
        sm_queue: Arc<SmQueue>,
        (ctrl, ctrl_bufs): (Buffer, usize),
    ) -> Rpc<T, C> {
        let RpcBuilder {
            nexus,
            transport,
            alloc,
            rpc_id,
            config,
            sm_handler,
        } = self;
        let ring_entries = ring.entries();
        let tx_burst_max = transport.tx_burst_max();
        // Burst requests of one RX burst, queued until the burst is read;
        // allocated once (none without a burst handler).
        let burst_pending = if handlers.iter().any(|h| matches!(h, HandlerSlot::Burst(_))) {
            Vec::with_capacity(ring_entries.min(crate::consts::MAX_BURST_PENDING))
        } else {
            Vec::new()
        };
        let clock = nexus.clock().clone();
        let now_ns = clock.now_ns();
        Rpc {
            ring: Some(ring),
            ring_entries,
            rx_head: 0,
            alloc,
            rpc_id,
            clock,
            now_ns,
            sessions: session::SessionTable::new(),
            free_session_nums: VecDeque::new(),
            open_sessions: 0,
            ring_entries_available: ring_entries,
            handlers,
            burst_pending,
            sm_handler,
            sm_queue,
            sm_pending: Vec::new(),
            token_map: HashMap::new(),
            retired_tokens: tokens::RetiredTokens::default(),
            abandoned: Vec::new(),
            tx: TxBatch::new(),
            ctrl: Some(ctrl),
            ctrl_next: 0,
            ctrl_bufs,
            tx_burst_max,
            stallq: Vec::with_capacity(64),
            active: active::Active::new(config.session_credits.next_power_of_two()),
            owed: VecDeque::new(),
            req_base_override: None,
            connect_limiter: admission::ConnectLimiter::default(),
            source_shares: admission::SourceShares::default(),
            ring_share_per_source: config.ring_entries_per_source.unwrap_or(0),
            connect_burst: config.connect_burst_per_source.unwrap_or_else(|| {
                u32::try_from(ring_entries / config.session_credits)
                    .unwrap_or(u32::MAX)
                    .max(CONNECT_BURST_PER_SOURCE)
            }),
            notices: VecDeque::new(),
            reassembling: Vec::new(),
            idle_candidates: Vec::new(),
            last_idle_walk_ns: 0,
            unserved: VecDeque::new(),
            next_probe_round_ns: 0,
            next_loss_scan_ns: now_ns + config.pkt_loss_scan_us * 1000,
            drops_logged: Default::default(),
            rto_ns: config.rto_us * 1000,
            loss_scan_ns: config.pkt_loss_scan_us * 1000,
            loss_scan_deferred: false,
            wheel: config
                .cc
                .enabled
                .then(|| crate::cc::TimingWheel::new(config.cc.wheel(), now_ns)),
            pacing: cc::Pacing::new(&config.cc),
            cc_shared: crate::cc::CcShared::new(&config.cc),
            tx_ts_cap: config.session_credits.next_power_of_two(),
            bg: BgState {
                links: nexus.workers().connect(rpc_id),
                backlog: VecDeque::new(),
                scratch: Vec::new(),
            },
            pending: 0,
            gate: 0,
            stats: RpcStats::default(),
            inspect: nexus.inspect_publisher(rpc_id),
            transport,
            nexus,
            config,
            _not_send: PhantomData,
        }
    }
}

/// Turns congestion control off on a transport whose round trips are a
/// host software stack's, unless the configuration insists (see
/// `CcConfig::on_software_stack`).
fn cc_for_transport<T: Transport>(transport: &T, config: &mut RpcConfig, rpc_id: u8) {
    if config.cc.enabled && !transport.rtt_is_network() && !config.cc.on_software_stack {
        tracing::info!(
            rpc_id,
            "congestion control off: this transport's round trips are a host software \
             stack's (set cc.on_software_stack to run it anyway)"
        );
        config.cc.enabled = false;
    }
}

/// The settings, against the transport's RX ring and TX burst limit.
fn check_config(
    config: &RpcConfig,
    ring_entries: usize,
    tx_burst_max: usize,
) -> Result<(), CreateError> {
    if config.session_credits == 0 || config.session_credits > ring_entries {
        return Err(CreateError::Credits {
            credits: config.session_credits,
            ring_entries,
        });
    }
    if tx_burst_max == 0 || tx_burst_max > crate::consts::MAX_TX_BATCH {
        return Err(CreateError::TxBurst(tx_burst_max));
    }
    let cc = &config.cc;
    if cc.enabled
        && !(cc.link_rate().is_finite()
            && cc.timely.min_rate > 0.0
            && cc.link_rate() >= cc.timely.min_rate)
    {
        return Err(CreateError::CcConfig {
            link_gbps: cc.link_gbps,
            min_rate_mbps: cc.timely.min_rate / 1e6,
        });
    }
    if config.rto_us == 0
        || config.pkt_loss_scan_us == 0
        || config.pkt_loss_scan_us >= config.rto_us
    {
        return Err(CreateError::LossTiming {
            rto_us: config.rto_us,
            scan_us: config.pkt_loss_scan_us,
        });
    }
    // A slot's wheel entries carry an 8-bit rollback generation: a stale
    // entry must leave the wheel (within its horizon) before the slot's
    // generation comes round again, at most one rollback per
    // retransmission timeout.
    if cc.enabled {
        let horizon_us = cc.wheel().horizon_ns.div_ceil(1000);
        let min_us = horizon_us.div_ceil(u64::from(u8::MAX)) + 1;
        if config.rto_us < min_us {
            return Err(CreateError::RtoBelowWheel {
                rto_us: config.rto_us,
                min_us,
            });
        }
    }
    Ok(())
}

/// The Nexus's handler table as this Rpc's `T` and `C` see it: one entry
/// per request type, each dispatch and burst handler checked to have been
/// registered for them.
fn handler_table<T: Transport + 'static, C: 'static>(
    nexus: &Nexus,
) -> Result<Box<[HandlerSlot<T, C>; 256]>, CreateError> {
    let mut handlers = Box::new([HandlerSlot::None; 256]);
    for (t, slot) in handlers.iter_mut().enumerate() {
        let wrong = |registered, expected| CreateError::HandlerType {
            req_type: t as u8,
            registered,
            expected,
        };
        *slot = match nexus.handler(t as u8) {
            None => HandlerSlot::None,
            Some(HandlerEntry::Background(_)) => HandlerSlot::Background,
            Some(HandlerEntry::Burst { func, type_name }) => {
                match func.downcast_ref::<BurstHandler<T, C>>() {
                    Some(f) => HandlerSlot::Burst(*f),
                    None => {
                        let expected = std::any::type_name::<BurstHandler<T, C>>();
                        return Err(wrong(type_name, expected));
                    }
                }
            }
            Some(HandlerEntry::Dispatch { func, type_name }) => {
                match func.downcast_ref::<ReqHandler<T, C>>() {
                    Some(f) => HandlerSlot::Dispatch(*f),
                    None => {
                        let expected = std::any::type_name::<ReqHandler<T, C>>();
                        return Err(wrong(type_name, expected));
                    }
                }
            }
        };
    }
    Ok(handlers)
}

/// The control-packet header slots, and how many. A control header is
/// rewritten only after `ctrl_bufs` later control packets: at least twice
/// what the transport may still hold unread (its send queue), so none is
/// rewritten under the NIC.
fn ctrl_buffer(
    alloc: &mut Allocator,
    tx_depth: usize,
) -> Result<(Buffer, usize), mempool::AllocError> {
    let ctrl_bufs = (2 * tx_depth).max(CTRL_BUFS).next_power_of_two();
    let ctrl = alloc.alloc(ctrl_bufs * CTRL_SLOT_BYTES)?;
    debug_assert!(ctrl.capacity() >= ctrl_bufs * CTRL_SLOT_BYTES);
    Ok((ctrl, ctrl_bufs))
}

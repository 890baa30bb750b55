//! Session management without sockets or threads: SM packets between the
//! Nexuses of one simulation travel through this hub with a delay, random
//! extra delay (which reorders them), and optional loss and duplication,
//! and are delivered when the virtual clock passes their due time
//! ([`SimSmHub::deliver_due`], called by `SimNet::advance`). The hub also
//! runs each Nexus's failure detection on the virtual clock (the job of
//! the SM thread in production), and can cut a Nexus off (a crash). A
//! tap records what reaches a URI, so a test can stand in for a peer (a
//! C++ eRPC process) or replay a packet later; [`SimSmHub::inject_from`]
//! hands a Nexus bytes from any source, as a forger's (or a replayed
//! packet's) datagram would arrive. Each packet carries its true source
//! (the sending Nexus's URI), as a UDP datagram carries its source
//! address, whatever the packet claims.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use erpc::VirtualClock;
use erpc::sm::{SmLink, SmRouter, SmSource};
use erpc::wire::SM_PKT_BYTES;
use erpc::{NexusError, Uri};
use netsim::Rng;

/// SM hub behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmHubConfig {
    /// One-way delay of an SM packet.
    pub delay_ns: u64,
    /// Extra random delay in `0..=jitter_ns` per packet (independently, so
    /// packets may overtake each other).
    pub jitter_ns: u64,
    /// Loss probability per million packets.
    pub loss_ppm: u32,
    /// Duplication probability per million packets.
    pub dup_ppm: u32,
}

impl Default for SmHubConfig {
    fn default() -> Self {
        SmHubConfig {
            delay_ns: 20_000,
            jitter_ns: 0,
            loss_ppm: 0,
            dup_ppm: 0,
        }
    }
}

/// Hub counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmHubStats {
    /// Packets sent.
    pub sent: u64,
    /// Packets handed to a Nexus.
    pub delivered: u64,
    /// Lost on purpose.
    pub lost: u64,
    /// Duplicated on purpose.
    pub duplicated: u64,
    /// Addressed to a URI no Nexus has.
    pub no_such_nexus: u64,
    /// Dropped because the sender or receiver is cut off.
    pub blackholed: u64,
    /// Delivered to a tap at a URI no Nexus has (see [`SimSmHub::tap`]).
    pub tapped: u64,
    /// Forged or replayed packets the hub added (see
    /// [`SimSmHub::set_forgery`]).
    pub forged: u64,
}

struct Pending {
    at_ns: u64,
    seq: u64,
    /// The Nexus that sent it (its true source).
    from: Uri,
    to: Uri,
    pkt: [u8; SM_PKT_BYTES],
}

/// The sender an SM packet names (the client endpoint of requests, the
/// server endpoint of responses, as the SM thread routes them).
fn claimed_sender(pkt: &[u8]) -> Option<Uri> {
    let p = erpc::wire::SmPkt::decode(pkt).ok()?;
    if p.pkt_type.is_req() {
        p.client.uri()
    } else {
        p.server.uri()
    }
}

/// Where the packets of the Nexus at `uri` come from in the hub.
fn resolve(uri: &Uri) -> Option<SmSource> {
    Some(SmSource::Sim(uri.clone()))
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.at_ns, self.seq) == (o.at_ns, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at_ns, self.seq).cmp(&(o.at_ns, o.seq))
    }
}

/// Most packets a tap keeps before it stops recording (counted).
const MAX_TAP: usize = 1 << 16;

/// Packets the forger remembers to replay.
const FORGER_MEMORY: usize = 64;

/// The source of forged packets that do not pretend to come from their
/// sender's address (no Nexus has it).
pub const FORGER_URI: (&str, u16) = ("forger", 6666);

struct HubInner {
    routers: BTreeMap<Uri, Arc<SmRouter>>,
    /// Recorded packets per tapped URI.
    taps: BTreeMap<Uri, Vec<[u8; SM_PKT_BYTES]>>,
    cut_off: BTreeSet<Uri>,
    /// Nexuses whose outgoing SM packets are dropped (`set_mute`).
    muted: BTreeSet<Uri>,
    last_tick_ns: u64,
    /// The failure-detection cadence: a quarter of the shortest ping
    /// interval of the Nexuses present, at most 1 ms (kept up to date as
    /// Nexuses come and go; a ping interval never changes).
    tick_ns: u64,
    /// Reused buffer of pings due.
    pings: Vec<(Uri, [u8; SM_PKT_BYTES])>,
    q: BinaryHeap<Reverse<Pending>>,
    rng: Rng,
    cfg: SmHubConfig,
    seq: u64,
    stats: SmHubStats,
    /// Forged or replayed packets per million sent.
    forge_ppm: u32,
    /// Recent packets (source, destination, bytes), for replays.
    recent: std::collections::VecDeque<(Uri, Uri, [u8; SM_PKT_BYTES])>,
}

/// The in-memory SM network of a simulation.
pub struct SimSmHub {
    clock: VirtualClock,
    inner: Mutex<HubInner>,
    /// The earliest time `deliver_due` has anything to do (the next
    /// packet's due time or the next failure-detection tick), republished
    /// under the lock after every change: the common call, with nothing
    /// due, returns after one load instead of taking the lock.
    due_ns: AtomicU64,
}

impl fmt::Debug for SimSmHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimSmHub {{ {:?} }}", self.stats())
    }
}

impl SimSmHub {
    /// A hub on `clock`.
    pub fn new(clock: VirtualClock, seed: u64, cfg: SmHubConfig) -> SimSmHub {
        SimSmHub {
            clock,
            inner: Mutex::new(HubInner {
                routers: BTreeMap::new(),
                taps: BTreeMap::new(),
                cut_off: BTreeSet::new(),
                muted: BTreeSet::new(),
                last_tick_ns: 0,
                tick_ns: tick_ns(&BTreeMap::new()),
                pings: Vec::new(),
                q: BinaryHeap::new(),
                rng: Rng::new(seed),
                cfg,
                seq: 0,
                stats: SmHubStats::default(),
                forge_ppm: 0,
                recent: std::collections::VecDeque::new(),
            }),
            due_ns: AtomicU64::new(0),
        }
    }

    /// Publishes when `deliver_due` next has work, from `g` (the lock held).
    fn publish_due(&self, g: &HubInner) {
        let tick = g.last_tick_ns.saturating_add(g.tick_ns);
        let next = g.q.peek().map_or(u64::MAX, |p| p.0.at_ns);
        self.due_ns.store(tick.min(next), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes loss/delay from now on.
    pub fn set_config(&self, cfg: SmHubConfig) {
        self.lock().cfg = cfg;
    }

    /// An attacker on the SM network, from now on: for `ppm` of every
    /// million packets sent, the hub also delivers a forged or replayed
    /// one, chosen at random (seeded) among
    ///
    /// * a recent packet replayed, from its true source or from
    ///   [`FORGER_URI`];
    /// * a copy of the packet claiming a newer incarnation of its sender,
    ///   from [`FORGER_URI`] (ping requests and responses; connect
    ///   requests with a fresh token);
    /// * a copy claiming an older incarnation (a dead process's packet),
    ///   from the sender's own address (same types);
    /// * a ping response naming the packet's sender, with no live Rpcs and
    ///   a random token, from the sender's address.
    ///
    /// Packets of C++-style endpoints (no incarnation) are only replayed.
    /// None of it may reset a session or keep a request from completing
    /// (`tests/forged_sm.rs`).
    pub fn set_forgery(&self, ppm: u32) {
        self.lock().forge_ppm = ppm;
    }

    /// Counters.
    pub fn stats(&self) -> SmHubStats {
        self.lock().stats
    }

    /// Due time of the next packet.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.lock().q.peek().map(|p| p.0.at_ns)
    }

    /// Cuts the Nexus at `uri` off (`true`: every SM packet to or from it
    /// is dropped, as when its process crashes) or reconnects it.
    pub fn set_cut_off(&self, uri: &Uri, cut: bool) {
        let mut g = self.lock();
        if cut {
            g.cut_off.insert(uri.clone());
        } else {
            g.cut_off.remove(uri);
        }
    }

    /// Cuts one direction only (`true`: every SM packet the Nexus at `uri`
    /// sends is dropped; what is sent to it still arrives), as a one-way
    /// partition: its peers stop hearing it while it hears them.
    pub fn set_mute(&self, uri: &Uri, mute: bool) {
        let mut g = self.lock();
        if mute {
            g.muted.insert(uri.clone());
        } else {
            g.muted.remove(uri);
        }
    }

    fn push(g: &mut HubInner, now_ns: u64, from: &Uri, to: Uri, pkt: [u8; SM_PKT_BYTES]) {
        g.stats.sent += 1;
        let cfg = g.cfg;
        if (!g.cut_off.is_empty() && (g.cut_off.contains(&to) || g.cut_off.contains(from)))
            || (!g.muted.is_empty() && g.muted.contains(from))
        {
            g.stats.blackholed += 1;
            return;
        }
        if g.rng.chance_ppm(cfg.loss_ppm) {
            g.stats.lost += 1;
            return;
        }
        let copies = if g.rng.chance_ppm(cfg.dup_ppm) {
            g.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            Self::enqueue(g, now_ns, from.clone(), to.clone(), pkt);
        }
        if g.forge_ppm > 0 {
            Self::forge(g, now_ns, from, &to, &pkt);
        }
    }

    fn enqueue(g: &mut HubInner, now_ns: u64, from: Uri, to: Uri, pkt: [u8; SM_PKT_BYTES]) {
        let cfg = g.cfg;
        g.seq += 1;
        let seq = g.seq;
        let jitter = if cfg.jitter_ns > 0 {
            g.rng.below(cfg.jitter_ns + 1)
        } else {
            0
        };
        g.q.push(Reverse(Pending {
            at_ns: now_ns + cfg.delay_ns + jitter,
            seq,
            from,
            to,
            pkt,
        }));
    }

    /// The attacker of [`SimSmHub::set_forgery`] sees `pkt` go from `from`
    /// to `to`, and perhaps adds a packet of its own.
    fn forge(g: &mut HubInner, now_ns: u64, from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        use erpc::wire::{EXT_RPC_BITMAP_BYTES, SmPkt, SmPktType as T};
        if g.recent.len() >= FORGER_MEMORY {
            g.recent.pop_front();
        }
        g.recent.push_back((from.clone(), to.clone(), *pkt));
        if !g.rng.chance_ppm(g.forge_ppm) {
            return;
        }
        let forger = Uri::new(FORGER_URI.0, FORGER_URI.1);
        let Ok(p) = SmPkt::decode(pkt) else { return };
        let claimed_inc = if p.pkt_type.is_req() {
            p.client.incarnation()
        } else {
            p.server.incarnation()
        };
        let mutable =
            claimed_inc > 1 && matches!(p.pkt_type, T::PingReq | T::PingResp | T::ConnectReq);
        let kind = if mutable {
            g.rng.below(5)
        } else {
            g.rng.below(2)
        };
        let mut f = p;
        let set_inc = |f: &mut SmPkt, inc: u64| {
            if f.pkt_type.is_req() {
                f.client.set_incarnation(inc);
            } else {
                f.server.set_incarnation(inc);
            }
        };
        let (src, dst, bytes) = match kind {
            0 | 1 => {
                let k = g.rng.below(g.recent.len() as u64) as usize;
                let (src, dst, bytes) = g.recent[k].clone();
                (if kind == 0 { src } else { forger }, dst, bytes)
            }
            2 => {
                set_inc(&mut f, claimed_inc + ((1 + g.rng.below(1 << 20)) << 20));
                if f.pkt_type == T::ConnectReq {
                    f.uniq_token = g.rng.next_u64();
                }
                (forger, to.clone(), f.encode())
            }
            3 => {
                set_inc(&mut f, 1 + g.rng.below(claimed_inc - 1));
                if f.pkt_type == T::ConnectReq {
                    f.uniq_token = g.rng.next_u64();
                }
                (from.clone(), to.clone(), f.encode())
            }
            _ => {
                // A ping response naming the sender, from its address.
                let sender = if p.pkt_type.is_req() {
                    p.client
                } else {
                    p.server
                };
                let mut r = SmPkt {
                    pkt_type: T::PingResp,
                    err: erpc::wire::SmErr::NoError,
                    uniq_token: g.rng.next_u64(),
                    client: if p.pkt_type.is_req() {
                        p.server
                    } else {
                        p.client
                    },
                    server: sender,
                };
                r.server.set_rpc_bitmap(&[0; EXT_RPC_BITMAP_BYTES]);
                r.server.set_incarnation(claimed_inc);
                (from.clone(), to.clone(), r.encode())
            }
        };
        g.stats.forged += 1;
        Self::enqueue(g, now_ns, src, dst, bytes);
    }

    /// Delivers every packet due by `now_ns` (replies the routers produce
    /// are sent through the hub in turn), then runs every Nexus's failure
    /// detection. Bounded by the packets queued at entry plus the replies
    /// they cause.
    pub fn deliver_due(&self, now_ns: u64) {
        if now_ns < self.due_ns.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.lock();
        // Failure detection at a bounded cadence of virtual time (a
        // quarter of the shortest ping interval, at most 1 ms), as the SM
        // thread's wake-ups do in production.
        if now_ns.saturating_sub(g.last_tick_ns) >= g.tick_ns {
            g.last_tick_ns = now_ns;
            let mut pings = std::mem::take(&mut g.pings);
            // Who sent which pings (allocated only when a ping is due).
            let mut senders: Vec<(Uri, usize)> = Vec::new();
            for (u, r) in g.routers.iter() {
                r.tick(&mut pings);
                if pings.len() > senders.last().map_or(0, |s| s.1) {
                    senders.push((u.clone(), pings.len()));
                }
            }
            let mut due = pings.drain(..);
            let mut k = 0;
            for (from, end) in senders {
                while k < end {
                    let (to, ping) = due.next().expect("counted above");
                    k += 1;
                    Self::push(&mut g, now_ns, &from, to, ping);
                }
            }
            drop(due);
            g.pings = pings;
        }
        let bound = 2 * g.q.len() + 1;
        for _ in 0..bound {
            match g.q.peek() {
                Some(p) if p.0.at_ns <= now_ns => {}
                _ => break,
            }
            let Some(Reverse(p)) = g.q.pop() else { break };
            if g.cut_off.contains(&p.to) {
                g.stats.blackholed += 1;
                continue;
            }
            let tapped = match g.taps.get_mut(&p.to) {
                Some(t) => {
                    if t.len() < MAX_TAP {
                        t.push(p.pkt);
                    }
                    true
                }
                None => false,
            };
            let Some(router) = g.routers.get(&p.to).cloned() else {
                if tapped {
                    g.stats.tapped += 1;
                } else {
                    g.stats.no_such_nexus += 1;
                }
                continue;
            };
            g.stats.delivered += 1;
            if let Some((to, reply)) = router.deliver(&p.pkt, &SmSource::Sim(p.from), &resolve) {
                Self::push(&mut g, now_ns, &p.to, to, reply);
            }
        }
        self.publish_due(&g);
    }
}

/// The failure-detection cadence for `routers` (see `HubInner::tick_ns`).
fn tick_ns(routers: &BTreeMap<Uri, Arc<SmRouter>>) -> u64 {
    let min_interval = routers
        .values()
        .map(|r| r.tick_interval_ns())
        .min()
        .unwrap_or(u64::MAX);
    (min_interval / 4).min(1_000_000)
}

impl SimSmHub {
    /// Records every SM packet the hub delivers to `uri` from now on
    /// (after its delay, loss and duplication), for
    /// [`SimSmHub::take_tapped`]. A Nexus at `uri` still gets them; with
    /// no Nexus there the tap is their only receiver, so a test can play a
    /// peer the hub does not know (a C++ eRPC process) by reading what
    /// reaches it and answering with [`SimSmHub::inject`]. At most 65536
    /// packets are kept between takes.
    pub fn tap(&self, uri: &Uri) {
        self.lock().taps.entry(uri.clone()).or_default();
    }

    /// The packets recorded at `uri` since the last call, oldest first
    /// (empty if `uri` is not tapped).
    pub fn take_tapped(&self, uri: &Uri) -> Vec<[u8; SM_PKT_BYTES]> {
        self.lock()
            .taps
            .get_mut(uri)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Hands arbitrary bytes to the Nexus at `to` right now, as if they
    /// arrived on its SM port from the Nexus they name as their sender (a
    /// peer the hub does not know, such as a C++ eRPC process a test plays;
    /// fuzzing). Replies go through the hub.
    pub fn inject(&self, to: &Uri, bytes: &[u8]) {
        let from = claimed_sender(bytes).unwrap_or_else(|| Uri::new("?", 0));
        self.inject_from(&from, to, bytes);
    }

    /// Hands arbitrary bytes to the Nexus at `to` right now, as if they
    /// arrived on its SM port from `from`, whatever they claim: a forger's
    /// datagram, or a packet replayed from elsewhere. Replies go through
    /// the hub (to whoever the packet names).
    pub fn inject_from(&self, from: &Uri, to: &Uri, bytes: &[u8]) {
        let now = self.clock.now_ns();
        let mut g = self.lock();
        let Some(router) = g.routers.get(to).cloned() else {
            g.stats.no_such_nexus += 1;
            return;
        };
        if let Some((dst, reply)) = router.deliver(bytes, &SmSource::Sim(from.clone()), &resolve) {
            Self::push(&mut g, now, to, dst, reply);
        }
        self.publish_due(&g);
    }
}

impl SmLink for SimSmHub {
    fn start(&self, local: &Uri, router: Arc<SmRouter>) -> Result<(), NexusError> {
        let mut g = self.lock();
        if g.routers.contains_key(local) {
            return Err(NexusError::SmBind {
                uri: local.clone(),
                why: "another simulated Nexus already has this URI".into(),
            });
        }
        g.routers.insert(local.clone(), router);
        g.tick_ns = tick_ns(&g.routers);
        self.publish_due(&g);
        Ok(())
    }

    fn send(&self, from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let now = self.clock.now_ns();
        let mut g = self.lock();
        Self::push(&mut g, now, from, to.clone(), *pkt);
        self.publish_due(&g);
    }

    fn stop(&self, local: &Uri) {
        let mut g = self.lock();
        g.routers.remove(local);
        g.tick_ns = tick_ns(&g.routers);
        self.publish_due(&g);
    }
}

//! Session management without sockets or threads: SM packets between the
//! Nexuses of one simulation travel through this hub with a delay, random
//! extra delay (which reorders them), and optional loss and duplication,
//! and are delivered when the virtual clock passes their due time
//! ([`SimSmHub::deliver_due`], called by `SimNet::advance`). The hub also
//! runs each Nexus's failure detection on the virtual clock (the job of
//! the SM thread in production), and can cut a Nexus off (a crash). A
//! tap records what reaches a URI, so a test can stand in for a peer (a
//! C++ eRPC process) or replay a packet later.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::VirtualClock;
use crate::nexus::{NexusError, SmLink, SmRouter, Uri};
use crate::rng::Rng;
use crate::sm_types::SM_PKT_BYTES;

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
}

struct Pending {
    at_ns: u64,
    seq: u64,
    to: Uri,
    pkt: [u8; SM_PKT_BYTES],
}

/// The sender of an SM packet (the client endpoint of requests, the server
/// endpoint of responses, as the SM thread routes them).
fn sender(pkt: &[u8; SM_PKT_BYTES]) -> Option<Uri> {
    let p = crate::sm_types::SmPkt::decode(pkt).ok()?;
    if p.pkt_type.is_req() {
        p.client.uri()
    } else {
        p.server.uri()
    }
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
const TAP_MAX: usize = 1 << 16;

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

    fn push(g: &mut HubInner, now_ns: u64, to: Uri, pkt: [u8; SM_PKT_BYTES]) {
        g.stats.sent += 1;
        let cfg = g.cfg;
        let from_cut = |set: &BTreeSet<Uri>| sender(&pkt).is_some_and(|u| set.contains(&u));
        if (!g.cut_off.is_empty() && (g.cut_off.contains(&to) || from_cut(&g.cut_off)))
            || (!g.muted.is_empty() && from_cut(&g.muted))
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
                to: to.clone(),
                pkt,
            }));
        }
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
            for r in g.routers.values() {
                r.tick(&mut pings);
            }
            for (to, ping) in pings.drain(..) {
                Self::push(&mut g, now_ns, to, ping);
            }
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
                    if t.len() < TAP_MAX {
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
            if let Some((to, reply)) = router.deliver(&p.pkt) {
                Self::push(&mut g, now_ns, to, reply);
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
    /// arrived on its SM port (fuzzing). Replies go through the hub.
    pub fn inject(&self, to: &Uri, bytes: &[u8]) {
        let now = self.clock.now_ns();
        let mut g = self.lock();
        let Some(router) = g.routers.get(to).cloned() else {
            g.stats.no_such_nexus += 1;
            return;
        };
        if let Some((to, reply)) = router.deliver(bytes) {
            Self::push(&mut g, now, to, reply);
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

    fn send(&self, _from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let now = self.clock.now_ns();
        let mut g = self.lock();
        Self::push(&mut g, now, to.clone(), *pkt);
        self.publish_due(&g);
    }

    fn stop(&self, local: &Uri) {
        let mut g = self.lock();
        g.routers.remove(local);
        g.tick_ns = tick_ns(&g.routers);
        self.publish_due(&g);
    }
}

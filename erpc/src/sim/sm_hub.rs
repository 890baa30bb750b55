//! Session management without sockets or threads: SM packets between the
//! Nexuses of one simulation travel through this hub with a delay and
//! optional loss, and are delivered when the virtual clock passes their
//! due time ([`SimSmHub::deliver_due`], called by `SimNet::advance`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
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
    /// Loss probability per million packets.
    pub loss_ppm: u32,
    /// Duplication probability per million packets.
    pub dup_ppm: u32,
}

impl Default for SmHubConfig {
    fn default() -> Self {
        SmHubConfig {
            delay_ns: 20_000,
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
}

struct Pending {
    at_ns: u64,
    seq: u64,
    to: Uri,
    pkt: [u8; SM_PKT_BYTES],
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

struct HubInner {
    routers: BTreeMap<Uri, Arc<SmRouter>>,
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
                q: BinaryHeap::new(),
                rng: Rng::new(seed),
                cfg,
                seq: 0,
                stats: SmHubStats::default(),
            }),
        }
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

    fn push(g: &mut HubInner, now_ns: u64, to: Uri, pkt: [u8; SM_PKT_BYTES]) {
        g.stats.sent += 1;
        let cfg = g.cfg;
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
            g.q.push(Reverse(Pending {
                at_ns: now_ns + cfg.delay_ns,
                seq,
                to: to.clone(),
                pkt,
            }));
        }
    }

    /// Delivers every packet due by `now_ns` (replies the routers produce
    /// are sent through the hub in turn). Bounded by the packets queued at
    /// entry plus the replies they cause.
    pub fn deliver_due(&self, now_ns: u64) {
        let mut g = self.lock();
        let bound = 2 * g.q.len() + 1;
        for _ in 0..bound {
            match g.q.peek() {
                Some(p) if p.0.at_ns <= now_ns => {}
                _ => break,
            }
            let Some(Reverse(p)) = g.q.pop() else { break };
            let Some(router) = g.routers.get(&p.to).cloned() else {
                g.stats.no_such_nexus += 1;
                continue;
            };
            g.stats.delivered += 1;
            if let Some((to, reply)) = router.deliver(&p.pkt) {
                Self::push(&mut g, now_ns, to, reply);
            }
        }
    }
}

impl SimSmHub {
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
        Ok(())
    }

    fn send(&self, _from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let now = self.clock.now_ns();
        let mut g = self.lock();
        Self::push(&mut g, now, to.clone(), *pkt);
    }

    fn stop(&self, local: &Uri) {
        self.lock().routers.remove(local);
    }
}

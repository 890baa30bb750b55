//! A replicated key-value store: Raft state-machine replication with
//! tikv's `raft` crate (raft-rs, used unmodified), every Raft message,
//! snapshot chunk and client request carried by eRPC.
//!
//! Why raft-rs: it is the Raft of TiKV (in production at scale, tested
//! with its own simulation and fuzzing), and it is a pure state machine —
//! no threads, timers or I/O of its own. The application ticks it, steps
//! it with received messages, and moves its `Ready` output (messages to
//! send, entries to persist, committed entries to apply) — exactly the
//! shape of an eRPC event loop, where handlers and continuations run
//! in one thread and nothing may block. (openraft, the other maintained
//! Rust Raft, is built around an async runtime and its own network
//! traits; the paper's point is running an existing library unmodified
//! on eRPC's event loop.)
//!
//! * [`replica`]: one replica (raft-rs `RawNode` + eRPC Rpc).
//! * [`client`]: the client with retries, and workloads.
//! * [`store`], [`sm`]: the log and the state machine.
//! * [`wire`]: message formats.
//! * [`Cluster`]: replicas and clients in one thread on a [`World`]
//!   (simulated network or device model), with crashes and partitions.

pub mod client;
pub mod log;
pub mod replica;
pub mod sm;
pub mod store;
pub mod wire;

use erpc::RpcConfig;

pub use client::{Client, ClientConfig, ClientState, Done, Op, Workload};
pub use replica::{PeerAddr, Replica, ReplicaConfig, ReplicaState, ReplicaStats};

use crate::env::World;

/// A cluster of replicas and clients polled round-robin in one thread.
pub struct Cluster<W: World> {
    /// Where it runs.
    pub world: W,
    /// Replica `i` has raft id `i + 1`; `None` once crashed.
    pub replicas: Vec<Option<Replica<W::T>>>,
    /// The clients.
    pub clients: Vec<Client<W::T>>,
    addrs: Vec<PeerAddr>,
    eps: Vec<usize>,
    client_eps: Vec<(usize, String)>,
    failure_timeout_ms: u64,
}

impl<W: World> std::fmt::Debug for Cluster<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("replicas", &self.replicas)
            .field("clients", &self.clients)
            .finish()
    }
}

/// eRPC settings for the cluster's Rpcs: the failure timeout both for
/// Nexus keep-alives and for connect requests.
pub fn rpc_config(failure_timeout_ms: u64) -> RpcConfig {
    RpcConfig {
        failure_timeout_ms,
        ..RpcConfig::default()
    }
}

impl<W: World> Cluster<W> {
    /// `n` replicas, configured by `cfg(id, peers)`; eRPC failure timeout
    /// `failure_timeout_ms`.
    pub fn new(
        mut world: W,
        n: usize,
        failure_timeout_ms: u64,
        cfg: impl Fn(u64, Vec<PeerAddr>) -> ReplicaConfig,
    ) -> Result<Cluster<W>, Box<dyn std::error::Error>> {
        let addrs: Vec<PeerAddr> = (1..=n as u64)
            .map(|id| PeerAddr {
                id,
                uri: world.uri(&format!("replica-{id}")),
                rpc_id: 0,
            })
            .collect();
        let mut replicas = Vec::with_capacity(n);
        let mut eps = Vec::with_capacity(n);
        for a in &addrs {
            let (t, alloc, ep) = world.endpoint();
            let nexus = Replica::<W::T>::register(world.nexus(&a.uri))
                .failure_timeout_ms(failure_timeout_ms)
                .build()?;
            let peers = addrs.iter().filter(|p| p.id != a.id).cloned().collect();
            let r = Replica::new(
                &nexus,
                0,
                t,
                alloc,
                rpc_config(failure_timeout_ms),
                cfg(a.id, peers),
            )?;
            replicas.push(Some(r));
            eps.push(ep);
        }
        Ok(Cluster {
            world,
            replicas,
            clients: Vec::new(),
            addrs,
            eps,
            client_eps: Vec::new(),
            failure_timeout_ms,
        })
    }

    /// The replicas' addresses.
    pub fn addrs(&self) -> &[PeerAddr] {
        &self.addrs
    }

    /// Adds a client configured by `cfg(replicas)`; returns its index.
    pub fn add_client(
        &mut self,
        cfg: impl FnOnce(Vec<PeerAddr>) -> ClientConfig,
        workload: Box<dyn Workload>,
    ) -> Result<usize, Box<dyn std::error::Error>> {
        let i = self.clients.len();
        let uri = self.world.uri(&format!("client-{i}"));
        let (t, alloc, ep) = self.world.endpoint();
        let nexus = self
            .world
            .nexus(&uri)
            .failure_timeout_ms(self.failure_timeout_ms)
            .build()?;
        let c = Client::new(
            &nexus,
            0,
            t,
            alloc,
            rpc_config(self.failure_timeout_ms),
            cfg(self.addrs.clone()),
            workload,
        )?;
        self.clients.push(c);
        self.client_eps.push((ep, uri));
        Ok(i)
    }

    /// Polls every replica and client once, then steps the world.
    pub fn poll(&mut self) {
        for r in self.replicas.iter_mut().flatten() {
            r.poll();
        }
        for c in &mut self.clients {
            c.poll();
        }
        self.world.step();
    }

    /// Polls until `done` holds; `Err` after `max_polls`.
    pub fn run_until(
        &mut self,
        max_polls: u64,
        what: &str,
        mut done: impl FnMut(&Cluster<W>) -> bool,
    ) -> Result<u64, String> {
        for i in 0..max_polls {
            if done(self) {
                return Ok(i);
            }
            self.poll();
        }
        Err(format!(
            "{what}: not done after {max_polls} polls (t = {} ns); {:?}",
            self.world.now_ns(),
            self
        ))
    }

    /// The index of the leader with the highest term, if any.
    pub fn leader(&self) -> Option<usize> {
        self.replicas
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().map(|r| (i, r)))
            .filter(|(_, r)| r.state.is_leader())
            .max_by_key(|(_, r)| r.state.term())
            .map(|(i, _)| i)
    }

    /// True if all clients are idle (their workloads have nothing left).
    pub fn clients_idle(&self) -> bool {
        self.clients.iter().all(|c| c.state.idle())
    }

    /// Replica `i`'s process crashes: silent at once, then dropped.
    pub fn crash(&mut self, i: usize) {
        let uri = self.addrs[i].uri.clone();
        self.world.crash(self.eps[i], &uri);
        self.replicas[i] = None;
    }

    /// Cuts replica `i` off from everyone (`cut`), or heals it.
    pub fn isolate(&mut self, i: usize, cut: bool) {
        let uri = self.addrs[i].uri.clone();
        self.world.isolate(self.eps[i], &uri, cut);
    }
}

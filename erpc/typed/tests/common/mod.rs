//! A typed server and client on eRPC's simulated network (one thread,
//! virtual time: every outcome is decided by the protocol, never by a
//! wall clock).

#![allow(dead_code)]

use std::collections::BTreeMap;

use erpc::Nexus;
use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};
use erpc_typed::{Ctx, Endpoint, EndpointConfig, Method, Reply, Service};
use serde::{Deserialize, Serialize};

pub type T = SimTransport;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Echo(pub u64, pub String);
impl Method for Echo {
    const REQ_TYPE: u8 = 1;
    type Resp = Echo;
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Put {
    pub key: u64,
    pub value: Vec<u8>,
}
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PutReply {
    pub replaced: bool,
}
impl Method for Put {
    const REQ_TYPE: u8 = 2;
    type Resp = PutReply;
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Get(pub u64);
impl Method for Get {
    const REQ_TYPE: u8 = 3;
    type Resp = Option<Vec<u8>>;
    const MAX_RESP_BYTES: usize = 16 << 10;
}

/// Answered when the test says so (deferred).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Slow(pub u64);
impl Method for Slow {
    const REQ_TYPE: u8 = 4;
    type Resp = u64;
}

/// Runs on a worker (inline: the simulation has no worker threads).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Upper(pub String);
impl Method for Upper {
    const REQ_TYPE: u8 = 5;
    type Resp = String;
}

/// The server's event-loop handler panics (the panic ends the server's
/// event loop, as a panicking dispatch handler does in the core).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Boom(pub u64);
impl Method for Boom {
    const REQ_TYPE: u8 = 6;
    type Resp = u64;
}

/// The server's background handler panics (the core catches it and
/// fails the request with `ServerError::HandlerPanicked`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct BgBoom(pub u64);
impl Method for BgBoom {
    const REQ_TYPE: u8 = 7;
    type Resp = u64;
}

/// No handler at the server.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Nobody;
impl Method for Nobody {
    const REQ_TYPE: u8 = 9;
    type Resp = ();
}

/// Echo's request type with another request shape: the server cannot
/// decode it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WrongEcho(pub Vec<u64>);
impl Method for WrongEcho {
    const REQ_TYPE: u8 = 1;
    type Resp = Echo;
}

/// Put's request type with another response shape: the client cannot
/// decode the response.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PutExpectingString {
    pub key: u64,
    pub value: Vec<u8>,
}
impl Method for PutExpectingString {
    const REQ_TYPE: u8 = 2;
    type Resp = (String, String);
}

/// The server's state.
#[derive(Default)]
pub struct Server {
    pub store: BTreeMap<u64, Vec<u8>>,
    /// Handler runs per method.
    pub echoes: u64,
    pub slows: u64,
    /// Deferred replies, held until the test answers them.
    pub held: Vec<(Reply<Slow>, u64)>,
    /// Most requests in a handler at once (deferred ones held).
    pub max_held: usize,
}

#[derive(Default)]
pub struct Client {
    pub results: Vec<String>,
}

pub fn server_service() -> Service<T, Server> {
    Service::new()
        .handle(|ctx: &mut Ctx<'_, T, Server>, e: Echo| {
            ctx.echoes += 1;
            e
        })
        .handle(|ctx, p: Put| PutReply {
            replaced: ctx.store.insert(p.key, p.value).is_some(),
        })
        .handle(|ctx, g: Get| ctx.store.get(&g.0).cloned())
        .handle_deferred(|ctx, s: Slow, reply| {
            ctx.slows += 1;
            ctx.held.push((reply, s.0));
            ctx.max_held = ctx.max_held.max(ctx.held.len());
        })
        .handle_background(|u: Upper| u.0.to_uppercase())
        .handle(|_ctx, b: Boom| -> u64 { panic!("the event-loop handler panics on {}", b.0) })
        .handle_background(|b: BgBoom| -> u64 {
            panic!("the background handler panics on {}", b.0)
        })
}

pub struct World {
    pub net: SimNet,
    pub server: Endpoint<T, Server>,
    pub client: Endpoint<T, Client>,
    /// The server's endpoint in `net` (for `net.crash`).
    pub server_ep: usize,
}

pub fn world(cfg: EndpointConfig) -> World {
    let net = SimNet::new(SimConfig::default());
    let svc = server_service();
    let sn = svc
        .register(Nexus::builder("server:31850"))
        .sm_link(net.sm_link())
        .clock(net.erpc_clock())
        .build()
        .unwrap();
    let csvc = Service::<T, Client>::new();
    let cn = csvc
        .register(Nexus::builder("client:31850"))
        .sm_link(net.sm_link())
        .clock(net.erpc_clock())
        .build()
        .unwrap();
    let st = net.add_transport();
    let server_ep = st.endpoint();
    let server = Endpoint::new(
        &sn,
        0,
        st,
        test_allocator(4 << 20),
        EndpointConfig::default(),
        &svc,
        Server::default(),
    )
    .unwrap();
    let client = Endpoint::new(
        &cn,
        0,
        net.add_transport(),
        test_allocator(4 << 20),
        cfg,
        &csvc,
        Client::default(),
    )
    .unwrap();
    World {
        net,
        server,
        client,
        server_ep,
    }
}

/// Virtual time per step.
pub const STEP_NS: u64 = 1_000;

impl World {
    /// Runs `fut` on the client, the server and the clock stepping
    /// between its iterations.
    pub fn run<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        let World {
            net,
            server,
            client,
            ..
        } = self;
        client.block_on_with(fut, || {
            server.run_once();
            net.advance(STEP_NS);
        })
    }

    /// Steps both endpoints `n` times.
    pub fn steps(&mut self, n: usize) {
        for _ in 0..n {
            self.client.run_once();
            self.server.run_once();
            self.net.advance(STEP_NS);
        }
    }

    /// Steps until `done` holds (at most `limit` steps of virtual time;
    /// panics beyond, naming `what`).
    pub fn until(&mut self, what: &str, limit: usize, mut done: impl FnMut(&mut World) -> bool) {
        for _ in 0..limit {
            if done(self) {
                return;
            }
            self.steps(1);
        }
        panic!("{what}: not within {limit} steps of virtual time");
    }

    /// Connects a session (virtual time).
    pub fn connect(&mut self) -> u16 {
        let api = self.client.client();
        self.run(async move { api.connect("server:31850", 0).await })
            .expect("connects")
    }

    /// Answers every held deferred request with its number.
    pub fn answer_held(&mut self) {
        self.server.with(|ctx| {
            for (r, v) in std::mem::take(&mut ctx.held) {
                ctx.reply(r, &v).expect("reply");
            }
        });
    }
}

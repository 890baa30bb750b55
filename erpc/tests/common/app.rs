//! A test application: request types with verifiable data, a closed-loop
//! client, nested and background handlers. Shared by the simulation, the
//! allocation test and the UDP tests.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;

use erpc::{
    BgResponse, Completion, MsgBuf, NexusBuilder, ReqHandle, Request, Rpc, SessionEvent,
    SessionEventKind, SessionNum,
};
use netsim::Rng;
use transport::Transport;

use super::{check_pattern, fill_pattern, pattern_byte};

/// Response = request with every byte XOR 0x5a (dispatch).
pub const ECHO: u8 = 1;
/// Request: key (8 B), response length (4 B), body pattern(key); response:
/// pattern(key ^ 1) of the asked length (dispatch).
pub const SIZED: u8 = 2;
/// As `SIZED`, on a worker thread.
pub const BG_SIZED: u8 = 3;
/// Forwards the request as `SIZED` to the node's downstream session and
/// responds with the downstream response (nested RPC).
pub const NESTED: u8 = 4;
/// Keeps the request handle in `ctx.deferred` and responds (like ECHO) only
/// when the test calls [`respond_deferred`].
pub const DEFER: u8 = 5;

pub const SIZED_HDR: usize = 12;

/// What a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub req_type: u8,
    pub req_len: usize,
    pub resp_len: usize,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    op: Op,
    key: u64,
    session: SessionNum,
}

/// Per-node application state.
#[derive(Default)]
pub struct Ctx {
    pub sessions: Vec<SessionNum>,
    pub events: Vec<SessionEvent>,
    pub completed: u64,
    pub failed: u64,
    pub bad_data: u64,
    pub handled: u64,
    pub in_flight: usize,
    /// Operations still to issue (closed loop: one per completion).
    pub todo: VecDeque<Op>,
    /// Downstream session for NESTED.
    pub downstream: Option<SessionNum>,
    nested: Vec<Option<ReqHandle>>,
    flights: Vec<Option<InFlight>>,
    free_tags: Vec<usize>,
    next_session: usize,
    pub key_seed: u64,
    pub errors: Vec<String>,
    /// Keep buffers for reuse instead of freeing (allocation-free loops).
    pub pool: Vec<(MsgBuf, MsgBuf)>,
    pub reuse_buffers: bool,
    /// DEFER requests waiting for `respond_deferred`, with their data.
    pub deferred: Vec<(ReqHandle, Vec<u8>)>,
    /// Error completions by message.
    pub failures: Vec<erpc::RpcError>,
}

impl Ctx {
    pub fn new(key_seed: u64) -> Ctx {
        Ctx {
            key_seed,
            ..Ctx::default()
        }
    }

    pub fn connected(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.kind == SessionEventKind::Connected)
            .count()
    }
}

pub fn sm_handler<T: Transport>(_rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, ev: SessionEvent) {
    ctx.events.push(ev);
}

/// Registers every test handler on a Nexus builder.
pub fn register<T: Transport + 'static>(b: NexusBuilder) -> NexusBuilder {
    b.handler::<T, Ctx>(ECHO, h_echo::<T>)
        .handler::<T, Ctx>(SIZED, h_sized::<T>)
        .handler::<T, Ctx>(NESTED, h_nested::<T>)
        .handler::<T, Ctx>(DEFER, h_defer::<T>)
        .bg_handler(BG_SIZED, bg_sized)
}

fn h_defer<T: Transport>(_rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    ctx.handled += 1;
    ctx.deferred.push((req.handle, req.data.to_vec()));
}

/// Responds to every deferred request (as ECHO would); returns the results.
pub fn respond_deferred<T: Transport>(
    rpc: &mut Rpc<T, Ctx>,
    ctx: &mut Ctx,
) -> Vec<Result<(), erpc::RespondError>> {
    let mut out = Vec::new();
    for (h, data) in std::mem::take(&mut ctx.deferred) {
        let mut m = rpc
            .response_buffer(&h, data.len())
            .expect("response buffer");
        for (o, i) in m.data_mut().iter_mut().zip(&data) {
            *o = i ^ 0x5a;
        }
        out.push(rpc.enqueue_response(h, m));
    }
    out
}

fn h_echo<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    ctx.handled += 1;
    let Request { handle, data, .. } = req;
    let mut m = rpc
        .response_buffer(&handle, data.len())
        .expect("response buffer");
    for (o, i) in m.data_mut().iter_mut().zip(data) {
        *o = i ^ 0x5a;
    }
    rpc.enqueue_response(handle, m).expect("respond");
}

/// Parses a SIZED request; checks its body.
fn sized_parse(data: &[u8]) -> Option<(u64, usize)> {
    if data.len() < SIZED_HDR {
        return None;
    }
    let key = u64::from_le_bytes(data[..8].try_into().ok()?);
    let resp_len = u32::from_le_bytes(data[8..12].try_into().ok()?) as usize;
    let body_ok = data[SIZED_HDR..]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern_byte(key, i));
    body_ok.then_some((key, resp_len))
}

fn h_sized<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    ctx.handled += 1;
    let Request { handle, data, .. } = req;
    let (key, resp_len) = match sized_parse(data) {
        Some(x) => x,
        None => {
            ctx.bad_data += 1;
            ctx.errors
                .push(format!("bad SIZED request of {} bytes", data.len()));
            (0, 0)
        }
    };
    let mut m = rpc
        .response_buffer(&handle, resp_len)
        .expect("response buffer");
    fill_pattern(m.data_mut(), key ^ 1);
    rpc.enqueue_response(handle, m).expect("respond");
}

fn bg_sized(data: &[u8], resp: &mut BgResponse<'_>) {
    match sized_parse(data) {
        Some((key, resp_len)) => fill_pattern(resp.buf(resp_len), key ^ 1),
        None => resp.write(b"BAD"),
    }
}

fn h_nested<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, req: Request<'_>) {
    ctx.handled += 1;
    let Request { handle, data, .. } = req;
    let down = ctx.downstream.expect("NESTED needs a downstream session");
    let mut fwd = rpc.alloc_msg_buffer(data.len()).expect("alloc");
    fwd.data_mut().copy_from_slice(data);
    let resp = rpc.alloc_msg_buffer(erpc::MAX_MSG_BYTES).expect("alloc");
    let tag = match ctx.nested.iter().position(Option::is_none) {
        Some(t) => t,
        None => {
            ctx.nested.push(None);
            ctx.nested.len() - 1
        }
    };
    ctx.nested[tag] = Some(handle);
    if let Err(e) = rpc.enqueue_request(down, SIZED, fwd, resp, nested_cont::<T>, tag) {
        panic!("nested enqueue: {e}");
    }
}

fn nested_cont<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, c: Completion) {
    let handle = ctx.nested[c.tag].take().expect("nested handle");
    // The original request is still readable until we respond.
    if rpc.request_data(&handle).is_none() {
        ctx.bad_data += 1;
        ctx.errors.push("deferred request data missing".into());
    }
    let data = c.resp.data();
    let mut m = rpc
        .response_buffer(&handle, data.len())
        .expect("response buffer");
    m.data_mut().copy_from_slice(data);
    rpc.enqueue_response(handle, m).expect("respond");
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

/// Issues the next op from `ctx.todo`, if any.
pub fn issue<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx) -> bool {
    let Some(op) = ctx.todo.pop_front() else {
        return false;
    };
    let session = ctx.sessions[ctx.next_session % ctx.sessions.len()];
    ctx.next_session += 1;
    let key = ctx.key_seed ^ (ctx.completed + ctx.in_flight as u64).wrapping_mul(0x1000_0001);
    let (mut req, resp) = match ctx.pool.pop() {
        Some((mut a, mut b)) if a.max_len() >= op.req_len && b.max_len() >= op.resp_len => {
            a.resize(op.req_len).unwrap();
            b.resize(op.resp_len).unwrap();
            (a, b)
        }
        other => {
            if let Some((a, b)) = other {
                rpc.free_msg_buffer(a);
                rpc.free_msg_buffer(b);
            }
            (
                rpc.alloc_msg_buffer(op.req_len).expect("alloc request"),
                rpc.alloc_msg_buffer(op.resp_len).expect("alloc response"),
            )
        }
    };
    match op.req_type {
        ECHO | DEFER => fill_pattern(req.data_mut(), key),
        _ => {
            assert!(op.req_len >= SIZED_HDR);
            let d = req.data_mut();
            d[..8].copy_from_slice(&key.to_le_bytes());
            d[8..12].copy_from_slice(&(op.resp_len as u32).to_le_bytes());
            fill_pattern(&mut d[SIZED_HDR..], key);
        }
    }
    let tag = match ctx.free_tags.pop() {
        Some(t) => t,
        None => {
            ctx.flights.push(None);
            ctx.flights.len() - 1
        }
    };
    ctx.flights[tag] = Some(InFlight { op, key, session });
    ctx.in_flight += 1;
    if let Err(e) = rpc.enqueue_request(session, op.req_type, req, resp, client_cont::<T>, tag) {
        panic!("enqueue_request: {e}");
    }
    true
}

pub fn client_cont<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, c: Completion) {
    let f = ctx.flights[c.tag].take().expect("tag in flight");
    ctx.free_tags.push(c.tag);
    ctx.in_flight -= 1;
    match c.result {
        Ok(()) => {
            ctx.completed += 1;
            let ok = match f.op.req_type {
                ECHO | DEFER => {
                    c.resp.len() == f.op.req_len
                        && c.resp
                            .data()
                            .iter()
                            .enumerate()
                            .all(|(i, &b)| b == pattern_byte(f.key, i) ^ 0x5a)
                }
                _ => c.resp.len() == f.op.resp_len && check_pattern(c.resp.data(), f.key ^ 1),
            };
            if !ok {
                ctx.bad_data += 1;
                ctx.errors.push(format!(
                    "bad response for {:?} on session {}: {} bytes",
                    f.op,
                    f.session,
                    c.resp.len()
                ));
            }
        }
        Err(e) => {
            ctx.failed += 1;
            ctx.failures.push(e);
            ctx.errors.push(format!("{:?} failed: {e}", f.op));
        }
    }
    if ctx.reuse_buffers {
        ctx.pool.push((c.req, c.resp));
    } else {
        rpc.free_msg_buffer(c.req);
        rpc.free_msg_buffer(c.resp);
    }
    issue(rpc, ctx);
}

/// Issues up to `window` ops now; the rest follow completions.
pub fn start<T: Transport>(rpc: &mut Rpc<T, Ctx>, ctx: &mut Ctx, window: usize) {
    for _ in 0..window {
        if !issue(rpc, ctx) {
            break;
        }
    }
}

/// Random ops: sizes drawn from `sizes`, types from `types`.
pub fn random_ops(rng: &mut Rng, n: usize, types: &[u8], sizes: &[usize]) -> VecDeque<Op> {
    (0..n)
        .map(|_| {
            let req_type = types[rng.below(types.len() as u64) as usize];
            let mut req_len = sizes[rng.below(sizes.len() as u64) as usize];
            let resp_len = sizes[rng.below(sizes.len() as u64) as usize];
            if req_type != ECHO && req_type != DEFER {
                req_len = req_len.max(SIZED_HDR);
            }
            Op {
                req_type,
                req_len,
                resp_len: if req_type == ECHO || req_type == DEFER {
                    req_len
                } else {
                    resp_len
                },
            }
        })
        .collect()
}

pub fn _unused(_: Arc<()>) {}

//! Rpcs on real threads, each both client and server: the body of the
//! multi-threaded tests over kernel UDP and over the device model.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use erpc::{Nexus, Rpc};
use mempool::Allocator;
use netsim::Rng;
use transport::Transport;

use super::app::{self, BG_SIZED, Ctx, ECHO, SIZED};

pub const OPS: usize = 1500;

/// Runs one Rpc thread: connects to `peers`, runs `OPS` requests spread
/// over them, and keeps serving until every thread is done.
pub fn rpc_thread<T: Transport + 'static>(
    nexus: Arc<Nexus>,
    rpc_id: u8,
    peers: Vec<(String, u8)>,
    ready: Arc<Barrier>,
    done: Arc<AtomicUsize>,
    threads: usize,
    make: impl FnOnce() -> Result<(T, Allocator), String>,
) -> Result<(), String> {
    let (t, alloc) = make()?;
    let mut rpc: Rpc<T, Ctx> = Rpc::builder(&nexus, t, alloc)
        .id(rpc_id)
        .session_handler(app::sm_handler::<T>)
        .build()
        .map_err(|e| e.to_string())?;
    let mut ctx = Ctx::new(0x1234 + u64::from(rpc_id));
    ready.wait();
    for (uri, id) in &peers {
        let sn = rpc.create_session(uri, *id).map_err(|e| e.to_string())?;
        ctx.sessions.push(sn);
    }
    let clock = nexus.clock().clone();
    let deadline = clock.now_ns() + 60_000_000_000;
    while !ctx.sessions.iter().all(|&s| rpc.is_connected(s)) {
        rpc.run_event_loop_once(&mut ctx);
        if clock.now_ns() > deadline {
            return Err(format!(
                "rpc {rpc_id}: sessions did not connect: {:?}",
                ctx.events
            ));
        }
    }
    let mut rng = Rng::new(u64::from(rpc_id) + 77);
    ctx.todo = app::random_ops(
        &mut rng,
        OPS,
        &[ECHO, SIZED, BG_SIZED],
        &[12, 500, 968, 969, 4000, 20_000],
    );
    app::start(&mut rpc, &mut ctx, 12);
    let mut counted = false;
    while done.load(Ordering::Acquire) < threads {
        rpc.run_event_loop_once(&mut ctx);
        if !counted && ctx.completed + ctx.failed == OPS as u64 {
            counted = true;
            done.fetch_add(1, Ordering::AcqRel);
        }
        if clock.now_ns() > deadline {
            return Err(format!(
                "rpc {rpc_id}: {} of {OPS} done after 60 s; stats {}; transport {:?}",
                ctx.completed,
                rpc.stats(),
                transport::Transport::stats(rpc.transport())
            ));
        }
    }
    // Serve a little longer so peers' last responses are not cut off.
    rpc.run_event_loop(&mut ctx, Duration::from_millis(20));
    if !ctx.errors.is_empty() || ctx.bad_data != 0 {
        return Err(format!(
            "rpc {rpc_id}: {:?}",
            &ctx.errors[..ctx.errors.len().min(5)]
        ));
    }
    for &sn in &ctx.sessions {
        rpc.destroy_session(sn).map_err(|e| e.to_string())?;
    }
    let until = clock.now_ns() + 5_000_000_000;
    while rpc.num_sessions() > 0 && clock.now_ns() < until {
        rpc.run_event_loop_once(&mut ctx);
    }
    Ok(())
}

/// One thread of the scale-out test: it owns several Rpcs (one per node,
/// e.g. Rpc i of node A and Rpc i of node B) and runs their event loops in
/// turn. Each Rpc is a client of `peers` (given per Rpc) and runs `ops`
/// requests spread over its sessions, `window` in flight, then keeps
/// serving until every thread is done. No wall-clock bound: loss recovery
/// must finish the work however slowly a loaded machine runs it.
pub struct Owned<T: Transport> {
    pub rpc: Rpc<T, Ctx>,
    pub ctx: Ctx,
    pub peers: Vec<(String, u8)>,
}

pub fn owner_thread<T: Transport + 'static>(
    mut owned: Vec<Owned<T>>,
    ops: usize,
    window: usize,
    ready: Arc<Barrier>,
    done: Arc<AtomicUsize>,
    total_rpcs: usize,
) -> Result<Vec<(u64, u64, u64)>, String> {
    ready.wait();
    for o in owned.iter_mut() {
        for (uri, id) in &o.peers {
            let sn = o.rpc.create_session(uri, *id).map_err(|e| e.to_string())?;
            o.ctx.sessions.push(sn);
        }
    }
    while !owned
        .iter()
        .all(|o| o.ctx.sessions.iter().all(|&s| o.rpc.is_connected(s)))
    {
        for o in owned.iter_mut() {
            o.rpc.run_event_loop_once(&mut o.ctx);
            if let Some(e) = o
                .ctx
                .events
                .iter()
                .find(|e| e.kind != erpc::SessionEventKind::Connected)
            {
                return Err(format!("rpc {}: session event {e:?}", o.rpc.rpc_id()));
            }
        }
    }
    for o in owned.iter_mut() {
        let mut rng = Rng::new(u64::from(o.rpc.rpc_id()) * 7919 + o.ctx.key_seed);
        o.ctx.todo = app::random_ops(&mut rng, ops, &[ECHO, SIZED], &[12, 500, 968, 969, 4000]);
        app::start(&mut o.rpc, &mut o.ctx, window);
    }
    let mut counted = vec![false; owned.len()];
    while done.load(Ordering::Acquire) < total_rpcs {
        for (o, c) in owned.iter_mut().zip(counted.iter_mut()) {
            o.rpc.run_event_loop_once(&mut o.ctx);
            if !*c && o.ctx.completed + o.ctx.failed == ops as u64 {
                *c = true;
                done.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
    // Serve until every peer's last response has surely left (a few loss
    // scan intervals of this Rpc's own clock).
    for o in owned.iter_mut() {
        o.rpc.run_event_loop(&mut o.ctx, Duration::from_millis(20));
    }
    let mut out = Vec::new();
    for o in owned.iter_mut() {
        if !o.ctx.errors.is_empty() || o.ctx.bad_data != 0 {
            return Err(format!(
                "rpc {}: {:?}",
                o.rpc.rpc_id(),
                &o.ctx.errors[..o.ctx.errors.len().min(5)]
            ));
        }
        out.push((
            o.ctx.completed,
            o.ctx.handled,
            o.rpc.stats().retransmissions,
        ));
    }
    Ok(out)
}

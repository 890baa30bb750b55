//! eRPC and its raw-echo reference over kernel UDP on loopback.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use erpc::{Nexus, Rpc, RpcConfig};
use mempool::Allocator;
use transport::Transport;
use transport::udp::{UdpConfig, UdpTransport};

use crate::capture::{Capture, CapturingSmLink, NodeAddr};
use crate::memory::{MemoryPlan, node_bytes};

use super::points::run_points;
use super::{
    BenchError, Ctx, Outcome, Point, Progress, RawEcho, Stop, new_ctx, raw_echo, register,
};

/// An identity-mapped allocator for the kernel-UDP runs (the kernel
/// copies; nothing is registered with a device).
fn udp_allocator(plan: &MemoryPlan, bytes: usize, what: &str) -> Result<Allocator, BenchError> {
    erpc_sim::sim_allocator(bytes, plan.region).map_err(|e| BenchError::setup(what.to_string(), e))
}

/// eRPC over kernel UDP on loopback, two Rpcs in one thread (the same shape
/// as the device-model run, so the two are comparable). With `capture`,
/// node 0's transport captures every datagram it sends and receives and
/// both Nexuses' SM packets are captured too (see [`crate::capture`]);
/// `inspect` exposes the Nexuses on the debug endpoint.
pub fn udp_erpc(
    plan: &MemoryPlan,
    p: Point,
    dur: Duration,
    warmup: Duration,
    progress: &Progress,
    capture: Option<&Capture>,
    inspect: bool,
) -> Result<Outcome, BenchError> {
    udp_erpc_until(
        plan,
        p,
        Stop::Time { dur, warmup },
        progress,
        capture,
        inspect,
    )
}

/// [`udp_erpc`] until `stop`.
pub fn udp_erpc_until(
    plan: &MemoryPlan,
    p: Point,
    stop: Stop,
    progress: &Progress,
    capture: Option<&Capture>,
    inspect: bool,
) -> Result<Outcome, BenchError> {
    udp_erpc_with(
        plan,
        p,
        stop,
        progress,
        capture,
        inspect,
        RpcConfig::default(),
    )
}

/// [`udp_erpc_until`] with the Rpcs' settings `cfg` (e.g. congestion
/// control switched on, which over kernel UDP needs
/// `cfg.cc.on_software_stack`).
pub fn udp_erpc_with(
    plan: &MemoryPlan,
    p: Point,
    stop: Stop,
    progress: &Progress,
    capture: Option<&Capture>,
    inspect: bool,
    cfg: RpcConfig,
) -> Result<Outcome, BenchError> {
    let uris = [loopback_uri()?, loopback_uri()?];
    let mut nodes: Vec<(Rpc<UdpTransport, Ctx>, Ctx)> = Vec::new();
    for (i, uri) in uris.iter().enumerate() {
        let mut b = Nexus::builder(uri).inspect(inspect);
        if let Some(cap) = capture {
            // Both nodes are 127.0.0.1, without a MAC on loopback (as the
            // UDP transport frames its own datagrams).
            let nodes = HashMap::from([(
                "127.0.0.1".to_string(),
                NodeAddr {
                    mac: [0; 6],
                    ipv4: Ipv4Addr::LOCALHOST,
                },
            )]);
            let link = CapturingSmLink::new(
                Arc::new(erpc::sm::UdpSmLink::new()),
                cap.clone(),
                nodes,
                unix_ns,
            );
            b = b.sm_link(Arc::new(link));
            if let Some(port) = uri.rsplit(':').next().and_then(|p| p.parse().ok()) {
                cap.note_port(port);
            }
        }
        let nexus = register::<UdpTransport>(b)
            .build()
            .map_err(|e| BenchError::setup(format!("Nexus of node {i} on {uri}"), e))?;
        let udp = UdpConfig {
            pcap: capture.filter(|_| i == 0).map(Capture::transport_file),
            ..UdpConfig::loopback()
        };
        let t = UdpTransport::new(&udp)
            .map_err(|e| BenchError::setup(format!("UDP transport of node {i}"), e))?;
        if let Some(cap) = capture {
            cap.note_port(t.local_routing_info().udp_port);
        }
        let alloc = udp_allocator(
            plan,
            node_bytes(p.size, p.window),
            &format!("message buffers of node {i}"),
        )?;
        let mut rpc = Rpc::builder(&nexus, t, alloc)
            .id(i as u8)
            .config(cfg)
            .build()
            .map_err(|e| BenchError::setup(format!("Rpc of node {i}"), e))?;
        let c = new_ctx(&mut rpc, p)?;
        nodes.push((rpc, c));
    }
    let out = run_points(&mut nodes, &uris, p, stop, progress, || {});
    // Let stragglers land before the Rpcs go away (kernel UDP on loopback
    // does not lose them; the bound only keeps a bug from hanging here).
    let t = Instant::now();
    while nodes.iter().any(|(_, c)| c.in_flight > 0) && t.elapsed() < Duration::from_secs(1) {
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
    }
    let mut out = out?;
    out.retransmissions = nodes.iter().map(|(r, _)| r.stats().retransmissions).sum();
    out.tx_flushes = nodes.iter().map(|(r, _)| r.stats().tx_flushes).sum();
    for (r, c) in nodes.iter_mut() {
        while let Some((a, b)) = c.pool.pop() {
            r.free_msg_buffer(a);
            r.free_msg_buffer(b);
        }
    }
    Ok(out)
}

/// The system clock in ns since the Unix epoch: what the UDP transport
/// stamps its capture with, so SM packets sort among its frames.
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The raw-echo reference of an eRPC point over two UDP transports on
/// loopback (see [`raw_echo`]).
pub fn udp_raw_echo(
    plan: &MemoryPlan,
    p: Point,
    stop: Stop,
    progress: &Progress,
) -> Result<RawEcho, BenchError> {
    let udp = |who| {
        UdpTransport::new(&UdpConfig::loopback())
            .map_err(|e| BenchError::setup(format!("raw echo: UDP transport {who}"), e))
    };
    let (mut a, mut b) = (udp("a")?, udp("b")?);
    let mut aa = udp_allocator(plan, 2 << 20, "raw echo: buffers")?;
    let mut ab = udp_allocator(plan, 2 << 20, "raw echo: buffers")?;
    raw_echo(
        [&mut a, &mut b],
        [&mut aa, &mut ab],
        p,
        stop,
        progress,
        || {},
    )
}

/// A URI on 127.0.0.1 with a port that was free a moment ago (the OS's
/// choice), for a Nexus's SM socket.
pub(crate) fn loopback_uri() -> Result<String, BenchError> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| format!("127.0.0.1:{}", a.port()))
        .map_err(|e| BenchError::setup("a free UDP port on 127.0.0.1", e))
}

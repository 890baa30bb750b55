//! The small-RPC benchmark behind `erpc-bench` (the paper's Figure 4 setup
//! scaled to a small machine): every node is both client and server, sends
//! 32-byte requests in batches of B with at most `window` in flight, and
//! answers the other node's requests with 32-byte responses. Each run also
//! measures a raw echo of eRPC-sized frames over the same transport, so the
//! eRPC rate is reported as a ratio against what the transport itself can
//! do in the same run.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use erpc::sim::SimNet;
use erpc::{Completion, MsgBuf, Nexus, NexusBuilder, Request, Rpc, RpcConfig};
use hdrhistogram::Histogram;
use mempool::{Allocator, AllocatorConfig, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Transport};
use transport::udp::{UdpConfig, UdpTransport};
use transport::{PKTHDR_BYTES, RxRing, Transport, TxItem};

/// Request type of the benchmark's RPC.
pub const REQ: u8 = 1;

/// One benchmark point.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    /// Requests enqueued per batch.
    pub batch: usize,
    /// Most requests in flight per node.
    pub window: usize,
    /// Request and response size.
    pub size: usize,
}

/// What a point measured.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// RPCs completed per second, all nodes together.
    pub rpcs_per_sec: f64,
    /// Latency percentiles in µs (median, p99, p99.9).
    pub lat_us: (f64, f64, f64),
}

/// Per-node application state (no allocation per request).
#[allow(missing_debug_implementations)]
pub struct Ctx {
    session: u16,
    in_flight: usize,
    completed: u64,
    pool: Vec<(MsgBuf, MsgBuf)>,
    tags: Vec<usize>,
    sent: Vec<Instant>,
    lat: Histogram<u64>,
    t0: Instant,
    size: usize,
}

fn handler<T: Transport>(rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, req: Request<'_>) {
    let mut m = rpc
        .response_buffer(&req.handle, c.size)
        .expect("response buffer");
    let n = req.data.len().min(8);
    m.data_mut()[..n].copy_from_slice(&req.data[..n]);
    rpc.enqueue_response(req.handle, m).expect("respond");
}

fn cont<T: Transport>(_rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, comp: Completion) {
    comp.result
        .expect("RPC failed (no loss recovery yet: is the link lossy?)");
    c.in_flight -= 1;
    c.completed += 1;
    let us = c.sent[comp.tag].elapsed().as_nanos() as u64;
    let _ = c.lat.record(us.max(1));
    c.tags.push(comp.tag);
    c.pool.push((comp.req, comp.resp));
}

fn issue<T: Transport>(rpc: &mut Rpc<T, Ctx>, c: &mut Ctx, p: Point) {
    if c.in_flight + p.batch > p.window {
        return;
    }
    let now = Instant::now();
    for _ in 0..p.batch {
        let (req, resp) = c.pool.pop().expect("pool holds a window of buffers");
        let tag = c.tags.pop().expect("tags");
        c.sent[tag] = now;
        c.in_flight += 1;
        rpc.enqueue_request(c.session, REQ, req, resp, cont::<T>, tag)
            .expect("enqueue");
    }
}

fn new_ctx<T: Transport + 'static>(rpc: &mut Rpc<T, Ctx>, p: Point) -> Ctx {
    let pool = (0..p.window)
        .map(|_| {
            (
                rpc.alloc_msg_buffer(p.size).unwrap(),
                rpc.alloc_msg_buffer(p.size).unwrap(),
            )
        })
        .collect();
    Ctx {
        session: 0,
        in_flight: 0,
        completed: 0,
        pool,
        tags: (0..p.window).collect(),
        sent: vec![Instant::now(); p.window],
        lat: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram"),
        t0: Instant::now(),
        size: p.size,
    }
}

fn register<T: Transport + 'static>(b: NexusBuilder) -> NexusBuilder {
    b.handler::<T, Ctx>(REQ, handler::<T>)
}

fn summarize(ctxs: &[&Ctx], elapsed: Duration) -> Outcome {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let mut done = 0;
    for c in ctxs {
        h.add(&c.lat).expect("same bounds");
        done += c.completed;
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    Outcome {
        rpcs_per_sec: done as f64 / elapsed.as_secs_f64(),
        lat_us: (q(0.5), q(0.99), q(0.999)),
    }
}

/// Device memory and buffers: hugepages when reserved, otherwise an
/// explicit (and announced) opt-in to 4 KiB pages.
pub fn region() -> RegionOptions {
    let fallback = if mempool::hugepages_available(64) {
        Fallback::Never
    } else {
        eprintln!(
            "note: fewer than 64 free 2 MiB hugepages; using 4 KiB pages (reserve with \
             `echo 256 | sudo tee /proc/sys/vm/nr_hugepages` for representative numbers)"
        );
        Fallback::SmallPages
    };
    RegionOptions {
        fallback,
        ..Default::default()
    }
}

/// Two device-model NICs on one deterministic fabric, driven by one thread.
#[allow(missing_debug_implementations)]
pub struct DeviceModel {
    fabric: Fabric,
    nics: Vec<SimNic>,
    devices: Vec<Device<SimBackend>>,
    net: SimNet,
    step: Duration,
}

/// Where the two benchmark nodes run: NICs brought up by the driver, each
/// node a queue set (and message buffers registered with its NIC).
pub trait Testbed {
    /// The hardware backend.
    type B: mlx5::hw::HwBackend;
    /// The NIC of node `i`.
    fn device(&self, i: usize) -> &Device<Self::B>;
    /// Lets time pass (the device model's clock); real NICs need nothing.
    fn step(&self) {}
    /// An SM link and clock for the Nexuses (in-memory and virtual for the
    /// deterministic device model; kernel UDP and the TSC otherwise).
    fn nexus(&self, uri: &str) -> NexusBuilder;

    /// A transport on node `i`'s NIC.
    fn transport(&self, i: usize, port: u16) -> Mlx5Transport<Self::B> {
        Mlx5Transport::new(
            self.device(i),
            Mlx5Config::new(
                Ipv4Addr::new(10, 0, 0, i as u8 + 1),
                QueueConfig {
                    udp_port: port,
                    ..Default::default()
                },
            ),
        )
        .expect("transport")
    }

    /// Message buffers registered with node `i`'s NIC.
    fn allocator(&self, i: usize) -> Allocator {
        Allocator::new(
            self.device(i).dma_mapper(),
            AllocatorConfig {
                initial_bytes: 8 << 20,
                region: region(),
                ..Default::default()
            },
        )
        .expect("allocator")
    }
}

/// A ConnectX bound to vfio-pci: both nodes are queue sets of that one
/// function, talking through the NIC's own loopback.
#[allow(missing_debug_implementations)]
pub struct Vfio {
    device: Device<mlx5::vfio::VfioBackend>,
}

impl Vfio {
    /// Opens and brings up the function at `bdf`.
    pub fn open(bdf: &str) -> Result<Vfio, String> {
        let addr: mlx5::vfio::PciAddress = bdf.parse().map_err(|e| format!("{bdf}: {e}"))?;
        let backend = mlx5::vfio::VfioBackend::open(addr).map_err(|e| e.to_string())?;
        let device = Device::open(
            backend,
            DeviceConfig {
                region: region(),
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        Ok(Vfio { device })
    }
}

impl Testbed for Vfio {
    type B = mlx5::vfio::VfioBackend;
    fn device(&self, _i: usize) -> &Device<Self::B> {
        &self.device
    }
    fn nexus(&self, uri: &str) -> NexusBuilder {
        // Session management over kernel UDP on loopback: node i on 31850 + i.
        let port = 31850 + u16::from(uri.starts_with("node1"));
        Nexus::builder(&format!("127.0.0.1:{port}"))
    }
}

impl Testbed for DeviceModel {
    type B = SimBackend;
    fn device(&self, i: usize) -> &Device<SimBackend> {
        &self.devices[i]
    }
    fn step(&self) {
        self.net.advance(self.step.as_nanos() as u64);
        self.fabric.advance(self.step);
    }
    fn nexus(&self, uri: &str) -> NexusBuilder {
        Nexus::builder(uri)
            .sm_link(self.net.sm_link())
            .clock(self.net.erpc_clock())
    }
}

impl DeviceModel {
    /// A fabric with two NICs brought up by the driver.
    pub fn new() -> DeviceModel {
        let fabric = Fabric::new(FabricConfig {
            seed: 1,
            deterministic: true,
            ..Default::default()
        });
        let region = region();
        let mut nics = Vec::new();
        let mut devices = Vec::new();
        for i in 1..=2u8 {
            let nic = SimNic::new(
                &fabric,
                NicConfig {
                    mac: [2, 0, 0, 0, 0, i],
                    ..Default::default()
                },
            );
            devices.push(
                Device::open(
                    nic.backend(),
                    DeviceConfig {
                        region,
                        ..Default::default()
                    },
                )
                .expect("bring-up"),
            );
            nics.push(nic);
        }
        DeviceModel {
            fabric,
            nics,
            devices,
            net: SimNet::new(Default::default()),
            step: Duration::from_nanos(500),
        }
    }

    /// The NICs (for their counters).
    pub fn nics(&self) -> &[SimNic] {
        &self.nics
    }
}

/// eRPC at one point on a testbed, for `dur` of wall time.
pub fn erpc_on<W: Testbed>(w: &W, p: Point, dur: Duration, warmup: Duration) -> Outcome
where
    W::B: 'static,
{
    type R<B> = Rpc<Mlx5Transport<B>, Ctx>;
    let nexuses: Vec<_> = (0..2)
        .map(|i| {
            register::<Mlx5Transport<W::B>>(w.nexus(&format!("node{i}:31850")))
                .build()
                .expect("nexus")
        })
        .collect();
    let uris: Vec<String> = nexuses.iter().map(|n| n.uri().to_string()).collect();
    let mut nodes: Vec<(R<W::B>, Ctx)> = (0..2)
        .map(|i| {
            let mut rpc = Rpc::new(
                &nexuses[i],
                i as u8,
                w.transport(i, 40_000 + i as u16),
                w.allocator(i),
                RpcConfig::default(),
                None,
            )
            .expect("rpc");
            let c = new_ctx(&mut rpc, p);
            (rpc, c)
        })
        .collect();
    for (i, (rpc, ctx)) in nodes.iter_mut().enumerate() {
        let peer = 1 - i;
        ctx.session = rpc
            .create_session(&uris[peer], peer as u8)
            .expect("session");
    }
    for _ in 0..1_000_000 {
        if nodes.iter().all(|(r, c)| r.is_connected(c.session)) {
            break;
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
        w.step();
    }
    assert!(
        nodes.iter().all(|(r, c)| r.is_connected(c.session)),
        "sessions did not connect"
    );
    let mut measuring = false;
    let start = Instant::now();
    let mut t0 = start;
    loop {
        let now = Instant::now();
        if !measuring && now - start >= warmup {
            measuring = true;
            t0 = now;
            for (_, c) in nodes.iter_mut() {
                c.completed = 0;
                c.lat.reset();
                c.t0 = now;
            }
        }
        if measuring && now - t0 >= dur {
            break;
        }
        for _ in 0..64 {
            for (r, c) in nodes.iter_mut() {
                issue(r, c, p);
                r.run_event_loop_once(c);
            }
            w.step();
        }
    }
    let elapsed = t0.elapsed();
    let out = summarize(&nodes.iter().map(|(_, c)| c).collect::<Vec<_>>(), elapsed);
    // Let requests in flight complete before the buffers go back.
    for _ in 0..100_000 {
        if nodes.iter().all(|(_, c)| c.in_flight == 0) {
            break;
        }
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
        w.step();
    }
    for (r, c) in nodes.iter_mut() {
        while let Some((a, b)) = c.pool.pop() {
            r.free_msg_buffer(a);
            r.free_msg_buffer(b);
        }
    }
    out
}

/// Raw echo of eRPC-sized packets between two transports of a testbed (no
/// eRPC): round trips per second with `window` in flight.
pub fn raw_echo_on<W: Testbed>(w: &W, size: usize, window: usize, dur: Duration) -> f64 {
    let mut a = w.transport(0, 41_000);
    let mut b = w.transport(1, 41_001);
    let (mut aa, mut ab) = (w.allocator(0), w.allocator(1));
    raw_echo(&mut a, &mut b, &mut aa, &mut ab, size, window, dur, || {
        w.step()
    })
}

impl Default for DeviceModel {
    fn default() -> Self {
        DeviceModel::new()
    }
}

/// Echoes packets of `PKTHDR_BYTES + size` bytes from `a` to `b` and back,
/// keeping `window` in flight, for `dur`; returns round trips per second.
#[allow(clippy::too_many_arguments)]
pub fn raw_echo<T: Transport>(
    a: &mut T,
    b: &mut T,
    aa: &mut Allocator,
    ab: &mut Allocator,
    size: usize,
    window: usize,
    dur: Duration,
    mut step: impl FnMut(),
) -> f64 {
    let len = PKTHDR_BYTES + size;
    let (ra, rb) = (
        a.resolve(&b.local_routing_info()).unwrap(),
        b.resolve(&a.local_routing_info()).unwrap(),
    );
    let mut ba = aa.alloc(len).unwrap();
    let mut bb = ab.alloc(len).unwrap();
    a.fill_headroom(
        &ra,
        &mut ba.as_mut_slice()[..transport::HEADROOM_BYTES],
        len,
    );
    b.fill_headroom(
        &rb,
        &mut bb.as_mut_slice()[..transport::HEADROOM_BYTES],
        len,
    );
    fn item<'a, R>(r: &'a R, buf: &'a mempool::Buffer, len: usize) -> TxItem<'a, R> {
        TxItem {
            route: r,
            pkt: &buf.as_slice()[..len],
            pkt_iova: buf.iova(),
            data: &[],
            data_iova: 0,
            lkey: buf.lkey(),
            drop: false,
        }
    }
    let mut ring_a = a.take_rx_ring().expect("the RX ring");
    let mut ring_b = b.take_rx_ring().expect("the RX ring");
    let (mut head_a, mut head_b) = (0usize, 0usize);
    let (mut in_flight, mut done) = (0usize, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        for _ in 0..64 {
            let n = (window - in_flight).min(a.tx_burst_max());
            if n > 0 {
                let items: [TxItem<'_, T::Route>; 16] =
                    std::array::from_fn(|_| item(&ra, &ba, len));
                in_flight += a.tx_burst(&items[..n.min(16)]);
            }
            step();
            let nb = b.rx_burst();
            if nb > 0 {
                for i in 0..nb {
                    std::hint::black_box(ring_b.packet((head_b + i) % ring_b.entries()));
                }
                head_b += nb;
                let mut left = nb;
                while left > 0 {
                    let k = left.min(b.tx_burst_max()).min(16);
                    let items: [TxItem<'_, T::Route>; 16] =
                        std::array::from_fn(|_| item(&rb, &bb, len));
                    left -= b.tx_burst(&items[..k]);
                }
                b.post_recvs(&mut ring_b, nb);
            }
            step();
            let na = a.rx_burst();
            for i in 0..na {
                std::hint::black_box(ring_a.packet((head_a + i) % ring_a.entries()));
            }
            head_a += na;
            a.post_recvs(&mut ring_a, na);
            in_flight -= na;
            done += na as u64;
        }
    }
    let rate = done as f64 / t0.elapsed().as_secs_f64();
    aa.free(ba);
    ab.free(bb);
    rate
}

/// eRPC over kernel UDP on loopback, two Rpcs in one thread (the same shape
/// as the device-model run, so the two are comparable).
pub fn udp_erpc(p: Point, dur: Duration, warmup: Duration) -> Outcome {
    let free_port = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("port")
            .port()
    };
    let uris: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut nodes: Vec<(Rpc<UdpTransport, Ctx>, Ctx)> = (0..2)
        .map(|i| {
            let nexus = register::<UdpTransport>(Nexus::builder(&uris[i]))
                .build()
                .expect("nexus");
            let t = UdpTransport::new(&UdpConfig::loopback()).expect("udp");
            let mut rpc = Rpc::new(
                &nexus,
                i as u8,
                t,
                erpc::sim::test_allocator(8 << 20),
                RpcConfig::default(),
                None,
            )
            .expect("rpc");
            let c = new_ctx(&mut rpc, p);
            (rpc, c)
        })
        .collect();
    for (i, (rpc, ctx)) in nodes.iter_mut().enumerate() {
        ctx.session = rpc
            .create_session(&uris[1 - i], (1 - i) as u8)
            .expect("session");
    }
    let t = Instant::now();
    while !nodes.iter().all(|(r, c)| r.is_connected(c.session)) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "UDP sessions did not connect"
        );
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
    }
    let start = Instant::now();
    let mut t0 = start;
    let mut measuring = false;
    loop {
        let now = Instant::now();
        if !measuring && now - start >= warmup {
            measuring = true;
            t0 = now;
            for (_, c) in nodes.iter_mut() {
                c.completed = 0;
                c.lat.reset();
            }
        }
        if measuring && now - t0 >= dur {
            break;
        }
        for (r, c) in nodes.iter_mut() {
            issue(r, c, p);
            r.run_event_loop_once(c);
        }
    }
    let out = summarize(
        &nodes.iter().map(|(_, c)| c).collect::<Vec<_>>(),
        t0.elapsed(),
    );
    // Let stragglers land before the Rpcs go away.
    let t = Instant::now();
    while nodes.iter().any(|(_, c)| c.in_flight > 0) && t.elapsed() < Duration::from_millis(200) {
        for (r, c) in nodes.iter_mut() {
            r.run_event_loop_once(c);
        }
    }
    out
}

/// Raw echo over two UDP transports on loopback, same shape as eRPC's run.
pub fn udp_raw_echo(size: usize, window: usize, dur: Duration) -> f64 {
    let mut a = UdpTransport::new(&UdpConfig::loopback()).expect("udp");
    let mut b = UdpTransport::new(&UdpConfig::loopback()).expect("udp");
    let (mut aa, mut ab) = (
        erpc::sim::test_allocator(2 << 20),
        erpc::sim::test_allocator(2 << 20),
    );
    raw_echo(&mut a, &mut b, &mut aa, &mut ab, size, window, dur, || {})
}

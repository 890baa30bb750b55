//! The mlx5 rows of the echo benchmark: the mlx5 transport on the device
//! model, in one process (one thread on the deterministic fabric, and two
//! threads on the threaded fabric), and across two processes in two network
//! namespaces through the AF_PACKET bridge (as root). Included by
//! `echo.rs`, whose `Client`/`measure` machinery it reuses.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{
    Args, Client, DATA_BYTES, MAX_BURST, PAYLOAD_BYTES, Row, SameThread, WINDOW, measure, netns,
    seq_of,
};
use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Ring, Mlx5Route, Mlx5Transport};
use transport::{HEADROOM_BYTES, PKTHDR_BYTES, RoutingInfo, RxRing, Transport, TxItem};

type T = Mlx5Transport<SimBackend>;

fn region() -> RegionOptions {
    RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    }
}

/// A NIC brought up on `fabric`, one transport on it, and registered memory.
struct Node {
    t: T,
    ring: Mlx5Ring,
    alloc: Allocator,
    bufs: Vec<Buffer>,
    head: usize,
    _device: Device<SimBackend>,
    _nic: SimNic,
}

impl Node {
    fn new(fabric: &Fabric, id: u8) -> Node {
        Node::with_pcap(fabric, id, None)
    }

    /// A node whose transport captures every frame to `pcap`.
    fn with_pcap(fabric: &Fabric, id: u8, pcap: Option<std::path::PathBuf>) -> Node {
        let nic = SimNic::new(
            fabric,
            NicConfig {
                mac: [2, 0xe0, 0, 0, 0, id],
                ..Default::default()
            },
        );
        let device = Device::open(
            nic.backend(),
            DeviceConfig {
                region: region(),
                ..Default::default()
            },
        )
        .expect("bring-up");
        let mut t = Mlx5Transport::new(
            &device,
            Mlx5Config {
                pcap,
                ..Mlx5Config::new(
                    Ipv4Addr::new(10, 99, 0, id),
                    QueueConfig {
                        udp_port: 7000,
                        ..Default::default()
                    },
                )
            },
        )
        .expect("transport");
        let mut alloc = Allocator::new(
            device.dma_mapper(),
            AllocatorConfig {
                initial_bytes: 2 << 20,
                region: region(),
                ..Default::default()
            },
        )
        .expect("allocator");
        let bufs = (0..MAX_BURST.max(WINDOW))
            .map(|_| alloc.alloc(PKTHDR_BYTES + DATA_BYTES).unwrap())
            .collect();
        Node {
            ring: t.take_rx_ring().expect("the RX ring"),
            t,
            alloc,
            bufs,
            head: 0,
            _device: device,
            _nic: nic,
        }
    }

    fn routing(&self) -> RoutingInfo {
        self.t.local_routing_info()
    }

    fn items<'a>(
        route: &'a Mlx5Route,
        bufs: &'a [Buffer],
        n: usize,
    ) -> [TxItem<'a, Mlx5Route>; MAX_BURST] {
        std::array::from_fn(|k| {
            let b = &bufs[k.min(n.max(1) - 1)];
            TxItem::contiguous(
                route,
                &b.as_slice()[..PKTHDR_BYTES + DATA_BYTES],
                b.iova(),
                b.lkey(),
            )
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for b in self.bufs.drain(..) {
            self.alloc.free(b);
        }
    }
}

/// Echo server: copies each request into a registered buffer and sends it back.
struct Mlx5Echo {
    n: Node,
    route: Option<Mlx5Route>,
}

impl Mlx5Echo {
    fn step(&mut self) -> usize {
        let got = self.n.t.rx_burst();
        let route = self.route.as_ref().expect("connected");
        let mut done = 0;
        while done < got {
            let m = (got - done).min(MAX_BURST);
            for k in 0..m {
                let p = self
                    .n
                    .ring
                    .packet((self.n.head + done + k) % self.n.ring.entries())
                    .expect("valid request");
                let b = self.n.bufs[k].as_mut_slice();
                b[HEADROOM_BYTES..HEADROOM_BYTES + p.len()].copy_from_slice(p);
                self.n
                    .t
                    .fill_headroom(route, &mut b[..HEADROOM_BYTES], HEADROOM_BYTES + p.len());
            }
            let items = Node::items(route, &self.n.bufs, m);
            let mut sent = 0;
            while sent < m {
                sent += self.n.t.tx_burst(&items[sent..m]);
            }
            done += m;
        }
        self.n.head += got;
        self.n.t.post_recvs(&mut self.n.ring, got);
        got
    }
}

struct Mlx5Client {
    n: Node,
    route: Mlx5Route,
}

impl Mlx5Client {
    fn new(n: Node, server: &RoutingInfo) -> Mlx5Client {
        let route = n.t.resolve(server).expect("route");
        let mut c = Mlx5Client { n, route };
        for b in c.n.bufs.iter_mut() {
            let s = b.as_mut_slice();
            s[HEADROOM_BYTES..PKTHDR_BYTES + DATA_BYTES].fill(0xab);
        }
        let route = c.route;
        for b in c.n.bufs.iter_mut() {
            c.n.t.fill_headroom(
                &route,
                &mut b.as_mut_slice()[..HEADROOM_BYTES],
                PKTHDR_BYTES + DATA_BYTES,
            );
        }
        c
    }
}

impl Client for Mlx5Client {
    fn send_seq(&mut self, seq: u64) {
        self.n.bufs[0].as_mut_slice()[HEADROOM_BYTES..HEADROOM_BYTES + 8]
            .copy_from_slice(&seq.to_le_bytes());
        let items = Node::items(&self.route, &self.n.bufs, 1);
        while self.n.t.tx_burst(&items[..1]) == 0 {}
    }
    fn send_burst(&mut self, n: usize) -> usize {
        let n = n.min(MAX_BURST);
        let items = Node::items(&self.route, &self.n.bufs, n);
        self.n.t.tx_burst(&items[..n])
    }
    fn poll(&mut self, f: &mut dyn FnMut(u64)) -> usize {
        let got = self.n.t.rx_burst();
        for k in 0..got {
            let p = self
                .n
                .ring
                .packet((self.n.head + k) % self.n.ring.entries());
            let p = p.expect("valid echo");
            assert_eq!(p.len(), PAYLOAD_BYTES);
            f(seq_of(p));
        }
        self.n.head += got;
        self.n.t.post_recvs(&mut self.n.ring, got);
        got
    }
}

/// One thread, deterministic fabric: client, server and the fabric's clock
/// stepped in turn.
pub(crate) fn mlx5_one_thread(a: &Args) -> Row {
    mlx5_one_thread_with(a, false)
}

/// The one-thread echo with both transports capturing every frame to a
/// pcap file (in the temp directory, removed afterwards).
pub(crate) fn mlx5_one_thread_pcap(a: &Args) -> Row {
    mlx5_one_thread_with(a, true)
}

fn mlx5_one_thread_with(a: &Args, pcap: bool) -> Row {
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: true,
        ..Default::default()
    });
    let files = pcap.then(|| crate::PcapFiles::new("mlx5"));
    let path = |i: usize| files.as_ref().map(|f| f.0[i].clone());
    let mut s = Mlx5Echo {
        n: Node::with_pcap(&fabric, 2, path(0)),
        route: None,
    };
    let c = Mlx5Client::new(Node::with_pcap(&fabric, 1, path(1)), &s.n.routing());
    s.route = Some(s.n.t.resolve(&c.n.routing()).unwrap());
    let f2 = fabric.clone();
    let mut both = SameThread {
        client: c,
        server: move || {
            f2.advance(Duration::from_nanos(200));
            s.step();
            f2.advance(Duration::from_nanos(200));
        },
    };
    let name = if pcap {
        "Mlx5Transport on the device model, pcap on"
    } else {
        "Mlx5Transport on the device model"
    };
    measure(a, name, &mut both)
}

/// Two threads, threaded fabric.
pub(crate) fn mlx5_two_threads(a: &Args) -> Row {
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: false,
        ..Default::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<RoutingInfo>();
    let (ctx_, crx) = mpsc::channel::<RoutingInfo>();
    let server = {
        let (stop, fabric) = (stop.clone(), fabric.clone());
        thread::spawn(move || {
            let mut s = Mlx5Echo {
                n: Node::new(&fabric, 2),
                route: None,
            };
            tx.send(s.n.routing()).unwrap();
            let client = crx.recv().unwrap();
            s.route = Some(s.n.t.resolve(&client).unwrap());
            while !stop.load(Ordering::Relaxed) {
                s.step();
            }
        })
    };
    let server_info = rx.recv().unwrap();
    let mut c = Mlx5Client::new(Node::new(&fabric, 1), &server_info);
    ctx_.send(c.n.routing()).unwrap();
    let row = measure(a, "Mlx5Transport, busy-poll", &mut c);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    row
}

/// Fixed addresses of the bridge run (inside private namespaces).
const BRIDGE_SERVER_MAC: [u8; 6] = [2, 0xe0, 0, 0, 0, 2];
const BRIDGE_SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// The echo server process of the bridge run (this binary, re-executed in
/// the server's namespace with `--bridge-server DEV`).
pub(crate) fn bridge_server(dev: &str) {
    let fabric = Fabric::new(FabricConfig {
        seed: 2,
        deterministic: false,
        ..Default::default()
    });
    let mut s = Mlx5Echo {
        n: Node::new(&fabric, 2),
        route: None,
    };
    let _bridge = fabric.add_bridge(dev).expect("bridge");
    let client = RoutingInfo {
        mac: [2, 0xe0, 0, 0, 0, 1],
        ipv4: Ipv4Addr::new(10, 99, 0, 1),
        udp_port: 7000,
        rxq_id: 0,
        rss_table_size: 0,
    };
    s.route = Some(s.n.t.resolve(&client).unwrap());
    println!("BRIDGE SERVER READY");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(120) {
        s.step();
    }
}

/// The client process of the bridge run.
pub(crate) fn bridge_client(dev: &str, a: &Args) -> Row {
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: false,
        ..Default::default()
    });
    let server = RoutingInfo {
        mac: BRIDGE_SERVER_MAC,
        ipv4: BRIDGE_SERVER_IP,
        udp_port: 7000,
        rxq_id: 0,
        rss_table_size: 0,
    };
    let mut c = Mlx5Client::new(Node::new(&fabric, 1), &server);
    let _bridge = fabric.add_bridge(dev).expect("bridge");
    measure(a, "Mlx5Transport, 2 processes via the bridge", &mut c)
}

/// Runs the bridge row: namespaces, the server re-executed in one, the
/// client re-executed in the other, which prints its row as one line.
pub(crate) fn mlx5_bridge(a: &Args) -> Option<Row> {
    if netns::effective_uid() != Some(0) {
        eprintln!("note: the bridge row needs root (network namespaces); skipped");
        return None;
    }
    netns::sweep_stale();
    let net = match netns::Netns::create("") {
        Ok(n) => n,
        Err(e) => {
            eprintln!("note: cannot create namespaces ({e}); bridge row skipped");
            return None;
        }
    };
    let exe = std::env::current_exe().expect("exe");
    let run = |ns: &str, args: &[&str]| {
        std::process::Command::new(netns::tool("ip"))
            .args(["netns", "exec", ns])
            .arg(&exe)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn")
    };
    let mut server = run(&net.server_ns, &["--bridge-server", &net.server_dev]);
    let mut lines = std::io::BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while !line.contains("BRIDGE SERVER READY") {
        line.clear();
        if lines.read_line(&mut line).unwrap_or(0) == 0 {
            eprintln!("bridge server did not start");
            let _ = server.kill();
            let _ = server.wait();
            return None;
        }
    }
    let secs = a.secs.to_string();
    let samples = a.samples.to_string();
    let client = run(
        &net.client_ns,
        &[
            "--bridge-client",
            &net.client_dev,
            "--secs",
            &secs,
            "--samples",
            &samples,
        ],
    );
    let out = client.wait_with_output().expect("client");
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let row_line = text.lines().find(|l| l.starts_with("ROW "))?;
    let v: Vec<f64> = row_line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    Some(Row {
        name: "Mlx5Transport, 2 processes via the bridge",
        rtt_ns: [v[0] as u64, v[1] as u64, v[2] as u64],
        rate_w1: v[3],
        rate_w32: v[4],
        lost: v[5] as u64,
    })
}

//! Packet echo over loopback: the UDP transport against plain kernel UDP
//! (`std::net::UdpSocket`, one packet per syscall), measured in the same
//! run.
//!
//! A client sends 46-byte UDP payloads (a 14-byte eRPC header + 32 bytes
//! of data, the paper's small RPC) to an echo server and measures:
//!
//! * RTT, one packet at a time (median, p99, p99.9, from an HDR histogram),
//!   and the round-trip rate that gives (window 1);
//! * the echo rate with up to 32 packets in flight (window 32).
//!
//! Paths:
//!
//! * `UdpTransport`: `sendmmsg`/`recvmmsg` bursts into the RX ring; the
//!   server echoes zero-copy from its RX ring.
//! * `std UdpSocket`: non-blocking `send_to`/`recv_from`, one packet per
//!   syscall, spinning on EAGAIN (the same polling model), and, in the
//!   two-thread setup, also blocking `recv_from` (the usual way).
//!
//! Two setups:
//!
//! * **two threads**: client and server each busy-poll on their own thread
//!   (wake-up and cross-core latency included). On a VM whose 2 vCPUs are
//!   shared, another runnable process preempts a poller for whole
//!   scheduler ticks, which shows up as multi-millisecond tails.
//! * **one thread**: the client and the server are polled in turn by one
//!   thread, so the result is the CPU cost of a round trip through the
//!   kernel, insensitive to how many cores are free: the fair comparison of
//!   kernel overheads.
//!
//! Run: `cargo bench -p transport --bench echo [-- --secs S --samples N]`;
//! `-- --udp-one-thread` measures only the one-thread UDP rows.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use transport::udp::{UdpConfig, UdpRing, UdpRoute, UdpTransport};
use transport::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, PKTHDR_BYTES, RoutingInfo, RxRing, Transport, TxItem,
};

const DATA_BYTES: usize = 32;
const PAYLOAD_BYTES: usize = ERPC_HDR_BYTES + DATA_BYTES;
const WINDOW: usize = 32;
/// Largest echo burst the server builds.
const MAX_BURST: usize = 16;
/// The UDP transports' `tx_burst_max`: the whole window in one `sendmmsg`
/// (the plain socket sends one datagram per syscall).
const UDP_BURST: usize = WINDOW;

/// The UDP transports' settings: loopback, a window per `sendmmsg`.
fn udp_config() -> UdpConfig {
    UdpConfig {
        tx_burst_max: UDP_BURST,
        ..UdpConfig::loopback()
    }
}
/// An echo missing this long counts as lost (its window slot is reused).
const LOSS_TIMEOUT: Duration = Duration::from_millis(200);

struct Args {
    secs: f64,
    samples: usize,
    /// `--udp-one-thread`: only the one-thread UDP table (for profiling).
    udp_one_thread: bool,
}

fn args() -> Args {
    let mut a = Args {
        secs: 1.0,
        samples: 20_000,
        udp_one_thread: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--secs" => a.secs = it.next().and_then(|v| v.parse().ok()).expect("--secs S"),
            "--samples" => a.samples = it.next().and_then(|v| v.parse().ok()).expect("--samples N"),
            "--udp-one-thread" => a.udp_one_thread = true,
            _ => {} // `cargo bench` passes --bench; filters are not supported
        }
    }
    a
}

/// One path's results.
struct Row {
    name: &'static str,
    /// RTT median, p99, p99.9 in ns.
    rtt_ns: [u64; 3],
    rate_w1: f64,
    rate_w32: f64,
    lost: u64,
}

fn seq_of(p: &[u8]) -> u64 {
    u64::from_le_bytes(p[..8].try_into().unwrap())
}

/// The UDP transport echo server: sends every packet back zero-copy (the
/// reply's data is the request in the RX ring).
struct TransportEcho {
    t: UdpTransport,
    ring: UdpRing,
    route: Option<UdpRoute>,
    hdrs: Vec<[u8; PKTHDR_BYTES]>,
    head: usize,
}

impl TransportEcho {
    fn new() -> TransportEcho {
        TransportEcho::with_config(&udp_config())
    }

    fn with_config(config: &UdpConfig) -> TransportEcho {
        let mut t = UdpTransport::new(config).expect("bind server");
        let ring = t.take_rx_ring().expect("the RX ring");
        TransportEcho {
            hdrs: vec![[0u8; PKTHDR_BYTES]; ring.entries()],
            t,
            ring,
            route: None,
            head: 0,
        }
    }

    fn connect(&mut self, client: &RoutingInfo) {
        self.route = Some(self.t.resolve(client).unwrap());
    }

    /// One `rx_burst`, and the echo of what it brought.
    fn step(&mut self) -> usize {
        let n = self.t.rx_burst();
        if n == 0 {
            return 0;
        }
        let (ring, entries) = (&self.ring, self.ring.entries());
        for k in 0..n {
            let i = (self.head + k) % entries;
            let p = ring.packet(i).expect("valid request");
            self.hdrs[i][HEADROOM_BYTES..].copy_from_slice(&p[..ERPC_HDR_BYTES]);
        }
        let (hdrs, route) = (&self.hdrs, self.route.as_ref().unwrap());
        let mut sent = 0;
        while sent < n {
            // A burst on the stack: no allocation on the echo path.
            let m = (n - sent).min(UDP_BURST).min(self.t.tx_burst_max());
            let burst: [TxItem<'_, UdpRoute>; UDP_BURST] = std::array::from_fn(|k| {
                let i = (self.head + sent + k.min(m - 1)) % entries;
                TxItem::unregistered(route, &hdrs[i], &ring.packet(i).unwrap()[ERPC_HDR_BYTES..])
            });
            sent += self.t.tx_burst(&burst[..m]);
        }
        self.t.post_recvs(&mut self.ring, n);
        self.head += n;
        n
    }
}

/// The UDP transport client.
struct TransportClient {
    t: UdpTransport,
    ring: UdpRing,
    route: UdpRoute,
    head: usize,
    pkts: Vec<Vec<u8>>,
}

impl TransportClient {
    fn new(server: impl FnOnce(RoutingInfo) -> RoutingInfo) -> TransportClient {
        TransportClient::with_config(&udp_config(), server)
    }

    fn with_config(
        config: &UdpConfig,
        server: impl FnOnce(RoutingInfo) -> RoutingInfo,
    ) -> TransportClient {
        let mut t = UdpTransport::new(config).expect("bind client");
        let route = t.resolve(&server(t.local_routing_info())).unwrap();
        TransportClient {
            ring: t.take_rx_ring().expect("the RX ring"),
            pkts: vec![vec![0xab; PKTHDR_BYTES + DATA_BYTES]; t.tx_burst_max()],
            t,
            route,
            head: 0,
        }
    }

    fn send_seq(&mut self, seq: u64) {
        self.pkts[0][HEADROOM_BYTES..HEADROOM_BYTES + 8].copy_from_slice(&seq.to_le_bytes());
        while self
            .t
            .tx_burst(&[TxItem::unregistered(&self.route, &self.pkts[0], &[])])
            == 0
        {}
    }

    /// Sends up to `n` packets as one burst; returns how many went.
    fn send_burst(&mut self, n: usize) -> usize {
        let n = n.min(self.pkts.len());
        let burst: [TxItem<'_, UdpRoute>; UDP_BURST] = std::array::from_fn(|k| {
            TxItem::unregistered(&self.route, &self.pkts[k.min(n - 1)], &[])
        });
        self.t.tx_burst(&burst[..n])
    }

    /// One `rx_burst`: checks each echo, hands its sequence number to `f`,
    /// gives the slots back.
    fn poll(&mut self, mut f: impl FnMut(u64)) -> usize {
        let n = self.t.rx_burst();
        for k in 0..n {
            let p = self.ring.packet((self.head + k) % self.ring.entries());
            let p = p.expect("valid echo");
            assert_eq!(p.len(), PAYLOAD_BYTES);
            f(seq_of(p));
        }
        self.t.post_recvs(&mut self.ring, n);
        self.head += n;
        n
    }
}

/// What a client must offer to be measured.
trait Client {
    fn send_seq(&mut self, seq: u64);
    fn send_burst(&mut self, n: usize) -> usize;
    fn poll(&mut self, f: &mut dyn FnMut(u64)) -> usize;
    /// Called while waiting: polls the server when it shares the thread.
    fn idle(&mut self) {}
}

/// Measures RTT (window 1) and the window-32 rate.
fn measure(a: &Args, name: &'static str, c: &mut dyn Client) -> Row {
    let mut rtt = Histogram::<u64>::new(3).unwrap();
    let mut lost = 0;
    let start = Instant::now();
    for seq in 1..=a.samples as u64 {
        let t0 = Instant::now();
        c.send_seq(seq);
        let mut back = false;
        while !back {
            c.idle();
            c.poll(&mut |s| back |= s == seq);
            if !back && t0.elapsed() > LOSS_TIMEOUT {
                lost += 1;
                break;
            }
        }
        if back {
            rtt.record(t0.elapsed().as_nanos() as u64).unwrap();
        }
    }
    let rate_w1 = rtt.len() as f64 / start.elapsed().as_secs_f64();

    let dur = Duration::from_secs_f64(a.secs);
    let mut inflight = 0usize;
    let mut echoed = 0u64;
    let mut last_echo = Instant::now();
    let start = Instant::now();
    while start.elapsed() < dur {
        if inflight < WINDOW {
            inflight += c.send_burst(WINDOW - inflight);
        }
        c.idle();
        let n = c.poll(&mut |_| {});
        if n > 0 {
            inflight = inflight.saturating_sub(n);
            echoed += n as u64;
            last_echo = Instant::now();
        } else if last_echo.elapsed() > LOSS_TIMEOUT {
            lost += inflight as u64;
            inflight = 0;
            last_echo = Instant::now();
        }
    }
    Row {
        name,
        rtt_ns: [
            rtt.value_at_quantile(0.5),
            rtt.value_at_quantile(0.99),
            rtt.value_at_quantile(0.999),
        ],
        rate_w1,
        rate_w32: echoed as f64 / start.elapsed().as_secs_f64(),
        lost,
    }
}

impl Client for TransportClient {
    fn send_seq(&mut self, seq: u64) {
        TransportClient::send_seq(self, seq)
    }
    fn send_burst(&mut self, n: usize) -> usize {
        TransportClient::send_burst(self, n)
    }
    fn poll(&mut self, f: &mut dyn FnMut(u64)) -> usize {
        TransportClient::poll(self, f)
    }
}

/// Client and server polled in turn by one thread.
struct SameThread<C, S: FnMut()> {
    client: C,
    server: S,
}

impl<C: Client, S: FnMut()> Client for SameThread<C, S> {
    fn send_seq(&mut self, seq: u64) {
        self.client.send_seq(seq)
    }
    fn send_burst(&mut self, n: usize) -> usize {
        self.client.send_burst(n)
    }
    fn poll(&mut self, f: &mut dyn FnMut(u64)) -> usize {
        self.client.poll(f)
    }
    fn idle(&mut self) {
        (self.server)()
    }
}

fn transport_two_threads(a: &Args) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (peer_tx, peer_rx) = mpsc::channel::<RoutingInfo>();
    let server = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut s = TransportEcho::new();
            ready_tx.send(s.t.local_routing_info()).unwrap();
            s.connect(&peer_rx.recv().unwrap());
            while !stop.load(Ordering::Relaxed) {
                s.step();
            }
        })
    };
    let mut c = TransportClient::new(|me| {
        peer_tx.send(me).unwrap();
        ready_rx.recv().unwrap()
    });
    let row = measure(a, "UdpTransport, busy-poll", &mut c);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    row
}

fn transport_one_thread(a: &Args) -> Row {
    transport_one_thread_with(a, None)
}

/// Two pcap files in the temp directory, removed on drop.
struct PcapFiles([std::path::PathBuf; 2]);

impl PcapFiles {
    fn new(what: &str) -> PcapFiles {
        let p = |side: &str| {
            std::env::temp_dir().join(format!(
                "erpc-echo-bench-{}-{what}-{side}.pcap",
                std::process::id()
            ))
        };
        PcapFiles([p("server"), p("client")])
    }
}

impl Drop for PcapFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The one-thread echo with both transports capturing every datagram.
fn transport_one_thread_pcap(a: &Args) -> Row {
    let files = PcapFiles::new("udp");
    transport_one_thread_with(a, Some(&files))
}

fn transport_one_thread_with(a: &Args, pcap: Option<&PcapFiles>) -> Row {
    let config = |i: usize| UdpConfig {
        pcap: pcap.map(|f| f.0[i].clone()),
        ..udp_config()
    };
    let mut s = TransportEcho::with_config(&config(0));
    let server_info = s.t.local_routing_info();
    let client = TransportClient::with_config(&config(1), |me| {
        s.connect(&me);
        server_info
    });
    let mut both = SameThread {
        client,
        server: || {
            s.step();
        },
    };
    let name = if pcap.is_some() {
        "UdpTransport, pcap on"
    } else {
        "UdpTransport"
    };
    measure(a, name, &mut both)
}

/// A `std::net::UdpSocket` client, one packet per syscall.
struct StdClient {
    sock: UdpSocket,
    server: SocketAddr,
    msg: [u8; PAYLOAD_BYTES],
    buf: [u8; 2048],
}

impl StdClient {
    fn new(server: SocketAddr, blocking: bool) -> StdClient {
        let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        if blocking {
            sock.set_read_timeout(Some(LOSS_TIMEOUT)).unwrap();
        } else {
            sock.set_nonblocking(true).unwrap();
        }
        StdClient {
            sock,
            server,
            msg: [0xab; PAYLOAD_BYTES],
            buf: [0; 2048],
        }
    }
}

impl Client for StdClient {
    fn send_seq(&mut self, seq: u64) {
        self.msg[..8].copy_from_slice(&seq.to_le_bytes());
        self.sock.send_to(&self.msg, self.server).unwrap();
    }
    fn send_burst(&mut self, n: usize) -> usize {
        let mut sent = 0;
        while sent < n && self.sock.send_to(&self.msg, self.server).is_ok() {
            sent += 1;
        }
        sent
    }
    /// One receive (blocking: waits up to LOSS_TIMEOUT).
    fn poll(&mut self, f: &mut dyn FnMut(u64)) -> usize {
        match self.sock.recv_from(&mut self.buf) {
            Ok((n, _)) => {
                assert_eq!(n, PAYLOAD_BYTES);
                f(seq_of(&self.buf));
                1
            }
            Err(_) => 0,
        }
    }
}

/// One non-blocking receive and, if it got something, the echo.
fn std_echo_step(sock: &UdpSocket, buf: &mut [u8]) -> bool {
    match sock.recv_from(buf) {
        Ok((n, from)) => {
            let _ = sock.send_to(&buf[..n], from);
            true
        }
        Err(_) => false,
    }
}

fn std_two_threads(a: &Args, blocking: bool) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let ssock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let server_addr = ssock.local_addr().unwrap();
    let server = {
        let stop = stop.clone();
        thread::spawn(move || {
            if blocking {
                ssock
                    .set_read_timeout(Some(Duration::from_millis(50)))
                    .unwrap();
            } else {
                ssock.set_nonblocking(true).unwrap();
            }
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                std_echo_step(&ssock, &mut buf);
            }
        })
    };
    let mut c = StdClient::new(server_addr, blocking);
    let name = if blocking {
        "std UdpSocket, blocking"
    } else {
        "std UdpSocket, busy-poll"
    };
    let row = measure(a, name, &mut c);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    row
}

fn std_one_thread(a: &Args) -> Row {
    let ssock = UdpSocket::bind("127.0.0.1:0").unwrap();
    ssock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    let client = StdClient::new(ssock.local_addr().unwrap(), false);
    let mut both = SameThread {
        client,
        // Drain what is there, as the transport's server does per burst.
        server: || while std_echo_step(&ssock, &mut buf) {},
    };
    measure(a, "std UdpSocket", &mut both)
}

/// Cost of one poll that finds nothing (what a busy event loop mostly
/// does): `rx_burst` against a non-blocking `recv_from`, in ns per call.
fn empty_poll_ns() -> (f64, f64) {
    const CALLS: u32 = 200_000;
    let mut t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let start = Instant::now();
    for _ in 0..CALLS {
        assert_eq!(t.rx_burst(), 0);
    }
    let transport = start.elapsed().as_nanos() as f64 / f64::from(CALLS);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    let start = Instant::now();
    for _ in 0..CALLS {
        assert!(sock.recv_from(&mut buf).is_err());
    }
    let std = start.elapsed().as_nanos() as f64 / f64::from(CALLS);
    (transport, std)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn table(title: &str, rows: &[Row]) {
    println!("\n{title}\n");
    println!(
        "| path | RTT median (µs) | RTT p99 (µs) | RTT p99.9 (µs) | echo rate, window 1 (k/s) | \
         echo rate, window 32 (k/s) | lost |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {} |",
            r.name,
            us(r.rtt_ns[0]),
            us(r.rtt_ns[1]),
            us(r.rtt_ns[2]),
            r.rate_w1 / 1e3,
            r.rate_w32 / 1e3,
            r.lost
        );
    }
    let med = |r: &Row| r.rtt_ns[0] as f64;
    for reference in &rows[1..] {
        println!(
            "\n{} / {}: RTT median x{:.2}, window-32 rate x{:.2}",
            rows[0].name,
            reference.name,
            med(&rows[0]) / med(reference),
            rows[0].rate_w32 / reference.rate_w32
        );
    }
}

mod mlx5;
use mlx5::{
    bridge_client, bridge_server, mlx5_bridge, mlx5_one_thread, mlx5_one_thread_pcap,
    mlx5_two_threads,
};

#[path = "../../tests/common/netns.rs"]
#[allow(unused_imports)]
mod netns;

fn main() {
    let a = args();
    let argv: Vec<String> = std::env::args().collect();
    if let Some(i) = argv.iter().position(|x| x == "--bridge-server") {
        return bridge_server(&argv[i + 1]);
    }
    if let Some(i) = argv.iter().position(|x| x == "--bridge-client") {
        let r = bridge_client(&argv[i + 1], &a);
        println!(
            "ROW {} {} {} {} {} {}",
            r.rtt_ns[0], r.rtt_ns[1], r.rtt_ns[2], r.rate_w1, r.rate_w32, r.lost
        );
        return;
    }
    if a.udp_one_thread {
        let one = [transport_one_thread(&a), std_one_thread(&a)];
        table("One thread (client and server polled in turn):", &one);
        return;
    }
    let (poll_transport, poll_std) = empty_poll_ns();
    let one = [
        transport_one_thread(&a),
        transport_one_thread_pcap(&a),
        std_one_thread(&a),
    ];
    let two = [
        transport_two_threads(&a),
        std_two_threads(&a, false),
        std_two_threads(&a, true),
    ];
    println!(
        "\nEcho of {PAYLOAD_BYTES} B payloads (UDP over loopback; mlx5 on the device model); RTT over {} round trips one at a \
         time, window-32 rate over {:.1} s; load average before: {}",
        a.samples,
        a.secs,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    table("One thread (client and server polled in turn):", &one);
    table("Two threads (client and server each busy-polling):", &two);
    let mut mlx5 = vec![
        mlx5_one_thread(&a),
        mlx5_one_thread_pcap(&a),
        mlx5_two_threads(&a),
    ];
    mlx5.extend(mlx5_bridge(&a));
    mlx5.push(std_one_thread(&a));
    table(
        "mlx5 transport on the device model (the last row is the kernel UDP reference, one thread):",
        &mlx5,
    );
    println!(
        "\nEmpty poll (nothing pending): UdpTransport rx_burst {poll_transport:.0} ns, \
         std recv_from {poll_std:.0} ns"
    );
}

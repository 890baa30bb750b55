//! The mlx5 transport on the device model across a real kernel link: two
//! processes in two network namespaces joined by a veth pair, each with its
//! own software ConnectX on a fabric bridged (AF_PACKET) onto its veth end.
//! The client sends numbered packets of many sizes through a window, the
//! server echoes them, and the client checks every byte; both check that
//! the bridges ignored the kernel's own chatter instead of passing it on.
//!
//! A second test puts the kernel UDP transport on one end instead: the
//! device-model client reaches it with nothing but the routing info it
//! advertises (the veth's real MAC, its address and port), as a C++ raw or
//! DPDK peer would.
//!
//! Needs root and iproute2 (reported as ignored with the reason otherwise,
//! a libtest-mimic harness; in CI it fails instead).

mod common;

fn main() -> std::process::ExitCode {
    use common::netns::{peer_trial, prerequisites, trial};
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        trial(
            "mlx5_over_the_bridge_between_two_namespaces",
            mlx5_over_the_bridge_between_two_namespaces,
            prerequisites(),
        ),
        trial(
            "mlx5_client_reaches_the_udp_transport_by_its_advertised_routing_info",
            mlx5_client_reaches_the_udp_transport_by_its_advertised_routing_info,
            prerequisites(),
        ),
        peer_trial("bridge_peer", bridge_peer),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::netns::{ROLE_ENV, SERVER, field, ip, setup};
use mempool::{Allocator, AllocatorConfig, Buffer, Fallback, RegionOptions};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Transport};
use transport::udp::{UdpConfig, UdpTransport};
use transport::{HEADROOM_BYTES, PKTHDR_BYTES, RoutingInfo, RxRing, Transport, TxItem};

const DEV_ENV: &str = "ERPC_BRIDGE_DEV";
/// The server's routing info (hex), for a client that talks to the UDP
/// transport.
const SERVER_INFO_ENV: &str = "ERPC_BRIDGE_SERVER_INFO";
const SERVER_MAC: [u8; 6] = [0x02, 0xb0, 0, 0, 0, 2];
const CLIENT_MAC: [u8; 6] = [0x02, 0xb0, 0, 0, 0, 1];
/// Device-model addresses: not assigned to any kernel interface.
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 2);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
const PORT: u16 = 7000;
const PACKETS: u32 = 3000;
const WINDOW: u32 = 32;
const STOP: u32 = u32::MAX;

fn mlx5_over_the_bridge_between_two_namespaces() {
    const TEST: &str = "mlx5_over_the_bridge_between_two_namespaces";
    let Some(net) = setup(TEST, "bridge_peer") else {
        return;
    };
    let mut server = net.spawn(&net.server_ns, "server", &[(DEV_ENV, &net.server_dev)]);
    server.expect_line("BRIDGE SERVER READY", Duration::from_secs(30));
    // If tshark is installed, capture on the client's veth end: the frames
    // are on a real kernel link, visible to ordinary tools.
    let tshark = common::netns::tool("tshark");
    let capture = tshark.is_file().then(|| {
        std::process::Command::new(common::netns::tool("ip"))
            .args(["netns", "exec", &net.client_ns])
            .arg(&tshark)
            .args([
                "-i",
                &net.client_dev,
                "-c",
                "20",
                "-f",
                "udp port 7000",
                "-q",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn tshark")
    });
    // tshark says "Capturing on ..." on stderr once the interface is open:
    // the client starts only then (however long a loaded machine takes), and
    // a thread keeps collecting stderr for the check at the end.
    let capture = capture.map(|mut c| {
        let stderr = c.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        // Until tshark is capturing, or has exited (its error shows below).
        while let Ok(line) = rx.recv() {
            if line.contains("Capturing on") {
                break;
            }
        }
        (c, reader)
    });
    let mut client = net.spawn(&net.client_ns, "client", &[(DEV_ENV, &net.client_dev)]);
    let (cs, creport) = client.wait(Duration::from_secs(60));
    let (ss, sreport) = server.wait(Duration::from_secs(10));
    assert!(
        cs.is_some_and(|s| s.success()),
        "client failed:\n{creport}\n{sreport}"
    );
    assert!(
        ss.is_some_and(|s| s.success()),
        "server failed:\n{sreport}\n{creport}"
    );
    assert_eq!(
        field(&creport, "client", "echoed"),
        Some(u64::from(PACKETS)),
        "{creport}"
    );
    assert!(
        field(&sreport, "server", "echoed").is_some_and(|n| n >= u64::from(PACKETS)),
        "{sreport}"
    );
    if let Some((mut c, reader)) = capture {
        let status = c.wait().expect("tshark");
        let err = reader.join().expect("tshark stderr reader");
        assert!(
            status.success() && err.contains("20 packets captured"),
            "tshark saw: {err}"
        );
    } else {
        eprintln!("note: tshark not installed; skipping the capture check");
    }
    // Frames crossed the real link in both directions.
    assert!(
        field(&creport, "client", "to_link").is_some_and(|n| n > u64::from(PACKETS)),
        "{creport}"
    );
    assert!(
        field(&creport, "client", "from_link").is_some_and(|n| n >= u64::from(PACKETS)),
        "{creport}"
    );
}

/// The device-model client against the kernel UDP transport: it resolves
/// the routing info the UDP transport advertises, unchanged, and sends raw
/// frames across the bridge. The server's kernel needs a route and a
/// neighbour entry for the device model's address (it answers no ARP, like
/// a DPDK or raw C++ peer).
fn mlx5_client_reaches_the_udp_transport_by_its_advertised_routing_info() {
    const TEST: &str = "mlx5_client_reaches_the_udp_transport_by_its_advertised_routing_info";
    let Some(net) = setup(TEST, "bridge_peer") else {
        return;
    };
    let mac = CLIENT_MAC
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let client = CLIENT_IP.to_string();
    let (ns, dev) = (net.server_ns.as_str(), net.server_dev.as_str());
    ip(&["-n", ns, "route", "add", &client, "dev", dev]).expect("route");
    ip(&[
        "-n",
        ns,
        "neigh",
        "add",
        &client,
        "lladdr",
        &mac,
        "dev",
        dev,
        "nud",
        "permanent",
    ])
    .expect("neighbour");
    let mut server = net.spawn(ns, "udp_server", &[]);
    let info_hex = server.expect_line("PEER READY ", Duration::from_secs(30));
    let info = RoutingInfo::from_bytes(&unhex(&info_hex));
    // The advertised MAC is the veth's, as the kernel reports it.
    let out = std::process::Command::new(common::netns::tool("ip"))
        .args(["netns", "exec", ns, "cat"])
        .arg(format!("/sys/class/net/{dev}/address"))
        .output()
        .expect("read the veth's MAC");
    let sys_mac = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(hex_mac(&info.mac), sys_mac, "advertised {info}");
    assert_ne!(info.mac, [0; 6]);
    assert_eq!((info.ipv4, info.udp_port), (*SERVER.ip(), SERVER.port()));
    assert_eq!((info.rxq_id, info.rss_table_size), (0, 1));

    let mut client = net.spawn(
        &net.client_ns,
        "client_to_udp",
        &[(DEV_ENV, &net.client_dev), (SERVER_INFO_ENV, &info_hex)],
    );
    let (cs, creport) = client.wait(Duration::from_secs(60));
    let (ss, sreport) = server.wait(Duration::from_secs(10));
    assert!(
        cs.is_some_and(|s| s.success()),
        "client failed:
{creport}
{sreport}"
    );
    assert!(
        ss.is_some_and(|s| s.success()),
        "server failed:
{sreport}
{creport}"
    );
    assert_eq!(
        field(&creport, "client", "echoed"),
        Some(u64::from(PACKETS)),
        "{creport}"
    );
    assert!(
        field(&sreport, "udp_server", "echoed").is_some_and(|n| n >= u64::from(PACKETS)),
        "{sreport}"
    );
    assert_eq!(
        field(&sreport, "udp_server", "rx_errors"),
        Some(0),
        "{sreport}"
    );
}

fn hex_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn unhex(s: &str) -> [u8; transport::ROUTING_INFO_BYTES] {
    let mut out = [0u8; transport::ROUTING_INFO_BYTES];
    assert_eq!(s.len(), 2 * out.len(), "routing info {s:?}");
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex routing info");
    }
    out
}

/// The UDP transport as an echo server: every datagram back to the device
/// model's address (from the routing info it would have got in session
/// management), until a STOP packet.
fn run_udp_server() {
    let mut t = UdpTransport::new(&UdpConfig::new(SERVER)).expect("bind");
    let to_client = t
        .resolve(&RoutingInfo {
            mac: CLIENT_MAC,
            ipv4: CLIENT_IP,
            udp_port: PORT,
            rxq_id: 0,
            rss_table_size: 1,
        })
        .expect("route");
    let info: String = t
        .local_routing_info()
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("PEER READY {info}");
    let mut ring = t.take_rx_ring().expect("the RX ring");
    let mut head = 0usize;
    let mut echoed = 0u64;
    let mut pkt = vec![0u8; transport::MTU];
    let deadline = Instant::now() + Duration::from_secs(45);
    'serve: while Instant::now() < deadline {
        let n = t.rx_burst();
        for i in 0..n {
            let Some(p) = ring.packet((head + i) % ring.entries()) else {
                continue;
            };
            let seq = u32::from_le_bytes(p[..4].try_into().unwrap());
            let len = HEADROOM_BYTES + p.len();
            pkt[HEADROOM_BYTES..len].copy_from_slice(p);
            let item = TxItem::unregistered(&to_client, &pkt[..len], &[]);
            while t.tx_burst(std::slice::from_ref(&item)) == 0 {}
            echoed += 1;
            if seq == STOP {
                t.post_recvs(&mut ring, n);
                break 'serve;
            }
        }
        head += n;
        t.post_recvs(&mut ring, n);
    }
    let s = t.stats();
    println!(
        "PEER udp_server echoed={echoed} rx_errors={} tx_errors={}",
        s.rx_errors + s.rx_short + s.rx_oversize,
        s.tx_errors
    );
}

/// The peer process (run by the tests above inside a namespace).
/// The peer process (run by the tests above inside a namespace; ignored
/// otherwise).
fn bridge_peer() {
    let role = std::env::var(ROLE_ENV).expect("role");
    if role == "udp_server" {
        return run_udp_server();
    }
    let dev = std::env::var(DEV_ENV).expect("interface");
    let server = role == "server";
    let (mac, ip, peer_mac, peer_ip) = if server {
        (SERVER_MAC, SERVER_IP, CLIENT_MAC, CLIENT_IP)
    } else {
        (CLIENT_MAC, CLIENT_IP, SERVER_MAC, SERVER_IP)
    };
    let fabric = Fabric::new(FabricConfig {
        seed: 1,
        deterministic: false,
        ..Default::default()
    });
    let nic = SimNic::new(
        &fabric,
        NicConfig {
            mac,
            ..Default::default()
        },
    );
    let bridge = fabric.add_bridge(&dev).expect("bridge");
    let region = RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    };
    let device = Device::open(
        nic.backend(),
        DeviceConfig {
            region,
            ..Default::default()
        },
    )
    .expect("bring-up");
    let mut t: Mlx5Transport<SimBackend> = Mlx5Transport::new(
        &device,
        Mlx5Config::new(
            ip,
            QueueConfig {
                udp_port: PORT,
                ..Default::default()
            },
        ),
    )
    .expect("transport");
    let peer = match std::env::var(SERVER_INFO_ENV) {
        Ok(hex) => RoutingInfo::from_bytes(&unhex(&hex)),
        Err(_) => RoutingInfo {
            mac: peer_mac,
            ipv4: peer_ip,
            udp_port: PORT,
            rxq_id: 0,
            rss_table_size: 1,
        },
    };
    let route = t.resolve(&peer).expect("route");
    let mut alloc = Allocator::new(
        device.dma_mapper(),
        AllocatorConfig {
            initial_bytes: 2 << 20,
            region,
            ..Default::default()
        },
    )
    .expect("allocator");
    let mut bufs: Vec<Buffer> = (0..WINDOW).map(|_| alloc.alloc(1024).unwrap()).collect();
    let mut ring = t.take_rx_ring().expect("the RX ring");
    let mut head = 0usize;
    let len_of = |seq: u32| PKTHDR_BYTES + 4 + (seq as usize * 37) % 900;
    let fill = |b: &mut Buffer, t: &Mlx5Transport<SimBackend>, seq: u32, len: usize| {
        let s = b.as_mut_slice();
        t.fill_headroom(&route, &mut s[..HEADROOM_BYTES], len);
        s[HEADROOM_BYTES..HEADROOM_BYTES + 4].copy_from_slice(&seq.to_le_bytes());
        for (i, x) in s[HEADROOM_BYTES + 4..len].iter_mut().enumerate() {
            *x = (seq as usize + i) as u8;
        }
    };
    let send = |t: &mut Mlx5Transport<SimBackend>, b: &Buffer, len: usize| {
        let item = TxItem::contiguous(&route, &b.as_slice()[..len], b.iova(), b.lkey());
        while t.tx_burst(&[item]) == 0 {}
    };
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut echoed = 0u64;
    if server {
        println!("BRIDGE SERVER READY");
        'serve: while Instant::now() < deadline {
            let n = t.rx_burst();
            for i in 0..n {
                let Some(p) = ring.packet((head + i) % ring.entries()) else {
                    continue;
                };
                let seq = u32::from_le_bytes(p[..4].try_into().unwrap());
                let len = HEADROOM_BYTES + p.len();
                let b = &mut bufs[(echoed % u64::from(WINDOW)) as usize];
                b.as_mut_slice()[HEADROOM_BYTES..len].copy_from_slice(p);
                t.fill_headroom(&route, &mut b.as_mut_slice()[..HEADROOM_BYTES], len);
                send(&mut t, b, len);
                echoed += 1;
                if seq == STOP {
                    t.post_recvs(&mut ring, n);
                    break 'serve;
                }
            }
            head += n;
            t.post_recvs(&mut ring, n);
        }
        t.tx_flush();
        let s = bridge.stats();
        println!(
            "PEER server echoed={echoed} to_link={} from_link={} ignored_not_ours={} ignored_ethertype={} ignored_outgoing={}",
            s.to_link, s.from_link, s.ignored_not_ours, s.ignored_ethertype, s.ignored_outgoing
        );
        return;
    }
    // Client: a window of numbered packets; every echo checked byte for byte.
    let (mut next, mut in_flight) = (0u32, 0u32);
    let mut expect = 0u32;
    while echoed < u64::from(PACKETS) {
        assert!(
            Instant::now() < deadline,
            "timed out: {echoed} of {PACKETS} echoed; bridge {:?}; transport {:?}",
            bridge.stats(),
            t.stats()
        );
        while next < PACKETS && in_flight < WINDOW {
            let len = len_of(next);
            let b = &mut bufs[(next % WINDOW) as usize];
            fill(b, &t, next, len);
            send(&mut t, b, len);
            next += 1;
            in_flight += 1;
        }
        let n = t.rx_burst();
        for i in 0..n {
            let p = ring
                .packet((head + i) % ring.entries())
                .expect("echo is a valid frame");
            let seq = u32::from_le_bytes(p[..4].try_into().unwrap());
            assert_eq!(seq, expect, "echoes arrive in order");
            assert_eq!(HEADROOM_BYTES + p.len(), len_of(seq));
            for (k, x) in p[4..].iter().enumerate() {
                assert_eq!(*x, (seq as usize + k) as u8, "seq {seq} byte {k}");
            }
            expect += 1;
            echoed += 1;
            in_flight -= 1;
        }
        head += n;
        t.post_recvs(&mut ring, n);
    }
    let b = &mut bufs[0];
    let len = PKTHDR_BYTES + 4;
    fill(b, &t, STOP, len);
    send(&mut t, b, len);
    t.tx_flush();
    let s = bridge.stats();
    println!(
        "PEER client echoed={echoed} to_link={} from_link={} ignored_not_ours={} ignored_ethertype={} ignored_outgoing={}",
        s.to_link, s.from_link, s.ignored_not_ours, s.ignored_ethertype, s.ignored_outgoing
    );
    for b in bufs {
        alloc.free(b);
    }
}

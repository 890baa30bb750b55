//! The UDP transport across a real kernel link: two network namespaces
//! joined by a veth pair, a client in one and an echo server in the other,
//! each a separate process.
//!
//! The test creates the namespaces and the veth pair with iproute2 (`ip
//! netns`, `ip link`), under names unique to this process, and removes them
//! when it ends, also when it fails (a guard's `Drop`; stale ones left by a
//! killed run are swept at the next start). The two peers are this test
//! binary itself, re-executed with `ip netns exec` to run the ignored test
//! `netns_peer` with a role in `ERPC_NETNS_PEER_ROLE`.
//!
//! A second test puts a slow token-bucket qdisc (`tc ... tbf`) on the
//! client's link so that the socket's send queue fills up, and checks what
//! `tx_burst` returns and counts when `sendmmsg` says EAGAIN.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; without them
//! the tests are reported as ignored with the reason (a libtest-mimic
//! harness), except in CI (`ERPC_CI=1`), where they fail.

// The shared transport conformance suite (a module of the tests only).
#[macro_use]
mod conformance;

mod common;

fn main() -> std::process::ExitCode {
    use common::netns::{peer_trial, prerequisites, trial};
    let args = libtest_mimic::Arguments::from_args();
    let missing = prerequisites();
    let tc = || {
        missing
            .clone()
            .or_else(|| (!tool("tc").is_file()).then(|| "needs `tc` (iproute2)".to_string()))
    };
    let trials = vec![
        trial(
            "udp_between_two_network_namespaces",
            udp_between_two_network_namespaces,
            missing.clone(),
        ),
        trial(
            "full_socket_queue_turns_the_rest_of_a_burst_back",
            full_socket_queue_turns_the_rest_of_a_burst_back,
            tc(),
        ),
        peer_trial("netns_peer", netns_peer),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::netns::{CLIENT, ROLE_ENV, SERVER, field, setup, skip, tool};

use conformance::probe::{self, ProbeId};
use transport::udp::{UdpConfig, UdpTransport};
use transport::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, MAX_DATA_PER_PKT, PKTHDR_BYTES, ROUTING_INFO_BYTES,
    RoutingInfo, RxRing, Transport, TxItem,
};

const SERVER_INFO_ENV: &str = "ERPC_NETNS_SERVER_INFO";
/// Not routed in the client's namespace: sending there fails at once.
const UNREACHABLE: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const PACKETS: u32 = 3000;
const WINDOW: usize = 32;
const STREAM_HELLO: u16 = 0;
const STREAM_DATA: u16 = 1;
const STREAM_STOP: u16 = 2;
const PEER_TIMEOUT: Duration = Duration::from_secs(30);

fn udp_between_two_network_namespaces() {
    let Some(net) = setup("udp_between_two_network_namespaces", "netns_peer") else {
        return;
    };
    // Peers are declared after `net`, so they are killed before the
    // namespaces are removed.
    let mut server = net.spawn(&net.server_ns.clone(), "server", &[]);
    let info = server.expect_line("PEER READY ", Duration::from_secs(10));
    let mut client = net.spawn(
        &net.client_ns.clone(),
        "client",
        &[(SERVER_INFO_ENV, &info)],
    );

    let (client_status, client_report) = client.wait(PEER_TIMEOUT);
    let (server_status, server_report) = server.wait(PEER_TIMEOUT);
    let both = format!("{client_report}\n{server_report}");
    assert!(
        client_status.is_some_and(|s| s.success()),
        "client failed ({client_status:?})\n{both}"
    );
    assert!(
        server_status.is_some_and(|s| s.success()),
        "server failed ({server_status:?})\n{both}"
    );
    assert_eq!(
        field(&client_report, "CLIENT", "echoed"),
        Some(u64::from(PACKETS)),
        "{both}"
    );
    assert_eq!(
        field(&client_report, "CLIENT", "tx_errors"),
        Some(1),
        "{both}"
    );
    assert!(
        field(&server_report, "SERVER", "echoed").is_some_and(|n| n >= u64::from(PACKETS)),
        "{both}"
    );
    let summaries = both
        .lines()
        .filter_map(|l| l.find("PEER ").map(|at| &l[at..]));
    for line in summaries.filter(|l| !l.starts_with("PEER READY")) {
        println!("{line}");
    }
    drop((client, server));
    drop(net);
}

fn full_socket_queue_turns_the_rest_of_a_burst_back() {
    const TEST: &str = "full_socket_queue_turns_the_rest_of_a_burst_back";
    let Some(net) = setup(TEST, "netns_peer") else {
        return;
    };
    // A token bucket of 1 kB/s on the client's link: datagrams wait in the
    // qdisc, charged to the socket, until its send buffer is full and
    // `sendmmsg` says EAGAIN.
    let tbf = [
        "-n",
        &net.client_ns,
        "qdisc",
        "add",
        "dev",
        &net.client_dev,
        "root",
        "tbf",
        "rate",
        "8kbit",
        "burst",
        "1600",
        "limit",
        "1000000",
    ];
    let out = Command::new(tool("tc")).args(tbf).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let e = String::from_utf8_lossy(&o.stderr).into_owned();
            return skip(TEST, &format!("cannot add a tbf qdisc: {}", e.trim()));
        }
        Err(e) => return skip(TEST, &format!("cannot run `tc` (iproute2): {e}")),
    }
    let mut peer = net.spawn(&net.client_ns.clone(), "queue_full", &[]);
    let (status, report) = peer.wait(PEER_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "peer failed ({status:?})\n{report}"
    );
    assert!(field(&report, "QUEUE", "accepted").is_some(), "{report}");
    for line in report
        .lines()
        .filter_map(|l| l.find("PEER ").map(|at| &l[at..]))
    {
        println!("{line}");
    }
    drop(peer);
    drop(net);
}

/// The peer process of the namespace tests, which run it inside a namespace
/// (ignored otherwise).
fn netns_peer() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        eprintln!("netns_peer: nothing to do outside the namespace tests");
        return;
    };
    match role.as_str() {
        "server" => run_server(),
        "client" => run_client(),
        "queue_full" => run_queue_full(),
        other => panic!("unknown role {other}"),
    }
}

/// Sends bursts (with one `drop` item each) into a link that drains at
/// 1 kB/s until the socket's send buffer is full, then checks that
/// `tx_burst` returns the accepted prefix and counts the rest.
fn run_queue_full() {
    let mut t = UdpTransport::new(&UdpConfig {
        socket_buffer_bytes: 4096,
        tx_burst_max: 16,
        ..UdpConfig::new(CLIENT)
    })
    .expect("bind");
    let to = t
        .resolve(&RoutingInfo {
            ipv4: *SERVER.ip(),
            udp_port: SERVER.port(),
            ..RoutingInfo::default()
        })
        .unwrap();
    let pkt = vec![0u8; PKTHDR_BYTES + 100];
    let burst = |first_drop: bool| -> Vec<TxItem<'_, _>> {
        (0..16)
            .map(|i| {
                TxItem::unregistered(&to, &pkt, &[]).with_drop(i == 3 || (first_drop && i == 0))
            })
            .collect()
    };
    let full = burst(false);
    let is_sent = |items: &[TxItem<'_, _>]| items.iter().filter(|i| !i.drop()).count() as u64;
    let is_drop = |items: &[TxItem<'_, _>]| items.iter().filter(|i| i.drop()).count() as u64;
    let mut bursts = 0;
    let accepted = loop {
        assert!(
            bursts < 1000,
            "the socket queue never filled: {:?}",
            t.stats()
        );
        let before = t.stats();
        let n = t.tx_burst(&full);
        let s = t.stats();
        assert_eq!(s.tx_pkts - before.tx_pkts, is_sent(&full[..n]), "{s:?}");
        assert_eq!(
            s.tx_dropped_on_purpose - before.tx_dropped_on_purpose,
            is_drop(&full[..n])
        );
        assert_eq!(
            s.tx_refused - before.tx_refused,
            is_sent(&full[n..]),
            "{s:?}"
        );
        bursts += 1;
        if n < full.len() {
            break n;
        }
    };
    // Still full: a burst starting with a drop item consumes just that one.
    let led = burst(true);
    let before = t.stats();
    let n = t.tx_burst(&led);
    let s = t.stats();
    assert_eq!(n, 1, "only the leading drop item is consumed: {s:?}");
    assert_eq!(s.tx_dropped_on_purpose - before.tx_dropped_on_purpose, 1);
    assert_eq!(s.tx_refused - before.tx_refused, is_sent(&led), "{s:?}");
    assert_eq!(s.tx_pkts, before.tx_pkts);
    println!(
        "PEER QUEUE accepted={accepted} after_bursts={bursts} tx_pkts={} tx_refused={} \
         tx_doorbells={}",
        s.tx_pkts, s.tx_refused, s.tx_doorbells
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; ROUTING_INFO_BYTES] {
    let mut out = [0u8; ROUTING_INFO_BYTES];
    assert_eq!(s.len(), 2 * ROUTING_INFO_BYTES, "routing info {s:?}");
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex routing info");
    }
    out
}

/// Echoes every packet back to the client, zero copy: the reply's data is
/// the request's bytes in the RX ring. Stops at a STOP probe.
fn run_server() {
    let mut t = UdpTransport::new(&UdpConfig::new(SERVER)).expect("bind the server");
    let to_client = t
        .resolve(&RoutingInfo {
            ipv4: *CLIENT.ip(),
            udp_port: CLIENT.port(),
            ..RoutingInfo::default()
        })
        .unwrap();
    println!("PEER READY {}", hex(&t.local_routing_info().to_bytes()));
    let mut ring = t.take_rx_ring().expect("the RX ring");
    let mut hdrs = vec![[0u8; PKTHDR_BYTES]; ring.entries()];
    let mut head = 0usize;
    let mut echoed = 0u64;
    let deadline = Instant::now() + PEER_TIMEOUT;
    let mut stop = false;
    while !stop {
        assert!(
            Instant::now() < deadline,
            "server timed out: {:?}",
            t.stats()
        );
        let n = t.rx_burst();
        let slots: Vec<usize> = (head..head + n).map(|i| i % ring.entries()).collect();
        for &i in &slots {
            let p = ring.packet(i).expect("a valid packet");
            let id = probe::check(p).expect("an intact probe");
            stop |= id.stream == STREAM_STOP;
            hdrs[i][HEADROOM_BYTES..].copy_from_slice(&p[..ERPC_HDR_BYTES]);
        }
        let replies: Vec<_> = slots
            .iter()
            .filter(|&&i| probe::check(ring.packet(i).unwrap()).unwrap().stream != STREAM_STOP)
            .map(|&i| {
                TxItem::unregistered(
                    &to_client,
                    &hdrs[i],
                    &ring.packet(i).unwrap()[ERPC_HDR_BYTES..],
                )
            })
            .collect();
        let mut sent = 0;
        while sent < replies.len() {
            sent += t.tx_burst(&replies[sent..]);
            assert!(
                Instant::now() < deadline,
                "server cannot send: {:?}",
                t.stats()
            );
        }
        echoed += sent as u64;
        drop(replies);
        t.post_recvs(&mut ring, n);
        head += n;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    let s = t.stats();
    println!(
        "PEER SERVER echoed={echoed} rx_pkts={} tx_pkts={} tx_errors={}",
        s.rx_pkts, s.tx_pkts, s.tx_errors
    );
}

/// Sends PACKETS probes of every size through a window, checks each echo
/// byte for byte, then checks that a datagram without a route is lost and
/// counted, and stops the server.
fn run_client() {
    let info = std::env::var(SERVER_INFO_ENV).expect("server routing info");
    let server_info = RoutingInfo::from_bytes(&unhex(&info));
    assert_eq!(
        (server_info.ipv4, server_info.udp_port),
        (*SERVER.ip(), SERVER.port())
    );
    let mut t = UdpTransport::new(&UdpConfig::new(CLIENT)).expect("bind the client");
    let to_server = t.resolve(&server_info).unwrap();
    let mut ring = t.take_rx_ring().expect("the RX ring");
    let mut head = 0usize;
    let deadline = Instant::now() + PEER_TIMEOUT;
    let packet = |id: ProbeId, len: usize| {
        let mut buf = vec![0u8; PKTHDR_BYTES + len];
        probe::write_header(&mut buf[HEADROOM_BYTES..], id, len);
        probe::fill_data(&mut buf[PKTHDR_BYTES..], id);
        buf
    };

    // Until the server answers a hello, the link may still be coming up
    // (carrier, ARP): resend every 20 ms.
    let hello = packet(
        ProbeId {
            stream: STREAM_HELLO,
            seq: 0,
        },
        0,
    );
    let mut answered = false;
    let mut last_hello = Instant::now() - Duration::from_secs(1);
    while !answered {
        assert!(
            Instant::now() < deadline,
            "no answer to hello: {:?}",
            t.stats()
        );
        if last_hello.elapsed() > Duration::from_millis(20) {
            t.tx_burst(&[TxItem::unregistered(&to_server, &hello, &[])]);
            last_hello = Instant::now();
        }
        let n = t.rx_burst();
        answered = n > 0;
        t.post_recvs(&mut ring, n);
        head += n;
    }

    let mut got = vec![false; PACKETS as usize];
    let mut echoed = 0u32;
    let mut next = 0u32;
    let len_of = |s: u32| (s as usize * 37) % (MAX_DATA_PER_PKT + 1);
    while echoed < PACKETS {
        assert!(
            Instant::now() < deadline,
            "client timed out: sent {next}, echoed {echoed}: {:?}",
            t.stats()
        );
        let inflight = (next - echoed) as usize;
        let room = WINDOW.saturating_sub(inflight).min(t.tx_burst_max());
        let room = room.min((PACKETS - next) as usize) as u32;
        if room > 0 {
            let bufs: Vec<Vec<u8>> = (next..next + room)
                .map(|s| {
                    packet(
                        ProbeId {
                            stream: STREAM_DATA,
                            seq: s,
                        },
                        len_of(s),
                    )
                })
                .collect();
            // Even sequence numbers as one contiguous slot, odd ones as
            // header + separate data, like eRPC's later packets.
            let items: Vec<_> = bufs
                .iter()
                .zip(next..)
                .map(|(b, s)| {
                    if s % 2 == 0 {
                        TxItem::unregistered(&to_server, &b[..], &[])
                    } else {
                        TxItem::unregistered(&to_server, &b[..PKTHDR_BYTES], &b[PKTHDR_BYTES..])
                    }
                })
                .collect();
            next += t.tx_burst(&items) as u32;
        }
        let n = t.rx_burst();
        for k in 0..n {
            let p = ring
                .packet((head + k) % ring.entries())
                .expect("a valid echo");
            let id = probe::check(p).unwrap_or_else(|e| panic!("echo corrupted: {e}"));
            if id.stream == STREAM_HELLO {
                continue; // a late answer to a resent hello
            }
            assert_eq!(id.stream, STREAM_DATA);
            assert_eq!(p.len(), ERPC_HDR_BYTES + len_of(id.seq));
            assert!(!got[id.seq as usize], "echo {id:?} twice");
            got[id.seq as usize] = true;
            echoed += 1;
        }
        t.post_recvs(&mut ring, n);
        head += n;
    }

    // A datagram with no route is lost and counted; the one after it in the
    // same burst still goes out.
    let nowhere = t
        .resolve(&RoutingInfo {
            ipv4: UNREACHABLE,
            ..server_info
        })
        .unwrap();
    let stop = packet(
        ProbeId {
            stream: STREAM_STOP,
            seq: 0,
        },
        0,
    );
    let before = t.stats();
    let sent = t.tx_burst(&[
        TxItem::unregistered(&nowhere, &stop, &[]),
        TxItem::unregistered(&to_server, &stop, &[]),
    ]);
    let s = t.stats();
    assert_eq!(sent, 2);
    assert_eq!(s.tx_errors - before.tx_errors, 1, "{s:?}");
    assert_eq!(s.tx_pkts - before.tx_pkts, 1, "{s:?}");
    println!(
        "PEER CLIENT echoed={echoed} tx_pkts={} tx_errors={} tx_doorbells={} rx_pkts={}",
        s.tx_pkts, s.tx_errors, s.tx_doorbells, s.rx_pkts
    );
}

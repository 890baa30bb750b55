//! Real threads over kernel UDP (loopback): Nexuses with their SM threads
//! on UDP, worker threads for background handlers, Rpcs on their own
//! threads, each both client and server.

mod common;

use std::net::UdpSocket;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Barrier};

use common::app::{self, Ctx};
use common::threads::rpc_thread;
use erpc::{Nexus, Rpc, RpcConfig};
use transport::udp::{UdpConfig, UdpTransport};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn three_rpcs_two_nexuses_real_threads() {
    // Nexus A hosts Rpcs 0 and 1 (SM routed by Rpc id); Nexus B hosts Rpc 0.
    let (pa, pb) = (free_port(), free_port());
    let ua = format!("127.0.0.1:{pa}");
    let ub = format!("127.0.0.1:{pb}");
    let build = |uri: &str| {
        app::register::<UdpTransport>(Nexus::builder(uri))
            .workers(2)
            .build()
            .expect("nexus")
    };
    let (na, nb) = (build(&ua), build(&ub));
    assert_eq!(na.worker_threads(), 2);
    let rpcs = [
        (na.clone(), 0u8, vec![(ua.clone(), 1u8), (ub.clone(), 0u8)]),
        (na.clone(), 1u8, vec![(ua.clone(), 0u8), (ub.clone(), 0u8)]),
        (nb.clone(), 0u8, vec![(ua.clone(), 0u8), (ua.clone(), 1u8)]),
    ];
    let n = rpcs.len();
    let ready = Arc::new(Barrier::new(n));
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = rpcs
        .into_iter()
        .map(|(nexus, id, peers)| {
            let (ready, done) = (ready.clone(), done.clone());
            std::thread::spawn(move || {
                rpc_thread(nexus, id, peers, ready, done, n, || {
                    let t = UdpTransport::new(&UdpConfig::loopback()).map_err(|e| e.to_string())?;
                    Ok((t, erpc_sim::test_allocator(8 << 20)))
                })
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread panicked").expect("rpc thread");
    }
    let (sa, sb) = (na.sm_stats(), nb.sm_stats());
    assert!(sa.delivered > 0 && sb.delivered > 0);
    assert_eq!(sa.malformed + sb.malformed, 0);
}

#[test]
fn sm_over_udp_unknown_rpc_id_and_garbage() {
    let p = free_port();
    let uri = format!("127.0.0.1:{p}");
    let nexus = app::register::<UdpTransport>(Nexus::builder(&uri))
        .workers(0)
        .build()
        .unwrap();
    let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
    let mut rpc: Rpc<UdpTransport, Ctx> =
        Rpc::builder(&nexus, t, erpc_sim::test_allocator(4 << 20))
            .id(3)
            .session_handler(app::sm_handler::<UdpTransport>)
            .build()
            .unwrap();
    let mut ctx = Ctx::new(1);
    // Garbage to the SM port is counted, never trusted.
    let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
    junk.send_to(&[0xffu8; 392], &uri).unwrap();
    junk.send_to(b"short", &uri).unwrap();
    // A session to an Rpc id nobody has: the Nexus answers for it.
    let sn = rpc.create_session(&uri, 9).unwrap();
    let clock = nexus.clock().clone();
    let deadline = clock.now_ns() + 10_000_000_000;
    while ctx.events.is_empty() && clock.now_ns() < deadline {
        rpc.run_event_loop_once(&mut ctx);
    }
    assert_eq!(
        ctx.events,
        vec![erpc::SessionEvent {
            session: sn,
            kind: erpc::SessionEventKind::Ended(erpc::SessionEnd::ConnectFailed(
                erpc::SmErr::InvalidRemoteRpcId
            ))
        }]
    );
    let st = nexus.sm_stats();
    assert_eq!(st.malformed, 2, "{st:?}");
    assert_eq!(st.invalid_rpc_id_req, 1);
}

/// Congestion control is off by default over kernel UDP (its RTT is the
/// kernel's socket queues, not the network's) and on when asked for; the
/// simulated network, whose RTT is the network's, keeps it on.
#[test]
fn congestion_control_defaults_off_on_kernel_udp() {
    let uri = format!("127.0.0.1:{}", free_port());
    let nexus = app::register::<UdpTransport>(Nexus::builder(&uri))
        .workers(0)
        .build()
        .unwrap();
    let make = |id: u8, cfg: RpcConfig| {
        let t = UdpTransport::new(&UdpConfig::loopback()).unwrap();
        let rpc: Rpc<UdpTransport, Ctx> =
            Rpc::builder(&nexus, t, erpc_sim::test_allocator(4 << 20))
                .id(id)
                .config(cfg)
                .build()
                .unwrap();
        rpc.config().cc.enabled
    };
    assert!(!make(0, RpcConfig::default()), "default: off over UDP");
    let mut forced = RpcConfig::default();
    forced.cc.on_software_stack = true;
    assert!(make(1, forced), "on_software_stack: on over UDP");
    let mut off = RpcConfig::default();
    off.cc.enabled = false;
    off.cc.on_software_stack = true;
    assert!(!make(2, off), "disabled stays disabled");

    let net = erpc_sim::SimNet::new(erpc_sim::SimConfig::default());
    let sim_nexus = app::register::<erpc_sim::SimTransport>(Nexus::builder("sim0:1"))
        .sm_link(net.sm_link())
        .clock(net.erpc_clock())
        .build()
        .unwrap();
    let rpc: Rpc<erpc_sim::SimTransport, Ctx> = Rpc::builder(
        &sim_nexus,
        net.add_transport(),
        erpc_sim::test_allocator(4 << 20),
    )
    .build()
    .unwrap();
    assert!(
        rpc.config().cc.enabled,
        "default: on over the simulated network"
    );
}

/// Kernel UDP for the data packets, the simulated network's SM link and
/// virtual clock for the rest: real sockets, but no wall clock decides
/// anything (a timeout fires only when the test moves time).
struct UdpWorld {
    net: erpc_sim::SimNet,
}

impl common::World for UdpWorld {
    type T = UdpTransport;

    fn transport(&mut self) -> UdpTransport {
        UdpTransport::new(&UdpConfig::loopback()).expect("UDP transport")
    }

    fn nexus(&mut self, uri: &str) -> erpc::NexusBuilder {
        Nexus::builder(uri)
            .sm_link(self.net.sm_link())
            .clock(self.net.erpc_clock())
    }

    fn step(&mut self) {
        self.net.advance(500);
    }

    fn now_ns(&self) -> u64 {
        self.net.now_ns()
    }

    fn queue(&self, _i: usize) -> erpc_sim::QueueStats {
        erpc_sim::QueueStats::default()
    }

    fn trace_queue(&mut self, _i: usize, _capacity: usize) {}

    fn queue_trace(&self, _i: usize) -> Vec<erpc_sim::QueueSample> {
        Vec::new()
    }
}

/// Receive before timers. A client sends 64 requests, the server answers
/// them all, and the client does not poll for twice the retransmission
/// timeout (a descheduled thread): its socket holds every answer. When it
/// resumes, its first iteration is due a loss scan, and the UDP transport
/// reads one datagram per `rx_burst` while datagrams have come one at a
/// time; the event loop must drain the socket before it scans, so nothing
/// is retransmitted and the server sees no duplicate. (Loopback delivers a
/// datagram within the send that carries it, so the answers are queued
/// when the server's iteration returns; the stall is virtual time.) That
/// scan is a whole stall late and so put off once (`defer_late_scan`),
/// which alone would avoid the retransmissions here: without the drain
/// this test fails on "all completed in the first iteration", and
/// `answers_queued_behind_a_put_off_scan_are_read_before_it_runs` pins
/// the retransmissions where the deferral cannot help.
#[test]
fn answers_queued_during_a_stall_are_read_before_the_loss_scan() {
    use common::scenarios::{check_done, connect, nodes};
    let mut w = UdpWorld {
        net: erpc_sim::SimNet::new(erpc_sim::SimConfig::default()),
    };
    let mut ns = nodes(&mut w, 2, 7);
    // Eight sessions of eight slots: 64 requests in flight at once.
    connect(&mut w, &mut ns, 0, 1, 8);
    let total = 64;
    ns[0].ctx.todo = (0..total)
        .map(|_| app::Op {
            req_type: app::ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, total);
        n.poll();
    }
    assert_eq!(ns[0].ctx.in_flight, total);
    assert_eq!(ns[0].rpc.stats().tx_pkts, total as u64, "all sent at once");
    // The server answers every request (its iteration flushes what it
    // queued); the client does not poll.
    let mut polls = 0;
    while ns[1].ctx.handled < total as u64 {
        ns[1].poll();
        polls += 1;
        assert!(polls < 1_000_000, "the server did not get the requests");
    }
    // The client stalls for twice the retransmission timeout.
    let rto_ns = ns[0].rpc.config().rto_us * 1_000;
    w.net.advance(2 * rto_ns);
    ns[0].poll();
    let at_resume = ns[0].ctx.completed;
    common::run_until(&mut w, &mut ns, 100_000, "completions", |ns| {
        ns[0].ctx.completed == total as u64
    });
    check_done::<UdpWorld>(&ns);
    let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
    assert_eq!(c.retransmissions, 0, "{c}");
    assert_eq!(s.dup_req_cr_resent + s.dup_req_resp_resent, 0, "{s}");
    assert_eq!(
        at_resume, total as u64,
        "all completed in the first iteration"
    );
}

/// A stall of the whole host is not loss. Both nodes stop for twice the
/// retransmission timeout right after the client sent 64 requests (the
/// two nodes of a one-thread benchmark descheduled together, or two
/// processes on a loaded machine): the requests are still in the server's
/// socket, unanswered. When the client runs again first, its loss scan is
/// a whole stall late, and it must give the server a scan interval to
/// answer instead of resending every request.
#[test]
fn a_stall_of_both_ends_is_not_taken_for_loss() {
    use common::scenarios::{check_done, connect, nodes};
    let mut w = UdpWorld {
        net: erpc_sim::SimNet::new(erpc_sim::SimConfig::default()),
    };
    let mut ns = nodes(&mut w, 2, 8);
    connect(&mut w, &mut ns, 0, 1, 8);
    let total = 64;
    ns[0].ctx.todo = (0..total)
        .map(|_| app::Op {
            req_type: app::ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, total);
        n.poll();
    }
    assert_eq!(ns[0].rpc.stats().tx_pkts, total as u64, "all sent at once");
    let rto_ns = ns[0].rpc.config().rto_us * 1_000;
    w.net.advance(2 * rto_ns);
    // The client runs first, then the server, as a one-thread loop does.
    common::run_until(&mut w, &mut ns, 100_000, "completions", |ns| {
        ns[0].ctx.completed == total as u64
    });
    check_done::<UdpWorld>(&ns);
    let (c, s) = (ns[0].rpc.stats(), ns[1].rpc.stats());
    assert_eq!(c.retransmissions, 0, "{c}");
    assert_eq!(s.reqs_handled, total as u64, "{s}");
    assert_eq!(s.dup_req_cr_resent + s.dup_req_resp_resent, 0, "{s}");
}

/// The deferral of a late loss scan happens once, never twice in a row:
/// a loop that keeps coming back late still scans at every other
/// iteration. The server does not run (to the client, its requests are
/// lost); the client stalls for twice the retransmission timeout before
/// each of two iterations. The first puts its scan off, the second must
/// scan and resend every request.
#[test]
fn a_slow_loop_puts_off_a_loss_scan_once_not_forever() {
    use common::scenarios::{check_done, connect, nodes};
    let mut w = UdpWorld {
        net: erpc_sim::SimNet::new(erpc_sim::SimConfig::default()),
    };
    let mut ns = nodes(&mut w, 2, 9);
    connect(&mut w, &mut ns, 0, 1, 8);
    let total = 64;
    ns[0].ctx.todo = (0..total)
        .map(|_| app::Op {
            req_type: app::ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, total);
        n.poll();
    }
    assert_eq!(ns[0].rpc.stats().tx_pkts, total as u64, "all sent at once");
    let rto_ns = ns[0].rpc.config().rto_us * 1_000;
    w.net.advance(2 * rto_ns);
    ns[0].poll();
    assert_eq!(
        ns[0].rpc.stats().retransmissions,
        0,
        "the late scan is put off"
    );
    w.net.advance(2 * rto_ns);
    ns[0].poll();
    let c = ns[0].rpc.stats();
    assert_eq!(c.retransmissions, total as u64, "{c}");
    // The server wakes up to every request twice; it answers each once.
    common::run_until(&mut w, &mut ns, 100_000, "completions", |ns| {
        ns[0].ctx.completed == total as u64
    });
    check_done::<UdpWorld>(&ns);
    assert_eq!(ns[1].rpc.stats().reqs_handled, total as u64);
}

/// Receive before timers, where putting off a late scan does not help:
/// the scan that runs after one was put off. The client sends 64
/// requests and stalls for twice the retransmission timeout; its first
/// iteration finds nothing queued (the server has not run) and puts the
/// late scan off. Then the server answers everything, and one scan
/// interval later the client's scan is due and runs: it must read the 64
/// queued answers first (the UDP transport hands out one datagram per
/// `rx_burst` after a receive that found nothing), or it resends every
/// request whose answer is still in the socket.
#[test]
fn answers_queued_behind_a_put_off_scan_are_read_before_it_runs() {
    use common::scenarios::{check_done, connect, nodes};
    let mut w = UdpWorld {
        net: erpc_sim::SimNet::new(erpc_sim::SimConfig::default()),
    };
    let mut ns = nodes(&mut w, 2, 10);
    connect(&mut w, &mut ns, 0, 1, 8);
    let total = 64;
    ns[0].ctx.todo = (0..total)
        .map(|_| app::Op {
            req_type: app::ECHO,
            req_len: 32,
            resp_len: 32,
        })
        .collect();
    {
        let n = &mut ns[0];
        app::start(&mut n.rpc, &mut n.ctx, total);
        n.poll();
    }
    assert_eq!(ns[0].rpc.stats().tx_pkts, total as u64, "all sent at once");
    let rto_ns = ns[0].rpc.config().rto_us * 1_000;
    let scan_ns = ns[0].rpc.config().pkt_loss_scan_us * 1_000;
    w.net.advance(2 * rto_ns);
    ns[0].poll();
    assert_eq!(
        ns[0].rpc.stats().retransmissions,
        0,
        "the late scan is put off"
    );
    assert_eq!(ns[0].ctx.completed, 0);
    let mut polls = 0;
    while ns[1].ctx.handled < total as u64 {
        ns[1].poll();
        polls += 1;
        assert!(polls < 1_000_000, "the server did not get the requests");
    }
    w.net.advance(scan_ns);
    ns[0].poll();
    let c = ns[0].rpc.stats();
    assert_eq!(c.retransmissions, 0, "{c}");
    assert_eq!(
        ns[0].ctx.completed, total as u64,
        "all read before the scan"
    );
    common::run_until(&mut w, &mut ns, 100_000, "completions", |ns| {
        ns[0].ctx.completed == total as u64
    });
    check_done::<UdpWorld>(&ns);
    let s = ns[1].rpc.stats();
    assert_eq!(s.dup_req_cr_resent + s.dup_req_resp_resent, 0, "{s}");
}

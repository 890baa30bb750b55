//! eRPC's own events in its log at debug level: session connect,
//! disconnect, reset and peer failure, each with the peer's URI, and
//! retransmissions (rate-limited). Alone in its test binary: the capture
//! is the process's global subscriber (a thread's scoped one misses
//! events whose call sites another test's thread registered first).

mod common;

use std::sync::Arc;

use common::app::{self, ECHO, Op};
use common::scenarios::{N, connect};
use common::scenarios::{node_uri as uri, two_nodes as two};
use common::{SimWorld, World, run_until, with_seeds};
use erpc::wire::{PktHdr, PktType};

const FILE: &str = "logs";

type W = SimWorld;

/// A request packet for session `session` (none exists: dropped).
fn stray(session: u16) -> Vec<u8> {
    let h = PktHdr {
        req_type: ECHO,
        msg_size: 10,
        dest_session_num: session,
        pkt_type: PktType::Req,
        pkt_num: 0,
        req_num: 8,
    };
    let mut b = vec![0u8; transport::ERPC_HDR_BYTES + 10];
    h.write_to(&mut b).expect("fields in range");
    b
}

/// Runs 20 ms of virtual time (several loss scans).
fn idle(w: &mut W, ns: &mut [N<W>]) {
    let until = w.now_ns() + 20_000_000;
    while w.now_ns() < until {
        w.step();
        for n in ns.iter_mut() {
            n.poll();
        }
    }
}

fn issue(ns: &mut [N<W>], c: usize, ops: Vec<Op>) {
    ns[c].ctx.todo.extend(ops);
    let n = &mut ns[c];
    let k = n.ctx.todo.len();
    app::start(&mut n.rpc, &mut n.ctx, k);
}

/// What a `tracing` subscriber wrote (plain text, no colours).
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn session_events_and_retransmissions_are_logged_at_debug_with_the_peer() {
    with_seeds(
        "session_events_and_retransmissions_are_logged_at_debug_with_the_peer",
        FILE,
        &[11],
        |seed| {
            let cap = Captured::default();
            let sub = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new("erpc=debug"))
                .with_ansi(false)
                .with_writer({
                    let cap = cap.clone();
                    move || cap.clone()
                })
                .finish();
            tracing::subscriber::set_global_default(sub).expect("the only subscriber");
            {
                let (mut w, mut ns) = two(seed);
                connect(&mut w, &mut ns, 0, 1, 2);
                let (a, b) = (ns[0].ctx.sessions[0], ns[0].ctx.sessions[1]);
                // A retransmission: the first is logged.
                ns[0].ctx.sessions = vec![a];
                ns[0].rpc.fault_drop_tx(a, 1).unwrap();
                issue(
                    &mut ns,
                    0,
                    vec![Op {
                        req_type: ECHO,
                        req_len: 100,
                        resp_len: 100,
                    }],
                );
                run_until(&mut w, &mut ns, 1_000_000, "resent", |ns| {
                    ns[0].ctx.completed == 1
                });
                assert_eq!(ns[0].rpc.stats().retransmissions, 1);
                ns[0].rpc.fault_reset_session(a).unwrap();
                run_until(&mut w, &mut ns, 100_000, "server end", |ns| {
                    ns[1].rpc.num_sessions() == 1
                });
                ns[0].rpc.fault_fail_remote(&uri(1)).unwrap();
                run_until(&mut w, &mut ns, 100_000, "failed", |ns| {
                    ns[0].rpc.num_sessions() == 0
                });
                let _ = b;
                // Drops, logged from the loss scan when a reason's count
                // passes a power of two: 3 (logged), 8 (logged), 9 (not).
                for n in [3, 5, 1] {
                    for _ in 0..n {
                        w.net.inject_payload(1, &stray(999));
                    }
                    idle(&mut w, &mut ns);
                }
                assert_eq!(ns[1].rpc.stats().drops(erpc::DropReason::UnknownSession), 9);
            }
            let lines = cap.lines();
            let all = lines.join("\n");
            let with = |needle: &str, peer: &str| {
                lines
                    .iter()
                    .filter(|l| l.contains(needle) && l.contains(peer))
                    .count()
            };
            let (srv, cli) = (uri(1), uri(0));
            // Client: each event once, with the server's URI.
            assert_eq!(with(": Connected", &srv), 2, "{all}");
            assert_eq!(with(": Reset", &srv), 1, "{all}");
            assert_eq!(with(": PeerFailed", &srv), 1, "{all}");
            assert_eq!(with("retransmission 1 of this Rpc", &srv), 1, "{all}");
            // Server: its sessions' ends, with the client's URI.
            assert_eq!(with(": connected ", &cli), 2, "{all}");
            // Both: the reset and the one-sided failure verdict each tell the
            // server (a disconnect request).
            assert_eq!(with("disconnected by its client", &cli), 2, "{all}");
            let drops: Vec<&String> = lines
                .iter()
                .filter(|l| l.contains("eRPC dropped packets: UnknownSession"))
                .collect();
            assert_eq!(drops.len(), 2, "{all}");
            assert!(
                drops[0].contains("total=3") && drops[1].contains("total=8"),
                "{drops:?}"
            );
            assert!(
                lines.iter().all(|l| !l.contains('\x1b')),
                "colours in a capture: {all}"
            );
        },
    );
}

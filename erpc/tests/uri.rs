//! `create_session`'s URI: a malformed one fails at once, naming what is
//! wrong; a host name that does not resolve fails the session as soon as
//! the SM link's lookup answers, as `HostNotFound`, and the requests that
//! waited for it with `SessionEnd::HostNotFound` (not 500 ms later as a
//! connect timeout).

use std::sync::Arc;
use std::time::{Duration, Instant};

use erpc::sm::{Resolver, UdpSmLink};
use erpc::{
    Completion, Nexus, Rpc, RpcConfig, RpcError, SessionError, SessionEvent, SessionEventKind,
};
use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};
use transport::udp::{UdpConfig, UdpTransport};

#[derive(Default)]
struct App {
    events: Vec<SessionEvent>,
    failed: Vec<RpcError>,
}

fn on_session<T: transport::Transport>(_: &mut Rpc<T, App>, app: &mut App, ev: SessionEvent) {
    app.events.push(ev);
}

fn cont<T: transport::Transport>(rpc: &mut Rpc<T, App>, app: &mut App, c: Completion) {
    if let Err(e) = c.result {
        app.failed.push(e);
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

#[test]
fn malformed_uris_fail_at_once() {
    let net = SimNet::new(SimConfig::default());
    let nexus = Nexus::builder("client:31850")
        .sm_link(net.sm_link())
        .clock(net.erpc_clock())
        .build()
        .unwrap();
    let mut rpc: Rpc<SimTransport, App> =
        Rpc::builder(&nexus, net.add_transport(), test_allocator(2 << 20))
            .build()
            .unwrap();
    for (uri, why) in [
        ("garbage", "port is missing"),
        ("garbage:", "port is not a number"),
        ("host:0", "port is not a number"),
        (":31850", "host is missing"),
        ("two words:31850", "neither an IPv4 address nor a hostname"),
    ] {
        match rpc.create_session(uri, 0) {
            Err(e @ SessionError::BadUri { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(why) && msg.contains(uri), "{uri}: {msg}");
            }
            other => panic!("{uri}: {other:?}"),
        }
    }
    assert_eq!(rpc.num_sessions(), 0, "no session was made");
}

/// A resolver that knows no names (lookups of `.invalid` names by the
/// system resolver can wait for DNS timeouts on a machine without a
/// network; the answer is what matters here, not who gives it).
fn no_names() -> Resolver {
    Arc::new(|_host: &str, _port: u16| None)
}

#[test]
fn unresolvable_host_is_named_as_such() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let link = Arc::new(UdpSmLink::with_resolver(no_names()));
    // A failure timeout far beyond anything this test waits for: only a
    // resolution failure can end the session early.
    let nexus = Nexus::builder(&format!("127.0.0.1:{port}"))
        .sm_link(link.clone())
        .failure_timeout_ms(600_000)
        .workers(0)
        .build()
        .unwrap();
    let cfg = RpcConfig {
        failure_timeout_ms: 600_000,
        ..RpcConfig::default()
    };
    let mut rpc: Rpc<UdpTransport, App> = Rpc::builder(
        &nexus,
        UdpTransport::new(&UdpConfig::loopback()).unwrap(),
        erpc::host_allocator(2 << 20, test_allocator_region()).unwrap(),
    )
    .config(cfg)
    .session_handler(on_session::<UdpTransport>)
    .build()
    .unwrap();
    let mut app = App::default();
    for round in 0..2 {
        // The second round hits the link's negative answer.
        let sn = rpc
            .create_session("no-such-host.invalid:31850", 0)
            .expect("a well-formed URI is accepted");
        let req = rpc.alloc_msg_buffer(8).unwrap();
        let resp = rpc.alloc_msg_buffer(8).unwrap();
        rpc.enqueue_request(sn, 1, req, resp, cont::<UdpTransport>, 0)
            .unwrap();
        let t0 = Instant::now();
        while app.events.len() <= round {
            rpc.run_event_loop_once(&mut app);
            // Not a bound on the outcome: only a guard against a hang (the
            // failure timeout is ten minutes).
            assert!(t0.elapsed() < Duration::from_secs(300), "no session event");
        }
        let ev = app.events[round];
        assert_eq!(ev.session, sn);
        assert_eq!(
            ev.kind,
            SessionEventKind::Ended(erpc::SessionEnd::HostNotFound),
            "round {round}"
        );
        assert!(ev.kind.to_string().contains("does not resolve"));
        while app.failed.len() <= round {
            rpc.run_event_loop_once(&mut app);
        }
        assert_eq!(
            app.failed[round],
            RpcError::SessionEnded {
                session: sn,
                why: erpc::SessionEnd::HostNotFound
            }
        );
        assert_eq!(rpc.num_sessions(), 0);
    }
    assert_eq!(rpc.stats().sm_unresolved, 2);
    assert!(link.stats().lookup_failures >= 1);
}

fn test_allocator_region() -> mempool::RegionOptions {
    mempool::RegionOptions {
        fallback: mempool::Fallback::SmallPages,
        ..Default::default()
    }
}

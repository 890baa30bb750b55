//! Hello, eRPC: a client and a server Rpc, each in its own Nexus.
//!
//! ```sh
//! cargo run -p erpc --example hello_world          # the device model: two software ConnectX NICs
//! cargo run -p erpc --example hello_world -- sim   # eRPC's own simulated network
//! cargo run -p erpc --example hello_world -- udp   # kernel UDP on 127.0.0.1
//! ```
//!
//! On the device model the mlx5 driver brings up two simulated ConnectX
//! NICs on one fabric, and each Rpc talks through the mlx5 raw-Ethernet
//! transport (striding RQ, overrunning RX CQ, unsignaled TX) exactly as it
//! would on real hardware bound to vfio-pci.
//!
//! The application code (`hello_handler`, `on_reply`, `on_session`,
//! `say_hello`) is generic over the transport; only the setup differs.

use std::sync::Arc;
use std::time::Duration;

use erpc::sim::{SimConfig, SimNet, SimTransport, test_allocator};
use erpc::{Completion, Nexus, NexusBuilder, Request, Rpc, RpcConfig, SessionEvent};
use transport::Transport;
use transport::udp::{UdpConfig, UdpTransport};

const REQ_HELLO: u8 = 1;

/// The application's per-Rpc state, passed `&mut` to handlers and
/// continuations by the event loop.
#[derive(Default)]
struct App {
    reply: Option<String>,
    connected: bool,
}

/// Server: runs in the event loop and reads the request in place.
fn hello_handler<T: Transport>(rpc: &mut Rpc<T, App>, _app: &mut App, req: Request<'_>) {
    let name = String::from_utf8_lossy(req.data).into_owned();
    let reply = format!("hello, {name}!");
    // Small responses use the slot's preallocated buffer: no allocation.
    rpc.respond(req.handle, reply.as_bytes()).expect("respond");
}

/// Client: the request and response buffers come back here.
fn on_reply<T: Transport>(rpc: &mut Rpc<T, App>, app: &mut App, c: Completion) {
    c.result.expect("request failed");
    app.reply = Some(String::from_utf8_lossy(c.resp.data()).into_owned());
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

fn on_session<T: Transport>(_rpc: &mut Rpc<T, App>, app: &mut App, ev: SessionEvent) {
    println!("session {}: {:?}", ev.session, ev.kind);
    app.connected = true;
}

fn with_handlers<T: Transport + 'static>(b: NexusBuilder) -> NexusBuilder {
    b.handler::<T, App>(REQ_HELLO, hello_handler::<T>)
}

/// Connects `client` to the server and enqueues one request; the reply
/// arrives in `App::reply`.
fn say_hello<T: Transport + 'static>(client: &mut Rpc<T, App>, server_uri: &str) {
    let session = client.create_session(server_uri, 0).expect("session");
    let name = b"eRPC";
    let mut req = client.alloc_msg_buffer(name.len()).expect("alloc");
    req.data_mut().copy_from_slice(name);
    let resp = client.alloc_msg_buffer(64).expect("alloc");
    // Requests may be enqueued before the session is up: they wait for it.
    client
        .enqueue_request(session, REQ_HELLO, req, resp, on_reply::<T>, 0)
        .expect("enqueue");
}

fn device_model() {
    use mempool::{Allocator, AllocatorConfig, Fallback, RegionOptions};
    use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
    use transport::mlx5::{Mlx5Config, Mlx5Transport};

    let region = RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    };
    let fabric = Fabric::new(FabricConfig::default());
    let net = SimNet::new(SimConfig::default()); // session management + clock
    let nexus = |uri: &str| -> Arc<Nexus> {
        with_handlers::<Mlx5Transport<SimBackend>>(Nexus::builder(uri))
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .build()
            .expect("nexus")
    };
    let (sn, cn) = (nexus("server:31850"), nexus("client:31851"));
    let rpc = |n: &Arc<Nexus>, i: u8| {
        let nic = SimNic::new(
            &fabric,
            NicConfig {
                mac: [2, 0, 0, 0, 0, i],
                ..Default::default()
            },
        );
        let dev = mlx5::Device::open(
            nic.backend(),
            mlx5::DeviceConfig {
                region,
                ..Default::default()
            },
        )
        .expect("driver bring-up");
        println!(
            "{}: firmware {:?}, MAC {:02x?}",
            dev.info().name,
            dev.info().fw_version,
            dev.info().mac
        );
        let cfg = Mlx5Config::new(
            std::net::Ipv4Addr::new(10, 0, 0, i),
            mlx5::QueueConfig {
                udp_port: 31850 + u16::from(i),
                ..Default::default()
            },
        );
        let t = Mlx5Transport::new(&dev, cfg).expect("mlx5 transport");
        let alloc = Allocator::new(
            dev.dma_mapper(),
            AllocatorConfig {
                region,
                ..Default::default()
            },
        )
        .expect("allocator");
        Rpc::new(
            n,
            0,
            t,
            alloc,
            RpcConfig::default(),
            Some(on_session::<Mlx5Transport<SimBackend>>),
        )
        .expect("rpc")
    };
    let (mut server, mut client) = (rpc(&sn, 1), rpc(&cn, 2));
    let (mut s_app, mut c_app) = (App::default(), App::default());
    say_hello(&mut client, "server:31850");
    for _ in 0..100_000 {
        if c_app.reply.is_some() {
            break;
        }
        client.run_event_loop_once(&mut c_app);
        server.run_event_loop_once(&mut s_app);
        net.advance(1_000); // 1 µs of simulated time, on both clocks
        fabric.advance(Duration::from_micros(1));
    }
    finish(c_app, &format!("simulated time {} µs", net.now_ns() / 1000));
}

fn simulated() {
    let net = SimNet::new(SimConfig::default());
    let nexus = |uri: &str| -> Arc<Nexus> {
        with_handlers::<SimTransport>(Nexus::builder(uri))
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .build()
            .expect("nexus")
    };
    let (sn, cn) = (nexus("server:31850"), nexus("client:31851"));
    let rpc = |n: &Arc<Nexus>| {
        Rpc::new(
            n,
            0,
            net.add_transport(),
            test_allocator(8 << 20),
            RpcConfig::default(),
            Some(on_session::<SimTransport>),
        )
        .expect("rpc")
    };
    let (mut server, mut client) = (rpc(&sn), rpc(&cn));
    let (mut s_app, mut c_app) = (App::default(), App::default());
    say_hello(&mut client, "server:31850");
    for _ in 0..100_000 {
        if c_app.reply.is_some() {
            break;
        }
        client.run_event_loop_once(&mut c_app);
        server.run_event_loop_once(&mut s_app);
        net.advance(1_000); // 1 µs of simulated time
    }
    finish(c_app, &format!("simulated time {} µs", net.now_ns() / 1000));
}

fn udp() {
    let free_port = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("free port")
            .port()
    };
    let (su, cu) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let nexus = |uri: &str| {
        with_handlers::<UdpTransport>(Nexus::builder(uri))
            .build()
            .expect("nexus")
    };
    let (sn, cn) = (nexus(&su), nexus(&cu));
    let rpc = |n: &Arc<Nexus>| {
        let t = UdpTransport::new(&UdpConfig::loopback()).expect("udp transport");
        Rpc::new(
            n,
            0,
            t,
            test_allocator(8 << 20),
            RpcConfig::default(),
            Some(on_session::<UdpTransport>),
        )
        .expect("rpc")
    };
    let (mut server, mut client) = (rpc(&sn), rpc(&cn));
    let (mut s_app, mut c_app) = (App::default(), App::default());
    say_hello(&mut client, &su);
    let t0 = std::time::Instant::now();
    while c_app.reply.is_none() && t0.elapsed() < Duration::from_secs(5) {
        client.run_event_loop_once(&mut c_app);
        server.run_event_loop_once(&mut s_app);
    }
    finish(
        c_app,
        &format!("{} µs of real time", t0.elapsed().as_micros()),
    );
}

fn finish(app: App, note: &str) {
    let reply = app.reply.expect("no reply");
    println!("{reply}  ({note})");
    assert!(app.connected);
    assert_eq!(reply, "hello, eRPC!");
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        None | Some("device-model") => device_model(),
        Some("sim") => simulated(),
        Some("udp") => udp(),
        Some(other) => {
            eprintln!("unknown mode {other:?}: use `device-model` (default), `sim` or `udp`")
        }
    }
}

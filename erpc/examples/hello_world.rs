//! Hello, eRPC: a client and a server Rpc, each in its own Nexus.
//!
//! ```sh
//! cargo run -p erpc --example hello_world          # the device model: two software ConnectX NICs
//! cargo run -p erpc --example hello_world -- sim   # eRPC's own simulated network
//! cargo run -p erpc --example hello_world -- udp   # kernel UDP on 127.0.0.1
//! RUST_LOG=debug cargo run -p erpc --example hello_world   # with the stack's log events
//! ```
//!
//! On the device model the mlx5 driver brings up two simulated ConnectX
//! NICs on one fabric, and each Rpc talks through the mlx5 raw-Ethernet
//! transport (striding RQ, overrunning RX CQ, unsignaled TX) exactly as it
//! would on real hardware bound to vfio-pci.
//!
//! The application code (`hello_handler`, `on_reply`, `on_session`,
//! `say_hello`) is generic over the transport; only the setup differs.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use erpc::{Completion, Nexus, NexusBuilder, Request, Rpc, SessionEvent, SessionEventKind};
use erpc_sim::{SimConfig, SimNet, SimTransport, sim_allocator};
use mempool::{Fallback, RegionOptions};
use transport::Transport;
use transport::udp::{UdpConfig, UdpTransport};

const REQ_HELLO: u8 = 1;
/// Message-buffer memory per Rpc.
const RPC_BYTES: usize = 8 << 20;
/// 2 MiB hugepages the example needs: two Rpcs' buffers, and on the
/// device model the two NICs' queues.
const HUGEPAGES: u64 = 16;

const USAGE: &str = "usage: hello_world [device-model | sim | udp]
  device-model  two software ConnectX NICs brought up by the mlx5 driver (default)
  sim           eRPC's own simulated network
  udp           kernel UDP on 127.0.0.1";

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The application's per-Rpc state, passed `&mut` to handlers and
/// continuations by the event loop.
#[derive(Default)]
struct App {
    reply: Option<String>,
    connected: bool,
    error: Option<String>,
}

/// Server: runs in the event loop and reads the request in place.
fn hello_handler<T: Transport>(rpc: &mut Rpc<T, App>, app: &mut App, req: Request<'_>) {
    let name = String::from_utf8_lossy(req.data).into_owned();
    let reply = format!("hello, {name}!");
    // Small responses use the slot's preallocated buffer: no allocation.
    if let Err(e) = rpc.respond(req.handle, reply.as_bytes()) {
        app.error = Some(format!("server: cannot respond: {e}"));
    }
}

/// Client: the request and response buffers come back here.
fn on_reply<T: Transport>(rpc: &mut Rpc<T, App>, app: &mut App, c: Completion) {
    match c.result {
        Ok(()) => app.reply = Some(String::from_utf8_lossy(c.resp.data()).into_owned()),
        Err(e) => app.error = Some(format!("request failed: {e}")),
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

fn on_session<T: Transport>(_rpc: &mut Rpc<T, App>, app: &mut App, ev: SessionEvent) {
    match ev.kind {
        SessionEventKind::Connected => {
            println!("session {}: connected", ev.session);
            app.connected = true;
        }
        SessionEventKind::Disconnected => println!("session {}: disconnected", ev.session),
        other => app.error = Some(format!("session {}: {other}", ev.session)),
    }
}

fn with_handlers<T: Transport + 'static>(b: NexusBuilder) -> NexusBuilder {
    b.handler::<T, App>(REQ_HELLO, hello_handler::<T>)
}

/// Connects `client` to the server and enqueues one request; the reply
/// arrives in `App::reply`.
fn say_hello<T: Transport + 'static>(client: &mut Rpc<T, App>, server_uri: &str) -> Result<()> {
    let session = client.create_session(server_uri, 0)?;
    let name = b"eRPC";
    let mut req = client.alloc_msg_buffer(name.len())?;
    req.data_mut().copy_from_slice(name);
    let resp = client.alloc_msg_buffer(64)?;
    // Requests may be enqueued before the session is up: they wait for it.
    client.enqueue_request(session, REQ_HELLO, req, resp, on_reply::<T>, 0)?;
    Ok(())
}

/// Hugepages if enough are free; otherwise 4 KiB pages, said once.
fn memory() -> RegionOptions {
    let fallback = if mempool::hugepages_available(HUGEPAGES) {
        Fallback::Never
    } else {
        let info = mempool::meminfo::HugepageInfo::read().unwrap_or_default();
        eprintln!(
            "note: hello_world needs {HUGEPAGES} free 2 MiB hugepages and {} are free; \
             using 4 KiB pages (reserve them with `{}`)",
            info.available(),
            mempool::meminfo::reserve_command(&info, HUGEPAGES)
        );
        Fallback::SmallPages
    };
    RegionOptions {
        fallback,
        ..Default::default()
    }
}

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn device_model(region: RegionOptions) -> Result<()> {
    use mempool::{Allocator, AllocatorConfig};
    use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
    use transport::mlx5::{Mlx5Config, Mlx5Transport};

    let fabric = Fabric::new(FabricConfig::default());
    let net = SimNet::new(SimConfig::default()); // session management + clock
    let nexus = |uri: &str| {
        with_handlers::<Mlx5Transport<SimBackend>>(Nexus::builder(uri))
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .build()
    };
    let (sn, cn) = (nexus("server:31850")?, nexus("client:31851")?);
    let rpc = |n: &Arc<Nexus>, i: u8| -> Result<Rpc<Mlx5Transport<SimBackend>, App>> {
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
        )?;
        let (major, minor, sub) = dev.info().fw_version;
        println!(
            "NIC {i}: firmware {major}.{minor}.{sub}, MAC {}",
            mac(dev.info().mac)
        );
        let cfg = Mlx5Config::new(
            std::net::Ipv4Addr::new(10, 0, 0, i),
            mlx5::QueueConfig {
                udp_port: 31850 + u16::from(i),
                ..Default::default()
            },
        );
        let t = Mlx5Transport::new(&dev, cfg)?;
        let alloc = Allocator::new(
            dev.dma_mapper(),
            AllocatorConfig {
                initial_bytes: RPC_BYTES,
                region,
                ..Default::default()
            },
        )?;
        Ok(Rpc::builder(n, t, alloc)
            .session_handler(on_session::<Mlx5Transport<SimBackend>>)
            .build()?)
    };
    let (mut server, mut client) = (rpc(&sn, 1)?, rpc(&cn, 2)?);
    let (mut s_app, mut c_app) = (App::default(), App::default());
    say_hello(&mut client, "server:31850")?;
    for _ in 0..100_000 {
        if c_app.reply.is_some() || c_app.error.is_some() || s_app.error.is_some() {
            break;
        }
        client.run_event_loop_once(&mut c_app);
        server.run_event_loop_once(&mut s_app);
        net.advance(1_000); // 1 µs of simulated time, on both clocks
        fabric.advance(Duration::from_micros(1));
    }
    finish(
        c_app,
        s_app,
        &format!("simulated time {} µs", net.now_ns() / 1000),
    )
}

fn simulated(region: RegionOptions) -> Result<()> {
    let net = SimNet::new(SimConfig::default());
    let nexus = |uri: &str| {
        with_handlers::<SimTransport>(Nexus::builder(uri))
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .build()
    };
    let (sn, cn) = (nexus("server:31850")?, nexus("client:31851")?);
    let rpc = |n: &Arc<Nexus>| -> Result<Rpc<SimTransport, App>> {
        Ok(
            Rpc::builder(n, net.add_transport(), sim_allocator(RPC_BYTES, region)?)
                .session_handler(on_session::<SimTransport>)
                .build()?,
        )
    };
    let (mut server, mut client) = (rpc(&sn)?, rpc(&cn)?);
    let (mut s_app, mut c_app) = (App::default(), App::default());
    say_hello(&mut client, "server:31850")?;
    for _ in 0..100_000 {
        if c_app.reply.is_some() || c_app.error.is_some() || s_app.error.is_some() {
            break;
        }
        client.run_event_loop_once(&mut c_app);
        server.run_event_loop_once(&mut s_app);
        net.advance(1_000); // 1 µs of simulated time
    }
    finish(
        c_app,
        s_app,
        &format!("simulated time {} µs", net.now_ns() / 1000),
    )
}

fn udp(region: RegionOptions) -> Result<()> {
    let free_port = || -> Result<u16> {
        Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let (su, cu) = (
        format!("127.0.0.1:{}", free_port()?),
        format!("127.0.0.1:{}", free_port()?),
    );
    let nexus = |uri: &str| with_handlers::<UdpTransport>(Nexus::builder(uri)).build();
    let (sn, cn) = (nexus(&su)?, nexus(&cu)?);
    let rpc = |n: &Arc<Nexus>| -> Result<Rpc<UdpTransport, App>> {
        let t = UdpTransport::new(&UdpConfig::loopback())?;
        Ok(Rpc::builder(n, t, erpc::host_allocator(RPC_BYTES, region)?)
            .session_handler(on_session::<UdpTransport>)
            .build()?)
    };
    let (mut server, mut client) = (rpc(&sn)?, rpc(&cn)?);
    let (mut s_app, mut c_app) = (App::default(), App::default());
    say_hello(&mut client, &su)?;
    let t0 = std::time::Instant::now();
    while c_app.reply.is_none() && c_app.error.is_none() && s_app.error.is_none() {
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("no reply within 10 s over loopback UDP".into());
        }
        client.run_event_loop_once(&mut c_app);
        server.run_event_loop_once(&mut s_app);
    }
    finish(
        c_app,
        s_app,
        &format!("{} µs of real time", t0.elapsed().as_micros()),
    )
}

fn finish(client: App, server: App, note: &str) -> Result<()> {
    if let Some(e) = client.error.or(server.error) {
        return Err(e.into());
    }
    let reply = client
        .reply
        .ok_or("no reply (the simulation ran out of steps)")?;
    if !client.connected {
        return Err("a reply without a connected session".into());
    }
    println!("{reply}  ({note})");
    Ok(())
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match args.as_slice() {
        [] => "device-model",
        [m] if ["device-model", "sim", "udp"].contains(&m.as_str()) => m.as_str(),
        [h] if h == "-h" || h == "--help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("hello_world: unknown arguments {args:?}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let region = memory();
    let run = match mode {
        "sim" => simulated(region),
        "udp" => udp(region),
        _ => device_model(region),
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello_world: {e}");
            ExitCode::FAILURE
        }
    }
}

//! A typed key-value service and an `async` client as two processes over
//! kernel UDP: `erpc/examples/two_process.rs` on the typed API.
//!
//! ```sh
//! cargo build -p erpc-typed --example typed_kv
//! target/debug/examples/typed_kv server 127.0.0.1:31850 &
//! target/debug/examples/typed_kv client 127.0.0.1:31850            # 2 000 keys, 8 calls in flight
//! target/debug/examples/typed_kv client 127.0.0.1:31850 --keys 100 --window 2
//! ```
//!
//! The server answers `Put`, `Get` and `Exit`, each a serde request type
//! with its response type, with closures over its map. The client starts
//! one future per key (`Put`, then `Get` of the same key, checking the
//! value) and awaits them all with `join_all`: the endpoint keeps
//! `--window` calls per session in flight and queues the rest. Then it
//! asks the server for the number of requests it served (`Exit`, which
//! also ends the server) and checks it. Message buffers come from
//! `erpc::host_allocator`. The client exits 0 only if every answer was
//! right.

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use erpc::Nexus;
use erpc_typed::{Ctx, Endpoint, EndpointConfig, Method, Service};
use mempool::{Fallback, RegionOptions};
use serde::{Deserialize, Serialize};
use transport::udp::{UdpConfig, UdpTransport};

/// Stores `value` under `key`.
#[derive(Serialize, Deserialize)]
struct Put {
    key: u64,
    value: String,
}

#[derive(Serialize, Deserialize)]
struct PutReply {
    replaced: bool,
}

impl Method for Put {
    const REQ_TYPE: u8 = 1;
    type Resp = PutReply;
}

/// The value under a key, if any.
#[derive(Serialize, Deserialize)]
struct Get(u64);

impl Method for Get {
    const REQ_TYPE: u8 = 2;
    type Resp = Option<String>;
}

/// Ends the server; answered with the number of `Put`s and `Get`s it
/// served.
#[derive(Serialize, Deserialize)]
struct Exit;

impl Method for Exit {
    const REQ_TYPE: u8 = 3;
    type Resp = u64;
}

const USAGE: &str = "usage:
  typed_kv server HOST:PORT
  typed_kv client SERVER_HOST:PORT [--keys N] [--window W]";

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The server's state, `&mut` in every handler.
#[derive(Default)]
struct Store {
    map: BTreeMap<u64, String>,
    served: u64,
    exit: bool,
}

fn service() -> Service<UdpTransport, Store> {
    Service::new()
        .handle(|ctx: &mut Ctx<'_, UdpTransport, Store>, p: Put| {
            ctx.served += 1;
            PutReply {
                replaced: ctx.map.insert(p.key, p.value).is_some(),
            }
        })
        .handle(|ctx, g: Get| {
            ctx.served += 1;
            ctx.map.get(&g.0).cloned()
        })
        .handle(|ctx, _: Exit| {
            ctx.exit = true;
            ctx.served
        })
}

/// An endpoint at `uri` with `svc`'s handlers: hugepages if enough are
/// free, otherwise 4 KiB pages (said once).
fn endpoint(
    uri: &str,
    svc: &Service<UdpTransport, Store>,
    cfg: EndpointConfig,
) -> Result<Endpoint<UdpTransport, Store>> {
    let nexus = svc.register(Nexus::builder(uri)).build()?;
    let transport = UdpTransport::new(&UdpConfig::loopback())?;
    let fallback = if mempool::hugepages_available(12) {
        Fallback::Never
    } else {
        eprintln!("note: fewer than 12 free 2 MiB hugepages; using 4 KiB pages");
        Fallback::SmallPages
    };
    let region = RegionOptions {
        fallback,
        ..RegionOptions::default()
    };
    let alloc = erpc::host_allocator(8 << 20, region)?;
    Ok(Endpoint::new(
        &nexus,
        0,
        transport,
        alloc,
        cfg,
        svc,
        Store::default(),
    )?)
}

fn server(uri: &str) -> Result<()> {
    let svc = service();
    let mut server = endpoint(uri, &svc, EndpointConfig::default())?;
    // The line a supervisor (or the test) waits for.
    println!("server: listening on {uri}");
    while !server.app().exit {
        server.run_once();
    }
    // Let the answer to Exit go out (and be retransmitted if it is lost)
    // before the process ends.
    let t0 = Instant::now();
    while t0.elapsed().as_millis() < 200 {
        server.run_once();
    }
    println!("server: served {} requests; exiting", server.app().served);
    Ok(())
}

/// Key `k`'s value: long enough to be more than a few bytes, and
/// different for every key.
fn value(k: u64) -> String {
    format!("value of key {k}: {}", "x".repeat((k % 64) as usize))
}

fn client(uri: &str, keys: u64, window: usize) -> Result<bool> {
    let cfg = EndpointConfig {
        max_in_flight: window,
        ..EndpointConfig::default()
    };
    // A pure client (no handlers), its Nexus on a free port.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut client = endpoint(&format!("127.0.0.1:{port}"), &Service::new(), cfg)?;
    let api = client.client();
    let (wrong, served) = client.block_on(async move {
        let s = api.connect(uri, 0).await?;
        // One future per key; join_all polls them all at once, and the
        // endpoint keeps `window` calls in flight and queues the rest.
        let calls = (0..keys).map(|k| {
            let api = api.clone();
            async move {
                let put = api
                    .call(
                        s,
                        Put {
                            key: k,
                            value: value(k),
                        },
                    )
                    .await?;
                let got = api.call(s, Get(k)).await?;
                Ok::<bool, erpc_typed::CallError>(!put.replaced && got == Some(value(k)))
            }
        });
        let mut wrong = 0u64;
        for r in futures_util::future::join_all(calls).await {
            if !r? {
                wrong += 1;
            }
        }
        let served = api.call(s, Exit).await?;
        Ok::<_, Box<dyn Error>>((wrong, served))
    })?;
    println!(
        "client: {keys} puts and {keys} gets, {} answers right, {window} in flight; the server served {served}",
        2 * (keys - wrong)
    );
    Ok(wrong == 0 && served == 2 * keys)
}

/// The parsed command line, or the reason it is wrong.
enum Cmd {
    Server(String),
    Client(String, u64, usize),
}

fn parse(args: &[String]) -> std::result::Result<Cmd, String> {
    match args {
        [cmd, uri] if cmd == "server" => Ok(Cmd::Server(uri.clone())),
        [cmd, uri, rest @ ..] if cmd == "client" => {
            let (mut keys, mut window) = (2_000u64, erpc::SESSION_REQ_WINDOW);
            let mut it = rest.iter();
            while let Some(opt) = it.next() {
                let v = it.next().ok_or(format!("{opt} needs a value"))?;
                match opt.as_str() {
                    "--keys" => keys = v.parse().map_err(|e| format!("--keys {v}: {e}"))?,
                    "--window" => {
                        window = v.parse().map_err(|e| format!("--window {v}: {e}"))?;
                        if window == 0 {
                            return Err("--window 0: at least one call must be in flight".into());
                        }
                    }
                    _ => return Err(format!("unknown option {opt}")),
                }
            }
            Ok(Cmd::Client(uri.clone(), keys, window))
        }
        _ => Err("expected `server URI` or `client URI [options]`".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("typed_kv: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let r = match cmd {
        Cmd::Server(uri) => server(&uri).map(|()| true),
        Cmd::Client(uri, keys, window) => client(&uri, keys, window),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("typed_kv: some answers were wrong");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("typed_kv: {e}");
            ExitCode::FAILURE
        }
    }
}

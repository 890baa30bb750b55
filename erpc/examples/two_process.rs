//! A server and a client as two processes over kernel UDP: what a new
//! user's first real program looks like.
//!
//! ```sh
//! cargo build -p erpc --example two_process
//! target/debug/examples/two_process server 127.0.0.1:31850 &
//! target/debug/examples/two_process client 127.0.0.1:31850     # 10 000 requests of 4 KiB, 8 in flight
//! target/debug/examples/two_process client 127.0.0.1:31850 --requests 500 --size 100 --window 4
//! ```
//!
//! The server answers each request with its bytes XORed with 0xA5; the
//! client checks every byte of every response, keeps `--window` requests
//! in flight (the session's 8 slots by default), and when done tells the
//! server to exit (request type 2). Message buffers come from
//! `erpc::host_allocator` (hugepages if enough are free, else 4 KiB pages,
//! said once). The client exits 0 only if every response came back and
//! was right.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use erpc::{Completion, Nexus, Request, Rpc};
use mempool::{Fallback, RegionOptions};
use transport::udp::{UdpConfig, UdpTransport};

const REQ_ECHO: u8 = 1;
const REQ_EXIT: u8 = 2;

const USAGE: &str = "usage:
  two_process server HOST:PORT
  two_process client SERVER_HOST:PORT [--requests N] [--size BYTES] [--window W]";

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Hugepages if enough are free (`pages`); otherwise 4 KiB pages, said
/// once.
fn region(pages: u64) -> RegionOptions {
    let fallback = if mempool::hugepages_available(pages) {
        Fallback::Never
    } else {
        eprintln!("note: fewer than {pages} free 2 MiB hugepages; using 4 KiB pages");
        Fallback::SmallPages
    };
    RegionOptions {
        fallback,
        ..Default::default()
    }
}

// ------------------------------------------------------------- server

#[derive(Default)]
struct Server {
    served: u64,
    exit: bool,
}

fn on_echo(rpc: &mut Rpc<UdpTransport, Server>, s: &mut Server, req: Request<'_>) {
    let mut m = match rpc.response_buffer(&req.handle, req.data.len()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("server: no buffer for a response: {e}");
            return;
        }
    };
    for (o, i) in m.data_mut().iter_mut().zip(req.data) {
        *o = i ^ 0xa5;
    }
    if rpc.enqueue_response(req.handle, m).is_ok() {
        s.served += 1;
    }
}

fn on_exit(rpc: &mut Rpc<UdpTransport, Server>, s: &mut Server, req: Request<'_>) {
    let _ = rpc.respond(req.handle, &[]);
    s.exit = true;
}

fn server(uri: &str) -> Result<()> {
    let nexus = Nexus::builder(uri)
        .handler::<UdpTransport, Server>(REQ_ECHO, on_echo)
        .handler::<UdpTransport, Server>(REQ_EXIT, on_exit)
        .build()?;
    let t = UdpTransport::new(&UdpConfig::loopback())?;
    let alloc = erpc::host_allocator(32 << 20, region(20))?;
    let mut rpc = Rpc::builder(&nexus, t, alloc).build()?;
    let mut s = Server::default();
    // The line a supervisor (or the test) waits for.
    println!("server: listening on {uri}");
    while !s.exit {
        rpc.run_event_loop_once(&mut s);
    }
    // Let the exit request's response go out (and be retransmitted if it
    // is lost) before the process ends.
    let t0 = Instant::now();
    while t0.elapsed().as_millis() < 200 {
        rpc.run_event_loop_once(&mut s);
    }
    println!("server: served {} requests; exiting", s.served);
    Ok(())
}

// ------------------------------------------------------------- client

struct Client {
    session: u16,
    size: usize,
    /// Requests still to send, and sent so far.
    left: u64,
    sent: u64,
    in_flight: usize,
    checked: u64,
    wrong: u64,
    failed: Vec<String>,
}

/// The byte `i` of request `seq`.
fn pattern(seq: u64, i: usize) -> u8 {
    (seq as u8).wrapping_mul(31) ^ (i as u8).wrapping_mul(7) ^ ((i >> 8) as u8)
}

fn fill(m: &mut erpc::MsgBuf, seq: u64) {
    let d = m.data_mut();
    d[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in d.iter_mut().enumerate().skip(8) {
        *b = pattern(seq, i);
    }
}

fn on_reply(rpc: &mut Rpc<UdpTransport, Client>, c: &mut Client, comp: Completion) {
    c.in_flight -= 1;
    match comp.result {
        Ok(()) => {
            let (q, r) = (comp.req.data(), comp.resp.data());
            if r.len() == q.len() && q.iter().zip(r).all(|(a, b)| a ^ 0xa5 == *b) {
                c.checked += 1;
            } else {
                c.wrong += 1;
            }
        }
        Err(e) => c.failed.push(e.to_string()),
    }
    // The same buffers carry the next request.
    if c.left > 0 && c.failed.is_empty() {
        let mut req = comp.req;
        fill(&mut req, c.sent);
        match rpc.enqueue_request(c.session, REQ_ECHO, req, comp.resp, on_reply, 0) {
            Ok(()) => {
                c.left -= 1;
                c.sent += 1;
                c.in_flight += 1;
            }
            Err(e) => {
                c.failed.push(e.to_string());
                rpc.free_msg_buffer(e.req);
                rpc.free_msg_buffer(e.resp);
            }
        }
    } else {
        rpc.free_msg_buffer(comp.req);
        rpc.free_msg_buffer(comp.resp);
    }
}

fn on_exit_reply(rpc: &mut Rpc<UdpTransport, Client>, c: &mut Client, comp: Completion) {
    c.in_flight -= 1;
    if let Err(e) = comp.result {
        c.failed.push(format!("exit request: {e}"));
    }
    rpc.free_msg_buffer(comp.req);
    rpc.free_msg_buffer(comp.resp);
}

fn client(server_uri: &str, requests: u64, size: usize, window: usize) -> Result<()> {
    // Our own Nexus needs a UDP port of its own for session management.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let nexus = Nexus::builder(&format!("127.0.0.1:{port}")).build()?;
    let t = UdpTransport::new(&UdpConfig::loopback())?;
    let alloc = erpc::host_allocator(32 << 20, region(20))?;
    let mut rpc = Rpc::builder(&nexus, t, alloc).build()?;
    let session = rpc.create_session(server_uri, 0)?;
    let mut c = Client {
        session,
        size,
        left: requests,
        sent: 0,
        in_flight: 0,
        checked: 0,
        wrong: 0,
        failed: Vec::new(),
    };
    // The window: requests wait for the session to connect.
    let t0 = Instant::now();
    for _ in 0..window.min(requests as usize) {
        let mut req = rpc.alloc_msg_buffer(c.size)?;
        fill(&mut req, c.sent);
        let resp = rpc.alloc_msg_buffer(c.size)?;
        rpc.enqueue_request(session, REQ_ECHO, req, resp, on_reply, 0)?;
        c.left -= 1;
        c.sent += 1;
        c.in_flight += 1;
    }
    while c.in_flight > 0 {
        rpc.run_event_loop_once(&mut c);
    }
    let secs = t0.elapsed().as_secs_f64();
    // Tell the server to exit.
    let req = rpc.alloc_msg_buffer(0)?;
    let resp = rpc.alloc_msg_buffer(0)?;
    rpc.enqueue_request(session, REQ_EXIT, req, resp, on_exit_reply, 0)?;
    c.in_flight += 1;
    while c.in_flight > 0 {
        rpc.run_event_loop_once(&mut c);
    }
    if let Some(e) = c.failed.first() {
        return Err(format!("{} requests failed; the first: {e}", c.failed.len()).into());
    }
    if c.wrong > 0 || c.checked != requests {
        return Err(format!(
            "{} of {requests} responses checked, {} wrong",
            c.checked, c.wrong
        )
        .into());
    }
    println!(
        "client: {} responses of {size} bytes checked, {window} in flight, in {:.2} s ({:.0} requests/s)",
        c.checked,
        secs,
        c.checked as f64 / secs
    );
    Ok(())
}

fn parse_client(args: &[String]) -> std::result::Result<(String, u64, usize, usize), String> {
    let mut it = args.iter();
    let uri = it
        .next()
        .ok_or("client: the server's HOST:PORT is missing")?;
    let (mut requests, mut size, mut window) = (10_000u64, 4096usize, erpc::SESSION_REQ_WINDOW);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag}: value missing"))?;
        let bad = |what: &str| format!("{flag} {v}: {what}");
        match flag.as_str() {
            "--requests" => requests = v.parse().map_err(|_| bad("not a number"))?,
            "--size" => {
                size = v.parse().map_err(|_| bad("not a number"))?;
                if !(8..=erpc::MAX_MSG_BYTES).contains(&size) {
                    return Err(bad(&format!("must be 8 to {}", erpc::MAX_MSG_BYTES)));
                }
            }
            "--window" => {
                window = v.parse().map_err(|_| bad("not a number"))?;
                if window == 0 {
                    return Err(bad("must be at least 1"));
                }
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok((uri.clone(), requests, size, window))
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = match args.first().map(String::as_str) {
        Some("server") if args.len() == 2 => server(&args[1]),
        Some("client") => match parse_client(&args[1..]) {
            Ok((uri, n, size, window)) => client(&uri, n, size, window),
            Err(e) => {
                eprintln!("two_process: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("two_process: unknown arguments {args:?}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("two_process: {e}");
            ExitCode::FAILURE
        }
    }
}

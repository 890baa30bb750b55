//! gRPC against eRPC, as a user would pick them (issue 16, item 5): unary
//! calls with 32-byte requests and responses on loopback, tonic (HTTP/2 over
//! TCP) against eRPC over the kernel-UDP transport, measured in one run.
//!
//! ```sh
//! cd tools/grpc-bench && cargo run --release -- --secs 2 --rounds 3
//! ```
//!
//! * **tonic**: a server on its own thread (tokio current-thread runtime),
//!   a client on another (current-thread runtime) with `--inflight`
//!   calls outstanding at a time (1: one call after the other). Messages
//!   are a protobuf `bytes` field of 32 bytes, encoded with prost through
//!   tonic's `ProstCodec`; the service is written out by hand (no build
//!   script, no `protoc`).
//! * **eRPC**: `erpc_tools::bench::udp_erpc`, the `erpc-bench --transport
//!   udp` run: two Rpcs on one thread, each both client and server, one
//!   request of 32 bytes in flight per node; the rate counts both nodes'
//!   RPCs (so eRPC runs on one thread where tonic has two).
//!
//! Rounds are interleaved (tonic, eRPC, tonic, eRPC, ...); each figure is
//! the median over the rounds. Latency is per call, from issue to the
//! response in the client's hands.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use clap::Parser;
use erpc_tools::bench::{Point, Progress, udp_erpc};
use erpc_tools::memory::{MemoryPlan, bench_pages};
use hdrhistogram::Histogram;
use tonic::codec::ProstCodec;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// Request and response size, as in the issue.
const SIZE: usize = 32;
/// The one method of the benchmark service.
const PATH: &str = "/erpcbench.Echo/Call";

/// The message both ways: one `bytes` field.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
}

#[derive(Debug, Parser)]
#[command(about = "tonic unary against eRPC over kernel UDP (loopback, 32 B)")]
struct Args {
    /// Seconds measured per point.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Seconds of warm-up before each point.
    #[arg(long, default_value_t = 0.3)]
    warmup: f64,
    /// Interleaved rounds (medians are reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// tonic calls outstanding at a time.
    #[arg(long, default_value_t = 1)]
    inflight: usize,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// The server: answers `PATH` with the request's bytes; any other path
/// gets gRPC status UNIMPLEMENTED.
#[derive(Debug, Clone, Copy)]
struct EchoService;

impl tonic::server::NamedService for EchoService {
    const NAME: &'static str = "erpcbench.Echo";
}

/// The unary handler tonic's `Grpc::unary` drives.
struct Call;

impl tonic::server::UnaryService<Msg> for Call {
    type Response = Msg;
    type Future = BoxFuture<Response<Msg>, Status>;

    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        Box::pin(async move { Ok(Response::new(req.into_inner())) })
    }
}

impl<B> tower::Service<http::Request<B>> for EchoService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == PATH {
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
                Ok(grpc.unary(Call, req).await)
            })
        } else {
            Box::pin(async move {
                Ok(Status::unimplemented(format!("no method {}", req.uri().path())).into_http())
            })
        }
    }
}

/// One measured point.
#[derive(Debug, Clone, Copy)]
struct Row {
    /// Calls per second.
    rate: f64,
    /// Median and 99th percentile latency, µs.
    p50_us: f64,
    p99_us: f64,
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Starts the tonic server on its own thread; returns its address.
fn start_server() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    listener.set_nonblocking(true).expect("non-blocking");
    std::thread::Builder::new()
        .name("tonic-server".into())
        .spawn(move || {
            current_thread().block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let incoming = tokio_stream_incoming(listener);
                Server::builder()
                    .add_service(EchoService)
                    .serve_with_incoming(incoming)
                    .await
                    .expect("tonic server");
            })
        })
        .expect("server thread");
    addr
}

/// The accepted connections of `listener`, as the stream tonic serves.
fn tokio_stream_incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

/// `inflight` tonic calls outstanding at a time from one client thread, for
/// `warmup` then `dur`.
fn tonic_point(
    addr: std::net::SocketAddr,
    inflight: usize,
    dur: Duration,
    warmup: Duration,
) -> Row {
    current_thread().block_on(async move {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect");
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
        let start = Instant::now();
        let mut measured_from = None;
        let mut calls = 0u64;
        let mut tasks = tokio::task::JoinSet::new();
        let one = |channel: Channel| async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("ready");
            let t0 = Instant::now();
            let r = grpc
                .unary(
                    Request::new(Msg {
                        data: vec![0xab; SIZE],
                    }),
                    http::uri::PathAndQuery::from_static(PATH),
                    ProstCodec::<Msg, Msg>::default(),
                )
                .await
                .expect("call");
            assert_eq!(r.get_ref().data.len(), SIZE);
            t0.elapsed()
        };
        // The runtime has one thread: the tasks all run on this one.
        for _ in 0..inflight {
            tasks.spawn(one(channel.clone()));
        }
        while let Some(done) = tasks.join_next().await {
            let lat = done.expect("task");
            let now = start.elapsed();
            if now >= warmup {
                let from = *measured_from.get_or_insert(now);
                if now - from >= dur {
                    break;
                }
                calls += 1;
                hist.record(lat.as_nanos() as u64).expect("record");
            }
            tasks.spawn(one(channel.clone()));
        }
        tasks.abort_all();
        let secs = (start.elapsed() - measured_from.unwrap_or_default()).as_secs_f64();
        Row {
            rate: calls as f64 / secs,
            p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        }
    })
}

fn erpc_point(plan: &MemoryPlan, dur: Duration, warmup: Duration, progress: &Progress) -> Row {
    let p = Point {
        batch: 1,
        window: 1,
        size: SIZE,
        min_rpcs: 1,
    };
    let o = udp_erpc(plan, p, dur, warmup, progress, None, false).expect("eRPC over UDP");
    Row {
        rate: o.rpcs_per_sec,
        p50_us: o.latency_us.median,
        p99_us: o.latency_us.p99,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = Args::parse();
    assert!(
        a.rounds >= 1 && a.inflight >= 1,
        "--rounds and --inflight at least 1"
    );
    let dur = Duration::from_secs_f64(a.secs);
    let warmup = Duration::from_secs_f64(a.warmup);
    let plan = MemoryPlan::decide("grpc-bench", bench_pages(SIZE, 1, false));
    let progress = Progress::new();
    let addr = start_server();
    println!(
        "32-byte unary calls on loopback, {} s per point, {} interleaved rounds (medians)",
        a.secs, a.rounds
    );
    let (mut t, mut e) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        let tr = tonic_point(addr, a.inflight, dur, warmup);
        let er = erpc_point(&plan, dur, warmup, &progress);
        println!(
            "round {round}: tonic {:.0}/s p50 {:.1} µs p99 {:.1} µs | eRPC {:.0}/s p50 {:.1} µs p99 {:.1} µs",
            tr.rate, tr.p50_us, tr.p99_us, er.rate, er.p50_us, er.p99_us
        );
        t.push(tr);
        e.push(er);
    }
    let m = |v: &[Row], f: fn(&Row) -> f64| median(v.iter().map(f).collect());
    let (tr, tp50, tp99) = (m(&t, |r| r.rate), m(&t, |r| r.p50_us), m(&t, |r| r.p99_us));
    let (er, ep50, ep99) = (m(&e, |r| r.rate), m(&e, |r| r.p50_us), m(&e, |r| r.p99_us));
    println!("| path | calls/s | p50 (µs) | p99 (µs) |");
    println!("|---|---:|---:|---:|");
    println!(
        "| tonic unary, {} in flight, client + server thread | {tr:.0} | {tp50:.1} | {tp99:.1} |",
        a.inflight
    );
    println!(
        "| eRPC over UDP, 1 in flight per node, one thread | {er:.0} | {ep50:.1} | {ep99:.1} |"
    );
    println!(
        "eRPC / tonic: rate x{:.2}, p50 x{:.2}, p99 x{:.2}",
        er / tr,
        ep50 / tp50,
        ep99 / tp99
    );
}

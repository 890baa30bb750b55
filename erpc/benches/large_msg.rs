//! eRPC's own instructions per data packet for large messages, under
//! callgrind on the simulated network (`callgrind_large.sh` runs it).
//!
//! Two nodes, each with `WINDOW` requests of `SIZE` bytes in flight on its
//! session to the other; the handler answers with a response of the same
//! size. On a ConnectX the NIC moves the bytes by DMA, so what a core pays
//! per data packet is eRPC's work (headers, credits, RFRs, reassembly
//! copies) plus the driver's: this harness counts the first part, with the
//! simulated network (not eRPC) doing the wire.
//!
//! ```sh
//! valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.out \
//!   target/release/deps/large_msg-* callgrind RPCS SIZE
//! erpc/benches/callgrind_large.sh        # per data packet, two sizes
//! ```

use erpc::{Completion, MsgBuf, Nexus, Request, Rpc};
use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};

const REQ: u8 = 1;
const WINDOW: usize = 2;

struct Ctx {
    session: u16,
    size: usize,
    in_flight: usize,
    completed: u64,
    pool: Vec<(MsgBuf, MsgBuf)>,
}

fn handler(rpc: &mut Rpc<SimTransport, Ctx>, c: &mut Ctx, req: Request<'_>) {
    assert_eq!(req.data.len(), c.size, "request size");
    let mut m = rpc.response_buffer(&req.handle, c.size).expect("resp");
    m.data_mut()[..8].copy_from_slice(&req.data[..8]);
    rpc.enqueue_response(req.handle, m).expect("respond");
}

fn cont(_rpc: &mut Rpc<SimTransport, Ctx>, c: &mut Ctx, comp: Completion) {
    comp.result.expect("large RPC failed");
    assert_eq!(comp.resp.len(), c.size, "response size");
    c.in_flight -= 1;
    c.completed += 1;
    c.pool.push((comp.req, comp.resp));
}

fn issue(rpc: &mut Rpc<SimTransport, Ctx>, c: &mut Ctx) {
    while c.in_flight < WINDOW {
        let (req, resp) = c.pool.pop().expect("pool sized to the window");
        c.in_flight += 1;
        rpc.enqueue_request(c.session, REQ, req, resp, cont, 0)
            .expect("enqueue");
    }
}

fn nodes(net: &SimNet, size: usize) -> Vec<(Rpc<SimTransport, Ctx>, Ctx)> {
    let mut v: Vec<(Rpc<SimTransport, Ctx>, Ctx)> = (0..2)
        .map(|i| {
            let nexus = Nexus::builder(&format!("n{i}:1"))
                .handler::<SimTransport, Ctx>(REQ, handler)
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .build()
                .unwrap();
            // Request and response buffers of the window, the server's
            // responses, and room for the reassembly of requests.
            let arena = (8 * WINDOW * size).next_power_of_two().max(8 << 20);
            let mut rpc = Rpc::builder(&nexus, net.add_transport(), test_allocator(arena))
                .build()
                .unwrap();
            let pool = (0..WINDOW)
                .map(|_| {
                    let mut req = rpc.alloc_msg_buffer(size).unwrap();
                    req.data_mut().fill(7);
                    (req, rpc.alloc_msg_buffer(size).unwrap())
                })
                .collect();
            let ctx = Ctx {
                session: 0,
                size,
                in_flight: 0,
                completed: 0,
                pool,
            };
            (rpc, ctx)
        })
        .collect();
    for (i, (rpc, ctx)) in v.iter_mut().enumerate() {
        ctx.session = rpc.create_session(&format!("n{}:1", 1 - i), 0).unwrap();
    }
    for _ in 0..10_000 {
        for (r, c) in v.iter_mut() {
            r.run_event_loop_once(c);
        }
        net.advance(1000);
    }
    assert!(v.iter().all(|(r, c)| r.is_connected(c.session)));
    v
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) != Some("callgrind") {
        eprintln!("usage: large_msg callgrind RPCS SIZE (see erpc/benches/callgrind_large.sh)");
        return;
    }
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    let size: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
    assert!(
        (8..=erpc::MAX_MSG_BYTES).contains(&size),
        "SIZE from 8 to {} bytes",
        erpc::MAX_MSG_BYTES
    );
    let net = SimNet::new(SimConfig::default());
    let mut v = nodes(&net, size);
    let mut steps = 0u64;
    while v.iter().map(|(_, c)| c.completed).sum::<u64>() < n {
        for (r, c) in v.iter_mut() {
            issue(r, c);
            r.run_event_loop_once(c);
        }
        net.advance(100);
        steps += 1;
        assert!(steps < 1 << 40, "no progress");
    }
    let done: u64 = v.iter().map(|(_, c)| c.completed).sum();
    let tx_pkts: u64 = v.iter().map(|(r, _)| r.stats().tx_pkts).sum();
    let resent: u64 = v.iter().map(|(r, _)| r.stats().retransmissions).sum();
    assert_eq!(resent, 0, "the simulated network lost nothing");
    println!("callgrind run: {done} RPCs of {size} bytes, {tx_pkts} packets sent");
}

//! A fuzzing harness shared by the property tests and the cargo-fuzz
//! target: a client and a server Rpc on a simulated network, driven by an
//! arbitrary byte string that mixes legitimate requests with hostile data
//! packets (raw frames, and headers aimed at live sessions and slots) and
//! hostile SM packets. [`run`] panics if anything panics inside, or if a
//! received packet is neither acted on nor counted as dropped. Headers are
//! aimed at the receiver's live sessions and at its slots' current,
//! previous and next request numbers (read from the Rpc when the packet is
//! made), and structured SM packets often carry a live session's token,
//! so that what is dropped is dropped by validation, not because it named
//! nothing ([`FuzzReport::aimed_live`]). The network runs in the
//! deferred-DMA mode (see [`super`]).

use std::sync::Arc;

use transport::{MAX_DATA_PER_PKT, Transport};

use super::{DeferredDma, SimConfig, SimNet, SimTransport};
use erpc::wire::{PktHdr, PktType};
use erpc::wire::{SM_PKT_BYTES, SmEndpoint, SmErr, SmPkt, SmPktType, TransportType};
use erpc::{Completion, DropReason, Nexus, Request, Rpc, Uri};

const ECHO: u8 = 1;

#[derive(Default)]
struct Ctx {
    completed: u64,
    bad: u64,
}

type FRpc = Rpc<SimTransport, Ctx>;

fn echo(rpc: &mut FRpc, _ctx: &mut Ctx, req: Request<'_>) {
    let data = req.data;
    if let Ok(mut m) = rpc.response_buffer(&req.handle, data.len()) {
        m.data_mut().copy_from_slice(data);
        let _ = rpc.enqueue_response(req.handle, m);
    }
}

fn cont(rpc: &mut FRpc, ctx: &mut Ctx, c: Completion) {
    ctx.completed += 1;
    let ok = c.result.is_ok() && c.resp.len() == c.req.len() && c.resp.data() == c.req.data();
    if c.result.is_ok() && !ok {
        ctx.bad += 1;
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

/// What a run did (for the callers' own checks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuzzReport {
    /// Data packets the two Rpcs took from their rings.
    pub rx_pkts: u64,
    /// Of those, dropped and counted.
    pub dropped: u64,
    /// Legitimate requests completed.
    pub completed: u64,
    /// SM packets the Nexuses rejected as malformed.
    pub sm_malformed: u64,
    /// Hostile data headers aimed at live state that named, when sent, a
    /// live session of the receiving Rpc and one of its slots' current,
    /// previous or next request numbers.
    pub aimed_live: u64,
    /// Of those, at the slot's current request number exactly.
    pub aimed_current: u64,
    /// Of those, spoofs the receiver cannot tell from genuine packets: a
    /// good magic number, a request at the server or a response at the
    /// client, at the slot's current or (a request) next request number.
    /// eRPC, like the C++ eRPC, does not authenticate data packets, so
    /// each of these may take the place of a genuine packet (a forged
    /// next request is answered, and the client's real one then gets that
    /// answer as a duplicate's) and spoil one RPC's data: completed echoes
    /// with wrong data are allowed up to this many, and no more.
    pub spoofed_in_window: u64,
    /// Structured SM packets that carried the token of a live session.
    pub sm_live_token: u64,
    /// Data packets dropped by a check that needs the session found
    /// (every drop but a malformed ring entry, a short packet, a bad magic
    /// number or an unknown session): what aimed headers reach.
    pub dropped_in_session: u64,
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// Runs one fuzz input. Panics on any violated invariant.
pub fn run(input: &[u8]) -> FuzzReport {
    // In the deferred-DMA mode: a hostile packet that makes an Rpc reuse
    // or free a buffer the NIC may still read panics too.
    let net = SimNet::new(SimConfig {
        seed: 1,
        ring_entries: 256,
        deferred_dma: Some(DeferredDma::default()),
        ..SimConfig::default()
    });
    let nexus = |uri: &str| -> Arc<Nexus> {
        Nexus::builder(uri)
            .handler::<SimTransport, Ctx>(ECHO, echo)
            .sm_link(net.sm_link())
            .clock(net.erpc_clock())
            .seed(7)
            .build()
            .expect("nexus")
    };
    let (nc, ns) = (nexus("client:1"), nexus("server:1"));
    let new_rpc = |n: &Arc<Nexus>| {
        FRpc::builder(n, net.add_transport(), net.allocator(2 << 20))
            .build()
            .expect("rpc")
    };
    let mut rpcs = [new_rpc(&nc), new_rpc(&ns)];
    let mut ctxs = [Ctx::default(), Ctx::default()];
    let eps = [
        rpcs[0].transport().endpoint(),
        rpcs[1].transport().endpoint(),
    ];
    let sn = rpcs[0].create_session("server:1", 0).expect("session");
    let poll = |rpcs: &mut [FRpc; 2], ctxs: &mut [Ctx; 2], steps: usize| {
        for _ in 0..steps {
            for (r, c) in rpcs.iter_mut().zip(ctxs.iter_mut()) {
                r.run_event_loop_once(c);
            }
            net.advance(500);
        }
    };
    poll(&mut rpcs, &mut ctxs, 200);
    let mut report = FuzzReport::default();
    let mut b = Bytes(input);
    // Bounded by the input length: every command consumes at least a byte.
    while !b.0.is_empty() {
        match b.u8() % 6 {
            0 => {
                // A raw frame, headers and all.
                let dst = eps[usize::from(b.u8() & 1)];
                // Mostly short frames (so an input holds many commands), some long.
                let len = usize::from(b.u16()) % if b.u8() < 16 { 1100 } else { 120 };
                let f = b.take(len).to_vec();
                net.inject_frame(dst, &f);
            }
            1 | 2 => {
                // A header aimed at live state, with some data: three times
                // in four at a live session of the receiver and one of its
                // slots' current, previous or next request number; else at
                // small raw numbers (sessions that may not exist, request
                // numbers below every live one).
                let to = usize::from(b.u8() & 1);
                let sel = b.u8();
                let aim = b.u8();
                let live: Vec<_> = rpcs[to].live_sessions().collect();
                let target = (aim & 3 != 0 && !live.is_empty()).then(|| {
                    let (sn, _, reqs) = live[usize::from((aim >> 2) & 3) % live.len()];
                    let slot = usize::from(aim >> 4) % reqs.len();
                    let w = erpc::SESSION_REQ_WINDOW as u64;
                    let req_num = match aim & 3 {
                        1 => reqs[slot],
                        2 => reqs[slot] + w,
                        _ => reqs[slot].saturating_sub(w),
                    };
                    (sn, req_num, aim & 3 == 1)
                });
                let hdr = PktHdr {
                    req_type: if sel & 1 == 0 { ECHO } else { b.u8() },
                    msg_size: match sel >> 5 {
                        0 => 0,
                        1 => MAX_DATA_PER_PKT as u32,
                        2 => MAX_DATA_PER_PKT as u32 + 1,
                        3 => erpc::MAX_MSG_BYTES as u32 + 1,
                        _ => b.u32() & 0xff_ffff,
                    },
                    dest_session_num: u16::from(b.u8() % 3),
                    pkt_type: PktType::from_bits(u64::from(b.u8())),
                    pkt_num: b.u16() % 20,
                    req_num: u64::from(b.u8()) % 64,
                };
                let hdr = match target {
                    Some((sn, req_num, current)) => {
                        report.aimed_live += 1;
                        report.aimed_current += u64::from(current);
                        PktHdr {
                            dest_session_num: sn,
                            req_num,
                            ..hdr
                        }
                    }
                    None => hdr,
                };
                let mut p = hdr.encode().expect("fields in range").to_vec();
                if sel & 2 != 0 {
                    p[13] ^= 0x10; // bad magic
                } else if target.is_some()
                    && match (to, hdr.pkt_type) {
                        (1, PktType::Req) => aim & 3 == 1 || aim & 3 == 2,
                        (0, PktType::Resp) => aim & 3 == 1,
                        _ => false,
                    }
                {
                    report.spoofed_in_window += 1;
                }
                let dlen = match b.u8() % 4 {
                    0 => usize::from(b.u16()) % (MAX_DATA_PER_PKT + 8),
                    1 => MAX_DATA_PER_PKT,
                    _ => usize::from(b.u8() % 8),
                };
                p.extend(std::iter::repeat_n(b.u8(), dlen));
                net.inject_payload(eps[to], &p);
            }
            3 => {
                // An SM packet: structured, or raw bytes of any length.
                let to = Uri::new(if b.u8() & 1 == 0 { "client" } else { "server" }, 1);
                if b.u8() & 1 == 0 {
                    let n = usize::from(b.u16()) % if b.u8() < 16 { 500 } else { 60 };
                    let raw = b.take(n).to_vec();
                    net.sm_hub().inject(&to, &raw);
                } else {
                    let ep = |b: &mut Bytes<'_>, host: &str| {
                        let mut e = SmEndpoint {
                            transport_type: TransportType::Raw,
                            sm_udp_port: 1,
                            rpc_id: b.u8() % 3,
                            session_num: u16::from(b.u8() % 4),
                            routing_info: rpcs[usize::from(b.u8() & 1)]
                                .transport()
                                .local_routing_info()
                                .to_bytes(),
                            ..SmEndpoint::default()
                        };
                        e.set_hostname(host).expect("short");
                        e
                    };
                    let pkt = SmPkt {
                        pkt_type: SmPktType::from_i32(i32::from(b.u8() % 7)).expect("in range"),
                        err: SmErr::from_i32(i32::from(b.u8() % 7)).expect("in range"),
                        // Half the time a live session's token (either
                        // Rpc's): such a packet is as good as authentic
                        // (the token is all SM checks), so the other half
                        // keeps sessions alive for the data-path attacks.
                        uniq_token: {
                            let k = b.u8();
                            let tokens: Vec<u64> = rpcs
                                .iter()
                                .flat_map(|r| r.live_sessions().map(|(_, t, _)| t))
                                .collect();
                            if k & 1 != 0 && !tokens.is_empty() {
                                report.sm_live_token += 1;
                                tokens[usize::from(k >> 2) % tokens.len()]
                            } else {
                                u64::from(k % 4)
                            }
                        },
                        client: ep(&mut b, "client"),
                        server: ep(&mut b, "server"),
                    };
                    let bytes: [u8; SM_PKT_BYTES] = pkt.encode();
                    net.sm_hub().inject(&to, &bytes);
                }
            }
            4 => {
                // A legitimate request.
                let len = usize::from(b.u16()) % 4000;
                if let (Ok(mut req), Ok(resp)) =
                    (rpcs[0].alloc_msg_buffer(len), rpcs[0].alloc_msg_buffer(len))
                {
                    req.data_mut().fill(b.u8());
                    if let Err(e) = rpcs[0].enqueue_request(sn, ECHO, req, resp, cont, 0) {
                        rpcs[0].free_msg_buffer(e.req);
                        rpcs[0].free_msg_buffer(e.resp);
                    }
                }
            }
            _ => {
                let steps = usize::from(b.u8() % 16);
                poll(&mut rpcs, &mut ctxs, steps);
            }
        }
    }
    poll(&mut rpcs, &mut ctxs, 400);
    report.completed = ctxs[0].completed;
    report.sm_malformed = nc.sm_stats().malformed + ns.sm_stats().malformed;
    for (i, r) in rpcs.iter().enumerate() {
        let s = r.stats();
        assert_eq!(
            s.rx_pkts,
            s.rx_accepted + s.data_drops(),
            "Rpc {i}: a packet was neither acted on nor counted: {s:?}"
        );
        report.rx_pkts += s.rx_pkts;
        report.dropped += s.data_drops();
        report.dropped_in_session += s.data_drops()
            - [
                DropReason::RingMalformed,
                DropReason::TooShort,
                DropReason::BadMagic,
                DropReason::UnknownSession,
            ]
            .iter()
            .map(|&r| s.drops(r))
            .sum::<u64>();
    }
    assert!(
        ctxs[0].bad <= report.spoofed_in_window,
        "{} completed echoes returned wrong data, more than the {} spoofed in-window packets \
         could explain",
        ctxs[0].bad,
        report.spoofed_in_window
    );
    report
}

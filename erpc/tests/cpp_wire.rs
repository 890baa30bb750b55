//! Wire compatibility with the C++ eRPC, from byte sequences in the form
//! C++ sends them.
//!
//! The C++ side is played by the test: its frames and SM packets are
//! written here from the rules in `shared/erpc-wire-facts.md` (and, where
//! the facts sheet has one, a captured byte sequence), with their own
//! encoders, independent of erpc's. Its data endpoint is a bare endpoint
//! of the simulated network whose arriving frames are captured
//! (`SimNet::capture`), or a tap on the device model's fabric for the raw
//! transport; its session management is a tap on the SM hub
//! (`SimSmHub::tap`), answered with `SimSmHub::inject`. The erpc-rs side
//! is an ordinary Rpc. Every exchange is checked both ways: erpc-rs takes
//! what C++ sends, and what erpc-rs sends decodes to what C++ expects
//! (Ethernet/IPv4/UDP framing included).

mod common;

use std::net::Ipv4Addr;

use common::app::{self, Ctx, ECHO, SIZED};
use common::devmodel::DevWorld;
use common::{Node, World, check_pattern, fill_pattern};
use erpc::{
    Completion, DropReason, Nexus, Rpc, RpcConfig, SessionEvent, SessionEventKind, TransportType,
    Uri,
};
use erpc_sim::{SimConfig, SimNet, SimTransport, test_allocator};
use transport::Transport;

/// The C++ forms, from the facts sheet, with nothing taken from erpc.
mod cpp {
    use std::net::Ipv4Addr;

    pub const REQ: u8 = 0;
    pub const RFR: u8 = 1;
    pub const CR: u8 = 2;
    pub const RESP: u8 = 3;
    pub const MAGIC: u64 = 11;

    /// The 14-byte eRPC header: little-endian fields, the last 8 bytes one
    /// u64 of packet type (2 bits), packet number (14), request number
    /// (44) and magic (4).
    pub fn hdr(
        req_type: u8,
        msg_size: u32,
        dsn: u16,
        pkt_type: u8,
        pkt_num: u16,
        req_num: u64,
    ) -> [u8; 14] {
        assert!(msg_size < 1 << 24 && pkt_num < 1 << 14 && req_num < 1 << 44);
        let mut b = [0u8; 14];
        b[0] = req_type;
        b[1..4].copy_from_slice(&msg_size.to_le_bytes()[..3]);
        b[4..6].copy_from_slice(&dsn.to_le_bytes());
        let w = u64::from(pkt_type) | (u64::from(pkt_num) << 2) | (req_num << 16) | (MAGIC << 60);
        b[6..14].copy_from_slice(&w.to_le_bytes());
        b
    }

    /// A decoded header, as the C++ code reads its bitfields.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Hdr {
        pub req_type: u8,
        pub msg_size: u32,
        pub dsn: u16,
        pub pkt_type: u8,
        pub pkt_num: u16,
        pub req_num: u64,
    }

    pub fn parse_hdr(b: &[u8]) -> Hdr {
        assert!(b.len() >= 14, "payload of {} bytes", b.len());
        let w = u64::from_le_bytes(b[6..14].try_into().unwrap());
        assert_eq!(w >> 60, MAGIC, "magic");
        Hdr {
            req_type: b[0],
            msg_size: u32::from_le_bytes([b[1], b[2], b[3], 0]),
            dsn: u16::from_le_bytes([b[4], b[5]]),
            pkt_type: (w & 3) as u8,
            pkt_num: ((w >> 2) & 0x3fff) as u16,
            req_num: (w >> 16) & ((1 << 44) - 1),
        }
    }

    /// A control packet (CR or RFR) as C++ sends it: header with message
    /// size 0, then the 8 zero data bytes of its control buffer.
    pub fn ctrl(req_type: u8, dsn: u16, pkt_type: u8, pkt_num: u16, req_num: u64) -> Vec<u8> {
        let mut p = hdr(req_type, 0, dsn, pkt_type, pkt_num, req_num).to_vec();
        p.extend_from_slice(&[0; 8]);
        p
    }

    /// Where a frame comes from or goes to.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Addr {
        pub mac: [u8; 6],
        pub ip: Ipv4Addr,
        pub port: u16,
    }

    fn csum(h: &[u8]) -> u16 {
        let mut s: u32 = h
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    /// An Ethernet/IPv4/UDP frame as C++ builds it: TOS 1, ID 0, no
    /// fragmentation, TTL 128, UDP checksum 0; the IPv4 checksum computed
    /// (DPDK transport) or left 0 (raw transport).
    pub fn frame(src: &Addr, dst: &Addr, payload: &[u8], ip_checksum: bool) -> Vec<u8> {
        let ip_len = (20 + 8 + payload.len()) as u16;
        let mut f = Vec::with_capacity(14 + usize::from(ip_len));
        f.extend_from_slice(&dst.mac);
        f.extend_from_slice(&src.mac);
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[1] = 0x01;
        ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
        ip[8] = 128;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src.ip.octets());
        ip[16..20].copy_from_slice(&dst.ip.octets());
        if ip_checksum {
            let c = csum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        f.extend_from_slice(&ip);
        f.extend_from_slice(&src.port.to_be_bytes());
        f.extend_from_slice(&dst.port.to_be_bytes());
        f.extend_from_slice(&(ip_len - 20).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    /// Checks a frame as a C++ receiver needs it and returns (source UDP
    /// port, payload): addressed to `dst` from `src`'s MAC and IPv4, IPv4
    /// header valid (version 4, IHL 5, TOS 1, ID 0, no fragments, TTL 128,
    /// UDP, checksum correct), UDP checksum 0, lengths consistent.
    pub fn check_frame<'a>(f: &'a [u8], src: &Addr, dst: &Addr) -> (u16, &'a [u8]) {
        assert!(
            f.len() >= 42 && f.len() <= 1024,
            "frame of {} bytes",
            f.len()
        );
        assert_eq!(&f[0..6], &dst.mac, "destination MAC");
        assert_eq!(&f[6..12], &src.mac, "source MAC");
        assert_eq!(&f[12..14], &[0x08, 0x00], "IPv4");
        let ip = &f[14..34];
        assert_eq!(ip[0], 0x45, "version and IHL");
        assert_eq!(ip[1], 0x01, "TOS");
        let ip_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        assert_eq!(14 + ip_len, f.len(), "IPv4 total length");
        assert_eq!(&ip[4..8], &[0, 0, 0, 0], "ID 0, no fragmentation");
        assert_eq!(ip[8], 128, "TTL");
        assert_eq!(ip[9], 17, "UDP");
        assert_eq!(csum(ip), 0, "IPv4 header checksum");
        assert_eq!(&ip[12..16], &src.ip.octets());
        assert_eq!(&ip[16..20], &dst.ip.octets());
        let udp = &f[34..42];
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), dst.port, "UDP port");
        assert_eq!(
            usize::from(u16::from_be_bytes([udp[4], udp[5]])),
            ip_len - 20
        );
        assert_eq!(&udp[6..8], &[0, 0], "UDP checksum 0");
        (u16::from_be_bytes([udp[0], udp[1]]), &f[42..])
    }

    /// Ethernet routing info (48 bytes): MAC at 0, IPv4 (host order, LE)
    /// at 8, UDP port at 12, RX queue at 14, RSS table size at 16; the rest
    /// zero.
    pub fn routing(a: &Addr, rxq: u16, rss_table_size: u16) -> [u8; 48] {
        let mut r = [0u8; 48];
        r[0..6].copy_from_slice(&a.mac);
        r[8..12].copy_from_slice(&u32::from(a.ip).to_le_bytes());
        r[12..14].copy_from_slice(&a.port.to_le_bytes());
        r[14..16].copy_from_slice(&rxq.to_le_bytes());
        r[16..18].copy_from_slice(&rss_table_size.to_le_bytes());
        r
    }

    pub const RAW: i32 = 1;
    pub const DPDK: i32 = 2;

    /// A session endpoint (188 bytes): transport type, hostname[128], SM
    /// UDP port, Rpc id (+1 pad), session number, routing info (+2 pad).
    pub fn endpoint(
        tt: i32,
        host: &str,
        sm_port: u16,
        rpc_id: u8,
        sn: u16,
        ri: &[u8; 48],
    ) -> [u8; 188] {
        let mut e = [0u8; 188];
        e[0..4].copy_from_slice(&tt.to_le_bytes());
        e[4..4 + host.len()].copy_from_slice(host.as_bytes());
        e[132..134].copy_from_slice(&sm_port.to_le_bytes());
        e[134] = rpc_id;
        e[136..138].copy_from_slice(&sn.to_le_bytes());
        e[138..186].copy_from_slice(ri);
        e
    }

    pub const CONNECT_REQ: i32 = 3;
    pub const CONNECT_RESP: i32 = 4;
    pub const DISCONNECT_REQ: i32 = 5;
    pub const DISCONNECT_RESP: i32 = 6;
    pub const CLIENT: usize = 16;
    pub const SERVER: usize = 204;

    /// An SM packet (392 bytes): type, error, token, client and server
    /// endpoints.
    pub fn sm(t: i32, err: i32, token: u64, client: &[u8; 188], server: &[u8; 188]) -> [u8; 392] {
        let mut p = [0u8; 392];
        p[0..4].copy_from_slice(&t.to_le_bytes());
        p[4..8].copy_from_slice(&err.to_le_bytes());
        p[8..16].copy_from_slice(&token.to_le_bytes());
        p[CLIENT..CLIENT + 188].copy_from_slice(client);
        p[SERVER..SERVER + 188].copy_from_slice(server);
        p
    }

    pub fn sm_type(p: &[u8; 392]) -> i32 {
        i32::from_le_bytes(p[0..4].try_into().unwrap())
    }

    pub fn sm_err(p: &[u8; 392]) -> i32 {
        i32::from_le_bytes(p[4..8].try_into().unwrap())
    }

    pub fn sm_token(p: &[u8; 392]) -> u64 {
        u64::from_le_bytes(p[8..16].try_into().unwrap())
    }

    /// Endpoint at `at` (CLIENT or SERVER).
    pub fn ep(p: &[u8; 392], at: usize) -> &[u8] {
        &p[at..at + 188]
    }

    pub fn ep_type(e: &[u8]) -> i32 {
        i32::from_le_bytes(e[0..4].try_into().unwrap())
    }

    pub fn ep_host(e: &[u8]) -> &str {
        let end = e[4..132]
            .iter()
            .position(|&c| c == 0)
            .expect("NUL-terminated");
        std::str::from_utf8(&e[4..4 + end]).unwrap()
    }

    pub fn ep_sm_port(e: &[u8]) -> u16 {
        u16::from_le_bytes([e[132], e[133]])
    }

    pub fn ep_rpc_id(e: &[u8]) -> u8 {
        e[134]
    }

    pub fn ep_session(e: &[u8]) -> u16 {
        u16::from_le_bytes([e[136], e[137]])
    }

    /// (MAC, IPv4, UDP port, RX queue, RSS table size) of an endpoint's
    /// routing info, as the C++ DPDK transport reads it.
    pub fn ep_routing(e: &[u8]) -> ([u8; 6], Ipv4Addr, u16, u16, u16) {
        let r = &e[138..186];
        let u16le = |i: usize| u16::from_le_bytes([r[i], r[i + 1]]);
        (
            r[0..6].try_into().unwrap(),
            Ipv4Addr::from(u32::from_le_bytes(r[8..12].try_into().unwrap())),
            u16le(12),
            u16le(14),
            u16le(16),
        )
    }
}

use cpp::Addr;

/// The facts sheet's header test vector and its captured C++ RFR.
#[test]
fn the_facts_sheet_bytes_decode_as_cpp_meant_them() {
    use erpc::wire::{PktHdr, PktType};
    let vector = [
        0xab, 0x56, 0x34, 0x12, 0xef, 0xbe, 0x57, 0x55, 0x34, 0x12, 0xf0, 0xde, 0xbc, 0xba,
    ];
    assert_eq!(
        cpp::hdr(0xab, 0x12_3456, 0xbeef, 3, 0x1555, 0xabc_def0_1234),
        vector
    );
    let h = PktHdr::decode(&vector).unwrap();
    assert_eq!(
        (
            h.req_type,
            h.msg_size,
            h.dest_session_num,
            h.pkt_type,
            h.pkt_num,
            h.req_num
        ),
        (
            0xab,
            0x12_3456,
            0xbeef,
            PktType::Resp,
            0x1555,
            0xabc_def0_1234
        )
    );
    assert_eq!(h.encode().unwrap(), vector);
    let rfr = CAPTURED_RFR;
    assert_eq!(rfr.len(), 22, "14-byte header and 8 trailing bytes");
    assert_eq!(cpp::ctrl(2, 0, cpp::RFR, 2, 8), rfr);
    let h = PktHdr::decode(&rfr).unwrap();
    assert_eq!(
        (
            h.req_type,
            h.msg_size,
            h.dest_session_num,
            h.pkt_type,
            h.pkt_num,
            h.req_num
        ),
        (2, 0, 0, PktType::Rfr, 2, 8)
    );
    assert_eq!(&h.encode().unwrap()[..], &rfr[..14]);
}

/// A request-for-response captured from a C++ eRPC (DPDK transport): request
/// type 2, size 0, session 0, RFR, packet 2, request 8, magic 11, and the
/// 8 trailing bytes of its control buffer.
const CAPTURED_RFR: [u8; 22] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0xb0, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// An erpc-rs Rpc on the simulated network, a bare endpoint for the C++
/// peer (frames captured), and the SM hub tapped at the C++ peer's URI.
struct Bench<C> {
    net: SimNet,
    rpc: Rpc<SimTransport, C>,
    ctx: C,
    /// Our endpoint index and address.
    our_ep: usize,
    our: Addr,
    our_uri: Uri,
    /// The C++ peer's endpoint index, address and URI.
    cpp_ep: usize,
    cpp: Addr,
    cpp_uri: Uri,
}

impl<C: 'static> Bench<C> {
    fn new(
        seed: u64,
        our_uri: &str,
        rpc_id: u8,
        cfg: RpcConfig,
        nexus: impl FnOnce(erpc::NexusBuilder) -> erpc::NexusBuilder,
        ctx: C,
        sm: Option<erpc::SessionHandler<SimTransport, C>>,
    ) -> Bench<C> {
        let net = SimNet::new(SimConfig {
            seed,
            ..SimConfig::default()
        });
        let n = nexus(
            Nexus::builder(our_uri)
                .sm_link(net.sm_link())
                .clock(net.erpc_clock())
                .seed(seed),
        )
        .build()
        .unwrap();
        let t = net.add_transport();
        let our_ep = t.endpoint();
        let ri = t.local_routing_info();
        let b = Rpc::builder(&n, t, test_allocator(8 << 20))
            .id(rpc_id)
            .config(cfg);
        let rpc = match sm {
            Some(h) => b.session_handler(h),
            None => b,
        }
        .build()
        .unwrap();
        // The C++ peer: an endpoint nobody reads but the capture.
        let peer = net.add_transport();
        let cpp_ep = peer.endpoint();
        let pri = peer.local_routing_info();
        drop(peer);
        net.capture(cpp_ep, true);
        let cpp_uri = Uri::new("cpp-peer", 31850);
        net.sm_hub().tap(&cpp_uri);
        Bench {
            net,
            rpc,
            ctx,
            our_ep,
            our: Addr {
                mac: ri.mac,
                ip: ri.ipv4,
                port: ri.udp_port,
            },
            our_uri: Uri::parse(our_uri).unwrap(),
            cpp_ep,
            cpp: Addr {
                mac: pri.mac,
                ip: pri.ipv4,
                port: pri.udp_port,
            },
            cpp_uri,
        }
    }

    /// Runs the Rpc and the network for `steps` microseconds.
    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.rpc.run_event_loop_once(&mut self.ctx);
            self.net.advance(1_000);
        }
    }

    /// Runs until at least `n` frames reached the C++ peer; returns them.
    fn frames(&mut self, n: usize) -> Vec<Box<[u8]>> {
        let mut got = Vec::new();
        for _ in 0..100_000 {
            got.extend(self.net.take_captured(self.cpp_ep));
            if got.len() >= n {
                // Anything else that is on its way.
                self.run(20);
                got.extend(self.net.take_captured(self.cpp_ep));
                return got;
            }
            self.run(1);
        }
        panic!("{} of {n} frames reached the C++ peer", got.len());
    }

    /// Runs until an SM packet reached the C++ peer; returns it.
    fn sm_pkt(&mut self) -> [u8; 392] {
        for _ in 0..100_000 {
            let mut got = self.net.sm_hub().take_tapped(&self.cpp_uri);
            if !got.is_empty() {
                assert_eq!(got.len(), 1, "one SM packet");
                return got.remove(0);
            }
            self.run(1);
        }
        panic!("no SM packet reached the C++ peer");
    }

    /// The C++ peer sends `payload` to us in a DPDK-style frame.
    fn send(&self, payload: &[u8]) {
        self.net.inject_frame(
            self.our_ep,
            &cpp::frame(&self.cpp, &self.our, payload, true),
        );
    }

    /// The erpc-rs header and payload of a frame from us to the C++ peer.
    fn ours<'a>(&self, f: &'a [u8]) -> (u16, cpp::Hdr, &'a [u8]) {
        let (src_port, payload) = cpp::check_frame(f, &self.our, &self.cpp);
        (src_port, cpp::parse_hdr(payload), &payload[14..])
    }
}

/// The C++ peer's routing info as its DPDK transport advertises it: queue
/// 0 of a 128-entry RSS table.
fn cpp_routing(b: &Bench<impl Sized>, rxq: u16) -> [u8; 48] {
    cpp::routing(&b.cpp, rxq, 128)
}

const CPP_CLIENT_SESSION: u16 = 5;
const CPP_CLIENT_RPC: u8 = 7;
const OUR_SERVER_RPC: u8 = 3;
const TOKEN: u64 = 0x0123_4567_89ab_cdef;

fn server_bench(seed: u64) -> Bench<Ctx> {
    let cfg = RpcConfig {
        transport_type: TransportType::Dpdk,
        ..RpcConfig::default()
    };
    Bench::new(
        seed,
        "server:31850",
        OUR_SERVER_RPC,
        cfg,
        app::register::<SimTransport>,
        Ctx::new(seed),
        Some(app::sm_handler::<SimTransport>),
    )
}

/// The connect request of a C++ client (transport type `tt`).
fn cpp_connect_req(b: &Bench<Ctx>, tt: i32) -> [u8; 392] {
    let client = cpp::endpoint(
        tt,
        "cpp-peer",
        31850,
        CPP_CLIENT_RPC,
        CPP_CLIENT_SESSION,
        &cpp_routing(b, 0),
    );
    // The client names us by another name than our Nexus's URI host (a
    // DNS alias, an address): the answer must carry its name back.
    let server = cpp::endpoint(tt, "server-alias", 31850, OUR_SERVER_RPC, 0xffff, &[0; 48]);
    cpp::sm(cpp::CONNECT_REQ, 0, TOKEN, &client, &server)
}

/// A SIZED request: key, response length, no body.
fn sized_req(key: u64, resp_len: u32) -> [u8; 12] {
    let mut d = [0u8; 12];
    d[..8].copy_from_slice(&key.to_le_bytes());
    d[8..].copy_from_slice(&resp_len.to_le_bytes());
    d
}

#[test]
fn a_cpp_client_of_the_other_ethernet_type_is_refused_as_cpp_refuses_it() {
    // Our server presents DPDK; a C++ raw-transport client (whose frames
    // carry IPv4 checksum 0, which a Linux socket drops) is refused with
    // "invalid transport", the request echoed byte for byte.
    let mut b = server_bench(1);
    let req = cpp_connect_req(&b, cpp::RAW);
    b.net.sm_hub().inject(&b.our_uri, &req);
    let resp = b.sm_pkt();
    assert_eq!(cpp::sm_type(&resp), cpp::CONNECT_RESP);
    assert_eq!(cpp::sm_err(&resp), 6, "invalid transport");
    assert_eq!(&resp[8..], &req[8..], "token and both endpoints unchanged");
    assert_eq!(b.rpc.num_sessions(), 0);
}

#[test]
fn a_cpp_client_connects_calls_and_disconnects() {
    let mut b = server_bench(2);
    let our_ri = b.rpc.transport().local_routing_info();

    // Connect: the response echoes the client endpoint byte for byte and
    // the server endpoint as the client filled it, with a session number
    // and routing info a C++ DPDK client can use.
    let req = cpp_connect_req(&b, cpp::DPDK);
    b.net.sm_hub().inject(&b.our_uri, &req);
    let resp = b.sm_pkt();
    assert_eq!(cpp::sm_type(&resp), cpp::CONNECT_RESP);
    assert_eq!(cpp::sm_err(&resp), 0);
    assert_eq!(cpp::sm_token(&resp), TOKEN);
    assert_eq!(
        cpp::ep(&resp, cpp::CLIENT),
        cpp::ep(&req, cpp::CLIENT),
        "client endpoint, hostname included, unchanged"
    );
    let srv = cpp::ep(&resp, cpp::SERVER);
    assert_eq!(cpp::ep_type(srv), cpp::DPDK);
    assert_eq!(
        cpp::ep_host(srv),
        "server-alias",
        "the hostname the client used"
    );
    assert_eq!(cpp::ep_sm_port(srv), 31850);
    assert_eq!(cpp::ep_rpc_id(srv), OUR_SERVER_RPC);
    let sn = cpp::ep_session(srv);
    assert_ne!(sn, 0xffff);
    assert_eq!(sn, 0, "the first session of the Rpc");
    let (mac, ip, port, rxq, rss) = cpp::ep_routing(srv);
    assert_eq!((mac, ip, port), (b.our.mac, b.our.ip, b.our.port));
    assert_ne!(mac, [0; 6], "a MAC the client can send to");
    assert_eq!(
        (rxq, rss),
        (0, 1),
        "queue 0 of a table of one: no division by zero"
    );
    assert_eq!(our_ri.rss_table_size, 1);
    assert_eq!(&resp[cpp::SERVER + 186..], &[0, 0], "tail padding");
    // A retransmitted request gets the same answer.
    b.net.sm_hub().inject(&b.our_uri, &req);
    assert_eq!(b.sm_pkt(), resp);
    assert_eq!(b.rpc.num_sessions(), 1);
    assert_eq!(
        b.rpc.rx_ring_unreserved().0,
        4096 - 32,
        "32 credits reserved"
    );

    // Request A: slot 0 (request 8), a single-packet SIZED request for a
    // 4000-byte (5-packet) response, pulled with requests-for-response:
    // one as C++ builds it, the captured one, one padded by a NIC to the
    // 60-byte minimum frame (no trailing bytes), and one more.
    let key = 0x5eed;
    let mut p = cpp::hdr(SIZED, 12, sn, cpp::REQ, 0, 8).to_vec();
    p.extend_from_slice(&sized_req(key, 4000));
    b.send(&p);
    let f = b.frames(1);
    assert_eq!(f.len(), 1, "only the first response packet before an RFR");
    let mut resp_data = vec![0u8; 4000];
    let mut check_resp = |b: &Bench<Ctx>, f: &[u8], k: usize| {
        let (_, h, d) = b.ours(f);
        assert_eq!(
            h,
            cpp::Hdr {
                req_type: SIZED,
                msg_size: 4000,
                dsn: CPP_CLIENT_SESSION,
                pkt_type: cpp::RESP,
                pkt_num: k as u16,
                req_num: 8,
            }
        );
        let at = k * 968;
        let len = (4000 - at).min(968);
        assert_eq!(d.len(), len);
        resp_data[at..at + len].copy_from_slice(d);
    };
    check_resp(&b, &f[0], 0);
    b.send(&cpp::ctrl(SIZED, sn, cpp::RFR, 1, 8));
    let f = b.frames(1);
    check_resp(&b, &f[0], 1);
    b.send(&CAPTURED_RFR);
    let f = b.frames(1);
    check_resp(&b, &f[0], 2);
    let mut padded = cpp::frame(
        &b.cpp,
        &b.our,
        &cpp::hdr(SIZED, 0, sn, cpp::RFR, 3, 8),
        true,
    );
    assert_eq!(padded.len(), 56);
    padded.resize(60, 0);
    b.net.inject_frame(b.our_ep, &padded);
    let f = b.frames(1);
    check_resp(&b, &f[0], 3);
    b.send(&cpp::ctrl(SIZED, sn, cpp::RFR, 4, 8));
    let f = b.frames(1);
    check_resp(&b, &f[0], 4);
    assert!(check_pattern(&resp_data, key ^ 1), "response data");

    // Request B: slot 1 (request 9), a 3-packet ECHO request: credit
    // returns for packets 0 and 1, then the 3-packet response, its
    // packets numbered 2, 3, 4 (request packets - 1 + i).
    let mut body = vec![0u8; 2036];
    fill_pattern(&mut body, 77);
    for k in 0..3 {
        let at = k * 968;
        let mut p = cpp::hdr(ECHO, 2036, sn, cpp::REQ, k as u16, 9).to_vec();
        p.extend_from_slice(&body[at..(at + 968).min(2036)]);
        b.send(&p);
    }
    let f = b.frames(3);
    assert_eq!(f.len(), 3);
    for (k, f) in f[..2].iter().enumerate() {
        let (_, h, d) = b.ours(f);
        assert_eq!(
            h,
            cpp::Hdr {
                req_type: ECHO,
                msg_size: 0,
                dsn: CPP_CLIENT_SESSION,
                pkt_type: cpp::CR,
                pkt_num: k as u16,
                req_num: 9,
            }
        );
        assert!(d.is_empty(), "a C++ receiver reads no data from a CR");
    }
    let mut echoed = Vec::new();
    let mut take = |b: &Bench<Ctx>, f: &[u8], pkt_num: u16| {
        let (_, h, d) = b.ours(f);
        assert_eq!((h.pkt_type, h.pkt_num, h.req_num), (cpp::RESP, pkt_num, 9));
        assert_eq!((h.msg_size, h.dsn), (2036, CPP_CLIENT_SESSION));
        echoed.extend_from_slice(d);
    };
    take(&b, &f[2], 2);
    // C++ counts 3 packets sent, so its RFRs are numbered 3 and 4.
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 3, 9));
    let f = b.frames(1);
    take(&b, &f[0], 3);
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 4, 9));
    let f = b.frames(1);
    take(&b, &f[0], 4);
    assert_eq!(echoed.len(), 2036);
    assert!(echoed.iter().zip(&body).all(|(e, o)| *e == o ^ 0x5a));

    // Kept refusing: a control packet with a message size.
    let drops = b.rpc.stats().drops(DropReason::CtrlHasData);
    b.send(&cpp::hdr(ECHO, 5, sn, cpp::RFR, 4, 9));
    b.run(10);
    assert_eq!(b.rpc.stats().drops(DropReason::CtrlHasData), drops + 1);
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    // A raw-transport frame (IPv4 checksum 0) on a Linux-like receiver:
    // dropped as a bad IPv4 header, never seen by eRPC.
    let mut p = cpp::hdr(ECHO, 4, sn, cpp::REQ, 0, 10).to_vec();
    p.extend_from_slice(b"ping");
    let bad_ip = b.rpc.transport().stats().rx_bad_ip;
    b.net
        .inject_frame(b.our_ep, &cpp::frame(&b.cpp, &b.our, &p, false));
    b.run(10);
    assert_eq!(b.rpc.transport().stats().rx_bad_ip, bad_ip + 1);
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    // The same request with its checksum: answered.
    b.send(&p);
    let f = b.frames(1);
    let (_, h, d) = b.ours(&f[0]);
    assert_eq!((h.pkt_type, h.req_num, h.msg_size), (cpp::RESP, 10, 4));
    assert_eq!(d, b"ping".map(|c| c ^ 0x5a));
    assert_eq!(b.ctx.handled, 3);

    // Disconnect. The C++ client sends its copy of the server endpoint,
    // whose routing info its DPDK transport has overwritten with a
    // prebuilt frame header: only the session number and token matter.
    let mut server = [0u8; 188];
    server.copy_from_slice(srv);
    server[138..178].fill(0xa5);
    let client: [u8; 188] = cpp::ep(&req, cpp::CLIENT).try_into().unwrap();
    let disc = cpp::sm(cpp::DISCONNECT_REQ, 0, TOKEN, &client, &server);
    b.net.sm_hub().inject(&b.our_uri, &disc);
    let resp = b.sm_pkt();
    assert_eq!(cpp::sm_type(&resp), cpp::DISCONNECT_RESP);
    assert_eq!(cpp::sm_err(&resp), 0);
    assert_eq!(&resp[8..], &disc[8..], "token and endpoints echoed");
    assert_eq!(b.rpc.num_sessions(), 0);
    assert_eq!(b.rpc.rx_ring_unreserved().0, 4096);
    // Nothing else was dropped on the way.
    let s = b.rpc.stats();
    assert_eq!(
        s.drops(DropReason::RingMalformed),
        1,
        "the zero-checksum frame"
    );
    assert_eq!(s.total_drops(), 2, "{s}");
    assert!(b.ctx.errors.is_empty(), "{:?}", b.ctx.errors);
}

/// Client-side application state: completions and session events.
#[derive(Default)]
struct Client {
    done: Vec<(Result<(), erpc::RpcError>, Vec<u8>)>,
    events: Vec<SessionEvent>,
}

fn client_done(rpc: &mut Rpc<SimTransport, Client>, c_: &mut Client, c: Completion) {
    c_.done.push((c.result, c.resp.data().to_vec()));
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

fn client_event(_: &mut Rpc<SimTransport, Client>, c: &mut Client, ev: SessionEvent) {
    c.events.push(ev);
}

fn enqueue(b: &mut Bench<Client>, sn: u16, req_type: u8, data: &[u8], resp_cap: usize) {
    let mut req = b.rpc.alloc_msg_buffer(data.len()).unwrap();
    req.data_mut().copy_from_slice(data);
    let resp = b.rpc.alloc_msg_buffer(resp_cap).unwrap();
    b.rpc
        .enqueue_request(sn, req_type, req, resp, client_done, 0)
        .unwrap();
}

const CPP_SERVER_SESSION: u16 = 0x42;
const CPP_SERVER_RPC: u8 = 7;

#[test]
fn our_client_calls_a_cpp_server() {
    let cfg = RpcConfig {
        transport_type: TransportType::Dpdk,
        // More than a C++ server reserves: capped at its 32.
        session_credits: 64,
        ..RpcConfig::default()
    };
    let mut b = Bench::new(
        3,
        "client:31850",
        0,
        cfg,
        |n| n,
        Client::default(),
        Some(client_event),
    );
    let our_ri = b.rpc.transport().local_routing_info();

    // The connect request, as a C++ server reads it.
    let sn = b
        .rpc
        .create_session("cpp-peer:31850", CPP_SERVER_RPC)
        .unwrap();
    let req = b.sm_pkt();
    assert_eq!(cpp::sm_type(&req), cpp::CONNECT_REQ);
    assert_eq!(cpp::sm_err(&req), 0);
    let token = cpp::sm_token(&req);
    let c = cpp::ep(&req, cpp::CLIENT);
    assert_eq!(cpp::ep_type(c), cpp::DPDK);
    assert_eq!(cpp::ep_host(c), "client");
    assert_eq!(cpp::ep_sm_port(c), 31850);
    assert_eq!(cpp::ep_rpc_id(c), 0);
    assert_eq!(cpp::ep_session(c), sn);
    let (mac, ip, port, rxq, rss) = cpp::ep_routing(c);
    assert_eq!(
        (mac, ip, port, rxq, rss),
        (b.our.mac, b.our.ip, b.our.port, 0, 1)
    );
    assert_eq!(our_ri.mac, mac);
    let s = cpp::ep(&req, cpp::SERVER);
    assert_eq!(
        cpp::ep_type(s),
        cpp::DPDK,
        "the type a C++ DPDK server checks"
    );
    assert_eq!(cpp::ep_host(s), "cpp-peer");
    assert_eq!(cpp::ep_sm_port(s), 31850);
    assert_eq!(cpp::ep_rpc_id(s), CPP_SERVER_RPC);
    assert_eq!(cpp::ep_session(s), 0xffff);
    assert!(
        s[138..186].iter().all(|&x| x == 0),
        "no server routing info yet"
    );

    // The C++ server's answer: its endpoint with a session number and the
    // routing info of its DPDK transport (queue 3 of a 128-entry table).
    let mut server: [u8; 188] = s.try_into().unwrap();
    server[136..138].copy_from_slice(&CPP_SERVER_SESSION.to_le_bytes());
    server[138..186].copy_from_slice(&cpp_routing(&b, 3));
    let client: [u8; 188] = c.try_into().unwrap();
    let resp = cpp::sm(cpp::CONNECT_RESP, 0, token, &client, &server);
    b.net.sm_hub().inject(&b.our_uri, &resp);
    b.run(10);
    assert!(b.rpc.is_connected(sn));
    assert_eq!(b.rpc.session_credits(sn), Some(32), "a C++ server's 32");
    assert_eq!(b.rpc.rx_ring_unreserved().0, 4096 - 32);

    // The UDP source port the C++ receiver's RSS needs to land on queue 3.
    let peer_ri = transport::RoutingInfo::from_bytes(&cpp_routing(&b, 3));
    let rss_port = transport::rss::source_port(b.our.ip, &peer_ri)
        .unwrap()
        .expect("the peer uses RSS");
    assert!(rss_port >= 10_000);
    let hash = transport::rss::hash_v4_udp(b.our.ip, b.cpp.ip, rss_port, b.cpp.port);
    assert_eq!((hash % 128) % 16, 3);

    // A single-packet request and its response.
    enqueue(&mut b, sn, 9, b"hello, C++", 64);
    let f = b.frames(1);
    let (src_port, h, d) = b.ours(&f[0]);
    assert_eq!(src_port, rss_port);
    assert_eq!(
        h,
        cpp::Hdr {
            req_type: 9,
            msg_size: 10,
            dsn: CPP_SERVER_SESSION,
            pkt_type: cpp::REQ,
            pkt_num: 0,
            req_num: 8,
        },
        "C++ numbers slot 0 from 8"
    );
    assert_eq!(d, b"hello, C++");
    let mut p = cpp::hdr(9, 7, sn, cpp::RESP, 0, 8).to_vec();
    p.extend_from_slice(b"hi, Rust");
    p.truncate(14 + 7);
    b.send(&p);
    b.run(10);
    assert_eq!(b.ctx.done, vec![(Ok(()), b"hi, Rus".to_vec())]);

    // A 100-packet request: never more than 32 packets without a credit
    // return; the C++ server returns credits with its 8 trailing bytes.
    let mut body = vec![0u8; 100 * 968];
    fill_pattern(&mut body, 5);
    enqueue(&mut b, sn, 9, &body, 64);
    let mut got = [false; 100];
    let mut acked = 0u16;
    let mut req_num = None;
    let mut received = Vec::new();
    while !got.iter().all(|&g| g) {
        let f = b.frames(1);
        for f in &f {
            let (src_port, h, d) = b.ours(f);
            assert_eq!(src_port, rss_port);
            assert_eq!(
                (h.pkt_type, h.msg_size, h.dsn),
                (cpp::REQ, 96_800, CPP_SERVER_SESSION)
            );
            assert_eq!(*req_num.get_or_insert(h.req_num), h.req_num);
            assert!(!got[usize::from(h.pkt_num)], "packet {} twice", h.pkt_num);
            got[usize::from(h.pkt_num)] = true;
            let at = usize::from(h.pkt_num) * 968;
            assert_eq!(d, &body[at..at + 968]);
            received.push(h.pkt_num);
        }
        let sent = got.iter().filter(|&&g| g).count() as u16;
        assert!(sent - acked <= 32, "{sent} sent, {acked} acknowledged");
        if acked == 0 {
            assert_eq!(sent, 32, "exactly the 32 credits at first");
        }
        // Return credits for everything but the last packet.
        while acked < sent.min(99) {
            b.send(&cpp::ctrl(9, sn, cpp::CR, acked, req_num.unwrap()));
            acked += 1;
        }
    }
    assert_eq!(
        received,
        (0..100).collect::<Vec<u16>>(),
        "in order, once each"
    );
    let rn = req_num.unwrap();
    b.send(&cpp::hdr(9, 0, sn, cpp::RESP, 99, rn));
    b.run(10);
    assert_eq!(b.ctx.done.len(), 2);
    assert_eq!(b.ctx.done[1], (Ok(()), Vec::new()));

    // A 6-packet response pulled with RFRs, which C++ reads as
    // (RFR, size 0, packet numbers 1..5).
    let mut big = vec![0u8; 5000];
    fill_pattern(&mut big, 6);
    enqueue(&mut b, sn, 9, b"big", 8000);
    let f = b.frames(1);
    let (_, h, _) = b.ours(&f[0]);
    let rn = h.req_num;
    let mut p = cpp::hdr(9, 5000, sn, cpp::RESP, 0, rn).to_vec();
    p.extend_from_slice(&big[..968]);
    b.send(&p);
    let rfrs = b.frames(5);
    assert_eq!(rfrs.len(), 5, "one RFR per further response packet");
    for (k, f) in rfrs.iter().enumerate() {
        let (src_port, h, d) = b.ours(f);
        assert_eq!(src_port, rss_port);
        assert_eq!(
            h,
            cpp::Hdr {
                req_type: 9,
                msg_size: 0,
                dsn: CPP_SERVER_SESSION,
                pkt_type: cpp::RFR,
                pkt_num: k as u16 + 1,
                req_num: rn,
            }
        );
        assert!(d.is_empty());
        let at = (k + 1) * 968;
        let mut p = cpp::hdr(9, 5000, sn, cpp::RESP, k as u16 + 1, rn).to_vec();
        p.extend_from_slice(&big[at..(at + 968).min(5000)]);
        b.send(&p);
    }
    b.run(10);
    assert_eq!(b.ctx.done.len(), 3);
    assert_eq!(b.ctx.done[2], (Ok(()), big));
    assert_eq!(b.rpc.session_credits(sn), Some(32), "every credit home");

    // Disconnect: the server endpoint goes back as the server sent it.
    b.rpc.destroy_session(sn).unwrap();
    let disc = b.sm_pkt();
    assert_eq!(cpp::sm_type(&disc), cpp::DISCONNECT_REQ);
    assert_eq!(cpp::sm_token(&disc), token);
    assert_eq!(cpp::ep(&disc, cpp::CLIENT), &client[..]);
    assert_eq!(cpp::ep(&disc, cpp::SERVER), &server[..]);
    let mut dresp = disc;
    dresp[0..4].copy_from_slice(&cpp::DISCONNECT_RESP.to_le_bytes());
    b.net.sm_hub().inject(&b.our_uri, &dresp);
    b.run(10);
    assert_eq!(b.rpc.session_state(sn), None);
    assert_eq!(
        b.ctx.events.iter().map(|e| e.kind).collect::<Vec<_>>(),
        vec![SessionEventKind::Connected, SessionEventKind::Disconnected]
    );
    assert_eq!(b.rpc.stats().total_drops(), 0, "{}", b.rpc.stats());
    assert_eq!(b.rpc.rx_ring_unreserved().0, 4096);
}

/// The C++ raw transport over our mlx5 transport on the device model: its
/// frames carry IPv4 checksum 0, and a NIC pads short frames to 60 bytes.
#[test]
fn a_cpp_raw_client_reaches_the_mlx5_transport_with_zero_checksums() {
    let mut w = DevWorld::new(4);
    let nexus = app::register::<<DevWorld as World>::T>(w.nexus("server:31850"))
        .build()
        .unwrap();
    let cfg = RpcConfig {
        transport_type: TransportType::Raw,
        ..RpcConfig::default()
    };
    let mut node = Node::new(&mut w, &nexus, OUR_SERVER_RPC, Ctx::new(4), cfg, None);
    let ri = node.rpc.transport().local_routing_info();
    assert_eq!((ri.rxq_id, ri.rss_table_size), (0, 1));
    let our = Addr {
        mac: ri.mac,
        ip: ri.ipv4,
        port: ri.udp_port,
    };
    let cpp = Addr {
        mac: [0x02, 0xc0, 0xff, 0xee, 0, 1],
        ip: Ipv4Addr::new(10, 20, 0, 200),
        port: 31900,
    };
    let tap = w.fabric.add_tap(Some(cpp.mac));
    let cpp_uri = Uri::new("cpp-raw", 31850);
    w.net.sm_hub().tap(&cpp_uri);
    let run = |w: &mut DevWorld, node: &mut Node<_, Ctx>, steps: usize| {
        for _ in 0..steps {
            node.poll();
            w.step();
        }
    };

    // Connect, as the C++ raw transport advertises itself: RSS table size
    // 0 (steered by exact port).
    let client = cpp::endpoint(
        cpp::RAW,
        "cpp-raw",
        31850,
        CPP_CLIENT_RPC,
        CPP_CLIENT_SESSION,
        &cpp::routing(&cpp, 0, 0),
    );
    let server = cpp::endpoint(cpp::RAW, "server", 31850, OUR_SERVER_RPC, 0xffff, &[0; 48]);
    let req = cpp::sm(cpp::CONNECT_REQ, 0, TOKEN, &client, &server);
    w.net.sm_hub().inject(&Uri::new("server", 31850), &req);
    run(&mut w, &mut node, 200);
    let resp = w.net.sm_hub().take_tapped(&cpp_uri);
    assert_eq!(resp.len(), 1);
    assert_eq!(cpp::sm_err(&resp[0]), 0);
    assert_eq!(cpp::ep(&resp[0], cpp::CLIENT), &client[..]);
    let srv = cpp::ep(&resp[0], cpp::SERVER);
    let sn = cpp::ep_session(srv);
    assert_eq!(cpp::ep_routing(srv).0, our.mac);

    // A SIZED request for a 2-packet response, in a zero-checksum frame.
    let mut p = cpp::hdr(SIZED, 12, sn, cpp::REQ, 0, 8).to_vec();
    p.extend_from_slice(&sized_req(9, 1500));
    tap.send(&cpp::frame(&cpp, &our, &p, false));
    run(&mut w, &mut node, 50);
    let f = tap.take();
    assert_eq!(f.len(), 1);
    let (src_port, payload) = cpp::check_frame(&f[0], &our, &cpp);
    assert_eq!(src_port, our.port, "no RSS at a raw receiver");
    let h = cpp::parse_hdr(payload);
    assert_eq!(
        (h.pkt_type, h.pkt_num, h.msg_size, h.dsn),
        (cpp::RESP, 0, 1500, CPP_CLIENT_SESSION)
    );
    let mut data = payload[14..].to_vec();
    // The RFR for packet 1 as the raw transport's NIC sends it: a 14-byte
    // header (no trailing bytes here) in a 56-byte frame padded to 60,
    // checksum 0.
    let mut rfr = cpp::frame(&cpp, &our, &cpp::hdr(SIZED, 0, sn, cpp::RFR, 1, 8), false);
    rfr.resize(60, 0);
    tap.send(&rfr);
    run(&mut w, &mut node, 50);
    let f = tap.take();
    assert_eq!(f.len(), 1);
    let (_, payload) = cpp::check_frame(&f[0], &our, &cpp);
    let h = cpp::parse_hdr(payload);
    assert_eq!((h.pkt_type, h.pkt_num, h.req_num), (cpp::RESP, 1, 8));
    data.extend_from_slice(&payload[14..]);
    assert_eq!(data.len(), 1500);
    assert!(check_pattern(&data, 9 ^ 1));
    let st = node.rpc.transport().stats();
    assert_eq!(st.rx_ip_csum_zero, 2, "{st:?}");
    assert_eq!(st.rx_bad_ip, 0);
    assert_eq!(node.ctx.handled, 1);
    assert_eq!(node.rpc.stats().total_drops(), 0, "{}", node.rpc.stats());
}

/// Our server Rpc with a C++ DPDK client connected; returns our session
/// number (the one the C++ client addresses).
fn cpp_client_connected(seed: u64) -> (Bench<Ctx>, u16) {
    let mut b = server_bench(seed);
    let req = cpp_connect_req(&b, cpp::DPDK);
    b.net.sm_hub().inject(&b.our_uri, &req);
    let resp = b.sm_pkt();
    assert_eq!(
        (cpp::sm_type(&resp), cpp::sm_err(&resp)),
        (cpp::CONNECT_RESP, 0)
    );
    let sn = cpp::ep_session(cpp::ep(&resp, cpp::SERVER));
    (b, sn)
}

/// One C++ request packet: header and the packet's share of `body`.
fn cpp_req_pkt(req_type: u8, sn: u16, pkt_num: u16, req_num: u64, body: &[u8]) -> Vec<u8> {
    let at = usize::from(pkt_num) * 968;
    let mut p = cpp::hdr(req_type, body.len() as u32, sn, cpp::REQ, pkt_num, req_num).to_vec();
    p.extend_from_slice(&body[at..(at + 968).min(body.len())]);
    p
}

/// What a C++ client does after its retransmission timeout (go-back-N:
/// `num_tx` rolled back to `num_rx`, then request packets or RFRs resent
/// from there), and what a C++ server answers each resent packet with,
/// which is what ours must answer: the credit return again for a request
/// packet but the last, response packet 0 again for the last one once the
/// response exists, the asked response packet again for an RFR; never the
/// handler again. Stale and future packets get nothing.
#[test]
fn a_cpp_client_going_back_n_gets_what_a_cpp_server_resends() {
    let (mut b, sn) = cpp_client_connected(11);
    let mut body = vec![0u8; 2036];
    fill_pattern(&mut body, 31);

    // Request 8 (slot 0): three packets, a three-packet ECHO response.
    b.send(&cpp_req_pkt(ECHO, sn, 0, 8, &body));
    let cr0 = b.frames(1);
    assert_eq!(cr0.len(), 1);
    let (_, h, d) = b.ours(&cr0[0]);
    assert_eq!(
        (h.pkt_type, h.pkt_num, h.req_num, h.msg_size),
        (cpp::CR, 0, 8, 0)
    );
    assert!(d.is_empty());
    // The credit return was lost: C++ resends packet 0.
    b.send(&cpp_req_pkt(ECHO, sn, 0, 8, &body));
    assert_eq!(b.frames(1), cr0, "the same credit return again");
    b.send(&cpp_req_pkt(ECHO, sn, 1, 8, &body));
    let cr1 = b.frames(1);
    let (_, h, _) = b.ours(&cr1[0]);
    assert_eq!((h.pkt_type, h.pkt_num), (cpp::CR, 1));
    b.send(&cpp_req_pkt(ECHO, sn, 2, 8, &body));
    let r2 = b.frames(1);
    assert_eq!(r2.len(), 1);
    let (_, h, d) = b.ours(&r2[0]);
    assert_eq!(
        h,
        cpp::Hdr {
            req_type: ECHO,
            msg_size: 2036,
            dsn: CPP_CLIENT_SESSION,
            pkt_type: cpp::RESP,
            pkt_num: 2,
            req_num: 8,
        }
    );
    assert_eq!(d.len(), 968);
    assert_eq!(b.ctx.handled, 1);
    // The first response packet was lost: C++ (num_rx 2 after both
    // credit returns) resends request packet 2; a lost CR 1 as well makes
    // it resend packets 1 and 2.
    b.send(&cpp_req_pkt(ECHO, sn, 2, 8, &body));
    assert_eq!(b.frames(1), r2, "response packet 0 again, byte for byte");
    b.send(&cpp_req_pkt(ECHO, sn, 1, 8, &body));
    b.send(&cpp_req_pkt(ECHO, sn, 2, 8, &body));
    let f = b.frames(2);
    assert_eq!(f, [cr1[0].clone(), r2[0].clone()]);
    // RFRs: C++ has sent 3 packets, so they are numbered 3 and 4; the
    // answer to 3 was lost and C++ resends both.
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 3, 8));
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 4, 8));
    let r34 = b.frames(2);
    assert_eq!(r34.len(), 2);
    for (f, n) in r34.iter().zip([3u16, 4]) {
        let (_, h, _) = b.ours(f);
        assert_eq!(
            (h.pkt_type, h.pkt_num, h.req_num, h.msg_size),
            (cpp::RESP, n, 8, 2036)
        );
    }
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 3, 8));
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 4, 8));
    assert_eq!(b.frames(2), r34, "the same response packets again");
    let echoed: Vec<u8> = [&r2[0], &r34[0], &r34[1]]
        .iter()
        .flat_map(|f| b.ours(f).2.to_vec())
        .collect();
    assert!(echoed.iter().zip(&body).all(|(e, o)| *e == o ^ 0x5a));
    assert_eq!(echoed.len(), 2036);
    // Past the response: nothing.
    b.send(&cpp::ctrl(ECHO, sn, cpp::RFR, 5, 8));
    b.run(50);
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    assert_eq!(b.ctx.handled, 1, "the handler ran once");

    // The next request on slot 0 (16), then a massively delayed copy of
    // request 8: dropped, as C++ drops it.
    b.send(&cpp_req_pkt(ECHO, sn, 0, 16, b"next"));
    let f = b.frames(1);
    let (_, h, d) = b.ours(&f[0]);
    assert_eq!(
        (h.pkt_type, h.pkt_num, h.req_num, h.msg_size),
        (cpp::RESP, 0, 16, 4)
    );
    assert_eq!(d, b"next".map(|c| c ^ 0x5a));
    let stale = b.rpc.stats().drops(DropReason::StaleReqNum);
    b.send(&cpp_req_pkt(ECHO, sn, 2, 8, &body));
    b.run(50);
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    assert_eq!(b.rpc.stats().drops(DropReason::StaleReqNum), stale + 1);

    // Request 9 (slot 1) whose packet 0 was lost: packet 1 is out of
    // order and gets nothing; C++ resends from packet 0.
    b.send(&cpp_req_pkt(ECHO, sn, 1, 9, &body));
    b.run(50);
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    b.send(&cpp_req_pkt(ECHO, sn, 0, 9, &body));
    let f = b.frames(1);
    let (_, h, _) = b.ours(&f[0]);
    assert_eq!((h.pkt_type, h.pkt_num, h.req_num), (cpp::CR, 0, 9));
    assert_eq!(b.ctx.handled, 2);
    assert!(b.ctx.errors.is_empty(), "{:?}", b.ctx.errors);
}

fn client_bench(seed: u64) -> Bench<Client> {
    let cfg = RpcConfig {
        transport_type: TransportType::Dpdk,
        ..RpcConfig::default()
    };
    Bench::new(
        seed,
        "client:31850",
        0,
        cfg,
        |n| n,
        Client::default(),
        Some(client_event),
    )
}

/// The answer of a C++ server to connect request `req`: the request
/// copied with the response type and `err` (C++ `sm_construct_resp`), and
/// for a success the server's session number and DPDK routing info.
fn cpp_connect_answer(b: &Bench<Client>, req: &[u8; 392], err: i32) -> [u8; 392] {
    let mut p = *req;
    p[0..4].copy_from_slice(&cpp::CONNECT_RESP.to_le_bytes());
    p[4..8].copy_from_slice(&err.to_le_bytes());
    if err == 0 {
        let s = cpp::SERVER;
        p[s + 136..s + 138].copy_from_slice(&CPP_SERVER_SESSION.to_le_bytes());
        p[s + 138..s + 186].copy_from_slice(&cpp_routing(b, 3));
    }
    p
}

/// Our client connected to a C++ server; returns the session number.
fn connected_to_cpp(b: &mut Bench<Client>) -> u16 {
    let sn = b
        .rpc
        .create_session("cpp-peer:31850", CPP_SERVER_RPC)
        .unwrap();
    let req = b.sm_pkt();
    let resp = cpp_connect_answer(b, &req, 0);
    b.net.sm_hub().inject(&b.our_uri, &resp);
    b.run(10);
    assert!(b.rpc.is_connected(sn));
    sn
}

/// Our client's loss recovery, as a C++ server sees it: after the
/// retransmission timeout (5 ms) the client resends, byte for byte, the
/// packets after the last one the server acknowledged (go-back-N), so a C++
/// server finds each in order: request packets it has not returned a
/// credit for, or RFRs numbered as before.
#[test]
fn our_client_goes_back_n_as_a_cpp_server_expects() {
    let mut b = client_bench(12);
    let sn = connected_to_cpp(&mut b);

    // A lost single-packet request: the same frame again after the RTO.
    enqueue(&mut b, sn, 9, b"lost once", 64);
    let first = b.frames(1);
    assert_eq!(first.len(), 1);
    let t0 = b.rpc.now_ns();
    let again = b.frames(1);
    let waited = b.rpc.now_ns() - t0;
    assert_eq!(again, first, "the same request packet");
    assert!(
        (4_900_000..6_000_000).contains(&waited),
        "resent after {waited} ns"
    );
    let (_, h, _) = b.ours(&first[0]);
    assert_eq!((h.pkt_type, h.pkt_num, h.req_num), (cpp::REQ, 0, 8));
    let mut p = cpp::hdr(9, 2, sn, cpp::RESP, 0, 8).to_vec();
    p.extend_from_slice(b"ok");
    b.send(&p);
    b.run(10);
    assert_eq!(b.ctx.done, vec![(Ok(()), b"ok".to_vec())]);

    // A three-packet request whose credit return for packet 1 is lost:
    // packets 1 and 2 again, as they were.
    let mut body = vec![0u8; 2036];
    fill_pattern(&mut body, 8);
    enqueue(&mut b, sn, 9, &body, 64);
    let sent = b.frames(3);
    assert_eq!(sent.len(), 3);
    let rn = b.ours(&sent[0]).1.req_num;
    assert_eq!(rn, 16, "slot 0's second request");
    for (k, f) in sent.iter().enumerate() {
        let (_, h, d) = b.ours(f);
        assert_eq!(
            (h.pkt_type, h.pkt_num, h.msg_size),
            (cpp::REQ, k as u16, 2036)
        );
        assert_eq!(d, &body[k * 968..(k * 968 + 968).min(2036)]);
    }
    b.send(&cpp::ctrl(9, sn, cpp::CR, 0, rn));
    let resent = b.frames(2);
    assert_eq!(resent, sent[1..], "go-back-N from the first unacknowledged");
    b.send(&cpp::ctrl(9, sn, cpp::CR, 1, rn));
    b.send(&cpp::hdr(9, 0, sn, cpp::RESP, 2, rn));
    b.run(10);
    assert_eq!(b.ctx.done.len(), 2);
    assert_eq!(b.ctx.done[1], (Ok(()), Vec::new()));

    // A four-packet response whose packets 2 and 3 are lost: the RFRs
    // for them (numbered 2 and 3, as C++ expects them) again.
    let mut big = vec![0u8; 3000];
    fill_pattern(&mut big, 9);
    enqueue(&mut b, sn, 9, b"big", 4000);
    let f = b.frames(1);
    let rn = b.ours(&f[0]).1.req_num;
    let resp_pkt = |k: u16| {
        let at = usize::from(k) * 968;
        let mut p = cpp::hdr(9, 3000, sn, cpp::RESP, k, rn).to_vec();
        p.extend_from_slice(&big[at..(at + 968).min(3000)]);
        p
    };
    b.send(&resp_pkt(0));
    let rfrs = b.frames(3);
    assert_eq!(rfrs.len(), 3);
    for (f, k) in rfrs.iter().zip(1u16..) {
        let (_, h, d) = b.ours(f);
        assert_eq!(
            (h.pkt_type, h.pkt_num, h.req_num, h.msg_size),
            (cpp::RFR, k, rn, 0)
        );
        assert!(d.is_empty());
    }
    b.send(&resp_pkt(1));
    let again = b.frames(2);
    assert_eq!(again, rfrs[1..], "RFRs 2 and 3 again");
    b.send(&resp_pkt(2));
    b.send(&resp_pkt(3));
    b.run(10);
    assert_eq!(b.ctx.done.len(), 3);
    assert_eq!(b.ctx.done[2], (Ok(()), big.clone()));
    // A late copy of a response packet changes nothing.
    b.send(&resp_pkt(3));
    b.run(10);
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    assert_eq!(b.ctx.done.len(), 3);
    assert_eq!(b.rpc.session_retransmits(sn), Some(3));
    assert_eq!(b.rpc.session_credits(sn), Some(32), "every credit home");
    b.rpc.check_credit_invariant().unwrap();
}

/// A C++ server's response larger than our response buffer fails that
/// request with `ResponseTooLarge` (C++ itself would overrun its buffer);
/// no RFR is sent for the rest, and the next request on the slot is the
/// next number, which a C++ server takes.
#[test]
fn a_cpp_response_larger_than_the_buffer_fails_only_its_request() {
    let mut b = client_bench(13);
    let sn = connected_to_cpp(&mut b);
    enqueue(&mut b, sn, 9, b"small buffer", 64);
    let f = b.frames(1);
    assert_eq!(b.ours(&f[0]).1.req_num, 8);
    let mut p = cpp::hdr(9, 5000, sn, cpp::RESP, 0, 8).to_vec();
    p.extend_from_slice(&[7; 968]);
    b.send(&p);
    b.run(50);
    assert!(b.net.take_captured(b.cpp_ep).is_empty(), "no RFR");
    assert_eq!(b.ctx.done.len(), 1);
    assert_eq!(
        b.ctx.done[0].0,
        Err(erpc::RpcError::ResponseTooLarge {
            size: 5000,
            capacity: 64
        })
    );
    assert_eq!(b.rpc.session_credits(sn), Some(32));
    enqueue(&mut b, sn, 9, b"again", 64);
    let f = b.frames(1);
    let (_, h, _) = b.ours(&f[0]);
    assert_eq!((h.pkt_type, h.req_num), (cpp::REQ, 16));
    let mut p = cpp::hdr(9, 3, sn, cpp::RESP, 0, 16).to_vec();
    p.extend_from_slice(b"yes");
    b.send(&p);
    b.run(10);
    assert_eq!(b.ctx.done[1], (Ok(()), b"yes".to_vec()));
}

/// A server that answers before it has our whole request (a misbehaving
/// or hostile peer) completes the request while its last packets are
/// still in our TX batch, here because the transport refuses them. The
/// request buffer goes back to the application at once, so those packets
/// must never leave: they are forgotten (counted as stale), and what goes
/// out once the transport takes packets again is only the next request,
/// intact, even though its buffer is very likely the same memory.
#[test]
fn packets_still_queued_when_their_request_completes_never_leave() {
    let mut b = client_bench(14);
    let sn = connected_to_cpp(&mut b);
    b.net.refuse_tx(b.our_ep, 1_000_000);
    let mut body = vec![0u8; 2036];
    fill_pattern(&mut body, 3);
    enqueue(&mut b, sn, 9, &body, 64);
    b.run(3);
    assert!(b.rpc.stats().tx_refused >= 3, "{}", b.rpc.stats());
    assert!(b.net.take_captured(b.cpp_ep).is_empty());
    // Credit returns for packets 0 and 1, then the "response" to request
    // 8, as if all three packets had arrived.
    b.send(&cpp::ctrl(9, sn, cpp::CR, 0, 8));
    b.send(&cpp::ctrl(9, sn, cpp::CR, 1, 8));
    let mut p = cpp::hdr(9, 2, sn, cpp::RESP, 2, 8).to_vec();
    p.extend_from_slice(b"ok");
    b.send(&p);
    b.run(3);
    assert_eq!(
        b.ctx.done,
        vec![(Ok(()), b"ok".to_vec())],
        "{}",
        b.rpc.stats()
    );
    assert_eq!(b.rpc.stats().tx_stale, 3, "{}", b.rpc.stats());
    // The next request, on the freed memory; then the transport recovers.
    let mut next = vec![0u8; 2036];
    fill_pattern(&mut next, 4);
    enqueue(&mut b, sn, 9, &next, 64);
    b.net.refuse_tx(b.our_ep, 0);
    let sent = b.frames(3);
    assert_eq!(sent.len(), 3, "only the new request's packets");
    for (k, f) in sent.iter().enumerate() {
        let (_, h, d) = b.ours(f);
        assert_eq!((h.pkt_type, h.pkt_num, h.req_num), (cpp::REQ, k as u16, 16));
        assert_eq!(d, &next[k * 968..(k * 968 + 968).min(2036)]);
    }
    b.rpc.check_credit_invariant().unwrap();
}

/// The errors a C++ server (or its SM thread) answers a connect request
/// with end our connect with that error; until answered, the request goes
/// out again every 100 ms, unchanged, so the C++ server can recognise it
/// by its token. A late duplicate of an answer changes nothing.
#[test]
fn our_client_takes_a_cpp_servers_connect_errors() {
    let mut b = client_bench(14);
    let cases = [
        (5, erpc::SmErr::InvalidRemoteRpcId),
        (2, erpc::SmErr::RingExhausted),
        (6, erpc::SmErr::InvalidTransport),
        (4, erpc::SmErr::RoutingResolutionFailure),
        (3, erpc::SmErr::OutOfMemory),
    ];
    for (k, (code, err)) in cases.into_iter().enumerate() {
        let sn = b
            .rpc
            .create_session("cpp-peer:31850", CPP_SERVER_RPC)
            .unwrap();
        let req = b.sm_pkt();
        assert_eq!(cpp::sm_type(&req), cpp::CONNECT_REQ);
        if k == 0 {
            let t0 = b.rpc.now_ns();
            b.run(90_000);
            assert!(
                b.net.sm_hub().take_tapped(&b.cpp_uri).is_empty(),
                "no retry within 90 ms"
            );
            let retry = b.sm_pkt();
            let waited = b.rpc.now_ns() - t0;
            assert_eq!(retry, req, "the same request again");
            assert!(
                (99_000_000..101_000_000).contains(&waited),
                "retried after {waited} ns"
            );
        }
        let resp = cpp_connect_answer(&b, &req, code);
        b.net.sm_hub().inject(&b.our_uri, &resp);
        b.run(10);
        assert_eq!(
            b.rpc.session_state(sn),
            None,
            "{err:?}: the session is gone"
        );
        assert_eq!(
            b.ctx.events.last().map(|e| (e.session, e.kind)),
            Some((
                sn,
                SessionEventKind::Ended(erpc::SessionEnd::ConnectFailed(err))
            ))
        );
        assert_eq!(b.rpc.rx_ring_unreserved().0, 4096);
        let stale = b.rpc.stats().drops(DropReason::SmStale);
        let events = b.ctx.events.len();
        b.net.sm_hub().inject(&b.our_uri, &resp);
        b.run(10);
        assert_eq!(b.rpc.stats().drops(DropReason::SmStale), stale + 1);
        assert_eq!(b.ctx.events.len(), events);
    }
    b.run(200_000);
    assert!(
        b.net.sm_hub().take_tapped(&b.cpp_uri).is_empty(),
        "no retries after the answers"
    );
}

/// Session management edge cases a C++ client produces: a connect request
/// for an Rpc id nobody has (the Nexus answers "invalid remote Rpc id",
/// the request echoed, as the C++ SM thread does), a retransmitted
/// disconnect request after the session is gone (answered again), and a
/// late copy of the connect request after the disconnect (ignored, never
/// a new session).
#[test]
fn a_cpp_clients_session_management_edge_cases() {
    let mut b = server_bench(15);
    let client = cpp::endpoint(
        cpp::DPDK,
        "cpp-peer",
        31850,
        CPP_CLIENT_RPC,
        CPP_CLIENT_SESSION,
        &cpp_routing(&b, 0),
    );
    let nobody = cpp::endpoint(cpp::DPDK, "server", 31850, 9, 0xffff, &[0; 48]);
    let req = cpp::sm(cpp::CONNECT_REQ, 0, TOKEN ^ 1, &client, &nobody);
    b.net.sm_hub().inject(&b.our_uri, &req);
    let resp = b.sm_pkt();
    assert_eq!(cpp::sm_type(&resp), cpp::CONNECT_RESP);
    assert_eq!(cpp::sm_err(&resp), 5, "invalid remote Rpc id");
    assert_eq!(&resp[8..], &req[8..], "token and endpoints echoed");
    assert_eq!(b.rpc.num_sessions(), 0);

    // Connect, then disconnect twice (the first answer was lost).
    let req = cpp_connect_req(&b, cpp::DPDK);
    b.net.sm_hub().inject(&b.our_uri, &req);
    let resp = b.sm_pkt();
    assert_eq!(cpp::sm_err(&resp), 0);
    let server: [u8; 188] = cpp::ep(&resp, cpp::SERVER).try_into().unwrap();
    let disc = cpp::sm(cpp::DISCONNECT_REQ, 0, TOKEN, &client, &server);
    for _ in 0..2 {
        b.net.sm_hub().inject(&b.our_uri, &disc);
        let dresp = b.sm_pkt();
        assert_eq!(cpp::sm_type(&dresp), cpp::DISCONNECT_RESP);
        assert_eq!(cpp::sm_err(&dresp), 0);
        assert_eq!(&dresp[8..], &disc[8..]);
        assert_eq!(b.rpc.num_sessions(), 0);
    }
    // The connect request once more, late: C++ remembers the token and
    // ignores it; so do we.
    b.net.sm_hub().inject(&b.our_uri, &req);
    b.run(1_000);
    assert!(b.net.sm_hub().take_tapped(&b.cpp_uri).is_empty());
    assert_eq!(b.rpc.num_sessions(), 0);
    assert_eq!(b.rpc.rx_ring_unreserved().0, 4096);
}

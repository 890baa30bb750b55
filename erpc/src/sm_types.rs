//! Session-management packets: 392 bytes, the C++ eRPC's `SmPkt` in its C
//! layout on x86 (little-endian, natural padding).
//!
//! | offset | field |
//! |---|---|
//! | 0 | packet type (i32) |
//! | 4 | error (i32) |
//! | 8 | unique token (u64) |
//! | 16 | client endpoint (188 B) |
//! | 204 | server endpoint (188 B) |
//!
//! Endpoint: transport type i32 at 0, hostname `char[128]` at 4, SM UDP
//! port u16 at 132, Rpc id u8 at 134, session number u16 at 136, routing
//! info (48 B) at 138, 2 bytes of tail padding.

use std::fmt;

use transport::{ROUTING_INFO_BYTES, RoutingInfo};

use crate::consts::INVALID_SESSION_NUM;

/// Bytes of one SM packet.
pub const SM_PKT_BYTES: usize = 392;
/// Bytes of one endpoint.
pub const SM_ENDPOINT_BYTES: usize = 188;
/// Bytes of the hostname field (NUL-terminated).
pub const HOSTNAME_BYTES: usize = 128;

const EP_TRANSPORT: usize = 0;
const EP_HOSTNAME: usize = 4;
const EP_SM_PORT: usize = EP_HOSTNAME + HOSTNAME_BYTES;
const EP_RPC_ID: usize = EP_SM_PORT + 2;
const EP_SESSION: usize = EP_RPC_ID + 2;
const EP_ROUTING: usize = EP_SESSION + 2;
const PKT_TYPE: usize = 0;
const PKT_ERR: usize = 4;
const PKT_TOKEN: usize = 8;
const PKT_CLIENT: usize = 16;
const PKT_SERVER: usize = PKT_CLIENT + SM_ENDPOINT_BYTES;

const _: () = assert!(EP_SM_PORT == 132 && EP_RPC_ID == 134 && EP_SESSION == 136);
const _: () =
    assert!(EP_ROUTING == 138 && EP_ROUTING + ROUTING_INFO_BYTES + 2 == SM_ENDPOINT_BYTES);
const _: () = assert!(PKT_SERVER == 204 && PKT_SERVER + SM_ENDPOINT_BYTES == SM_PKT_BYTES);

/// SM packet type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum SmPktType {
    /// Wakes the SM thread (never sent between processes by us).
    Unblock = 0,
    /// Ping request (C++ failure detection).
    PingReq = 1,
    /// Ping response.
    PingResp = 2,
    /// Connect request.
    ConnectReq = 3,
    /// Connect response.
    ConnectResp = 4,
    /// Disconnect request.
    DisconnectReq = 5,
    /// Disconnect response.
    DisconnectResp = 6,
}

impl SmPktType {
    /// From the wire value.
    pub fn from_i32(v: i32) -> Option<SmPktType> {
        Some(match v {
            0 => SmPktType::Unblock,
            1 => SmPktType::PingReq,
            2 => SmPktType::PingResp,
            3 => SmPktType::ConnectReq,
            4 => SmPktType::ConnectResp,
            5 => SmPktType::DisconnectReq,
            6 => SmPktType::DisconnectResp,
            _ => return None,
        })
    }

    /// True for packet types a client sends (the server answers them).
    pub fn is_req(self) -> bool {
        matches!(
            self,
            SmPktType::PingReq | SmPktType::ConnectReq | SmPktType::DisconnectReq
        )
    }

    /// The response type for a request type.
    pub fn resp_type(self) -> Option<SmPktType> {
        match self {
            SmPktType::PingReq => Some(SmPktType::PingResp),
            SmPktType::ConnectReq => Some(SmPktType::ConnectResp),
            SmPktType::DisconnectReq => Some(SmPktType::DisconnectResp),
            _ => None,
        }
    }
}

/// SM error code, as the C++ `SmErrType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(i32)]
pub enum SmErr {
    /// No error.
    #[error("no error")]
    NoError = 0,
    /// The server has disconnected the session.
    #[error("server disconnected")]
    SrvDisconnected = 1,
    /// The server's RX ring has no room for another session's credits.
    #[error("server RX ring exhausted")]
    RingExhausted = 2,
    /// The server could not allocate the session's buffers.
    #[error("server out of memory")]
    OutOfMemory = 3,
    /// The server could not resolve the client's routing info.
    #[error("routing resolution failure")]
    RoutingResolutionFailure = 4,
    /// No Rpc with the requested id at the server.
    #[error("invalid remote Rpc id")]
    InvalidRemoteRpcId = 5,
    /// Client and server use different transports.
    #[error("invalid transport")]
    InvalidTransport = 6,
}

impl SmErr {
    /// From the wire value.
    pub fn from_i32(v: i32) -> Option<SmErr> {
        Some(match v {
            0 => SmErr::NoError,
            1 => SmErr::SrvDisconnected,
            2 => SmErr::RingExhausted,
            3 => SmErr::OutOfMemory,
            4 => SmErr::RoutingResolutionFailure,
            5 => SmErr::InvalidRemoteRpcId,
            6 => SmErr::InvalidTransport,
            _ => return None,
        })
    }
}

/// Transport type in an SM endpoint (C++ `TransportType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TransportType {
    /// InfiniBand verbs.
    InfiniBand = 0,
    /// Raw Ethernet: the C++ mlx5-verbs transport (IPv4 checksum 0).
    Raw = 1,
    /// DPDK: Ethernet/IPv4/UDP frames with the IPv4 checksum. Our UDP and
    /// mlx5 transports send the same frames as DPDK and may present either
    /// type (`RpcConfig::transport_type`).
    Dpdk = 2,
    /// The C++ fake transport (matches only itself).
    Fake = 3,
}

impl TransportType {
    /// From the wire value.
    pub fn from_i32(v: i32) -> Option<TransportType> {
        Some(match v {
            0 => TransportType::InfiniBand,
            1 => TransportType::Raw,
            2 => TransportType::Dpdk,
            3 => TransportType::Fake,
            _ => return None,
        })
    }
}

/// Offset, in an endpoint's 48-byte routing info, of the erpc-rs
/// extension: the sending Nexus's incarnation (u64 LE, non-zero, ordered by
/// creation time: milliseconds since the Unix epoch above 20 random bits,
/// so a restarted process's is larger; see `nexus::liveness`).
///
/// The Ethernet routing info the C++ eRPC defines uses bytes 0..20; C++
/// leaves the rest zero and echoes endpoints unchanged, and our transports
/// ignore it. A non-zero incarnation tells an erpc-rs peer that this end
/// answers keep-alive pings (a C++ eRPC process must never be pinged: its
/// SM thread reads past its Rpc table for the invalid Rpc id a ping
/// carries, or throws if the ping reaches an Rpc), and lets it notice a
/// restarted process behind an unchanged URI. A C++ peer's zero means "no
/// incarnation", never "older": nothing compares it.
pub const EXT_INCARNATION: usize = 40;
/// Bytes of the live-Rpc bitmap in a keep-alive ping's routing info (ping
/// endpoints carry no transport routing info).
pub const EXT_RPC_BITMAP_BYTES: usize = 32;
/// Offset, in a connect packet's endpoint routing info, of the erpc-rs
/// request-number base (u64 LE, a multiple of the slot count): slot `i`
/// of the session numbers its requests `base + i + 8k` instead of
/// `i + 8k`. The client proposes a random base in its endpoint; an erpc-rs
/// server adopts it and echoes it in its own endpoint; a C++ server
/// leaves its endpoint's tail zero, so base 0 (the C++ numbering) is used
/// with it. A random base means a packet of another session or of an
/// earlier process that happens to carry this session's number (a
/// restarted peer reusing session numbers) cannot carry a request number
/// this session expects.
pub const EXT_REQ_BASE: usize = 32;
/// Offset, in a connect packet's endpoint routing info, of the erpc-rs
/// session-credit field (u32 LE). In the client's endpoint: the credits
/// the client wants per session (its `RpcConfig::session_credits`). In the
/// server's: the credits the server granted, which is the number of RX
/// ring entries it reserved for the session (at most the client's wish);
/// the client never has more packets outstanding than that. A C++ peer
/// leaves the field zero and always uses (and reserves) its fixed 32
/// credits (`kSessionCredits`), so 0 means 32.
pub const EXT_CREDITS: usize = 20;
/// Offset, in the server endpoint of a "server disconnected" notice (a
/// connect response with `SmErr::SrvDisconnected` for a connected
/// session), of the erpc-rs reason byte: [`END_RECLAIMED`] (or 0, from a
/// server that predates it) or [`END_BY_SERVER`].
pub const EXT_END_REASON: usize = 24;
/// The server reclaimed the session unused: no request of it ran.
pub const END_RECLAIMED: u8 = 1;
/// The server ended the session (its application reset it, or it
/// declared the client failed): a request may have run.
pub const END_BY_SERVER: u8 = 2;
const _: () = assert!(EXT_CREDITS + 4 <= EXT_END_REASON && EXT_END_REASON < EXT_REQ_BASE);
const _: () = assert!(EXT_RPC_BITMAP_BYTES <= EXT_INCARNATION);
const _: () = assert!(EXT_CREDITS + 4 <= EXT_REQ_BASE);
const _: () = assert!(EXT_INCARNATION + 8 <= ROUTING_INFO_BYTES);
const _: () = assert!(EXT_REQ_BASE + 8 <= EXT_INCARNATION);
// The Ethernet routing info (MAC, pad, IPv4, UDP port, RX queue, RSS
// table size) ends at byte 18 (C++ pads its struct to 20).
const _: () = assert!(20 <= EXT_CREDITS);

/// One side of a session, as carried in SM packets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SmEndpoint {
    /// Transport type.
    pub transport_type: TransportType,
    /// Hostname (NUL-padded; at most 127 bytes used).
    pub hostname: [u8; HOSTNAME_BYTES],
    /// SM UDP port of the endpoint's Nexus.
    pub sm_udp_port: u16,
    /// Rpc id within the Nexus.
    pub rpc_id: u8,
    /// Session number at this endpoint ([`INVALID_SESSION_NUM`] if none yet).
    pub session_num: u16,
    /// Routing info (48 bytes on the wire).
    pub routing_info: [u8; ROUTING_INFO_BYTES],
}

impl Default for SmEndpoint {
    fn default() -> Self {
        SmEndpoint {
            transport_type: TransportType::Raw,
            hostname: [0; HOSTNAME_BYTES],
            sm_udp_port: 0,
            rpc_id: 0,
            session_num: INVALID_SESSION_NUM,
            routing_info: [0; ROUTING_INFO_BYTES],
        }
    }
}

/// What a session keeps of one end's [`SmEndpoint`]: all but the
/// hostname's 128 bytes (kept once, as the bytes it has; see
/// [`SmEndpoint::split`]), so that an idle session stays small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndpointFields {
    pub transport_type: TransportType,
    pub sm_udp_port: u16,
    pub rpc_id: u8,
    pub session_num: u16,
    pub routing_info: [u8; ROUTING_INFO_BYTES],
}

impl EndpointFields {
    /// The endpoint again, with hostname `host` (its bytes up to the NUL,
    /// as [`SmEndpoint::split`] kept them).
    pub(crate) fn with_host(&self, host: &[u8]) -> SmEndpoint {
        let mut hostname = [0u8; HOSTNAME_BYTES];
        let n = host.len().min(HOSTNAME_BYTES - 1);
        hostname[..n].copy_from_slice(&host[..n]);
        SmEndpoint {
            transport_type: self.transport_type,
            hostname,
            sm_udp_port: self.sm_udp_port,
            rpc_id: self.rpc_id,
            session_num: self.session_num,
            routing_info: self.routing_info,
        }
    }
}

impl SmEndpoint {
    /// The endpoint without its hostname, and the hostname's bytes up to
    /// its NUL ([`EndpointFields::with_host`] puts them together again).
    pub(crate) fn split(&self) -> (EndpointFields, Box<[u8]>) {
        let end = self
            .hostname
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(HOSTNAME_BYTES);
        (
            EndpointFields {
                transport_type: self.transport_type,
                sm_udp_port: self.sm_udp_port,
                rpc_id: self.rpc_id,
                session_num: self.session_num,
                routing_info: self.routing_info,
            },
            self.hostname[..end].into(),
        )
    }

    /// Sets the hostname; `None` if it does not fit (127 bytes + NUL) or
    /// contains a NUL.
    pub fn set_hostname(&mut self, host: &str) -> Option<()> {
        let b = host.as_bytes();
        if b.len() >= HOSTNAME_BYTES || b.contains(&0) {
            return None;
        }
        self.hostname = [0; HOSTNAME_BYTES];
        self.hostname[..b.len()].copy_from_slice(b);
        Some(())
    }

    /// The hostname up to its NUL, if it is UTF-8.
    pub fn hostname_str(&self) -> Option<&str> {
        let end = self.hostname.iter().position(|&c| c == 0)?;
        std::str::from_utf8(&self.hostname[..end]).ok()
    }

    /// Routing info decoded as Ethernet routing info.
    pub fn routing(&self) -> RoutingInfo {
        RoutingInfo::from_bytes(&self.routing_info)
    }

    /// The erpc-rs Nexus incarnation carried in this endpoint (see
    /// [`EXT_INCARNATION`]); 0 from a C++ peer or an old packet.
    pub fn incarnation(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.routing_info[EXT_INCARNATION..EXT_INCARNATION + 8]);
        u64::from_le_bytes(b)
    }

    /// Writes the Nexus incarnation into the routing-info tail.
    pub fn set_incarnation(&mut self, inc: u64) {
        self.routing_info[EXT_INCARNATION..EXT_INCARNATION + 8].copy_from_slice(&inc.to_le_bytes());
    }

    /// The request-number base this endpoint proposes or adopted (see
    /// [`EXT_REQ_BASE`]); 0 from a C++ peer.
    pub fn req_base(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.routing_info[EXT_REQ_BASE..EXT_REQ_BASE + 8]);
        u64::from_le_bytes(b)
    }

    /// Writes the request-number base.
    pub fn set_req_base(&mut self, base: u64) {
        self.routing_info[EXT_REQ_BASE..EXT_REQ_BASE + 8].copy_from_slice(&base.to_le_bytes());
    }

    /// The session credits this endpoint asks for or granted (see
    /// [`EXT_CREDITS`]); 0 from a C++ peer.
    pub fn credits(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.routing_info[EXT_CREDITS..EXT_CREDITS + 4]);
        u32::from_le_bytes(b)
    }

    /// Writes the session-credit field.
    pub fn set_credits(&mut self, credits: u32) {
        self.routing_info[EXT_CREDITS..EXT_CREDITS + 4].copy_from_slice(&credits.to_le_bytes());
    }

    /// The reason byte of a "server disconnected" notice (see
    /// [`EXT_END_REASON`]).
    pub fn end_reason(&self) -> u8 {
        self.routing_info[EXT_END_REASON]
    }

    /// Sets the reason byte of a "server disconnected" notice.
    pub fn set_end_reason(&mut self, reason: u8) {
        self.routing_info[EXT_END_REASON] = reason;
    }

    /// The bitmap of live Rpc ids a keep-alive ping carries (bit `i` of
    /// byte `i / 8`), in the routing info's first [`EXT_RPC_BITMAP_BYTES`].
    pub fn rpc_bitmap(&self) -> [u8; EXT_RPC_BITMAP_BYTES] {
        let mut b = [0u8; EXT_RPC_BITMAP_BYTES];
        b.copy_from_slice(&self.routing_info[..EXT_RPC_BITMAP_BYTES]);
        b
    }

    /// Sets the live-Rpc bitmap of a keep-alive ping.
    pub fn set_rpc_bitmap(&mut self, bitmap: &[u8; EXT_RPC_BITMAP_BYTES]) {
        self.routing_info[..EXT_RPC_BITMAP_BYTES].copy_from_slice(bitmap);
    }

    /// "host:port" of this endpoint's Nexus.
    pub fn uri(&self) -> Option<crate::Uri> {
        Some(crate::Uri::new(self.hostname_str()?, self.sm_udp_port))
    }

    fn encode(&self, o: &mut [u8]) {
        o[EP_TRANSPORT..EP_TRANSPORT + 4]
            .copy_from_slice(&(self.transport_type as i32).to_le_bytes());
        o[EP_HOSTNAME..EP_HOSTNAME + HOSTNAME_BYTES].copy_from_slice(&self.hostname);
        o[EP_SM_PORT..EP_SM_PORT + 2].copy_from_slice(&self.sm_udp_port.to_le_bytes());
        o[EP_RPC_ID] = self.rpc_id;
        o[EP_RPC_ID + 1] = 0;
        o[EP_SESSION..EP_SESSION + 2].copy_from_slice(&self.session_num.to_le_bytes());
        o[EP_ROUTING..EP_ROUTING + ROUTING_INFO_BYTES].copy_from_slice(&self.routing_info);
        o[EP_ROUTING + ROUTING_INFO_BYTES..SM_ENDPOINT_BYTES].fill(0);
    }

    fn decode(b: &[u8]) -> Result<SmEndpoint, SmDecodeError> {
        let t = i32::from_le_bytes(le4(b, EP_TRANSPORT));
        let transport_type =
            TransportType::from_i32(t).ok_or(SmDecodeError::BadTransportType(t))?;
        let mut hostname = [0u8; HOSTNAME_BYTES];
        hostname.copy_from_slice(&b[EP_HOSTNAME..EP_HOSTNAME + HOSTNAME_BYTES]);
        if !hostname.contains(&0) {
            return Err(SmDecodeError::HostnameNotTerminated);
        }
        let mut routing_info = [0u8; ROUTING_INFO_BYTES];
        routing_info.copy_from_slice(&b[EP_ROUTING..EP_ROUTING + ROUTING_INFO_BYTES]);
        Ok(SmEndpoint {
            transport_type,
            hostname,
            sm_udp_port: u16::from_le_bytes([b[EP_SM_PORT], b[EP_SM_PORT + 1]]),
            rpc_id: b[EP_RPC_ID],
            session_num: u16::from_le_bytes([b[EP_SESSION], b[EP_SESSION + 1]]),
            routing_info,
        })
    }
}

impl fmt::Debug for SmEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SmEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:?} {}:{} rpc {} session {}]",
            self.transport_type,
            self.hostname_str().unwrap_or("?"),
            self.sm_udp_port,
            self.rpc_id,
            self.session_num
        )
    }
}

fn le4(b: &[u8], o: usize) -> [u8; 4] {
    [b[o], b[o + 1], b[o + 2], b[o + 3]]
}

/// Why 392 bytes are not an SM packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SmDecodeError {
    /// Wrong length.
    #[error("SM packet of {0} bytes (expected {SM_PKT_BYTES})")]
    BadLength(usize),
    /// Unknown packet type.
    #[error("unknown SM packet type {0}")]
    BadPktType(i32),
    /// Unknown error code.
    #[error("unknown SM error code {0}")]
    BadErr(i32),
    /// Unknown transport type.
    #[error("unknown transport type {0}")]
    BadTransportType(i32),
    /// Hostname without NUL.
    #[error("hostname not NUL-terminated")]
    HostnameNotTerminated,
}

/// A session-management packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmPkt {
    /// Packet type.
    pub pkt_type: SmPktType,
    /// Error code (responses).
    pub err: SmErr,
    /// Random token chosen by the client per session.
    pub uniq_token: u64,
    /// The client's endpoint.
    pub client: SmEndpoint,
    /// The server's endpoint.
    pub server: SmEndpoint,
}

impl SmPkt {
    /// Encodes into the 392-byte wire form.
    pub fn encode(&self) -> [u8; SM_PKT_BYTES] {
        let mut b = [0u8; SM_PKT_BYTES];
        b[PKT_TYPE..PKT_TYPE + 4].copy_from_slice(&(self.pkt_type as i32).to_le_bytes());
        b[PKT_ERR..PKT_ERR + 4].copy_from_slice(&(self.err as i32).to_le_bytes());
        b[PKT_TOKEN..PKT_TOKEN + 8].copy_from_slice(&self.uniq_token.to_le_bytes());
        self.client
            .encode(&mut b[PKT_CLIENT..PKT_CLIENT + SM_ENDPOINT_BYTES]);
        self.server
            .encode(&mut b[PKT_SERVER..PKT_SERVER + SM_ENDPOINT_BYTES]);
        b
    }

    /// Decodes and validates the wire form.
    pub fn decode(b: &[u8]) -> Result<SmPkt, SmDecodeError> {
        if b.len() != SM_PKT_BYTES {
            return Err(SmDecodeError::BadLength(b.len()));
        }
        let t = i32::from_le_bytes(le4(b, PKT_TYPE));
        let e = i32::from_le_bytes(le4(b, PKT_ERR));
        let mut tok = [0u8; 8];
        tok.copy_from_slice(&b[PKT_TOKEN..PKT_TOKEN + 8]);
        Ok(SmPkt {
            pkt_type: SmPktType::from_i32(t).ok_or(SmDecodeError::BadPktType(t))?,
            err: SmErr::from_i32(e).ok_or(SmDecodeError::BadErr(e))?,
            uniq_token: u64::from_le_bytes(tok),
            client: SmEndpoint::decode(&b[PKT_CLIENT..PKT_CLIENT + SM_ENDPOINT_BYTES])?,
            server: SmEndpoint::decode(&b[PKT_SERVER..PKT_SERVER + SM_ENDPOINT_BYTES])?,
        })
    }

    /// The response to this request: same endpoints and token, the response
    /// type and `err`.
    pub fn response(&self, err: SmErr) -> SmPkt {
        let mut r = *self;
        r.pkt_type = self.pkt_type.resp_type().unwrap_or(self.pkt_type);
        r.err = err;
        r
    }
}

impl fmt::Display for SmPkt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:?}, {:?}, token {:#x}, client {}, server {}]",
            self.pkt_type, self.err, self.uniq_token, self.client, self.server
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn sample() -> SmPkt {
        let mut client = SmEndpoint {
            transport_type: TransportType::Raw,
            sm_udp_port: 31850,
            rpc_id: 3,
            session_num: 0x0102,
            routing_info: RoutingInfo {
                mac: [2, 0, 0, 0, 0, 1],
                ipv4: Ipv4Addr::new(10, 0, 0, 1),
                udp_port: 31882,
                rxq_id: 3,
                rss_table_size: 0,
            }
            .to_bytes(),
            ..SmEndpoint::default()
        };
        client.set_hostname("10.0.0.1").unwrap();
        let mut server = SmEndpoint {
            sm_udp_port: 31851,
            rpc_id: 7,
            ..SmEndpoint::default()
        };
        server.set_hostname("10.0.0.2").unwrap();
        SmPkt {
            pkt_type: SmPktType::ConnectReq,
            err: SmErr::NoError,
            uniq_token: 0x1122_3344_5566_7788,
            client,
            server,
        }
    }

    /// Byte-for-byte the C layout of `SmPkt` on x86-64.
    #[test]
    fn layout_matches_cpp_byte_for_byte() {
        let p = sample();
        let b = p.encode();
        assert_eq!(b.len(), 392);
        assert_eq!(&b[0..4], &3i32.to_le_bytes());
        assert_eq!(&b[4..8], &0i32.to_le_bytes());
        assert_eq!(&b[8..16], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        // Client endpoint at 16.
        assert_eq!(&b[16..20], &1i32.to_le_bytes());
        assert_eq!(&b[20..28], b"10.0.0.1");
        assert!(b[28..148].iter().all(|&c| c == 0));
        assert_eq!(&b[148..150], &31850u16.to_le_bytes());
        assert_eq!(b[150], 3);
        assert_eq!(b[151], 0, "pad after rpc id");
        assert_eq!(&b[152..154], &[0x02, 0x01]);
        // Routing info at 16 + 138 = 154: MAC, 2 pad, IPv4 (host order), port.
        assert_eq!(&b[154..160], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&b[160..162], &[0, 0]);
        assert_eq!(
            &b[162..166],
            &u32::from(Ipv4Addr::new(10, 0, 0, 1)).to_le_bytes()
        );
        assert_eq!(&b[166..168], &31882u16.to_le_bytes());
        assert_eq!(&b[168..170], &3u16.to_le_bytes());
        assert!(b[174..204].iter().all(|&c| c == 0), "routing tail + pad");
        // Server endpoint at 204.
        assert_eq!(&b[204..208], &1i32.to_le_bytes());
        assert_eq!(&b[208..216], b"10.0.0.2");
        assert_eq!(&b[336..338], &31851u16.to_le_bytes());
        assert_eq!(b[338], 7);
        assert_eq!(&b[340..342], &[0xff, 0xff], "invalid session number");
        assert!(b[342..392].iter().all(|&c| c == 0));
        assert_eq!(SmPkt::decode(&b), Ok(p));
    }

    #[test]
    fn decode_rejects_by_reason() {
        let b = sample().encode();
        assert_eq!(SmPkt::decode(&b[..391]), Err(SmDecodeError::BadLength(391)));
        let mut c = b;
        c[0] = 7;
        assert_eq!(SmPkt::decode(&c), Err(SmDecodeError::BadPktType(7)));
        let mut c = b;
        c[4] = 9;
        assert_eq!(SmPkt::decode(&c), Err(SmDecodeError::BadErr(9)));
        let mut c = b;
        c[204] = 4;
        assert_eq!(SmPkt::decode(&c), Err(SmDecodeError::BadTransportType(4)));
        let mut c = b;
        c[20..148].fill(b'a');
        assert_eq!(SmPkt::decode(&c), Err(SmDecodeError::HostnameNotTerminated));
    }

    #[test]
    fn every_type_and_error_round_trips() {
        for t in 0..7 {
            for e in 0..7 {
                let mut p = sample();
                p.pkt_type = SmPktType::from_i32(t).unwrap();
                p.err = SmErr::from_i32(e).unwrap();
                assert_eq!(SmPkt::decode(&p.encode()), Ok(p));
            }
        }
        let r = sample().response(SmErr::RingExhausted);
        assert_eq!(r.pkt_type, SmPktType::ConnectResp);
        assert_eq!(r.uniq_token, sample().uniq_token);
    }

    #[test]
    fn hostname_limits() {
        let mut e = SmEndpoint::default();
        assert!(e.set_hostname(&"x".repeat(127)).is_some());
        assert_eq!(e.hostname_str().unwrap().len(), 127);
        assert!(e.set_hostname(&"x".repeat(128)).is_none());
        assert!(e.set_hostname("a\0b").is_none());
    }
}

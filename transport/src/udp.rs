//! The kernel UDP transport: one non-blocking UDP socket per Rpc, batched
//! with `sendmmsg`/`recvmmsg`, so eRPC runs on any Linux machine (and gives
//! the kernel-overhead reference point for the mlx5 transport).
//!
//! It keeps the zero-copy shape of [`Transport`]:
//!
//! * **TX**: the kernel builds the Ethernet/IPv4/UDP headers, so
//!   [`Transport::fill_headroom`] does nothing. A burst becomes one
//!   `sendmmsg`; each datagram is gathered from two iovecs pointing into the
//!   caller's buffers (`pkt` after the headroom, then `data`), so nothing is
//!   copied before the kernel copies it into its socket buffer. Within a
//!   burst, a run of datagrams to one peer with one payload size goes as
//!   one `sendmsg` with UDP GSO (`UDP_SEGMENT`): the stack routes and builds
//!   one large datagram and cuts it into the original ones, which the peer
//!   receives one by one as if sent separately (if the kernel refuses GSO
//!   for this socket's path, the transport stops using it); a lone
//!   datagram goes with `sendto`. When the call returns, the buffers are
//!   free again: [`Transport::tx_flush`] has nothing to wait for.
//! * **RX**: a preallocated ring of `rx_ring_entries` slots of [`MTU`] bytes
//!   behaves like a NIC's receive queue. `recvmmsg` writes datagrams straight
//!   into the free slots that come next in ring order; a slot is free again
//!   only after eRPC gives it back with [`Transport::post_recvs`]. The ring
//!   is shared (`Rc`) with its one [`UdpRing`] handle, which reads held
//!   slots without borrowing the transport.
//!
//! # Routing info
//! The advertised IPv4 address and the bound port, the MAC of the
//! interface that carries that address (looked up with `getifaddrs` when
//! the transport is created; zero on loopback, which has no link-layer
//! address: only a process on the same host can reach 127.0.0.1 anyway, and
//! our own transports do not need a MAC), RX queue 0 and an RSS table size
//! of 1: the socket receives exactly what is sent to its port, whatever the
//! source port, so a C++ DPDK peer's source-port search ends at its first
//! port. [`UdpConfig::mac`] overrides the lookup.
//!
//! # Routes, and source ports for peers that use RSS
//! A route is the peer's socket address, prebuilt in the kernel's layout.
//! Datagrams go out of the transport's own socket, so their source port is
//! the bound port, except toward a peer whose routing info has an RSS table
//! of more than one entry (a multi-queue C++ DPDK receiver): its NIC picks
//! the RX queue from a hash that includes our source port, so the port must
//! be one that lands on the peer's queue ([`crate::rss`]). For such a peer,
//! [`Transport::resolve`] (called when a session is set up, never on the
//! datapath) binds an extra send-only socket to the advertised address and
//! the first such port from 10000 upward that is free on this host (C++
//! picks the first port outright; any of them reaches the same queue) and
//! puts it in the route. Routes to peers that need the same port share the
//! socket; a socket no route uses any more is closed at the next resolve.
//! `tx_burst` sends each run of consecutive items with the same source
//! socket with one `sendmmsg` (one run, one call, in the common case).
//! Nobody sends *to* those ports (peers reply to the advertised port), so
//! the extra sockets receive nothing.
//!
//! A raw-Ethernet peer (C++ DPDK or raw transport, or our mlx5 transport)
//! answers no ARP: the kernel on this side needs a route and a permanent
//! neighbour entry for its address (`ip route add PEER_IP dev IF`, `ip
//! neigh add PEER_IP lladdr PEER_MAC dev IF nud permanent`), and it drops
//! frames whose IPv4 checksum is 0 (the C++ raw transport's), so only a
//! peer that computes checksums (C++ DPDK, our mlx5) can reach it.
//!
//! Datagrams the ring cannot accept as eRPC packets (longer than
//! `MTU - HEADROOM_BYTES`, or shorter than an eRPC header) still take a slot
//! (so ring accounting stays exact) but read as `None` from
//! [`RxRing::packet`], and are counted by reason in [`TransportStats`].
//!
//! The per-packet path allocates nothing, takes no lock and makes no
//! syscall besides one send per burst (per run of one source socket, and
//! within it per GSO run) and one `recvmmsg` or `recvfrom` per `rx_burst`
//! (none when the ring has no free slot; `RxMode` says which).
//!
//! A `UdpTransport`, its ring handle and its routes belong to one thread
//! (`!Send`), like the Rpc that owns them.
#![deny(unsafe_code)]

mod sys;

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::rc::Rc;

use crate::pcap::Capture;
use crate::rss::{self, RssError};
use crate::wire::{self, FrameTemplate};
use crate::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, MTU, PKTHDR_BYTES, RoutingInfo, RxRing, Transport,
    TransportError, TransportStats, TxItem,
};

/// Largest UDP payload (eRPC header + data) the transport sends or accepts:
/// what fits in an [`MTU`]-byte frame.
pub const MAX_PAYLOAD_BYTES: usize = MTU - HEADROOM_BYTES;

/// Most messages the kernel takes in one `sendmmsg`/`recvmmsg` (UIO_MAXIOV).
pub const MAX_BATCH: usize = 1024;

/// Default RX ring size, as in the C++ eRPC.
pub const DEFAULT_RX_RING_ENTRIES: usize = 4096;

/// Most extra send sockets (one per RSS source port in use) a transport
/// keeps open at once.
pub const MAX_RSS_SOURCE_SOCKETS: usize = 1024;

/// Most candidate source ports tried (each found in use by someone else)
/// before resolving a peer that uses RSS fails.
const MAX_RSS_PORT_TRIES: usize = 256;

/// Settings of a [`UdpTransport`]. Start from [`UdpConfig::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Address to bind. Port 0 picks a free port. The IP may be
    /// `0.0.0.0` only together with [`UdpConfig::advertise`].
    pub bind: SocketAddrV4,
    /// The IPv4 address put in the routing info that peers use to reach
    /// this transport. `None`: the bound address. Required when binding to
    /// `0.0.0.0`, since the transport cannot know which of the host's
    /// addresses a given peer can reach.
    pub advertise: Option<Ipv4Addr>,
    /// RX ring slots (a power of two, at least 2). Default 4096.
    pub rx_ring_entries: usize,
    /// Most datagrams one `rx_burst` takes (one `recvmmsg`), 1 to
    /// [`MAX_BATCH`]. Default 32.
    pub rx_burst_max: usize,
    /// Most packets one `sendmmsg` takes, 1 to [`MAX_BATCH`];
    /// reported as [`Transport::tx_burst_max`]. Default 16 (eRPC's postlist).
    pub tx_burst_max: usize,
    /// Kernel send and receive buffer size to ask for, in bytes. The kernel
    /// caps it at `net.core.rmem_max`/`wmem_max` unless the process has
    /// CAP_NET_ADMIN. Default 4 MiB: a default-sized ring of MTU frames.
    pub socket_buffer_bytes: usize,
    /// The MAC to advertise. `None` (default): the MAC of the interface
    /// that carries the advertised address, looked up at creation (zero
    /// on loopback); creation fails if no interface of this host (in this
    /// network namespace) has that address. Set it when the advertised
    /// address belongs to another box (NAT) whose MAC peers must use.
    pub mac: Option<[u8; 6]>,
    /// Write every datagram sent and received, with the Ethernet/IPv4/UDP
    /// framing it would have had on the wire, to this pcap file (created
    /// or truncated). Default `None`: no capture, and no cost. See
    /// [`crate::pcap`] for what is written and what it costs.
    pub pcap: Option<PathBuf>,
}

impl UdpConfig {
    /// Defaults: ring of 4096 entries, bursts of 32 (RX) and 16 (TX).
    pub fn new(bind: SocketAddrV4) -> UdpConfig {
        UdpConfig {
            bind,
            advertise: None,
            rx_ring_entries: DEFAULT_RX_RING_ENTRIES,
            rx_burst_max: 32,
            tx_burst_max: 16,
            socket_buffer_bytes: DEFAULT_RX_RING_ENTRIES * MTU,
            mac: None,
            pcap: None,
        }
    }

    /// Binds to `127.0.0.1` with a free port.
    pub fn loopback() -> UdpConfig {
        UdpConfig::new(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
    }

    /// Sizes the RX ring for at least `entries` packets (a power of two,
    /// e.g. `erpc::rx_ring_entries_for(sessions, credits)`), and asks the
    /// kernel for a receive buffer of as many MTU frames. The ring is eRPC's
    /// accounting and the slots it reads from (`entries` × 1 KiB of heap,
    /// touched only as packets reach them); what keeps datagrams from being
    /// dropped is the socket buffer, which the kernel caps at
    /// `net.core.rmem_max` (a few hundred KiB by default) unless the
    /// process has `CAP_NET_ADMIN`. Past that cap, credits no longer
    /// guarantee room, and a burst from many sessions at once can be
    /// dropped by the kernel (and is then resent by loss recovery).
    pub fn with_rx_ring_entries(mut self, entries: usize) -> UdpConfig {
        self.rx_ring_entries = entries.max(2).next_power_of_two();
        self.socket_buffer_bytes = self.rx_ring_entries.saturating_mul(MTU);
        self
    }

    fn validate(&self) -> Result<(), String> {
        let n = self.rx_ring_entries;
        if !n.is_power_of_two() || n < 2 {
            return Err(format!(
                "rx_ring_entries = {n}: must be a power of two, at least 2"
            ));
        }
        // Ring indexes are kept in u64 totals; slot offsets in usize.
        if n.checked_mul(sys::SLOT_BYTES).is_none() || n > 1 << 24 {
            return Err(format!("rx_ring_entries = {n}: too large (at most 2^24)"));
        }
        for (name, v) in [
            ("rx_burst_max", self.rx_burst_max),
            ("tx_burst_max", self.tx_burst_max),
        ] {
            if v == 0 || v > MAX_BATCH {
                return Err(format!("{name} = {v}: must be 1 to {MAX_BATCH}"));
            }
        }
        if let Some(ip) = self.advertise
            && (ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast())
        {
            return Err(format!(
                "advertise = {ip}: peers cannot send to that address"
            ));
        }
        if let Some(mac) = self.mac
            && mac[0] & 1 != 0
        {
            return Err(format!(
                "mac = {mac:02x?}: a multicast MAC cannot name this host"
            ));
        }
        Ok(())
    }
}

/// A send-only socket bound to a source port chosen for a peer's RSS.
struct SourceSocket {
    socket: UdpSocket,
    port: u16,
}

/// A resolved peer: its socket address, prebuilt in the kernel's layout,
/// and the socket to send from.
#[derive(Clone)]
pub struct UdpRoute {
    addr: SocketAddrV4,
    raw: sys::SockAddr,
    /// The socket bound to the source port the peer's RSS needs; `None`:
    /// the transport's own socket.
    source: Option<Rc<SourceSocket>>,
    /// The framing the datagrams would have on the wire (for captures).
    template: FrameTemplate,
}

impl UdpRoute {
    /// The peer's socket address.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// The UDP source port chosen for the peer's RSS, if it uses RSS
    /// (otherwise datagrams leave from the transport's bound port).
    pub fn rss_source_port(&self) -> Option<u16> {
        self.source.as_ref().map(|s| s.port)
    }
}

impl fmt::Debug for UdpRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rss_source_port() {
            None => write!(f, "UdpRoute({})", self.addr),
            Some(p) => write!(f, "UdpRoute({} from port {p})", self.addr),
        }
    }
}

/// Reads a [`UdpTransport`]'s RX ring (the one handle of its transport).
pub struct UdpRing(Rc<sys::Ring>);

impl UdpRing {
    /// Slots currently held by the application (delivered by `rx_burst`,
    /// not yet given back with `post_recvs`).
    pub fn held(&self) -> usize {
        self.0.held()
    }
}

impl RxRing for UdpRing {
    fn entries(&self) -> usize {
        self.0.entries()
    }

    /// The UDP payload (eRPC header + data) in slot `idx`. `None` if the
    /// datagram there was rejected (too short or too long; counted), or if
    /// the slot is not currently held by the application (never delivered,
    /// or already given back), so a stale index cannot read a slot that
    /// the kernel may be refilling.
    fn packet(&self, idx: usize) -> Option<&[u8]> {
        self.0.packet(idx)
    }
}

impl fmt::Debug for UdpRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpRing")
            .field("entries", &self.0.entries())
            .field("held", &self.0.held())
            .finish()
    }
}

/// eRPC's transport over one kernel UDP socket. See the [module docs](self).
pub struct UdpTransport {
    socket: UdpSocket,
    local_addr: SocketAddrV4,
    routing_info: RoutingInfo,
    rx: sys::RxQueue,
    /// How the next `rx_burst` receives (see [`RxMode`]).
    rx_mode: RxMode,
    /// The last `rx_burst` may have left datagrams in the socket
    /// ([`Transport::rx_may_hold_more`]).
    rx_more: bool,
    ring_taken: bool,
    tx: sys::TxQueue,
    /// For each message of the TX batch being sent, the index of its item
    /// (`REFUSED` once the kernel refused it for good).
    tx_item_of: Box<[usize]>,
    tx_burst_max: usize,
    /// Send runs of datagrams to one peer with one size as one UDP GSO
    /// `sendmsg` (off for good after the kernel refuses it once).
    gso: bool,
    rx_burst_max: usize,
    socket_buffer_bytes: usize,
    /// Send sockets bound to RSS source ports (see the module docs).
    /// Touched only by `resolve`, never on the datapath.
    source_sockets: RefCell<Vec<Rc<SourceSocket>>>,
    pcap: Option<Box<Capture>>,
    stats: TransportStats,
}

/// How `rx_burst` receives. `recvmmsg` copies in a message header and
/// imports an iovec per datagram, and after the last datagram waiting it
/// makes one more attempt that finds the queue empty; `recvfrom` does
/// neither, but takes one datagram per call. Measured on loopback
/// (BENCHMARKS.md, item 4), a one-at-a-time round trip costs ~15% more with
/// `recvmmsg`; bursts need it. So: one datagram at a time while datagrams
/// come one at a time (or none come), a burst as soon as one is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxMode {
    /// `recvfrom`; `run` counts the polls in a row that got a datagram.
    /// `recvfrom` cannot tell whether more are waiting, so after
    /// [`RX_PROBE_AFTER`] of them the next poll asks for a burst.
    Single { run: u32 },
    /// `recvmmsg`, for as long as it gets two or more datagrams.
    Batch,
}

/// Polls in a row that each got one datagram with `recvfrom` before
/// `rx_burst` tries `recvmmsg` to see whether datagrams queue up: one, so
/// a poll that found a datagram is followed by one that takes whatever
/// queued behind it. A burst that ends (a `recvmmsg` that gets one or
/// none, as the loss scan's drain always ends) drops to single mode; with
/// 8 here the next 8 polls read one datagram each however many waited,
/// and with 60 requests in flight per node the queue that built up in
/// those polls kept the event loop behind a full window: the median RPC
/// waited 5-7 times the raw echo's (BENCHMARKS.md, issue 32). After a lone
/// datagram the probe is an empty `recvmmsg` (about 50 ns more than an
/// empty `recvfrom`), once per datagram received, not per poll.
const RX_PROBE_AFTER: u32 = 1;

/// Marks a batch message the kernel refused for good.
const REFUSED: usize = usize::MAX;

impl UdpTransport {
    /// Opens and binds the socket and preallocates the RX ring.
    ///
    /// # Errors
    /// [`TransportError::Io`] naming the address when the bind fails
    /// ("port in use", "address not assigned to this host", ...) or a
    /// socket option cannot be set, when no interface carries the
    /// advertised address (and [`UdpConfig::mac`] is unset), when the pcap
    /// file cannot be created, and for an invalid configuration (with an
    /// `InvalidInput` source).
    pub fn new(config: &UdpConfig) -> Result<UdpTransport, TransportError> {
        let invalid = |why: String| TransportError::Io {
            what: format!("invalid UDP transport configuration (bind {})", config.bind),
            source: io::Error::new(io::ErrorKind::InvalidInput, why),
        };
        config.validate().map_err(invalid)?;
        let advertise = match config.advertise {
            Some(ip) => ip,
            None if config.bind.ip().is_unspecified() => {
                return Err(invalid(
                    "bound to 0.0.0.0 without an address to advertise: set \
                     UdpConfig::advertise to the address peers should use"
                        .into(),
                ));
            }
            None => *config.bind.ip(),
        };

        let socket =
            UdpSocket::bind(SocketAddr::V4(config.bind)).map_err(|e| bind_error(config.bind, e))?;
        let local_addr = match socket.local_addr() {
            Ok(SocketAddr::V4(a)) => a,
            Ok(SocketAddr::V6(_)) => unreachable!("bound an IPv4 address"),
            Err(e) => return Err(io_error(format!("getsockname on {}", config.bind), e)),
        };
        socket
            .set_nonblocking(true)
            .map_err(|e| io_error(format!("set UDP socket {local_addr} non-blocking"), e))?;
        let socket_buffer_bytes =
            sys::set_socket_buffers(socket.as_fd(), config.socket_buffer_bytes)
                .map_err(|e| io_error(format!("set buffer sizes of UDP socket {local_addr}"), e))?;

        let mac = match config.mac {
            Some(mac) => mac,
            None => interface_mac(advertise)?,
        };
        let pcap = match &config.pcap {
            Some(path) => Some(Box::new(Capture::create(path)?)),
            None => None,
        };

        let rx_burst = config.rx_burst_max.min(config.rx_ring_entries);
        Ok(UdpTransport {
            socket,
            local_addr,
            routing_info: RoutingInfo {
                mac,
                ipv4: advertise,
                udp_port: local_addr.port(),
                rxq_id: 0,
                rss_table_size: 1,
            },
            rx: sys::RxQueue::new(config.rx_ring_entries, rx_burst, pcap.is_some()),
            rx_mode: RxMode::Single { run: 0 },
            rx_more: true,
            ring_taken: false,
            tx: sys::TxQueue::new(config.tx_burst_max),
            tx_item_of: vec![0; config.tx_burst_max].into_boxed_slice(),
            tx_burst_max: config.tx_burst_max,
            gso: true,
            rx_burst_max: rx_burst,
            socket_buffer_bytes,
            source_sockets: RefCell::new(Vec::new()),
            pcap,
            stats: TransportStats::default(),
        })
    }

    /// Pushes captured frames to the pcap file (they are buffered).
    ///
    /// # Errors
    /// If there is no capture, it stopped after a write error, or the
    /// write fails.
    pub fn flush_pcap(&mut self) -> io::Result<()> {
        match self.pcap.as_mut() {
            Some(c) => c.flush(),
            None => Err(io::Error::other("no pcap capture configured")),
        }
    }

    /// Frames written to the pcap capture so far (0 without one).
    pub fn pcap_frames(&self) -> u64 {
        self.pcap.as_ref().map_or(0, |c| c.frames())
    }

    /// Extra send sockets open for peers that use RSS.
    pub fn rss_source_sockets(&self) -> usize {
        self.source_sockets.borrow().len()
    }

    /// The send socket for `peer`, which uses RSS: an open one bound to a
    /// port that lands on the peer's queue, or a new one bound to the first
    /// such port that is free.
    fn rss_source(&self, peer: &RoutingInfo) -> Result<Rc<SourceSocket>, TransportError> {
        let src_ip = self.routing_info.ipv4;
        let fail = |why: String| TransportError::Resolve { info: *peer, why };
        rss::source_port(src_ip, peer).map_err(|e| fail(e.to_string()))?;
        let mut open = self.source_sockets.borrow_mut();
        // Close the sockets that no route uses any more.
        open.retain(|s| Rc::strong_count(s) > 1);
        let mut in_use = 0;
        for port in rss::source_ports(src_ip, peer) {
            if let Some(s) = open.iter().find(|s| s.port == port) {
                return Ok(Rc::clone(s));
            }
            if open.len() >= MAX_RSS_SOURCE_SOCKETS {
                return Err(fail(format!(
                    "{MAX_RSS_SOURCE_SOCKETS} RSS source sockets are open already"
                )));
            }
            let addr = SocketAddrV4::new(src_ip, port);
            match bind_send_socket(addr, self.socket_buffer_bytes) {
                Ok(socket) => {
                    let s = Rc::new(SourceSocket { socket, port });
                    open.push(Rc::clone(&s));
                    return Ok(s);
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    in_use += 1;
                    if in_use == MAX_RSS_PORT_TRIES {
                        break;
                    }
                }
                Err(e) => {
                    return Err(fail(format!(
                        "cannot bind a send socket to RSS source port {addr}: {e}"
                    )));
                }
            }
        }
        Err(fail(if in_use > 0 {
            format!(
                "the first {in_use} UDP source ports that reach RX queue {} are in use on {src_ip}",
                peer.rxq_id
            )
        } else {
            RssError::NoPort {
                rxq_id: peer.rxq_id,
                rss_table_size: peer.rss_table_size,
            }
            .to_string()
        }))
    }

    /// The address the socket is bound to (with the port the kernel chose).
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local_addr
    }

    /// The receive buffer size the kernel granted, in bytes.
    pub fn socket_buffer_bytes(&self) -> usize {
        self.socket_buffer_bytes
    }

    /// Sends at most `tx_burst_max` items with as few `sendmmsg` calls as
    /// the kernel allows; returns how many items (a prefix) were consumed.
    fn tx_chunk(&mut self, items: &[TxItem<'_, UdpRoute>]) -> usize {
        debug_assert!(items.len() <= self.tx_burst_max);
        let mut batch = self.tx.batch();
        for (i, item) in items.iter().enumerate() {
            if item.drop() || !well_formed(item) {
                continue;
            }
            self.tx_item_of[batch.len()] = i;
            batch.push(
                &item.route().raw,
                &item.pkt()[HEADROOM_BYTES..],
                item.data(),
            );
        }
        let msgs = batch.len();
        let own = &self.socket;
        let source_of = |item_of: &[usize], k: usize| match &items[item_of[k]].route().source {
            Some(s) => &s.socket,
            None => own,
        };
        // Messages handled so far: sent, or refused for good.
        let mut done = 0;
        let mut gso_ok = self.gso;
        let mut refused = 0u64;
        let mut refused_bytes = 0u64;
        // Each iteration handles at least one message or stops, except one
        // GSO send the kernel refuses, after which GSO is off: bounded.
        while done < msgs {
            // The run of messages from the same socket (all of them, unless
            // the burst goes to peers that use RSS).
            let socket = source_of(&self.tx_item_of, done);
            let mut end = done + 1;
            while end < msgs && std::ptr::eq(source_of(&self.tx_item_of, end), socket) {
                end += 1;
            }
            self.stats.tx_doorbells += 1;
            // A run to one peer with one size goes as one GSO send; up to
            // the next such run, the messages go with one `sendmmsg` (or a
            // `sendto` if there is one).
            let (gso, upto) = match gso_ok && end - done > 1 {
                true => match batch.gso_run(done, end) {
                    1 => (1, batch.next_gso_run(done + 1, end)),
                    n => (n, done + n),
                },
                false => (1, end),
            };
            let sent = if gso > 1 {
                let seg = items[self.tx_item_of[done]].frame_len() - HEADROOM_BYTES;
                batch.send_gso(socket.as_fd(), done, upto, seg as u16)
            } else if upto - done == 1 {
                batch.send_one(socket.as_fd(), done)
            } else {
                batch.send(socket.as_fd(), done, upto)
            };
            match sent {
                Ok(n) => done += n.max(1).min(upto - done),
                Err(e) if is_transient(&e) => break,
                Err(e) if gso > 1 => {
                    // Sent nothing. Again without GSO; and if this socket's
                    // path cannot do GSO at all (UDP checksums off, no
                    // checksum offload on the route, a datagram over the
                    // route's MTU, a kernel without it), from now on.
                    gso_ok = false;
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
                    ) {
                        tracing::debug!(error = %e, "UDP GSO refused; sending datagrams one by one");
                        self.gso = false;
                    }
                }
                Err(_) => {
                    // This datagram cannot be sent (no route, EACCES for a
                    // broadcast address, ...): lose it, as a NIC would, and
                    // go on with the rest.
                    refused += 1;
                    refused_bytes += items[self.tx_item_of[done]].frame_len() as u64;
                    self.tx_item_of[done] = REFUSED;
                    done += 1;
                }
            }
        }
        if let Some(cap) = self.pcap.as_deref_mut() {
            capture_tx(cap, items, &self.tx_item_of[..done]);
        }
        let accepted = if done == msgs {
            items.len()
        } else {
            self.tx_item_of[done]
        };
        let mut sent_bytes = 0u64;
        for item in &items[..accepted] {
            if item.drop() {
                self.stats.tx_dropped_on_purpose += 1;
            } else if !well_formed(item) {
                self.stats.tx_errors += 1;
            } else {
                sent_bytes += item.frame_len() as u64;
            }
        }
        self.stats.tx_pkts += done as u64 - refused;
        self.stats.tx_bytes += sent_bytes - refused_bytes;
        // Refused for good; those the full socket queue turned back are not
        // accepted (the caller keeps them and retries).
        self.stats.tx_errors += refused;
        self.stats.tx_refused += (msgs - done) as u64;
        accepted
    }
}

/// Writes the datagrams of one sent batch to the capture, with the framing
/// they would have had on the wire.
#[cold]
#[inline(never)]
fn capture_tx(cap: &mut Capture, items: &[TxItem<'_, UdpRoute>], sent: &[usize]) {
    let ts = Capture::now();
    for &i in sent.iter().filter(|&&i| i != REFUSED) {
        let item = &items[i];
        let len = item.frame_len();
        let scratch = cap.scratch();
        wire::build_headroom(&item.route().template, scratch, len);
        let head = &item.pkt()[HEADROOM_BYTES..];
        scratch[HEADROOM_BYTES..HEADROOM_BYTES + head.len()].copy_from_slice(head);
        scratch[HEADROOM_BYTES + head.len()..len].copy_from_slice(item.data());
        cap.commit(ts, len, len);
    }
}

/// The MAC of the interface that carries `ip` (zero if it has no 6-byte
/// link-layer address, as loopback).
fn interface_mac(ip: Ipv4Addr) -> Result<[u8; 6], TransportError> {
    let addrs: Vec<_> = nix::ifaddrs::getifaddrs()
        .map_err(|e| io_error("getifaddrs".into(), e.into()))?
        .collect();
    let carries_ip = |a: &nix::ifaddrs::InterfaceAddress| {
        a.address
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .is_some_and(|sin| sin.ip() == ip)
    };
    let Some(iface) = addrs.iter().find(|a| carries_ip(a)) else {
        return Err(io_error(
            format!(
                "no network interface of this host has the address {ip} to advertise; \
                 bind or advertise an address of this host, or set UdpConfig::mac"
            ),
            io::Error::from(io::ErrorKind::AddrNotAvailable),
        ));
    };
    let mac = addrs
        .iter()
        .filter(|a| a.interface_name == iface.interface_name)
        .filter_map(|a| a.address.as_ref()?.as_link_addr()?.addr())
        .next();
    Ok(mac.unwrap_or([0; 6]))
}

/// A non-blocking UDP socket bound to `addr`, for sending only.
fn bind_send_socket(addr: SocketAddrV4, buffer_bytes: usize) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(SocketAddr::V4(addr))?;
    socket.set_nonblocking(true)?;
    sys::set_socket_buffers(socket.as_fd(), buffer_bytes)?;
    Ok(socket)
}

/// True if the kernel can take the item: a whole packet header slot, and a
/// frame no larger than the MTU.
fn well_formed(item: &TxItem<'_, UdpRoute>) -> bool {
    item.pkt().len() >= PKTHDR_BYTES && item.frame_len() <= MTU
}

/// Errors after which a later `sendmmsg` may succeed: the socket queue is
/// full (or we were interrupted).
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

fn io_error(what: String, source: io::Error) -> TransportError {
    TransportError::Io { what, source }
}

fn bind_error(addr: SocketAddrV4, e: io::Error) -> TransportError {
    let why = match e.kind() {
        io::ErrorKind::AddrInUse => ": port in use",
        io::ErrorKind::AddrNotAvailable => ": address not assigned to this host",
        io::ErrorKind::PermissionDenied => {
            ": permission denied (ports below 1024 need CAP_NET_BIND_SERVICE)"
        }
        _ => "",
    };
    io_error(format!("cannot bind UDP socket to {addr}{why}"), e)
}

impl Transport for UdpTransport {
    type Route = UdpRoute;
    type Ring = UdpRing;

    fn local_routing_info(&self) -> RoutingInfo {
        self.routing_info
    }

    /// Accepts any unicast IPv4 address and non-zero port. The MAC is not
    /// needed (the kernel resolves the next hop). A peer with an RSS table
    /// of more than one entry gets a send socket on a source port that its
    /// RSS maps to its RX queue (see the module docs); resolution fails if
    /// no such port can be had.
    fn resolve(&self, info: &RoutingInfo) -> Result<UdpRoute, TransportError> {
        let why = if info.ipv4.is_unspecified() {
            "IPv4 address 0.0.0.0"
        } else if info.ipv4.is_broadcast() || info.ipv4.is_multicast() {
            "not a unicast IPv4 address"
        } else if info.udp_port == 0 {
            "UDP port 0"
        } else {
            let addr = SocketAddrV4::new(info.ipv4, info.udp_port);
            let source = if rss::uses_rss(info) {
                Some(self.rss_source(info)?)
            } else {
                None
            };
            let me = &self.routing_info;
            let template = FrameTemplate {
                dst_mac: info.mac,
                src_mac: me.mac,
                src_ip: me.ipv4,
                dst_ip: info.ipv4,
                src_port: source.as_ref().map_or(me.udp_port, |s| s.port),
                dst_port: info.udp_port,
            };
            return Ok(UdpRoute {
                addr,
                raw: sys::SockAddr::new(addr),
                source,
                template,
            });
        };
        Err(TransportError::Resolve {
            info: *info,
            why: why.into(),
        })
    }

    /// Does nothing: the kernel writes the Ethernet/IPv4/UDP headers.
    fn fill_headroom(&self, _route: &UdpRoute, _headroom: &mut [u8], _frame_len: usize) {}

    /// Sends each item as one datagram (`pkt[HEADROOM_BYTES..]` then
    /// `data`), one `sendmmsg` per `tx_burst_max` items.
    ///
    /// Items with `drop` set are consumed and counted, not sent. Items the
    /// kernel cannot take (header slot shorter than [`PKTHDR_BYTES`], frame
    /// over the MTU, or refused by the kernel for good, e.g. no route) are
    /// consumed and counted as `tx_errors`. When the socket queue is full
    /// the call stops and returns how many items it consumed; the rest are
    /// not accepted (counted as `tx_refused`; the caller still has them).
    fn tx_burst(&mut self, items: &[TxItem<'_, UdpRoute>]) -> usize {
        let mut consumed = 0;
        while consumed < items.len() {
            let end = (consumed + self.tx_burst_max).min(items.len());
            consumed += self.tx_chunk(&items[consumed..end]);
            if consumed < end {
                // The socket queue is full: the later chunks are turned
                // back as well.
                let later = items[end..].iter().filter(|i| !i.drop() && well_formed(i));
                self.stats.tx_refused += later.count() as u64;
                break;
            }
        }
        consumed
    }

    fn tx_burst_max(&self) -> usize {
        self.tx_burst_max
    }

    /// No: a round trip is two passes through the kernel's UDP stack each
    /// way, and under load its socket queues, not the network, set the
    /// delay.
    fn rtt_is_network(&self) -> bool {
        false
    }

    /// Nothing to wait for: `sendmmsg` has copied every datagram into the
    /// kernel before `tx_burst` returned.
    fn tx_flush(&mut self) {}

    /// One `recvmmsg` into the free ring slots that come next (none when
    /// no slot is free: the datagrams wait in the socket buffer).
    fn rx_burst(&mut self) -> usize {
        let stats = &mut self.stats;
        let mut pcap = self.pcap.as_deref_mut().map(|c| (c, Capture::now()));
        let me = &self.routing_info;
        let classify = |d: sys::Datagram<'_>| {
            if let Some((cap, ts)) = pcap.as_mut() {
                capture_rx(cap, *ts, me, &d);
            }
            let len = d.len;
            stats.rx_pkts += 1;
            stats.rx_bytes += (len + HEADROOM_BYTES) as u64;
            if d.truncated || len > MAX_PAYLOAD_BYTES {
                stats.rx_oversize += 1;
                0
            } else if len < ERPC_HDR_BYTES {
                stats.rx_short += 1;
                0
            } else {
                len
            }
        };
        let batch = match self.rx_mode {
            RxMode::Batch => true,
            RxMode::Single { run } => run >= RX_PROBE_AFTER,
        };
        // A `recvmmsg` that fills fewer slots than it offered, or a
        // receive that finds nothing, emptied the socket.
        let room = self.rx.ring().free().min(self.rx_burst_max);
        let (got, more) = if batch && self.rx_burst_max > 1 {
            let got = self.rx.recv(self.socket.as_fd(), classify);
            let more = matches!(got, Ok(n) if n >= room);
            (got, more)
        } else {
            let got = self.rx.recv_one(self.socket.as_fd(), classify);
            // One datagram says nothing of what follows it; with no free
            // slot (`Ok(0)` without a call) the socket was not looked at.
            let more = got.is_ok();
            (got, more)
        };
        self.rx_more = more;
        self.rx_mode = match (&got, self.rx_mode) {
            (Ok(n), _) if batch => {
                if *n >= 2 {
                    RxMode::Batch
                } else {
                    RxMode::Single { run: 0 }
                }
            }
            (Ok(1), RxMode::Single { run }) => RxMode::Single { run: run + 1 },
            _ => RxMode::Single { run: 0 },
        };
        match got {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(_) => {
                self.stats.rx_errors += 1;
                0
            }
        }
    }

    /// `false` after a `recvmmsg` that filled fewer slots than it offered
    /// or a receive that found the socket empty.
    fn rx_may_hold_more(&self) -> bool {
        self.rx_more
    }

    /// # Panics
    /// If `ring` is another transport's, or `n` is more than the number of
    /// slots the application holds.
    fn post_recvs(&mut self, ring: &mut UdpRing, n: usize) {
        assert!(
            Rc::ptr_eq(&ring.0, self.rx.ring()),
            "post_recvs: the ring handle belongs to another transport"
        );
        self.rx.ring().release(n);
    }

    fn take_rx_ring(&mut self) -> Option<UdpRing> {
        if std::mem::replace(&mut self.ring_taken, true) {
            return None;
        }
        Some(UdpRing(Rc::clone(self.rx.ring())))
    }

    /// `tx_bytes` and `rx_bytes` count whole frames as the mlx5 transport
    /// would put them on the wire (UDP payload + [`HEADROOM_BYTES`]).
    fn stats(&self) -> TransportStats {
        self.stats
    }
}

impl fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpTransport")
            .field("local_addr", &self.local_addr)
            .field("routing_info", &self.routing_info)
            .field("rx_ring_entries", &self.rx.ring().entries())
            .field("rx_ring_held", &self.rx.ring().held())
            .field("tx_burst_max", &self.tx_burst_max)
            .field("socket_buffer_bytes", &self.socket_buffer_bytes)
            .field("rss_source_sockets", &self.rss_source_sockets())
            .field("pcap", &self.pcap)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Writes one received datagram to the capture with the framing it had:
/// the sender's address and port, our advertised address and port.
#[cold]
#[inline(never)]
fn capture_rx(cap: &mut Capture, ts: std::time::Duration, me: &RoutingInfo, d: &sys::Datagram<'_>) {
    let src = d
        .source
        .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
    let template = FrameTemplate {
        dst_mac: me.mac,
        src_mac: [0; 6],
        src_ip: *src.ip(),
        dst_ip: me.ipv4,
        src_port: src.port(),
        dst_port: me.udp_port,
    };
    let orig_len = HEADROOM_BYTES + d.len;
    let scratch = cap.scratch();
    let captured = (HEADROOM_BYTES + d.bytes.len()).min(scratch.len());
    // The IPv4 length field holds at most 65535: a datagram that big
    // cannot arrive over UDP/IPv4 anyway.
    wire::build_headroom(&template, scratch, orig_len.min(usize::from(u16::MAX)));
    scratch[HEADROOM_BYTES..captured].copy_from_slice(&d.bytes[..captured - HEADROOM_BYTES]);
    cap.commit(ts, captured, orig_len);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poll that got one datagram with `recvfrom` is followed by one
    /// that takes what queued behind it with one `recvmmsg`: a queue is
    /// never read one datagram per poll (it was for 8 polls).
    #[test]
    fn a_queue_behind_a_single_read_is_taken_in_one_burst() {
        let mut a = UdpTransport::new(&UdpConfig::loopback()).unwrap();
        let mut b = UdpTransport::new(&UdpConfig::loopback()).unwrap();
        let route = a.resolve(&b.local_routing_info()).unwrap();
        let pkts: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; PKTHDR_BYTES + 10]).collect();
        let items: Vec<_> = pkts
            .iter()
            .map(|pkt| TxItem::unregistered(&route, pkt, &[]))
            .collect();
        assert_eq!(b.rx_burst(), 0);
        assert_eq!(b.rx_mode, RxMode::Single { run: 0 });
        // Loopback delivers within the send: all ten are queued.
        assert_eq!(a.tx_burst(&items), 10);
        assert_eq!(b.rx_burst(), 1, "single mode: one datagram");
        assert!(b.rx_may_hold_more(), "recvfrom cannot tell");
        assert_eq!(b.rx_burst(), 9, "then the rest in one burst");
        assert!(!b.rx_may_hold_more(), "9 of 32 slots filled: emptied");
        assert_eq!(b.rx_mode, RxMode::Batch);
        assert_eq!(b.rx_burst(), 0);
        assert!(!b.rx_may_hold_more());
        assert_eq!(b.rx_mode, RxMode::Single { run: 0 });
        let mut ring = b.take_rx_ring().unwrap();
        b.post_recvs(&mut ring, 10);
    }

    /// On a socket whose path refuses GSO (UDP checksums off), a burst
    /// that would go as one GSO send goes out datagram by datagram, all of
    /// it, and the transport stops trying GSO.
    #[test]
    fn refused_gso_falls_back_to_plain_sends() {
        let mut a = UdpTransport::new(&UdpConfig::loopback()).unwrap();
        let mut b = UdpTransport::new(&UdpConfig::loopback()).unwrap();
        sys::disable_udp_checksums(a.socket.as_fd()).unwrap();
        let route = a.resolve(&b.local_routing_info()).unwrap();
        let pkts: Vec<Vec<u8>> = (0..8u8)
            .map(|i| {
                let mut p = vec![i; PKTHDR_BYTES + 10];
                p[HEADROOM_BYTES..PKTHDR_BYTES].fill(0xee);
                p
            })
            .collect();
        let items: Vec<_> = pkts
            .iter()
            .map(|pkt| TxItem::unregistered(&route, pkt, &[]))
            .collect();
        assert_eq!(a.tx_burst(&items), 8);
        assert!(!a.gso, "GSO off after the refusal");
        let s = a.stats();
        assert_eq!((s.tx_pkts, s.tx_errors, s.tx_doorbells), (8, 0, 2), "{s:?}");
        let mut ring = b.take_rx_ring().unwrap();
        let mut got = Vec::new();
        // Loopback delivers within the send: all are queued already.
        for _ in 0..64 {
            let n = b.rx_burst();
            let head = got.len();
            for k in 0..n {
                got.push(ring.packet((head + k) % ring.entries()).unwrap().to_vec());
            }
            b.post_recvs(&mut ring, n);
        }
        assert_eq!(got.len(), 8);
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p[..], pkts[i][HEADROOM_BYTES..], "datagram {i}");
        }
    }
}

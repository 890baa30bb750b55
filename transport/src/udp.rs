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
//!   copied before the kernel copies it into its socket buffer. When
//!   `sendmmsg` returns, the buffers are free again: [`Transport::tx_flush`]
//!   has nothing to wait for.
//! * **RX**: a preallocated ring of `rx_ring_entries` slots of [`MTU`] bytes
//!   behaves like a NIC's receive queue. `recvmmsg` writes datagrams straight
//!   into the free slots that come next in ring order; a slot is free again
//!   only after eRPC gives it back with [`Transport::post_recvs`]. The ring
//!   is shared (`Rc`) with its [`UdpRing`] handles, which read held slots
//!   without borrowing the transport.
//!
//! Routing info is the bound IPv4 address and port (MAC zero); a route is
//! the peer's socket address, prebuilt in the kernel's layout.
//!
//! Datagrams the ring cannot accept as eRPC packets (longer than
//! `MTU - HEADROOM_BYTES`, or shorter than an eRPC header) still take a slot
//! (so ring accounting stays exact) but read as `None` from
//! [`RxRing::packet`], and are counted by reason in [`TransportStats`].
//!
//! The per-packet path allocates nothing, takes no lock and makes no
//! syscall besides one `sendmmsg` per burst and one `recvmmsg` per
//! `rx_burst` (none when the ring has no free slot).
//!
//! A `UdpTransport` and its ring handles belong to one thread (`!Send`),
//! like the Rpc that owns them.
#![deny(unsafe_code)]

mod sys;

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::rc::Rc;

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
        }
    }

    /// Binds to `127.0.0.1` with a free port.
    pub fn loopback() -> UdpConfig {
        UdpConfig::new(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
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
        if let Some(ip) = self.advertise {
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                return Err(format!(
                    "advertise = {ip}: peers cannot send to that address"
                ));
            }
        }
        Ok(())
    }
}

/// A resolved peer: its socket address, prebuilt in the kernel's layout.
#[derive(Clone)]
pub struct UdpRoute {
    addr: SocketAddrV4,
    raw: sys::SockAddr,
}

impl UdpRoute {
    /// The peer's socket address.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }
}

impl fmt::Debug for UdpRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UdpRoute({})", self.addr)
    }
}

/// Reads a [`UdpTransport`]'s RX ring; a cheap clone of a shared handle.
#[derive(Clone)]
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
    tx: sys::TxQueue,
    /// For each message of the TX batch being sent, the index of its item.
    tx_item_of: Box<[usize]>,
    tx_burst_max: usize,
    socket_buffer_bytes: usize,
    stats: TransportStats,
}

impl UdpTransport {
    /// Opens and binds the socket and preallocates the RX ring.
    ///
    /// # Errors
    /// [`TransportError::Io`] naming the address when the bind fails
    /// ("port in use", "address not assigned to this host", ...) or a
    /// socket option cannot be set, and for an invalid configuration (with
    /// an `InvalidInput` source).
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

        let rx_burst = config.rx_burst_max.min(config.rx_ring_entries);
        Ok(UdpTransport {
            socket,
            local_addr,
            routing_info: RoutingInfo {
                mac: [0; 6],
                ipv4: advertise,
                udp_port: local_addr.port(),
                rxq_id: 0,
                rss_table_size: 0,
            },
            rx: sys::RxQueue::new(config.rx_ring_entries, rx_burst),
            tx: sys::TxQueue::new(config.tx_burst_max),
            tx_item_of: vec![0; config.tx_burst_max].into_boxed_slice(),
            tx_burst_max: config.tx_burst_max,
            socket_buffer_bytes,
            stats: TransportStats::default(),
        })
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
            if item.drop || !well_formed(item) {
                continue;
            }
            self.tx_item_of[batch.len()] = i;
            batch.push(&item.route.raw, &item.pkt[HEADROOM_BYTES..], item.data);
        }
        let msgs = batch.len();
        // Messages handled so far: sent, or refused for good.
        let mut done = 0;
        let mut refused = 0u64;
        let mut refused_bytes = 0u64;
        // Each iteration handles at least one message or stops: bounded.
        while done < msgs {
            self.stats.tx_doorbells += 1;
            match batch.send(self.socket.as_fd(), done) {
                Ok(n) => done += n.max(1).min(msgs - done),
                Err(e) if is_transient(&e) => break,
                Err(_) => {
                    // This datagram cannot be sent (no route, EACCES for a
                    // broadcast address, ...): lose it, as a NIC would, and
                    // go on with the rest.
                    refused += 1;
                    refused_bytes += items[self.tx_item_of[done]].frame_len() as u64;
                    done += 1;
                }
            }
        }
        let accepted = if done == msgs {
            items.len()
        } else {
            self.tx_item_of[done]
        };
        let mut sent_bytes = 0u64;
        for item in &items[..accepted] {
            if item.drop {
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

/// True if the kernel can take the item: a whole packet header slot, and a
/// frame no larger than the MTU.
fn well_formed(item: &TxItem<'_, UdpRoute>) -> bool {
    item.pkt.len() >= PKTHDR_BYTES && item.frame_len() <= MTU
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

    /// Accepts any unicast IPv4 address and non-zero port; the MAC and the
    /// RX queue fields are ignored.
    fn resolve(&self, info: &RoutingInfo) -> Result<UdpRoute, TransportError> {
        let why = if info.ipv4.is_unspecified() {
            "IPv4 address 0.0.0.0"
        } else if info.ipv4.is_broadcast() || info.ipv4.is_multicast() {
            "not a unicast IPv4 address"
        } else if info.udp_port == 0 {
            "UDP port 0"
        } else {
            let addr = SocketAddrV4::new(info.ipv4, info.udp_port);
            return Ok(UdpRoute {
                addr,
                raw: sys::SockAddr::new(addr),
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
                let later = items[end..].iter().filter(|i| !i.drop && well_formed(i));
                self.stats.tx_refused += later.count() as u64;
                break;
            }
        }
        consumed
    }

    fn tx_burst_max(&self) -> usize {
        self.tx_burst_max
    }

    /// Nothing to wait for: `sendmmsg` has copied every datagram into the
    /// kernel before `tx_burst` returned.
    fn tx_flush(&mut self) {}

    /// One `recvmmsg` into the free ring slots that come next (none when
    /// no slot is free: the datagrams wait in the socket buffer).
    fn rx_burst(&mut self) -> usize {
        let stats = &mut self.stats;
        let got = self.rx.recv(self.socket.as_fd(), |len, truncated| {
            stats.rx_pkts += 1;
            stats.rx_bytes += (len + HEADROOM_BYTES) as u64;
            if truncated || len > MAX_PAYLOAD_BYTES {
                stats.rx_oversize += 1;
                0
            } else if len < ERPC_HDR_BYTES {
                stats.rx_short += 1;
                0
            } else {
                len
            }
        });
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

    /// # Panics
    /// If `n` is more than the number of slots the application holds.
    fn post_recvs(&mut self, n: usize) {
        self.rx.ring().release(n);
    }

    fn rx_ring(&self) -> UdpRing {
        UdpRing(Rc::clone(self.rx.ring()))
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
            .field("rx_ring", &self.rx_ring())
            .field("tx_burst_max", &self.tx_burst_max)
            .field("socket_buffer_bytes", &self.socket_buffer_bytes)
            .field("stats", &self.stats)
            .finish()
    }
}

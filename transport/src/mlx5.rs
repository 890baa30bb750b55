//! The mlx5 raw-Ethernet transport: eRPC frames on a driver [`QueueSet`],
//! generic over the hardware backend (a real ConnectX through VFIO, or the
//! device model).
//!
//! TX: every packet is one SEND WQE with up to two gather entries (the
//! packet header slot, plus the data when it is not contiguous); the driver
//! inlines the L2 header when the device requires it, requests a completion
//! only every 64 WQEs, and rings one doorbell per burst.
//!
//! RX: the driver counts arrivals from the overrunning 8-entry CQ; each new
//! frame is validated once, in `rx_burst` (`wire::parse_frame_verified`,
//! plus our MAC and port), with every rejected frame counted by reason, and
//! is then read in place from the striding ring. The IPv4 header checksum
//! is not recomputed when the frame's CQE says the NIC verified it (L3
//! header type IPv4 and `l3_ok`; counted in `rx_ip_csum_hw`); the driver
//! reports that only when it could read the frame's own CQE (the CQ
//! overruns), and every other frame is checked in software. Frames whose
//! IPv4 checksum is 0 (the C++ raw transport does not compute it; the NIC
//! reports `l3_ok` = 0 for them) are accepted and counted in
//! `rx_ip_csum_zero`, unless [`Mlx5Config::accept_zero_ip_checksum`] is
//! off; a wrong non-zero checksum is always a drop.
//!
//! Routing info: the port's MAC, the configured IPv4 address and UDP port,
//! RX queue 0 and an RSS table size of 1 (the flow rule steers the exact
//! UDP destination port to this queue set; no RSS). Toward a peer that
//! uses RSS (a multi-queue C++ DPDK receiver) the prebuilt frame header
//! carries the source port the peer's RSS maps to its queue
//! ([`crate::rss`]); toward any other peer, our own UDP port.

use std::cell::Cell;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::rc::Rc;

use mlx5::hw::HwBackend;
use mlx5::{Device, Gather, QueueConfig, QueueSet, RxRingView, TxFrame};

use crate::pcap::Capture;
use crate::rss;
use crate::wire::{self, FrameError, FrameTemplate, Headroom, ParseOptions, RoutingInfo};
use crate::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, MTU, PKTHDR_BYTES, RxRing, Transport, TransportError,
    TransportStats, TxItem,
};

/// Largest burst (eRPC's postlist).
pub const POSTLIST: usize = 16;

/// Settings of one mlx5 transport (one per Rpc). Start from
/// [`Mlx5Config::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mlx5Config {
    /// IPv4 address this endpoint claims (the NIC has no IP of its own).
    pub ipv4: Ipv4Addr,
    /// Queue-set settings, including the UDP port steered to it.
    pub queue: QueueConfig,
    /// Accept received frames whose IPv4 header checksum is 0, as the C++
    /// raw transport sends them (counted in `rx_ip_csum_zero`). Default
    /// on; off, they are dropped as `rx_bad_ip`.
    pub accept_zero_ip_checksum: bool,
    /// Write every frame sent and received to this pcap file (created or
    /// truncated). Default `None`: no capture, and no cost. See
    /// [`crate::pcap`].
    pub pcap: Option<PathBuf>,
    /// Most frames posted with one doorbell (the postlist, 1..=16, default
    /// 16). 1 rings a doorbell per frame: no doorbell batching (for
    /// measuring what batching saves).
    pub postlist: usize,
}

/// Strides (ring entries) per striding-RQ WQE by default (eRPC's 512).
const DEFAULT_LOG_STRIDES: u8 = 9;
/// Most WQEs the driver posts on one striding RQ (2^10).
const MAX_LOG_RQ_WQES: u8 = 10;
/// Most strides per WQE the PRM allows (2^16).
const MAX_LOG_STRIDES: u8 = 16;

impl Mlx5Config {
    /// `ipv4` and `queue`, zero IPv4 checksums accepted, no capture.
    pub fn new(ipv4: Ipv4Addr, queue: QueueConfig) -> Mlx5Config {
        Mlx5Config {
            ipv4,
            queue,
            accept_zero_ip_checksum: true,
            pcap: None,
            postlist: POSTLIST,
        }
    }

    /// Sizes the striding RX ring for at least `entries` packets (e.g.
    /// `erpc::rx_ring_entries_for(sessions, credits)`): a power of two of
    /// 1 KiB strides, at least 1 024, in WQEs of 512 strides (eRPC's) up
    /// to 1 024 WQEs and longer WQEs beyond that. Each entry is 1 KiB of
    /// hugepage memory ([`Mlx5Config::rx_ring_bytes`]). Whether the device
    /// takes it (`log_max_wq_sz`, the stride ranges of its caps) is
    /// checked when the queue set is created; the largest ring this makes
    /// is 2^26 entries.
    pub fn with_rx_ring_entries(mut self, entries: usize) -> Mlx5Config {
        let log = entries
            .max(1024)
            .next_power_of_two()
            .trailing_zeros()
            .min(u32::from(MAX_LOG_RQ_WQES + MAX_LOG_STRIDES)) as u8;
        let strides = DEFAULT_LOG_STRIDES.max(log.saturating_sub(MAX_LOG_RQ_WQES));
        self.queue.rq_log_strides = strides;
        self.queue.rq_log_wqes = log - strides;
        self
    }

    /// Hugepage bytes of the RX ring's strides.
    pub fn rx_ring_bytes(&self) -> usize {
        self.queue.rx_ring_entries() << self.queue.rq_log_stride_bytes
    }
}

/// A resolved peer: the fixed part of every frame to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mlx5Route {
    /// Headers of every frame to the peer, built once.
    headroom: Headroom,
    template: FrameTemplate,
}

impl Mlx5Route {
    /// The UDP source port of frames to this peer: ours, or the one its
    /// RSS needs.
    pub fn src_port(&self) -> u16 {
        self.template.src_port
    }
}

/// Ring state shared by the transport (which validates arrivals and gives
/// slots back) and its ring handle (which reads held slots).
#[derive(Debug)]
struct RingState {
    /// UDP payload length of the frame in each slot, 0 if it was rejected.
    lens: Box<[Cell<u16>]>,
    /// Slots reported by rx_burst, in total.
    delivered: Cell<u64>,
    /// Slots given back by post_recvs, in total.
    released: Cell<u64>,
}

impl RingState {
    fn held(&self) -> u64 {
        self.delivered.get() - self.released.get()
    }
}

/// Reads packets in the striding RX ring (the one handle of its
/// transport). Frames are validated once, in `rx_burst`; this handle only
/// returns what passed, and only from slots the application holds.
#[derive(Debug)]
pub struct Mlx5Ring {
    view: RxRingView,
    state: Rc<RingState>,
}

impl RxRing for Mlx5Ring {
    fn entries(&self) -> usize {
        self.view.entries()
    }

    #[inline]
    fn packet(&self, idx: usize) -> Option<&[u8]> {
        let st = &*self.state;
        let entries = st.lens.len();
        let age = (idx as u64).wrapping_sub(st.released.get()) & (entries as u64 - 1);
        if idx >= entries || age >= st.held() {
            return None;
        }
        let len = usize::from(st.lens[idx].get());
        if len == 0 {
            return None;
        }
        // SAFETY: the slot is held: reported by rx_burst and not yet given
        // back (checked just above). The driver reposts a WQE only once
        // all its strides are given back, so the NIC leaves a held slot
        // alone. The slice borrows this handle, the only one of its
        // transport, and `Mlx5Transport::post_recvs` takes the handle
        // mutably: the slot cannot be given back while the slice lives.
        let slot = unsafe { self.view.slot(idx) };
        Some(&slot[HEADROOM_BYTES..HEADROOM_BYTES + len])
    }
}

/// eRPC over an mlx5 queue set.
pub struct Mlx5Transport<B: HwBackend> {
    qs: QueueSet<B>,
    /// The transport's own view of the RX ring (for validation).
    view: RxRingView,
    state: Rc<RingState>,
    ring_taken: bool,
    local: RoutingInfo,
    parse: ParseOptions,
    pcap: Option<Box<Capture>>,
    stats: TransportStats,
    /// Next ring slot rx_burst validates.
    rx_head: usize,
    /// Frames per doorbell.
    postlist: usize,
}

impl<B: HwBackend> std::fmt::Debug for Mlx5Transport<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mlx5Transport({})", self.local)
    }
}

impl<B: HwBackend> Mlx5Transport<B> {
    /// Creates the queue set and the flow rule for `cfg.queue.udp_port`,
    /// and the pcap file if one is configured.
    pub fn new(device: &Device<B>, cfg: Mlx5Config) -> Result<Self, TransportError> {
        if !(1..=POSTLIST).contains(&cfg.postlist) {
            return Err(TransportError::Device(format!(
                "postlist {} outside 1..={POSTLIST}",
                cfg.postlist
            )));
        }
        let pcap = match &cfg.pcap {
            Some(path) => Some(Box::new(Capture::create(path)?)),
            None => None,
        };
        let qs = device
            .create_queue_set(cfg.queue)
            .map_err(|e| TransportError::Device(e.to_string()))?;
        let mac = qs.mac();
        let view = qs.rx_ring();
        let state = Rc::new(RingState {
            lens: (0..view.entries()).map(|_| Cell::new(0)).collect(),
            delivered: Cell::new(0),
            released: Cell::new(0),
        });
        let local = RoutingInfo {
            mac,
            ipv4: cfg.ipv4,
            udp_port: cfg.queue.udp_port,
            rxq_id: 0,
            rss_table_size: 1,
        };
        Ok(Mlx5Transport {
            qs,
            view,
            state,
            ring_taken: false,
            local,
            parse: ParseOptions {
                accept_zero_ip_checksum: cfg.accept_zero_ip_checksum,
            },
            pcap,
            stats: TransportStats::default(),
            rx_head: 0,
            postlist: cfg.postlist,
        })
    }

    /// Pushes captured frames to the pcap file (they are buffered).
    ///
    /// # Errors
    /// If there is no capture, it stopped after a write error, or the
    /// write fails.
    pub fn flush_pcap(&mut self) -> std::io::Result<()> {
        match self.pcap.as_mut() {
            Some(c) => c.flush(),
            None => Err(std::io::Error::other("no pcap capture configured")),
        }
    }

    /// Frames written to the pcap capture so far (0 without one).
    pub fn pcap_frames(&self) -> u64 {
        self.pcap.as_ref().map_or(0, |c| c.frames())
    }

    /// The driver's queue set (snapshots, hardware queries). There is no
    /// mutable access: reposting RX slots behind the ring handle's back
    /// (`QueueSet::post_recvs`) would let the NIC overwrite packets the
    /// application still reads.
    pub fn queue_set(&self) -> &QueueSet<B> {
        &self.qs
    }
}

impl<B: HwBackend> Mlx5Transport<B> {
    /// Checks the frame in ring slot `idx` and returns its UDP payload
    /// length, or 0 (counted by reason) if eRPC must not see it.
    #[inline]
    fn validate(&mut self, idx: usize) -> u16 {
        // SAFETY: the slot was just reported by the driver's rx_burst and is
        // not given back before this read ends (giving back needs the ring
        // handle mutably, and `&mut self` is held here).
        let slot = unsafe { self.view.slot(idx) };
        // The NIC checked the IPv4 header checksum if this frame's CQE says
        // so (and the driver could read that CQE); else it is checked here.
        let hw_ok = self.qs.rx_cqe_flags_of(idx).ipv4_header_ok();
        let s = &mut self.stats;
        match wire::parse_frame_verified(slot, self.parse, hw_ok) {
            Ok(f) if f.dst_mac != self.local.mac || f.dst_port != self.local.udp_port => {
                s.rx_not_for_us += 1;
                0
            }
            Ok(f) if f.payload.len() < ERPC_HDR_BYTES => {
                s.rx_short += 1;
                0
            }
            Ok(f) => {
                s.rx_bytes += (HEADROOM_BYTES + f.payload.len()) as u64;
                s.rx_ip_csum_zero += u64::from(f.ip_checksum_zero);
                s.rx_ip_csum_hw += u64::from(hw_ok);
                f.payload.len() as u16
            }
            Err(e) => {
                *match e {
                    FrameError::Short => &mut s.rx_short,
                    FrameError::BadEthertype => &mut s.rx_bad_ethertype,
                    FrameError::BadIp => &mut s.rx_bad_ip,
                    FrameError::BadUdp => &mut s.rx_bad_udp,
                    FrameError::Oversize => &mut s.rx_oversize,
                } += 1;
                0
            }
        }
    }
}

impl<B: HwBackend> Transport for Mlx5Transport<B> {
    type Route = Mlx5Route;
    type Ring = Mlx5Ring;

    fn local_routing_info(&self) -> RoutingInfo {
        self.local
    }

    fn resolve(&self, info: &RoutingInfo) -> Result<Mlx5Route, TransportError> {
        let fail = |why: &str| {
            Err(TransportError::Resolve {
                info: *info,
                why: why.into(),
            })
        };
        if info.mac == [0; 6] || info.mac[0] & 1 != 0 {
            return fail("no unicast MAC address (is the peer using the UDP transport?)");
        }
        if info.ipv4.is_unspecified() || info.udp_port == 0 {
            return fail("no IPv4 address or UDP port");
        }
        let src_port = match rss::source_port(self.local.ipv4, info) {
            Ok(p) => p.unwrap_or(self.local.udp_port),
            Err(e) => return fail(&e.to_string()),
        };
        let template = FrameTemplate {
            dst_mac: info.mac,
            src_mac: self.local.mac,
            src_ip: self.local.ipv4,
            dst_ip: info.ipv4,
            src_port,
            dst_port: info.udp_port,
        };
        Ok(Mlx5Route {
            headroom: Headroom::new(&template),
            template,
        })
    }

    #[inline]
    fn fill_headroom(&self, route: &Mlx5Route, headroom: &mut [u8], frame_len: usize) {
        route.headroom.write(headroom, frame_len);
    }

    fn tx_burst(&mut self, items: &[TxItem<'_, Mlx5Route>]) -> usize {
        let mut frames = [TxFrame {
            first: &[],
            first_iova: 0,
            first_lkey: 0,
            rest: Gather::default(),
        }; POSTLIST];
        // Item index of each frame: a partial post accepts exactly the items
        // before the first frame not posted (and the capture writes them).
        let mut item_of = [0u8; POSTLIST];
        let mut n = 0;
        let considered = items.len().min(self.postlist);
        for (i, item) in items[..considered].iter().enumerate() {
            if item.drop() {
                self.stats.tx_dropped_on_purpose += 1;
                continue;
            }
            if item.frame_len() > MTU || item.pkt().len() < PKTHDR_BYTES {
                self.stats.tx_errors += 1;
                continue;
            }
            frames[n] = TxFrame {
                first: item.pkt(),
                first_iova: item.pkt_iova(),
                first_lkey: item.lkey(),
                rest: Gather {
                    iova: item.data_iova(),
                    len: item.data().len() as u32,
                    lkey: item.lkey(),
                },
            };
            item_of[n] = i as u8;
            n += 1;
        }
        if n == 0 {
            return considered;
        }
        let posted = match self.qs.tx_burst(&frames[..n]) {
            Ok(posted) => posted,
            Err(e) => {
                tracing_error(&e);
                if matches!(e, mlx5::Error::SqInError { .. }) {
                    // Nothing was posted; get the SQ usable again so that the
                    // caller's retry can go out.
                    let _ = self.qs.recover_sq();
                }
                0
            }
        };
        self.stats.tx_pkts += posted as u64;
        self.stats.tx_bytes += frames[..posted]
            .iter()
            .map(|f| f.first.len() as u64 + u64::from(f.rest.len))
            .sum::<u64>();
        if posted > 0 {
            self.stats.tx_doorbells += 1;
            if let Some(cap) = self.pcap.as_deref_mut() {
                capture_tx(cap, items, &item_of[..posted]);
            }
        }
        if posted < n {
            // The SQ is full (or in error): the caller keeps the rest queued.
            self.stats.tx_refused += (n - posted) as u64;
            return usize::from(item_of[posted]);
        }
        considered
    }

    fn tx_depth(&self) -> usize {
        // One WQE per frame at least one WQEBB: the send queue holds at
        // most this many frames the NIC has not read yet.
        1 << self.qs.config().sq_log_wqebbs
    }

    fn tx_burst_max(&self) -> usize {
        self.postlist
    }

    fn tx_flush(&mut self) {
        if let Err(e) = self.qs.tx_flush() {
            tracing_error(&e);
            if matches!(e, mlx5::Error::SqInError { .. }) {
                let _ = self.qs.recover_sq();
            }
        }
    }

    #[inline]
    fn rx_burst(&mut self) -> usize {
        // Firmware events (page requests, CQ errors) are serviced from here
        // at a bounded cadence; almost always a counter decrement.
        self.qs.poll_control();
        let n = self.qs.rx_burst();
        let mask = self.state.lens.len() - 1;
        let first = self.rx_head;
        for _ in 0..n {
            let idx = self.rx_head;
            self.rx_head = (idx + 1) & mask;
            let len = self.validate(idx);
            self.state.lens[idx].set(len);
        }
        let st = &self.state;
        st.delivered.set(st.delivered.get() + n as u64);
        self.stats.rx_pkts += n as u64;
        if let Some(cap) = self.pcap.as_deref_mut() {
            capture_rx(cap, &self.view, &self.state, first, n);
        }
        n
    }

    /// # Panics
    /// If `ring` is another transport's, or `n` is more than the slots the
    /// application holds (the NIC could then overwrite held packets).
    #[inline]
    fn post_recvs(&mut self, ring: &mut Mlx5Ring, n: usize) {
        assert!(
            Rc::ptr_eq(&ring.state, &self.state),
            "post_recvs: the ring handle belongs to another transport"
        );
        let st = &self.state;
        let held = st.held();
        assert!(
            n as u64 <= held,
            "post_recvs({n}): only {held} RX ring slots are held by the application"
        );
        st.released.set(st.released.get() + n as u64);
        self.qs.post_recvs(n)
    }

    fn take_rx_ring(&mut self) -> Option<Mlx5Ring> {
        if std::mem::replace(&mut self.ring_taken, true) {
            return None;
        }
        Some(Mlx5Ring {
            view: self.view.clone(),
            state: Rc::clone(&self.state),
        })
    }

    fn stats(&self) -> TransportStats {
        self.stats
    }
}

/// Writes the frames of one posted burst to the capture, as they left host
/// memory (headers, then the gathered data).
#[cold]
#[inline(never)]
fn capture_tx(cap: &mut Capture, items: &[TxItem<'_, Mlx5Route>], posted: &[u8]) {
    let ts = Capture::now();
    for &i in posted {
        let item = &items[usize::from(i)];
        cap.write_parts(ts, &[item.pkt(), item.data()]);
    }
}

/// Writes the `n` frames that arrived in slots `first..` to the capture,
/// cut to their IPv4 length (the whole stride when that is not sane).
#[cold]
#[inline(never)]
fn capture_rx(cap: &mut Capture, view: &RxRingView, state: &RingState, first: usize, n: usize) {
    let ts = Capture::now();
    let mask = state.lens.len() - 1;
    for k in 0..n {
        let idx = (first + k) & mask;
        // SAFETY: the slot was just reported by rx_burst; it is held, and
        // giving it back needs the transport mutably, which our caller
        // holds until the slice is gone.
        let slot = unsafe { view.slot(idx) };
        let len = match usize::from(state.lens[idx].get()) {
            0 => frame_len_hint(slot),
            payload => HEADROOM_BYTES + payload,
        };
        cap.write_parts(ts, &[&slot[..len]]);
    }
}

/// The length of a rejected frame, as far as its headers tell: its IPv4
/// total length when that fits in the slot and covers the IPv4 and UDP
/// headers, else the whole slot.
fn frame_len_hint(slot: &[u8]) -> usize {
    use wire::{ETH_HDR_BYTES, ETHERTYPE_IPV4, IPV4_HDR_BYTES, UDP_HDR_BYTES};
    if slot.len() < HEADROOM_BYTES || slot[12..14] != ETHERTYPE_IPV4.to_be_bytes() {
        return slot.len();
    }
    let ip_len = usize::from(u16::from_be_bytes([slot[16], slot[17]]));
    let len = ETH_HDR_BYTES + ip_len;
    if ip_len >= IPV4_HDR_BYTES + UDP_HDR_BYTES && len <= slot.len() {
        len
    } else {
        slot.len()
    }
}

#[cold]
fn tracing_error(e: &mlx5::Error) {
    tracing::error!(error = %e, "mlx5 transport");
}

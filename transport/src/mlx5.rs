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
//! frame is validated once, in `rx_burst` (`wire::parse_frame`, plus our MAC
//! and port), with every rejected frame counted by reason, and is then read
//! in place from the striding ring.

use std::cell::Cell;
use std::net::Ipv4Addr;
use std::rc::Rc;

use mlx5::hw::HwBackend;
use mlx5::{Device, Gather, QueueConfig, QueueSet, RxRingView, TxFrame};

use crate::wire::{self, FrameError, FrameTemplate, RoutingInfo};
use crate::{
    ERPC_HDR_BYTES, HEADROOM_BYTES, MTU, PKTHDR_BYTES, RxRing, Transport, TransportError,
    TransportStats, TxItem,
};

/// Largest burst (eRPC's postlist).
pub const POSTLIST: usize = 16;

/// Settings of one mlx5 transport (one per Rpc).
#[derive(Debug, Clone, Copy)]
pub struct Mlx5Config {
    /// IPv4 address this endpoint claims (the NIC has no IP of its own).
    pub ipv4: Ipv4Addr,
    /// Queue-set settings, including the UDP port steered to it.
    pub queue: QueueConfig,
}

/// A resolved peer: the fixed part of every frame to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mlx5Route {
    template: FrameTemplate,
}

/// Reads packets in the striding RX ring. Frames are validated once, in
/// `rx_burst`; this handle only returns what passed.
#[derive(Debug, Clone)]
pub struct Mlx5Ring {
    view: RxRingView,
    /// UDP payload length of the frame in each slot, 0 if it was rejected.
    lens: Rc<[Cell<u16>]>,
}

impl RxRing for Mlx5Ring {
    fn entries(&self) -> usize {
        self.view.entries()
    }

    #[inline]
    fn packet(&self, idx: usize) -> Option<&[u8]> {
        let i = idx & (self.lens.len() - 1);
        let len = usize::from(self.lens[i].get());
        if len == 0 {
            return None;
        }
        // SAFETY: eRPC reads slot `idx` only between the rx_burst that
        // reported it and the post_recvs that gives it back (the contract of
        // `RxRing::packet`); the driver never reposts a WQE whose strides
        // have not all been given back, so the NIC leaves the slot alone.
        let slot = unsafe { self.view.slot(i) };
        Some(&slot[HEADROOM_BYTES..HEADROOM_BYTES + len])
    }
}

/// eRPC over an mlx5 queue set.
pub struct Mlx5Transport<B: HwBackend> {
    qs: QueueSet<B>,
    ring: Mlx5Ring,
    local: RoutingInfo,
    stats: TransportStats,
    /// Next ring slot rx_burst validates.
    rx_head: usize,
}

impl<B: HwBackend> std::fmt::Debug for Mlx5Transport<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mlx5Transport({})", self.local)
    }
}

impl<B: HwBackend> Mlx5Transport<B> {
    /// Creates the queue set and the flow rule for `cfg.queue.udp_port`.
    pub fn new(device: &Device<B>, cfg: Mlx5Config) -> Result<Self, TransportError> {
        let qs = device
            .create_queue_set(cfg.queue)
            .map_err(|e| TransportError::Device(e.to_string()))?;
        let mac = qs.mac();
        let view = qs.rx_ring();
        let lens = (0..view.entries()).map(|_| Cell::new(0)).collect();
        let ring = Mlx5Ring { view, lens };
        let local = RoutingInfo {
            mac,
            ipv4: cfg.ipv4,
            udp_port: cfg.queue.udp_port,
            rxq_id: 0,
            rss_table_size: 0,
        };
        Ok(Mlx5Transport {
            qs,
            ring,
            local,
            stats: TransportStats::default(),
            rx_head: 0,
        })
    }

    /// The driver's queue set (snapshot, hardware queries, error recovery).
    pub fn queue_set(&self) -> &QueueSet<B> {
        &self.qs
    }

    /// Mutable access to the queue set.
    pub fn queue_set_mut(&mut self) -> &mut QueueSet<B> {
        &mut self.qs
    }
}

impl<B: HwBackend> Mlx5Transport<B> {
    /// Checks the frame in ring slot `idx` and returns its UDP payload
    /// length, or 0 (counted by reason) if eRPC must not see it.
    #[inline]
    fn validate(&mut self, idx: usize) -> u16 {
        // SAFETY: the slot was just reported by the driver's rx_burst and is
        // not given back before this read ends.
        let slot = unsafe { self.ring.view.slot(idx) };
        let s = &mut self.stats;
        match wire::parse_frame(slot) {
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
        Ok(Mlx5Route {
            template: FrameTemplate {
                dst_mac: info.mac,
                src_mac: self.local.mac,
                src_ip: self.local.ipv4,
                dst_ip: info.ipv4,
                src_port: self.local.udp_port,
                dst_port: info.udp_port,
            },
        })
    }

    #[inline]
    fn fill_headroom(&self, route: &Mlx5Route, headroom: &mut [u8], frame_len: usize) {
        wire::build_headroom(&route.template, headroom, frame_len);
    }

    fn tx_burst(&mut self, items: &[TxItem<'_, Mlx5Route>]) -> usize {
        let mut frames = [TxFrame {
            first: &[],
            first_iova: 0,
            first_lkey: 0,
            rest: Gather::default(),
        }; POSTLIST];
        let mut n = 0;
        let mut accepted = 0;
        for item in items.iter().take(POSTLIST) {
            accepted += 1;
            if item.drop {
                self.stats.tx_dropped_on_purpose += 1;
                continue;
            }
            if item.frame_len() > MTU || item.pkt.len() < PKTHDR_BYTES {
                self.stats.tx_errors += 1;
                continue;
            }
            frames[n] = TxFrame {
                first: item.pkt,
                first_iova: item.pkt_iova,
                first_lkey: item.lkey,
                rest: Gather {
                    iova: item.data_iova,
                    len: item.data.len() as u32,
                    lkey: item.lkey,
                },
            };
            n += 1;
        }
        if n == 0 {
            return accepted;
        }
        match self.qs.tx_burst(&frames[..n]) {
            Ok(posted) => {
                self.stats.tx_pkts += posted as u64;
                self.stats.tx_bytes += frames[..posted]
                    .iter()
                    .map(|f| f.first.len() as u64 + u64::from(f.rest.len))
                    .sum::<u64>();
                self.stats.tx_doorbells += 1;
                if posted < n {
                    self.stats.tx_errors += (n - posted) as u64;
                }
            }
            Err(e) => {
                tracing_error(&e);
                self.stats.tx_errors += n as u64;
                if matches!(e, mlx5::Error::SqInError { .. }) {
                    // Frames are lost either way (eRPC retransmits); get the
                    // SQ usable again for the next burst.
                    let _ = self.qs.recover_sq();
                }
            }
        }
        accepted
    }

    fn tx_burst_max(&self) -> usize {
        POSTLIST
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
        let mask = self.ring.lens.len() - 1;
        for _ in 0..n {
            let idx = self.rx_head;
            self.rx_head = (idx + 1) & mask;
            let len = self.validate(idx);
            self.ring.lens[idx].set(len);
        }
        self.stats.rx_pkts += n as u64;
        n
    }

    #[inline]
    fn post_recvs(&mut self, n: usize) {
        self.qs.post_recvs(n)
    }

    fn rx_ring(&self) -> Mlx5Ring {
        self.ring.clone()
    }

    fn stats(&self) -> TransportStats {
        self.stats
    }
}

#[cold]
fn tracing_error(e: &mlx5::Error) {
    tracing::error!(error = %e, "mlx5 transport");
}

//! The simulated NIC: [`SimTransport`], an endpoint's transport on the
//! simulated network, with its RX ring ([`SimRing`]) and routes
//! ([`SimRoute`]).

use super::*;

/// A destination on the simulated network.
#[derive(Debug, Clone)]
pub struct SimRoute {
    ep: usize,
    /// Headers of every frame to the peer, built once.
    headroom: Headroom,
}

/// Read handle of a simulated RX ring (one per transport).
pub struct SimRing(pub(crate) Rc<RingMem>);

impl fmt::Debug for SimRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimRing({} entries)", self.0.entries())
    }
}

impl RxRing for SimRing {
    fn entries(&self) -> usize {
        self.0.entries()
    }

    #[inline]
    fn packet(&self, idx: usize) -> Option<&[u8]> {
        self.0.packet(idx)
    }
}

/// One endpoint of a [`SimNet`]: a [`Transport`] whose frames cross the
/// simulated network.
pub struct SimTransport {
    pub(crate) net: Rc<RefCell<NetInner>>,
    pub(crate) clock: VirtualClock,
    pub(crate) ep: usize,
    pub(crate) generation: u32,
    /// The ring handle, until `take_rx_ring` hands it out.
    pub(crate) ring: Option<SimRing>,
    pub(crate) routing: RoutingInfo,
    pub(crate) tx_burst_max: usize,
}

impl fmt::Debug for SimTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimTransport {{ ep {}, {} }}", self.ep, self.routing)
    }
}

impl SimTransport {
    /// Endpoint index in its network.
    pub fn endpoint(&self) -> usize {
        self.ep
    }

    /// False once the endpoint was restarted: this transport belongs to
    /// the crashed incarnation and sends and receives nothing.
    fn current(&self, n: &NetInner) -> bool {
        n.net.device(port(self.ep)).generation == self.generation
    }
}

impl Drop for SimTransport {
    /// Deferred DMA: the NIC reads what it has not read yet of a transport
    /// that goes away, as a flush would (its send queue is torn down only
    /// once the NIC let go): a buffer freed before the owner's last drain
    /// shows here. The owner drops its transport before its allocator.
    fn drop(&mut self) {
        let Ok(mut guard) = self.net.try_borrow_mut() else {
            return;
        };
        if !self.current(&guard) || guard.cfg.deferred_dma.is_none() {
            return;
        }
        let now = self.clock.now_ns();
        let NetInner {
            net, extra, iommu, ..
        } = &mut *guard;
        read_due(net, extra, iommu, self.ep, now, false, true);
    }
}

impl Transport for SimTransport {
    type Route = SimRoute;
    type Ring = SimRing;

    fn local_routing_info(&self) -> RoutingInfo {
        self.routing
    }

    fn resolve(&self, info: &RoutingInfo) -> Result<SimRoute, TransportError> {
        let n = self.net.borrow();
        let Some(ep) = n
            .net
            .devices()
            .position(|e| e.routing.ipv4 == info.ipv4 && e.routing.udp_port == info.udp_port)
        else {
            return Err(TransportError::Resolve {
                info: *info,
                why: "no simulated endpoint has this address".into(),
            });
        };
        // Toward a peer that uses RSS (a C++ DPDK receiver), the source
        // port its RSS maps to its queue, as the real transports pick it.
        let src_port = match transport::rss::source_port(self.routing.ipv4, info) {
            Ok(p) => p.unwrap_or(self.routing.udp_port),
            Err(e) => {
                return Err(TransportError::Resolve {
                    info: *info,
                    why: e.to_string(),
                });
            }
        };
        let template = FrameTemplate {
            dst_mac: info.mac,
            src_mac: self.routing.mac,
            src_ip: self.routing.ipv4,
            dst_ip: info.ipv4,
            src_port,
            dst_port: info.udp_port,
        };
        Ok(SimRoute {
            ep,
            headroom: Headroom::new(&template),
        })
    }

    #[inline]
    fn fill_headroom(&self, route: &SimRoute, headroom: &mut [u8], frame_len: usize) {
        route.headroom.write(headroom, frame_len);
    }

    fn tx_burst(&mut self, items: &[TxItem<'_, SimRoute>]) -> usize {
        let now = self.clock.now_ns();
        let mut guard = self.net.borrow_mut();
        if !self.current(&guard) {
            return items.len();
        }
        let NetInner {
            net, extra, iommu, ..
        } = &mut *guard;
        let me = port(self.ep);
        {
            let ep = net.device_mut(me);
            if ep.refuse_bursts > 0 {
                ep.refuse_bursts -= 1;
                ep.stats.tx_refused += items.len() as u64;
                extra.tx_refused_bursts += 1;
                return 0;
            }
        }
        let deferred = net.device(me).dma.is_some();
        if let Some(q) = net.device_mut(me).dma.as_mut() {
            q.start_burst();
        }
        for it in items {
            let ep = net.device_mut(me);
            if it.drop() {
                ep.stats.tx_dropped_on_purpose += 1;
                continue;
            }
            let len = it.frame_len();
            if len > MTU {
                ep.stats.tx_errors += 1;
                continue;
            }
            ep.stats.tx_pkts += 1;
            ep.stats.tx_bytes += len as u64;
            let mut f = net.frame_buf();
            if deferred && it.pkt_iova() != 0 {
                // The NIC reads it later: a snapshot now, the bytes then.
                let ep = net.device_mut(me);
                let q = ep.dma.as_mut().expect("deferred");
                let panic = q.cfg().panic;
                if let Err((f, msg)) = q.post(iommu, it, it.route().ep, now, f) {
                    net.recycle(f);
                    extra.dma_error(true, msg, panic);
                }
                continue;
            }
            f.reserve(len);
            f.extend_from_slice(it.pkt());
            f.extend_from_slice(it.data());
            send_frame(net, extra, self.ep, it.route().ep, now, f);
        }
        if deferred {
            read_due(net, extra, iommu, self.ep, now, true, false);
        }
        net.device_mut(me).stats.tx_doorbells += 1;
        items.len()
    }

    fn tx_burst_max(&self) -> usize {
        self.tx_burst_max
    }

    fn tx_flush(&mut self) {
        let mut guard = self.net.borrow_mut();
        if !self.current(&guard) || guard.cfg.deferred_dma.is_none() {
            return;
        }
        let now = self.clock.now_ns();
        let NetInner {
            net, extra, iommu, ..
        } = &mut *guard;
        read_due(net, extra, iommu, self.ep, now, false, true);
    }

    #[inline]
    fn rx_burst(&mut self) -> usize {
        let mut n = self.net.borrow_mut();
        if !self.current(&n) {
            return 0;
        }
        let ep = n.net.device_mut(port(self.ep));
        let k = ep.written - ep.reported;
        ep.reported = ep.written;
        k as usize
    }

    fn post_recvs(&mut self, ring: &mut SimRing, k: usize) {
        let mut n = self.net.borrow_mut();
        if !self.current(&n) {
            return;
        }
        let ep = n.net.device_mut(port(self.ep));
        assert!(
            Rc::ptr_eq(&ring.0, &ep.ring),
            "post_recvs: the ring handle belongs to another transport"
        );
        let entries = ep.ring.entries() as u64;
        for _ in 0..k {
            assert!(
                ep.reposted < ep.reported,
                "post_recvs beyond received packets"
            );
            ep.ring.repost((ep.reposted % entries) as usize);
            ep.reposted += 1;
        }
    }

    fn take_rx_ring(&mut self) -> Option<SimRing> {
        self.ring.take()
    }

    fn stats(&self) -> TransportStats {
        self.net.borrow().net.device(port(self.ep)).stats
    }
}

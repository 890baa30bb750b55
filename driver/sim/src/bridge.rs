//! A fabric port bridged to a real Linux interface through an AF_PACKET
//! socket, so device-model NICs in different processes (for instance in
//! two network namespaces joined by a veth pair) exchange frames across a
//! real kernel link that tcpdump/tshark can see.
//!
//! Frames the switch sends to the bridge's port leave on the interface.
//! Frames arriving on the interface enter the switch through the port, but
//! only those meant for a device behind this fabric: IPv4 frames whose
//! destination MAC the switch knows on another port. Everything else is
//! ignored and counted by reason: our own transmissions coming back
//! (`PACKET_OUTGOING`), ARP/IPv6/other EtherTypes (the kernel's neighbour
//! and router chatter), frames for other MACs (the kernel's own traffic,
//! including any ICMP it sends in reaction to our UDP frames, which goes to
//! the *kernel's* peers, not to our device-model MACs), runts and frames
//! larger than the buffer. The kernel never owns our IPs or MACs, so it
//! does not otherwise react to our frames: they arrive as PACKET_OTHERHOST.
//!
//! In threaded mode a receive thread feeds the switch; in deterministic
//! mode nothing runs in the background and [`Bridge::poll`] moves waiting
//! frames (a real link is not deterministic; a bridged fabric replays only
//! what happens on its own side).

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bridge_sys;
use crate::fabric::{Fabric, PortId, PortSink};

/// Attaching a bridge failed.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// No such interface.
    #[error(
        "bridge: no interface named {ifname:?} ({source}); check `ip link` in this network namespace"
    )]
    NoInterface {
        /// The name given.
        ifname: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Opening or configuring the packet socket failed.
    #[error(
        "bridge: cannot open an AF_PACKET socket on {ifname:?}: {source}; needs root or CAP_NET_RAW"
    )]
    Socket {
        /// The interface.
        ifname: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Counters of one bridge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BridgeStats {
    /// Frames from the switch written to the interface.
    pub to_link: u64,
    /// Frames that could not be written (errno counted once each).
    pub to_link_errors: u64,
    /// Frames from the interface passed into the switch.
    pub from_link: u64,
    /// Ignored: our own transmission seen again.
    pub ignored_outgoing: u64,
    /// Ignored: not IPv4 (ARP, IPv6 neighbour discovery, LLDP, ...).
    pub ignored_ethertype: u64,
    /// Ignored: destination MAC not behind this fabric (or behind the bridge itself).
    pub ignored_not_ours: u64,
    /// Ignored: shorter than an Ethernet header, or truncated.
    pub ignored_malformed: u64,
    /// Receive errors.
    pub rx_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    to_link: AtomicU64,
    to_link_errors: AtomicU64,
    from_link: AtomicU64,
    ignored_outgoing: AtomicU64,
    ignored_ethertype: AtomicU64,
    ignored_not_ours: AtomicU64,
    ignored_malformed: AtomicU64,
    rx_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Sink {
    fd: Arc<OwnedFd>,
    c: Arc<Counters>,
}

impl PortSink for Sink {
    fn receive(&self, frame: &[u8]) {
        match bridge_sys::send(&self.fd, frame) {
            Ok(()) => bump(&self.c.to_link),
            Err(e) => {
                if self.c.to_link_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(%e, "bridge: writing a frame to the link failed");
                }
            }
        }
    }
}

/// A fabric port bridged to a Linux interface. Detached on drop.
pub struct Bridge {
    fabric: Fabric,
    port: PortId,
    ifname: String,
    fd: Arc<OwnedFd>,
    c: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _sink: Arc<dyn PortSink>,
}

impl fmt::Debug for Bridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bridge({} <-> {})", self.port, self.ifname)
    }
}

/// Largest frame the bridge passes (jumbo frames are truncated and counted).
const MAX_FRAME: usize = 9216;

/// Decides whether a frame from the link goes into the switch.
fn admit(fabric: &Fabric, port: PortId, c: &Counters, frame: &[u8], pkttype: u8) -> bool {
    if pkttype == bridge_sys::PACKET_OUTGOING {
        bump(&c.ignored_outgoing);
        return false;
    }
    if frame.len() < 14 {
        bump(&c.ignored_malformed);
        return false;
    }
    if u16::from_be_bytes([frame[12], frame[13]]) != 0x0800 {
        bump(&c.ignored_ethertype);
        return false;
    }
    let dst = [frame[0], frame[1], frame[2], frame[3], frame[4], frame[5]];
    match fabric.inner().port_of_mac(&dst) {
        Some(p) if p != port.0 => true,
        _ => {
            bump(&c.ignored_not_ours);
            false
        }
    }
}

impl Fabric {
    /// Bridges a new port of this fabric to interface `ifname`.
    pub fn add_bridge(&self, ifname: &str) -> Result<Bridge, BridgeError> {
        let index = bridge_sys::ifindex(ifname).map_err(|source| BridgeError::NoInterface {
            ifname: ifname.to_string(),
            source,
        })?;
        let fd = Arc::new(bridge_sys::open(index, Duration::from_millis(20)).map_err(
            |source| BridgeError::Socket {
                ifname: ifname.to_string(),
                source,
            },
        )?);
        let c = Arc::new(Counters::default());
        let sink: Arc<dyn PortSink> = Arc::new(Sink {
            fd: fd.clone(),
            c: c.clone(),
        });
        let port = self.add_sink_port(&sink);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = if self.config().deterministic {
            None
        } else {
            let (fabric, fd, c, stop) = (self.clone(), fd.clone(), c.clone(), stop.clone());
            Some(
                std::thread::Builder::new()
                    .name(format!("bridge-{ifname}"))
                    .spawn(move || {
                        let mut buf = vec![0u8; MAX_FRAME];
                        while !stop.load(Ordering::Relaxed) {
                            pump_one(&fabric, port, &fd, &c, &mut buf, false);
                        }
                    })
                    .expect("spawn bridge thread"),
            )
        };
        Ok(Bridge {
            fabric: self.clone(),
            port,
            ifname: ifname.to_string(),
            fd,
            c,
            stop,
            thread,
            _sink: sink,
        })
    }
}

/// Receives at most one frame and passes it on; false if nothing came.
fn pump_one(
    fabric: &Fabric,
    port: PortId,
    fd: &OwnedFd,
    c: &Counters,
    buf: &mut [u8],
    nonblocking: bool,
) -> bool {
    match bridge_sys::recv(fd, buf, nonblocking) {
        Ok(Some((len, pkttype))) => {
            if len > buf.len() {
                bump(&c.ignored_malformed);
                return true;
            }
            let frame = &buf[..len];
            if admit(fabric, port, c, frame, pkttype) {
                bump(&c.from_link);
                fabric.inner().transmit(port.0, frame.to_vec());
            }
            true
        }
        Ok(None) => false,
        Err(e) => {
            if c.rx_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(%e, "bridge: receive failed");
            }
            false
        }
    }
}

impl Bridge {
    /// The fabric port.
    pub fn port(&self) -> PortId {
        self.port
    }

    /// The Linux interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Deterministic mode: moves every frame waiting on the interface into
    /// the switch (threaded mode does this in the background). Returns how
    /// many frames were read.
    pub fn poll(&self) -> usize {
        let mut buf = vec![0u8; MAX_FRAME];
        let mut n = 0;
        while n < 4096 && pump_one(&self.fabric, self.port, &self.fd, &self.c, &mut buf, true) {
            n += 1;
        }
        n
    }

    /// Counters.
    pub fn stats(&self) -> BridgeStats {
        let c = &self.c;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BridgeStats {
            to_link: g(&c.to_link),
            to_link_errors: g(&c.to_link_errors),
            from_link: g(&c.from_link),
            ignored_outgoing: g(&c.ignored_outgoing),
            ignored_ethertype: g(&c.ignored_ethertype),
            ignored_not_ours: g(&c.ignored_not_ours),
            ignored_malformed: g(&c.ignored_malformed),
            rx_errors: g(&c.rx_errors),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

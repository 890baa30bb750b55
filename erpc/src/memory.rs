//! Message-buffer memory for transports that copy packets.
//!
//! An Rpc's msgbufs come from a [`mempool::Allocator`] whose regions are
//! registered with whatever reads them. On a NIC that is the device
//! (`mempool::Allocator::new(device.dma_mapper(), ..)`); over kernel UDP
//! (and eRPC's simulated network) no device reads them: the kernel copies
//! each datagram out of the buffer during `sendmsg`. Such memory still
//! comes from 2 MiB hugepages (fewer TLB misses over large messages), but
//! needs no DMA registration: [`host_allocator`] is that allocator.

use std::sync::Arc;

use mempool::{AllocError, Allocator, AllocatorConfig, IdentityMapper, RegionOptions};

/// The allocator for an Rpc over kernel UDP (`transport::udp`): hugepage
/// memory that no device reads (an identity DMA mapping: the I/O address
/// of a byte is its virtual address, and nothing is registered with a
/// NIC), reserving `initial_bytes` up front and growing on demand.
///
/// Where its memory comes from is the caller's decision: with
/// `region.fallback` left at `Fallback::Never` a shortage of free 2 MiB
/// hugepages is an error that names the shortfall and the command that
/// fixes it; `Fallback::SmallPages` accepts 4 KiB pages instead (counted in
/// the allocator's stats).
///
/// ```no_run
/// use transport::udp::{UdpConfig, UdpTransport};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let nexus = erpc::Nexus::builder("127.0.0.1:31850").build()?;
/// let transport = UdpTransport::new(&UdpConfig::loopback())?;
/// let alloc = erpc::host_allocator(8 << 20, Default::default())?;
/// let rpc: erpc::Rpc<_, ()> =
///     erpc::Rpc::builder(&nexus, transport, alloc).build()?;
/// # drop(rpc);
/// # Ok(())
/// # }
/// ```
pub fn host_allocator(
    initial_bytes: usize,
    region: RegionOptions,
) -> Result<Allocator, AllocError> {
    Allocator::new(
        Arc::new(IdentityMapper::new()),
        AllocatorConfig {
            initial_bytes,
            region,
            ..AllocatorConfig::default()
        },
    )
}

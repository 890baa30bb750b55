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

/// Test hook (`testing` feature): the allocator of a test (or a
/// test-like benchmark) on the simulated network or kernel UDP: 2 MiB
/// hugepages when enough are free; otherwise, outside CI (`ERPC_CI`
/// unset), 4 KiB pages with a note on stderr that names the test's
/// opt-in. In CI a shortage is an error. Tools and examples decide for
/// themselves and call [`host_allocator`] (`erpc_sim::sim_allocator`).
#[cfg(any(test, feature = "testing"))]
pub fn test_allocator(initial_bytes: usize) -> mempool::Allocator {
    test_allocator_with(
        initial_bytes,
        Arc::new(mempool::IdentityMapper::new()),
        None,
    )
}

/// Test hook (`testing` feature): [`test_allocator`] with memory
/// registered with `mapper` and freed blocks filled with `poison` (if
/// set); the simulator's deferred-DMA allocators.
#[cfg(any(test, feature = "testing"))]
pub fn test_allocator_with(
    initial_bytes: usize,
    mapper: Arc<dyn mempool::DmaMapper>,
    poison: Option<u8>,
) -> mempool::Allocator {
    use mempool::{Allocator, AllocatorConfig, Fallback, RegionOptions};
    let pages = (initial_bytes as u64).div_ceil(2 << 20).max(1) + 8;
    let fallback = if mempool::hugepages_available(pages) {
        Fallback::Never
    } else if std::env::var_os("ERPC_CI").is_some() {
        panic!("ERPC_CI is set and fewer than {pages} free 2 MiB hugepages remain");
    } else {
        eprintln!(
            "note: fewer than {pages} free 2 MiB hugepages; this test opts in to 4 KiB pages \
             (Fallback::SmallPages)"
        );
        Fallback::SmallPages
    };
    let region = RegionOptions {
        fallback,
        ..RegionOptions::default()
    };
    let cfg = AllocatorConfig {
        initial_bytes,
        region,
        poison_on_free: poison,
        ..AllocatorConfig::default()
    };
    match Allocator::new(mapper, cfg) {
        Ok(a) => a,
        Err(e) => panic!("test allocator of {initial_bytes} bytes: {e}"),
    }
}

//! [`SimBackend`]: the device model behind the driver's
//! [`HwBackend`] trait. Every register write reaches
//! the model synchronously, the way a hypervisor traps MMIO.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use mempool::DmaMapper;
use mlx5::hw::HwBackend;

use crate::nic::NicInner;
use crate::util::mac_str;

/// The backend of one device-model NIC (cheap to clone; `Send + Sync`).
#[derive(Clone)]
pub struct SimBackend {
    pub(crate) nic: Arc<NicInner>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimBackend({})", self.describe())
    }
}

impl HwBackend for SimBackend {
    fn bar0_len(&self) -> usize {
        self.nic.bar0_len()
    }

    fn read32(&self, offset: usize) -> u32 {
        self.nic.read32(offset)
    }

    fn write32(&self, offset: usize, value: u32) {
        self.nic.write32(offset, value)
    }

    fn write64(&self, offset: usize, value: u64) {
        self.nic.write64(offset, value)
    }

    fn write_bf(&self, offset: usize, data: &[u8]) {
        self.nic.write_bf(offset, data)
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> io::Result<()> {
        self.nic.config_read(offset, buf)
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> io::Result<()> {
        self.nic.config_write(offset, data)
    }

    /// What vfio-pci does to the device: MSI-X on, `vector` routed.
    fn enable_msix(&self, vector: u16) -> io::Result<()> {
        self.nic.enable_msix(vector)
    }

    fn disable_msix(&self) -> io::Result<()> {
        self.nic.disable_msix();
        Ok(())
    }

    fn bar_write_combining(&self) -> bool {
        self.nic.cfg.bar_write_combining
    }

    fn dma_mapper(&self) -> Arc<dyn DmaMapper> {
        self.nic.mapper.clone()
    }

    /// Deterministic fabric: advances the virtual clock by `duration` and
    /// delivers what is due. Threaded: yields for waits under 100 µs,
    /// sleeps otherwise.
    fn wait(&self, duration: Duration) {
        // The NIC goes on while the host waits: held sends (deferred
        // gather) are read and their CQEs written.
        self.nic.release_deferred_tx(true);
        let f = &self.nic.fabric;
        if f.deterministic() {
            f.check_thread();
            f.advance_by(duration);
        } else if duration < Duration::from_micros(100) {
            std::thread::yield_now();
            f.pump_due();
        } else {
            std::thread::sleep(duration);
            f.pump_due();
        }
    }

    /// The fabric clock.
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nic.now_ns())
    }

    fn describe(&self) -> String {
        format!(
            "sim nic {} ({}, mac {})",
            self.nic.function,
            self.nic.port,
            mac_str(&self.nic.cfg.mac)
        )
    }
}

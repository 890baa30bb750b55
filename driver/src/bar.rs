//! BAR0: the one choke point every register access goes through.
//!
//! Offsets are bounds- and alignment-checked here (a bad offset is a driver
//! bug, so it panics with the offset); the backend does the MMIO itself.

use std::time::Duration;

use crate::hw::HwBackend;

/// BAR0 of one device, over a backend.
#[derive(Debug)]
pub struct Bar<B> {
    backend: B,
    len: usize,
}

impl<B: HwBackend> Bar<B> {
    /// Wraps a backend.
    pub fn new(backend: B) -> Bar<B> {
        let len = backend.bar0_len();
        Bar { backend, len }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    #[inline(always)]
    fn check(&self, off: usize, width: usize) {
        assert!(
            off.is_multiple_of(width) && off + width <= self.len,
            "BAR0 access of {width} bytes at {off:#x} (BAR0 is {:#x} bytes)",
            self.len
        );
    }

    /// Reads a 32-bit register.
    #[inline]
    pub fn read32(&self, off: usize) -> u32 {
        self.check(off, 4);
        self.backend.read32(off)
    }

    /// Writes a 32-bit register.
    #[inline]
    pub fn write32(&self, off: usize, v: u32) {
        self.check(off, 4);
        self.backend.write32(off, v)
    }

    /// One 64-bit doorbell store.
    #[inline]
    pub fn write64(&self, off: usize, v: u64) {
        self.check(off, 8);
        self.backend.write64(off, v)
    }

    /// BlueFlame copy (whole 64-byte chunks).
    #[inline]
    pub fn write_bf(&self, off: usize, data: &[u8]) {
        assert!(
            !data.is_empty() && data.len().is_multiple_of(64) && data.len() <= 256,
            "BlueFlame write of {} bytes",
            data.len()
        );
        self.check(off, 64);
        assert!(off + data.len() <= self.len);
        self.backend.write_bf(off, data)
    }

    /// Lets time pass while polling.
    #[inline]
    pub fn wait(&self, d: Duration) {
        self.backend.wait(d)
    }

    /// Device name for messages.
    pub fn name(&self) -> String {
        self.backend.describe()
    }
}

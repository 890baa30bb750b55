//! Memory barriers named by what they order, one implementation per
//! architecture (x86-64 and aarch64; other targets get the conservative
//! `SeqCst` fence).
//!
//! * [`to_device`]: CPU stores to DMA memory (WQEs, doorbell records) become
//!   visible to the device before a later store (a doorbell record or an
//!   MMIO doorbell). x86 keeps stores in order, so only the compiler must be
//!   stopped; aarch64 needs `dmb oshst`.
//! * [`from_device`]: after reading an ownership bit the device wrote, later
//!   loads of the same entry see what the device wrote before it. x86 keeps
//!   loads in order (compiler fence); aarch64 needs `dmb oshld`.
//! * [`full`]: orders loads and stores against later loads and stores
//!   (nothing on the datapath needs it; the overrunning-CQ snapshot needs
//!   only load-load order, [`from_device`]). `mfence` / `dmb osh`.
//! * [`wc_start`] / [`wc_flush`]: bracket write-combining BlueFlame stores:
//!   earlier stores drain first, and the WC buffer is flushed so the 64-byte
//!   burst leaves as one transaction. `sfence` on x86; `dsb st` on aarch64.
//!
//! The fences are also `std::sync::atomic` fences, so the same code is
//! correct in Rust's memory model when the "device" is the device model on
//! another thread.

use std::sync::atomic::{Ordering, compiler_fence, fence};

/// Orders earlier stores to DMA memory before later stores (doorbell record,
/// MMIO doorbell).
#[inline(always)]
pub fn to_device() {
    fence(Ordering::Release);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; touches no memory.
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    compiler_fence(Ordering::SeqCst);
}

/// Orders a load of an ownership bit before later loads of the entry.
#[inline(always)]
pub fn from_device() {
    fence(Ordering::Acquire);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; touches no memory.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    compiler_fence(Ordering::SeqCst);
}

/// Orders all earlier loads and stores before all later ones.
#[inline(always)]
pub fn full() {
    // On x86-64 the SeqCst fence is itself an `mfence`.
    fence(Ordering::SeqCst);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; touches no memory.
    unsafe {
        std::arch::asm!("dmb osh", options(nostack, preserves_flags))
    };
}

/// Before write-combining (BlueFlame) stores: earlier stores go first.
#[inline(always)]
pub fn wc_start() {
    to_device();
}

/// After write-combining stores: flush the WC buffer.
#[inline(always)]
pub fn wc_flush() {
    fence(Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a barrier instruction; touches no memory.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; touches no memory.
    unsafe {
        std::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
}

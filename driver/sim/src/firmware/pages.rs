//! Firmware page accounting: boot, init and regular pages.
//!
//! * The firmware's target is `boot + init` after ENABLE_HCA, grows by
//!   `regular` at INIT_HCA (announced with a page-request EQE, +regular),
//!   moves with injected page requests/returns, and is 0 after
//!   TEARDOWN_HCA (every page must come back through MANAGE_PAGES TAKE).
//! * QUERY_PAGES op_mod 1 answers `boot - held`, op_mod 2
//!   `boot + init - held` (both at least 0), and op_mod 3 (regular;
//!   [unsure]: rdma-core never sends it) the signed `target - held`, so a
//!   driver may poll it instead of reading page-request EQEs.
//! * Given pages are checked (4 KiB aligned, mapped in the IOMMU, not
//!   already held) and filled with [`PAGE_FILL`] as the firmware "uses"
//!   them, so a driver that reuses a page it gave away sees garbage.

use std::collections::BTreeSet;

use mlx5::prm::codes::EventType;

use crate::nic::NicConfig;
use crate::nic::NicInner;
use crate::objects::Datapath;

use super::{Firmware, HcaState};

/// Byte the firmware writes over every page it is given.
pub const PAGE_FILL: u8 = 0xf7;

/// Page state.
#[derive(Debug, Clone)]
pub(crate) struct Pages {
    pub held: BTreeSet<u64>,
    /// On an embedded-CPU function (ECPF): pages given for the host PF
    /// (function 0, `ec_function` 0), which firmware asks the ECPF for.
    pub host: BTreeSet<u64>,
    /// Host PF pages firmware wants while initialized.
    pub host_demand: u32,
    pub boot: u32,
    pub init: u32,
    /// Regular pages wanted after INIT_HCA (changes with page requests).
    pub regular: u32,
    pub regular_default: u32,
}

impl Pages {
    pub(crate) fn new(cfg: &NicConfig) -> Pages {
        Pages {
            held: BTreeSet::new(),
            host: BTreeSet::new(),
            host_demand: 0,
            boot: cfg.boot_pages,
            init: cfg.init_pages,
            regular: 0,
            regular_default: cfg.regular_pages,
        }
    }

    /// Pages the firmware wants to hold in state `hca`.
    pub(crate) fn target(&self, hca: HcaState) -> i64 {
        match hca {
            HcaState::Disabled | HcaState::TornDown => 0,
            HcaState::Enabled => i64::from(self.boot) + i64::from(self.init),
            HcaState::Initialized => {
                i64::from(self.boot) + i64::from(self.init) + i64::from(self.regular)
            }
        }
    }

    /// Held pages above the target.
    pub(crate) fn surplus(&self, hca: HcaState) -> usize {
        (self.held.len() as i64 - self.target(hca)).max(0) as usize
    }

    /// What MANAGE_PAGES TAKE may return now. Before INIT_HCA every page
    /// (a driver whose bring-up failed takes its boot and init pages back
    /// before DISABLE_HCA, as Linux `mlx5_reclaim_startup_pages` does on
    /// its error path); while initialized the surplus over the target;
    /// after TEARDOWN_HCA nothing until the firmware has released its
    /// pages, `release_delay_ns` later, then every page.
    /// Pages held for every function.
    pub(crate) fn total(&self) -> usize {
        self.held.len() + self.host.len()
    }

    /// What TAKE may return of the host PF's pages (same rules as
    /// [`Pages::reclaimable`], against the host demand).
    pub(crate) fn reclaimable_host(
        &self,
        hca: HcaState,
        torn_down_at: Option<u64>,
        now_ns: u64,
        release_delay_ns: u64,
    ) -> usize {
        match hca {
            HcaState::Enabled | HcaState::Disabled => self.host.len(),
            HcaState::Initialized => self.host.len().saturating_sub(self.host_demand as usize),
            HcaState::TornDown => {
                let released =
                    torn_down_at.is_none_or(|t| now_ns >= t.saturating_add(release_delay_ns));
                if released { self.host.len() } else { 0 }
            }
        }
    }

    pub(crate) fn reclaimable(
        &self,
        hca: HcaState,
        torn_down_at: Option<u64>,
        now_ns: u64,
        release_delay_ns: u64,
    ) -> usize {
        match hca {
            HcaState::Enabled | HcaState::Disabled => self.held.len(),
            HcaState::Initialized => self.surplus(hca),
            HcaState::TornDown => {
                let released =
                    torn_down_at.is_none_or(|t| now_ns >= t.saturating_add(release_delay_ns));
                if released { self.held.len() } else { 0 }
            }
        }
    }
}

/// Writes queued page-request EQEs to the first EQ that takes them.
pub(crate) fn flush_page_events(nic: &NicInner, fw: &mut Firmware, dp: &Datapath) {
    if fw.page_events.is_empty() {
        return;
    }
    // The IOMMU session before any EQ's lock (see `Iommu::session`).
    let io = &nic.iommu.session();
    while let Some(&(ec, func, n)) = fw.page_events.front() {
        let eq = dp
            .eqs
            .values()
            .find(|e| crate::util::lock(e).subscribed(EventType::PageRequest))
            .cloned();
        let Some(eq) = eq else { return };
        let mut data = [0u8; 28];
        // ec_function, the function's id, num_pages (signed).
        data[0..2].copy_from_slice(&u16::from(ec).to_be_bytes());
        data[2..4].copy_from_slice(&func.to_be_bytes());
        data[4..8].copy_from_slice(&n.to_be_bytes());
        match crate::util::lock(&eq).post(nic, io, EventType::PageRequest, 0, &data) {
            Ok(()) => {
                fw.page_events.pop_front();
            }
            Err(_) => return,
        }
    }
}

/// Firmware asks for `n` more pages (n > 0) or offers `-n` back (n < 0).
pub(crate) fn request(nic: &NicInner, fw: &mut Firmware, dp: &Datapath, n: i32) {
    if n >= 0 {
        fw.pages.regular = fw.pages.regular.saturating_add(n as u32);
    } else {
        fw.pages.regular = fw.pages.regular.saturating_sub(n.unsigned_abs());
    }
    if n != 0 {
        fw.page_events
            .push_back((nic.cfg.ecpf, nic.cfg.function_id, n));
    }
    flush_page_events(nic, fw, dp);
}

/// On an ECPF: firmware asks for `n` pages for the host PF (function 0,
/// `ec_function` 0), as Linux `pagealloc.c` serves them from the ECPF.
pub(crate) fn request_host(nic: &NicInner, fw: &mut Firmware, dp: &Datapath, n: u32) {
    fw.pages.host_demand = fw.pages.host_demand.saturating_add(n);
    if n != 0 {
        fw.page_events.push_back((false, 0, n as i32));
    }
    flush_page_events(nic, fw, dp);
}

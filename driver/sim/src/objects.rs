//! The per-function object tables the datapath reads: memory keys, TIS,
//! TIR, Q counters, the vport context, and the queues.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::queues::{Cq, Eq};
use crate::rx::Rq;
use crate::stats::ObjectCounts;
use crate::steering::Steering;
use crate::tx::Sq;

/// IOVA pieces of a memory-key range, (IOVA, bytes): inline for the usual
/// few (a PA key gives one, an MTT key one per page crossed).
pub(crate) type IovaPieces = SmallVec<[(u64, u64); 4]>;

/// How a memory key translates addresses.
#[derive(Debug, Clone)]
pub(crate) enum MkeyKind {
    /// Physical (bus) addresses: the address in a data segment is the
    /// IOVA. `length64` covers everything; otherwise `[start, start+len)`.
    Pa {
        length64: bool,
        start: u64,
        len: u64,
    },
    /// A page list: virtual `[start, start+len)` in pages of
    /// `1 << page_shift` bytes.
    Mtt {
        start: u64,
        len: u64,
        page_shift: u32,
        pages: Vec<u64>,
    },
}

/// A memory key.
#[derive(Debug, Clone)]
pub(crate) struct Mkey {
    pub variant: u8,
    pub pd: u32,
    pub lr: bool,
    pub lw: bool,
    pub kind: MkeyKind,
}

/// Why a memory-key translation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MkeyError {
    /// The key does not exist (index or variant byte).
    NoKey,
    /// The key belongs to another PD.
    PdMismatch,
    /// Local read or write not allowed by the key.
    Access,
    /// The range is outside the key.
    Range,
    /// An MTT entry lacks the read/write permission bit.
    MttPermission,
}

impl Mkey {
    /// Splits `[addr, addr+len)` into IOVA pieces appended to `out`.
    pub(crate) fn translate(
        &self,
        addr: u64,
        len: u64,
        write: bool,
        out: &mut IovaPieces,
    ) -> Result<(), MkeyError> {
        if (write && !self.lw) || (!write && !self.lr) {
            return Err(MkeyError::Access);
        }
        let end = addr.checked_add(len).ok_or(MkeyError::Range)?;
        match &self.kind {
            MkeyKind::Pa {
                length64,
                start,
                len: klen,
            } => {
                if !length64 && (addr < *start || end > start.saturating_add(*klen)) {
                    return Err(MkeyError::Range);
                }
                if len > 0 {
                    out.push((addr, len));
                }
                Ok(())
            }
            MkeyKind::Mtt {
                start,
                len: klen,
                page_shift,
                pages,
            } => {
                if addr < *start || end > start.saturating_add(*klen) {
                    return Err(MkeyError::Range);
                }
                let psz = 1u64 << page_shift;
                // Page 0 starts at `start` rounded down to the page size.
                let base = start & !(psz - 1);
                let mut cur = addr;
                while cur < end {
                    let idx = ((cur - base) >> page_shift) as usize;
                    let e = *pages.get(idx).ok_or(MkeyError::Range)?;
                    let perm = if write { 2 } else { 1 };
                    if e & perm == 0 {
                        return Err(MkeyError::MttPermission);
                    }
                    let in_page = (cur - base) & (psz - 1);
                    let n = (psz - in_page).min(end - cur);
                    let iova = (e & !0xfff) + in_page;
                    match out.last_mut() {
                        Some((a, l)) if *a + *l == iova => *l += n,
                        _ => out.push((iova, n)),
                    }
                    cur += n;
                }
                Ok(())
            }
        }
    }
}

/// A transport interface send object.
#[derive(Debug, Clone)]
pub(crate) struct Tis {
    pub td: u32,
}

/// A transport interface receive object (direct dispatch only).
#[derive(Debug, Clone)]
pub(crate) struct Tir {
    pub td: u32,
    pub rqn: u32,
    /// Bit 0 blocks unicast, bit 1 multicast loopback.
    pub self_lb_block: u8,
}

/// A Q counter set.
#[derive(Debug, Default)]
pub(crate) struct QCounter {
    pub out_of_buffer: AtomicU64,
}

/// The NIC vport context.
#[derive(Debug, Clone)]
pub(crate) struct Vport {
    pub mac: [u8; 6],
    pub min_inline: u8,
    pub mtu: u16,
    pub promisc_uc: bool,
    pub promisc_mc: bool,
    pub promisc_all: bool,
    pub uc_list: Vec<[u8; 6]>,
    /// Fabric time the unicast list was last set (the PF copies it into
    /// its forwarding table `VfPolicy::copy_delay` later).
    pub uc_list_at_ns: Option<u64>,
    pub roce_en: bool,
    pub disable_uc_lb: bool,
    pub disable_mc_lb: bool,
}

impl Vport {
    /// A unicast address of this function: the permanent MAC (if set) or
    /// one in the unicast address list.
    pub(crate) fn owns(&self, mac: &[u8; 6]) -> bool {
        (*mac != [0; 6] && *mac == self.mac) || self.uc_list.contains(mac)
    }
}

/// Every object of a function (read by the datapath under the read lock,
/// changed by commands under the write lock).
#[derive(Debug)]
pub(crate) struct Datapath {
    pub uars: BTreeSet<u32>,
    pub pds: BTreeSet<u32>,
    pub tds: BTreeSet<u32>,
    pub mkeys: BTreeMap<u32, Mkey>,
    pub eqs: BTreeMap<u32, Arc<Mutex<Eq>>>,
    pub cqs: BTreeMap<u32, Arc<Mutex<Cq>>>,
    pub sqs: BTreeMap<u32, Arc<Mutex<Sq>>>,
    pub rqs: BTreeMap<u32, Arc<Mutex<Rq>>>,
    pub tises: BTreeMap<u32, Tis>,
    pub tirs: BTreeMap<u32, Tir>,
    pub steering: Steering,
    pub qcounters: BTreeMap<u32, Arc<QCounter>>,
    /// MPFS L2 table entries (SET_L2_TABLE_ENTRY): index → MAC.
    pub l2_table: BTreeMap<u32, [u8; 6]>,
    pub vport: Vport,
    /// INIT_HCA done and not torn down: the datapath may run.
    pub hca_up: bool,
    /// Fabric time from which the port's link is up (INIT_HCA brings it
    /// up, `NicConfig::link_up_delay` later); `None` while the HCA is down.
    pub link_up_at_ns: Option<u64>,
    /// Current `cqe_version` (user index in CQEs when 1).
    pub cqe_version: u8,
}

impl Datapath {
    /// The port's link is up at `now_ns` (the fabric's own link state
    /// aside).
    pub(crate) fn link_up(&self, now_ns: u64) -> bool {
        self.link_up_at_ns.is_some_and(|t| now_ns >= t)
    }

    pub(crate) fn new(vport: Vport) -> Datapath {
        Datapath {
            uars: BTreeSet::new(),
            pds: BTreeSet::new(),
            tds: BTreeSet::new(),
            mkeys: BTreeMap::new(),
            eqs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            sqs: BTreeMap::new(),
            rqs: BTreeMap::new(),
            tises: BTreeMap::new(),
            tirs: BTreeMap::new(),
            steering: Steering::default(),
            qcounters: BTreeMap::new(),
            l2_table: BTreeMap::new(),
            vport,
            hca_up: false,
            link_up_at_ns: None,
            cqe_version: 1,
        }
    }

    /// Looks up the memory key of `lkey` and checks its PD.
    pub(crate) fn mkey(&self, lkey: u32, pd: u32) -> Result<&Mkey, MkeyError> {
        let k = self.mkeys.get(&(lkey >> 8)).ok_or(MkeyError::NoKey)?;
        if k.variant != (lkey & 0xff) as u8 {
            return Err(MkeyError::NoKey);
        }
        if k.pd != pd {
            return Err(MkeyError::PdMismatch);
        }
        Ok(k)
    }

    pub(crate) fn counts(&self) -> ObjectCounts {
        let (groups, entries) = self.steering.group_entry_counts();
        ObjectCounts {
            uars: self.uars.len(),
            pds: self.pds.len(),
            tds: self.tds.len(),
            mkeys: self.mkeys.len(),
            eqs: self.eqs.len(),
            cqs: self.cqs.len(),
            sqs: self.sqs.len(),
            rqs: self.rqs.len(),
            tises: self.tises.len(),
            tirs: self.tirs.len(),
            flow_tables: self.steering.tables.len(),
            flow_groups: groups,
            flow_entries: entries,
            q_counters: self.qcounters.len(),
            l2_entries: self.l2_table.len(),
            root_set: self.steering.root.is_some(),
        }
    }

    /// Every 24-bit object number the function holds (for releasing them).
    pub(crate) fn numbers24(&self) -> Vec<u32> {
        let mut v: Vec<u32> = Vec::new();
        v.extend(self.pds.iter());
        v.extend(self.tds.iter());
        v.extend(self.mkeys.keys());
        v.extend(self.cqs.keys());
        v.extend(self.sqs.keys());
        v.extend(self.rqs.keys());
        v.extend(self.tises.keys());
        v.extend(self.tirs.keys());
        for (id, t) in &self.steering.tables {
            v.push(*id);
            v.extend(t.groups.keys());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: MkeyKind) -> Mkey {
        Mkey {
            variant: 0,
            pd: 1,
            lr: true,
            lw: true,
            kind,
        }
    }

    #[test]
    fn pa_key_checks_range_unless_length64() {
        let mut out = IovaPieces::new();
        let k = key(MkeyKind::Pa {
            length64: false,
            start: 0x1000,
            len: 0x1000,
        });
        assert!(k.translate(0x1800, 0x800, false, &mut out).is_ok());
        assert_eq!(
            k.translate(0x1800, 0x801, false, &mut out),
            Err(MkeyError::Range)
        );
        let k = key(MkeyKind::Pa {
            length64: true,
            start: 0,
            len: 0,
        });
        assert!(k.translate(u64::MAX - 10, 5, true, &mut out).is_ok());
        assert_eq!(
            k.translate(u64::MAX - 1, 5, true, &mut out),
            Err(MkeyError::Range)
        );
    }

    #[test]
    fn mtt_key_splits_pages_and_checks_permissions() {
        let k = key(MkeyKind::Mtt {
            start: 0x7000_0000,
            len: 0x3000,
            page_shift: 12,
            pages: vec![0x10_0000 | 3, 0x50_0000 | 3, 0x10_1000 | 1],
        });
        let mut out = IovaPieces::new();
        k.translate(0x7000_0ff0, 0x20, false, &mut out).unwrap();
        assert_eq!(out.as_slice(), [(0x10_0ff0, 0x10), (0x50_0000, 0x10)]);
        let mut out = IovaPieces::new();
        assert_eq!(
            k.translate(0x7000_2000, 4, true, &mut out),
            Err(MkeyError::MttPermission)
        );
        assert_eq!(
            k.translate(0x7000_2ffc, 8, false, &mut out),
            Err(MkeyError::Range)
        );
    }
}

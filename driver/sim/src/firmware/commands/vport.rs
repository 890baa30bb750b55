//! The NIC vport: its context (MAC, MTU, inline mode, address list) and
//! state.

use mlx5::prm::cmd::*;
use mlx5::prm::codes::CmdStatus;
use mlx5::prm::ctx::*;

use super::super::Why;
use super::{Ctx, R, must_be_zero, param, range, rej};

impl Ctx<'_> {
    // --------------------------------------------------------------- vport

    pub(super) fn own_vport(&self, other: u64, num: u64) -> R {
        if other != 0 || num != 0 {
            return Err(param(
                Why::NotSupported,
                format!(
                    "other_vport {other} vport {num}: only the own vport is modeled (no e-switch)"
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn query_vport_ctx(&mut self) -> R {
        let v = self.iv::<QueryNicVportContextIn>()?;
        self.own_vport(
            v.get(QueryNicVportContextIn::OTHER_VPORT),
            v.get(QueryNicVportContextIn::VPORT_NUMBER),
        )?;
        let list_type = v.get(QueryNicVportContextIn::ALLOWED_LIST_TYPE);
        let vp = self.dp.vport.clone();
        let base = QueryNicVportContextOut::NIC_VPORT_CONTEXT.byte();
        let list_at = base + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
        let room = self.out.len().saturating_sub(list_at) / 8;
        let n = if list_type == 0 {
            vp.uc_list.len().min(room)
        } else {
            0
        };
        {
            let mut o = self.ov::<QueryNicVportContextOut>()?;
            let mut c = o.sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT);
            c.set(
                NicVportContext::MIN_WQE_INLINE_MODE,
                u64::from(vp.min_inline),
            )
            .set(
                NicVportContext::DISABLE_MC_LOCAL_LB,
                u64::from(vp.disable_mc_lb),
            )
            .set(
                NicVportContext::DISABLE_UC_LOCAL_LB,
                u64::from(vp.disable_uc_lb),
            )
            .set(NicVportContext::ROCE_EN, u64::from(vp.roce_en))
            .set(NicVportContext::MTU, u64::from(vp.mtu))
            .set(NicVportContext::PROMISC_UC, u64::from(vp.promisc_uc))
            .set(NicVportContext::PROMISC_MC, u64::from(vp.promisc_mc))
            .set(NicVportContext::PROMISC_ALL, u64::from(vp.promisc_all))
            .set(NicVportContext::ALLOWED_LIST_TYPE, list_type)
            .set(NicVportContext::ALLOWED_LIST_SIZE, n as u64);
            let m = vp.mac;
            let mut a = c.sub(NicVportContext::PERMANENT_ADDRESS);
            a.set(
                MacAddressLayout::MAC_ADDR_47_32,
                u64::from(u16::from_be_bytes([m[0], m[1]])),
            )
            .set(
                MacAddressLayout::MAC_ADDR_31_0,
                u64::from(u32::from_be_bytes([m[2], m[3], m[4], m[5]])),
            );
        }
        for (i, mac) in vp.uc_list.iter().take(n).enumerate() {
            let at = list_at + 8 * i + 2;
            self.out[at..at + 6].copy_from_slice(mac);
        }
        Ok(())
    }

    pub(super) fn modify_vport_ctx(&mut self) -> R {
        let v = self.iv::<ModifyNicVportContextIn>()?;
        self.own_vport(
            v.get(ModifyNicVportContextIn::OTHER_VPORT),
            v.get(ModifyNicVportContextIn::VPORT_NUMBER),
        )?;
        let sel = v.sub(ModifyNicVportContextIn::FIELD_SELECT);
        let c = v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT);
        let mut vp = self.dp.vport.clone();
        if sel.get(ModifyNicVportFieldSelect::ROCE_EN) == 1 {
            if c.get(NicVportContext::ROCE_EN) == 1 {
                return Err(param(
                    Why::NotSupported,
                    "roce_en: the device reports roce = 0",
                ));
            }
            vp.roce_en = false;
        }
        if sel.get(ModifyNicVportFieldSelect::MIN_INLINE) == 1 {
            let m = c.get(NicVportContext::MIN_WQE_INLINE_MODE);
            range("min_wqe_inline_mode", m, 0, 3)?;
            vp.min_inline = m as u8;
        }
        if sel.get(ModifyNicVportFieldSelect::MTU) == 1 {
            let m = c.get(NicVportContext::MTU);
            // A frame length (software MTU + 22, Linux `mlx5e_set_mtu`):
            // 68..=9978 bytes of IP.
            range("mtu", m, 68 + 22, 9978 + 22)?;
            vp.mtu = m as u16;
        }
        if sel.get(ModifyNicVportFieldSelect::PROMISC) == 1 {
            vp.promisc_uc = c.get(NicVportContext::PROMISC_UC) == 1;
            vp.promisc_mc = c.get(NicVportContext::PROMISC_MC) == 1;
            vp.promisc_all = c.get(NicVportContext::PROMISC_ALL) == 1;
        }
        if sel.get(ModifyNicVportFieldSelect::PERMANENT_ADDRESS) == 1 {
            let a = c.sub(NicVportContext::PERMANENT_ADDRESS);
            let hi = (a.get32(MacAddressLayout::MAC_ADDR_47_32) as u16).to_be_bytes();
            let lo = a.get32(MacAddressLayout::MAC_ADDR_31_0).to_be_bytes();
            vp.mac = [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]];
        }
        if sel.get(ModifyNicVportFieldSelect::ADDRESSES_LIST) == 1 {
            let ty = c.get(NicVportContext::ALLOWED_LIST_TYPE);
            if ty != 0 {
                return Err(param(
                    Why::NotSupported,
                    format!("allowed_list_type {ty}: only unicast (0)"),
                ));
            }
            let n = c.get(NicVportContext::ALLOWED_LIST_SIZE) as usize;
            let max = 1usize << self.nic.cfg.limits.log_max_uc_list;
            if n > max {
                return Err(rej(
                    CmdStatus::LimitsExceeded,
                    Why::Limit,
                    format!("{n} unicast addresses, limit {max}"),
                ));
            }
            let at = ModifyNicVportContextIn::NIC_VPORT_CONTEXT.byte()
                + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
            let need = at + 8 * n;
            if self.inp.len() < need {
                return Err(rej(
                    CmdStatus::BadInputLength,
                    Why::InputLength,
                    format!(
                        "{n} addresses need {need} input bytes, got {}",
                        self.inp.len()
                    ),
                ));
            }
            vp.uc_list_at_ns = Some(self.nic.now_ns());
            vp.uc_list = (0..n)
                .map(|i| {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(&self.inp[at + 8 * i + 2..at + 8 * i + 8]);
                    m
                })
                .collect();
        }
        self.dp.vport = vp;
        Ok(())
    }

    pub(super) fn query_vport_state(&mut self) -> R {
        let v = self.iv::<QueryVportStateIn>()?;
        self.own_vport(
            v.get(QueryVportStateIn::OTHER_VPORT),
            v.get(QueryVportStateIn::VPORT_NUMBER),
        )?;
        let up = !self.nic.fabric.link_is_down(self.nic.port) && self.dp.link_up(self.nic.now_ns());
        let mut o = self.ov::<QueryVportStateOut>()?;
        o.set(QueryVportStateOut::ADMIN_STATE, 2)
            .set(QueryVportStateOut::STATE, u64::from(up));
        Ok(())
    }

    // ------------------------------------------------------------------ MPFS

    /// SET_L2_TABLE_ENTRY: the e-switch manager steers a unicast MAC to
    /// itself on a port shared through MPFS (Linux `mlx5_mpfs_add_mac`).
    pub(super) fn set_l2_table_entry(&mut self) -> R {
        if self.nic.cfg.eswitch != crate::nic::Eswitch::Mpfs {
            return Err(param(
                Why::NotSupported,
                "SET_L2_TABLE_ENTRY: the function is not the e-switch manager",
            ));
        }
        let v = self.iv::<SetL2TableEntryIn>()?;
        let index = v.get32(SetL2TableEntryIn::TABLE_INDEX);
        if self.nic.cfg.log_max_l2_table == 0 {
            // One entry means no MPFS (Linux `mlx5_mpfs_init` skips it).
            return Err(param(
                Why::NotSupported,
                "SET_L2_TABLE_ENTRY: log_max_l2_table is 0, the device has no MPFS",
            ));
        }
        let size = 1u64 << self.nic.cfg.log_max_l2_table;
        range("table_index", u64::from(index), 0, size - 1)?;
        must_be_zero(
            "vlan_valid (VLAN entries)",
            v.get(SetL2TableEntryIn::VLAN_VALID),
        )?;
        let a = v.sub(SetL2TableEntryIn::MAC_ADDRESS);
        let hi = (a.get32(MacAddressLayout::MAC_ADDR_47_32) as u16).to_be_bytes();
        let lo = a.get32(MacAddressLayout::MAC_ADDR_31_0).to_be_bytes();
        let mac = [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]];
        if mac[0] & 1 == 1 || mac == [0; 6] {
            return Err(param(
                Why::OutOfRange,
                format!(
                    "L2 table entry {index}: {} is not a unicast MAC",
                    crate::util::mac_str(&mac)
                ),
            ));
        }
        self.dp.l2_table.insert(index, mac);
        Ok(())
    }

    /// DELETE_L2_TABLE_ENTRY.
    pub(super) fn delete_l2_table_entry(&mut self) -> R {
        let index = self
            .iv::<DeleteL2TableEntryIn>()?
            .get32(DeleteL2TableEntryIn::TABLE_INDEX);
        if self.dp.l2_table.remove(&index).is_none() {
            return Err(param(Why::NoObject, format!("no L2 table entry {index}")));
        }
        Ok(())
    }
}

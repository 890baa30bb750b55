//! NIC RX flow steering: tables, groups, entries and the root.

use mlx5::prm::cmd::*;
use mlx5::prm::codes::CmdStatus;
use mlx5::prm::ctx::*;

use crate::packet::{MATCH_SET_BYTES, supported_match_mask};
use crate::steering::{Dest, FlowGroup, FlowTable, Fte};
use crate::util::be32;

use super::super::{Reject, Why};
use super::{Ctx, R, must_be_zero, param, range, rej};

impl Ctx<'_> {
    // ------------------------------------------------------------ steering

    pub(super) fn nic_rx(&self, table_type: u64) -> R {
        if table_type != 0 {
            return Err(param(
                Why::NotSupported,
                format!("table_type {table_type}: only NIC RX (0) is modeled"),
            ));
        }
        Ok(())
    }

    pub(super) fn table_of(&self, id: u32) -> Result<&FlowTable, Reject> {
        self.dp
            .steering
            .tables
            .get(&id)
            .ok_or_else(|| self.missing("flow table", id))
    }

    pub(super) fn create_flow_table(&mut self) -> R {
        let v = self.iv::<CreateFlowTableIn>()?;
        self.nic_rx(v.get(CreateFlowTableIn::TABLE_TYPE))?;
        must_be_zero("other_vport", v.get(CreateFlowTableIn::OTHER_VPORT))?;
        must_be_zero("vport_number", v.get(CreateFlowTableIn::VPORT_NUMBER))?;
        let c = v.sub(CreateFlowTableIn::FLOW_TABLE_CONTEXT);
        must_be_zero("reformat_en", c.get(FlowTableContext::REFORMAT_EN))?;
        must_be_zero("decap_en", c.get(FlowTableContext::DECAP_EN))?;
        let log_size = c.get(FlowTableContext::LOG_SIZE);
        range(
            "log_size",
            log_size,
            0,
            u64::from(self.nic.cfg.limits.log_max_ft_size),
        )?;
        let level = c.get(FlowTableContext::LEVEL) as u8;
        let miss_action = c.get(FlowTableContext::TABLE_MISS_ACTION) as u8;
        let miss_table = c.get32(FlowTableContext::TABLE_MISS_ID);
        match miss_action {
            0 => {}
            1 => {
                let t = self.table_of(miss_table)?;
                if t.level <= level {
                    return Err(param(
                        Why::Mismatch,
                        format!(
                            "miss table {miss_table:#x} level {} must be above {level}",
                            t.level
                        ),
                    ));
                }
            }
            a => return Err(param(Why::NotSupported, format!("table_miss_action {a}"))),
        }
        self.limit(
            "flow tables",
            self.dp.steering.tables.len(),
            self.nic.cfg.limits.max_flow_tables,
        )?;
        let id = self.alloc24()?;
        self.dp.steering.tables.insert(
            id,
            FlowTable {
                level,
                log_size: log_size as u8,
                miss_action,
                miss_table,
                groups: Default::default(),
                entries: Default::default(),
            },
        );
        self.ov::<CreateFlowTableOut>()?
            .set(CreateFlowTableOut::TABLE_ID, u64::from(id));
        Ok(())
    }

    pub(super) fn destroy_flow_table(&mut self) -> R {
        let v = self.iv::<DestroyFlowTableIn>()?;
        self.nic_rx(v.get(DestroyFlowTableIn::TABLE_TYPE))?;
        let id = v.get32(DestroyFlowTableIn::TABLE_ID);
        let t = self.table_of(id)?;
        if !t.groups.is_empty() {
            return Err(self.busy(format!(
                "flow table {id:#x} still has {} groups",
                t.groups.len()
            )));
        }
        if self.dp.steering.references(Dest::Table(id)) {
            return Err(self.busy(format!("flow table {id:#x} is another table's destination")));
        }
        self.dp.steering.tables.remove(&id);
        self.free24(id);
        // Destroying the root is allowed: steering falls back to the
        // default (nothing is received). Linux destroys the last NIC RX
        // root this way, without SET_FLOW_TABLE_ROOT.
        if self.dp.steering.root == Some(id) {
            self.dp.steering.root = None;
        }
        Ok(())
    }

    pub(super) fn create_flow_group(&mut self) -> R {
        let v = self.iv::<CreateFlowGroupIn>()?;
        self.nic_rx(v.get(CreateFlowGroupIn::TABLE_TYPE))?;
        must_be_zero("group_type", v.get(CreateFlowGroupIn::GROUP_TYPE))?;
        let id = v.get32(CreateFlowGroupIn::TABLE_ID);
        let start = v.get32(CreateFlowGroupIn::START_FLOW_INDEX);
        let end = v.get32(CreateFlowGroupIn::END_FLOW_INDEX);
        let enable = v.get(CreateFlowGroupIn::MATCH_CRITERIA_ENABLE);
        if enable & !1 != 0 {
            return Err(param(
                Why::NotSupported,
                format!(
                    "match_criteria_enable {enable:#x}: only outer headers (bit 0) are modeled"
                ),
            ));
        }
        let off = CreateFlowGroupIn::MATCH_CRITERIA.byte() + FteMatchParam::OUTER_HEADERS.byte();
        let mut mask = [0u8; MATCH_SET_BYTES];
        if enable & 1 != 0 {
            mask.copy_from_slice(&self.inp[off..off + MATCH_SET_BYTES]);
        }
        let ok = supported_match_mask();
        if let Some(i) = (0..MATCH_SET_BYTES).find(|&i| mask[i] & !ok[i] != 0) {
            return Err(param(
                Why::NotSupported,
                format!(
                    "match criteria byte {i:#x} of the outer headers selects bits the model does not match on"
                ),
            ));
        }
        let t = self.table_of(id)?;
        let size = 1u64 << t.log_size;
        if start > end || u64::from(end) >= size {
            return Err(param(
                Why::OutOfRange,
                format!("flow index range {start}..={end} outside a table of {size}"),
            ));
        }
        if let Some((g, _)) = t
            .groups
            .iter()
            .find(|(_, g)| start <= g.end && g.start <= end)
        {
            return Err(param(
                Why::Mismatch,
                format!("range {start}..={end} overlaps group {g:#x}"),
            ));
        }
        let gid = self.alloc24()?;
        if let Some(t) = self.dp.steering.tables.get_mut(&id) {
            t.groups.insert(gid, FlowGroup { start, end, mask });
        }
        self.ov::<CreateFlowGroupOut>()?
            .set(CreateFlowGroupOut::GROUP_ID, u64::from(gid));
        Ok(())
    }

    pub(super) fn destroy_flow_group(&mut self) -> R {
        let v = self.iv::<DestroyFlowGroupIn>()?;
        self.nic_rx(v.get(DestroyFlowGroupIn::TABLE_TYPE))?;
        let id = v.get32(DestroyFlowGroupIn::TABLE_ID);
        let gid = v.get32(DestroyFlowGroupIn::GROUP_ID);
        let t = self.table_of(id)?;
        if !t.groups.contains_key(&gid) {
            return Err(self.missing("flow group", gid));
        }
        if t.entries.values().any(|e| e.group == gid) {
            return Err(self.busy(format!("flow group {gid:#x} still has entries")));
        }
        if let Some(t) = self.dp.steering.tables.get_mut(&id) {
            t.groups.remove(&gid);
        }
        self.free24(gid);
        Ok(())
    }

    pub(super) fn set_fte(&mut self) -> R {
        let v = self.iv::<SetFteIn>()?;
        self.nic_rx(v.get(SetFteIn::TABLE_TYPE))?;
        if self.op_mod > 1 {
            return Err(param(
                Why::OpMod,
                format!("SET_FLOW_TABLE_ENTRY op_mod {}", self.op_mod),
            ));
        }
        let id = v.get32(SetFteIn::TABLE_ID);
        let index = v.get32(SetFteIn::FLOW_INDEX);
        let fc = v.sub(SetFteIn::FLOW_CONTEXT);
        let group = fc.get32(FlowContext::GROUP_ID);
        let action = fc.get(FlowContext::ACTION) as u16;
        let flow_tag = fc.get32(FlowContext::FLOW_TAG);
        let ndest = fc.get(FlowContext::DESTINATION_LIST_SIZE) as usize;
        must_be_zero(
            "flow_counter_list_size",
            fc.get(FlowContext::FLOW_COUNTER_LIST_SIZE),
        )?;
        let t = self.table_of(id)?;
        if u64::from(index) >= 1u64 << t.log_size {
            return Err(param(
                Why::OutOfRange,
                format!(
                    "flow_index {index} outside a table of {}",
                    1u64 << t.log_size
                ),
            ));
        }
        match t.group_of(index) {
            Some(g) if g == group => {}
            Some(g) => {
                return Err(param(
                    Why::Mismatch,
                    format!("flow_index {index} is in group {g:#x}, the entry names {group:#x}"),
                ));
            }
            None => {
                return Err(param(
                    Why::Mismatch,
                    format!("flow_index {index} is in no group"),
                ));
            }
        }
        let exists = t.entries.contains_key(&index);
        if self.op_mod == 0 && exists {
            return Err(param(
                Why::Duplicate,
                format!("entry {index} already exists (use op_mod 1)"),
            ));
        }
        if self.op_mod == 1 && !exists {
            return Err(param(
                Why::NoObject,
                format!("entry {index} does not exist"),
            ));
        }
        let my_level = t.level;
        let dests = match action {
            0x2 => {
                if ndest != 0 {
                    return Err(param(Why::Mismatch, "drop action with destinations"));
                }
                Vec::new()
            }
            0x4 => {
                if ndest == 0 {
                    return Err(param(Why::Mismatch, "forward action without destinations"));
                }
                let base = SetFteIn::FLOW_CONTEXT.byte() + FlowContext::DESTINATION.byte();
                let need = base + 8 * ndest;
                if self.inp.len() < need {
                    return Err(rej(
                        CmdStatus::BadInputLength,
                        Why::InputLength,
                        format!(
                            "{ndest} destinations need {need} input bytes, got {}",
                            self.inp.len()
                        ),
                    ));
                }
                let mut d = Vec::with_capacity(ndest);
                for i in 0..ndest {
                    let w = be32(self.inp, base + 8 * i);
                    let (ty, n) = ((w >> 24) as u8, w & 0x00ff_ffff);
                    match ty {
                        mlx5::prm::codes::flow::DEST_TIR => {
                            if !self.dp.tirs.contains_key(&n) {
                                return Err(self.missing("TIR", n));
                            }
                            d.push(Dest::Tir(n));
                        }
                        mlx5::prm::codes::flow::DEST_FLOW_TABLE => {
                            let t2 = self.table_of(n)?;
                            if t2.level <= my_level {
                                return Err(param(
                                    Why::Mismatch,
                                    format!(
                                        "destination table {n:#x} level {} must be above {my_level}",
                                        t2.level
                                    ),
                                ));
                            }
                            d.push(Dest::Table(n));
                        }
                        other => {
                            return Err(param(
                                Why::NotSupported,
                                format!(
                                    "destination type {other:#x}: TIR (2) and flow table (1) are modeled"
                                ),
                            ));
                        }
                    }
                }
                d
            }
            a => {
                return Err(param(
                    Why::NotSupported,
                    format!("flow action {a:#x}: drop (0x2) and forward (0x4) are modeled"),
                ));
            }
        };
        let off = SetFteIn::FLOW_CONTEXT.byte() + FlowContext::MATCH_VALUE.byte();
        let mut value = [0u8; MATCH_SET_BYTES];
        value.copy_from_slice(&self.inp[off..off + MATCH_SET_BYTES]);
        if let Some(t) = self.dp.steering.tables.get_mut(&id)
            && let Some(g) = t.groups.get(&group)
        {
            let fte = Fte::new(group, &g.mask, value, action, flow_tag, dests);
            t.entries.insert(index, fte);
        }
        Ok(())
    }

    pub(super) fn delete_fte(&mut self) -> R {
        let v = self.iv::<DeleteFteIn>()?;
        self.nic_rx(v.get(DeleteFteIn::TABLE_TYPE))?;
        let id = v.get32(DeleteFteIn::TABLE_ID);
        let index = v.get32(DeleteFteIn::FLOW_INDEX);
        self.table_of(id)?;
        let removed = self
            .dp
            .steering
            .tables
            .get_mut(&id)
            .and_then(|t| t.entries.remove(&index));
        if removed.is_none() {
            return Err(param(
                Why::NoObject,
                format!("no entry {index} in flow table {id:#x}"),
            ));
        }
        Ok(())
    }

    pub(super) fn set_root(&mut self) -> R {
        let v = self.iv::<SetFlowTableRootIn>()?;
        self.nic_rx(v.get(SetFlowTableRootIn::TABLE_TYPE))?;
        must_be_zero("underlay_qpn", v.get(SetFlowTableRootIn::UNDERLAY_QPN))?;
        match self.op_mod {
            0 => {
                let id = v.get32(SetFlowTableRootIn::TABLE_ID);
                self.table_of(id)?;
                self.dp.steering.root = Some(id);
                Ok(())
            }
            1 if !self.nic.cfg.reset_root_to_default => Err(param(
                Why::NotSupported,
                "SET_FLOW_TABLE_ROOT op_mod 1 (back to the default root) needs the reset_root_to_default flow table capability",
            )),
            1 => {
                self.dp.steering.root = None;
                Ok(())
            }
            m => Err(param(
                Why::OpMod,
                format!("SET_FLOW_TABLE_ROOT op_mod {m} (0 set, 1 disconnect)"),
            )),
        }
    }
}

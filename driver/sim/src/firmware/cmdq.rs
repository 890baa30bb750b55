//! The command queue transport: read an entry and its input mailbox chain,
//! check the output chain, run the command, write the output and the
//! status, flip the ownership bit (release store), and post a command EQE
//! if an EQ subscribed to them.
//!
//! Delivery statuses (`status_own >> 1`) are returned for what the
//! transport itself cannot accept: descriptor type ≠ 7 (0x10), lengths
//! outside 8..=1 MiB input / 16..=1 MiB output (0x7/0x8), mailbox pointers
//! not 1 KiB aligned (0x5/0x4; 1 KiB is the kernel's mailbox alignment —
//! rdma-core uses 4 KiB pages), a token that differs from the entry's in
//! any block (0x2), a block number out of sequence or a chain that ends
//! early (0x3), and a DMA fault while fetching (0x6). Signatures are not
//! modeled (`cmdif_checksum` is reported as 0 and cannot be enabled).

use std::sync::atomic::Ordering;

use mlx5::prm::View;
use mlx5::prm::cmdq::{
    CMD_OWNER_HW, CMD_TYPE_PCIE, CmdLayout, CmdProtBlock, INLINE_BYTES, MAILBOX_BYTES,
    MAILBOX_DATA_BYTES, mailbox_blocks,
};
use mlx5::prm::codes::{CmdStatus, DeliveryStatus, EventType, Opcode};

use crate::nic::NicInner;
use crate::objects::Datapath;
use crate::util::{be32, lock};

use super::commands;
use super::{CommandRecord, Firmware, Reject, Why, op_name};

/// Largest input or output the model accepts.
pub const MAX_MSG_BYTES: usize = 1 << 20;
/// Mailbox blocks must be aligned to this.
pub const MAILBOX_ALIGN: u64 = 1024;
/// Bytes per command-queue entry (`log_cmdq_stride` 6).
pub const ENTRY_BYTES: u64 = 64;

/// A command as the firmware fetched it: what it runs, wherever the entry
/// and the mailboxes are rewritten later.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    entry_iova: u64,
    token: u8,
    input: Vec<u8>,
    outlen: usize,
    out_blocks: Vec<u64>,
}

fn delivery(d: DeliveryStatus, reason: String) -> (DeliveryStatus, String) {
    (d, reason)
}

/// Follows a mailbox chain of `blocks` blocks from `first`, checking
/// alignment, token and block numbers. Returns each block's address and,
/// for an input chain, its data.
fn walk_chain(
    nic: &NicInner,
    first: u64,
    blocks: usize,
    token: u8,
    input: bool,
    data: &mut Vec<u8>,
) -> Result<Vec<u64>, (DeliveryStatus, String)> {
    let misaligned = if input {
        DeliveryStatus::InputPointerNotAligned
    } else {
        DeliveryStatus::OutputPointerNotAligned
    };
    let what = if input { "input" } else { "output" };
    let mut addrs = Vec::with_capacity(blocks);
    let mut ptr = first;
    let mut block = vec![0u8; MAILBOX_BYTES];
    for i in 0..blocks {
        if ptr == 0 {
            return Err(delivery(
                DeliveryStatus::BadBlockNumber,
                format!("{what} mailbox chain ends after {i} of {blocks} blocks"),
            ));
        }
        if !ptr.is_multiple_of(MAILBOX_ALIGN) {
            return Err(delivery(
                misaligned,
                format!("{what} mailbox {i} at {ptr:#x} is not {MAILBOX_ALIGN}-byte aligned"),
            ));
        }
        if let Err(f) = nic.iommu.read(ptr, &mut block) {
            return Err(delivery(
                DeliveryStatus::FwInternalError,
                format!("{what} mailbox {i}: {f}"),
            ));
        }
        let v = View::<CmdProtBlock>::new(&block).expect("576 bytes");
        let num = v.get32(CmdProtBlock::BLOCK_NUM);
        let tok = v.get32(CmdProtBlock::TOKEN) as u8;
        if tok != token {
            return Err(delivery(
                DeliveryStatus::TokenError,
                format!("{what} mailbox {i} token {tok:#04x}, entry token {token:#04x}"),
            ));
        }
        if num as usize != i {
            return Err(delivery(
                DeliveryStatus::BadBlockNumber,
                format!("{what} mailbox {i} has block number {num}"),
            ));
        }
        if input {
            data.extend_from_slice(&block[..MAILBOX_DATA_BYTES]);
        }
        addrs.push(ptr);
        ptr = v.get(CmdProtBlock::NEXT);
    }
    Ok(addrs)
}

/// Reads and checks the entry in `slot` and its chains.
fn fetch(
    nic: &NicInner,
    fw: &Firmware,
    slot: u8,
    raw: &[u8; 64],
    entry_iova: u64,
) -> Result<Fetched, (DeliveryStatus, String)> {
    let _ = fw;
    let e = View::<CmdLayout>::new(raw).expect("64 bytes");
    let ty = e.get32(CmdLayout::TYPE) as u8;
    if ty != CMD_TYPE_PCIE {
        return Err(delivery(
            DeliveryStatus::BadDescriptorType,
            format!("slot {slot}: descriptor type {ty}, expected {CMD_TYPE_PCIE}"),
        ));
    }
    let inlen = e.get32(CmdLayout::INLEN) as usize;
    let outlen = e.get32(CmdLayout::OUTLEN) as usize;
    let token = e.get32(CmdLayout::TOKEN) as u8;
    if !(8..=MAX_MSG_BYTES).contains(&inlen) {
        return Err(delivery(
            DeliveryStatus::InputLengthError,
            format!("inlen {inlen} outside 8..={MAX_MSG_BYTES}"),
        ));
    }
    if !(16..=MAX_MSG_BYTES).contains(&outlen) {
        return Err(delivery(
            DeliveryStatus::OutputLengthError,
            format!("outlen {outlen} outside 16..={MAX_MSG_BYTES}"),
        ));
    }
    let mut input = Vec::with_capacity(inlen.max(INLINE_BYTES));
    input.extend_from_slice(e.bytes(CmdLayout::IN));
    walk_chain(
        nic,
        e.get(CmdLayout::IN_PTR),
        mailbox_blocks(inlen),
        token,
        true,
        &mut input,
    )?;
    input.truncate(inlen);
    let out_blocks = walk_chain(
        nic,
        e.get(CmdLayout::OUT_PTR),
        mailbox_blocks(outlen),
        token,
        false,
        &mut Vec::new(),
    )?;
    Ok(Fetched {
        entry_iova,
        token,
        input,
        outlen,
        out_blocks,
    })
}

/// Writes the output and hands the entry back to software.
fn complete(nic: &NicInner, entry_iova: u64, out: &[u8], out_blocks: &[u64], d: DeliveryStatus) {
    let io = &nic.iommu;
    let head = out.len().min(INLINE_BYTES);
    let mut ok = io.write(entry_iova + 0x20, &out[..head]).is_ok();
    for (i, &b) in out_blocks.iter().enumerate() {
        let start = INLINE_BYTES + i * MAILBOX_DATA_BYTES;
        if start >= out.len() {
            break;
        }
        let end = (start + MAILBOX_DATA_BYTES).min(out.len());
        ok &= io.write(b, &out[start..end]).is_ok();
    }
    let d = if ok {
        d
    } else {
        DeliveryStatus::FwInternalError
    };
    let so = CmdLayout::STATUS_OWN.bit() / 8;
    let _ = io.store_u8_release(entry_iova + u64::from(so), (d as u8) << 1);
}

fn cmd_event(nic: &NicInner, dp: &Datapath, slot: u8) {
    // The IOMMU session before any EQ's lock (see `Iommu::session`).
    let io = &nic.iommu.session();
    for eq in dp.eqs.values() {
        let mut eq = lock(eq);
        if eq.subscribed(EventType::Command) {
            let mut data = [0u8; 28];
            data[0..4].copy_from_slice(&(1u32 << slot).to_be_bytes());
            let _ = eq.post(nic, io, EventType::Command, 0, &data);
            return;
        }
    }
}

/// A command held until pages arrive: the firmware already fetched it and
/// finishes exactly that command later, whatever software writes into the
/// entry or the mailboxes meanwhile (the slot stays owned by hardware; a
/// doorbell for it is ignored).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// Command queue slot.
    pub slot: u8,
    fetched: Fetched,
}

/// Runs the command in `slot`.
pub(crate) fn run_slot(nic: &NicInner, fw: &mut Firmware, dp: &mut Datapath, slot: u8) {
    let entry_iova = fw.regs.base() + u64::from(slot) * ENTRY_BYTES;
    let mut raw = [0u8; 64];
    if let Err(f) = nic.iommu.read(entry_iova, &mut raw) {
        nic.stats
            .cmd_doorbells_ignored
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(slot, %f, "command entry unreadable; doorbell ignored");
        return;
    }
    let so = (CmdLayout::STATUS_OWN.bit() / 8) as usize;
    if raw[so] & CMD_OWNER_HW == 0 {
        nic.stats
            .cmd_doorbells_ignored
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(slot, "command doorbell for an entry software owns; ignored");
        return;
    }
    let opcode_hint = (be32(&raw, 0x10) >> 16) as u16;
    let op_mod_hint = be32(&raw, 0x14) as u16;
    fw.seq += 1;
    let seq = fw.seq;
    let mut rec = CommandRecord {
        seq,
        slot,
        opcode: opcode_hint,
        name: op_name(opcode_hint),
        op_mod: op_mod_hint,
        delivery: DeliveryStatus::Ok,
        status: CmdStatus::Ok,
        syndrome: 0,
        reason: String::new(),
        injected: false,
        time_ns: nic.now_ns(),
    };
    let f = match fetch(nic, fw, slot, &raw, entry_iova) {
        Ok(f) => f,
        Err((d, reason)) => {
            complete(nic, entry_iova, &[], &[], d);
            nic.stats.commands.fetch_add(1, Ordering::Relaxed);
            nic.stats.commands_failed.fetch_add(1, Ordering::Relaxed);
            rec.delivery = d;
            rec.reason = reason;
            fw.record(rec);
            cmd_event(nic, dp, slot);
            return;
        }
    };
    execute(nic, fw, dp, slot, f, rec, false);
}

/// Runs a fetched command (`resume`: one held for pages, never held again).
fn execute(
    nic: &NicInner,
    fw: &mut Firmware,
    dp: &mut Datapath,
    slot: u8,
    f: Fetched,
    mut rec: CommandRecord,
    resume: bool,
) {
    let _ = f.token;
    let op = (be32(&f.input, 0) >> 16) as u16;
    let op_mod = be32(&f.input, 4) as u16;
    let mut out = vec![0u8; f.outlen];

    // Injected failure of the Nth (matching) command.
    let mut injected = None;
    let mut hit = None;
    for (i, fc) in fw.inject.fail.iter_mut().enumerate() {
        if fc.opcode.is_none_or(|o| o == op) {
            fc.nth = fc.nth.saturating_sub(1);
            if fc.nth == 0 && hit.is_none() {
                hit = Some(i);
            }
        }
    }
    if let Some(i) = hit {
        let fc = fw.inject.fail.remove(i);
        injected = Some(Reject {
            status: fc.status,
            why: Why::Injected,
            reason: format!("injected failure ({})", fc.status),
            syndrome: Some(fc.syndrome),
        });
    }

    // Injected "waits for pages".
    if injected.is_none()
        && !resume
        && fw.hca == super::HcaState::Initialized
        && !matches!(
            Opcode::from_raw(op),
            Some(Opcode::ManagePages | Opcode::QueryPages | Opcode::Nop)
        )
        && let Some(n) = fw.inject.wait_for_pages.take()
    {
        tracing::debug!(slot, op = op_name(op), n, "command waits for pages");
        fw.seq -= 1;
        fw.pending.push(Held { slot, fetched: f });
        super::pages::request(nic, fw, dp, n as i32);
        return;
    }

    let result = match injected {
        Some(r) => {
            rec.injected = true;
            Err(r)
        }
        None => commands::execute(nic, fw, dp, op, op_mod, &f.input, &mut out),
    };
    match &result {
        Ok(()) => {
            out[0] = 0;
            out[4..8].fill(0);
        }
        Err(r) => {
            out.fill(0);
            out[0] = r.status as u8;
            out[4..8].copy_from_slice(&r.syndrome(op).to_be_bytes());
        }
    }
    complete(nic, f.entry_iova, &out, &f.out_blocks, DeliveryStatus::Ok);
    nic.stats.commands.fetch_add(1, Ordering::Relaxed);
    rec.opcode = op;
    rec.name = op_name(op);
    rec.op_mod = op_mod;
    if let Err(r) = result {
        nic.stats.commands_failed.fetch_add(1, Ordering::Relaxed);
        rec.status = r.status;
        rec.syndrome = r.syndrome(op);
        rec.reason = r.reason;
    }
    rec.time_ns = nic.now_ns();
    fw.record(rec);
    cmd_event(nic, dp, slot);
    super::pages::flush_page_events(nic, fw, dp);
    // Pages may have arrived for a held command.
    if op == Opcode::ManagePages as u16 && !fw.pending.is_empty() {
        let enough = fw.pages.held.len() as i64 >= fw.pages.target(fw.hca);
        let refused = op_mod == mlx5::prm::codes::manage_pages_op_mod::CANNOT_GIVE;
        if enough || refused {
            for h in std::mem::take(&mut fw.pending) {
                if refused {
                    fail_pending(nic, fw, dp, h);
                } else {
                    fw.seq += 1;
                    let f = h.fetched;
                    let rec = CommandRecord {
                        seq: fw.seq,
                        slot: h.slot,
                        opcode: (be32(&f.input, 0) >> 16) as u16,
                        name: op_name((be32(&f.input, 0) >> 16) as u16),
                        op_mod: be32(&f.input, 4) as u16,
                        delivery: DeliveryStatus::Ok,
                        status: CmdStatus::Ok,
                        syndrome: 0,
                        reason: String::new(),
                        injected: false,
                        time_ns: nic.now_ns(),
                    };
                    execute(nic, fw, dp, h.slot, f, rec, true);
                }
            }
        }
    }
}

/// Completes a command held for pages with NO_RESOURCES (the driver said
/// it cannot give pages).
fn fail_pending(nic: &NicInner, fw: &mut Firmware, dp: &mut Datapath, h: Held) {
    let (slot, f) = (h.slot, h.fetched);
    let entry_iova = f.entry_iova;
    let op = (be32(&f.input, 0) >> 16) as u16;
    let r = Reject::new(
        CmdStatus::NoResources,
        Why::Pages,
        "driver could not give the pages this command waited for",
    );
    let mut out = vec![0u8; f.outlen];
    out[0] = r.status as u8;
    out[4..8].copy_from_slice(&r.syndrome(op).to_be_bytes());
    complete(nic, entry_iova, &out, &f.out_blocks, DeliveryStatus::Ok);
    fw.seq += 1;
    let rec = CommandRecord {
        seq: fw.seq,
        slot,
        opcode: op,
        name: op_name(op),
        op_mod: be32(&f.input, 4) as u16,
        delivery: DeliveryStatus::Ok,
        status: r.status,
        syndrome: r.syndrome(op),
        reason: r.reason,
        injected: true,
        time_ns: nic.now_ns(),
    };
    nic.stats.commands.fetch_add(1, Ordering::Relaxed);
    nic.stats.commands_failed.fetch_add(1, Ordering::Relaxed);
    fw.record(rec);
    cmd_event(nic, dp, slot);
}

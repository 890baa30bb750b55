//! The command interface: a command queue page with 64-byte entries, and
//! chains of 576-byte mailbox blocks for input and output beyond 16 bytes.
//!
//! Every command is polled: the driver sets the entry's ownership bit, rings
//! the command doorbell, and polls the ownership bit, letting the caller
//! service the event queue (page requests) in between.
//!
//! Slots: the last entry the firmware reports is kept for MANAGE_PAGES
//! (Linux and rdma-core do the same with 32 entries: slot 31), the others
//! carry general commands. A slot whose command did not finish in time
//! still belongs to the hardware, which may yet write it: it is never
//! reused (Linux leaks it too), and the next command takes another slot.
//! While polling, the health buffer is read at every wait: a device that
//! is gone (all-ones reads), disabled or in a fatal state fails the
//! command at once instead of after the full timeout (Linux `cmd.c` stops
//! waiting on an internal error or an offline PCI channel), and every
//! later command fails at once too.

use std::sync::Arc;
use std::time::Duration;

use crate::bar::Bar;
use crate::barrier;
use crate::dma::{DmaMem, DmaPool, PAGE};
use crate::error::{DeliveryName, Error, HealthProblem, OpName, StatusName};
use crate::hw::HwBackend;
use crate::prm::cmd::{MboxIn, MboxOut};
use crate::prm::cmdq::{
    CMD_OWNER_HW, CMD_TYPE_PCIE, CmdLayout, CmdProtBlock, INLINE_BYTES, MAILBOX_DATA_BYTES,
    MAX_ENTRIES, MIN_ENTRIES, mailbox_blocks,
};
use crate::prm::init_seg::{self, InitSeg};
use crate::prm::{Layout, View};

/// Offsets inside a command entry.
const E_TYPE: usize = (CmdLayout::TYPE.bit() / 8) as usize;
const E_INLEN: usize = CmdLayout::INLEN.dword();
const E_IN_PTR: usize = CmdLayout::IN_PTR.dword();
const E_IN: usize = (CmdLayout::IN.bit() / 8) as usize;
const E_OUT: usize = (CmdLayout::OUT.bit() / 8) as usize;
const E_OUT_PTR: usize = CmdLayout::OUT_PTR.dword();
const E_OUTLEN: usize = CmdLayout::OUTLEN.dword();
const E_TOKEN: usize = (CmdLayout::TOKEN.bit() / 8) as usize;
const E_STATUS_OWN: usize = (CmdLayout::STATUS_OWN.bit() / 8) as usize;
/// Offsets inside a mailbox block.
const M_NEXT: usize = CmdProtBlock::NEXT.dword();
const M_BLOCK_NUM: usize = CmdProtBlock::BLOCK_NUM.dword();
const M_TOKEN: usize = (CmdProtBlock::TOKEN.bit() / 8) as usize;

const _: () = assert!(E_STATUS_OWN == 0x3f && E_IN == 0x10 && E_OUT == 0x20 && M_NEXT == 0x230);

/// A chain of mailbox blocks, one 4 KiB page each (as rdma-core does).
#[derive(Debug, Default)]
struct Chain {
    blocks: Vec<DmaMem>,
}

impl Chain {
    fn ensure(&mut self, pool: &Arc<DmaPool>, n: usize) -> Result<(), Error> {
        while self.blocks.len() < n {
            self.blocks.push(pool.alloc(PAGE)?);
        }
        Ok(())
    }

    /// Links the first `n` blocks, stamps block numbers and the token.
    fn link(&self, n: usize, token: u8) {
        for i in 0..n {
            let b = &self.blocks[i];
            let next = if i + 1 < n {
                self.blocks[i + 1].iova()
            } else {
                0
            };
            b.write_be64(M_NEXT, next);
            b.write_be32(M_BLOCK_NUM, i as u32);
            b.write_u8(M_TOKEN, token);
        }
    }

    fn head(&self, n: usize) -> u64 {
        if n == 0 { 0 } else { self.blocks[0].iova() }
    }
}

/// Per-opcode counters for the debug snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmdStats {
    /// Commands sent.
    pub sent: u64,
    /// Commands that failed (any reason).
    pub failed: u64,
    /// Polls of the ownership bit that found the command still running.
    pub busy_polls: u64,
    /// Slots given up because their command timed out (never reused).
    pub poisoned_slots: u64,
    /// Errors while servicing events during a command (logged, not
    /// returned: they belong to the event, not to the command).
    pub service_errors: u64,
}

/// Which kind of slot a command goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Any usable general slot.
    General,
    /// The slot kept for MANAGE_PAGES (the queue's last entry).
    Pages,
}

/// The command queue and its mailboxes.
#[derive(Debug)]
pub struct CmdQueue {
    page: DmaMem,
    log_stride: u32,
    entries: usize,
    inputs: Vec<Chain>,
    outputs: Vec<Chain>,
    token: u8,
    timeout: Duration,
    stats: CmdStats,
    /// Slots whose command timed out: the hardware may still own them.
    poisoned: u32,
    /// Set once the device was found gone or fatally broken while a
    /// command waited: every later command fails at once with it.
    down: Option<HealthProblem>,
}

/// A command posted to a slot and not yet finished.
#[derive(Debug)]
pub struct Pending {
    slot: usize,
    op: u16,
    out_len: usize,
}

impl CmdQueue {
    /// Reads the queue geometry from the init segment, allocates the queue
    /// page and programs its address (high half, then low half).
    pub fn setup<B: HwBackend>(bar: &Bar<B>, pool: &Arc<DmaPool>) -> Result<CmdQueue, Error> {
        let rev = bar.read32(InitSeg::CMDIF_REV_FW_SUB.dword()) >> init_seg::CMDIF_REV_SHIFT;
        if rev != init_seg::CMDIF_REV {
            return Err(Error::CmdifRevision {
                device: bar.name(),
                found: rev,
            });
        }
        let l = bar.read32(InitSeg::CMDQ_ADDR_L_SZ.dword());
        let log_sz = (l >> init_seg::LOG_CMDQ_SIZE_SHIFT) & 0xf;
        let log_stride = l & init_seg::LOG_CMDQ_STRIDE_MASK;
        let entries = 1usize << log_sz;
        if !(MIN_ENTRIES..=MAX_ENTRIES).contains(&entries)
            || log_sz + log_stride > 12
            || (1usize << log_stride) < CmdLayout::BYTES
        {
            return Err(Error::Config(format!(
                "{}: unsupported command queue geometry: 2^{log_sz} entries of 2^{log_stride} bytes",
                bar.name()
            )));
        }
        let page = pool.alloc(PAGE)?;
        for slot in 0..entries {
            page.write_u8((slot << log_stride) + E_TYPE, CMD_TYPE_PCIE);
        }
        bar.write32(InitSeg::CMDQ_ADDR_H.dword(), (page.iova() >> 32) as u32);
        bar.write32(
            InitSeg::CMDQ_ADDR_L_SZ.dword(),
            page.iova() as u32 & 0xffff_f000,
        );
        // Firmware that is still initializing drops these writes; say so
        // now rather than time out on the first command.
        let read = (u64::from(bar.read32(InitSeg::CMDQ_ADDR_H.dword())) << 32)
            | u64::from(bar.read32(InitSeg::CMDQ_ADDR_L_SZ.dword()) & 0xffff_f000);
        if read != page.iova() {
            return Err(Error::CmdqAddress {
                device: bar.name(),
                wrote: page.iova(),
                read,
            });
        }
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        inputs.resize_with(entries, Chain::default);
        outputs.resize_with(entries, Chain::default);
        Ok(CmdQueue {
            page,
            log_stride,
            entries,
            inputs,
            outputs,
            token: 0,
            timeout: Duration::from_secs(60),
            stats: CmdStats::default(),
            poisoned: 0,
            down: None,
        })
    }

    /// The slot kept for MANAGE_PAGES: the last one (31 with the usual 32
    /// entries).
    pub fn pages_slot(&self) -> usize {
        self.entries - 1
    }

    /// The slot a command of `kind` goes to, if one is still usable.
    fn slot_for(&self, kind: SlotKind) -> Option<usize> {
        let usable = |s: usize| self.poisoned & (1 << s) == 0;
        match kind {
            SlotKind::Pages => Some(self.pages_slot()).filter(|&s| usable(s)),
            SlotKind::General => (0..self.pages_slot()).find(|&s| usable(s)),
        }
    }

    /// The health problem that made the command interface give up, if any.
    pub fn down(&self) -> Option<&HealthProblem> {
        self.down.as_ref()
    }

    /// Uses the firmware-advertised command timeout, if any.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// The command timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Number of entries (slots).
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Counters.
    pub fn stats(&self) -> CmdStats {
        self.stats
    }

    fn entry(&self, slot: usize) -> usize {
        slot << self.log_stride
    }

    /// Writes `input` into `slot` and rings the doorbell. `out_len` bytes of
    /// output are expected.
    pub fn post<B: HwBackend>(
        &mut self,
        bar: &Bar<B>,
        pool: &Arc<DmaPool>,
        slot: usize,
        input: &[u8],
        out_len: usize,
    ) -> Result<Pending, Error> {
        assert!(slot < self.entries && input.len() >= INLINE_BYTES && out_len >= INLINE_BYTES);
        let op = View::<MboxIn>::new(input)
            .expect("16 bytes")
            .get32(MboxIn::OPCODE) as u16;
        self.token = self.token.wrapping_add(1).max(1);
        let token = self.token;
        let (in_blocks, out_blocks) = (mailbox_blocks(input.len()), mailbox_blocks(out_len));
        self.inputs[slot].ensure(pool, in_blocks)?;
        self.outputs[slot].ensure(pool, out_blocks)?;
        let (ichain, ochain) = (&self.inputs[slot], &self.outputs[slot]);
        ichain.link(in_blocks, token);
        ochain.link(out_blocks, token);
        for (i, chunk) in input[INLINE_BYTES..].chunks(MAILBOX_DATA_BYTES).enumerate() {
            let b = &ichain.blocks[i];
            b.write_bytes(0, chunk);
            b.write_bytes(
                chunk.len(),
                &[0u8; MAILBOX_DATA_BYTES][..MAILBOX_DATA_BYTES - chunk.len()],
            );
        }
        for b in &ochain.blocks[..out_blocks] {
            b.write_bytes(0, &[0u8; MAILBOX_DATA_BYTES]);
        }
        let e = self.entry(slot);
        let p = &self.page;
        p.write_u8(e + E_TYPE, CMD_TYPE_PCIE);
        p.write_be32(e + E_INLEN, input.len() as u32);
        p.write_be64(e + E_IN_PTR, ichain.head(in_blocks));
        p.write_bytes(e + E_IN, &input[..INLINE_BYTES]);
        p.write_bytes(e + E_OUT, &[0u8; INLINE_BYTES]);
        p.write_be64(e + E_OUT_PTR, ochain.head(out_blocks));
        p.write_be32(e + E_OUTLEN, out_len as u32);
        p.write_u8(e + E_TOKEN, token);
        p.store_owner(e + E_STATUS_OWN, CMD_OWNER_HW);
        barrier::to_device();
        bar.write32(InitSeg::CMD_DBELL.dword(), 1 << slot);
        self.stats.sent += 1;
        Ok(Pending { slot, op, out_len })
    }

    /// True once firmware has handed the entry back.
    pub fn is_done(&mut self, p: &Pending) -> bool {
        let done = self.page.load_owner(self.entry(p.slot) + E_STATUS_OWN) & CMD_OWNER_HW == 0;
        if !done {
            self.stats.busy_polls += 1;
        }
        done
    }

    /// Collects the output of a finished command and checks both statuses.
    pub fn finish(&mut self, p: Pending, device: &str) -> Result<Vec<u8>, Error> {
        barrier::from_device();
        let e = self.entry(p.slot);
        let delivery = self.page.read_u8(e + E_STATUS_OWN) >> 1;
        if delivery != 0 {
            self.stats.failed += 1;
            return Err(Error::Delivery {
                device: device.to_string(),
                op: OpName(p.op),
                status: DeliveryName(delivery),
                raw: delivery,
            });
        }
        let mut out = vec![0u8; p.out_len];
        self.page.read_bytes(e + E_OUT, &mut out[..INLINE_BYTES]);
        for (i, chunk) in out[INLINE_BYTES..]
            .chunks_mut(MAILBOX_DATA_BYTES)
            .enumerate()
        {
            self.outputs[p.slot].blocks[i].read_bytes(0, chunk);
        }
        let v = View::<MboxOut>::new(&out).expect("16 bytes");
        let status = v.get32(MboxOut::STATUS) as u8;
        if status != 0 {
            self.stats.failed += 1;
            return Err(Error::Command {
                device: device.to_string(),
                op: OpName(p.op),
                status: StatusName(status),
                raw_status: status,
                syndrome: v.get32(MboxOut::SYNDROME),
            });
        }
        Ok(out)
    }

    /// Posts a command to a slot of `kind`, polls it (calling `service`
    /// between polls, e.g. to answer page requests; its failures are the
    /// caller's to log, never this command's) and finishes it, with the
    /// command timeout. Between waits the health buffer is checked, so a
    /// device that is gone or fatally broken fails the command at once.
    pub fn exec<B: HwBackend>(
        &mut self,
        bar: &Bar<B>,
        pool: &Arc<DmaPool>,
        kind: SlotKind,
        input: &[u8],
        out_len: usize,
        mut service: impl FnMut(&mut Self),
    ) -> Result<Vec<u8>, Error> {
        let op = View::<MboxIn>::new(input)
            .map(|v| v.get32(MboxIn::OPCODE) as u16)
            .unwrap_or(0);
        if let Some(why) = self.down.clone() {
            self.stats.failed += 1;
            return Err(Error::Unhealthy {
                device: bar.name(),
                why,
            });
        }
        let Some(slot) = self.slot_for(kind) else {
            self.stats.failed += 1;
            return Err(Error::Config(format!(
                "{}: no usable command slot for {} ({kind:?}): every one timed out and may still belong to the hardware",
                bar.name(),
                OpName(op)
            )));
        };
        let p = self.post(bar, pool, slot, input, out_len)?;
        let mut waited = Duration::ZERO;
        let mut step = Duration::from_micros(1);
        let mut spins = 0u32;
        while !self.is_done(&p) {
            service(self);
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if let Some(why) = crate::device::read_health_regs(bar).fatal() {
                // The entry may never come back: leave the slot alone.
                self.poison(slot);
                self.stats.failed += 1;
                tracing::error!(device = %bar.name(), op = %OpName(p.op), slot, problem = %why, "device unhealthy while a command was in flight; failing it and every later command");
                self.down = Some(why.clone());
                return Err(Error::Unhealthy {
                    device: bar.name(),
                    why,
                });
            }
            if waited >= self.timeout {
                self.poison(slot);
                self.stats.failed += 1;
                tracing::error!(device = %bar.name(), op = %OpName(p.op), slot, ?waited, "command timed out; its slot stays with the hardware and is not reused");
                return Err(Error::Timeout {
                    device: bar.name(),
                    what: format!("{} (command slot {slot})", OpName(p.op)),
                    waited,
                });
            }
            bar.wait(step);
            waited += step;
            step = (step * 2).min(Duration::from_millis(1));
        }
        self.finish(p, &bar.name())
    }

    fn poison(&mut self, slot: usize) {
        self.poisoned |= 1 << slot;
        self.stats.poisoned_slots += 1;
    }

    /// Counts an error the caller's `service` hit during a command.
    pub fn note_service_error(&mut self) {
        self.stats.service_errors += 1;
    }
}

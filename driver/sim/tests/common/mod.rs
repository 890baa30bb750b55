//! A small test "driver": builds commands with the `mlx5::prm` layouts,
//! puts them in a command queue in host memory mapped through the model's
//! DmaMapper, rings doorbells through the HwBackend, polls the EQ for page
//! requests while it waits, and drives SQs/RQs/CQs the way the real
//! driver will (facts sheet §8 bring-up order).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use mempool::DmaMapper;
use mlx5::hw::HwBackend;
use mlx5::prm::cmd::*;
use mlx5::prm::cmdq::{CmdLayout, CmdProtBlock, MAILBOX_DATA_BYTES, mailbox_blocks};
use mlx5::prm::codes::{EventType, Opcode, cap_type, manage_pages_op_mod, wq_type};
use mlx5::prm::cqe::{Cqe, EqeDecoded};
use mlx5::prm::ctx::*;
use mlx5::prm::wqe::encode_log_num_strides;
use mlx5::prm::{Layout, View, ViewMut};
use mlx5_sim::{Fabric, FabricConfig, HostMem, NicConfig, SimBackend, SimNic};

pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
pub const IP_A: [u8; 4] = [10, 0, 0, 1];
pub const IP_B: [u8; 4] = [10, 0, 0, 2];
pub const UDP_PORT: u16 = 31850;

pub fn det_fabric(seed: u64) -> Fabric {
    Fabric::new(FabricConfig {
        seed,
        deterministic: true,
        ..Default::default()
    })
}

/// Result of one command.
#[derive(Debug, Clone)]
pub struct CmdOut {
    pub delivery: u8,
    pub status: u8,
    pub syndrome: u32,
    pub out: Vec<u8>,
}

impl CmdOut {
    pub fn ok(&self) -> bool {
        self.delivery == 0 && self.status == 0
    }
}

/// Builds a command input of `len` bytes (at least the layout) with the
/// header set.
pub fn input<S: Layout>(
    op: Opcode,
    op_mod: u16,
    len: usize,
    f: impl FnOnce(&mut ViewMut<'_, S>),
) -> Vec<u8> {
    let mut v = vec![0u8; len.max(S::BYTES).max(16)];
    {
        let mut h = ViewMut::<MboxIn>::new(&mut v).unwrap();
        h.set(MboxIn::OPCODE, op as u64)
            .set(MboxIn::OP_MOD, u64::from(op_mod));
    }
    {
        let mut s = ViewMut::<S>::new(&mut v).unwrap();
        f(&mut s);
    }
    v
}

/// A bare 16-byte input (opcode, op_mod, dword 2).
pub fn simple(op: Opcode, op_mod: u16, dw2: u32) -> Vec<u8> {
    let mut v = vec![0u8; 16];
    v[0..2].copy_from_slice(&(op as u16).to_be_bytes());
    v[6..8].copy_from_slice(&op_mod.to_be_bytes());
    v[8..12].copy_from_slice(&dw2.to_be_bytes());
    v
}

pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

pub struct Eq {
    pub eqn: u32,
    pub mem: HostMem,
    pub log_size: u32,
    pub ci: u32,
    pub uar: u32,
}

pub struct Cq {
    pub cqn: u32,
    pub mem: HostMem,
    pub log_size: u32,
    pub ci: u32,
    pub dbr: u64,
    pub dbr_off: usize,
}

pub struct Sq {
    pub sqn: u32,
    pub mem: HostMem,
    pub log_wqebbs: u32,
    pub pi: u16,
    pub last: u16,
    pub dbr_off: usize,
    pub uar: u32,
    pub bf_half: usize,
}

pub struct Rq {
    pub rqn: u32,
    pub ring: HostMem,
    pub bufs: HostMem,
    pub log_wqes: u32,
    pub log_strides: u32,
    pub log_stride: u32,
    pub posted: u32,
    pub dbr_off: usize,
}

/// Which parts of a datapath to build.
#[derive(Debug, Clone, Copy)]
pub struct PathCfg {
    pub rx_cq_log: u32,
    pub rx_oi: bool,
    pub rq_log_wqes: u32,
    pub log_strides: u32,
    pub log_stride: u32,
    pub tx_cq_log: u32,
    pub sq_log: u32,
    pub min_inline: u8,
}

impl Default for PathCfg {
    fn default() -> Self {
        PathCfg {
            rx_cq_log: 3,
            rx_oi: true,
            rq_log_wqes: 3,
            log_strides: 9,
            log_stride: 10,
            tx_cq_log: 4,
            sq_log: 7,
            min_inline: 0,
        }
    }
}

pub struct Path {
    pub tx_cq: Cq,
    pub tis: u32,
    pub sq: Sq,
    pub rx_cq: Cq,
    pub rq: Rq,
    pub tir: u32,
    pub table: u32,
    pub group: u32,
    pub qcounter: u32,
}

pub struct Host {
    pub fabric: Fabric,
    pub nic: SimNic,
    pub hw: SimBackend,
    pub mapper: Arc<dyn DmaMapper>,
    pub cmdq: HostMem,
    pub mbox: Vec<HostMem>,
    pub token: u8,
    /// Memory the pages given to firmware come from (kept until the host
    /// is dropped; chunks of up to 512 pages, as a driver would use).
    pub fw_chunks: Vec<HostMem>,
    /// IOVAs of the pages the firmware holds.
    pub fw_given: std::collections::BTreeSet<u64>,
    pub eq: Option<Eq>,
    pub events: Vec<EqeDecoded>,
    pub uar_eq: u32,
    pub uar_tx: u32,
    pub pd: u32,
    pub td: u32,
    pub lkey: u32,
    pub dbrs: HostMem,
    pub next_dbr: usize,
    pub mtu: u16,
}

pub const SLOT_PAGES: u8 = 31;

impl Host {
    pub fn new(fabric: &Fabric, cfg: NicConfig) -> Host {
        let nic = SimNic::new(fabric, cfg);
        let hw = nic.backend();
        let mapper = hw.dma_mapper();
        let cmdq = HostMem::new(mapper.clone(), 4096).unwrap();
        let mbox = (0..2)
            .map(|_| HostMem::new(mapper.clone(), 32 * 1024).unwrap())
            .collect();
        let dbrs = HostMem::new(mapper.clone(), 4096).unwrap();
        Host {
            fabric: fabric.clone(),
            nic,
            hw,
            mapper,
            cmdq,
            mbox,
            token: 0x5a,
            fw_chunks: Vec::new(),
            fw_given: Default::default(),
            eq: None,
            events: Vec::new(),
            uar_eq: 0,
            uar_tx: 0,
            pd: 0,
            td: 0,
            lkey: 0,
            dbrs,
            next_dbr: 0,
            mtu: 0,
        }
    }

    /// A ConnectX-5 with `mac` that accepts striding WQEs down to 512
    /// bytes (8 strides of 64 bytes), so that the datapath tests can fill
    /// WQEs and provoke filler CQEs with a few frames (the profile's
    /// minimum is 16 KiB, DPDK's default `log_min_stride_wqe_sz`).
    pub fn with_mac(fabric: &Fabric, mac: [u8; 6]) -> Host {
        Host::new(
            fabric,
            NicConfig {
                mac,
                log_min_stride_wqe_sz: Some(9),
                ..Default::default()
            },
        )
    }

    pub fn alloc(&self, len: usize) -> HostMem {
        HostMem::new(self.mapper.clone(), len).unwrap()
    }

    pub fn dbr(&mut self) -> (usize, u64) {
        let off = self.next_dbr;
        self.next_dbr += 8;
        (off, self.dbrs.iova_at(off))
    }

    // ------------------------------------------------------------- commands

    /// Waits for `initializing` to clear.
    pub fn wait_ready(&self) {
        let mut waited = 0;
        while self.hw.read32(0x1fc) & (1 << 31) != 0 {
            self.hw.wait(Duration::from_millis(2));
            waited += 1;
            assert!(waited < 1000, "firmware never became ready");
        }
    }

    /// Enables bus mastering, waits for the firmware to come out of reset,
    /// programs the command queue and waits again (the kernel's order).
    pub fn init_cmdq(&mut self) {
        self.hw.config_write(4, &0x0006u16.to_le_bytes()).unwrap();
        self.wait_ready();
        let rev = self.hw.read32(0x4) >> 16;
        assert_eq!(rev, 5, "cmdif revision");
        let sz = self.hw.read32(0x14);
        assert_eq!((sz >> 4) & 0xf, 5);
        assert_eq!(sz & 0xf, 6);
        let iova = self.cmdq.iova();
        self.hw.write32(0x10, (iova >> 32) as u32);
        self.hw.write32(0x14, iova as u32);
        self.wait_ready();
    }

    /// Places a command in `slot` (with its mailbox chains) and rings the
    /// doorbell; `tweak` may corrupt the entry and blocks before the ring.
    pub fn submit(
        &mut self,
        slot: u8,
        inp: &[u8],
        outlen: usize,
        tweak: &mut dyn FnMut(&mut [u8; 64], &HostMem),
    ) {
        let m = if slot == SLOT_PAGES { 1 } else { 0 };
        let mb = &self.mbox[m];
        let in_blocks = mailbox_blocks(inp.len());
        let out_blocks = mailbox_blocks(outlen);
        assert!(
            in_blocks <= 16 && out_blocks <= 16,
            "message too large for the test host"
        );
        let blk = |i: usize| i * 1024;
        let oblk = |i: usize| 16 * 1024 + i * 1024;
        for i in 0..in_blocks {
            let mut b = [0u8; 0x240];
            let start = 16 + i * MAILBOX_DATA_BYTES;
            let end = (start + MAILBOX_DATA_BYTES).min(inp.len());
            b[..end - start].copy_from_slice(&inp[start..end]);
            let mut v = ViewMut::<CmdProtBlock>::new(&mut b).unwrap();
            let next = if i + 1 < in_blocks {
                mb.iova_at(blk(i + 1))
            } else {
                0
            };
            v.set(CmdProtBlock::NEXT, next)
                .set(CmdProtBlock::BLOCK_NUM, i as u64)
                .set(CmdProtBlock::TOKEN, u64::from(self.token));
            mb.write(blk(i), &b);
        }
        for i in 0..out_blocks {
            let mut b = [0u8; 0x240];
            let mut v = ViewMut::<CmdProtBlock>::new(&mut b).unwrap();
            let next = if i + 1 < out_blocks {
                mb.iova_at(oblk(i + 1))
            } else {
                0
            };
            v.set(CmdProtBlock::NEXT, next)
                .set(CmdProtBlock::BLOCK_NUM, i as u64)
                .set(CmdProtBlock::TOKEN, u64::from(self.token));
            mb.write(oblk(i), &b);
        }
        let mut e = [0u8; 64];
        {
            let mut v = ViewMut::<CmdLayout>::new(&mut e).unwrap();
            v.set(CmdLayout::TYPE, 7)
                .set(CmdLayout::INLEN, inp.len() as u64)
                .set(
                    CmdLayout::IN_PTR,
                    if in_blocks > 0 { mb.iova_at(blk(0)) } else { 0 },
                )
                .set(
                    CmdLayout::OUT_PTR,
                    if out_blocks > 0 {
                        mb.iova_at(oblk(0))
                    } else {
                        0
                    },
                )
                .set(CmdLayout::OUTLEN, outlen as u64)
                .set(CmdLayout::TOKEN, u64::from(self.token))
                .set(CmdLayout::STATUS_OWN, 1);
        }
        let n = inp.len().min(16);
        e[0x10..0x10 + n].copy_from_slice(&inp[..n]);
        tweak(&mut e, mb);
        let at = usize::from(slot) * 64;
        self.cmdq.write(at, &e[..63]);
        self.cmdq.store_u8_release(at + 63, e[63]);
        self.hw.write32(0x18, 1 << slot);
    }

    /// True while hardware owns `slot`.
    pub fn busy(&self, slot: u8) -> bool {
        self.cmdq.load_u8_acquire(usize::from(slot) * 64 + 0x3f) & 1 == 1
    }

    pub fn collect(&self, slot: u8, outlen: usize) -> CmdOut {
        let m = if slot == SLOT_PAGES { 1 } else { 0 };
        let at = usize::from(slot) * 64;
        let so = self.cmdq.load_u8_acquire(at + 0x3f);
        let mut out = self.cmdq.read_vec(at + 0x20, 16.min(outlen));
        let mut i = 0;
        while out.len() < outlen {
            let n = (outlen - out.len()).min(MAILBOX_DATA_BYTES);
            out.extend(self.mbox[m].read_vec(16 * 1024 + i * 1024, n));
            i += 1;
        }
        CmdOut {
            delivery: so >> 1,
            status: out[0],
            syndrome: be32(&out, 4),
            out,
        }
    }

    /// Runs a command in `slot`, polling the EQ (and answering page
    /// requests from slot 31) while it is outstanding.
    pub fn exec_slot(&mut self, slot: u8, inp: &[u8], outlen: usize) -> CmdOut {
        self.submit(slot, inp, outlen, &mut |_, _| {});
        let mut spins = 0;
        while self.busy(slot) {
            if slot != SLOT_PAGES {
                self.service_eq();
            }
            self.hw.wait(Duration::from_millis(1));
            spins += 1;
            assert!(spins < 2000, "command in slot {slot} never completed");
        }
        self.collect(slot, outlen)
    }

    pub fn exec(&mut self, inp: &[u8], outlen: usize) -> CmdOut {
        self.exec_slot(0, inp, outlen)
    }

    /// Runs a command that must succeed; returns its output.
    pub fn ok(&mut self, inp: &[u8], outlen: usize) -> Vec<u8> {
        let r = self.exec(inp, outlen);
        assert!(
            r.ok(),
            "command {:#x} failed: delivery {:#x} status {:#x} syndrome {:#x}; log: {}",
            u16::from_be_bytes([inp[0], inp[1]]),
            r.delivery,
            r.status,
            r.syndrome,
            self.nic
                .command_log()
                .last()
                .map(|r| r.to_string())
                .unwrap_or_default()
        );
        r.out
    }

    pub fn out24(out: &[u8]) -> u32 {
        be32(out, 8) & 0xff_ffff
    }

    // ---------------------------------------------------------------- pages

    /// MANAGE_PAGES GIVE of `n` pages in commands of at most 512 pages;
    /// returns the last command's result (the first failure stops).
    pub fn give_pages(&mut self, n: usize, slot: u8) -> CmdOut {
        let mut left = n;
        let mut last = None;
        while left > 0 || last.is_none() {
            let batch = left.min(512);
            let chunk = self.alloc(4096 * batch.max(1));
            let mut inp = input::<ManagePagesIn>(
                Opcode::ManagePages,
                manage_pages_op_mod::GIVE,
                0x10 + 8 * batch,
                |v| {
                    v.set(ManagePagesIn::INPUT_NUM_ENTRIES, batch as u64);
                },
            );
            for i in 0..batch {
                inp[0x10 + 8 * i..0x18 + 8 * i]
                    .copy_from_slice(&chunk.iova_at(i * 4096).to_be_bytes());
            }
            let r = self.exec_slot(slot, &inp, 0x10);
            if !r.ok() {
                return r;
            }
            self.fw_given
                .extend((0..batch).map(|i| chunk.iova_at(i * 4096)));
            self.fw_chunks.push(chunk);
            left -= batch;
            last = Some(r);
        }
        last.expect("at least one command")
    }

    /// The first `n` bytes of a page given to firmware.
    pub fn fw_page_bytes(&self, iova: u64, n: usize) -> Vec<u8> {
        let c = self
            .fw_chunks
            .iter()
            .find(|c| iova >= c.iova() && iova < c.iova() + c.len() as u64)
            .expect("a page we gave");
        c.read_vec((iova - c.iova()) as usize, n)
    }

    pub fn take_pages(&mut self, n: usize, slot: u8) -> usize {
        let inp =
            input::<ManagePagesIn>(Opcode::ManagePages, manage_pages_op_mod::TAKE, 0x10, |v| {
                v.set(ManagePagesIn::INPUT_NUM_ENTRIES, n as u64);
            });
        let r = self.exec_slot(slot, &inp, 0x10 + 8 * n);
        assert!(r.ok(), "TAKE failed {r:?}");
        let k = be32(&r.out, 8) as usize;
        for i in 0..k {
            let a = u64::from_be_bytes(r.out[0x10 + 8 * i..0x18 + 8 * i].try_into().unwrap());
            assert!(
                self.fw_given.remove(&a),
                "firmware returned {a:#x}, a page we never gave"
            );
        }
        k
    }

    pub fn query_pages(&mut self, op_mod: u16) -> i32 {
        let out = self.ok(&simple(Opcode::QueryPages, op_mod, 0), 0x10);
        be32(&out, 12) as i32
    }

    // ------------------------------------------------------------------ EQ

    /// Reads new EQEs; answers page requests; keeps the rest.
    pub fn service_eq(&mut self) {
        let Some(eq) = self.eq.as_mut() else { return };
        let n = 1u32 << eq.log_size;
        let mut new = Vec::new();
        loop {
            let off = ((eq.ci & (n - 1)) * 64) as usize;
            let owner = eq.mem.load_u8_acquire(off + 63) & 1;
            if u32::from(owner) != (eq.ci >> eq.log_size) & 1 {
                break;
            }
            let mut b = [0u8; 64];
            eq.mem.read(off, &mut b);
            new.push(EqeDecoded::decode(&b));
            eq.ci += 1;
        }
        if !new.is_empty() {
            let v = (eq.eqn << 24) | (eq.ci & 0xff_ffff);
            let uar = eq.uar;
            self.hw.write32(uar as usize * 4096 + 0x48, v);
        }
        for e in new {
            if let Some((_, n)) = e.page_request() {
                if n > 0 {
                    let r = self.give_pages(n as usize, SLOT_PAGES);
                    assert!(r.ok(), "page give failed {r:?}");
                } else if n < 0 {
                    self.take_pages((-n) as usize, SLOT_PAGES);
                }
            } else {
                self.events.push(e);
            }
        }
    }

    pub fn alloc_uar(&mut self) -> u32 {
        let out = self.ok(&simple(Opcode::AllocUar, 0, 0), 0x10);
        Self::out24(&out)
    }

    pub fn create_eq(&mut self, uar: u32, log_size: u32, mask: u64) -> Eq {
        let mem = self.alloc(64 << log_size);
        for i in 0..(1usize << log_size) {
            mem.store_u8_release(i * 64 + 63, 1);
        }
        let npages = (64usize << log_size).div_ceil(4096);
        let mut inp = input::<CreateEqIn>(Opcode::CreateEq, 0, 0x110 + 8 * npages, |v| {
            v.set_flex(CreateEqIn::EVENT_BITMASK, 0, mask);
            let mut e = v.sub(CreateEqIn::EQC);
            e.set(Eqc::LOG_EQ_SIZE, u64::from(log_size))
                .set(Eqc::UAR_PAGE, u64::from(uar))
                .set(Eqc::INTR, 0)
                .set(Eqc::LOG_PAGE_SIZE, 0);
        });
        for i in 0..npages {
            inp[0x110 + 8 * i..0x118 + 8 * i].copy_from_slice(&mem.iova_at(i * 4096).to_be_bytes());
        }
        let out = self.ok(&inp, 0x10);
        Eq {
            eqn: be32(&out, 8) & 0xff,
            mem,
            log_size,
            ci: 0,
            uar,
        }
    }

    // ------------------------------------------------------------- bring-up

    /// Facts sheet §8 steps 1-3. Returns with an EQ for page requests and CQ
    /// errors, a TX UAR, PD, TD and a PA mkey.
    pub fn bring_up(&mut self) {
        self.init_cmdq();
        self.ok(&simple(Opcode::EnableHca, 0, 0), 0x10);
        let out = self.ok(&simple(Opcode::QueryIssi, 0, 0), 0x70);
        assert_eq!(be32(&out, 0x6c) & 2, 2, "ISSI 1 supported");
        self.ok(&simple(Opcode::SetIssi, 0, 1), 0x10);
        let boot = self.query_pages(1);
        assert!(boot > 0);
        let r = self.give_pages(boot as usize, SLOT_PAGES);
        assert!(r.ok());
        let mut reg = simple(Opcode::AccessReg, 0, 0x7004);
        reg.extend_from_slice(&[0u8; 16]);
        self.ok(&reg, 0x20);
        let gen_cur = self.ok(
            &simple(Opcode::QueryHcaCap, (cap_type::GENERAL << 1) | 1, 0),
            0x1010,
        );
        let _gen_max = self.ok(
            &simple(Opcode::QueryHcaCap, cap_type::GENERAL << 1, 0),
            0x1010,
        );
        let eth = self.ok(
            &simple(
                Opcode::QueryHcaCap,
                (cap_type::ETHERNET_OFFLOADS << 1) | 1,
                0,
            ),
            0x1010,
        );
        let caps = View::<CmdHcaCap>::new(&gen_cur[0x10..]).unwrap();
        assert_eq!(caps.get(CmdHcaCap::PORT_TYPE), 1);
        assert_eq!(caps.get(CmdHcaCap::STRIDING_RQ), 1);
        assert_eq!(caps.get(CmdHcaCap::CQ_OI), 1);
        assert_eq!(caps.get(CmdHcaCap::EXT_STRIDE_NUM_RANGE), 1);
        assert_eq!(caps.get(CmdHcaCap::LOG_BF_REG_SIZE), 9);
        let _ = View::<EthCaps>::new(&eth[0x10..]).unwrap();
        let mut set = input::<SetHcaCapIn>(Opcode::SetHcaCap, cap_type::GENERAL << 1, 0, |_| {});
        // Only cmd_hca_cap (256 bytes): the rest of the union is reserved.
        set[0x10..0x110].copy_from_slice(&gen_cur[0x10..0x110]);
        {
            let mut v = ViewMut::<SetHcaCapIn>::new(&mut set).unwrap();
            let mut c = v.sub(SetHcaCapIn::CMD_HCA_CAP);
            c.set(CmdHcaCap::CMDIF_CHECKSUM, 0)
                .set(CmdHcaCap::LOG_UAR_PAGE_SZ, 0);
        }
        self.ok(&set, 0x10);
        let init = self.query_pages(2);
        if init > 0 {
            let r = self.give_pages(init as usize, SLOT_PAGES);
            assert!(r.ok());
        }
        self.ok(&simple(Opcode::InitHca, 0, 0), 0x10);
        self.uar_eq = self.alloc_uar();
        self.hw.enable_msix(0).unwrap();
        let mask = (1u64 << EventType::PageRequest as u8) | (1u64 << EventType::CqError as u8);
        let eq = self.create_eq(self.uar_eq, 8, mask);
        self.eq = Some(eq);
        self.service_eq();
        self.uar_tx = self.alloc_uar();
        self.pd = Self::out24(&self.ok(&simple(Opcode::AllocPd, 0, 0), 0x10));
        self.td = Self::out24(&self.ok(&simple(Opcode::AllocTransportDomain, 0, 0), 0x10));
        let pd = self.pd;
        let mk = input::<CreateMkeyIn>(Opcode::CreateMkey, 0, 0, |v| {
            let mut m = v.sub(CreateMkeyIn::MKC);
            m.set(Mkc::ACCESS_MODE_1_0, 0)
                .set(Mkc::LR, 1)
                .set(Mkc::LW, 1)
                .set(Mkc::QPN, 0xff_ffff)
                .set(Mkc::MKEY_7_0, 0x42)
                .set(Mkc::LENGTH64, 1)
                .set(Mkc::PD, u64::from(pd));
        });
        let idx = Self::out24(&self.ok(&mk, 0x10));
        self.lkey = (idx << 8) | 0x42;
        let v = self.ok(&simple(Opcode::QueryNicVportContext, 0, 0), 0x110);
        let mac = &v[0x106..0x10c];
        assert_eq!(mac, &self.nic.config().mac);
        self.mtu = u16::from_be_bytes([v[0x10 + 0x26], v[0x10 + 0x27]]);
        // The link comes up `link_up_delay` after INIT_HCA.
        let mut waited = 0;
        loop {
            let st = self.ok(&simple(Opcode::QueryVportState, 0, 0), 0x10);
            if be32(&st, 0xc) & 0xf == 1 {
                break;
            }
            assert!(waited < 1000, "link up within a second");
            self.hw.wait(Duration::from_millis(1));
            waited += 1;
        }
        // Unicast reaches the function only for MACs in its vport list
        // (a VF's e-switch) and, on an e-switch manager, its MPFS entry.
        let mac = self.nic.config().mac;
        self.set_uc_list(&[mac]);
        if caps.get(CmdHcaCap::ESWITCH_MANAGER) == 1 {
            self.set_l2_entry(0, mac);
        }
    }

    /// MODIFY_NIC_VPORT_CONTEXT of the unicast address list.
    pub fn set_uc_list(&mut self, macs: &[[u8; 6]]) {
        let mut inp = input::<ModifyNicVportContextIn>(
            Opcode::ModifyNicVportContext,
            0,
            0x200 + 8 * macs.len(),
            |v| {
                v.sub(ModifyNicVportContextIn::FIELD_SELECT)
                    .set(ModifyNicVportFieldSelect::ADDRESSES_LIST, 1);
                v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
                    .set(NicVportContext::ALLOWED_LIST_SIZE, macs.len() as u64);
            },
        );
        for (i, m) in macs.iter().enumerate() {
            inp[0x200 + 8 * i + 2..0x200 + 8 * i + 8].copy_from_slice(m);
        }
        self.ok(&inp, 0x10);
    }

    /// SET_L2_TABLE_ENTRY (MPFS).
    pub fn set_l2_entry(&mut self, index: u32, mac: [u8; 6]) {
        let mut inp = input::<SetL2TableEntryIn>(Opcode::SetL2TableEntry, 0, 0, |v| {
            v.set(SetL2TableEntryIn::TABLE_INDEX, u64::from(index));
        });
        let at = SetL2TableEntryIn::MAC_ADDRESS.byte() + 2;
        inp[at..at + 6].copy_from_slice(&mac);
        self.ok(&inp, 0x10);
    }

    // ------------------------------------------------------------ datapath

    pub fn create_cq(&mut self, log_size: u32, oi: bool) -> Cq {
        let mem = self.alloc(64 << log_size);
        for i in 0..(1usize << log_size) {
            mem.store_u8_release(i * 64 + 63, 0xf0);
        }
        let (dbr_off, dbr) = self.dbr();
        let npages = (64usize << log_size).div_ceil(4096);
        let eqn = self.eq.as_ref().map_or(0, |e| e.eqn);
        let uar = self.uar_eq;
        let mut inp = input::<CreateCqIn>(Opcode::CreateCq, 0, 0x110 + 8 * npages, |v| {
            let mut c = v.sub(CreateCqIn::CQC);
            c.set(Cqc::LOG_CQ_SIZE, u64::from(log_size))
                .set(Cqc::OI, u64::from(oi))
                .set(Cqc::UAR_PAGE, u64::from(uar))
                .set(Cqc::C_EQN, u64::from(eqn))
                .set(Cqc::DBR_ADDR, dbr);
        });
        for i in 0..npages {
            inp[0x110 + 8 * i..0x118 + 8 * i].copy_from_slice(&mem.iova_at(i * 4096).to_be_bytes());
        }
        let out = self.ok(&inp, 0x10);
        Cq {
            cqn: Self::out24(&out),
            mem,
            log_size,
            ci: 0,
            dbr,
            dbr_off,
        }
    }

    pub fn create_tis(&mut self) -> u32 {
        let td = self.td;
        let inp = input::<CreateTisIn>(Opcode::CreateTis, 0, 0, |v| {
            v.sub(CreateTisIn::CTX)
                .set(Tisc::TRANSPORT_DOMAIN, u64::from(td));
        });
        Self::out24(&self.ok(&inp, 0x10))
    }

    pub fn create_sq_input(
        &mut self,
        cqn: u32,
        tisn: u32,
        log_wqebbs: u32,
        min_inline: u8,
        mem: &HostMem,
        dbr: u64,
    ) -> Vec<u8> {
        let npages = (64usize << log_wqebbs).div_ceil(4096);
        let (pd, uar) = (self.pd, self.uar_tx);
        let mut inp = input::<CreateSqIn>(Opcode::CreateSq, 0, 0x110 + 8 * npages, |v| {
            let mut s = v.sub(CreateSqIn::CTX);
            s.set(Sqc::FLUSH_IN_ERROR_EN, 1)
                .set(Sqc::MIN_WQE_INLINE_MODE, u64::from(min_inline))
                .set(Sqc::CQN, u64::from(cqn))
                .set(Sqc::TIS_LST_SZ, 1)
                .set(Sqc::TIS_NUM_0, u64::from(tisn));
            let mut w = s.sub(Sqc::WQ);
            w.set(Wq::WQ_TYPE, u64::from(wq_type::CYCLIC))
                .set(Wq::PD, u64::from(pd))
                .set(Wq::UAR_PAGE, u64::from(uar))
                .set(Wq::DBR_ADDR, dbr)
                .set(Wq::LOG_WQ_STRIDE, 6)
                .set(Wq::LOG_WQ_PG_SZ, 0)
                .set(Wq::LOG_WQ_SZ, u64::from(log_wqebbs));
        });
        for i in 0..npages {
            inp[0x110 + 8 * i..0x118 + 8 * i].copy_from_slice(&mem.iova_at(i * 4096).to_be_bytes());
        }
        inp
    }

    pub fn create_sq(&mut self, cqn: u32, tisn: u32, log_wqebbs: u32, min_inline: u8) -> Sq {
        let mem = self.alloc(64 << log_wqebbs);
        let (dbr_off, dbr) = self.dbr();
        let inp = self.create_sq_input(cqn, tisn, log_wqebbs, min_inline, &mem, dbr);
        let sqn = Self::out24(&self.ok(&inp, 0x10));
        Sq {
            sqn,
            mem,
            log_wqebbs,
            pi: 0,
            last: 0,
            dbr_off,
            uar: self.uar_tx,
            bf_half: 0,
        }
    }

    pub fn modify_sq(&mut self, sqn: u32, from: u8, to: u8) -> CmdOut {
        let inp = input::<ModifySqIn>(Opcode::ModifySq, 0, 0, |v| {
            v.set(ModifySqIn::SQ_STATE, u64::from(from))
                .set(ModifySqIn::SQN, u64::from(sqn));
            v.sub(ModifySqIn::CTX).set(Sqc::STATE, u64::from(to));
        });
        self.exec(&inp, 0x10)
    }

    pub fn modify_rq(&mut self, rqn: u32, from: u8, to: u8) -> CmdOut {
        let inp = input::<ModifyRqIn>(Opcode::ModifyRq, 0, 0, |v| {
            v.set(ModifyRqIn::RQ_STATE, u64::from(from))
                .set(ModifyRqIn::RQN, u64::from(rqn));
            v.sub(ModifyRqIn::CTX).set(Rqc::STATE, u64::from(to));
        });
        self.exec(&inp, 0x10)
    }

    pub fn alloc_q_counter(&mut self) -> u32 {
        be32(&self.ok(&simple(Opcode::AllocQCounter, 0, 0), 0x10), 8) & 0xff
    }

    pub fn create_rq(
        &mut self,
        cqn: u32,
        log_wqes: u32,
        log_strides: u32,
        log_stride: u32,
        counter: u32,
    ) -> Rq {
        let ring = self.alloc(32 << log_wqes);
        let bufs = self.alloc((1usize << (log_wqes + log_strides + log_stride)).max(4096));
        let (dbr_off, dbr) = self.dbr();
        let npages = (32usize << log_wqes).div_ceil(4096);
        let pd = self.pd;
        let mut inp = input::<CreateRqIn>(Opcode::CreateRq, 0, 0x110 + 8 * npages, |v| {
            let mut r = v.sub(CreateRqIn::CTX);
            r.set(Rqc::VSD, 1)
                .set(Rqc::FLUSH_IN_ERROR_EN, 1)
                .set(Rqc::CQN, u64::from(cqn))
                .set(Rqc::COUNTER_SET_ID, u64::from(counter));
            let mut w = r.sub(Rqc::WQ);
            w.set(Wq::WQ_TYPE, u64::from(wq_type::CYCLIC_STRIDING))
                .set(Wq::PD, u64::from(pd))
                .set(Wq::DBR_ADDR, dbr)
                .set(Wq::LOG_WQ_STRIDE, 5)
                .set(Wq::LOG_WQ_PG_SZ, 0)
                .set(Wq::LOG_WQ_SZ, u64::from(log_wqes))
                .set(
                    Wq::LOG_WQE_NUM_OF_STRIDES,
                    u64::from(encode_log_num_strides(log_strides, true).unwrap()),
                )
                .set(Wq::LOG_WQE_STRIDE_SIZE, u64::from(log_stride - 6));
        });
        for i in 0..npages {
            inp[0x110 + 8 * i..0x118 + 8 * i]
                .copy_from_slice(&ring.iova_at(i * 4096).to_be_bytes());
        }
        let rqn = Self::out24(&self.ok(&inp, 0x10));
        // Write every WQE once: slot i always describes buffer i.
        let wqe_bytes = 1u64 << (log_strides + log_stride);
        for i in 0..(1usize << log_wqes) {
            let mut w = [0u8; 32];
            w[0x10..0x14].copy_from_slice(&(wqe_bytes as u32).to_be_bytes());
            w[0x14..0x18].copy_from_slice(&self.lkey.to_be_bytes());
            w[0x18..0x20].copy_from_slice(&bufs.iova_at(i * wqe_bytes as usize).to_be_bytes());
            ring.write(i * 32, &w);
        }
        Rq {
            rqn,
            ring,
            bufs,
            log_wqes,
            log_strides,
            log_stride,
            posted: 0,
            dbr_off,
        }
    }

    /// Posts `n` more striding WQEs (producer counter in the RQ dbr).
    pub fn post_rq(&self, rq: &mut Rq, n: u32) {
        rq.posted += n;
        self.dbrs.store_be32_release(rq.dbr_off, rq.posted & 0xffff);
    }

    pub fn create_tir(&mut self, rqn: u32) -> u32 {
        let td = self.td;
        let inp = input::<CreateTirIn>(Opcode::CreateTir, 0, 0, |v| {
            v.sub(CreateTirIn::CTX)
                .set(Tirc::DISP_TYPE, 0)
                .set(Tirc::INLINE_RQN, u64::from(rqn))
                .set(Tirc::TRANSPORT_DOMAIN, u64::from(td));
        });
        Self::out24(&self.ok(&inp, 0x10))
    }

    pub fn create_flow_table(&mut self, log_size: u32) -> u32 {
        let inp = input::<CreateFlowTableIn>(Opcode::CreateFlowTable, 0, 0, |v| {
            v.sub(CreateFlowTableIn::FLOW_TABLE_CONTEXT)
                .set(FlowTableContext::LOG_SIZE, u64::from(log_size));
        });
        Self::out24(&self.ok(&inp, 0x10))
    }

    /// The eRPC rule group: outer dmac + ethertype + ip_protocol + udp_dport.
    pub fn create_flow_group(&mut self, table: u32, start: u32, end: u32) -> u32 {
        let inp = input::<CreateFlowGroupIn>(Opcode::CreateFlowGroup, 0, 0, |v| {
            v.set(CreateFlowGroupIn::TABLE_ID, u64::from(table))
                .set(CreateFlowGroupIn::START_FLOW_INDEX, u64::from(start))
                .set(CreateFlowGroupIn::END_FLOW_INDEX, u64::from(end))
                .set(CreateFlowGroupIn::MATCH_CRITERIA_ENABLE, 1);
            let mut mc = v.sub(CreateFlowGroupIn::MATCH_CRITERIA);
            let mut o = mc.sub(FteMatchParam::OUTER_HEADERS);
            o.set(FteMatchSetLyr24::DMAC_47_16, 0xffff_ffff)
                .set(FteMatchSetLyr24::DMAC_15_0, 0xffff)
                .set(FteMatchSetLyr24::ETHERTYPE, 0xffff)
                .set(FteMatchSetLyr24::IP_PROTOCOL, 0xff)
                .set(FteMatchSetLyr24::UDP_DPORT, 0xffff);
        });
        Self::out24(&self.ok(&inp, 0x10))
    }

    pub fn fte_input(
        &self,
        table: u32,
        group: u32,
        index: u32,
        mac: [u8; 6],
        dport: u16,
        tir: u32,
    ) -> Vec<u8> {
        input::<SetFteIn>(Opcode::SetFlowTableEntry, 0, 0x348, |v| {
            v.set(SetFteIn::TABLE_ID, u64::from(table))
                .set(SetFteIn::FLOW_INDEX, u64::from(index));
            let mut fc = v.sub(SetFteIn::FLOW_CONTEXT);
            fc.set(FlowContext::GROUP_ID, u64::from(group))
                .set(FlowContext::ACTION, 0x4)
                .set(FlowContext::FLOW_TAG, 0x77)
                .set(FlowContext::DESTINATION_LIST_SIZE, 1);
            fc.set_flex(
                FlowContext::DESTINATION,
                0,
                (0x2u64 << 56) | (u64::from(tir) << 32),
            );
            let mut mv = fc.sub(FlowContext::MATCH_VALUE);
            let mut o = mv.sub(FteMatchParam::OUTER_HEADERS);
            o.set(
                FteMatchSetLyr24::DMAC_47_16,
                u64::from(u32::from_be_bytes([mac[0], mac[1], mac[2], mac[3]])),
            )
            .set(
                FteMatchSetLyr24::DMAC_15_0,
                u64::from(u16::from_be_bytes([mac[4], mac[5]])),
            )
            .set(FteMatchSetLyr24::ETHERTYPE, 0x0800)
            .set(FteMatchSetLyr24::IP_PROTOCOL, 17)
            .set(FteMatchSetLyr24::UDP_DPORT, u64::from(dport));
        })
    }

    pub fn set_root(&mut self, table: u32) {
        let inp = input::<SetFlowTableRootIn>(Opcode::SetFlowTableRoot, 0, 0, |v| {
            v.set(SetFlowTableRootIn::TABLE_ID, u64::from(table));
        });
        self.ok(&inp, 0x10);
    }

    /// §8 steps 4-6: TX CQ, TIS, SQ (RDY); RX CQ (pre-filled as eRPC does),
    /// striding RQ with all WQEs posted (RDY), TIR, flow table/group/entry
    /// for (own MAC, IPv4, UDP, `UDP_PORT`), root.
    pub fn build_path(&mut self, p: PathCfg) -> Path {
        let tx_cq = self.create_cq(p.tx_cq_log, false);
        let tis = self.create_tis();
        let sq = self.create_sq(tx_cq.cqn, tis, p.sq_log, p.min_inline);
        assert!(self.modify_sq(sq.sqn, 0, 1).ok());
        let rx_cq = self.create_cq(p.rx_cq_log, p.rx_oi);
        if p.rx_oi {
            // eRPC's start-up pattern: the last 8 positions of the cycle.
            let n = 1usize << p.rx_cq_log;
            for i in 0..n {
                rx_cq.mem.write(i * 64 + 2, &0xffffu16.to_be_bytes());
                rx_cq
                    .mem
                    .write(i * 64 + 0x3c, &((512 - (n - i)) as u16).to_be_bytes());
            }
        }
        let qcounter = self.alloc_q_counter();
        let mut rq = self.create_rq(
            rx_cq.cqn,
            p.rq_log_wqes,
            p.log_strides,
            p.log_stride,
            qcounter,
        );
        self.post_rq(&mut rq, 1 << p.rq_log_wqes);
        assert!(self.modify_rq(rq.rqn, 0, 1).ok());
        let tir = self.create_tir(rq.rqn);
        let table = self.create_flow_table(4);
        let group = self.create_flow_group(table, 0, 15);
        let mac = self.nic.mac();
        let fte = self.fte_input(table, group, 0, mac, UDP_PORT, tir);
        self.ok(&fte, 0x10);
        self.set_root(table);
        Path {
            tx_cq,
            tis,
            sq,
            rx_cq,
            rq,
            tir,
            table,
            group,
            qcounter,
        }
    }

    /// Reverse of `build_path`.
    pub fn destroy_path(&mut self, p: Path) {
        let del = input::<DeleteFteIn>(Opcode::DeleteFlowTableEntry, 0, 0, |v| {
            v.set(DeleteFteIn::TABLE_ID, u64::from(p.table))
                .set(DeleteFteIn::FLOW_INDEX, 0);
        });
        self.ok(&del, 0x10);
        // The root table is destroyed while it is the root (Linux does so);
        // op_mod 1 needs the reset_root_to_default cap.
        let dg = input::<DestroyFlowGroupIn>(Opcode::DestroyFlowGroup, 0, 0, |v| {
            v.set(DestroyFlowGroupIn::TABLE_ID, u64::from(p.table))
                .set(DestroyFlowGroupIn::GROUP_ID, u64::from(p.group));
        });
        self.ok(&dg, 0x10);
        let dt = input::<DestroyFlowTableIn>(Opcode::DestroyFlowTable, 0, 0, |v| {
            v.set(DestroyFlowTableIn::TABLE_ID, u64::from(p.table));
        });
        self.ok(&dt, 0x10);
        self.ok(&simple(Opcode::DestroyTir, 0, p.tir), 0x10);
        self.ok(&simple(Opcode::DestroyRq, 0, p.rq.rqn), 0x10);
        self.ok(&simple(Opcode::DestroySq, 0, p.sq.sqn), 0x10);
        self.ok(&simple(Opcode::DestroyTis, 0, p.tis), 0x10);
        self.ok(&simple(Opcode::DestroyCq, 0, p.rx_cq.cqn), 0x10);
        self.ok(&simple(Opcode::DestroyCq, 0, p.tx_cq.cqn), 0x10);
        let mut dq = simple(Opcode::DeallocQCounter, 0, 0);
        dq[8..12].copy_from_slice(&p.qcounter.to_be_bytes());
        self.ok(&dq, 0x10);
    }

    /// §8 step 8 after the datapath is gone: mkey, PD, TD, UARs, EQ,
    /// TEARDOWN_HCA, take every page back, DISABLE_HCA.
    pub fn teardown(&mut self) {
        self.ok(&simple(Opcode::DestroyMkey, 0, self.lkey >> 8), 0x10);
        self.ok(&simple(Opcode::DeallocPd, 0, self.pd), 0x10);
        self.ok(&simple(Opcode::DeallocTransportDomain, 0, self.td), 0x10);
        self.ok(&simple(Opcode::DeallocUar, 0, self.uar_tx), 0x10);
        if let Some(eq) = self.eq.take() {
            self.ok(&simple(Opcode::DestroyEq, 0, eq.eqn), 0x10);
        }
        self.hw.disable_msix().unwrap();
        if self.nic.objects().l2_entries > 0 {
            let inp = input::<DeleteL2TableEntryIn>(Opcode::DeleteL2TableEntry, 0, 0, |v| {
                v.set(DeleteL2TableEntryIn::TABLE_INDEX, 0);
            });
            self.ok(&inp, 0x10);
        }
        self.ok(&simple(Opcode::DeallocUar, 0, self.uar_eq), 0x10);
        self.ok(&simple(Opcode::TeardownHca, 0, 0), 0x10);
        // Firmware releases its pages a little after TEARDOWN_HCA
        // (`NicConfig::page_release_delay`): ask until all are back.
        let mut idle = 0;
        while !self.fw_given.is_empty() && idle < 1000 {
            if self.take_pages(512, 0) == 0 {
                self.hw.wait(Duration::from_millis(1));
                idle += 1;
            } else {
                idle = 0;
            }
        }
        self.ok(&simple(Opcode::DisableHca, 0, 0), 0x10);
    }

    // ------------------------------------------------------------------ TX

    /// Writes a SEND WQE at the producer index: optional inline header,
    /// then pointer segments. Returns its WQEBB count.
    pub fn post_send(
        &self,
        sq: &mut Sq,
        inline: &[u8],
        segs: &[(u64, u32)],
        signaled: bool,
    ) -> u16 {
        let ds = 1 + (14 + inline.len()).div_ceil(16).max(1) + segs.len();
        let wqebbs = (ds * 16).div_ceil(64);
        let mut w = vec![0u8; wqebbs * 64];
        let idx = sq.pi;
        w[0..4].copy_from_slice(&((u32::from(idx) << 8) | 0x0a).to_be_bytes());
        w[4..8].copy_from_slice(&((sq.sqn << 8) | ds as u32).to_be_bytes());
        w[0x0b] = if signaled { 0x08 } else { 0 };
        w[0x1c..0x1e].copy_from_slice(&(inline.len() as u16).to_be_bytes());
        w[0x1e..0x1e + inline.len()].copy_from_slice(inline);
        let mut at = 16 + (14 + inline.len()).div_ceil(16).max(1) * 16;
        for &(addr, len) in segs {
            w[at..at + 4].copy_from_slice(&len.to_be_bytes());
            w[at + 4..at + 8].copy_from_slice(&self.lkey.to_be_bytes());
            w[at + 8..at + 16].copy_from_slice(&addr.to_be_bytes());
            at += 16;
        }
        self.write_wqe(sq, &w);
        wqebbs as u16
    }

    /// Writes raw WQE bytes (whole WQEBBs) at the producer index, wrapping.
    pub fn write_wqe(&self, sq: &mut Sq, w: &[u8]) {
        let n = 1u16 << sq.log_wqebbs;
        for (i, bb) in w.chunks(64).enumerate() {
            let slot = sq.pi.wrapping_add(i as u16) & (n - 1);
            sq.mem.write(usize::from(slot) * 64, bb);
        }
        sq.last = sq.pi;
        sq.pi = sq.pi.wrapping_add((w.len() / 64) as u16);
    }

    /// Doorbell record then one 8-byte doorbell of the last WQE's control
    /// segment (alternating bfreg halves).
    pub fn ring_sq(&self, sq: &mut Sq) {
        self.dbrs
            .store_be32_release(sq.dbr_off + 4, u32::from(sq.pi));
        let n = 1u16 << sq.log_wqebbs;
        let last = usize::from(sq.last & (n - 1)) * 64;
        let ctrl = sq.mem.read_vec(last, 8);
        let v = u64::from_be_bytes(ctrl.try_into().unwrap());
        let off = sq.uar as usize * 4096 + 0x800 + 2 * 512 + sq.bf_half;
        sq.bf_half ^= 256;
        self.hw.write64(off, v);
    }

    /// BlueFlame: doorbell record, then the whole last WQE into the bfreg.
    pub fn ring_sq_bf(&self, sq: &mut Sq, wqebbs: usize) {
        self.dbrs
            .store_be32_release(sq.dbr_off + 4, u32::from(sq.pi));
        let n = 1u16 << sq.log_wqebbs;
        let mut data = Vec::new();
        for i in 0..wqebbs {
            let slot = sq.last.wrapping_add(i as u16) & (n - 1);
            data.extend(sq.mem.read_vec(usize::from(slot) * 64, 64));
        }
        let off = sq.uar as usize * 4096 + 0x800 + 2 * 512 + sq.bf_half;
        sq.bf_half ^= 256;
        self.hw.write_bf(off, &data);
    }

    /// Next CQE of a normal CQ (owner-bit protocol), updating the doorbell
    /// record.
    pub fn poll_cq(&self, cq: &mut Cq) -> Option<Cqe> {
        let n = 1u32 << cq.log_size;
        let off = ((cq.ci & (n - 1)) * 64) as usize;
        let op_own = cq.mem.load_u8_acquire(off + 63);
        if op_own >> 4 == 0xf || u32::from(op_own & 1) != (cq.ci >> cq.log_size) & 1 {
            return None;
        }
        let mut b = [0u8; 64];
        cq.mem.read(off, &mut b);
        cq.ci += 1;
        self.dbrs.store_be32_release(cq.dbr_off, cq.ci & 0xff_ffff);
        Some(Cqe::decode(&b))
    }

    /// eRPC's overrun-CQ snapshot of CQE `idx`: (wqe_id, wqe_counter).
    pub fn snapshot(cq: &Cq, idx: usize) -> (u16, u16) {
        loop {
            let id1 = cq.mem.load_be16_acquire(idx * 64 + 2);
            let ctr = cq.mem.load_be16_acquire(idx * 64 + 0x3c);
            mlx5::barrier::full();
            let id2 = cq.mem.load_be16_acquire(idx * 64 + 2);
            if id1 == id2 {
                return (id1, ctr);
            }
        }
    }
}

/// A frame for `dst` on the standard port.
pub fn frame_to(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    mlx5_sim::packet::udp_frame(dst, src, IP_B, IP_A, 12345, UDP_PORT, payload)
}

/// Reads the CQE at ring slot `i`.
pub fn cqe_at(cq: &Cq, i: usize) -> Cqe {
    let mut b = [0u8; 64];
    cq.mem.read(i * 64, &mut b);
    Cqe::decode(&b)
}

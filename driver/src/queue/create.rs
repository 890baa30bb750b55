//! Creating a queue set: its objects in the order the device needs them
//! (UAR, TX CQ, TIS, SQ, RX CQ, Q counter, striding RQ, TIR, flow rule).

use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::{Device, DeviceInfo, InlineMode, Inner, input, out_len};
use crate::dma::{DmaMem, PAGE};
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::cmd::*;
use crate::prm::codes::{Opcode, QueueState, flow, inline_mode, wq_type};
use crate::prm::cqe::CQE_OP_OWN_INVALID;
use crate::prm::ctx::*;
use crate::prm::wqe::{self, MprqWqe, SEND_WQE_BB};
use crate::prm::{Layout, View, ViewMut, uar};

use super::{
    CQE_BYTES, CompQueue, DBR_RQ, DBR_RX_CQ, DBR_SQ, DBR_TX_CQ, MAX_WQEBBS, OP_OWN, QObj,
    QueueConfig, QueueSet, QueueStats, RecvQueue, RxCq, RxCqeFlags, RxWqeIdMode, SendQueue,
    WQE_COUNTER, WQE_ID,
};

impl<B: HwBackend> Device<B> {
    /// Creates a queue set steered to `cfg.udp_port`.
    pub fn create_queue_set(&self, cfg: QueueConfig) -> Result<QueueSet<B>, Error> {
        QueueSet::create(self.inner.clone(), cfg)
    }
}

impl<B: HwBackend> QueueSet<B> {
    fn create(dev: Arc<Inner<B>>, cfg: QueueConfig) -> Result<QueueSet<B>, Error> {
        let info = &dev.info;
        cfg.validate(dev.as_ref())?;
        let sq_wqebbs = 1u32 << cfg.sq_log_wqebbs;
        let inline = info.inline_mode == InlineMode::L2;
        // Two signaled batches of the largest WQEs must fit the ring: with
        // the 18-byte inline header a two-gather WQE takes 2 WQEBBs, else 1.
        let max_wqebbs = if inline { MAX_WQEBBS } else { 1 };
        let batch = cfg
            .unsignaled_batch
            .min(sq_wqebbs / (2 * max_wqebbs))
            .max(1);
        assert!(
            2 * batch * max_wqebbs <= sq_wqebbs,
            "validate keeps the SQ large enough"
        );

        let dbr = dev.alloc(PAGE)?;
        let mut qs = QueueSet {
            cfg,
            uar: 0,
            dbr,
            sq: SendQueue {
                ring: dev.alloc(sq_wqebbs as usize * SEND_WQE_BB)?,
                sqn: 0,
                mask: sq_wqebbs - 1,
                pi: 0,
                ci: 0,
                since_signal: 0,
                batch,
                signaled: None,
                bf_offset: 0,
                bf_half: info.bf_reg_size / 2,
                bf_toggle: 0,
                error: None,
            },
            tx_cq: CompQueue {
                ring: dev.alloc(sq_wqebbs as usize * CQE_BYTES)?,
                cqn: 0,
                log: cfg.sq_log_wqebbs as u32,
                ci: 0,
                last: None,
            },
            rq: RecvQueue {
                wqes: dev.alloc((1usize << cfg.rq_log_wqes) * MprqWqe::BYTES)?,
                data: Arc::new(dev.alloc(cfg.rx_ring_entries() << cfg.rq_log_stride_bytes)?),
                rqn: 0,
                log_wqes: cfg.rq_log_wqes as u32,
                log_strides: cfg.rq_log_strides as u32,
                stride: 1 << cfg.rq_log_stride_bytes,
                head: 0,
                to_post: 0,
                reported: 0,
                recv_head: 0,
            },
            rx_cq: RxCq {
                ring: dev.alloc((1usize << cfg.rx_cq_log_size) * CQE_BYTES)?,
                cqn: 0,
                entries: 1 << cfg.rx_cq_log_size,
                idx: 0,
                prev: 0,
                cycle: 65536u32 << cfg.rq_log_strides,
                mode: RxWqeIdMode::Undetermined,
                last_raw: 0,
                flags: vec![RxCqeFlags::UNKNOWN; cfg.rx_ring_entries()].into_boxed_slice(),
            },
            tisn: 0,
            tirn: 0,
            counter_set_id: 0,
            flow_index: 0,
            inline,
            lkey: info.lkey,
            stats: QueueStats::default(),
            created: Vec::new(),
            control_countdown: cfg.control_interval.max(1),
            inspect: None,
            _not_sync: PhantomData,
            dev,
        };
        match qs.build() {
            Ok(()) => {
                if let Some(i) = qs.dev.inspect.as_ref() {
                    qs.inspect = Some(i.add_queue_set(cfg.udp_port, qs.inspect_ids()));
                }
                Ok(qs)
            }
            Err(e) => {
                if let Err(t) = qs.destroy() {
                    tracing::error!(error = %t, "cleanup after failed queue-set creation also failed");
                }
                Err(e)
            }
        }
    }

    /// Runs a command on the device.
    fn exec(&self, inp: &[u8], out: usize) -> Result<Vec<u8>, Error> {
        self.dev.exec(inp, out)
    }

    /// Creates the queue set's objects, each after those it names (facts
    /// sheet §8 steps 4 to 6): the UAR, the TX side (CQ, TIS, SQ, which goes
    /// to ready), the RX side (CQ, Q counter, striding RQ with its WQEs
    /// posted, which goes to ready, TIR), then the flow rule that steers
    /// our UDP port to it. Each object is recorded in `created` as soon as
    /// it exists, so that a failure tears down exactly those.
    fn build(&mut self) -> Result<(), Error> {
        let info = self.dev.info.clone();
        self.alloc_uar()?;
        self.create_tx_cq()?;
        self.create_tis(&info)?;
        self.create_sq(&info)?;
        self.modify_sq(QueueState::Rst, QueueState::Rdy)?;
        self.create_rx_cq()?;
        self.alloc_q_counter(&info)?;
        self.create_rq(&info)?;
        self.post_all_rq_wqes();
        self.modify_rq(QueueState::Rst, QueueState::Rdy)?;
        self.create_tir(&info)?;
        self.add_flow_rule(&info)
    }

    /// ALLOC_UAR: the page this queue set's doorbells (and BlueFlame
    /// register) live in.
    fn alloc_uar(&mut self) -> Result<(), Error> {
        let out = self.exec(
            &input::<MboxIn>(Opcode::AllocUar, 0, 0),
            out_len::<AllocUarOut>(0),
        )?;
        self.uar = View::<AllocUarOut>::new(&out)
            .expect("sized")
            .get32(AllocUarOut::UAR);
        self.created.push(QObj::Uar(self.uar));
        self.sq.bf_offset = self.uar as usize * uar::UAR_PAGE_BYTES + uar::BF_OFFSET;
        Ok(())
    }

    /// CREATE_CQ of the TX CQ, every CQE first made invalid and owned by
    /// hardware.
    fn create_tx_cq(&mut self) -> Result<(), Error> {
        for i in 0..(1usize << self.tx_cq.log) {
            self.tx_cq
                .ring
                .write_u8(i * CQE_BYTES + OP_OWN, CQE_OP_OWN_INVALID);
        }
        self.tx_cq.cqn = self.create_cq(&self.tx_cq.ring, self.tx_cq.log, false, DBR_TX_CQ)?;
        self.created.push(QObj::Cq(self.tx_cq.cqn));
        Ok(())
    }

    /// CREATE_TIS in the device's transport domain.
    fn create_tis(&mut self, info: &DeviceInfo) -> Result<(), Error> {
        let mut inp = input::<CreateTisIn>(Opcode::CreateTis, 0, 0);
        ViewMut::<CreateTisIn>::new(&mut inp)
            .expect("sized")
            .sub(CreateTisIn::CTX)
            .set(Tisc::TRANSPORT_DOMAIN, info.td as u64);
        let out = self.exec(&inp, out_len::<CreateTisOut>(0))?;
        self.tisn = View::<CreateTisOut>::new(&out)
            .expect("sized")
            .get32(CreateTisOut::TISN);
        self.created.push(QObj::Tis(self.tisn));
        Ok(())
    }

    /// CREATE_SQ: cyclic, 64-byte WQEBBs, in reset, reporting to the TX CQ.
    fn create_sq(&mut self, info: &DeviceInfo) -> Result<(), Error> {
        let pages = self.sq.ring.len() / PAGE;
        let mut inp = input::<CreateSqIn>(Opcode::CreateSq, 0, pages.max(1) * 8);
        {
            let mut v = ViewMut::<CreateSqIn>::new(&mut inp).expect("sized");
            let mut c = v.sub(CreateSqIn::CTX);
            // The SQ's inline field counts only when the requirement lives
            // in the vport context (Linux and DPDK set it only then).
            let min_inline = if info.wqe_inline_mode_cap == inline_mode::VPORT_CONTEXT {
                u64::from(self.inline)
            } else {
                0
            };
            c.set(Sqc::FLUSH_IN_ERROR_EN, 1)
                .set(Sqc::MIN_WQE_INLINE_MODE, min_inline)
                .set(Sqc::TS_FORMAT, u64::from(info.sq_ts_format))
                .set(Sqc::STATE, QueueState::Rst as u64)
                .set(Sqc::CQN, self.tx_cq.cqn as u64)
                .set(Sqc::TIS_LST_SZ, 1)
                .set(Sqc::TIS_NUM_0, self.tisn as u64);
            let mut w = c.sub(Sqc::WQ);
            w.set(Wq::WQ_TYPE, wq_type::CYCLIC as u64)
                .set(Wq::PD, info.pd as u64)
                .set(Wq::UAR_PAGE, self.uar as u64)
                .set(Wq::DBR_ADDR, self.dbr.iova_at(DBR_SQ))
                .set(Wq::LOG_WQ_STRIDE, wqe::SEND_WQE_SHIFT as u64)
                .set(Wq::LOG_WQ_PG_SZ, 0)
                .set(Wq::LOG_WQ_SZ, self.cfg.sq_log_wqebbs as u64);
            for p in 0..pages.max(1) {
                assert!(w.set_flex(Wq::PAS, p as u32, self.sq.ring.iova_at(p * PAGE)));
            }
        }
        let out = self.exec(&inp, out_len::<CreateSqOut>(0))?;
        self.sq.sqn = View::<CreateSqOut>::new(&out)
            .expect("sized")
            .get32(CreateSqOut::SQN);
        self.created.push(QObj::Sq(self.sq.sqn));
        Ok(())
    }

    /// CREATE_CQ of the RX CQ: overrun ignored, its CQEs pre-filled so
    /// that the first packet counts as one (facts sheet §6.6).
    fn create_rx_cq(&mut self) -> Result<(), Error> {
        let strides = 1u32 << self.rq.log_strides;
        let n = self.rx_cq.entries;
        for i in 0..n {
            let off = i * CQE_BYTES;
            self.rx_cq.ring.write_u8(off + OP_OWN, CQE_OP_OWN_INVALID);
            self.rx_cq.ring.write_u8(off + WQE_ID, 0xff);
            self.rx_cq.ring.write_u8(off + WQE_ID + 1, 0xff);
            let ctr = (strides - (n - i) as u32) as u16;
            self.rx_cq
                .ring
                .write_u8(off + WQE_COUNTER, (ctr >> 8) as u8);
            self.rx_cq.ring.write_u8(off + WQE_COUNTER + 1, ctr as u8);
        }
        self.rx_cq.prev = self.rx_snapshot(n - 1);
        let (id, ctr) = self.rx_snapshot_raw(n - 1);
        self.rx_cq.last_raw = (u32::from(id) << 16) | u32::from(ctr);
        self.rx_cq.cqn = self.create_cq(
            &self.rx_cq.ring,
            self.cfg.rx_cq_log_size as u32,
            true,
            DBR_RX_CQ,
        )?;
        self.created.push(QObj::Cq(self.rx_cq.cqn));
        Ok(())
    }

    /// ALLOC_Q_COUNTER (out-of-buffer drops), if the function has one to
    /// spare: VFs get few (`max_qp_cnt`), and the RQ works without one
    /// (Linux mlx5e carries on when ALLOC_Q_COUNTER fails).
    fn alloc_q_counter(&mut self, info: &DeviceInfo) -> Result<(), Error> {
        self.counter_set_id = 0;
        if info.max_q_counters > 0 {
            match self.exec(
                &input::<MboxIn>(Opcode::AllocQCounter, 0, 0),
                out_len::<AllocQCounterOut>(0),
            ) {
                Ok(out) => {
                    self.counter_set_id = View::<AllocQCounterOut>::new(&out)
                        .expect("sized")
                        .get32(AllocQCounterOut::COUNTER_SET_ID);
                    self.created.push(QObj::QCounter(self.counter_set_id));
                }
                Err(e @ Error::Command { .. }) => {
                    tracing::warn!(device = %info.name, udp_port = self.cfg.udp_port, error = %e, "no Q counter for this queue set; out-of-buffer drops are not counted");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// CREATE_RQ: cyclic striding, in reset, reporting to the RX CQ and
    /// counted by the Q counter.
    fn create_rq(&mut self, info: &DeviceInfo) -> Result<(), Error> {
        let log_num_strides =
            wqe::encode_log_num_strides(self.rq.log_strides, info.ext_stride_num_range)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "2^{} strides per WQE not supported",
                        self.rq.log_strides
                    ))
                })?;
        let pages = self.rq.wqes.len() / PAGE;
        let mut inp = input::<CreateRqIn>(Opcode::CreateRq, 0, pages * 8);
        {
            let mut v = ViewMut::<CreateRqIn>::new(&mut inp).expect("sized");
            let mut c = v.sub(CreateRqIn::CTX);
            c.set(Rqc::VSD, 1)
                .set(Rqc::TS_FORMAT, u64::from(info.rq_ts_format))
                .set(Rqc::MEM_RQ_TYPE, 0)
                .set(Rqc::STATE, QueueState::Rst as u64)
                .set(Rqc::FLUSH_IN_ERROR_EN, 1)
                .set(Rqc::CQN, self.rx_cq.cqn as u64)
                .set(Rqc::COUNTER_SET_ID, self.counter_set_id as u64);
            let mut w = c.sub(Rqc::WQ);
            w.set(Wq::WQ_TYPE, wq_type::CYCLIC_STRIDING as u64)
                .set(Wq::PD, info.pd as u64)
                .set(Wq::DBR_ADDR, self.dbr.iova_at(DBR_RQ))
                .set(Wq::LOG_WQ_STRIDE, wqe::MPRQ_WQE_SHIFT as u64)
                .set(Wq::LOG_WQ_PG_SZ, 0)
                .set(Wq::LOG_WQ_SZ, self.rq.log_wqes as u64)
                .set(Wq::LOG_WQE_NUM_OF_STRIDES, log_num_strides as u64)
                .set(Wq::TWO_BYTE_SHIFT_EN, 0)
                .set(
                    Wq::LOG_WQE_STRIDE_SIZE,
                    (self.cfg.rq_log_stride_bytes as u32 - wqe::MPWQE_LOG_STRIDE_SZ_BASE) as u64,
                );
            for p in 0..pages {
                assert!(w.set_flex(Wq::PAS, p as u32, self.rq.wqes.iova_at(p * PAGE)));
            }
        }
        let out = self.exec(&inp, out_len::<CreateRqOut>(0))?;
        self.rq.rqn = View::<CreateRqOut>::new(&out)
            .expect("sized")
            .get32(CreateRqOut::RQN);
        self.created.push(QObj::Rq(self.rq.rqn));
        Ok(())
    }

    /// Posts the RQ's WQEs. Until the wqe_id reading is known, one WQE stays
    /// unposted (see `rx_burst`); it is owed, and posted once the reading
    /// is known to be free running.
    fn post_all_rq_wqes(&mut self) {
        let per_wqe = 1usize << self.rq.log_strides;
        self.rq.to_post = (1usize << self.rq.log_wqes) * per_wqe;
        self.repost();
        assert_eq!(self.rq.to_post, per_wqe, "one WQE owed");
        assert_eq!(self.rq.head, (1 << self.rq.log_wqes) - 1);
    }

    /// CREATE_TIR: direct, to the RQ, in the device's transport domain.
    fn create_tir(&mut self, info: &DeviceInfo) -> Result<(), Error> {
        let mut inp = input::<CreateTirIn>(Opcode::CreateTir, 0, 0);
        ViewMut::<CreateTirIn>::new(&mut inp)
            .expect("sized")
            .sub(CreateTirIn::CTX)
            .set(Tirc::DISP_TYPE, 0)
            .set(Tirc::INLINE_RQN, self.rq.rqn as u64)
            .set(Tirc::TRANSPORT_DOMAIN, info.td as u64);
        let out = self.exec(&inp, out_len::<CreateTirOut>(0))?;
        self.tirn = View::<CreateTirOut>::new(&out)
            .expect("sized")
            .get32(CreateTirOut::TIRN);
        self.created.push(QObj::Tir(self.tirn));
        Ok(())
    }

    /// SET_FLOW_TABLE_ENTRY in the device's NIC RX table: frames to our MAC,
    /// IPv4, UDP, our port go to the TIR. Refused if another queue set has
    /// the port, or the table is full.
    fn add_flow_rule(&mut self, info: &DeviceInfo) -> Result<(), Error> {
        let port = self.cfg.udp_port;
        let mut ctl = self.dev.lock();
        let flow = ctl
            .flow
            .as_mut()
            .ok_or_else(|| Error::Config("device has no flow table".into()))?;
        if flow.ports.contains(&Some(port)) {
            return Err(Error::Config(format!(
                "UDP port {port} is already steered to another queue set on {}",
                info.name
            )));
        }
        let index = flow
            .ports
            .iter()
            .position(Option::is_none)
            .ok_or(Error::Exhausted {
                device: info.name.clone(),
                what: "NIC RX flow table entries",
                limit: flow.ports.len(),
            })?;
        let (table_id, group_id) = (flow.table_id, flow.group_id);
        let mut inp = input::<SetFteIn>(Opcode::SetFlowTableEntry, 0, DestFormatStruct::BYTES);
        {
            let mut v = ViewMut::<SetFteIn>::new(&mut inp).expect("sized");
            v.set(SetFteIn::TABLE_TYPE, flow::TABLE_TYPE_NIC_RX as u64)
                .set(SetFteIn::TABLE_ID, table_id as u64)
                .set(SetFteIn::FLOW_INDEX, index as u64);
            let mut fc = v.sub(SetFteIn::FLOW_CONTEXT);
            fc.set(FlowContext::GROUP_ID, group_id as u64)
                .set(FlowContext::ACTION, flow::ACTION_FWD_DEST as u64)
                .set(FlowContext::DESTINATION_LIST_SIZE, 1);
            let dest = (u64::from(flow::DEST_TIR) << 56) | (u64::from(self.tirn) << 32);
            assert!(fc.set_flex(FlowContext::DESTINATION, 0, dest));
            let mut mv = fc.sub(FlowContext::MATCH_VALUE);
            let mut o = mv.sub(FteMatchParam::OUTER_HEADERS);
            let m = info.mac;
            o.set(
                FteMatchSetLyr24::DMAC_47_16,
                u32::from_be_bytes([m[0], m[1], m[2], m[3]]) as u64,
            )
            .set(
                FteMatchSetLyr24::DMAC_15_0,
                u16::from_be_bytes([m[4], m[5]]) as u64,
            )
            .set(FteMatchSetLyr24::ETHERTYPE, 0x0800)
            .set(FteMatchSetLyr24::IP_PROTOCOL, 17)
            .set(FteMatchSetLyr24::UDP_DPORT, port as u64);
        }
        let inner = &self.dev;
        ctl.exec(&inner.bar, &inner.pool, &inp, 16)?;
        ctl.flow.as_mut().expect("checked").ports[index] = Some(port);
        self.flow_index = index as u32;
        self.created.push(QObj::Fte(index as u32));
        Ok(())
    }

    /// CREATE_CQ of `2^log` 64-byte CQEs in `ring`, on this queue set's UAR,
    /// reporting to the device's EQ, its doorbell record at `dbr_off`.
    fn create_cq(
        &self,
        ring: &DmaMem,
        log: u32,
        overrun_ignore: bool,
        dbr_off: usize,
    ) -> Result<u32, Error> {
        let pages = ring.len() / PAGE;
        let mut inp = input::<CreateCqIn>(Opcode::CreateCq, 0, pages * 8);
        {
            let mut v = ViewMut::<CreateCqIn>::new(&mut inp).expect("sized");
            for p in 0..pages {
                assert!(v.set_flex(CreateCqIn::PAS, p as u32, ring.iova_at(p * PAGE)));
            }
            let mut c = v.sub(CreateCqIn::CQC);
            c.set(Cqc::CQE_SZ, 0)
                .set(Cqc::OI, u64::from(overrun_ignore))
                .set(Cqc::CQE_COMP_EN, 0)
                .set(Cqc::LOG_CQ_SIZE, log as u64)
                .set(Cqc::UAR_PAGE, self.uar as u64)
                .set(Cqc::C_EQN, self.dev.info.eqn as u64)
                .set(Cqc::LOG_PAGE_SIZE, 0)
                .set(Cqc::DBR_ADDR, self.dbr.iova_at(dbr_off));
        }
        let out = self.exec(&inp, out_len::<CreateCqOut>(0))?;
        Ok(View::<CreateCqOut>::new(&out)
            .expect("sized")
            .get32(CreateCqOut::CQN))
    }

    /// MODIFY_SQ from state `from` to `to`.
    pub(super) fn modify_sq(&self, from: QueueState, to: QueueState) -> Result<(), Error> {
        let mut inp = input::<ModifySqIn>(Opcode::ModifySq, 0, 0);
        let mut v = ViewMut::<ModifySqIn>::new(&mut inp).expect("sized");
        v.set(ModifySqIn::SQ_STATE, from as u64)
            .set(ModifySqIn::SQN, self.sq.sqn as u64);
        v.sub(ModifySqIn::CTX).set(Sqc::STATE, to as u64);
        self.exec(&inp, 16).map(|_| ())
    }

    /// MODIFY_RQ from state `from` to `to`.
    fn modify_rq(&self, from: QueueState, to: QueueState) -> Result<(), Error> {
        let mut inp = input::<ModifyRqIn>(Opcode::ModifyRq, 0, 0);
        let mut v = ViewMut::<ModifyRqIn>::new(&mut inp).expect("sized");
        v.set(ModifyRqIn::RQ_STATE, from as u64)
            .set(ModifyRqIn::RQN, self.rq.rqn as u64);
        v.sub(ModifyRqIn::CTX).set(Rqc::STATE, to as u64);
        self.exec(&inp, 16).map(|_| ())
    }
}

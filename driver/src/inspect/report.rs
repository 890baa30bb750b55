//! What the endpoint's thread reads from a device: its report, the event
//! queue, and the firmware's view of a queue set (QUERY_* commands).

use std::collections::BTreeMap;

use crate::device::{Device, InlineMode, Inner, input, out_len};
use crate::error::Error;
use crate::hw::{HwBackend, mlx5_device_name};
use crate::prm::cmd::*;
use crate::prm::codes::{EventType, Opcode};
use crate::prm::ctx::*;
use crate::prm::{View, ViewMut};
use crate::queue::HwQueueState;

use super::compare::compare_eq;
use super::{
    CapsView, CommandsView, CqErrorView, DeviceReport, EqView, HealthView, PagesView, QueueIds,
    SharedObjects,
};

pub(super) fn mac_string(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The report of a brought-up device (takes the control lock briefly and
/// reads the health registers; runs no command).
pub fn report<B: HwBackend>(dev: &Device<B>) -> DeviceReport {
    let i = dev.info();
    let (major, minor, sub) = i.fw_version;
    let (firmware_pages, cmd) = (dev.firmware_pages(), dev.command_stats());
    let pool = dev.dma_stats();
    DeviceReport {
        name: i.name.clone(),
        pci_device_id: i.pci_device_id,
        model: mlx5_device_name(i.pci_device_id).map(str::to_string),
        is_vf: i.is_vf,
        fw_version: format!("{major}.{minor}.{sub}"),
        mac: mac_string(i.mac),
        port_state: match i.vport_state {
            0 => "down".into(),
            1 => "up".into(),
            s => format!("state {s}"),
        },
        caps: CapsView {
            inline_mode: match i.inline_mode {
                InlineMode::None => "none",
                InlineMode::L2 => "l2",
                InlineMode::Ip => "ip",
                InlineMode::L4 => "l4",
            }
            .into(),
            wqe_inline_mode_cap: i.wqe_inline_mode_cap,
            bf_reg_size: i.bf_reg_size,
            log_max_wq_sz: i.log_max_wq_sz,
            log_max_cq_sz: i.log_max_cq_sz,
            ext_stride_num_range: i.ext_stride_num_range,
            cqe_version: i.cqe_version,
            sq_ts_format: i.sq_ts_format,
            rq_ts_format: i.rq_ts_format,
            reset_root_to_default: i.reset_root_to_default,
        },
        objects: SharedObjects {
            pd: i.pd,
            td: i.td,
            lkey: i.lkey,
            eqn: i.eqn,
        },
        pages: PagesView {
            firmware_pages,
            dma_regions: pool.regions,
            dma_pages_total: pool.pages_total,
            dma_pages_in_use: pool.pages_in_use,
        },
        health: HealthView::new(&dev.read_health()),
        commands: CommandsView {
            sent: cmd.sent,
            failed: cmd.failed,
            busy_polls: cmd.busy_polls,
        },
    }
}

/// QUERY_SQ, QUERY_RQ, QUERY_CQ (both) and QUERY_Q_COUNTER for the queue
/// set with these object numbers. Commands: never on the datapath.
pub(crate) fn query_objects<B: HwBackend>(
    inner: &Inner<B>,
    ids: &QueueIds,
) -> Result<HwQueueState, Error> {
    let mut inp = input::<QuerySqIn>(Opcode::QuerySq, 0, 0);
    ViewMut::<QuerySqIn>::new(&mut inp)
        .expect("sized")
        .set(QuerySqIn::SQN, u64::from(ids.sqn));
    let out = inner.exec(&inp, out_len::<QuerySqOut>(0))?;
    let sq = View::<QuerySqOut>::new(&out)
        .expect("sized")
        .sub(QuerySqOut::SQ_CONTEXT);
    let mut inp = input::<QueryRqIn>(Opcode::QueryRq, 0, 0);
    ViewMut::<QueryRqIn>::new(&mut inp)
        .expect("sized")
        .set(QueryRqIn::RQN, u64::from(ids.rqn));
    let out_rq = inner.exec(&inp, out_len::<QueryRqOut>(0))?;
    let rq = View::<QueryRqOut>::new(&out_rq)
        .expect("sized")
        .sub(QueryRqOut::RQ_CONTEXT);
    let cq = |cqn: u32| -> Result<(u32, u32, u8), Error> {
        let mut inp = input::<QueryCqIn>(Opcode::QueryCq, 0, 0);
        ViewMut::<QueryCqIn>::new(&mut inp)
            .expect("sized")
            .set(QueryCqIn::CQN, u64::from(cqn));
        let out = inner.exec(&inp, out_len::<QueryCqOut>(0))?;
        let c = View::<QueryCqOut>::new(&out)
            .expect("sized")
            .sub(QueryCqOut::CQC);
        Ok((
            c.get32(Cqc::CONSUMER_COUNTER),
            c.get32(Cqc::PRODUCER_COUNTER),
            c.get32(Cqc::STATUS) as u8,
        ))
    };
    let (tx_cq, rx_cq) = (cq(ids.tx_cqn)?, cq(ids.rx_cqn)?);
    // Counter set 0: the queue set has no Q counter (none to spare).
    let out_of_buffer = if ids.counter_set_id == 0 {
        0
    } else {
        let mut inp = input::<QueryQCounterIn>(Opcode::QueryQCounter, 0, 0);
        ViewMut::<QueryQCounterIn>::new(&mut inp)
            .expect("sized")
            .set(
                QueryQCounterIn::COUNTER_SET_ID,
                u64::from(ids.counter_set_id),
            );
        let out_q = inner.exec(&inp, out_len::<QueryQCounterOut>(0))?;
        View::<QueryQCounterOut>::new(&out_q)
            .expect("sized")
            .get32(QueryQCounterOut::OUT_OF_BUFFER)
    };
    Ok(HwQueueState {
        sq_state: sq.get32(Sqc::STATE) as u8,
        sq_hw_counter: sq.sub(Sqc::WQ).get32(Wq::HW_COUNTER),
        sq_sw_counter: sq.sub(Sqc::WQ).get32(Wq::SW_COUNTER),
        sq_min_wqe_inline_mode: sq.get32(Sqc::MIN_WQE_INLINE_MODE) as u8,
        sq_ts_format: sq.get32(Sqc::TS_FORMAT) as u8,
        rq_ts_format: rq.get32(Rqc::TS_FORMAT) as u8,
        rq_state: rq.get32(Rqc::STATE) as u8,
        rq_hw_counter: rq.sub(Rqc::WQ).get32(Wq::HW_COUNTER),
        rq_sw_counter: rq.sub(Rqc::WQ).get32(Wq::SW_COUNTER),
        tx_cq,
        rx_cq,
        out_of_buffer,
    })
}

pub(super) fn eq_view<B: HwBackend>(dev: &Device<B>) -> (Option<EqView>, Vec<CqErrorView>) {
    let (eq, cq_errors) = {
        let ctl = dev.inner.lock();
        let eq = ctl.eq.as_ref().map(|e| {
            let mut events = BTreeMap::new();
            for (t, &n) in e.counts.iter().enumerate() {
                if n > 0 {
                    let name = EventType::from_raw(t as u8)
                        .map_or_else(|| format!("type 0x{t:02x}"), |e| e.name().to_string());
                    events.insert(name, n);
                }
            }
            EqView {
                eqn: e.eqn,
                uar: e.uar,
                ci: e.ci(),
                events,
                last_event: e.last.map(|l| l.to_string()),
                firmware: None,
                firmware_error: None,
                compare: Vec::new(),
            }
        });
        let errs = ctl
            .cq_errors
            .iter()
            .map(|&(cqn, syndrome)| CqErrorView { cqn, syndrome })
            .collect::<Vec<_>>();
        (eq, errs)
    };
    let eq = eq.map(|mut v| {
        match dev.query_eq() {
            Ok(fw) => {
                v.compare = compare_eq(v.ci, fw);
                v.firmware = Some(fw);
            }
            Err(e) => v.firmware_error = Some(e.to_string()),
        }
        v
    });
    (eq, cq_errors)
}

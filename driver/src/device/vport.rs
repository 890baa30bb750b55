//! The vport: its MTU, its unicast address list and its link state
//! (QUERY/MODIFY_NIC_VPORT_CONTEXT, QUERY_VPORT_STATE), and MAC helpers.

use std::sync::Arc;
use std::time::Duration;

use crate::bar::Bar;
use crate::dma::DmaPool;
use crate::error::Error;
use crate::hw::HwBackend;
use crate::prm::cmd::*;
use crate::prm::codes::Opcode;
use crate::prm::ctx::*;
use crate::prm::{Layout, View, ViewMut};

use super::{Ctl, MAX_RX_FRAME, VPORT_STATE_UP, input, out_len};

/// Writes a MAC into a `mac_address_layout`.
pub(super) fn set_mac(a: &mut ViewMut<'_, MacAddressLayout>, m: [u8; 6]) {
    a.set(
        MacAddressLayout::MAC_ADDR_47_32,
        u64::from(u16::from_be_bytes([m[0], m[1]])),
    )
    .set(
        MacAddressLayout::MAC_ADDR_31_0,
        u64::from(u32::from_be_bytes([m[2], m[3], m[4], m[5]])),
    );
}

/// QUERY_VPORT_STATE's `state` (1 = up).
fn vport_state<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<u8, Error> {
    let inp = input::<QueryVportStateIn>(Opcode::QueryVportState, 0, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryVportStateOut>(0))?;
    Ok(View::<QueryVportStateOut>::new(&out)
        .expect("sized")
        .get32(QueryVportStateOut::STATE) as u8)
}

/// Waits for the link: INIT_HCA brings it up (unless the cap
/// `disable_link_up` says otherwise), but training takes time, and frames
/// sent before it is up are lost (rdma-core leaves this to its caller; the
/// `disable_link_up_by_init_hca` cap shows the link follows INIT_HCA). The
/// vport state is polled every millisecond, servicing the event queue
/// (page requests, port-change events) in between.
pub(super) fn wait_link_up<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    timeout: Duration,
) -> Result<u8, Error> {
    let step = Duration::from_millis(1);
    let mut waited = Duration::ZERO;
    loop {
        let state = vport_state(bar, pool, ctl)?;
        if state == VPORT_STATE_UP {
            if !waited.is_zero() {
                tracing::info!(device = %bar.name(), ?waited, "link up");
            }
            return Ok(state);
        }
        if timeout.is_zero() {
            tracing::warn!(device = %bar.name(), "link is down; not waiting (link_up_timeout 0): frames are lost until it comes up");
            return Ok(state);
        }
        if waited >= timeout {
            return Err(Error::Timeout {
                device: bar.name(),
                what: "link up (QUERY_VPORT_STATE still reports the port down: check the cable and the switch port, or set DeviceConfig::link_up_timeout to 0 to come up without waiting)".into(),
                waited,
            });
        }
        ctl.service(bar, pool)?;
        bar.wait(step);
        waited += step;
    }
}

/// MODIFY_NIC_VPORT_CONTEXT of the MTU (a frame length: Linux
/// `mlx5_modify_nic_vport_mtu` with software MTU + 22), then a query to
/// see that it holds.
pub(super) fn set_vport_mtu<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    mtu: u16,
) -> Result<(), Error> {
    let mut inp = input::<ModifyNicVportContextIn>(Opcode::ModifyNicVportContext, 0, 0);
    {
        let mut v = ViewMut::<ModifyNicVportContextIn>::new(&mut inp).expect("sized");
        v.sub(ModifyNicVportContextIn::FIELD_SELECT)
            .set(ModifyNicVportFieldSelect::MTU, 1);
        v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT)
            .set(NicVportContext::MTU, u64::from(mtu));
    }
    ctl.exec(bar, pool, &inp, 16)?;
    let inp = input::<QueryNicVportContextIn>(Opcode::QueryNicVportContext, 0, 0);
    let out = ctl.exec(bar, pool, &inp, out_len::<QueryNicVportContextOut>(0))?;
    let now = View::<QueryNicVportContextOut>::new(&out)
        .expect("sized")
        .sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT)
        .get32(NicVportContext::MTU);
    if now != u32::from(mtu) {
        return Err(Error::Config(format!(
            "{}: the vport MTU reads {now} after setting it to {mtu}; frames longer than a {MAX_RX_FRAME}-byte receive stride would be miscounted",
            bar.name()
        )));
    }
    Ok(())
}

/// Most unicast addresses read back by [`query_vport_mac_list`].
const MAC_LIST_READ_BACK: usize = 8;

/// QUERY_NIC_VPORT_CONTEXT of the unicast address list (the first
/// [`MAC_LIST_READ_BACK`] entries).
pub(super) fn query_vport_mac_list<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
) -> Result<Vec<[u8; 6]>, Error> {
    let inp = input::<QueryNicVportContextIn>(Opcode::QueryNicVportContext, 0, 0);
    let base = QueryNicVportContextOut::NIC_VPORT_CONTEXT.byte()
        + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
    let len = (base + MAC_LIST_READ_BACK * MacAddressLayout::BYTES)
        .max(out_len::<QueryNicVportContextOut>(0));
    let out = ctl.exec(bar, pool, &inp, len)?;
    let n = View::<QueryNicVportContextOut>::new(&out)
        .expect("sized")
        .sub(QueryNicVportContextOut::NIC_VPORT_CONTEXT)
        .get32(NicVportContext::ALLOWED_LIST_SIZE) as usize;
    Ok((0..n.min(MAC_LIST_READ_BACK))
        .map(|i| {
            let e = View::<MacAddressLayout>::new(&out[base + i * MacAddressLayout::BYTES..])
                .expect("sized");
            let (hi, lo) = (
                e.get32(MacAddressLayout::MAC_ADDR_47_32) as u16,
                e.get32(MacAddressLayout::MAC_ADDR_31_0),
            );
            let (h, l) = (hi.to_be_bytes(), lo.to_be_bytes());
            [h[0], h[1], l[0], l[1], l[2], l[3]]
        })
        .collect())
}

/// MODIFY_NIC_VPORT_CONTEXT of the unicast address list (Linux
/// `mlx5_modify_nic_vport_mac_list`).
pub(super) fn set_vport_mac_list<B: HwBackend>(
    bar: &Bar<B>,
    pool: &Arc<DmaPool>,
    ctl: &mut Ctl,
    macs: &[[u8; 6]],
) -> Result<(), Error> {
    let mut inp = input::<ModifyNicVportContextIn>(
        Opcode::ModifyNicVportContext,
        0,
        macs.len() * MacAddressLayout::BYTES,
    );
    let mut v = ViewMut::<ModifyNicVportContextIn>::new(&mut inp).expect("sized");
    v.sub(ModifyNicVportContextIn::FIELD_SELECT)
        .set(ModifyNicVportFieldSelect::ADDRESSES_LIST, 1);
    let mut c = v.sub(ModifyNicVportContextIn::NIC_VPORT_CONTEXT);
    c.set(NicVportContext::ALLOWED_LIST_TYPE, 0)
        .set(NicVportContext::ALLOWED_LIST_SIZE, macs.len() as u64);
    let base = ModifyNicVportContextIn::NIC_VPORT_CONTEXT.byte()
        + NicVportContext::CURRENT_UC_MAC_ADDRESS.byte();
    for (i, m) in macs.iter().enumerate() {
        let at = base + i * MacAddressLayout::BYTES;
        let mut e = ViewMut::<MacAddressLayout>::new(&mut inp[at..]).expect("sized");
        set_mac(&mut e, *m);
    }
    ctl.exec(bar, pool, &inp, 16).map(|_| ())
}

/// A random locally administered unicast MAC (std's per-process random
/// hash keys, mixed with the time: no RNG dependency for one address).
pub(super) fn random_local_mac() -> [u8; 6] {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let b = h.finish().to_be_bytes();
    [(b[0] & 0xfe) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

/// Displays a MAC as `aa:bb:cc:dd:ee:ff`.
pub(super) struct MacStr(pub(super) [u8; 6]);

impl std::fmt::Display for MacStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

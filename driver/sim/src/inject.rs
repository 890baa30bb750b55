//! Device-side fault injection.

use std::time::Duration;

use mlx5::prm::codes::{CmdStatus, CqeSyndrome, HealthSyndrome};

use crate::firmware::{HcaState, pages};
use crate::nic::NicInner;
use crate::util::{lock, read, write};

/// Fail a command with a chosen status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailCommand {
    /// Which one: 1 = the next (matching) command, 2 = the one after, ...
    pub nth: u32,
    /// Only count commands with this opcode (`None`: every command).
    pub opcode: Option<u16>,
    /// Status to return.
    pub status: CmdStatus,
    /// Syndrome to return.
    pub syndrome: u32,
}

/// A fault to inject into a NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// Fail a future command with a chosen status and syndrome.
    FailCommand(FailCommand),
    /// Keep `initializing` set this much longer.
    InitDelay(Duration),
    /// Firmware asks for `n` more pages (page-request EQE with
    /// `num_pages = n`), or offers `-n` back (negative).
    PageRequest(i32),
    /// The next command (other than QUERY/MANAGE_PAGES and NOP) waits:
    /// the firmware asks for this many pages with a page-request EQE and
    /// completes the command only once they were given (or fails it with
    /// NO_RESOURCES on MANAGE_PAGES "cannot give").
    CommandWaitsForPages(u32),
    /// The next WQE processed on SQ `sqn` fails with this syndrome (error
    /// CQE, SQ to ERR).
    ErrorCqe {
        /// SQ number.
        sqn: u32,
        /// Error CQE syndrome.
        syndrome: CqeSyndrome,
    },
    /// The health counter stops advancing (a hung firmware).
    StopHealthCounter,
    /// The health counter advances again.
    ResumeHealthCounter,
    /// Sets the health syndrome without reset-required (0 clears it):
    /// reported, not fatal.
    HealthSyndrome(u8),
    /// Sets the health syndrome with reset-required (RFR): a fatal error
    /// the driver must report (0 clears both).
    FatalHealthSyndrome(u8),
    /// The device falls off the bus: every register and config read
    /// returns all-ones.
    SurpriseRemoval,
}

/// An injection that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    /// No such SQ on this NIC.
    #[error("no SQ {sqn:#x} on this NIC")]
    NoSuchSq {
        /// The SQ number given.
        sqn: u32,
    },
    /// Page requests need an initialized HCA.
    #[error("page requests need an initialized HCA (state is {state:?})")]
    HcaNotInitialized {
        /// Current state.
        state: HcaState,
    },
    /// `nth` must be at least 1.
    #[error("FailCommand.nth must be at least 1")]
    ZeroNth,
}

pub(crate) fn apply(nic: &NicInner, what: Injection) -> Result<(), InjectError> {
    match what {
        Injection::FailCommand(fc) => {
            if fc.nth == 0 {
                return Err(InjectError::ZeroNth);
            }
            lock(&nic.fw).inject.fail.push(fc);
        }
        Injection::InitDelay(d) => {
            lock(&nic.fw).inject.extra_init_delay_ns += d.as_nanos() as u64;
        }
        Injection::PageRequest(n) => {
            let mut fw = lock(&nic.fw);
            if fw.hca != HcaState::Initialized {
                return Err(InjectError::HcaNotInitialized { state: fw.hca });
            }
            let dp = read(&nic.dp);
            pages::request(nic, &mut fw, &dp, n);
        }
        Injection::CommandWaitsForPages(n) => {
            lock(&nic.fw).inject.wait_for_pages = Some(n);
        }
        Injection::ErrorCqe { sqn, syndrome } => {
            let dp = write(&nic.dp);
            let sq = dp.sqs.get(&sqn).ok_or(InjectError::NoSuchSq { sqn })?;
            lock(sq).fail_next = Some(syndrome as u8);
        }
        Injection::StopHealthCounter => {
            let now = nic.now_ns();
            nic.health.stop(now);
        }
        Injection::ResumeHealthCounter => nic.health.resume(),
        Injection::HealthSyndrome(s) => {
            nic.health.set_syndrome(s);
            nic.health.set_rfr(false);
        }
        Injection::FatalHealthSyndrome(s) => {
            nic.health.set_syndrome(s);
            nic.health.set_rfr(s != 0);
        }
        Injection::SurpriseRemoval => {
            nic.health.set_gone();
            nic.iommu.set_bus_master(false);
            nic.health.set_syndrome(HealthSyndrome::HwFatal as u8);
            nic.health.set_rfr(true);
        }
    }
    Ok(())
}

//! Background (worker-thread) handlers. The request goes to a worker as a
//! msgbuf (copied out of the RX ring if it was handled in place), with the
//! slot's preallocated response buffer; the finished response comes back
//! through this Rpc's bounded reply queue, polled by the event loop, which
//! never waits for a worker.

use transport::Transport;

use super::{ReqHandle, Rpc, SessionNum};
use crate::msgbuf::{MsgBuf, Origin};
use crate::nexus::{BgDone, Job};
use crate::session::SrvState;
use crate::stats::DropReason;

/// Jobs handled per event-loop iteration (inline mode and completions).
const BG_PER_LOOP_MAX: usize = 64;

impl<T: Transport, C> Rpc<T, C> {
    /// Hands the request on slot `i` to a worker.
    pub(crate) fn submit_bg(
        &mut self,
        sn: SessionNum,
        i: usize,
        req_type: u8,
        req: Result<MsgBuf, &[u8]>,
    ) {
        let req = match req {
            Ok(m) => m,
            Err(d) => match MsgBuf::alloc(&mut self.alloc, d.len(), Origin::Dynamic) {
                Ok(mut m) => {
                    m.data_mut().copy_from_slice(d);
                    m
                }
                Err(_) => return self.bg_oom(sn, i),
            },
        };
        let s = self.session_mut(sn).expect("caller checked");
        let req_num = s.slots[i].cur_req_num;
        let sv = &mut s.half.server_mut()[i];
        let pre = sv.pre_resp.take();
        sv.state = SrvState::Background;
        let resp = match pre {
            Some(m) => m,
            None => match MsgBuf::alloc(
                &mut self.alloc,
                transport::MAX_DATA_PER_PKT,
                Origin::Dynamic,
            ) {
                Ok(m) => m,
                Err(_) => {
                    self.alloc.free(req.into_buffer());
                    return self.bg_oom(sn, i);
                }
            },
        };
        let job = Job {
            req_type,
            req,
            resp,
            session: sn,
            slot: i as u8,
            req_num,
            reply: Some(self.bg.reply_tx.clone()),
            large: self.bg.scratch.pop().unwrap_or_default(),
        };
        self.stats.bg_jobs += 1;
        // Queued here or on a worker: either way the event loop has work.
        self.pending |= super::ev_loop::PENDING_BG;
        if self.nexus.worker_threads() == 0 || !self.bg.backlog.is_empty() {
            self.bg.backlog.push_back(job);
            return;
        }
        match self.nexus.workers().submit(job) {
            Ok(()) => self.bg.outstanding += 1,
            Err(job) => {
                self.stats.bg_backlogged += 1;
                self.bg.backlog.push_back(job);
            }
        }
    }

    fn bg_oom(&mut self, sn: SessionNum, i: usize) {
        self.stats.drop(DropReason::OutOfMemory);
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        s.half.server_mut()[i].state = SrvState::Idle;
        if self.reads_status(sn) {
            // An erpc-rs client is told (`rpc/status.rs`).
            return self.fail_request(sn, i, super::ServerError::OutOfMemory);
        }
        // A C++ client: undo the slot's claim so that a retransmission
        // can retry.
        let s = self.session_mut(sn).expect("looked up above");
        s.slots[i].cur_req_num = crate::pkthdr::prev_req_num(s.slots[i].cur_req_num);
    }

    /// Runs inline jobs, resubmits backlogged ones, and turns finished
    /// jobs into responses. Bounded per call.
    #[inline(never)]
    pub(crate) fn process_bg(&mut self) {
        if self.nexus.worker_threads() == 0 {
            for _ in 0..BG_PER_LOOP_MAX {
                let Some(mut job) = self.bg.backlog.pop_front() else {
                    break;
                };
                job.reply = None;
                let (done, _) = crate::nexus::workers_run_job(job, self.nexus.workers().handlers());
                self.finish_bg(done);
            }
            return;
        }
        for _ in 0..BG_PER_LOOP_MAX {
            let Some(job) = self.bg.backlog.pop_front() else {
                break;
            };
            match self.nexus.workers().submit(job) {
                Ok(()) => self.bg.outstanding += 1,
                Err(job) => {
                    self.bg.backlog.push_front(job);
                    break;
                }
            }
        }
        for _ in 0..BG_PER_LOOP_MAX {
            if self.bg.outstanding == 0 {
                break;
            }
            let Ok(done) = self.bg.reply_rx.try_recv() else {
                break;
            };
            self.bg.outstanding -= 1;
            self.finish_bg(done);
        }
    }

    fn finish_bg(&mut self, done: BgDone) {
        let BgDone {
            session,
            slot,
            req_num,
            req,
            mut resp,
            mut large,
            use_large,
            len,
        } = done;
        self.alloc.free(req.into_buffer());
        let live = self.session(session).is_some_and(|s| {
            let i = usize::from(slot);
            s.slots[i].cur_req_num == req_num && s.half.server()[i].state == SrvState::Background
        });
        if live
            && self.session(session).map(|s| s.state)
                == Some(crate::session::SessionState::Resetting)
        {
            // The client went away while the worker ran.
            self.bg.scratch.push(large);
            return self.resetting_slot_done(session, usize::from(slot), Some(resp));
        }
        if !live {
            self.recycle(resp);
            self.bg.scratch.push(large);
            return;
        }
        if use_large {
            match MsgBuf::alloc(&mut self.alloc, len, Origin::Dynamic) {
                Ok(mut m) => {
                    m.data_mut().copy_from_slice(&large[..len]);
                    large.clear();
                    self.recycle(resp);
                    resp = m;
                }
                Err(e) => {
                    tracing::warn!(error = %e, len, "no memory for a background response; sending it empty");
                    resp.resize(0).expect("0 fits");
                }
            }
        }
        self.bg.scratch.push(large);
        let h = ReqHandle {
            session,
            slot,
            req_num,
        };
        let _ = self.enqueue_response(h, resp);
    }
}

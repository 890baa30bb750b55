//! Background (worker-thread) handlers. The request goes to a worker as a
//! msgbuf (copied out of the RX ring if it was handled in place), with the
//! slot's preallocated response buffer, through this Rpc's link to the
//! worker (`nexus::workers`); the worker runs it in the link's ring and
//! marks it done there, and the event loop takes finished jobs back while
//! jobs are out. It never waits for a worker.
//!
//! A job that comes back without a response fails its request
//! ([`Rpc::fail_request`], `rpc/status.rs`): a panicking handler with
//! [`ServerError::HandlerPanicked`], a large response the Rpc has no
//! memory to copy into a msgbuf with [`ServerError::OutOfMemory`]. An
//! erpc-rs client gets a status packet and completes the request with
//! [`super::RpcError::Server`]. A C++ eRPC client cannot read one; toward
//! it the slot is failed silently: the request is not run again (its
//! retransmissions are dropped, at-most-once holds), nothing is sent, and
//! the client's request stays outstanding until its application resets
//! the session. The alternatives are worse: an empty response would
//! complete as a success, rolling the slot back would run a handler that
//! may have done part of its work again (and a panicking one again and
//! again), and retiring the server session would strand every slot of the
//! session instead of one, since a C++ client is never told of that
//! either.

use transport::Transport;

use super::{ReqHandle, Rpc, ServerError, SessionNum};
use crate::msgbuf::{MsgBuf, Origin};
use crate::nexus::{Job, Outcome};
use crate::session::SrvState;
use crate::stats::DropReason;

/// Jobs handled per event-loop iteration (inline mode and completions).
const MAX_BG_PER_LOOP: usize = 64;

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
            // A single-packet request in the RX ring: copied out.
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
        self.stats.bg_jobs += 1;
        // Queued here or on a worker: either way the event loop has work.
        self.pending |= super::ev_loop::PENDING_BG;
        // The worker first, so that the job is built right in its ring.
        let to = if self.bg.backlog.is_empty() {
            self.bg.links.reserve()
        } else {
            None
        };
        let job = Job {
            req,
            resp,
            req_num,
            large: self.bg.scratch.pop().unwrap_or_default(),
            len: 0,
            session: sn,
            slot: i as u8,
            req_type,
            outcome: Outcome::Queued,
        };
        match to {
            Some(w) => self.bg.links.push(w, job),
            None => self.backlog_bg(job),
        }
    }

    /// Keeps a job that no worker may take now (or, with no workers, that
    /// runs inline) in the backlog.
    #[cold]
    #[inline(never)]
    fn backlog_bg(&mut self, job: Job) {
        if self.bg.links.workers() != 0 {
            self.stats.bg_backlogged += 1;
        }
        self.bg.backlog.push_back(job);
    }

    fn bg_oom(&mut self, sn: SessionNum, i: usize) {
        self.stats.drop(DropReason::OutOfMemory);
        let Some(s) = self.session_mut(sn) else {
            return;
        };
        s.half.server_mut()[i].state = SrvState::Idle;
        if self.reads_status(sn) {
            // An erpc-rs client is told (`rpc/status.rs`).
            return self.fail_request(sn, i, ServerError::OutOfMemory);
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
        if self.bg.links.workers() == 0 {
            for _ in 0..MAX_BG_PER_LOOP {
                let Some(mut job) = self.bg.backlog.pop_front() else {
                    break;
                };
                crate::nexus::run_job(&mut job, self.nexus.workers().handlers());
                self.finish_bg(job);
            }
            return;
        }
        for _ in 0..MAX_BG_PER_LOOP {
            let Some(job) = self.bg.backlog.pop_front() else {
                break;
            };
            if let Err(job) = self.bg.links.submit(job) {
                self.bg.backlog.push_front(job);
                break;
            }
        }
        if self.bg.links.outstanding() == 0 {
            return;
        }
        for _ in 0..MAX_BG_PER_LOOP {
            let Some(job) = self.bg.links.pop_done() else {
                break;
            };
            self.finish_bg(job);
        }
    }

    #[inline(always)]
    fn finish_bg(&mut self, job: Job) {
        let Job {
            req,
            mut resp,
            req_num,
            mut large,
            len,
            session,
            slot,
            outcome,
            ..
        } = job;
        self.alloc.free(req.into_buffer());
        let i = usize::from(slot);
        if outcome == Outcome::Panicked {
            self.stats.bg_panics += 1;
        }
        // The session's state if the slot still waits for this job.
        let state = self.session(session).and_then(|s| {
            (s.slots[i].cur_req_num == req_num && s.half.server()[i].state == SrvState::Background)
                .then_some(s.state)
        });
        let Some(state) = state else {
            self.recycle(resp);
            self.bg.scratch.push(large);
            return;
        };
        if state == crate::session::SessionState::Resetting {
            // The client went away while the worker ran.
            self.bg.scratch.push(large);
            return self.resetting_slot_done(session, i, Some(resp));
        }
        let err = match outcome {
            Outcome::Small => None,
            Outcome::Large => {
                let len = len as usize;
                match MsgBuf::alloc(&mut self.alloc, len, Origin::Dynamic) {
                    Ok(mut m) => {
                        m.data_mut().copy_from_slice(&large[..len]);
                        large.clear();
                        self.recycle(resp);
                        resp = m;
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, len, "no memory for a background response; failing the request");
                        self.stats.drop(DropReason::OutOfMemory);
                        Some(ServerError::OutOfMemory)
                    }
                }
            }
            Outcome::Panicked => Some(ServerError::HandlerPanicked),
            // Never back on a live slot: only a retired link skips jobs.
            Outcome::Queued | Outcome::Skipped => Some(ServerError::HandlerPanicked),
        };
        self.bg.scratch.push(large);
        if let Some(err) = err {
            self.recycle(resp);
            self.session_mut(session)
                .expect("looked up above")
                .half
                .server_mut()[i]
                .state = SrvState::Idle;
            return self.fail_request(session, i, err);
        }
        let h = ReqHandle {
            session,
            slot,
            req_num,
        };
        let _ = self.enqueue_response(h, resp);
    }
}

//! The worker-dispatch benchmark: a background handler with a bimodal
//! service time (by default 99.5 % short, 0.5 % a hundred times longer),
//! an open-loop Poisson client at a given load, and the p99 latency under
//! round-robin and single-queue (JBSQ) dispatch against the ideal: an
//! M/G/N first-come-first-served queue simulated from the same arrival
//! times and the service times the workers actually took ([`ideal`]).
//!
//! Latency runs from a request's *scheduled* arrival to its response, so
//! a client that falls behind does not hide queueing (no coordinated
//! omission).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use erpc::{BgResponse, Completion, NexusBuilder, Rpc, SessionNum, WorkerDispatch};
use transport::Transport;

/// The benchmark's request type (a background handler).
pub const REQ_SERVICE: u8 = 50;
/// Request: service time (ns) and sequence number.
pub const REQ_BYTES: usize = 16;
/// Response: start and end of service (ns since the server's epoch).
pub const RESP_BYTES: usize = 16;

/// How the handler spends its service time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Busy-loops (needs a core per worker to be meaningful).
    Spin,
    /// Sleeps, then spins the last 100 µs (workers use no CPU while
    /// serving, so several fit on a small machine; service times must be
    /// long against the OS's wake-up latency).
    Sleep,
}

/// Registers the synthetic handler: it serves for the time the request
/// names and answers with when it started and ended (relative to `epoch`).
pub fn register(b: NexusBuilder, service: Service, epoch: Instant) -> NexusBuilder {
    b.bg_handler(REQ_SERVICE, move |req: &[u8], resp: &mut BgResponse<'_>| {
        let start = epoch.elapsed();
        let ns = service_ns(req);
        let until = start + Duration::from_nanos(ns);
        if service == Service::Sleep && ns > 150_000 {
            std::thread::sleep(Duration::from_nanos(ns - 100_000));
        }
        let mut end = epoch.elapsed();
        while end < until {
            std::hint::spin_loop();
            end = epoch.elapsed();
        }
        let out = resp.buf(RESP_BYTES);
        out[..8].copy_from_slice(&(start.as_nanos() as u64).to_le_bytes());
        out[8..].copy_from_slice(&(end.as_nanos() as u64).to_le_bytes());
    })
}

/// Registers the synthetic handler for simulated service times (stepped
/// workers on virtual time, `Nexus::take_job` / `finish_job`): the driver
/// finishes a job when its service time has passed on `clock`, so the
/// handler answers with that time as the end and the service time before
/// it as the start.
pub fn register_modelled(b: NexusBuilder, clock: erpc::Clock) -> NexusBuilder {
    b.bg_handler(REQ_SERVICE, move |req: &[u8], resp: &mut BgResponse<'_>| {
        let ns = service_ns(req);
        let end = clock.now_ns();
        let out = resp.buf(RESP_BYTES);
        out[..8].copy_from_slice(&end.saturating_sub(ns).to_le_bytes());
        out[8..].copy_from_slice(&end.to_le_bytes());
    })
}

/// The service time a request asks for (ns).
pub fn service_ns(req: &[u8]) -> u64 {
    req.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// A bimodal service-time distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bimodal {
    /// Short service time, ns.
    pub short_ns: u64,
    /// Long service time, ns.
    pub long_ns: u64,
    /// Long requests per million.
    pub long_ppm: u64,
}

impl Bimodal {
    /// Mean service time, ns.
    pub fn mean_ns(&self) -> f64 {
        let p = self.long_ppm as f64 / 1e6;
        (1.0 - p) * self.short_ns as f64 + p * self.long_ns as f64
    }
}

/// One scheduled request: arrival time (ns after the start) and service
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// When it is due, ns after the start.
    pub at_ns: u64,
    /// Service time asked for, ns.
    pub service_ns: u64,
}

/// `n` Poisson arrivals at `load` (utilization of `workers` servers) with
/// service times from `dist`, from `seed`.
pub fn schedule(n: usize, load: f64, workers: usize, dist: Bimodal, seed: u64) -> Vec<Arrival> {
    let mut rng = netsim::Rng::new(seed);
    let rate_per_ns = load * workers as f64 / dist.mean_ns();
    let mut t = 0.0f64;
    (0..n)
        .map(|_| {
            // Uniform in (0, 1].
            let u = ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
            t += -u.ln() / rate_per_ns;
            let long = rng.next_u64() % 1_000_000 < dist.long_ppm;
            Arrival {
                at_ns: t as u64,
                service_ns: if long { dist.long_ns } else { dist.short_ns },
            }
        })
        .collect()
}

/// Sojourn times (wait + service) of an ideal first-come-first-served
/// queue with `servers` servers: job `i` arrives at `arrivals[i]` and
/// takes `service[i]`. Arrivals must be in order.
pub fn ideal(arrivals: &[u64], service: &[u64], servers: usize) -> Vec<u64> {
    assert_eq!(arrivals.len(), service.len());
    assert!(servers > 0);
    let mut free: BinaryHeap<Reverse<u64>> = (0..servers).map(|_| Reverse(0)).collect();
    arrivals
        .iter()
        .zip(service)
        .map(|(&a, &s)| {
            let Reverse(f) = free.pop().expect("servers > 0");
            let end = a.max(f) + s;
            free.push(Reverse(end));
            end - a
        })
        .collect()
}

/// Sojourn times under round robin as `erpc`'s pool does it when no
/// worker queue is full: job `i` goes to worker `i % servers`, each
/// worker first-come-first-served. The policy alone, without eRPC.
pub fn model_round_robin(arrivals: &[u64], service: &[u64], servers: usize) -> Vec<u64> {
    assert_eq!(arrivals.len(), service.len());
    let mut free = vec![0u64; servers];
    arrivals
        .iter()
        .zip(service)
        .enumerate()
        .map(|(i, (&a, &s))| {
            let w = i % servers;
            let end = a.max(free[w]) + s;
            free[w] = end;
            end - a
        })
        .collect()
}

/// Sojourn times under join-bounded-shortest-queue with depth `depth`: a
/// job goes to the worker holding the fewest jobs if it holds fewer than
/// `depth`, else waits in a central FIFO; a worker that finishes a job
/// takes the central queue's head. Ties between equally loaded workers
/// are broken as `erpc` breaks them: the first at or after the worker
/// after the last one chosen (taking the lowest-numbered instead changes
/// JBSQ(2)'s p99 by 2x at some loads). The policy alone, without eRPC (the
/// hand-off is instantaneous).
pub fn model_jbsq(arrivals: &[u64], service: &[u64], servers: usize, depth: usize) -> Vec<u64> {
    assert_eq!(arrivals.len(), service.len());
    assert!(servers > 0 && depth > 0);
    let n = arrivals.len();
    let mut out = vec![0u64; n];
    // Per worker: queued jobs (the running one first) and when the
    // running one ends.
    let mut queues: Vec<VecDeque<usize>> = vec![VecDeque::new(); servers];
    let mut busy_until = vec![u64::MAX; servers];
    let mut central: VecDeque<usize> = VecDeque::new();
    let mut next = 0usize;
    // Where the search for the least-loaded worker starts.
    let mut rot = 0usize;
    let start = |w: usize, t: u64, q: &VecDeque<usize>, b: &mut Vec<u64>| {
        if let Some(&j) = q.front() {
            b[w] = t + service[j];
        } else {
            b[w] = u64::MAX;
        }
    };
    loop {
        // The next event: an arrival or the earliest completion (arrivals
        // first at equal times).
        let (w_done, t_done) = busy_until
            .iter()
            .enumerate()
            .min_by_key(|&(_, &t)| t)
            .map(|(w, &t)| (w, t))
            .expect("servers > 0");
        if next < n && arrivals[next] <= t_done {
            let t = arrivals[next];
            let (w, len) = (0..servers)
                .map(|k| (rot + k) % servers)
                .map(|w| (w, queues[w].len()))
                .min_by_key(|&(_, l)| l)
                .expect("servers > 0");
            if central.is_empty() && len < depth {
                queues[w].push_back(next);
                rot = (w + 1) % servers;
                if len == 0 {
                    start(w, t, &queues[w], &mut busy_until);
                }
            } else {
                central.push_back(next);
            }
            next += 1;
        } else if t_done != u64::MAX {
            let j = queues[w_done].pop_front().expect("running job");
            out[j] = t_done - arrivals[j];
            if let Some(c) = central.pop_front() {
                queues[w_done].push_back(c);
            }
            start(w_done, t_done, &queues[w_done], &mut busy_until);
        } else {
            break;
        }
    }
    out
}

/// The `q` quantile of `v` (sorted in place).
pub fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The open-loop client's state.
#[derive(Debug)]
pub struct LoadGen {
    plan: Vec<Arrival>,
    start_ns: u64,
    next: usize,
    sessions: Vec<SessionNum>,
    outstanding: Vec<usize>,
    /// Requests due but waiting for a free session slot.
    waiting: VecDeque<usize>,
    /// Most requests ever waiting in the client.
    pub max_waiting: usize,
    /// Per request: latency from scheduled arrival to response (ns), 0 if
    /// not done.
    pub latency_ns: Vec<u64>,
    /// Per request: service time the worker took (ns).
    pub served_ns: Vec<u64>,
    /// Requests done.
    pub done: usize,
    /// Requests that failed.
    pub errors: u64,
}

impl LoadGen {
    /// A client for `plan`, starting now (`now_ns`), on `sessions`.
    pub fn new(plan: Vec<Arrival>, sessions: Vec<SessionNum>, now_ns: u64) -> LoadGen {
        let n = plan.len();
        LoadGen {
            plan,
            start_ns: now_ns,
            next: 0,
            outstanding: vec![0; sessions.len()],
            sessions,
            waiting: VecDeque::new(),
            max_waiting: 0,
            latency_ns: vec![0; n],
            served_ns: vec![0; n],
            done: 0,
            errors: 0,
        }
    }

    /// True when every request has been answered (or failed).
    pub fn finished(&self) -> bool {
        self.done + self.errors as usize == self.plan.len()
    }

    /// The schedule.
    pub fn plan(&self) -> &[Arrival] {
        &self.plan
    }

    /// Sends what is due.
    pub fn drive<T: Transport + 'static>(&mut self, rpc: &mut Rpc<T, LoadGen>) {
        let now = rpc.now_ns().saturating_sub(self.start_ns);
        while self.next < self.plan.len() && self.plan[self.next].at_ns <= now {
            self.waiting.push_back(self.next);
            self.next += 1;
        }
        self.max_waiting = self.max_waiting.max(self.waiting.len());
        while let Some(&i) = self.waiting.front() {
            // The session with the fewest requests, if it has a free slot.
            let Some(s) = (0..self.sessions.len())
                .filter(|&s| self.outstanding[s] < erpc::SESSION_REQ_WINDOW)
                .min_by_key(|&s| self.outstanding[s])
            else {
                return;
            };
            let Some((mut req, resp)) = crate::alloc_pair(rpc, REQ_BYTES, RESP_BYTES) else {
                return;
            };
            let d = req.data_mut();
            d[..8].copy_from_slice(&self.plan[i].service_ns.to_le_bytes());
            d[8..].copy_from_slice(&(i as u64).to_le_bytes());
            let tag = (i << 8) | s;
            match rpc.enqueue_request(self.sessions[s], REQ_SERVICE, req, resp, on_done::<T>, tag) {
                Ok(()) => {
                    self.outstanding[s] += 1;
                    self.waiting.pop_front();
                }
                Err(e) => {
                    rpc.free_msg_buffer(e.req);
                    rpc.free_msg_buffer(e.resp);
                    return;
                }
            }
        }
    }
}

/// How [`run_simulated`] sets up its server and client.
#[derive(Debug, Clone, Copy)]
pub struct SimSetup {
    /// Stepped workers at the server.
    pub workers: usize,
    /// How the server hands requests to them.
    pub policy: WorkerDispatch,
    /// Client sessions (8 requests in flight each).
    pub sessions: usize,
    /// Virtual time per step, ns.
    pub step_ns: u64,
    /// The network's seed.
    pub seed: u64,
}

/// Runs `plan` against a server on eRPC's simulated network in virtual
/// time, with stepped workers whose service times are modelled: a worker
/// takes a job when it is free, and the driver finishes it when the
/// request's service time has passed on the virtual clock. The same
/// hand-off (links, the policy's reservations, the backlog) as worker
/// threads, deterministic; the polling costs no virtual time. Returns the
/// finished client state and the jobs each worker ran.
pub fn run_simulated(plan: Vec<Arrival>, setup: &SimSetup) -> Result<(LoadGen, Vec<u64>), String> {
    use crate::env::{SimWorld, World};
    let mut world = SimWorld::new(setup.seed, erpc_sim::DEFAULT_LINK);
    world.step_ns = setup.step_ns.max(1);
    let clock = world.net.erpc_clock();
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let server_nexus = register_modelled(world.nexus("server:1"), clock)
        .stepped_workers(setup.workers)
        .worker_dispatch(setup.policy)
        .build()
        .map_err(|x| e(&x))?;
    let client_nexus = world.nexus("client:1").build().map_err(|x| e(&x))?;
    let (st, sa, _) = world.endpoint();
    let (ct, ca, _) = world.endpoint();
    let mut server: Rpc<_, ()> = Rpc::builder(&server_nexus, st, sa)
        .build()
        .map_err(|x| e(&x))?;
    let mut client: Rpc<_, LoadGen> = Rpc::builder(&client_nexus, ct, ca)
        .build()
        .map_err(|x| e(&x))?;
    let mut sessions = Vec::new();
    for _ in 0..setup.sessions {
        sessions.push(client.create_session("server:1", 0).map_err(|x| e(&x))?);
    }
    let mut lg = LoadGen::new(Vec::new(), Vec::new(), 0);
    for _ in 0..1_000_000 {
        if sessions.iter().all(|&s| client.is_connected(s)) {
            break;
        }
        client.run_event_loop_once(&mut lg);
        server.run_event_loop_once(&mut ());
        world.step();
    }
    if !sessions.iter().all(|&s| client.is_connected(s)) {
        return Err("sessions did not connect in a virtual second".into());
    }
    let span = plan.last().map_or(0, |a| a.at_ns);
    let mut lg = LoadGen::new(plan, sessions, client.now_ns());
    let mut busy: Vec<Option<(u64, erpc::SteppedJob)>> = (0..setup.workers).map(|_| None).collect();
    let mut jobs = vec![0u64; setup.workers];
    // Virtual time to give up after: twenty times the schedule and a
    // virtual second (the work is bounded by the schedule: no wall clock).
    let limit = (20 * span + 1_000_000_000) / world.step_ns;
    let mut steps = 0u64;
    while !lg.finished() {
        lg.drive(&mut client);
        client.run_event_loop_once(&mut lg);
        server.run_event_loop_once(&mut ());
        let now = world.now_ns();
        for (w, b) in busy.iter_mut().enumerate() {
            if b.as_ref().is_some_and(|(until, _)| *until <= now) {
                let (_, j) = b.take().expect("checked");
                server_nexus.finish_job(j);
                jobs[w] += 1;
            }
            if b.is_none()
                && let Some(j) = server_nexus.take_job(w)
            {
                *b = Some((now + service_ns(j.request()), j));
            }
        }
        world.step();
        steps += 1;
        if steps > limit {
            return Err(format!("{} of {} requests done", lg.done, lg.plan().len()));
        }
    }
    Ok((lg, jobs))
}

fn on_done<T: Transport + 'static>(rpc: &mut Rpc<T, LoadGen>, st: &mut LoadGen, c: Completion) {
    let (i, s) = (c.tag >> 8, c.tag & 0xff);
    st.outstanding[s] -= 1;
    let now = rpc.now_ns().saturating_sub(st.start_ns);
    let r = c.resp.data();
    if c.result.is_ok() && r.len() == RESP_BYTES {
        let start = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        let end = u64::from_le_bytes(r[8..].try_into().expect("8 bytes"));
        st.served_ns[i] = end.saturating_sub(start);
        st.latency_ns[i] = now.saturating_sub(st.plan[i].at_ns).max(1);
        st.done += 1;
    } else {
        st.errors += 1;
    }
    rpc.free_msg_buffer(c.req);
    rpc.free_msg_buffer(c.resp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ideal_queue_matches_hand_computed_cases() {
        // One server: FIFO waits add up.
        assert_eq!(ideal(&[0, 1, 2], &[10, 10, 10], 1), vec![10, 19, 28]);
        // Two servers: the long job holds one, short jobs use the other.
        assert_eq!(
            ideal(&[0, 1, 2, 3], &[100, 5, 5, 5], 2),
            vec![100, 5, 9, 13]
        );
        // Idle gaps: no wait.
        assert_eq!(ideal(&[0, 50, 100], &[10, 10, 10], 1), vec![10, 10, 10]);
    }

    #[test]
    fn the_policy_models_match_hand_computed_cases() {
        // A long job then short ones on two workers.
        let a = [0, 1, 2, 3];
        let s = [100, 5, 5, 5];
        // Round robin: jobs 0 and 2 share worker 0.
        assert_eq!(model_round_robin(&a, &s, 2), vec![100, 5, 103, 8]);
        // JBSQ(1): short jobs wait for the idle worker, never behind the
        // long one; the same as the ideal queue here.
        assert_eq!(model_jbsq(&a, &s, 2, 1), ideal(&a, &s, 2));
        // JBSQ(2): job 2 joins the long job's queue (both hold one).
        assert_eq!(model_jbsq(&a, &s, 2, 2), vec![100, 5, 103, 8]);
        // Depth 1 on one worker is FIFO.
        assert_eq!(
            model_jbsq(&[0, 1, 2], &[10, 10, 10], 1, 1),
            vec![10, 19, 28]
        );
        // JBSQ(1) with many servers equals the ideal M/G/N queue.
        let d = Bimodal {
            short_ns: 1_000,
            long_ns: 100_000,
            long_ppm: 5_000,
        };
        let plan = schedule(20_000, 0.8, 4, d, 5);
        let a: Vec<u64> = plan.iter().map(|p| p.at_ns).collect();
        let s: Vec<u64> = plan.iter().map(|p| p.service_ns).collect();
        assert_eq!(model_jbsq(&a, &s, 4, 1), ideal(&a, &s, 4));
        let p99 = |mut v: Vec<u64>| quantile(&mut v, 0.99);
        assert!(p99(model_round_robin(&a, &s, 4)) > 2 * p99(ideal(&a, &s, 4)));
    }

    #[test]
    fn the_schedule_has_the_asked_load_and_mix() {
        let d = Bimodal {
            short_ns: 1_000,
            long_ns: 100_000,
            long_ppm: 5_000,
        };
        let plan = schedule(400_000, 0.8, 4, d, 7);
        let span = plan.last().unwrap().at_ns as f64;
        let work: f64 = plan.iter().map(|a| a.service_ns as f64).sum();
        let load = work / span / 4.0;
        assert!((load - 0.8).abs() < 0.03, "load {load}");
        let long = plan.iter().filter(|a| a.service_ns == 100_000).count();
        assert!((1_700..2_300).contains(&long), "{long} long of 400000");
        assert!(plan.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert_eq!(schedule(100, 0.5, 2, d, 3), schedule(100, 0.5, 2, d, 3));
    }

    #[test]
    fn through_erpc_in_virtual_time_jbsq_1_is_the_ideal_queue_and_round_robin_its_model() {
        // Stepped workers with modelled service times: eRPC's own hand-off
        // (links, reservations, the backlog) in virtual time, so the
        // policies can be held to their models exactly enough to test.
        let d = Bimodal {
            short_ns: 10_000,
            long_ns: 1_000_000,
            long_ppm: 5_000,
        };
        let plan = schedule(6_000, 0.7, 4, d, 11);
        let arrivals: Vec<u64> = plan.iter().map(|a| a.at_ns).collect();
        let p = |mut v: Vec<u64>, q| quantile(&mut v, q) as f64;
        for policy in [WorkerDispatch::single_queue(1), WorkerDispatch::RoundRobin] {
            let setup = SimSetup {
                workers: 4,
                policy,
                sessions: 32,
                step_ns: 100,
                seed: 3,
            };
            let (lg, jobs) = run_simulated(plan.clone(), &setup).unwrap();
            assert_eq!(lg.errors, 0);
            assert_eq!(jobs.iter().sum::<u64>(), 6_000, "{jobs:?}");
            // The service times the workers took are the asked ones.
            let asked: Vec<u64> = plan.iter().map(|a| a.service_ns).collect();
            assert_eq!(lg.served_ns, asked);
            let model = match policy {
                WorkerDispatch::RoundRobin => model_round_robin(&arrivals, &asked, 4),
                _ => ideal(&arrivals, &asked, 4),
            };
            let got99 = p(lg.latency_ns.clone(), 0.99);
            let want99 = p(model.clone(), 0.99);
            // The measured latency adds the network round trip and the
            // hand-off steps (a few µs) to the model's queueing.
            assert!(
                got99 <= want99 * 1.05 + 10_000.0 && got99 >= want99,
                "{policy}: p99 {got99} ns against the model's {want99}"
            );
        }
    }

    #[test]
    fn quantiles() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(quantile(&mut v, 0.99), 99);
        assert_eq!(quantile(&mut v, 0.5), 50);
        assert_eq!(quantile(&mut [], 0.5), 0);
    }
}

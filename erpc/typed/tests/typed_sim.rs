//! The typed layer on eRPC's simulated network, in virtual time: calls as
//! closures and futures, pipelining under `join_all`, the per-session
//! window, dropped futures, timeouts, every error reaching the caller
//! typed, and servers whose handlers panic.

mod common;

use std::cell::RefCell;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::*;
use erpc::{RpcError, ServerError};
use erpc_typed::{CallError, EndpointConfig};
use futures_util::future::join_all;

#[test]
fn closure_and_future_calls() {
    let mut w = world(EndpointConfig::default());
    let s = w.connect();
    // A future.
    let api = w.client.client();
    let r = w
        .run(async move {
            let put = api
                .call(
                    s,
                    Put {
                        key: 7,
                        value: b"seven".to_vec(),
                    },
                )
                .await?;
            let again = api
                .call(
                    s,
                    Put {
                        key: 7,
                        value: vec![7; 5000], // larger than a packet
                    },
                )
                .await?;
            let got = api.call(s, Get(7)).await?;
            let missing = api.call(s, Get(8)).await?;
            let up = api.call(s, Upper("background".into())).await?;
            Ok::<_, CallError>((put, again, got, missing, up))
        })
        .unwrap();
    assert_eq!(r.0, PutReply { replaced: false });
    assert_eq!(r.1, PutReply { replaced: true });
    assert_eq!(r.2, Some(vec![7; 5000]));
    assert_eq!(r.3, None);
    assert_eq!(r.4, "BACKGROUND");
    // A closure continuation, started from outside the event loop, that
    // starts a nested call of its own.
    w.client.with(|ctx| {
        ctx.call_then(s, Echo(1, "one".into()), move |ctx, r| {
            let e = r.expect("echo");
            ctx.results.push(format!("{} {}", e.0, e.1));
            ctx.call_then(s, Get(7), |ctx, r| {
                let v = r.expect("get").expect("stored");
                ctx.results.push(format!("get {}", v.len()));
            })
            .expect("nested call");
        })
        .expect("call");
    });
    w.until("closure calls", 100_000, |w| {
        w.client.app().results.len() == 2
    });
    assert_eq!(w.client.app().results, ["1 one", "get 5000"]);
    assert_eq!(w.server.app().echoes, 1);
    assert_eq!(w.client.pending_calls(), 0);
    let st = w.client.stats();
    assert_eq!((st.calls, st.ok, st.failed), (7, 7, 0), "{st:?}");
}

#[test]
fn join_all_pipelines_within_the_window() {
    let mut w = world(EndpointConfig::default());
    let s = w.connect();
    let api = w.client.client();
    // Sequential calls: one round trip each.
    let seq_t0 = w.net.now_ns();
    let api2 = api.clone();
    let seq = w.run(async move {
        let mut v = Vec::new();
        for i in 0..20u64 {
            v.push(api2.call(s, Echo(i, String::new())).await.unwrap().0);
        }
        v
    });
    let seq_ns = w.net.now_ns() - seq_t0;
    assert_eq!(seq, (0..20).collect::<Vec<_>>());

    // The same 20 calls joined: all start in the first poll, 8 go out
    // (the window), 12 wait in the layer, none in the core's backlog.
    let core_backlogged = w.client.rpc_stats().reqs_backlogged;
    let queued = w.client.stats().queued;
    let par_t0 = w.net.now_ns();
    let api3 = api.clone();
    let par = w.run(async move {
        join_all((0..20u64).map(|i| api3.call(s, Echo(i, String::new()))))
            .await
            .into_iter()
            .map(|r| r.unwrap().0)
            .collect::<Vec<_>>()
    });
    let par_ns = w.net.now_ns() - par_t0;
    assert_eq!(par, (0..20).collect::<Vec<_>>());
    assert_eq!(w.client.stats().queued - queued, 12);
    assert_eq!(w.client.rpc_stats().reqs_backlogged, core_backlogged);
    // Pipelined: 20 calls in well under the time of 20 round trips (3
    // rounds of 8 at most, plus the stepping).
    assert!(
        par_ns * 3 < seq_ns,
        "joined {par_ns} ns vs sequential {seq_ns} ns"
    );
}

#[test]
fn the_window_bounds_calls_in_flight() {
    let mut w = world(EndpointConfig {
        max_in_flight: 3,
        ..EndpointConfig::default()
    });
    let s = w.connect();
    let api = w.client.client();
    for i in 0..10u64 {
        let api = api.clone();
        w.client.spawn(async move {
            api.call(s, Slow(i)).await.expect("slow");
        });
    }
    // Only the window's worth reaches the server while none is answered.
    w.steps(2_000);
    assert_eq!(w.server.app().held.len(), 3);
    let mut answered = 0;
    while answered < 10 {
        let n = w.server.app().held.len();
        assert!(n <= 3, "{n} held");
        answered += n;
        w.answer_held();
        w.steps(2_000);
    }
    assert_eq!(w.server.app().max_held, 3);
    assert_eq!(w.server.app().slows, 10);
    assert_eq!(w.client.pending_calls(), 0);
}

/// Polls `fut` once with a no-op waker.
fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    let waker = std::task::Waker::noop();
    std::pin::Pin::new(fut).poll(&mut Context::from_waker(waker))
}

#[test]
fn dropped_futures_run_at_most_once_and_leave_nothing() {
    let mut w = world(EndpointConfig {
        max_in_flight: 1,
        ..EndpointConfig::default()
    });
    let s = w.connect();
    let api = w.client.client();
    // Never polled: never sent.
    drop(api.call(s, Slow(1)));
    // In flight, then dropped: the handler runs once, the response is
    // discarded.
    let mut in_flight = api.call(s, Slow(2));
    assert!(poll_once(&mut in_flight).is_pending());
    // Queued behind it (window 1), then dropped: never sent.
    let mut queued = api.call(s, Slow(3));
    assert!(poll_once(&mut queued).is_pending());
    assert_eq!(w.client.pending_calls(), 2);
    w.steps(2_000);
    drop(in_flight);
    drop(queued);
    w.answer_held();
    w.steps(2_000);
    assert_eq!(w.server.app().slows, 1, "only the started call ran");
    assert_eq!(w.client.pending_calls(), 0);
    assert_eq!(w.client.stats().discarded, 1);
    // The session is fine, and the slots come back.
    let api2 = api.clone();
    let r = w.run(async move { api2.call(s, Echo(5, "x".into())).await });
    assert_eq!(r.unwrap(), Echo(5, "x".into()));
    // A future dropped inside a handler (the endpoint is busy then) is
    // given up at the next iteration.
    let held = Rc::new(RefCell::new(Some(api.call(s, Slow(4)))));
    assert!(poll_once(held.borrow_mut().as_mut().unwrap()).is_pending());
    let h2 = held.clone();
    w.client.with(move |ctx| {
        ctx.call_then(s, Echo(6, String::new()), move |_, _| {
            h2.borrow_mut().take();
        })
        .unwrap();
    });
    w.steps(2_000);
    w.answer_held();
    w.steps(2_000);
    assert!(held.borrow().is_none());
    assert_eq!(w.server.app().slows, 2);
    assert_eq!(w.client.pending_calls(), 0);
}

#[test]
fn timeouts_fail_the_call_and_discard_the_late_response() {
    let mut w = world(EndpointConfig {
        max_in_flight: 1,
        ..EndpointConfig::default()
    });
    let s = w.connect();
    let api = w.client.client();
    let (a, b) = (api.clone(), api.clone());
    let (sent, unsent) = w.run(async move {
        // The first is in flight when its timeout passes; the second
        // waits behind it in the window and never goes out.
        let x = a.call(s, Slow(1)).timeout(Duration::from_millis(1));
        let y = b.call(s, Slow(2)).timeout(Duration::from_millis(1));
        futures_util::future::join(x, y).await
    });
    assert!(
        matches!(sent, Err(CallError::TimedOut { sent: true })),
        "{sent:?}"
    );
    assert!(
        matches!(unsent, Err(CallError::TimedOut { sent: false })),
        "{unsent:?}"
    );
    assert_eq!(w.server.app().slows, 1);
    // The late answer is discarded; the slot comes back.
    assert_eq!(w.client.pending_calls(), 1);
    w.answer_held();
    w.steps(2_000);
    assert_eq!(w.client.pending_calls(), 0);
    assert_eq!(w.server.app().slows, 1, "the unsent call never ran");
    let st = w.client.stats();
    assert_eq!((st.timed_out, st.discarded), (2, 1), "{st:?}");
    // A closure call with a timeout.
    w.client.with(|ctx| {
        ctx.call_then_within(s, Slow(3), Some(Duration::from_micros(500)), |ctx, r| {
            ctx.results.push(format!("{r:?}"));
        })
        .unwrap();
    });
    w.until("closure timeout", 100_000, |w| {
        !w.client.app().results.is_empty()
    });
    assert!(w.client.app().results[0].contains("TimedOut { sent: true }"));
}

#[test]
fn errors_reach_the_caller_typed() {
    let mut w = world(EndpointConfig::default());
    let s = w.connect();
    let api = w.client.client();
    let a = api.clone();
    let (nobody, wrong_req, wrong_resp) = w.run(async move {
        (
            a.call(s, Nobody).await,
            a.call(s, WrongEcho(vec![1, 2, 3])).await,
            a.call(
                s,
                PutExpectingString {
                    key: 1,
                    value: vec![],
                },
            )
            .await,
        )
    });
    assert!(
        matches!(
            nobody,
            Err(CallError::Rpc(RpcError::Server {
                err: ServerError::NoHandler,
                ..
            }))
        ),
        "{nobody:?}"
    );
    assert!(
        matches!(wrong_req, Err(CallError::BadRequest)),
        "{wrong_req:?}"
    );
    assert!(
        matches!(wrong_resp, Err(CallError::Decode(_))),
        "{wrong_resp:?}"
    );
    assert_eq!(w.server.stats().bad_requests, 1);
    // No such session: refused at once.
    let a = api.clone();
    let r = w.run(async move { a.call(999, Echo(0, String::new())).await });
    assert!(matches!(r, Err(CallError::Enqueue(_))), "{r:?}");

    // A session reset: the call in flight and the calls queued behind it
    // fail with the reset.
    let calls: Vec<_> = (0..12u64).map(|i| api.call(s, Slow(i))).collect();
    let mut all = pin!(join_all(calls));
    let waker = std::task::Waker::noop();
    assert!(
        all.as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_pending()
    );
    w.steps(2_000);
    w.client
        .with(|ctx| ctx.rpc().reset_session(s))
        .expect("reset");
    w.steps(100);
    let Poll::Ready(res) = all.as_mut().poll(&mut Context::from_waker(waker)) else {
        panic!("the reset did not end the calls");
    };
    assert_eq!(res.len(), 12);
    for r in &res {
        assert!(
            matches!(
                r,
                Err(CallError::Rpc(RpcError::SessionEnded {
                    why: erpc::SessionEnd::Reset,
                    ..
                }))
            ),
            "{r:?}"
        );
        assert!(r.as_ref().unwrap_err().session_gone());
    }
    // The server's handlers ran only for the 8 that were sent.
    assert_eq!(w.server.app().slows, 8);
    assert_eq!(w.client.pending_calls(), 0);

    // A peer failure.
    let s2 = w.connect();
    let mut call = api.call(s2, Slow(100));
    assert!(poll_once(&mut call).is_pending());
    w.steps(2_000);
    w.client
        .with(|ctx| ctx.rpc().fault_fail_remote("server:31850"))
        .unwrap();
    w.steps(100);
    let Poll::Ready(r) = poll_once(&mut call) else {
        panic!("the peer failure did not end the call");
    };
    assert!(
        matches!(
            r,
            Err(CallError::Rpc(RpcError::SessionEnded {
                why: erpc::SessionEnd::PeerFailed,
                ..
            }))
        ),
        "{r:?}"
    );

    // A connect that cannot succeed: nobody has that URI.
    let a = api.clone();
    let r = w.run(async move { a.connect("nobody:31850", 0).await });
    assert!(
        matches!(
            r,
            Err(erpc_typed::ConnectError::Failed(CallError::Rpc(
                RpcError::SessionEnded {
                    why: erpc::SessionEnd::ConnectTimedOut,
                    ..
                }
            )))
        ),
        "{r:?}"
    );
    let a = api.clone();
    let r = w.run(async move { a.connect("garbage", 0).await });
    assert!(
        matches!(
            r,
            Err(erpc_typed::ConnectError::Create(
                erpc::SessionError::BadUri { .. }
            ))
        ),
        "{r:?}"
    );
}

#[test]
fn spawned_tasks_and_deferred_replies_from_tasks() {
    let mut w = world(EndpointConfig::default());
    let s = w.connect();
    let api = w.client.client();
    let done = Rc::new(RefCell::new(Vec::new()));
    for i in 0..30u64 {
        let (api, done) = (api.clone(), done.clone());
        w.client.spawn(async move {
            let e = api.call(s, Echo(i, "t".into())).await.unwrap();
            let p = api
                .call(
                    s,
                    Put {
                        key: e.0,
                        value: vec![e.0 as u8],
                    },
                )
                .await
                .unwrap();
            done.borrow_mut().push((i, p.replaced));
        });
    }
    w.until("tasks", 100_000, |_| done.borrow().len() == 30);
    assert_eq!(w.server.app().store.len(), 30);
    // The server answers a deferred request from a task of its own.
    let mut call = api.call(s, Slow(41));
    assert!(poll_once(&mut call).is_pending());
    w.until("held", 100_000, |w| w.server.app().held.len() == 1);
    let (reply, v) = w.server.app().held.pop().unwrap();
    let sapi = w.server.client();
    w.server.spawn(async move {
        sapi.reply(reply, &(v + 1)).unwrap();
    });
    let mut got = None;
    w.until("deferred reply", 100_000, |_| {
        if let Poll::Ready(r) = poll_once(&mut call) {
            got = Some(r);
        }
        got.is_some()
    });
    assert_eq!(got.unwrap().unwrap(), 42);
}

#[test]
fn a_panicking_background_handler_fails_only_its_own_call() {
    let mut w = world(EndpointConfig::default());
    let s = w.connect();
    let api = w.client.client();
    let (boom, after) = w.run(async move {
        let boom = api.call(s, BgBoom(7)).await;
        let after = api.call(s, Upper("still here".into())).await;
        (boom, after)
    });
    assert!(
        matches!(
            boom,
            Err(CallError::Rpc(RpcError::Server {
                err: ServerError::HandlerPanicked,
                ..
            }))
        ),
        "{boom:?}"
    );
    assert!(!boom.as_ref().unwrap_err().session_gone());
    // The server and the session live on.
    assert_eq!(after.unwrap(), "STILL HERE");
    assert_eq!(w.server.rpc_stats().bg_panics, 1);
    assert_eq!(w.client.pending_calls(), 0);
}

#[test]
fn a_panicking_event_loop_handler_ends_the_server_and_its_callers_learn_it() {
    let mut w = world(EndpointConfig::default());
    let s = w.connect();
    let api = w.client.client();
    // A call that the server answers, then the one whose handler panics
    // with another behind it in flight.
    let a = api.clone();
    assert_eq!(w.run(async move { a.call(s, Get(1)).await }).unwrap(), None);
    let mut boom = api.call(s, Boom(1));
    let mut behind = api.call(s, Echo(2, "behind".into()));
    assert!(poll_once(&mut boom).is_pending());
    assert!(poll_once(&mut behind).is_pending());
    // The panic leaves the server's event loop (as in the core, where a
    // panicking dispatch handler ends the thread that runs the Rpc).
    let mut panicked = None;
    for _ in 0..10_000 {
        w.client.run_once();
        let server = &mut w.server;
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.run_once()))
        {
            panicked = Some(p);
            break;
        }
        w.net.advance(STEP_NS);
    }
    let p = panicked.expect("the handler ran and panicked");
    let msg = p
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert_eq!(msg, "the event-loop handler panics on 1");
    // Its process is gone: its NIC and its Nexus fall silent. The client
    // alone runs on; its failure detection ends the session, and both
    // calls fail with the peer's failure.
    w.net.crash(w.server_ep);
    w.net
        .sm_hub()
        .set_cut_off(&erpc::Uri::parse("server:31850").unwrap(), true);
    let (mut r1, mut r2) = (None, None);
    for _ in 0..20_000 {
        w.client.run_once();
        w.net.advance(100 * STEP_NS);
        if r1.is_none()
            && let Poll::Ready(r) = poll_once(&mut boom)
        {
            r1 = Some(r);
        }
        if r2.is_none()
            && let Poll::Ready(r) = poll_once(&mut behind)
        {
            r2 = Some(r);
        }
        if r1.is_some() && r2.is_some() {
            break;
        }
    }
    for r in [r1.map(|r| r.map(|_| ())), r2.map(|r| r.map(|_| ()))] {
        let r = r.expect("the failure reached the call within 2 s of virtual time");
        assert!(
            matches!(
                r,
                Err(CallError::Rpc(RpcError::SessionEnded {
                    why: erpc::SessionEnd::PeerFailed,
                    ..
                }))
            ),
            "{r:?}"
        );
    }
    assert_eq!(w.client.pending_calls(), 0);
    // The server is not dropped: the panic left its Rpc with a request
    // in a handler, and the core's debug assertions refuse to free such a
    // request's buffers (erpc/src/session.rs, `into_buffers`). A process
    // whose event loop panicked does not run its Rpc's teardown either.
    let World { server, .. } = w;
    std::mem::forget(server);
}

//! The endpoint's executor: `!Send` tasks on the Rpc's thread, polled after
//! each event-loop iteration, only when woken.
//!
//! Why not `futures`' `LocalPool`: its `run_until_stalled` costs about 300
//! instructions per call even with no task ready (it drains its spawn
//! queue, registers a waker and walks its `FuturesUnordered`), and the
//! event loop calls it every iteration, often millions of times a second:
//! that alone cost the typed layer a tenth of the raw API's small-RPC rate
//! on the device model (BENCHMARKS.md, "Typed and async calls"). Here an
//! idle iteration costs one atomic swap and one length check.
//!
//! Each task has one waker for its life (an `Arc` made at spawn, so a wake
//! allocates nothing): waking it puts its number on the ready list, once
//! until it is polled again, and sets the `any` flag. The ready list sits
//! behind a mutex because a waker may be woken from another thread (a
//! future waiting on a channel fed by one); on the endpoint's own thread
//! the lock is never contended.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

type Task = Pin<Box<dyn Future<Output = ()>>>;

#[derive(Default)]
struct Ready {
    /// Some task is on `list`.
    any: AtomicBool,
    list: Mutex<Vec<usize>>,
}

struct TaskWaker {
    id: usize,
    /// On the ready list already.
    queued: AtomicBool,
    ready: Arc<Ready>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready
                .list
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.id);
            self.ready.any.store(true, Ordering::Release);
        }
    }
}

struct Slot {
    task: Task,
    waker: Waker,
    state: Arc<TaskWaker>,
}

/// Tasks spawned and not yet taken in by the executor (from handlers, or
/// from other tasks while the executor polls).
pub(crate) type Spawns = Rc<RefCell<Vec<Task>>>;

/// A handle that spawns tasks onto an [`Executor`].
#[derive(Clone, Default)]
pub(crate) struct Spawner {
    spawns: Spawns,
}

impl Spawner {
    pub(crate) fn spawn<F: Future<Output = ()> + 'static>(&self, f: F) {
        self.spawns.borrow_mut().push(Box::pin(f));
    }
}

/// The tasks of one endpoint.
#[derive(Default)]
pub(crate) struct Executor {
    tasks: Vec<Option<Slot>>,
    free: Vec<usize>,
    ready: Arc<Ready>,
    spawner: Spawner,
    /// The ready list, swapped out (two vectors, no allocation in steady
    /// state).
    batch: Vec<usize>,
}

impl Executor {
    pub(crate) fn spawner(&self) -> Spawner {
        self.spawner.clone()
    }

    /// Tasks not finished.
    pub(crate) fn len(&self) -> usize {
        self.tasks.len() - self.free.len()
    }

    /// True if no task is ready and none was spawned: the event loop's
    /// common case, a load and a length check.
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        !self.ready.any.load(Ordering::Acquire) && self.spawner.spawns.borrow().is_empty()
    }

    /// Polls every task that is ready (newly spawned, or woken) until none
    /// is.
    pub(crate) fn run_until_stalled(&mut self) {
        loop {
            let spawned = !self.spawner.spawns.borrow().is_empty();
            if spawned {
                let new = std::mem::take(&mut *self.spawner.spawns.borrow_mut());
                for t in new {
                    self.insert(t);
                }
            }
            if !self.ready.any.swap(false, Ordering::AcqRel) {
                return;
            }
            std::mem::swap(
                &mut self.batch,
                &mut *self.ready.list.lock().unwrap_or_else(|e| e.into_inner()),
            );
            let mut batch = std::mem::take(&mut self.batch);
            for &id in &batch {
                self.poll(id);
            }
            batch.clear();
            self.batch = batch;
        }
    }

    fn insert(&mut self, task: Task) {
        let id = self.free.pop().unwrap_or_else(|| {
            self.tasks.push(None);
            self.tasks.len() - 1
        });
        let state = Arc::new(TaskWaker {
            id,
            queued: AtomicBool::new(false),
            ready: self.ready.clone(),
        });
        let waker = Waker::from(state.clone());
        self.tasks[id] = Some(Slot { task, waker, state });
        // First poll: as if woken.
        self.tasks[id]
            .as_ref()
            .expect("just put")
            .waker
            .wake_by_ref();
    }

    fn poll(&mut self, id: usize) {
        let Some(slot) = self.tasks.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        slot.state.queued.store(false, Ordering::Release);
        let mut cx = Context::from_waker(&slot.waker);
        if let Poll::Ready(()) = slot.task.as_mut().poll(&mut cx) {
            self.tasks[id] = None;
            self.free.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A future that is pending until its flag is set, and wakes through
    /// the waker it stored.
    struct Gate(Rc<Cell<bool>>, Rc<RefCell<Option<Waker>>>);
    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0.get() {
                Poll::Ready(())
            } else {
                *self.1.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    #[test]
    fn tasks_run_when_spawned_and_when_woken() {
        let mut ex = Executor::default();
        let open = Rc::new(Cell::new(false));
        let waker = Rc::new(RefCell::new(None));
        let log = Rc::new(RefCell::new(Vec::new()));
        let (o, w, l) = (open.clone(), waker.clone(), log.clone());
        let sp = ex.spawner();
        ex.spawner().spawn(async move {
            l.borrow_mut().push("start");
            Gate(o, w).await;
            l.borrow_mut().push("gate");
            // A task spawned by a task runs in the same call.
            let l2 = l.clone();
            sp.spawn(async move { l2.borrow_mut().push("child") });
        });
        ex.run_until_stalled();
        assert_eq!(*log.borrow(), ["start"]);
        assert_eq!(ex.len(), 1);
        // Not woken: not polled.
        ex.run_until_stalled();
        assert_eq!(*log.borrow(), ["start"]);
        open.set(true);
        let w = waker.borrow_mut().take().unwrap();
        w.wake_by_ref();
        w.wake(); // twice: queued once
        ex.run_until_stalled();
        assert_eq!(*log.borrow(), ["start", "gate", "child"]);
        assert_eq!(ex.len(), 0);
        // Slots are reused.
        ex.spawner().spawn(async {});
        ex.run_until_stalled();
        assert_eq!(ex.tasks.len(), 1);
    }
}

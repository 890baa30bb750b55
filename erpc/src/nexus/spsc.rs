//! A bounded single-producer single-consumer ring whose values go out and
//! come back: how an Rpc hands jobs to a worker thread and gets them back.
//!
//! One of the crate's `unsafe` modules (see the crate documentation). The
//! ring is a power-of-two array of slots, each on cache lines of its own
//! with a state byte next to the value: `FREE` (nothing, or a value
//! already taken back), `QUEUED` (a value waiting for the worker), `DONE`
//! (a value the worker is finished with). The owner keeps `tail` (values
//! put in) and `head` (values taken back out) to itself; the worker keeps
//! `done` (values it finished). At all times
//! `head <= done <= tail <= head + capacity`, and
//!
//! * slots in `head..done` hold values the worker is finished with: only
//!   the owner touches them (it moves them out, advancing `head`);
//! * slots in `done..tail` hold values waiting for the worker: only the
//!   worker touches them, in order, in place (no copy), advancing `done`;
//! * the other slots hold nothing: only the owner touches them (it writes
//!   a new value at `tail`).
//!
//! Neither end reads a counter of the other: the worker learns that slot
//! `done` is ready from its state, the owner that slot `head` is finished
//! from its state, so a hand-off moves the slot's lines between the cores
//! and nothing else (no separate index lines). The ends are separate
//! handles, [`Owner`] and [`Worker`], neither `Clone` nor `Sync`, and
//! every operation takes `&mut` of its end, so each region has one thread
//! touching it at a time. A value is moved in once and out once; the
//! worker works on it where it lies.
//!
//! Barriers, by purpose:
//!
//! * **publish** — the owner's `Release` store of `QUEUED` after writing
//!   the value, paired with the worker's `Acquire` load of the state: the
//!   worker sees the value once it sees it queued.
//! * **hand back** — the worker's `Release` store of `DONE` after it is
//!   finished with the value, paired with the owner's `Acquire` load of
//!   the state: the owner sees the worker's writes (and moves the value
//!   out) only after the worker stopped touching it.
//!
//! A slot's state goes `QUEUED` (owner) then `DONE` (worker), lap after
//! lap; the owner never stores anything when it takes a value out. A
//! worker looking at slot `done` before the owner filled it for this lap
//! sees the `DONE` it stored itself a lap ago (or `FREE`), not `QUEUED`;
//! an owner looking at slot `head` sees its own `QUEUED` until the worker
//! stores `DONE`. No allocation, lock or system call per value; the array
//! is allocated once when the ring is made. Measured against crossbeam's
//! `ArrayQueue` and `std::sync::mpsc` in `benches/handoff.rs`
//! (BENCHMARKS.md, "Worker hand-off").

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Slot states.
const FREE: u8 = 0;
const QUEUED: u8 = 1;
const DONE: u8 = 2;

/// A slot, starting on a cache line of its own (a value never shares a
/// line with its neighbours: each is handed between the threads
/// separately), its state first.
#[repr(C, align(64))]
struct Slot<T> {
    state: AtomicU8,
    value: UnsafeCell<MaybeUninit<T>>,
}

struct Ring<T> {
    slots: Box<[Slot<T>]>,
    mask: usize,
    /// The owner's `head` and `tail`, stored when its end is dropped (so
    /// that the ring, dropped after both ends, knows which slots hold
    /// values).
    head_at_drop: AtomicUsize,
    tail_at_drop: AtomicUsize,
}

// SAFETY: the ring moves `T` values from the owner's thread to the
// worker's (which mutates them in place) and back, so `T: Send` is
// required and enough: a slot is touched by one end at a time (see the
// module documentation), never shared.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as above; the ring owns `T` values and may drop them on any
// thread (`Drop`), which `T: Send` allows.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // Both ends are gone (each owns an `Arc`): exclusive access, and
        // the `Arc`'s last release orders every earlier access before this.
        let head = *self.head_at_drop.get_mut();
        let tail = *self.tail_at_drop.get_mut();
        for i in head..tail {
            // SAFETY: slots in `head..tail` hold initialised values that
            // the owner never moved out (it moves out only below `head`);
            // each is dropped once, here, and the ring is never used again.
            unsafe { (*self.slots[i & self.mask].value.get()).assume_init_drop() };
        }
    }
}

/// The end that puts values in and takes them back out.
pub(crate) struct Owner<T> {
    ring: Arc<Ring<T>>,
    /// Values put in (only we use it).
    tail: usize,
    /// Values taken back out (only we use it).
    head: usize,
}

/// The end that works on the values in place.
pub(crate) struct Worker<T> {
    ring: Arc<Ring<T>>,
    /// Values finished (only we use it).
    done: usize,
}

impl<T> fmt::Debug for Owner<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Owner({} out of {})",
            self.tail - self.head,
            self.ring.slots.len()
        )
    }
}

impl<T> fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Worker(done {})", self.done)
    }
}

impl<T> Drop for Owner<T> {
    fn drop(&mut self) {
        // Read by the ring's own drop, after the `Arc`'s last release.
        self.ring.head_at_drop.store(self.head, Ordering::Relaxed);
        self.ring.tail_at_drop.store(self.tail, Ordering::Relaxed);
    }
}

/// A ring of at least `capacity` slots (rounded up to a power of two, at
/// least 1), as its two ends.
pub(crate) fn ring<T: Send>(capacity: usize) -> (Owner<T>, Worker<T>) {
    let cap = capacity.max(1).next_power_of_two();
    let ring = Arc::new(Ring {
        slots: (0..cap)
            .map(|_| Slot {
                state: AtomicU8::new(FREE),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect(),
        mask: cap - 1,
        head_at_drop: AtomicUsize::new(0),
        tail_at_drop: AtomicUsize::new(0),
    });
    (
        Owner {
            ring: ring.clone(),
            tail: 0,
            head: 0,
        },
        Worker { ring, done: 0 },
    )
}

impl<T: Send> Owner<T> {
    /// Slots in the ring.
    pub(crate) fn capacity(&self) -> usize {
        self.ring.slots.len()
    }

    /// Values put in and not yet taken back out.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head)
    }

    /// Puts `v` in for the worker, or gives it back if the ring is full.
    #[inline]
    pub(crate) fn push(&mut self, v: T) -> Result<(), T> {
        let ring = &*self.ring;
        if self.len() == ring.slots.len() {
            return Err(v);
        }
        let slot = &ring.slots[self.tail & ring.mask];
        // SAFETY: `tail - head < capacity`, so slot `tail` is outside
        // `head..tail`: it holds no value (its last one was moved out
        // before `head` passed it), and the worker does not touch it: its
        // state is the worker's own `DONE` of a lap ago (or `FREE`), and
        // the worker works on a slot only once it reads `QUEUED`, which we
        // store below. We are the only owner (`&mut self`).
        unsafe { (*slot.value.get()).write(v) };
        // Publish: the value is written before the worker can see it queued.
        slot.state.store(QUEUED, Ordering::Release);
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Takes back the oldest value the worker is finished with, if any.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.head == self.tail {
            return None;
        }
        let ring = &*self.ring;
        let slot = &ring.slots[self.head & ring.mask];
        // Hand back (the pairing load): once the worker stored `DONE`, its
        // writes to the value are visible and it no longer touches it.
        if slot.state.load(Ordering::Acquire) != DONE {
            return None;
        }
        // SAFETY: slot `head` is in `head..tail` and the worker is finished
        // with it (`DONE` of this lap: we stored `QUEUED` for it ourselves,
        // so an older `DONE` cannot be what we read) and never touches it
        // again this lap; we are the only owner (`&mut self`), and the
        // value is moved out exactly once: `head` passes the slot next.
        let v = unsafe { (*slot.value.get()).assume_init_read() };
        self.head = self.head.wrapping_add(1);
        Some(v)
    }
}

impl<T: Send> Worker<T> {
    /// The slot of the next value for the worker, if one is queued.
    #[inline]
    fn next_queued(&self) -> Option<&Slot<T>> {
        let slot = &self.ring.slots[self.done & self.ring.mask];
        // Publish (the pairing load): a value seen queued is written.
        (slot.state.load(Ordering::Acquire) == QUEUED).then_some(slot)
    }

    /// The next value waiting for the worker, if any (without finishing
    /// it).
    #[inline]
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn peek(&mut self) -> Option<&T> {
        let slot = self.next_queued()?;
        // SAFETY: the slot is `QUEUED` for this lap: the owner published a
        // value in it (the Acquire above) and will not touch it until we
        // store `DONE`; the shared borrow ends before any `&mut` of ours
        // (`&mut self`).
        Some(unsafe { (*slot.value.get()).assume_init_ref() })
    }

    /// Runs `f` on the next value waiting for the worker, in place, and
    /// hands it back to the owner. False if no value was waiting.
    #[inline]
    pub(crate) fn process(&mut self, f: impl FnOnce(&mut T)) -> bool {
        let Some(slot) = self.next_queued() else {
            return false;
        };
        // SAFETY: as in `peek`: the slot is ours alone until the store of
        // `DONE` below; `&mut self` makes this the only reference into it
        // on our side.
        f(unsafe { (*slot.value.get()).assume_init_mut() });
        // Hand back: our writes to the value are done before the owner can
        // see it finished.
        slot.state.store(DONE, Ordering::Release);
        self.done = self.done.wrapping_add(1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_out_and_come_back_in_order() {
        let (mut o, mut w) = ring::<u32>(3);
        assert_eq!(o.capacity(), 4);
        assert!(o.pop().is_none());
        assert!(!w.process(|_| unreachable!()));
        for i in 0..4 {
            o.push(i).unwrap();
        }
        assert_eq!(o.push(9), Err(9));
        // Nothing comes back before the worker is finished with it.
        assert!(o.pop().is_none());
        assert_eq!(w.peek(), Some(&0));
        assert!(w.process(|v| *v += 10));
        assert!(w.process(|v| *v += 10));
        assert_eq!(o.pop(), Some(10));
        assert_eq!(o.len(), 3);
        o.push(4).unwrap();
        assert_eq!(o.push(9), Err(9), "taken out, but 3 still at the worker");
        while w.process(|v| *v += 10) {}
        assert_eq!(
            (0..4).map(|_| o.pop().unwrap()).collect::<Vec<_>>(),
            vec![11, 12, 13, 14]
        );
        assert!(o.pop().is_none());
        assert_eq!(o.len(), 0);
    }

    #[test]
    fn values_left_in_the_ring_are_dropped_once() {
        let marker = Arc::new(());
        {
            let (mut o, mut w) = ring::<Arc<()>>(4);
            for _ in 0..4 {
                o.push(marker.clone()).unwrap();
            }
            assert!(w.process(|_| {}));
            assert!(w.process(|_| {}));
            drop(o.pop());
            assert_eq!(Arc::strong_count(&marker), 4);
            // The owner goes first (an Rpc that stopped waiting), then the
            // worker: three values left, one of them finished.
            drop(o);
            assert_eq!(Arc::strong_count(&marker), 4);
            drop(w);
        }
        assert_eq!(Arc::strong_count(&marker), 1);
    }

    #[test]
    fn a_million_values_cross_threads_and_back_in_order() {
        // Wraps a small ring many times; every wait is for the other
        // thread's progress (no timing).
        let (mut o, mut w) = ring::<u64>(8);
        let n = 1_000_000u64;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            let mut want = 0;
            while !s.load(Ordering::Relaxed) {
                if !w.process(|v| {
                    assert_eq!(*v, want);
                    want += 1;
                    *v *= 2;
                }) {
                    std::thread::yield_now();
                }
            }
        });
        let (mut sent, mut back) = (0, 0);
        while back < n {
            if sent < n && o.push(sent).is_ok() {
                sent += 1;
            }
            match o.pop() {
                Some(v) => {
                    assert_eq!(v, 2 * back);
                    back += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        assert!(o.pop().is_none());
    }
}

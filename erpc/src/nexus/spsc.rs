//! A bounded single-producer single-consumer ring whose values go out and
//! come back: how an Rpc hands jobs to a worker thread and gets them back.
//!
//! One of the crate's `unsafe` modules (see the crate documentation). The
//! ring is a power-of-two array of slots and two counters, each alone on
//! its cache line: `tail` (values put in, stored only by the owner) and
//! `done` (values the worker has finished with, stored only by the
//! worker). The owner also keeps `head` (values taken back out) to itself.
//! At all times `head <= done <= tail <= head + capacity`, and
//!
//! * slots in `head..done` hold values the worker is finished with: only
//!   the owner touches them (it moves them out, advancing `head`);
//! * slots in `done..tail` hold values waiting for the worker: only the
//!   worker touches them, in order, in place (no copy), advancing `done`;
//! * the other slots hold nothing: only the owner touches them (it writes
//!   a new value at `tail`).
//!
//! The ends are separate handles, [`Owner`] and [`Worker`], neither
//! `Clone` nor `Sync`, and every operation takes `&mut` of its end, so each
//! region has one thread touching it at a time. A value is moved in once
//! and out once; the worker works on it where it lies. Each end caches the
//! other's counter and reloads it only when the cached value says there is
//! nothing to do, so it touches the other end's cache line only then.
//!
//! Barriers, by purpose:
//!
//! * **publish** — the owner's `Release` store of `tail` after writing a
//!   value, paired with the worker's `Acquire` load of `tail`: the worker
//!   sees the value before it sees it counted.
//! * **hand back** — the worker's `Release` store of `done` after it is
//!   finished with a value, paired with the owner's `Acquire` load of
//!   `done`: the owner sees the worker's writes to the value (and moves it
//!   out) only after the worker stopped touching it.
//!
//! No allocation, lock or system call per value; the array is allocated
//! once when the ring is made. Measured against crossbeam's `ArrayQueue`
//! and `std::sync::mpsc` in `benches/handoff.rs` (BENCHMARKS.md, "Worker
//! hand-off").

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

struct Ring<T> {
    /// Values put in; stored by the owner only.
    tail: CachePadded<AtomicUsize>,
    /// Values the worker is finished with; stored by the worker only.
    done: CachePadded<AtomicUsize>,
    /// The owner's `head`, stored when the owner's end is dropped (so that
    /// the ring, dropped after both ends, knows which slots hold values).
    head_at_drop: AtomicUsize,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
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
        let tail = *self.tail.get_mut();
        for i in head..tail {
            // SAFETY: slots in `head..tail` hold initialised values that
            // the owner never moved out (it moves out only below `head`);
            // each is dropped once, here, and the ring is never used again.
            unsafe { (*self.slots[i & self.mask].get()).assume_init_drop() };
        }
    }
}

/// The end that puts values in and takes them back out.
pub(crate) struct Owner<T> {
    ring: Arc<Ring<T>>,
    /// Our copy of `tail` (we are its only writer).
    tail: usize,
    /// Values taken back out (only we use it).
    head: usize,
    /// `done` as last loaded: values below it are finished.
    done_seen: usize,
}

/// The end that works on the values in place.
pub(crate) struct Worker<T> {
    ring: Arc<Ring<T>>,
    /// Our copy of `done` (we are its only writer).
    done: usize,
    /// `tail` as last loaded: values below it are there.
    tail_seen: usize,
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
    }
}

/// A ring of at least `capacity` slots (rounded up to a power of two, at
/// least 1), as its two ends.
pub(crate) fn ring<T: Send>(capacity: usize) -> (Owner<T>, Worker<T>) {
    let cap = capacity.max(1).next_power_of_two();
    let ring = Arc::new(Ring {
        tail: CachePadded::new(AtomicUsize::new(0)),
        done: CachePadded::new(AtomicUsize::new(0)),
        head_at_drop: AtomicUsize::new(0),
        slots: (0..cap)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect(),
        mask: cap - 1,
    });
    (
        Owner {
            ring: ring.clone(),
            tail: 0,
            head: 0,
            done_seen: 0,
        },
        Worker {
            ring,
            done: 0,
            tail_seen: 0,
        },
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
        // SAFETY: `tail - head < capacity`, so slot `tail` is outside
        // `head..tail`: it holds no value (its last one was moved out
        // before `head` passed it), and the worker does not touch it (it
        // works only below `tail`, which it learns from our publish
        // below). We are the only owner (`&mut self`).
        unsafe { (*ring.slots[self.tail & ring.mask].get()).write(v) };
        self.tail = self.tail.wrapping_add(1);
        // Publish: the value is written before the worker can count it.
        ring.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Takes back the oldest value the worker is finished with, if any.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        let ring = &*self.ring;
        if self.head == self.done_seen {
            if self.head == self.tail {
                return None;
            }
            // Hand back (the pairing load): the worker's writes to values
            // below `done` are visible, and it no longer touches them.
            self.done_seen = ring.done.load(Ordering::Acquire);
            if self.head == self.done_seen {
                return None;
            }
        }
        // SAFETY: `head < done_seen <= done`: the worker is finished with
        // the value in slot `head` (the Acquire above pairs with its
        // Release store of `done`) and never touches it again; we are the
        // only owner (`&mut self`), and the value is moved out exactly
        // once: `head` passes the slot next.
        let v = unsafe { (*ring.slots[self.head & ring.mask].get()).assume_init_read() };
        self.head = self.head.wrapping_add(1);
        Some(v)
    }
}

impl<T: Send> Worker<T> {
    /// The next value waiting for the worker, if any (without finishing
    /// it).
    #[inline]
    pub(crate) fn peek(&mut self) -> Option<&T> {
        if !self.ready() {
            return None;
        }
        let ring = &*self.ring;
        // SAFETY: `done < tail_seen <= tail`: slot `done` holds a value the
        // owner published (the Acquire in `ready` pairs with its Release
        // store of `tail`) and will not touch until we hand it back; the
        // shared borrow ends before any `&mut` of ours (`&mut self`).
        Some(unsafe { (*ring.slots[self.done & ring.mask].get()).assume_init_ref() })
    }

    /// Runs `f` on the next value waiting for the worker, in place, and
    /// hands it back to the owner. False if no value was waiting.
    #[inline]
    pub(crate) fn process(&mut self, f: impl FnOnce(&mut T)) -> bool {
        if !self.ready() {
            return false;
        }
        let ring = &*self.ring;
        // SAFETY: as in `peek`: slot `done` is published and ours alone
        // until the store of `done` below; `&mut self` makes this the only
        // reference into it on our side.
        let v = unsafe { (*ring.slots[self.done & ring.mask].get()).assume_init_mut() };
        f(v);
        self.done = self.done.wrapping_add(1);
        // Hand back: our writes to the value are done before the owner can
        // count it finished.
        ring.done.store(self.done, Ordering::Release);
        true
    }

    /// True if a value waits (reloads `tail` if the cached one says none).
    #[inline]
    fn ready(&mut self) -> bool {
        if self.done == self.tail_seen {
            // Publish (the pairing load): values below `tail` are written.
            self.tail_seen = self.ring.tail.load(Ordering::Acquire);
            if self.done == self.tail_seen {
                return false;
            }
        }
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

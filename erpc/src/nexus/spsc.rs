//! A bounded single-producer single-consumer ring: how an Rpc hands jobs
//! to a worker thread and how the worker hands them back.
//!
//! One of the crate's `unsafe` modules (see the crate documentation). A
//! ring is a power-of-two array of slots and two counters, each alone on
//! its cache line: `tail` (slots written, stored only by the producer) and
//! `head` (slots read, stored only by the consumer). Slot `i % capacity`
//! holds a value exactly while `head <= i < tail`. The two ends are
//! separate handles, [`Producer`] and [`Consumer`], neither `Clone` nor
//! `Sync`; pushing takes `&mut Producer` and popping `&mut Consumer`, so
//! at any moment at most one thread writes slots (the producer, only slots
//! outside `head..tail`) and at most one reads them (the consumer, only
//! slots inside). Each end also caches the other's counter and reloads it
//! only when the cached value says full (or empty), so the common push or
//! pop touches the other end's cache line only when it has to.
//!
//! Barriers, by purpose:
//!
//! * **publish** — the producer's `Release` store of `tail` after writing
//!   the slot, paired with the consumer's `Acquire` load of `tail`: the
//!   consumer sees the value written before it sees the slot counted.
//! * **hand back** — the consumer's `Release` store of `head` after moving
//!   the value out, paired with the producer's `Acquire` load of `head`:
//!   the producer overwrites a slot only after the consumer is done with it.
//!
//! No allocation, lock or system call per push or pop; the array is
//! allocated once when the ring is made.
//!
//! Measured against crossbeam's `ArrayQueue` (multi-producer
//! multi-consumer: a compare-and-swap and a per-slot stamp per operation)
//! and `std::sync::mpsc` in `benches/handoff.rs`; see BENCHMARKS.md
//! ("Worker hand-off").

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

struct Ring<T> {
    /// Slots written (pushed); stored by the producer only.
    tail: CachePadded<AtomicUsize>,
    /// Slots read (popped); stored by the consumer only.
    head: CachePadded<AtomicUsize>,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
}

// SAFETY: the ring moves `T` values from the producer's thread to the
// consumer's, so `T: Send` is required and enough: a slot is accessed by
// one end at a time (see the module documentation), never shared.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as above; the ring owns `T` values and may drop them on any
// thread (`Drop`), which `T: Send` allows.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // Both handles are gone (they own the `Arc`s): exclusive access.
        let head = *self.head.get_mut();
        let tail = *self.tail.get_mut();
        for i in head..tail {
            // SAFETY: slots in `head..tail` hold initialised values that
            // nobody moved out (the consumer moves out only below `head`);
            // each is dropped once, here, and the ring is never used again.
            unsafe { (*self.slots[i & self.mask].get()).assume_init_drop() };
        }
    }
}

/// The writing end of a ring.
pub(crate) struct Producer<T> {
    ring: Arc<Ring<T>>,
    /// Our copy of `tail` (we are its only writer).
    tail: usize,
    /// `head` as last loaded: the ring has at least `tail - head_seen`
    /// values in it, so room is certain below `head_seen + capacity`.
    head_seen: usize,
}

/// The reading end of a ring.
pub(crate) struct Consumer<T> {
    ring: Arc<Ring<T>>,
    /// Our copy of `head` (we are its only writer).
    head: usize,
    /// `tail` as last loaded: values up to it are certainly there.
    tail_seen: usize,
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Producer(tail {}, capacity {})",
            self.tail,
            self.ring.slots.len()
        )
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Consumer(head {}, capacity {})",
            self.head,
            self.ring.slots.len()
        )
    }
}

/// A ring of at least `capacity` slots (rounded up to a power of two, at
/// least 1), as its two ends.
pub(crate) fn ring<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let cap = capacity.max(1).next_power_of_two();
    let ring = Arc::new(Ring {
        tail: CachePadded::new(AtomicUsize::new(0)),
        head: CachePadded::new(AtomicUsize::new(0)),
        slots: (0..cap)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect(),
        mask: cap - 1,
    });
    (
        Producer {
            ring: ring.clone(),
            tail: 0,
            head_seen: 0,
        },
        Consumer {
            ring,
            head: 0,
            tail_seen: 0,
        },
    )
}

impl<T: Send> Producer<T> {
    /// Slots in the ring.
    pub(crate) fn capacity(&self) -> usize {
        self.ring.slots.len()
    }

    /// Appends `v`, or gives it back if the ring is full.
    #[inline]
    pub(crate) fn push(&mut self, v: T) -> Result<(), T> {
        let ring = &*self.ring;
        if self.tail.wrapping_sub(self.head_seen) == ring.slots.len() {
            // Hand back: the consumer is done with slots below `head`.
            self.head_seen = ring.head.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head_seen) == ring.slots.len() {
                return Err(v);
            }
        }
        // SAFETY: `tail - head < capacity`, so slot `tail` is outside
        // `head..tail`: the consumer does not touch it (it reads only
        // inside, and only after our publish below), and it holds no value
        // (its last one, if any, was moved out before `head` passed it).
        // We are the only producer (`&mut self`).
        unsafe { (*ring.slots[self.tail & ring.mask].get()).write(v) };
        self.tail = self.tail.wrapping_add(1);
        // Publish: the value is written before the consumer can count it.
        ring.tail.store(self.tail, Ordering::Release);
        Ok(())
    }
}

impl<T: Send> Consumer<T> {
    /// Takes the oldest value, if any.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        if !self.ready() {
            return None;
        }
        let ring = &*self.ring;
        // SAFETY: `head < tail_seen <= tail`: the slot holds a value the
        // producer published (the Acquire in `ready` pairs with its
        // Release store of `tail`) and will not touch until we hand it
        // back below. We are the only consumer (`&mut self`), and the
        // value is moved out exactly once: `head` passes the slot next.
        let v = unsafe { (*ring.slots[self.head & ring.mask].get()).assume_init_read() };
        self.head = self.head.wrapping_add(1);
        // Hand back: the value is out before the producer may overwrite
        // the slot.
        ring.head.store(self.head, Ordering::Release);
        Some(v)
    }

    /// True if a value is ready to pop (reloads `tail` if the cached one
    /// says empty).
    #[inline]
    pub(crate) fn ready(&mut self) -> bool {
        if self.head == self.tail_seen {
            // Publish (the pairing load): values up to `tail` are written.
            self.tail_seen = self.ring.tail.load(Ordering::Acquire);
            if self.head == self.tail_seen {
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
    fn fills_to_its_capacity_and_keeps_order() {
        let (mut p, mut c) = ring::<u32>(3);
        assert_eq!(p.capacity(), 4);
        assert!(c.pop().is_none());
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9));
        assert_eq!(c.pop(), Some(0));
        p.push(4).unwrap();
        assert_eq!(p.push(9), Err(9));
        assert_eq!(
            (1..=4).map(|_| c.pop().unwrap()).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert!(c.pop().is_none());
        assert!(!c.ready());
    }

    #[test]
    fn values_left_in_the_ring_are_dropped_once() {
        let marker = Arc::new(());
        {
            let (mut p, mut c) = ring::<Arc<()>>(4);
            for _ in 0..4 {
                p.push(marker.clone()).unwrap();
            }
            drop(c.pop());
            assert_eq!(Arc::strong_count(&marker), 4);
            drop(p);
            drop(c);
        }
        assert_eq!(Arc::strong_count(&marker), 1);
    }

    #[test]
    fn a_million_values_cross_threads_in_order() {
        // Wraps the counters' slots many times over a small ring; every
        // wait is for the other thread's progress (no timing).
        let (mut p, mut c) = ring::<u64>(8);
        let n = 1_000_000u64;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                match p.push(i) {
                    Ok(()) => i += 1,
                    Err(_) => std::thread::yield_now(),
                }
            }
        });
        let mut want = 0;
        while want < n {
            match c.pop() {
                Some(v) => {
                    assert_eq!(v, want);
                    want += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
        assert!(c.pop().is_none());
    }
}

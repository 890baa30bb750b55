//! Publication: how a datapath thread hands a snapshot to the socket
//! thread without ever waiting for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Instant;

/// An atomic on a cache line of its own, so that the datapath's read of
/// the request generation never shares a line with anything written often.
#[repr(align(128))]
pub(crate) struct Padded(pub(crate) AtomicU64);

/// The request generation: bumped by the socket thread when a client asks
/// for a snapshot, read by every publisher's [`Publisher::wanted`].
pub(crate) static GENERATION: Padded = Padded(AtomicU64::new(0));

/// The last generation whose request asked for whole descriptor rings.
pub(crate) static RINGS_GENERATION: Padded = Padded(AtomicU64::new(0));

/// What one publisher last stored.
#[derive(Debug)]
pub struct Latest<T> {
    /// The snapshot.
    pub value: Arc<T>,
    /// The request generation it answered.
    pub generation: u64,
    /// When it was stored.
    pub at: Instant,
}

impl<T> Clone for Latest<T> {
    fn clone(&self) -> Self {
        Latest {
            value: self.value.clone(),
            generation: self.generation,
            at: self.at,
        }
    }
}

impl<T> Latest<T> {
    /// How this snapshot relates to the request being answered.
    pub fn info(&self, requested: u64) -> PublishInfo {
        PublishInfo {
            generation: self.generation,
            age_ms: self.at.elapsed().as_secs_f64() * 1e3,
            fresh: self.generation >= requested,
        }
    }
}

/// When a published snapshot was taken, as every snapshot section reports
/// it (JSON keys `generation`, `age_ms`, `fresh`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PublishInfo {
    /// The request generation the snapshot answered.
    pub generation: u64,
    /// Milliseconds between publication and this answer.
    pub age_ms: f64,
    /// True if it answered this request (false: the thread did not run its
    /// event loop within the timeout, and this is an older snapshot).
    pub fresh: bool,
}

/// The socket thread's side of one publisher.
#[derive(Debug)]
pub struct Slot<T> {
    latest: Mutex<Option<Latest<T>>>,
    published: AtomicU64,
    closed: AtomicBool,
}

impl<T> Slot<T> {
    /// The last snapshot, if any.
    pub fn latest(&self) -> Option<Latest<T>> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True if the publisher is alive and has not answered `generation`.
    pub fn pending(&self, generation: u64) -> bool {
        !self.is_closed() && self.published.load(Ordering::Acquire) < generation
    }

    /// True once the publisher is gone (its owner was dropped).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// What a publisher must build: the generation it answers and whether
/// whole descriptor rings were asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// The generation the snapshot will answer.
    pub generation: u64,
    /// A client asked for whole descriptor rings (`--cqe`, `--wqe`) since
    /// this publisher last published.
    pub rings: bool,
}

/// The datapath thread's side: owned by the object whose state it
/// publishes, used only from that object's thread.
#[derive(Debug)]
pub struct Publisher<T> {
    slot: Arc<Slot<T>>,
    seen: u64,
}

impl<T> Publisher<T> {
    /// A new publisher and the slot the socket thread reads. If a request
    /// is already out, the first [`Publisher::wanted`] answers it.
    pub fn new() -> (Publisher<T>, Arc<Slot<T>>) {
        let now = GENERATION.0.load(Ordering::Acquire);
        let seen = now.saturating_sub(1);
        let slot = Arc::new(Slot {
            latest: Mutex::new(None),
            published: AtomicU64::new(seen),
            closed: AtomicBool::new(false),
        });
        (
            Publisher {
                slot: slot.clone(),
                seen,
            },
            slot,
        )
    }

    /// True if a client asked for a snapshot this publisher has not
    /// answered: one relaxed load and a compare, the datapath's whole cost
    /// while nobody is attached.
    #[inline(always)]
    pub fn wanted(&self) -> bool {
        GENERATION.0.load(Ordering::Relaxed) != self.seen
    }

    /// Starts answering: which generation, and whether rings were asked
    /// for. Call after [`Publisher::wanted`], build the snapshot, then
    /// [`Publisher::publish`].
    #[cold]
    pub fn begin(&self) -> Pending {
        let generation = GENERATION.0.load(Ordering::Acquire);
        Pending {
            generation,
            rings: RINGS_GENERATION.0.load(Ordering::Acquire) > self.seen,
        }
    }

    /// Stores the snapshot without waiting. Returns false if the socket
    /// thread held the slot just then: the request stays unanswered and
    /// [`Publisher::wanted`] stays true, so the caller tries again at its
    /// next check.
    #[cold]
    pub fn publish(&mut self, p: Pending, value: T) -> bool {
        let mut g = match self.slot.latest.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        *g = Some(Latest {
            value: Arc::new(value),
            generation: p.generation,
            at: Instant::now(),
        });
        drop(g);
        self.slot.published.store(p.generation, Ordering::Release);
        self.seen = p.generation;
        true
    }
}

impl<T> Drop for Publisher<T> {
    fn drop(&mut self) {
        self.slot.closed.store(true, Ordering::Release);
    }
}

/// Bumps the generation for a new request and returns it (the caller
/// serializes calls and paces them).
pub(crate) fn bump(rings: bool) -> u64 {
    let next = GENERATION.0.load(Ordering::Acquire) + 1;
    if rings {
        RINGS_GENERATION.0.store(next, Ordering::Release);
    }
    GENERATION.0.store(next, Ordering::Release);
    next
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The generation is process-wide; tests that bump it run one at a time.
    pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn publishes_once_per_request_and_reports_rings() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let (mut p, slot) = Publisher::<u32>::new();
        if p.wanted() {
            // An earlier test asked: a new publisher answers the last
            // request once.
            assert!(p.publish(p.begin(), 0));
        }
        assert!(!p.wanted());
        let g1 = bump(false);
        assert!(p.wanted());
        assert!(slot.pending(g1));
        let pend = p.begin();
        assert_eq!(
            pend,
            Pending {
                generation: g1,
                rings: false
            }
        );
        assert!(p.publish(pend, 7));
        assert!(!p.wanted());
        assert!(!slot.pending(g1));
        let l = slot.latest().unwrap();
        assert_eq!((*l.value, l.generation), (7, g1));
        assert!(l.info(g1).fresh);
        let g2 = bump(true);
        assert!(!l.info(g2).fresh);
        assert!(p.wanted());
        assert!(
            p.begin().rings,
            "rings were asked for after our last publication"
        );
        assert!(p.publish(p.begin(), 8));
        // The rings request was answered; a plain request does not ask again.
        bump(false);
        assert!(!p.begin().rings);
        assert!(g2 > g1);
    }

    #[test]
    fn a_held_slot_makes_publish_retry_and_a_dropped_publisher_is_not_waited_for() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let (mut p, slot) = Publisher::<u32>::new();
        let g = bump(false);
        let held = slot.latest.lock().unwrap();
        assert!(!p.publish(p.begin(), 1), "the slot is held: no waiting");
        assert!(p.wanted(), "still owed");
        drop(held);
        assert!(p.publish(p.begin(), 2));
        let g2 = bump(false);
        assert!(slot.pending(g2));
        drop(p);
        assert!(!slot.pending(g2), "a closed publisher is not waited for");
        assert!(slot.is_closed());
        assert_eq!(*slot.latest().unwrap().value, 2);
        assert!(g2 > g);
    }

    #[test]
    fn a_publisher_created_after_a_request_answers_it() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let g = bump(false);
        let (p, slot) = Publisher::<u32>::new();
        assert!(p.wanted());
        assert!(slot.pending(g));
    }
}

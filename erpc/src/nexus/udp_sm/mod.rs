//! Session management over kernel UDP ([`UdpSmLink`]), and how it turns the
//! hostnames SM packets name into addresses without ever blocking an Rpc
//! thread or the SM thread.
//!
//! The destination of an SM packet is a hostname taken from a packet (the
//! client endpoint of a request we answer) or from the application (the
//! URI of `create_session`). Resolving a name may block for seconds (DNS),
//! and names from packets are chosen by whoever sent them. So:
//!
//! * An IPv4 literal ("10.0.0.2") is parsed on the spot: no lookup.
//! * Any other name is looked up by the link's resolver thread, never by
//!   the sender. A packet to a name not yet resolved waits in a bounded
//!   queue (at most [`PENDING_PER_NAME`] per name, [`MAX_PENDING`] in all)
//!   and is sent by the resolver thread when the answer comes; the sender
//!   returns at once. (The SM thread would be the wrong place: it answers
//!   keep-alive pings, and a slow lookup there would get this process
//!   declared failed by its peers.)
//! * Answers are cached, positive and negative, in a table of at most
//!   [`MAX_CACHE`] names (the oldest answer is forgotten first). A positive
//!   answer is used for [`POSITIVE_TTL_MS`] and then looked up again in the
//!   background while the old address stays in use; a negative one makes
//!   packets to that name fail at once (counted) for [`NEGATIVE_TTL_MS`].
//! * At most [`MAX_LOOKUPS`] lookups wait or run at a time: a flood of
//!   packets naming fresh hostnames costs a bounded queue, and packets
//!   beyond it are dropped and counted (SM requests are retried).
//!
//! # Sending from an Rpc thread
//!
//! Rpc threads send SM packets (connect and disconnect requests and their
//! answers) through [`SmLink::send`], and an Rpc thread must never block:
//! so a send there makes no blocking system call and never waits for a
//! lock. It takes the socket under a read lock it only *tries* (held for
//! writing only while the link starts and stops), sends an IPv4 literal
//! at once, and looks a hostname up in the address cache under a mutex it
//! only tries too. Every `sendto` is non-blocking (`MSG_DONTWAIT`; the
//! socket itself stays blocking for the SM thread's timed receive). What
//! cannot go out at once — a lock held by another thread, a name without
//! a fresh cached address, a full socket send buffer (`EAGAIN`) — is
//! handed to the SM thread through a bounded lock-free queue of
//! [`MAX_DEFERRED`] packets, which it sends at its next wake-up (within
//! its poll interval, at most 20 ms), again without blocking: a packet
//! that meets a full buffer again is queued again. Only a packet that
//! finds that queue full is lost, and it is counted
//! ([`UdpSmStats::deferred_dropped`]); SM requests are retried anyway.
//!
//! # Sources
//!
//! The SM thread hands every datagram to the router with its source
//! address, and the address a URI resolves to as far as the cache knows it
//! (an IPv4 literal, or a cached answer; never a lookup), so that a packet
//! is believed about its sender only if it came from the sender's address
//! (see `nexus::liveness`).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, SockaddrStorage, sendto};

use super::sm_link::{SmLink, SmRouter, SmSource};
use super::{NexusError, Uri};
use crate::sm_types::SM_PKT_BYTES;

/// Names whose answers are cached.
pub(super) const MAX_CACHE: usize = 1024;
/// How long a positive answer is used before it is looked up again (in
/// the background; the old address serves meanwhile).
pub(super) const POSITIVE_TTL_MS: u64 = 60_000;
/// How long a name that did not resolve makes sends to it fail at once.
pub(super) const NEGATIVE_TTL_MS: u64 = 5_000;
/// Lookups waiting or running at once.
pub(super) const MAX_LOOKUPS: usize = 16;
/// Packets waiting for lookups, in all.
pub(super) const MAX_PENDING: usize = 256;
/// Packets waiting for one name's lookup.
pub(super) const PENDING_PER_NAME: usize = 8;
/// Packets an Rpc thread (or the resolver thread) could not send at once,
/// waiting for the SM thread.
pub(super) const MAX_DEFERRED: usize = 1024;

const _: () = assert!(MAX_LOOKUPS <= MAX_CACHE && PENDING_PER_NAME <= MAX_PENDING);

/// How often the SM thread wakes to check for shutdown.
const SM_THREAD_POLL_MS: u64 = 20;

/// Turns a host and port into an IPv4 socket address. May block (DNS);
/// runs only on the link's resolver thread.
pub type Resolver = Arc<dyn Fn(&str, u16) -> Option<SocketAddr> + Send + Sync>;

/// The system resolver (`getaddrinfo`), first IPv4 answer.
pub fn system_resolver() -> Resolver {
    Arc::new(|host: &str, port: u16| {
        (host, port)
            .to_socket_addrs()
            .ok()?
            .find(SocketAddr::is_ipv4)
    })
}

/// Counters of a [`UdpSmLink`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpSmStats {
    /// Packets handed to the kernel.
    pub sent: u64,
    /// Sends the kernel refused.
    pub send_errors: u64,
    /// Packets dropped because their name did not resolve (now, or within
    /// the negative-answer time).
    pub unresolved: u64,
    /// Packets dropped because too many lookups or waiting packets were
    /// queued already.
    pub queue_full: u64,
    /// Lookups made (on the resolver thread).
    pub lookups: u64,
    /// Lookups that found no IPv4 address.
    pub lookup_failures: u64,
    /// Packets sent before the link started or after it stopped (dropped).
    pub not_started: u64,
    /// Packets handed to the SM thread instead of sent at once (a lock
    /// held by another thread, a name not freshly cached, or a full
    /// socket buffer).
    pub deferred: u64,
    /// Sends the kernel refused for a full socket buffer (`EAGAIN`,
    /// `ENOBUFS`): handed to the SM thread to retry.
    pub would_block: u64,
    /// Packets lost because the SM thread's queue of deferred packets was
    /// full.
    pub deferred_dropped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Never answered yet.
    Unknown,
    Addr(SocketAddr),
    NoAddr,
}

#[derive(Debug)]
struct Entry {
    answer: Answer,
    /// When the answer came (ns since the link was made).
    at_ns: u64,
    /// A lookup of this name is queued or running.
    looking_up: bool,
}

/// What to do with one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Send it to this address now.
    Send(SocketAddr),
    /// Send it to this address now, and look the name up again.
    SendAndRefresh(SocketAddr),
    /// It waits for the lookup of its name; start that lookup.
    QueuedLookUp,
    /// It waits for the lookup already under way.
    Queued,
    /// The name did not resolve recently.
    Unresolved,
    /// No room for another waiting packet or lookup.
    Full,
}

/// The address cache and the packets waiting for lookups. Pure state:
/// time is passed in, so the rules are tested without a clock or DNS.
#[derive(Debug, Default)]
struct AddrBook {
    entries: HashMap<Uri, Entry>,
    pending: VecDeque<(Uri, [u8; SM_PKT_BYTES])>,
    lookups: usize,
}

impl AddrBook {
    /// Decides what happens to `pkt` for `to` at `now_ns`; queues it when
    /// it has to wait. A lookup the caller cannot start must be undone
    /// with [`AddrBook::lookup_refused`].
    fn route(&mut self, to: &Uri, pkt: &[u8; SM_PKT_BYTES], now_ns: u64) -> Route {
        if let Ok(ip) = to.host.parse::<Ipv4Addr>() {
            return Route::Send(SocketAddr::from((ip, to.port)));
        }
        let positive_ns = POSITIVE_TTL_MS * 1_000_000;
        let negative_ns = NEGATIVE_TTL_MS * 1_000_000;
        if let Some(e) = self.entries.get_mut(to) {
            match e.answer {
                Answer::Addr(a) => {
                    if now_ns.saturating_sub(e.at_ns) >= positive_ns
                        && !e.looking_up
                        && self.lookups < MAX_LOOKUPS
                    {
                        e.looking_up = true;
                        self.lookups += 1;
                        return Route::SendAndRefresh(a);
                    }
                    return Route::Send(a);
                }
                Answer::NoAddr if now_ns.saturating_sub(e.at_ns) < negative_ns => {
                    return Route::Unresolved;
                }
                Answer::NoAddr | Answer::Unknown => {}
            }
        }
        // The packet waits for a lookup.
        let waiting = self.pending.iter().filter(|(u, _)| u == to).count();
        if self.pending.len() >= MAX_PENDING || waiting >= PENDING_PER_NAME {
            return Route::Full;
        }
        let looking_up = self.entries.get(to).is_some_and(|e| e.looking_up);
        if !looking_up {
            if self.lookups >= MAX_LOOKUPS {
                return Route::Full;
            }
            self.make_room(to);
            let e = self.entries.entry(to.clone()).or_insert(Entry {
                answer: Answer::Unknown,
                at_ns: now_ns,
                looking_up: false,
            });
            e.looking_up = true;
            self.lookups += 1;
        }
        self.pending.push_back((to.clone(), *pkt));
        if looking_up {
            Route::Queued
        } else {
            Route::QueuedLookUp
        }
    }

    /// The address of `to` if it is an IPv4 literal or has a cached
    /// answer that need not be refreshed yet at `now_ns`: what an Rpc
    /// thread may send to at once. Changes nothing.
    fn fresh(&self, to: &Uri, now_ns: u64) -> Option<SocketAddr> {
        if let Ok(ip) = to.host.parse::<Ipv4Addr>() {
            return Some(SocketAddr::from((ip, to.port)));
        }
        let e = self.entries.get(to)?;
        match e.answer {
            Answer::Addr(a) if now_ns.saturating_sub(e.at_ns) < POSITIVE_TTL_MS * 1_000_000 => {
                Some(a)
            }
            _ => None,
        }
    }

    /// Where packets of the Nexus at `uri` come from, as far as known
    /// without a lookup: an IPv4 literal, or the last answer for the name
    /// (however old: a source check needs no fresh one).
    fn source_of(&self, uri: &Uri) -> Option<SocketAddr> {
        if let Ok(ip) = uri.host.parse::<Ipv4Addr>() {
            return Some(SocketAddr::from((ip, uri.port)));
        }
        match self.entries.get(uri)?.answer {
            Answer::Addr(a) => Some(a),
            Answer::Unknown | Answer::NoAddr => None,
        }
    }

    /// Keeps the table within [`MAX_CACHE`] names before `to` is added:
    /// forgets the oldest answer whose lookup is not under way.
    fn make_room(&mut self, to: &Uri) {
        if self.entries.len() < MAX_CACHE || self.entries.contains_key(to) {
            return;
        }
        let oldest = self
            .entries
            .iter()
            .filter(|(_, e)| !e.looking_up)
            .min_by_key(|(_, e)| e.at_ns)
            .map(|(u, _)| u.clone());
        if let Some(u) = oldest {
            self.entries.remove(&u);
        }
    }

    /// The lookup of `to` could not be started: its waiting packets are
    /// dropped; returns how many.
    fn lookup_refused(&mut self, to: &Uri) -> usize {
        if let Some(e) = self.entries.get_mut(to)
            && e.looking_up
        {
            e.looking_up = false;
            self.lookups -= 1;
            if e.answer == Answer::Unknown {
                self.entries.remove(to);
            }
        }
        let before = self.pending.len();
        self.pending.retain(|(u, _)| u != to);
        before - self.pending.len()
    }

    /// The lookup of `to` answered `addr` at `now_ns`: records it and takes
    /// the packets that waited for it, oldest first.
    fn answered(
        &mut self,
        to: &Uri,
        addr: Option<SocketAddr>,
        now_ns: u64,
    ) -> Vec<[u8; SM_PKT_BYTES]> {
        match self.entries.get_mut(to) {
            Some(e) => {
                if e.looking_up {
                    e.looking_up = false;
                    self.lookups -= 1;
                }
                // A failed refresh keeps the address we had.
                match (addr, e.answer) {
                    (Some(a), _) => e.answer = Answer::Addr(a),
                    (None, Answer::Addr(_)) => {}
                    (None, _) => e.answer = Answer::NoAddr,
                }
                e.at_ns = now_ns;
            }
            None => {
                self.make_room(to);
                self.entries.insert(
                    to.clone(),
                    Entry {
                        answer: addr.map_or(Answer::NoAddr, Answer::Addr),
                        at_ns: now_ns,
                        looking_up: false,
                    },
                );
            }
        }
        let mut out = Vec::new();
        self.pending.retain(|(u, p)| {
            if u == to {
                out.push(*p);
                false
            } else {
                true
            }
        });
        out
    }
}

/// State shared by the senders (Rpc threads, the SM thread) and the
/// resolver thread.
struct Shared {
    born: Instant,
    /// Written only when the link starts and stops; senders on Rpc threads
    /// only try to read it.
    socket: RwLock<Option<Arc<UdpSocket>>>,
    book: Mutex<AddrBook>,
    lookups_tx: Mutex<Option<SyncSender<Uri>>>,
    /// Packets for the SM thread to send (see the module documentation).
    deferred: ArrayQueue<(Uri, [u8; SM_PKT_BYTES])>,
    /// The Nexus's router, told about names that do not resolve (so that
    /// sessions connecting to them fail at once, by that name).
    router: Mutex<Option<Arc<SmRouter>>>,
    stop: AtomicBool,
    sent: AtomicU64,
    send_errors: AtomicU64,
    unresolved: AtomicU64,
    queue_full: AtomicU64,
    lookups: AtomicU64,
    lookup_failures: AtomicU64,
    not_started: AtomicU64,
    deferred_count: AtomicU64,
    would_block: AtomicU64,
    deferred_dropped: AtomicU64,
    /// Tests: this many next sends meet a full socket buffer.
    #[cfg(test)]
    fake_full: std::sync::atomic::AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.born.elapsed().as_nanos() as u64
    }

    fn socket(&self) -> Option<Arc<UdpSocket>> {
        self.socket
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Leaves `pkt` for the SM thread to send; counts it lost if its queue
    /// is full.
    fn defer(&self, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        match self.deferred.push((to.clone(), *pkt)) {
            Ok(()) => self.deferred_count.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.deferred_dropped.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// One non-blocking `sendto`; a full socket buffer hands the packet to
    /// the SM thread.
    fn send_to(&self, sock: &UdpSocket, to: &Uri, pkt: &[u8; SM_PKT_BYTES], a: SocketAddr) {
        #[cfg(test)]
        let full = self
            .fake_full
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        #[cfg(not(test))]
        let full = false;
        let r = if full {
            Err(Errno::EAGAIN)
        } else {
            sendto(
                sock.as_raw_fd(),
                pkt,
                &SockaddrStorage::from(a),
                MsgFlags::MSG_DONTWAIT,
            )
        };
        match r {
            Ok(_) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(Errno::EAGAIN | Errno::ENOBUFS) => {
                self.would_block.fetch_add(1, Ordering::Relaxed);
                self.defer(to, pkt);
            }
            Err(_) => {
                self.send_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends `pkt` to `to` from an Rpc thread: at once if nothing stands in
    /// the way, otherwise through the SM thread (see the module
    /// documentation). Never blocks and never waits for a lock.
    fn send_nonblocking(&self, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let guard = match self.socket.try_read() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return self.defer(to, pkt),
        };
        let Some(sock) = guard.as_ref() else {
            self.not_started.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let addr = match to.host.parse::<Ipv4Addr>() {
            Ok(ip) => Some(SocketAddr::from((ip, to.port))),
            Err(_) => match self.book.try_lock() {
                Ok(b) => b.fresh(to, self.now_ns()),
                Err(TryLockError::Poisoned(e)) => e.into_inner().fresh(to, self.now_ns()),
                Err(TryLockError::WouldBlock) => None,
            },
        };
        match addr {
            Some(a) => self.send_to(sock, to, pkt, a),
            None => self.defer(to, pkt),
        }
    }

    /// Tells the router that `to` does not resolve.
    fn tell_unresolved(&self, to: &Uri) {
        let router = lock(&self.router).clone();
        if let Some(r) = router {
            r.host_unresolved(to);
        }
    }

    /// Sends `pkt` to `to` from the SM thread (or the resolver thread),
    /// now or, for a name not yet resolved, from the resolver thread.
    /// Never blocks on a lookup or on the socket; may wait for a lock.
    fn send(&self, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        let Some(sock) = self.socket() else {
            self.not_started.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let route = lock(&self.book).route(to, pkt, self.now_ns());
        let look_up = match route {
            Route::Send(a) => return self.send_to(&sock, to, pkt, a),
            Route::SendAndRefresh(a) => {
                self.send_to(&sock, to, pkt, a);
                true
            }
            Route::QueuedLookUp => true,
            Route::Queued => false,
            Route::Unresolved => {
                self.unresolved.fetch_add(1, Ordering::Relaxed);
                self.tell_unresolved(to);
                false
            }
            Route::Full => {
                self.queue_full.fetch_add(1, Ordering::Relaxed);
                false
            }
        };
        if !look_up {
            return;
        }
        let sent = match lock(&self.lookups_tx).as_ref() {
            Some(tx) => match tx.try_send(to.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !sent {
            // Cannot happen while running (the channel holds MAX_LOOKUPS,
            // which the book never exceeds); after a stop the packets go.
            let dropped = lock(&self.book).lookup_refused(to);
            self.queue_full.fetch_add(dropped as u64, Ordering::Relaxed);
        }
    }

    /// The SM thread: sends the packets deferred to it (those there now;
    /// one that meets a full socket buffer again waits for the next call).
    fn send_deferred(&self) {
        for _ in 0..self.deferred.len() {
            let Some((to, pkt)) = self.deferred.pop() else {
                break;
            };
            self.send(&to, &pkt);
        }
    }

    /// Where the Nexus at `uri` sends from, as far as known without a
    /// lookup.
    fn source_of(&self, uri: &Uri) -> Option<SmSource> {
        lock(&self.book).source_of(uri).map(SmSource::Udp)
    }

    /// The resolver thread: looks names up one at a time and sends what
    /// waited for them.
    fn resolve_loop(&self, rx: Receiver<Uri>, resolver: Resolver) {
        loop {
            let to = match rx.recv_timeout(Duration::from_millis(SM_THREAD_POLL_MS)) {
                Ok(u) => u,
                Err(RecvTimeoutError::Timeout) if !self.stop.load(Ordering::Relaxed) => continue,
                Err(_) => return,
            };
            self.lookups.fetch_add(1, Ordering::Relaxed);
            let addr = resolver(&to.host, to.port).filter(SocketAddr::is_ipv4);
            if addr.is_none() {
                self.lookup_failures.fetch_add(1, Ordering::Relaxed);
            }
            let waiting = lock(&self.book).answered(&to, addr, self.now_ns());
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            // A first lookup that failed (a failed refresh keeps the old
            // address, and nothing waited for it).
            if addr.is_none() && !waiting.is_empty() {
                self.tell_unresolved(&to);
            }
            let sock = self.socket();
            match (addr, sock) {
                (Some(a), Some(s)) => {
                    for p in &waiting {
                        self.send_to(&s, &to, p, a);
                    }
                }
                _ => {
                    self.unresolved
                        .fetch_add(waiting.len() as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Session management over kernel UDP: the Nexus's SM thread receives on
/// the URI's port and answers pings; Rpcs send from the same socket.
/// Hostnames are resolved off every sender's path (see the module
/// documentation).
pub struct UdpSmLink {
    shared: Arc<Shared>,
    resolver: Resolver,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for UdpSmLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UdpSmLink {{ {:?} }}", self.stats())
    }
}

impl Default for UdpSmLink {
    fn default() -> Self {
        UdpSmLink::new()
    }
}

impl UdpSmLink {
    /// An unstarted link with the system resolver.
    pub fn new() -> UdpSmLink {
        UdpSmLink::with_resolver(system_resolver())
    }

    /// An unstarted link that resolves hostnames with `resolver` (on its
    /// resolver thread; it may block). For name services other than the
    /// system's, and for tests.
    pub fn with_resolver(resolver: Resolver) -> UdpSmLink {
        UdpSmLink {
            shared: Arc::new(Shared {
                born: Instant::now(),
                socket: RwLock::new(None),
                book: Mutex::new(AddrBook::default()),
                lookups_tx: Mutex::new(None),
                deferred: ArrayQueue::new(MAX_DEFERRED),
                deferred_count: AtomicU64::new(0),
                would_block: AtomicU64::new(0),
                deferred_dropped: AtomicU64::new(0),
                #[cfg(test)]
                fake_full: std::sync::atomic::AtomicU32::new(0),
                router: Mutex::new(None),
                stop: AtomicBool::new(false),
                sent: AtomicU64::new(0),
                send_errors: AtomicU64::new(0),
                unresolved: AtomicU64::new(0),
                queue_full: AtomicU64::new(0),
                lookups: AtomicU64::new(0),
                lookup_failures: AtomicU64::new(0),
                not_started: AtomicU64::new(0),
            }),
            resolver,
            thread: Mutex::new(None),
        }
    }

    /// Sends that failed: refused by the kernel, to a name that does not
    /// resolve, or dropped for lack of room while a lookup was pending or
    /// while waiting for the SM thread.
    pub fn send_errors(&self) -> u64 {
        let s = self.stats();
        s.send_errors + s.unresolved + s.queue_full + s.not_started + s.deferred_dropped
    }

    /// Counters.
    pub fn stats(&self) -> UdpSmStats {
        let s = &self.shared;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        UdpSmStats {
            sent: l(&s.sent),
            send_errors: l(&s.send_errors),
            unresolved: l(&s.unresolved),
            queue_full: l(&s.queue_full),
            lookups: l(&s.lookups),
            lookup_failures: l(&s.lookup_failures),
            not_started: l(&s.not_started),
            deferred: l(&s.deferred_count),
            would_block: l(&s.would_block),
            deferred_dropped: l(&s.deferred_dropped),
        }
    }

    /// Names in the address cache.
    pub fn cached_names(&self) -> usize {
        lock(&self.shared.book).entries.len()
    }

    /// The local address the link is bound to, once started.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.socket().and_then(|s| s.local_addr().ok())
    }
}

impl SmLink for UdpSmLink {
    fn start(&self, local: &Uri, router: Arc<SmRouter>) -> Result<(), NexusError> {
        let io = |what, source| NexusError::SmIo {
            uri: local.clone(),
            what,
            source,
        };
        // Our own name: resolved once, here, while the Nexus is built.
        let addr = match local.host.parse::<Ipv4Addr>() {
            Ok(ip) => Some(SocketAddr::from((ip, local.port))),
            Err(_) => (self.resolver)(&local.host, local.port).filter(SocketAddr::is_ipv4),
        }
        .ok_or_else(|| NexusError::SmBind {
            uri: local.clone(),
            why: "host does not resolve to an IPv4 address".into(),
        })?;
        let sock = UdpSocket::bind(addr).map_err(|e| io("bind", e))?;
        // Wake at least once per ping interval to run failure detection.
        let poll = Duration::from_millis(SM_THREAD_POLL_MS)
            .min(Duration::from_nanos(router.tick_interval_ns()))
            .max(Duration::from_millis(1));
        sock.set_read_timeout(Some(poll))
            .map_err(|e| io("set_read_timeout", e))?;
        let sock = Arc::new(sock);
        *self
            .shared
            .socket
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(sock.clone());
        *lock(&self.shared.router) = Some(router.clone());
        let (tx, rx) = sync_channel(MAX_LOOKUPS);
        *lock(&self.shared.lookups_tx) = Some(tx);
        let shared = self.shared.clone();
        let resolver = self.resolver.clone();
        // The resolver thread is never joined: a stop must not wait for a
        // slow lookup. It ends after its current lookup.
        std::thread::Builder::new()
            .name(format!("erpc-sm-dns-{}", local.port))
            .spawn(move || shared.resolve_loop(rx, resolver))
            .map_err(|e| io("spawn SM resolver thread", e))?;
        let shared = self.shared.clone();
        let t = std::thread::Builder::new()
            .name(format!("erpc-sm-{}", local.port))
            .spawn(move || {
                let mut buf = [0u8; 2048];
                let mut pings = Vec::new();
                let resolve = |u: &Uri| shared.source_of(u);
                while !shared.stop.load(Ordering::Relaxed) {
                    router.tick(&mut pings);
                    for (to, ping) in pings.drain(..) {
                        shared.send(&to, &ping);
                    }
                    shared.send_deferred();
                    let (n, src) = match sock.recv_from(&mut buf) {
                        Ok(r) => r,
                        Err(_) => continue, // timeout or transient error
                    };
                    let src = SmSource::Udp(src);
                    if let Some((to, reply)) = router.deliver(&buf[..n], &src, &resolve) {
                        shared.send(&to, &reply);
                    }
                }
            })
            .map_err(|e| io("spawn SM thread", e))?;
        *lock(&self.thread) = Some(t);
        Ok(())
    }

    fn send(&self, _from: &Uri, to: &Uri, pkt: &[u8; SM_PKT_BYTES]) {
        self.shared.send_nonblocking(to, pkt);
    }

    fn stop(&self, _local: &Uri) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // The resolver thread sees the channel close after its lookup.
        lock(&self.shared.lookups_tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        self.shared
            .socket
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        lock(&self.shared.router).take();
    }
}

#[cfg(test)]
mod tests;

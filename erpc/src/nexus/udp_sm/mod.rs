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
//!   queue (at most [`PENDING_PER_NAME`] per name, [`PENDING_MAX`] in all)
//!   and is sent by the resolver thread when the answer comes; the sender
//!   returns at once. (The SM thread would be the wrong place: it answers
//!   keep-alive pings, and a slow lookup there would get this process
//!   declared failed by its peers.)
//! * Answers are cached, positive and negative, in a table of at most
//!   [`CACHE_MAX`] names (the oldest answer is forgotten first). A positive
//!   answer is used for [`POSITIVE_TTL_MS`] and then looked up again in the
//!   background while the old address stays in use; a negative one makes
//!   packets to that name fail at once (counted) for [`NEGATIVE_TTL_MS`].
//! * At most [`LOOKUPS_MAX`] lookups wait or run at a time: a flood of
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
//! [`DEFERRED_MAX`] packets, which it sends at its next wake-up (within
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
pub const CACHE_MAX: usize = 1024;
/// How long a positive answer is used before it is looked up again (in
/// the background; the old address serves meanwhile).
pub const POSITIVE_TTL_MS: u64 = 60_000;
/// How long a name that did not resolve makes sends to it fail at once.
pub const NEGATIVE_TTL_MS: u64 = 5_000;
/// Lookups waiting or running at once.
pub const LOOKUPS_MAX: usize = 16;
/// Packets waiting for lookups, in all.
pub const PENDING_MAX: usize = 256;
/// Packets waiting for one name's lookup.
pub const PENDING_PER_NAME: usize = 8;
/// Packets an Rpc thread (or the resolver thread) could not send at once,
/// waiting for the SM thread.
pub const DEFERRED_MAX: usize = 1024;

const _: () = assert!(LOOKUPS_MAX <= CACHE_MAX && PENDING_PER_NAME <= PENDING_MAX);

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
                        && self.lookups < LOOKUPS_MAX
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
        if self.pending.len() >= PENDING_MAX || waiting >= PENDING_PER_NAME {
            return Route::Full;
        }
        let looking_up = self.entries.get(to).is_some_and(|e| e.looking_up);
        if !looking_up {
            if self.lookups >= LOOKUPS_MAX {
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

    /// Keeps the table within [`CACHE_MAX`] names before `to` is added:
    /// forgets the oldest answer whose lookup is not under way.
    fn make_room(&mut self, to: &Uri) {
        if self.entries.len() < CACHE_MAX || self.entries.contains_key(to) {
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
            // Cannot happen while running (the channel holds LOOKUPS_MAX,
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
                deferred: ArrayQueue::new(DEFERRED_MAX),
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
        let (tx, rx) = sync_channel(LOOKUPS_MAX);
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
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    const MS: u64 = 1_000_000;
    const PKT: [u8; SM_PKT_BYTES] = [7; SM_PKT_BYTES];

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 9], port))
    }

    #[test]
    fn literals_need_no_lookup() {
        let mut b = AddrBook::default();
        let to = Uri::new("10.1.2.3", 31850);
        assert_eq!(
            b.route(&to, &PKT, 0),
            Route::Send(SocketAddr::from(([10, 1, 2, 3], 31850)))
        );
        assert!(b.entries.is_empty() && b.pending.is_empty());
    }

    #[test]
    fn a_name_waits_for_one_lookup_then_is_cached_and_refreshed_in_the_background() {
        let mut b = AddrBook::default();
        let to = Uri::new("peer", 1);
        assert_eq!(b.route(&to, &PKT, 0), Route::QueuedLookUp);
        assert_eq!(b.route(&to, &PKT, MS), Route::Queued, "one lookup per name");
        assert_eq!(b.lookups, 1);
        assert_eq!(b.answered(&to, Some(addr(1)), 2 * MS).len(), 2);
        assert_eq!(b.lookups, 0);
        assert_eq!(b.route(&to, &PKT, 3 * MS), Route::Send(addr(1)));
        // Old answers are used while they are looked up again.
        let old = 2 * MS + POSITIVE_TTL_MS * MS;
        assert_eq!(b.route(&to, &PKT, old), Route::SendAndRefresh(addr(1)));
        assert_eq!(b.route(&to, &PKT, old + 1), Route::Send(addr(1)));
        // A failed refresh keeps the address.
        assert!(b.answered(&to, None, old + 2).is_empty());
        assert_eq!(b.route(&to, &PKT, old + 3), Route::Send(addr(1)));
        assert_eq!(b.lookups, 0);
    }

    #[test]
    fn negative_answers_are_cached_for_their_time() {
        let mut b = AddrBook::default();
        let to = Uri::new("nowhere", 1);
        assert_eq!(b.route(&to, &PKT, 0), Route::QueuedLookUp);
        assert_eq!(b.answered(&to, None, MS).len(), 1);
        for t in [MS, 2 * MS, MS + NEGATIVE_TTL_MS * MS - 1] {
            assert_eq!(b.route(&to, &PKT, t), Route::Unresolved, "no lookup at {t}");
        }
        assert_eq!(b.lookups, 0);
        // Then it is asked again.
        assert_eq!(
            b.route(&to, &PKT, MS + NEGATIVE_TTL_MS * MS),
            Route::QueuedLookUp
        );
    }

    #[test]
    fn cache_lookups_and_waiting_packets_are_bounded() {
        let mut b = AddrBook::default();
        // Lookups: at most LOOKUPS_MAX at once.
        for i in 0..LOOKUPS_MAX + 5 {
            let r = b.route(&Uri::new(&format!("n{i}"), 1), &PKT, 0);
            let want = if i < LOOKUPS_MAX {
                Route::QueuedLookUp
            } else {
                Route::Full
            };
            assert_eq!(r, want, "name {i}");
        }
        // Waiting packets: at most PENDING_PER_NAME per name.
        let n0 = Uri::new("n0", 1);
        for _ in 1..PENDING_PER_NAME {
            assert_eq!(b.route(&n0, &PKT, 0), Route::Queued);
        }
        assert_eq!(b.route(&n0, &PKT, 0), Route::Full);
        assert!(b.pending.len() <= PENDING_MAX);
        // Answers for many names: at most CACHE_MAX remembered, the
        // oldest forgotten first.
        for i in 0..3 * CACHE_MAX {
            b.answered(&Uri::new(&format!("a{i}"), 1), Some(addr(2)), i as u64);
        }
        assert!(b.entries.len() <= CACHE_MAX, "{}", b.entries.len());
        assert!(!b.entries.contains_key(&Uri::new("a0", 1)));
        assert!(
            b.entries
                .contains_key(&Uri::new(&format!("a{}", 3 * CACHE_MAX - 1), 1))
        );
        // Names being looked up are never evicted.
        assert!(b.entries.contains_key(&Uri::new("n0", 1)));
        // A lookup that cannot start drops its packets and its claim.
        assert_eq!(b.lookup_refused(&n0), PENDING_PER_NAME);
        assert_eq!(b.lookups, LOOKUPS_MAX - 1);
    }

    fn started(link: &UdpSmLink) -> Arc<SmRouter> {
        let router = Arc::new(SmRouter::new(
            Uri::new("127.0.0.1", 0),
            crate::Clock::tsc(),
            1,
            500 * MS,
            1,
        ));
        link.start(&Uri::new("127.0.0.1", 0), router.clone())
            .unwrap();
        router
    }

    /// A sender never waits for a lookup, however long it takes: the
    /// resolver here blocks until the test lets it go, after `send`
    /// returned. Then the packet that waited goes out.
    #[test]
    fn send_never_waits_for_a_lookup() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let peer_addr = peer.local_addr().unwrap();
        let (asked_tx, asked_rx) = channel::<String>();
        let (go_tx, go_rx) = channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let link = UdpSmLink::with_resolver(Arc::new(move |host: &str, _port: u16| {
            asked_tx.send(host.to_owned()).unwrap();
            lock(&go_rx).recv().ok()?;
            (host == "peer.test").then_some(peer_addr)
        }));
        let _router = started(&link);
        let to = Uri::new("peer.test", peer_addr.port());
        let from = Uri::new("127.0.0.1", 0);
        link.send(&from, &to, &PKT);
        link.send(&from, &to, &PKT);
        // Both sends returned; the resolver is still blocked in its lookup.
        assert_eq!(asked_rx.recv().unwrap(), "peer.test");
        assert_eq!(link.stats().sent, 0);
        go_tx.send(()).unwrap();
        let mut buf = [0u8; 512];
        for _ in 0..2 {
            let (n, _) = peer.recv_from(&mut buf).expect("the waiting packets");
            assert_eq!(&buf[..n], &PKT[..]);
        }
        // From now on the cached address is used directly: no lookup.
        link.send(&from, &to, &PKT);
        let (n, _) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(n, SM_PKT_BYTES);
        assert!(asked_rx.try_recv().is_err(), "looked up once");
        assert_eq!(link.stats().lookups, 1);
        // A name that does not resolve: looked up once, then sends to it
        // fail at once.
        let nowhere = Uri::new("nowhere.test", 1);
        link.send(&from, &nowhere, &PKT);
        assert_eq!(asked_rx.recv().unwrap(), "nowhere.test");
        go_tx.send(()).unwrap();
        while link.stats().unresolved == 0 {
            std::thread::yield_now();
        }
        link.send(&from, &nowhere, &PKT);
        assert!(asked_rx.try_recv().is_err(), "negative answer cached");
        let s = link.stats();
        assert_eq!((s.lookups, s.lookup_failures), (2, 1));
        assert!(s.unresolved >= 1, "{s:?}");
        link.stop(&from);
        drop(go_tx);
    }

    /// An Rpc thread's send never waits for a lock: with the address
    /// cache held by another thread, a send to a name returns at once and
    /// the SM thread sends the packet once the cache is free.
    #[test]
    fn an_rpc_thread_send_never_waits_for_a_lock() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let peer_addr = peer.local_addr().unwrap();
        let link = Arc::new(UdpSmLink::with_resolver(Arc::new(
            move |host: &str, _port: u16| (host == "peer.test").then_some(peer_addr),
        )));
        let _router = started(&link);
        let to = Uri::new("peer.test", peer_addr.port());
        let from = Uri::new("127.0.0.1", 0);
        let held = lock(&link.shared.book);
        let (done_tx, done_rx) = channel();
        let l = link.clone();
        let (f, t) = (from.clone(), to.clone());
        let rpc_thread = std::thread::spawn(move || {
            l.send(&f, &t, &PKT);
            done_tx.send(()).unwrap();
        });
        // The send returned while the lock is still held (a failure here
        // means it is waiting for it).
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the send waited for the address cache's lock");
        rpc_thread.join().unwrap();
        assert_eq!(link.stats().deferred, 1);
        drop(held);
        let mut buf = [0u8; 512];
        let (n, _) = peer.recv_from(&mut buf).expect("sent by the SM thread");
        assert_eq!(&buf[..n], &PKT[..]);
        // Counted just after the datagram left.
        while link.stats().sent == 0 {
            std::thread::yield_now();
        }
        let s = link.stats();
        assert_eq!((s.sent, s.deferred_dropped), (1, 0), "{s:?}");
        link.stop(&from);
    }

    /// A full socket send buffer loses nothing: the packet goes to the SM
    /// thread, which sends it again (here the first two tries meet a full
    /// buffer).
    #[test]
    fn a_full_socket_buffer_defers_the_packet_to_the_sm_thread() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let link = UdpSmLink::with_resolver(system_resolver());
        let _router = started(&link);
        link.shared
            .fake_full
            .store(2, std::sync::atomic::Ordering::Relaxed);
        let to = Uri::new("127.0.0.1", peer.local_addr().unwrap().port());
        let from = Uri::new("127.0.0.1", 0);
        link.send(&from, &to, &PKT);
        let mut buf = [0u8; 512];
        let (n, _) = peer.recv_from(&mut buf).expect("sent again later");
        assert_eq!(&buf[..n], &PKT[..]);
        while link.stats().sent == 0 {
            std::thread::yield_now();
        }
        let s = link.stats();
        assert_eq!(
            (s.would_block, s.sent, s.deferred_dropped),
            (2, 1, 0),
            "{s:?}"
        );
        assert!(s.deferred >= 2, "{s:?}");
        link.stop(&from);
    }

    /// What a datagram claims about its sender is believed only from the
    /// sender's address (IPv4 and SM port): the router is handed the
    /// source, and the cache's answer for the claimed URI.
    #[test]
    fn the_source_of_a_claimed_uri_is_its_resolved_address() {
        let mut b = AddrBook::default();
        let lit = Uri::new("10.1.2.3", 31850);
        assert_eq!(
            b.source_of(&lit),
            Some(SocketAddr::from(([10, 1, 2, 3], 31850)))
        );
        let name = Uri::new("peer", 31851);
        assert_eq!(b.source_of(&name), None, "never looked up: unknown");
        b.answered(&name, Some(addr(31851)), 0);
        assert_eq!(b.source_of(&name), Some(addr(31851)));
        // However old the answer: a source check needs no fresh one.
        assert_eq!(b.fresh(&name, POSITIVE_TTL_MS * MS), None);
        assert_eq!(b.source_of(&name), Some(addr(31851)));
    }
}

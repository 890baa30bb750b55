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
    // Lookups: at most MAX_LOOKUPS at once.
    for i in 0..MAX_LOOKUPS + 5 {
        let r = b.route(&Uri::new(&format!("n{i}"), 1), &PKT, 0);
        let want = if i < MAX_LOOKUPS {
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
    assert!(b.pending.len() <= MAX_PENDING);
    // Answers for many names: at most MAX_CACHE remembered, the
    // oldest forgotten first.
    for i in 0..3 * MAX_CACHE {
        b.answered(&Uri::new(&format!("a{i}"), 1), Some(addr(2)), i as u64);
    }
    assert!(b.entries.len() <= MAX_CACHE, "{}", b.entries.len());
    assert!(!b.entries.contains_key(&Uri::new("a0", 1)));
    assert!(
        b.entries
            .contains_key(&Uri::new(&format!("a{}", 3 * MAX_CACHE - 1), 1))
    );
    // Names being looked up are never evicted.
    assert!(b.entries.contains_key(&Uri::new("n0", 1)));
    // A lookup that cannot start drops its packets and its claim.
    assert_eq!(b.lookup_refused(&n0), PENDING_PER_NAME);
    assert_eq!(b.lookups, MAX_LOOKUPS - 1);
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

//! Everything unsafe in the UDP transport, in one place: the RX ring memory
//! the kernel writes into (with the accounting that decides which slots it
//! may write), the batched `sendmmsg`/`recvmmsg` calls, and `setsockopt`.
//!
//! The safety argument rests on one invariant, kept by [`Ring`]: the kernel
//! only ever writes into *free* slots (posted, not yet delivered), and
//! [`Ring::packet`] only hands out *held* slots (delivered, not yet given
//! back). A slot moves from held to free only through [`Ring::release`].
#![allow(unsafe_code)]

use std::cell::{Cell, UnsafeCell};
use std::io;
use std::marker::PhantomData;
use std::mem;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::rc::Rc;

use crate::MTU;

/// Bytes per RX ring slot: a whole MTU, so that every datagram eRPC can
/// legally send (at most `MTU - HEADROOM_BYTES`) fits with room to spare.
pub(crate) const SLOT_BYTES: usize = MTU;

const _: () = assert!(SLOT_BYTES <= u16::MAX as usize);

/// An IPv4 socket address in the kernel's layout, built once per route so
/// that `tx_burst` hands the kernel a pointer to it instead of converting.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct SockAddr(libc::sockaddr_in);

impl SockAddr {
    pub(crate) fn new(addr: SocketAddrV4) -> SockAddr {
        SockAddr(libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: addr.port().to_be(),
            sin_addr: libc::in_addr {
                // Network byte order: the octets as they are in memory.
                s_addr: u32::from_ne_bytes(addr.ip().octets()),
            },
            sin_zero: [0; 8],
        })
    }
}

/// An all-zero `mmsghdr`: null pointers and zero lengths.
fn zeroed_mmsghdr() -> libc::mmsghdr {
    // SAFETY: `mmsghdr` is a C struct of integers and raw pointers (plus
    // padding on some targets); all-zero bytes are a valid value of each.
    unsafe { mem::zeroed() }
}

/// The RX ring: `entries` slots of [`SLOT_BYTES`], shared (through `Rc`)
/// by the transport, which fills free slots, and the ring handles, which
/// read held ones.
///
/// Counters are totals since creation, like a NIC's producer/consumer
/// indexes: the `k`-th datagram ever received lands in slot
/// `k mod entries`. Slots `released..delivered` (mod `entries`) are held by
/// the application; the other `entries - held` are free.
pub(crate) struct Ring {
    /// Slot memory. `UnsafeCell` because the kernel writes into it while
    /// handles hold `&Ring`.
    mem: Box<[UnsafeCell<u8>]>,
    /// Payload length of the datagram in each slot; 0 when it was rejected
    /// (a valid payload is never empty: it starts with the eRPC header).
    lens: Box<[Cell<u16>]>,
    mask: u64,
    /// Datagrams handed to the application (the sum of `rx_burst` results).
    delivered: Cell<u64>,
    /// Slots the application gave back (the sum of `post_recvs` arguments).
    released: Cell<u64>,
}

impl Ring {
    /// A ring of `entries` slots (a power of two), all free.
    pub(crate) fn new(entries: usize) -> Ring {
        assert!(
            entries.is_power_of_two(),
            "ring entries must be a power of two"
        );
        // Zeroed memory from the allocator: a ring sized for thousands of
        // sessions touches only the pages its traffic reaches.
        let bytes: Box<[u8]> = vec![0u8; entries * SLOT_BYTES].into_boxed_slice();
        let len = bytes.len();
        // SAFETY: `UnsafeCell<u8>` has the layout of `u8`
        // (`repr(transparent)`), so the boxed bytes are a boxed slice of
        // as many cells, freed with the same layout.
        let mem: Box<[UnsafeCell<u8>]> = unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                Box::into_raw(bytes).cast::<UnsafeCell<u8>>(),
                len,
            ))
        };
        Ring {
            mem,
            lens: (0..entries).map(|_| Cell::new(0)).collect(),
            mask: entries as u64 - 1,
            delivered: Cell::new(0),
            released: Cell::new(0),
        }
    }

    pub(crate) fn entries(&self) -> usize {
        self.lens.len()
    }

    /// Slots the application holds (delivered, not yet given back).
    pub(crate) fn held(&self) -> usize {
        (self.delivered.get() - self.released.get()) as usize
    }

    /// Slots the kernel may write into.
    pub(crate) fn free(&self) -> usize {
        self.entries() - self.held()
    }

    /// True if slot `idx` is held by the application.
    fn is_held(&self, idx: usize) -> bool {
        let age = (idx as u64).wrapping_sub(self.released.get()) & self.mask;
        idx < self.entries() && age < self.held() as u64
    }

    /// The payload in slot `idx`, if that slot is held and its datagram was
    /// accepted.
    pub(crate) fn packet(&self, idx: usize) -> Option<&[u8]> {
        if !self.is_held(idx) {
            return None;
        }
        let len = usize::from(self.lens[idx].get());
        if len == 0 {
            return None;
        }
        debug_assert!(len <= SLOT_BYTES);
        let start = self.mem.as_ptr().wrapping_add(idx * SLOT_BYTES) as *const u8;
        // SAFETY: `start..start + len` lies inside `mem` (idx < entries,
        // len <= SLOT_BYTES) and was initialised at creation. The slot is
        // held, so no write reaches it until `release` frees it: the kernel
        // writes only free slots (`RxQueue::recv`). The reference cannot
        // outlive that: it borrows the one `UdpRing` handle of this ring
        // (through which it was asked for), and `release` is reached only
        // through `UdpTransport::post_recvs`, which takes that handle
        // mutably (and checks it is this ring's).
        Some(unsafe { std::slice::from_raw_parts(start, len) })
    }

    /// Gives the `n` oldest held slots back to the kernel.
    ///
    /// # Panics
    /// If `n` exceeds the number of held slots: the application would be
    /// handing back slots it does not own, and the kernel could then
    /// overwrite packets it is still reading.
    pub(crate) fn release(&self, n: usize) {
        let held = self.held();
        assert!(
            n <= held,
            "post_recvs({n}): only {held} RX ring slots are held by the application"
        );
        self.released.set(self.released.get() + n as u64);
    }
}

/// One received datagram, as `RxQueue::recv` shows it to its classifier.
pub(crate) struct Datagram<'a> {
    /// Its real length (may exceed the slot).
    pub(crate) len: usize,
    /// The kernel cut it to the slot.
    pub(crate) truncated: bool,
    /// What the slot holds of it (at most `SLOT_BYTES`).
    pub(crate) bytes: &'a [u8],
    /// The sender, when the queue was created to learn it.
    pub(crate) source: Option<SocketAddrV4>,
}

/// The receive side: the ring plus the preallocated `recvmmsg` vectors.
pub(crate) struct RxQueue {
    ring: Rc<Ring>,
    /// One fixed iovec per ring slot, pointing at the slot.
    iovs: Box<[libc::iovec]>,
    /// One message header per datagram of a burst.
    msgs: Box<[libc::mmsghdr]>,
    /// One sender address per message of a burst; empty unless the queue
    /// was created to learn senders (for captures).
    names: Box<[libc::sockaddr_in]>,
    /// `(first slot total, count)` the headers in `msgs` are set up for:
    /// an empty poll (the common case when busy polling) reuses them.
    prepared: (u64, usize),
}

impl RxQueue {
    /// A ring of `entries` slots, received into at most `burst` at a time;
    /// with `sources`, the kernel also reports each datagram's sender.
    pub(crate) fn new(entries: usize, burst: usize, sources: bool) -> RxQueue {
        let ring = Rc::new(Ring::new(entries));
        let base = ring.mem.as_ptr() as *mut u8;
        let iovs = (0..entries)
            .map(|i| libc::iovec {
                iov_base: base.wrapping_add(i * SLOT_BYTES).cast(),
                iov_len: SLOT_BYTES,
            })
            .collect();
        let msgs = (0..burst).map(|_| zeroed_mmsghdr()).collect();
        let names = (0..if sources { burst } else { 0 })
            .map(|_| SockAddr::new(SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)).0)
            .collect();
        RxQueue {
            ring,
            iovs,
            msgs,
            names,
            prepared: (0, 0),
        }
    }

    pub(crate) fn ring(&self) -> &Rc<Ring> {
        &self.ring
    }

    /// Receives up to one burst of datagrams into the free slots that come
    /// next in ring order, with one `recvmmsg`, and delivers them to the
    /// application. `classify` sees each datagram (its real length, what
    /// the slot holds, the sender if asked for) and returns the payload
    /// length to record, or 0 to mark the slot rejected. Returns how many
    /// datagrams were delivered; `Ok(0)` without a syscall when no slot is
    /// free.
    pub(crate) fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        mut classify: impl FnMut(Datagram<'_>) -> usize,
    ) -> io::Result<usize> {
        let n = self.ring.free().min(self.msgs.len());
        if n == 0 {
            return Ok(0);
        }
        let first = self.ring.delivered.get();
        if self.prepared != (first, n) {
            // The kernel writes a header only for a datagram it delivers,
            // and then `delivered` moves: headers left from a poll that got
            // nothing are still right.
            let iov_base = self.iovs.as_mut_ptr();
            for (k, msg) in self.msgs[..n].iter_mut().enumerate() {
                let slot = ((first + k as u64) & self.ring.mask) as usize;
                msg.msg_hdr.msg_name = std::ptr::null_mut();
                msg.msg_hdr.msg_namelen = 0;
                msg.msg_hdr.msg_iov = iov_base.wrapping_add(slot);
                msg.msg_hdr.msg_iovlen = 1;
                msg.msg_hdr.msg_control = std::ptr::null_mut();
                msg.msg_hdr.msg_controllen = 0;
                msg.msg_hdr.msg_flags = 0;
                msg.msg_len = 0;
            }
            self.prepared = (first, n);
        }
        if !self.names.is_empty() {
            // The kernel overwrites the length with the sender's; reset it
            // (and the pointer, in case the headers were just rebuilt).
            let names = self.names.as_mut_ptr();
            for (k, msg) in self.msgs[..n].iter_mut().enumerate() {
                msg.msg_hdr.msg_name = names.wrapping_add(k).cast();
                msg.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
        }
        // SAFETY: `msgs[..n]` are initialised headers; each points at one
        // iovec of `iovs`, which covers exactly one slot of `ring.mem`
        // (kept alive by the `Rc` we hold). Those slots are the next `n` in
        // ring order after `delivered`, and `n <= free`, so they are all
        // free: no reference handed out by `Ring::packet` covers them. The
        // memory is `UnsafeCell`, so writing it through a pointer derived
        // from a shared reference is allowed. With MSG_TRUNC the kernel
        // reports each datagram's real length in `msg_len` but still writes
        // at most `iov_len` bytes. A non-null `msg_name` points at one
        // `sockaddr_in` of `names` with `msg_namelen` its size.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = r as usize;
        debug_assert!(got <= n);
        for k in 0..got {
            let msg = &self.msgs[k];
            let slot = ((first + k as u64) & self.ring.mask) as usize;
            let truncated = msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let namelen = msg.msg_hdr.msg_namelen;
            self.deliver(
                slot,
                k,
                msg.msg_len as usize,
                truncated,
                namelen,
                &mut classify,
            );
        }
        self.ring.delivered.set(first + got as u64);
        Ok(got)
    }

    /// [`RxQueue::recv`] for at most one datagram, with one `recvfrom`
    /// into the next free slot: the kernel copies in no message header and
    /// imports no iovec, and does not try for a second datagram, so an
    /// empty poll or a lone datagram costs less than with `recvmmsg`.
    pub(crate) fn recv_one(
        &mut self,
        fd: BorrowedFd<'_>,
        mut classify: impl FnMut(Datagram<'_>) -> usize,
    ) -> io::Result<usize> {
        if self.ring.free() == 0 {
            return Ok(0);
        }
        let first = self.ring.delivered.get();
        let slot = (first & self.ring.mask) as usize;
        let start = self.ring.mem.as_ptr().wrapping_add(slot * SLOT_BYTES) as *mut u8;
        let mut namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let (name, namelen_ptr) = match self.names.first_mut() {
            Some(sa) => (
                (sa as *mut libc::sockaddr_in).cast::<libc::sockaddr>(),
                &mut namelen as *mut libc::socklen_t,
            ),
            None => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        // SAFETY: `start..start + SLOT_BYTES` is one slot of `ring.mem`
        // (slot < entries), the next in ring order after `delivered`, and
        // a slot is free (checked above), so it is that one: no reference
        // handed out by `Ring::packet` covers it, and the memory is
        // `UnsafeCell`. With MSG_TRUNC the kernel returns the datagram's
        // real length but writes at most SLOT_BYTES. `name` is null (with a
        // null length pointer) or one `sockaddr_in` of `names` with
        // `namelen` its size.
        let r = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                start.cast(),
                SLOT_BYTES,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                name,
                namelen_ptr,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = r as usize;
        self.deliver(slot, 0, len, len > SLOT_BYTES, namelen, &mut classify);
        self.ring.delivered.set(first + 1);
        Ok(1)
    }

    /// Shows the datagram the kernel has just put in `slot` (`len` its real
    /// length; `k` its message index, for the sender's address) to
    /// `classify` and records the payload length it returns.
    #[inline]
    fn deliver(
        &self,
        slot: usize,
        k: usize,
        len: usize,
        truncated: bool,
        namelen: libc::socklen_t,
        classify: &mut impl FnMut(Datagram<'_>) -> usize,
    ) {
        let source = self.names.get(k).and_then(|sa| {
            let full = namelen as usize >= mem::size_of::<libc::sockaddr_in>();
            (full && sa.sin_family == libc::AF_INET as libc::sa_family_t).then(|| {
                SocketAddrV4::new(
                    sa.sin_addr.s_addr.to_ne_bytes().into(),
                    u16::from_be(sa.sin_port),
                )
            })
        });
        let start = self.ring.mem.as_ptr().wrapping_add(slot * SLOT_BYTES) as *const u8;
        // SAFETY: the slot lies inside `mem` (slot < entries) and the
        // kernel has just filled it; it is now delivered, so no write
        // reaches it until the application gives it back, and the slice
        // does not outlive this call.
        let bytes = unsafe { std::slice::from_raw_parts(start, len.min(SLOT_BYTES)) };
        let keep = classify(Datagram {
            len,
            truncated,
            bytes,
            source,
        })
        .min(SLOT_BYTES);
        self.ring.lens[slot].set(keep as u16);
    }
}

/// The send side: preallocated `sendmmsg` vectors for one burst.
pub(crate) struct TxQueue {
    msgs: Box<[libc::mmsghdr]>,
    /// Two iovecs per message: eRPC header (+ data for packet 0), data.
    iovs: Box<[libc::iovec]>,
}

impl TxQueue {
    pub(crate) fn new(burst: usize) -> TxQueue {
        TxQueue {
            msgs: (0..burst).map(|_| zeroed_mmsghdr()).collect(),
            iovs: (0..2 * burst)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
        }
    }

    /// Starts a burst whose datagrams borrow buffers for `'a`.
    pub(crate) fn batch<'a>(&mut self) -> TxBatch<'_, 'a> {
        TxBatch {
            q: self,
            len: 0,
            _bufs: PhantomData,
        }
    }
}

/// One burst being assembled: the message headers point into the caller's
/// buffers (zero copy up to the kernel), which `'a` keeps alive and
/// unchanged for as long as the batch exists.
pub(crate) struct TxBatch<'q, 'a> {
    q: &'q mut TxQueue,
    len: usize,
    _bufs: PhantomData<&'a [u8]>,
}

impl<'a> TxBatch<'_, 'a> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds one datagram to `dst` whose payload is `head` followed by
    /// `tail` (which may be empty).
    ///
    /// # Panics
    /// If the batch is full.
    pub(crate) fn push(&mut self, dst: &'a SockAddr, head: &'a [u8], tail: &'a [u8]) {
        let i = self.len;
        assert!(i < self.q.msgs.len(), "UDP TX batch overflow");
        self.q.iovs[2 * i] = libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        };
        self.q.iovs[2 * i + 1] = libc::iovec {
            iov_base: tail.as_ptr() as *mut libc::c_void,
            iov_len: tail.len(),
        };
        let hdr = &mut self.q.msgs[i].msg_hdr;
        hdr.msg_name = (dst as *const SockAddr).cast_mut().cast();
        hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        hdr.msg_iovlen = if tail.is_empty() { 1 } else { 2 };
        hdr.msg_control = std::ptr::null_mut();
        hdr.msg_controllen = 0;
        hdr.msg_flags = 0;
        self.len += 1;
    }

    /// Sends messages `from..to` with one non-blocking `sendmmsg` on `fd`;
    /// returns how many the kernel took (at least one), or the error that
    /// stopped the first of them.
    pub(crate) fn send(&mut self, fd: BorrowedFd<'_>, from: usize, to: usize) -> io::Result<usize> {
        assert!(
            from < to && to <= self.len,
            "sendmmsg range {from}..{to} of {}",
            self.len
        );
        let iov_base = self.q.iovs.as_mut_ptr();
        for (i, msg) in self.q.msgs[..self.len].iter_mut().enumerate() {
            msg.msg_hdr.msg_iov = iov_base.wrapping_add(2 * i);
            msg.msg_len = 0;
        }
        let msgs = self.q.msgs[from..to].as_mut_ptr();
        // SAFETY: messages `from..to` were filled by `push` in this batch:
        // their names point at `SockAddr`s and their iovecs at byte slices,
        // all borrowed for `'a`, which outlives `self`; each `msg_iov` points
        // at that message's iovec pair inside `iovs` (derived just above,
        // nothing touches `iovs` before the call). The kernel only reads the
        // buffers and writes `msg_len`.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                msgs,
                (to - from) as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }
}

impl TxBatch<'_, '_> {
    /// Sends message `i` alone with one non-blocking `sendto`: the kernel
    /// copies in no message header and imports no iovec. A payload in two
    /// parts of at most [`COALESCE_BYTES`] together is first copied into
    /// one buffer here (cheaper than the kernel gathering it); a larger
    /// one goes with `sendmmsg`. Returns 1, or the error that stopped it.
    pub(crate) fn send_one(&mut self, fd: BorrowedFd<'_>, i: usize) -> io::Result<usize> {
        assert!(i < self.len, "send_one({i}) of {}", self.len);
        let (head, tail) = (self.q.iovs[2 * i], self.q.iovs[2 * i + 1]);
        let mut buf = [0u8; COALESCE_BYTES];
        let (base, len) = if tail.iov_len == 0 {
            (head.iov_base.cast_const().cast::<u8>(), head.iov_len)
        } else if head.iov_len + tail.iov_len <= COALESCE_BYTES {
            // SAFETY: both iovecs were filled by `push` from byte slices
            // borrowed for `'a`, which outlives the batch; `buf` holds
            // both (checked), and a local buffer cannot overlap them.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    head.iov_base.cast::<u8>(),
                    buf.as_mut_ptr(),
                    head.iov_len,
                );
                std::ptr::copy_nonoverlapping(
                    tail.iov_base.cast::<u8>(),
                    buf.as_mut_ptr().add(head.iov_len),
                    tail.iov_len,
                );
            }
            (buf.as_ptr(), head.iov_len + tail.iov_len)
        } else {
            return self.send(fd, i, i + 1);
        };
        let hdr = &self.q.msgs[i].msg_hdr;
        // SAFETY: `base..base + len` is the caller's buffer borrowed for
        // `'a` or `buf`; `msg_name` points at the `SockAddr` `push` was
        // given (borrowed for `'a`), `msg_namelen` bytes. The kernel only
        // reads them.
        let r = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                base.cast(),
                len,
                libc::MSG_DONTWAIT,
                hdr.msg_name.cast_const().cast(),
                hdr.msg_namelen,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(1)
    }
}

impl TxBatch<'_, '_> {
    /// Payload length and destination of message `i`: what must match for
    /// messages to go in one UDP GSO send.
    fn shape(&self, i: usize) -> (usize, u32, u16) {
        let name = self.q.msgs[i]
            .msg_hdr
            .msg_name
            .cast_const()
            .cast::<SockAddr>();
        // SAFETY: `push` set the name of every message of the batch to a
        // `SockAddr` borrowed for `'a`, which outlives the batch.
        let sa = unsafe { &(*name).0 };
        let len = self.q.iovs[2 * i].iov_len + self.q.iovs[2 * i + 1].iov_len;
        (len, sa.sin_addr.s_addr, sa.sin_port)
    }

    /// How many messages from `from` on (at most `to - from`) can go as one
    /// UDP GSO send: same destination, same payload length (not empty), at
    /// most [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`] together.
    pub(crate) fn gso_run(&self, from: usize, to: usize) -> usize {
        assert!(
            from < to && to <= self.len,
            "GSO run {from}..{to} of {}",
            self.len
        );
        let first = self.shape(from);
        if first.0 == 0 {
            return 1;
        }
        let most = (to - from)
            .min(GSO_MAX_SEGMENTS)
            .min(GSO_MAX_BYTES / first.0);
        let mut n = 1;
        while n < most && self.shape(from + n) == first {
            n += 1;
        }
        n
    }

    /// The first message in `from..to` that starts a run [`TxBatch::gso_run`]
    /// would send as one (the next has its shape), or `to`.
    pub(crate) fn next_gso_run(&self, from: usize, to: usize) -> usize {
        assert!(
            from <= to && to <= self.len,
            "GSO runs in {from}..{to} of {}",
            self.len
        );
        (from..to.saturating_sub(1))
            .find(|&i| self.shape(i).0 > 0 && self.shape(i) == self.shape(i + 1))
            .unwrap_or(to)
    }

    /// Sends messages `from..to`, all to one destination and each of
    /// `seg` bytes ([`TxBatch::gso_run`]), as one `sendmsg` with UDP GSO
    /// (`UDP_SEGMENT`): the stack routes and builds one large datagram and
    /// cuts it into `to - from` datagrams of `seg` bytes (in software on
    /// loopback, else in the NIC if it can), so the receiver gets them one
    /// by one as if sent separately. Returns `to - from`, or the error
    /// that stopped all of them.
    pub(crate) fn send_gso(
        &mut self,
        fd: BorrowedFd<'_>,
        from: usize,
        to: usize,
        seg: u16,
    ) -> io::Result<usize> {
        assert!(
            from < to && to <= self.len,
            "GSO send {from}..{to} of {}",
            self.len
        );
        // Room for one control message carrying a u16, 8-byte aligned.
        let mut control = [0u64; 4];
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(mem::size_of::<u16>() as u32) } as usize;
        assert!(space <= mem::size_of_val(&control));
        let first = &self.q.msgs[from].msg_hdr;
        // SAFETY: `msghdr` is integers and raw pointers; all zero is valid.
        let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
        hdr.msg_name = first.msg_name;
        hdr.msg_namelen = first.msg_namelen;
        hdr.msg_iov = self.q.iovs.as_mut_ptr().wrapping_add(2 * from);
        hdr.msg_iovlen = 2 * (to - from);
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = space as _;
        // SAFETY: `msg_control` points at `control`, `space` bytes, enough
        // for one header and its u16 (asserted), so CMSG_FIRSTHDR returns a
        // pointer inside it, aligned for `cmsghdr`, and CMSG_DATA one past
        // the header (written unaligned).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(mem::size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
        }
        // SAFETY: the name and the iovec pairs of messages `from..to` were
        // filled by `push` from a `SockAddr` and byte slices borrowed for
        // `'a`, which outlives the batch (zero-length tails are allowed);
        // the control buffer lives until the call returns. The kernel only
        // reads them.
        let r = unsafe { libc::sendmsg(fd.as_raw_fd(), &hdr, libc::MSG_DONTWAIT) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(to - from)
    }
}

/// Most datagrams [`TxBatch::send_gso`] sends at once (the kernel's
/// `UDP_MAX_SEGMENTS` has been at least 64 since GSO came in, Linux 4.18).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;

/// Most bytes of one GSO send: the payload of one largest IPv4 datagram.
pub(crate) const GSO_MAX_BYTES: usize = 65535 - 20 - 8;

/// Largest two-part payload [`TxBatch::send_one`] copies into one buffer.
pub(crate) const COALESCE_BYTES: usize = 256;

/// Turns UDP checksums off on a socket (`SO_NO_CHECK`), with which the
/// kernel refuses GSO: for testing the fallback.
#[cfg(test)]
pub(crate) fn disable_udp_checksums(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SO_NO_CHECK, 1)
}

/// Asks for kernel socket buffers of `bytes` in each direction; returns
/// the receive buffer the kernel granted. Above `net.core.rmem_max` /
/// `wmem_max` the request is capped, unless the process may force it
/// (CAP_NET_ADMIN), which is tried second.
pub(crate) fn set_socket_buffers(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for (plain, forced) in [
        (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
        (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
    ] {
        setsockopt_int(fd, plain, want)?;
        // The kernel doubles the value it stores (bookkeeping overhead).
        if getsockopt_int(fd, plain)? / 2 < want {
            // Not permitted without CAP_NET_ADMIN: keep the capped size.
            let _ = setsockopt_int(fd, forced, want);
        }
    }
    Ok(getsockopt_int(fd, libc::SO_RCVBUF)? as usize / 2)
}

fn setsockopt_int(fd: BorrowedFd<'_>, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn getsockopt_int(fd: BorrowedFd<'_>, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value`, a live
    // c_int, and updates `len`, a live socklen_t.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_accounting_tracks_held_and_free_slots() {
        let ring = Ring::new(8);
        assert_eq!((ring.held(), ring.free()), (0, 8));
        // Nothing is held: no slot is readable.
        assert!((0..8).all(|i| ring.packet(i).is_none()));
        ring.delivered.set(6);
        for i in 0..6 {
            ring.lens[i].set(20);
        }
        assert_eq!((ring.held(), ring.free()), (6, 2));
        assert!(ring.packet(5).is_some());
        assert!(ring.packet(6).is_none(), "slot 6 was never delivered");
        assert!(ring.packet(8).is_none(), "out of range");
        ring.release(4);
        assert!(ring.packet(3).is_none(), "slot 3 was given back");
        assert_eq!(ring.packet(4).map(<[u8]>::len), Some(20));
        // Wrap around: slots 6, 7, 0, 1 delivered next.
        ring.delivered.set(10);
        for i in [6, 7, 0, 1] {
            ring.lens[i].set(14);
        }
        assert_eq!(ring.held(), 6);
        assert!(ring.packet(1).is_some() && ring.packet(0).is_some());
        assert!(ring.packet(2).is_none() && ring.packet(3).is_none());
        // A rejected datagram holds its slot but reads as None.
        ring.lens[7].set(0);
        assert!(ring.packet(7).is_none());
    }

    #[test]
    #[should_panic(expected = "only 2 RX ring slots are held")]
    fn releasing_more_than_held_panics() {
        let ring = Ring::new(4);
        ring.delivered.set(2);
        ring.release(3);
    }
}

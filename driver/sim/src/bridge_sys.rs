//! The bridge's only contact with the kernel: an AF_PACKET raw socket bound
//! to one interface. Every unsafe block of the bridge is here.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// `sll_pkttype` of a frame this host sent (seen again on the socket).
pub const PACKET_OUTGOING: u8 = 4;
/// Socket option (Linux 4.20+): do not loop our own sends back.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// Index of interface `name`.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string for the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens a raw packet socket for every EtherType on interface `ifindex`,
/// promiscuous, not looping back our own sends, with a receive timeout.
pub fn open(ifindex: u32, rx_timeout: Duration) -> io::Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be() as libc::c_int;
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })?;
    // SAFETY: packet_mreq is plain data; all-zero is a valid value.
    let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
    mr.mr_ifindex = ifindex as i32;
    mr.mr_type = libc::PACKET_MR_PROMISC as u16;
    // SAFETY: `mr` is a valid packet_mreq of the size passed.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            (&mr as *const libc::packet_mreq).cast(),
            std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
        )
    })?;
    let one: libc::c_int = 1;
    // Best effort: older kernels lack it; outgoing frames are also filtered
    // by their packet type on receive.
    // SAFETY: an int option of the size passed.
    let _ = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            PACKET_IGNORE_OUTGOING,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let tv = libc::timeval {
        tv_sec: rx_timeout.as_secs() as libc::time_t,
        tv_usec: rx_timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a timeval option of the size passed.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// Sends one frame.
pub fn send(fd: &OwnedFd, frame: &[u8]) -> io::Result<()> {
    // SAFETY: `frame` is valid for `frame.len()` bytes for the call.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one frame into `buf`: `Ok(Some((len, pkttype)))`, `Ok(None)`
/// on timeout (or when `nonblocking` and nothing is waiting).
pub fn recv(fd: &OwnedFd, buf: &mut [u8], nonblocking: bool) -> io::Result<Option<(usize, u8)>> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    let flags = if nonblocking { libc::MSG_DONTWAIT } else { 0 } | libc::MSG_TRUNC;
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, `sll`/`len`
    // describe a valid address buffer.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags,
            (&mut sll as *mut libc::sockaddr_ll).cast(),
            &mut len,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some((n as usize, sll.sll_pkttype)))
}

//! The 14-byte eRPC packet header, exactly as the C++ eRPC lays it out on
//! x86 (little-endian bitfields), encoded with explicit shifts and masks.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | request type |
//! | 1–3 | message size (24 bits, LE) |
//! | 4–5 | destination session number (LE) |
//! | 6–13 | LE u64: packet type (2 bits), packet number (14), request number (44), magic (4) |
//!
//! [`PktHdr::decode`] never reads past its input and rejects a bad magic;
//! everything else is checked by the Rpc against its own state.
//! [`PktHdr::encode`] refuses a field wider than its wire width (the same
//! in debug and release builds: nothing is ever masked off).
//!
//! Request numbers live on a 44-bit circle: [`next_req_num`] wraps from
//! the top back to the bottom (keeping the slot, the number mod 8), and
//! [`req_num_delta`] compares two numbers the wrap-aware way (serial-number
//! arithmetic, as RFC 1982 does for 32-bit sequence numbers).

use std::fmt;

use transport::ERPC_HDR_BYTES;

use crate::consts::{MSG_SIZE_BITS, PKT_MAGIC, PKT_NUM_BITS, REQ_NUM_BITS, SESSION_REQ_WINDOW};

/// Packet type (2 bits on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PktType {
    /// Request data.
    Req = 0,
    /// Request for response: the client pulls the next response packet.
    Rfr = 1,
    /// Explicit credit return for a request packet other than the last.
    ExplCr = 2,
    /// Response data.
    Resp = 3,
}

impl PktType {
    /// From the 2-bit wire value.
    #[inline]
    pub const fn from_bits(b: u64) -> PktType {
        match b & 3 {
            0 => PktType::Req,
            1 => PktType::Rfr,
            2 => PktType::ExplCr,
            _ => PktType::Resp,
        }
    }

    /// Short name for dumps.
    pub const fn name(self) -> &'static str {
        match self {
            PktType::Req => "REQ",
            PktType::Rfr => "RFR",
            PktType::ExplCr => "CR",
            PktType::Resp => "RESP",
        }
    }
}

/// Largest packet number.
pub const MAX_PKT_NUM: u16 = (1 << PKT_NUM_BITS) - 1;
/// Largest request number.
pub const MAX_REQ_NUM: u64 = (1 << REQ_NUM_BITS) - 1;
/// Largest message size the header can carry.
pub const MAX_HDR_MSG_SIZE: u32 = (1 << MSG_SIZE_BITS) - 1;

/// The first of the 256 message sizes that mark a *status packet*: a
/// response header whose size is `STATUS_SIZE_BASE + code` carries no
/// message but the server's verdict on the request (`code`, see
/// `ServerError` in the crate root): header only, packet number that of the
/// first response packet. No message is ever that large (the largest is
/// `MAX_MSG_BYTES`, below 2^23), so a receiver cannot mistake one for the
/// other. An erpc-rs extension: sent only to erpc-rs peers (their SM
/// endpoints carry an incarnation); a C++ eRPC client would take the size
/// for a response's. See `rpc/status.rs`.
pub const STATUS_SIZE_BASE: u32 = MAX_HDR_MSG_SIZE - 0xff;
const _: () = assert!(crate::consts::MAX_MSG_BYTES < STATUS_SIZE_BASE as usize);

const PKT_TYPE_SHIFT: u32 = 0;
const PKT_NUM_SHIFT: u32 = 2;
const REQ_NUM_SHIFT: u32 = PKT_NUM_SHIFT + PKT_NUM_BITS;
const MAGIC_SHIFT: u32 = REQ_NUM_SHIFT + REQ_NUM_BITS;
const _: () = assert!(MAGIC_SHIFT + 4 == 64);
const _: () = assert!(ERPC_HDR_BYTES == 14);

/// A decoded packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PktHdr {
    /// Request type (selects the handler).
    pub req_type: u8,
    /// Message size in bytes (24 bits).
    pub msg_size: u32,
    /// Session number at the receiver.
    pub dest_session_num: u16,
    /// Packet type.
    pub pkt_type: PktType,
    /// Packet number within the request/response exchange (14 bits).
    pub pkt_num: u16,
    /// Request number (44 bits).
    pub req_num: u64,
}

/// Why a header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HdrError {
    /// Fewer than 14 bytes.
    #[error("packet of {len} bytes is shorter than the 14-byte eRPC header")]
    Short {
        /// Bytes available.
        len: usize,
    },
    /// The magic nibble is not 11.
    #[error("bad magic {magic} (expected {PKT_MAGIC})")]
    BadMagic {
        /// The nibble found.
        magic: u8,
    },
}

/// A header field does not fit its wire width ([`PktHdr::encode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value} does not fit the eRPC header (at most {max})")]
pub struct FieldTooWide {
    /// Which field.
    pub field: &'static str,
    /// The value given.
    pub value: u64,
    /// The largest value the field carries.
    pub max: u64,
}

/// The request number after `n` on the same slot: `n + 8`, wrapping from
/// the top of the 44-bit space to its bottom (2^44 is a multiple of 8, so
/// the slot, `n mod 8`, is kept).
#[inline]
pub const fn next_req_num(n: u64) -> u64 {
    (n + SESSION_REQ_WINDOW as u64) & MAX_REQ_NUM
}

/// The request number before `n` on the same slot (the inverse of
/// [`next_req_num`]).
#[inline]
pub const fn prev_req_num(n: u64) -> u64 {
    n.wrapping_sub(SESSION_REQ_WINDOW as u64) & MAX_REQ_NUM
}

/// How far request number `n` is ahead of `cur` on the 44-bit circle:
/// `Ok(d)` with `d` in `0..2^43` when `n` is `d` ahead (0: the same
/// number), `Err(d)` when `n` is `d` behind (`d` in `1..=2^43`). Both
/// numbers must be at most [`MAX_REQ_NUM`].
#[inline]
pub const fn req_num_delta(n: u64, cur: u64) -> Result<u64, u64> {
    let ahead = n.wrapping_sub(cur) & MAX_REQ_NUM;
    if ahead < REQ_NUM_HALF {
        Ok(ahead)
    } else {
        Err((1 << REQ_NUM_BITS) - ahead)
    }
}

/// Half the request-number circle: numbers less than this far ahead are
/// newer, the rest older.
const REQ_NUM_HALF: u64 = 1 << (REQ_NUM_BITS - 1);
const _: () = assert!((1u64 << REQ_NUM_BITS).is_multiple_of(SESSION_REQ_WINDOW as u64));

impl PktHdr {
    /// Encodes into the 14 wire bytes. A field wider than its wire width
    /// (message size above 24 bits, packet number above 14, request number
    /// above 44) is an error, never masked.
    #[inline]
    pub fn encode(&self) -> Result<[u8; ERPC_HDR_BYTES], FieldTooWide> {
        self.check()?;
        Ok(self.encode_checked())
    }

    /// Every field within its wire width? One branch on the hot path;
    /// which field is wrong is found on the cold one.
    #[inline]
    fn check(&self) -> Result<(), FieldTooWide> {
        if (self.msg_size > MAX_HDR_MSG_SIZE)
            | (self.pkt_num > MAX_PKT_NUM)
            | (self.req_num > MAX_REQ_NUM)
        {
            return Err(self.too_wide());
        }
        Ok(())
    }

    /// The wire bytes of a header that passed [`PktHdr::check`].
    #[inline]
    fn encode_checked(&self) -> [u8; ERPC_HDR_BYTES] {
        let word = ((self.pkt_type as u64) << PKT_TYPE_SHIFT)
            | (u64::from(self.pkt_num) << PKT_NUM_SHIFT)
            | (self.req_num << REQ_NUM_SHIFT)
            | (u64::from(PKT_MAGIC) << MAGIC_SHIFT);
        // Bytes 0..8: type, size, session number and the word's first two
        // bytes; bytes 6..14: the word (the overlap is written twice, alike).
        let lo = u64::from(self.req_type)
            | (u64::from(self.msg_size) << 8)
            | (u64::from(self.dest_session_num) << 32)
            | (word << 48);
        let mut b = [0u8; ERPC_HDR_BYTES];
        b[..8].copy_from_slice(&lo.to_le_bytes());
        b[6..].copy_from_slice(&word.to_le_bytes());
        b
    }

    #[cold]
    fn too_wide(&self) -> FieldTooWide {
        let (field, value, max) = if self.msg_size > MAX_HDR_MSG_SIZE {
            (
                "message size",
                u64::from(self.msg_size),
                u64::from(MAX_HDR_MSG_SIZE),
            )
        } else if self.pkt_num > MAX_PKT_NUM {
            (
                "packet number",
                u64::from(self.pkt_num),
                u64::from(MAX_PKT_NUM),
            )
        } else {
            ("request number", self.req_num, MAX_REQ_NUM)
        };
        FieldTooWide { field, value, max }
    }

    /// Writes the header into the first 14 bytes of `out` (see
    /// [`PktHdr::encode`] for the errors; `out` is left alone on error).
    #[inline]
    pub fn write_to(&self, out: &mut [u8]) -> Result<(), FieldTooWide> {
        self.check()?;
        out[..ERPC_HDR_BYTES].copy_from_slice(&self.encode_checked());
        Ok(())
    }

    /// Writes a header whose fields are within their wire widths by
    /// construction: the headers eRPC writes into its own messages (sizes
    /// of msgbufs, at most `MAX_MSG_BYTES`; request numbers, kept in 44
    /// bits by every assignment; packet numbers below
    /// `2 * MAX_MSG_PKTS - 1`, which `consts` asserts fits 14 bits). Debug
    /// builds check it as [`PktHdr::write_to`] does; release builds, on
    /// the per-packet path, do not repeat the proof.
    #[inline(always)]
    pub(crate) fn write_in_range(&self, out: &mut [u8; ERPC_HDR_BYTES]) {
        debug_assert_eq!(self.check(), Ok(()), "an eRPC header field out of range");
        *out = self.encode_checked();
    }

    /// Decodes the first 14 bytes of `b`; checks length and magic only.
    #[inline]
    pub fn decode(b: &[u8]) -> Result<PktHdr, HdrError> {
        RxHdr::decode(b).map(RxHdr::fields)
    }
}

/// A received header as its two wire words, each field read on demand:
/// 16 bytes, so the RX path passes it in two registers where a
/// [`PktHdr`] would go through memory. Same checks as [`PktHdr::decode`]
/// (length and magic); the accessors give what its fields would hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxHdr {
    /// Bytes 0..8: request type, message size, session number (and the
    /// word's first two bytes).
    lo: u64,
    /// Bytes 6..14: packet type, packet number, request number, magic.
    word: u64,
}

impl RxHdr {
    /// Decodes the first 14 bytes of `b`; checks length and magic only.
    #[inline(always)]
    pub(crate) fn decode(b: &[u8]) -> Result<RxHdr, HdrError> {
        let Some(h) = b.first_chunk::<ERPC_HDR_BYTES>() else {
            return Err(HdrError::Short { len: b.len() });
        };
        // Two overlapping 8-byte loads cover the 14 bytes: bytes 0..8 hold
        // the type, size and session number, bytes 6..14 the packed word.
        let (lo, _) = h.split_first_chunk::<8>().expect("14 >= 8");
        let (_, hi) = h.split_last_chunk::<8>().expect("14 >= 8");
        let lo = u64::from_le_bytes(*lo);
        let word = u64::from_le_bytes(*hi);
        let magic = (word >> MAGIC_SHIFT) as u8;
        if magic != PKT_MAGIC {
            return Err(HdrError::BadMagic { magic });
        }
        Ok(RxHdr { lo, word })
    }

    /// Request type.
    #[inline(always)]
    pub(crate) fn req_type(self) -> u8 {
        self.lo as u8
    }

    /// Message size in bytes.
    #[inline(always)]
    pub(crate) fn msg_size(self) -> u32 {
        ((self.lo >> 8) & u64::from(MAX_HDR_MSG_SIZE)) as u32
    }

    /// Session number at the receiver.
    #[inline(always)]
    pub(crate) fn dest_session_num(self) -> u16 {
        (self.lo >> 32) as u16
    }

    /// Packet type.
    #[inline(always)]
    pub(crate) fn pkt_type(self) -> PktType {
        PktType::from_bits(self.word >> PKT_TYPE_SHIFT)
    }

    /// Packet number.
    #[inline(always)]
    pub(crate) fn pkt_num(self) -> u16 {
        ((self.word >> PKT_NUM_SHIFT) & u64::from(MAX_PKT_NUM)) as u16
    }

    /// Request number.
    #[inline(always)]
    pub(crate) fn req_num(self) -> u64 {
        (self.word >> REQ_NUM_SHIFT) & MAX_REQ_NUM
    }

    /// All fields.
    #[inline]
    pub(crate) fn fields(self) -> PktHdr {
        PktHdr {
            req_type: self.req_type(),
            msg_size: self.msg_size(),
            dest_session_num: self.dest_session_num(),
            pkt_type: self.pkt_type(),
            pkt_num: self.pkt_num(),
            req_num: self.req_num(),
        }
    }
}

impl fmt::Display for PktHdr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[type {}, dsn {}, reqn {}, pktn {}, msz {}, req_type {}]",
            self.pkt_type.name(),
            self.dest_session_num,
            self.req_num,
            self.pkt_num,
            self.msg_size,
            self.req_type
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_vector_from_the_cpp_reference() {
        let h = PktHdr {
            req_type: 0xAB,
            msg_size: 0x12_3456,
            dest_session_num: 0xBEEF,
            pkt_type: PktType::Resp,
            pkt_num: 0x1555,
            req_num: 0xABC_DEF0_1234,
        };
        let want = [
            0xab, 0x56, 0x34, 0x12, 0xef, 0xbe, 0x57, 0x55, 0x34, 0x12, 0xf0, 0xde, 0xbc, 0xba,
        ];
        assert_eq!(h.encode(), Ok(want));
        assert_eq!(PktHdr::decode(&want), Ok(h));
    }

    #[test]
    fn rejects_short_and_bad_magic() {
        let h = PktHdr {
            req_type: 1,
            msg_size: 5,
            dest_session_num: 2,
            pkt_type: PktType::Req,
            pkt_num: 0,
            req_num: 8,
        };
        let b = h.encode().unwrap();
        assert_eq!(PktHdr::decode(&b[..13]), Err(HdrError::Short { len: 13 }));
        for magic in 0..16u8 {
            let mut c = b;
            c[13] = (c[13] & 0x0f) | (magic << 4);
            let r = PktHdr::decode(&c);
            if magic == PKT_MAGIC {
                assert_eq!(r, Ok(h));
            } else {
                assert_eq!(r, Err(HdrError::BadMagic { magic }));
            }
        }
    }

    #[test]
    fn every_field_at_its_extremes_round_trips() {
        for pkt_type in [PktType::Req, PktType::Rfr, PktType::ExplCr, PktType::Resp] {
            for &(msg_size, pkt_num, req_num) in &[
                (0, 0, 0),
                (MAX_HDR_MSG_SIZE, MAX_PKT_NUM, MAX_REQ_NUM),
                (1, 1, 1),
                (0x80_0000, 0x2000, 1 << 43),
            ] {
                let h = PktHdr {
                    req_type: 0xff,
                    msg_size,
                    dest_session_num: 0xffff,
                    pkt_type,
                    pkt_num,
                    req_num,
                };
                assert_eq!(PktHdr::decode(&h.encode().unwrap()), Ok(h), "{h}");
            }
        }
    }

    #[test]
    fn fields_wider_than_the_wire_are_errors_in_every_build() {
        let ok = PktHdr {
            req_type: 1,
            msg_size: MAX_HDR_MSG_SIZE,
            dest_session_num: 0,
            pkt_type: PktType::Req,
            pkt_num: MAX_PKT_NUM,
            req_num: MAX_REQ_NUM,
        };
        assert!(ok.encode().is_ok());
        let cases = [
            (
                PktHdr {
                    msg_size: MAX_HDR_MSG_SIZE + 1,
                    ..ok
                },
                "message size",
            ),
            (
                PktHdr {
                    pkt_num: MAX_PKT_NUM + 1,
                    ..ok
                },
                "packet number",
            ),
            (
                PktHdr {
                    req_num: MAX_REQ_NUM + 1,
                    ..ok
                },
                "request number",
            ),
        ];
        for (h, name) in cases {
            match h.encode() {
                Err(FieldTooWide { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
            let mut out = [0xeeu8; 14];
            assert!(h.write_to(&mut out).is_err());
            assert_eq!(out, [0xee; 14], "nothing written on error");
        }
    }

    #[test]
    fn request_numbers_wrap_around_the_44_bit_circle() {
        let top = MAX_REQ_NUM - 7 + 3; // slot 3, the last number of its slot
        assert_eq!(top % 8, 3);
        assert_eq!(next_req_num(top), 3);
        assert_eq!(prev_req_num(3), top);
        assert_eq!(next_req_num(16), 24);
        assert_eq!(prev_req_num(24), 16);
        assert_eq!(req_num_delta(3, top), Ok(8));
        assert_eq!(req_num_delta(top, 3), Err(8));
        assert_eq!(req_num_delta(24, 24), Ok(0));
        assert_eq!(req_num_delta(16, 24), Err(8));
        assert_eq!(req_num_delta(24 + (1 << 42), 24), Ok(1 << 42));
        // Exactly half way round counts as behind.
        assert_eq!(req_num_delta(24 + (1 << 43), 24), Err(1 << 43));
        // Every number a slot goes through round-trips on the wire.
        let mut n = MAX_REQ_NUM + 1 - 8 * 3 + 5;
        for _ in 0..6 {
            let h = PktHdr {
                req_type: 0,
                msg_size: 0,
                dest_session_num: 0,
                pkt_type: PktType::Req,
                pkt_num: 0,
                req_num: n,
            };
            assert_eq!(PktHdr::decode(&h.encode().unwrap()).unwrap().req_num, n);
            assert_eq!(n % 8, 5);
            n = next_req_num(n);
        }
        assert_eq!(n, 5 + 8 * 3);
    }

    #[test]
    fn display_is_one_line() {
        let h = PktHdr {
            req_type: 3,
            msg_size: 32,
            dest_session_num: 1,
            pkt_type: PktType::Rfr,
            pkt_num: 2,
            req_num: 16,
        };
        assert_eq!(
            h.to_string(),
            "[type RFR, dsn 1, reqn 16, pktn 2, msz 32, req_type 3]"
        );
    }
}

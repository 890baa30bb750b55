//! The wire form of typed messages: postcard (serde, varint integers, no
//! field names or type tags), after a one-byte envelope on responses.
//!
//! Why postcard: among the serde codecs measured on this layer's message
//! shapes (`erpc/typed/codec-bench`, BENCHMARKS.md "Typed and async
//! calls", "The codec") it is as compact as any, the fastest on all but
//! the smallest shape, encodes into a caller's buffer (the request msgbuf
//! itself: no intermediate `Vec`, no allocation), decodes from a borrowed
//! slice, and is maintained with a stable 1.x wire format. bincode was
//! faster on four `u64`s and slower on the rest, and is no longer
//! maintained; bitcode's serde API returns a new `Vec` per message and
//! was the slowest on most shapes; MessagePack and CBOR carry type tags
//! that cost bytes and time.
//!
//! A response starts with one status byte: [`RESP_OK`] followed by the
//! encoded response, or [`RESP_BAD_REQUEST`] when the server could not
//! decode the request as the method's type (the client's call fails with
//! [`crate::CallError::BadRequest`] instead of waiting or decoding
//! garbage).

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A codec error (postcard's).
pub type CodecError = postcard::Error;

/// Response status: the encoded response follows.
pub const RESP_OK: u8 = 0;
/// Response status: the server could not decode the request.
pub const RESP_BAD_REQUEST: u8 = 1;

/// Encodes `v` into the start of `buf`; returns the bytes used, or
/// `Ok(None)` if `buf` is too small (then see [`encoded_len`]).
pub fn encode_into<T: Serialize + ?Sized>(
    v: &T,
    buf: &mut [u8],
) -> Result<Option<usize>, CodecError> {
    match postcard::to_slice(v, buf) {
        Ok(used) => Ok(Some(used.len())),
        Err(postcard::Error::SerializeBufferFull) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The encoded size of `v`.
pub fn encoded_len<T: Serialize + ?Sized>(v: &T) -> Result<usize, CodecError> {
    postcard::experimental::serialized_size(v)
}

/// Decodes a `T` that must use all of `b`.
pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, CodecError> {
    let (v, rest) = postcard::take_from_bytes(b)?;
    if !rest.is_empty() {
        return Err(postcard::Error::DeserializeBadEncoding);
    }
    Ok(v)
}

/// Encodes `v` into a new vector (tests, tools).
pub fn to_vec<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_allocvec(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Put {
        key: u64,
        value: Vec<u8>,
    }

    #[test]
    fn round_trip_sizes_and_trailing_bytes() {
        let p = Put {
            key: 300,
            value: vec![7; 5],
        };
        let mut buf = [0u8; 64];
        let n = encode_into(&p, &mut buf).unwrap().unwrap();
        assert_eq!(n, encoded_len(&p).unwrap());
        // varint 300 (2 bytes), length 5 (1 byte), 5 bytes.
        assert_eq!(n, 8);
        assert_eq!(decode::<Put>(&buf[..n]).unwrap(), p);
        assert!(decode::<Put>(&buf[..n + 1]).is_err(), "trailing bytes");
        assert!(decode::<Put>(&buf[..n - 1]).is_err(), "short");
        let mut small = [0u8; 4];
        assert_eq!(encode_into(&p, &mut small).unwrap(), None);
        assert_eq!(to_vec(&p).unwrap(), buf[..n].to_vec());
    }
}

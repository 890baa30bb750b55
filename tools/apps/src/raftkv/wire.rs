//! What travels in eRPC messages: the client requests and responses, the
//! batches of Raft messages between replicas, and snapshot chunks.
//!
//! Little-endian fixed-size fields, parsed with explicit lengths; every
//! parser returns `None` on a malformed message (the caller counts it and
//! answers with an error status or an empty response), never panics.
//!
//! ```text
//! PUT request   client u64 | seq u64 | key [16] | value [64]            (96 B)
//! GET request   count u16 | key [16] * count                             (1 <= count <= MAX_GET_KEYS)
//! response      status u8 | leader u64 | payload
//!               GET payload: (found u8 | value [64]) * count
//! Raft batch    count u32 | (len u32 | protobuf eraftpb::Message) * count
//! snapshot chunk from u64 | snap id u64 | offset u64 | total u64 | bytes
//! ```

use protobuf::Message as _;
use raft::eraftpb::Message;

/// Key length.
pub const KEY_BYTES: usize = 16;
/// Value length.
pub const VALUE_BYTES: usize = 64;
/// A key.
pub type Key = [u8; KEY_BYTES];
/// A value.
pub type Value = [u8; VALUE_BYTES];

/// eRPC request types.
pub mod req {
    /// A batch of Raft messages (response: the receiver's replies to the
    /// sender, as a batch, possibly empty).
    pub const RAFT: u8 = 10;
    /// A chunk of a Raft snapshot message too large for one eRPC message.
    pub const SNAP_CHUNK: u8 = 11;
    /// Client PUT.
    pub const PUT: u8 = 20;
    /// Client GET of one or more keys (linearizable read).
    pub const GET: u8 = 21;
    /// An empty request answered at once (the eRPC round-trip reference).
    pub const PING: u8 = 22;
}

/// PUT request size.
pub const PUT_BYTES: usize = 16 + KEY_BYTES + VALUE_BYTES;
/// Most keys one GET may read.
pub const MAX_GET_KEYS: usize = 256;
/// Response header size.
pub const RESP_HDR_BYTES: usize = 9;
/// Bytes per key of a GET response.
pub const GET_ITEM_BYTES: usize = 1 + VALUE_BYTES;
/// Snapshot chunk header size.
pub const CHUNK_HDR_BYTES: usize = 32;

/// GET request size for `n` keys.
pub const fn get_req_bytes(n: usize) -> usize {
    2 + n * KEY_BYTES
}

/// GET response size for `n` keys.
pub const fn get_resp_bytes(n: usize) -> usize {
    RESP_HDR_BYTES + n * GET_ITEM_BYTES
}

/// The outcome of a client request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Done: the PUT is committed and applied; the GET's values follow.
    Ok = 0,
    /// This replica is not the leader; `leader` names the one it knows (0:
    /// none known). Nothing was done.
    NotLeader = 1,
    /// The replica lost leadership or timed out while the request was
    /// pending: the PUT may or may not be committed. Retry (PUTs are
    /// deduplicated by client and sequence number).
    Retry = 2,
    /// The request was malformed.
    Bad = 3,
}

impl Status {
    fn from_u8(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::NotLeader,
            2 => Status::Retry,
            3 => Status::Bad,
            _ => return None,
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A PUT as proposed to Raft and applied by the state machine (the entry
/// data is the request itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Put {
    /// Client (one per outstanding operation stream) for deduplication.
    pub client: u64,
    /// Sequence number within the client; increases by one per operation.
    pub seq: u64,
    /// Key.
    pub key: Key,
    /// Value.
    pub value: Value,
}

impl Put {
    /// Writes the request into `b` (exactly [`PUT_BYTES`]).
    pub fn write(&self, b: &mut [u8]) {
        b[..8].copy_from_slice(&self.client.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..32].copy_from_slice(&self.key);
        b[32..96].copy_from_slice(&self.value);
    }

    /// Parses a PUT request or entry.
    pub fn parse(b: &[u8]) -> Option<Put> {
        if b.len() != PUT_BYTES {
            return None;
        }
        Some(Put {
            client: u64_at(b, 0)?,
            seq: u64_at(b, 8)?,
            key: b[16..32].try_into().ok()?,
            value: b[32..96].try_into().ok()?,
        })
    }
}

/// Writes a GET request for `keys` into `b`.
pub fn write_get(b: &mut [u8], keys: &[Key]) {
    b[..2].copy_from_slice(&(keys.len() as u16).to_le_bytes());
    for (i, k) in keys.iter().enumerate() {
        b[2 + i * KEY_BYTES..2 + (i + 1) * KEY_BYTES].copy_from_slice(k);
    }
}

/// The keys of a GET request, or `None` if malformed.
pub fn parse_get(b: &[u8]) -> Option<impl Iterator<Item = &Key>> {
    let n = usize::from(u16::from_le_bytes(b.get(..2)?.try_into().ok()?));
    if n == 0 || n > MAX_GET_KEYS || b.len() != get_req_bytes(n) {
        return None;
    }
    Some(
        b[2..]
            .chunks_exact(KEY_BYTES)
            .map(|c| <&Key>::try_from(c).expect("exact chunks")),
    )
}

/// Writes a response header.
pub fn write_resp_hdr(b: &mut [u8], status: Status, leader: u64) {
    b[0] = status as u8;
    b[1..9].copy_from_slice(&leader.to_le_bytes());
}

/// Parses a response header: status, leader hint, payload.
pub fn parse_resp(b: &[u8]) -> Option<(Status, u64, &[u8])> {
    let status = Status::from_u8(*b.first()?)?;
    Some((status, u64_at(b, 1)?, &b[RESP_HDR_BYTES..]))
}

/// Writes one GET result item.
pub fn write_get_item(b: &mut [u8], v: Option<&Value>) {
    match v {
        Some(v) => {
            b[0] = 1;
            b[1..GET_ITEM_BYTES].copy_from_slice(v);
        }
        None => b[..GET_ITEM_BYTES].fill(0),
    }
}

/// The values of a GET response payload for `n` keys.
pub fn parse_get_items(p: &[u8], n: usize) -> Option<Vec<Option<Value>>> {
    if p.len() != n * GET_ITEM_BYTES {
        return None;
    }
    p.chunks_exact(GET_ITEM_BYTES)
        .map(|c| match c[0] {
            0 => Some(None),
            1 => Some(Some(c[1..].try_into().ok()?)),
            _ => None,
        })
        .collect()
}

/// Size of a batch holding `msgs`.
pub fn batch_bytes(msgs: &[&Message]) -> usize {
    4 + msgs
        .iter()
        .map(|m| 4 + m.compute_size() as usize)
        .sum::<usize>()
}

/// Encodes `msgs` into `b` (exactly [`batch_bytes`] long). Call
/// [`batch_bytes`] first: it caches the sizes the encoder uses.
pub fn write_batch(b: &mut [u8], msgs: &[&Message]) -> Result<(), protobuf::ProtobufError> {
    b[..4].copy_from_slice(&(msgs.len() as u32).to_le_bytes());
    let mut at = 4;
    for m in msgs {
        let len = m.get_cached_size() as usize;
        b[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        at += 4;
        let mut os = protobuf::CodedOutputStream::bytes(&mut b[at..at + len]);
        m.write_to_with_cached_sizes(&mut os)?;
        os.check_eof();
        at += len;
    }
    debug_assert_eq!(at, b.len());
    Ok(())
}

/// Most messages one batch may claim (a malformed count is refused before
/// anything is allocated).
pub const MAX_BATCH_MSGS: usize = 1 << 16;

/// Decodes a batch; `None` if malformed (lengths that overrun, a bad
/// protobuf message, trailing bytes).
pub fn parse_batch(b: &[u8]) -> Option<Vec<Message>> {
    let n = u32_at(b, 0)? as usize;
    if n > MAX_BATCH_MSGS || n > b.len() / 4 {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    let mut at = 4;
    for _ in 0..n {
        let len = u32_at(b, at)? as usize;
        at += 4;
        let body = b.get(at..at.checked_add(len)?)?;
        out.push(Message::parse_from_bytes(body).ok()?);
        at += len;
    }
    (at == b.len()).then_some(out)
}

/// A snapshot chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHdr {
    /// Sending replica.
    pub from: u64,
    /// Identifies one transfer (chunks of another transfer restart the
    /// receiver's buffer).
    pub snap_id: u64,
    /// Where this chunk's bytes go.
    pub offset: u64,
    /// Size of the whole encoded message.
    pub total: u64,
}

/// Largest snapshot message accepted (the receiver allocates this much).
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

impl ChunkHdr {
    /// Writes the header into `b[..CHUNK_HDR_BYTES]`.
    pub fn write(&self, b: &mut [u8]) {
        b[..8].copy_from_slice(&self.from.to_le_bytes());
        b[8..16].copy_from_slice(&self.snap_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
    }

    /// Parses a chunk: the header and its bytes, if they fit the total.
    pub fn parse(b: &[u8]) -> Option<(ChunkHdr, &[u8])> {
        let h = ChunkHdr {
            from: u64_at(b, 0)?,
            snap_id: u64_at(b, 8)?,
            offset: u64_at(b, 16)?,
            total: u64_at(b, 24)?,
        };
        let data = &b[CHUNK_HDR_BYTES..];
        let end = h.offset.checked_add(data.len() as u64)?;
        (h.total <= MAX_SNAPSHOT_BYTES && end <= h.total && !data.is_empty()).then_some((h, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};

    #[test]
    fn put_and_get_round_trip() {
        let p = Put {
            client: 7,
            seq: 9,
            key: [3; 16],
            value: [4; 64],
        };
        let mut b = [0u8; PUT_BYTES];
        p.write(&mut b);
        assert_eq!(Put::parse(&b), Some(p));
        assert_eq!(Put::parse(&b[..95]), None);
        let keys = [[1u8; 16], [2u8; 16]];
        let mut g = vec![0u8; get_req_bytes(2)];
        write_get(&mut g, &keys);
        assert_eq!(parse_get(&g).unwrap().copied().collect::<Vec<_>>(), keys);
        assert!(parse_get(&g[..g.len() - 1]).is_none());
        assert!(parse_get(&[0, 0]).is_none(), "zero keys");
        let mut r = vec![0u8; get_resp_bytes(2)];
        write_resp_hdr(&mut r, Status::Ok, 3);
        write_get_item(&mut r[9..], Some(&[5; 64]));
        write_get_item(&mut r[9 + 65..], None);
        let (s, l, p) = parse_resp(&r).unwrap();
        assert_eq!((s, l), (Status::Ok, 3));
        assert_eq!(parse_get_items(p, 2).unwrap(), vec![Some([5; 64]), None]);
        assert!(parse_resp(&[9; 9]).is_none(), "unknown status");
    }

    #[test]
    fn batches_round_trip_and_reject_damage() {
        let mut a = Message::default();
        a.set_msg_type(MessageType::MsgAppend);
        a.to = 2;
        a.from = 1;
        a.term = 5;
        a.mut_entries().push(Entry {
            index: 9,
            data: vec![1u8; 96].into(),
            ..Default::default()
        });
        let mut h = Message::default();
        h.set_msg_type(MessageType::MsgHeartbeat);
        let msgs = [&a, &h];
        let mut b = vec![0u8; batch_bytes(&msgs)];
        write_batch(&mut b, &msgs).unwrap();
        let back = parse_batch(&b).unwrap();
        assert_eq!(back, vec![a.clone(), h.clone()]);
        assert_eq!(parse_batch(&[0, 0, 0, 0]).unwrap(), vec![]);
        // Truncated, extended, a huge count: refused.
        assert!(parse_batch(&b[..b.len() - 1]).is_none());
        let mut longer = b.clone();
        longer.push(0);
        assert!(parse_batch(&longer).is_none());
        assert!(parse_batch(&[255, 255, 255, 255]).is_none());
        let mut bad_len = b.clone();
        bad_len[4] = 0xff;
        bad_len[7] = 0x7f;
        assert!(parse_batch(&bad_len).is_none());
    }

    #[test]
    fn chunks_must_fit_their_total() {
        let h = ChunkHdr {
            from: 1,
            snap_id: 2,
            offset: 10,
            total: 20,
        };
        let mut b = vec![0u8; CHUNK_HDR_BYTES + 10];
        h.write(&mut b);
        assert_eq!(ChunkHdr::parse(&b).unwrap().0, h);
        b.push(0);
        assert!(ChunkHdr::parse(&b).is_none(), "past the total");
        assert!(ChunkHdr::parse(&b[..CHUNK_HDR_BYTES]).is_none(), "empty");
        let mut huge = vec![0u8; CHUNK_HDR_BYTES + 1];
        ChunkHdr {
            total: MAX_SNAPSHOT_BYTES + 1,
            offset: 0,
            ..h
        }
        .write(&mut huge);
        assert!(ChunkHdr::parse(&huge).is_none());
    }
}

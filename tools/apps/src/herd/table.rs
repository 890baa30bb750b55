//! The store's hash table: bucketised open addressing, MICA/HERD style.
//!
//! Why not a crate: the burst handler must compute each key's bucket
//! address and prefetch it before it reads any bucket. hashbrown's
//! `HashTable` (the raw API is gone since 0.15) and std's map hide where a
//! key's group lives, so neither can be prefetched without doing the
//! lookup itself; a bucket index computed from the hash is the one thing
//! this design needs, and the table around it is fifty lines.
//!
//! Layout: a bucket is 192 bytes, 64-byte aligned: one cache line with
//! four 16-byte keys, then two lines with their four 32-byte values. A
//! key hashes to a home bucket (Lemire's multiply-shift reduction of the
//! hash, so any bucket count works); a bucket that is full spills into the
//! next (linear probing over buckets). The all-zero key marks an empty
//! slot and is refused. There are no deletes (HERD's workload has GET and
//! PUT only), so an empty slot ends a search. The table holds at most 7/8
//! of its slots, so probe sequences stay short.

use super::{KEY_BYTES, Key, VALUE_BYTES, Value};

/// Slots per bucket.
pub const SLOTS: usize = 4;

/// One bucket: the keys' cache line first, then the values' two.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    keys: [Key; SLOTS],
    vals: [Value; SLOTS],
}

const EMPTY: Key = [0; KEY_BYTES];

impl Bucket {
    const ZERO: Bucket = Bucket {
        keys: [EMPTY; SLOTS],
        vals: [[0; VALUE_BYTES]; SLOTS],
    };
}

/// Why a PUT was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PutError {
    /// The table holds its most items (7/8 of its slots).
    #[error("the table is full")]
    Full,
    /// The all-zero key (it marks empty slots).
    #[error("the all-zero key is reserved")]
    ZeroKey,
}

/// A bucketised hash table of 16-byte keys and 32-byte values.
pub struct Table {
    buckets: Box<[Bucket]>,
    len: usize,
    max_len: usize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Table({} items in {} buckets)",
            self.len,
            self.buckets.len()
        )
    }
}

/// The 64-bit hash of a key (a strong mixer over its two halves: keys are
/// often sequential).
#[inline]
pub fn hash(k: &Key) -> u64 {
    let lo = u64::from_le_bytes(k[..8].try_into().expect("8 bytes"));
    let hi = u64::from_le_bytes(k[8..].try_into().expect("8 bytes"));
    mix64(lo ^ mix64(hi))
}

/// A 64-bit finaliser (SplitMix64's).
#[inline]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `x * n / 2^32` for a 32-bit `x`: a uniform index below `n`.
#[inline]
fn reduce(x: u32, n: usize) -> usize {
    ((u64::from(x) * n as u64) >> 32) as usize
}

/// Brings the cache line at `p` towards the core (a hint: it never faults
/// and changes nothing observable).
#[inline(always)]
fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that never faults, whatever the
    // address; `p` points into a live bucket anyway. SSE is part of the
    // x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl Table {
    /// A table for up to `items` items (at least one bucket).
    pub fn with_capacity(items: usize) -> Table {
        // items <= 7/8 of the slots.
        let buckets = (items.saturating_mul(8) / 7).div_ceil(SLOTS).max(1);
        let max_len = buckets * SLOTS * 7 / 8;
        Table {
            buckets: vec![Bucket::ZERO; buckets].into_boxed_slice(),
            len: 0,
            max_len: max_len.max(items.min(buckets * SLOTS)),
        }
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The home bucket of a key with hash `h`.
    #[inline]
    fn home(&self, h: u64) -> usize {
        reduce((h >> 32) as u32, self.buckets.len())
    }

    /// Prefetches the three cache lines of `k`'s home bucket (what the
    /// burst handler does for every request before it reads any).
    #[inline]
    pub fn prefetch(&self, k: &Key) {
        let b = &self.buckets[self.home(hash(k))];
        prefetch_line(b.keys.as_ptr());
        prefetch_line(b.vals.as_ptr());
        prefetch_line(b.vals[2].as_ptr());
    }

    /// Finds `k`: (bucket, slot), or the first empty slot on its probe
    /// sequence (`Err`), or `Err(None)` when every bucket is full.
    #[inline]
    fn find(&self, k: &Key) -> Result<(usize, usize), Option<(usize, usize)>> {
        let n = self.buckets.len();
        let mut b = self.home(hash(k));
        for _ in 0..n {
            let bucket = &self.buckets[b];
            for s in 0..SLOTS {
                if bucket.keys[s] == *k {
                    return Ok((b, s));
                }
                if bucket.keys[s] == EMPTY {
                    return Err(Some((b, s)));
                }
            }
            b = if b + 1 == n { 0 } else { b + 1 };
        }
        Err(None)
    }

    /// The value of `k`.
    #[inline]
    pub fn get(&self, k: &Key) -> Option<&Value> {
        if *k == EMPTY {
            return None;
        }
        self.find(k).ok().map(|(b, s)| &self.buckets[b].vals[s])
    }

    /// Stores `v` at `k` (replacing a value, or inserting while there is
    /// room).
    #[inline]
    pub fn put(&mut self, k: &Key, v: &Value) -> Result<(), PutError> {
        if *k == EMPTY {
            return Err(PutError::ZeroKey);
        }
        match self.find(k) {
            Ok((b, s)) => {
                self.buckets[b].vals[s] = *v;
                Ok(())
            }
            Err(Some((b, s))) if self.len < self.max_len => {
                self.buckets[b].keys[s] = *k;
                self.buckets[b].vals[s] = *v;
                self.len += 1;
                Ok(())
            }
            Err(_) => Err(PutError::Full),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> Key {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&(i + 1).to_le_bytes());
        k
    }

    #[test]
    fn get_put_replace_and_fill_up() {
        let mut t = Table::with_capacity(1000);
        assert!(t.buckets() * SLOTS * 7 / 8 >= 1000);
        for i in 0..1000 {
            t.put(&k(i), &[i as u8; 32]).unwrap();
        }
        assert_eq!(t.len(), 1000);
        for i in 0..1000 {
            assert_eq!(t.get(&k(i)), Some(&[i as u8; 32]));
        }
        assert_eq!(t.get(&k(5000)), None);
        t.put(&k(7), &[99; 32]).unwrap();
        assert_eq!(t.get(&k(7)), Some(&[99; 32]));
        assert_eq!(t.len(), 1000);
        // Up to 7/8 of the slots, then full; replacing still works.
        let mut i = 1000;
        while t.put(&k(i), &[1; 32]).is_ok() {
            i += 1;
        }
        assert_eq!(t.len(), t.buckets() * SLOTS * 7 / 8);
        assert_eq!(t.put(&k(i), &[1; 32]), Err(PutError::Full));
        t.put(&k(3), &[3; 32]).unwrap();
        for j in 0..i {
            assert!(t.get(&k(j)).is_some(), "key {j} lost");
        }
        assert_eq!(t.put(&EMPTY, &[1; 32]), Err(PutError::ZeroKey));
        assert_eq!(t.get(&EMPTY), None);
    }

    #[test]
    fn a_tiny_table_wraps_its_probes() {
        let mut t = Table::with_capacity(1);
        assert_eq!(t.buckets(), 1);
        t.put(&k(1), &[1; 32]).unwrap();
        t.put(&k(2), &[2; 32]).unwrap();
        t.put(&k(3), &[3; 32]).unwrap();
        assert_eq!(t.put(&k(4), &[4; 32]), Err(PutError::Full));
        assert_eq!(t.get(&k(2)), Some(&[2; 32]));
        t.prefetch(&k(9));
    }
}

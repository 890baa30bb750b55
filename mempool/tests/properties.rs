//! Property tests of the allocator: no overlap, alignment, IOVA translation,
//! reuse after free, accounting. They use 4 KiB fallback pages explicitly when
//! hugepages are missing, so they always run; the hugepage path itself is
//! covered in tests/hugepages.rs.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::BumpMapper;
use mempool::{
    AllocError, Allocator, AllocatorConfig, Buffer, Fallback, HUGE_2M, MAX_ALLOC, RegionOptions,
    class_for, class_size,
};
use proptest::prelude::*;

fn allocator(max_bytes: usize) -> (Allocator, Arc<BumpMapper>) {
    let mapper = Arc::new(BumpMapper::new());
    let cfg = AllocatorConfig {
        initial_bytes: HUGE_2M,
        max_bytes,
        region: RegionOptions {
            fallback: Fallback::SmallPages,
            ..Default::default()
        },
        poison_on_free: None,
    };
    (Allocator::new(mapper.clone(), cfg).unwrap(), mapper)
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![0usize..=2048, 2049usize..=(1 << 20), Just(MAX_ALLOC)].prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

fn check_invariants(live: &[Buffer], mapper: &BumpMapper) {
    let mut by_va: BTreeMap<usize, &Buffer> = BTreeMap::new();
    for b in live {
        // Alignment: own size, capped at 2 MiB.
        assert_eq!(b.va() % b.capacity().min(HUGE_2M), 0, "misaligned {b:?}");
        // IOVA translation agrees with the mapping that covers the block.
        let regions = mapper.live.lock().unwrap();
        let (rva, m) = regions
            .iter()
            .find(|(va, m)| b.va() >= *va && b.va() + b.capacity() <= va + m.len)
            .expect("block lies inside one registered region");
        assert_eq!(b.iova(), m.iova + (b.va() - rva) as u64);
        assert_eq!(b.lkey(), m.lkey);
        assert!(
            by_va.insert(b.va(), b).is_none(),
            "two live blocks at one address"
        );
    }
    // No overlap: each block ends before the next begins.
    let mut prev_end = 0usize;
    for (va, b) in by_va {
        assert!(va >= prev_end, "overlap at {va:#x}");
        prev_end = va + b.capacity();
    }
}

/// Cases per property: the default, or `PROPTEST_CASES` for a longer soak.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    #[test]
    fn random_alloc_free_sequences(ops in proptest::collection::vec(op(), 1..200)) {
        let (mut a, mapper) = allocator(usize::MAX);
        let mut live: Vec<Buffer> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(size) => {
                    let b = a.alloc(size).unwrap();
                    prop_assert!(b.capacity() >= size);
                    prop_assert_eq!(b.class().map(usize::from), class_for(size));
                    live.push(b);
                }
                Op::Free(i) if !live.is_empty() => {
                    let b = live.swap_remove(i % live.len());
                    let (va, class) = (b.va(), b.class());
                    a.free(b);
                    // LIFO reuse: the next allocation of that class gets it back.
                    let again = a.alloc(class_size(class.unwrap().into())).unwrap();
                    prop_assert_eq!(again.va(), va);
                    live.push(again);
                }
                Op::Free(_) => {}
            }
            let s = a.stats();
            let expect: usize = live.iter().map(|b| b.capacity()).sum();
            prop_assert_eq!(s.in_use_bytes, expect);
            prop_assert!(s.high_water_bytes >= expect);
            prop_assert!(s.reserved_bytes >= expect);
        }
        check_invariants(&live, &mapper);
        for b in live.drain(..) {
            a.free(b);
        }
        prop_assert_eq!(a.stats().in_use_bytes, 0);
        drop(a);
        prop_assert!(mapper.live.lock().unwrap().is_empty());
    }

    #[test]
    fn exhaustion_is_an_error_not_a_crash(sizes in proptest::collection::vec(64usize..=(256 << 10), 1..100)) {
        let limit = 4 << 20;
        let (mut a, _m) = allocator(limit);
        let mut live = Vec::new();
        let mut failed = false;
        for size in sizes {
            match a.alloc(size) {
                Ok(b) => live.push(b),
                Err(AllocError::Exhausted { limit: l, .. }) => { prop_assert_eq!(l, limit); failed = true; }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
            prop_assert!(a.stats().reserved_bytes <= limit);
        }
        let in_use: usize = live.iter().map(|b| b.capacity()).sum();
        prop_assert!(in_use <= limit);
        if failed {
            prop_assert!(in_use + 256 * 1024 > limit - (1 << 20), "failed while far from the limit: {in_use}");
        }
        for b in live { a.free(b); }
    }
}

#[test]
fn too_large_is_rejected() {
    let (mut a, _m) = allocator(usize::MAX);
    let err = a.alloc(MAX_ALLOC + 1).unwrap_err();
    assert!(matches!(err, AllocError::TooLarge { size } if size == MAX_ALLOC + 1));
}

#[test]
fn dedicated_ring_larger_than_any_class() {
    let (mut a, mapper) = allocator(usize::MAX);
    let before = a.stats().reserved_bytes;
    let ring = a.alloc_ring(MAX_ALLOC + 1).unwrap();
    assert_eq!(ring.class(), None);
    assert_eq!(ring.capacity(), MAX_ALLOC + HUGE_2M);
    assert_eq!(a.iova_of(ring.va() + 5), Some(ring.iova() + 5));
    assert_eq!(a.stats().dedicated_ring_bytes, ring.capacity());
    a.free(ring);
    assert_eq!(a.stats().reserved_bytes, before);
    assert_eq!(a.stats().dedicated_ring_bytes, 0);
    drop(a);
    assert!(mapper.live.lock().unwrap().is_empty());
}

#[test]
#[should_panic(expected = "did not allocate it")]
fn freeing_into_the_wrong_allocator_panics() {
    let (mut a, _m1) = allocator(usize::MAX);
    let (mut b, _m2) = allocator(usize::MAX);
    let buf = a.alloc(100).unwrap();
    b.free(buf);
}

#[test]
fn dropping_with_outstanding_buffers_keeps_memory_valid() {
    let (mut a, mapper) = allocator(usize::MAX);
    let mut buf = a.alloc(4096).unwrap();
    drop(a);
    // The region was leaked, not unmapped: the buffer is still usable.
    buf.as_mut_slice().fill(1);
    assert_eq!(mapper.live.lock().unwrap().len(), 1);
    // A Buffer has no destructor: letting it go out of scope leaks the block.
}

/// `Allocator` must not be `Send`; this is checked at compile time by a
/// doc test in the crate (`compile_fail`), and here we assert the `Buffer`
/// handle is `Send` (it may travel to a worker thread and back).
#[test]
fn buffer_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Buffer>();
}

/// A mapper whose unmap always fails: the region must not be handed back to
/// the kernel while the device may still reach it.
#[derive(Debug)]
struct FailingUnmap;

impl mempool::DmaMapper for FailingUnmap {
    unsafe fn map(&self, va: usize, len: usize) -> Result<mempool::DmaMapping, mempool::DmaError> {
        Ok(mempool::DmaMapping {
            iova: va as u64,
            len,
            lkey: 0,
        })
    }

    fn unmap(&self, va: usize, m: &mempool::DmaMapping) -> Result<(), mempool::DmaError> {
        Err(mempool::DmaError {
            op: "unmap",
            va,
            iova: m.iova,
            len: m.len,
            source: "injected failure".into(),
        })
    }
}

#[test]
fn failed_unmap_leaks_instead_of_freeing() {
    let opts = RegionOptions {
        fallback: Fallback::SmallPages,
        ..Default::default()
    };
    let mut r = mempool::HugepageRegion::reserve(HUGE_2M, opts).unwrap();
    r.register(Arc::new(FailingUnmap)).unwrap();
    let (va, len) = (r.va(), r.len());
    drop(r);
    // Still mapped: the page is readable (munmap would make this fault). The
    // kernel's view is checked through /proc/self/maps.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let still = maps.lines().any(|l| {
        let range = l.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        a <= va && va + len <= b
    });
    assert!(
        still,
        "region at {va:#x} was unmapped although its DMA unmap failed"
    );
}

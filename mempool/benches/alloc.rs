//! alloc + free of one buffer per size class, against the system allocator
//! (malloc/free of the same size) measured in the same run.
//!
//! Run: `cargo bench -p mempool --bench alloc`
//! Needs about 64 MiB of 2 MiB hugepages; without them it falls back to
//! 4 KiB pages and says so (the fast path does not touch the pages).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use mempool::{
    Allocator, AllocatorConfig, Fallback, IdentityMapper, NUM_CLASSES, RegionOptions, class_size,
};

fn bench(c: &mut Criterion) {
    let config = AllocatorConfig {
        initial_bytes: 64 << 20,
        region: RegionOptions {
            fallback: Fallback::SmallPages,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut alloc = Allocator::new(Arc::new(IdentityMapper::new()), config).expect("allocator");
    if alloc.stats().fallback_regions > 0 {
        eprintln!("NOTE: no hugepages available, benchmarking on 4 KiB pages");
    }
    let mut group = c.benchmark_group("alloc_free");
    for class in (0..NUM_CLASSES).step_by(3) {
        let size = class_size(class);
        // Warm the class so the measured loop is the fast path.
        let b = alloc.alloc(size).unwrap();
        alloc.free(b);
        group.bench_with_input(BenchmarkId::new("mempool", size), &size, |bench, &size| {
            bench.iter(|| {
                let b = alloc.alloc(black_box(size)).unwrap();
                alloc.free(black_box(b));
            })
        });
        group.bench_with_input(BenchmarkId::new("malloc", size), &size, |bench, &size| {
            bench.iter(|| {
                let v: Vec<u8> = Vec::with_capacity(black_box(size));
                black_box(v.as_ptr());
                drop(v);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! The zsmalloc-style pool: contents survive allocation, freeing and
//! compaction; handles stay valid across compaction; empty zspages go back.

use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use uswap::zpool::{AllocError, Pool, MAX_OBJECT, PAGE_SIZE};

fn fill(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn objects_keep_their_bytes_through_frees_and_compaction() {
    let pool = Pool::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut live = HashMap::new();
    for i in 0..20_000u64 {
        let len = rng.gen_range(1..=MAX_OBJECT);
        let data = fill(i, len);
        let h = pool.alloc(len).unwrap();
        pool.write(h, &data);
        live.insert(h, data);
    }
    let before = pool.total_size();
    // Free two objects in three, scattered: zspages end up sparse.
    let handles: Vec<_> = live.keys().copied().collect();
    for (i, h) in handles.into_iter().enumerate() {
        if i % 3 != 0 {
            pool.free(h);
            live.remove(&h);
        }
    }
    let sparse = pool.total_size();
    let freed = pool.compact();
    assert!(freed > 0, "compaction freed nothing");
    assert_eq!(pool.total_size(), sparse - freed * PAGE_SIZE);
    assert!(pool.total_size() < before / 2);
    for (h, data) in &live {
        let mut out = vec![0u8; data.len()];
        pool.read(*h, &mut out);
        assert!(&out == data, "an object changed");
    }
    assert_eq!(pool.objects(), live.len());
    let stats = pool.class_stats();
    assert_eq!(stats.iter().map(|c| c.objs_used).sum::<usize>(), live.len());
    assert_eq!(
        stats.iter().map(|c| c.pages_used).sum::<usize>() * PAGE_SIZE,
        pool.total_size()
    );
    for h in live.keys() {
        pool.free(*h);
    }
    assert_eq!(pool.total_size(), 0, "empty zspages are given back");
}

#[test]
fn bad_sizes_and_injected_failures_are_errors() {
    let pool = Pool::new();
    assert_eq!(pool.alloc(0), Err(AllocError::BadSize));
    assert_eq!(pool.alloc(MAX_OBJECT + 1), Err(AllocError::BadSize));
    pool.fail_next_allocs(2);
    assert_eq!(pool.alloc(100), Err(AllocError::NoMemory));
    assert_eq!(pool.alloc(100), Err(AllocError::NoMemory));
    assert!(pool.alloc(100).is_ok());
}

#[test]
fn concurrent_alloc_free_and_compaction() {
    let pool = Pool::new();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let pool = &pool;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut mine: Vec<(uswap::zpool::Handle, Vec<u8>)> = Vec::new();
                for i in 0..5_000u64 {
                    if !mine.is_empty() && rng.gen_bool(0.4) {
                        let (h, data) = mine.swap_remove(rng.gen_range(0..mine.len()));
                        let mut out = vec![0u8; data.len()];
                        pool.read(h, &mut out);
                        assert!(out == data);
                        pool.free(h);
                    } else {
                        let len = rng.gen_range(32..2000);
                        let data = fill(t << 32 | i, len);
                        let h = pool.alloc(len).unwrap();
                        pool.write(h, &data);
                        mine.push((h, data));
                    }
                }
                for (h, data) in mine {
                    let mut out = vec![0u8; data.len()];
                    pool.read(h, &mut out);
                    assert!(out == data);
                    pool.free(h);
                }
            });
        }
        s.spawn(|| {
            for _ in 0..200 {
                pool.compact();
                std::thread::yield_now();
            }
        });
    });
    assert_eq!(pool.objects(), 0);
    assert_eq!(pool.total_size(), 0);
}

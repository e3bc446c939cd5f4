//! Slot allocation and release: no slot is handed out twice, folios get
//! aligned contiguous runs, and every slot comes back in every free mode,
//! under concurrency, including the async worker's direct-free fallback.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use uswap::swap::{FreeMode, SlotAllocator, SlotReleaser};

#[test]
fn folios_get_aligned_contiguous_runs_and_fall_back_when_fragmented() {
    let a = SlotAllocator::new(4096);
    let mut taken = HashSet::new();
    for order in [0usize, 4, 9, 2, 4, 0] {
        let first = a.alloc(order).unwrap();
        assert_eq!(first % (1 << order), 0, "order {order} run not aligned");
        for s in first..first + (1 << order) {
            assert!(taken.insert(s), "slot {s} handed out twice");
        }
    }
    // Fill the rest with single pages: no 2 MiB run remains, but every slot
    // is still usable one by one.
    while let Some(s) = a.alloc(0) {
        assert!(taken.insert(s), "slot {s} handed out twice");
    }
    assert_eq!(taken.len(), 4096);
    assert_eq!(a.alloc(9), None);
    assert_eq!(a.alloc(4), None);
    for s in taken {
        a.free(s);
    }
    assert_eq!(a.in_use(), 0);
    assert!(
        a.alloc(9).is_some(),
        "freed clusters serve large folios again"
    );
}

#[test]
fn a_partial_last_cluster_is_usable_to_its_end() {
    let a = SlotAllocator::new(700);
    let mut n = 0;
    while let Some(s) = a.alloc(0) {
        assert!(s < 700);
        n += 1;
    }
    assert_eq!(n, 700);
}

fn churn(mode: FreeMode, hold_worker: bool) {
    let allocator = Arc::new(SlotAllocator::new(8192));
    let releaser = SlotReleaser::new(mode, allocator.clone(), None).unwrap();
    if hold_worker {
        releaser.hold_worker(true);
    }
    let seen = Mutex::new(HashSet::new());
    std::thread::scope(|s| {
        for t in 0..4 {
            let (allocator, releaser, seen) = (&allocator, &releaser, &seen);
            s.spawn(move || {
                // Forgets a run in the shared record, then releases it.
                let give_back = |(first, n): (u32, usize)| {
                    let mut seen = seen.lock().unwrap();
                    for s in first..first + n as u32 {
                        seen.remove(&s);
                    }
                    drop(seen);
                    for s in first..first + n as u32 {
                        releaser.release(s);
                    }
                };
                let mut held: Vec<(u32, usize)> = Vec::new();
                for i in 0..3000usize {
                    let order = [0usize, 0, 0, 2, 4][(i + t) % 5];
                    if let Some(first) = allocator.alloc(order) {
                        let mut seen = seen.lock().unwrap();
                        for s in first..first + (1 << order) {
                            assert!(seen.insert(s), "slot {s} handed out twice");
                        }
                        held.push((first, 1 << order));
                    }
                    if held.len() > 40 || (i % 3 == 0 && !held.is_empty()) {
                        give_back(held.remove(0));
                    }
                }
                held.into_iter().for_each(give_back);
            });
        }
    });
    if hold_worker {
        let stats = releaser.stats();
        assert!(stats.async_handoffs >= 1);
        assert!(
            stats.async_direct_frees >= 1,
            "a busy worker makes releasers free directly"
        );
        releaser.hold_worker(false);
    }
    releaser.drain();
    assert_eq!(
        allocator.in_use(),
        0,
        "{mode:?}: slots did not all come back"
    );
    let stats = releaser.stats();
    match mode {
        FreeMode::Immediate => assert_eq!(stats.freed_immediately, stats.released),
        FreeMode::Batched => assert!(stats.cache_flushes_by_caller > 0),
        FreeMode::Async => assert!(stats.async_handoffs > 0 && stats.freed_by_worker > 0),
    }
    for _ in 0..8192 {
        assert!(allocator.alloc(0).is_some());
    }
}

#[test]
fn every_slot_comes_back_immediate() {
    churn(FreeMode::Immediate, false);
}

#[test]
fn every_slot_comes_back_batched() {
    churn(FreeMode::Batched, false);
}

#[test]
fn every_slot_comes_back_async() {
    churn(FreeMode::Async, false);
}

#[test]
fn every_slot_comes_back_async_with_a_busy_worker() {
    churn(FreeMode::Async, true);
}

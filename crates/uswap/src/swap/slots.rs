//! Swap slot allocation by clusters, the way Linux 6.15+ allocates.
//!
//! The swap space is cut into clusters of 512 slots. A cluster serves one
//! folio order at a time, so a folio of 2^k pages always finds a contiguous,
//! 2^k-aligned run inside it. Each thread (hashed to one of a few shards)
//! keeps a current cluster per order and allocates from it until it fills;
//! then it takes a non-full cluster of that order, or a free cluster. When
//! neither exists, a large folio cannot be placed and falls back (the
//! caller splits it; `swpout_fallback`), while a single page may still take
//! any free slot anywhere.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Slots per cluster.
pub const CLUSTER_SLOTS: usize = 512;
/// Folio orders 0..=9 (1..=512 pages).
pub const ORDERS: usize = 10;
const WORDS: usize = CLUSTER_SLOTS / 64;
const SHARDS: usize = 16;
const NONE: u32 = u32::MAX;

struct Cluster {
    used_bits: [u64; WORDS],
    used: u16,
    /// Slots past the end of the swap space (marked used forever).
    reserved: u16,
    /// The order this cluster serves; `None` while it is entirely free.
    order: Option<u8>,
    listed_nonfull: bool,
    listed_free: bool,
}

impl Cluster {
    /// Takes a free aligned run of `1 << order` slots; returns its offset.
    fn take_run(&mut self, order: usize) -> Option<usize> {
        let n = 1usize << order;
        if self.used as usize + n > CLUSTER_SLOTS {
            return None;
        }
        let offset = if n >= 64 {
            let words = n / 64;
            (0..WORDS)
                .step_by(words)
                .find(|&w| self.used_bits[w..w + words].iter().all(|&x| x == 0))
                .map(|w| w * 64)?
        } else {
            let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            (0..WORDS).find_map(|w| {
                let word = self.used_bits[w];
                if word == u64::MAX {
                    return None;
                }
                (0..64)
                    .step_by(n)
                    .find(|&b| word & (mask << b) == 0)
                    .map(|b| w * 64 + b)
            })?
        };
        self.mark(offset, n, true);
        Some(offset)
    }

    fn mark(&mut self, offset: usize, n: usize, used: bool) {
        for s in offset..offset + n {
            let bit = 1u64 << (s % 64);
            let word = &mut self.used_bits[s / 64];
            if used {
                debug_assert!(*word & bit == 0, "slot {s} handed out twice");
                *word |= bit;
            } else {
                assert!(*word & bit != 0, "slot {s} freed twice");
                *word &= !bit;
            }
        }
        if used {
            self.used += n as u16;
        } else {
            self.used -= n as u16;
        }
    }
}

/// Counters of the allocator.
#[derive(Debug, Default)]
pub(crate) struct AllocCounters {
    pub allocated: AtomicU64,
    pub freed: AtomicU64,
    pub order0_scans: AtomicU64,
}

/// The cluster allocator of one swap space.
pub struct SlotAllocator {
    slots: u32,
    clusters: Vec<Mutex<Cluster>>,
    free_clusters: Mutex<Vec<u32>>,
    nonfull: Vec<Mutex<Vec<u32>>>,
    current: Vec<[AtomicU32; ORDERS]>,
    pub(crate) counters: AllocCounters,
}

static NEXT_SHARD: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) as usize % SHARDS;
}

/// The calling thread's shard, shared by the allocator and the free caches.
pub(crate) fn thread_shard() -> usize {
    SHARD.with(|s| *s)
}

pub(crate) const SHARD_COUNT: usize = SHARDS;

impl SlotAllocator {
    /// An allocator for `slots` slots (a partial last cluster is usable up
    /// to `slots`).
    pub fn new(slots: u32) -> SlotAllocator {
        let count = (slots as usize).div_ceil(CLUSTER_SLOTS);
        let clusters = (0..count)
            .map(|c| {
                let mut cluster = Cluster {
                    used_bits: [0; WORDS],
                    used: 0,
                    reserved: 0,
                    order: None,
                    listed_nonfull: false,
                    listed_free: false,
                };
                let end = ((c + 1) * CLUSTER_SLOTS).min(slots as usize) - c * CLUSTER_SLOTS;
                if end < CLUSTER_SLOTS {
                    // Slots past the end of the space are never free.
                    cluster.mark(end, CLUSTER_SLOTS - end, true);
                    cluster.reserved = (CLUSTER_SLOTS - end) as u16;
                }
                Mutex::new(cluster)
            })
            .collect::<Vec<_>>();
        let mut free: Vec<u32> = Vec::new();
        for (i, c) in clusters.iter().enumerate().rev() {
            c.lock().expect("cluster lock").listed_free = true;
            free.push(i as u32);
        }
        let nonfull: Vec<Mutex<Vec<u32>>> = (0..ORDERS).map(|_| Mutex::new(Vec::new())).collect();
        SlotAllocator {
            slots,
            clusters,
            free_clusters: Mutex::new(free),
            nonfull,
            current: (0..SHARDS)
                .map(|_| std::array::from_fn(|_| AtomicU32::new(NONE)))
                .collect(),
            counters: AllocCounters::default(),
        }
    }

    /// Slots in the swap space (the `slots` given to [`SlotAllocator::new`]),
    /// free or not.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    fn try_cluster(&self, index: u32, order: usize) -> Option<u32> {
        let mut c = self.clusters[index as usize].lock().expect("cluster lock");
        let claimed_now = match c.order {
            Some(o) if o as usize == order => false,
            None => {
                c.order = Some(order as u8);
                true
            }
            _ => return None,
        };
        let Some(offset) = c.take_run(order) else {
            if claimed_now {
                c.order = None;
            }
            return None;
        };
        Some(index * CLUSTER_SLOTS as u32 + offset as u32)
    }

    /// Allocates a contiguous, aligned run of `1 << order` slots and returns
    /// the first; `None` when no such run is free.
    pub fn alloc(&self, order: usize) -> Option<u32> {
        assert!(order < ORDERS, "folio order {order} too large");
        let shard = thread_shard();
        let current = &self.current[shard][order];
        let cur = current.load(Ordering::Relaxed);
        let slot = (cur != NONE)
            .then(|| self.try_cluster(cur, order))
            .flatten()
            .or_else(|| self.alloc_from_lists(order, current))
            .or_else(|| (order == 0).then(|| self.scan_any_free()).flatten());
        if slot.is_some() {
            self.counters
                .allocated
                .fetch_add(1 << order, Ordering::Relaxed);
        }
        slot
    }

    fn alloc_from_lists(&self, order: usize, current: &AtomicU32) -> Option<u32> {
        loop {
            let next = self.nonfull[order].lock().expect("nonfull lock").pop();
            let Some(index) = next else { break };
            self.clusters[index as usize]
                .lock()
                .expect("cluster lock")
                .listed_nonfull = false;
            if let Some(slot) = self.try_cluster(index, order) {
                current.store(index, Ordering::Relaxed);
                return Some(slot);
            }
        }
        loop {
            let index = self
                .free_clusters
                .lock()
                .expect("free cluster lock")
                .pop()?;
            self.clusters[index as usize]
                .lock()
                .expect("cluster lock")
                .listed_free = false;
            if let Some(slot) = self.try_cluster(index, order) {
                current.store(index, Ordering::Relaxed);
                return Some(slot);
            }
        }
    }

    /// The slow path for a single page: any free slot in any cluster.
    fn scan_any_free(&self) -> Option<u32> {
        self.counters.order0_scans.fetch_add(1, Ordering::Relaxed);
        for (i, c) in self.clusters.iter().enumerate() {
            let mut c = c.lock().expect("cluster lock");
            if (c.used as usize) < CLUSTER_SLOTS {
                let w = c
                    .used_bits
                    .iter()
                    .position(|&w| w != u64::MAX)
                    .expect("a free bit");
                let b = (!c.used_bits[w]).trailing_zeros() as usize;
                c.mark(w * 64 + b, 1, true);
                if c.order.is_none() {
                    c.order = Some(0);
                }
                return Some((i * CLUSTER_SLOTS + w * 64 + b) as u32);
            }
        }
        None
    }

    /// Frees `count` slots starting at `first` (all in one cluster).
    pub fn free_run(&self, first: u32, count: usize) {
        let index = first as usize / CLUSTER_SLOTS;
        let offset = first as usize % CLUSTER_SLOTS;
        assert!(
            offset + count <= CLUSTER_SLOTS,
            "a run never crosses clusters"
        );
        let mut c = self.clusters[index].lock().expect("cluster lock");
        c.mark(offset, count, false);
        self.counters
            .freed
            .fetch_add(count as u64, Ordering::Relaxed);
        if c.used == c.reserved {
            c.order = None;
            if !c.listed_free {
                c.listed_free = true;
                drop(c);
                self.free_clusters
                    .lock()
                    .expect("free cluster lock")
                    .push(index as u32);
            }
        } else if !c.listed_nonfull {
            c.listed_nonfull = true;
            let order = c.order.expect("a used cluster has an order") as usize;
            drop(c);
            self.nonfull[order]
                .lock()
                .expect("nonfull lock")
                .push(index as u32);
        }
    }

    /// Frees one slot.
    pub fn free(&self, slot: u32) {
        self.free_run(slot, 1);
    }

    /// Slots currently allocated.
    pub fn in_use(&self) -> u64 {
        self.counters.allocated.load(Ordering::Relaxed)
            - self.counters.freed.load(Ordering::Relaxed)
    }

    /// Whether `slot` is allocated.
    pub fn is_allocated(&self, slot: u32) -> bool {
        let c = self.clusters[slot as usize / CLUSTER_SLOTS]
            .lock()
            .expect("cluster lock");
        let s = slot as usize % CLUSTER_SLOTS;
        c.used_bits[s / 64] & (1 << (s % 64)) != 0
    }
}

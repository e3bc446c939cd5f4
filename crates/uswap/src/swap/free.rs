//! Returning swap slots, in the three ways the async-free seed compares.
//!
//! - `immediate`: each slot is freed when it is released.
//! - `batched`: a per-thread return cache of 64 slots, freed all at once by
//!   whichever thread fills it. That thread — often one serving a page
//!   fault — pays for 64 frees: the tail latency the seed measured.
//! - `async`: a full cache is handed to a background worker; if the worker is
//!   still busy with the previous batch, the releasing thread frees the
//!   slots itself (the seed's fallback).
//!
//! Freeing a slot runs the owner's [`FreeHook`] first (the store frees the
//! slot's pool object there, as the kernel frees a zswap entry when its swap
//! slot is freed), then returns the slot to the allocator.

use super::slots::{thread_shard, SlotAllocator, SHARD_COUNT};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Slots per return cache, as in the kernel's swap_slots cache.
pub const RETURN_CACHE: usize = 64;

/// How released slots are freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeMode {
    /// Each slot is freed by the thread that releases it, at once.
    Immediate,
    /// Released slots gather in a cache of [`RETURN_CACHE`] slots per
    /// thread shard; the thread whose release fills a cache frees all of it.
    Batched,
    /// As `Batched`, but a full cache goes to a background worker; the
    /// releasing thread frees it itself only while the worker is busy.
    Async,
}

impl FreeMode {
    /// The mode's name, as [`FromStr`](std::str::FromStr) parses it.
    pub fn name(self) -> &'static str {
        match self {
            FreeMode::Immediate => "immediate",
            FreeMode::Batched => "batched",
            FreeMode::Async => "async",
        }
    }
}

impl std::str::FromStr for FreeMode {
    type Err = String;

    fn from_str(s: &str) -> Result<FreeMode, String> {
        match s {
            "immediate" => Ok(FreeMode::Immediate),
            "batched" => Ok(FreeMode::Batched),
            "async" => Ok(FreeMode::Async),
            other => Err(format!(
                "unknown slot free mode {other:?}: expected immediate, batched or async"
            )),
        }
    }
}

/// Counters of the release paths.
#[derive(Debug, Default)]
pub(crate) struct FreeCounters {
    pub released: AtomicU64,
    pub freed_immediately: AtomicU64,
    pub cache_flushes_by_caller: AtomicU64,
    pub async_handoffs: AtomicU64,
    pub async_direct_frees: AtomicU64,
    pub freed_by_worker: AtomicU64,
}

/// A snapshot of the release counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreeStats {
    /// Slots released.
    pub released: u64,
    /// Slots freed at once (`immediate`).
    pub freed_immediately: u64,
    /// Full caches freed by the releasing thread (`batched`).
    pub cache_flushes_by_caller: u64,
    /// Full caches handed to the worker (`async`).
    pub async_handoffs: u64,
    /// Full caches the releasing thread freed because the worker was busy.
    pub async_direct_frees: u64,
    /// Slots the worker freed.
    pub freed_by_worker: u64,
}

struct Mailbox {
    batch: Option<Vec<u32>>,
    stop: bool,
}

struct Worker {
    /// Fault injection: a held worker takes batches but frees nothing.
    held: Mutex<bool>,
    released: Condvar,
    mailbox: Mutex<Mailbox>,
    wake: Condvar,
    idle: Condvar,
    busy: AtomicBool,
}

/// Work to do for a slot just before it becomes free.
pub type FreeHook = Arc<dyn Fn(u32) + Send + Sync>;

/// Frees slots: runs the hook, then returns them to the allocator.
struct Freer {
    allocator: Arc<SlotAllocator>,
    hook: Option<FreeHook>,
}

impl Freer {
    fn free(&self, slot: u32) {
        if let Some(hook) = &self.hook {
            hook(slot);
        }
        self.allocator.free(slot);
    }

    fn free_all(&self, slots: &[u32]) {
        for &s in slots {
            self.free(s);
        }
    }
}

/// Releases slots into an allocator according to a [`FreeMode`].
pub struct SlotReleaser {
    mode: FreeMode,
    freer: Arc<Freer>,
    caches: Vec<Mutex<Vec<u32>>>,
    worker: Option<(Arc<Worker>, JoinHandle<()>)>,
    counters: Arc<FreeCounters>,
}

impl SlotReleaser {
    /// A releaser into `allocator`; `hook` runs for each slot as it is freed.
    pub fn new(
        mode: FreeMode,
        allocator: Arc<SlotAllocator>,
        hook: Option<FreeHook>,
    ) -> std::io::Result<SlotReleaser> {
        let counters = Arc::new(FreeCounters::default());
        let freer = Arc::new(Freer { allocator, hook });
        let worker = if mode == FreeMode::Async {
            let w = Arc::new(Worker {
                held: Mutex::new(false),
                released: Condvar::new(),
                mailbox: Mutex::new(Mailbox {
                    batch: None,
                    stop: false,
                }),
                wake: Condvar::new(),
                idle: Condvar::new(),
                busy: AtomicBool::new(false),
            });
            let (wc, fc, cc) = (w.clone(), freer.clone(), counters.clone());
            let handle = std::thread::Builder::new()
                .name("uswap-slot-free".into())
                .spawn(move || worker_loop(&wc, &fc, &cc))?;
            Some((w, handle))
        } else {
            None
        };
        Ok(SlotReleaser {
            mode,
            freer,
            caches: (0..SHARD_COUNT)
                .map(|_| Mutex::new(Vec::with_capacity(RETURN_CACHE)))
                .collect(),
            worker,
            counters,
        })
    }

    /// The release counters so far. Each is read on its own, so a snapshot
    /// taken while slots are being released need not be consistent across
    /// counters.
    pub fn stats(&self) -> FreeStats {
        let c = &self.counters;
        FreeStats {
            released: c.released.load(Ordering::Relaxed),
            freed_immediately: c.freed_immediately.load(Ordering::Relaxed),
            cache_flushes_by_caller: c.cache_flushes_by_caller.load(Ordering::Relaxed),
            async_handoffs: c.async_handoffs.load(Ordering::Relaxed),
            async_direct_frees: c.async_direct_frees.load(Ordering::Relaxed),
            freed_by_worker: c.freed_by_worker.load(Ordering::Relaxed),
        }
    }

    /// The mode the releaser was created with.
    pub fn mode(&self) -> FreeMode {
        self.mode
    }

    /// Releases one slot.
    pub fn release(&self, slot: u32) {
        self.counters.released.fetch_add(1, Ordering::Relaxed);
        if self.mode == FreeMode::Immediate {
            self.freer.free(slot);
            self.counters
                .freed_immediately
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let full = {
            let mut cache = self.caches[thread_shard()]
                .lock()
                .expect("return cache lock");
            cache.push(slot);
            if cache.len() < RETURN_CACHE {
                return;
            }
            std::mem::replace(&mut *cache, Vec::with_capacity(RETURN_CACHE))
        };
        match &self.worker {
            Some((worker, _)) => {
                if let Err(full) = self.hand_off(worker, full) {
                    self.counters
                        .async_direct_frees
                        .fetch_add(1, Ordering::Relaxed);
                    self.freer.free_all(&full);
                }
            }
            None => {
                self.counters
                    .cache_flushes_by_caller
                    .fetch_add(1, Ordering::Relaxed);
                self.freer.free_all(&full);
            }
        }
    }

    /// Gives a full cache to the worker unless it is still busy.
    fn hand_off(&self, worker: &Worker, batch: Vec<u32>) -> Result<(), Vec<u32>> {
        if worker
            .busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(batch);
        }
        worker.mailbox.lock().expect("mailbox lock").batch = Some(batch);
        worker.wake.notify_one();
        self.counters.async_handoffs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Fault injection: while held, the async worker keeps the batch it was
    /// given without freeing it, so releasers see it busy.
    pub fn hold_worker(&self, hold: bool) {
        if let Some((worker, _)) = &self.worker {
            *worker.held.lock().expect("hold lock") = hold;
            worker.released.notify_all();
        }
    }

    /// Frees every cached slot and waits for the worker to finish, so that
    /// every released slot is free when this returns.
    pub fn drain(&self) {
        for cache in &self.caches {
            let slots = std::mem::take(&mut *cache.lock().expect("return cache lock"));
            self.freer.free_all(&slots);
        }
        if let Some((worker, _)) = &self.worker {
            let mut mailbox = worker.mailbox.lock().expect("mailbox lock");
            while worker.busy.load(Ordering::Acquire) {
                mailbox = worker.idle.wait(mailbox).expect("mailbox lock");
            }
        }
    }
}

fn worker_loop(worker: &Worker, freer: &Freer, counters: &FreeCounters) {
    let mut mailbox = worker.mailbox.lock().expect("mailbox lock");
    loop {
        if let Some(batch) = mailbox.batch.take() {
            drop(mailbox);
            let mut held = worker.held.lock().expect("hold lock");
            while *held {
                held = worker.released.wait(held).expect("hold lock");
            }
            drop(held);
            freer.free_all(&batch);
            counters
                .freed_by_worker
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            mailbox = worker.mailbox.lock().expect("mailbox lock");
            worker.busy.store(false, Ordering::Release);
            worker.idle.notify_all();
            continue;
        }
        if mailbox.stop {
            return;
        }
        mailbox = worker.wake.wait(mailbox).expect("mailbox lock");
    }
}

impl Drop for SlotReleaser {
    fn drop(&mut self) {
        self.hold_worker(false);
        self.drain();
        if let Some((worker, handle)) = self.worker.take() {
            worker.mailbox.lock().expect("mailbox lock").stop = true;
            worker.wake.notify_all();
            let _ = handle.join();
        }
    }
}

//! `mm`: transparent compressed paging of a process's memory with
//! userfaultfd.
//!
//! A [`Runtime`] manages [`Region`]s of anonymous memory. The first touch of
//! a folio maps zero pages; when the resident managed memory passes
//! `memory_high`, the reclaimer ([`reclaim`]) evicts cold folios through the
//! compressed store in plugged batches; a touch of an evicted folio raises a
//! userfaultfd fault that a filler thread ([`fault`]) serves by loading the
//! folio (plus readahead) and installing it with UFFDIO_COPY.
//!
//! Threads: one event thread reads the userfaultfd and never blocks on
//! anything else (our own MADV_DONTNEED waits until its REMOVE event is
//! read); filler threads serve page faults and may wait for reclaim
//! (throttling); one reclaimer evicts.
//!
//! Eviction never loses a write: a folio is write-protected
//! (UFFDIO_WRITEPROTECT) before it is copied out, a writer meanwhile waits
//! on a write-protect fault, and it is woken only once the folio is either
//! stored and dropped (it then refaults and gets the stored data back) or
//! refused and unprotected (its write lands in place).

mod fault;
pub mod floor;
mod folio;
mod reclaim;
mod region;
mod uffd;

pub use region::Region;

use crate::accel::{Device, DeviceConfig};
use crate::size::parse_size;
use crate::swap::{Backing, FreeMode, SwapFile};
use crate::zswap::{PoolLimit, Zswap, ZswapConfig, ZswapStats};
use region::RegionInner;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use uffd::Uffd;

/// Bytes per page.
pub const PAGE_SIZE: usize = 4096;

/// The runtime's knobs, named as in the kernel.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Resident managed memory above which the reclaimer evicts.
    pub memory_high: usize,
    /// The unit evicted, stored and brought back together (4K..2M).
    pub folio_size: usize,
    /// Codec by kernel name.
    pub compressor: String,
    /// Folios collected in the reclaim plug before they are stored together.
    pub compress_batchsize: usize,
    /// Readahead of 2^page_cluster folios (the faulting one included).
    pub page_cluster: u32,
    /// Pool limit as a percentage of physical memory (kernel default 20).
    pub max_pool_percent: u8,
    /// Pool limit in bytes, overriding the percentage.
    pub max_pool_bytes: Option<usize>,
    /// Stores resume below this percentage of the pool limit.
    pub accept_threshold_percent: u8,
    /// Compression engines.
    pub engines: usize,
    /// The swap file: directory and size; `None` for none.
    pub swap_file: Option<(PathBuf, u64)>,
    /// Swap slots when there is no swap file.
    pub swap_slots: u32,
    /// How released slots are freed.
    pub slot_free: FreeMode,
    /// Threads serving page faults.
    pub fillers: usize,
    /// How long a partly filled plug waits for more folios.
    pub plug_timeout: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            memory_high: 256 << 20,
            folio_size: 64 << 10,
            compressor: "lz4".into(),
            compress_batchsize: 8,
            page_cluster: 0,
            max_pool_percent: 20,
            max_pool_bytes: None,
            accept_threshold_percent: 90,
            engines: 2,
            swap_file: None,
            swap_slots: 1 << 20,
            slot_free: FreeMode::Async,
            fillers: 2,
            plug_timeout: Duration::from_millis(1),
        }
    }
}

impl RuntimeConfig {
    /// How far resident managed memory may exceed `memory_high` before a
    /// faulting thread waits for reclaim: two plugs of folios and one
    /// readahead window per fault server, but at least 1/64 of the limit and
    /// 1 MiB, so that reclaim can run beside the faulting threads instead of
    /// in front of every fault (as memory.high lets usage overshoot and
    /// reclaims on the way back to user space).
    pub fn slack(&self) -> usize {
        let plug = self.compress_batchsize.max(1) * self.folio_size;
        let readahead = (self.fillers + 1) * (1usize << self.page_cluster) * self.folio_size;
        (2 * plug + readahead).max(self.memory_high / 64).max(1 << 20)
    }
}

/// Builds a [`Runtime`]; sizes accept "64k", "512M", "2G".
#[derive(Debug, Clone, Default)]
pub struct Builder {
    config: RuntimeConfig,
}

/// A bad knob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadConfig(pub String);

impl std::fmt::Display for BadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadConfig {}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    pub fn memory_high(mut self, size: &str) -> Result<Builder, BadConfig> {
        self.config.memory_high = parse_size(size).map_err(|e| BadConfig(e.to_string()))? as usize;
        Ok(self)
    }

    pub fn folio_size(mut self, size: &str) -> Result<Builder, BadConfig> {
        self.config.folio_size = parse_size(size).map_err(|e| BadConfig(e.to_string()))? as usize;
        Ok(self)
    }

    /// Replaces every knob at once.
    pub fn config(mut self, config: RuntimeConfig) -> Builder {
        self.config = config;
        self
    }

    pub fn compressor(mut self, name: &str) -> Builder {
        self.config.compressor = name.to_string();
        self
    }

    pub fn compress_batchsize(mut self, n: usize) -> Builder {
        self.config.compress_batchsize = n;
        self
    }

    pub fn page_cluster(mut self, n: u32) -> Builder {
        self.config.page_cluster = n;
        self
    }

    pub fn engines(mut self, n: usize) -> Builder {
        self.config.engines = n;
        self
    }

    pub fn swap_file(mut self, dir: PathBuf, size: &str) -> Result<Builder, BadConfig> {
        let bytes = parse_size(size).map_err(|e| BadConfig(e.to_string()))?;
        self.config.swap_file = Some((dir, bytes));
        Ok(self)
    }

    pub fn slot_free(mut self, mode: FreeMode) -> Builder {
        self.config.slot_free = mode;
        self
    }

    pub fn max_pool_percent(mut self, percent: u8) -> Builder {
        self.config.max_pool_percent = percent;
        self
    }

    pub fn accept_threshold_percent(mut self, percent: u8) -> Builder {
        self.config.accept_threshold_percent = percent;
        self
    }

    pub fn build(self) -> io::Result<Runtime> {
        Runtime::new(self.config)
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

/// Counters of the runtime itself (the store's are in [`ZswapStats`]).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub pgmajfault: AtomicU64,
    pub faults: AtomicU64,
    pub zero_fills: AtomicU64,
    pub wp_faults: AtomicU64,
    pub swap_ra: AtomicU64,
    pub throttled: AtomicU64,
    pub evicted_folios: AtomicU64,
    pub eviction_refused: AtomicU64,
    pub reclaim_batches: AtomicU64,
    pub refaults_activated: AtomicU64,
    pub sigbus: AtomicU64,
}

/// A snapshot of the runtime's counters.
#[derive(Debug, Clone, Default)]
pub struct RuntimeStats {
    /// The store's counters (zswpout, zswpin, pswpout, ...).
    pub store: ZswapStats,
    /// Faults served from the store or the swap file (major faults).
    pub pgmajfault: u64,
    /// Page faults on managed memory the runtime received.
    pub faults: u64,
    /// First touches served with zero pages.
    pub zero_fills: u64,
    /// Writes that met a folio being evicted and waited.
    pub wp_faults: u64,
    /// Pages brought in ahead of a fault (page_cluster).
    pub swap_ra: u64,
    /// Faults that waited for reclaim because memory was over the limit.
    pub throttled: u64,
    /// Folios evicted.
    pub evicted_folios: u64,
    /// Folios the store refused (they stayed resident).
    pub eviction_refused: u64,
    /// Plugs flushed to the store.
    pub reclaim_batches: u64,
    /// Refaulted folios given a second pass (short refault distance).
    pub refaults_activated: u64,
    /// Faults answered with SIGBUS because the stored data was unusable.
    pub sigbus: u64,
    /// Managed memory resident now.
    pub resident_bytes: u64,
}

impl RuntimeStats {
    /// Every counter as (name, value), store counters first.
    pub fn named(&self) -> Vec<(String, u64)> {
        let mut v = self.store.named();
        for (name, value) in [
            ("pgmajfault", self.pgmajfault),
            ("faults", self.faults),
            ("zero_fills", self.zero_fills),
            ("wp_faults", self.wp_faults),
            ("swap_ra", self.swap_ra),
            ("throttled", self.throttled),
            ("evicted_folios", self.evicted_folios),
            ("eviction_refused", self.eviction_refused),
            ("reclaim_batches", self.reclaim_batches),
            ("refaults_activated", self.refaults_activated),
            ("sigbus", self.sigbus),
            ("resident_bytes", self.resident_bytes),
        ] {
            v.push((name.to_string(), value));
        }
        v
    }
}

/// A folio in the reclaim FIFO.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FolioRef {
    pub region: u32,
    pub folio: u32,
}

/// A page fault handed to the fillers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FaultMsg {
    pub addr: usize,
    pub flags: u64,
    pub tid: u32,
}

/// Everything the runtime's threads share.
pub(crate) struct Shared {
    pub config: RuntimeConfig,
    pub uffd: Uffd,
    pub store: Zswap,
    pub regions: RwLock<Vec<Arc<RegionInner>>>,
    next_region: AtomicU32,
    /// Resident managed memory, in bytes.
    pub resident: AtomicUsize,
    /// Folios in fault-in order.
    pub fifo: Mutex<VecDeque<FolioRef>>,
    /// Workingset clock: folios evicted so far.
    pub evictions: AtomicU32,
    pub reclaim_signal: (Mutex<bool>, Condvar),
    /// Notified after every reclaim batch (throttled faults wait on it).
    pub reclaimed: (Mutex<()>, Condvar),
    /// The reclaimer could not free anything: throttling would wait forever.
    pub reclaim_stuck: AtomicBool,
    /// Folio ranges the reclaimer is dropping itself (their REMOVE events
    /// are ours).
    pub own_removes: Mutex<Vec<usize>>,
    pub reclaimer_tid: AtomicI32,
    pub faults: (Mutex<VecDeque<FaultMsg>>, Condvar),
    pub counters: Counters,
    pub shutdown: AtomicBool,
    /// Handles (the runtime and its regions) still held by users.
    users: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The compressed paging runtime.
pub struct Runtime {
    shared: Arc<Shared>,
}

impl Runtime {
    /// Starts a runtime: the store, the device, and the event, filler and
    /// reclaimer threads.
    pub fn new(config: RuntimeConfig) -> io::Result<Runtime> {
        let fs = config.folio_size;
        if !fs.is_power_of_two() || !(PAGE_SIZE..=2 << 20).contains(&fs) {
            return Err(invalid(format!("folio_size {fs}: expected a power of two from 4k to 2M")));
        }
        if !(1..=32).contains(&config.compress_batchsize) {
            return Err(invalid("compress_batchsize must be 1..=32"));
        }
        if config.page_cluster > 9 {
            return Err(invalid("page_cluster must be at most 9"));
        }
        if config.memory_high < fs {
            return Err(invalid("memory_high must hold at least one folio"));
        }
        let device = Arc::new(Device::new(DeviceConfig::with_engines(config.engines))?);
        let backing: Option<Arc<dyn Backing>> = match &config.swap_file {
            Some((dir, bytes)) => Some(Arc::new(SwapFile::create(dir, *bytes)?)),
            None => None,
        };
        let store_config = ZswapConfig {
            compressor: config.compressor.clone(),
            max_pool: match config.max_pool_bytes {
                Some(b) => PoolLimit::Bytes(b),
                None => PoolLimit::Percent {
                    percent: config.max_pool_percent,
                    of_bytes: crate::zswap::physical_memory(),
                },
            },
            accept_threshold_percent: config.accept_threshold_percent,
            slots: config.swap_slots,
            free_mode: config.slot_free,
            batching: true,
            writeback_worker: true,
            ..ZswapConfig::default()
        };
        let store = Zswap::new(store_config, device, backing).map_err(|e| invalid(e.to_string()))?;
        let shared = Arc::new(Shared {
            uffd: Uffd::open()?,
            store,
            regions: RwLock::new(Vec::new()),
            next_region: AtomicU32::new(0),
            resident: AtomicUsize::new(0),
            fifo: Mutex::new(VecDeque::new()),
            evictions: AtomicU32::new(0),
            reclaim_signal: (Mutex::new(false), Condvar::new()),
            reclaimed: (Mutex::new(()), Condvar::new()),
            reclaim_stuck: AtomicBool::new(false),
            own_removes: Mutex::new(Vec::new()),
            reclaimer_tid: AtomicI32::new(0),
            faults: (Mutex::new(VecDeque::new()), Condvar::new()),
            counters: Counters::default(),
            shutdown: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            threads: Mutex::new(Vec::new()),
            config,
        });
        let runtime = Runtime { shared: shared.clone() };
        // On error, dropping `runtime` stops the threads already started.
        let spawn = |name: String, f: fn(&Shared)| -> io::Result<()> {
            let s = shared.clone();
            let handle = std::thread::Builder::new().name(name).spawn(move || f(&s))?;
            shared.threads.lock().expect("threads lock").push(handle);
            Ok(())
        };
        spawn("uswap-uffd".into(), fault::event_loop)?;
        for i in 0..shared.config.fillers.max(1) {
            spawn(format!("uswap-fill-{i}"), fault::filler_loop)?;
        }
        spawn("uswap-reclaim".into(), reclaim::reclaim_loop)?;
        Ok(runtime)
    }

    pub fn builder() -> Builder {
        Builder::new()
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }

    /// Maps `len` bytes (rounded up to whole folios) of managed anonymous
    /// memory.
    pub fn map(&self, len: usize) -> io::Result<Region> {
        let fs = self.shared.config.folio_size;
        let len = len.div_ceil(fs).max(1) * fs;
        // Over-map by a folio so the region can start folio-aligned.
        let raw = crate::sys::map_anonymous(len + fs)?.as_ptr() as usize;
        let base = raw.next_multiple_of(fs);
        // SAFETY: trimming the unaligned head and tail of our own mapping.
        unsafe {
            if base > raw {
                libc::munmap(raw as *mut _, base - raw);
            }
            let tail = raw + len + fs - (base + len);
            if tail > 0 {
                libc::munmap((base + len) as *mut _, tail);
            }
            // Large folios are our unit; the kernel's THP would only get in
            // the way of page-granular faults.
            libc::madvise(base as *mut _, len, libc::MADV_NOHUGEPAGE);
        }
        self.register(base, len, folio::UNTOUCHED, true)
    }

    /// Manages an existing private anonymous mapping (`ptr` and `len` whole
    /// folios, folio-aligned). Its present contents count as resident.
    /// Dropping the region gives the mapping back intact.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be a private anonymous mapping that stays mapped
    /// while the region lives (the program may still move or unmap it
    /// through the kernel; the runtime follows).
    pub unsafe fn manage(&self, ptr: *mut u8, len: usize) -> io::Result<Region> {
        let fs = self.shared.config.folio_size;
        let base = ptr as usize;
        if !base.is_multiple_of(fs) || !len.is_multiple_of(fs) || len == 0 {
            return Err(invalid("manage: the range must be whole, aligned folios"));
        }
        self.register(base, len, folio::RESIDENT, false)
    }

    fn register(&self, base: usize, len: usize, initial: u64, owned: bool) -> io::Result<Region> {
        let shared = &self.shared;
        let id = shared.next_region.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(RegionInner::new(id, base, len, shared.config.folio_size, initial, owned));
        shared.regions.write().expect("regions lock").push(inner.clone());
        if let Err(e) = shared.uffd.register(base, len) {
            shared.regions.write().expect("regions lock").retain(|r| r.id != id);
            if owned {
                // SAFETY: our own mapping, never handed out.
                unsafe { libc::munmap(base as *mut _, len) };
            }
            return Err(io::Error::new(e.kind(), format!("registering with userfaultfd: {e}")));
        }
        if initial == folio::RESIDENT {
            shared.resident.fetch_add(len, Ordering::AcqRel);
            let mut fifo = shared.fifo.lock().expect("fifo lock");
            for f in 0..inner.folios.len() {
                fifo.push_back(FolioRef { region: id, folio: f as u32 });
            }
            drop(fifo);
            shared.kick_reclaim();
        }
        shared.users.fetch_add(1, Ordering::AcqRel);
        Ok(Region {
            shared: shared.clone(),
            inner,
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RuntimeStats {
        self.shared.stats()
    }

    /// How far resident memory may exceed `memory_high`.
    pub fn slack(&self) -> usize {
        self.shared.config.slack()
    }

    /// The store (for fault injection in tests and statistics).
    pub fn store(&self) -> &Zswap {
        &self.shared.store
    }

    /// The state of the folio holding `addr`, for tests: whether it is
    /// swapped out now.
    pub fn is_swapped(&self, addr: *const u8) -> bool {
        self.shared
            .lookup(addr as usize)
            .is_some_and(|(r, i)| folio::state(r.folios[i].load()) == folio::SWAPPED)
    }

    /// The first swap slot of the swapped folio holding `addr`.
    pub fn swapped_slot(&self, addr: *const u8) -> Option<u32> {
        let (r, i) = self.shared.lookup(addr as usize)?;
        let w = r.folios[i].load();
        (folio::state(w) == folio::SWAPPED).then(|| folio::slot(w))
    }

    /// Wakes the reclaimer (it evicts whenever resident memory is above
    /// `memory_high`).
    pub fn reclaim_now(&self) {
        self.shared.kick_reclaim();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shared.release_user();
    }
}

impl Shared {
    pub fn stats(&self) -> RuntimeStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RuntimeStats {
            store: self.store.stats(),
            pgmajfault: l(&c.pgmajfault),
            faults: l(&c.faults),
            zero_fills: l(&c.zero_fills),
            wp_faults: l(&c.wp_faults),
            swap_ra: l(&c.swap_ra),
            throttled: l(&c.throttled),
            evicted_folios: l(&c.evicted_folios),
            eviction_refused: l(&c.eviction_refused),
            reclaim_batches: l(&c.reclaim_batches),
            refaults_activated: l(&c.refaults_activated),
            sigbus: l(&c.sigbus),
            resident_bytes: self.resident.load(Ordering::Relaxed) as u64,
        }
    }

    /// The region and folio index holding `addr`.
    pub fn lookup(&self, addr: usize) -> Option<(Arc<RegionInner>, usize)> {
        let regions = self.regions.read().expect("regions lock");
        let r = regions.iter().find(|r| r.contains(addr))?;
        Some((r.clone(), r.folio_of(addr)))
    }

    pub fn region_by_id(&self, id: u32) -> Option<Arc<RegionInner>> {
        self.regions.read().expect("regions lock").iter().find(|r| r.id == id).cloned()
    }

    pub fn kick_reclaim(&self) {
        let (lock, cv) = &self.reclaim_signal;
        *lock.lock().expect("reclaim signal lock") = true;
        cv.notify_one();
    }

    /// Takes a region out of service: waits out busy folios, frees its
    /// store entries (or, for a managed mapping, brings everything back),
    /// unregisters it and, if ours, unmaps it.
    fn drop_region(&self, region: &Arc<RegionInner>) {
        let mut buf = vec![0u8; region.folio_size];
        // Folios the program unmapped (or moved away) are not ours to unmap.
        let mut ours = vec![true; region.folios.len()];
        for (i, f) in region.folios.iter().enumerate() {
            loop {
                let w = f.load();
                match folio::state(w) {
                    folio::EVICTING | folio::LOADING => std::thread::yield_now(),
                    folio::GONE => {
                        ours[i] = false;
                        break;
                    }
                    folio::SWAPPED => {
                        if !f.transition(w, folio::GONE) {
                            continue;
                        }
                        let range = region.slots_of(w);
                        let restored = !region.owned && self.store.load(range, &mut buf).is_ok();
                        if restored {
                            // The caller's mapping gets its data back.
                            let _ = self.uffd.copy_dontwake(region.folio_addr(i), &buf);
                        } else {
                            self.store.invalidate(range);
                        }
                        break;
                    }
                    folio::RESIDENT => {
                        if f.transition(w, folio::GONE) {
                            self.resident.fetch_sub(region.folio_size, Ordering::AcqRel);
                            break;
                        }
                    }
                    _ => {
                        if f.transition(w, folio::GONE) {
                            break;
                        }
                    }
                }
            }
        }
        self.regions.write().expect("regions lock").retain(|r| r.id != region.id);
        let fs = region.folio_size;
        let mut i = 0;
        while i < ours.len() {
            if !ours[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < ours.len() && ours[i] {
                i += 1;
            }
            let (base, len) = (region.folio_addr(start), (i - start) * fs);
            let _ = self.uffd.unregister(base, len);
            if region.owned {
                // SAFETY: the runtime mapped this range, the program has not
                // unmapped it, and nobody else holds it.
                unsafe { libc::munmap(base as *mut _, len) };
            }
        }
        let (_, cv) = &self.reclaimed;
        cv.notify_all();
    }

    /// Drops one user handle; the last one stops the threads.
    fn release_user(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.shutdown.store(true, Ordering::Release);
        self.kick_reclaim();
        self.faults.1.notify_all();
        self.reclaimed.1.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        for t in threads {
            let _ = t.join();
        }
    }
}

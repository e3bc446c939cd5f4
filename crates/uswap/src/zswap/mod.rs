//! `zswap`: the compressed store.
//!
//! Pages come in as folios (1..=512 pages). [`Zswap::store_batch`] gives each
//! folio a contiguous run of swap slots, records same-filled pages without
//! compressing them, compresses every other page of every folio of the batch
//! on the `accel` device, and copies the results into the `zpool`. A folio
//! is stored all or nothing. With [`Layout::Folio`] a folio of several pages
//! is compressed as one object instead (one stream, or a by_n frame whose
//! segments the engines decompress in parallel), which finds the matches
//! between its pages that page-sized objects cannot; a folio that would not
//! save a page that way is stored page by page. Such a folio is read and
//! invalidated whole (the runtime above never does otherwise; partial
//! operations on its memory are its own bookkeeping). [`Zswap::read`] brings a folio back (one
//! decompression batch) and leaves its entries; [`Zswap::invalidate`] frees
//! them once the caller has put the bytes back. A fork shares entries
//! ([`Zswap::share`]): each slot counts its users, like the kernel's
//! swap_map, and the last user frees it. A pool at its limit refuses stores until it has drained to
//! the accept threshold; a writeback worker moves cold entries (LRU with a
//! second chance) to the swap file.
//!
//! Every stored object carries a CRC32C of its stored bytes; a load whose
//! bytes do not match, or do not decompress, is a `decompress_fail` and an
//! error, never data.
//!
//! Modules: `index` (slot -> entry), `store`, `load`, `writeback`,
//! [`stats`].

mod index;
mod load;
pub mod stats;
mod store;
mod writeback;

pub use stats::{size_label, ZswapStats, SIZE_ORDERS};

use crate::accel::Device;
use crate::codec::{self, Codec};
use crate::swap::{Backing, FreeHook, FreeMode, SlotAllocator, SlotReleaser};
use crate::zpool::Pool;
use index::Index;
use stats::Counters;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub use crate::page::{MAX_FOLIO_PAGES, PAGE_SIZE};

/// A folio's slots: `pages` consecutive slots from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotRange {
    /// The first slot.
    pub first: u32,
    /// Pages in the folio, one slot each.
    pub pages: u32,
}

impl SlotRange {
    /// Each slot of the range, in order.
    pub fn slots(self) -> impl Iterator<Item = u32> {
        self.first..self.first + self.pages
    }
}

/// Why a folio was not stored. The caller still has the folio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Not a whole folio: the length must be a power-of-two number of pages
    /// up to 512.
    BadFolio,
    /// No contiguous run of slots was free (`swpout_fallback`): split the
    /// folio and store its pages one by one.
    NoSlots,
    /// A page did not shrink, there is no swap file to hold it raw, and the
    /// folio as a whole would not save a page by keeping it raw in the pool.
    CompressPoor,
    /// A page's compression failed.
    CompressFail,
    /// The pool could not allocate and there is no swap file.
    AllocFail,
    /// The pool is at its limit and there is no swap file.
    PoolLimit,
    /// Writing to the swap file failed (ENOSPC, EIO, short write).
    Io,
}

/// Why a load failed. The entries are left as they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadError {
    /// The slot holds nothing (never stored, or already loaded).
    NotStored(u32),
    /// The object failed its checksum or did not decompress.
    Corrupt(u32),
    /// Reading the swap file failed.
    Io(u32),
    /// The range covers only part of a folio stored as one object (the slot
    /// is in that folio): such a folio is read whole.
    PartOfFolio(u32),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotStored(s) => write!(f, "slot {s} holds nothing"),
            LoadError::Corrupt(s) => write!(f, "slot {s}: stored object is corrupt"),
            LoadError::Io(s) => write!(f, "slot {s}: swap file read failed"),
            LoadError::PartOfFolio(s) => write!(
                f,
                "slot {s}: part of a folio stored as one object, which is read whole"
            ),
        }
    }
}

impl std::error::Error for StoreError {}
impl std::error::Error for LoadError {}

/// The pool size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLimit {
    /// At most this many bytes.
    Bytes(usize),
    /// At most this percentage of a reference size (the kernel's
    /// `max_pool_percent` of total RAM).
    Percent {
        /// The percentage of `of_bytes`.
        percent: u8,
        /// The reference size in bytes (by default, the machine's physical
        /// memory).
        of_bytes: usize,
    },
}

impl PoolLimit {
    /// The limit in bytes; a percentage is `of_bytes / 100 * percent`, the
    /// division rounding down.
    pub fn bytes(self) -> usize {
        match self {
            PoolLimit::Bytes(b) => b,
            PoolLimit::Percent { percent, of_bytes } => of_bytes / 100 * percent as usize,
        }
    }
}

/// How the pages of a folio of several pages are kept in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every page compressed on its own, one object per page, as the
    /// kernel's zswap stores a large folio.
    PerPage,
    /// The whole folio compressed as one object: one stream when `segments`
    /// is 1, otherwise a by_n frame of that many segments (a power of two up
    /// to 64) compressed and decompressed in parallel on the engines. A
    /// folio whose pages are all same-filled, or that would not save a page
    /// as one object, is stored page by page.
    Folio {
        /// Segments of the by_n frame; 1 for a single stream.
        segments: usize,
    },
}

impl Layout {
    /// Checks the segment count.
    pub fn validate(self) -> Result<(), ConfigError> {
        match self {
            Layout::Folio { segments }
                if !segments.is_power_of_two() || segments > codec::byn::MAX_SEGMENTS =>
            {
                Err(ConfigError(format!(
                    "by_n segments must be a power of two from 1 to {}, not {segments}",
                    codec::byn::MAX_SEGMENTS
                )))
            }
            _ => Ok(()),
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = ConfigError;

    /// `page`, `folio`, or `byn:N` (a folio as a by_n frame of N segments).
    fn from_str(s: &str) -> Result<Layout, ConfigError> {
        let layout = match s {
            "page" => Layout::PerPage,
            "folio" => Layout::Folio { segments: 1 },
            _ => match s.strip_prefix("byn:").map(str::parse::<usize>) {
                Some(Ok(segments)) if segments > 1 => Layout::Folio { segments },
                _ => {
                    return Err(ConfigError(format!(
                        "bad layout {s:?}: expected page, folio or byn:N (N from 2 to {})",
                        codec::byn::MAX_SEGMENTS
                    )))
                }
            },
        };
        layout.validate().map(|()| layout)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::PerPage => f.write_str("page"),
            Layout::Folio { segments: 1 } => f.write_str("folio"),
            Layout::Folio { segments } => write!(f, "byn:{segments}"),
        }
    }
}

/// Configuration of the store.
#[derive(Debug, Clone)]
pub struct ZswapConfig {
    /// Codec by kernel name (`lz4`, `zstd:3`, ...).
    pub compressor: String,
    /// The pool limit (default: 20% of physical memory).
    pub max_pool: PoolLimit,
    /// Stores resume when the pool has shrunk to this percentage of the
    /// limit (default 90).
    pub accept_threshold_percent: u8,
    /// Swap slots when there is no backing file (with one, the file's size).
    pub slots: u32,
    /// How released slots are freed.
    pub free_mode: FreeMode,
    /// Compress a batch's pages together on the device's engines (when it
    /// has any); false compresses page by page on the caller, as zswap did
    /// before batching.
    pub batching: bool,
    /// Run a background worker that writes cold entries back when the pool
    /// reaches its limit (needs a backing file).
    pub writeback_worker: bool,
    /// Decompress a folio on the engines only when it has at least this many
    /// compressed pages; below that the round trip to the engines costs more
    /// than the parallelism saves (measured with `uswap bench store`).
    pub load_batch_min_pages: usize,
    /// Pages compressed one by one, or folios as one object.
    pub layout: Layout,
}

/// Physical memory of this machine, in bytes.
pub fn physical_memory() -> usize {
    // SAFETY: sysconf only reads system configuration.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as usize).saturating_mul(size.max(0) as usize)
}

impl Default for ZswapConfig {
    fn default() -> Self {
        ZswapConfig {
            compressor: "lz4".into(),
            max_pool: PoolLimit::Percent {
                percent: 20,
                of_bytes: physical_memory(),
            },
            accept_threshold_percent: 90,
            slots: 1 << 18,
            free_mode: FreeMode::Async,
            batching: true,
            writeback_worker: true,
            load_batch_min_pages: 64,
            layout: Layout::PerPage,
        }
    }
}

/// Everything the store's threads share.
pub(crate) struct Inner {
    codec: Arc<dyn Codec>,
    device: Arc<Device>,
    /// No engines: by_n frames of folios too small to pay for the engines'
    /// round trip are decompressed on the caller, segment after segment.
    here: Device,
    pool: Arc<Pool>,
    index: Arc<Index>,
    allocator: Arc<SlotAllocator>,
    releaser: SlotReleaser,
    backing: Option<Arc<dyn Backing>>,
    counters: Counters,
    max_pool: usize,
    accept_below: usize,
    batching: bool,
    load_batch_min_pages: usize,
    layout: Layout,
    /// Set when the pool hit its limit; cleared when it drains below the
    /// accept threshold (the kernel's `zswap_pool_reached_full`).
    pool_full: AtomicBool,
    /// Pages in the pool, and of those the ones stored raw.
    stored_pages: AtomicU64,
    stored_raw_pages: AtomicU64,
    /// Bytes of the objects in the pool (what the pool's pages hold).
    stored_bytes: AtomicU64,
    lru: writeback::Lru,
    worker: writeback::WorkerSignal,
}

/// The compressed store.
pub struct Zswap {
    inner: Arc<Inner>,
    worker: Option<JoinHandle<()>>,
}

/// A configuration error.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Zswap {
    /// A store compressing on `device`, writing back to `backing` if given.
    pub fn new(
        config: ZswapConfig,
        device: Arc<Device>,
        backing: Option<Arc<dyn Backing>>,
    ) -> Result<Zswap, ConfigError> {
        let codec = codec::by_name(&config.compressor).map_err(|e| ConfigError(e.to_string()))?;
        if config.accept_threshold_percent > 100 {
            return Err(ConfigError(
                "accept_threshold_percent must be at most 100".into(),
            ));
        }
        config.layout.validate()?;
        let slots = backing.as_ref().map_or(config.slots, |b| b.slots());
        if slots == 0 {
            return Err(ConfigError("the swap space has no slots".into()));
        }
        let allocator = Arc::new(SlotAllocator::new(slots));
        let pool = Arc::new(Pool::new());
        let index = Arc::new(Index::new(slots));
        // A loaded page's pool object lives until its slot is freed, which
        // the release mode may do later and elsewhere (the kernel frees a
        // zswap entry when its swap slot is freed).
        let hook: FreeHook = {
            let (pool, index) = (pool.clone(), index.clone());
            Arc::new(move |slot| {
                if let Some(handle) = index.take_stale(slot) {
                    pool.free(handle);
                }
            })
        };
        let releaser = SlotReleaser::new(config.free_mode, allocator.clone(), Some(hook))
            .map_err(|e| ConfigError(format!("starting the slot free worker: {e}")))?;
        let max_pool = config.max_pool.bytes();
        let inner = Arc::new(Inner {
            codec,
            device,
            here: Device::synchronous(),
            pool,
            index,
            allocator,
            releaser,
            backing,
            counters: Counters::default(),
            max_pool,
            accept_below: max_pool / 100 * config.accept_threshold_percent as usize,
            batching: config.batching,
            load_batch_min_pages: config.load_batch_min_pages.max(2),
            layout: config.layout,
            pool_full: AtomicBool::new(false),
            stored_pages: AtomicU64::new(0),
            stored_raw_pages: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            lru: writeback::Lru::new(),
            worker: writeback::WorkerSignal::new(),
        });
        let worker = if config.writeback_worker && inner.backing.is_some() {
            let w = inner.clone();
            Some(
                std::thread::Builder::new()
                    .name("uswap-writeback".into())
                    .spawn(move || writeback::worker_loop(&w))
                    .map_err(|e| ConfigError(format!("starting the writeback worker: {e}")))?,
            )
        } else {
            None
        };
        Ok(Zswap { inner, worker })
    }

    /// Stores a batch of folios; one result per folio, in order.
    pub fn store_batch(&self, folios: &[&[u8]]) -> Vec<Result<SlotRange, StoreError>> {
        self.inner.store_batch(folios)
    }

    /// Reads a folio into `dst` (its pages, in order), leaving its entries
    /// stored: the caller invalidates them once the bytes are in place.
    pub fn read(&self, range: SlotRange, dst: &mut [u8]) -> Result<(), LoadError> {
        self.inner.read(range, dst)
    }

    /// Loads a folio exclusively: [`Zswap::read`], then [`Zswap::invalidate`].
    /// On error the entries stay.
    pub fn load(&self, range: SlotRange, dst: &mut [u8]) -> Result<(), LoadError> {
        self.inner.read(range, dst)?;
        self.inner.invalidate(range);
        Ok(())
    }

    /// Adds a user to every slot of a stored folio: another address space
    /// (a forked child) holds it too, and the entries live until every user
    /// has invalidated them. False, with nothing added, if any slot holds
    /// nothing.
    pub fn share(&self, range: SlotRange) -> bool {
        self.inner.share(range)
    }

    /// Drops one user of a folio's entries; the last user frees the entries
    /// and slots, without reading them.
    pub fn invalidate(&self, range: SlotRange) {
        self.inner.invalidate(range)
    }

    /// Whether the pool takes new objects now (below its limit, or drained
    /// below the accept threshold since it was full).
    pub fn has_room(&self) -> bool {
        self.inner.pool_accepts(0)
    }

    /// Writes up to `max_pages` cold pool entries back to the swap file;
    /// returns how many were written.
    pub fn writeback(&self, max_pages: usize) -> usize {
        self.inner.writeback(max_pages)
    }

    /// Compacts the pool; returns the pages freed.
    pub fn compact(&self) -> usize {
        self.inner.pool.compact()
    }

    /// Frees every slot waiting in a release cache (for accounting checks).
    pub fn drain_slot_caches(&self) {
        self.inner.releaser.drain()
    }

    /// Slots allocated in the swap space.
    pub fn slots_in_use(&self) -> u64 {
        self.inner.allocator.in_use()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ZswapStats {
        self.inner.stats()
    }

    /// The pool (for statistics).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The configured pool limit in bytes.
    pub fn max_pool(&self) -> usize {
        self.inner.max_pool
    }

    /// The codec in use.
    pub fn codec(&self) -> &Arc<dyn Codec> {
        &self.inner.codec
    }

    /// The slot releaser (its mode, counters and test hooks).
    pub fn releaser(&self) -> &SlotReleaser {
        &self.inner.releaser
    }

    /// Fault injection: corrupts the stored object of `slot` if it has one
    /// (for a folio stored whole, the chunk of its object the slot holds);
    /// returns whether it did.
    #[cfg(feature = "fault-injection")]
    pub fn corrupt_stored_object(&self, slot: u32) -> bool {
        match self.inner.index.get(slot) {
            index::Entry::Pool { handle, len, .. }
            | index::Entry::Whole(index::Part {
                chunk: Some((handle, len)),
                ..
            }) => {
                self.inner.pool.corrupt(handle, len / 2);
                true
            }
            _ => false,
        }
    }

    /// Fault injection (for the fuzz targets): lets `edit` rewrite the bytes
    /// of the stored object of `slot`, length included. The checksum is the
    /// one taken at store time, so the load must catch any change, unless
    /// `refresh_crc`: then it is taken of the edited bytes, as if they had
    /// been wrong before the store checksummed them, and the decoder is what
    /// sees the damage. The edited length must be one the store can record:
    /// 1..=PAGE_SIZE bytes, exactly PAGE_SIZE for a page stored raw.
    /// Returns whether the slot held a pool object and the edit was applied.
    #[cfg(feature = "fault-injection")]
    pub fn edit_stored_object(
        &self,
        slot: u32,
        refresh_crc: bool,
        edit: impl FnOnce(&mut Vec<u8>),
    ) -> bool {
        let inner = &self.inner;
        let entry = inner.index.claim(slot);
        let index::Entry::Pool { handle, len, raw } = entry else {
            if entry != index::Entry::Empty {
                inner.index.release(slot, entry);
            }
            return false;
        };
        let crc = inner.index.crc(slot);
        let mut bytes = vec![0u8; len];
        inner.pool.read(handle, &mut bytes);
        edit(&mut bytes);
        let fits = if raw {
            bytes.len() == PAGE_SIZE
        } else {
            (1..=PAGE_SIZE).contains(&bytes.len())
        };
        if !fits {
            inner.index.release(slot, entry);
            return false;
        }
        let handle = if bytes.len() == len {
            handle
        } else {
            let Ok(moved) = inner.pool.alloc(bytes.len()) else {
                inner.index.release(slot, entry);
                return false;
            };
            inner.pool.free(handle);
            inner.account_pool_object(len, raw, false);
            inner.account_pool_object(bytes.len(), raw, true);
            moved
        };
        inner.pool.write(handle, &bytes);
        let crc = if refresh_crc {
            crc32c::crc32c(&bytes)
        } else {
            crc
        };
        let edited = index::Entry::Pool {
            handle,
            len: bytes.len(),
            raw,
        };
        inner.index.publish(slot, edited, crc);
        true
    }

    /// Whether `slot` holds a page (in the pool, written back, or
    /// same-filled).
    pub fn is_stored(&self, slot: u32) -> bool {
        !matches!(
            self.inner.index.get(slot),
            index::Entry::Empty | index::Entry::Stale(_)
        )
    }
}

impl Inner {
    fn stats(&self) -> ZswapStats {
        let mut s = self.counters.snapshot();
        s.pool_total_size = self.pool.total_size() as u64;
        s.pool_kept_size = self.pool.kept_size() as u64;
        s.stored_pages = self.stored_pages.load(Ordering::Relaxed);
        s.stored_incompressible_pages = self.stored_raw_pages.load(Ordering::Relaxed);
        s.stored_bytes = self.stored_bytes.load(Ordering::Relaxed);
        s
    }

    /// Accounts an object entering (`added`) or leaving the pool.
    fn account_pool_object(&self, len: usize, raw: bool, added: bool) {
        let (pages, raws, bytes) = (
            &self.stored_pages,
            &self.stored_raw_pages,
            &self.stored_bytes,
        );
        if added {
            pages.fetch_add(1, Ordering::Relaxed);
            raws.fetch_add(raw as u64, Ordering::Relaxed);
            bytes.fetch_add(len as u64, Ordering::Relaxed);
        } else {
            pages.fetch_sub(1, Ordering::Relaxed);
            raws.fetch_sub(raw as u64, Ordering::Relaxed);
            bytes.fetch_sub(len as u64, Ordering::Relaxed);
        }
    }
}

impl Drop for Zswap {
    fn drop(&mut self) {
        self.inner.worker.stop();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

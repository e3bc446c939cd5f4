//! The runtime's knobs and their builder.

use crate::page::PAGE_SIZE;
use crate::size::parse_size;
use crate::swap::FreeMode;
use crate::zswap::Layout;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

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
    pub compress_batchsize: BatchSize,
    /// Readahead of 2^page_cluster folios (the faulting one included).
    pub page_cluster: u32,
    /// Bytes a first touch fills with zeros from the touched folio on, when
    /// the folio before it was touched already (a program going through new
    /// memory in order): the folios after it, untouched, go in with the
    /// same copy and cost no fault of their own, as a kernel's large folio
    /// does on an anonymous fault. Only as far as memory stays under
    /// `memory_high` (a fill ahead never makes reclaim work), and up to the
    /// region's end; at most 2 MiB. At most the folio size (or zero): one
    /// folio per touch. Default 1 MiB (see `fault::zero_fill_ahead`).
    pub zero_fill_ahead: usize,
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
    /// Threads serving page faults that must wait, and swap-ins handed on
    /// (`handoff_pages`).
    pub fillers: usize,
    /// Swap-ins of folios of at least this many pages are handed by the
    /// event thread to a filler, and the event thread goes back to reading:
    /// a fault of another thread is then served beside it instead of after
    /// it. A single event thread serves faults one at a time, so two
    /// threads faulting on 64K folios each waited for the other's swap-in
    /// too. Near the limit it always hands on; well under it, only while
    /// that has paid lately (another thread's fault came while a swap-in
    /// was served; see `fault::HandoffPays`), as a hand-off costs a
    /// wake-up of the filler. Zero: never.
    pub handoff_pages: usize,
    /// How long a partly filled plug waits for more folios.
    pub plug_timeout: Duration,
    /// After an event, how long the event thread keeps looking for the next
    /// one before it sleeps in poll: faults come in bursts, and waking a
    /// sleeping thread from another CPU costs tens of microseconds (the
    /// engines poll before sleeping for the same reason). Not while a
    /// filler works; with memory near `memory_high` (see `fault.rs`,
    /// `reclaim_idle`) it yields the CPU between looks, as the reclaimer
    /// and the engines need it then. Zero: never. Default 50 us: `uswap
    /// bench faults --mode pressure,no-pressure --folios 4k,64k --slot-free
    /// async --event-spin-us 0,50` gave 4K no-pressure p50 18 us against
    /// 51 us, 92K against 33K pages/s, 64K unchanged.
    pub event_spin: Duration,
    /// The longest an event reader sleeps in poll with nothing to read:
    /// how often, at least, the event thread looks for children that
    /// exited. Nothing else waits for it: a process attached meanwhile
    /// wakes the readers (`Shared::announce_space`).
    pub event_poll_timeout: Duration,
    /// Which threads read the userfaultfds (see [`EventReaders`]).
    pub event_readers: EventReaders,
    /// Serve forked children (UFFD_FEATURE_EVENT_FORK, which needs
    /// CAP_SYS_PTRACE). Without it a child would read swapped-out memory as
    /// zeros, so the runtime then refuses to start rather than risk it,
    /// unless this is false: the caller promises not to fork while regions
    /// exist.
    pub serve_forks: bool,
    /// Discard the runtime's own stored pages by moving them out
    /// (UFFDIO_MOVE, where the kernel has it) rather than dropping them in
    /// place: no event, so none to tell from the program's (see
    /// `mm/scratch.rs`); other processes' pages are moved by their agent,
    /// into a scratch in that process.
    pub discard_by_move: bool,
    /// How the store keeps a folio's pages: one object per page, or the
    /// folio as one object (see `zswap::Layout`). The folio as one object
    /// by default: on 64 KiB folios it takes about 1/1.2 of the room, and
    /// one codec call, checksum and pool object per folio instead of
    /// sixteen gave 64 KiB swap-in faults a lower median, with and without
    /// pressure, and usemem no lower throughput, in side-by-side runs
    /// (`uswap bench faults --layout page,folio`, `uswap bench usemem
    /// --layout page,folio`).
    pub layout: Layout,
    /// Keep the stored copy of a folio brought back for a read, with its
    /// pages write-protected, while the pool has room: evicting it again
    /// before anything writes to it is a discard, not a compression (the
    /// kernel keeps a swapped-in page's swap slot the same way while swap
    /// is not full). The first write costs a write-protect fault. Before a
    /// CLEAN folio is discarded, the page map must show every page of it in
    /// place and protected; otherwise it is stored anew
    /// (`clean_unverified`).
    pub keep_clean_copies: bool,
    /// How long the reclaimer leaves what is still in memory of a folio the
    /// program dropped pages of (a REMOVE event: MADV_DONTNEED or
    /// MADV_FREE) before it evicts it. The kernel zaps a MADV_DONTNEED's
    /// pages only after the event is read, once the madvise has the address
    /// space's lock again, and nothing tells when it has: evicted before,
    /// the pages would be stored with their old bytes where the program
    /// must read zeros. Pages the program gave up with MADV_FREE and wrote
    /// again look the same and are evicted once the grace is over. Default
    /// 100 ms: a scheduler's worth of delays on a busy machine, many times
    /// the zap itself.
    pub drop_grace: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            memory_high: 256 << 20,
            folio_size: 64 << 10,
            compressor: "lz4".into(),
            compress_batchsize: BatchSize::Auto,
            page_cluster: 0,
            zero_fill_ahead: 1 << 20,
            max_pool_percent: 20,
            max_pool_bytes: None,
            accept_threshold_percent: 90,
            engines: 2,
            swap_file: None,
            swap_slots: 1 << 20,
            slot_free: FreeMode::Async,
            fillers: 2,
            handoff_pages: 2,
            plug_timeout: Duration::from_millis(1),
            event_spin: Duration::from_micros(50),
            event_poll_timeout: Duration::from_millis(50),
            event_readers: EventReaders::PerCpu,
            serve_forks: true,
            discard_by_move: true,
            layout: Layout::Folio { segments: 1 },
            keep_clean_copies: true,
            drop_grace: Duration::from_millis(100),
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
        self.slack_at(self.memory_high)
    }

    /// The slack for a limit of `memory_high` (it may change at run time:
    /// `Runtime::set_memory_high`).
    pub fn slack_at(&self, memory_high: usize) -> usize {
        let plug = self.plug_folios(memory_high) * self.folio_size;
        let readahead = (self.fillers + 1) * (1usize << self.page_cluster) * self.folio_size;
        (2 * plug + readahead).max(memory_high / 64).max(1 << 20)
    }

    /// The folios a reclaim plug holds before its flush under a limit of
    /// `memory_high` (see [`BatchSize`]).
    pub fn plug_folios(&self, memory_high: usize) -> usize {
        self.compress_batchsize.folios(memory_high, self.folio_size)
    }

    /// Checks the knobs against each other.
    pub fn validate(&self) -> Result<(), BadConfig> {
        let fs = self.folio_size;
        if !fs.is_power_of_two() || !(PAGE_SIZE..=2 << 20).contains(&fs) {
            return Err(BadConfig(format!(
                "folio_size {fs}: expected a power of two from 4k to 2M"
            )));
        }
        if let BatchSize::Fixed(n) = self.compress_batchsize {
            if !(1..=BatchSize::MAX).contains(&n) {
                return Err(BadConfig(format!(
                    "compress_batchsize must be 1..={}",
                    BatchSize::MAX
                )));
            }
        }
        if self.page_cluster > 9 {
            return Err(BadConfig("page_cluster must be at most 9".into()));
        }
        if self.zero_fill_ahead > 2 << 20 || !self.zero_fill_ahead.is_multiple_of(PAGE_SIZE) {
            return Err(BadConfig(
                "zero_fill_ahead must be whole pages, at most 2M".into(),
            ));
        }
        if self.memory_high < fs {
            return Err(BadConfig("memory_high must hold at least one folio".into()));
        }
        self.layout.validate().map_err(|e| BadConfig(e.0))
    }
}

/// How many folios a reclaim plug collects before they are stored together.
///
/// A plug's folios count as resident until its flush is done, and a fault
/// that waits for room waits for a whole flush; each flush pays its own
/// write-protect call, copy-out, move (through the agent, for a process
/// under `uswap run`) and engine wake-ups. So a large limit wants large
/// plugs and a small one small plugs. Measured on a 2-CPU machine, auto
/// alternating with a fixed 8, 3 pairs each (auto gives 32 in the first
/// two cases):
/// - `uswap run --memory-high 1G ... touch usemem 1536 2` (64K folios):
///   1218-1245 against 1090-1133 MB/s; `uswap usemem 1536M -n 2
///   --memory-high 1G`: threads 1262-1301 against 1089-1103, processes
///   (512M each) 1422-1453 against 1354-1434;
/// - `touch faults` at random on 4K folios under a 32M limit (128 KiB
///   plugs): mean 17.7-25.6 against 20.9-29.6 us;
/// - the same on 64K folios, where auto keeps 8: a fixed 32 (2 MiB, about
///   all the room faults have above the limit) had p99.9 1.50-2.00 ms
///   against 0.91-1.28, for a 5-7% lower p50.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSize {
    /// Chosen from the limit ([`BatchSize::for_limit`]), again whenever the
    /// limit changes.
    Auto,
    /// This many folios (1..=[`BatchSize::MAX`]).
    Fixed(usize),
}

impl BatchSize {
    /// The most folios in one plug.
    pub const MAX: usize = 32;
    /// The fewest folios auto gives a plug: plugs sized to a quarter of the
    /// room left above the limit, down to one folio, fell behind a program
    /// streaming through memory (smaller plugs, so slower reclaim, so less
    /// room): usemem as above wrote 553-573 MB/s against 1118-1143.
    pub const AUTO_MIN: usize = 8;

    /// The folios a plug holds under a limit of `memory_high`: the fixed
    /// number, or auto's ([`BatchSize::for_limit`]).
    pub fn folios(self, memory_high: usize, folio_size: usize) -> usize {
        match self {
            BatchSize::Fixed(n) => n.max(1),
            BatchSize::Auto => BatchSize::for_limit(memory_high, folio_size),
        }
    }

    /// Auto's plug: as many folios as fill 1/256 of the limit (at least
    /// 256 KiB), from [`BatchSize::AUTO_MIN`] to [`BatchSize::MAX`]. With
    /// 64K folios that is 8 up to 128M, 16 at 256M, 32 from 512M; with 4K
    /// folios always 32. Two plugs stay well inside the slack faults
    /// have above the limit (1/64 of it, at least 1 MiB).
    pub fn for_limit(memory_high: usize, folio_size: usize) -> usize {
        let bytes = (memory_high / 256).max(256 << 10);
        (bytes / folio_size.max(1)).clamp(Self::AUTO_MIN, Self::MAX)
    }
}

impl std::fmt::Display for BatchSize {
    /// As `--compress-batchsize` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchSize::Auto => f.write_str("auto"),
            BatchSize::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Which threads read the userfaultfds and serve what they read.
///
/// Whichever of them runs first after an event takes the event thread's
/// role (its state and its place in the event gate's protocol); the others
/// wait for the role to be free, then look again. A fault wakes every
/// reader asleep in poll: with one pinned to each CPU, the one on the
/// faulting thread's CPU runs as soon as that thread sleeps, and its
/// install wakes the thread on the same CPU, with no wake-up sent across
/// (which costs tens of microseconds where idle CPUs halt). The others'
/// wake-ups cost CPU: a streaming job bound by CPU runs a few percent
/// slower than with `One` (see docs/ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReaders {
    /// One reader, placed by the scheduler.
    One,
    /// One reader pinned to each CPU the runtime may use, where those are
    /// at most [`EventReaders::PER_CPU_MAX`] (every fault wakes every
    /// sleeping reader); one unpinned reader beyond that.
    PerCpu,
}

impl EventReaders {
    /// The most CPUs served by a reader each.
    pub const PER_CPU_MAX: usize = 4;

    /// The CPU each reader is pinned to (`None`: not pinned), given the
    /// CPUs the runtime may use.
    pub fn placement(self, allowed: &[usize]) -> Vec<Option<usize>> {
        match self {
            EventReaders::PerCpu if (2..=Self::PER_CPU_MAX).contains(&allowed.len()) => {
                allowed.iter().copied().map(Some).collect()
            }
            _ => vec![None],
        }
    }
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

impl From<BadConfig> for io::Error {
    fn from(e: BadConfig) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e.0)
    }
}

/// Builds a [`super::Runtime`]; sizes accept "64k", "512M", "2G".
#[derive(Debug, Clone, Default)]
pub struct Builder {
    config: RuntimeConfig,
}

fn size(text: &str) -> Result<u64, BadConfig> {
    parse_size(text).map_err(|e| BadConfig(e.to_string()))
}

impl Builder {
    /// The defaults.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Sets `memory_high`.
    pub fn memory_high(mut self, text: &str) -> Result<Builder, BadConfig> {
        self.config.memory_high = size(text)? as usize;
        Ok(self)
    }

    /// Sets the folio size.
    pub fn folio_size(mut self, text: &str) -> Result<Builder, BadConfig> {
        self.config.folio_size = size(text)? as usize;
        Ok(self)
    }

    /// Replaces every knob at once.
    pub fn config(mut self, config: RuntimeConfig) -> Builder {
        self.config = config;
        self
    }

    /// Sets the codec by kernel name.
    pub fn compressor(mut self, name: &str) -> Builder {
        self.config.compressor = name.to_string();
        self
    }

    /// Sets the plug size in folios (the default chooses it from the limit).
    pub fn compress_batchsize(mut self, n: usize) -> Builder {
        self.config.compress_batchsize = BatchSize::Fixed(n);
        self
    }

    /// Sets readahead to 2^n folios.
    pub fn page_cluster(mut self, n: u32) -> Builder {
        self.config.page_cluster = n;
        self
    }

    /// Sets how far a sequential first touch fills with zeros, in bytes
    /// (0: the touched folio only).
    pub fn zero_fill_ahead(mut self, bytes: usize) -> Builder {
        self.config.zero_fill_ahead = bytes;
        self
    }

    /// Sets the number of compression engines.
    pub fn engines(mut self, n: usize) -> Builder {
        self.config.engines = n;
        self
    }

    /// Adds a swap file in `dir` of `text` bytes.
    pub fn swap_file(mut self, dir: PathBuf, text: &str) -> Result<Builder, BadConfig> {
        self.config.swap_file = Some((dir, size(text)?));
        Ok(self)
    }

    /// Sets how released slots are freed.
    pub fn slot_free(mut self, mode: FreeMode) -> Builder {
        self.config.slot_free = mode;
        self
    }

    /// Sets the pool limit as a percentage of physical memory.
    pub fn max_pool_percent(mut self, percent: u8) -> Builder {
        self.config.max_pool_percent = percent;
        self
    }

    /// Sets the accept threshold.
    pub fn accept_threshold_percent(mut self, percent: u8) -> Builder {
        self.config.accept_threshold_percent = percent;
        self
    }

    /// Sets how the store keeps a folio's pages.
    pub fn layout(mut self, layout: Layout) -> Builder {
        self.config.layout = layout;
        self
    }

    /// Starts the runtime.
    pub fn build(self) -> io::Result<super::Runtime> {
        super::Runtime::new(self.config)
    }
}

#[cfg(test)]
mod tests {
    use super::{BatchSize, EventReaders, RuntimeConfig};

    #[test]
    fn the_auto_plug_holds_a_256th_of_the_limit_within_8_to_32_folios() {
        const K: usize = 1 << 10;
        const M: usize = 1 << 20;
        assert_eq!(BatchSize::for_limit(32 * M, 64 * K), 8);
        assert_eq!(BatchSize::for_limit(256 * M, 64 * K), 16);
        assert_eq!(BatchSize::for_limit(M << 10, 64 * K), 32);
        assert_eq!(BatchSize::for_limit(32 * M, 4 * K), 32);
        assert_eq!(BatchSize::for_limit(4 * M, 4 * K), 32, "256 KiB at least");
        assert_eq!(BatchSize::for_limit(M << 10, 2 * M), 8);
        let fixed = RuntimeConfig {
            compress_batchsize: BatchSize::Fixed(3),
            ..RuntimeConfig::default()
        };
        assert_eq!(fixed.plug_folios(M << 10), 3);
        assert!(RuntimeConfig {
            compress_batchsize: BatchSize::Fixed(33),
            ..RuntimeConfig::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn readers_are_pinned_one_per_cpu_only_on_a_few_cpus() {
        assert_eq!(
            EventReaders::PerCpu.placement(&[0, 3]),
            vec![Some(0), Some(3)]
        );
        let four = [0, 1, 2, 3];
        assert_eq!(EventReaders::PerCpu.placement(&four).len(), 4);
        // One CPU: nothing to choose between. Many: every fault would wake
        // every reader.
        assert_eq!(EventReaders::PerCpu.placement(&[2]), vec![None]);
        let many: Vec<usize> = (0..=EventReaders::PER_CPU_MAX).collect();
        assert_eq!(EventReaders::PerCpu.placement(&many), vec![None]);
        assert_eq!(EventReaders::PerCpu.placement(&[]), vec![None]);
        assert_eq!(EventReaders::One.placement(&four), vec![None]);
    }
}

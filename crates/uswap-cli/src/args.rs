//! Value parsers shared by subcommands, so that a bad value is a usage error
//! (exit status 2) with a message that says what was expected.

use std::path::PathBuf;
use uswap::codec;
use uswap::mm::BatchSize;
use uswap::size::parse_size;
use uswap::zswap::Layout;

/// A codec name as the kernel spells it, optionally `NAME:LEVEL`.
pub fn codec_name(s: &str) -> Result<String, String> {
    codec::by_name(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// A byte size such as `4k`, `64K`, `2M`.
pub fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A folio size: a power-of-two multiple of 4 KiB up to 2 MiB.
pub fn folio_size(s: &str) -> Result<usize, String> {
    let bytes = size(s)?;
    if bytes.is_power_of_two() && (4096..=2 << 20).contains(&bytes) {
        Ok(bytes as usize)
    } else {
        Err(format!(
            "bad folio size {s:?}: expected a power of two from 4k to 2M"
        ))
    }
}

/// A zero-fill-ahead window: whole pages, at most 2 MiB (0: none).
pub fn zero_fill_ahead(s: &str) -> Result<usize, String> {
    let bytes = size(s)?;
    if bytes.is_multiple_of(4096) && bytes <= 2 << 20 {
        Ok(bytes as usize)
    } else {
        Err(format!(
            "bad zero-fill-ahead {s:?}: expected whole 4k pages, at most 2M"
        ))
    }
}

/// A number of seconds: finite, not negative.
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1e9).contains(&v) => Ok(v),
        _ => Err(format!("bad number of seconds {s:?}: expected 0 to 1e9")),
    }
}

/// Whether an output file can be written, found out before a run rather
/// than after it: opened for writing (created if missing, its contents left
/// as they are until the results are written).
pub fn writable(path: &std::path::Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A directory that exists.
pub fn existing_dir(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_dir() {
        Ok(p)
    } else {
        Err(format!("{s}: not a directory"))
    }
}

/// Knobs of the software compression device, shared by every command that
/// starts one.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Compression engines (threads); 0 runs everything on the caller.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub engines: u32,
    /// Jobs per batch.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub batch_size: u32,
    /// Caller-to-engine mapping: local or global.
    #[arg(long, default_value = "global")]
    pub mapping: uswap::accel::Mapping,
    /// Let the caller run jobs of its own batch while the engines work.
    #[arg(long)]
    pub caller_assist: bool,
    /// Pin engine i to CPU i (off by default, as in the runtime: a pinned
    /// engine cannot leave a CPU another process keeps busy).
    #[arg(long)]
    pub pin: bool,
    /// Microseconds an idle engine polls before it sleeps.
    #[arg(long, default_value_t = 50)]
    pub idle_poll_us: u64,
    /// Microseconds a waiting caller polls before it runs a job no engine
    /// has begun, or sleeps.
    #[arg(long, default_value_t = 0)]
    pub wait_poll_us: u64,
    /// Verify every compressed result.
    #[arg(long)]
    pub verify: bool,
}

impl DeviceArgs {
    pub fn config(&self) -> uswap::accel::DeviceConfig {
        use std::time::Duration;
        uswap::accel::DeviceConfig {
            engines: self.engines as usize,
            batch_size: self.batch_size as usize,
            mapping: self.mapping,
            caller_assist: self.caller_assist,
            pin: self.pin,
            idle_poll: Duration::from_micros(self.idle_poll_us),
            wait_poll: Duration::from_micros(self.wait_poll_us),
            verify: self.verify,
            ..uswap::accel::DeviceConfig::default()
        }
    }
}

/// The runtime's knobs, named as in the kernel.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Resident managed memory above which folios are compressed away (for
    /// the whole run; with --processes each process gets its share).
    #[arg(long, env = "USWAP_MEMORY_HIGH", default_value = "512M", value_parser = size)]
    pub memory_high: u64,
    /// The unit evicted, stored and brought back together.
    #[arg(long, env = "USWAP_FOLIO_SIZE", default_value = "64k", value_parser = folio_size)]
    pub folio_size: usize,
    /// Codec by kernel name (lz4, lzo, lzo-rle, zstd, deflate, canned).
    #[arg(long, env = "USWAP_COMPRESSOR", default_value = "lz4", value_parser = codec_name)]
    pub compressor: String,
    /// Folios per reclaim batch (1..32), or auto: more under a larger
    /// limit, 1/256 of it from 8 to 32 folios (see `BatchSize`).
    #[arg(long, env = "USWAP_COMPRESS_BATCHSIZE", default_value = "auto", value_parser = batch_size)]
    pub compress_batchsize: BatchSize,
    /// Readahead of 2^N folios.
    #[arg(long, env = "USWAP_PAGE_CLUSTER", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=9))]
    pub page_cluster: u32,
    /// A first touch of new memory right after the memory before it fills
    /// this much with zeros at once, its folio first: a program going
    /// through new memory in order then faults once per window, not once
    /// per folio (0: the touched folio only).
    #[arg(long, env = "USWAP_ZERO_FILL_AHEAD", default_value = "1M", value_parser = zero_fill_ahead)]
    pub zero_fill_ahead: usize,
    /// Swap-ins of folios of at least this many pages are handed by the
    /// event thread to a filler thread, so that the next fault is read and
    /// served beside it (0: never).
    #[arg(long, env = "USWAP_HANDOFF_PAGES", default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=512))]
    pub handoff_pages: u32,
    /// Pool limit as a percentage of physical memory.
    #[arg(long, env = "USWAP_MAX_POOL_PERCENT", default_value_t = 20, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub max_pool_percent: u8,
    /// Stores resume below this percentage of the pool limit.
    #[arg(long, env = "USWAP_ACCEPT_THRESHOLD_PERCENT", default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub accept_threshold_percent: u8,
    /// Compression engines per runtime (0..64), or auto: one fewer than the
    /// runtime's share of the machine's CPUs (its caller compresses too),
    /// none where that share is below two, and none where a batch on them
    /// is slower than on the caller at start-up (see `Engines::choose`).
    #[arg(long, env = "USWAP_ENGINES", default_value = "auto", value_parser = engines)]
    pub engines: Engines,
    /// Directory for a swap file (none by default).
    #[arg(long, env = "USWAP_SWAP_DIR", value_parser = existing_dir)]
    pub swap_dir: Option<PathBuf>,
    /// Size of the swap file.
    #[arg(long, env = "USWAP_SWAP_SIZE", default_value = "4G", value_parser = size)]
    pub swap_size: u64,
    /// How freed swap slots are returned: immediate, batched or async.
    #[arg(long, env = "USWAP_SLOT_FREE", default_value = "async")]
    pub slot_free: uswap::swap::FreeMode,
    /// How stored pages leave memory: move (moved out, no event, where the
    /// kernel can; what it will not move stays) or in-place (MADV_DONTNEED,
    /// which can lose memory another thread moves or maps into a range
    /// being dropped: README, Known issues).
    #[arg(long, env = "USWAP_DISCARD", default_value = "move")]
    pub discard: Discard,
    /// How a folio's pages are stored: page (one object per page, as the
    /// kernel does), folio (the folio as one object), or byn:N (the folio as
    /// a by_n frame of N segments, decompressed in parallel on the engines).
    #[arg(long, env = "USWAP_LAYOUT", default_value = "folio", value_parser = layout)]
    pub layout: Layout,
    /// What a folio brought back for a read does with its stored copy: keep
    /// (the default: its pages write-protected; evicted again unwritten, it
    /// needs no compression) or drop (every eviction compresses).
    #[arg(long, env = "USWAP_CLEAN_COPIES", default_value = "keep")]
    pub clean_copies: CleanCopies,
    /// Which threads read the userfaultfds: per-cpu (one pinned to each CPU
    /// the runtime may use, up to 4; the one on the faulting CPU serves the
    /// fault; lower fault latency) or one (placed by the scheduler; a
    /// streaming job bound by CPU runs a few percent faster: every fault
    /// wakes every reader).
    #[arg(long, env = "USWAP_EVENT_READERS", default_value = "per-cpu")]
    pub event_readers: Readers,
}

/// Which threads read the userfaultfds.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readers {
    /// One pinned to each CPU (up to 4).
    PerCpu,
    /// One, placed by the scheduler.
    One,
}

/// What a folio read back does with its stored copy.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanCopies {
    /// Kept while the folio is unwritten.
    Keep,
    /// Dropped at once.
    Drop,
}

impl CleanCopies {
    /// The value as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CleanCopies::Keep => "keep",
            CleanCopies::Drop => "drop",
        }
    }
}

/// A store layout: page, folio or byn:N.
pub fn layout(s: &str) -> Result<Layout, String> {
    s.parse().map_err(|e: uswap::zswap::ConfigError| e.0)
}

/// How many compression engines each runtime gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engines {
    /// Chosen from the machine's CPUs.
    Auto,
    /// This many.
    Fixed(u32),
}

impl Engines {
    /// Engines for each of `runtimes` runtimes on a machine of `cpus` CPUs.
    /// Auto shares the CPUs among the runtimes and gives each one engine
    /// fewer than its share (at most 8): the runtime's caller runs jobs of
    /// its own batch too (`DeviceConfig::for_runtime`), so engines and
    /// caller together make one compressor per CPU. A runtime whose share
    /// is below two gets none. Measured on a 2-CPU machine, each count
    /// alternating with the other:
    /// - `uswap usemem 1536M -n 2 --memory-high 1G --compressor lzo-rle`
    ///   (one runtime, threads), 8 pairs: 1 engine wrote a median 790 MB/s
    ///   against 733 with 2 (more in 6 pairs), in a median 9.6 s against
    ///   10.4 s (less in 7); none wrote 597-636 MB/s in 3 runs beside them;
    /// - `uswap run` of `touch usemem 1536 2`, 8 pairs: 1 engine wrote
    ///   more in 6, and took a median 10.8 s against 10.6 s (less in 3);
    /// - `touch faults` under `uswap run --memory-high 32M`: 4K p50 lower
    ///   in 3 of 4 pairs; 64K p50 lower in 5 of 9, but p99 and p99.9 higher
    ///   in 7 of 9 (median p99.9 1.67 ms against 1.47 ms): the reclaimer
    ///   runs more of each batch itself, and a fault that waits for its CPU
    ///   waits longer;
    /// - the threads' usemem beside two `yes` loops, 3 pairs: 1 engine
    ///   wrote 261-352 MB/s against 184-192 with 2, in less time in all 3.
    ///
    /// Measured before the caller ran jobs: two runtimes (--processes)
    /// write 1283-1327 MB/s with none and 950-985 with 1 or 2 each (their
    /// engines' polling then takes the CPUs the programs need).
    pub fn per_runtime(self, runtimes: usize, cpus: usize) -> usize {
        match self {
            Engines::Fixed(n) => n as usize,
            Engines::Auto => match cpus / runtimes.max(1) {
                share if share >= 2 => (share - 1).min(8),
                _ => 0,
            },
        }
    }

    /// Engines for each of `runtimes` runtimes compressing with `codec`
    /// in batches of `plug_pages` pages: [`Engines::per_runtime`], and for
    /// auto, when that gives a runtime engines, a measurement at start-up
    /// ([`uswap::accel::probe`]) that keeps them unless a batch on them
    /// takes longer than it takes on the caller.
    pub fn choose(self, runtimes: usize, cpus: usize, codec: &str, plug_pages: usize) -> usize {
        let n = self.per_runtime(runtimes, cpus);
        if self != Engines::Auto || n == 0 {
            return n;
        }
        let Ok(codec) = uswap::codec::by_name(codec) else {
            return n;
        };
        // A busy moment can make one probe lose: the engines go only if
        // three in a row say so. Every `uswap run` pays the probe before
        // its program starts, so it measures at most 128 pages (a plug of
        // 8 64K folios): 256, as auto's larger plugs would ask, made
        // `uswap run -- true` take 35-37 ms against 25-28.
        let pages = plug_pages.clamp(16, 128);
        let lost = (0..3).all(|_| {
            uswap::accel::probe::batching(n, codec.as_ref(), pages)
                .is_ok_and(|probe| probe.ratio() > BATCHING_PAYS_BELOW)
        });
        if lost {
            0
        } else {
            n
        }
    }

    /// The value as given, or what auto chose by the CPU count alone.
    pub fn describe(self, runtimes: usize, cpus: usize) -> String {
        self.describe_as(self.per_runtime(runtimes, cpus))
    }

    /// The value as given, or `auto (chosen)`.
    pub fn describe_as(self, chosen: usize) -> String {
        match self {
            Engines::Fixed(n) => n.to_string(),
            Engines::Auto => format!("auto ({chosen})"),
        }
    }
}

/// Auto keeps the engines unless a batch on them takes more than this share
/// of the time it takes page by page on the caller: on an idle 2-CPU machine
/// the share is 0.57-0.63, and a busy moment at start-up pushes it towards
/// 1, which alone is no reason to go without them.
const BATCHING_PAYS_BELOW: f64 = 1.0;

impl std::fmt::Display for Engines {
    /// As `--engines` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Engines::Auto => f.write_str("auto"),
            Engines::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Parses `--engines`: `auto` or 0..=64.
pub fn engines(text: &str) -> Result<Engines, String> {
    if text == "auto" {
        return Ok(Engines::Auto);
    }
    match text.parse::<u32>() {
        Ok(n) if n <= 64 => Ok(Engines::Fixed(n)),
        _ => Err(format!(
            "{text:?} is neither auto nor a number of engines (0..64)"
        )),
    }
}

/// Parses `--compress-batchsize`: `auto` or 1..=32 folios.
pub fn batch_size(text: &str) -> Result<BatchSize, String> {
    if text == "auto" {
        return Ok(BatchSize::Auto);
    }
    match text.parse::<usize>() {
        Ok(n) if (1..=BatchSize::MAX).contains(&n) => Ok(BatchSize::Fixed(n)),
        _ => Err(format!(
            "{text:?} is neither auto nor a number of folios (1..{})",
            BatchSize::MAX
        )),
    }
}

/// The CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How stored pages leave memory.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Discard {
    /// Moved out (UFFDIO_MOVE) and dropped where no event is raised.
    Move,
    /// Dropped in place (MADV_DONTNEED).
    InPlace,
}

impl Discard {
    /// The value as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Discard::Move => "move",
            Discard::InPlace => "in-place",
        }
    }
}

impl RuntimeArgs {
    /// What no single value's parser can say: values wrong together. A
    /// message for a usage error (exit 2), before anything starts.
    pub fn check(&self) -> Result<(), String> {
        if (self.memory_high as usize) < self.folio_size {
            return Err(format!(
                "--memory-high {} is less than one folio (--folio-size {})",
                self.memory_high, self.folio_size
            ));
        }
        if self.swap_dir.is_some() {
            let pages = self.swap_size / 4096;
            if (self.swap_size as usize) < self.folio_size || pages > u64::from(u32::MAX) {
                return Err(format!(
                    "--swap-size {}: expected at least one folio ({}) and at most 2^32 pages (16T)",
                    self.swap_size, self.folio_size
                ));
            }
        }
        Ok(())
    }

    /// The limit of each of `share` runtimes that share `--memory-high`.
    pub fn memory_high_each(&self, share: usize) -> usize {
        (self.memory_high as usize / share.max(1)).max(self.folio_size)
    }

    /// `--compress-batchsize` as given, and for auto what it chose for each
    /// of `share` runtimes: `auto (32)`.
    pub fn describe_batch(&self, share: usize) -> String {
        let folios = self
            .compress_batchsize
            .folios(self.memory_high_each(share), self.folio_size);
        match self.compress_batchsize {
            BatchSize::Fixed(_) => folios.to_string(),
            BatchSize::Auto => format!("auto ({folios})"),
        }
    }

    /// The runtime configuration, with `share` of the memory limit.
    pub fn config(&self, share: usize) -> uswap::mm::RuntimeConfig {
        let mut config = uswap::mm::RuntimeConfig {
            memory_high: self.memory_high_each(share),
            folio_size: self.folio_size,
            compressor: self.compressor.clone(),
            compress_batchsize: self.compress_batchsize,
            page_cluster: self.page_cluster,
            zero_fill_ahead: self.zero_fill_ahead,
            handoff_pages: self.handoff_pages as usize,
            max_pool_percent: self.max_pool_percent,
            accept_threshold_percent: self.accept_threshold_percent,
            swap_file: self.swap_dir.clone().map(|d| (d, self.swap_size)),
            slot_free: self.slot_free,
            discard_by_move: self.discard == Discard::Move,
            layout: self.layout,
            keep_clean_copies: self.clean_copies == CleanCopies::Keep,
            event_readers: match self.event_readers {
                Readers::PerCpu => uswap::mm::EventReaders::PerCpu,
                Readers::One => uswap::mm::EventReaders::One,
            },
            ..uswap::mm::RuntimeConfig::default()
        };
        let plug_pages = config.plug_folios(config.memory_high) * config.folio_size / 4096;
        config.engines = self
            .engines
            .choose(share, cpus(), &self.compressor, plug_pages);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags' defaults are the runtime's own, where both have one: a
    /// default changed on one side only (as the zero-fill-ahead window's
    /// once was) would make `uswap run` and a runtime built in code differ.
    #[test]
    fn flag_defaults_are_the_runtimes() {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            runtime: RuntimeArgs,
        }
        let flags = <Only as clap::Parser>::try_parse_from(["uswap"])
            .expect("defaults parse")
            .runtime
            .config(1);
        let runtime = uswap::mm::RuntimeConfig::default();
        assert_eq!(flags.folio_size, runtime.folio_size);
        assert_eq!(flags.compress_batchsize, runtime.compress_batchsize);
        assert_eq!(flags.page_cluster, runtime.page_cluster);
        assert_eq!(flags.zero_fill_ahead, runtime.zero_fill_ahead);
        assert_eq!(flags.handoff_pages, runtime.handoff_pages);
        assert_eq!(flags.max_pool_percent, runtime.max_pool_percent);
        assert_eq!(
            flags.accept_threshold_percent,
            runtime.accept_threshold_percent
        );
        assert_eq!(flags.discard_by_move, runtime.discard_by_move);
        assert_eq!(flags.keep_clean_copies, runtime.keep_clean_copies);
        assert_eq!(flags.event_readers, runtime.event_readers);
    }

    #[test]
    fn auto_engines_leave_the_caller_a_cpu_of_the_share() {
        assert_eq!(
            Engines::Auto.per_runtime(1, 2),
            1,
            "the caller is the other"
        );
        assert_eq!(Engines::Auto.per_runtime(2, 2), 0, "one each does not pay");
        assert_eq!(Engines::Auto.per_runtime(2, 8), 3);
        assert_eq!(Engines::Auto.per_runtime(1, 9), 8);
        assert_eq!(Engines::Auto.per_runtime(1, 64), 8);
        assert_eq!(Engines::Auto.per_runtime(1, 1), 0);
        assert_eq!(Engines::Fixed(3).per_runtime(2, 2), 3);
        assert_eq!(
            Engines::Fixed(3).choose(1, 2, "lz4", 128),
            3,
            "fixed is never probed"
        );
        assert_eq!(
            Engines::Auto.choose(2, 2, "lz4", 128),
            0,
            "no share, no probe"
        );
        assert!(Engines::Auto.choose(1, 2, "lz4", 128) <= 1);
        assert_eq!(engines("auto"), Ok(Engines::Auto));
        assert_eq!(engines("0"), Ok(Engines::Fixed(0)));
        assert!(engines("65").is_err() && engines("two").is_err());
    }

    #[test]
    fn batch_size_takes_auto_or_1_to_32_folios() {
        assert_eq!(batch_size("auto"), Ok(BatchSize::Auto));
        assert_eq!(batch_size("1"), Ok(BatchSize::Fixed(1)));
        assert_eq!(batch_size("32"), Ok(BatchSize::Fixed(32)));
        for bad in ["0", "33", "-1", "eight", ""] {
            assert!(batch_size(bad).is_err(), "{bad:?} taken");
        }
    }
}

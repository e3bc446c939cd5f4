//! The knobs of the software compression device.

use std::time::Duration;

/// How callers are mapped to engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// A calling thread always submits to the same engine (IAA's per-core
    /// mapping to the package-local device).
    Local,
    /// Jobs are spread round-robin over all engines (the series' global WQ).
    Global,
}

impl std::str::FromStr for Mapping {
    type Err = String;

    fn from_str(s: &str) -> Result<Mapping, String> {
        match s {
            "local" => Ok(Mapping::Local),
            "global" => Ok(Mapping::Global),
            other => Err(format!(
                "unknown mapping {other:?}: expected local or global"
            )),
        }
    }
}

/// Configuration of a [`crate::accel::Device`].
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Engine threads; 0 runs every job synchronously on the caller.
    pub engines: usize,
    /// Descriptors per engine work queue.
    pub queue_depth: usize,
    /// The batch size callers should use (IAA's is 8).
    pub batch_size: usize,
    /// Caller-to-engine mapping.
    pub mapping: Mapping,
    /// Decompress and compare (CRC32C) every compressed result.
    pub verify: bool,
    /// Let the caller run not-yet-started jobs of its own batch.
    pub caller_assist: bool,
    /// Pin engine i to CPU i mod the number of CPUs this process may use.
    /// Off by default: a pinned engine cannot leave a CPU that another
    /// process keeps busy, and every batch on it waits for that process's
    /// time slices. With one `yes` beside it, on 2 CPUs: `uswap run
    /// --memory-high 32M --folio-size 4k --compressor lzo-rle -- touch
    /// faults 256 2 20000 corpus/*.pages` had a mean fault of 448 us pinned
    /// against 49 us not (p99 4.0 against 0.55 ms), and `uswap usemem 1536M
    /// -n 2 --memory-high 1G --compressor lzo-rle` wrote 197 against 462
    /// MB/s. On an idle machine the two were alike (usemem threads 669 and
    /// 638 MB/s pinned, 719 and 644 not).
    pub pin: bool,
    /// Attempts to enqueue on a full queue before falling back to software.
    pub submit_retries: u32,
    /// How long an idle engine keeps polling its queue (yielding the CPU
    /// between polls) before it sleeps until a submitter wakes it.
    pub idle_poll: Duration,
    /// How long a waiting caller keeps polling its completion records
    /// (yielding between polls) before it runs a job no engine has begun
    /// itself, or sleeps on the futex until the engine is done. None by
    /// default: on this project's 2-CPU machine, polling took the CPU from
    /// the engines it waited for (`uswap usemem 1536M -n 2 --memory-high 1G
    /// --compressor lzo-rle`, threads, 3 runs each, alternating: 8.76-8.81 s
    /// without against 9.06-9.36 s with 50 us), and `uswap bench faults`
    /// latencies were no worse without.
    pub wait_poll: Duration,
    /// How long a waiting caller tolerates no progress before it takes its
    /// still-queued jobs back and runs them itself.
    pub stall_timeout: Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            engines: 2,
            queue_depth: 64,
            batch_size: 8,
            mapping: Mapping::Global,
            verify: false,
            caller_assist: false,
            pin: false,
            submit_retries: 64,
            idle_poll: Duration::from_micros(50),
            wait_poll: Duration::ZERO,
            stall_timeout: Duration::from_millis(100),
        }
    }
}

impl DeviceConfig {
    /// The default configuration with `engines` engines.
    pub fn with_engines(engines: usize) -> DeviceConfig {
        DeviceConfig {
            engines,
            ..DeviceConfig::default()
        }
    }

    /// The device the runtime's store uses: `engines` engines, and the
    /// caller (the reclaimer, a filler) runs jobs of its own batch that no
    /// engine has begun while it waits, rather than sleeping until the
    /// engines get to them. On the 2-CPU build machine, 7 alternating
    /// pairs of `uswap usemem 1536M -n 2 --memory-high 1G --compressor
    /// lzo-rle` (threads, 2 engines) wrote 613-794 MB/s (median 657)
    /// against 596-663 (median 623), in 10.3-11.5 s against 11.1-12.4 s
    /// (less time in all 7). Without it the reclaimer slept on a job's
    /// futex 14,490 times in a run that evicted 49,152 folios, and a CPU
    /// sat idle through many of the wake-ups (12% of all CPU samples).
    pub fn for_runtime(engines: usize) -> DeviceConfig {
        DeviceConfig {
            caller_assist: true,
            ..DeviceConfig::with_engines(engines)
        }
    }
}

//! Per-engine counters, in the spirit of iaa_crypto's `wq_stats`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters of one engine (or of the jobs that callers ran themselves).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub compress_jobs: AtomicU64,
    pub decompress_jobs: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub queue_full_retries: AtomicU64,
    pub sw_fallbacks: AtomicU64,
    pub verify_failures: AtomicU64,
    pub stall_recoveries: AtomicU64,
}

/// A snapshot of one engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Compression jobs completed.
    pub compress_jobs: u64,
    /// Decompression jobs completed.
    pub decompress_jobs: u64,
    /// Bytes read by completed jobs.
    pub bytes_in: u64,
    /// Bytes written by completed jobs.
    pub bytes_out: u64,
    /// Submissions that found this engine's queue full and retried.
    pub queue_full_retries: u64,
    /// Jobs meant for this engine that ran in software on the caller because
    /// its queue stayed full.
    pub sw_fallbacks: u64,
    /// Compressed results that did not decompress to their input.
    pub verify_failures: u64,
    /// Jobs queued on this engine that a caller took back after the engine
    /// made no progress for the stall timeout.
    pub stall_recoveries: u64,
}

impl Counters {
    pub fn snapshot(&self) -> EngineStats {
        EngineStats {
            compress_jobs: self.compress_jobs.load(Relaxed),
            decompress_jobs: self.decompress_jobs.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            queue_full_retries: self.queue_full_retries.load(Relaxed),
            sw_fallbacks: self.sw_fallbacks.load(Relaxed),
            verify_failures: self.verify_failures.load(Relaxed),
            stall_recoveries: self.stall_recoveries.load(Relaxed),
        }
    }
}

/// A snapshot of the whole device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// One entry per engine.
    pub engines: Vec<EngineStats>,
    /// Jobs that calling threads ran themselves (caller assist, fallbacks,
    /// and every job when there are no engines).
    pub caller: EngineStats,
}

impl DeviceStats {
    /// The sum over engines and callers.
    pub fn total(&self) -> EngineStats {
        let mut t = self.caller;
        for e in &self.engines {
            t.compress_jobs += e.compress_jobs;
            t.decompress_jobs += e.decompress_jobs;
            t.bytes_in += e.bytes_in;
            t.bytes_out += e.bytes_out;
            t.queue_full_retries += e.queue_full_retries;
            t.sw_fallbacks += e.sw_fallbacks;
            t.verify_failures += e.verify_failures;
            t.stall_recoveries += e.stall_recoveries;
        }
        t
    }
}

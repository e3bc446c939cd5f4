//! Fault latency: how long the runtime takes to serve a page fault, from
//! the moment its event is read to the moment its handler is done (the
//! folio installed, or the fault handed to whoever is already bringing the
//! folio in). Kept as a histogram of atomic counters, so that recording
//! costs one increment and a snapshot can be taken while faults go on.
//!
//! Buckets are logarithmic with four steps per power of two (at most 19%
//! apart), from 64 ns to about 70 s: good enough for percentiles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Steps per power of two.
const STEPS: u32 = 4;
/// Durations below 2^MIN_SHIFT ns share the first bucket.
const MIN_SHIFT: u32 = 6;
/// Buckets: powers of two from 2^6 to 2^36 ns, four each.
const BUCKETS: usize = ((36 - MIN_SHIFT) * STEPS) as usize;

/// A latency histogram.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    let ns = ns.max(1 << MIN_SHIFT);
    let shift = 63 - ns.leading_zeros();
    // The two bits below the top one pick the step.
    let step = ((ns >> (shift - 2)) & (STEPS as u64 - 1)) as u32;
    (((shift - MIN_SHIFT) * STEPS + step) as usize).min(BUCKETS - 1)
}

/// The upper bound of bucket `b`, in nanoseconds.
fn bucket_top(b: usize) -> u64 {
    let shift = b as u32 / STEPS + MIN_SHIFT;
    let step = b as u64 % STEPS as u64;
    (1u64 << shift) + ((step + 1) << (shift - 2)) - 1
}

impl Histogram {
    /// Counts one latency.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Latencies {
        Latencies {
            counts: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// A snapshot of a [`Histogram`].
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    counts: Vec<u64>,
}

impl Latencies {
    /// How many latencies were counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The latency below which a fraction `q` (0..=1) of them fall (the
    /// upper bound of the bucket where that fraction is reached); zero if
    /// none was counted.
    pub fn percentile(&self, q: f64) -> Duration {
        let total = self.count();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(bucket_top(b));
            }
        }
        Duration::from_nanos(bucket_top(BUCKETS - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_falls_in_a_bucket_whose_bounds_hold_it() {
        for ns in [
            1u64,
            63,
            64,
            65,
            100,
            1_000,
            9_999,
            123_456,
            7_000_000,
            1 << 35,
        ] {
            let b = bucket_of(ns);
            assert!(ns.max(64) <= bucket_top(b), "{ns} above bucket {b}");
            if b > 0 {
                assert!(ns > bucket_top(b - 1), "{ns} belongs below bucket {b}");
            }
        }
    }

    #[test]
    fn percentiles_follow_the_counts() {
        let h = Histogram::default();
        for _ in 0..90 {
            h.record(Duration::from_micros(10));
        }
        for _ in 0..10 {
            h.record(Duration::from_millis(5));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        let p50 = s.percentile(0.5);
        assert!(
            p50 >= Duration::from_micros(10) && p50 < Duration::from_micros(13),
            "{p50:?}"
        );
        let p99 = s.percentile(0.99);
        assert!(
            p99 >= Duration::from_millis(5) && p99 < Duration::from_millis(6),
            "{p99:?}"
        );
        assert_eq!(Latencies::default().percentile(0.5), Duration::ZERO);
    }
}

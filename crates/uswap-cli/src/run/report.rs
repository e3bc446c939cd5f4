//! What a supervisor reports about its run: the counters in /proc/vmstat
//! form (the kernel's names where it has them), plus resident, stored and
//! pool bytes, the compression ratio and fault latency percentiles. The
//! same report is served live (`uswap stats`) and written at the end
//! (`--stats-file`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use uswap::mm::Runtime;

/// Fault service latency percentiles, in microseconds.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct FaultLatency {
    pub faults: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// One report.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Report {
    /// The supervisor's pid.
    pub supervisor: i32,
    /// The command it runs.
    pub program: String,
    /// The pids of the program images it serves now.
    pub served: Vec<i32>,
    pub memory_high: u64,
    pub resident_bytes: u64,
    /// Uncompressed bytes of the pages held (pool and swap file).
    pub stored_bytes_uncompressed: u64,
    /// Compressed bytes of the pages in the pool.
    pub stored_bytes: u64,
    /// Memory the pool takes.
    pub pool_bytes: u64,
    /// Uncompressed over compressed bytes of the pages in the pool.
    pub compression_ratio: f64,
    pub fault_latency: FaultLatency,
    pub counters: BTreeMap<String, u64>,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Report {
    pub fn of(rt: &Runtime, program: &str, served: Vec<i32>) -> Report {
        let stats = rt.stats();
        let latency = rt.fault_latency();
        let store = &stats.store;
        let pool_pages = store
            .stored_pages
            .saturating_sub(store.stored_incompressible_pages);
        Report {
            // SAFETY: getpid has no preconditions.
            supervisor: unsafe { libc::getpid() },
            program: program.to_string(),
            served,
            memory_high: rt.memory_high() as u64,
            resident_bytes: stats.resident_bytes,
            stored_bytes_uncompressed: store.stored_pages * 4096,
            stored_bytes: store.stored_bytes,
            pool_bytes: store.pool_total_size,
            compression_ratio: if store.stored_bytes == 0 {
                0.0
            } else {
                (pool_pages * 4096) as f64 / store.stored_bytes as f64
            },
            fault_latency: FaultLatency {
                faults: latency.count(),
                p50_us: us(latency.percentile(0.50)),
                p90_us: us(latency.percentile(0.90)),
                p99_us: us(latency.percentile(0.99)),
                p999_us: us(latency.percentile(0.999)),
            },
            counters: stats.named().into_iter().collect(),
        }
    }

    /// The report as `name value` lines.
    pub fn vmstat(&self) -> String {
        let mut out = String::new();
        let mut line = |k: &str, v: String| {
            out.push_str(k);
            out.push(' ');
            out.push_str(&v);
            out.push('\n');
        };
        line("supervisor", self.supervisor.to_string());
        line(
            "served",
            self.served
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        line("memory_high", self.memory_high.to_string());
        line(
            "stored_bytes_uncompressed",
            self.stored_bytes_uncompressed.to_string(),
        );
        line(
            "compression_ratio",
            format!("{:.2}", self.compression_ratio),
        );
        let l = &self.fault_latency;
        line("fault_latency_count", l.faults.to_string());
        line("fault_latency_p50_us", format!("{:.1}", l.p50_us));
        line("fault_latency_p90_us", format!("{:.1}", l.p90_us));
        line("fault_latency_p99_us", format!("{:.1}", l.p99_us));
        line("fault_latency_p999_us", format!("{:.1}", l.p999_us));
        for (k, v) in &self.counters {
            line(k, v.to_string());
        }
        out
    }
}

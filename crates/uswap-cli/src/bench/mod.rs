//! Benchmarks: shared measurement helpers (percentiles, progress, tables,
//! JSON output) and one module per `uswap bench` subcommand.

pub mod codecs;
pub mod faults;
pub mod floor;
pub mod store;
pub mod svg;
pub mod usemem;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Latency percentiles in nanoseconds.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Percentiles {
    pub p05: u64,
    pub p50: u64,
    pub p99: u64,
}

/// The `q`-quantile (0..=1) of sorted samples.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at]
}

impl Percentiles {
    pub fn of(samples: &mut [u64]) -> Percentiles {
        samples.sort_unstable();
        Percentiles {
            p05: quantile(samples, 0.05),
            p50: quantile(samples, 0.50),
            p99: quantile(samples, 0.99),
        }
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>18} [{bar:40}] {pos}/{len} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

/// A plain text table: a header row and rows of cells, right-aligned.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self, title: &str) {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].len())
                    .chain([self.header[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        println!("\n{title}");
        let line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:>w$}"))
                .collect();
            println!("  {}", parts.join("  "));
        };
        line(&self.header);
        for r in &self.rows {
            line(r);
        }
    }
}

/// The latency buckets of the async-free seed, upper bounds in ns.
const BUCKETS: [(&str, u64); 4] = [
    ("0-20", 20_000),
    ("20-100", 100_000),
    ("100-500", 500_000),
    (">500", u64::MAX),
];

/// A latency distribution in microseconds, with the share of samples in
/// each of the seed's buckets.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub buckets: BTreeMap<&'static str, f64>,
}

impl Latency {
    /// Column names matching [`Latency::cells`].
    pub const HEADER: [&'static str; 8] = [
        "mean us", "p50 us", "p99 us", "p99.9 us", "0-20", "20-100", "100-500", ">500",
    ];

    /// The distribution of `samples` (ns).
    pub fn of(samples: &mut [u64]) -> Latency {
        samples.sort_unstable();
        let n = samples.len().max(1) as f64;
        let us = |ns: u64| ns as f64 / 1000.0;
        let mut buckets = BTreeMap::new();
        let mut lower = 0;
        for (name, upper) in BUCKETS {
            let count = samples.iter().filter(|&&x| x >= lower && x < upper).count();
            buckets.insert(name, count as f64 / n);
            lower = upper;
        }
        Latency {
            mean_us: samples.iter().sum::<u64>() as f64 / n / 1000.0,
            p50_us: us(quantile(samples, 0.5)),
            p99_us: us(quantile(samples, 0.99)),
            p999_us: us(quantile(samples, 0.999)),
            buckets,
        }
    }

    /// Table cells, in [`Latency::HEADER`] order.
    pub fn cells(&self) -> Vec<String> {
        let mut v = vec![
            format!("{:.2}", self.mean_us),
            format!("{:.2}", self.p50_us),
            format!("{:.2}", self.p99_us),
            format!("{:.2}", self.p999_us),
        ];
        v.extend(
            BUCKETS
                .iter()
                .map(|(k, _)| format!("{:.3}%", self.buckets[k] * 100.0)),
        );
        v
    }
}

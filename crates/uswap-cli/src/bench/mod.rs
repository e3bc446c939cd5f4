//! Benchmarks: shared measurement helpers (percentiles, progress, tables,
//! JSON output) and one module per `uswap bench` subcommand.

pub mod codecs;
pub mod faults;
pub mod store;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
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
            let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect();
            println!("  {}", parts.join("  "));
        };
        line(&self.header);
        for r in &self.rows {
            line(r);
        }
    }
}

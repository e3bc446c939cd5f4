//! `uswap bench usemem`: `uswap usemem` in several configurations side by
//! side (threads or processes, engine counts, store layouts), each run as a
//! child process of its own, in rounds that rotate the order so that no
//! configuration always runs first on a noisy machine. Shows whether
//! `--engines auto` picks as well as the best fixed count, and draws the
//! throughput per configuration with `--svg DIR`.

use super::{progress, write_json, Table};
use crate::args::{self, Engines};
use serde::Serialize;
use std::path::PathBuf;
use std::process::Command;
use uswap::size::format_size;
use uswap::zswap::Layout;

#[derive(clap::Args)]
pub struct Args {
    /// Memory per task.
    #[arg(default_value = "1536M", value_parser = args::size)]
    size: u64,
    /// Tasks.
    #[arg(short = 'n', long = "tasks", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    tasks: u32,
    /// The limit for the whole run.
    #[arg(long, default_value = "1G", value_parser = args::size)]
    memory_high: u64,
    /// Codec by kernel name.
    #[arg(long, default_value = "lzo-rle", value_parser = args::codec_name)]
    compressor: String,
    /// Folio size.
    #[arg(long, default_value = "64k", value_parser = args::folio_size)]
    folio_size: usize,
    /// How the tasks run: threads (one runtime), processes (one each).
    #[arg(long, default_value = "threads,processes", value_delimiter = ',')]
    modes: Vec<TaskMode>,
    /// Engine counts (auto or 0..64).
    #[arg(long, default_value = "auto,0,1,2", value_parser = args::engines, value_delimiter = ',')]
    engines: Vec<Engines>,
    /// Store layouts (page, folio, byn:N).
    #[arg(long, default_value = "folio", value_parser = args::layout, value_delimiter = ',')]
    layout: Vec<Layout>,
    /// Runs of each configuration.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Write every figure as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the throughput of each configuration as an SVG chart in this
    /// directory (usemem.svg).
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// Threads sharing one runtime, or a process (and runtime) per task.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskMode {
    Threads,
    Processes,
}

impl TaskMode {
    fn name(self) -> &'static str {
        match self {
            TaskMode::Threads => "threads",
            TaskMode::Processes => "processes",
        }
    }
}

/// One configuration.
#[derive(Clone, Copy)]
struct Config {
    mode: TaskMode,
    engines: Engines,
    layout: Layout,
}

/// One configuration's runs.
#[derive(Serialize)]
struct Row {
    mode: TaskMode,
    /// As given, and what auto chose (`auto (1)`).
    engines: String,
    layout: String,
    /// Write throughput of all tasks together, MB/s (10^6 bytes), per run.
    mb_per_s: Vec<f64>,
    /// Wall time of each run, write and verify, seconds.
    elapsed_s: Vec<f64>,
    /// For auto: the median throughput against the best median of the
    /// fixed engine counts of the same mode and layout.
    vs_best_fixed: Option<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Runs `uswap usemem` once in `config`; returns (MB/s, elapsed seconds,
/// engines as chosen).
fn usemem(args: &Args, config: Config) -> Result<(f64, f64, String), String> {
    let json = std::env::temp_dir().join(format!("uswap-bench-usemem-{}.json", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| format!("finding uswap: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("usemem")
        .arg(args.size.to_string())
        .args(["-n", &args.tasks.to_string()])
        .args(["--memory-high", &args.memory_high.to_string()])
        .args(["--compressor", &args.compressor])
        .args(["--folio-size", &args.folio_size.to_string()])
        .args(["--engines", &config.engines.to_string()])
        .args(["--layout", &config.layout.to_string()])
        .arg("--json")
        .arg(&json);
    if config.mode == TaskMode::Processes {
        cmd.arg("--processes");
    }
    let out = cmd.output().map_err(|e| format!("running usemem: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "usemem failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    std::fs::remove_file(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    let report: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("usemem's report: {e}"))?;
    if report["verify_ok"] != serde_json::Value::Bool(true) {
        return Err("usemem read back different bytes than it wrote".into());
    }
    let number = |key: &str| {
        report[key]
            .as_f64()
            .ok_or_else(|| format!("usemem's report has no {key}"))
    };
    let engines = report["engines"].as_str().unwrap_or("?").to_string();
    Ok((
        number("total_kbps")? * 1024.0 / 1e6,
        number("elapsed_s")?,
        engines,
    ))
}

pub fn run(args: &Args) -> Result<(), String> {
    let mut configs = Vec::new();
    for &mode in &args.modes {
        for &layout in &args.layout {
            for &engines in &args.engines {
                configs.push(Config {
                    mode,
                    engines,
                    layout,
                });
            }
        }
    }
    let mut rows: Vec<Row> = configs
        .iter()
        .map(|c| Row {
            mode: c.mode,
            engines: c.engines.to_string(),
            layout: c.layout.to_string(),
            mb_per_s: Vec::new(),
            elapsed_s: Vec::new(),
            vs_best_fixed: None,
        })
        .collect();
    let bar = progress(configs.len() as u64 * args.rounds as u64, "usemem");
    for r in 0..args.rounds as usize {
        for k in 0..configs.len() {
            let i = (k + r) % configs.len();
            let c = configs[i];
            bar.set_message(format!("{} {} {}", c.mode.name(), c.engines, c.layout));
            let (mbps, elapsed, engines) = usemem(args, c)?;
            rows[i].mb_per_s.push(mbps);
            rows[i].elapsed_s.push(elapsed);
            rows[i].engines = engines;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    for i in 0..rows.len() {
        if configs[i].engines != Engines::Auto {
            continue;
        }
        let best_fixed = (0..rows.len())
            .filter(|&j| {
                configs[j].engines != Engines::Auto
                    && configs[j].mode == configs[i].mode
                    && configs[j].layout == configs[i].layout
            })
            .map(|j| median(&rows[j].mb_per_s))
            .fold(None, |best: Option<f64>, m| {
                Some(best.map_or(m, |b| b.max(m)))
            });
        rows[i].vs_best_fixed = best_fixed.map(|b| median(&rows[i].mb_per_s) / b);
    }

    let mut t = Table::new(&[
        "mode",
        "engines",
        "layout",
        "MB/s median",
        "min",
        "max",
        "elapsed s",
        "auto vs best fixed",
    ]);
    let fold = |v: &[f64], f: fn(f64, f64) -> f64, init: f64| v.iter().copied().fold(init, f);
    for r in &rows {
        t.row(vec![
            r.mode.name().to_string(),
            r.engines.clone(),
            r.layout.clone(),
            format!("{:.0}", median(&r.mb_per_s)),
            format!("{:.0}", fold(&r.mb_per_s, f64::min, f64::MAX)),
            format!("{:.0}", fold(&r.mb_per_s, f64::max, 0.0)),
            format!("{:.2}", median(&r.elapsed_s)),
            r.vs_best_fixed.map_or(String::new(), |v| format!("{v:.3}")),
        ]);
    }
    let title = format!(
        "usemem: {} x {} under {}, {}, {} folios, {} runs each (throughput of the write phase)",
        args.tasks,
        format_size(args.size),
        format_size(args.memory_high),
        args.compressor,
        format_size(args.folio_size as u64),
        args.rounds
    );
    t.print(&title);
    if let Some(dir) = &args.svg {
        super::svg::prepare(dir)?;
        let bars: Vec<(String, [f64; 3])> = rows
            .iter()
            .map(|r| {
                (
                    format!("{} engines {} {}", r.mode.name(), r.engines, r.layout),
                    [
                        fold(&r.mb_per_s, f64::min, f64::MAX),
                        median(&r.mb_per_s),
                        fold(&r.mb_per_s, f64::max, 0.0),
                    ],
                )
            })
            .collect();
        super::svg::bars(
            &dir.join("usemem.svg"),
            &title,
            "MB/s (median; line: min to max)",
            &bars,
        )?;
    }
    if let Some(path) = &args.json {
        write_json(path, &rows)?;
    }
    Ok(())
}

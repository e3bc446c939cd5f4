//! `uswap usemem`: vm-scalability's usemem on top of the runtime. Each task
//! maps SIZE bytes of managed memory, writes it sequentially (`p[i] = i` per
//! 8-byte word, or pages of a corpus), optionally holds it, then reads it all
//! back and checks it. Throughput is the write phase's, as usemem reports it.

use crate::args::{self, RuntimeArgs};
use crate::bench::write_json;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use uswap::corpus::{self, PAGE_SIZE};
use uswap::mm::{Region, Runtime, RuntimeConfig, RuntimeStats};
use uswap::size::format_size;
use uswap::zswap::{size_label, SIZE_ORDERS};

#[derive(clap::Args)]
pub struct Args {
    /// Memory per task.
    #[arg(default_value = "512M", value_parser = args::size)]
    size: u64,
    /// Tasks (threads in one process, sharing one runtime).
    #[arg(short = 'n', long = "tasks", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    tasks: u32,
    /// Fork a process per task, each with its own runtime.
    #[arg(long)]
    processes: bool,
    /// Fill from the pages of this corpus instead of p[i] = i.
    #[arg(long, value_parser = args::existing_dir)]
    data: Option<PathBuf>,
    /// Seconds to hold the memory after writing it.
    #[arg(long, default_value_t = 0.0, value_parser = args::seconds)]
    sleep: f64,
    /// Skip reading everything back and checking it.
    #[arg(long)]
    no_verify: bool,
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: run task N of a --processes run and print its result.
    #[arg(long, hide = true)]
    child_task: Option<u32>,
}

/// One task's outcome.
#[derive(Serialize, serde::Deserialize, Clone)]
struct TaskResult {
    bytes: u64,
    write_usecs: u64,
    verify_ok: bool,
    mismatches: u64,
}

#[derive(Serialize)]
struct Report {
    tasks: u32,
    processes: bool,
    bytes_per_task: u64,
    memory_high: u64,
    folio_size: String,
    compressor: String,
    compress_batchsize: String,
    engines: String,
    total_kbps: f64,
    average_kbps: f64,
    elapsed_s: f64,
    sys_s: f64,
    user_s: f64,
    verify_ok: bool,
    per_task: Vec<TaskResult>,
    stats: BTreeMap<String, u64>,
}

/// What a task writes into its memory.
enum Fill {
    Words,
    Pages(Vec<u8>),
}

impl Fill {
    fn expected_page(&self, page: usize, task: usize, out: &mut [u8]) {
        match self {
            Fill::Words => {
                let first = (page * PAGE_SIZE / 8) as u64;
                for (k, w) in out.chunks_exact_mut(8).enumerate() {
                    w.copy_from_slice(&(first + k as u64).to_le_bytes());
                }
            }
            Fill::Pages(pages) => {
                let n = pages.len() / PAGE_SIZE;
                let p = (page + task * 7919) % n;
                out.copy_from_slice(&pages[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]);
            }
        }
    }
}

fn run_task(region: &mut Region, fill: &Fill, task: usize, sleep: f64, verify: bool) -> TaskResult {
    let mem = region.as_mut_slice();
    let t = Instant::now();
    match fill {
        Fill::Words => {
            for (i, w) in mem.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&(i as u64).to_le_bytes());
            }
        }
        Fill::Pages(_) => {
            for (p, page) in mem.chunks_exact_mut(PAGE_SIZE).enumerate() {
                fill.expected_page(p, task, page);
            }
        }
    }
    let write_usecs = t.elapsed().as_micros() as u64;
    if sleep > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(sleep));
    }
    let mut mismatches = 0u64;
    if verify {
        let mut expect = vec![0u8; PAGE_SIZE];
        for (p, page) in mem.chunks_exact(PAGE_SIZE).enumerate() {
            fill.expected_page(p, task, &mut expect);
            if page != expect.as_slice() {
                mismatches += 1;
            }
        }
    }
    TaskResult {
        bytes: mem.len() as u64,
        write_usecs: write_usecs.max(1),
        verify_ok: mismatches == 0,
        mismatches,
    }
}

fn cpu_times(who: i32) -> (f64, f64) {
    // SAFETY: getrusage writes one rusage structure.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(who, &mut ru) };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

fn stats_map(s: &RuntimeStats) -> BTreeMap<String, u64> {
    s.named().into_iter().collect()
}

fn add_stats(total: &mut BTreeMap<String, u64>, more: &BTreeMap<String, u64>) {
    for (k, v) in more {
        *total.entry(k.clone()).or_insert(0) += v;
    }
}

/// Runs every task as a thread of this process, sharing one runtime.
fn run_threads(
    args: &Args,
    fill: &Fill,
    config: RuntimeConfig,
) -> Result<(Vec<TaskResult>, BTreeMap<String, u64>), String> {
    let rt = Runtime::new(config).map_err(|e| format!("starting the runtime: {e}"))?;
    let mut regions: Vec<Region> = (0..args.tasks)
        .map(|_| rt.map(args.size as usize))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("mapping memory: {e}"))?;
    let verify = !args.no_verify;
    let results: Vec<TaskResult> = std::thread::scope(|s| {
        let handles: Vec<_> = regions
            .iter_mut()
            .enumerate()
            .map(|(t, r)| s.spawn(move || run_task(r, fill, t, args.sleep, verify)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("usemem task"))
            .collect()
    });
    let stats = stats_map(&rt.stats());
    drop(regions);
    Ok((results, stats))
}

/// Starts a process per task (this program again, with `--child-task`),
/// each with its own runtime and its share of the memory limit; each prints
/// its result as one JSON line.
fn run_processes(args: &Args) -> Result<(Vec<TaskResult>, BTreeMap<String, u64>), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let children: Vec<std::process::Child> = (0..args.tasks)
        .map(|t| {
            std::process::Command::new(&exe)
                .args(&raw)
                .args(["--child-task", &t.to_string()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting task {t}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut results = Vec::new();
    let mut stats = BTreeMap::new();
    for child in children {
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for a task: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (r, s): (TaskResult, BTreeMap<String, u64>) = serde_json::from_str(text.trim())
            .map_err(|_| format!("a task process failed ({}): {text}", out.status))?;
        results.push(r);
        add_stats(&mut stats, &s);
    }
    Ok((results, stats))
}

/// The body of one task process.
fn run_child(args: &Args, fill: &Fill, task: usize) -> Result<(), String> {
    let rt = Runtime::new(args.runtime.config(args.tasks as usize))
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let mut region = rt
        .map(args.size as usize)
        .map_err(|e| format!("mapping memory: {e}"))?;
    let r = run_task(&mut region, fill, task, args.sleep, !args.no_verify);
    let stats = stats_map(&rt.stats());
    drop(region);
    println!(
        "{}",
        serde_json::to_string(&(r, stats)).map_err(|e| e.to_string())?
    );
    Ok(())
}

impl Args {
    /// Values wrong together, and an output file that cannot be written:
    /// a usage error (exit 2) before anything runs.
    pub fn check(&self) -> Result<(), String> {
        self.runtime.check()?;
        if let Some(json) = &self.json {
            args::writable(json)?;
        }
        Ok(())
    }
}

pub fn run(args: &Args) -> Result<(), String> {
    let fill = match &args.data {
        Some(dir) => {
            let w = corpus::load_dir(dir).map_err(|e| format!("loading {}: {e}", dir.display()))?;
            Fill::Pages(w.into_iter().flat_map(|w| w.pages).collect())
        }
        None => Fill::Words,
    };
    if args.size < PAGE_SIZE as u64 {
        return Err("the size per task must be at least one page".into());
    }
    if let Some(task) = args.child_task {
        return run_child(args, &fill, task as usize);
    }
    let t = Instant::now();
    // Engines as the threads' runtime got them (auto measures at start-up);
    // each process of a --processes run chooses its own.
    let (results, stats, chosen) = if args.processes {
        let (results, stats) = run_processes(args)?;
        (results, stats, None)
    } else {
        let config = args.runtime.config(1);
        let engines = config.engines;
        let (results, stats) = run_threads(args, &fill, config)?;
        (results, stats, Some(engines))
    };
    let elapsed = t.elapsed().as_secs_f64();
    let (mut user, mut sys) = cpu_times(libc::RUSAGE_SELF);
    if args.processes {
        let (u, s) = cpu_times(libc::RUSAGE_CHILDREN);
        user += u;
        sys += s;
    }

    for r in &results {
        println!(
            "{} bytes / {} usecs = {} KB/s",
            r.bytes,
            r.write_usecs,
            r.bytes * 1_000_000 / r.write_usecs / 1024
        );
    }
    let kbps: Vec<f64> = results
        .iter()
        .map(|r| r.bytes as f64 * 1e6 / r.write_usecs as f64 / 1024.0)
        .collect();
    let total: f64 = kbps.iter().sum();
    let average = total / kbps.len() as f64;
    let verify_ok = results.iter().all(|r| r.verify_ok);
    println!();
    println!(
        "  {:<28} {:>16}",
        "",
        format!("{} x {}", results.len(), format_size(args.size))
    );
    let line = |name: &str, value: String| println!("  {name:<28} {value:>16}");
    line("Total throughput (KB/s)", format!("{total:.0}"));
    line("Average throughput (KB/s)", format!("{average:.0}"));
    line("elapsed time (sec)", format!("{elapsed:.2}"));
    line("sys time (sec)", format!("{sys:.2}"));
    line("user time (sec)", format!("{user:.2}"));
    for name in [
        "zswpout",
        "zswpin",
        "pswpout",
        "pswpin",
        "swpout_zero",
        "written_back_pages",
        "pool_limit_hit",
        "pgmajfault",
    ] {
        line(name, stats.get(name).copied().unwrap_or(0).to_string());
    }
    for order in 0..SIZE_ORDERS {
        let label = size_label(order);
        let out = stats.get(&format!("zswpout_{label}")).copied().unwrap_or(0);
        let fallback = stats
            .get(&format!("swpout_fallback_{label}"))
            .copied()
            .unwrap_or(0);
        if out > 0 || fallback > 0 || label == format!("{}kB", args.runtime.folio_size / 1024) {
            line(&format!("ZSWPOUT-{label}"), out.to_string());
            line(&format!("swpout_fallback-{label}"), fallback.to_string());
        }
    }
    line(
        "verify",
        if args.no_verify {
            "skipped".into()
        } else if verify_ok {
            "ok".into()
        } else {
            "FAILED".into()
        },
    );

    if let Some(path) = &args.json {
        write_json(
            path,
            &Report {
                tasks: args.tasks,
                processes: args.processes,
                bytes_per_task: args.size,
                memory_high: args.runtime.memory_high,
                folio_size: format_size(args.runtime.folio_size as u64),
                compressor: args.runtime.compressor.clone(),
                compress_batchsize: args.runtime.describe_batch(if args.processes {
                    args.tasks as usize
                } else {
                    1
                }),
                engines: match chosen {
                    Some(n) => args.runtime.engines.describe_as(n),
                    None => args
                        .runtime
                        .engines
                        .describe(args.tasks as usize, crate::args::cpus()),
                },
                total_kbps: total,
                average_kbps: average,
                elapsed_s: elapsed,
                sys_s: sys,
                user_s: user,
                verify_ok,
                per_task: results.clone(),
                stats,
            },
        )?;
    }
    if !verify_ok {
        let bad: u64 = results.iter().map(|r| r.mismatches).sum();
        return Err(format!(
            "verification failed: {bad} pages differ from what was written"
        ));
    }
    Ok(())
}

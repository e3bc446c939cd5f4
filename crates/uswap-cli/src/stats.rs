//! `uswap stats`: the live report of running `uswap run` supervisors, in
//! /proc/vmstat form or JSON, once or every few seconds.

use crate::run::report::Report;
use crate::run::{connect, stats_socket, STATS_PREFIX};
use std::io::Read;
use std::time::Duration;

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// A supervisor's pid, or the pid of a program it serves (by default the
    /// only supervisor running).
    pid: Option<i32>,
    /// Every running supervisor.
    #[arg(long, conflicts_with = "pid")]
    all: bool,
    /// JSON instead of `name value` lines.
    #[arg(long)]
    json: bool,
    /// Print again every SECONDS, until the supervisors end.
    #[arg(long, value_parser = positive_seconds)]
    watch: Option<f64>,
}

/// The pids of the supervisors running now (their stats sockets are in
/// /proc/net/unix as `@uswap-stats-PID`).
fn supervisors() -> Vec<i32> {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    let prefix = format!("@{STATS_PREFIX}");
    let mut pids: Vec<i32> = table
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .last()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// One report from supervisor `pid`.
fn fetch(pid: i32) -> Result<Report, String> {
    let sock = connect(&stats_socket(pid), libc::SOCK_STREAM)
        .map_err(|_| format!("no uswap supervisor with pid {pid}"))?;
    let mut json = Vec::new();
    std::fs::File::from(sock)
        .read_to_end(&mut json)
        .map_err(|e| format!("reading the report of {pid}: {e}"))?;
    serde_json::from_slice(&json).map_err(|e| format!("the report of {pid}: {e}"))
}

/// The supervisor `pid` names: itself, or the one serving that program;
/// with no pid, the only supervisor running.
pub fn supervisor_of(pid: Option<i32>) -> Result<i32, String> {
    let running = supervisors();
    match pid {
        Some(pid) if running.contains(&pid) => Ok(pid),
        Some(pid) => running
            .iter()
            .copied()
            .find(|&s| fetch(s).is_ok_and(|r| r.served.contains(&pid)))
            .ok_or_else(|| format!("no uswap supervisor is or serves process {pid}")),
        None => match running.as_slice() {
            [one] => Ok(*one),
            [] => Err("no uswap supervisor is running".into()),
            many => Err(format!(
                "{} supervisors are running ({}): name one",
                many.len(),
                many.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }
}

/// The supervisors asked for.
fn targets(args: &Args) -> Result<Vec<i32>, String> {
    if args.all {
        Ok(supervisors())
    } else {
        supervisor_of(args.pid).map(|one| vec![one])
    }
}

fn print(args: &Args, reports: &[Report]) -> Result<(), String> {
    if args.json {
        let json = if args.all {
            serde_json::to_string_pretty(reports)
        } else {
            serde_json::to_string_pretty(&reports[0])
        };
        println!("{}", json.map_err(|e| e.to_string())?);
    } else {
        for r in reports {
            if reports.len() > 1 || args.all {
                println!("# supervisor {}: {}", r.supervisor, r.program);
            }
            print!("{}", r.vmstat());
        }
    }
    Ok(())
}

pub fn run(args: &Args) -> Result<(), String> {
    // Piped into `head` and the like: end quietly when the reader does, as
    // other command line tools do.
    // SAFETY: restoring the default action of one signal.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let pids = targets(args)?;
    loop {
        let reports: Vec<Report> = pids.iter().filter_map(|&p| fetch(p).ok()).collect();
        if reports.is_empty() {
            // Asked for once: say so. Watched: the supervisors are done.
            return if args.watch.is_some() {
                Ok(())
            } else {
                Err("the supervisor ended before it answered".into())
            };
        }
        print(args, &reports)?;
        match args.watch {
            Some(s) => {
                std::thread::sleep(Duration::from_secs_f64(s));
                println!();
            }
            None => return Ok(()),
        }
    }
}

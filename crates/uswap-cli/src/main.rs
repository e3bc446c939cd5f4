//! The `uswap` command: benchmarks and tools for the uswap compressed memory
//! tier.
//!
//! Bad flags and values exit with status 2 and a message (clap's usage
//! errors); failures while running exit with status 1.

mod args;
mod bench;
mod limit;
mod run;
mod stats;
mod train_dict;
mod usemem;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "uswap",
    version,
    about = "A compressed memory tier in user space"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks: `uswap bench codecs`, `uswap bench store`, `uswap bench
    /// faults`, `uswap bench usemem`.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Train a `canned` dictionary from a page dump.
    TrainDict(train_dict::Args),
    /// vm-scalability's usemem on managed memory: write, hold, verify.
    Usemem(usemem::Args),
    /// Run a program (and its children) under a memory limit: what does not
    /// fit is compressed away and comes back on touch.
    ///
    /// Every option can also be given in the environment, as USWAP_ and the
    /// option's name in capitals with underscores (--memory-high:
    /// USWAP_MEMORY_HIGH), or in a file given with --config.
    #[command(args_override_self = true)]
    Run(run::Args),
    /// The live counters of running `uswap run` supervisors (/proc/vmstat
    /// form, or --json), with resident, stored and pool bytes, the
    /// compression ratio and fault latency percentiles.
    Stats(stats::Args),
    /// Change the memory limit of a running `uswap run` (its --memory-high),
    /// as a write to a cgroup's memory.high does: lowered, what is over it
    /// is compressed away at once. Root and the supervisor's own user only.
    Limit(limit::Args),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Codec latency and ratio per folio size, our layer against the raw
    /// codec, the by_n table, and batched against sequential compression.
    Codecs(bench::codecs::Args),
    /// The compressed store: batched vs sequential store and load per folio
    /// size, pool efficiency, and the slot free modes.
    Store(bench::store::Args),
    /// Swap-in fault latency per folio size and slot free mode, against the
    /// userfaultfd and codec floors.
    Faults(bench::faults::Args),
    /// usemem in several configurations side by side (threads or
    /// processes, engine counts, store layouts).
    Usemem(bench::usemem::Args),
}

fn main() -> ExitCode {
    let args = match run::config::expand(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("uswap: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    let checked = match &cli.command {
        Command::Run(args) => args.check(),
        Command::Usemem(args) => args.check(),
        _ => Ok(()),
    };
    if let Err(e) = checked {
        use clap::CommandFactory;
        Cli::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit();
    }
    let result = match cli.command {
        Command::Bench { which } => match which {
            BenchCommand::Codecs(args) => bench::codecs::run(&args),
            BenchCommand::Store(args) => bench::store::run(&args),
            BenchCommand::Faults(args) => bench::faults::run(&args),
            BenchCommand::Usemem(args) => bench::usemem::run(&args),
        },
        Command::TrainDict(args) => train_dict::run(&args),
        Command::Usemem(args) => usemem::run(&args),
        Command::Run(args) => run::run(&args).map(|never| match never {}),
        Command::Stats(args) => stats::run(&args),
        Command::Limit(args) => limit::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uswap: {e}");
            ExitCode::FAILURE
        }
    }
}

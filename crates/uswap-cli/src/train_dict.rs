//! `uswap train-dict`: trains a `canned` dictionary from a page dump.

use crate::args;
use std::path::PathBuf;
use uswap::codec::train_dictionary;
use uswap::corpus::{self, PAGE_SIZE};

#[derive(clap::Args)]
pub struct Args {
    /// Corpus directory (NAME.pages + NAME.idx per workload).
    #[arg(long, value_parser = args::existing_dir)]
    corpus: Option<PathBuf>,
    /// Where to write the dictionary.
    #[arg(long, short)]
    out: PathBuf,
    /// Largest dictionary size.
    #[arg(long, default_value = "16k", value_parser = args::size)]
    size: u64,
    /// Train on one 64 KiB folio in every STRIDE (1 = all pages); with the
    /// default 2 the other half stays unseen for honest measurements.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    stride: u64,
}

pub fn run(args: &Args) -> Result<(), String> {
    let dir = args.corpus.clone().unwrap_or_else(corpus::default_dir);
    let workloads = corpus::load_dir(&dir).map_err(|e| e.to_string())?;
    let stride = args.stride as usize;
    let mut samples: Vec<&[u8]> = Vec::new();
    for w in &workloads {
        let group = 16;
        for (i, chunk) in w.pages.chunks(PAGE_SIZE * group).enumerate() {
            if i % stride == 0 {
                samples.extend(chunk.chunks(PAGE_SIZE));
            }
        }
    }
    let dict = train_dictionary(&samples, args.size as usize)
        .map_err(|e| format!("training failed: {e}"))?;
    std::fs::write(&args.out, &dict).map_err(|e| format!("{}: {e}", args.out.display()))?;
    println!(
        "trained a {} byte dictionary from {} pages of {} workloads into {}",
        dict.len(),
        samples.len(),
        workloads.len(),
        args.out.display()
    );
    Ok(())
}

//! A measurement at start-up: whether compressing a batch on the engines
//! beats compressing it page by page on the caller, on this machine, now.
//!
//! Engines pay off only when the CPUs they run on are otherwise idle and a
//! cross-CPU wake-up costs less than the work handed over; neither is known
//! from the CPU count alone (a loaded machine, a slow wake-up path, a small
//! VM). The probe times the same batch both ways, best of a few rounds in
//! alternation, on pages made up to compress like program memory does.

use super::{Device, DeviceConfig, Job};
use crate::codec::Codec;
use crate::page::PAGE_SIZE;
use std::time::{Duration, Instant};

/// What one batch of pages cost, best of the rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchingProbe {
    /// Compressed page by page on the caller.
    pub sequential: Duration,
    /// Compressed as one batch on the engines (the caller assisting).
    pub batched: Duration,
}

impl BatchingProbe {
    /// batched / sequential: below 1 the engines pay off.
    pub fn ratio(&self) -> f64 {
        self.batched.as_secs_f64() / self.sequential.as_secs_f64().max(1e-9)
    }
}

/// Pages that compress about as well as program memory: words from a small
/// vocabulary, picked by a fixed pseudo-random sequence, with numbers.
fn sample(pages: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 12] = [
        b"alloc ",
        b"buffer ",
        b"0x7f3a",
        b"index ",
        b"\0\0\0\0",
        b"node ",
        b"value=",
        b"struct ",
        b"\xff\xff",
        b"key ",
        b"12345",
        b"return ",
    ];
    let mut out = Vec::with_capacity(pages * PAGE_SIZE);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while out.len() < pages * PAGE_SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % WORDS.len() as u64) as usize]);
        if x.is_multiple_of(5) {
            out.extend_from_slice(&(x as u32).to_le_bytes());
        }
    }
    out.truncate(pages * PAGE_SIZE);
    out
}

/// Times a batch of `pages` pages compressed with `codec` on a device of
/// `engines` engines against the same pages compressed on the caller.
pub fn batching(engines: usize, codec: &dyn Codec, pages: usize) -> std::io::Result<BatchingProbe> {
    let device = Device::new(DeviceConfig::for_runtime(engines))?;
    let src = sample(pages);
    let mut dst = vec![0u8; src.len()];
    let mut best = BatchingProbe {
        sequential: Duration::MAX,
        batched: Duration::MAX,
    };
    for _ in 0..5 {
        let t = Instant::now();
        for (s, d) in src.chunks(PAGE_SIZE).zip(dst.chunks_mut(PAGE_SIZE)) {
            // The outcome does not matter here, only the time it took.
            std::hint::black_box(codec.compress(s, d).ok());
        }
        best.sequential = best.sequential.min(t.elapsed());
        let mut jobs: Vec<Job<'_>> = src
            .chunks(PAGE_SIZE)
            .zip(dst.chunks_mut(PAGE_SIZE))
            .map(|(s, d)| Job::new(s, d))
            .collect();
        let t = Instant::now();
        device.compress_batch(codec, &mut jobs);
        best.batched = best.batched.min(t.elapsed());
    }
    Ok(best)
}

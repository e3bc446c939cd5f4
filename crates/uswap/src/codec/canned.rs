//! `canned`: zstd with a dictionary trained ahead of time on real process
//! memory.
//!
//! This is the software analog of IAA's "canned" mode, where the entropy
//! tables are built once offline instead of per buffer: small buffers (a 4 KiB
//! page) compress better because they need not carry their own statistics.
//! A default dictionary trained on the project's page corpus is built in;
//! `uswap train-dict` trains one from any page dump.

use super::zstd::{compress_with, decompress_with, LEVELS};
use super::{context::new_key, Codec, CodecError, CodecId};
use std::sync::Arc;

/// The built-in dictionary, trained by `uswap train-dict` on every other
/// 64 KiB folio of `corpus/`.
pub static DEFAULT_DICTIONARY: &[u8] = include_bytes!("../../assets/canned.dict");

/// The `canned` codec: zstd at `level` with a fixed dictionary.
#[derive(Debug)]
pub struct Canned {
    key: u64,
    level: i32,
    dictionary: Arc<[u8]>,
}

impl Canned {
    /// `None` for a level zstd does not have.
    pub fn new(dictionary: Vec<u8>, level: i32) -> Option<Canned> {
        LEVELS.contains(&level).then(|| Canned {
            key: new_key(),
            level,
            dictionary: dictionary.into(),
        })
    }

    /// The dictionary this codec compresses with.
    pub fn dictionary(&self) -> &[u8] {
        &self.dictionary
    }
}

impl Codec for Canned {
    fn name(&self) -> &'static str {
        "canned"
    }

    fn id(&self) -> CodecId {
        CodecId::Canned
    }

    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        compress_with(self.key, self.level, &self.dictionary, src, dst)
    }

    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        decompress_with(self.key, self.level, &self.dictionary, src, dst)
    }
}

/// Trains a dictionary of at most `max_size` bytes from `samples` (each one
/// page or folio of real memory). Samples that are a single repeated byte are
/// left out: they teach nothing and the store never compresses them.
pub fn train_dictionary(samples: &[&[u8]], max_size: usize) -> std::io::Result<Vec<u8>> {
    let useful: Vec<&[u8]> = samples
        .iter()
        .copied()
        .filter(|s| super::same_filled(s).is_none())
        .collect();
    let sizes: Vec<usize> = useful.iter().map(|s| s.len()).collect();
    let continuous: Vec<u8> = useful.concat();
    zstd::dict::from_continuous(&continuous, &sizes, max_size)
}

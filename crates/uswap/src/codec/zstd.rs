//! `zstd`: Zstandard at a chosen level (default 1), and the shared context
//! used by `canned` (zstd with a pre-trained dictionary).
//!
//! Frames are written without the content-size field, checksum or dictionary
//! id: the store knows the length and the dictionary, and every byte saved is
//! pool space.

use super::context::{new_key, with_context};
use super::{shrink_capacity, Codec, CodecError, CodecId};
use zstd::bulk::{Compressor, Decompressor};
use zstd::zstd_safe::CParameter;

/// The levels zstd accepts (negative levels are its "fast" modes).
pub(crate) const LEVELS: std::ops::RangeInclusive<i32> = -7..=22;

/// One thread's zstd compression and decompression contexts, with the
/// dictionary (if any) loaded once.
pub struct ZstdContext {
    compressor: Compressor<'static>,
    decompressor: Decompressor<'static>,
}

impl ZstdContext {
    /// Contexts for `level`, with `dictionary` loaded when it is not empty.
    pub fn new(level: i32, dictionary: &[u8]) -> Option<ZstdContext> {
        let mut compressor = Compressor::with_dictionary(level, dictionary).ok()?;
        for parameter in [
            CParameter::ContentSizeFlag(false),
            CParameter::ChecksumFlag(false),
            CParameter::DictIdFlag(false),
        ] {
            compressor.set_parameter(parameter).ok()?;
        }
        let decompressor = Decompressor::with_dictionary(dictionary).ok()?;
        Some(ZstdContext {
            compressor,
            decompressor,
        })
    }

    /// Compresses into at most `capacity` bytes of `dst`.
    pub fn compress(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        capacity: usize,
    ) -> Result<usize, CodecError> {
        let capacity = capacity.min(dst.len());
        self.compressor
            .compress_to_buffer(src, &mut dst[..capacity])
            .map_err(|_| CodecError::DoesNotFit)
    }

    /// Decompresses a frame that must fill `dst` exactly.
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        match self.decompressor.decompress_to_buffer(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            _ => Err(CodecError::Corrupt),
        }
    }
}

/// Compression through this thread's context for `key`.
pub(crate) fn compress_with(
    key: u64,
    level: i32,
    dictionary: &[u8],
    src: &[u8],
    dst: &mut [u8],
) -> Result<usize, CodecError> {
    let capacity = shrink_capacity(src, dst);
    with_context(
        key,
        || ZstdContext::new(level, dictionary),
        |ctx| ctx.compress(src, dst, capacity),
    )
    .ok_or(CodecError::Internal)?
}

/// Decompression through this thread's context for `key`.
pub(crate) fn decompress_with(
    key: u64,
    level: i32,
    dictionary: &[u8],
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), CodecError> {
    with_context(
        key,
        || ZstdContext::new(level, dictionary),
        |ctx| ctx.decompress(src, dst),
    )
    .ok_or(CodecError::Internal)?
}

/// The `zstd` codec.
#[derive(Debug)]
pub struct Zstd {
    key: u64,
    level: i32,
}

impl Zstd {
    /// zstd at `level`; `None` for a level zstd does not have.
    pub fn new(level: i32) -> Option<Zstd> {
        LEVELS.contains(&level).then(|| Zstd {
            key: new_key(),
            level,
        })
    }

    /// The compression level.
    pub fn level(&self) -> i32 {
        self.level
    }
}

impl Codec for Zstd {
    fn name(&self) -> &'static str {
        "zstd"
    }

    fn id(&self) -> CodecId {
        CodecId::Zstd
    }

    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        compress_with(self.key, self.level, &[], src, dst)
    }

    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        decompress_with(self.key, self.level, &[], src, dst)
    }
}

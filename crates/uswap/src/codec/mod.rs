//! The codec layer: compress one buffer into a caller's buffer, decompress
//! into a buffer of known length.
//!
//! Every codec is selected by the name the kernel's crypto API gives it
//! (`lz4`, `lzo`, `lzo-rle`, `zstd`, `deflate`) plus `canned`, zstd with a
//! pre-trained dictionary (the analog of IAA's canned Huffman tables).
//!
//! Two rules hold for every codec, because the store above depends on them:
//!
//! - **Compression only succeeds when it shrinks.** The usable output capacity
//!   is `min(dst.len(), src.len() - 1)`; a result that would not fit is
//!   reported as [`CodecError::DoesNotFit`] as soon as the codec notices, like
//!   QPL's trick of an output buffer of page size - 1. The kernel stores such
//!   pages raw, and so do we.
//! - **Decompression is exact or an error.** A decoder never panics, never
//!   reads or writes out of bounds, and succeeds only when the stream is valid
//!   and decodes to exactly `dst.len()` bytes. Anything else is
//!   [`CodecError::Corrupt`].
//!
//! Codecs keep per-thread contexts (hash tables, zstd contexts, libdeflate
//! state) in `context`, so a call allocates nothing once a thread has
//! warmed up.

pub mod byn;
mod canned;
mod context;
pub mod deflate;
pub mod lz4;
pub mod lzo;
pub mod zstd;

use std::fmt;
use std::sync::Arc;

pub use canned::{train_dictionary, Canned, DEFAULT_DICTIONARY};
pub use deflate::Deflate;
pub use lz4::Lz4;
pub use lzo::Lzo;
pub use zstd::Zstd;

/// Why a codec call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    /// The compressed form would not be smaller than the input (or than the
    /// caller's capacity): store the data raw instead.
    DoesNotFit,
    /// The compressed stream is corrupt or truncated, or does not decode to
    /// exactly the requested length.
    Corrupt,
    /// The codec library failed for a reason that is not about the data
    /// (for example a context could not be created).
    Internal,
    /// The call's parameters are invalid (for by_n: a segment count that is
    /// not a power of two up to 64, or that does not divide the input).
    BadArgument,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::DoesNotFit => {
                f.write_str("compressed data would not be smaller than the input")
            }
            CodecError::Corrupt => f.write_str("corrupt or truncated compressed data"),
            CodecError::Internal => f.write_str("internal codec failure"),
            CodecError::BadArgument => f.write_str("invalid codec parameters"),
        }
    }
}

impl std::error::Error for CodecError {}

/// Stable one-byte identifiers, written into by_n headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CodecId {
    /// [`Lz4`].
    Lz4 = 1,
    /// [`Lzo`] writing plain LZO1X-1 (`lzo`).
    Lzo = 2,
    /// [`Lzo`] writing LZO1X with zero runs (`lzo-rle`).
    LzoRle = 3,
    /// [`Zstd`].
    Zstd = 4,
    /// [`Deflate`].
    Deflate = 5,
    /// [`Canned`].
    Canned = 6,
}

impl CodecId {
    /// The id for a header byte, if it names a codec.
    pub fn from_byte(byte: u8) -> Option<CodecId> {
        Some(match byte {
            1 => CodecId::Lz4,
            2 => CodecId::Lzo,
            3 => CodecId::LzoRle,
            4 => CodecId::Zstd,
            5 => CodecId::Deflate,
            6 => CodecId::Canned,
            _ => return None,
        })
    }
}

/// One compression algorithm with its settings.
///
/// Implementations are cheap to share (`Arc<dyn Codec>`) and thread-safe: each
/// thread gets its own reusable context on first use.
pub trait Codec: Send + Sync + fmt::Debug {
    /// The name this codec is selected by (`"lz4"`, `"zstd"`, ...).
    fn name(&self) -> &'static str;

    /// The identifier written into framed formats.
    fn id(&self) -> CodecId;

    /// Compresses `src` into the front of `dst` and returns the compressed
    /// length, which is always less than `src.len()` and at most `dst.len()`.
    /// Fails with [`CodecError::DoesNotFit`] otherwise.
    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError>;

    /// Decompresses `src`, which must decode to exactly `dst.len()` bytes.
    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError>;
}

/// The names accepted by [`by_name`], in the order the benchmarks print them.
pub const CODEC_NAMES: [&str; 6] = ["lz4", "lzo", "lzo-rle", "zstd", "deflate", "canned"];

/// An unknown codec name or a bad level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCodec(pub String);

impl fmt::Display for UnknownCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown codec {:?}: expected one of {} (zstd, deflate and canned take a level as NAME:LEVEL)",
            self.0,
            CODEC_NAMES.join(", ")
        )
    }
}

impl std::error::Error for UnknownCodec {}

/// Builds a codec from its kernel name, optionally with a level:
/// `"lz4"`, `"lzo"`, `"lzo-rle"`, `"zstd"`, `"zstd:3"`, `"deflate"`,
/// `"deflate:6"`, `"canned"`, `"canned:3"`.
pub fn by_name(spec: &str) -> Result<Arc<dyn Codec>, UnknownCodec> {
    let unknown = || UnknownCodec(spec.to_string());
    let (name, level) = match spec.split_once(':') {
        Some((name, level)) => (name, Some(level.parse::<i32>().map_err(|_| unknown())?)),
        None => (spec, None),
    };
    let codec: Arc<dyn Codec> = match (name, level) {
        ("lz4", None) => Arc::new(Lz4::new()),
        ("lzo", None) => Arc::new(Lzo::new()),
        ("lzo-rle", None) => Arc::new(Lzo::rle()),
        ("zstd", level) => Arc::new(Zstd::new(level.unwrap_or(1)).ok_or_else(unknown)?),
        ("deflate", level) => Arc::new(Deflate::new(level.unwrap_or(1)).ok_or_else(unknown)?),
        ("canned", level) => Arc::new(
            Canned::new(DEFAULT_DICTIONARY.to_vec(), level.unwrap_or(1)).ok_or_else(unknown)?,
        ),
        _ => return Err(unknown()),
    };
    Ok(codec)
}

/// The capacity a compressor may use: the caller's buffer, but never as much
/// as the input (a result that does not shrink is useless).
pub(crate) fn shrink_capacity(src: &[u8], dst: &[u8]) -> usize {
    dst.len().min(src.len().saturating_sub(1))
}

/// True when every byte of `page` equals its first byte (zero pages and
/// same-filled pages, which the store keeps without compressing).
pub fn same_filled(page: &[u8]) -> Option<u8> {
    let first = *page.first()?;
    let word = u64::from_ne_bytes([first; 8]);
    let chunks = page.chunks_exact(8);
    let tail = chunks.remainder();
    let words_match = chunks
        .map(|c| u64::from_ne_bytes(c.try_into().expect("chunks_exact(8) yields 8 bytes")))
        .all(|w| w == word);
    (words_match && tail.iter().all(|&b| b == first)).then_some(first)
}

//! `lzo` (LZO1X-1) and `lzo-rle` (LZO1X with the zero-run extension, the
//! kernel's default zram/zswap codec), written from the stream format that
//! the kernel documents in `Documentation/staging/lzo.rst`.
//!
//! # Stream format
//!
//! A stream is a sequence of instructions. Each match instruction carries, in
//! its last two bits `S`, the number (0..3) of literals that follow it; longer
//! literal runs get an instruction of their own. Lengths that do not fit in
//! their bit field continue in extra bytes: each zero byte adds 255, the
//! first non-zero byte ends the length.
//!
//! | first byte | meaning |
//! |---|---|
//! | `0000LLLL` after a match with `S = 0` | literal run of `3 + L` bytes (`L = 0`: extended) |
//! | `0001HLLL` + LE16 `DDDDDDDD DDDDDDSS` | match of `2 + L` bytes at distance `16384 + H·16384 + D` (M4) |
//! | `001LLLLL` + LE16 | match of `2 + L` bytes at distance `D + 1` ≤ 16 KiB (M3) |
//! | `01LDDDSS` / `1LLDDDSS` + byte `H` | match of 3..8 bytes at distance `(H << 3) + D + 1` ≤ 2 KiB (M2) |
//!
//! The very first byte may instead be `17 + n` for a leading run of `n`
//! literals. The stream ends with `0x11 0x00 0x00` (an M4 with distance
//! 16384). We never emit the two short forms that `lzo.rst` also lists
//! (2- and 3-byte matches right after literals); the decoder accepts them.
//!
//! **lzo-rle** (bitstream version 1) starts with the two bytes `17, 1` and adds
//! one instruction: `00011RRR 111111SS 11111111 XXXXXXXX` is a run of
//! `4 + (X << 3 | R)` zero bytes. Because that pattern is an M4 with
//! distance 0xbfff, a version-1 compressor never emits that distance, nor an
//! extended M4 whose first length byte could read as `0xfc..0xff` followed by
//! `0xff`.

mod compress;
mod decompress;

pub use compress::{compress, LzoTable};
pub use decompress::decompress;

use super::context::{new_key, with_context};
use super::{shrink_capacity, Codec, CodecError, CodecId};

/// Which LZO bitstream to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Plain LZO1X-1.
    Lzo1x,
    /// LZO1X with runs of zeros encoded as runs (the kernel's `lzo-rle`).
    Rle,
}

/// The `lzo` (LZO1X-1) and `lzo-rle` codecs: one type, two bitstreams.
#[derive(Debug)]
pub struct Lzo {
    key: u64,
    version: Version,
}

impl Lzo {
    /// Plain LZO1X-1 (`lzo`).
    pub fn new() -> Lzo {
        Lzo {
            key: new_key(),
            version: Version::Lzo1x,
        }
    }

    /// LZO1X with zero runs (`lzo-rle`, the kernel's default).
    pub fn rle() -> Lzo {
        Lzo {
            key: new_key(),
            version: Version::Rle,
        }
    }
}

impl Default for Lzo {
    fn default() -> Self {
        Lzo::new()
    }
}

impl Codec for Lzo {
    fn name(&self) -> &'static str {
        match self.version {
            Version::Lzo1x => "lzo",
            Version::Rle => "lzo-rle",
        }
    }

    fn id(&self) -> CodecId {
        match self.version {
            Version::Lzo1x => CodecId::Lzo,
            Version::Rle => CodecId::LzoRle,
        }
    }

    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let capacity = shrink_capacity(src, dst);
        let version = self.version;
        with_context(
            self.key,
            || Some(LzoTable::new()),
            |table| compress(src, &mut dst[..capacity], version, table),
        )
        .ok_or(CodecError::Internal)?
        .ok_or(CodecError::DoesNotFit)
    }

    /// Both versions decode with one decoder (a version-1 stream announces
    /// itself in its first two bytes), as in the kernel.
    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        decompress(src, dst).map_err(|_| CodecError::Corrupt)
    }
}

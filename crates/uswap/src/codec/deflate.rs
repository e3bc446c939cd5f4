//! `deflate`: raw DEFLATE (no zlib or gzip wrapper) through libdeflate, the
//! format IAA implements in hardware.

use super::context::{new_key, with_context};
use super::{shrink_capacity, Codec, CodecError, CodecId};
use libdeflater::{CompressionLvl, Compressor, Decompressor};

/// One thread's libdeflate state.
pub struct DeflateContext {
    compressor: Compressor,
    decompressor: Decompressor,
}

impl DeflateContext {
    /// A compressor at `level` (0..=12) and a decompressor; `None` for
    /// another level.
    pub fn new(level: i32) -> Option<DeflateContext> {
        let level = CompressionLvl::new(level).ok()?;
        Some(DeflateContext {
            compressor: Compressor::new(level),
            decompressor: Decompressor::new(),
        })
    }

    /// Compresses `src` into at most `capacity` bytes at the front of `dst`
    /// and returns the compressed length, or [`CodecError::DoesNotFit`].
    pub fn compress(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        capacity: usize,
    ) -> Result<usize, CodecError> {
        let capacity = capacity.min(dst.len());
        self.compressor
            .deflate_compress(src, &mut dst[..capacity])
            .map_err(|_| CodecError::DoesNotFit)
    }

    /// Decompresses `src`, which must decode to exactly `dst.len()` bytes;
    /// anything else is [`CodecError::Corrupt`].
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        match self.decompressor.deflate_decompress(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            _ => Err(CodecError::Corrupt),
        }
    }
}

/// The `deflate` codec.
#[derive(Debug)]
pub struct Deflate {
    key: u64,
    level: i32,
}

impl Deflate {
    /// libdeflate at `level` (0..=12); `None` for another level.
    pub fn new(level: i32) -> Option<Deflate> {
        (0..=12).contains(&level).then(|| Deflate {
            key: new_key(),
            level,
        })
    }

    fn with<R>(
        &self,
        f: impl FnOnce(&mut DeflateContext) -> Result<R, CodecError>,
    ) -> Result<R, CodecError> {
        with_context(self.key, || DeflateContext::new(self.level), f).ok_or(CodecError::Internal)?
    }
}

impl Codec for Deflate {
    fn name(&self) -> &'static str {
        "deflate"
    }

    fn id(&self) -> CodecId {
        CodecId::Deflate
    }

    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let capacity = shrink_capacity(src, dst);
        self.with(|ctx| ctx.compress(src, dst, capacity))
    }

    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        self.with(|ctx| ctx.decompress(src, dst))
    }
}

//! `lz4`: liblz4's fast block compressor (the kernel's `lz4`).
//!
//! liblz4 is called directly (through `lz4-sys`, which builds the bundled C
//! library) because its compressor honours an output capacity and gives up as
//! soon as the output would not fit, which is what lets an incompressible
//! page fail fast. The per-thread context is liblz4's external state, reset
//! cheaply between calls (`_fastReset`).

use super::context::{new_key, with_context};
use super::{shrink_capacity, Codec, CodecError, CodecId};
use std::os::raw::{c_char, c_int, c_void};

// `lz4-sys` links liblz4 but does not declare these two entry points; they
// are part of liblz4's stable static-linking API.
extern "C" {
    fn LZ4_sizeofState() -> c_int;
    fn LZ4_initStream(buffer: *mut c_void, size: usize) -> *mut c_void;
    fn LZ4_compress_fast_extState_fastReset(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
}

/// liblz4's compression state, 8-byte aligned as the library requires.
pub struct Lz4State {
    words: Vec<u64>,
}

impl Lz4State {
    /// A freshly initialised state.
    pub fn new() -> Lz4State {
        // SAFETY: a pure query of a constant.
        let size = unsafe { LZ4_sizeofState() } as usize;
        let mut words = vec![0u64; size.div_ceil(8)];
        // SAFETY: `words` is a writable, 8-byte aligned buffer of at least
        // `size` bytes, which is what LZ4_initStream requires.
        let ok = unsafe { LZ4_initStream(words.as_mut_ptr().cast(), size) };
        assert!(
            !ok.is_null(),
            "LZ4_initStream rejected a correctly sized buffer"
        );
        Lz4State { words }
    }

    /// Compresses `src` into at most `capacity` bytes of `dst`; `None` when it
    /// does not fit.
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8], capacity: usize) -> Option<usize> {
        let capacity = capacity.min(dst.len());
        let src_len = c_int::try_from(src.len()).ok()?;
        let capacity = c_int::try_from(capacity).unwrap_or(c_int::MAX);
        // SAFETY: the state was initialised by LZ4_initStream; `src` is
        // readable for `src_len` bytes and `dst` writable for `capacity`
        // bytes; liblz4 writes nothing past `capacity`.
        let n = unsafe {
            LZ4_compress_fast_extState_fastReset(
                self.words.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src_len,
                capacity,
                1,
            )
        };
        (n > 0).then_some(n as usize)
    }
}

impl Default for Lz4State {
    fn default() -> Self {
        Lz4State::new()
    }
}

/// Decompresses an lz4 block that must fill `dst` exactly.
pub fn lz4_decompress(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let src_len = c_int::try_from(src.len()).map_err(|_| CodecError::Corrupt)?;
    let dst_len = c_int::try_from(dst.len()).map_err(|_| CodecError::Corrupt)?;
    // SAFETY: LZ4_decompress_safe never reads past `src_len` bytes of `src`
    // nor writes past `dst_len` bytes of `dst`, whatever the input.
    let n = unsafe {
        lz4_sys::LZ4_decompress_safe(
            src.as_ptr().cast(),
            dst.as_mut_ptr().cast(),
            src_len,
            dst_len,
        )
    };
    if n == dst_len {
        Ok(())
    } else {
        Err(CodecError::Corrupt)
    }
}

/// The `lz4` codec.
#[derive(Debug)]
pub struct Lz4 {
    key: u64,
}

impl Lz4 {
    /// The `lz4` codec at liblz4's default acceleration.
    pub fn new() -> Lz4 {
        Lz4 { key: new_key() }
    }
}

impl Default for Lz4 {
    fn default() -> Self {
        Lz4::new()
    }
}

impl Codec for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }

    fn id(&self) -> CodecId {
        CodecId::Lz4
    }

    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let capacity = shrink_capacity(src, dst);
        with_context(
            self.key,
            || Some(Lz4State::new()),
            |state| state.compress(src, dst, capacity),
        )
        .ok_or(CodecError::Internal)?
        .ok_or(CodecError::DoesNotFit)
    }

    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        lz4_decompress(src, dst)
    }
}

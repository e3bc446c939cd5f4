//! The LZO1X decoder for both bitstream versions (`lzo` and `lzo-rle`).
//!
//! Written against untrusted input. Every length the stream gives is checked
//! against what is left of the input and of the output before anything is
//! read or written, every match distance against what is already written,
//! and the stream must end with the end marker exactly at the end of the
//! input and of the output.
//!
//! # Why raw copies
//!
//! Most instructions move a handful of bytes, so per-step bounds checks and
//! exact-length copies cost more than the bytes themselves. Where at least
//! 16 bytes are left on both sides, copies go in whole 4-, 8- or 16-byte
//! words with one check per instruction: the words may run past the copy's
//! end, into bytes later instructions write over (a stream that fills the
//! output exactly always does), but never past the buffers. Against the
//! same decoder with checked slice copies, in alternate runs of `uswap bench
//! codecs --codecs lzo-rle --folios 4k,64k --rounds 2`, the 64 KiB p50 went
//! from 82 and 79 us to 57 and 54 us (4 KiB: 4.9 and 5.3 us to 4.0 and
//! 3.6 us).
//!
//! # Why a short match and its literals are one store
//!
//! A load that spans bytes of two recent stores cannot take them from the
//! store buffer: it waits until both reach the cache, a dozen cycles. A
//! short match written as a word, then its trailing literals as another word
//! over its end, makes exactly that load for the next match at distance 8
//! (a run of 64-bit counters encodes as one such M2 and one literal per
//! word: 46 us per 64 KiB against 29 us for liblzo2 on the same streams).
//! So an M2 match and the 0..3 literals after it are composed in a register
//! and written as one word where they fit in eight bytes ([`Decoder::short_match`]):
//! 26 us on those streams, and no change on the corpus (41 us).
//!
//! Matches reaching 16 bytes back or more are copied 16 bytes at a time,
//! half the loads and stores of 8-byte words: in alternate runs of `uswap
//! bench codecs --codecs lzo-rle --folios 64k`, the 64 KiB p50 went from
//! 54, 43 and 42 us to 39, 38 and 39 us.

use super::compress::{MIN_ZERO_RUN, RLE_VERSION, VERSION_MARKER};
use std::ptr;

/// Why a stream was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LzoError {
    /// The stream ended in the middle of an instruction.
    InputOverrun,
    /// The stream decodes to more bytes than the output holds.
    OutputOverrun,
    /// A match refers to bytes before the start of the output.
    LookbehindOverrun,
    /// The end marker is malformed, or bytes follow it.
    BadEnd,
    /// The stream ended before filling the output.
    ShortOutput,
    /// A version header names a bitstream version we do not know.
    UnknownVersion,
}

/// How far past the end of a copy a word copy may write (and read).
const SLOP: usize = 16;

/// Where decoding stands: `ip` indexes the input, `op` the output.
///
/// Invariant: `ip <= src.len()` and `op <= dst.len()`; every unchecked
/// access below is justified against it and a check right before it.
struct Decoder<'a> {
    src: &'a [u8],
    dst: &'a mut [u8],
    ip: usize,
    op: usize,
}

impl Decoder<'_> {
    fn input_left(&self) -> usize {
        self.src.len() - self.ip
    }

    fn output_left(&self) -> usize {
        self.dst.len() - self.op
    }

    fn byte(&mut self) -> Result<usize, LzoError> {
        let b = *self.src.get(self.ip).ok_or(LzoError::InputOverrun)?;
        self.ip += 1;
        Ok(b as usize)
    }

    fn peek_le16(&self) -> Result<usize, LzoError> {
        match self.src.get(self.ip..self.ip + 2) {
            Some(b) => Ok(b[0] as usize | (b[1] as usize) << 8),
            None => Err(LzoError::InputOverrun),
        }
    }

    fn le16(&mut self) -> Result<usize, LzoError> {
        let v = self.peek_le16()?;
        self.ip += 2;
        Ok(v)
    }

    /// An extended length: each zero byte adds 255, the first non-zero byte
    /// is added and ends it.
    fn extended_length(&mut self) -> Result<usize, LzoError> {
        let mut zeros = 0usize;
        loop {
            match self.byte()? {
                0 => zeros += 1,
                last => return Ok(zeros * 255 + last),
            }
        }
    }

    /// Copies a run of `n` literals from the input to the output.
    fn literals(&mut self, n: usize) -> Result<(), LzoError> {
        if n > self.input_left() {
            return Err(LzoError::InputOverrun);
        }
        if n > self.output_left() {
            return Err(LzoError::OutputOverrun);
        }
        if n + SLOP <= self.input_left() && n + SLOP <= self.output_left() {
            let mut done = 0;
            while done < n {
                // SAFETY: `done < n`, so the 16 bytes at `ip + done` and at
                // `op + done` end before `ip + n + SLOP` and `op + n + SLOP`,
                // which the check above keeps inside `src` and `dst`; the two
                // are distinct slices, so they do not overlap.
                unsafe {
                    ptr::copy_nonoverlapping(
                        self.src.as_ptr().add(self.ip + done),
                        self.dst.as_mut_ptr().add(self.op + done),
                        16,
                    );
                }
                done += 16;
            }
        } else {
            self.dst[self.op..self.op + n].copy_from_slice(&self.src[self.ip..self.ip + n]);
        }
        self.ip += n;
        self.op += n;
        Ok(())
    }

    /// The 0..3 literals after a match.
    fn trailing_literals(&mut self, n: usize) -> Result<(), LzoError> {
        if self.input_left() >= 4 && self.output_left() >= 4 {
            // SAFETY: four bytes are left at `ip` in `src` and at `op` in
            // `dst` (checked above), distinct slices; `n <= 3`.
            unsafe {
                ptr::copy_nonoverlapping(
                    self.src.as_ptr().add(self.ip),
                    self.dst.as_mut_ptr().add(self.op),
                    4,
                );
            }
            self.ip += n;
            self.op += n;
            Ok(())
        } else {
            self.literals(n)
        }
    }

    fn zeros(&mut self, n: usize) -> Result<(), LzoError> {
        if n > self.output_left() {
            return Err(LzoError::OutputOverrun);
        }
        self.dst[self.op..self.op + n].fill(0);
        self.op += n;
        Ok(())
    }

    /// An M2 match (`len <= 8`) and the `next` (0..3) literals after it,
    /// written together where there is room on both sides and the match
    /// reaches at least a word back; returns false, having done nothing,
    /// where not.
    fn short_match(&mut self, distance: usize, len: usize, next: usize) -> bool {
        debug_assert!((3..=8).contains(&len) && next <= 3);
        if distance < 8 || distance > self.op || self.output_left() < 16 || self.input_left() < 4 {
            return false;
        }
        let base = self.dst.as_mut_ptr();
        // SAFETY: the word read ends at `op - distance + 8 <= op`, inside
        // `dst` and before anything written here; the literal word is inside
        // `src` (four bytes left). The writes end by `op + 8` or, for the
        // second form, `op + len + 4 <= op + 12`, both inside `dst` (16 bytes
        // left). Bytes written past `op + len + next` are written over by
        // the instructions that follow, as in `literals`.
        // The words are taken little-endian, so that the first bytes in
        // memory are the low ones on any machine.
        unsafe {
            let at = base.add(self.op - distance) as *const u64;
            let matched = u64::from_le(ptr::read_unaligned(at));
            let at = self.src.as_ptr().add(self.ip) as *const u32;
            let literals = u32::from_le(ptr::read_unaligned(at));
            let to = base.add(self.op);
            if len + next <= 8 {
                let keep = u64::MAX >> (64 - 8 * len);
                // Two shifts: one of 64 bits (len 8) would overflow.
                let after = ((literals as u64) << (4 * len)) << (4 * len);
                ptr::write_unaligned(to as *mut u64, ((matched & keep) | after).to_le());
            } else {
                ptr::write_unaligned(to as *mut u64, matched.to_le());
                ptr::write_unaligned(to.add(len) as *mut u32, literals.to_le());
            }
        }
        self.op += len + next;
        self.ip += next;
        true
    }

    /// Copies `len` bytes from `distance` back; overlapping copies repeat the
    /// pattern, as LZ77 requires.
    fn copy_match(&mut self, distance: usize, len: usize) -> Result<(), LzoError> {
        if distance == 0 || distance > self.op {
            return Err(LzoError::LookbehindOverrun);
        }
        if len > self.output_left() {
            return Err(LzoError::OutputOverrun);
        }
        let start = self.op - distance;
        if distance >= 16 && len + SLOP <= self.output_left() {
            // SAFETY: `start + 16 <= op` (`distance >= 16`), and `op + len +
            // SLOP` is inside `dst` (checked above), SLOP being 16.
            unsafe { copy_words::<u128>(self.dst, start, self.op, len) };
        } else if distance >= 8 && len + SLOP <= self.output_left() {
            // SAFETY: `start + 8 <= op`, and `op + len + SLOP` is inside
            // `dst` (checked above).
            unsafe { copy_words::<u64>(self.dst, start, self.op, len) };
        } else if distance == 1 {
            let b = self.dst[start];
            self.dst[self.op..self.op + len].fill(b);
        } else {
            // The bytes from `start` to the write position are the pattern
            // repeated, so each step may copy everything written so far.
            let mut done = 0;
            while done < len {
                let chunk = (self.op + done - start).min(len - done);
                self.dst.copy_within(start..start + chunk, self.op + done);
                done += chunk;
            }
        }
        self.op += len;
        Ok(())
    }
}

/// Copies `len` bytes of `dst` from `from` to `to` in whole words of `W`:
/// the last word may write up to `size_of::<W>() - 1` bytes past `to +
/// len`, which later instructions write over.
///
/// # Safety
/// `from + size_of::<W>() <= to` (each word read ends where the next write
/// begins, so it reads only bytes already final and never overlaps the
/// write), and `to + len + size_of::<W>() <= dst.len()`.
unsafe fn copy_words<W: Copy>(dst: &mut [u8], from: usize, to: usize, len: usize) {
    let step = std::mem::size_of::<W>();
    debug_assert!(from + step <= to && to + len + step <= dst.len());
    let base = dst.as_mut_ptr();
    let mut done = 0;
    while done < len {
        // SAFETY: `done < len`, so both words end before `to + len + step`,
        // inside `dst` (the caller's promise), and the read ends by `to +
        // done`, where the write begins.
        unsafe {
            let word = ptr::read_unaligned(base.add(from + done) as *const W);
            ptr::write_unaligned(base.add(to + done) as *mut W, word);
        }
        done += step;
    }
}

/// Decodes `src` into exactly `dst.len()` bytes.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), LzoError> {
    if src.len() < 3 {
        return Err(LzoError::InputOverrun);
    }
    let rle = src.len() >= 5 && src[0] == VERSION_MARKER;
    let mut d = Decoder {
        src,
        dst,
        ip: 0,
        op: 0,
    };
    if rle {
        if src[1] != RLE_VERSION {
            return Err(LzoError::UnknownVersion);
        }
        d.ip = 2;
    }

    // `state`: literals copied by the previous instruction (4 = four or more).
    let mut state;
    let first = *src.get(d.ip).ok_or(LzoError::InputOverrun)? as usize;
    if first > 17 {
        d.ip += 1;
        let n = first - 17;
        d.literals(n)?;
        state = n.min(4);
    } else {
        state = 0;
    }

    loop {
        let t = d.byte()?;
        let (distance, len, next);
        if t < 16 {
            if state == 0 {
                let n = if t == 0 { 15 + d.extended_length()? } else { t };
                d.literals(n + 3)?;
                state = 4;
                continue;
            }
            let h = d.byte()?;
            next = t & 3;
            if state < 4 {
                distance = 1 + (t >> 2) + (h << 2);
                len = 2;
            } else {
                distance = 2049 + (t >> 2) + (h << 2);
                len = 3;
            }
        } else if t >= 64 {
            let h = d.byte()?;
            distance = 1 + ((t >> 2) & 7) + (h << 3);
            len = (t >> 5) + 1;
            next = t & 3;
            if d.short_match(distance, len, next) {
                state = next;
                continue;
            }
        } else if t >= 32 {
            let short = t & 31;
            len = 2 + if short == 0 {
                31 + d.extended_length()?
            } else {
                short
            };
            let v = d.le16()?;
            distance = 1 + (v >> 2);
            next = v & 3;
        } else {
            let v = d.peek_le16()?;
            if rle && (v & 0xfffc) == 0xfffc && (t & 0xf8) == 0x18 {
                d.ip += 2;
                let high = d.byte()?;
                d.zeros(MIN_ZERO_RUN + ((t & 7) | high << 3))?;
                next = v & 3;
                d.trailing_literals(next)?;
                state = next;
                continue;
            }
            let short = t & 7;
            len = 2 + if short == 0 {
                7 + d.extended_length()?
            } else {
                short
            };
            let v = d.le16()?;
            let far = ((t & 8) << 11) + (v >> 2);
            next = v & 3;
            if far == 0 {
                if len != 3 || next != 0 || d.ip != src.len() {
                    return Err(LzoError::BadEnd);
                }
                return if d.op == d.dst.len() {
                    Ok(())
                } else {
                    Err(LzoError::ShortOutput)
                };
            }
            distance = far + 16384;
        }
        d.copy_match(distance, len)?;
        d.trailing_literals(next)?;
        state = next;
    }
}

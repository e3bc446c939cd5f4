//! The LZO1X decoder for both bitstream versions (`lzo` and `lzo-rle`).
//!
//! Written against untrusted input: every read and write is bounds-checked
//! through slices, every length is checked against the space left before it
//! is used, and the stream must end with the end marker exactly at the end
//! of the input and of the output.

use super::compress::{MIN_ZERO_RUN, RLE_VERSION, VERSION_MARKER};

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

struct Input<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> Result<usize, LzoError> {
        let b = *self.bytes.get(self.pos).ok_or(LzoError::InputOverrun)?;
        self.pos += 1;
        Ok(b as usize)
    }

    fn peek_le16(&self) -> Result<usize, LzoError> {
        match self.bytes.get(self.pos..self.pos + 2) {
            Some(b) => Ok(b[0] as usize | (b[1] as usize) << 8),
            None => Err(LzoError::InputOverrun),
        }
    }

    fn le16(&mut self) -> Result<usize, LzoError> {
        let v = self.peek_le16()?;
        self.pos += 2;
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

    fn take(&mut self, n: usize) -> Result<&[u8], LzoError> {
        let end = self.pos.checked_add(n).ok_or(LzoError::InputOverrun)?;
        let run = self
            .bytes
            .get(self.pos..end)
            .ok_or(LzoError::InputOverrun)?;
        self.pos = end;
        Ok(run)
    }
}

struct Output<'a> {
    bytes: &'a mut [u8],
    pos: usize,
}

impl Output<'_> {
    fn room(&self, n: usize) -> Result<(), LzoError> {
        if n <= self.bytes.len() - self.pos {
            Ok(())
        } else {
            Err(LzoError::OutputOverrun)
        }
    }

    fn literals(&mut self, input: &mut Input<'_>, n: usize) -> Result<(), LzoError> {
        // Most runs are short: with 16 bytes to spare on both sides, copy 16
        // at once. The bytes past the run are garbage only until the next
        // instructions write over them, which a stream that fills the output
        // exactly always does.
        if n <= 16 && self.pos + 16 <= self.bytes.len() && input.pos + 16 <= input.bytes.len() {
            let run: [u8; 16] = input.bytes[input.pos..input.pos + 16]
                .try_into()
                .expect("16 bytes");
            self.bytes[self.pos..self.pos + 16].copy_from_slice(&run);
            self.pos += n;
            input.pos += n;
            return Ok(());
        }
        self.room(n)?;
        let run = input.take(n)?;
        self.bytes[self.pos..self.pos + n].copy_from_slice(run);
        self.pos += n;
        Ok(())
    }

    fn zeros(&mut self, n: usize) -> Result<(), LzoError> {
        self.room(n)?;
        self.bytes[self.pos..self.pos + n].fill(0);
        self.pos += n;
        Ok(())
    }

    /// Copies `len` bytes from `distance` back; overlapping copies repeat the
    /// pattern, as LZ77 requires.
    fn copy_match(&mut self, distance: usize, len: usize) -> Result<(), LzoError> {
        if distance == 0 || distance > self.pos {
            return Err(LzoError::LookbehindOverrun);
        }
        self.room(len)?;
        let start = self.pos - distance;
        if distance >= 8 && self.pos + len + 8 <= self.bytes.len() {
            // Eight bytes a step: each read lies wholly before its write
            // (distance >= 8), so it sees only final bytes; the last step may
            // write up to seven bytes past the match, which later
            // instructions overwrite (as for literals).
            let (mut from, mut to) = (start, self.pos);
            let end = self.pos + len;
            while to < end {
                let word: [u8; 8] = self.bytes[from..from + 8].try_into().expect("8 bytes");
                self.bytes[to..to + 8].copy_from_slice(&word);
                from += 8;
                to += 8;
            }
        } else if distance == 1 {
            let b = self.bytes[start];
            self.bytes[self.pos..self.pos + len].fill(b);
        } else {
            // The bytes from `start` to the write position are the pattern
            // repeated, so each step may copy everything written so far.
            let mut done = 0;
            while done < len {
                let chunk = (self.pos + done - start).min(len - done);
                self.bytes
                    .copy_within(start..start + chunk, self.pos + done);
                done += chunk;
            }
        }
        self.pos += len;
        Ok(())
    }
}

/// Decodes `src` into exactly `dst.len()` bytes.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), LzoError> {
    if src.len() < 3 {
        return Err(LzoError::InputOverrun);
    }
    let mut input = Input { bytes: src, pos: 0 };
    let mut output = Output { bytes: dst, pos: 0 };

    let rle = src.len() >= 5 && src[0] == VERSION_MARKER;
    if rle {
        if src[1] != RLE_VERSION {
            return Err(LzoError::UnknownVersion);
        }
        input.pos = 2;
    }

    // `state`: literals copied by the previous instruction (4 = four or more).
    let mut state;
    let first = *src.get(input.pos).ok_or(LzoError::InputOverrun)? as usize;
    if first > 17 {
        input.pos += 1;
        let n = first - 17;
        output.literals(&mut input, n)?;
        state = n.min(4);
    } else {
        state = 0;
    }

    loop {
        let t = input.byte()?;
        let (distance, len, next);
        if t < 16 {
            if state == 0 {
                let n = if t == 0 {
                    15 + input.extended_length()?
                } else {
                    t
                };
                output.literals(&mut input, n + 3)?;
                state = 4;
                continue;
            }
            let h = input.byte()?;
            next = t & 3;
            if state < 4 {
                distance = 1 + (t >> 2) + (h << 2);
                len = 2;
            } else {
                distance = 2049 + (t >> 2) + (h << 2);
                len = 3;
            }
        } else if t >= 64 {
            let h = input.byte()?;
            distance = 1 + ((t >> 2) & 7) + (h << 3);
            len = (t >> 5) + 1;
            next = t & 3;
        } else if t >= 32 {
            let short = t & 31;
            len = 2 + if short == 0 {
                31 + input.extended_length()?
            } else {
                short
            };
            let v = input.le16()?;
            distance = 1 + (v >> 2);
            next = v & 3;
        } else {
            let v = input.peek_le16()?;
            if rle && (v & 0xfffc) == 0xfffc && (t & 0xf8) == 0x18 {
                input.pos += 2;
                let high = input.byte()?;
                output.zeros(MIN_ZERO_RUN + ((t & 7) | high << 3))?;
                next = v & 3;
                output.literals(&mut input, next)?;
                state = next;
                continue;
            }
            let short = t & 7;
            len = 2 + if short == 0 {
                7 + input.extended_length()?
            } else {
                short
            };
            let v = input.le16()?;
            let far = ((t & 8) << 11) + (v >> 2);
            next = v & 3;
            if far == 0 {
                if len != 3 || next != 0 || input.pos != src.len() {
                    return Err(LzoError::BadEnd);
                }
                return if output.pos == output.bytes.len() {
                    Ok(())
                } else {
                    Err(LzoError::ShortOutput)
                };
            }
            distance = far + 16384;
        }
        output.copy_match(distance, len)?;
        output.literals(&mut input, next)?;
        state = next;
    }
}

//! The LZO1X-1 compressor, with the zero-run extension for `lzo-rle`.
//!
//! A greedy LZ77 parse: a hash of the next four bytes finds the last position
//! that had the same hash; if the four bytes really match, the match is
//! extended and emitted, otherwise the position advances, faster and faster
//! through data that does not match (as LZO1X-1 does). Zero runs are checked
//! first in `lzo-rle` mode, since zero-filled stretches are the common case in
//! swapped memory.
//!
//! Every write is checked against the caller's capacity, so an incompressible
//! input is given up on as soon as the output is full.

use super::Version;

/// First byte of a versioned (lzo-rle) stream.
pub(crate) const VERSION_MARKER: u8 = 17;
/// Bitstream version of lzo-rle.
pub(crate) const RLE_VERSION: u8 = 1;
/// Shortest zero run the RLE instruction encodes.
pub(crate) const MIN_ZERO_RUN: usize = 4;
/// Longest zero run one RLE instruction encodes (11 bits of length).
const MAX_ZERO_RUN: usize = MIN_ZERO_RUN + 2047;

/// Largest match distance of each instruction.
const M2_MAX_DISTANCE: usize = 2048;
const M3_MAX_DISTANCE: usize = 16384;
const M4_MAX_DISTANCE: usize = 0xbfff;
/// In lzo-rle, distance 0xbfff is the RLE instruction's signature.
const M4_MAX_DISTANCE_RLE: usize = 0xbffe;
const M2_MAX_LEN: usize = 8;
const M3_MAX_SHORT_LEN: usize = 33;
const M4_MAX_SHORT_LEN: usize = 9;

const HASH_BITS: u32 = 14;
const END_MARKER: [u8; 3] = [17, 0, 0];

/// The compressor's dictionary: for each hash of four bytes, the last position
/// seen. Positions are stored offset by a per-call base, so entries from
/// earlier calls read as empty without clearing the table each call.
pub struct LzoTable {
    slots: Vec<u32>,
    base: u32,
}

impl LzoTable {
    /// An empty table.
    pub fn new() -> LzoTable {
        LzoTable {
            slots: vec![0; 1 << HASH_BITS],
            base: 1,
        }
    }

    /// Starts a call over `len` bytes: every older entry is below the new base.
    fn begin(&mut self, len: usize) -> u32 {
        let span = u32::try_from(len).unwrap_or(u32::MAX).saturating_add(1);
        match self
            .base
            .checked_add(span)
            .and_then(|end| end.checked_add(span))
        {
            Some(_) => {}
            None => {
                self.slots.fill(0);
                self.base = 1;
            }
        }
        let base = self.base;
        self.base += span;
        base
    }
}

impl Default for LzoTable {
    fn default() -> Self {
        LzoTable::new()
    }
}

fn hash(v: u32) -> usize {
    (v.wrapping_mul(0x1824_429d) >> (32 - HASH_BITS)) as usize
}

fn read_u32(src: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(src[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(src: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(src[at..at + 8].try_into().expect("8 bytes"))
}

/// How many bytes from `a` and from `b` (`a < b`) agree, up to the end of `src`.
fn common_length(src: &[u8], a: usize, b: usize) -> usize {
    let max = src.len() - b;
    let mut len = 0;
    while len + 8 <= max {
        let diff = read_u64(src, a + len) ^ read_u64(src, b + len);
        if diff != 0 {
            return len + (diff.trailing_zeros() / 8) as usize;
        }
        len += 8;
    }
    while len < max && src[a + len] == src[b + len] {
        len += 1;
    }
    len
}

/// The output being written, with what the next literal run needs to know.
struct Out<'a> {
    buf: &'a mut [u8],
    pos: usize,
    /// Where the instructions start (after the version header).
    start: usize,
    /// The byte whose low two bits say how many literals follow the last
    /// instruction.
    state_at: usize,
}

impl Out<'_> {
    fn byte(&mut self, b: u8) -> Option<()> {
        *self.buf.get_mut(self.pos)? = b;
        self.pos += 1;
        Some(())
    }

    fn bytes(&mut self, run: &[u8]) -> Option<()> {
        self.buf
            .get_mut(self.pos..self.pos + run.len())?
            .copy_from_slice(run);
        self.pos += run.len();
        Some(())
    }

    /// The tail of an extended length (`rest >= 1`): 255 per zero byte, then
    /// the remainder.
    fn extension(&mut self, mut rest: usize) -> Option<()> {
        while rest > 255 {
            self.byte(0)?;
            rest -= 255;
        }
        self.byte(rest as u8)
    }

    fn le16_with_state(&mut self, value: usize) -> Option<()> {
        self.state_at = self.pos;
        self.bytes(&[(value << 2) as u8, (value >> 6) as u8])
    }

    fn literals(&mut self, run: &[u8]) -> Option<()> {
        let n = run.len();
        if n == 0 {
            return Some(());
        }
        if self.pos == self.start && n <= 238 {
            self.byte(17 + n as u8)?;
        } else if n <= 3 && self.pos != self.start {
            *self.buf.get_mut(self.state_at)? |= n as u8;
        } else if n <= 18 {
            self.byte((n - 3) as u8)?;
        } else {
            self.byte(0)?;
            self.extension(n - 18)?;
        }
        self.bytes(run)
    }

    fn matched(&mut self, distance: usize, len: usize) -> Option<()> {
        if len <= M2_MAX_LEN && distance <= M2_MAX_DISTANCE {
            let d = distance - 1;
            self.state_at = self.pos;
            self.bytes(&[((len - 1) << 5 | (d & 7) << 2) as u8, (d >> 3) as u8])
        } else if distance <= M3_MAX_DISTANCE {
            if len <= M3_MAX_SHORT_LEN {
                self.byte(32 | (len - 2) as u8)?;
            } else {
                self.byte(32)?;
                self.extension(len - M3_MAX_SHORT_LEN)?;
            }
            self.le16_with_state(distance - 1)
        } else {
            let d = distance - 16384;
            let high = ((d >> 11) & 8) as u8;
            if len <= M4_MAX_SHORT_LEN {
                self.byte(16 | high | (len - 2) as u8)?;
            } else {
                self.byte(16 | high)?;
                self.extension(len - M4_MAX_SHORT_LEN)?;
            }
            self.le16_with_state(d & 0x3fff)
        }
    }

    fn zero_run(&mut self, len: usize) -> Option<()> {
        let rest = len - MIN_ZERO_RUN;
        self.byte(0x18 | (rest & 7) as u8)?;
        self.state_at = self.pos;
        self.bytes(&[0xfc, 0xff, (rest >> 3) as u8])
    }
}

/// In lzo-rle, an extended M4 match whose first length byte is 0xfc..0xff
/// (length 261..264) followed by a distance byte of 0xff reads as a zero
/// run; such matches are shortened to 260.
fn avoid_rle_ambiguity(distance: usize, len: usize) -> usize {
    // Only M4 matches (beyond M3's reach) are concerned; nearer ones must
    // not reach the subtraction.
    if distance <= M3_MAX_DISTANCE {
        return len;
    }
    let d = distance - 16384;
    let high_bit = d & 0x4000 != 0;
    if high_bit && (261..=264).contains(&len) && d & 0x3f == 0x3f {
        260
    } else {
        len
    }
}

/// Compresses `src` into `dst`. Returns the compressed length, or `None` as
/// soon as the output would not fit in `dst`.
pub fn compress(
    src: &[u8],
    dst: &mut [u8],
    version: Version,
    table: &mut LzoTable,
) -> Option<usize> {
    let rle = version == Version::Rle;
    let mut out = Out {
        buf: dst,
        pos: 0,
        start: 0,
        state_at: 0,
    };
    if rle {
        out.bytes(&[VERSION_MARKER, RLE_VERSION])?;
        out.start = out.pos;
    }
    let max_distance = if rle {
        M4_MAX_DISTANCE_RLE
    } else {
        M4_MAX_DISTANCE
    };

    let n = src.len();
    let base = table.begin(n);
    let mut literal_start = 0;
    let mut i = 0;
    while i + 4 <= n {
        let v = read_u32(src, i);
        // The first instruction must be a literal run (the decoder reads a
        // first byte above 17 as one), so zero runs start at position 1.
        if rle && v == 0 && i > 0 {
            let mut run = MIN_ZERO_RUN;
            let max = (n - i).min(MAX_ZERO_RUN);
            while run < max && src[i + run] == 0 {
                run += 1;
            }
            out.literals(&src[literal_start..i])?;
            out.zero_run(run)?;
            i += run;
            literal_start = i;
            continue;
        }
        let slot = &mut table.slots[hash(v)];
        let candidate = *slot;
        *slot = base + i as u32;
        if candidate >= base {
            let c = (candidate - base) as usize;
            let distance = i - c;
            if distance <= max_distance && read_u32(src, c) == v {
                let mut len = 4 + common_length(src, c + 4, i + 4);
                if rle {
                    len = avoid_rle_ambiguity(distance, len);
                }
                out.literals(&src[literal_start..i])?;
                out.matched(distance, len)?;
                i += len;
                literal_start = i;
                continue;
            }
        }
        i += 1 + ((i - literal_start) >> 5);
    }
    out.literals(&src[literal_start..])?;
    out.bytes(&END_MARKER)?;
    Some(out.pos)
}

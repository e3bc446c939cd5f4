//! The LZO1X-1 compressor, with the zero-run extension for `lzo-rle`.
//!
//! A greedy LZ77 parse: a hash of the next four bytes finds the last position
//! that had the same hash; if the four bytes really match, the match is
//! extended and emitted, otherwise the position advances, faster and faster
//! through data that does not match (as LZO1X-1 does). Zero runs are checked
//! first in `lzo-rle` mode, since zero-filled stretches are the common case in
//! swapped memory.
//!
//! The dictionary is small and of 16-bit entries (16 KiB, as the kernel's),
//! so that it stays in the first-level cache beside the input: the hash
//! look-up is on the path of every byte not covered by a match. For inputs
//! of up to 64 KiB an entry is a whole position, read straight as the
//! candidate; past that it holds the low 16 bits of a position, and the
//! candidate is the latest position at that distance (mod 65536). Either way
//! the candidate's four bytes are compared before any use, so an entry from a
//! stretch far back costs a compare and nothing else. The table is cleared at
//! each call, which keeps the output a function of the input alone.
//!
//! Room is checked once per instruction against the caller's capacity, for
//! exactly what the instruction writes, so an incompressible input is given
//! up on as soon as the output is full; short literal runs are copied 16
//! bytes at a time where the output has room past them (what lies past the
//! run is overwritten by the instructions that follow).

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

/// 8192 entries of 16 bits: 16 KiB, cleared per call (see the module doc;
/// 16384 entries gave 0.2% better ratios on the corpus but cost 9% of the
/// speed on 4 KiB pages, whose clearing then costs as much as their parse).
const HASH_BITS: u32 = 13;
const END_MARKER: [u8; 3] = [17, 0, 0];
/// Literal runs up to this long are copied in one block of this size where
/// the input and the output both have room for it.
const LITERAL_BLOCK: usize = 16;

/// The compressor's dictionary: for each hash of four bytes, the low 16 bits
/// of the last position seen.
pub struct LzoTable {
    slots: Box<[u16; 1 << HASH_BITS]>,
}

impl LzoTable {
    /// An empty table.
    pub fn new() -> LzoTable {
        LzoTable {
            slots: Box::new([0; 1 << HASH_BITS]),
        }
    }
}

impl Default for LzoTable {
    fn default() -> Self {
        LzoTable::new()
    }
}

#[inline(always)]
fn hash(v: u32) -> usize {
    (v.wrapping_mul(0x1824_429d) >> (32 - HASH_BITS)) as usize
}

/// The four bytes at `at`, little-endian.
///
/// # Safety
/// `at + 4 <= src.len()`.
#[inline(always)]
unsafe fn read_u32(src: &[u8], at: usize) -> u32 {
    debug_assert!(at + 4 <= src.len());
    // SAFETY: inside `src` (the caller's promise); an unaligned read.
    u32::from_le(unsafe { std::ptr::read_unaligned(src.as_ptr().add(at) as *const u32) })
}

/// The eight bytes at `at`, little-endian.
///
/// # Safety
/// `at + 8 <= src.len()`.
#[inline(always)]
unsafe fn read_u64(src: &[u8], at: usize) -> u64 {
    debug_assert!(at + 8 <= src.len());
    // SAFETY: inside `src` (the caller's promise); an unaligned read.
    u64::from_le(unsafe { std::ptr::read_unaligned(src.as_ptr().add(at) as *const u64) })
}

/// How many bytes from `a` and from `b` agree, up to the end of `src`.
///
/// # Safety
/// `a < b <= src.len()`.
#[inline(always)]
unsafe fn common_length(src: &[u8], a: usize, b: usize) -> usize {
    debug_assert!(a < b && b <= src.len());
    let max = src.len() - b;
    let mut len = 0;
    while len + 8 <= max {
        // SAFETY: a + len + 8 < b + len + 8 <= b + max = src.len().
        let diff = unsafe { read_u64(src, a + len) ^ read_u64(src, b + len) };
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

/// How many zero bytes start `src[at..]`, `limit` at most.
#[inline(always)]
fn zero_length(src: &[u8], at: usize, limit: usize) -> usize {
    let max = src.len().saturating_sub(at).min(limit);
    let mut len = 0;
    while len + 8 <= max {
        // SAFETY: at + len + 8 <= at + max <= src.len().
        let word = unsafe { read_u64(src, at + len) };
        if word != 0 {
            return len + (word.trailing_zeros() / 8) as usize;
        }
        len += 8;
    }
    while len < max && src[at + len] == 0 {
        len += 1;
    }
    len
}

/// Bytes an extended length of `rest` (`>= 1`) takes.
#[inline(always)]
fn extension_len(rest: usize) -> usize {
    rest.div_ceil(255)
}

/// The output being written, with what the next literal run needs to know.
struct Out<'a> {
    buf: &'a mut [u8],
    pos: usize,
    /// The byte whose low two bits say how many literals follow the last
    /// instruction.
    state_at: usize,
}

impl Out<'_> {
    /// Whether `n` more bytes fit: every instruction asks once, for all it
    /// writes, before it writes.
    #[inline(always)]
    fn room(&self, n: usize) -> Option<()> {
        (self.buf.len() - self.pos >= n).then_some(())
    }

    #[inline(always)]
    fn byte(&mut self, b: u8) {
        self.buf[self.pos] = b;
        self.pos += 1;
    }

    /// The tail of an extended length (`rest >= 1`): 255 per zero byte, then
    /// the remainder ([`extension_len`] bytes).
    fn extension(&mut self, mut rest: usize) {
        while rest > 255 {
            self.byte(0);
            rest -= 255;
        }
        self.byte(rest as u8);
    }

    /// The two distance bytes of an M3 or M4, whose low two bits the next
    /// literal run may fill.
    #[inline(always)]
    fn le16_with_state(&mut self, value: usize) {
        self.state_at = self.pos;
        self.byte((value << 2) as u8);
        self.byte((value >> 6) as u8);
    }

    /// The literals `src[from..to]`, with the instruction they need.
    #[inline(always)]
    fn literals(&mut self, src: &[u8], from: usize, to: usize) -> Option<()> {
        let n = to - from;
        if n == 0 {
            return Some(());
        }
        // The parse's first instruction is the literal run from position 0
        // (see `parse`), which has an encoding of its own.
        let at_start = from == 0;
        // Short runs, the common case: one check covers the instruction
        // byte and the block.
        if n <= LITERAL_BLOCK
            && from + LITERAL_BLOCK <= src.len()
            && self.room(1 + LITERAL_BLOCK).is_some()
        {
            if at_start {
                self.byte(17 + n as u8);
            } else if n <= 3 {
                self.buf[self.state_at] |= n as u8;
            } else {
                self.byte((n - 3) as u8);
            }
            self.buf[self.pos..self.pos + LITERAL_BLOCK]
                .copy_from_slice(&src[from..from + LITERAL_BLOCK]);
            self.pos += n;
            return Some(());
        }
        let header = if at_start && n <= 238 {
            1
        } else if n <= 3 {
            0
        } else if n <= 18 {
            1
        } else {
            1 + extension_len(n - 18)
        };
        self.room(header + n)?;
        if at_start && n <= 238 {
            self.byte(17 + n as u8);
        } else if n <= 3 {
            self.buf[self.state_at] |= n as u8;
        } else if n <= 18 {
            self.byte((n - 3) as u8);
        } else {
            self.byte(0);
            self.extension(n - 18);
        }
        self.buf[self.pos..self.pos + n].copy_from_slice(&src[from..to]);
        self.pos += n;
        Some(())
    }

    #[inline(always)]
    fn matched(&mut self, distance: usize, len: usize) -> Option<()> {
        if len <= M2_MAX_LEN && distance <= M2_MAX_DISTANCE {
            self.room(2)?;
            let d = distance - 1;
            self.state_at = self.pos;
            self.byte(((len - 1) << 5 | (d & 7) << 2) as u8);
            self.byte((d >> 3) as u8);
        } else if distance <= M3_MAX_DISTANCE {
            if len <= M3_MAX_SHORT_LEN {
                self.room(3)?;
                self.byte(32 | (len - 2) as u8);
            } else {
                self.room(3 + extension_len(len - M3_MAX_SHORT_LEN))?;
                self.byte(32);
                self.extension(len - M3_MAX_SHORT_LEN);
            }
            self.le16_with_state(distance - 1);
        } else {
            let d = distance - 16384;
            let high = ((d >> 11) & 8) as u8;
            if len <= M4_MAX_SHORT_LEN {
                self.room(3)?;
                self.byte(16 | high | (len - 2) as u8);
            } else {
                self.room(3 + extension_len(len - M4_MAX_SHORT_LEN))?;
                self.byte(16 | high);
                self.extension(len - M4_MAX_SHORT_LEN);
            }
            self.le16_with_state(d & 0x3fff);
        }
        Some(())
    }

    #[inline(always)]
    fn zero_run(&mut self, len: usize) -> Option<()> {
        self.room(4)?;
        let rest = len - MIN_ZERO_RUN;
        self.byte(0x18 | (rest & 7) as u8);
        self.state_at = self.pos;
        self.byte(0xfc);
        self.byte(0xff);
        self.byte((rest >> 3) as u8);
        Some(())
    }

    fn end(&mut self) -> Option<()> {
        self.room(END_MARKER.len())?;
        for b in END_MARKER {
            self.byte(b);
        }
        Some(())
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
    // One parse loop per bitstream and per dictionary form, each with its
    // constants folded in.
    let wide = src.len() > 1 << 16;
    match (version, wide) {
        (Version::Lzo1x, false) => parse::<false, false>(src, dst, table),
        (Version::Lzo1x, true) => parse::<false, true>(src, dst, table),
        (Version::Rle, false) => parse::<true, false>(src, dst, table),
        (Version::Rle, true) => parse::<true, true>(src, dst, table),
    }
}

/// The parse. With `WIDE` false (inputs of at most 64 KiB, every folio
/// size but 2 MiB), a dictionary entry is a whole position, and the
/// candidate's bytes are read straight from it: the look-up is on the
/// latency chain of every byte not covered by a match, and the distance
/// arithmetic of the wide form on it cost about a tenth of the time (64
/// KiB p50 94-95 against 83-84 us in `uswap bench codecs`). With `WIDE`
/// true, an entry is a position's low 16 bits, and the candidate is the
/// latest position at that distance.
fn parse<const RLE: bool, const WIDE: bool>(
    src: &[u8],
    dst: &mut [u8],
    table: &mut LzoTable,
) -> Option<usize> {
    let mut out = Out {
        buf: dst,
        pos: 0,
        state_at: 0,
    };
    if RLE {
        out.room(2)?;
        out.byte(VERSION_MARKER);
        out.byte(RLE_VERSION);
    }
    let max_distance = if RLE {
        M4_MAX_DISTANCE_RLE
    } else {
        M4_MAX_DISTANCE
    };

    let slots = &mut *table.slots;
    slots.fill(0);
    let n = src.len();
    debug_assert!(WIDE || n <= 1 << 16);
    let mut literal_start = 0;
    // The first instruction is a literal run (the decoder reads a first
    // byte above 17 as one), so the parse starts at position 1. Every
    // dictionary entry then holds a position before the current one: 0
    // from the clearing, or an earlier `i`, as `i` only grows.
    let mut i = 1;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n, the loop's condition.
        let v = unsafe { read_u32(src, i) };
        if RLE && v == 0 {
            let run =
                MIN_ZERO_RUN + zero_length(src, i + MIN_ZERO_RUN, MAX_ZERO_RUN - MIN_ZERO_RUN);
            out.literals(src, literal_start, i)?;
            out.zero_run(run)?;
            i += run;
            literal_start = i;
            continue;
        }
        let slot = &mut slots[hash(v)];
        let candidate = if WIDE {
            let distance = (i as u16).wrapping_sub(*slot) as usize;
            // One compare for 0 < distance <= min(max_distance, i).
            (distance.wrapping_sub(1) < max_distance.min(i)).then(|| i - distance)
        } else {
            // A whole position (n <= 65536), before `i` (see above).
            debug_assert!((*slot as usize) < i);
            Some(*slot as usize)
        };
        *slot = i as u16;
        if let Some(c) = candidate {
            // SAFETY: c < i (above), and i + 4 <= n.
            if unsafe { read_u32(src, c) } == v && (WIDE || i - c <= max_distance) {
                let distance = i - c;
                // SAFETY: c + 4 < i + 4 <= n.
                let mut len = 4 + unsafe { common_length(src, c + 4, i + 4) };
                if RLE {
                    len = avoid_rle_ambiguity(distance, len);
                }
                out.literals(src, literal_start, i)?;
                out.matched(distance, len)?;
                i += len;
                literal_start = i;
                continue;
            }
        }
        i += 1 + ((i - literal_start) >> 5);
    }
    out.literals(src, literal_start, n)?;
    out.end()?;
    Some(out.pos)
}

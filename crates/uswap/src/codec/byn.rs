//! by_n: one buffer compressed as N independently decompressible segments in
//! one output, so that N engines can compress and decompress it in parallel.
//!
//! This is the format of the IAA `canned-by_n` proposal, with any codec: a
//! 64 KiB folio cut into N equal segments trades a little ratio for up to N
//! times lower latency per folio.
//!
//! # Byte layout (all integers little endian)
//!
//! ```text
//! offset     size  field
//! 0          1     magic 0xB7
//! 1          1     codec id (CodecId as u8)
//! 2          1     log2(N), 0..=6
//! 3          1     reserved, 0
//! 4          4     original length L (a multiple of N; each segment is L/N)
//! 8          4·N   per segment: bit 31 = stored raw, bits 0..30 = stored length
//! 8 + 4·N    ...   the segments, back to back, in order
//! ```
//!
//! A raw segment (one that did not shrink) is stored as its L/N bytes; a
//! compressed one is strictly shorter. The stored lengths must add up to
//! exactly the bytes after the header; anything else is corrupt.
//!
//! This module is the format alone: the header's layout, its parsing, and
//! where each segment lies. Compressing and decompressing the segments as
//! one batch on a device's engines is [`crate::accel::byn`]'s work.

use super::{CodecError, CodecId};

const MAGIC: u8 = 0xB7;
const RAW_FLAG: u32 = 1 << 31;
/// The largest segment count.
pub const MAX_SEGMENTS: usize = 64;

/// Bytes of header for `n` segments.
pub fn header_len(n: usize) -> usize {
    8 + 4 * n
}

fn valid_segments(n: usize, len: usize) -> bool {
    n.is_power_of_two()
        && n <= MAX_SEGMENTS
        && len > 0
        && len.is_multiple_of(n)
        && len < RAW_FLAG as usize
}

/// The length of each segment when a `len`-byte buffer is cut into `n`.
/// Fails with [`CodecError::BadArgument`] unless `n` is a power of two up to
/// [`MAX_SEGMENTS`] that divides `len`, and `len` is neither zero nor too
/// large for the length fields.
pub fn segment_len(n: usize, len: usize) -> Result<usize, CodecError> {
    if valid_segments(n, len) {
        Ok(len / n)
    } else {
        Err(CodecError::BadArgument)
    }
}

/// Writes the header of a frame of `entries.len()` segments into the front
/// of `dst` and returns its length, [`header_len`]`(entries.len())`; the
/// segments go right after it, in order. `entries` are as in
/// [`Header::entries`]: a raw segment's length is the segment length, a
/// compressed one's is shorter.
///
/// # Panics
///
/// If the segment count is not valid for `original_len` (see
/// [`segment_len`]) or `dst` is shorter than the header.
pub fn write_header(
    dst: &mut [u8],
    codec: CodecId,
    original_len: usize,
    entries: &[(bool, usize)],
) -> usize {
    let n = entries.len();
    assert!(
        valid_segments(n, original_len),
        "{n} segments of a {original_len}-byte buffer"
    );
    dst[0] = MAGIC;
    dst[1] = codec as u8;
    dst[2] = n.trailing_zeros() as u8;
    dst[3] = 0;
    dst[4..8].copy_from_slice(&(original_len as u32).to_le_bytes());
    for (i, &(raw, len)) in entries.iter().enumerate() {
        let entry = if raw {
            RAW_FLAG | len as u32
        } else {
            len as u32
        };
        dst[8 + 4 * i..12 + 4 * i].copy_from_slice(&entry.to_le_bytes());
    }
    header_len(n)
}

/// The parsed header of a by_n frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The codec that compressed the segments.
    pub codec: CodecId,
    /// The number of segments, N.
    pub segments: usize,
    /// The length of the buffer the frame decodes to, L.
    pub original_len: usize,
    /// (stored raw, stored length) per segment.
    pub entries: Vec<(bool, usize)>,
}

impl Header {
    /// The length of each segment once decoded, L/N.
    pub fn segment_len(&self) -> usize {
        self.original_len / self.segments
    }

    /// Each segment's (stored raw, stored bytes) in `frame`, the frame this
    /// header was parsed from, in order.
    pub fn segment_bodies<'a>(
        &'a self,
        frame: &'a [u8],
    ) -> impl Iterator<Item = (bool, &'a [u8])> + 'a {
        let mut at = header_len(self.segments);
        self.entries.iter().map(move |&(raw, len)| {
            let body = &frame[at..at + len];
            at += len;
            (raw, body)
        })
    }
}

/// Parses and checks a frame's header against the length it must decode to.
pub fn parse_header(src: &[u8], expected_len: usize) -> Result<Header, CodecError> {
    let corrupt = Err(CodecError::Corrupt);
    if src.len() < 8 || src[0] != MAGIC || src[3] != 0 || src[2] > 6 {
        return corrupt;
    }
    let codec = CodecId::from_byte(src[1]).ok_or(CodecError::Corrupt)?;
    let n = 1usize << src[2];
    let original_len = u32::from_le_bytes(src[4..8].try_into().expect("4 bytes")) as usize;
    if original_len != expected_len || !valid_segments(n, original_len) || src.len() < header_len(n)
    {
        return corrupt;
    }
    let segment = original_len / n;
    let mut entries = Vec::with_capacity(n);
    let mut body = 0usize;
    for i in 0..n {
        let e = u32::from_le_bytes(src[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes"));
        let raw = e & RAW_FLAG != 0;
        let len = (e & !RAW_FLAG) as usize;
        if (raw && len != segment) || (!raw && (len == 0 || len >= segment)) {
            return corrupt;
        }
        body += len;
        entries.push((raw, len));
    }
    if header_len(n) + body != src.len() {
        return corrupt;
    }
    Ok(Header {
        codec,
        segments: n,
        original_len,
        entries,
    })
}

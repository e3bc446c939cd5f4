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

use super::{Codec, CodecError, CodecId};
use crate::accel::{Device, Job, JobError};
use std::cell::RefCell;

const MAGIC: u8 = 0xB7;
const RAW_FLAG: u32 = 1 << 31;
/// The largest segment count.
pub const MAX_SEGMENTS: usize = 64;

/// Bytes of header for `n` segments.
pub fn header_len(n: usize) -> usize {
    8 + 4 * n
}

fn valid_segments(n: usize, len: usize) -> bool {
    n.is_power_of_two() && n <= MAX_SEGMENTS && len > 0 && len.is_multiple_of(n) && len < RAW_FLAG as usize
}

thread_local! {
    /// Where segments are compressed before they are packed together.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Compresses `src` as `n` segments on `device` into `dst`; returns the
/// framed length, which is always less than `src.len()`.
pub fn compress(device: &Device, codec: &dyn Codec, n: usize, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
    if !valid_segments(n, src.len()) {
        return Err(CodecError::BadArgument);
    }
    let segment = src.len() / n;
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < src.len() {
            scratch.resize(src.len(), 0);
        }
        let mut jobs: Vec<Job<'_>> = src
            .chunks(segment)
            .zip(scratch[..src.len()].chunks_mut(segment))
            .map(|(s, d)| Job::new(s, d))
            .collect();
        device.compress_batch(codec, &mut jobs);

        let mut pos = header_len(n);
        let mut entries = [0u32; MAX_SEGMENTS];
        for (i, job) in jobs.iter().enumerate() {
            let stored = match job.result.expect("a finished batch has every result") {
                Ok(len) => len as u32,
                Err(JobError::Codec(CodecError::DoesNotFit)) => RAW_FLAG | segment as u32,
                Err(JobError::Codec(e)) => return Err(e),
                Err(JobError::VerifyFailed) => return Err(CodecError::Internal),
            };
            entries[i] = stored;
            pos += (stored & !RAW_FLAG) as usize;
        }
        if pos >= src.len() || pos > dst.len() {
            return Err(CodecError::DoesNotFit);
        }

        dst[0] = MAGIC;
        dst[1] = codec.id() as u8;
        dst[2] = n.trailing_zeros() as u8;
        dst[3] = 0;
        dst[4..8].copy_from_slice(&(src.len() as u32).to_le_bytes());
        let mut at = header_len(n);
        for (i, (&entry, job)) in entries.iter().zip(&jobs).enumerate() {
            dst[8 + 4 * i..12 + 4 * i].copy_from_slice(&entry.to_le_bytes());
            let len = (entry & !RAW_FLAG) as usize;
            let body = if entry & RAW_FLAG != 0 { job.src } else { &job.dst[..len] };
            dst[at..at + len].copy_from_slice(body);
            at += len;
        }
        Ok(at)
    })
}

/// The parsed header of a by_n frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub codec: CodecId,
    pub segments: usize,
    pub original_len: usize,
    /// (stored raw, stored length) per segment.
    pub entries: Vec<(bool, usize)>,
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
    if original_len != expected_len || !valid_segments(n, original_len) || src.len() < header_len(n) {
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

/// Decompresses a by_n frame into exactly `dst.len()` bytes, the segments in
/// parallel on `device`.
pub fn decompress(device: &Device, codec: &dyn Codec, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let header = parse_header(src, dst.len())?;
    if header.codec != codec.id() {
        return Err(CodecError::Corrupt);
    }
    let segment = header.original_len / header.segments;
    let mut at = header_len(header.segments);
    let mut jobs = Vec::with_capacity(header.segments);
    for (&(raw, len), out) in header.entries.iter().zip(dst.chunks_mut(segment)) {
        let body = &src[at..at + len];
        at += len;
        if raw {
            out.copy_from_slice(body);
        } else {
            jobs.push(Job::new(body, out));
        }
    }
    device.decompress_batch(codec, &mut jobs);
    if jobs.iter().all(|j| matches!(j.result, Some(Ok(_)))) {
        Ok(())
    } else {
        Err(CodecError::Corrupt)
    }
}

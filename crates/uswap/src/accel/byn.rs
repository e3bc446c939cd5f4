//! The by_n driver: a buffer's segments compressed as one batch on a
//! device's engines and packed into a by_n frame, and a frame's segments
//! decompressed as one batch. The frame format itself is
//! [`crate::codec::byn`].

use super::{Device, Job, JobError};
use crate::codec::byn::{self as frame, MAX_SEGMENTS};
use crate::codec::{Codec, CodecError};
use std::cell::RefCell;

thread_local! {
    /// Where segments are compressed before they are packed together.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Compresses `src` as `n` segments on `device` into `dst`; returns the
/// framed length, which is always less than `src.len()`.
///
/// Fails with [`CodecError::BadArgument`] for a segment count the format
/// does not allow for `src` (see [`frame::segment_len`]), and with
/// [`CodecError::DoesNotFit`] when the frame would not be shorter than
/// `src` or does not fit `dst`. A segment that does not shrink is stored
/// raw. A result that fails the device's verification is
/// [`CodecError::Internal`].
pub fn compress(
    device: &Device,
    codec: &dyn Codec,
    n: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<usize, CodecError> {
    let segment = frame::segment_len(n, src.len())?;
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

        let mut entries = [(false, 0usize); MAX_SEGMENTS];
        let mut framed_len = frame::header_len(n);
        for (entry, job) in entries.iter_mut().zip(&jobs) {
            *entry = match job.result.expect("a finished batch has every result") {
                Ok(len) => (false, len),
                Err(JobError::Codec(CodecError::DoesNotFit)) => (true, segment),
                Err(JobError::Codec(e)) => return Err(e),
                Err(JobError::VerifyFailed) => return Err(CodecError::Internal),
            };
            framed_len += entry.1;
        }
        if framed_len >= src.len() || framed_len > dst.len() {
            return Err(CodecError::DoesNotFit);
        }

        let entries = &entries[..n];
        let mut at = frame::write_header(dst, codec.id(), src.len(), entries);
        for (&(raw, len), job) in entries.iter().zip(&jobs) {
            let body = if raw { job.src } else { &job.dst[..len] };
            dst[at..at + len].copy_from_slice(body);
            at += len;
        }
        Ok(at)
    })
}

/// Decompresses a by_n frame into exactly `dst.len()` bytes, the segments in
/// parallel on `device`. Any frame that is corrupt, was made by another
/// codec, or does not decode to `dst.len()` bytes is [`CodecError::Corrupt`].
pub fn decompress(
    device: &Device,
    codec: &dyn Codec,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), CodecError> {
    let header = frame::parse_header(src, dst.len())?;
    if header.codec != codec.id() {
        return Err(CodecError::Corrupt);
    }
    let mut jobs = Vec::with_capacity(header.segments);
    for ((raw, body), out) in header
        .segment_bodies(src)
        .zip(dst.chunks_mut(header.segment_len()))
    {
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

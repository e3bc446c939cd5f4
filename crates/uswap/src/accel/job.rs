//! Jobs and their completion records.
//!
//! A [`Job`] is what a caller hands the device: an input buffer and an output
//! buffer, borrowed. Inside the device each job becomes a `Cell`, the
//! completion record an engine reads its work from and writes its result to;
//! the engine queues carry pointers to cells. The device guarantees (see
//! `device.rs`) that no engine touches a cell after the call that owns it has
//! returned.

use crate::codec::{Codec, CodecError};
use std::cell::UnsafeCell;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Compress `src` into `dst`; the result is the compressed length.
    Compress,
    /// Decompress `src` into exactly `dst`; the result is `dst.len()`.
    Decompress,
}

/// Why a job failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobError {
    /// The codec failed (including "does not fit": the data did not shrink).
    Codec(CodecError),
    /// The compressed result did not decompress back to the input.
    VerifyFailed,
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Codec(e) => e.fmt(f),
            JobError::VerifyFailed => f.write_str("compressed result failed verification"),
        }
    }
}

impl std::error::Error for JobError {}

impl From<CodecError> for JobError {
    fn from(e: CodecError) -> Self {
        JobError::Codec(e)
    }
}

/// One buffer to compress or decompress.
///
/// For compression, `dst` is the output capacity and the result is the
/// compressed length. For decompression, `dst` must be exactly the
/// decompressed length and the result is that length.
#[derive(Debug)]
pub struct Job<'a> {
    /// The input.
    pub src: &'a [u8],
    /// The output: capacity for compression, exact length for decompression.
    pub dst: &'a mut [u8],
    /// Set when the job has run.
    pub result: Option<Result<usize, JobError>>,
}

impl<'a> Job<'a> {
    /// A job that has not run yet.
    pub fn new(src: &'a [u8], dst: &'a mut [u8]) -> Job<'a> {
        Job {
            src,
            dst,
            result: None,
        }
    }
}

pub(crate) const PENDING: u32 = 0;
pub(crate) const RUNNING: u32 = 1;
pub(crate) const DONE: u32 = 2;
/// Added to RUNNING by a caller that sleeps until the job is done.
pub(crate) const WAITED: u32 = 1 << 31;

/// Counts the queue references to a batch's cells that engines have not yet
/// released. The caller may return only when it reaches zero. The top bit
/// says the caller sleeps on it.
pub(crate) struct Group {
    pub outstanding: AtomicU32,
}

pub(crate) const SLEEPING: u32 = 1 << 31;

impl Group {
    pub fn new() -> Group {
        Group {
            outstanding: AtomicU32::new(0),
        }
    }

    /// An engine is done with one of this group's queue entries. This is the
    /// last access an engine makes to the batch.
    pub fn release(&self) {
        let addr: *const AtomicU32 = &self.outstanding;
        let before = self.outstanding.fetch_sub(1, Ordering::AcqRel);
        if before == (SLEEPING | 1) {
            super::futex::wake_all(addr);
        }
    }
}

/// The completion record of one job.
pub(crate) struct Cell {
    pub state: AtomicU32,
    pub op: Op,
    pub codec: *const dyn Codec,
    pub src: *const u8,
    pub src_len: usize,
    pub dst: *mut u8,
    pub dst_len: usize,
    pub result: UnsafeCell<Option<Result<usize, JobError>>>,
    pub group: *const Group,
}

impl Cell {
    /// Claims a pending job for execution; false if someone else has it.
    pub fn claim(&self) -> bool {
        self.state
            .compare_exchange(PENDING, RUNNING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// Ends a claimed job: its result is written. Wakes a caller sleeping in
    /// [`Cell::sleep_until_done`].
    pub fn finish(&self) {
        if self.state.swap(DONE, Ordering::AcqRel) & WAITED != 0 {
            super::futex::wake_all(&self.state);
        }
    }

    /// Sleeps (at most `timeout`) until the job someone else runs is done;
    /// returns at once if it is done or nobody has claimed it.
    pub fn sleep_until_done(&self, timeout: std::time::Duration) {
        let waited = RUNNING | WAITED;
        let marked = self.state.load(Ordering::Acquire) == waited
            || self
                .state
                .compare_exchange(RUNNING, waited, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if marked {
            super::futex::wait(&self.state, waited, timeout);
        }
    }

    /// The result of a finished job, `None` while it runs.
    pub fn result(&self) -> Option<Result<usize, JobError>> {
        if !self.is_done() {
            return None;
        }
        // SAFETY: DONE is stored (Release) after the result is written, and
        // nobody writes the result after DONE; the Acquire load above makes
        // the write visible.
        unsafe { *self.result.get() }
    }
}

/// A queue entry: a pointer to a cell.
#[derive(Clone, Copy)]
pub(crate) struct Descriptor(pub *const Cell);

// SAFETY: a descriptor is only dereferenced while the batch that owns the
// cell is blocked waiting for its group to reach zero (see `device.rs`), and
// every cell field an engine touches is either immutable during that time or
// synchronised through `state`.
unsafe impl Send for Descriptor {}

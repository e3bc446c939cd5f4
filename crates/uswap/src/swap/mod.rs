//! `swap`: swap slot numbers and the backing file.
//!
//! - [`slots`]: the cluster allocator (contiguous, aligned runs per folio).
//! - [`free`]: returning slots immediately, in per-thread batches, or through
//!   an async worker.
//! - [`file`](mod@file): the unlinked, preallocated swap file and the [`Backing`]
//!   interface (with an in-memory, fault-injecting double for tests).

pub mod file;
pub mod free;
pub mod slots;

pub use file::{Backing, Fault, MemBacking, SwapFile, SLOT_SIZE};
pub use free::{FreeHook, FreeMode, FreeStats, SlotReleaser};
pub use slots::SlotAllocator;

//! uswap: a compressed memory tier in user space.
//!
//! The crate is built in layers, bottom up, each using only the ones before it
//! (see `DESIGN.md` in the project's shared documents):
//!
//! - [`codec`]: one buffer in, one buffer out (lz4, lzo, lzo-rle, zstd, deflate,
//!   canned), plus the by_n framing that splits a buffer into independently
//!   compressed segments.
//! - [`accel`]: the software model of a multi-engine compression device: many
//!   buffers at once on K engines, submit then poll, bounded queues, software
//!   fallback, verification; and the by_n driver, which runs a frame's
//!   segments on the engines as one batch.
//! - [`zpool`]: compressed objects packed into pages (zsmalloc's design).
//! - [`swap`]: swap slots (cluster allocator, free modes) and the swap file.
//! - [`zswap`]: the store: slot -> entry, batched folio stores, reads that
//!   leave the entries stored, per-slot user counts (a fork shares entries;
//!   invalidating drops one user, and the last frees them), limits,
//!   writeback.
//! - [`mm`]: the runtime: userfaultfd regions, faults, reclaim.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod accel;
pub mod codec;
pub mod corpus;
pub mod mm;
pub mod page;
pub mod size;
pub mod swap;
pub mod sys;
pub mod zpool;
pub mod zswap;

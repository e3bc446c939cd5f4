//! `accel`: the software model of a multi-engine compression device.
//!
//! It follows the shape of Intel IAA as the zswap batching series uses it:
//!
//! - K **engines**, each a thread that owns a bounded **work queue** of depth
//!   D (the device's descriptors). K = 0 means "no device": every job runs
//!   synchronously on the caller, with nothing in between.
//! - **Submit never blocks.** A full queue is retried a bounded number of
//!   times, then the job runs in software on the caller (a *fallback*).
//! - **Submit, then poll.** No interrupts: the caller checks completion
//!   records, and sleeps on a futex only after spinning briefly.
//! - **Batches.** [`Device::compress_batch`] / [`Device::decompress_batch`]
//!   submit a whole batch and poll it to completion; [`Device::batch_size`]
//!   and [`Device::has_batching`] let callers size their buffers and skip
//!   batching where it gains nothing.
//! - **Mapping** of callers to engines: `local` (a thread always uses the
//!   same engine, like IAA's per-core mapping) or `global` (round-robin over
//!   all engines, like the series' global work queue).
//! - **Verify**: each compressed result is decompressed and its CRC32C compared
//!   with the input's before the job is reported done.
//! - **Caller assist**: while engines work, the caller may run not-yet-started
//!   jobs of its own batch, so a 2-core machine is not left half idle.
//!
//! Modules: [`config`] (knobs), [`job`] (jobs and completion records),
//! `engine` (the engine threads and their queues), [`stats`] (per-engine
//! counters), `device` (submission, polling, batches, and why lending
//! buffers to the engines is safe), [`byn`] (a by_n frame's segments as one
//! batch), [`probe`] (whether batching pays off on this machine).

pub mod byn;
pub mod config;
mod device;
mod engine;
mod futex;
pub mod job;
pub mod probe;
pub mod stats;

pub use config::{DeviceConfig, Mapping};
pub use device::{Device, Scope, Ticket};
pub use engine::live_engine_threads;
pub use job::{Job, JobError, Op};
pub use stats::{DeviceStats, EngineStats};

//! Engine threads, their work queues, and the job executor they share with
//! callers that run jobs themselves.

use super::job::JobError;
use super::job::{Cell, Descriptor, Op};
use super::stats::Counters;
use crate::codec::Codec;
use crossbeam_queue::ArrayQueue;
use std::cell::RefCell;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Engine threads alive in this process (so tests can see that dropping a
/// device stops them).
static LIVE_ENGINE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// The number of engine threads currently running in this process.
pub fn live_engine_threads() -> usize {
    LIVE_ENGINE_THREADS.load(Ordering::SeqCst)
}

/// One engine: its queue of descriptors and what it needs to sleep and wake.
pub(crate) struct Engine {
    pub queue: ArrayQueue<Descriptor>,
    pub counters: Counters,
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
    /// Fault injection: a paused engine takes nothing from its queue.
    pub paused: AtomicBool,
}

impl Engine {
    pub fn new(depth: usize) -> Engine {
        Engine {
            queue: ArrayQueue::new(depth.max(1)),
            counters: Counters::default(),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
            paused: AtomicBool::new(false),
        }
    }

    /// Wakes the engine if it sleeps; called after every enqueue.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Wakes the engine unconditionally (shutdown, unpause).
    pub fn kick(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// State shared by a device and its engine threads.
pub(crate) struct Shared {
    pub engines: Vec<Engine>,
    pub caller: Counters,
    pub shutdown: AtomicBool,
    pub verify: bool,
    pub idle_poll: Duration,
    /// Fault injection: corrupt this many upcoming compressed results.
    pub corrupt_next: AtomicU32,
}

impl Shared {
    /// Runs one queue entry: executes the job unless a caller already took
    /// it, then releases the entry. After `release` the batch may be gone.
    pub fn process(&self, desc: Descriptor, counters: &Counters) {
        // SAFETY: the batch that owns this cell waits for its group's count
        // to reach zero before it frees its cells, and this entry holds one
        // unit of that count until `release` below.
        let cell = unsafe { &*desc.0 };
        // SAFETY: as above; the group lives in the same batch.
        let group = unsafe { &*cell.group };
        if cell.claim() {
            self.execute(cell, counters);
        }
        group.release();
    }

    /// Runs a claimed job and publishes its result.
    pub fn execute(&self, cell: &Cell, counters: &Counters) {
        // SAFETY: the claim (PENDING -> RUNNING) gives this thread the only
        // access to the job's buffers and result until it stores DONE; the
        // buffers are borrowed by the batch for at least that long.
        let (codec, src, dst) = unsafe {
            (
                &*cell.codec,
                std::slice::from_raw_parts(cell.src, cell.src_len),
                std::slice::from_raw_parts_mut(cell.dst, cell.dst_len),
            )
        };
        let result = self.run_job(codec, cell.op, src, dst, counters);
        // SAFETY: as above, this thread owns the result slot until DONE.
        unsafe { *cell.result.get() = Some(result) };
        cell.finish();
    }

    /// The work of one job, with counters, fault injection and verification.
    pub fn run_job(
        &self,
        codec: &dyn Codec,
        op: Op,
        src: &[u8],
        dst: &mut [u8],
        counters: &Counters,
    ) -> Result<usize, JobError> {
        let result = match op {
            Op::Compress => codec
                .compress(src, dst)
                .map_err(JobError::from)
                .and_then(|n| {
                    self.inject_corruption(&mut dst[..n]);
                    if self.verify {
                        verify(codec, src, &dst[..n], counters)?;
                    }
                    Ok(n)
                }),
            Op::Decompress => codec
                .decompress(src, dst)
                .map(|()| dst.len())
                .map_err(JobError::from),
        };
        let (jobs, out) = match (op, &result) {
            (Op::Compress, Ok(n)) => (&counters.compress_jobs, *n),
            (Op::Compress, Err(_)) => (&counters.compress_jobs, 0),
            (Op::Decompress, Ok(n)) => (&counters.decompress_jobs, *n),
            (Op::Decompress, Err(_)) => (&counters.decompress_jobs, 0),
        };
        jobs.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_in
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        counters.bytes_out.fetch_add(out as u64, Ordering::Relaxed);
        result
    }

    fn inject_corruption(&self, compressed: &mut [u8]) {
        if self.corrupt_next.load(Ordering::Relaxed) == 0 || compressed.is_empty() {
            return;
        }
        let claimed = self
            .corrupt_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if claimed {
            let mid = compressed.len() / 2;
            compressed[mid] ^= 0x5a;
        }
    }
}

thread_local! {
    /// Scratch for verification, grown to the largest job this thread saw.
    static VERIFY_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn verify(
    codec: &dyn Codec,
    src: &[u8],
    compressed: &[u8],
    counters: &Counters,
) -> Result<(), JobError> {
    let ok = VERIFY_SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < src.len() {
            scratch.resize(src.len(), 0);
        }
        let out = &mut scratch[..src.len()];
        codec.decompress(compressed, out).is_ok() && crc32c::crc32c(out) == crc32c::crc32c(src)
    });
    if ok {
        Ok(())
    } else {
        counters.verify_failures.fetch_add(1, Ordering::Relaxed);
        Err(JobError::VerifyFailed)
    }
}

/// Starts engine `index`'s thread.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    index: usize,
    pin: bool,
) -> std::io::Result<thread::JoinHandle<()>> {
    LIVE_ENGINE_THREADS.fetch_add(1, Ordering::SeqCst);
    let spawned = thread::Builder::new()
        .name(format!("uswap-engine-{index}"))
        .spawn(move || {
            if pin {
                pin_to_cpu(index);
            }
            engine_loop(&shared, index);
            LIVE_ENGINE_THREADS.fetch_sub(1, Ordering::SeqCst);
        });
    match spawned {
        Ok(handle) => Ok(handle),
        Err(e) => {
            LIVE_ENGINE_THREADS.fetch_sub(1, Ordering::SeqCst);
            Err(e)
        }
    }
}

/// Registers the engine thread's handle so submitters can wake it.
pub(crate) fn register(shared: &Shared, index: usize, thread: Thread) {
    let _ = shared.engines[index].thread.set(thread);
}

fn engine_loop(shared: &Shared, index: usize) {
    let engine = &shared.engines[index];
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        if engine.paused.load(Ordering::Acquire) {
            thread::park_timeout(Duration::from_millis(1));
            continue;
        }
        if let Some(desc) = engine.queue.pop() {
            shared.process(desc, &engine.counters);
            continue;
        }
        // Idle: poll a while (the next batch often comes right away), then
        // sleep until a submitter wakes us. Polling yields the CPU, since on a
        // small machine the caller that will submit may need this core.
        let idle_since = Instant::now();
        while engine.queue.is_empty()
            && !shared.shutdown.load(Ordering::Relaxed)
            && idle_since.elapsed() < shared.idle_poll
        {
            thread::yield_now();
        }
        if engine.queue.is_empty() {
            engine.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if engine.queue.is_empty() && !shared.shutdown.load(Ordering::SeqCst) {
                thread::park();
            }
            engine.sleeping.store(false, Ordering::SeqCst);
        }
    }
}

/// Pins the calling thread to the `index`-th CPU it is allowed to run on
/// (modulo their number).
fn pin_to_cpu(index: usize) {
    let cpus = crate::sys::allowed_cpus();
    if !cpus.is_empty() {
        crate::sys::pin_to_cpu(cpus[index % cpus.len()]);
    }
}

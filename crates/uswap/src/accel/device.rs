//! The device: engine start-up and shutdown, submission with retry and
//! software fallback, polling, batches, and the submit/poll/wait scope.
//!
//! # Why the borrowed buffers are safe
//!
//! Engine queues hold raw pointers to completion records ([`Cell`]s) that
//! point into the caller's buffers. Every path that submits jobs — a batch
//! call or a [`Device::scope`] — counts each queue entry it makes in a
//! [`Group`] and does not return (not even by unwinding) until engines have
//! released every entry. An engine's release is its last access to the
//! batch. So no engine ever touches a buffer or record after its owner has
//! moved on.
//!
//! A batch call borrows its buffers for the call, so that is the whole
//! argument there. A scope lends buffers across many calls, which leaves two
//! more ways to go wrong; the types turn both into compile errors.
//!
//! **A lent buffer must outlive the scope.** [`Scope::submit`] takes buffers
//! borrowed for `'scope`. The closure given to [`Device::scope`] must accept
//! a `&'scope Scope<'scope, 'env>` for *every* `'scope` (the bound is
//! higher-ranked) and may assume nothing about `'scope` except `'env:
//! 'scope`, that is, that it ends no later than the device borrow. So the
//! only borrows it can lend are ones that were taken before the `scope` call
//! and last past it; a buffer created inside the closure, which dies when
//! the closure returns, does not qualify. The scope's records are dropped,
//! which waits for every queue entry, after the closure returns (or unwinds)
//! and before `scope` returns: inside every such borrow. This rests on
//! `Scope` being *invariant* in `'scope` (and in `'env`, as
//! [`std::thread::Scope`] is):
//! were it covariant, a `&'scope Scope<'scope, 'env>` would coerce to a
//! `&'short Scope<'short, 'env>` for any lifetime `'short` inside the
//! closure, and `submit` would take a buffer that dies halfway through it
//! while an engine still has the pointer. The `PhantomData<&'a mut &'a ()>`
//! markers give the invariance.
//!
//! **A buffer is handed back once.** [`Scope::wait`] rebuilds the output
//! buffer as a `&'scope mut [u8]` from the record, which is sound only if no
//! other reference to it exists: the loan moved into `submit`, and nothing
//! else may hand it back. A [`Ticket`] names one record of one scope, and
//! `wait` consumes it; tickets are neither `Clone` nor `Copy`, so a record's
//! buffer comes back at most once. A ticket is also branded with its
//! scope's `'scope`, invariantly: each `scope` call has its own
//! higher-ranked `'scope`, so a ticket from one scope has a type that
//! another scope's `wait` and `poll` do not accept (it would otherwise index
//! that scope's records and hand back a buffer whose loan is still live
//! there). Nor can a ticket leave its scope to be used in a later one: the
//! closure's result type cannot name `'scope`.
//!
//! A scope also pushes each record into its list *before* queuing it, so a
//! record an engine can see is always owned by the scope's records and freed
//! only after their final wait, even if the submission panics halfway.

use super::config::{DeviceConfig, Mapping};
use super::engine::{self, Engine, Shared};
use super::job::{Cell, Descriptor, Group, Job, JobError, Op, PENDING, SLEEPING};
use super::stats::DeviceStats;
use crate::codec::Codec;
use std::cell::{RefCell, UnsafeCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// A software model of a multi-engine compression device.
pub struct Device {
    shared: Arc<Shared>,
    config: DeviceConfig,
    round_robin: AtomicUsize,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("config", &self.config)
            .finish()
    }
}

static NEXT_LOCAL_ENGINE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's engine under the `local` mapping, chosen on first use.
    static LOCAL_ENGINE: usize = NEXT_LOCAL_ENGINE.fetch_add(1, Ordering::Relaxed);
}

impl Device {
    /// Starts a device with `config.engines` engine threads.
    pub fn new(config: DeviceConfig) -> std::io::Result<Device> {
        let shared = Arc::new(Shared {
            engines: (0..config.engines)
                .map(|_| Engine::new(config.queue_depth))
                .collect(),
            caller: Default::default(),
            shutdown: Default::default(),
            verify: config.verify,
            idle_poll: config.idle_poll,
            corrupt_next: AtomicU32::new(0),
        });
        let mut device = Device {
            shared,
            config,
            round_robin: AtomicUsize::new(0),
            threads: Vec::new(),
        };
        for index in 0..device.config.engines {
            // On error, dropping `device` stops the engines already started.
            let handle = engine::spawn(device.shared.clone(), index, device.config.pin)?;
            engine::register(&device.shared, index, handle.thread().clone());
            device.threads.push(handle);
        }
        Ok(device)
    }

    /// A device with no engines: every job runs on the caller.
    pub fn synchronous() -> Device {
        Device::new(DeviceConfig::with_engines(0))
            .expect("a device without engines starts no thread")
    }

    /// The configuration the device was started with.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// How many jobs a caller should put in one batch.
    pub fn batch_size(&self) -> usize {
        self.config.batch_size.max(1)
    }

    /// Whether batches run in parallel; without engines a caller gains
    /// nothing by batching and may as well call the codec page by page.
    pub fn has_batching(&self) -> bool {
        self.config.engines > 0
    }

    /// Compresses every job's `src` into its `dst`; each job's `result` is
    /// the compressed length or the error.
    pub fn compress_batch(&self, codec: &dyn Codec, jobs: &mut [Job<'_>]) {
        self.run_batch(codec, Op::Compress, jobs);
    }

    /// Decompresses every job's `src` into exactly its `dst`.
    pub fn decompress_batch(&self, codec: &dyn Codec, jobs: &mut [Job<'_>]) {
        self.run_batch(codec, Op::Decompress, jobs);
    }

    /// One job, run where the device would run it.
    pub fn run_one(
        &self,
        codec: &dyn Codec,
        op: Op,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<usize, JobError> {
        let mut jobs = [Job::new(src, dst)];
        self.run_batch(codec, op, &mut jobs);
        jobs[0]
            .result
            .take()
            .expect("a finished batch has every result")
    }

    fn run_batch(&self, codec: &dyn Codec, op: Op, jobs: &mut [Job<'_>]) {
        if self.config.engines == 0 {
            for job in jobs.iter_mut() {
                job.result =
                    Some(
                        self.shared
                            .run_job(codec, op, job.src, job.dst, &self.shared.caller),
                    );
            }
            return;
        }
        let group = Group::new();
        let cells: Vec<Cell> = jobs
            .iter_mut()
            .map(|job| new_cell(codec, op, job, &group))
            .collect();
        let guard = WaitGuard {
            device: self,
            group: &group,
        };
        for cell in &cells {
            self.submit_cell(cell);
        }
        if self.config.caller_assist {
            // Engines take from the front of their queues; take from the back.
            for cell in cells.iter().rev() {
                if cell.claim() {
                    self.shared.execute(cell, &self.shared.caller);
                }
            }
        }
        drop(guard);
        for (job, cell) in jobs.iter_mut().zip(&cells) {
            job.result = cell.result();
        }
    }

    fn pick_engine(&self) -> usize {
        let k = self.config.engines;
        match self.config.mapping {
            Mapping::Local => LOCAL_ENGINE.with(|e| *e) % k,
            Mapping::Global => self.round_robin.fetch_add(1, Ordering::Relaxed) % k,
        }
    }

    /// Queues a cell on an engine; a queue that stays full makes the job run
    /// here and now in software.
    fn submit_cell(&self, cell: &Cell) {
        let index = self.pick_engine();
        let engine = &self.shared.engines[index];
        // SAFETY: the cell's group lives as long as the cell (same batch).
        let group = unsafe { &*cell.group };
        group.outstanding.fetch_add(1, Ordering::AcqRel);
        let mut desc = Descriptor(cell as *const Cell);
        for attempt in 0..=self.config.submit_retries {
            match engine.queue.push(desc) {
                Ok(()) => {
                    engine.notify();
                    return;
                }
                Err(back) => {
                    desc = back;
                    if attempt < self.config.submit_retries {
                        engine
                            .counters
                            .queue_full_retries
                            .fetch_add(1, Ordering::Relaxed);
                        std::hint::spin_loop();
                    }
                }
            }
        }
        group.outstanding.fetch_sub(1, Ordering::AcqRel);
        engine.counters.sw_fallbacks.fetch_add(1, Ordering::Relaxed);
        if cell.claim() {
            self.shared.execute(cell, &self.shared.caller);
        }
    }

    /// Blocks until engines have released every queue entry of `group`.
    /// Polls first, then sleeps on the futex; if nothing moves for the stall
    /// timeout, it drains the queues itself, acting as the engine.
    fn wait_group(&self, group: &Group) {
        let polling_since = Instant::now();
        let mut last_seen = u32::MAX;
        let mut last_progress = None::<Instant>;
        loop {
            let value = group.outstanding.load(Ordering::Acquire);
            let count = value & !SLEEPING;
            if count == 0 {
                return;
            }
            let now = Instant::now();
            if now - polling_since < self.config.wait_poll {
                std::thread::yield_now();
                continue;
            }
            if count != last_seen {
                last_seen = count;
                last_progress = Some(now);
            } else if last_progress.is_some_and(|t| now - t >= self.config.stall_timeout) {
                self.recover_stalled();
                last_progress = Some(Instant::now());
                continue;
            }
            let sleeping = value | SLEEPING;
            if value == sleeping
                || group
                    .outstanding
                    .compare_exchange(value, sleeping, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                super::futex::wait(&group.outstanding, sleeping, self.config.stall_timeout / 4);
            }
        }
    }

    /// Takes every queued entry off every paused-or-stuck engine's queue and
    /// runs it here.
    fn recover_stalled(&self) {
        for engine in &self.shared.engines {
            while let Some(desc) = engine.queue.pop() {
                engine
                    .counters
                    .stall_recoveries
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.process(desc, &self.shared.caller);
            }
        }
    }

    /// Runs `f` with a [`Scope`] for submitting single jobs and polling them;
    /// returns only when every job submitted in it has finished.
    ///
    /// Buffers lent to the scope must be borrowed from outside `f`: they have
    /// to outlive the scope, which waits for the engines only after `f`
    /// returns. The types enforce this (`accel/device.rs` explains how), so
    /// misuse does not compile; see [`Scope::submit`], [`Scope::wait`] and
    /// [`Ticket`].
    ///
    /// ```
    /// use uswap::accel::{Device, DeviceConfig, Op};
    /// use uswap::codec::{by_name, Codec};
    ///
    /// let device = Device::new(DeviceConfig::with_engines(2)).unwrap();
    /// let codec = by_name("lz4").unwrap();
    /// let page = vec![7u8; 4096];
    /// let mut out = vec![0u8; 4096];
    /// let compressed = device.scope(|s| {
    ///     let ticket = s.submit(codec.as_ref(), Op::Compress, &page, &mut out);
    ///     let (result, out) = s.wait(ticket);
    ///     out[..result.unwrap()].to_vec()
    /// });
    /// let mut back = vec![0u8; 4096];
    /// codec.decompress(&compressed, &mut back).unwrap();
    /// assert_eq!(back, page);
    /// ```
    pub fn scope<'env, F, R>(&'env self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    {
        // Dropped when this returns or unwinds, after `f`: that drop waits
        // for the engines.
        let records = ScopeRecords {
            device: self,
            group: Group::new(),
            cells: RefCell::new(Vec::new()),
        };
        f(&Scope {
            records: &records,
            scope: PhantomData,
            env: PhantomData,
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DeviceStats {
        DeviceStats {
            engines: self
                .shared
                .engines
                .iter()
                .map(|e| e.counters.snapshot())
                .collect(),
            caller: self.shared.caller.snapshot(),
        }
    }

    /// Fault injection: the next `count` compressed results get one byte
    /// flipped, as a faulty engine would return them.
    pub fn inject_corruption(&self, count: u32) {
        self.shared.corrupt_next.fetch_add(count, Ordering::Relaxed);
    }

    /// Fault injection: a paused engine stops taking jobs from its queue (an
    /// engine that stops answering).
    pub fn pause_engine(&self, index: usize, paused: bool) {
        let engine = &self.shared.engines[index];
        engine.paused.store(paused, Ordering::Release);
        engine.kick();
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for engine in &self.shared.engines {
            engine.kick();
        }
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

fn new_cell(codec: &dyn Codec, op: Op, job: &mut Job<'_>, group: &Group) -> Cell {
    Cell {
        state: AtomicU32::new(PENDING),
        op,
        // SAFETY: only the trait object's lifetime is erased; the batch that
        // owns this cell outlives every use of the pointer (module docs).
        codec: unsafe {
            std::mem::transmute::<*const (dyn Codec + '_), *const (dyn Codec + 'static)>(codec)
        },
        src: job.src.as_ptr(),
        src_len: job.src.len(),
        dst: job.dst.as_mut_ptr(),
        dst_len: job.dst.len(),
        result: UnsafeCell::new(None),
        group: group as *const Group,
    }
}

/// Waits for a batch's queue entries on every exit path, unwinding included.
struct WaitGuard<'a> {
    device: &'a Device,
    group: &'a Group,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.device.wait_group(self.group);
    }
}

/// A handle to one job submitted in a [`Scope`]. Waiting consumes it and
/// gives the output buffer back.
///
/// A ticket works only in the scope that issued it. Waiting it in another
/// scope does not compile:
///
/// ```compile_fail,E0521
/// use uswap::accel::{Device, Op};
/// use uswap::codec::by_name;
///
/// let device = Device::synchronous();
/// let codec = by_name("lz4").unwrap();
/// let page = vec![7u8; 4096];
/// let mut out = vec![0u8; 4096];
/// device.scope(|outer| {
///     let ticket = outer.submit(codec.as_ref(), Op::Compress, &page, &mut out);
///     device.scope(|inner| {
///         let _ = inner.wait(ticket);
///     });
/// });
/// ```
///
/// Nor can a ticket leave its scope to be waited in a later one:
///
/// ```compile_fail
/// use uswap::accel::{Device, Op};
/// use uswap::codec::by_name;
///
/// let device = Device::synchronous();
/// let codec = by_name("lz4").unwrap();
/// let page = vec![7u8; 4096];
/// let mut out = vec![0u8; 4096];
/// let ticket = device.scope(|first| first.submit(codec.as_ref(), Op::Compress, &page, &mut out));
/// device.scope(|second| {
///     let _ = second.wait(ticket);
/// });
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket<'scope> {
    index: usize,
    /// The issuing scope's brand, invariant for the same reason as in
    /// [`Scope`].
    scope: PhantomData<&'scope mut &'scope ()>,
}

/// Single-job submission: `submit`, then `poll` or `wait`. Made by
/// [`Device::scope`].
///
/// `'scope` is the scope itself: buffers are lent to it for `'scope`, and
/// its tickets carry it. `'env` is the borrow of the device, which outlives
/// the scope.
pub struct Scope<'scope, 'env: 'scope> {
    records: &'scope ScopeRecords<'env>,
    // Invariance in both lifetimes keeps a scope from being passed off as a
    // shorter-lived one (module docs, "Why the borrowed buffers are safe").
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// The completion records of a scope's jobs. Dropping it waits until the
/// engines have released every one; it is kept apart from [`Scope`] because
/// a value borrowed for its own invariant lifetime, as the scope is, must
/// not have a drop that uses it.
struct ScopeRecords<'env> {
    device: &'env Device,
    group: Group,
    // Boxed: engines hold pointers to the cells, so a cell must not move
    // when the vector grows.
    #[allow(clippy::vec_box)]
    cells: RefCell<Vec<Box<Cell>>>,
}

impl Drop for ScopeRecords<'_> {
    fn drop(&mut self) {
        self.device.wait_group(&self.group);
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Submits one job. Never blocks: a full queue falls back to running the
    /// job here (and with no engines every job runs here).
    ///
    /// The buffers must outlive the scope. A buffer that would die before
    /// the scope ends (here, when the closure returns, while an engine may
    /// still be writing to it) does not compile:
    ///
    /// ```compile_fail,E0597
    /// use uswap::accel::{Device, Op};
    /// use uswap::codec::by_name;
    ///
    /// let device = Device::synchronous();
    /// let codec = by_name("lz4").unwrap();
    /// let page = vec![7u8; 4096];
    /// device.scope(|s| {
    ///     let mut out = vec![0u8; 4096];
    ///     s.submit(codec.as_ref(), Op::Compress, &page, &mut out);
    /// });
    /// ```
    pub fn submit(
        &self,
        codec: &'scope dyn Codec,
        op: Op,
        src: &'scope [u8],
        dst: &'scope mut [u8],
    ) -> Ticket<'scope> {
        let mut job = Job::new(src, dst);
        let records = self.records;
        let cell = Box::new(new_cell(codec, op, &mut job, &records.group));
        // Own the cell before any engine can see it, so that it is freed only
        // after the scope's final wait, whatever happens below.
        let index = {
            let mut cells = records.cells.borrow_mut();
            cells.push(cell);
            cells.len() - 1
        };
        let cells = records.cells.borrow();
        let cell = &cells[index];
        let device = records.device;
        if device.config.engines == 0 {
            if cell.claim() {
                device.shared.execute(cell, &device.shared.caller);
            }
        } else {
            device.submit_cell(cell);
        }
        Ticket {
            index,
            scope: PhantomData,
        }
    }

    /// The job's result if it has finished, `None` while it runs.
    pub fn poll(&self, ticket: &Ticket<'scope>) -> Option<Result<usize, JobError>> {
        self.records.cells.borrow()[ticket.index].result()
    }

    /// Waits for the job (running it here if no engine has started it and
    /// caller assist is on, and meanwhile running later jobs of the scope
    /// that no engine has started); returns its result and its output
    /// buffer.
    ///
    /// Waiting consumes the ticket, so one job's buffer cannot be handed back
    /// twice; a second wait does not compile:
    ///
    /// ```compile_fail,E0382
    /// use uswap::accel::{Device, Op};
    /// use uswap::codec::by_name;
    ///
    /// let device = Device::synchronous();
    /// let codec = by_name("lz4").unwrap();
    /// let page = vec![7u8; 4096];
    /// let mut out = vec![0u8; 4096];
    /// device.scope(|s| {
    ///     let ticket = s.submit(codec.as_ref(), Op::Compress, &page, &mut out);
    ///     let (_, first) = s.wait(ticket);
    ///     let (_, second) = s.wait(ticket);
    ///     first[0] = second[0];
    /// });
    /// ```
    pub fn wait(&self, ticket: Ticket<'scope>) -> (Result<usize, JobError>, &'scope mut [u8]) {
        let device = self.records.device;
        let cells = self.records.cells.borrow();
        let cell = &cells[ticket.index];
        if device.config.caller_assist && cell.claim() {
            device.shared.execute(cell, &device.shared.caller);
        }
        let start = Instant::now();
        while !cell.is_done() {
            // An engine has it: rather than spin, run the newest job of this
            // scope that no engine has started (jobs before this one were
            // waited for already). Spin only when every job is taken.
            if device.config.caller_assist {
                if let Some(other) = cells[ticket.index + 1..].iter().rev().find(|c| c.claim()) {
                    device.shared.execute(other, &device.shared.caller);
                    continue;
                }
            }
            let waited = start.elapsed();
            if waited >= device.config.stall_timeout {
                device.recover_stalled();
            }
            // Poll a while (a job is tens of microseconds), then sleep until
            // the engine is done: spinning on yield would take a CPU the
            // engines and the program need. A job no engine has begun by
            // then waits behind others: the caller runs it itself (there is
            // nothing to sleep on, and spinning until an engine frees up
            // took the CPU from the very engines it waited for: with no
            // poll at all, a usemem run went from 9 s to 164 s).
            if waited < device.config.wait_poll {
                std::thread::yield_now();
            } else if cell.claim() {
                device.shared.execute(cell, &device.shared.caller);
            } else {
                cell.sleep_until_done(device.config.stall_timeout / 4);
            }
        }
        let result = cell.result().expect("a finished job has a result");
        // SAFETY: the buffer was lent to `submit` for 'scope and the job is
        // done, so no engine touches it again. The ticket is consumed and
        // belongs to this scope (its brand), so this is the only time this
        // record's buffer is handed back (module docs).
        let dst = unsafe { std::slice::from_raw_parts_mut(cell.dst, cell.dst_len) };
        (result, dst)
    }
}

//! `mm`: transparent compressed paging with userfaultfd.
//!
//! A [`Runtime`] manages [`Region`]s of anonymous memory. The first touch of
//! a folio installs zero pages; when the resident managed memory passes
//! `memory_high`, the reclaimer ([`reclaim`]) evicts cold folios through the
//! compressed store in plugged batches; a touch of an evicted folio raises a
//! userfaultfd fault that is served ([`fault`]) by loading the folio (plus
//! readahead) and installing it ([`swapin`]). What the program does to its
//! memory (madvise, munmap, mremap, fork) arrives as events ([`events`]).
//!
//! Files, by path: `uffd` (the typed userfaultfd layer), `space` (address
//! spaces, regions, extras), `folio` (folio states), `fault` (the event
//! thread and the fillers), `swapin` (the one swap-in routine), `reclaim`
//! (the one eviction routine), `events` (the program's memory events),
//! `config`, `counters`.
//!
//! # Threads
//!
//! One event thread reads every address space's userfaultfd and never
//! blocks on anything but the locks below (our own MADV_DONTNEED and the
//! program's madvise, munmap, mremap and fork wait until their event is
//! read); filler threads serve faults that must wait for reclaim; one
//! reclaimer evicts.
//!
//! # The event gate
//!
//! An event is read before its effect is final (the kernel zaps a
//! MADV_DONTNEED range after its REMOVE event is read; a fork copies the page
//! tables, then waits for its FORK event), and once it is read, installs no
//! longer answer EAGAIN. So that no install lands on the wrong side of an
//! event, [`Shared::gate`] orders them: the event thread reads, and applies
//! what it read to the bookkeeping, under the gate's write side; any other
//! thread makes each install attempt, and publishes a folio's end state,
//! under its read side, and releases it before waiting out an EAGAIN. An
//! install therefore either happened before the event was read (and the
//! event's effect covers it) or sees the event's bookkeeping. The one
//! exception, events read while the program forks (the gate is the forker's
//! then), is closed by [`Shared::read_gate`].
//!
//! # Lock order
//!
//! `gate` -> `spaces` -> a space's `regions` -> `inheritors` -> a space's
//! `unsettled_drops` -> a space's `extras` -> `fifo` / `given_up` /
//! `own_drops` / `faults` / `reclaimed` / a region's `unmapped` (leaves). Folio
//! words are atomics; a busy state (ZEROING, LOADING, EVICTING) makes its
//! setter the folio's only writer until it publishes the next state.
//!
//! Eviction never loses a write: a folio is write-protected before it is
//! copied out, a writer meanwhile waits on a write-protect fault, and it is
//! woken only once the folio is either stored and dropped (it then refaults
//! and gets the stored data back) or refused and unprotected (its write
//! lands in place).

mod attached;
mod config;
mod counters;
mod events;
mod fault;
mod folio;
mod fork;
mod latency;
pub mod memory;
mod reclaim;
mod region;
mod scratch;
mod space;
mod swapin;
pub mod uffd;

pub use attached::{Attached, BEACON_SPAN};
pub use config::{BadConfig, BatchSize, Builder, EventReaders, RuntimeConfig};
pub use counters::RuntimeStats;
pub use latency::Latencies;
pub use region::Region;

use crate::accel::{Device, DeviceConfig};
use crate::page::PAGE_SIZE;
use crate::swap::{Backing, SwapFile};
use crate::zswap::{PoolLimit, Zswap, ZswapConfig};
use counters::{Counters, Gauges};
use events::Inheritor;
use fault::FillerJob;
use memory::Memory;
use scratch::Scratch;
use space::{Owner, RegionInner, Space};
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use swapin::Worker;
use uffd::{Features, Uffd, UffdError};

/// A folio in the reclaim FIFO.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FolioRef {
    pub space: u32,
    pub region: u32,
    pub folio: u32,
}

/// One of the reclaimer's own MADV_DONTNEEDs and how far its REMOVE events
/// have come (see [`Shared::is_own_drop`]). The call returns as soon as the event
/// thread has read its events, which may be well before it applies them
/// (while the program forks), so the record outlives the call: the event
/// thread forgets it once it has applied every read up to the one current
/// when the call returned.
struct OwnDrop {
    /// The address space dropped from.
    space: u32,
    start: usize,
    end: usize,
    /// The end of the part from `start` on that the events taken as this
    /// drop's cover.
    cursor: usize,
    /// The start of the last event taken as this drop's, if any.
    last_start: Option<usize>,
    /// The event thread's read count when the call returned, once it has.
    returned_at: Option<u64>,
}

/// The reclaimer's drop in place in flight, for the event thread to read
/// without a lock: it reads while the program forks, when a lock's holder
/// may be waiting on malloc. A sequence lock: `seq` is odd while the one
/// writer (the reclaimer) changes the fields, and a reader tries again
/// when it changed under it; its even value names the drop.
#[derive(Default)]
struct DropInFlight {
    seq: AtomicU64,
    /// Space id + 1; 0: no drop in flight.
    space: AtomicU32,
    start: AtomicUsize,
    end: AtomicUsize,
}

impl DropInFlight {
    /// The drop now in flight: (space, start, end), or none.
    fn set(&self, drop: Option<(u32, usize, usize)>) {
        let (space, start, end) = drop.map_or((0, 0, 0), |(s, a, b)| (s + 1, a, b));
        self.seq.fetch_add(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        self.space.store(space, Ordering::Relaxed);
        self.start.store(start, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// The drop in flight: (generation, space, start, end).
    fn get(&self) -> Option<(u64, u32, usize, usize)> {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                std::thread::yield_now();
                continue;
            }
            let space = self.space.load(Ordering::Relaxed);
            let start = self.start.load(Ordering::Relaxed);
            let end = self.end.load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == seq {
                return (space != 0).then(|| (seq, space - 1, start, end));
            }
        }
    }
}

/// Everything the runtime's threads share.
pub(crate) struct Shared {
    pub config: RuntimeConfig,
    pub store: Zswap,
    /// Read side: an install attempt or a folio's final publication; write
    /// side: the event thread reading and applying events (see the module
    /// docs).
    pub gate: RwLock<()>,
    /// The address spaces served; the runtime's own first.
    pub spaces: RwLock<Vec<Arc<Space>>>,
    next_space: AtomicU32,
    next_region: AtomicU32,
    /// Forked children's folios waiting for their parent's eviction to end.
    pub inheritors: Mutex<Vec<Inheritor>>,
    /// Resident managed memory of the runtime's own space, in bytes.
    pub resident: AtomicUsize,
    /// The part of `resident` in UNFIT folios (out of the reclaim queue; see
    /// `folio::UNFIT`).
    pub unfit: AtomicUsize,
    /// Folios the reclaimer holds taken for eviction (EVICTING), in its
    /// plugs or in a flush: raised as it takes one, lowered only once the
    /// folio's flush has finished with it (its eviction counted, or the
    /// folio left resident), so that a reader that sees it at zero after
    /// an Acquire load sees every count those folios made.
    pub evicting: AtomicUsize,
    /// The limit now (`config.memory_high` at start; see
    /// [`Runtime::set_memory_high`]).
    memory_high: AtomicUsize,
    /// Own-space folios in fault-in order.
    pub fifo: Mutex<VecDeque<FolioRef>>,
    /// Folios given up whole that the reclaimer found with pages still
    /// there in their grace (`folio::DROPPED`): looked at again before the
    /// queue, a few at a time, until their pages are gone or the grace is
    /// over, so that the memory they held is the first to go without
    /// another folio evicted in their place.
    pub given_up: Mutex<VecDeque<FolioRef>>,
    /// Folios of processes found stopped (`Memory::held`), per address
    /// space, out of the queue until their process runs again (looked at
    /// every `memory::STOPPED_RECHECK`, see `reclaim::release_held_back`):
    /// left in the queue, they would be walked past at every look for a
    /// victim. Taken by the reclaimer alone, before `fifo` where both are.
    pub held_back: Mutex<reclaim::HeldBack>,
    /// Workingset clock: folios evicted so far.
    pub evictions: AtomicU32,
    /// The runtime's clock starts here (see [`Shared::now_ms`]).
    started_at: std::time::Instant,
    pub reclaim_signal: (Mutex<bool>, Condvar),
    /// Notified after every reclaim batch (throttled faults wait on it).
    pub reclaimed: (Mutex<()>, Condvar),
    /// The reclaimer could not free anything: throttling would wait forever.
    pub reclaim_stuck: AtomicBool,
    /// When the discard the reclaimer is in began (`now_ms` + 1, never 0),
    /// or 0 outside one; set by the reclaimer alone (see
    /// [`Shared::discard_stalled`]).
    pub discard_since: AtomicU32,
    /// Faults handed to the fillers because they must wait for room, and
    /// not yet served. While there are any, the event thread hands on every
    /// fault that needs room too, so that room the reclaimer frees goes to
    /// the faults that waited first instead of to the next one read.
    pub waiting_for_room: AtomicUsize,
    /// Tests: a flush stops before it write-protects its folios (taken for
    /// eviction already) while armed (see [`Runtime::hold_next_flush`]).
    #[cfg(feature = "fault-injection")]
    pub flush_hold: Hold,
    /// Tests: a flush stops before its discard while armed (see
    /// [`Runtime::hold_next_discard`]).
    #[cfg(feature = "fault-injection")]
    pub discard_hold: Hold,
    /// Tests: a flush stops after its discard, before it finishes its
    /// folios, while armed (see [`Runtime::hold_next_finish`]).
    #[cfg(feature = "fault-injection")]
    pub finish_hold: Hold,
    /// Tests: the event thread stops before it serves its follow-ups while
    /// armed (see [`Runtime::hold_next_follow_ups`]).
    #[cfg(feature = "fault-injection")]
    pub follow_up_hold: Hold,
    /// Tests: a flush stops under the settled gate, just before it moves
    /// stored pages out (the first moves of all its runs together, or a
    /// later move of one run), while armed (see
    /// [`Runtime::hold_next_move`]).
    #[cfg(feature = "fault-injection")]
    pub move_hold: Hold,
    /// Tests: a drop in place stops once it is checked and taken for the
    /// reclaimer's, with the gate let go, just before it drops, while armed
    /// (see [`Runtime::hold_next_drop`]).
    #[cfg(feature = "fault-injection")]
    pub drop_hold: Hold,
    /// Tests: the event thread stops before reading an own drop's event
    /// while armed (see [`Runtime::hold_events_at_next_drop`]).
    #[cfg(feature = "fault-injection")]
    pub event_hold: Hold,
    /// Tests: a finishing flush stops just before it lifts the protection
    /// of a folio whose eviction was refused, while armed (see
    /// [`Runtime::hold_next_lift`]).
    #[cfg(feature = "fault-injection")]
    pub lift_hold: Hold,
    /// Tests: a fault server stops just before it installs a zero page in
    /// a hole of a resident folio, while armed (see
    /// [`Runtime::hold_next_hole_fill`]).
    #[cfg(feature = "fault-injection")]
    pub hole_hold: Hold,
    /// Tests: an install stops just before its copy to `slip_at`, while
    /// armed, and once released takes the kernel's answer to a move that
    /// slipped in (see [`Runtime::hold_next_install_at`]).
    #[cfg(feature = "fault-injection")]
    pub slip_hold: Hold,
    #[cfg(feature = "fault-injection")]
    pub slip_at: AtomicUsize,
    /// Tests: times the event thread found the gate held when it came to
    /// read (see [`Runtime::gate_waits`]).
    #[cfg(feature = "fault-injection")]
    pub gate_waits: AtomicU64,
    /// Turns at the room the reclaimer frees, first come first served
    /// between the fillers: (next ticket, ticket now served).
    pub room_turns: (AtomicU64, AtomicU64),
    own_drops: Mutex<Vec<OwnDrop>>,
    /// The reclaimer's drop in place in flight (its call has not returned).
    /// The reclaimer makes one at a time.
    dropping: DropInFlight,
    /// Reads of the userfaultfds the event thread has begun.
    pub reads: AtomicU64,
    pub reclaimer_tid: AtomicI32,
    /// Write protection lifted by a fault server (see [`Unprotects`]).
    pub unprotects: Unprotects,
    /// The fillers' work: faults that must wait for room, folios handed
    /// on to be brought in.
    pub faults: (Mutex<VecDeque<FillerJob>>, Condvar),
    /// Jobs queued for the fillers or being done by them.
    pub filler_jobs: AtomicUsize,
    /// Whether handing swap-ins to the fillers has paid lately.
    pub handoff_pays: fault::HandoffPays,
    pub counters: Counters,
    /// Forked children that touched their beacon page: pid -> space id
    /// (see [`Runtime::adopt`]).
    pub beacon_hits: Mutex<std::collections::HashMap<i32, u32>>,
    /// Page faults, from read to served (see [`latency`]).
    pub fault_latency: latency::Histogram,
    pub shutdown: AtomicBool,
    /// An eventfd in every poll of the event readers until `shutdown` is
    /// set, and readable from then on: a reader asleep in poll then wakes
    /// at once rather than at its timeout
    /// (`RuntimeConfig::event_poll_timeout`), which every runtime's end
    /// paid, as the event thread ends last.
    pub wake_readers: OwnedFd,
    /// An eventfd in every poll of the event readers, made readable when a
    /// space is attached from outside them ([`Shared::announce_space`]):
    /// a reader asleep in poll watches only the spaces there were when it
    /// went to sleep, and a new process's faults would otherwise wait for
    /// its timeout. Spaces of forked children need none: the event thread,
    /// which reads their fork, reads them from then on.
    pub spaces_added: OwnedFd,
    /// The program is forking (see [`fork`]).
    pub fork_pending: AtomicBool,
    /// The event thread has read events while the program forked and not
    /// yet applied them (see [`Shared::read_gate`]).
    pub unapplied: AtomicBool,
    /// This is a forked child's copy of the runtime: none of its threads
    /// exist here and its descriptors act on the parent, so it does nothing.
    pub forked_copy: AtomicBool,
    /// Handles (the runtime and its regions) still held by users.
    users: AtomicUsize,
    /// The runtime is ending and its threads other than the event thread
    /// have ended.
    pub helpers_ended: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Threads that have made their start-up allocations (see
    /// [`Shared::thread_started`]).
    started: (Mutex<usize>, Condvar),
}

/// Write-protect faults being served, and protections lifted.
///
/// A fault server decides to lift a page's protection from the folio's
/// state, then lifts it with an ioctl: in between, the folio may have been
/// taken for eviction (write-protected, copied out) or brought back CLEAN
/// (installed write-protected), and the lifted protection would let a write
/// in that the copy does not hold. So a server counts itself in before it
/// reads the state ([`Unprotects::begin`]) and out after the ioctl, and
/// whoever relies on a protection it set checks, before relying on it, that
/// no lift may have crossed it: the reclaimer before it discards a copied
/// folio, a swap-in before it publishes a folio CLEAN. Lifts are rare (stale
/// protections, first writes to clean folios) and remembered with their
/// ranges, so that one crosses only what it overlaps.
#[derive(Default)]
pub(crate) struct Unprotects {
    in_flight: AtomicUsize,
    /// Protections lifted so far.
    lifted: AtomicU64,
    /// The latest lifts: (number, space id, start, length).
    recent: Mutex<VecDeque<(u64, u32, usize, usize)>>,
}

/// Lifts remembered for [`Unprotects::none_since`].
const RECENT_LIFTS: usize = 64;

/// How long a discard lasts before faults stop waiting for the reclaimer
/// (see [`Shared::discard_stalled`]): a move out of a whole batch answers
/// within a millisecond or two even on a busy machine, and a fault that
/// waits for room waits in steps of 5 ms.
const DISCARD_STALL_MS: u32 = 50;

impl Unprotects {
    /// A write-protect fault is being served (before its folio is looked at).
    pub fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// Its service ended, having lifted the protection of `lifted` (space
    /// id, start, length) if any.
    pub fn end(&self, lifted: Option<(u32, usize, usize)>) {
        if let Some((space, start, len)) = lifted {
            let mut recent = self.recent.lock().expect("lifts lock");
            let n = self.lifted.fetch_add(1, Ordering::SeqCst) + 1;
            if recent.len() == RECENT_LIFTS {
                recent.pop_front();
            }
            recent.push_back((n, space, start, len));
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// A mark to compare with later (taken before setting a protection).
    pub fn mark(&self) -> u64 {
        self.lifted.load(Ordering::SeqCst)
    }

    /// Whether no protection in `start..start + len` of space `space` was
    /// lifted since `mark`, once the services in flight have ended (they
    /// never wait for anything a caller holds). Lifts too old to remember
    /// count as crossing.
    pub fn none_since(&self, mark: u64, space: u32, start: usize, len: usize) -> bool {
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        // The common case, on every flush run and clean publication: no
        // lift at all, and no lock to take.
        if self.lifted.load(Ordering::SeqCst) == mark {
            return true;
        }
        let recent = self.recent.lock().expect("lifts lock");
        let remembered = recent.front().is_some_and(|&(n, ..)| n <= mark + 1);
        remembered
            && recent
                .iter()
                .filter(|&&(n, ..)| n > mark)
                .all(|&(_, s, a, l)| s != space || a + l <= start || start + len <= a)
    }
}

/// The compressed paging runtime.
pub struct Runtime {
    shared: Arc<Shared>,
}

impl Runtime {
    /// Starts a runtime: the store, the device, and the event, filler and
    /// reclaimer threads.
    pub fn new(config: RuntimeConfig) -> io::Result<Runtime> {
        config.validate()?;
        let device = Arc::new(Device::new(DeviceConfig::for_runtime(config.engines))?);
        let backing: Option<Arc<dyn Backing>> = match &config.swap_file {
            Some((dir, bytes)) => Some(Arc::new(SwapFile::create(dir, *bytes)?)),
            None => None,
        };
        let store_config = ZswapConfig {
            compressor: config.compressor.clone(),
            max_pool: match config.max_pool_bytes {
                Some(b) => PoolLimit::Bytes(b),
                None => PoolLimit::Percent {
                    percent: config.max_pool_percent,
                    of_bytes: crate::zswap::physical_memory(),
                },
            },
            accept_threshold_percent: config.accept_threshold_percent,
            slots: config.swap_slots,
            free_mode: config.slot_free,
            batching: true,
            writeback_worker: true,
            layout: config.layout,
            ..ZswapConfig::default()
        };
        let store = Zswap::new(store_config, device, backing)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let uffd = Uffd::open(Features {
            fork: config.serve_forks,
        })?;
        let scratch = if config.discard_by_move {
            Scratch::new(&uffd)
        } else {
            None
        };
        let wake_readers = crate::sys::eventfd()?;
        let spaces_added = crate::sys::eventfd()?;
        let shared = Arc::new(Shared {
            store,
            gate: RwLock::new(()),
            spaces: RwLock::new(vec![Arc::new(Space::new(
                0,
                uffd,
                Owner::Runtime,
                Some(Memory::own(scratch)?),
                None,
            ))]),
            next_space: AtomicU32::new(1),
            next_region: AtomicU32::new(0),
            inheritors: Mutex::new(Vec::new()),
            resident: AtomicUsize::new(0),
            unfit: AtomicUsize::new(0),
            evicting: AtomicUsize::new(0),
            memory_high: AtomicUsize::new(config.memory_high),
            fifo: Mutex::new(VecDeque::new()),
            given_up: Mutex::new(VecDeque::new()),
            held_back: Mutex::new(reclaim::HeldBack::default()),
            evictions: AtomicU32::new(0),
            started_at: std::time::Instant::now(),
            reclaim_signal: (Mutex::new(false), Condvar::new()),
            reclaimed: (Mutex::new(()), Condvar::new()),
            reclaim_stuck: AtomicBool::new(false),
            discard_since: AtomicU32::new(0),
            waiting_for_room: AtomicUsize::new(0),
            #[cfg(feature = "fault-injection")]
            flush_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            discard_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            finish_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            follow_up_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            move_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            drop_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            event_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            lift_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            hole_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            slip_hold: Hold::new(),
            #[cfg(feature = "fault-injection")]
            slip_at: AtomicUsize::new(0),
            #[cfg(feature = "fault-injection")]
            gate_waits: AtomicU64::new(0),
            room_turns: (AtomicU64::new(0), AtomicU64::new(0)),
            own_drops: Mutex::new(Vec::new()),
            dropping: DropInFlight::default(),
            reads: AtomicU64::new(0),
            reclaimer_tid: AtomicI32::new(0),
            unprotects: Unprotects::default(),
            faults: (Mutex::new(VecDeque::new()), Condvar::new()),
            filler_jobs: AtomicUsize::new(0),
            handoff_pays: fault::HandoffPays::new(),
            counters: Counters::default(),
            fault_latency: latency::Histogram::default(),
            beacon_hits: Mutex::new(std::collections::HashMap::new()),
            shutdown: AtomicBool::new(false),
            wake_readers,
            spaces_added,
            fork_pending: AtomicBool::new(false),
            unapplied: AtomicBool::new(false),
            forked_copy: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            helpers_ended: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            started: (Mutex::new(0), Condvar::new()),
            config,
        });
        let runtime = Runtime {
            shared: shared.clone(),
        };
        fork::register(&shared);
        // On error, dropping `runtime` stops the threads already started.
        let spawn = |name: String, f: fn(&Shared)| -> io::Result<()> {
            let s = shared.clone();
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || fail_loudly(&name, || f(&s)))?;
            shared.threads.lock().expect("threads lock").push(handle);
            Ok(())
        };
        spawn("uswap-uffd".into(), fault::event_loop)?;
        for i in 0..shared.config.fillers.max(1) {
            spawn(format!("uswap-fill-{i}"), fault::filler_loop)?;
        }
        spawn("uswap-reclaim".into(), reclaim::reclaim_loop)?;
        // A thread's first allocation takes glibc's arena list lock, which a
        // fork holds from before it enters the kernel until the event thread
        // has read its event: a program that forked before the event thread
        // had allocated its first bytes would hang. So the runtime is handed
        // out only once every thread is past its start-up allocations.
        let spawned = shared.threads.lock().expect("threads lock").len();
        let (count, cv) = &shared.started;
        let guard = count.lock().expect("started lock");
        drop(
            cv.wait_while(guard, |n| *n < spawned)
                .expect("started lock"),
        );
        Ok(runtime)
    }

    /// A builder with the defaults.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// The knobs in force.
    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }

    /// Maps `len` bytes (rounded up to whole folios) of managed anonymous
    /// memory.
    pub fn map(&self, len: usize) -> io::Result<Region> {
        let fs = self.shared.config.folio_size;
        let len = len.div_ceil(fs).max(1) * fs;
        // Over-map by a folio so the region can start folio-aligned.
        let raw = crate::sys::map_anonymous(len + fs)?.as_ptr() as usize;
        let base = raw.next_multiple_of(fs);
        // SAFETY: trimming the unaligned head and tail of our own mapping,
        // and advice on what remains.
        unsafe {
            if base > raw {
                libc::munmap(raw as *mut _, base - raw);
            }
            let tail = raw + len + fs - (base + len);
            if tail > 0 {
                libc::munmap((base + len) as *mut _, tail);
            }
            // Large folios are our unit; the kernel's THP would only get in
            // the way of page-granular faults.
            libc::madvise(base as *mut _, len, libc::MADV_NOHUGEPAGE);
        }
        self.register(base, len, folio::UNTOUCHED, true)
    }

    /// Manages an existing private anonymous mapping (`ptr` and `len` whole
    /// folios, folio-aligned). Its present contents count as resident.
    /// Dropping the region gives the mapping back intact (a folio whose
    /// stored data is unusable comes back poisoned: a touch raises SIGBUS).
    ///
    /// Memory this runtime manages already is refused (InvalidInput).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be a private anonymous mapping that stays mapped
    /// while the region lives (the program may still move or unmap it
    /// through the kernel; the runtime follows).
    pub unsafe fn manage(&self, ptr: *mut u8, len: usize) -> io::Result<Region> {
        let fs = self.shared.config.folio_size;
        let base = ptr as usize;
        if !base.is_multiple_of(fs) || !len.is_multiple_of(fs) || len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "manage: the range must be whole, aligned folios",
            ));
        }
        self.register(base, len, folio::RESIDENT, false)
    }

    fn register(&self, base: usize, len: usize, initial: u64, owned: bool) -> io::Result<Region> {
        let shared = &self.shared;
        let own = shared.own_space();
        // Under the gate: an unmap (or a mapping made over older memory)
        // returns once its event is read, which is applied under the gate's
        // write side; entered before that, the new region would take the
        // older memory's event for its own and be given up whole.
        let _gate = shared.read_gate();
        // Two regions over the same pages would each take the other's
        // evictions and swap-ins for their own. (The parts of a region the
        // program unmapped or moved away are not its any more; a mapping
        // the runtime made just now is no region's.)
        let end = base + len;
        if !owned
            && own.overlapping(base, end).iter().any(|r| {
                let (lo, hi) = (base.max(r.base()), end.min(r.base() + r.len));
                !r.all_gone(&r.gaps(), lo, hi)
            })
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("manage: {base:#x}+{len:#x} is managed already"),
            ));
        }
        let id = shared.next_region.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(RegionInner::new(
            id,
            base,
            len,
            shared.config.folio_size,
            initial,
            owned,
        ));
        own.regions
            .write()
            .expect("regions lock")
            .push(inner.clone());
        if let Err(e) = own.uffd.register(base, len) {
            own.regions
                .write()
                .expect("regions lock")
                .retain(|r| r.id != id);
            if owned {
                // SAFETY: our own mapping, never handed out.
                unsafe { libc::munmap(base as *mut _, len) };
            }
            return Err(io::Error::other(format!(
                "registering with userfaultfd: {e}"
            )));
        }
        shared.count_resident_region(&own, &inner);
        shared.users.fetch_add(1, Ordering::AcqRel);
        Ok(Region {
            shared: shared.clone(),
            inner,
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RuntimeStats {
        self.shared.stats()
    }

    /// How long page faults took to serve, from their event being read to
    /// their handler being done.
    pub fn fault_latency(&self) -> Latencies {
        self.shared.fault_latency.snapshot()
    }

    /// How far resident memory may exceed `memory_high`.
    pub fn slack(&self) -> usize {
        self.shared.config.slack_at(self.memory_high())
    }

    /// How far under `memory_high` the reclaimer evicts once it passed it
    /// (its low mark).
    pub fn reclaim_margin(&self) -> usize {
        self.shared.reclaim_margin()
    }

    /// The limit now.
    pub fn memory_high(&self) -> usize {
        self.shared.memory_high()
    }

    /// Changes the limit (at least one folio), as a write to a cgroup's
    /// memory.high does: above it, the reclaimer evicts at once.
    pub fn set_memory_high(&self, bytes: usize) {
        let bytes = bytes.max(self.shared.config.folio_size);
        self.shared.memory_high.store(bytes, Ordering::Release);
        self.shared.kick_reclaim();
    }

    /// The store (statistics and slot accounting).
    pub fn store(&self) -> &Zswap {
        &self.shared.store
    }

    /// The first swap slot of the swapped folio holding `addr`, if it is
    /// swapped out now.
    pub fn swapped_slot(&self, addr: *const u8) -> Option<u32> {
        let (r, i) = self.shared.own_space().lookup(addr as usize)?;
        let w = r.folios[i].load();
        (folio::state(w) == folio::SWAPPED).then(|| folio::slot(w))
    }

    /// Whether the folio holding `addr` is swapped out now.
    pub fn is_swapped(&self, addr: *const u8) -> bool {
        self.swapped_slot(addr).is_some()
    }

    /// Wakes the reclaimer (it evicts whenever resident memory is above
    /// `memory_high`).
    pub fn reclaim_now(&self) {
        self.shared.kick_reclaim();
    }

    /// Tests: the next flush stops once its folios are taken for eviction
    /// (EVICTING), before it write-protects and copies them out, until
    /// [`Runtime::release_flush`]; so a test can act on the folios in that
    /// window as the program would.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_flush(&self) {
        self.shared.flush_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a flush is held before it
    /// write-protects its folios; false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_flush_held(&self) -> bool {
        self.shared.flush_hold.wait_held()
    }

    /// Tests: lets the held flush go on, and waits (at most ten seconds)
    /// until it has finished its folios.
    #[cfg(feature = "fault-injection")]
    pub fn release_flush(&self) {
        self.shared.flush_hold.release();
        self.shared.flush_hold.wait_over();
    }

    /// Tests: the next flush stops after its folios are stored and checked,
    /// before they are discarded, until [`Runtime::release_discard`]; so a
    /// test can change the address space in that window.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_discard(&self) {
        self.shared.discard_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a flush is held; false if
    /// none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_discard_held(&self) -> bool {
        self.shared.discard_hold.wait_held()
    }

    /// Tests: lets the held flush go on, and waits (at most ten seconds)
    /// until it has discarded what it was going to.
    #[cfg(feature = "fault-injection")]
    pub fn release_discard(&self) {
        self.shared.discard_hold.release();
        self.shared.discard_hold.wait_over();
    }

    /// Tests: the next flush stops after its folios are discarded, before
    /// it finishes them (they are still EVICTING), until
    /// [`Runtime::release_finish`].
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_finish(&self) {
        self.shared.finish_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a flush is held before its
    /// finish; false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_finish_held(&self) -> bool {
        self.shared.finish_hold.wait_held()
    }

    /// Tests: lets the flush held before its finish go on.
    #[cfg(feature = "fault-injection")]
    pub fn release_finish(&self) {
        self.shared.finish_hold.release();
    }

    /// Tests: the event thread stops before it serves its next follow-ups
    /// (the installs an mremap of stored pages or a fork calls for) until
    /// [`Runtime::release_follow_ups`], and then until the program forks
    /// (at most ten seconds): a test can release it, then fork, and the
    /// follow-ups wait for the fork's event.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_follow_ups(&self) {
        self.shared.follow_up_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until the event thread is held
    /// before its follow-ups; false if it was not.
    #[cfg(feature = "fault-injection")]
    pub fn wait_follow_ups_held(&self) -> bool {
        self.shared.follow_up_hold.wait_held()
    }

    /// Tests: lets the event thread held before its follow-ups go on once
    /// the program forks.
    #[cfg(feature = "fault-injection")]
    pub fn release_follow_ups(&self) {
        self.shared.follow_up_hold.release();
    }

    /// Tests: the next flush stops just before it moves stored pages out
    /// (the first moves of all its runs together), under the settled gate
    /// (no event is read meanwhile), until
    /// [`Runtime::release_move`]; so a test can change the address space
    /// in that window as another thread of a program would.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_move(&self) {
        self.shared.move_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a flush is held before its
    /// move; false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_move_held(&self) -> bool {
        self.shared.move_hold.wait_held()
    }

    /// Tests: lets the flush held before its move go on.
    #[cfg(feature = "fault-injection")]
    pub fn release_move(&self) {
        self.shared.move_hold.release();
    }

    /// Tests: the reclaimer's next drop in place stops once it is checked
    /// and taken for the reclaimer's, with the event gate let go, just
    /// before it drops, until [`Runtime::release_drop`]; so a test can act
    /// on the range in that window as another thread of a program would.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_drop(&self) {
        self.shared.drop_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a drop in place is held;
    /// false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_drop_held(&self) -> bool {
        self.shared.drop_hold.wait_held()
    }

    /// Tests: the range of the reclaimer's drop in place in flight in the
    /// runtime's own space, if any (the one held, while it is).
    #[cfg(feature = "fault-injection")]
    pub fn drop_in_flight(&self) -> Option<(usize, usize)> {
        let own = self.shared.own_space().id;
        self.shared
            .own_drop_in_flight(own)
            .map(|(_, start, end)| (start, end))
    }

    /// Tests: lets the held drop go on, and waits (at most ten seconds)
    /// until it has returned.
    #[cfg(feature = "fault-injection")]
    pub fn release_drop(&self) {
        self.shared.drop_hold.release();
        self.shared.drop_hold.wait_over();
    }

    /// Tests: a MADV_DONTNEED of `addr..addr + len` (the runtime's own
    /// memory) whose zap comes late. The REMOVE event is applied as the
    /// event thread would apply it, then `meanwhile` runs, then the pages
    /// are zapped without an event. The kernel zaps only after the event
    /// has been read, once the madvise has the address space's lock again,
    /// which a busy machine can delay; no user-space call can hold it there,
    /// so this plays the kernel's part.
    #[cfg(feature = "fault-injection")]
    pub fn drop_with_late_zap(&self, addr: *mut u8, len: usize, meanwhile: impl FnOnce()) {
        let space = self.shared.own_space();
        let start = addr as usize;
        {
            let _gate = self.shared.write_gate();
            events::on_remove(&self.shared, &space, start, start + len);
        }
        meanwhile();
        space.uffd.unregister(start, len).expect("unregistering");
        // SAFETY: the caller's own managed memory, unregistered above so
        // that the drop raises no event.
        let r = unsafe { libc::madvise(addr.cast(), len, libc::MADV_DONTNEED) };
        assert_eq!(r, 0, "zapping {start:#x}+{len:#x}");
        space.uffd.register(start, len).expect("registering again");
    }

    /// Tests: once the reclaimer's next drop in place has raised its event,
    /// the event thread leaves it unread until [`Runtime::release_events`]:
    /// the drop waits inside its madvise, with the mapping's lock let go,
    /// so that a test can change the address space in that window.
    #[cfg(feature = "fault-injection")]
    pub fn hold_events_at_next_drop(&self) {
        self.shared.event_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a drop's event is held
    /// unread; false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_events_held(&self) -> bool {
        self.shared.event_hold.wait_held()
    }

    /// Tests: lets the event thread read the held event (and go on).
    #[cfg(feature = "fault-injection")]
    pub fn release_events(&self) {
        self.shared.event_hold.release();
    }

    /// Tests: the reclaimer stops just before it lifts the write protection
    /// of the next folio whose eviction was refused (it stays resident),
    /// until [`Runtime::release_lift`]; so a test can change the address
    /// space in that window as another thread of the program would.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_lift(&self) {
        self.shared.lift_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until the reclaimer is held before
    /// a lift; false if it was not.
    #[cfg(feature = "fault-injection")]
    pub fn wait_lift_held(&self) -> bool {
        self.shared.lift_hold.wait_held()
    }

    /// Tests: lets the reclaimer held before its lift go on.
    #[cfg(feature = "fault-injection")]
    pub fn release_lift(&self) {
        self.shared.lift_hold.release();
    }

    /// Tests: the next fault in a hole of a resident folio (a page the
    /// program dropped) stops just before its zero page is installed, until
    /// [`Runtime::release_hole_fill`].
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_hole_fill(&self) {
        self.shared.hole_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until a fault is held before its
    /// zero page; false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_hole_fill_held(&self) -> bool {
        self.shared.hole_hold.wait_held()
    }

    /// Tests: lets the held fault go on.
    #[cfg(feature = "fault-injection")]
    pub fn release_hole_fill(&self) {
        self.shared.hole_hold.release();
    }

    /// Tests: the next install of a page at `addr` stops just before its
    /// copy, until [`Runtime::release_install`]; so a test can move the
    /// page away meanwhile. The copy is then not made: the install takes
    /// the answer the kernel gives when such a move slips in between its
    /// look for changes in flight and its look-up of the mapping (ENOENT,
    /// with the move's event unread), a window no test can hit on purpose.
    #[cfg(feature = "fault-injection")]
    pub fn hold_next_install_at(&self, addr: *const u8) {
        self.shared.slip_at.store(addr as usize, Ordering::Release);
        self.shared.slip_hold.arm();
    }

    /// Tests: waits (at most ten seconds) until an install is held before
    /// its copy; false if none was.
    #[cfg(feature = "fault-injection")]
    pub fn wait_install_held(&self) -> bool {
        self.shared.slip_hold.wait_held()
    }

    /// Tests: lets the held install go on.
    #[cfg(feature = "fault-injection")]
    pub fn release_install(&self) {
        self.shared.slip_hold.release();
    }

    /// Tests: how many times the event thread found the event gate held
    /// when it came to read events: a thread of the program then waits in
    /// its munmap, mremap or madvise until the gate is let go.
    #[cfg(feature = "fault-injection")]
    pub fn gate_waits(&self) -> u64 {
        self.shared.gate_waits.load(Ordering::Relaxed)
    }

    /// Tests: the runtime's own events are held as by a move out in flight
    /// that has stalled (another process's agent, stopped mid-request; see
    /// [`Shared::discard_stalled`]), until [`Runtime::release_stalled_hold`].
    /// Only while the reclaimer is idle: its own moves set and clear the
    /// same flags.
    #[cfg(feature = "fault-injection")]
    pub fn hold_events_as_a_stalled_move(&self) {
        let since = self.shared.now_ms().wrapping_sub(DISCARD_STALL_MS);
        self.shared
            .discard_since
            .store(since.max(1), Ordering::Release);
        self.shared
            .own_space()
            .move_in_flight
            .store(true, Ordering::SeqCst);
    }

    /// Tests: ends [`Runtime::hold_events_as_a_stalled_move`].
    #[cfg(feature = "fault-injection")]
    pub fn release_stalled_hold(&self) {
        self.shared
            .own_space()
            .move_in_flight
            .store(false, Ordering::SeqCst);
        self.shared.discard_since.store(0, Ordering::Release);
    }
}

/// Tests: a place where a runtime thread stops while a test holds it.
#[cfg(feature = "fault-injection")]
pub(crate) struct Hold {
    state: Mutex<HoldState>,
    cv: Condvar,
}

/// Where a [`Hold`] stands: Off -arm-> Armed -thread stops-> Held
/// -release-> Released -over-> Off.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldState {
    Off,
    Armed,
    Held,
    Released,
}

#[cfg(feature = "fault-injection")]
impl Hold {
    fn new() -> Hold {
        Hold {
            state: Mutex::new(HoldState::Off),
            cv: Condvar::new(),
        }
    }

    fn arm(&self) {
        *self.state.lock().expect("hold lock") = HoldState::Armed;
    }

    /// On the held thread: while armed, and if `ready` says this is the
    /// moment, stops here until released.
    pub fn stop_if_armed(&self, ready: impl FnOnce() -> bool) {
        let mut h = self.state.lock().expect("hold lock");
        if *h != HoldState::Armed || !ready() {
            return;
        }
        *h = HoldState::Held;
        self.cv.notify_all();
        drop(
            self.cv
                .wait_while(h, |h| *h == HoldState::Held)
                .expect("hold lock"),
        );
    }

    /// On the held thread: what the test waits for after the release is
    /// done.
    pub fn over(&self) {
        let mut h = self.state.lock().expect("hold lock");
        if *h == HoldState::Released {
            *h = HoldState::Off;
            self.cv.notify_all();
        }
    }

    /// Waits (at most ten seconds) until a thread stops; false if none did.
    fn wait_held(&self) -> bool {
        let held = self
            .cv
            .wait_timeout_while(
                self.state.lock().expect("hold lock"),
                std::time::Duration::from_secs(10),
                |h| *h != HoldState::Held,
            )
            .expect("hold lock");
        *held.0 == HoldState::Held
    }

    fn release(&self) {
        *self.state.lock().expect("hold lock") = HoldState::Released;
        self.cv.notify_all();
    }

    /// Waits (at most ten seconds) until the released thread says it is
    /// over.
    fn wait_over(&self) {
        drop(
            self.cv
                .wait_timeout_while(
                    self.state.lock().expect("hold lock"),
                    std::time::Duration::from_secs(10),
                    |h| *h == HoldState::Released,
                )
                .expect("hold lock"),
        );
    }
}

#[cfg(feature = "fault-injection")]
impl Shared {
    /// The event thread, before its follow-ups: see
    /// [`Runtime::hold_next_follow_ups`].
    pub fn hold_follow_ups_if_armed(&self) {
        let mut held = false;
        self.follow_up_hold.stop_if_armed(|| {
            held = true;
            true
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while held
            && !self.fork_pending.load(Ordering::SeqCst)
            && std::time::Instant::now() < deadline
        {
            std::thread::yield_now();
        }
        self.follow_up_hold.over();
    }

    /// The event thread, before it reads: while a test holds it, and one of
    /// the reclaimer's drops in place is under way, waits until that drop's
    /// event is pending in the runtime's own descriptor (nothing else
    /// faults there meanwhile: the test waits for the hold), then stops
    /// until released.
    pub fn hold_events_if_armed(&self) {
        self.event_hold.stop_if_armed(|| {
            let dropping = self
                .own_drops
                .lock()
                .expect("own drops lock")
                .iter()
                .any(|d| d.returned_at.is_none());
            let mut pollfd = libc::pollfd {
                fd: self.own_space().uffd.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the call.
            dropping && unsafe { libc::poll(&mut pollfd, 1, 10_000) } == 1
        });
        self.event_hold.over();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shared.release_user();
    }
}

/// Runs a runtime thread's body; a panic there would leave faults unserved
/// and the program hung, so it ends the process with a message instead.
pub(crate) fn fail_loudly(name: &str, body: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let message = format!(
            "uswap: the {name} thread panicked ({what}); aborting rather than leaving the program's memory unserved\n"
        );
        // Straight to the descriptor: output a test harness captures would
        // be lost with the abort.
        // SAFETY: writing a buffer that lives across the call.
        unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
        std::process::abort();
    }
}

impl Shared {
    /// A snapshot of every counter.
    pub fn stats(&self) -> RuntimeStats {
        let spaces = self.spaces.read().expect("spaces lock");
        let children = spaces.len().saturating_sub(1) as u64;
        let regions = spaces
            .iter()
            .map(|s| s.regions.read().expect("regions lock").len() as u64)
            .sum();
        drop(spaces);
        // First: the counters read after it are at least as new as the
        // folios it no longer holds.
        let evicting_folios = self.evicting.load(Ordering::Acquire) as u64;
        let gauges = Gauges {
            resident_bytes: self.resident.load(Ordering::Relaxed) as u64,
            unfit_bytes: self.unfit.load(Ordering::Relaxed) as u64,
            evicting_folios,
            children,
            regions,
        };
        self.counters.snapshot(self.store.stats(), gauges)
    }

    /// Whether the reclaimer has been in one discard (a move out or a drop
    /// of stored pages) for [`DISCARD_STALL_MS`] or longer. Another
    /// process's pages are discarded by its agent, which answers only while
    /// that process runs: one stopped (SIGSTOP, job control, a debugger)
    /// after the reclaimer found it running holds the reclaimer until it is
    /// continued, and faults that waited for room in every other process
    /// would wait as long (`programs/stopflip.c` under `uswap run` stalled
    /// that way in 2 of 6 runs). Faults stop waiting meanwhile, as when the
    /// reclaimer is stuck: memory may pass the limit until the process runs
    /// again, and nothing is lost.
    pub fn discard_stalled(&self) -> bool {
        let since = self.discard_since.load(Ordering::Acquire);
        since != 0 && self.now_ms().wrapping_add(1).wrapping_sub(since) >= DISCARD_STALL_MS
    }

    /// Milliseconds since the runtime started, wrapping after 49 days: the
    /// time a folio was dropped (`folio::DROPPED`), which only ever is
    /// compared with a time less than `drop_grace` before.
    pub fn now_ms(&self) -> u32 {
        self.started_at.elapsed().as_millis() as u32
    }

    /// `word` for a folio that stays resident, DROPPED if the program
    /// dropped part of it meanwhile (`extras`): the zap may be yet to come.
    pub fn dropped_meanwhile(&self, extras: &space::Extras, word: u64) -> u64 {
        if extras.removed.is_empty() {
            word
        } else {
            folio::dropped_at(word, self.now_ms())
        }
    }

    /// Whether a folio dropped at `word`'s time is still in its grace
    /// (`RuntimeConfig::drop_grace`).
    pub fn in_drop_grace(&self, word: u64) -> bool {
        let since = self.now_ms().wrapping_sub(folio::dropped_ms(word));
        u128::from(since) < self.config.drop_grace.as_millis()
    }

    /// The runtime's own address space.
    pub fn own_space(&self) -> Arc<Space> {
        self.spaces.read().expect("spaces lock")[0].clone()
    }

    /// Counts a new region's resident folios towards `memory_high` and
    /// queues them for reclaim.
    fn count_resident_region(&self, space: &Space, region: &RegionInner) {
        let mut fifo = self.fifo.lock().expect("fifo lock");
        let mut resident = 0;
        for (i, f) in region.folios.iter().enumerate() {
            if folio::state(f.load()) == folio::RESIDENT {
                resident += region.folio_size;
                fifo.push_back(FolioRef {
                    space: space.id,
                    region: region.id,
                    folio: i as u32,
                });
            }
        }
        drop(fifo);
        if resident > 0 {
            self.resident.fetch_add(resident, Ordering::AcqRel);
            self.kick_reclaim();
        }
    }

    /// The limit now.
    pub fn memory_high(&self) -> usize {
        self.memory_high.load(Ordering::Acquire)
    }

    /// The limit reclaim works to: `memory_high` plus the UNFIT memory.
    /// Memory that neither compresses nor has a swap file to go to cannot
    /// leave; counted against the limit, it would leave the rest of memory
    /// no room, and every folio brought back would be evicted again at
    /// once. Measured with a node program holding 40 MiB of random numbers
    /// under a 32 MiB limit (`uswap run --memory-high 32M -- node ...`):
    /// 1.6 s with UNFIT memory left out, 10.5-15.8 s with it counted beyond
    /// half the limit, 2.7-3.6 s when the reclaimer compressed it again at
    /// every pass (and then gave up on the limit). `unfit_bytes` reports
    /// how far over `memory_high` this lets resident memory go.
    pub fn reclaim_limit(&self) -> usize {
        self.memory_high() + self.unfit.load(Ordering::Acquire)
    }

    /// How far under [`Shared::reclaim_limit`] the reclaimer evicts once
    /// woken: the slack, but at most a quarter of `memory_high`, in whole
    /// folios of the default size (none under a limit of fewer than four
    /// folios, which then keeps every folio it can hold).
    pub fn reclaim_margin(&self) -> usize {
        let high = self.memory_high();
        let folio = self.config.folio_size;
        self.config.slack_at(high).min(high / 4) / folio * folio
    }

    /// The live space with `id`.
    pub fn space(&self, id: u32) -> Option<Arc<Space>> {
        self.spaces
            .read()
            .expect("spaces lock")
            .iter()
            .find(|s| s.id == id && s.alive.load(Ordering::Acquire))
            .cloned()
    }

    /// A fresh address space id.
    pub fn next_space_id(&self) -> u32 {
        self.next_space.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes the event readers to watch a space just added to `spaces` by
    /// a thread that is not one of them (see [`Shared::spaces_added`]).
    pub fn announce_space(&self) {
        crate::sys::eventfd_signal(&self.spaces_added);
    }

    /// Wakes the reclaimer.
    pub fn kick_reclaim(&self) {
        let (lock, cv) = &self.reclaim_signal;
        *lock.lock().expect("reclaim signal lock") = true;
        cv.notify_one();
    }

    /// The reclaimer's drop in place in flight in `space`, if there is one:
    /// its generation (unique to it), start and end.
    pub fn own_drop_in_flight(&self, space: u32) -> Option<(u64, usize, usize)> {
        self.dropping
            .get()
            .and_then(|(generation, of, start, end)| {
                (of == space).then_some((generation, start, end))
            })
    }

    /// The reclaimer is about to MADV_DONTNEED `start..start + len` of
    /// `space`.
    fn begin_own_drop(&self, space: u32, start: usize, len: usize) {
        self.dropping.set(Some((space, start, start + len)));
        self.own_drops
            .lock()
            .expect("own drops lock")
            .push(OwnDrop {
                space,
                start,
                end: start + len,
                cursor: start,
                last_start: None,
                returned_at: None,
            });
    }

    /// Queues folio `folio` of region `region` of space `space` for
    /// reclaim, last (fault-in order).
    pub fn queue_for_reclaim(&self, space: u32, region: u32, folio: usize) {
        self.fifo.lock().expect("fifo lock").push_back(FolioRef {
            space,
            region,
            folio: folio as u32,
        });
    }

    /// Queues a folio for reclaim ahead of all others (the reclaimer has a
    /// question about it, see `folio::GIVEN_UP`).
    pub fn queue_for_reclaim_first(&self, space: u32, region: u32, folio: usize) {
        self.fifo.lock().expect("fifo lock").push_front(FolioRef {
            space,
            region,
            folio: folio as u32,
        });
    }

    /// The reclaimer's drop in place of `start` in `space` returned; `made`:
    /// whether it came to the madvise. One that did not (its probe found the
    /// range changed) raised no event, so the events taken for its own were
    /// the program's drops (one over exactly its range, read first): the
    /// part they cover is returned, for the caller to apply as the
    /// program's, and the record takes no more.
    fn end_own_drop(&self, space: u32, start: usize, made: bool) -> Option<(usize, usize)> {
        self.dropping.set(None);
        let mut drops = self.own_drops.lock().expect("own drops lock");
        let d = drops
            .iter_mut()
            .find(|d| d.space == space && d.start == start && d.returned_at.is_none())
            .expect("the drop was registered");
        d.returned_at = Some(self.reads.load(Ordering::Acquire));
        if made || d.last_start.is_none() {
            return None;
        }
        let taken = (d.start, d.cursor);
        d.end = d.start;
        Some(taken)
    }

    /// The event gate's read side, for any thread but the event thread.
    ///
    /// While the program forks, the event thread reads events without the
    /// gate (see `fault.rs`) and applies them only once the fork is over and
    /// it has the write side. A read event no longer holds installs off with
    /// EAGAIN (an mremap that was read has returned), so in that gap a
    /// thread acting on the bookkeeping could install at a region's old
    /// address: it waits instead until they are applied.
    pub fn read_gate(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        loop {
            let gate = self.gate.read().expect("event gate");
            if !self.unapplied.load(Ordering::SeqCst) {
                return gate;
            }
            drop(gate);
            std::thread::yield_now();
        }
    }

    /// Drops the stored copy of folio `i` of `region` if it is CLEAN: it
    /// becomes RESIDENT, its flags kept. Its pages may stay write-protected;
    /// a write finds that protection stale and lifts it. False if the folio
    /// is not CLEAN (or stopped being so meanwhile: the reclaimer took it).
    pub(crate) fn forget_clean_copy(&self, region: &RegionInner, i: usize) -> bool {
        let f = &region.folios[i];
        loop {
            let w = f.load();
            if folio::state(w) != folio::CLEAN {
                return false;
            }
            if f.transition(w, folio::RESIDENT | (w & (folio::ACTIVE | folio::EXTRA))) {
                self.store.invalidate(region.slots_of(w));
                self.counters.clean_dropped.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
    }

    /// Takes an UNFIT folio back into reclaim: its contents changed (a
    /// write, a page dropped) or its place did (an event), so it may
    /// compress now or has to be looked at again. Its pages may stay
    /// write-protected; a write finds that protection stale and lifts it.
    /// False if the folio is not UNFIT.
    pub(crate) fn requeue_unfit(&self, space: u32, region: &RegionInner, i: usize) -> bool {
        if !self.forget_unfit(region, i) {
            return false;
        }
        self.queue_for_reclaim(space, region.id, i);
        true
    }

    /// Clears the UNFIT flag of folio `i` of `region`, and takes its bytes
    /// off the UNFIT count. False if it was not UNFIT.
    fn forget_unfit(&self, region: &RegionInner, i: usize) -> bool {
        if !region.folios[i].clear_flag(folio::UNFIT) {
            return false;
        }
        self.unfit.fetch_sub(region.folio_size, Ordering::AcqRel);
        true
    }

    /// A folio parked write-protected until its next change is let go,
    /// because the program changed its memory (an event): a CLEAN folio
    /// drops its stored copy, an UNFIT one goes back into reclaim. Both
    /// become plain RESIDENT.
    pub(crate) fn unpark(&self, space: u32, region: &RegionInner, i: usize) {
        self.forget_clean_copy(region, i);
        self.requeue_unfit(space, region, i);
    }

    /// The event gate's write side, for a thread other than the event
    /// thread that must keep every folio state still (see
    /// [`Shared::read_gate`] for why it waits while events are unapplied).
    pub fn write_gate(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        loop {
            let gate = self.gate.write().expect("event gate");
            if !self.unapplied.load(Ordering::SeqCst) {
                return gate;
            }
            drop(gate);
            std::thread::yield_now();
        }
    }

    /// Called by each runtime thread once it has made its start-up
    /// allocations (from here on it allocates only where a fork cannot be
    /// waiting on it).
    pub fn thread_started(&self) {
        let (count, cv) = &self.started;
        *count.lock().expect("started lock") += 1;
        cv.notify_all();
    }

    /// After the event thread has applied every read up to read number
    /// `applied`: forgets the drops whose call had returned by then.
    pub fn forget_returned_drops(&self, applied: u64) {
        self.own_drops
            .lock()
            .expect("own drops lock")
            .retain(|d| d.returned_at.is_none_or(|at| at > applied));
    }

    /// Whether a REMOVE event, read in read number `read`, is the
    /// reclaimer's own drop.
    ///
    /// The kernel walks a MADV_DONTNEED mapping by mapping, in address
    /// order: one REMOVE per mapping, for the part of the range it covers,
    /// each waiting to be read with the mapping lock let go. Then it looks
    /// the mapping at the event's start up again and drops only up to that
    /// mapping's end, which is short of the event's end when the program
    /// split the mapping meanwhile (an mprotect of part of it), and walks on
    /// from there: the next mapping, raised again. A drop covers one mapping
    /// when the reclaimer checks it, and is probed right before the madvise
    /// (wholly registered, no event unread: `DropPages::drop_pages`). So its
    /// first event starts at its start and covers all of it, or, where the
    /// program split the mapping after the check, up to the end of the
    /// mapping there; the events after it start at strictly rising
    /// addresses, each at the start of a mapping, and each at or before the
    /// end of the one before it (a repetition after a split), or past a gap
    /// of memory unmapped meanwhile; a repetition covers at least the
    /// mapping it starts (up to the drop's end). An event inside the drop
    /// that fits none of these is the program's MADV_DONTNEED, and its pages
    /// become holes. A program's event over exactly the drop's range, read
    /// first, is taken for the drop's and the drop's own for the program's:
    /// the same pages become holes either way, as the program asked.
    ///
    /// Left open, the event carrying no thread to tell them apart: a
    /// program's event at the start of the drop that ends where a split
    /// does, one that continues where the covered part ends, or one that
    /// repeats a whole mapping at its start, while the drop is under way, is
    /// taken for the reclaimer's (the program then reads the bytes it
    /// dropped instead of zeros); the layout is read when the event is
    /// applied, not when it was raised, so a split undone again before the
    /// event is read makes it the program's; and a drop whose start the
    /// program unmaps between the probe and the madvise raises events the
    /// first of which starts past the drop's start, taken for the
    /// program's. Only drops in place are judged here: stored pages leave by
    /// a move where the kernel has one, which raises no event
    /// (`mm/scratch.rs`).
    pub fn is_own_drop(&self, space: &Space, start: usize, end: usize, read: u64) -> bool {
        let Some(memory) = space.memory.get() else {
            return false;
        };
        let mut drops = self.own_drops.lock().expect("own drops lock");
        let own = drops.iter_mut().find(|d| {
            if d.space != space.id || start < d.start || end > d.end {
                return false;
            }
            if d.last_start.is_none() {
                // The drop's first event starts where the drop does, and
                // covers all of it (a drop covers one mapping) or, where
                // the program split the mapping after the drop's check, up
                // to the end of the mapping there. A program's own drop of
                // a piece at the start is neither (taken for the drop's,
                // its pages read their old bytes back from the stored copy).
                return start == d.start
                    && (end == d.end || memory.mapping_at(start).is_some_and(|(_, hi)| hi == end));
            }
            // The walk goes on where the covered part ends (an event that
            // starts before and ends past it is taken too: were a
            // program's event taken for the drop's next one, the drop's own
            // would still extend what is covered).
            if (start <= d.cursor && end > d.cursor)
                || (start > d.cursor && memory.any_unmapped(d.cursor, start))
            {
                return true;
            }
            let Some(last_start) = d.last_start else {
                return false;
            };
            start > last_start
                && start < d.cursor
                && d.returned_at.is_none_or(|at| at >= read)
                && memory
                    .mapping_at(start)
                    .is_some_and(|(lo, hi)| lo == start && end >= hi.min(d.end))
        });
        match own {
            Some(d) => {
                d.cursor = d.cursor.max(end);
                d.last_start = Some(start);
                true
            }
            None => false,
        }
    }

    /// Takes a region of the runtime's own space out of service: waits out
    /// busy folios, frees its store entries (or, for a managed mapping,
    /// brings everything back), unregisters it and, if ours, unmaps it —
    /// except what the program unmapped or moved away, which may belong to
    /// an unrelated mapping by now.
    fn drop_region(&self, region: &Arc<RegionInner>) {
        if self.forked_copy.load(Ordering::Acquire) {
            return;
        }
        let own = self.own_space();
        for (i, f) in region.folios.iter().enumerate() {
            loop {
                // Each step is taken under the gate: a fork the program has
                // just made copies the folios' states when its event is
                // applied, and must find them as they were at the fork.
                let gate = self.read_gate();
                let w = f.load();
                match folio::state(w) {
                    folio::EVICTING | folio::LOADING | folio::ZEROING => {
                        drop(gate);
                        std::thread::yield_now();
                    }
                    folio::SWAPPED if !region.owned => {
                        // The caller's mapping gets its data back.
                        if f.transition(
                            w,
                            folio::with_slot(folio::LOADING, folio::slot(w)) | (w & folio::EXTRA),
                        ) {
                            drop(gate);
                            swapin::swap_in(self, &own, region, i, &mut Worker, false);
                        }
                    }
                    folio::SWAPPED => {
                        if f.transition(w, folio::GONE) {
                            own.take_extras(region, i);
                            self.store.invalidate(region.slots_of(w));
                            break;
                        }
                    }
                    folio::CLEAN => {
                        self.forget_clean_copy(region, i);
                    }
                    folio::RESIDENT if w & folio::UNFIT != 0 => {
                        self.forget_unfit(region, i);
                    }
                    folio::RESIDENT => {
                        if f.transition(w, folio::GONE) {
                            self.resident.fetch_sub(region.folio_size, Ordering::AcqRel);
                            break;
                        }
                    }
                    _ => {
                        if f.transition(w, folio::GONE) {
                            own.take_extras(region, i);
                            break;
                        }
                    }
                }
            }
        }
        // Where the region is and what of it the program unmapped or moved
        // away are read under the gate: an munmap or mremap returns once its
        // event is read, which may be before it is applied, and a range
        // taken for the region's then may hold a new mapping by now. The
        // release raises no event (the range is unregistered first).
        let gate = self.read_gate();
        own.regions
            .write()
            .expect("regions lock")
            .retain(|r| r.id != region.id);
        for (start, len) in region.live_ranges() {
            self.release_range(&own, start, len, region.owned);
        }
        drop(gate);
        self.reclaimed.1.notify_all();
    }

    /// Unregisters (and, if the runtime mapped it, unmaps) a range that is
    /// still the region's.
    fn release_range(&self, own: &Space, start: usize, len: usize, owned: bool) {
        match own.uffd.unregister(start, len) {
            Ok(()) | Err(UffdError::NoMapping) => {}
            Err(e) => panic!("unregistering {start:#x}+{len:#x}: {e}"),
        }
        if owned {
            // SAFETY: the runtime mapped this range and the program has not
            // unmapped or moved it; nobody else holds it.
            unsafe { libc::munmap(start as *mut _, len) };
        }
    }

    /// Drops one user handle; the last one stops the threads.
    fn release_user(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) != 1
            || self.forked_copy.load(Ordering::Acquire)
        {
            return;
        }
        self.shutdown.store(true, Ordering::Release);
        self.kick_reclaim();
        // Notified with the queue's lock taken and let go: a filler that
        // found no shutdown under it is asleep by then, and woken. Without,
        // it could miss the wake-up and sleep out its timeout (100 ms), which
        // the end of a run paid half the time.
        drop(self.faults.0.lock().expect("fault queue lock"));
        self.faults.1.notify_all();
        self.reclaimed.1.notify_all();
        crate::sys::eventfd_signal(&self.wake_readers);
        let mut threads = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        // The event thread (started first) ends last: it lets go of the
        // descriptors once nothing else can use them (see
        // `fault::EventThread::finish`).
        let event_thread = (!threads.is_empty()).then(|| threads.remove(0));
        for t in threads {
            // A runtime thread that panicked has already aborted the process.
            t.join().expect("runtime threads end without panicking");
        }
        self.helpers_ended.store(true, Ordering::Release);
        if let Some(t) = event_thread {
            t.join().expect("runtime threads end without panicking");
        }
    }
}

const _: () = assert!(PAGE_SIZE == 4096);

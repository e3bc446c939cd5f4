//! Fault service: the event thread that reads every address space's
//! userfaultfd, and the filler threads that take the faults it must not
//! wait for, and the swap-ins of large folios.
//!
//! The event thread must stay able to read: the reclaimer's MADV_DONTNEED
//! and the program's madvise, munmap, mremap and fork block until their
//! event is read, and while one is unread every install in that address
//! space answers EAGAIN. So the event thread serves a fault itself only when
//! nothing has to wait for reclaim, reads the pending events whenever one of
//! its own installs meets EAGAIN, and hands faults that would wait
//! (throttling) to the fillers.
//!
//! A swap-in of a folio of several pages (`RuntimeConfig::handoff_pages`)
//! is handed to a free filler once the event thread has taken the folio
//! (LOADING): the event thread goes back to reading, so that a fault of
//! another thread is served beside it rather than after it. Two threads
//! faulting on 64K folios waited for each other's decompression before:
//! `uswap bench faults --faults 4000 --mode no-pressure --folios 64k
//! --handoff-pages 0,2` gave p50 166 against 128 us in one run. With no
//! other fault coming meanwhile, the hand-off only costs (the filler's
//! wake-up, and the event thread's spin for the next fault, which it
//! leaves the CPU to the filler for): [`HandoffPays`] keeps count of which
//! it has been lately.
//!
//! Room is first come, first served: while any fault waits for room, the
//! event thread hands on every fault that needs room too instead of taking
//! what one reclaim batch freed for itself, and the fillers take their
//! turns in the order they began waiting (`Shared::room_turns`); a fault
//! that had its turn is not sent to the back when it has to be decided
//! again. Without this, on a busy two-CPU machine, one waiting fault lost
//! the race for room to newer faults for up to half a second.
//!
//! The event thread is a role, not one thread: with
//! `RuntimeConfig::event_readers` at `PerCpu`, a reader pinned to each CPU
//! sleeps in poll on every descriptor, and whichever runs first after an
//! event takes the role (its state behind one lock) and serves while there
//! is work. A fault wakes every reader, and the one on the faulting
//! thread's CPU runs as soon as that thread sleeps: the fault is read and
//! served there, and the install's wake-up stays on that CPU. `uswap run
//! --memory-high 32M --folio-size 4k --compressor lzo-rle -- touch faults
//! 256 2 20000`, three alternating runs against one unpinned event thread:
//! p50 22-27 us against 32-42 us, and 2.4-6.4% of faults above 100 us
//! against 6.2-12.9% (with the role given up at once after each burst,
//! not spinning 50 us for the next event: p50 28-39 us). The floor, from
//! `bench/probes/uffd-roundtrip.c`: 10.4 us with a reader per CPU, against
//! 16-20 us for one spinning handler and 48-60 us for one asleep in poll.
//! The cost is the other readers' wake-ups: on a machine whose CPUs are
//! all busy they take CPU from the program (`uswap run ... touch usemem
//! 1536 2`: elapsed 3-7% longer than with one reader, 4 of 4 pairs).
//!
//! One role is also this design's limit: two processes faulting at once
//! are served by whichever reader holds it, one fault after the other, and
//! the other process's CPU idles while it waits, so that its wake-up is a
//! cross-CPU one. No-pressure 4K touches (`bench/touch.c` with
//! `TOUCH_AFTER_FILL='uswap limit 4G $PPID'`, as `bench/side-by-side.sh`
//! runs them): p50 9.8-10.0 us with one process against 20.3-24.2 us with
//! two; the kernel's zswap, which serves each fault on its own thread,
//! 5.9-6.2 us. On the build machine's VM an idle vCPU halts at once
//! (booted with haltpoll.guest_halt_poll_ns=0), and a wake-up on the other
//! CPU costs 62-67 us (`uffd-roundtrip`'s "other CPU"; 3.1-3.4 us on the
//! same CPU); with idle CPUs polling for KVM's default of 200 us, 6.0-6.4
//! us, and the two processes' p50 16.7-17.2 us against 20.3-22.2 us
//! (`HALT_POLL_NS=200000 bench/side-by-side.sh 3` and the same without,
//! back to back). Priorities, spinning or not, waiting readers that spin,
//! and passing faults to the reader that woke for them all left it there;
//! so did readers that each read a share of the address spaces (by id) on
//! their own CPU and served it outside the role (a prototype, not kept,
//! 2026-11-28): the scheduler kept both programs on one CPU while the
//! other CPU's reader spun, p50 39-44 us; with halt polling, 15-16 us
//! where the two programs fell into different shares, against 16-18 us.
//! What is left is the service of each fault, about 10 us on one CPU (the
//! same-CPU round trip, decompression 2.7 us, the 4 KiB copy 1.2 us, and
//! the bookkeeping), against 6 us for the kernel's whole fault.
//!
//! Every read happens under the event gate's write side, and the
//! non-fault events read are applied to the bookkeeping before the gate is
//! released ([`super::events`]); faults are queued and served after.

use super::events::{self, FollowUp};
use super::folio::{
    self, CLEAN, EVICTING, GONE, INHERITING, LOADING, POISONED, RESIDENT, SWAPPED, UNFIT,
    UNTOUCHED, ZEROING,
};
use super::memory::Memory;
use super::space::{Owner, RegionInner, Space};
use super::swapin::{self, Pass, Server, SwappedIn, Worker};
use super::uffd::{Event, Partial, UffdError};
use super::Shared;
use crate::page::{page_floor, PAGE_SIZE};
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a reader sleeps in poll once the runtime is ending. The wake-up
/// (`Shared::wake_readers`) has woken every reader then, and stays out of
/// later polls: left in, it would keep them from sleeping at all while the
/// other threads end, which a reclaimer waiting on a stopped process's
/// agent can make last. The event thread, which ends last, then sees the
/// others gone within this.
const ENDING_POLL_MS: i32 = 1;

/// How long an event reader sleeps in poll between looks at a space whose
/// events are held, once the discard that holds them has stalled
/// (`Shared::discard_stalled`): a hold normally ends within a millisecond
/// and is looked at again after a yield, but one held by a process that
/// stopped while its agent was asked lasts until that process runs again,
/// and looking after a yield all along kept a CPU busy as long. The other
/// spaces' events still wake the poll at once.
const STALLED_HOLD_POLL_MS: i32 = 1;

/// The poll timeout while the runtime runs
/// (`RuntimeConfig::event_poll_timeout`), or once it is ending.
fn poll_timeout(shared: &Shared) -> i32 {
    if shared.shutdown.load(Ordering::Acquire) {
        ENDING_POLL_MS
    } else {
        shared
            .config
            .event_poll_timeout
            .as_millis()
            .clamp(1, i32::MAX as u128) as i32
    }
}

/// Work the event thread hands to the fillers.
pub(crate) enum FillerJob {
    /// A fault that must wait for room (counted in
    /// `Shared::waiting_for_room` until served).
    MustWait(Fault),
    /// A fault's folio, taken for loading (LOADING) by the event thread: the
    /// filler brings it in, and reads ahead, as the event thread would have
    /// (see `RuntimeConfig::handoff_pages`).
    SwapIn {
        fault: Fault,
        region: Arc<RegionInner>,
        folio: usize,
        /// Set when the job is handed on while another thread's is in
        /// flight, or once the event thread takes up a fault of another
        /// thread while this one is (see [`HandoffPays`]). Whoever does the
        /// job drops it once done, and keeps no other clone: the event
        /// thread takes a flag only it holds for a job done.
        beside: Arc<AtomicBool>,
    },
}

/// Whether handing the swap-ins of large folios to a filler has paid
/// lately. It pays when another fault comes while one is brought in: the
/// event thread reads and serves that fault beside the filler instead of
/// after the swap-in. With none (one thread faulting in turn), it costs
/// the filler's wake-up and the event thread's spin for the next fault.
/// Each large swap-in that had a free filler to go to tells which it was:
/// one handed on, whether the event thread took up a fault of another
/// thread while the filler worked; one served by the event thread itself,
/// whether a fault of another thread was waiting once it was done. (The
/// faulting thread's own next fault does not count: woken by the install,
/// it may fault again before the server has finished the swap-in's
/// bookkeeping.) They are kept as a two-bit branch predictor keeps its
/// history: a count from 0 to
/// 3, raised by a swap-in another fault came beside and lowered by one
/// none did; hand-offs go on while it is 2 or more. It starts at 3 (handing
/// off), so that two swap-ins in a row with no fault beside them turn to
/// serving in place, and after a run of those two that had one turn back.
/// A filler tells once it is done, after its install has woken the
/// faulting thread, whose next fault may be taken up first: one thread
/// faulting in turn sees up to three hand-offs before the turn.
/// (A fault of another thread on the very folio being brought in counts
/// as one beside it, though it only waits for that folio: threads sharing
/// folios keep handing off, as they did before this count.)
///
/// `uswap bench faults --mode no-pressure --folios 64k --threads 1
/// --size 96M --faults 1536`, five runs each alternating with the runtime
/// that always handed on: a median p50 of 95.1 against 109.0 us; with
/// `--threads 2`, 117.1 against 116.9 us (hand-offs kept). Near the limit
/// the bookkeeping costs nothing that shows: six alternating pairs of
/// `uswap run --memory-high 32M --folio-size 64k --compressor lzo-rle --
/// touch faults 256 2 20000 corpus/*.pages` gave a mean p50 of 129.4 us,
/// against 129.2 us for the runtime without the count. The flags in flight
/// are the event thread's own ([`EventThread::handed_on`]), not shared
/// under a lock: with one, the same runs were
/// slower than the runtime without the count in 15 of 20 pairs (mean p50
/// 146.4 against 140.8 us).
pub(crate) struct HandoffPays {
    count: AtomicU8,
}

impl HandoffPays {
    const MOST: u8 = 3;

    pub fn new() -> HandoffPays {
        HandoffPays {
            count: AtomicU8::new(Self::MOST),
        }
    }

    fn pays(&self) -> bool {
        self.count.load(Ordering::Relaxed) >= 2
    }

    /// Whoever did the swap-in flagged `beside` (a filler, or the event
    /// thread at the end) is done with it, and lets the flag go, which
    /// tells the event thread it is done.
    fn done(&self, beside: Arc<AtomicBool>) {
        self.tell(beside.load(Ordering::Relaxed));
    }

    /// One swap-in's evidence (the event thread and the fillers may tell at
    /// once).
    fn tell(&self, another_fault_came: bool) {
        let mut n = self.count.load(Ordering::Relaxed);
        loop {
            let next = if another_fault_came {
                (n + 1).min(Self::MOST)
            } else {
                n.saturating_sub(1)
            };
            match self
                .count
                .compare_exchange_weak(n, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => n = now,
            }
        }
    }
}

/// Queues `job` for the fillers and wakes one.
fn hand_to_fillers(shared: &Shared, job: FillerJob) {
    shared.filler_jobs.fetch_add(1, Ordering::AcqRel);
    let (queue, cv) = &shared.faults;
    queue.lock().expect("fault queue lock").push_back(job);
    cv.notify_one();
}
/// How often the event thread checks that forked children still exist.
const CHILD_CHECK: Duration = Duration::from_millis(100);

/// One page fault, with the address space it happened in.
#[derive(Clone)]
pub(crate) struct Fault {
    space: Arc<Space>,
    addr: usize,
    /// A write (a missing page or a write-protected one).
    write: bool,
    wp: bool,
    tid: u32,
    /// When its event was read.
    read_at: Instant,
}

fn bump(counter: &std::sync::atomic::AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The event thread, with the faults it has read but not yet served.
struct EventThread<'a> {
    shared: &'a Shared,
    /// The gate's read side, held while this thread serves faults: it may
    /// allocate then, and a fork's prepare handler (which takes the write
    /// side) cannot let glibc take the malloc locks under it.
    pass: Option<std::sync::RwLockReadGuard<'a, ()>>,
    backlog: VecDeque<Fault>,
    follow_ups: Vec<FollowUp>,
    /// Events read and not yet applied, and the index of each one's space.
    raw: Vec<Event>,
    origin: Vec<(u32, u64)>,
    /// One entry per space, for poll; grown only under the gate (never
    /// while the program forks: see `read_pending`).
    pollfds: Vec<libc::pollfd>,
    /// When exited children were last looked for.
    reaped: Instant,
    /// When events were last read (see `RuntimeConfig::event_spin`).
    last_event: Instant,
    /// The generation of the reclaimer's drop in place whose first REMOVE
    /// (at its start) has been read, if any (see `read_raw`).
    drop_begun: Option<u64>,
    /// Where the evidence of a large swap-in this thread served itself
    /// stands (see [`HandoffPays`]).
    served_in_place: InPlace,
    /// The swap-ins handed on, with their faulting threads and flags; a
    /// flag the filler has let go of (only this one left) is done. Pruned
    /// at each hand-off, so at most `fillers` entries.
    handed_on: Vec<(u32, Arc<AtomicBool>)>,
    /// Set once a reader has finished the runtime (see [`EventThread::finish`]):
    /// the others return.
    finished: bool,
}

/// The evidence of a large swap-in the event thread served itself.
#[derive(Clone, Copy)]
enum InPlace {
    /// None waiting to be told.
    Told,
    /// One is being served: the faults read with it, if any are left,
    /// waited for it.
    Served,
    /// Served, for this thread, with no fault left: the first faults read
    /// next tell whether one of another thread came meanwhile (a poll that
    /// finds nothing, that none did).
    AtNextPoll(u32),
}

/// Events one read takes at most.
const READ_BATCH: usize = 64;
/// The longest the events of a space are held unread after the REMOVE of
/// the reclaimer's own drop (see `read_raw`): a drop whose range the
/// program split meanwhile raises a second REMOVE, which the drop then
/// waits for, and the program's own REMOVE over the same range may come
/// first.
const HOLD_MAX_MS: u32 = 20;

/// Where a space's hold on its events stands (see `EventThread::read_raw`).
enum Hold {
    /// None: its events may be read.
    None,
    /// Held: while the reclaimer waits for an agent's move out, or until
    /// its drop's call has returned (for at most [`HOLD_MAX_MS`]).
    Held,
    /// A hold for a drop is over; `expired` if its drop is still in flight
    /// (its bound ran out).
    Over { expired: bool },
}

/// Looks at the hold on `space`'s events, changing nothing.
fn hold_of(shared: &Shared, space: &Space) -> Hold {
    // SeqCst: paired with `Shared::unapplied` (see `reclaim.rs`,
    // `move_out`). A move whose agent has answered holds nothing more: its
    // moves have all returned, and the reclaimer, which takes the answer
    // and then ends the hold, may not run for a while on a busy machine.
    if space.move_in_flight.load(Ordering::SeqCst)
        && !space.memory.get().is_some_and(Memory::moves_answered)
    {
        return Hold::Held;
    }
    let held_for = space.events_held_for.load(Ordering::Acquire);
    if held_for == 0 {
        return Hold::None;
    }
    let since = shared
        .now_ms()
        .wrapping_sub(space.events_held_at.load(Ordering::Acquire));
    // Only for the drop whose event it was: the reclaimer's next drop may
    // have begun by the time this is looked at.
    let same_drop = shared
        .own_drop_in_flight(space.id)
        .is_some_and(|(generation, _, _)| generation == held_for);
    if since < HOLD_MAX_MS && same_drop {
        Hold::Held
    } else {
        Hold::Over { expired: same_drop }
    }
}

/// Whether the events of `space` are held; a hold found over is ended
/// (and counted, if its bound ran out). Only the holder of the event
/// thread's role ends holds: the role sets them (`EventThread::read_raw`).
fn events_held(shared: &Shared, space: &Space) -> bool {
    match hold_of(shared, space) {
        Hold::None => false,
        Hold::Held => true,
        Hold::Over { expired } => {
            if expired {
                shared
                    .counters
                    .event_holds_expired
                    .fetch_add(1, Ordering::Relaxed);
            }
            space.events_held_for.store(0, Ordering::Release);
            false
        }
    }
}

/// Events that may wait unapplied while the program forks: each program
/// thread has at most one fault or event pending, so this bounds the
/// threads a forking program may have.
const PENDING_EVENTS: usize = 4096;

impl EventThread<'_> {
    /// Reads every live space's pending events, applies the non-fault ones
    /// and queues the faults; returns how many events it read.
    ///
    /// Reading happens under the gate's write side, taken here or, while
    /// the program forks, held for this thread by the fork's prepare handler
    /// (see [`super::fork`]). Until a fork's own event has been read, glibc
    /// holds every malloc lock and the forking thread waits for this thread:
    /// so this never blocks on the gate (a thread holding it may be waiting
    /// for malloc) and allocates nothing before the fork event is in.
    fn read_pending(&mut self) -> usize {
        let shared = self.shared;
        #[cfg(feature = "fault-injection")]
        shared.hold_events_if_armed();
        let mut read = 0;
        let gate = loop {
            if shared.fork_pending.load(Ordering::SeqCst) {
                // What is read now is applied only once this thread has the
                // gate; until then no other thread may act on the
                // bookkeeping (see `Shared::read_gate`). Raised before the
                // second look, so that a thread that takes the gate after
                // the fork and finds it low knows nothing is read here.
                shared.unapplied.store(true, Ordering::SeqCst);
                if shared.fork_pending.load(Ordering::SeqCst) {
                    read += self.read_raw();
                    if !self.raw.iter().any(|e| matches!(e, Event::Fork { .. })) {
                        std::thread::yield_now();
                        continue;
                    }
                }
                // The fork's event is in (or the fork is over): the forker
                // gives the gate back once fork has returned.
            }
            match shared.gate.try_write() {
                Ok(g) => break g,
                Err(_) => {
                    #[cfg(feature = "fault-injection")]
                    shared.gate_waits.fetch_add(1, Ordering::Relaxed);
                    std::thread::yield_now()
                }
            }
        };
        read += self.read_raw();
        let read_at = Instant::now();
        let applied = shared.reads.load(Ordering::Acquire);
        let spaces: Vec<Arc<Space>> = shared.spaces.read().expect("spaces lock").clone();
        let origins = std::mem::take(&mut self.origin);
        for (event, &(k, read_no)) in self.raw.drain(..).zip(origins.iter()) {
            let space = &spaces[k as usize];
            match event {
                Event::PageFault {
                    addr,
                    write,
                    wp,
                    tid,
                } => self.backlog.push_back(Fault {
                    space: space.clone(),
                    addr,
                    write,
                    wp,
                    tid,
                    read_at,
                }),
                Event::Remove { start, end } => {
                    if !shared.is_own_drop(space, start, end, read_no) {
                        events::on_remove(shared, space, start, end);
                    }
                }
                Event::Unmap { start, end } => events::on_unmap(shared, space, start, end),
                Event::Remap { from, to, len } => {
                    events::on_remap(shared, space, from, to, len, &mut self.follow_ups)
                }
                Event::Fork { child } => {
                    let child = events::on_fork(shared, space, child, &mut self.follow_ups);
                    let mut all = shared.spaces.write().expect("spaces lock");
                    all.push(child);
                    self.pollfds
                        .reserve((all.len() + WAKE_UP_ENTRIES).saturating_sub(self.pollfds.len()));
                }
            }
        }
        self.origin = origins;
        self.origin.clear();
        for space in &spaces {
            events::settle_drops(shared, space, false);
        }
        shared.forget_returned_drops(applied);
        shared.unapplied.store(false, Ordering::SeqCst);
        // Freed before the gate goes: a fork's prepare handler takes the
        // gate as soon as it is free, then glibc locks malloc until this
        // thread has read the fork's event, and a free here after the gate
        // would wait for that lock forever (a hang the model soak found).
        drop(spaces);
        drop(gate);
        read
    }

    /// Reads what every live space has pending into `raw` (whose capacity is
    /// reserved: no allocation), noting each event's space and read number
    /// in `origin`.
    ///
    /// While a drop in place of the reclaimer's is in flight in a space,
    /// its events are read one at a time, and once the drop's last REMOVE
    /// is read, no more until the drop's call has returned (at most
    /// [`HOLD_MAX_MS`]). The madvise zaps only after its event is read, with
    /// the address space's lock taken again, whatever is mapped there then;
    /// an unmap of the program's read together with it would let the
    /// program map and write new memory there before the zap. Held, the
    /// program's munmap returns only after the zap. (A drop over several
    /// mappings raises one REMOVE per mapping, each after the zap of the
    /// one before, so only its last can be held for: the reclaimer drops
    /// one mapping at a time.)
    ///
    /// Nor is anything read from a space while another process's agent
    /// moves pages of it out for the reclaimer, until the agent has
    /// answered (see `reclaim.rs`, `move_out`).
    fn read_raw(&mut self) -> usize {
        let shared = self.shared;
        let spaces = shared.spaces.read().expect("spaces lock");
        let read_no = shared.reads.fetch_add(1, Ordering::AcqRel) + 1;
        let mut read = 0;
        for (k, space) in spaces.iter().enumerate() {
            if !space.alive.load(Ordering::Acquire)
                || self.raw.len() + READ_BATCH > self.raw.capacity()
                || events_held(shared, space)
            {
                continue;
            }
            loop {
                // Sampled before each read: a drop that begins just after
                // could still have its event read in a batch with what
                // follows it (a window of a few instructions).
                let one_at_a_time = shared.own_drop_in_flight(space.id).is_some();
                let before = self.raw.len();
                match space
                    .uffd
                    .read_events(&mut self.raw, if one_at_a_time { 1 } else { READ_BATCH })
                {
                    Ok(n) => read += n,
                    Err(UffdError::ProcessGone) => break,
                    Err(e) => panic!("reading userfaultfd events: {e}"),
                }
                while self.origin.len() < self.raw.len() {
                    self.origin.push((k as u32, read_no));
                }
                let Some(last) = self.raw.get(before..).and_then(|new| new.last()) else {
                    break;
                };
                if let Event::Remove { start, end } = *last {
                    // The drop cannot return before this event is read: it
                    // is still the one in flight, if the event is its. Its
                    // last event reaches its end, and is its first (at its
                    // start) or comes after that one: a program's drop of
                    // a piece at the end, read before the drop's own
                    // event, would hold that event off until the bound.
                    if let Some((generation, from, to)) = shared.own_drop_in_flight(space.id) {
                        if start == from {
                            self.drop_begun = Some(generation);
                        }
                        if from <= start
                            && start < to
                            && end >= to
                            && self.drop_begun == Some(generation)
                        {
                            space
                                .events_held_at
                                .store(shared.now_ms(), Ordering::Release);
                            space.events_held_for.store(generation, Ordering::Release);
                            break;
                        }
                    }
                }
                if !one_at_a_time || self.raw.len() + 1 > self.raw.capacity() {
                    break;
                }
            }
        }
        read
    }

    /// Takes the gate's read side for serving faults, reading (and, when
    /// it can, applying) events until it gets it.
    fn hold_pass(&mut self) {
        let shared = self.shared;
        while self.pass.is_none() {
            match shared.gate.try_read() {
                Ok(g) => self.pass = Some(g),
                Err(_) => {
                    self.read_pending();
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Releases children that have exited or exec'd, and forgets regions
    /// gone whole whose last busy folio has settled.
    fn reap_children(&mut self) {
        let shared = self.shared;
        // Never block on the gate here (see `read_pending`): try later. Held
        // before anything is allocated.
        let Ok(_gate) = shared.gate.try_write() else {
            return;
        };
        // Regions gone whole, kept while a folio of theirs was busy (an
        // eviction that has finished since).
        for space in shared.spaces.read().expect("spaces lock").iter() {
            space.forget_settled_regions();
        }
        let gone: Vec<Arc<Space>> = shared
            .spaces
            .read()
            .expect("spaces lock")
            .iter()
            .filter(|s| s.owner != Owner::Runtime && !s.uffd.is_alive())
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        for space in &gone {
            events::release_space(shared, space);
        }
        // A child that touched its beacon and exec'd or exited before it
        // asked to be adopted.
        shared
            .beacon_hits
            .lock()
            .expect("beacon lock")
            .retain(|_, id| !gone.iter().any(|g| g.id == *id));
        shared
            .spaces
            .write()
            .expect("spaces lock")
            .retain(|s| !gone.iter().any(|g| g.id == s.id));
    }
}

impl Server for EventThread<'_> {
    fn may_wait(&self) -> bool {
        false
    }

    /// Only to a filler that is free (one waiting for room would leave the
    /// folio waiting behind it); with memory near the limit always (the
    /// reclaim work, and faults waiting for room, keep this thread's
    /// reading in demand), and with it well under while that has paid
    /// lately. Near the limit, the hand-off shortened the waits: `uswap
    /// bench faults --mode pressure --folios 64k --handoff-pages 0,2` gave a
    /// p50 of 161 us served in place against 114 us handed on.
    fn hands_off(&mut self, pages: usize, tid: u32) -> Option<Arc<AtomicBool>> {
        let shared = self.shared;
        let min = shared.config.handoff_pages;
        if min == 0
            || pages < min
            || shared.filler_jobs.load(Ordering::Acquire) >= shared.config.fillers.max(1)
            || shared.shutdown.load(Ordering::Acquire)
        {
            return None;
        }
        if !reclaim_idle(shared) || shared.handoff_pays.pays() {
            // Another thread's swap-in in flight already is beside it.
            self.handed_on.retain(|(_, b)| Arc::strong_count(b) > 1);
            let another = self.handed_on.iter().any(|&(t, _)| t != tid);
            let beside = Arc::new(AtomicBool::new(another));
            self.handed_on.push((tid, beside.clone()));
            return Some(beside);
        }
        self.served_in_place = InPlace::Served;
        None
    }

    fn enter<'s>(&self, shared: &'s Shared) -> Option<Pass<'s>> {
        // Never block on the gate: a forking program's prepare handler may
        // hold it until this thread has read the fork's event.
        if self.pass.is_some() {
            Some(Pass::Held)
        } else {
            shared
                .gate
                .try_read()
                .ok()
                .map(|g| Pass::Taken { _guard: g })
        }
    }

    fn on_eagain(&mut self) {
        // The event that makes the address space change may be waiting for
        // this thread.
        self.pass = None;
        self.read_pending();
        std::thread::yield_now();
        self.hold_pass();
    }
}

/// Runs the event thread: one reader per place of
/// `RuntimeConfig::event_readers`, each taking the role of the event thread
/// while there are events to read and work to do (see [`read_and_serve`]).
/// Returns once the runtime has ended and one of them has finished it.
pub(crate) fn event_loop(shared: &Shared) {
    let allowed = crate::sys::allowed_cpus();
    let places = shared.config.event_readers.placement(&allowed);
    let role = RoleLock {
        state: Mutex::new(Role(EventThread {
            shared,
            pass: None,
            backlog: VecDeque::new(),
            follow_ups: Vec::new(),
            raw: Vec::with_capacity(PENDING_EVENTS),
            origin: Vec::with_capacity(PENDING_EVENTS),
            pollfds: Vec::with_capacity(64),
            reaped: Instant::now(),
            last_event: Instant::now(),
            drop_begun: None,
            served_in_place: InPlace::Told,
            handed_on: Vec::new(),
            finished: false,
        })),
        holder: Mutex::new(Holder::default()),
        freed: Condvar::new(),
        allowed,
    };
    // Every reader past its start-up allocations before the runtime is
    // handed out (see `Runtime::new`).
    let started = (Mutex::new(0usize), Condvar::new());
    std::thread::scope(|scope| {
        let mut others = 0;
        for (i, &cpu) in places.iter().enumerate().skip(1) {
            let (role, started) = (&role, &started);
            let spawned = std::thread::Builder::new()
                .name(format!("uswap-uffd-{i}"))
                .spawn_scoped(scope, move || {
                    super::fail_loudly(&format!("uswap-uffd-{i}"), || {
                        read_and_serve(shared, role, cpu, || {
                            *started.0.lock().expect("started lock") += 1;
                            started.1.notify_all();
                        })
                    })
                });
            match spawned {
                Ok(_) => others += 1,
                // The readers there are serve every CPU, if with less
                // locality.
                Err(e) => eprintln!("uswap: starting event reader {i}: {e}; going on without it"),
            }
        }
        read_and_serve(shared, &role, places[0], || {
            let count = started.0.lock().expect("started lock");
            drop(
                started
                    .1
                    .wait_while(count, |n| *n < others)
                    .expect("started lock"),
            );
            shared.thread_started();
        });
    });
}

/// How long a reader waits for the role before it lets the holder run on
/// any CPU: a holder pinned to a CPU that a thread of higher priority (a
/// real-time one, say) keeps busy would otherwise hold the role, and every
/// fault with it, for as long as that thread runs. Far longer than a busy
/// turn (the largest swap-in served in place).
const HOLDER_GRACE: Duration = Duration::from_millis(5);

/// The event thread's role: its state, and who holds it.
///
/// The two locks are never held together: `holder` is taken for moments,
/// to name or clear the holder, and `state` by the thread named holder
/// while it turns.
struct RoleLock<'a> {
    state: Mutex<Role<'a>>,
    holder: Mutex<Holder>,
    /// Signalled when the role is given up while a reader waits for it.
    freed: Condvar,
    /// The CPUs the runtime may use: a holder's pin is widened to them.
    allowed: Vec<usize>,
}

/// Who holds the role, and who waits for it.
#[derive(Default)]
struct Holder {
    /// The holder's thread id (0: the role is free).
    tid: i32,
    /// Readers waiting for the role.
    waiting: usize,
    /// A waiting reader let the holder run on any CPU; it pins itself
    /// again when it gives the role up.
    widened: bool,
}

impl<'a> RoleLock<'a> {
    /// Waits for the role and takes it for thread `tid`. A holder that
    /// keeps it past [`HOLDER_GRACE`] is let run on any CPU.
    fn take(&self, tid: i32) -> std::sync::MutexGuard<'_, Role<'a>> {
        let mut h = self.holder.lock().expect("role holder lock");
        while h.tid != 0 {
            h.waiting += 1;
            let (again, wait) = self
                .freed
                .wait_timeout(h, HOLDER_GRACE)
                .expect("role holder lock");
            h = again;
            h.waiting -= 1;
            if wait.timed_out() && h.tid != 0 && !h.widened {
                // Under the holder lock, so that the holder, which gives
                // the role up under it, finds the flag once this is done.
                crate::sys::set_affinity(h.tid, &self.allowed);
                h.widened = true;
            }
        }
        h.tid = tid;
        drop(h);
        // Uncontended: only the thread named holder takes it.
        self.state.lock().expect("event role lock")
    }

    /// Gives the role up; the holder (pinned to `cpu`, if given) pins
    /// itself again if a waiting reader widened it. The gate's pass goes
    /// first, on this thread (see [`Role`]).
    fn give_up(&self, mut state: std::sync::MutexGuard<'_, Role<'a>>, cpu: Option<usize>) {
        state.0.pass = None;
        drop(state);
        let mut h = self.holder.lock().expect("role holder lock");
        h.tid = 0;
        let widened = std::mem::take(&mut h.widened);
        if h.waiting > 0 {
            self.freed.notify_one();
        }
        drop(h);
        if let (true, Some(cpu)) = (widened, cpu) {
            crate::sys::pin_to_cpu(cpu);
        }
    }
}

/// One event reader (pinned to `cpu`, if given): it sleeps in poll on
/// every space's descriptor, then takes the event thread's role and turns
/// while there is anything to read or serve (and for `event_spin` after
/// the last event), then gives the role up and sleeps again. A reader
/// woken while another holds the role waits for it, then looks for
/// itself: what the holder read is gone by then. `started` is called once
/// the reader's start-up allocations are done.
///
/// The sleeping poll allocates nothing while a fork may be in flight: a
/// forking program holds glibc's malloc locks until the fork's event is
/// read, by whichever reader holds the role, which must not find every
/// reader stuck in malloc. So a reader's list of descriptors grows only
/// under the gate's read side, which a fork's prepare handler cannot take
/// meanwhile; without it, the reader skips the sleep.
fn read_and_serve(
    shared: &Shared,
    role: &RoleLock<'_>,
    cpu: Option<usize>,
    started: impl FnOnce(),
) {
    if let Some(cpu) = cpu {
        crate::sys::pin_to_cpu(cpu);
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut pollfds: Vec<libc::pollfd> = Vec::with_capacity(64);
    started();
    loop {
        if wait_for_events(shared, &mut pollfds) {
            // A space's events are held: its pending events would wake the
            // poll at once. The role holder looks again after a yield.
            std::thread::yield_now();
        }
        let mut state = role.take(tid);
        let ev = &mut state.0;
        if ev.finished {
            role.give_up(state, cpu);
            return;
        }
        if shared.shutdown.load(Ordering::Acquire) {
            ev.finish();
            ev.finished = true;
            role.give_up(state, cpu);
            return;
        }
        while ev.turn(false) && !shared.shutdown.load(Ordering::Acquire) {}
        role.give_up(state, cpu);
    }
}

/// Sleeps in poll (for at most `RuntimeConfig::event_poll_timeout`) until
/// some live space not held has an event pending, and returns whether some
/// space is held.
/// It does not sleep where one is (but for [`STALLED_HOLD_POLL_MS`] where
/// the discard holding it has stalled), nor where `pollfds` would have to
/// grow and the gate is not to be had (see [`read_and_serve`]).
fn wait_for_events(shared: &Shared, pollfds: &mut Vec<libc::pollfd>) -> bool {
    let spaces = shared.spaces.read().expect("spaces lock");
    if room_in_poll_list(shared, pollfds, spaces.len()) < spaces.len() {
        return false;
    }
    // Looked at only: a hold is ended by the role's holder alone.
    let held = fill_poll_list(shared, pollfds, &spaces, |s| {
        matches!(hold_of(shared, s), Hold::Held)
    });
    drop(spaces);
    if !held || shared.discard_stalled() {
        let timeout = if held {
            STALLED_HOLD_POLL_MS
        } else {
            poll_timeout(shared)
        };
        // SAFETY: `pollfds` is a valid array of its length for the call.
        let ready =
            unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, timeout) };
        if ready > 0 {
            take_space_announcement(shared, pollfds);
        }
    }
    held
}

/// Entries of a reader's poll list past its spaces': the announcement of
/// a new space (`Shared::spaces_added`) and the runtime's end
/// (`Shared::wake_readers`).
const WAKE_UP_ENTRIES: usize = 2;

/// Reads the announcement of a new space if `pollfds`, just polled, found
/// it readable, so that the next poll sleeps again. One reader taking it is
/// enough: whoever reads events next (the role's holder) reads every space
/// there is, and sleeps on all of them.
fn take_space_announcement(shared: &Shared, pollfds: &[libc::pollfd]) {
    let fd = shared.spaces_added.as_raw_fd();
    let announced = pollfds
        .iter()
        .rev()
        .take(WAKE_UP_ENTRIES)
        .any(|p| p.fd == fd && p.revents & libc::POLLIN != 0);
    if announced {
        crate::sys::eventfd_take(&shared.spaces_added);
    }
}

/// Makes room in `pollfds` for `spaces` entries and the wake-ups
/// ([`WAKE_UP_ENTRIES`]) where it may, and returns how many spaces fit.
/// Growing allocates, and an allocation may wait for malloc's locks, which
/// a thread of this process that forks holds until the role's holder has
/// read its fork's event: only the gate's read side (whose write side that
/// fork's prepare handler holds meanwhile) makes it safe.
fn room_in_poll_list(shared: &Shared, pollfds: &mut Vec<libc::pollfd>, spaces: usize) -> usize {
    if spaces + WAKE_UP_ENTRIES > pollfds.capacity() {
        if let Ok(_gate) = shared.gate.try_read() {
            pollfds.clear();
            pollfds.reserve(spaces + WAKE_UP_ENTRIES);
        }
    }
    spaces.min(pollfds.capacity().saturating_sub(WAKE_UP_ENTRIES))
}

/// Fills `pollfds` with one entry per space of `spaces`, those `held` says
/// are held left out (their pending events would wake the poll at once),
/// then the announcement of a new space, then the runtime's wake-up until
/// the runtime is ending (see [`ENDING_POLL_MS`]); returns whether any
/// space was held. Callers make room first ([`room_in_poll_list`]), so
/// that it never grows `pollfds`.
fn fill_poll_list(
    shared: &Shared,
    pollfds: &mut Vec<libc::pollfd>,
    spaces: &[Arc<Space>],
    mut held: impl FnMut(&Space) -> bool,
) -> bool {
    pollfds.clear();
    let mut any = false;
    pollfds.extend(spaces.iter().map(|s| {
        let hold = held(s);
        any |= hold;
        libc::pollfd {
            fd: if hold { -1 } else { s.uffd.raw_fd() },
            events: libc::POLLIN,
            revents: 0,
        }
    }));
    pollfds.push(libc::pollfd {
        fd: shared.spaces_added.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    if !shared.shutdown.load(Ordering::Acquire) {
        pollfds.push(libc::pollfd {
            fd: shared.wake_readers.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    any
}

/// The event thread's state, passed from reader to reader.
struct Role<'a>(EventThread<'a>);

// SAFETY: every member but one is `Send`. The one that may not cross
// threads, the gate's read guard (`EventThread::pass`), is taken on the
// thread holding the role and released there before the role's lock is
// (`RoleLock::give_up` clears it first): it is `None` whenever the lock is
// free, so no guard ever reaches another thread.
unsafe impl Send for Role<'_> {}

impl EventThread<'_> {
    /// One round of service: now and then a look for children that exited,
    /// then a look for events (a wait of at most the poll timeout if
    /// `sleep`, and nothing is spinning or held), which are read and
    /// applied, then the follow-up installs and the faults read. Returns
    /// whether to turn again at once: something was read or served, the
    /// spin for the next event goes on, or a space's events are held.
    fn turn(&mut self, sleep: bool) -> bool {
        let shared = self.shared;
        if self.reaped.elapsed() >= CHILD_CHECK {
            self.reap_children();
            self.reaped = Instant::now();
        }
        if self.backlog.is_empty() && self.follow_ups.is_empty() {
            let pollfds = &mut self.pollfds;
            let spaces = shared.spaces.read().expect("spaces lock");
            let unsettled = spaces
                .iter()
                .any(|s| s.has_unsettled_drops.load(Ordering::Acquire));
            // Spaces attached since the list last grew may not fit while a
            // fork is in flight: they are left out of this poll (which only
            // decides whether to wait), and `read_pending` reads them all.
            let fit = room_in_poll_list(shared, pollfds, spaces.len());
            // A held space is left out, and looked at again at once: the
            // hold ends when the reclaimer's call returns, which yielding
            // lets it do; once that call has stalled, after a short sleep
            // (see `STALLED_HOLD_POLL_MS`).
            let held = fill_poll_list(shared, pollfds, &spaces[..fit], |s| events_held(shared, s));
            drop(spaces);
            let stalled = held && shared.discard_stalled();
            // Not while the fillers work: the CPU is theirs.
            let spinning = self.last_event.elapsed() < shared.config.event_spin
                && shared.filler_jobs.load(Ordering::Acquire) == 0;
            let timeout = if stalled {
                STALLED_HOLD_POLL_MS
            } else if spinning || held || !sleep {
                0
            } else {
                poll_timeout(shared)
            };
            // SAFETY: `pollfds` is a valid array of its length for the call.
            let ready =
                unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, timeout) };
            if ready <= 0 {
                // Nothing came (a held space, left out of the poll, may
                // have a fault waiting: no verdict then).
                if let (InPlace::AtNextPoll(_), 0, false) = (self.served_in_place, ready, held) {
                    self.served_in_place = InPlace::Told;
                    shared.handoff_pays.tell(false);
                }
                if held {
                    if !stalled {
                        std::thread::yield_now();
                    }
                } else if spinning {
                    // Near the limit the reclaimer and the engines need the
                    // CPU: looking again after a yield still spares the
                    // fault a wake-up when they do not (8 alternating runs
                    // of `uswap run --memory-high 32M --folio-size 4k --
                    // touch faults 256 2 20000`: median p50 30 us against
                    // 46 us sleeping, lower in all 8 pairs, though p99 was
                    // higher in 6; `uswap usemem` unchanged. A spin
                    // without the yield gave 29 us, but 8-11% of faults
                    // above 100 us against 5-13%).
                    if reclaim_idle(shared) {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                } else if unsettled {
                    // No event to come and settle them: a pass with nothing
                    // read looks at them again (see `events::settle_drops`).
                    // What it reads after all (a fault that came after the
                    // poll) is served at once: no poll wakes for it now.
                    if self.read_pending() > 0 {
                        return true;
                    }
                }
                return spinning || held;
            }
            take_space_announcement(shared, pollfds);
            self.read_pending();
            self.last_event = Instant::now();
        }
        #[cfg(feature = "fault-injection")]
        if !self.follow_ups.is_empty() {
            shared.hold_follow_ups_if_armed();
        }
        self.hold_pass();
        for fu in std::mem::take(&mut self.follow_ups) {
            swapin::swap_in(shared, &fu.space, &fu.region, fu.folio, self, false);
            // A region whose range is all gone may have been kept for it.
            fu.space.forget_settled_regions();
        }
        // The first faults read after a swap-in served in place (by a poll,
        // or by a read while an install met EAGAIN).
        if let InPlace::AtNextPoll(tid) = self.served_in_place {
            if !self.backlog.is_empty() {
                self.tell_in_place(tid);
            }
        }
        while let Some(fault) = self.backlog.pop_front() {
            bump(&shared.counters.faults);
            // Every swap-in handed on for another thread, still in flight,
            // has a fault beside it.
            for (t, beside) in &self.handed_on {
                if *t != fault.tid && Arc::strong_count(beside) > 1 {
                    beside.store(true, Ordering::Relaxed);
                }
            }
            if !handle_fault(shared, &fault, self) {
                shared.waiting_for_room.fetch_add(1, Ordering::AcqRel);
                hand_to_fillers(shared, FillerJob::MustWait(fault));
                continue;
            }
            if let InPlace::Served = self.served_in_place {
                if self.backlog.is_empty() {
                    self.served_in_place = InPlace::AtNextPoll(fault.tid);
                } else {
                    self.tell_in_place(fault.tid);
                }
            }
        }
        self.pass = None;
        true
    }

    /// Tells the evidence of a swap-in served in place for thread `tid`
    /// from the faults read and not yet served: whether one of another
    /// thread is among them (see [`HandoffPays`]).
    fn tell_in_place(&mut self, tid: u32) {
        self.served_in_place = InPlace::Told;
        let another = self.backlog.iter().any(|f| f.tid != tid);
        self.shared.handoff_pays.tell(another);
    }

    /// The runtime is ending. While memory of the process is registered
    /// with one of its descriptors, the kernel raises a FORK event there for
    /// every fork and holds the forking thread until it is read; the fork's
    /// child already has a copy of the descriptor then, so closing ours
    /// would not let the fork go. So this thread serves on until the other
    /// runtime threads have ended and no fork is in flight; then, with forks
    /// held off, it installs in forked children and attached processes what
    /// they still hold in the store (the store ends with the runtime; they
    /// must never read zeros instead), unregisters what moves
    /// carried out of regions, and lets go of every descriptor.
    fn finish(&mut self) {
        loop {
            if self.shared.helpers_ended.load(Ordering::Acquire) {
                self.take_back_filler_jobs();
                if let Some(_no_fork) = super::fork::quiet() {
                    while self.give_served_spaces_their_memory() {
                        self.turn(true);
                    }
                    self.let_go();
                    return;
                }
            }
            self.turn(true);
        }
    }

    /// Serves here what was handed to the fillers after they had ended
    /// (the runtime's end is seen by the fillers and this thread at
    /// different times): a folio taken for loading would wait for ever, and
    /// with it the children and attached processes that outlive the
    /// runtime's user. Nothing is handed on once the fillers have ended
    /// (`hands_off`, and no fault waits for room at the end).
    ///
    /// Under the pass throughout, as everything this thread frees: a job
    /// may hold the last reference to a space or region, and a free while
    /// the program forks would wait for glibc's malloc locks, which the
    /// fork holds until this thread has read its event (a hang the model
    /// soak found: an ending runtime's event thread stuck in the drop of a
    /// forked child's space).
    fn take_back_filler_jobs(&mut self) {
        let shared = self.shared;
        self.hold_pass();
        let jobs = std::mem::take(&mut *shared.faults.0.lock().expect("fault queue lock"));
        for job in jobs {
            match job {
                FillerJob::MustWait(fault) => {
                    shared.waiting_for_room.fetch_sub(1, Ordering::AcqRel);
                    // No fault waits for room at the end: served here.
                    if !handle_fault(shared, &fault, self) {
                        self.backlog.push_back(fault);
                    }
                }
                FillerJob::SwapIn {
                    fault,
                    region,
                    folio,
                    beside,
                } => {
                    bring_in(shared, &fault, &region, folio, self);
                    shared.handoff_pays.done(beside);
                }
            }
            shared.filler_jobs.fetch_sub(1, Ordering::AcqRel);
        }
        self.pass = None;
    }

    /// Swaps in every folio that forked children and attached processes
    /// still hold in the store. Returns whether some folio was busy (a
    /// follow-up or an eviction's heir not settled yet): the caller serves a
    /// round and asks again.
    fn give_served_spaces_their_memory(&mut self) -> bool {
        let shared = self.shared;
        let children: Vec<Arc<Space>> = shared
            .spaces
            .read()
            .expect("spaces lock")
            .iter()
            .filter(|s| s.owner != Owner::Runtime && s.alive.load(Ordering::Acquire))
            .cloned()
            .collect();
        let mut busy = false;
        self.hold_pass();
        for space in &children {
            let regions = space.regions.read().expect("regions lock").clone();
            for region in &regions {
                for (i, f) in region.folios.iter().enumerate() {
                    let w = f.load();
                    match folio::state(w) {
                        SWAPPED => {
                            let loading =
                                folio::with_slot(LOADING, folio::slot(w)) | (w & folio::EXTRA);
                            if f.transition(w, loading) {
                                swapin::swap_in(shared, space, region, i, self, false);
                            } else {
                                busy = true;
                            }
                        }
                        EVICTING | LOADING | ZEROING | INHERITING => busy = true,
                        _ => {}
                    }
                }
            }
        }
        self.pass = None;
        // A child that forked meanwhile (its event read where an install
        // met EAGAIN) shares entries its parent held, and is not among
        // those looked at: another round, as for follow-ups not served yet.
        // Once no space holds anything stored, a fork copies pages, and
        // its child loses nothing when the descriptors go.
        let served_now = shared
            .spaces
            .read()
            .expect("spaces lock")
            .iter()
            .filter(|s| s.owner != Owner::Runtime && s.alive.load(Ordering::Acquire))
            .count();
        busy || served_now != children.len() || !self.follow_ups.is_empty()
    }

    /// Unregisters the memory moves carried out of the runtime's regions
    /// (see `Space::strays`), then lets go of every descriptor: the kernel
    /// unregisters whatever else is still registered with them.
    fn let_go(&mut self) {
        let own = self.shared.own_space();
        for (start, end) in std::mem::take(&mut *own.strays.lock().expect("strays lock")) {
            match own.uffd.unregister(start, end - start) {
                Ok(()) | Err(UffdError::NoMapping | UffdError::ProcessGone) => {}
                // Not ours any more in a way no event told (it cannot be
                // unregistered as a whole): letting go below clears it.
                Err(e) => eprintln!(
                    "uswap: unregistering moved memory at {start:#x}+{:#x}: {e}",
                    end - start
                ),
            }
        }
        for space in self.shared.spaces.read().expect("spaces lock").iter() {
            events::settle_drops(self.shared, space, true);
        }
        let placeholder = std::fs::File::open("/dev/null").expect("opening /dev/null");
        if let Some(scratch) = own.memory.get().and_then(|m| m.scratch()) {
            assert!(
                scratch.let_go(placeholder.as_raw_fd()),
                "letting go of the scratch's registration"
            );
        }
        for space in self.shared.spaces.read().expect("spaces lock").iter() {
            space
                .uffd
                .let_go(placeholder.as_raw_fd())
                .expect("letting go of a userfaultfd");
        }
    }
}

/// A filler: takes the jobs the event thread hands on, in order.
///
/// After a swap-in it looks for the next job for `event_spin`, yielding
/// the CPU between looks, before it sleeps: a program faulting on large
/// folios sends the next one about a fault's round trip later, and a
/// sleeping filler's wake-up costs as much again where idle CPUs halt.
/// On the 2-CPU build machine, `uswap run --memory-high 32M --folio-size
/// 64k --compressor lzo-rle -- touch faults 256 2 20000 corpus/*.pages`
/// had a lower p50 in 7 of 7 alternating pairs (114-145 us against
/// 135-177 us), and a lower p99 in 3 of them (795-1090 us against
/// 713-1100 us). After a job that waited for room it sleeps at once: 4K
/// swap-ins stay on the event thread, and a filler looking there took the
/// CPU the event thread and the reclaimer needed (4K p50 25-40 us against
/// 30-34 us, and 4-13% of faults above 100 us against 3-5%).
pub(crate) fn filler_loop(shared: &Shared) {
    shared.thread_started();
    let mut swapped_in = false;
    loop {
        let job = {
            let (queue, cv) = &shared.faults;
            let mut q = queue.lock().expect("fault queue lock");
            let idle_since = Instant::now();
            loop {
                if let Some(f) = q.pop_front() {
                    break f;
                }
                if shared.shutdown.load(Ordering::Acquire) {
                    return;
                }
                if swapped_in && idle_since.elapsed() < shared.config.event_spin {
                    drop(q);
                    std::thread::yield_now();
                    q = queue.lock().expect("fault queue lock");
                    continue;
                }
                q = cv
                    .wait_timeout(q, Duration::from_millis(100))
                    .expect("fault queue lock")
                    .0;
            }
        };
        swapped_in = matches!(job, FillerJob::SwapIn { .. });
        match job {
            FillerJob::MustWait(fault) => {
                handle_fault(shared, &fault, &mut Worker);
                shared.waiting_for_room.fetch_sub(1, Ordering::AcqRel);
            }
            FillerJob::SwapIn {
                fault,
                region,
                folio,
                beside,
            } => {
                bring_in(shared, &fault, &region, folio, &mut Worker);
                shared.fault_latency.record(fault.read_at.elapsed());
                shared.handoff_pays.done(beside);
            }
        }
        shared.filler_jobs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one attempt at serving a fault came to.
enum Step {
    /// Served (or nothing to do: the thread is woken or will be).
    Done,
    /// It must wait for reclaim, and this server may not.
    MustWait,
    /// It must wait for reclaim (room for this many bytes), and this
    /// server may: wait for room, then serve it.
    WaitForRoom(usize),
    /// The address space is changing: read the events, then decide again.
    Again,
    /// The fault's folio is taken for loading (LOADING), to be brought in
    /// by a filler (see `RuntimeConfig::handoff_pages`).
    HandOff(Arc<RegionInner>, usize, Arc<AtomicBool>),
}

/// The folio a zero page goes into: (runtime, region, folio).
type ZeroedIn<'a> = (&'a Shared, &'a RegionInner, usize);

/// Fills one missing page with zeros (write-protected with `wp`) and wakes
/// its waiters; a page already there is left alone. A page put in a
/// tracked `folio` ends what earlier drops kept of it for forked children
/// (`events::forget_folio_in_drops`).
fn zero_page(space: &Space, page: usize, wp: bool, folio: Option<ZeroedIn<'_>>) -> Step {
    let step = put_zero_page(space, page, wp, folio);
    if let Step::Done = step {
        swapin::wake_range(space, page, PAGE_SIZE);
    }
    step
}

/// [`zero_page`] but for the wake-up: `Done` once the page is there (or has
/// no mapping, or the process is gone), nobody woken yet.
fn put_zero_page(space: &Space, page: usize, wp: bool, folio: Option<ZeroedIn<'_>>) -> Step {
    match space.uffd.copy(page, swapin::zeros(PAGE_SIZE), wp) {
        Ok(()) => {
            if let Some((shared, region, i)) = folio {
                events::forget_folio_in_drops(shared, space, region.id, i);
            }
        }
        Err(Partial {
            error: UffdError::Exists | UffdError::NoMapping | UffdError::ProcessGone,
            ..
        }) => {}
        Err(Partial {
            error: UffdError::Again,
            ..
        }) => return Step::Again,
        Err(p) => panic!("installing a zero page at {page:#x}: {}", p.error),
    }
    Step::Done
}

/// Marks one missing page poisoned and wakes its waiters.
fn poison_page(space: &Space, page: usize) -> Step {
    match space.uffd.poison(page, PAGE_SIZE) {
        Ok(())
        | Err(Partial {
            error: UffdError::Exists | UffdError::NoMapping | UffdError::ProcessGone,
            ..
        }) => {}
        Err(Partial {
            error: UffdError::Again,
            ..
        }) => return Step::Again,
        Err(p) => panic!("poisoning {page:#x}: {}", p.error),
    }
    swapin::wake_range(space, page, PAGE_SIZE);
    Step::Done
}

/// Lifts a stale write protection from one page (which wakes its waiters).
fn unprotect(space: &Space, page: usize) -> Step {
    match space.uffd.write_protect(page, PAGE_SIZE, false) {
        Ok(()) | Err(UffdError::NoMapping | UffdError::ProcessGone) => Step::Done,
        Err(UffdError::Again) => Step::Again,
        Err(e) => panic!("lifting write protection at {page:#x}: {e}"),
    }
}

/// Lifts the protection of a whole folio (which wakes its waiters); a folio
/// part of which is unmapped falls back to the faulting page alone.
fn unprotect_folio(space: &Space, start: usize, len: usize, page: usize) -> Step {
    match space.uffd.write_protect(start, len, false) {
        Ok(()) | Err(UffdError::ProcessGone) => Step::Done,
        Err(UffdError::NoMapping) => unprotect(space, page),
        Err(UffdError::Again) => Step::Again,
        Err(e) => panic!("lifting write protection at {start:#x}+{len:#x}: {e}"),
    }
}

/// Serves one page fault. Returns false when the server may not wait and
/// the fault must (a filler then takes it).
fn handle_fault(shared: &Shared, fault: &Fault, server: &mut dyn Server) -> bool {
    // Whether this fault has had its turn at room freed by reclaim: it does
    // not queue again when it has to be decided again.
    let mut room = false;
    loop {
        match serve(shared, fault, server, room) {
            Step::Done => {
                shared.fault_latency.record(fault.read_at.elapsed());
                return true;
            }
            Step::MustWait => return false,
            Step::HandOff(region, folio, beside) => {
                bump(&shared.counters.swapins_handed_off);
                hand_to_fillers(
                    shared,
                    FillerJob::SwapIn {
                        fault: fault.clone(),
                        region,
                        folio,
                        beside,
                    },
                );
                return true;
            }
            // What the fault meets may have changed with the events read
            // meanwhile (the folio moved, was dropped or unmapped): decide
            // again from the start.
            Step::Again => server.on_eagain(),
            Step::WaitForRoom(incoming) => {
                throttle(shared, incoming);
                room = true;
            }
        }
    }
}

/// One attempt at serving a fault. Every decision taken on the bookkeeping
/// is carried out under the event gate's read side, so that no event read
/// meanwhile can make it stale; the routines that fill whole folios take the
/// gate themselves.
fn serve(shared: &Shared, fault: &Fault, server: &mut dyn Server, room: bool) -> Step {
    let space = &*fault.space;
    let page = page_floor(fault.addr);
    let Some(gate) = server.enter(shared) else {
        return Step::Again;
    };
    // A forked child saying which space is its (see `Runtime::adopt`),
    // whatever else the page is taken for.
    if space.owner == Owner::Child && space.beacon == Some(page) {
        shared
            .beacon_hits
            .lock()
            .expect("beacon lock")
            .insert(fault.tid as i32, space.id);
    }
    if fault.wp {
        shared.unprotects.begin();
        let (step, lifted) = serve_write_protected(shared, fault, space, page);
        shared
            .unprotects
            .end(lifted.map(|(start, len)| (space.id, start, len)));
        return step;
    }
    let Some((region, i)) = space.lookup(fault.addr) else {
        // Pages a move carried out of a folio that is not back yet: its
        // owner installs them and wakes this range.
        if space.awaits_moved_pages(page, page + PAGE_SIZE) {
            return Step::Done;
        }
        // Other registered memory no region tracks (moved out of a region
        // by a cut, or grown by mremap, or a beacon): fresh anonymous memory
        // reads as zero. Counted, as memory a supervisor has yet to manage
        // (`Attached::untracked_faults`).
        space.untracked_faults.fetch_add(1, Ordering::Relaxed);
        bump(&shared.counters.untracked_faults);
        return zero_page(space, page, false, None);
    };
    if !fault.wp && space.has_unsettled_drops.load(Ordering::Acquire) {
        events::fault_near_witness(space, region.folio_addr(i), region.folio_size);
    }
    let f = &region.folios[i];
    let own = space.is_evicted();
    // The reclaimer's own copy-out faults where memory it took for
    // eviction was replaced (unmapped, and other managed memory mapped or
    // moved there since): the room it would wait for is the room only the
    // reclaimer makes.
    let by_reclaimer = fault.tid as i32 == shared.reclaimer_tid.load(Ordering::Relaxed);
    loop {
        let w = f.load();
        match folio::state(w) {
            UNTOUCHED | SWAPPED => {
                if own && !room && !by_reclaimer {
                    let behind = !server.may_wait()
                        && shared.waiting_for_room.load(Ordering::Acquire) > 0
                        && !shared.shutdown.load(Ordering::Acquire);
                    if behind || must_throttle(shared, region.folio_size) {
                        return if server.may_wait() {
                            Step::WaitForRoom(region.folio_size)
                        } else {
                            Step::MustWait
                        };
                    }
                }
                if folio::state(w) == UNTOUCHED {
                    if f.transition(w, ZEROING | (w & folio::EXTRA)) {
                        let ahead = if own && !by_reclaimer && w == UNTOUCHED {
                            zero_fill_ahead(shared, space, &region, i)
                        } else {
                            0
                        };
                        drop(gate);
                        swapin::zero_fill(shared, space, &region, i, 1 + ahead, server);
                        return Step::Done;
                    }
                } else if f.transition(
                    w,
                    folio::with_slot(LOADING, folio::slot(w)) | (w & folio::EXTRA),
                ) {
                    drop(gate);
                    if let Some(beside) =
                        server.hands_off(region.pages_per_folio() as usize, fault.tid)
                    {
                        return Step::HandOff(region, i, beside);
                    }
                    bring_in(shared, fault, &region, i, server);
                    return Step::Done;
                }
            }
            // A page inside a resident folio that the program dropped: it
            // reads as zero. An UNFIT folio changed with it, and goes back
            // into reclaim. Installed write-protected: the reclaimer may
            // take the folio (it needs only the gate's read side, as this
            // does) and protect and copy it out before this install lands,
            // and a writable page would then take a write the copy does not
            // hold, dropped with the page. The first write lifts the
            // protection as a stale one (counted, see `Unprotects`).
            RESIDENT => {
                shared.requeue_unfit(space.id, &region, i);
                #[cfg(feature = "fault-injection")]
                shared.hole_hold.stop_if_armed(|| true);
                if !fault.write {
                    return zero_page(space, page, true, Some((shared, &region, i)));
                }
                // A write would come straight back for the protection: a
                // second round trip, which a program that drops pages and
                // writes them again pays on every one (about half of a
                // node.js program's faults were such pairs). The write-
                // protect fault's own service lifts it now, before the
                // thread is woken, counted in `Unprotects` as it counts
                // there: a reclaimer that took the folio meanwhile gives
                // up its copy, and one that is evicting it makes the write
                // wait as before.
                let step = put_zero_page(space, page, true, Some((shared, &region, i)));
                if let Step::Done = step {
                    shared.unprotects.begin();
                    let (_, lifted) = serve_write_protected(shared, fault, space, page);
                    shared
                        .unprotects
                        .end(lifted.map(|(start, len)| (space.id, start, len)));
                    // Whatever the service found (a folio busy meanwhile
                    // leaves the protection), the thread retries now.
                    swapin::wake_range(space, page, PAGE_SIZE);
                }
                return step;
            }
            // A page of an untracked folio: nothing evicts it.
            GONE => return zero_page(space, page, false, Some((shared, &region, i))),
            // A clean folio missing a page (the kernel freed one the program
            // had given up with MADV_FREE): its copy is no longer its
            // contents, so it goes before the page reads as zero.
            CLEAN => {
                shared.forget_clean_copy(&region, i);
            }
            // The reclaimer copying out a folio with a hole in it: the zero
            // page it gets is write-protected like the rest of the folio, so
            // a write racing the eviction waits instead of being dropped.
            EVICTING if by_reclaimer => {
                return zero_page(space, page, true, Some((shared, &region, i)))
            }
            POISONED => return poison_page(space, page),
            // Busy folios: their owner wakes the range when done, and this
            // thread's fault is retried then.
            EVICTING | LOADING | ZEROING | INHERITING => return Step::Done,
            other => unreachable!("folio state {other}"),
        }
    }
}

/// Brings in folio `i` of `region`, owned as LOADING for `fault`, and
/// reads ahead after it in the runtime's own memory.
fn bring_in(
    shared: &Shared,
    fault: &Fault,
    region: &Arc<RegionInner>,
    i: usize,
    server: &mut dyn Server,
) {
    let space = &*fault.space;
    if swapin::swap_in(shared, space, region, i, server, !fault.write) == SwappedIn::Done
        && space.is_evicted()
    {
        readahead(shared, space, region, i, server);
    }
}

/// Serves a write-protect fault (under the gate, counted in
/// [`super::Unprotects`]); returns the step and the range whose protection
/// it lifted, if any.
fn serve_write_protected(
    shared: &Shared,
    fault: &Fault,
    space: &Space,
    page: usize,
) -> (Step, Option<(usize, usize)>) {
    let one = Some((page, PAGE_SIZE));
    let Some((region, i)) = space.lookup(fault.addr) else {
        if space.awaits_moved_pages(page, page + PAGE_SIZE) {
            return (Step::Done, None);
        }
        // Registered memory no region tracks: the protection is stale.
        return (unprotect(space, page), one);
    };
    let w = region.folios[i].load();
    match folio::state(w) {
        // The first write to a folio that would not compress: back into
        // reclaim (it may compress now), and the whole folio is unprotected
        // (which wakes the writer).
        RESIDENT if w & UNFIT != 0 => {
            if shared.requeue_unfit(space.id, &region, i) {
                let (start, len) = (region.folio_addr(i), region.folio_size);
                (unprotect_folio(space, start, len, page), Some((start, len)))
            } else {
                // Another fault server took it back meanwhile: decide
                // again.
                (Step::Again, None)
            }
        }
        // The first write to a clean folio: its stored copy goes, then the
        // whole folio is unprotected (which wakes the writer).
        CLEAN => {
            if shared.forget_clean_copy(&region, i) {
                let (start, len) = (region.folio_addr(i), region.folio_size);
                (unprotect_folio(space, start, len, page), Some((start, len)))
            } else {
                // The reclaimer took it meanwhile: decide again.
                (Step::Again, None)
            }
        }
        // A write to a folio being evicted waits until the reclaimer is
        // done with it (it wakes the folio's range).
        EVICTING => {
            bump(&shared.counters.wp_faults);
            (Step::Done, None)
        }
        // Being loaded for a read: its pages go in write-protected before it
        // is published CLEAN, and a write that met them waits for the owner
        // to wake the folio's range, then finds it CLEAN. Lifting the
        // protection now would let the write in unseen.
        LOADING => (Step::Done, None),
        // Any other protection is stale (a child's copy of a page its parent
        // was evicting, a folio whose eviction missed after a move, one
        // whose clean copy was dropped by an event, or a zero page put in a
        // resident folio's hole).
        _ => (unprotect(space, page), one),
    }
}

/// Brings in the next swapped folios of the region (2^page_cluster - 1 of
/// them), while memory is under its limit.
fn readahead(
    shared: &Shared,
    space: &Space,
    region: &super::space::RegionInner,
    i: usize,
    server: &mut dyn Server,
) {
    let window = (1usize << shared.config.page_cluster) - 1;
    for j in i + 1..(i + 1 + window).min(region.folios.len()) {
        if shared.resident.load(Ordering::Relaxed) + region.folio_size > shared.reclaim_limit() {
            return;
        }
        // Taken under the gate, as every folio is taken: the event
        // handlers read and then set a settled folio's word while they hold
        // the write side, and a folio taken between the two would be set
        // GONE (its entries freed) under its new owner, or owned twice.
        let Some(pass) = server.enter(shared) else {
            return;
        };
        let f = &region.folios[j];
        let w = f.load();
        let taken = folio::state(w) == SWAPPED
            && f.transition(
                w,
                folio::with_slot(LOADING, folio::slot(w)) | (w & folio::EXTRA),
            );
        drop(pass);
        if !taken {
            continue;
        }
        if swapin::swap_in(shared, space, region, j, server, true) == SwappedIn::Done {
            shared
                .counters
                .swap_ra
                .fetch_add(region.pages_per_folio() as u64, Ordering::Relaxed);
        }
    }
}

/// Takes the untouched folios after folio `i` (just taken as ZEROING for
/// its first touch) as ZEROING too, for one zero fill with it, and returns
/// how many: none unless the folio before `i` was touched already, so that
/// only a program going through new memory in order gets them (one touching
/// new memory at random would be given memory it never uses). At most
/// `zero_fill_ahead` bytes with folio `i`, up to the region's end or the
/// first folio that is not plainly untouched, and only as far as memory
/// stays under `memory_high`. None while a drop of the space is unsettled:
/// its witness page may lie in a folio dropped whole, and a page put back
/// there unseen by `events::fault_near_witness` would keep the drop from
/// settling. Under the gate.
///
/// Why: every fault is a round trip through the event thread, the faulting
/// thread asleep meanwhile, where the kernel's own first touch is a trap.
/// A program writing new memory in order (`uswap run --memory-high 1G
/// --compressor lzo-rle -- touch usemem 1536 2`) made one fault per folio,
/// and the event threads' time went more to those round trips than to the
/// copies of zeros.
fn zero_fill_ahead(shared: &Shared, space: &Space, region: &RegionInner, i: usize) -> usize {
    let size = region.folio_size;
    let window = shared.config.zero_fill_ahead / size;
    if window < 2
        || i == 0
        || folio::state(region.folios[i - 1].load()) == UNTOUCHED
        || space.has_unsettled_drops.load(Ordering::Acquire)
    {
        return 0;
    }
    let resident = shared.resident.load(Ordering::Relaxed);
    let room = shared.reclaim_limit().saturating_sub(resident) / size;
    let want = (window - 1).min(room.saturating_sub(1));
    let mut taken = 0;
    for f in region.folios[i + 1..].iter().take(want) {
        if !f.transition(UNTOUCHED, ZEROING) {
            break;
        }
        taken += 1;
    }
    if taken > 0 {
        bump(&shared.counters.zero_fills_ahead);
    }
    taken
}

/// Whether memory is far enough under `memory_high` that faults make no
/// reclaim work: only then does the event thread spin for the next event
/// without yielding. Spinning takes a CPU; while the reclaimer and the
/// engines need it (a program streaming through more memory than its
/// limit) that cost more than the wake-up it saves (`uswap usemem 1536M
/// -n 2 --memory-high 1G`, threads: 818-825K against 927-931K KB/s with a
/// 50 us spin).
fn reclaim_idle(shared: &Shared) -> bool {
    let high = shared.reclaim_limit();
    shared.resident.load(Ordering::Acquire) < high - high / 16
}

/// Whether bringing `incoming` bytes in now would pass `memory_high` plus
/// the slack while the reclaimer can still free memory: it is not stuck,
/// nor held in a discard that does not return (see
/// `Shared::discard_stalled`).
fn must_throttle(shared: &Shared, incoming: usize) -> bool {
    let limit = shared.reclaim_limit() + shared.config.slack_at(shared.memory_high());
    shared.resident.load(Ordering::Acquire) + incoming > limit
        && !shared.shutdown.load(Ordering::Acquire)
        && !shared.reclaim_stuck.load(Ordering::Acquire)
        && !shared.discard_stalled()
}

/// Waits while [`must_throttle`] says so, in turn: a filler that began to
/// wait earlier goes first, so that room freed by one reclaim batch does
/// not go to whichever waiter the scheduler happens to run first (on a busy
/// machine the same one could lose every time, and wait hundreds of
/// milliseconds).
fn throttle(shared: &Shared, incoming: usize) {
    let (next, serving) = &shared.room_turns;
    let ticket = next.fetch_add(1, Ordering::AcqRel);
    let mut counted = false;
    loop {
        if serving.load(Ordering::Acquire) == ticket && !must_throttle(shared, incoming) {
            serving.fetch_add(1, Ordering::AcqRel);
            // The next in line may have room already.
            shared.reclaimed.1.notify_all();
            return;
        }
        if !counted {
            bump(&shared.counters.throttled);
            counted = true;
        }
        shared.kick_reclaim();
        let (lock, cv) = &shared.reclaimed;
        let guard = lock.lock().expect("reclaimed lock");
        drop(
            cv.wait_timeout(guard, Duration::from_millis(5))
                .expect("reclaimed lock"),
        );
    }
}

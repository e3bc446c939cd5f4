//! Reclaim: when resident managed memory passes `memory_high`, evict cold
//! folios until it is a margin under it.
//!
//! Marks, as kswapd's: the reclaimer wakes once resident memory passes the
//! limit (`Shared::reclaim_limit`), and goes on evicting down to the low
//! mark, the limit less [`Shared::reclaim_margin`]; faults wait for it only
//! past the limit plus the slack (`RuntimeConfig::slack`). Stopping at the
//! limit itself left no room: the next fault passed it again, and reclaim
//! ran one plug at a time in step with the faults, waking for each.
//!
//! Order: FIFO of folios in fault-in order; a folio that refaulted soon
//! after its eviction (refault distance shorter than what fits in memory,
//! the kernel's workingset test) is marked active and gets one more pass.
//! Victims are collected in plugs, one per address space ([`Plug`]), of up
//! to `compress_batchsize` folios (by default more under a larger limit:
//! `config::BatchSize`; flushed when full, before a 2M folio, and after a
//! short timeout). At a
//! flush they are write-protected, copied out in one `process_vm_readv`,
//! stored with one `store_batch`, then discarded: moved out to a scratch
//! and dropped there, which raises no event (`mm/scratch.rs`; another
//! process's pages by its agent, into a scratch of its own, one request
//! for the first moves of all the plug's runs). Each move is checked
//! against the copy (`Copies`: a device may have written a page pinned
//! before the protection, after the copy), and what differs goes back.
//! What the kernel will not move stays in memory: read-only or locked
//! memory, or memory of other protection (UNFIT until written), a page
//! shared with a forked child or pinned (tried again later). Dropped in
//! place, it would be zapped whatever the range holds once the drop's
//! REMOVE event is read, memory another thread of the program moved or
//! mapped there meanwhile included, and no check before the drop closes
//! that window. Only where nothing moves (no
//! UFFDIO_MOVE before Linux 6.8, or moves turned off) are stored pages
//! dropped in place (MADV_DONTNEED), with the narrowing the event thread
//! gives that window (`fault.rs`, `read_raw`). Adjacent folios
//! of the plug (sequential access makes them the rule) share one
//! write-protect call and one move or MADV_DONTNEED, so the TLB flushes and
//! the REMOVE event round trips are paid per run, not per folio; a run the
//! program split into several mappings moves one mapping at a time (the
//! kernel moves only inside one). A part of a folio the program gave up
//! (REMOVE) before its discard keeps the folio in memory: a MADV_FREE looks
//! like a MADV_DONTNEED, and a write after it keeps the pages. A folio the store
//! refuses is unprotected and stays resident; one refused because it does
//! not compress, with no swap file to take it raw, keeps its protection and
//! leaves the queue until it is written (`folio::UNFIT`), and the limit
//! reclaim works to leaves it out (`Shared::reclaim_limit`).
//!
//! The copy-out goes through `process_vm_readv` rather than a plain memory
//! copy so that a range the program unmapped or moved meanwhile is an error
//! to handle, not a crash.
//!
//! A plug's eviction ends under the event gate's read side, taken once for
//! all its folios ([`finish_plug`]): what the program did to each folio
//! meanwhile (recorded in its extras by the event thread) is applied there,
//! and forked children that inherited it mid-eviction take it over. When the store refuses a whole
//! plug for want of room (pool full and no swap file), or a whole queue's
//! worth of folios in a row would not compress, the reclaimer backs off
//! instead of recompressing the same folios: faults stop waiting for it
//! (`reclaim_stuck`) and it retries after a growing pause. A plug refused
//! only for its own contents is no reason to pause: the next may compress.
//! Faults stop waiting as well while one discard has lasted 50 ms (another
//! process's agent, stopped after the reclaimer found it running, answers
//! only once continued; `Shared::discard_stalled`).

use super::events::{self, FollowUp, Outcome};
use super::folio::{
    self, ACTIVE, CLEAN, DROPPED, EVICTING, GIVEN_UP, GONE, LOADING, POISONED, RESIDENT, SWAPPED,
    UNFIT, UNTOUCHED,
};
use super::memory::{Discarded, DropError, Memory, MoveRange, SCRATCH_LEN, STOPPED_RECHECK};
use super::space::{Extras, RegionInner, Space};
use super::swapin::{self, Worker};
use super::uffd::UffdError;
use super::{FolioRef, Shared};
use crate::page::{PageMask, PAGE_SIZE};
use crate::zswap::{SlotRange, StoreError};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Victim {
    space: Arc<Space>,
    region: Arc<RegionInner>,
    folio: usize,
    /// Where the folio was when its flush began: write protection, copy-out
    /// and drop all act here, so that a move of the region in between
    /// makes them miss together (and the flush notices) rather than act on
    /// two different places.
    addr: usize,
    /// The region's move count when the flush began.
    moves: u32,
    /// The stored copy of a CLEAN folio: nothing to compress, only to drop.
    clean: Option<SlotRange>,
}

/// The first pause after a plug the store refused entirely; it doubles with
/// each refusal in a row, up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) fn reclaim_loop(shared: &Shared) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    shared.reclaimer_tid.store(tid, Ordering::Relaxed);
    let mut plugs: Vec<Plug> = Vec::new();
    let mut staging: Vec<u8> = Vec::new();
    let mut pace = Pace {
        backoff: Duration::ZERO,
        refused_at: Instant::now(),
        unfit_in_row: 0,
    };
    // Woken over the limit, reclaim goes on down to the low mark.
    let mut draining = false;
    shared.thread_started();
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            for plug in &mut plugs {
                release_plug(shared, &mut plug.victims);
            }
            return;
        }
        let resident = shared.resident.load(Ordering::Acquire);
        let limit = shared.reclaim_limit();
        if resident > limit {
            draining = true;
        } else if resident + shared.reclaim_margin() <= limit {
            draining = false;
        }
        let over = draining;
        let pause_left = pace.backoff.saturating_sub(pace.refused_at.elapsed());
        let victim = if over && pause_left.is_zero() {
            let victim = next_victim(shared);
            if victim.is_none() && resident <= limit {
                // Under the limit with nothing left to take: what keeps
                // memory over the low mark cannot go (locked, in its drop
                // grace), and folios that come in later are not to be
                // evicted before memory passes the limit again.
                draining = false;
            }
            victim
        } else {
            None
        };
        if let Some(v) = victim {
            shared.evicting.fetch_add(1, Ordering::Relaxed);
            flush_due(shared, &mut plugs, false, &mut staging, &mut pace);
            plug_victim(shared, &mut plugs, v, &mut staging, &mut pace);
            continue;
        }
        // No victim now: every plug goes once memory is under the low mark.
        if flush_due(shared, &mut plugs, !over, &mut staging, &mut pace) {
            continue;
        }
        if resident > limit && plugs.is_empty() && pause_left.is_zero() {
            // Nothing left to evict.
            shared.reclaim_stuck.store(true, Ordering::Release);
            shared.reclaimed.1.notify_all();
        }
        let wait = if !pause_left.is_zero() {
            pause_left
        } else if plugs.is_empty() {
            Duration::from_millis(10)
        } else {
            shared.config.plug_timeout
        };
        let (lock, cv) = &shared.reclaim_signal;
        let mut kicked = lock.lock().expect("reclaim signal lock");
        if !*kicked || !pause_left.is_zero() {
            kicked = cv
                .wait_timeout(kicked, wait)
                .expect("reclaim signal lock")
                .0;
        }
        *kicked = false;
    }
}

/// Folios taken for eviction (EVICTING) that wait for their flush, all of
/// one address space: a flush acts through one process's descriptor (and
/// its agent). The reclaimer keeps one plug per address space, up to
/// [`MAX_PLUGS`], so that the folios of processes faulting in turn still
/// gather into whole batches. With one plug, flushed whenever the queue's
/// next folio was another process's, `uswap run` of two processes touching
/// at random flushed 2.1 folios per batch (`reclaim_batches` against
/// `evicted_folios`).
struct Plug {
    victims: Vec<Victim>,
    /// When its first folio was taken: it goes after `plug_timeout`.
    since: Instant,
}

/// The most plugs at once; a victim of one more address space first
/// flushes the oldest.
const MAX_PLUGS: usize = 4;

/// Flushes the plugs that waited `plug_timeout` (all of them with `all`),
/// oldest first, until one leaves the store refusing (a pause): the next
/// would only be refused too. Returns whether any was flushed.
fn flush_due(
    shared: &Shared,
    plugs: &mut Vec<Plug>,
    all: bool,
    staging: &mut Vec<u8>,
    pace: &mut Pace,
) -> bool {
    let mut flushed = false;
    for plug in plugs.iter_mut() {
        if all || plug.since.elapsed() >= shared.config.plug_timeout {
            flushed = true;
            if flush_and_pace(shared, &mut plug.victims, staging, pace) {
                break;
            }
        }
    }
    plugs.retain(|p| !p.victims.is_empty());
    flushed
}

/// Adds `v` to its address space's plug, flushing what that makes due: the
/// plug once it holds a batch, and the plug already there before a 2 MiB
/// folio (which starts a plug of its own).
fn plug_victim(
    shared: &Shared,
    plugs: &mut Vec<Plug>,
    v: Victim,
    staging: &mut Vec<u8>,
    pace: &mut Pace,
) {
    let k = match plugs
        .iter()
        .position(|p| p.victims[0].space.id == v.space.id)
    {
        Some(k) => k,
        None => {
            if plugs.len() >= MAX_PLUGS {
                let mut oldest = plugs.remove(0);
                flush_and_pace(shared, &mut oldest.victims, staging, pace);
            }
            plugs.push(Plug {
                victims: Vec::new(),
                since: Instant::now(),
            });
            plugs.len() - 1
        }
    };
    let plug = &mut plugs[k];
    if v.region.folio_size >= 2 << 20 && !plug.victims.is_empty() {
        flush_and_pace(shared, &mut plug.victims, staging, pace);
        plug.since = Instant::now();
    }
    plug.victims.push(v);
    if plug.victims.len() >= shared.config.plug_folios(shared.memory_high()) {
        flush_and_pace(shared, &mut plug.victims, staging, pace);
        plugs.remove(k);
    }
}

/// What a flush achieved.
enum Flushed {
    /// At least one folio left memory.
    Progress,
    /// None did, and the store is out of room (pool at its limit, no
    /// allocation, no slots): waiting lets it drain.
    StoreFull,
    /// None did, for reasons of their own (pages that do not compress with
    /// no swap file to hold them raw, a move meanwhile): other folios may
    /// do better, so reclaim goes on at once.
    Unfit,
}

/// Where the reclaimer stands after refusals, to pace itself.
struct Pace {
    /// The pause after the last refusal that asked for one.
    backoff: Duration,
    refused_at: Instant,
    /// Folios refused for reasons of their own since the last progress.
    unfit_in_row: usize,
}

/// Flushes the plug and sets the pause: none after progress or after unfit
/// folios, a growing one (counted in `reclaim_backoffs`) after a plug the
/// full store refused, or, until the next progress, once as many unfit
/// folios in a row as are queued for eviction have been tried. Only then do
/// faults stop waiting for reclaim (`reclaim_stuck`): one plug of
/// incompressible pages says nothing about the rest of memory. Returns
/// whether it paused.
fn flush_and_pace(
    shared: &Shared,
    plug: &mut Vec<Victim>,
    staging: &mut Vec<u8>,
    pace: &mut Pace,
) -> bool {
    let tried = plug.len();
    let flushed = flush(shared, plug, staging);
    shared.evicting.fetch_sub(tried, Ordering::Release);
    let stuck = match flushed {
        Flushed::Progress => {
            pace.unfit_in_row = 0;
            false
        }
        Flushed::StoreFull => true,
        Flushed::Unfit => {
            pace.unfit_in_row += tried;
            pace.unfit_in_row > shared.fifo.lock().expect("fifo lock").len()
        }
    };
    if stuck {
        pace.backoff = (pace.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
        pace.refused_at = Instant::now();
        shared
            .counters
            .reclaim_backoffs
            .fetch_add(1, Ordering::Relaxed);
    } else {
        pace.backoff = Duration::ZERO;
    }
    shared.reclaim_stuck.store(stuck, Ordering::Release);
    shared.reclaimed.1.notify_all();
    stuck
}

/// Pops folios until one can be taken for eviction (state EVICTING). None
/// once the queue is empty, or once every folio in it has been passed over
/// because it is in its grace after a drop (`folio::DROPPED`). A folio of a
/// process found stopped (`Memory::held`) is held back ([`HeldBack`]).
fn next_victim(shared: &Shared) -> Option<Victim> {
    revisit_given_up(shared);
    release_held_back(shared);
    let queued = shared.fifo.lock().expect("fifo lock").len();
    let mut passed_over = 0;
    loop {
        let next = shared.fifo.lock().expect("fifo lock").pop_front()?;
        let FolioRef {
            space,
            region,
            folio: i,
        } = next;
        let Some(space) = shared.space(space) else {
            continue;
        };
        let Some(region) = space.region(region) else {
            continue;
        };
        let i = i as usize;
        let f = &region.folios[i];
        // Under the gate: the event thread applies what the program did
        // (an unmap makes a resident folio GONE) by reading the word and
        // setting a new one, which must not land on a folio taken for
        // eviction in between.
        let _gate = shared.read_gate();
        let mut w = f.load();
        let state = folio::state(w);
        // An UNFIT folio leaves the queue; an entry of it is stale (the
        // folio was queued twice, and is parked again since).
        if state != RESIDENT && state != CLEAN || w & UNFIT != 0 {
            continue;
        }
        if w & DROPPED != 0 {
            let looked = look_at_dropped(shared, &space, &region, i, w);
            if matches!(looked, Dropped::Waits) {
                shared
                    .counters
                    .drop_grace_waits
                    .fetch_add(1, Ordering::Relaxed);
            }
            match looked {
                Dropped::Gone => continue,
                Dropped::Evictable(plain) => w = plain,
                Dropped::Waits if w & GIVEN_UP != 0 => {
                    shared
                        .given_up
                        .lock()
                        .expect("given up lock")
                        .push_back(next);
                    continue;
                }
                Dropped::Waits | Dropped::Changed => {
                    shared.queue_for_reclaim(space.id, region.id, i);
                    passed_over += 1;
                    if passed_over > queued {
                        return None;
                    }
                    continue;
                }
            }
        }
        // A stopped process's folios wait, out of the queue, until it runs
        // again: its agent could not take them out (see `move_out`).
        if space.memory.get().is_some_and(Memory::held) {
            shared
                .counters
                .stopped_folios_held
                .fetch_add(1, Ordering::Relaxed);
            let mut held = shared.held_back.lock().expect("held back lock");
            held.by_space.entry(space.id).or_default().push_back(next);
            continue;
        }
        if w & ACTIVE != 0 {
            f.clear_flag(ACTIVE);
            shared.queue_for_reclaim(space.id, region.id, i);
            continue;
        }
        if !f.transition(w, EVICTING | (w & folio::EXTRA)) {
            continue;
        }
        let mut clean = (state == CLEAN).then(|| region.slots_of(w));
        if let Some(range) = clean {
            // A CLEAN folio leaves by a discard alone, on the word of its
            // write protection: every page in place and protected since
            // its install, so that any write to it was a fault that took
            // the copy away. That is checked here, before the flush
            // protects the range again (which would hide a page a write
            // went to unseen), and a folio that fails it is stored anew.
            let memory = space
                .memory
                .get()
                .expect("an evicted space reaches its memory");
            if !memory.all_protected(region.folio_addr(i), region.folio_size) {
                shared.store.invalidate(range);
                clean = None;
                // An unmap or move the program made, its event unread, also
                // takes pages away, as does its exit: only a folio changed
                // with the process alive and no change in flight is
                // counted.
                if space.uffd.is_quiet() {
                    shared
                        .counters
                        .clean_unverified
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        return Some(Victim {
            space,
            region,
            folio: i,
            addr: 0,
            moves: 0,
            clean,
        });
    }
}

/// What the reclaimer makes of a DROPPED folio (see `folio::DROPPED`).
enum Dropped {
    /// Given up whole and its pages are gone: made UNTOUCHED, uncounted.
    Gone,
    /// In its grace, with pages still there: they may be about to be
    /// zapped.
    Waits,
    /// Its grace is over: the word it has now, without the mark, to be
    /// evicted as any resident folio (what is still there is the
    /// program's: MADV_FREE, perhaps written again).
    Evictable(u64),
    /// Its word changed meanwhile: to be looked at again.
    Changed,
}

/// Looks at DROPPED folio `i` of `region`, whose word was `w`, under the
/// gate's read side.
fn look_at_dropped(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    w: u64,
) -> Dropped {
    let f = &region.folios[i];
    // A page a fault puts in meanwhile is counted again with the folio's
    // next touch (its zero fill skips it).
    let gone = w & GIVEN_UP != 0 && space.pages_gone(region, i);
    if gone {
        if !f.transition(w, UNTOUCHED) {
            return Dropped::Changed;
        }
        space.take_extras(region, i);
        shared
            .resident
            .fetch_sub(region.folio_size, Ordering::AcqRel);
        return Dropped::Gone;
    }
    if shared.in_drop_grace(w) {
        return Dropped::Waits;
    }
    let plain = folio::undropped(w);
    if f.transition(w, plain) {
        Dropped::Evictable(plain)
    } else {
        Dropped::Changed
    }
}

/// Looks again at the folios given up whole that were waiting for their
/// zap (`Shared::given_up`), each at most once: untouched once their pages
/// are gone, at the head of the queue once their grace is over.
fn revisit_given_up(shared: &Shared) {
    let waiting = shared.given_up.lock().expect("given up lock").len();
    for _ in 0..waiting.min(REVISITS) {
        let Some(next) = shared.given_up.lock().expect("given up lock").pop_front() else {
            return;
        };
        let Some(space) = shared.space(next.space) else {
            continue;
        };
        let Some(region) = space.region(next.region) else {
            continue;
        };
        let i = next.folio as usize;
        let _gate = shared.read_gate();
        let w = region.folios[i].load();
        // Taken out of this state since (unmapped, evicted, dropped
        // again): it is queued wherever that put it.
        if folio::state(w) != RESIDENT || w & (GIVEN_UP | UNFIT) != GIVEN_UP {
            continue;
        }
        match look_at_dropped(shared, &space, &region, i, w) {
            Dropped::Gone => {}
            Dropped::Waits => shared
                .given_up
                .lock()
                .expect("given up lock")
                .push_back(next),
            Dropped::Evictable(_) | Dropped::Changed => {
                shared.queue_for_reclaim_first(space.id, region.id, i)
            }
        }
    }
}

/// The most folios given up whole that one look for a victim looks at
/// again (each reads the page map).
const REVISITS: usize = 16;

/// Folios held back from the queue while their process is stopped, per
/// address space (`Shared::held_back`).
#[derive(Default)]
pub(crate) struct HeldBack {
    by_space: std::collections::HashMap<u32, VecDeque<FolioRef>>,
    /// When the spaces were last looked at.
    looked_at: Option<Instant>,
}

/// Puts the folios held back for a process that runs again back at the
/// front of the queue, in their order (they were the oldest), and forgets
/// those of a process gone; once per [`STOPPED_RECHECK`], one state read
/// per stopped process.
fn release_held_back(shared: &Shared) {
    let mut held = shared.held_back.lock().expect("held back lock");
    if held.by_space.is_empty()
        || held
            .looked_at
            .is_some_and(|t| t.elapsed() < STOPPED_RECHECK)
    {
        return;
    }
    held.looked_at = Some(Instant::now());
    let ids: Vec<u32> = held.by_space.keys().copied().collect();
    for id in ids {
        let space = shared.space(id);
        if space
            .as_ref()
            .is_some_and(|s| s.memory.get().is_some_and(Memory::held))
        {
            continue;
        }
        let folios = held.by_space.remove(&id).unwrap_or_default();
        if space.is_some() {
            let mut fifo = shared.fifo.lock().expect("fifo lock");
            for f in folios.into_iter().rev() {
                fifo.push_front(f);
            }
        }
    }
}

/// Runs of plug entries that are adjacent folios of one region: (first
/// index into the plug, count).
fn runs(plug: &[Victim], include: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (k, v) in plug.iter().enumerate() {
        if !include(k) {
            continue;
        }
        match out.last_mut() {
            Some((first, count))
                if *first + *count == k
                    && plug[*first].region.id == v.region.id
                    && plug[*first].folio + *count == v.folio =>
            {
                *count += 1
            }
            _ => out.push((k, 1)),
        }
    }
    out
}

fn run_range(plug: &[Victim], (first, count): (usize, usize)) -> (usize, usize) {
    let v = &plug[first];
    (v.addr, count * v.region.folio_size)
}

/// Write-protects a range, retrying while the address space changes.
fn write_protect(space: &Space, start: usize, len: usize, protect: bool) -> Result<(), UffdError> {
    loop {
        match space.uffd.write_protect(start, len, protect) {
            Err(UffdError::Again) => std::thread::yield_now(),
            other => return other,
        }
    }
}

/// The one eviction routine: write-protects, copies out and stores the
/// plugged folios (all of one address space) as one batch, drops the stored
/// ones from memory, and finishes each. Returns whether the store accepted
/// anything.
fn flush(shared: &Shared, plug: &mut Vec<Victim>, staging: &mut Vec<u8>) -> Flushed {
    #[cfg(feature = "fault-injection")]
    shared.flush_hold.stop_if_armed(|| true);
    let space = plug[0].space.clone();
    let space = &*space;
    let memory = space
        .memory
        .get()
        .expect("an evicted space reaches its memory");
    // Keep the plug sorted so that adjacent folios form runs.
    plug.sort_by_key(|v| (v.region.id, v.folio));
    // Under the gate: a move of the region applied in between would give a
    // count that says it came with an address from before it, and the checks
    // against the count would then take whatever is at that address now
    // for the folio.
    let gate = shared.read_gate();
    for v in plug.iter_mut() {
        v.moves = v.region.moves.load(Ordering::Acquire);
        v.addr = v.region.folio_addr(v.folio);
    }
    drop(gate);
    // Protections a fault server lifts from here on may cross this flush's
    // (see `Unprotects`): checked before each run is discarded.
    let mark = shared.unprotects.mark();
    let mut protected = vec![true; plug.len()];
    for run in runs(plug, |_| true) {
        let (start, len) = run_range(plug, run);
        match write_protect(space, start, len, true) {
            Ok(()) => {}
            // The range is gone: these folios stay as they were, and the
            // unmap event says what became of them.
            Err(UffdError::NoMapping | UffdError::ProcessGone) => {
                protected[run.0..run.0 + run.1].fill(false)
            }
            Err(e) => panic!("write-protecting {start:#x}+{len:#x}: {e}"),
        }
    }
    // Clean folios are stored already (their pages were write-protected
    // since they came back, so the copy is what they hold): only the others
    // are copied out and stored.
    let fresh: Vec<(usize, usize)> = plug
        .iter()
        .filter(|v| v.clean.is_none())
        .map(|v| (v.addr, v.region.folio_size))
        .collect();
    let sizes: usize = fresh.iter().map(|&(_, len)| len).sum();
    if staging.len() < sizes {
        staging.resize(sizes, 0);
    }
    let whole = protected.iter().all(|&p| p);
    let copied = whole && copy_out(memory, &fresh, &mut staging[..sizes]);
    let mut folios: Vec<&[u8]> = Vec::with_capacity(fresh.len());
    let mut at = 0;
    for &(_, len) in &fresh {
        folios.push(&staging[at..at + len]);
        at += len;
    }
    let copies = Copies::new(plug, &staging[..sizes]);
    let mut stored = if copied {
        shared.store.store_batch(&folios)
    } else {
        fresh.iter().map(|_| Err(StoreError::Io)).collect()
    }
    .into_iter();
    let mut results: Vec<Result<SlotRange, StoreError>> = plug
        .iter()
        .map(|v| match v.clean {
            Some(range) if whole => Ok(range),
            Some(range) => {
                // It stays resident, no longer clean.
                shared.store.invalidate(range);
                Err(StoreError::Io)
            }
            None => stored.next().expect("a result per fresh folio"),
        })
        .collect();
    shared
        .counters
        .reclaim_batches
        .fetch_add(1, Ordering::Relaxed);

    #[cfg(feature = "fault-injection")]
    shared.discard_hold.stop_if_armed(|| true);

    // Drop the stored folios, a run of adjacent ones at a time (at most a
    // scratch's worth): moved out without an event where that works
    // (`mm/scratch.rs`); in place where nothing moves (no UFFDIO_MOVE, or
    // moves turned off), and then the event thread attributes the REMOVE
    // events a drop raises to the reclaimer. Where moves work, what the
    // kernel will not move (read-only, locked, or otherwise unlike the
    // scratch) stays: a drop in
    // place zaps whatever its range holds once its event is read, and
    // memory another thread of the program moves or maps there meanwhile
    // goes with it, a window no check before the drop closes.
    // Plug entries (first, count) kept in memory, and why; empty, and not
    // allocated, in the usual case.
    let mut kept: Vec<(usize, usize, Kept)> = Vec::new();
    // A run is all clean folios or none, so that its moves are checked
    // against the copies of all its folios or of none (see `Copies`).
    let discard_runs: Vec<(usize, usize)> = runs(plug, |k| results[k].is_ok())
        .into_iter()
        .flat_map(|run| copies.split(run))
        .flat_map(|(first, count)| {
            let most = (SCRATCH_LEN / plug[first].region.folio_size).max(1);
            (0..count)
                .step_by(most)
                .map(move |k| (first + k, most.min(count - k)))
        })
        .collect();
    let heads = move_out_together(shared, space, memory, plug, &copies, &discard_runs, mark);
    'runs: for (run, mut head) in discard_runs.into_iter().zip(heads) {
        let (start, len) = run_range(plug, run);
        let (first, count) = run;
        let end = start + len;
        let void = |results: &mut Vec<Result<SlotRange, StoreError>>| {
            for r in &mut results[first..first + count] {
                if let Ok(range) = *r {
                    shared.store.invalidate(range);
                    *r = Err(StoreError::Io);
                }
            }
        };
        // The run leaves from its start on: `at` is where what is left
        // begins, and the next move takes up to `piece_end` (the end of the
        // run, or, once a move of it was refused, of the mapping at `at`:
        // a run that mprotect, mlock or madvise split into several
        // mappings moves one mapping at a time, as the kernel moves only
        // inside one).
        let mut at = start;
        let mut piece_end = end;
        // A move refused for an event that came in (or for a range that
        // changed: nothing mapped at its start) is tried again once the
        // events are in, a few times; then the copies are void and the
        // folios stay (nothing has left memory), where a drop in place
        // could take memory the program has mapped there since.
        let mut tries = 0;
        // Drops in place that found the range changed (see `drop_in_place`).
        let mut drop_tries = 0;
        // Whether anything of the run may have left memory: a discard
        // answered other than "again" (another process's agent may have
        // moved pages and lost its answer), or a drop in place was made.
        let mut maybe_gone = false;
        // Where a move was refused for good, and whether for what is there
        // (it stays) or because nothing moves here
        // (it is dropped in place), once the range is checked again. The
        // refusal may come from memory the program mapped there while the
        // gate was let go for the move (another process's pages move by
        // its agent): the check finds the unmap event, and nothing is
        // dropped or kept.
        let mut refused_at: Option<(usize, bool)> = None;
        while at < end {
            // The run's first move, unless the run had changed, was made
            // with the others' (see `move_out_together`); what follows it
            // (moves of what is left, drops in place) is checked and made
            // here.
            let discarded = match head.take() {
                Some(first_move) => first_move,
                None => {
                    // Under the settled gate every event up to now is applied
                    // and no other is meanwhile: a move of the region since the
                    // flush began (the write protection and copy-out may have
                    // acted on what it left behind, and the program may since
                    // have mapped something else at the old address) voids the
                    // copies here instead of discarding whatever lies there
                    // now. A move out raises no event, so it is made under the
                    // gate too (another process's, by its agent, once the gate
                    // is released, with none of the process's events read until
                    // it answers: see `move_out`); it is refused while an event
                    // is unread, and tried again once the events are in. A drop
                    // in place must wait for its event to be read, so it
                    // follows once the gate is released; the event thread then
                    // reads nothing more of the process until the drop has
                    // returned (see `fault.rs`, `read_raw`), which closes the
                    // window for a drop over one mapping: a drop never covers
                    // more than one.
                    let piece = copies.range(plug, run, at, piece_end - at);
                    let (settled, registered) = settled_gate(shared, space, &[(at, end - at)]);
                    let changed = run_changed(shared, space, plug, run, registered[0], mark);
                    if changed || tries > MOVE_TRIES {
                        // Once part of the run may have left, the copies may be
                        // all there is of it: they stay, and the rest of the
                        // run stays in memory. Each folio's finish then keeps
                        // the copy of one that has left, brings back one that
                        // left in part, and voids that of one still whole in
                        // place.
                        if !maybe_gone {
                            void(&mut results);
                        }
                        continue 'runs;
                    }
                    // The folios `at..to` covers (in part or whole).
                    let piece_folios = |to: usize| {
                        let fs = plug[first].region.folio_size;
                        let lo = first + (at - start) / fs;
                        let hi = first + (to - start).div_ceil(fs);
                        (lo, hi - lo)
                    };
                    if let Some((_, unmovable)) = refused_at.take_if(|&mut (r, _)| r == at) {
                        drop(settled);
                        if unmovable {
                            // The mapping that cannot move stays (each
                            // folio's finish decides: one that left in part
                            // comes back whole), and the rest of the run
                            // moves on after it. (A piece short of the run's
                            // end was already cut to the mapping at `at`.)
                            if piece_end == end {
                                if let Some((_, mapping_end)) = memory.mapping_at(at) {
                                    piece_end = mapping_end.min(end);
                                }
                            }
                            let (lo, count) = piece_folios(piece_end);
                            kept.push((lo, count, Kept::Unmovable));
                            at = piece_end;
                            piece_end = end;
                            continue;
                        }
                        // Nothing moves here: dropped in place, up to the
                        // end of the piece. The drop waits for its event,
                        // which is read under the gate's write side.
                        match drop_in_place(shared, space, memory, at, piece_end - at) {
                            InPlace::Dropped => {}
                            InPlace::Locked => {
                                let (lo, count) = piece_folios(piece_end);
                                kept.push((lo, count, Kept::Locked));
                            }
                            InPlace::Changed => {
                                // Nothing dropped: looked at again under the
                                // settled gate, like a refused move, and the
                                // mapping asked for again; a few times, then
                                // the rest of the run stays (each folio's
                                // finish decides, as above).
                                drop_tries += 1;
                                if drop_tries > MOVE_TRIES {
                                    continue 'runs;
                                }
                                piece_end = end;
                                std::thread::yield_now();
                                continue;
                            }
                        }
                        at = piece_end;
                        piece_end = end;
                        continue;
                    }
                    #[cfg(feature = "fault-injection")]
                    {
                        shared.move_hold.stop_if_armed(|| true);
                        shared.move_hold.over();
                    }
                    move_out(shared, space, memory, &[piece], settled)[0]
                }
            };
            let Discarded {
                bytes,
                again,
                shared: busy,
                unmovable,
                changed,
                stale,
            } = discarded;
            shared
                .counters
                .discarded_by_move
                .fetch_add((bytes / PAGE_SIZE) as u64, Ordering::Relaxed);
            if changed && !stale {
                shared
                    .counters
                    .discard_refused_changed
                    .fetch_add(((end - at) / PAGE_SIZE) as u64, Ordering::Relaxed);
            }
            if stale {
                // Pages that took a device's bytes after their copy moved
                // out and could not go back: what of them is not in place
                // has no copy anywhere. The finish of each folio this move
                // took from poisons the pages it misses rather than bring
                // back the old bytes (those that left before by checked
                // moves keep their copies); the rest of the run stays.
                let fs = plug[first].region.folio_size;
                let lo = first + (at - start) / fs;
                let hi = first + (at + bytes - start).div_ceil(fs);
                kept.push((lo, hi - lo, Kept::Stale));
                shared.counters.stale_moves.fetch_add(1, Ordering::Relaxed);
                continue 'runs;
            }
            at += bytes;
            maybe_gone |= bytes > 0 || !(again || busy);
            if again {
                // Only tries that moved nothing count: one that stopped
                // part way goes on from there.
                if bytes == 0 {
                    tries += 1;
                }
                std::thread::yield_now();
                continue;
            }
            tries = 0;
            if busy {
                // A page shared with a forked child (or pinned), or a
                // stopped process (see `move_out`): the rest of the run
                // stays, as its finish decides (each folio keeps the copy
                // of what left, or stays resident), and is tried again
                // later. A drop would free nothing while the page is
                // shared, and its window could take memory the program maps
                // meanwhile.
                if !memory.held() && !changed {
                    shared
                        .counters
                        .discard_refused_shared
                        .fetch_add(((end - at) / PAGE_SIZE) as u64, Ordering::Relaxed);
                }
                if !maybe_gone {
                    void(&mut results);
                }
                continue 'runs;
            }
            if at == piece_end {
                piece_end = end;
                continue;
            }
            // One mapping at a time, for moves (the kernel moves only
            // inside one) and for drops in place alike: a drop over several
            // mappings raises a REMOVE per mapping, each after the zap of
            // the one before, and only its last is held for (`fault.rs`,
            // `read_raw`); over one, its only REMOVE is its last.
            if bytes == 0 && piece_end == end {
                if let Some((_, mapping_end)) = memory.mapping_at(at) {
                    if mapping_end < end {
                        piece_end = mapping_end;
                        continue;
                    }
                }
            }
            refused_at = Some((at, unmovable));
        }
    }

    #[cfg(feature = "fault-injection")]
    {
        shared.discard_hold.over();
        shared.finish_hold.stop_if_armed(|| true);
        shared.finish_hold.over();
    }

    let full = results.iter().any(|r| {
        matches!(
            r,
            Err(StoreError::PoolLimit | StoreError::AllocFail | StoreError::NoSlots)
        )
    });
    let left = finish_plug(shared, space, plug, results, &protected, &kept);
    for (v, &gone) in plug.iter().zip(&left) {
        if gone && v.clean.is_some() {
            shared
                .counters
                .clean_evictions
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    plug.clear();
    let progress = left.contains(&true);
    #[cfg(feature = "fault-injection")]
    shared.flush_hold.over();
    if progress {
        Flushed::Progress
    } else if full {
        Flushed::StoreFull
    } else {
        Flushed::Unfit
    }
}

/// Why folios of a plug stayed in memory though stored (see `flush`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Where nothing moves, the drop in place was refused: the program
    /// locked them (mlock). Out of reclaim, as the kernel keeps locked
    /// memory off its LRU.
    Locked,
    /// The move was refused for good (EINVAL): the kernel moves only
    /// between mappings alike in access and protection, writable and both
    /// locked or neither, and the scratch is plain read-write memory. So
    /// read-only memory, locked memory, memory also executable or of a
    /// protection key: they wait, write-protected, until written.
    Unmovable,
    /// What moved differs from the copies and not all of it went back
    /// (`Discarded::stale`): the pages not in place are lost, and poisoned.
    Stale,
}

/// The flush's copies of its folios, to check what each move takes against
/// ([`MoveRange`]): where each folio's copy lies in the staging buffer.
/// None for a clean folio: its copy was stored before, and its pages have
/// been write-protected since, so nothing can have written them unseen (a
/// pin for writing takes a write fault first, which a clean folio does not
/// survive, and one taken while the flush holds it waits for the flush).
struct Copies<'a> {
    staging: &'a [u8],
    at: Vec<Option<usize>>,
}

impl<'a> Copies<'a> {
    /// The copies of `plug`'s folios other than clean ones, back to back
    /// in `staging`, in plug order (see `copy_out`).
    fn new(plug: &[Victim], staging: &'a [u8]) -> Copies<'a> {
        let mut next = 0;
        let at = plug
            .iter()
            .map(|v| {
                v.clean.is_none().then(|| {
                    next += v.region.folio_size;
                    next - v.region.folio_size
                })
            })
            .collect();
        Copies { staging, at }
    }

    /// `run` cut where its folios pass from clean to not or back.
    fn split(&self, (first, count): (usize, usize)) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for k in first..first + count {
            match out.last_mut() {
                Some((f, c)) if self.at[*f].is_some() == self.at[k].is_some() => *c += 1,
                _ => out.push((k, 1)),
            }
        }
        out
    }

    /// `start..start + len`, part of `run` (all clean or none, see
    /// [`Copies::split`]), with its copy (none for clean folios).
    fn range(
        &self,
        plug: &[Victim],
        (first, _): (usize, usize),
        start: usize,
        len: usize,
    ) -> MoveRange<'a> {
        let copy = self.at[first].map(|base| {
            let from = base + (start - plug[first].addr);
            &self.staging[from..from + len]
        });
        MoveRange { start, len, copy }
    }
}

/// What became of a drop in place.
enum InPlace {
    /// Dropped, or found unmapped in part (the unmap event says what became
    /// of the folios), or the process is gone, or failed otherwise (each
    /// folio's finish finds which of its pages are still there).
    Dropped,
    /// The kernel refused it: the program locked the memory.
    Locked,
    /// Nothing dropped: the range changed, or an event came in, after the
    /// check (see `DropPages::drop_pages`).
    Changed,
}

/// Drops stored pages in place (MADV_DONTNEED), as the reclaimer's own drop
/// (whose REMOVE events the event thread tells from the program's, see
/// `Shared::is_own_drop`).
///
/// Part of the range unmapped meanwhile: the rest is dropped, and the unmap
/// event says what became of the folios. A process gone: its space is
/// released. A drop that failed otherwise leaves the pages in memory, where
/// `finish_folio` finds them: they stay resident and the stored copy is
/// void.
fn drop_in_place(
    shared: &Shared,
    space: &Space,
    memory: &Memory,
    start: usize,
    len: usize,
) -> InPlace {
    if memory.stopped_now() {
        // As for a move (see `move_out`): nothing asked, nothing dropped.
        shared
            .counters
            .stopped_runs_left
            .fetch_add(1, Ordering::Relaxed);
        return InPlace::Changed;
    }
    shared.begin_own_drop(space.id, start, len);
    let outcome = match timed_discard(shared, || {
        #[cfg(feature = "fault-injection")]
        shared.drop_hold.stop_if_armed(|| true);
        memory.drop_pages(&space.uffd, start, len)
    }) {
        Ok(()) | Err(DropError::Unmapped | DropError::Gone) => {
            shared
                .counters
                .discarded_in_place
                .fetch_add((len / PAGE_SIZE) as u64, Ordering::Relaxed);
            InPlace::Dropped
        }
        Err(DropError::Changed) => {
            shared
                .counters
                .drop_in_place_changed
                .fetch_add(1, Ordering::Relaxed);
            InPlace::Changed
        }
        Err(DropError::Failed(e)) => {
            let before = shared
                .counters
                .eviction_drop_failed
                .fetch_add(1, Ordering::Relaxed);
            // Said once: memory the program locked (mlock) refuses every
            // drop (EINVAL), and would repeat the line at every pass; the
            // counter says how often.
            if before == 0 {
                eprintln!(
                    "uswap: dropping {start:#x}+{len:#x} after storing it: {e}; it stays in memory (further failures are counted in eviction_drop_failed)"
                );
            }
            // MADV_DONTNEED refuses (EINVAL) only memory the program
            // locked (mlock) among what the runtime manages.
            if e.raw_os_error() == Some(libc::EINVAL) {
                InPlace::Locked
            } else {
                InPlace::Dropped
            }
        }
    };
    let made = !matches!(outcome, InPlace::Changed);
    if let Some((from, to)) = shared.end_own_drop(space.id, start, made) {
        let _gate = shared.write_gate();
        events::on_remove(shared, space, from, to);
    }
    #[cfg(feature = "fault-injection")]
    shared.drop_hold.over();
    outcome
}

/// Ends the eviction of a flushed plug's folios (all of `space`) under the
/// gate: applies what the program did to each meanwhile, hands them to
/// forked children that inherited them and publishes their states; then
/// lifts the protection of those that stayed and wakes the writers held on
/// it. Returns, per folio, whether it left memory.
///
/// One settled gate serves the whole plug. The pages left in place are
/// looked at under it, then the address space is probed again: the program
/// may have moved or unmapped them meanwhile (its event then waits unread,
/// and the probe meets EAGAIN), and other memory mapped at the address
/// since would pass for a folio's pages, staying where they were: its copy
/// would be dropped. The probe answers EAGAIN for an unread event anywhere
/// in the address space (the context's `mmap_changing`, looked at before
/// the range), so one probe of the first folio's range before the look and
/// one after cover every folio; each folio's state is then decided and
/// published with no event applied in between.
fn finish_plug(
    shared: &Shared,
    space: &Space,
    plug: &[Victim],
    results: Vec<Result<SlotRange, StoreError>>,
    protected: &[bool],
    kept: &[(usize, usize, Kept)],
) -> Vec<bool> {
    let memory = space
        .memory
        .get()
        .expect("an evicted space reaches its memory");
    // Only stored folios' pages are looked at: one look per run of them.
    let stored_runs = runs(plug, |k| results[k].is_ok());
    let mut follow_ups = Vec::new();
    let (gate, present) = loop {
        let first = &plug[0];
        let probe = (
            first.region.folio_addr(first.folio),
            first.region.folio_size,
        );
        let (gate, _) = settled_gate(shared, space, &[probe]);
        if !space.alive.load(Ordering::Acquire) {
            break (gate, None);
        }
        let mut present = vec![PageMask::default(); plug.len()];
        for &(first, count) in &stored_runs {
            let v = &plug[first];
            let fs = v.region.folio_size;
            let masks = memory.present_folios(v.region.folio_addr(v.folio), fs, count);
            present[first..first + count].copy_from_slice(&masks);
        }
        if stored_runs.is_empty() {
            // Nothing looked at: nothing to probe for.
            break (gate, Some(present));
        }
        match space.uffd.write_protect(probe.0, probe.1, true) {
            Err(UffdError::Again) => {
                drop(gate);
                std::thread::yield_now();
            }
            _ => break (gate, Some(present)),
        }
    };
    let Some(present) = present else {
        for (v, result) in plug.iter().zip(results) {
            finish_folio_of_gone(shared, space, &v.region, v.folio, result, &mut follow_ups);
        }
        drop(gate);
        serve_follow_ups(shared, follow_ups);
        return vec![false; plug.len()];
    };
    let finished: Vec<Finished> = plug
        .iter()
        .zip(results)
        .zip(present)
        .enumerate()
        .map(|(k, ((v, result), present))| {
            // A folio a stale move took from is poisoned whatever else kept
            // part of it (a piece of it in a mapping that cannot move).
            let covering = || {
                kept.iter()
                    .filter(move |&&(first, count, _)| (first..first + count).contains(&k))
                    .map(|&(_, _, why)| why)
            };
            let why_kept = covering()
                .find(|&why| why == Kept::Stale)
                .or_else(|| covering().next());
            finish_folio(
                shared,
                space,
                &v.region,
                v.folio,
                result,
                present,
                protected[k],
                why_kept,
                &mut follow_ups,
            )
        })
        .collect();
    // Where the writers held on the protection wait: one wake per run of
    // adjacent folios, at the address the folios have under this gate. A
    // lift below that lets the gate go may let a move of the region in
    // first; the writers held at the old address are then woken by the
    // move's own handling (`events::on_remap`), and a wake at the old
    // address only makes a thread fault again.
    let wakes: Vec<(usize, usize)> = runs(plug, |_| true)
        .into_iter()
        .map(|(first, count)| {
            let v = &plug[first];
            (v.region.folio_addr(v.folio), count * v.region.folio_size)
        })
        .collect();
    let mut gate = gate;
    for (v, done) in plug.iter().zip(&finished) {
        if done.lift {
            gate = lift_protection(shared, space, &v.region, v.folio, gate);
        }
    }
    drop(gate);
    // Writers held on the protection refault and load the folio; faults
    // where its moved pages live refault and find them (or a hole).
    for (start, len) in wakes {
        swapin::wake_range(space, start, len);
    }
    for done in &finished {
        for &(to, len) in &done.moved {
            swapin::wake_range(space, to, len);
        }
    }
    for (v, done) in plug.iter().zip(&finished) {
        if done.bring_back {
            swapin::swap_in(shared, space, &v.region, v.folio, &mut Worker, false);
            if done.partly_lost && done.unmovable {
                // Part of it cannot move: taken again as it is, it would
                // leave in part and come back at every pass. It waits
                // until its next change (the pages that stayed keep the
                // flush's protection; those brought back are writable).
                let _gate = shared.read_gate();
                park_unmovable(shared, &v.region, v.folio);
            } else if done.partly_lost && done.lift {
                // The pages that stayed keep the flush's protection
                // otherwise (the folio was not resident above): lifted, as
                // for a folio that stays.
                drop(lift_protection(
                    shared,
                    space,
                    &v.region,
                    v.folio,
                    shared.read_gate(),
                ));
            }
        }
    }
    serve_follow_ups(shared, follow_ups);
    finished.iter().map(|done| done.gone).collect()
}

/// Makes folio `i` of `region`, resident, UNFIT: out of the reclaim queue
/// until its next change (see `folio::UNFIT`). Nothing if it is no longer
/// plainly resident (the program changed it meanwhile: a folio it gave up
/// or dropped pages of is the reclaimer's to look at again).
fn park_unmovable(shared: &Shared, region: &RegionInner, i: usize) {
    let f = &region.folios[i];
    let w = f.load();
    if folio::state(w) != RESIDENT || w & (UNFIT | GIVEN_UP | DROPPED) != 0 {
        return;
    }
    // Counted before it is published, as in `finish_folio`: a fault server
    // that sees the flag takes the bytes off again.
    shared.unfit.fetch_add(region.folio_size, Ordering::AcqRel);
    if f.transition(w, w | UNFIT) {
        shared
            .counters
            .unmovable_folios
            .fetch_add(1, Ordering::Relaxed);
    } else {
        shared.unfit.fetch_sub(region.folio_size, Ordering::AcqRel);
    }
}

/// What is left to do for one folio of a flushed plug once its state is
/// published (see [`finish_plug`]).
struct Finished {
    /// The flush write-protected it: the protection goes if it stayed.
    lift: bool,
    /// Its copy is all there is of pages that left: it is brought back.
    bring_back: bool,
    /// Part of it left memory and part stayed in place.
    partly_lost: bool,
    /// It is in part or whole of memory the kernel would not move.
    unmovable: bool,
    /// Where pages the program moved away from it meanwhile live now.
    moved: Vec<(usize, usize)>,
    /// It left memory.
    gone: bool,
}

/// How many pages the program moved out of folio `i` during its eviction
/// are not where they went: a move carries only the pages in place, so
/// pages the discard took before it arrived there empty, and the stored
/// copy is all there is of their bytes. (Pages it carried are in place
/// there; pages dropped or unmapped there since have no destination.)
fn moved_without_their_bytes(
    space: &Space,
    region: &RegionInner,
    i: usize,
    extras: &Extras,
) -> usize {
    let memory = space
        .memory
        .get()
        .expect("an evicted space reaches its memory");
    let at = region.folio_addr(i);
    // One look per run where it went; pages with no destination (dropped
    // or unmapped there) are passed over.
    extras
        .moved
        .iter()
        .map(|&(lo, hi, to)| {
            let there = memory.present_pages(to, (hi - lo) * PAGE_SIZE);
            (lo..hi)
                .filter(|&p| extras.destination(at, p).is_some() && !there.contains(p - lo))
                .count()
        })
        .sum()
}

/// Ends folio `i`'s eviction under the plug's settled gate, given the pages
/// of it still in place (`present`, looked at only if it was stored):
/// applies what the program did to it meanwhile, hands it to forked
/// children that inherited it (their follow-ups go in `follow_ups`) and
/// publishes its state.
#[allow(clippy::too_many_arguments)]
fn finish_folio(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    result: Result<SlotRange, StoreError>,
    present: PageMask,
    was_protected: bool,
    kept: Option<Kept>,
    follow_ups: &mut Vec<FollowUp>,
) -> Finished {
    let f = &region.folios[i];
    let fs = region.folio_size;
    let pages = region.pages_per_folio() as usize;
    // Read, not taken: a fault where moved pages now live looks for them
    // in the extras (under the gate's read side, like this), and must find
    // them until they are installed.
    let extras = space.extras_of(region, i, f.load());
    let mut stored = result.as_ref().ok().copied();
    // The drop acts on whatever is at the address when the kernel gets to
    // it: a move of the region in between (the madvise waits for its event
    // with the address space unlocked) makes it miss, and the folio's pages
    // are then still in memory where the region is now. The stored copy is
    // then void, and the folio stays resident. Unless the discard took some
    // of its pages before it failed (a move stopped by a page a forked
    // child shares, then a drop of the rest refused; a drop in place that
    // stopped at a mapping locked meanwhile; an agent gone): the copy is all
    // there is of those, and the folio is brought back from it (pages
    // still in place are left as they are). Only the folio's own pages
    // count at its address: where the program unmapped, moved or dropped
    // part of it, what is there now (new memory it mapped) is not the
    // folio's. Pages it moved count as gone where nothing is where they
    // went ([`moved_without_their_bytes`]).
    let mut partly_lost = false;
    if let Some(range) = stored {
        let holes = extras.holes();
        let own = |p: &usize| !holes.contains(*p);
        let stayed = (0..pages)
            .filter(own)
            .filter(|&p| present.contains(p))
            .count();
        let left = (0..pages)
            .filter(own)
            .filter(|&p| !present.contains(p))
            .count()
            + moved_without_their_bytes(space, region, i, &extras);
        if stayed > 0 {
            if left > 0 {
                partly_lost = true;
            } else {
                shared.store.invalidate(range);
                stored = None;
            }
        }
    }
    if kept == Some(Kept::Stale) {
        if let Some(range) = stored {
            // Pages of it left holding bytes that may differ from the copy,
            // and did not come back (`Discarded::stale`): the copy would
            // give them old bytes. They read as SIGBUS, as for a copy found
            // corrupt; the pages in place keep theirs. So do pages the
            // program moved away meanwhile where they went: those the move
            // carried are in place there, the others are poisoned there.
            shared.store.invalidate(range);
            events::resolve_inheritors(
                shared,
                space.id,
                region.id,
                i,
                Outcome::Poisoned,
                follow_ups,
            );
            swapin::poison_missing(space, extras.moved_destinations(region.folio_addr(i)));
            let moved: Vec<(usize, usize)> = extras.moved_ranges().collect();
            space.take_extras(region, i);
            events::forget_folio_in_drops(shared, space, region.id, i);
            shared.resident.fetch_sub(fs, Ordering::AcqRel);
            f.set(if extras.unmapped.covers(pages) {
                GONE
            } else {
                POISONED
            });
            return Finished {
                lift: was_protected,
                bring_back: false,
                partly_lost: false,
                unmovable: false,
                moved,
                gone: true,
            };
        }
    }
    let outcome = outcome_of(stored.as_ref());
    events::resolve_inheritors(shared, space.id, region.id, i, outcome, follow_ups);
    let mut bring_back = false;
    match stored {
        Some(range) => {
            let clock = shared
                .evictions
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            region.evicted_at[i].store(clock, Ordering::Relaxed);
            shared.resident.fetch_sub(fs, Ordering::AcqRel);
            shared
                .counters
                .evicted_folios
                .fetch_add(1, Ordering::Relaxed);
            if partly_lost {
                f.set(folio::with_slot(LOADING, range.first) | (f.load() & folio::EXTRA));
                bring_back = true;
            } else if extras.holes().covers(pages) && extras.moved.is_empty() {
                space.take_extras(region, i);
                f.set(extras.all_holes_state());
                if !events::keep_for_unsettled_drop(space, region, i, range, &extras) {
                    shared.store.invalidate(range);
                }
            } else if !extras.moved.is_empty() {
                // Pages moved away meanwhile: put them where they live now
                // (the extras stay until they are in place).
                f.set(folio::with_slot(LOADING, range.first) | folio::EXTRA);
                bring_back = true;
            } else {
                // Holes, if any, stay recorded with the stored folio.
                f.set(folio::with_slot(SWAPPED, range.first) | (f.load() & folio::EXTRA));
            }
        }
        None => {
            // The pages (moved ones included) stay where they are.
            space.take_extras(region, i);
            events::forget_folio_in_drops(shared, space, region.id, i);
            shared
                .counters
                .eviction_refused
                .fetch_add(1, Ordering::Relaxed);
            if !extras.unmapped.is_empty() || !extras.moved.is_empty() {
                f.set(GONE);
                shared.resident.fetch_sub(fs, Ordering::AcqRel);
            } else if extras.removed.covers(pages) && space.pages_gone(region, i) {
                // Given up whole, and gone. (Given up with MADV_FREE and
                // written again, its pages are still there: it stays
                // resident, and counted.)
                f.set(UNTOUCHED);
                shared.resident.fetch_sub(fs, Ordering::AcqRel);
            } else if kept == Some(Kept::Locked) && extras.removed.is_empty() {
                // Locked memory stays out of reclaim, as the kernel keeps it
                // off its LRU: taken again, it would be stored and refused
                // at every pass. It still counts as resident; it comes back
                // to reclaim once the program drops or unmaps it and touches
                // it anew. (Dropped in part meanwhile, it is queued again
                // below: its pages may be about to go.)
                f.set(RESIDENT);
                shared
                    .counters
                    .unevictable_folios
                    .fetch_add(1, Ordering::Relaxed);
            } else if was_protected
                && (matches!(result, Err(StoreError::CompressPoor))
                    || kept == Some(Kept::Unmovable))
            {
                // Taken again as it is, it would be refused again (it does
                // not compress, or cannot move): it waits, write-protected,
                // for its next change (`folio::UNFIT`). Counted before it
                // is published: a fault server that sees the flag takes the
                // bytes off again.
                shared.unfit.fetch_add(fs, Ordering::AcqRel);
                f.set(shared.dropped_meanwhile(&extras, RESIDENT | UNFIT));
                let counter = if kept.is_some() {
                    &shared.counters.unmovable_folios
                } else {
                    &shared.counters.unfit_folios
                };
                counter.fetch_add(1, Ordering::Relaxed);
            } else {
                f.set(shared.dropped_meanwhile(&extras, RESIDENT));
                shared.queue_for_reclaim(space.id, region.id, i);
            }
        }
    }
    Finished {
        lift: was_protected,
        bring_back,
        partly_lost,
        unmovable: kept == Some(Kept::Unmovable),
        moved: extras.moved_ranges().collect(),
        gone: stored.is_some(),
    }
}

/// What an evicted folio's inheritors take over: its stored copy, or the
/// pages they have if nothing was stored.
fn outcome_of(stored: Option<&SlotRange>) -> Outcome {
    match stored {
        Some(range) => Outcome::Swapped(folio::with_slot(SWAPPED, range.first)),
        None => Outcome::Resident,
    }
}

/// Ends folio `i`'s eviction once its process is gone
/// (`events::release_space` left the folio to the reclaimer): nothing to
/// keep for it. Children it forked meanwhile still wait for the folio
/// (INHERITING): they share what was stored, or keep the pages they have if
/// nothing was.
fn finish_folio_of_gone(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    result: Result<SlotRange, StoreError>,
    follow_ups: &mut Vec<FollowUp>,
) {
    let outcome = outcome_of(result.as_ref().ok());
    events::resolve_inheritors(shared, space.id, region.id, i, outcome, follow_ups);
    if let Ok(range) = result {
        shared.store.invalidate(range);
    }
    region.folios[i].set(GONE);
    space.take_extras(region, i);
    shared
        .resident
        .fetch_sub(region.folio_size, Ordering::AcqRel);
}

/// Lifts the flush's write protection from folio `i` if it stayed resident
/// (and is not UNFIT, which keeps it), waking the writers held on it.
///
/// The folio is looked at and the ioctl made under the gate's read side
/// (`gate`), so that no event is applied in between; one unread makes the
/// ioctl answer EAGAIN, and the gate is let go for it to be read before the
/// folio is looked at again. With the gate let go before the ioctl, the
/// program could unmap the folio and move other managed memory to its
/// address meanwhile, whose folio, brought back for a read with its copy
/// kept (CLEAN), then lost its protection to this lift: a write to it went
/// unseen, and its next eviction dropped it as unchanged. What is left of a
/// folio no longer resident (a part unmapped or moved) keeps the
/// protection: a write there finds it stale and lifts it as any other
/// (counted, see `Unprotects`). Returns the gate, taken again if it was
/// let go.
fn lift_protection<'a>(
    shared: &'a Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    mut gate: std::sync::RwLockReadGuard<'a, ()>,
) -> std::sync::RwLockReadGuard<'a, ()> {
    loop {
        let w = region.folios[i].load();
        if folio::state(w) != RESIDENT || w & UNFIT != 0 {
            return gate;
        }
        let start = region.folio_addr(i);
        #[cfg(feature = "fault-injection")]
        shared.lift_hold.stop_if_armed(|| true);
        match space.uffd.write_protect(start, region.folio_size, false) {
            Err(UffdError::Again) => {
                drop(gate);
                std::thread::yield_now();
                gate = shared.read_gate();
            }
            Ok(()) | Err(UffdError::NoMapping | UffdError::ProcessGone) => return gate,
            Err(e) => panic!("lifting write protection at {start:#x}: {e}"),
        }
    }
}

/// How many times one run's move is tried while it is refused for events
/// that came in (see `flush`).
const MOVE_TRIES: u32 = 8;

/// Takes the event gate's read side at a moment when no event of the
/// address space is pending: every move, unmap and drop that has happened is
/// then in the bookkeeping, so a folio's address is where its pages are.
/// The probe write-protects each of `ranges` (start, length) of evicting
/// folios again, which changes nothing but answers EAGAIN while an event is
/// unread; with the gate comes, per range, whether it is still wholly
/// registered (ENOENT: a mapping in it is not; a hole passes since Linux
/// 6.3, but its unmap event, applied by then, is in the folios' extras).
fn settled_gate<'a>(
    shared: &'a Shared,
    space: &Space,
    ranges: &[(usize, usize)],
) -> (std::sync::RwLockReadGuard<'a, ()>, Vec<bool>) {
    let mut registered = Vec::with_capacity(ranges.len());
    'settle: loop {
        let gate = shared.read_gate();
        registered.clear();
        for &(start, len) in ranges {
            match space.uffd.write_protect(start, len, true) {
                Err(UffdError::Again) => {
                    drop(gate);
                    std::thread::yield_now();
                    continue 'settle;
                }
                Ok(()) => registered.push(true),
                Err(UffdError::NoMapping | UffdError::ProcessGone) => registered.push(false),
                Err(e) => panic!("write-protecting {start:#x}: {e}"),
            }
        }
        return (gate, registered);
    }
}

/// Whether run `run` of the plug must not be discarded, as found under the
/// settled gate (`registered`: whether its range, from where it is still to
/// go on, is wholly registered).
///
/// Part of the range no longer registered: unmapped, and perhaps mapped
/// anew by the program (whose pages a discard would take). So is memory the
/// program unmapped, or moved, from a folio of the run (the probe passes
/// over holes, and over memory registered since at the same address), and
/// a move of the region since the flush began (the write protection and
/// copy-out may have acted on what it left behind, and the program may
/// since have mapped something else at the old address).
///
/// A part the program gave up (REMOVE) may be written again: a MADV_FREE
/// raises the same event as a MADV_DONTNEED but leaves the pages mapped,
/// and a write before the write protection keeps them with their new bytes,
/// which the copy holds. Taken as holes, they would read as zeros; the
/// folio stays instead (a REMOVE from here on, with the folio protected,
/// has no write behind it that a hole could lose).
///
/// A write let in by a protection lifted since `mark` would be lost with
/// the discard: the run must stay then too.
fn run_changed(
    shared: &Shared,
    space: &Space,
    plug: &[Victim],
    run: (usize, usize),
    registered: bool,
    mark: u64,
) -> bool {
    let (first, count) = run;
    let (start, len) = run_range(plug, run);
    !registered
        || plug[first..first + count].iter().any(|v| {
            let word = v.region.folios[v.folio].load();
            let extras = space.extras_of(&v.region, v.folio, word);
            v.region.moves.load(Ordering::Acquire) != v.moves
                || !extras.unmapped.is_empty()
                || !extras.moved.is_empty()
                || !extras.removed.is_empty()
        })
        || !shared.unprotects.none_since(mark, space.id, start, len)
}

/// The first move of every run of a flush, made together: the runs are
/// checked under one settled gate and moved with one [`move_out`], which
/// for another process is one request to its agent rather than one per
/// run (random access leaves most runs one folio long: a batch of eight
/// 4 KiB folios cost eight round trips to the agent). Returns, per run,
/// what its first move did; `None` for a run not moved because it changed
/// (its own turn in `flush` finds that again, and keeps it in memory).
fn move_out_together(
    shared: &Shared,
    space: &Space,
    memory: &Memory,
    plug: &[Victim],
    copies: &Copies,
    runs: &[(usize, usize)],
    mark: u64,
) -> Vec<Option<Discarded>> {
    let mut heads = vec![None; runs.len()];
    if runs.is_empty() {
        return heads;
    }
    let ranges: Vec<(usize, usize)> = runs.iter().map(|&run| run_range(plug, run)).collect();
    let checked: Vec<MoveRange> = runs
        .iter()
        .zip(&ranges)
        .map(|(&run, &(start, len))| copies.range(plug, run, start, len))
        .collect();
    let (settled, registered) = settled_gate(shared, space, &ranges);
    let chosen: Vec<usize> = (0..runs.len())
        .filter(|&k| !run_changed(shared, space, plug, runs[k], registered[k], mark))
        .collect();
    if chosen.is_empty() {
        return heads;
    }
    #[cfg(feature = "fault-injection")]
    {
        shared.move_hold.stop_if_armed(|| true);
        shared.move_hold.over();
    }
    let asked: Vec<MoveRange> = chosen.iter().map(|&k| checked[k]).collect();
    let moved = move_out(shared, space, memory, &asked, settled);
    for (&k, discarded) in chosen.iter().zip(moved) {
        heads[k] = Some(discarded);
    }
    heads
}

/// Moves the stored pages of each of `ranges` (start, length) out of
/// `space` without an event (`Memory::discard_quietly`), the ranges having
/// been checked under `settled`: what each move did, in order.
///
/// The runtime's own pages move under the gate, so no event is read
/// before the move; another process's are moved by its agent, once the
/// gate is let go. Meanwhile nothing is read from the space's descriptor:
/// the agent's move (and its probe before) is refused while an event of
/// the process is unread, so what the check found at the range is still
/// there when the move takes it. Read, the program's unmap, move or drop
/// there would return, and the program could move memory of its own
/// there, which keeps its registration and passes the probe (its bytes
/// then went with the move), or map new memory there that a scan
/// manages. The hold ends as soon as the agent's answer has come
/// (`DropPages::moves_answered`: every move has returned), not when this
/// thread takes it, which may wait for a CPU: in one run of `uswap run
/// --memory-high 32M --folio-size 4k --compressor lzo-rle -- touch faults
/// 256 2 20000 corpus/*.pages`, the readers found the answer in 5604 of
/// 8000 holds, 75 us after the hold began on average, and this thread took
/// it more than 10 us later in 3579 of them, more than 100 us later in
/// 70. A fault of the process waits for the hold: with no hold at all (a
/// build for the measurement only, unsafe), 0.8-2.4% of those touches took
/// over 100 us against 2.0-2.9%, five alternating pairs.
fn move_out(
    shared: &Shared,
    space: &Space,
    memory: &Memory,
    ranges: &[MoveRange<'_>],
    settled: std::sync::RwLockReadGuard<'_, ()>,
) -> Vec<Discarded> {
    space.move_in_flight.store(true, Ordering::SeqCst);
    // While the runtime's own process forks, the event thread reads without
    // the gate (`Shared::read_gate`): it raises `unapplied`, then looks at
    // the hold; here the hold is raised, then `unapplied` looked at. One of
    // the two sees the other (both SeqCst), and where this side does, the
    // move waits for what was read to be applied.
    let mut discarded = Vec::with_capacity(ranges.len());
    if shared.unapplied.load(Ordering::SeqCst) {
        discarded.extend(ranges.iter().map(|_| Discarded {
            bytes: 0,
            again: true,
            shared: false,
            unmovable: false,
            ..Default::default()
        }));
    } else if memory.stopped_now() {
        // Its agent would answer only once the process runs again: the
        // runs stay in memory, as for a page that cannot leave, and its
        // folios are held out of the queue meanwhile (`next_victim`).
        shared
            .counters
            .stopped_runs_left
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        discarded.extend(ranges.iter().map(|_| Discarded {
            bytes: 0,
            again: false,
            shared: true,
            unmovable: false,
            ..Default::default()
        }));
    } else {
        timed_discard(shared, || {
            memory.discard_quietly(ranges, settled, &mut discarded)
        });
    }
    assert_eq!(discarded.len(), ranges.len(), "one outcome per range moved");
    space.move_in_flight.store(false, Ordering::SeqCst);
    discarded
}

/// Runs `discard`, a move out or drop that may wait for the program (see
/// [`Shared::discard_stalled`]), with its start published; counts it in
/// `slow_discards` if it lasted that long.
fn timed_discard<T>(shared: &Shared, discard: impl FnOnce() -> T) -> T {
    shared
        .discard_since
        .store(shared.now_ms().wrapping_add(1).max(1), Ordering::Release);
    let outcome = discard();
    if shared.discard_stalled() {
        shared
            .counters
            .slow_discards
            .fetch_add(1, Ordering::Relaxed);
    }
    shared.discard_since.store(0, Ordering::Release);
    outcome
}

/// Reads the folios at `folios` (address, length) into `staging`, back to
/// back, with one `process_vm_readv`.
fn copy_out(memory: &Memory, folios: &[(usize, usize)], staging: &mut [u8]) -> bool {
    let mut local = Vec::with_capacity(folios.len());
    let mut remote = Vec::with_capacity(folios.len());
    let mut at = 0;
    for &(addr, fs) in folios {
        local.push(libc::iovec {
            iov_base: staging[at..].as_mut_ptr().cast(),
            iov_len: fs,
        });
        remote.push(libc::iovec {
            iov_base: addr as *mut _,
            iov_len: fs,
        });
        at += fs;
    }
    let mut done = 0usize;
    let total = staging.len();
    // Long plugs may exceed IOV_MAX: copy in groups.
    for (l, r) in local.chunks(512).zip(remote.chunks(512)) {
        match memory.read(l, r) {
            Ok(n) => done += n,
            Err(_) => return false,
        }
    }
    done == total
}

/// Installs what forked children took over from a finished eviction
/// (pages a move carried elsewhere), off the gate.
fn serve_follow_ups(shared: &Shared, follow_ups: Vec<FollowUp>) {
    for fu in follow_ups {
        swapin::swap_in(shared, &fu.space, &fu.region, fu.folio, &mut Worker, false);
    }
}

/// On shutdown: leave plugged folios resident (they are not protected
/// until a flush); a child forked meanwhile has them resident too.
fn release_plug(shared: &Shared, plug: &mut Vec<Victim>) {
    if plug.is_empty() {
        return;
    }
    let _gate = shared.read_gate();
    let mut none = Vec::new();
    let held = plug.len();
    for v in plug.drain(..) {
        let f = &v.region.folios[v.folio];
        f.set(RESIDENT | (f.load() & folio::EXTRA));
        if let Some(range) = v.clean {
            shared.store.invalidate(range);
        }
        events::resolve_inheritors(
            shared,
            v.space.id,
            v.region.id,
            v.folio,
            Outcome::Resident,
            &mut none,
        );
    }
    shared.evicting.fetch_sub(held, Ordering::Release);
}

//! The fault side: the event thread that reads the userfaultfd, and the
//! filler threads that serve the faults it cannot.
//!
//! The event thread must stay able to read the descriptor: the reclaimer's
//! own MADV_DONTNEED blocks until its REMOVE event is read, and while any
//! non-cooperative event is unread, UFFDIO_COPY answers EAGAIN. So the event
//! thread serves a fault itself only when nothing has to wait for reclaim,
//! and when an install meets EAGAIN it reads the pending events (keeping
//! them for later) before it retries. Faults that would wait for reclaim
//! (throttling) go to the fillers. REMOVE, UNMAP and REMAP events (the
//! program called madvise, munmap or mremap on managed memory) are handled
//! on the event thread, without waiting.

use super::folio::{self, ACTIVE, DROPPED, EVICTING, GONE, LOADING, MOVED, RESIDENT, SWAPPED, UNTOUCHED};
use super::region::RegionInner;
use super::uffd::{RawMsg, EVENT_PAGEFAULT, EVENT_REMAP, EVENT_REMOVE, EVENT_UNMAP, PAGEFAULT_FLAG_WP};
use super::{FaultMsg, FolioRef, Shared, PAGE_SIZE};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const POLL_TIMEOUT_MS: i32 = 50;
const MAX_MESSAGES: usize = 64;

fn bump(counter: &std::sync::atomic::AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn page_of(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

/// The thread serving a fault: what it may do while it does.
trait Server {
    /// Whether it may wait for reclaim.
    fn may_wait(&self) -> bool;
    /// Called when an install meets a changing mapping (EAGAIN).
    fn on_eagain(&mut self);
}

/// A filler thread: may wait; the event thread will read what is pending.
struct Filler;

impl Server for Filler {
    fn may_wait(&self) -> bool {
        true
    }

    fn on_eagain(&mut self) {
        std::thread::yield_now();
    }
}

/// The event thread, with the messages it has read but not yet handled.
struct EventThread<'a> {
    shared: &'a Shared,
    backlog: VecDeque<RawMsg>,
    buf: Box<[RawMsg; MAX_MESSAGES]>,
}

impl EventThread<'_> {
    /// Reads whatever is pending into the backlog; returns how many.
    fn read_pending(&mut self) -> usize {
        let n = self.shared.uffd.read_messages(&mut self.buf[..]).unwrap_or(0);
        self.backlog.extend(&self.buf[..n]);
        n
    }
}

impl Server for EventThread<'_> {
    fn may_wait(&self) -> bool {
        false
    }

    fn on_eagain(&mut self) {
        // The event that makes the mapping change may be waiting for us.
        self.read_pending();
        std::thread::yield_now();
    }
}

pub(crate) fn event_loop(shared: &Shared) {
    let mut ev = EventThread {
        shared,
        backlog: VecDeque::new(),
        buf: Box::new([RawMsg::ZERO; MAX_MESSAGES]),
    };
    while !shared.shutdown.load(Ordering::Acquire) {
        if ev.backlog.is_empty() {
            let mut pfd = libc::pollfd {
                fd: shared.uffd.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, POLL_TIMEOUT_MS) } <= 0 {
                continue;
            }
            ev.read_pending();
        }
        while let Some(msg) = ev.backlog.pop_front() {
            let arg = msg.arg;
            match msg.event {
                EVENT_PAGEFAULT => {
                    let fault = FaultMsg {
                        addr: arg[1] as usize,
                        flags: arg[0],
                        tid: arg[2] as u32,
                    };
                    bump(&shared.counters.faults);
                    if !handle_fault(shared, fault, &mut ev) {
                        let (queue, cv) = &shared.faults;
                        queue.lock().expect("fault queue lock").push_back(fault);
                        cv.notify_one();
                    }
                }
                EVENT_REMOVE => on_remove(shared, arg[0] as usize, arg[1] as usize, false, &mut ev),
                EVENT_UNMAP => on_remove(shared, arg[0] as usize, arg[1] as usize, true, &mut ev),
                EVENT_REMAP => on_remap(shared, arg[0] as usize, arg[1] as usize, arg[2] as usize, &mut ev),
                _ => {}
            }
        }
    }
}

pub(crate) fn filler_loop(shared: &Shared) {
    loop {
        let fault = {
            let (queue, cv) = &shared.faults;
            let mut q = queue.lock().expect("fault queue lock");
            loop {
                if let Some(f) = q.pop_front() {
                    break f;
                }
                if shared.shutdown.load(Ordering::Acquire) {
                    return;
                }
                q = cv.wait_timeout(q, Duration::from_millis(100)).expect("fault queue lock").0;
            }
        };
        handle_fault(shared, fault, &mut Filler);
    }
}

thread_local! {
    /// One folio's worth of data being loaded.
    static FOLIO_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// A folio of zeros, the source of first-touch installs.
    static ZERO_FOLIO: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_buf<R>(cell: &'static std::thread::LocalKey<RefCell<Vec<u8>>>, size: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    cell.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < size {
            b.resize(size, 0);
        }
        f(&mut b[..size])
    })
}

/// Serves one page fault. Returns false when the server may not wait and
/// the fault must (a filler then takes it).
fn handle_fault(shared: &Shared, fault: FaultMsg, server: &mut dyn Server) -> bool {
    let Some((region, i)) = shared.lookup(fault.addr) else {
        // Registered memory no region tracks (part of a region the program
        // moved with a cut through folios): fresh anonymous memory reads as
        // zero.
        let page = page_of(fault.addr);
        let _ = shared.uffd.zeropage_with(page, PAGE_SIZE, &mut || server.on_eagain());
        let _ = shared.uffd.wake(page, PAGE_SIZE);
        return true;
    };
    let f = &region.folios[i];
    let start = region.folio_addr(i);
    let fs = region.folio_size;

    if fault.flags & PAGEFAULT_FLAG_WP != 0 {
        bump(&shared.counters.wp_faults);
        // A write to a folio being evicted waits until the reclaimer is done
        // with it (it wakes the folio's range); any other protection is stale.
        if folio::state(f.load()) != EVICTING {
            let _ = shared.uffd.write_protect(page_of(fault.addr), PAGE_SIZE, false, &mut || server.on_eagain());
        }
        return true;
    }

    loop {
        let w = f.load();
        match folio::state(w) {
            UNTOUCHED | SWAPPED => {
                if must_throttle(shared, fs) {
                    if !server.may_wait() {
                        return false;
                    }
                    throttle(shared, fs);
                }
                if !f.transition(w, LOADING) {
                    continue;
                }
                if folio::state(w) == UNTOUCHED {
                    // Real zeroed pages rather than the shared zero page: the
                    // first write to a zero-page mapping is a copy-on-write
                    // fault whose TLB flush interrupts every CPU running this
                    // process, which costs more than the copy.
                    let _ = with_buf(&ZERO_FOLIO, fs, |zeros| shared.uffd.copy_with(start, zeros, &mut || server.on_eagain()));
                    make_resident(shared, &region, i);
                    bump(&shared.counters.zero_fills);
                } else if swap_in(shared, &region, i, w, server) {
                    shared.counters.pgmajfault.fetch_add(1, Ordering::Relaxed);
                    readahead(shared, &region, i, server);
                } else {
                    // Unusable stored data: the kernel's answer is SIGBUS for
                    // the faulting thread, never wrong bytes.
                    f.set(w);
                    bump(&shared.counters.sigbus);
                    send_sigbus(fault.tid);
                    return true;
                }
                let _ = shared.uffd.wake(start, fs);
                return true;
            }
            RESIDENT => {
                // A page inside a resident folio that the program dropped
                // (MADV_DONTNEED), or that the reclaimer reads while copying
                // a folio out: it reads as zero.
                let page = page_of(fault.addr);
                let _ = shared.uffd.zeropage_with(page, PAGE_SIZE, &mut || server.on_eagain());
                let _ = shared.uffd.wake(page, PAGE_SIZE);
                return true;
            }
            EVICTING if fault.tid as i32 == shared.reclaimer_tid.load(Ordering::Relaxed) => {
                // The reclaimer copying out a folio with a hole in it.
                let page = page_of(fault.addr);
                let _ = shared.uffd.zeropage_with(page, PAGE_SIZE, &mut || server.on_eagain());
                let _ = shared.uffd.wake(page, PAGE_SIZE);
                return true;
            }
            // Busy folios: their owner wakes the range when done, and this
            // thread's fault is retried then.
            EVICTING | LOADING => return true,
            _ => {
                let _ = shared.uffd.wake(page_of(fault.addr), PAGE_SIZE);
                return true;
            }
        }
    }
}

/// Loads a swapped folio (owned as LOADING) and installs it. False when the
/// store could not produce it.
fn swap_in(shared: &Shared, region: &RegionInner, i: usize, word: u64, server: &mut dyn Server) -> bool {
    let range = region.slots_of(word);
    let start = region.folio_addr(i);
    with_buf(&FOLIO_BUF, region.folio_size, |buf| {
        if shared.store.load(range, buf).is_err() {
            return false;
        }
        let _ = shared.uffd.copy_with(start, buf, &mut || server.on_eagain());
        // A refault soon after eviction (distance shorter than what fits in
        // memory) marks the folio active: the FIFO gives it a second pass.
        let now = shared.evictions.load(Ordering::Relaxed);
        let distance = now.wrapping_sub(region.evicted_at[i].load(Ordering::Relaxed)) as usize;
        let fits = shared.config.memory_high / region.folio_size;
        make_resident(shared, region, i);
        if distance < fits {
            region.folios[i].set_flag(ACTIVE);
            bump(&shared.counters.refaults_activated);
        }
        true
    })
}

/// Publishes a folio (owned as LOADING) as resident and queues it for
/// reclaim.
fn make_resident(shared: &Shared, region: &RegionInner, i: usize) {
    region.folios[i].set(RESIDENT);
    shared.resident.fetch_add(region.folio_size, Ordering::AcqRel);
    shared.fifo.lock().expect("fifo lock").push_back(FolioRef {
        region: region.id,
        folio: i as u32,
    });
    if shared.resident.load(Ordering::Relaxed) > shared.config.memory_high {
        shared.kick_reclaim();
    }
}

/// Brings in the next swapped folios of the region (2^page_cluster - 1 of
/// them), while memory is under its limit.
fn readahead(shared: &Shared, region: &RegionInner, i: usize, server: &mut dyn Server) {
    let window = (1usize << shared.config.page_cluster) - 1;
    for j in i + 1..(i + 1 + window).min(region.folios.len()) {
        if shared.resident.load(Ordering::Relaxed) + region.folio_size > shared.config.memory_high {
            return;
        }
        let f = &region.folios[j];
        let w = f.load();
        if folio::state(w) != SWAPPED || !f.transition(w, LOADING) {
            continue;
        }
        if swap_in(shared, region, j, w, server) {
            shared.counters.swap_ra.fetch_add(region.pages_per_folio() as u64, Ordering::Relaxed);
            let _ = shared.uffd.wake(region.folio_addr(j), region.folio_size);
        } else {
            f.set(w);
        }
    }
}

/// Whether bringing `incoming` bytes in now would pass `memory_high` plus
/// the slack while the reclaimer can still free memory.
fn must_throttle(shared: &Shared, incoming: usize) -> bool {
    let limit = shared.config.memory_high + shared.config.slack();
    shared.resident.load(Ordering::Acquire) + incoming > limit
        && !shared.shutdown.load(Ordering::Acquire)
        && !shared.reclaim_stuck.load(Ordering::Acquire)
}

/// Waits while [`must_throttle`] says so.
fn throttle(shared: &Shared, incoming: usize) {
    let mut counted = false;
    while must_throttle(shared, incoming) {
        if !counted {
            bump(&shared.counters.throttled);
            counted = true;
        }
        shared.kick_reclaim();
        let (lock, cv) = &shared.reclaimed;
        let guard = lock.lock().expect("reclaimed lock");
        let _ = cv.wait_timeout(guard, Duration::from_millis(5)).expect("reclaimed lock");
    }
}

fn send_sigbus(tid: u32) {
    // SAFETY: signalling a thread of this process; a stale tid only fails.
    unsafe {
        let pid = libc::getpid();
        if tid == 0 || libc::syscall(libc::SYS_tgkill, pid, tid as libc::pid_t, libc::SIGBUS) != 0 {
            libc::kill(pid, libc::SIGBUS);
        }
    }
}

/// The program dropped (`unmap` false: MADV_DONTNEED) or unmapped a range.
fn on_remove(shared: &Shared, start: usize, end: usize, unmap: bool, ev: &mut EventThread<'_>) {
    if !unmap {
        let mut own = shared.own_removes.lock().expect("own removes lock");
        if let Some(at) = own.iter().position(|&s| s == start) {
            own.swap_remove(at);
            return;
        }
    }
    let regions: Vec<Arc<RegionInner>> = shared
        .regions
        .read()
        .expect("regions lock")
        .iter()
        .filter(|r| r.base() < end && start < r.base() + r.len)
        .cloned()
        .collect();
    for region in regions {
        let fs = region.folio_size;
        let first = start.max(region.base());
        let last = end.min(region.base() + region.len);
        let mut i = region.folio_of(first);
        while i < region.folios.len() && region.folio_addr(i) < last {
            let fstart = region.folio_addr(i);
            let whole = first <= fstart && fstart + fs <= last;
            drop_folio(shared, &region, i, whole, unmap, (first, last), ev);
            i += 1;
        }
    }
}

fn drop_folio(
    shared: &Shared,
    region: &RegionInner,
    i: usize,
    whole: bool,
    unmap: bool,
    (first, last): (usize, usize),
    ev: &mut EventThread<'_>,
) {
    let f = &region.folios[i];
    let fs = region.folio_size;
    let after = if unmap { GONE } else { UNTOUCHED };
    loop {
        let w = f.load();
        match folio::state(w) {
            RESIDENT if whole => {
                if f.transition(w, after) {
                    shared.resident.fetch_sub(fs, Ordering::AcqRel);
                    return;
                }
            }
            SWAPPED if whole => {
                if f.transition(w, after) {
                    shared.store.invalidate(region.slots_of(w));
                    return;
                }
            }
            SWAPPED => {
                // Part of a swapped folio dropped: bring the rest back, with
                // the dropped part zero.
                if !f.transition(w, LOADING) {
                    continue;
                }
                let start = region.folio_addr(i);
                let ok = with_buf(&FOLIO_BUF, fs, |buf| {
                    if shared.store.load(region.slots_of(w), buf).is_err() {
                        return false;
                    }
                    let (a, b) = (first.max(start) - start, last.min(start + fs) - start);
                    buf[a..b].fill(0);
                    let _ = shared.uffd.copy_with(start, buf, &mut || ev.on_eagain());
                    true
                });
                if ok {
                    make_resident(shared, region, i);
                    let _ = shared.uffd.wake(start, fs);
                } else {
                    f.set(w);
                }
                return;
            }
            EVICTING | LOADING if whole => {
                f.set_flag(DROPPED);
                return;
            }
            UNTOUCHED if whole && unmap => {
                if f.transition(w, GONE) {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// The program moved `len` bytes from `from` to `to` (mremap). Whole regions
/// move with their folios; a folio-aligned part becomes a region of its own
/// at the new place.
fn on_remap(shared: &Shared, from: usize, to: usize, len: usize, ev: &mut EventThread<'_>) {
    let Some((region, _)) = shared.lookup(from) else { return };
    if from == region.base() && len == region.len {
        region.base.store(to, Ordering::Release);
        return;
    }
    let fs = region.folio_size;
    if !(from - region.base()).is_multiple_of(fs) || !len.is_multiple_of(fs) {
        follow_cutting_move(shared, &region, from, to, len, ev);
        return;
    }
    let first = (from - region.base()) / fs;
    let count = len / fs;
    let id = shared.next_region_id();
    let moved = Arc::new(RegionInner::new(id, to, len, fs, UNTOUCHED, true));
    for k in 0..count {
        let src = &region.folios[first + k];
        loop {
            let w = src.load();
            match folio::state(w) {
                // A filler finishes a load without this thread (it reads its
                // own EAGAIN away by yielding; this thread has read the event).
                LOADING => std::thread::yield_now(),
                // The reclaimer may be waiting for this thread (its
                // MADV_DONTNEED): do not wait. The pages moved with their
                // page tables, so the moved folio is resident; the reclaimer
                // discards what it stored for the old place.
                EVICTING => {
                    src.set_flag(DROPPED);
                    moved.folios[k].set(RESIDENT);
                    shared.resident.fetch_add(fs, Ordering::AcqRel);
                    break;
                }
                _ => {
                    if src.transition(w, GONE) {
                        moved.folios[k].set(w & !(ACTIVE | DROPPED));
                        break;
                    }
                }
            }
        }
        if folio::state(moved.folios[k].load()) == RESIDENT {
            shared.fifo.lock().expect("fifo lock").push_back(FolioRef { region: id, folio: k as u32 });
        }
    }
    shared.regions.write().expect("regions lock").push(moved);
}

/// A move that cuts through folios: the moved pages leave the folio
/// bookkeeping (they stay resident, untracked, at their new place). Swapped
/// folios it touches are brought back page by page, each page installed
/// where it now lives; a folio being evicted keeps its pages in place.
fn follow_cutting_move(shared: &Shared, region: &RegionInner, from: usize, to: usize, len: usize, ev: &mut EventThread<'_>) {
    let fs = region.folio_size;
    let mut i = region.folio_of(from);
    while i < region.folios.len() && region.folio_addr(i) < from + len {
        let f = &region.folios[i];
        let start = region.folio_addr(i);
        loop {
            let w = f.load();
            match folio::state(w) {
                // A filler finishes a load without this thread.
                LOADING => std::thread::yield_now(),
                // The reclaimer may be waiting for this thread: do not wait.
                EVICTING => {
                    f.set_flag(MOVED);
                    break;
                }
                SWAPPED => {
                    if !f.transition(w, LOADING) {
                        continue;
                    }
                    let ok = with_buf(&FOLIO_BUF, fs, |buf| {
                        if shared.store.load(region.slots_of(w), buf).is_err() {
                            return false;
                        }
                        for (k, page) in buf.chunks(PAGE_SIZE).enumerate() {
                            let old = start + k * PAGE_SIZE;
                            let now = if old >= from && old < from + len { to + (old - from) } else { old };
                            let _ = shared.uffd.copy_with(now, page, &mut || ev.on_eagain());
                        }
                        true
                    });
                    if ok {
                        make_resident(shared, region, i);
                    } else {
                        f.set(w);
                    }
                    break;
                }
                _ => break,
            }
        }
        i += 1;
    }
}

impl Shared {
    pub fn next_region_id(&self) -> u32 {
        self.next_region.fetch_add(1, Ordering::Relaxed)
    }
}

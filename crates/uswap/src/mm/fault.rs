//! The fault side: the event thread that reads the userfaultfd, and the
//! filler threads that serve page faults.
//!
//! The event thread never waits on anything but the descriptor: the
//! reclaimer's own MADV_DONTNEED blocks until its REMOVE event is read. Page
//! faults go to the fillers, which may wait (for reclaim, when memory is over
//! its limit); REMOVE, UNMAP and REMAP events (the program called madvise,
//! munmap or mremap on managed memory) are handled on the event thread
//! itself, without waiting.

use super::folio::{self, ACTIVE, DROPPED, EVICTING, GONE, LOADING, RESIDENT, SWAPPED, UNTOUCHED};
use super::region::RegionInner;
use super::uffd::{RawMsg, EVENT_PAGEFAULT, EVENT_REMAP, EVENT_REMOVE, EVENT_UNMAP, PAGEFAULT_FLAG_WP};
use super::{FaultMsg, FolioRef, Shared, PAGE_SIZE};
use std::cell::RefCell;
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

pub(crate) fn event_loop(shared: &Shared) {
    let mut msgs = [RawMsg::ZERO; MAX_MESSAGES];
    while !shared.shutdown.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: shared.uffd.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, POLL_TIMEOUT_MS) };
        if ready <= 0 {
            continue;
        }
        let n = match shared.uffd.read_messages(&mut msgs) {
            Ok(n) => n,
            Err(_) => continue,
        };
        for msg in &msgs[..n] {
            let arg = msg.arg;
            match msg.event {
                EVENT_PAGEFAULT => {
                    let fault = FaultMsg {
                        addr: arg[1] as usize,
                        flags: arg[0],
                        tid: arg[2] as u32,
                    };
                    bump(&shared.counters.faults);
                    // The reclaimer reading a hole of a folio it is evicting
                    // must not wait for a filler (they may be waiting for it).
                    if fault.tid as i32 == shared.reclaimer_tid.load(Ordering::Relaxed) {
                        serve_reclaimer_hole(shared, fault.addr);
                        continue;
                    }
                    // A first touch is served here when nothing has to wait:
                    // one thread hand-off less on the most common fault.
                    if zero_fill_inline(shared, fault) {
                        continue;
                    }
                    let (queue, cv) = &shared.faults;
                    queue.lock().expect("fault queue lock").push_back(fault);
                    cv.notify_one();
                }
                EVENT_REMOVE => on_remove(shared, arg[0] as usize, arg[1] as usize, false),
                EVENT_UNMAP => on_remove(shared, arg[0] as usize, arg[1] as usize, true),
                EVENT_REMAP => on_remap(shared, arg[0] as usize, arg[1] as usize, arg[2] as usize),
                _ => {}
            }
        }
    }
}

fn serve_reclaimer_hole(shared: &Shared, addr: usize) {
    let page = page_of(addr);
    let _ = shared.uffd.zeropage_dontwake(page, PAGE_SIZE);
    let _ = shared.uffd.wake(page, PAGE_SIZE);
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
        handle_fault(shared, fault);
    }
}

thread_local! {
    /// One folio's worth of data being loaded.
    static FOLIO_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_folio_buf<R>(size: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    FOLIO_BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < size {
            b.resize(size, 0);
        }
        f(&mut b[..size])
    })
}

/// Serves a first touch on the event thread if it needs no waiting: not
/// throttled, and the mapping is not changing (EAGAIN would last until this
/// very thread reads the pending event). Returns whether it was served.
fn zero_fill_inline(shared: &Shared, fault: FaultMsg) -> bool {
    if fault.flags & PAGEFAULT_FLAG_WP != 0 {
        return false;
    }
    let Some((region, i)) = shared.lookup(fault.addr) else { return false };
    let f = &region.folios[i];
    let w = f.load();
    if folio::state(w) != UNTOUCHED || must_throttle(shared, region.folio_size) || !f.transition(w, LOADING) {
        return false;
    }
    let start = region.folio_addr(i);
    let installed = with_zero_folio(region.folio_size, |zeros| shared.uffd.try_copy_dontwake(start, zeros));
    if installed.is_err() {
        f.set(UNTOUCHED);
        return false;
    }
    make_resident(shared, &region, i);
    bump(&shared.counters.zero_fills);
    let _ = shared.uffd.wake(start, region.folio_size);
    true
}

thread_local! {
    /// A folio of zeros, the source of first-touch installs.
    static ZERO_FOLIO: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_zero_folio<R>(size: usize, f: impl FnOnce(&[u8]) -> R) -> R {
    ZERO_FOLIO.with(|z| {
        let mut z = z.borrow_mut();
        if z.len() < size {
            z.resize(size, 0);
        }
        f(&z[..size])
    })
}

/// Serves one page fault (on a filler thread: it may wait for reclaim).
fn handle_fault(shared: &Shared, fault: FaultMsg) {
    let Some((region, i)) = shared.lookup(fault.addr) else {
        // Not ours (any more): let the thread retry against the kernel.
        let _ = shared.uffd.wake(page_of(fault.addr), PAGE_SIZE);
        return;
    };
    let f = &region.folios[i];
    let start = region.folio_addr(i);
    let fs = region.folio_size;

    if fault.flags & PAGEFAULT_FLAG_WP != 0 {
        bump(&shared.counters.wp_faults);
        // A write to a folio being evicted waits until the reclaimer is done
        // with it (it wakes the folio's range); any other protection is stale.
        if folio::state(f.load()) != EVICTING {
            let _ = shared.uffd.write_protect(page_of(fault.addr), PAGE_SIZE, false);
        }
        return;
    }

    loop {
        let w = f.load();
        match folio::state(w) {
            UNTOUCHED => {
                throttle(shared, fs);
                if !f.transition(w, LOADING) {
                    continue;
                }
                // Real zeroed pages rather than the shared zero page: the
                // program's first write to a zero-page mapping is a
                // copy-on-write fault whose TLB flush interrupts every CPU
                // running this process, which costs more than the copy.
                let _ = with_zero_folio(fs, |zeros| shared.uffd.copy_dontwake(start, zeros));
                make_resident(shared, &region, i);
                bump(&shared.counters.zero_fills);
                let _ = shared.uffd.wake(start, fs);
                return;
            }
            RESIDENT => {
                // A page the program dropped (MADV_DONTNEED) inside a resident
                // folio reads as zero.
                let page = page_of(fault.addr);
                let _ = shared.uffd.zeropage_dontwake(page, PAGE_SIZE);
                let _ = shared.uffd.wake(page, PAGE_SIZE);
                return;
            }
            SWAPPED => {
                throttle(shared, fs);
                if !f.transition(w, LOADING) {
                    continue;
                }
                if swap_in(shared, &region, i, w) {
                    shared.counters.pgmajfault.fetch_add(1, Ordering::Relaxed);
                    readahead(shared, &region, i);
                    let _ = shared.uffd.wake(start, fs);
                } else {
                    // Unusable stored data: the kernel's answer is SIGBUS for
                    // the faulting thread, never wrong bytes.
                    f.set(w);
                    bump(&shared.counters.sigbus);
                    send_sigbus(fault.tid);
                }
                return;
            }
            // Busy folios: their owner wakes the range when done, and this
            // thread's fault is retried then.
            EVICTING | LOADING => return,
            _ => {
                let _ = shared.uffd.wake(page_of(fault.addr), PAGE_SIZE);
                return;
            }
        }
    }
}

/// Loads a swapped folio (owned as LOADING) and installs it. False when the
/// store could not produce it.
fn swap_in(shared: &Shared, region: &RegionInner, i: usize, word: u64) -> bool {
    let range = region.slots_of(word);
    let start = region.folio_addr(i);
    with_folio_buf(region.folio_size, |buf| {
        if shared.store.load(range, buf).is_err() {
            return false;
        }
        let _ = shared.uffd.copy_dontwake(start, buf);
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
fn readahead(shared: &Shared, region: &RegionInner, i: usize) {
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
        if swap_in(shared, region, j, w) {
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
fn on_remove(shared: &Shared, start: usize, end: usize, unmap: bool) {
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
            drop_folio(shared, &region, i, whole, unmap, first, last);
            i += 1;
        }
    }
}

fn drop_folio(shared: &Shared, region: &RegionInner, i: usize, whole: bool, unmap: bool, first: usize, last: usize) {
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
                let ok = with_folio_buf(fs, |buf| {
                    if shared.store.load(region.slots_of(w), buf).is_err() {
                        return false;
                    }
                    let (a, b) = (first.max(start) - start, last.min(start + fs) - start);
                    buf[a..b].fill(0);
                    let _ = shared.uffd.copy_dontwake(start, buf);
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
fn on_remap(shared: &Shared, from: usize, to: usize, len: usize) {
    let Some((region, _)) = shared.lookup(from) else { return };
    if from == region.base() && len == region.len {
        region.base.store(to, Ordering::Release);
        return;
    }
    let fs = region.folio_size;
    if (from - region.base()) % fs != 0 || len % fs != 0 {
        // A move that cuts folios: the folios it touches cannot be followed;
        // their slots are released and they read as zero.
        on_remove(shared, from, from + len, true);
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
                // A filler finishes a load without the event thread; waiting
                // here is safe.
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

impl Shared {
    pub fn next_region_id(&self) -> u32 {
        self.next_region.fetch_add(1, Ordering::Relaxed)
    }
}

//! Swap-in: the one routine that puts a folio's bytes back in place, for a
//! fault, readahead, a partial drop, a region given back, or a move that
//! cut through a folio.
//!
//! Order, so that nothing is freed before its bytes are safe:
//!
//! 1. the caller owns the folio (LOADING, or ZEROING for a first touch);
//! 2. [`Zswap::read`](crate::zswap::Zswap::read) reconstructs it and frees
//!    nothing;
//! 3. [`install`] copies it in, one UFFDIO_COPY per mapping: a folio that
//!    mprotect, mlock or a partial munmap split across mappings is installed
//!    piece by piece, pages the program dropped or unmapped meanwhile are
//!    skipped, pages it moved go where they now live;
//! 4. under the event gate (see [`super::Shared::gate`]) the folio's new
//!    state is published, and only then is this address space's reference to
//!    the stored entries dropped, unless the folio was brought back for a
//!    read and is published CLEAN: its pages went in write-protected and the
//!    entries stay as its clean copy (see [`super::folio`]);
//! 5. the waiting threads are woken. Where the whole folio went in with one
//!    copy, that copy woke them, before step 4: a thread that goes on may
//!    find the folio's bookkeeping not yet done, but the runtime reads no
//!    fault or event of the program's until the gate, held from the copy to
//!    the end of step 4, is let go (see [`install`]).
//!
//! Unusable stored data (checksum, decompression or swap file read failure)
//! poisons the folio's missing pages instead: every touch raises SIGBUS, the
//! kernel's answer to a failed swap-in, never wrong bytes.

use super::events;
use super::folio::{self, ACTIVE, CLEAN, GIVEN_UP, GONE, LOADING, POISONED, RESIDENT, UNTOUCHED};
use super::space::{Extras, RegionInner, Space};
use super::uffd::{Partial, UffdError};
use super::Shared;
use crate::page::PAGE_SIZE;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The thread doing the work: what it may do while it does.
pub(crate) trait Server {
    /// Whether it may wait for reclaim.
    fn may_wait(&self) -> bool;
    /// Whether it hands the swap-in of a folio of `pages` pages, for thread
    /// `tid`'s fault, to a filler rather than doing it itself (see
    /// `RuntimeConfig::handoff_pages`): if so, the flag the filler reads
    /// once it is done (see `fault::HandoffPays`).
    fn hands_off(&mut self, _pages: usize, _tid: u32) -> Option<Arc<AtomicBool>> {
        None
    }
    /// Called when an ioctl meets a changing address space (EAGAIN), with no
    /// lock held: the event thread reads the pending events there, any other
    /// thread yields to it.
    fn on_eagain(&mut self);
    /// Takes the event gate's read side (or finds it held already), or None
    /// if this thread must not wait for it now (it then calls `on_eagain`
    /// and tries again).
    fn enter<'s>(&self, shared: &'s Shared) -> Option<Pass<'s>> {
        Some(Pass::Taken {
            _guard: shared.read_gate(),
        })
    }
}

/// The event gate's read side, as [`Server::enter`] gives it.
pub(crate) enum Pass<'s> {
    /// The server holds it for longer already (the event thread).
    Held,
    /// Taken for this section (released when dropped).
    Taken {
        /// The guard, held for its drop.
        _guard: std::sync::RwLockReadGuard<'s, ()>,
    },
}

/// Any thread but the event thread.
pub(crate) struct Worker;

impl Server for Worker {
    fn may_wait(&self) -> bool {
        true
    }

    fn on_eagain(&mut self) {
        std::thread::yield_now();
    }
}

/// Poisons each of `pages` (addresses) in `space` that is missing (one in
/// place keeps its bytes): a touch raises SIGBUS. For pages whose only
/// copy was lost: where they live now, outside any folio that would say
/// so at a fault. Called under the settled gate, where no event is unread
/// but for one raised since the gate's probe: a page that then answers
/// EAGAIN is left as it is, and reads as zeros (said on stderr).
pub(crate) fn poison_missing(space: &Space, pages: impl Iterator<Item = usize>) {
    for page in pages {
        match space.uffd.poison(page, PAGE_SIZE) {
            Ok(())
            | Err(Partial {
                error: UffdError::Exists | UffdError::NoMapping | UffdError::ProcessGone,
                ..
            }) => wake_range(space, page, PAGE_SIZE),
            Err(Partial { error, .. }) => {
                eprintln!("uswap: poisoning a page with no copy at {page:#x}: {error}");
            }
        }
    }
}

/// What goes into the pages.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// The folio's bytes.
    Data(&'a [u8]),
    /// The folio's bytes, write-protected: a write raises a fault before it
    /// changes them.
    Protected(&'a [u8]),
    /// Poison markers (a touch raises SIGBUS).
    Poison,
}

/// How an install ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Installed {
    /// Every page is in place or was skipped (dropped, unmapped, present);
    /// the ranges to wake once the caller is done.
    Done(Wake),
    /// The address space has exited.
    SpaceGone,
}

/// Ranges whose waiting threads must be woken.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Wake(Vec<(usize, usize)>);

impl Wake {
    /// Wakes them.
    pub fn wake(self, space: &Space) {
        for (start, len) in self.0 {
            wake_range(space, start, len);
        }
    }
}

thread_local! {
    /// One folio's worth of data being loaded.
    static FOLIO_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The longest run of zeros [`zeros`] gives: the largest folio, and the
/// largest zero-fill-ahead window.
const ZEROS_LEN: usize = 2 << 20;

/// `len` bytes of zeros (at most 2 MiB), the source of first-touch
/// installs. They are one read-only mapping made of the kernel's zero page
/// over and over, so that a copy from it reads the same 4 KiB, hot in the
/// cache, however long the fill, where a buffer of zeros as long as the
/// fill would be read from memory.
pub(crate) fn zeros(len: usize) -> &'static [u8] {
    static ZEROS: OnceLock<usize> = OnceLock::new();
    assert!(len <= ZEROS_LEN, "a zero fill of {len} bytes");
    let addr = *ZEROS.get_or_init(|| {
        let p = crate::sys::map_anonymous(ZEROS_LEN)
            .unwrap_or_else(|e| panic!("mapping zeros: {e}"))
            .as_ptr()
            .cast::<libc::c_void>();
        // Read-only, so that nothing ever writes it; small pages, each the
        // zero page, mapped now: a huge zero page would be 2 MiB to read,
        // and a copy that meets a page not mapped in its source is made
        // twice by the kernel. The advice only saves costs, so a kernel that
        // refuses it still gives zeros.
        // SAFETY: protection and advice on the mapping made above, which
        // nothing else refers to.
        unsafe {
            assert_eq!(
                libc::mprotect(p, ZEROS_LEN, libc::PROT_READ),
                0,
                "protecting zeros: {}",
                std::io::Error::last_os_error()
            );
            libc::madvise(p, ZEROS_LEN, libc::MADV_NOHUGEPAGE);
            libc::madvise(p, ZEROS_LEN, libc::MADV_POPULATE_READ);
        }
        p as usize
    });
    // SAFETY: the mapping is never unmapped nor made writable, and reads as
    // zeros for the life of the process.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// Installs `source` over folio `i` of `region` honouring its extras, then
/// runs `finish` under the event gate with the extras it honoured and
/// whether this install put every page the extras leave in place (false
/// when a page was there already or had no mapping: its bytes are not the
/// source's, nor is it protected by a `Protected` install). Returns
/// what to wake: the folio's whole range and every place its pages moved to
/// (a thread may wait on a page that was skipped: it refaults and finds the
/// folio settled), less the folio's range where one copy put the whole
/// folio in and woke its waiters itself.
pub(crate) fn install(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    source: Source<'_>,
    server: &mut dyn Server,
    finish: &mut dyn FnMut(&Extras, bool),
) -> Installed {
    let pages = region.pages_per_folio() as usize;
    let mut done = crate::page::PageMask::default();
    // A page skipped because it was there already or had no mapping.
    let mut skipped = false;
    // A page went in: an ioctl succeeded, with no fork under way.
    let mut placed = false;
    // The whole folio went in with one call that woke its waiters.
    let mut woken = false;
    'attempts: loop {
        let Some(gate) = server.enter(shared) else {
            server.on_eagain();
            continue;
        };
        let extras = space.extras_of(region, i, region.folios[i].load());
        let at = region.folio_addr(i);
        let mut p = 0;
        while p < pages {
            let Some(dst) = (!done.contains(p))
                .then(|| extras.destination(at, p))
                .flatten()
            else {
                done.insert_range(p, p + 1);
                p += 1;
                continue;
            };
            let mut q = p + 1;
            while q < pages
                && !done.contains(q)
                && extras.destination(at, q) == Some(dst + (q - p) * PAGE_SIZE)
            {
                q += 1;
            }
            // The common case, one run over the whole folio at its own
            // place: the copy wakes the folio's waiters itself, before
            // `finish` publishes it. No thread can then be told the folio
            // is busy and left to wait for a wake that will not come:
            // faults are read only under the gate's write side, and this
            // holds its read side until `finish` is done. Not for protected
            // installs, whose writers must find the folio settled.
            let waking = p == 0 && q == pages && dst == at && matches!(source, Source::Data(_));
            let filled = match source {
                _ if slipped_in(shared, dst) => Err(Partial {
                    filled: 0,
                    error: space.uffd.no_mapping(),
                }),
                Source::Data(data) if waking => space.uffd.copy_waking(dst, data),
                _ => fill(space, dst, p, q, source),
            };
            match filled {
                Ok(()) => {
                    woken = waking;
                    placed = true;
                    done.insert_range(p, q);
                    p = q;
                }
                Err(Partial { filled, error }) => {
                    let k = p + filled / PAGE_SIZE;
                    placed |= k > p;
                    done.insert_range(p, k);
                    match error {
                        // Already there (installed by someone, or present):
                        // leave it.
                        UffdError::Exists => {
                            skipped = true;
                            done.insert_range(k, k + 1);
                            p = k + 1;
                        }
                        // The run crosses a mapping boundary, or a page has
                        // no mapping: go page by page; a page with no
                        // mapping was unmapped and is skipped.
                        UffdError::NoMapping if q - k > 1 => {
                            shared
                                .counters
                                .split_installs
                                .fetch_add(1, Ordering::Relaxed);
                            for page in k..q {
                                let d = dst + (page - p) * PAGE_SIZE;
                                match fill(space, d, page, page + 1, source) {
                                    Ok(()) => placed = true,
                                    Err(Partial {
                                        error: UffdError::Exists | UffdError::NoMapping,
                                        ..
                                    }) => skipped = true,
                                    Err(Partial {
                                        error: UffdError::Again,
                                        ..
                                    }) => {
                                        drop(gate);
                                        server.on_eagain();
                                        continue 'attempts;
                                    }
                                    Err(Partial {
                                        error: UffdError::ProcessGone,
                                        ..
                                    }) => return Installed::SpaceGone,
                                    Err(Partial {
                                        error: e @ (UffdError::Busy | UffdError::Os(_)),
                                        ..
                                    }) => panic!(
                                        "installing a page at {d:#x}: {e}{}",
                                        mappings_of(source, d, page)
                                    ),
                                }
                                done.insert_range(page, page + 1);
                            }
                            p = q;
                        }
                        UffdError::NoMapping => {
                            skipped = true;
                            done.insert_range(k, k + 1);
                            p = k + 1;
                        }
                        UffdError::Again => {
                            drop(gate);
                            server.on_eagain();
                            continue 'attempts;
                        }
                        UffdError::ProcessGone => return Installed::SpaceGone,
                        e @ (UffdError::Busy | UffdError::Os(_)) => {
                            panic!(
                                "installing {} pages at {dst:#x}: {e}{}",
                                q - k,
                                mappings_of(source, dst, p)
                            )
                        }
                    }
                }
            }
        }
        if placed {
            events::forget_folio_in_drops(shared, space, region.id, i);
        }
        finish(&extras, !skipped);
        drop(gate);
        let mut wake = Vec::new();
        if !woken {
            wake.push((at, region.folio_size));
        }
        wake.extend(extras.moved_ranges());
        return Installed::Done(Wake(wake));
    }
}

/// Tests: whether a test held the copy to `dst` and moved its page away
/// meanwhile (see `Runtime::hold_next_install_at`): the copy is then not
/// made, and the install takes the kernel's answer to such a move.
#[cfg(feature = "fault-injection")]
fn slipped_in(shared: &Shared, dst: usize) -> bool {
    let mut held = false;
    shared.slip_hold.stop_if_armed(|| {
        held = shared.slip_at.load(Ordering::Acquire) == dst;
        held
    });
    shared.slip_hold.over();
    held
}

#[cfg(not(feature = "fault-injection"))]
fn slipped_in(_: &Shared, _: usize) -> bool {
    false
}

/// One fill ioctl of pages `p..q` of the source at `dst`.
fn fill(space: &Space, dst: usize, p: usize, q: usize, source: Source<'_>) -> Result<(), Partial> {
    match source {
        Source::Data(data) => space
            .uffd
            .copy(dst, &data[p * PAGE_SIZE..q * PAGE_SIZE], false),
        Source::Protected(data) => space
            .uffd
            .copy(dst, &data[p * PAGE_SIZE..q * PAGE_SIZE], true),
        Source::Poison => space.uffd.poison(dst, (q - p) * PAGE_SIZE),
    }
}

/// For a failed install's message: the mappings of this process holding
/// the source bytes of page `p` and the destination `dst` (when it is in
/// this process), from /proc/self/maps.
fn mappings_of(source: Source<'_>, dst: usize, p: usize) -> String {
    let src = match source {
        Source::Data(data) | Source::Protected(data) => data.as_ptr() as usize + p * PAGE_SIZE,
        Source::Poison => return String::new(),
    };
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let holding = |addr: usize| {
        maps.lines()
            .find(|line| {
                let range = line.split(' ').next().unwrap_or("");
                let mut ends = range.split('-').map(|x| usize::from_str_radix(x, 16));
                matches!((ends.next(), ends.next()), (Some(Ok(a)), Some(Ok(b))) if a <= addr && addr < b)
            })
            .unwrap_or("none")
            .to_string()
    };
    format!(
        " (source {src:#x} in [{}], destination in this process's [{}])",
        holding(src),
        holding(dst)
    )
}

/// Wakes the threads waiting on faults in a range. UFFDIO_WAKE looks at no
/// mapping, so it fails only on a malformed range: a bug.
pub(crate) fn wake_range(space: &Space, start: usize, len: usize) {
    if let Err(e) = space.uffd.wake(start, len) {
        match e {
            UffdError::ProcessGone => {}
            e => panic!("waking {start:#x}+{len:#x}: {e}"),
        }
    }
}

/// The state a folio takes once its pages are back, given what the program
/// did to it meanwhile: untracked if part of it was unmapped or moved away,
/// untouched if all of it was dropped, else resident.
fn settled_state(extras: &Extras, pages: usize) -> u64 {
    if !extras.unmapped.is_empty() || !extras.moved.is_empty() {
        GONE
    } else if extras.removed.covers(pages) {
        UNTOUCHED
    } else {
        RESIDENT
    }
}

/// Publishes a folio whose pages are in place (under the gate): its new
/// state, resident accounting and reclaim order for the runtime's own space.
/// With `clean_copy` (the first slot of a stored copy kept for it, its pages
/// installed write-protected) a folio that settles resident and whole is
/// published CLEAN; returns whether it was.
fn publish_settled(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    extras: &Extras,
    active: bool,
    clean_copy: Option<u32>,
) -> bool {
    let mut state = settled_state(extras, region.pages_per_folio() as usize);
    // Given up whole while it was being installed: pages put in before the
    // drop's event may be yet to be zapped. Untouched, they would be taken
    // for the zero fill's on the next touch and could be evicted with their
    // old bytes; so the folio is a resident one given up whole instead
    // (`folio::GIVEN_UP`), counted until its pages are gone.
    let given_up = state == UNTOUCHED && space.is_evicted() && !space.pages_gone(region, i);
    if given_up {
        state = RESIDENT | GIVEN_UP;
    }
    // A settled folio keeps no extras: its holes are missing pages, which
    // read as zero (resident) or are no longer ours (gone).
    let whole = extras.holes().is_empty() && extras.lost.is_empty();
    space.take_extras(region, i);
    let resident = folio::state(state) == RESIDENT && space.is_evicted();
    let clean = match clean_copy {
        Some(slot) if resident && whole => Some(folio::with_slot(CLEAN, slot)),
        _ => None,
    };
    let mut settled = clean.unwrap_or(state);
    if resident && active {
        settled |= ACTIVE;
    }
    if resident {
        // Pages installed before a drop's event may be yet to be zapped.
        settled = shared.dropped_meanwhile(extras, settled);
    }
    // Counted before it is published: a region dropped meanwhile (under the
    // gate's read side too) takes a RESIDENT folio off the count.
    if resident {
        shared
            .resident
            .fetch_add(region.folio_size, Ordering::AcqRel);
    }
    region.folios[i].set(settled);
    if resident {
        if given_up {
            shared.queue_for_reclaim_first(space.id, region.id, i);
        } else {
            shared.queue_for_reclaim(space.id, region.id, i);
        }
        if shared.resident.load(Ordering::Relaxed) > shared.reclaim_limit() {
            shared.kick_reclaim();
        }
    }
    clean.is_some()
}

/// First touch of untouched folios `i..i + n` of `region` (owned as
/// ZEROING): zero pages. Several (a sequential first touch, see
/// `fault::zero_fill_ahead`) go in with one copy where nothing has happened
/// to any of them meanwhile; the rest, and each folio after a copy that
/// stopped short, one folio at a time.
pub(crate) fn zero_fill(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    n: usize,
    server: &mut dyn Server,
) {
    let filled = if n > 1 {
        zero_fill_run(shared, space, region, i, n, server)
    } else {
        0
    };
    for j in i + filled..i + n {
        // Real zeroed pages rather than the shared zero page: the first
        // write to a zero-page mapping is a copy-on-write fault whose TLB
        // flush interrupts every CPU running the process, which costs more
        // than the copy.
        let outcome = install(
            shared,
            space,
            region,
            j,
            Source::Data(zeros(region.folio_size)),
            server,
            &mut |extras, _| {
                publish_settled(shared, space, region, j, extras, false, None);
            },
        );
        match outcome {
            Installed::Done(wake) => wake.wake(space),
            Installed::SpaceGone => region.folios[j].set(GONE),
        }
    }
    shared
        .counters
        .zero_fills
        .fetch_add(n as u64, Ordering::Relaxed);
}

/// [`zero_fill`]'s one copy over folios `i..i + n`, made and published
/// under the gate, so that no event can come between: only when none of
/// them has extras (an event while it was ZEROING), and only one attempt.
/// Returns how many folios from `i` went in, woken once published: a
/// program that goes on at once finds them resident and counted, as it
/// finds a folio it faulted on alone (the copy that wakes its waiters
/// itself would let it run before then). A copy that stops short (part of
/// the range unmapped or split into mappings, a page there already, an
/// event unread) leaves the rest to [`install`], which skips the pages this
/// copy put in.
fn zero_fill_run(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    n: usize,
    server: &mut dyn Server,
) -> usize {
    let Some(gate) = server.enter(shared) else {
        return 0;
    };
    if region.folios[i..i + n]
        .iter()
        .any(|f| f.load() & folio::EXTRA != 0)
    {
        return 0;
    }
    let (at, size) = (region.folio_addr(i), region.folio_size);
    let copied = match space.uffd.copy(at, zeros(n * size), false) {
        Ok(()) => n * size,
        Err(Partial { filled, .. }) => filled,
    };
    let whole = copied / size;
    let plain = Extras::default();
    for j in i..i + whole {
        events::forget_folio_in_drops(shared, space, region.id, j);
        publish_settled(shared, space, region, j, &plain, false, None);
    }
    drop(gate);
    if whole > 0 {
        wake_range(space, at, whole * size);
    }
    whole
}

/// How a swap-in ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SwappedIn {
    /// The folio is back (or settled as its extras say).
    Done,
    /// The stored data was unusable: the folio is poisoned.
    Poisoned,
    /// The address space has exited.
    SpaceGone,
}

/// Brings folio `i` (owned by the caller as LOADING, the word holding its
/// slots) back in, then drops this space's reference to its entries. With
/// `for_read` (a read fault or readahead: nothing is writing to it yet) the
/// folio is kept CLEAN where the runtime keeps clean copies, this space's
/// own memory is concerned, nothing happened to part of it, and the pool
/// has room: the entries then stay as its copy.
pub(crate) fn swap_in(
    shared: &Shared,
    space: &Space,
    region: &RegionInner,
    i: usize,
    server: &mut dyn Server,
    for_read: bool,
) -> SwappedIn {
    let word = region.folios[i].load();
    debug_assert_eq!(folio::state(word), LOADING);
    let range = region.slots_of(word);
    let keep = for_read
        && shared.config.keep_clean_copies
        && space.is_evicted()
        && word & folio::EXTRA == 0
        && shared.store.has_room();
    let mut kept = false;
    let read = FOLIO_BUF.with(|b| {
        let mut buf = b.borrow_mut();
        if buf.len() < region.folio_size {
            buf.resize(region.folio_size, 0);
        }
        let buf = &mut buf[..region.folio_size];
        if shared.store.read(range, buf).is_err() {
            return None;
        }
        // A refault soon after eviction (distance shorter than what fits in
        // memory) marks the folio active: the FIFO gives it a second pass.
        let now = shared.evictions.load(Ordering::Relaxed);
        let distance = now.wrapping_sub(region.evicted_at[i].load(Ordering::Relaxed)) as usize;
        let active = distance < shared.memory_high() / region.folio_size;
        let source = if keep {
            Source::Protected(buf)
        } else {
            Source::Data(buf)
        };
        let mark = shared.unprotects.mark();
        let (start, len) = (region.folio_addr(i), region.folio_size);
        Some(install(
            shared,
            space,
            region,
            i,
            source,
            server,
            &mut |extras, every_page| {
                // Clean only if this install protected every page (one that
                // was there already holds bytes of its own, unprotected) and
                // no protection was lifted across the folio's since its pages
                // went in (see `Unprotects`).
                let clean_copy = (keep
                    && every_page
                    && shared.unprotects.none_since(mark, space.id, start, len))
                .then_some(range.first);
                kept = publish_settled(shared, space, region, i, extras, active, clean_copy);
                if !kept {
                    shared.store.invalidate(range);
                }
                if active {
                    shared
                        .counters
                        .refaults_activated
                        .fetch_add(1, Ordering::Relaxed);
                }
            },
        ))
    });
    match read {
        Some(Installed::Done(wake)) => {
            shared.counters.pgmajfault.fetch_add(1, Ordering::Relaxed);
            if kept {
                shared
                    .counters
                    .clean_installs
                    .fetch_add(1, Ordering::Relaxed);
            }
            wake.wake(space);
            SwappedIn::Done
        }
        Some(Installed::SpaceGone) => {
            region.folios[i].set(GONE);
            shared.store.invalidate(range);
            SwappedIn::SpaceGone
        }
        None => {
            let outcome = install(
                shared,
                space,
                region,
                i,
                Source::Poison,
                server,
                &mut |_, _| {
                    space.take_extras(region, i);
                    region.folios[i].set(POISONED);
                },
            );
            // The entries cannot produce the data; holding them helps nobody.
            shared.store.invalidate(range);
            shared.counters.sigbus.fetch_add(1, Ordering::Relaxed);
            match outcome {
                Installed::Done(wake) => wake.wake(space),
                Installed::SpaceGone => region.folios[i].set(GONE),
            }
            SwappedIn::Poisoned
        }
    }
}

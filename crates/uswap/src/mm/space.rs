//! Address spaces and their regions.
//!
//! An address space is what the runtime serves: a userfaultfd (which acts on
//! the process that created it, whoever calls its ioctls), the regions
//! registered with it, and what is known about each folio. The runtime's own
//! process is one; each fork adds one for the child, whose descriptor
//! arrives with the fork event; a supervisor attaches other processes
//! (`Runtime::attach`). The spaces with a way to reach their memory (the
//! own one and attached processes, see [`super::memory`]) are evicted from
//! and count together towards `memory_high`; forked children are served,
//! not evicted from; every space's faults are served.
//!
//! Extras: what the program did to part of a folio while the runtime could
//! not apply it at once. A partial MADV_DONTNEED (`removed`: those pages
//! read as zero), a partial munmap (`unmapped`), or a move that cut through
//! the folio (`moved`: pages that now live elsewhere). The owner of a busy
//! folio, or the next swap-in of a swapped one, applies them.

use super::folio::{self, Folio, EXTRA};
use super::memory::Memory;
use super::uffd::Uffd;
use crate::page::{PageMask, PAGE_SIZE};
use crate::zswap::SlotRange;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// The runtime's view of one managed range of one address space.
pub(crate) struct RegionInner {
    /// Unique within its space; a child's copy keeps its parent's id.
    pub id: u32,
    /// Start address; changes when the program moves the whole range.
    pub base: AtomicUsize,
    /// Length in bytes (whole folios).
    pub len: usize,
    /// The unit evicted, stored and loaded together.
    pub folio_size: usize,
    /// One word per folio.
    pub folios: Box<[Folio]>,
    /// The workingset clock at each folio's last eviction.
    pub evicted_at: Box<[AtomicU32]>,
    /// Whether the runtime mapped the memory (and unmaps it on drop).
    pub owned: bool,
    /// Moves of the region (or of part of it) seen so far: an eviction whose
    /// copy-out overlapped a move may have read the wrong place.
    pub moves: AtomicU32,
    /// Byte ranges (offsets from the region's start) the program unmapped or
    /// moved away: never unmapped or unregistered by the runtime, since an
    /// unrelated mapping may live there now.
    pub unmapped: Mutex<Vec<(usize, usize)>>,
}

impl RegionInner {
    /// A region of `len / folio_size` folios in state `initial`.
    pub fn new(
        id: u32,
        base: usize,
        len: usize,
        folio_size: usize,
        initial: u64,
        owned: bool,
    ) -> RegionInner {
        let n = len / folio_size;
        RegionInner {
            id,
            base: AtomicUsize::new(base),
            len,
            folio_size,
            folios: (0..n).map(|_| Folio::new(initial)).collect(),
            evicted_at: (0..n).map(|_| AtomicU32::new(0)).collect(),
            owned,
            moves: AtomicU32::new(0),
            unmapped: Mutex::new(Vec::new()),
        }
    }

    /// The current start address.
    pub fn base(&self) -> usize {
        self.base.load(Ordering::Acquire)
    }

    /// Whether `addr` lies in the region's range (which, where the program
    /// unmapped or moved part of it away, may hold memory that is not the
    /// region's: see [`Self::holds`]).
    pub fn contains(&self, addr: usize) -> bool {
        let base = self.base();
        addr >= base && addr < base + self.len
    }

    /// Whether the page at `addr` is the region's: in its range, and not
    /// unmapped or moved away by the program. The kernel hands a range the
    /// program gave up out again, and what it maps there (a region of its
    /// own, or pages a move carried there) must not be taken for this one.
    pub fn holds(&self, addr: usize) -> bool {
        // Gaps are whole pages: the page is gone if one gap holds it.
        self.contains(addr) && {
            let offset = addr - self.base();
            !self
                .unmapped
                .lock()
                .expect("unmapped lock")
                .iter()
                .any(|&(lo, hi)| lo <= offset && offset < hi)
        }
    }

    /// The byte ranges the program unmapped or moved away, as offsets from
    /// the region's start, sorted by start (they may overlap).
    pub fn gaps(&self) -> Vec<(usize, usize)> {
        let mut gaps = self.unmapped.lock().expect("unmapped lock").clone();
        gaps.sort_unstable();
        gaps
    }

    /// What of the region's range is still the region's, as `(start, len)`
    /// at its current place: the range less what the program unmapped or
    /// moved away.
    pub fn live_ranges(&self) -> Vec<(usize, usize)> {
        let base = self.base();
        let mut out = Vec::new();
        let mut at = 0;
        for (lo, hi) in self.gaps().into_iter().chain([(self.len, self.len)]) {
            if lo > at {
                out.push((base + at, lo - at));
            }
            at = at.max(hi);
        }
        out
    }

    /// Whether every page of `start..end` (addresses in the region's range)
    /// lies in `gaps` (from [`Self::gaps`]).
    pub fn all_gone(&self, gaps: &[(usize, usize)], start: usize, end: usize) -> bool {
        let base = self.base();
        let (mut at, end) = (start - base, end - base);
        for &(lo, hi) in gaps {
            if lo > at {
                break;
            }
            at = at.max(hi);
        }
        at >= end
    }

    /// Start address of folio `i`.
    pub fn folio_addr(&self, i: usize) -> usize {
        self.base() + i * self.folio_size
    }

    /// The folio holding `addr`.
    pub fn folio_of(&self, addr: usize) -> usize {
        (addr - self.base()) / self.folio_size
    }

    /// Pages per folio.
    pub fn pages_per_folio(&self) -> u32 {
        (self.folio_size / PAGE_SIZE) as u32
    }

    /// The store's slot range of a SWAPPED or LOADING word.
    pub fn slots_of(&self, word: u64) -> SlotRange {
        SlotRange {
            first: folio::slot(word),
            pages: self.pages_per_folio(),
        }
    }
}

/// A program event over memory where pages moved out of a folio live now.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AtDestination {
    /// MADV_DONTNEED.
    Dropped,
    /// munmap.
    Unmapped,
    /// mremap, to this address (of the event's start).
    MovedTo(usize),
}

/// What happened to part of a folio (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    /// Pages dropped by MADV_DONTNEED: they read as zero.
    pub removed: PageMask,
    /// Pages unmapped.
    pub unmapped: PageMask,
    /// Pages moved away: (first page, end page, where the first now lives).
    pub moved: Vec<(usize, usize, usize)>,
    /// Moved pages the program then dropped or unmapped where they went:
    /// installed nowhere.
    pub lost: PageMask,
}

impl Extras {
    /// Pages not to install at the folio's own address.
    pub fn holes(&self) -> PageMask {
        let mut h = self.removed;
        h.union(&self.unmapped);
        for &(lo, hi, _) in &self.moved {
            h.insert_range(lo, hi);
        }
        h
    }

    /// The state of a folio none of whose pages is to be installed at its
    /// own address (all holes, none moved): GONE if the program unmapped any
    /// part of it, UNTOUCHED if it only dropped them. A folio with a part
    /// unmapped never comes back to life: other memory, which the region no
    /// longer holds, may be mapped there since, and a folio zero-filled and
    /// evicted whole would take its pages (as a partly unmapped resident
    /// folio leaves the bookkeeping).
    pub fn all_holes_state(&self) -> u64 {
        if self.unmapped.is_empty() {
            super::folio::UNTOUCHED
        } else {
            super::folio::GONE
        }
    }

    /// Where the moved pages live now: (address, length) of each run.
    pub fn moved_ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.moved
            .iter()
            .map(|&(lo, hi, to)| (to, (hi - lo) * PAGE_SIZE))
    }

    /// Where page `p` of a folio at `folio_addr` lives now, or None if it
    /// must not be installed. A moved page is installed where it went unless
    /// it was dropped before the move (a hole moves as a hole) or dropped or
    /// unmapped after it, where it went; its old address is unmapped by the
    /// move itself (mremap raises UNMAP for it), which says nothing about
    /// the page.
    pub fn destination(&self, folio_addr: usize, p: usize) -> Option<usize> {
        match self
            .moved
            .iter()
            .find(|&&(lo, hi, _)| (lo..hi).contains(&p))
        {
            Some(_) if self.removed.contains(p) || self.lost.contains(p) => None,
            Some(&(lo, _, to)) => Some(to + (p - lo) * PAGE_SIZE),
            None if self.removed.contains(p) || self.unmapped.contains(p) => None,
            None => Some(folio_addr + p * PAGE_SIZE),
        }
    }

    /// Where the pages moved out of this folio (at `folio_addr`) that have a
    /// destination live now: not those dropped or unmapped there.
    pub fn moved_destinations(&self, folio_addr: usize) -> impl Iterator<Item = usize> + '_ {
        self.moved
            .iter()
            .flat_map(|&(lo, hi, _)| lo..hi)
            .filter_map(move |p| self.destination(folio_addr, p))
    }

    /// Applies an event over `start..end` to the pages moved out of this
    /// folio that live there now and are not back yet: dropped or unmapped
    /// ones are not installed, ones moved on are installed where they went.
    /// (The region no longer covers them, so only this record knows.)
    pub fn at_destination(&mut self, start: usize, end: usize, event: AtDestination) {
        let mut runs = Vec::with_capacity(self.moved.len() + 2);
        for &(lo, hi, to) in &self.moved {
            let (a, b) = (start.max(to), end.min(to + (hi - lo) * PAGE_SIZE));
            if a >= b {
                runs.push((lo, hi, to));
                continue;
            }
            let (plo, phi) = (lo + (a - to) / PAGE_SIZE, lo + (b - to).div_ceil(PAGE_SIZE));
            match event {
                AtDestination::Dropped | AtDestination::Unmapped => {
                    self.lost.insert_range(plo, phi);
                    runs.push((lo, hi, to));
                }
                AtDestination::MovedTo(new) => {
                    if lo < plo {
                        runs.push((lo, plo, to));
                    }
                    runs.push((plo, phi, new + (a - start)));
                    if phi < hi {
                        runs.push((phi, hi, to + (phi - lo) * PAGE_SIZE));
                    }
                }
            }
        }
        self.moved = runs;
    }

    /// Whether moved pages wait to be installed in `start..end`.
    pub fn awaited_in(&self, start: usize, end: usize) -> bool {
        self.moved_ranges()
            .any(|(to, len)| to < end && start < to + len)
    }
}

/// A drop (MADV_DONTNEED) of the program's that emptied or holed swapped
/// folios, and whose zap may still be to come.
///
/// The kernel tells of a drop before it zaps the pages: the REMOVE event is
/// read, then the dropping thread takes the address space's lock again and
/// zaps the range (one mapping), as one step against a fork, which copies
/// the page tables under the same lock. A fork between the read and the zap
/// gives the child the range's resident pages with their old bytes; its
/// swapped pages must then read their old bytes too, or the child would
/// hold memory that no order of the two calls gives. So the entries of the
/// swapped folios the drop emptied are kept here (the drop holds their
/// user), and the holes it made in others are noted, until no fork can
/// have been copied before the zap (`events::settle_drops`). A fork applied
/// meanwhile asks its child which side of the zap it was copied on
/// (`events::on_fork`).
#[derive(Clone)]
pub(crate) struct UnsettledDrop {
    /// The range dropped.
    pub start: usize,
    pub end: usize,
    /// A page of the range present when the event was applied: once it is
    /// gone, the zap is done. None if there was none: the zap has then
    /// nothing of the program's to take.
    pub witness: Option<usize>,
    /// The parts of resident folios the range covered (address, length),
    /// then those of folios being evicted: where the witness is looked
    /// for, and where a child, forked while there was none, is asked
    /// whether it has the old pages.
    pub resident: Vec<(usize, usize)>,
    /// Swapped folios the drop emptied, their entries' user the drop's now
    /// (and evicted folios it emptied before they were stored).
    pub emptied: Vec<Emptied>,
    /// Swapped or busy folios it made holes in: region id, folio, and the
    /// pages that became holes.
    pub holed: Vec<(u32, usize, PageMask)>,
    /// Pages it dropped again of folios an earlier unsettled drop emptied
    /// or holed (region id, folio, pages): that drop's undo must not give
    /// them back to a child copied after this one's zap.
    pub retaken: Vec<(u32, usize, PageMask)>,
    /// When the event was applied (`Shared::now_ms`).
    pub at_ms: u32,
    /// The zap was seen done (the witness gone; at once without one).
    pub zapped: bool,
    /// Set by a fault server that found the zap done with no change of the
    /// mappings in flight: nothing keeps the drop any more.
    pub settled: bool,
}

/// A folio an unsettled drop emptied, with what a child copied before the
/// zap gets back.
#[derive(Clone)]
pub(crate) struct Emptied {
    /// Its region's id.
    pub region: u32,
    /// Its index.
    pub folio: usize,
    /// Its entries.
    pub slots: SlotRange,
    /// Its extras, less what the drop added.
    pub extras: Extras,
}

/// Whose memory a space is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The runtime's own process: evicted from, counted in `memory_high`.
    Runtime,
    /// A process attached by a supervisor: evicted from, counted in
    /// `memory_high`.
    Attached,
    /// A forked child: served, not evicted from.
    Child,
}

/// One address space the runtime serves.
pub(crate) struct Space {
    /// Unique per runtime.
    pub id: u32,
    /// Its userfaultfd.
    pub uffd: Uffd,
    /// Whose memory it is.
    pub owner: Owner,
    /// How the reclaimer reaches its memory; unset for a space that is not
    /// evicted from (a forked child, until a supervisor adopts it).
    pub memory: OnceLock<Memory>,
    /// A page the program's agent keeps unpopulated, so that a forked
    /// child, by touching its copy, says which space is its (see
    /// [`super::attached`]); copied to forked children.
    pub beacon: Option<usize>,
    /// The managed ranges.
    pub regions: RwLock<Vec<Arc<RegionInner>>>,
    /// Extras by (region id, folio index), for folios with [`EXTRA`] set.
    pub extras: Mutex<HashMap<(u32, usize), Extras>>,
    /// False once the address space has exited or exec'd.
    pub alive: AtomicBool,
    /// Registered memory outside every region, as `start..end` ranges,
    /// forgotten when unmapped: what moves carried out of regions, and the
    /// parts of folios at the ends of the ranges an attached process's
    /// supervisor manages (`Attached::manage`). A runtime that ends
    /// unregisters its own: its descriptor may live on in a forked child,
    /// and a fork of this process would wait for ever on a FORK event of a
    /// descriptor nobody reads.
    pub strays: Mutex<Vec<(usize, usize)>>,
    /// Regions whose range is all gone, kept while a folio of theirs was
    /// busy (see [`Space::forget_regions_gone`]).
    gone_but_busy: Mutex<Vec<u32>>,
    /// While the reclaimer's own drop in place (MADV_DONTNEED) of this
    /// space is in flight and its last REMOVE event has been read: the
    /// drop's generation (0: none) and when the event was read
    /// (`Shared::now_ms`). Nothing more is read from the descriptor
    /// meanwhile (see `fault.rs`, `read_raw`).
    pub events_held_for: AtomicU64,
    pub events_held_at: AtomicU32,
    /// While the reclaimer waits for another process's agent to move pages
    /// of this space out (`reclaim.rs`, `move_out`): nothing is read from
    /// the descriptor meanwhile, until the agent has answered.
    pub move_in_flight: AtomicBool,
    /// The program's drops whose zap may still be to come (see
    /// [`UnsettledDrop`]); `has_unsettled_drops` says whether there are any
    /// without the lock, for the fault path.
    pub unsettled_drops: Mutex<Vec<UnsettledDrop>>,
    pub has_unsettled_drops: AtomicBool,
    /// For a forked child: the ranges the kernel gave it empty
    /// (MADV_WIPEONFORK in its parent), which stay so marked in it. What a
    /// fork of a child not evicted from (whose mappings the runtime cannot
    /// read) takes for its advice (see `events::on_fork`).
    pub wiped_at_fork: OnceLock<Vec<(usize, usize)>>,
    /// Faults served in registered memory that no region tracks (see
    /// `Attached::untracked_faults`).
    pub untracked_faults: AtomicU64,
}

impl Space {
    /// A space with no regions yet.
    pub fn new(
        id: u32,
        uffd: Uffd,
        owner: Owner,
        memory: Option<Memory>,
        beacon: Option<usize>,
    ) -> Space {
        Space {
            id,
            uffd,
            owner,
            memory: memory.map_or_else(OnceLock::new, OnceLock::from),
            beacon,
            regions: RwLock::new(Vec::new()),
            extras: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            strays: Mutex::new(Vec::new()),
            gone_but_busy: Mutex::new(Vec::new()),
            events_held_for: AtomicU64::new(0),
            events_held_at: AtomicU32::new(0),
            move_in_flight: AtomicBool::new(false),
            unsettled_drops: Mutex::new(Vec::new()),
            has_unsettled_drops: AtomicBool::new(false),
            wiped_at_fork: OnceLock::new(),
            untracked_faults: AtomicU64::new(0),
        }
    }

    /// Whether the space is evicted from (and its resident folios count
    /// towards `memory_high`).
    pub fn is_evicted(&self) -> bool {
        self.memory.get().is_some()
    }

    /// Whether none of folio `i`'s pages is in memory (false for a space
    /// whose memory is not reached: one not evicted from).
    pub fn pages_gone(&self, region: &RegionInner, i: usize) -> bool {
        self.memory.get().is_some_and(|m| {
            m.present_pages(region.folio_addr(i), region.folio_size)
                .is_empty()
        })
    }

    /// The region and folio index holding `addr` (see
    /// [`RegionInner::holds`]: the ranges of regions the program cut holes
    /// in may overlap others).
    pub fn lookup(&self, addr: usize) -> Option<(Arc<RegionInner>, usize)> {
        let regions = self.regions.read().expect("regions lock");
        let r = regions.iter().find(|r| r.holds(addr))?;
        Some((r.clone(), r.folio_of(addr)))
    }

    /// Whether `start..end` holds pages a move carried out of a folio whose
    /// bytes are not back yet (a swapped or busy folio with moved extras):
    /// the folio's owner installs them there and wakes the range, so a
    /// fault there must wait rather than read zeros, and the range is not
    /// to be taken for new memory.
    pub fn awaits_moved_pages(&self, start: usize, end: usize) -> bool {
        self.extras
            .lock()
            .expect("extras lock")
            .values()
            .any(|x| x.awaited_in(start, end))
    }

    /// Applies a program event over `start..end` to every folio's pages
    /// that moved there and are not back yet.
    pub fn event_at_destinations(&self, start: usize, end: usize, event: AtDestination) {
        for x in self.extras.lock().expect("extras lock").values_mut() {
            if !x.moved.is_empty() {
                x.at_destination(start, end, event);
            }
        }
    }

    /// Forgets the stray memory in `start..end` (unmapped, or moved on).
    pub fn forget_strays(&self, start: usize, end: usize) {
        let mut strays = self.strays.lock().expect("strays lock");
        let mut kept = Vec::with_capacity(strays.len() + 1);
        for &(a, b) in strays.iter() {
            if b <= start || end <= a {
                kept.push((a, b));
                continue;
            }
            if a < start {
                kept.push((a, start));
            }
            if end < b {
                kept.push((end, b));
            }
        }
        *strays = kept;
    }

    /// Forgets the regions overlapping `start..end` (the range of an event
    /// just applied: no other region's holes changed) that the program has
    /// unmapped or moved away whole, at once or in pieces: nothing in their
    /// ranges is theirs any more, and a program that maps and unmaps all the
    /// time would otherwise grow the list, and every lookup, without bound.
    ///
    /// A region with a folio still busy is kept until it settles
    /// ([`Space::forget_settled_regions`]): pages it moved elsewhere may be
    /// yet to be installed there, and a fork meanwhile builds the child's
    /// view from the regions kept here. Forgotten before, the child never
    /// got those pages and read zeros (`mm_defects`, "a child forked before
    /// the pages of a region moved whole are installed").
    pub fn forget_regions_gone(&self, start: usize, end: usize) {
        let mut gone = Vec::new();
        for r in self.overlapping(start, end) {
            if !r.all_gone(&r.gaps(), r.base(), r.base() + r.len) {
                continue;
            }
            if r.folios.iter().any(|f| folio::is_busy(f.load())) {
                let mut busy = self.gone_but_busy.lock().expect("gone regions lock");
                if !busy.contains(&r.id) {
                    busy.push(r.id);
                }
            } else {
                gone.push(r.id);
            }
        }
        self.forget(&gone);
    }

    /// Forgets the regions kept by [`Space::forget_regions_gone`] whose
    /// folios have all settled since.
    pub fn forget_settled_regions(&self) {
        let mut busy = self.gone_but_busy.lock().expect("gone regions lock");
        if busy.is_empty() {
            return;
        }
        let mut settled = Vec::new();
        busy.retain(|&id| match self.region(id) {
            Some(r) if r.folios.iter().any(|f| folio::is_busy(f.load())) => true,
            Some(_) => {
                settled.push(id);
                false
            }
            None => false,
        });
        drop(busy);
        self.forget(&settled);
    }

    fn forget(&self, gone: &[u32]) {
        if !gone.is_empty() {
            self.regions
                .write()
                .expect("regions lock")
                .retain(|r| !gone.contains(&r.id));
        }
    }

    /// Whether a region still holds a page of `start..end` (one that the
    /// program has not unmapped or moved away).
    pub fn tracks_any(&self, start: usize, end: usize) -> bool {
        self.overlapping(start, end).iter().any(|r| {
            r.live_ranges()
                .iter()
                .any(|&(at, len)| at < end && start < at + len)
        })
    }

    /// The regions overlapping `start..end`.
    pub fn overlapping(&self, start: usize, end: usize) -> Vec<Arc<RegionInner>> {
        self.regions
            .read()
            .expect("regions lock")
            .iter()
            .filter(|r| r.base() < end && start < r.base() + r.len)
            .cloned()
            .collect()
    }

    /// The region with `id`.
    pub fn region(&self, id: u32) -> Option<Arc<RegionInner>> {
        self.regions
            .read()
            .expect("regions lock")
            .iter()
            .find(|r| r.id == id)
            .cloned()
    }

    /// Changes a folio's extras (creating them) and sets [`EXTRA`].
    pub fn update_extras(&self, region: &RegionInner, i: usize, f: impl FnOnce(&mut Extras)) {
        let mut extras = self.extras.lock().expect("extras lock");
        f(extras.entry((region.id, i)).or_default());
        region.folios[i].set_flag(EXTRA);
    }

    /// A copy of a folio's extras (empty when it has none).
    pub fn extras_of(&self, region: &RegionInner, i: usize, word: u64) -> Extras {
        if word & EXTRA == 0 {
            return Extras::default();
        }
        self.extras
            .lock()
            .expect("extras lock")
            .get(&(region.id, i))
            .cloned()
            .unwrap_or_default()
    }

    /// Removes a folio's extras and clears [`EXTRA`]; returns them.
    pub fn take_extras(&self, region: &RegionInner, i: usize) -> Extras {
        let taken = self
            .extras
            .lock()
            .expect("extras lock")
            .remove(&(region.id, i));
        region.folios[i].clear_flag(EXTRA);
        taken.unwrap_or_default()
    }
}

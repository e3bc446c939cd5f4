//! The program's memory events: madvise (REMOVE), munmap (UNMAP), mremap
//! (REMAP) and fork (FORK), and the end of a forked child. mprotect and
//! mlock raise no event; the mappings they split are handled where pages
//! are installed ([`super::swapin`]).
//!
//! Every handler here runs on the event thread while it holds the event
//! gate's write side, right after reading the event (see
//! [`super::Shared::gate`]): they only change bookkeeping, never call an
//! ioctl that could answer EAGAIN, and never wait. Work that needs an
//! install is returned as a [`FollowUp`] for the event thread to do once the
//! gate is released.
//!
//! What each event does to a folio it covers in part or in whole:
//!
//! | state      | dropped (REMOVE)         | unmapped (UNMAP)          | moved away in part (REMAP)   |
//! |------------|--------------------------|---------------------------|------------------------------|
//! | RESIDENT   | DROPPED; whole: also GIVEN_UP (1) | GONE             | GONE (pages moved with it)   |
//! | SWAPPED    | whole: UNTOUCHED, freed; part: extras | whole: GONE, freed; part: extras | LOADING + follow-up swap-in |
//! | busy       | extras                   | extras                    | extras                       |
//!
//! ("extras": recorded for the folio's owner or its next swap-in, see
//! [`super::space`]. DROPPED: not evicted until a grace is over, see
//! [`folio::DROPPED`]. (1): flagged, still counted, and first in line for
//! the reclaimer, which makes it UNTOUCHED as soon as its pages are gone,
//! see [`folio::GIVEN_UP`]; in a space not evicted from, UNTOUCHED at
//! once.) A CLEAN folio first drops
//! its stored copy and is RESIDENT for every event, fork included: what the
//! program does to its memory may make the copy wrong, and events are rare
//! enough not to be worth telling apart.
//!
//! A drop is told before it is done: the kernel zaps the pages once the
//! REMOVE is read, and a fork may copy the program in between. What the
//! drop takes from swapped folios is therefore kept until the zap is seen
//! done with no fork in flight, and a fork applied meanwhile asks its
//! child which side of the zap it was copied on ([`UnsettledDrop`]). A
//! later drop over pages an earlier one still keeps takes them back from
//! it, for every child copied after its own zap (`retaken`).

use super::folio::{
    self, EVICTING, GONE, INHERITING, LOADING, POISONED, RESIDENT, SWAPPED, UNTOUCHED, ZEROING,
};
use super::memory::ForkAdvice;
use super::space::{AtDestination, Emptied, Extras, Owner, RegionInner, Space, UnsettledDrop};
use super::uffd::{Partial, Uffd, UffdError};
use super::Shared;
use crate::page::{PageMask, PAGE_SIZE};
use crate::zswap::SlotRange;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// A swap-in the event thread must do once it has released the gate.
pub(crate) struct FollowUp {
    /// The space.
    pub space: Arc<Space>,
    /// The region.
    pub region: Arc<RegionInner>,
    /// The folio, owned as LOADING.
    pub folio: usize,
}

/// A child's folio waiting for its parent's eviction to end.
pub(crate) struct Inheritor {
    /// The parent: (space id, region id, folio).
    pub from: (u32, u32, usize),
    /// The child.
    pub space: Weak<Space>,
    /// The child's id: what it forked is found by it once it is gone.
    pub space_id: u32,
    /// The child's region.
    pub region: Arc<RegionInner>,
}

/// What a parent's busy folio ended as, for its inheritors.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    /// Stored and dropped: the child shares the entries.
    Swapped(u64),
    /// Still in memory (the eviction was refused): so is the child's copy.
    Resident,
    /// Left memory with no copy of its bytes (`Discarded::stale`): its
    /// missing pages are poisoned, in the child as in the owner.
    Poisoned,
}

/// The part `lo..hi` (in pages) of folio `i` that `start..end` covers.
fn covered(region: &RegionInner, i: usize, start: usize, end: usize) -> (usize, usize) {
    let at = region.folio_addr(i);
    let lo = start.max(at) - at;
    let hi = end.min(at + region.folio_size) - at;
    (lo / PAGE_SIZE, hi.div_ceil(PAGE_SIZE))
}

/// Each (region, folio) of `space` with a page of its own in `start..end`.
fn folios_in(space: &Space, start: usize, end: usize) -> Vec<(Arc<RegionInner>, usize)> {
    let mut out = Vec::new();
    for region in space.overlapping(start, end) {
        let first = region.folio_of(start.max(region.base()));
        let last = region.folio_of(end.min(region.base() + region.len) - 1);
        // Where the program cut the region, the range may hold memory that
        // is not the region's (see `RegionInner::holds`).
        let gaps = region.gaps();
        out.extend(
            (first..=last)
                .filter(|&i| {
                    let at = region.folio_addr(i);
                    !region.all_gone(&gaps, at.max(start), (at + region.folio_size).min(end))
                })
                .map(|i| (region.clone(), i)),
        );
    }
    out
}

/// The program dropped (MADV_DONTNEED) `start..end`; the kernel zaps the
/// pages after this event is read.
pub(crate) fn on_remove(shared: &Shared, space: &Space, start: usize, end: usize) {
    space.event_at_destinations(start, end, AtDestination::Dropped);
    let mut unsettled = UnsettledDrop {
        start,
        end,
        witness: None,
        resident: Vec::new(),
        emptied: Vec::new(),
        holed: Vec::new(),
        retaken: Vec::new(),
        at_ms: shared.now_ms(),
        zapped: false,
        settled: false,
    };
    let mut evicting = Vec::new();
    let kept = folios_kept_by_drops(space);
    for (region, i) in folios_in(space, start, end) {
        let (lo, hi) = covered(&region, i, start, end);
        let pages = region.pages_per_folio() as usize;
        shared.unpark(space.id, &region, i);
        let f = &region.folios[i];
        let w = f.load();
        if hi - lo < pages {
            shared
                .counters
                .partial_folio_events
                .fetch_add(1, Ordering::Relaxed);
        }
        // Where the range's pages may still be: resident folios, and
        // folios being evicted (their pages stay until the eviction moves
        // them out), after the resident ones.
        let part = (region.folio_addr(i) + lo * PAGE_SIZE, (hi - lo) * PAGE_SIZE);
        if kept.contains(&(region.id, i)) {
            let mut pages = PageMask::default();
            pages.insert_range(lo, hi);
            unsettled.retaken.push((region.id, i, pages));
        }
        match folio::state(w) {
            RESIDENT => unsettled.resident.push(part),
            EVICTING => evicting.push(part),
            _ => {}
        }
        match folio::state(w) {
            // Its pages may still be there (see `folio::GIVEN_UP`), and the
            // kernel has yet to zap them (`folio::DROPPED`).
            RESIDENT if hi - lo == pages && space.is_evicted() => {
                f.set(folio::dropped_at(w | folio::GIVEN_UP, shared.now_ms()));
                shared.queue_for_reclaim_first(space.id, region.id, i);
            }
            RESIDENT if hi - lo == pages => {
                f.set(UNTOUCHED);
                space.take_extras(&region, i);
            }
            // The zap leaves holes that read as zero, once it has come
            // (marked in any space: one not evicted from may be adopted
            // before the zap).
            RESIDENT => f.set(folio::dropped_at(w, shared.now_ms())),
            SWAPPED => {
                let before = space.extras_of(&region, i, w);
                if drop_swapped_pages(space, &region, i, lo, hi) {
                    unsettled.emptied.push(Emptied {
                        region: region.id,
                        folio: i,
                        slots: region.slots_of(w),
                        extras: before,
                    });
                } else {
                    unsettled
                        .holed
                        .push((region.id, i, newly_holed(&before, lo, hi)));
                }
            }
            // Its evictor, if it ends with every page a hole, hands the
            // entries to the drop (see `keep_for_unsettled_drop`).
            EVICTING => {
                let before = space.extras_of(&region, i, w);
                space.update_extras(&region, i, |x| x.removed.insert_range(lo, hi));
                unsettled
                    .holed
                    .push((region.id, i, newly_holed(&before, lo, hi)));
            }
            LOADING | ZEROING | INHERITING => {
                space.update_extras(&region, i, |x| x.removed.insert_range(lo, hi))
            }
            _ => {}
        }
    }
    unsettled.resident.append(&mut evicting);
    keep_until_zapped(shared, space, unsettled);
}

/// Pages `lo..hi` of SWAPPED folio `i` now read as zero (a drop): they are
/// holes of the stored folio, and a folio left with nothing but holes is
/// stored no more (UNTOUCHED, or GONE if part of it is unmapped). True if
/// so: its entries are then the caller's to keep or free.
fn drop_swapped_pages(space: &Space, region: &RegionInner, i: usize, lo: usize, hi: usize) -> bool {
    let f = &region.folios[i];
    space.update_extras(region, i, |x| x.removed.insert_range(lo, hi));
    let x = space.extras_of(region, i, f.load());
    let emptied = x.holes().covers(region.pages_per_folio() as usize);
    if emptied {
        space.take_extras(region, i);
        f.set(x.all_holes_state());
    }
    emptied
}

/// The folios (region id, folio) that unsettled drops of `space` emptied
/// or holed, gathered once per event under the gate's write side (nothing
/// adds to the drops meanwhile) rather than looked up per folio.
fn folios_kept_by_drops(space: &Space) -> HashSet<(u32, usize)> {
    if !space.has_unsettled_drops.load(Ordering::Acquire) {
        return HashSet::new();
    }
    let drops = space.unsettled_drops.lock().expect("unsettled drops lock");
    drops
        .iter()
        .flat_map(|d| {
            let emptied = d.emptied.iter().map(|e| (e.region, e.folio));
            emptied.chain(d.holed.iter().map(|&(r, f, _)| (r, f)))
        })
        .collect()
}

/// Takes the pages a drop dropped again (`retaken`) from what an earlier
/// drop `d` kept: holes in the folios it emptied (with every page a hole
/// an undo gives nothing back), no longer its own holes in those it holed.
fn retake(d: &mut UnsettledDrop, retaken: &[(u32, usize, PageMask)]) {
    for (region, i, pages) in retaken {
        for e in d
            .emptied
            .iter_mut()
            .filter(|e| e.region == *region && e.folio == *i)
        {
            e.extras.removed.union(pages);
        }
        for (_, _, holed) in d.holed.iter_mut().filter(|(r, f, _)| r == region && f == i) {
            holed.remove(pages);
        }
    }
}

/// Pages `lo..hi` less those `before` had dropped already.
fn newly_holed(before: &Extras, lo: usize, hi: usize) -> PageMask {
    let mut holed = PageMask::default();
    holed.insert_range(lo, hi);
    holed.remove(&before.removed);
    holed
}

/// An eviction of folio `i` ended with every page a hole, some made by a
/// drop of the program's not yet settled: the drop (the newest such) takes
/// the stored entries (as it would have had the folio been stored when the drop
/// came), so that a child copied before the zap gets them. Returns whether
/// one did; the caller lets them go otherwise. Under the gate.
pub(crate) fn keep_for_unsettled_drop(
    space: &Space,
    region: &RegionInner,
    i: usize,
    slots: SlotRange,
    extras: &Extras,
) -> bool {
    if !space.has_unsettled_drops.load(Ordering::Acquire) {
        return false;
    }
    let mut drops = space.unsettled_drops.lock().expect("unsettled drops lock");
    let Some((d, holed)) = drops.iter_mut().rev().filter(|d| !d.settled).find_map(|d| {
        let holed = d
            .holed
            .iter()
            .find(|&&(r, f, _)| r == region.id && f == i)
            .map(|&(_, _, h)| h)?;
        Some((d, holed))
    }) else {
        return false;
    };
    let mut before = extras.clone();
    before.removed.remove(&holed);
    d.emptied.push(Emptied {
        region: region.id,
        folio: i,
        slots,
        extras: before,
    });
    true
}

/// Keeps what a drop took from swapped folios until its zap is surely
/// done (see [`UnsettledDrop`]), or lets it go at once where nothing can
/// tell: a space the runtime cannot look into (a forked child not adopted)
/// has no witness to wait for.
fn keep_until_zapped(shared: &Shared, space: &Space, mut unsettled: UnsettledDrop) {
    if unsettled.emptied.is_empty() && unsettled.holed.is_empty() && unsettled.retaken.is_empty() {
        return;
    }
    let Some(memory) = space.memory.get() else {
        release_drop(shared, unsettled);
        return;
    };
    unsettled.witness = unsettled.resident.iter().find_map(|&(at, len)| {
        let present = memory.present_pages(at, len);
        (0..len / PAGE_SIZE)
            .find(|&p| present.contains(p))
            .map(|p| at + p * PAGE_SIZE)
    });
    unsettled.zapped = unsettled.witness.is_none();
    space
        .unsettled_drops
        .lock()
        .expect("unsettled drops lock")
        .push(unsettled);
    space.has_unsettled_drops.store(true, Ordering::Release);
}

/// Lets go of what a settled drop kept.
fn release_drop(shared: &Shared, unsettled: UnsettledDrop) {
    for e in unsettled.emptied {
        shared.store.invalidate(e.slots);
    }
}

/// Lets go of the drops of `space` that no fork can still need: with the
/// zap seen done, once the mappings are seen quiet (a fork copied before
/// the zap holds them changing from its copy until its event is read, and
/// then it has been applied), or once the witness is there again (an
/// install put it back after the zap, which the kernel allows only while
/// they are quiet). A witness still there past the drop grace is taken for
/// pages the kernel keeps (MADV_FREE raises the same event and zaps
/// nothing), and let go once quiet. Runs on the event thread under the
/// gate's write side, after the events read are applied; `everything`
/// lets all of them go (the space is gone, or the runtime ends).
pub(crate) fn settle_drops(shared: &Shared, space: &Space, everything: bool) {
    let memory = space.memory.get();
    let now = shared.now_ms();
    let grace = shared.config.drop_grace.as_millis();
    let mut quiet = None;
    release_drops_where(shared, space, |d| {
        let present = match (d.witness, memory) {
            (Some(w), Some(m)) => !m.present_pages(w, PAGE_SIZE).is_empty(),
            _ => false,
        };
        let back = d.zapped && present;
        d.zapped |= !present;
        let waited = u128::from(now.wrapping_sub(d.at_ms)) >= grace;
        everything
            || d.settled
            || back
            || ((d.zapped || waited) && *quiet.get_or_insert_with(|| !space.uffd.is_changing()))
    });
}

/// The program unmapped or moved memory over `start..end`: drops there
/// are let go, their addresses no longer the ones to ask a child about (a
/// zero page mapped there in a child could land on other memory of its).
fn forget_drops_over(shared: &Shared, space: &Space, start: usize, end: usize) {
    release_drops_where(shared, space, |d| d.start < end && start < d.end);
}

/// Lets go of the drops of `space` that `settle` picks (it may update
/// each one it looks at), keeping the others in order: a fork undoes the
/// newest first (see `on_fork`). What one let go dropped again of an
/// earlier one's folios is taken from that one for good: no child can be
/// copied before its zap any more.
fn release_drops_where(
    shared: &Shared,
    space: &Space,
    mut settle: impl FnMut(&mut UnsettledDrop) -> bool,
) {
    if !space.has_unsettled_drops.load(Ordering::Acquire) {
        return;
    }
    let mut drops = space.unsettled_drops.lock().expect("unsettled drops lock");
    let mut settled = Vec::new();
    let mut k = 0;
    while k < drops.len() {
        if settle(&mut drops[k]) {
            let d = drops.remove(k);
            for earlier in &mut drops[..k] {
                retake(earlier, &d.retaken);
            }
            settled.push(d);
        } else {
            k += 1;
        }
    }
    space
        .has_unsettled_drops
        .store(!drops.is_empty(), Ordering::Release);
    drop(drops);
    for d in settled {
        release_drop(shared, d);
    }
}

/// A fault in the folio at `start..start + len` of `space`, before it is
/// served (under the gate's read side): a drop's witness there that is
/// missing says the zap is done, and the install to come may put it back,
/// which `settle_drops` would otherwise not see. With the mappings quiet
/// the drop is settled at once.
pub(crate) fn fault_near_witness(space: &Space, start: usize, len: usize) {
    let Some(memory) = space.memory.get() else {
        return;
    };
    let mut drops = space.unsettled_drops.lock().expect("unsettled drops lock");
    let mut quiet = None;
    for d in drops.iter_mut() {
        let Some(w) = d.witness.filter(|&w| start <= w && w < start + len) else {
            continue;
        };
        if !d.zapped && memory.present_pages(w, PAGE_SIZE).is_empty() {
            d.zapped = true;
        }
        if d.zapped && *quiet.get_or_insert_with(|| !space.uffd.is_changing()) {
            d.settled = true;
        }
    }
}

/// A page went into folio `i` of region `region` of `space` (under the
/// gate), or the folio stayed in memory after an eviction: no drop before
/// is to be undone for it in a child. A page goes in only while no fork is
/// under way (the kernel refuses installs then), so every fork applied from
/// now on copied the folio as it is now, or later; and a child's copy of a
/// folio that stayed resident is resident, which no undo touches. A drop
/// kept the entries of its swapped folios, or its holes in them, for
/// children copied before the drop's zap; kept on, a later drop that left
/// the folio as empty as this one had would let the undo give a child
/// bytes older than both (the entries are let go here).
pub(crate) fn forget_folio_in_drops(shared: &Shared, space: &Space, region: u32, i: usize) {
    if !space.has_unsettled_drops.load(Ordering::Acquire) {
        return;
    }
    let mut released = Vec::new();
    for d in space
        .unsettled_drops
        .lock()
        .expect("unsettled drops lock")
        .iter_mut()
    {
        d.emptied.retain(|e| {
            let this = e.region == region && e.folio == i;
            if this {
                released.push(e.slots);
            }
            !this
        });
        d.holed.retain(|&(r, f, _)| !(r == region && f == i));
    }
    for slots in released {
        shared.store.invalidate(slots);
    }
}

/// Whether the child behind `child` was copied before the zap of
/// `unsettled`, a drop of its parent's: it has a page there that the zap
/// took from the parent. Asked by mapping the zero page where the child
/// has none, which is what the page reads as in a child copied after the
/// zap (a dropped page); only where the child's copy of the folio is
/// resident, untouched (the reclaimer makes a folio the program dropped
/// whole UNTOUCHED once its pages are gone, see `folio::GIVEN_UP`) or
/// inheriting (its parent's was being evicted: a page the eviction moved
/// out before the copy is missing too, and then reads as zero as well,
/// the drop covering it). A child that cannot be asked (a change of its
/// own mappings in flight) is taken as copied before: it keeps the old
/// bytes. `regions` are the child's copies.
fn copied_before_zap(
    child: &Space,
    regions: &[Arc<RegionInner>],
    unsettled: &UnsettledDrop,
) -> bool {
    let has_page = |at: usize, len: usize| {
        let askable = regions.iter().any(|r| {
            r.holds(at)
                && matches!(
                    folio::state(r.folios[r.folio_of(at)].load()),
                    RESIDENT | UNTOUCHED | INHERITING
                )
        });
        askable
            && match child.uffd.zero_pages(at, len) {
                Ok(()) => false,
                Err(Partial {
                    error: UffdError::Exists | UffdError::Again,
                    ..
                }) => true,
                Err(Partial {
                    error: UffdError::NoMapping | UffdError::ProcessGone,
                    ..
                }) => false,
                Err(p) => panic!("asking a forked child for {at:#x}+{len:#x}: {}", p.error),
            }
    };
    match unsettled.witness {
        Some(w) => has_page(w, PAGE_SIZE),
        None => unsettled
            .resident
            .iter()
            .any(|&(at, len)| has_page(at, len)),
    }
}

/// Gives a child copied before the zap of a drop of its parent's what the
/// drop took from the swapped folios: the entries of those it emptied, the
/// pages of those it holed (busy ones included: what they end as reaches
/// the child through its extras). `regions` are the child's copies.
fn undo_drop_in_child(
    shared: &Shared,
    child: &Space,
    regions: &[Arc<RegionInner>],
    unsettled: &UnsettledDrop,
) {
    let copy_of = |id: u32| regions.iter().find(|c| c.id == id);
    for e in &unsettled.emptied {
        let Some(copy) = copy_of(e.region) else {
            continue;
        };
        let f = &copy.folios[e.folio];
        // What the drop left it, unless the parent touched it since.
        if !matches!(folio::state(f.load()), UNTOUCHED | GONE) {
            continue;
        }
        // What the program unmapped of it since stays unmapped.
        let mut extras = e.extras.clone();
        let at = copy.folio_addr(e.folio);
        for (lo, hi) in copy.gaps() {
            let (lo, hi) = (copy.base() + lo, copy.base() + hi);
            if lo < at + copy.folio_size && at < hi {
                extras.unmapped.insert_range(
                    (lo.max(at) - at) / PAGE_SIZE,
                    (hi.min(at + copy.folio_size) - at).div_ceil(PAGE_SIZE),
                );
            }
        }
        if extras.holes().covers(copy.pages_per_folio() as usize) {
            continue;
        }
        assert!(
            shared.store.share(e.slots),
            "a kept drop's entries are gone"
        );
        child.take_extras(copy, e.folio);
        f.set(folio::with_slot(SWAPPED, e.slots.first));
        if !is_empty(&extras) {
            child.update_extras(copy, e.folio, |x| *x = extras);
        }
    }
    for &(region, i, holed) in &unsettled.holed {
        let Some(copy) = copy_of(region) else {
            continue;
        };
        if matches!(
            folio::state(copy.folios[i].load()),
            SWAPPED | LOADING | INHERITING
        ) {
            child.update_extras(copy, i, |x| x.removed.remove(&holed));
        }
    }
}

/// The program unmapped `start..end` (already gone from its page tables).
pub(crate) fn on_unmap(shared: &Shared, space: &Space, start: usize, end: usize) {
    space.event_at_destinations(start, end, AtDestination::Unmapped);
    forget_drops_over(shared, space, start, end);
    space.forget_strays(start, end);
    for (region, i) in folios_in(space, start, end) {
        let (lo, hi) = covered(&region, i, start, end);
        let pages = region.pages_per_folio() as usize;
        record_unmapped(
            &region,
            lo * PAGE_SIZE + region.folio_addr(i) - region.base(),
            (hi - lo) * PAGE_SIZE,
        );
        if hi - lo < pages {
            shared
                .counters
                .partial_folio_events
                .fetch_add(1, Ordering::Relaxed);
        }
        shared.unpark(space.id, &region, i);
        let f = &region.folios[i];
        let w = f.load();
        match folio::state(w) {
            // What is left of a partly unmapped resident folio stays where
            // it is, no longer tracked.
            RESIDENT => untrack_resident(shared, space, &region, i),
            SWAPPED => {
                space.update_extras(&region, i, |x| x.unmapped.insert_range(lo, hi));
                if space.extras_of(&region, i, f.load()).unmapped.covers(pages) {
                    space.take_extras(&region, i);
                    f.set(GONE);
                    shared.store.invalidate(region.slots_of(w));
                }
            }
            EVICTING | LOADING | ZEROING | INHERITING => {
                space.update_extras(&region, i, |x| x.unmapped.insert_range(lo, hi))
            }
            UNTOUCHED | POISONED => f.set(GONE),
            _ => {}
        }
    }
    space.forget_regions_gone(start, end);
}

/// Remembers that the program unmapped `len` bytes at `offset` of the
/// region, so that dropping the region never unmaps what may since belong to
/// an unrelated mapping.
fn record_unmapped(region: &RegionInner, offset: usize, len: usize) {
    region
        .unmapped
        .lock()
        .expect("unmapped lock")
        .push((offset, offset + len));
}

/// A resident folio leaves the bookkeeping: its pages stay where they are,
/// unmanaged.
fn untrack_resident(shared: &Shared, space: &Space, region: &RegionInner, i: usize) {
    region.folios[i].set(GONE);
    space.take_extras(region, i);
    uncount_resident(shared, space, region);
}

fn uncount_resident(shared: &Shared, space: &Space, region: &RegionInner) {
    if space.is_evicted() {
        shared
            .resident
            .fetch_sub(region.folio_size, Ordering::AcqRel);
    }
}

/// The program moved `len` bytes from `from` to `to` (mremap). A region
/// the move carries whole moves with its folios; folios a move cuts
/// through leave the bookkeeping once their pages are where they now
/// belong.
pub(crate) fn on_remap(
    shared: &Shared,
    space: &Arc<Space>,
    from: usize,
    to: usize,
    len: usize,
    follow_ups: &mut Vec<FollowUp>,
) {
    // What was at the destination is gone: the kernel unmapped it before
    // the move. Its UNMAP event came first where that memory was
    // registered; memory managed there since (a scan that read the maps
    // before the move, and registered the range once the moved memory was
    // there, before this event was read) is taken off here, lest two
    // regions track the same pages.
    on_unmap(shared, space, to, to + len);
    forget_drops_over(shared, space, from, from + len);
    // A thread waiting on a fault in the old range waits on the old
    // addresses, which no install will wake now: wake it to retry.
    super::swapin::wake_range(space, from, len);
    space.event_at_destinations(from, from + len, AtDestination::MovedTo(to));
    space.forget_strays(from, from + len);
    // A region moved exactly goes with it whole, with its folios; so does
    // a region of another process inside the moved range (a mapping moved
    // whole takes the parts of folios at its ends along, registered as
    // strays: see `Attached::manage`). A region the runtime mapped keeps
    // to its handle's range, which drops what is still there: moved with
    // other memory, it is cut. The kernel never moves a range onto itself,
    // so a region carried to `to..` is found in `from..` no more.
    let mut carried = Vec::new();
    for region in space.overlapping(from, from + len) {
        region.moves.fetch_add(1, Ordering::AcqRel);
        let base = region.base();
        let exact = from == base && len == region.len;
        if exact || (!region.owned && from <= base && base + region.len <= from + len) {
            let at = to + (base - from);
            region.base.store(at, Ordering::Release);
            for i in 0..region.folios.len() {
                shared.unpark(space.id, &region, i);
            }
            carried.push((at, at + region.len));
        }
    }
    // The rest of what moved is registered memory no region covers (the
    // event comes only for registered memory).
    carried.sort_unstable();
    let mut strays = space.strays.lock().expect("strays lock");
    let mut at = to;
    for (lo, hi) in carried.into_iter().chain([(to + len, to + len)]) {
        if lo > at {
            strays.push((at, lo));
        }
        at = at.max(hi);
    }
    drop(strays);
    for (region, i) in folios_in(space, from, from + len) {
        let (lo, hi) = covered(&region, i, from, from + len);
        let dest = to + (region.folio_addr(i) + lo * PAGE_SIZE - from);
        record_unmapped(
            &region,
            lo * PAGE_SIZE + region.folio_addr(i) - region.base(),
            (hi - lo) * PAGE_SIZE,
        );
        shared
            .counters
            .partial_folio_events
            .fetch_add(1, Ordering::Relaxed);
        shared.unpark(space.id, &region, i);
        let f = &region.folios[i];
        let w = f.load();
        match folio::state(w) {
            // The pages moved with their page tables; the rest stay.
            RESIDENT => untrack_resident(shared, space, &region, i),
            UNTOUCHED | POISONED => f.set(GONE),
            SWAPPED => {
                space.update_extras(&region, i, |x| x.moved.push((lo, hi, dest)));
                f.set(folio::with_slot(LOADING, folio::slot(w)) | (f.load() & folio::EXTRA));
                follow_ups.push(FollowUp {
                    space: space.clone(),
                    region: region.clone(),
                    folio: i,
                });
            }
            EVICTING | LOADING | ZEROING | INHERITING => {
                space.update_extras(&region, i, |x| x.moved.push((lo, hi, dest)))
            }
            _ => {}
        }
    }
    space.forget_regions_gone(from, from + len);
}

/// The address space `parent` forked: the child's registered memory now
/// faults on `child`. Builds the child's view of every region from the
/// parent's at this moment (the fork has copied the page tables and waits
/// for this event to be read), then takes out of it what the kernel did
/// not copy as it is ([`ForkAdvice`]).
pub(crate) fn on_fork(
    shared: &Shared,
    parent: &Space,
    child: Uffd,
    follow_ups: &mut Vec<FollowUp>,
) -> Arc<Space> {
    let space = Arc::new(Space::new(
        shared.next_space_id(),
        child,
        Owner::Child,
        None,
        parent.beacon,
    ));
    let mut regions = Vec::new();
    // Whether the child shares (or will share) stored entries of its
    // parent's: only those can give it bytes the kernel did not.
    let mut shares_entries = false;
    for r in parent.regions.read().expect("regions lock").iter() {
        let copy = Arc::new(RegionInner::new(
            r.id,
            r.base(),
            r.len,
            r.folio_size,
            UNTOUCHED,
            false,
        ));
        *copy.unmapped.lock().expect("unmapped lock") =
            r.unmapped.lock().expect("unmapped lock").clone();
        for (i, f) in r.folios.iter().enumerate() {
            shared.unpark(parent.id, r, i);
            let w = f.load();
            let mut extras = parent.extras_of(r, i, w);
            shares_entries |= matches!(folio::state(w), SWAPPED | LOADING | EVICTING | INHERITING);
            let state = match folio::state(w) {
                UNTOUCHED => UNTOUCHED,
                // The parent's zero fill installs the pages a move carried
                // away where they went, in the parent only: the child owns
                // no swap-in of them, and a fault of its there would wait
                // for one for ever. They read as zeros there as plain
                // registered memory; at the folio's own address they are
                // gone, as unmapped ones are.
                ZEROING => {
                    for (lo, hi, _) in std::mem::take(&mut extras.moved) {
                        extras.unmapped.insert_range(lo, hi);
                    }
                    UNTOUCHED
                }
                RESIDENT => RESIDENT,
                // A load in progress has installed some pages, which the
                // child has; it shares the entries for the others. Pages a
                // move carried away are installed in the child too, where
                // they went (a follow-up, as for the parent).
                SWAPPED | LOADING if shared.store.share(r.slots_of(w)) => {
                    if extras.moved.is_empty() {
                        folio::with_slot(SWAPPED, folio::slot(w))
                    } else {
                        follow_ups.push(FollowUp {
                            space: space.clone(),
                            region: copy.clone(),
                            folio: i,
                        });
                        folio::with_slot(LOADING, folio::slot(w))
                    }
                }
                SWAPPED | LOADING => panic!("a swapped folio's entries are gone at fork"),
                EVICTING | INHERITING => {
                    shared
                        .inheritors
                        .lock()
                        .expect("inheritors lock")
                        .push(Inheritor {
                            from: (parent.id, r.id, i),
                            space: Arc::downgrade(&space),
                            space_id: space.id,
                            region: copy.clone(),
                        });
                    INHERITING
                }
                POISONED => POISONED,
                _ => GONE,
            };
            copy.folios[i].set(state);
            if !is_empty(&extras) && state != GONE && state != RESIDENT {
                space.update_extras(&copy, i, |x| *x = extras);
            }
        }
        regions.push(copy);
    }
    // Newest first: an older drop's holes in a folio a newer one emptied
    // are in that folio's kept extras, and come out once it is back. What
    // a drop the child was copied after dropped again of an older one's
    // folios stays dropped in the undo of that one.
    let mut before_a_zap = false;
    let mut retaken = Vec::new();
    for d in parent
        .unsettled_drops
        .lock()
        .expect("unsettled drops lock")
        .iter()
        .rev()
    {
        if !d.settled && copied_before_zap(&space, &regions, d) {
            let mut d = d.clone();
            retake(&mut d, &retaken);
            undo_drop_in_child(shared, &space, &regions, &d);
            before_a_zap = true;
        } else {
            retaken.extend(d.retaken.iter().cloned());
        }
    }
    if before_a_zap {
        shared
            .counters
            .forks_before_a_zap
            .fetch_add(1, Ordering::Relaxed);
    }
    *space.regions.write().expect("regions lock") = regions;
    let advice = if shares_entries || before_a_zap {
        advice_at_fork(parent)
    } else {
        Vec::new()
    };
    for &(lo, hi, advice) in &advice {
        // Pages a move carried out of their region may lie outside every
        // region, still to be installed where they went: the advice over
        // them counts as much (passed over, a wiped range got the pages'
        // stored bytes in the child).
        if space.overlapping(lo, hi).is_empty() && !space.awaits_moved_pages(lo, hi) {
            continue;
        }
        match advice {
            ForkAdvice::DontCopy if child_has_mapping(&space, lo) => continue,
            ForkAdvice::DontCopy => on_unmap(shared, &space, lo, hi),
            ForkAdvice::Wipe => wipe_in_child(shared, &space, lo, hi),
        }
        shared
            .counters
            .fork_advice_ranges
            .fetch_add(1, Ordering::Relaxed);
    }
    let wiped = advice.iter().filter(|a| a.2 == ForkAdvice::Wipe);
    space
        .wiped_at_fork
        .set(wiped.map(|&(lo, hi, _)| (lo, hi)).collect())
        .expect("a new space's wiped ranges are set once");
    shared.counters.forks.fetch_add(1, Ordering::Relaxed);
    space
}

/// What the kernel did not give a child of `parent` as it was, read from
/// the parent's mappings: the fork returns to the program only once this is
/// read (the agent's fence, `fork::parent`), so they are as the kernel
/// copied them but for what other threads changed meanwhile. A child not
/// evicted from has no reader of its mappings: what its own parent marked
/// wiped is still marked so in it (the memory its parent did not copy it
/// does not have). Read only where the child shares stored entries: memory
/// the child holds in its pages is what the kernel gave it, wiped or not,
/// and a page of a resident folio it does not have reads as zero. (A
/// not-copied range of resident folios then stays in the child's view,
/// over a hole: memory the child maps there goes unmanaged.) Reading costs
/// a walk of the parent's page tables: about 135 us for a shell, 11 ms per
/// GiB resident in 4 KiB pages.
fn advice_at_fork(parent: &Space) -> Vec<(usize, usize, ForkAdvice)> {
    match parent.memory.get() {
        Some(memory) => memory.fork_advice(),
        None => parent.wiped_at_fork.get().map_or_else(Vec::new, |wiped| {
            wiped
                .iter()
                .map(|&(lo, hi)| (lo, hi, ForkAdvice::Wipe))
                .collect()
        }),
    }
}

/// Whether forked child `space` has its copy of the parent's mapping at
/// `start` (one mapping of the parent's), which the parent's mappings, read
/// after the kernel's copy, say it was not given (MADV_DONTFORK): the
/// parent may have marked it since (its forking thread runs on once the
/// fork's event is read), and memory the child has taken for unmapped would
/// lose what it holds. The fork left the child's copies of registered
/// mappings registered; memory the child has mapped there since is not
/// (unless the child registered it with a userfaultfd of its own), and is
/// not the parent's. One page is asked: the range is one mapping of the
/// parent's. Where the kernel does not say, the child is taken to have it,
/// as before such advice was read: its new memory there then goes
/// unmanaged, and nothing is lost.
fn child_has_mapping(space: &Space, start: usize) -> bool {
    space.uffd.registered_anonymous(start) != Some(false)
}

/// The kernel gave forked child `space` the range `start..end` empty
/// (MADV_WIPEONFORK in its parent): every page of it reads as zero there,
/// as after a drop of the child's own whose zap is done, and no fork of
/// the child can have been copied before that.
fn wipe_in_child(shared: &Shared, space: &Space, start: usize, end: usize) {
    space.event_at_destinations(start, end, AtDestination::Dropped);
    for (region, i) in folios_in(space, start, end) {
        let (lo, hi) = covered(&region, i, start, end);
        let pages = region.pages_per_folio() as usize;
        let f = &region.folios[i];
        let w = f.load();
        match folio::state(w) {
            RESIDENT | POISONED if hi - lo == pages => {
                space.take_extras(&region, i);
                f.set(UNTOUCHED);
            }
            // Its pages missing in the child read as zero where touched
            // (see `fault::serve`); a poisoned folio in part stays poisoned,
            // a SIGBUS rather than wrong bytes.
            RESIDENT | POISONED => {}
            // Emptied, it frees the child's share of the entries.
            SWAPPED => {
                let emptied = drop_swapped_pages(space, &region, i, lo, hi);
                if emptied {
                    shared.store.invalidate(region.slots_of(w));
                }
            }
            LOADING | INHERITING => {
                space.update_extras(&region, i, |x| x.removed.insert_range(lo, hi))
            }
            _ => {}
        }
    }
}

fn is_empty(x: &Extras) -> bool {
    x.removed.is_empty() && x.unmapped.is_empty() && x.moved.is_empty() && x.lost.is_empty()
}

/// A busy folio of `space` ended as `outcome`: its inheritors in forked
/// children take it over (and theirs, recursively). Runs under the gate's
/// read side (the owner's finish) or write side.
pub(crate) fn resolve_inheritors(
    shared: &Shared,
    space: u32,
    region: u32,
    i: usize,
    outcome: Outcome,
    follow_ups: &mut Vec<FollowUp>,
) {
    let heirs: Vec<Inheritor> = {
        let mut all = shared.inheritors.lock().expect("inheritors lock");
        if all.is_empty() {
            return;
        }
        let (mine, rest) = std::mem::take(&mut *all)
            .into_iter()
            .partition(|h| h.from == (space, region, i));
        *all = rest;
        mine
    };
    for heir in heirs {
        // A child gone (exited or exec'd: `release_space` let its copy go)
        // takes nothing and is counted for nothing; what it forked
        // meanwhile takes over what it would have taken. (Settled as the
        // child's own, a resident folio of a process gone stayed counted
        // for good, and a grandchild took a gone copy's UNTOUCHED for
        // resident and read zeros; a child whose space was dropped left
        // its heirs waiting for ever.)
        let child = heir
            .space
            .upgrade()
            .filter(|c| c.alive.load(Ordering::Acquire));
        let Some(child) = child else {
            resolve_inheritors(
                shared,
                heir.space_id,
                heir.region.id,
                i,
                outcome,
                follow_ups,
            );
            continue;
        };
        let f = &heir.region.folios[i];
        let extras = child.extras_of(&heir.region, i, f.load());
        let pages = heir.region.pages_per_folio() as usize;
        let next = match outcome {
            Outcome::Resident => {
                child.take_extras(&heir.region, i);
                if !extras.unmapped.is_empty() || !extras.moved.is_empty() {
                    GONE
                } else {
                    shared.dropped_meanwhile(&extras, RESIDENT)
                }
            }
            Outcome::Poisoned => {
                // Pages the child moved away meanwhile lost their copy too.
                super::swapin::poison_missing(
                    &child,
                    extras.moved_destinations(heir.region.folio_addr(i)),
                );
                child.take_extras(&heir.region, i);
                if extras.unmapped.covers(pages) {
                    GONE
                } else {
                    POISONED
                }
            }
            // Nothing to install anywhere: every page is a hole and none
            // moved (moved pages count as holes at the folio's own address,
            // but live on where they went, as in the owner's
            // `finish_folio`).
            Outcome::Swapped(_) if extras.holes().covers(pages) && extras.moved.is_empty() => {
                child.take_extras(&heir.region, i);
                extras.all_holes_state()
            }
            Outcome::Swapped(word) => {
                assert!(
                    shared.store.share(heir.region.slots_of(word)),
                    "an evicted folio's entries are gone"
                );
                if extras.moved.is_empty() {
                    folio::with_slot(SWAPPED, folio::slot(word)) | (f.load() & folio::EXTRA)
                } else {
                    follow_ups.push(FollowUp {
                        space: child.clone(),
                        region: heir.region.clone(),
                        folio: i,
                    });
                    folio::with_slot(LOADING, folio::slot(word)) | (f.load() & folio::EXTRA)
                }
            }
        };
        f.set(next);
        if folio::state(next) == RESIDENT && child.is_evicted() {
            // An adopted child's resident memory counts (see
            // `Runtime::adopt`).
            shared
                .resident
                .fetch_add(heir.region.folio_size, Ordering::AcqRel);
            shared.queue_for_reclaim(child.id, heir.region.id, i);
        }
        super::swapin::wake_range(&child, heir.region.folio_addr(i), heir.region.folio_size);
        // Faults where its moved pages live wait for them too.
        for (to, len) in extras.moved_ranges() {
            super::swapin::wake_range(&child, to, len);
        }
        let settled = match folio::state(next) {
            SWAPPED | LOADING => Outcome::Swapped(next),
            POISONED => Outcome::Poisoned,
            // The child keeps nothing of it (unmapped, or every page
            // dropped): what it forked meanwhile takes what it would have
            // taken, as from a child gone.
            GONE | UNTOUCHED => outcome,
            _ => Outcome::Resident,
        };
        resolve_inheritors(shared, child.id, heir.region.id, i, settled, follow_ups);
    }
}

/// A served address space (a forked child, an attached process) has exited
/// or exec'd: drops its references to stored entries and its resident
/// memory from the count. Runs under the gate's write side; folios a worker
/// is loading or evicting are released by that worker when it finds the
/// space gone.
pub(crate) fn release_space(shared: &Shared, space: &Space) {
    space.alive.store(false, Ordering::Release);
    settle_drops(shared, space, true);
    for region in space.regions.read().expect("regions lock").iter() {
        for (i, f) in region.folios.iter().enumerate() {
            shared.unpark(space.id, region, i);
            let w = f.load();
            match folio::state(w) {
                SWAPPED => {
                    f.set(GONE);
                    shared.store.invalidate(region.slots_of(w));
                }
                INHERITING => f.set(GONE),
                RESIDENT => {
                    f.set(GONE);
                    uncount_resident(shared, space, region);
                }
                _ => {}
            }
            space.take_extras(region, i);
        }
    }
    shared
        .counters
        .children_exited
        .fetch_add(1, Ordering::Relaxed);
}

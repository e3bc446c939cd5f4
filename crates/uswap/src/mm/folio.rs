//! Folio states: what the runtime knows about each folio of a region, in
//! one atomic word per folio.
//!
//! ```text
//!            first touch                 reclaim                stored + dropped
//! UNTOUCHED ----------> ZEROING --> RESIDENT ------> EVICTING ----------------> SWAPPED
//!     ^                                ^   ^            |  refused                 |
//!     |                                |   +------------+                          | fault, or a
//!     |  program drops it whole        |                                           | partial drop
//!     +--------------------------------+------------- LOADING <--------------------+
//!                                                        | unusable stored data
//!                                                        v
//!                                                     POISONED (touch = SIGBUS)
//! ```
//!
//! A folio brought back for a read is CLEAN rather than RESIDENT when the
//! runtime keeps clean copies: its pages are write-protected and its stored
//! copy is kept (the word holds its slots), so that evicting it again needs
//! no compression, only a discard. The first write (a write-protect fault),
//! a missing page, or any event of the program over it drops the copy and
//! makes it RESIDENT; the reclaimer takes it as EVICTING like any resident
//! folio.
//!
//! ```text
//! LOADING --read fault--> CLEAN --write, event, missing page--> RESIDENT
//!                           |
//!                           +--reclaim (discard only)--> EVICTING --> SWAPPED
//! ```
//!
//! A folio that cannot leave memory as it is is UNFIT (a flag on
//! RESIDENT): the store refused it because its pages do not compress, with
//! no swap file to hold them raw, or the kernel would not move it out (its
//! mapping read-only, locked, or otherwise unlike the scratch). It keeps
//! the flush's write protection (on the pages that stayed, for one that
//! left in part and came back) and stays out
//! of the reclaim queue, so that the reclaimer does not compress the same
//! pages again at every pass. Its first
//! write (a write-protect fault), a missing page, or any event of the
//! program over it clears the flag and queues it again (`Shared::unpark`).
//! UNFIT memory still counts as resident, but not against the limit
//! (`Shared::reclaim_limit`): the rest of memory keeps the limit's room to
//! work in instead of being evicted as soon as it comes back.
//!
//! In a forked child, a folio that its parent was evicting at the fork is
//! INHERITING until the eviction ends; it then becomes SWAPPED (sharing the
//! parent's entries) or RESIDENT. GONE: unmapped, or no longer tracked (a
//! move cut through it; its pages stay where they are, unmanaged).
//!
//! ZEROING, EVICTING and LOADING are owned by one thread; everyone else
//! leaves such a folio alone, and its owner wakes the folio's range when it
//! is done, so a fault that found it busy simply waits to be retried. An
//! event that changes a busy folio (the program dropped, unmapped or moved
//! part of it) records what happened in the folio's extras (see
//! [`super::space`]) and sets [`EXTRA`]; the owner applies them when it
//! finishes.
//!
//! A resident folio the program dropped pages of (a REMOVE event) is
//! [`DROPPED`] for a while (`RuntimeConfig::drop_grace`): the kernel zaps a
//! MADV_DONTNEED's pages only after the event is read, when the madvise has
//! the address space's lock again, and a folio evicted before that would be
//! stored with the old bytes of pages that must read as zero. The reclaimer
//! passes over it until the grace is over (one given up whole leaves as
//! soon as its pages are gone); what is still there then was given up with
//! MADV_FREE (and perhaps written again), and is evicted as any other page.
//!
//! Word layout: bits 0..4 state, 4..9 flags, 32..64 the first swap slot
//! (SWAPPED, LOADING and CLEAN) or, for a DROPPED folio, when it was
//! dropped (milliseconds of the runtime's clock).

use std::sync::atomic::{AtomicU64, Ordering};

/// Never touched: the first touch gets zero pages.
pub const UNTOUCHED: u64 = 0;
/// In memory (pages the program dropped inside it read as zero).
pub const RESIDENT: u64 = 1;
/// Write-protected, being copied out and stored by the reclaimer.
pub const EVICTING: u64 = 2;
/// In the store; the word holds the first swap slot.
pub const SWAPPED: u64 = 3;
/// Being loaded and installed; the word still holds the first swap slot.
pub const LOADING: u64 = 4;
/// Zero pages being installed on first touch.
pub const ZEROING: u64 = 5;
/// Unmapped by the program, or no longer tracked.
pub const GONE: u64 = 6;
/// In a child: the parent was evicting it at the fork; resolved when the
/// eviction ends.
pub const INHERITING: u64 = 7;
/// The stored data was unusable: its missing pages are poisoned.
pub const POISONED: u64 = 8;
/// In memory, write-protected and unwritten since it was loaded; its stored
/// copy is kept, and the word holds its first swap slot.
pub const CLEAN: u64 = 9;

const STATE_MASK: u64 = 0xf;
/// Refaulted soon after eviction: gets a second pass in the reclaim FIFO.
pub const ACTIVE: u64 = 1 << 4;
/// The folio has extras (holes from partial drops, pages moved away).
pub const EXTRA: u64 = 1 << 5;
/// Resident, and given up whole by the program (a REMOVE event over all of
/// it): its pages are gone (MADV_DONTNEED), or stay until the kernel needs
/// them and keep their bytes if written again first (MADV_FREE), which the
/// event does not tell apart. It stays counted; the reclaimer, which takes
/// it first, finds out which (`reclaim::next_victim`). Always DROPPED too.
pub const GIVEN_UP: u64 = 1 << 6;
/// Resident, and cannot leave as it is (incompressible with no swap file,
/// or memory the kernel would not move): write-protected and out of the
/// reclaim queue until written (see above).
pub const UNFIT: u64 = 1 << 7;
/// Resident, and the program dropped pages of it (a REMOVE event) at the
/// time the upper half of the word holds ([`dropped_ms`]): its pages may
/// still be about to be zapped (see above).
pub const DROPPED: u64 = 1 << 8;
const SLOT_SHIFT: u32 = 32;
const LOW_HALF: u64 = (1 << SLOT_SHIFT) - 1;

/// The state part of a word.
pub fn state(word: u64) -> u64 {
    word & STATE_MASK
}

/// Whether a word is owned by a thread at work on it (evicting, loading,
/// zeroing, or waiting for the parent's eviction), which settles it.
pub fn is_busy(word: u64) -> bool {
    matches!(state(word), EVICTING | LOADING | ZEROING | INHERITING)
}

/// The first swap slot of a SWAPPED, LOADING or CLEAN word.
pub fn slot(word: u64) -> u32 {
    (word >> SLOT_SHIFT) as u32
}

/// A word in `state` holding `first_slot`.
pub fn with_slot(state: u64, first_slot: u32) -> u64 {
    state | (first_slot as u64) << SLOT_SHIFT
}

/// A resident `word` marked DROPPED at `ms` of the runtime's clock.
pub fn dropped_at(word: u64, ms: u32) -> u64 {
    (word & LOW_HALF) | DROPPED | (ms as u64) << SLOT_SHIFT
}

/// When a DROPPED word was dropped.
pub fn dropped_ms(word: u64) -> u32 {
    (word >> SLOT_SHIFT) as u32
}

/// A DROPPED word without the mark (nor GIVEN_UP, which comes with it).
pub fn undropped(word: u64) -> u64 {
    word & LOW_HALF & !(DROPPED | GIVEN_UP)
}

/// One folio's word.
pub struct Folio(AtomicU64);

impl Folio {
    /// A folio in state `word`.
    pub fn new(word: u64) -> Folio {
        Folio(AtomicU64::new(word))
    }

    /// The current word.
    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Moves from exactly `from` to `to`.
    pub fn transition(&self, from: u64, to: u64) -> bool {
        self.0
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Sets the word (only by the thread that owns the folio's busy state,
    /// or under the event gate's write side).
    pub fn set(&self, word: u64) {
        self.0.store(word, Ordering::Release);
    }

    /// Sets a flag.
    pub fn set_flag(&self, flag: u64) {
        self.0.fetch_or(flag, Ordering::AcqRel);
    }

    /// Clears a flag; returns whether it was set.
    pub fn clear_flag(&self, flag: u64) -> bool {
        self.0.fetch_and(!flag, Ordering::AcqRel) & flag != 0
    }
}

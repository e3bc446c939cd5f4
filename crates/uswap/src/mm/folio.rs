//! Folio states: what the runtime knows about each folio of a region, in
//! one atomic word per folio.
//!
//! ```text
//! UNTOUCHED --first touch--> RESIDENT --reclaim--> EVICTING --stored--> SWAPPED
//!     ^                          ^  ^                  |                   |
//!     |                          |  +----refused-------+                   |
//!     +--program's DONTNEED------+  +-----------LOADING <----fault---------+
//! ```
//!
//! EVICTING and LOADING are owned by one thread (the reclaimer, a filler);
//! everyone else leaves such a folio alone, and its owner wakes the folio's
//! range when it is done, so a fault that found it busy simply retries.

use std::sync::atomic::{AtomicU64, Ordering};

/// Never touched: the first touch gets zero pages.
pub const UNTOUCHED: u64 = 0;
/// In memory.
pub const RESIDENT: u64 = 1;
/// Write-protected, being copied out and stored by the reclaimer.
pub const EVICTING: u64 = 2;
/// In the store; the word also holds the first swap slot.
pub const SWAPPED: u64 = 3;
/// Being loaded and installed by a filler.
pub const LOADING: u64 = 4;
/// Unmapped by the program.
pub const GONE: u64 = 5;

const STATE_MASK: u64 = 0x7;
/// Refaulted soon after eviction: gets a second pass in the reclaim FIFO.
pub const ACTIVE: u64 = 1 << 3;
/// The program dropped the folio (MADV_DONTNEED) while it was busy: its
/// owner discards what it was doing instead of publishing it.
pub const DROPPED: u64 = 1 << 4;
/// The program moved part of the folio away (mremap) while the reclaimer
/// was evicting it: the reclaimer leaves the pages where they are and
/// discards what it stored.
pub const MOVED: u64 = 1 << 5;
const SLOT_SHIFT: u32 = 32;

pub fn state(word: u64) -> u64 {
    word & STATE_MASK
}

pub fn slot(word: u64) -> u32 {
    (word >> SLOT_SHIFT) as u32
}

pub fn swapped(first_slot: u32) -> u64 {
    SWAPPED | (first_slot as u64) << SLOT_SHIFT
}

/// One folio's word.
pub struct Folio(AtomicU64);

impl Folio {
    pub fn new(word: u64) -> Folio {
        Folio(AtomicU64::new(word))
    }

    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Moves from exactly `from` to `to`.
    pub fn transition(&self, from: u64, to: u64) -> bool {
        self.0.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Sets the word (only by the thread that owns the folio's busy state).
    pub fn set(&self, word: u64) {
        self.0.store(word, Ordering::Release);
    }

    pub fn set_flag(&self, flag: u64) {
        self.0.fetch_or(flag, Ordering::AcqRel);
    }

    /// Clears a flag; returns whether it was set.
    pub fn clear_flag(&self, flag: u64) -> bool {
        self.0.fetch_and(!flag, Ordering::AcqRel) & flag != 0
    }
}

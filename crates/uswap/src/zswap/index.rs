//! The index: swap slot -> entry, as flat arrays of atomic words.
//!
//! Slot numbers are dense, so an array indexed by slot beats any map: a
//! lookup is one atomic load and takes no lock. Each slot has an entry word
//! and a checksum word (CRC32C of what is stored for it).
//!
//! Entry word layout:
//!
//! ```text
//! bits 63..60  kind: EMPTY, SAME, POOL, FILE, BUSY, STALE, WHOLE
//! SAME:  bits 7..0 the fill byte
//! POOL:  bits 31..0 pool handle, bits 44..32 stored length, bit 45 raw
//! BUSY:  a load, invalidate or writeback owns the slot for a moment
//! STALE: bits 31..0 the pool handle of a loaded page, freed with the slot
//! WHOLE: a page of a folio stored as one object (see `Part`):
//!        bits 31..0 pool handle and bits 44..32 length of the object's
//!        chunk this slot holds (length 0: none), bits 53..45 the page's
//!        place in the folio, bits 57..54 the folio's order, bit 58 the
//!        object is a by_n frame
//! ```
//!
//! A folio stored as one object of L bytes keeps it in ceil(L / 4096)
//! chunks, chunk k in the pool under the folio's slot k, every chunk but the
//! last a whole 4096 bytes: read back in order into one buffer at 4096-byte
//! steps, they are the object again. The folio's other slots hold no chunk.
//! Each chunk has its own checksum in its slot's checksum word.

use crate::zpool::Handle;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

const KIND_SHIFT: u32 = 60;
const EMPTY: u64 = 0;
const SAME: u64 = 1;
const POOL: u64 = 2;
const FILE: u64 = 3;
const BUSY: u64 = 4;
const STALE: u64 = 5;
const WHOLE: u64 = 6;
const RAW_BIT: u64 = 1 << 45;
const AT_SHIFT: u32 = 45;
const ORDER_SHIFT: u32 = 54;
const FRAMED_BIT: u64 = 1 << 58;

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Empty,
    /// A page of one repeated byte.
    Same(u8),
    /// An object in the pool: `len` bytes, raw when the page did not shrink.
    Pool {
        handle: Handle,
        len: usize,
        raw: bool,
    },
    /// The page is in the swap file at this slot.
    File,
    /// Someone is working on this slot.
    Busy,
    /// Loaded; the pool object is freed when the slot is (off the fault
    /// path, by the slot release mode).
    Stale(Handle),
    /// A page of a folio stored as one compressed object.
    Whole(Part),
}

/// One slot's share of a folio stored as one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    /// The page's place in the folio: the folio's first slot is this slot
    /// less `at`, and the chunk this slot holds (if any) is chunk `at`.
    pub at: usize,
    /// The folio holds 2^order pages.
    pub order: usize,
    /// The object is a by_n frame (segments decompressed in parallel).
    pub framed: bool,
    /// The object's chunk kept under this slot: pool handle and length.
    pub chunk: Option<(Handle, usize)>,
}

impl Part {
    /// Pages in the folio.
    pub fn pages(self) -> usize {
        1 << self.order
    }
}

impl Entry {
    pub fn encode(self) -> u64 {
        match self {
            Entry::Empty => EMPTY,
            Entry::Same(b) => SAME << KIND_SHIFT | b as u64,
            Entry::Pool { handle, len, raw } => {
                POOL << KIND_SHIFT
                    | if raw { RAW_BIT } else { 0 }
                    | (len as u64) << 32
                    | handle.to_raw() as u64
            }
            Entry::File => FILE << KIND_SHIFT,
            Entry::Busy => BUSY << KIND_SHIFT,
            Entry::Stale(handle) => STALE << KIND_SHIFT | handle.to_raw() as u64,
            Entry::Whole(part) => {
                let (handle, len) = part
                    .chunk
                    .map_or((0, 0), |(h, len)| (h.to_raw() as u64, len as u64));
                WHOLE << KIND_SHIFT
                    | if part.framed { FRAMED_BIT } else { 0 }
                    | (part.order as u64) << ORDER_SHIFT
                    | (part.at as u64) << AT_SHIFT
                    | len << 32
                    | handle
            }
        }
    }

    pub fn decode(word: u64) -> Entry {
        match word >> KIND_SHIFT {
            SAME => Entry::Same(word as u8),
            POOL => Entry::Pool {
                handle: Handle::from_raw(word as u32),
                len: ((word >> 32) & 0x1fff) as usize,
                raw: word & RAW_BIT != 0,
            },
            FILE => Entry::File,
            BUSY => Entry::Busy,
            STALE => Entry::Stale(Handle::from_raw(word as u32)),
            WHOLE => {
                let len = ((word >> 32) & 0x1fff) as usize;
                Entry::Whole(Part {
                    at: ((word >> AT_SHIFT) & 0x1ff) as usize,
                    order: ((word >> ORDER_SHIFT) & 0xf) as usize,
                    framed: word & FRAMED_BIT != 0,
                    chunk: (len > 0).then(|| (Handle::from_raw(word as u32), len)),
                })
            }
            _ => Entry::Empty,
        }
    }
}

/// Bits of the per-slot LRU flags.
pub(crate) const IN_LRU: u8 = 1;
pub(crate) const REFERENCED: u8 = 2;

pub(crate) struct Index {
    entries: Box<[AtomicU64]>,
    crcs: Box<[AtomicU32]>,
    /// References to each stored page (the kernel's swap_map count): one
    /// per address space whose memory still holds the slot, so that a
    /// forked child and its parent share an entry until both are done.
    users: Box<[AtomicU16]>,
    pub lru_flags: Box<[AtomicU8]>,
}

impl Index {
    pub fn new(slots: u32) -> Index {
        let n = slots as usize;
        Index {
            entries: (0..n).map(|_| AtomicU64::new(EMPTY)).collect(),
            crcs: (0..n).map(|_| AtomicU32::new(0)).collect(),
            users: (0..n).map(|_| AtomicU16::new(0)).collect(),
            lru_flags: (0..n).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    pub fn get(&self, slot: u32) -> Entry {
        Entry::decode(self.entries[slot as usize].load(Ordering::Acquire))
    }

    pub fn crc(&self, slot: u32) -> u32 {
        self.crcs[slot as usize].load(Ordering::Acquire)
    }

    /// Publishes an entry and its checksum.
    pub fn publish(&self, slot: u32, entry: Entry, crc: u32) {
        self.crcs[slot as usize].store(crc, Ordering::Relaxed);
        self.entries[slot as usize].store(entry.encode(), Ordering::Release);
    }

    /// Publishes a newly stored page with one user.
    pub fn publish_new(&self, slot: u32, entry: Entry, crc: u32) {
        self.users[slot as usize].store(1, Ordering::Relaxed);
        self.publish(slot, entry, crc);
    }

    /// Adds a user to a stored page; false if the count would overflow.
    pub fn add_user(&self, slot: u32) -> bool {
        self.users[slot as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(1))
            .is_ok()
    }

    /// Drops a user; true when it was the last one (the entry is then to be
    /// freed).
    pub fn drop_user(&self, slot: u32) -> bool {
        let prev = self.users[slot as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            })
            .expect("the update always succeeds");
        prev <= 1
    }

    /// Takes the slot for exclusive work: waits out another owner, then
    /// swaps in BUSY and returns what was there. A slot that holds no page
    /// (`Empty`, `Stale`) is left alone and reported as `Empty`.
    pub fn claim(&self, slot: u32) -> Entry {
        let word = &self.entries[slot as usize];
        loop {
            let cur = word.load(Ordering::Acquire);
            match Entry::decode(cur) {
                Entry::Busy => std::thread::yield_now(),
                Entry::Empty | Entry::Stale(_) => return Entry::Empty,
                entry => {
                    if word
                        .compare_exchange(
                            cur,
                            Entry::Busy.encode(),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        return entry;
                    }
                }
            }
        }
    }

    /// Claims the slot only if it still holds exactly `expected`.
    pub fn claim_if(&self, slot: u32, expected: Entry) -> bool {
        self.entries[slot as usize]
            .compare_exchange(
                expected.encode(),
                Entry::Busy.encode(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Ends a claim with `entry` (the old one restored, or the new state).
    pub fn release(&self, slot: u32, entry: Entry) {
        self.entries[slot as usize].store(entry.encode(), Ordering::Release);
    }

    /// Empties a slot that is being freed; returns the pool object it still
    /// holds, if it was loaded.
    pub fn take_stale(&self, slot: u32) -> Option<Handle> {
        match Entry::decode(self.entries[slot as usize].swap(EMPTY, Ordering::AcqRel)) {
            Entry::Stale(h) => Some(h),
            _ => None,
        }
    }
}

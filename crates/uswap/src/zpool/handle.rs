//! Handles: stable names for objects that compaction may move.
//!
//! A handle indexes a table of atomic words, each holding the object's
//! current location (class, zspage, slot). Compaction rewrites the word;
//! the handle the store keeps stays the same. The table grows in chunks
//! that never move, so reading a location takes no lock. A free handle's
//! word holds a sentinel, so that compaction can find a zspage's objects by
//! scanning the table instead of keeping a back pointer per object.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

const CHUNK: usize = 4096;
/// The word of a handle that names no object.
const FREE: u64 = u64::MAX;
const MAX_CHUNKS: usize = 4096;

/// The name of an object in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub(crate) u32);

impl Handle {
    /// The raw number, for packing into an index word.
    pub fn to_raw(self) -> u32 {
        self.0
    }

    /// A handle from its raw number (as packed by `to_raw`).
    pub fn from_raw(raw: u32) -> Handle {
        Handle(raw)
    }
}

/// Where an object lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub class: u8,
    pub zspage: u32,
    pub slot: u16,
}

impl Location {
    fn pack(self) -> u64 {
        (self.class as u64) << 48 | (self.zspage as u64) << 16 | self.slot as u64
    }

    fn unpack(word: u64) -> Location {
        Location {
            class: (word >> 48) as u8,
            zspage: (word >> 16) as u32,
            slot: word as u16,
        }
    }
}

struct Free {
    ids: Vec<u32>,
    next: u32,
}

pub(crate) struct HandleTable {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
    free: Mutex<Free>,
}

impl HandleTable {
    pub fn new() -> HandleTable {
        HandleTable {
            chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect(),
            free: Mutex::new(Free {
                ids: Vec::new(),
                next: 0,
            }),
        }
    }

    fn word(&self, h: Handle) -> &AtomicU64 {
        let i = h.0 as usize;
        let chunk = self.chunks[i / CHUNK]
            .get()
            .expect("a handle's chunk exists");
        &chunk[i % CHUNK]
    }

    /// A fresh handle pointing at `loc`; `None` when the table is full.
    pub fn alloc(&self, loc: Location) -> Option<Handle> {
        let mut free = self.free.lock().expect("handle table lock");
        let id = match free.ids.pop() {
            Some(id) => id,
            None => {
                let id = free.next;
                let chunk = id as usize / CHUNK;
                if chunk >= MAX_CHUNKS {
                    return None;
                }
                self.chunks[chunk]
                    .get_or_init(|| (0..CHUNK).map(|_| AtomicU64::new(FREE)).collect());
                free.next += 1;
                id
            }
        };
        drop(free);
        let h = Handle(id);
        self.set(h, loc);
        Some(h)
    }

    pub fn free(&self, h: Handle) {
        self.word(h).store(FREE, Ordering::Release);
        self.free.lock().expect("handle table lock").ids.push(h.0);
    }

    /// Calls `f` for every live handle in `class`.
    pub fn for_each_in_class(&self, class: u8, mut f: impl FnMut(Handle, Location)) {
        let next = self.free.lock().expect("handle table lock").next as usize;
        for (c, chunk) in self.chunks.iter().enumerate().take(next.div_ceil(CHUNK)) {
            let Some(words) = chunk.get() else { continue };
            for (i, w) in words.iter().enumerate() {
                let word = w.load(Ordering::Acquire);
                if word != FREE && c * CHUNK + i < next {
                    let loc = Location::unpack(word);
                    if loc.class == class {
                        f(Handle((c * CHUNK + i) as u32), loc);
                    }
                }
            }
        }
    }

    pub fn get(&self, h: Handle) -> Location {
        Location::unpack(self.word(h).load(Ordering::Acquire))
    }

    pub fn set(&self, h: Handle, loc: Location) {
        self.word(h).store(loc.pack(), Ordering::Release);
    }

    /// Bytes of table memory in use.
    pub fn metadata_bytes(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count() * CHUNK * 8
            + self.free.lock().expect("handle table lock").ids.capacity() * 4
    }
}

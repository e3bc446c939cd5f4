//! Writeback: an LRU of pool entries with a referenced bit (second chance),
//! and the worker that moves cold entries to the swap file when the pool is
//! at its limit.

use super::index::{Entry, Index, Part, IN_LRU, REFERENCED};
use super::stats::bump;
use super::{Inner, PAGE_SIZE};
use crate::swap::Backing;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};

/// Pages written back per step of the worker.
const WRITEBACK_STEP: usize = 64;

/// Pool entries in store order. Each slot is queued at most once (its
/// IN_LRU flag); entries loaded or invalidated since are skipped when they
/// come up.
pub(crate) struct Lru {
    queue: Mutex<VecDeque<u32>>,
}

impl Lru {
    pub fn new() -> Lru {
        Lru {
            queue: Mutex::new(VecDeque::new()),
        }
    }

    /// Queues a newly stored entry, marked referenced: it survives one pass.
    pub fn add(&self, index: &Index, slot: u32) {
        let flags = &index.lru_flags[slot as usize];
        let before = flags.fetch_or(IN_LRU | REFERENCED, Ordering::AcqRel);
        if before & IN_LRU == 0 {
            self.queue.lock().expect("lru lock").push_back(slot);
        }
    }

    fn pop(&self, index: &Index) -> Option<u32> {
        let slot = self.queue.lock().expect("lru lock").pop_front()?;
        index.lru_flags[slot as usize].fetch_and(!IN_LRU, Ordering::AcqRel);
        Some(slot)
    }

    fn len(&self) -> usize {
        self.queue.lock().expect("lru lock").len()
    }
}

struct Signal {
    requested: bool,
    stop: bool,
}

/// Wakes the writeback worker.
pub(crate) struct WorkerSignal {
    state: Mutex<Signal>,
    cv: Condvar,
}

impl WorkerSignal {
    pub fn new() -> WorkerSignal {
        WorkerSignal {
            state: Mutex::new(Signal {
                requested: false,
                stop: false,
            }),
            cv: Condvar::new(),
        }
    }

    pub fn request(&self) {
        self.state.lock().expect("signal lock").requested = true;
        self.cv.notify_one();
    }

    pub fn stop(&self) {
        self.state.lock().expect("signal lock").stop = true;
        self.cv.notify_one();
    }
}

impl Inner {
    pub(crate) fn writeback(&self, max_pages: usize) -> usize {
        let Some(backing) = &self.backing else {
            return 0;
        };
        let mut page = [0u8; PAGE_SIZE];
        let mut stored = [0u8; PAGE_SIZE];
        let mut written = 0;
        // Each queued slot is looked at no more than twice per call.
        let mut budget = self.lru.len() * 2;
        while written < max_pages && budget > 0 {
            budget -= 1;
            let Some(slot) = self.lru.pop(&self.index) else {
                break;
            };
            let entry = self.index.get(slot);
            if entry == Entry::Busy {
                // Being loaded or written: it may stay stored (a forked
                // child's reference, a clean copy kept, a load that failed),
                // and nothing else would queue it again.
                self.lru.add(&self.index, slot);
                continue;
            }
            if !matches!(entry, Entry::Pool { .. } | Entry::Whole(Part { at: 0, .. })) {
                continue;
            }
            let flags = &self.index.lru_flags[slot as usize];
            if flags.fetch_and(!REFERENCED, Ordering::AcqRel) & REFERENCED != 0 {
                // Second chance: back to the tail, unreferenced.
                if flags.fetch_or(IN_LRU, Ordering::AcqRel) & IN_LRU == 0 {
                    self.lru.queue.lock().expect("lru lock").push_back(slot);
                }
                continue;
            }
            if let Entry::Whole(part) = entry {
                match self.write_back_whole(backing.as_ref(), slot, part) {
                    Ok(pages) => written += pages,
                    Err(Stop) => break,
                }
                continue;
            }
            let Entry::Pool { handle, len, raw } = entry else {
                unreachable!("checked above")
            };
            if !self.index.claim_if(slot, entry) {
                // Taken by a load meanwhile (see above).
                self.lru.add(&self.index, slot);
                continue;
            }
            let stored = &mut stored[..len];
            self.pool.read(handle, stored);
            let intact = crc32c::crc32c(stored) == self.index.crc(slot)
                && if raw {
                    page.copy_from_slice(stored);
                    true
                } else {
                    self.codec.decompress(stored, &mut page).is_ok()
                };
            if !intact {
                // Leave it in place: its load will report the corruption.
                bump(&self.counters.decompress_fail, 1);
                self.index.release(slot, entry);
                continue;
            }
            if backing.write_page(slot, &page).is_err() {
                bump(&self.counters.swap_write_errors, 1);
                self.index.release(slot, entry);
                self.lru.add(&self.index, slot);
                break;
            }
            self.index.publish(slot, Entry::File, crc32c::crc32c(&page));
            self.pool.free(handle);
            self.account_pool_object(len, raw, false);
            bump(&self.counters.zswpwb, 1);
            bump(&self.counters.written_back_pages, 1);
            bump(&self.counters.pswpout, 1);
            written += 1;
        }
        written
    }

    /// Writes back a folio stored as one object, found by its first slot:
    /// claims every slot of the folio, decompresses the object, writes each
    /// page to its slot and only then frees the chunks. Returns the pages
    /// written (0 when the folio changed under us or is corrupt, which its
    /// load will report); `Stop` when the swap file refused a write.
    fn write_back_whole(
        &self,
        backing: &dyn Backing,
        first: u32,
        head: Part,
    ) -> Result<usize, Stop> {
        let pages = head.pages();
        let mut members: Vec<(u32, Entry)> = Vec::with_capacity(pages);
        for at in 0..pages {
            let slot = first + at as u32;
            let entry = self.index.get(slot);
            let belongs = matches!(entry, Entry::Whole(p) if p.at == at && p.order == head.order);
            if !belongs || !self.index.claim_if(slot, entry) {
                self.unclaim(&members);
                if entry == Entry::Busy || belongs {
                    // Being loaded (see `writeback`): looked at again later.
                    self.lru.add(&self.index, first);
                }
                return Ok(0);
            }
            members.push((slot, entry));
        }
        let mut stored = vec![0u8; pages * PAGE_SIZE];
        let mut folio = vec![0u8; pages * PAGE_SIZE];
        if self.read_whole(&members, &mut stored, &mut folio).is_err() {
            // Left in place: its load reports the corruption.
            self.unclaim(&members);
            return Ok(0);
        }
        for (&(slot, _), page) in members.iter().zip(folio.chunks(PAGE_SIZE)) {
            if backing.write_page(slot, page).is_err() {
                bump(&self.counters.swap_write_errors, 1);
                self.unclaim(&members);
                self.lru.add(&self.index, first);
                return Err(Stop);
            }
        }
        for (&(slot, entry), page) in members.iter().zip(folio.chunks(PAGE_SIZE)) {
            self.index.publish(slot, Entry::File, crc32c::crc32c(page));
            let Entry::Whole(part) = entry else {
                unreachable!("members are parts")
            };
            if let Some((handle, len)) = part.chunk {
                self.pool.free(handle);
                self.account_pool_object(len, false, false);
            } else {
                self.account_pool_object(0, false, false);
            }
        }
        let n = pages as u64;
        bump(&self.counters.zswpwb, n);
        bump(&self.counters.written_back_pages, n);
        bump(&self.counters.pswpout, n);
        Ok(pages)
    }
}

/// The swap file refused a write: writing back stops for now.
struct Stop;

/// Waits for requests; on each, writes back (and compacts) until the pool is
/// below its accept threshold or nothing more can be moved.
pub(crate) fn worker_loop(inner: &Inner) {
    loop {
        {
            let mut state = inner.worker.state.lock().expect("signal lock");
            while !state.requested && !state.stop {
                state = inner.worker.cv.wait(state).expect("signal lock");
            }
            if state.stop {
                return;
            }
            state.requested = false;
        }
        while inner.pool.total_size() > inner.accept_below {
            let written = inner.writeback(WRITEBACK_STEP);
            let compacted = inner.pool.compact();
            if written == 0 && compacted == 0 {
                break;
            }
        }
    }
}

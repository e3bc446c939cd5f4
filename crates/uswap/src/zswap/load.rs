//! The load path (exclusive: entries are freed once the folio is back) and
//! invalidation.

use super::index::Entry;
use super::stats::bump;
use super::{Inner, LoadError, SlotRange, PAGE_SIZE};
use crate::accel::Job;
use std::cell::RefCell;

thread_local! {
    /// Stored bytes copied out of the pool for one folio.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Inner {
    pub(crate) fn load(&self, range: SlotRange, dst: &mut [u8]) -> Result<(), LoadError> {
        assert_eq!(dst.len(), range.pages as usize * PAGE_SIZE, "dst must hold the whole folio");
        let mut claimed: Vec<(u32, Entry)> = Vec::with_capacity(range.pages as usize);
        for slot in range.slots() {
            match self.index.claim(slot) {
                Entry::Empty => {
                    self.unclaim(&claimed);
                    return Err(LoadError::NotStored(slot));
                }
                entry => claimed.push((slot, entry)),
            }
        }
        if let Err(e) = self.fill(&claimed, dst) {
            self.unclaim(&claimed);
            return Err(e);
        }
        let (mut pooled, mut same, mut filed) = (0, 0, 0);
        for &(slot, entry) in &claimed {
            match entry {
                Entry::Pool { handle, len, raw } => {
                    self.account_pool_object(len, raw, false);
                    pooled += 1;
                    // The object goes when the slot does (see the free hook).
                    self.index.release(slot, Entry::Stale(handle));
                    self.releaser.release(slot);
                    continue;
                }
                Entry::Same(_) => same += 1,
                Entry::File => filed += 1,
                Entry::Empty | Entry::Busy | Entry::Stale(_) => unreachable!("claimed entries hold data"),
            }
            self.index.release(slot, Entry::Empty);
            self.releaser.release(slot);
        }
        bump(&self.counters.zswpin, pooled);
        bump(&self.counters.swpin_zero, same);
        bump(&self.counters.pswpin, filed);
        Ok(())
    }

    fn unclaim(&self, claimed: &[(u32, Entry)]) {
        for &(slot, entry) in claimed {
            self.index.release(slot, entry);
        }
    }

    /// Reconstructs the claimed pages into `dst`; checks every checksum and
    /// decompresses the pool objects as one batch.
    fn fill(&self, claimed: &[(u32, Entry)], dst: &mut [u8]) -> Result<(), LoadError> {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            if scratch.len() < dst.len() {
                scratch.resize(dst.len(), 0);
            }
            let mut jobs: Vec<Job<'_>> = Vec::new();
            let mut job_slots: Vec<u32> = Vec::new();
            for ((&(slot, entry), out), buf) in claimed.iter().zip(dst.chunks_mut(PAGE_SIZE)).zip(scratch.chunks_mut(PAGE_SIZE)) {
                match entry {
                    Entry::Same(b) => out.fill(b),
                    Entry::File => {
                        let backing = self.backing.as_ref().expect("file entries exist only with a backing");
                        if backing.read_page(slot, out).is_err() {
                            bump(&self.counters.swap_read_errors, 1);
                            return Err(LoadError::Io(slot));
                        }
                        if crc32c::crc32c(out) != self.index.crc(slot) {
                            bump(&self.counters.decompress_fail, 1);
                            return Err(LoadError::Corrupt(slot));
                        }
                    }
                    Entry::Pool { handle, len, raw } => {
                        let stored = &mut buf[..len];
                        self.pool.read(handle, stored);
                        if crc32c::crc32c(stored) != self.index.crc(slot) {
                            bump(&self.counters.decompress_fail, 1);
                            return Err(LoadError::Corrupt(slot));
                        }
                        if raw {
                            out.copy_from_slice(stored);
                        } else {
                            jobs.push(Job::new(stored, out));
                            job_slots.push(slot);
                        }
                    }
                    Entry::Empty | Entry::Busy | Entry::Stale(_) => unreachable!("claimed entries hold data"),
                }
            }
            if jobs.len() >= self.load_batch_min_pages && self.batching && self.device.has_batching() {
                self.device.decompress_batch(self.codec.as_ref(), &mut jobs);
            } else {
                for job in &mut jobs {
                    job.result = Some(self.codec.decompress(job.src, job.dst).map(|()| PAGE_SIZE).map_err(Into::into));
                }
            }
            match jobs.iter().zip(&job_slots).find(|(j, _)| !matches!(j.result, Some(Ok(_)))) {
                Some((_, &slot)) => {
                    bump(&self.counters.decompress_fail, 1);
                    Err(LoadError::Corrupt(slot))
                }
                None => Ok(()),
            }
        })
    }

    pub(crate) fn invalidate(&self, range: SlotRange) {
        for slot in range.slots() {
            match self.index.claim(slot) {
                Entry::Empty => continue,
                Entry::Pool { handle, len, raw } => {
                    self.pool.free(handle);
                    self.account_pool_object(len, raw, false);
                }
                Entry::Same(_) | Entry::File | Entry::Busy | Entry::Stale(_) => {}
            }
            self.index.release(slot, Entry::Empty);
            self.releaser.release(slot);
        }
    }
}

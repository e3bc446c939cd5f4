//! The load path and invalidation.
//!
//! Loads do not free anything: [`Inner::read`] reconstructs a folio and
//! leaves its entries in place, so that the caller frees them only once the
//! bytes are safely back where they belong ([`Inner::invalidate`], which
//! drops one user of each slot). A slot has one user per address space that
//! holds it (a fork adds one with [`Inner::share`]); the last user's
//! invalidation frees the entry, the pool object going with the slot (off
//! the fault path, by the slot release mode), as the kernel frees a zswap
//! entry with its swap slot.

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
    /// Reconstructs a folio into `dst` (its pages, in order) and leaves its
    /// entries stored. Counts the pages read (zswpin, swpin_zero, pswpin).
    pub(crate) fn read(&self, range: SlotRange, dst: &mut [u8]) -> Result<(), LoadError> {
        assert_eq!(
            dst.len(),
            range.pages as usize * PAGE_SIZE,
            "dst must hold the whole folio"
        );
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
        let filled = self.fill(&claimed, dst);
        self.unclaim(&claimed);
        filled?;
        let (mut pooled, mut same, mut filed) = (0, 0, 0);
        for &(_, entry) in &claimed {
            match entry {
                Entry::Pool { .. } => pooled += 1,
                Entry::Same(_) => same += 1,
                Entry::File => filed += 1,
                Entry::Empty | Entry::Busy | Entry::Stale(_) => {
                    unreachable!("claimed entries hold data")
                }
            }
        }
        bump(&self.counters.zswpin, pooled);
        bump(&self.counters.swpin_zero, same);
        bump(&self.counters.pswpin, filed);
        Ok(())
    }

    /// Adds a user to every slot of a stored folio (a forked address space
    /// now holds it too). False, with nothing added, if a slot holds
    /// nothing or its count is full.
    pub(crate) fn share(&self, range: SlotRange) -> bool {
        for (k, slot) in range.slots().enumerate() {
            if matches!(self.index.get(slot), Entry::Empty | Entry::Stale(_))
                || !self.index.add_user(slot)
            {
                for undo in range.slots().take(k) {
                    self.index.drop_user(undo);
                }
                return false;
            }
        }
        true
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
            for ((&(slot, entry), out), buf) in claimed
                .iter()
                .zip(dst.chunks_mut(PAGE_SIZE))
                .zip(scratch.chunks_mut(PAGE_SIZE))
            {
                match entry {
                    Entry::Same(b) => out.fill(b),
                    Entry::File => {
                        let backing = self
                            .backing
                            .as_ref()
                            .expect("file entries exist only with a backing");
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
                    Entry::Empty | Entry::Busy | Entry::Stale(_) => {
                        unreachable!("claimed entries hold data")
                    }
                }
            }
            if jobs.len() >= self.load_batch_min_pages
                && self.batching
                && self.device.has_batching()
            {
                self.device.decompress_batch(self.codec.as_ref(), &mut jobs);
            } else {
                for job in &mut jobs {
                    job.result = Some(
                        self.codec
                            .decompress(job.src, job.dst)
                            .map(|()| PAGE_SIZE)
                            .map_err(Into::into),
                    );
                }
            }
            match jobs
                .iter()
                .zip(&job_slots)
                .find(|(j, _)| !matches!(j.result, Some(Ok(_))))
            {
                Some((_, &slot)) => {
                    bump(&self.counters.decompress_fail, 1);
                    Err(LoadError::Corrupt(slot))
                }
                None => Ok(()),
            }
        })
    }

    /// Drops one user of each slot of the folio; the last user's drop frees
    /// the entry and the slot.
    pub(crate) fn invalidate(&self, range: SlotRange) {
        for slot in range.slots() {
            if !self.index.drop_user(slot) {
                continue;
            }
            match self.index.claim(slot) {
                Entry::Empty => continue,
                Entry::Pool { handle, len, raw } => {
                    self.account_pool_object(len, raw, false);
                    // The object goes when the slot does (see the free hook).
                    self.index.release(slot, Entry::Stale(handle));
                }
                Entry::Same(_) | Entry::File | Entry::Busy | Entry::Stale(_) => {
                    self.index.release(slot, Entry::Empty)
                }
            }
            self.releaser.release(slot);
        }
    }
}

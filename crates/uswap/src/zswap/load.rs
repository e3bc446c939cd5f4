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

use super::index::{Entry, Part};
use super::stats::bump;
use super::{Inner, LoadError, SlotRange, PAGE_SIZE};
use crate::accel::{byn, Job};
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
                Entry::Pool { .. } | Entry::Whole(_) => pooled += 1,
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

    pub(crate) fn unclaim(&self, claimed: &[(u32, Entry)]) {
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
            // Folios stored whole first, each as one object.
            let mut k = 0;
            while k < claimed.len() {
                let (slot, entry) = claimed[k];
                let Entry::Whole(part) = entry else {
                    k += 1;
                    continue;
                };
                let end = k + part.pages();
                if part.at != 0 || end > claimed.len() {
                    return Err(LoadError::PartOfFolio(slot));
                }
                let span = k * PAGE_SIZE..end * PAGE_SIZE;
                self.read_whole(&claimed[k..end], &mut scratch[span.clone()], &mut dst[span])?;
                k = end;
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
                    Entry::Whole(_) => {}
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

    /// Reconstructs a folio stored as one object from its claimed slots,
    /// `members` (the folio's, in order), into `out`, with `stored` (as long
    /// as `out`) to gather the object's chunks in. Every chunk's checksum is
    /// checked before the object is decompressed.
    pub(crate) fn read_whole(
        &self,
        members: &[(u32, Entry)],
        stored: &mut [u8],
        out: &mut [u8],
    ) -> Result<(), LoadError> {
        let (head, Entry::Whole(first)) = members[0] else {
            unreachable!("a whole folio starts with its first part")
        };
        let mut len = 0;
        for (j, &(slot, entry)) in members.iter().enumerate() {
            let Entry::Whole(part) = entry else {
                return Err(LoadError::PartOfFolio(slot));
            };
            if part.at != j || part.order != first.order {
                return Err(LoadError::PartOfFolio(slot));
            }
            if let Part {
                chunk: Some((handle, chunk_len)),
                ..
            } = part
            {
                // Chunks are whole pages but the last, in order from the
                // first slot: gathered at page steps, they are contiguous.
                if len != j * PAGE_SIZE {
                    bump(&self.counters.decompress_fail, 1);
                    return Err(LoadError::Corrupt(slot));
                }
                let chunk = &mut stored[len..len + chunk_len];
                self.pool.read(handle, chunk);
                if crc32c::crc32c(chunk) != self.index.crc(slot) {
                    bump(&self.counters.decompress_fail, 1);
                    return Err(LoadError::Corrupt(slot));
                }
                len += chunk_len;
            }
        }
        let object = &stored[..len];
        let decoded = if first.framed {
            // As for a folio stored page by page (`load_batch_min_pages`).
            let on_engines = first.pages() >= self.load_batch_min_pages
                && self.batching
                && self.device.has_batching();
            let device = if on_engines { &self.device } else { &self.here };
            byn::decompress(device, self.codec.as_ref(), object, out)
        } else {
            self.codec.decompress(object, out)
        };
        decoded.map_err(|_| {
            bump(&self.counters.decompress_fail, 1);
            LoadError::Corrupt(head)
        })
    }

    /// Drops one user of each slot of the folio; the last user's drop frees
    /// the entry and the slot. A folio stored as one object is invalidated
    /// whole: what is left of one invalidated in part cannot be read.
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
                Entry::Whole(part) => {
                    self.account_pool_object(part.chunk.map_or(0, |(_, len)| len), false, false);
                    self.index.release(
                        slot,
                        part.chunk
                            .map_or(Entry::Empty, |(handle, _)| Entry::Stale(handle)),
                    );
                }
                Entry::Same(_) | Entry::File | Entry::Busy | Entry::Stale(_) => {
                    self.index.release(slot, Entry::Empty)
                }
            }
            self.releaser.release(slot);
        }
    }
}

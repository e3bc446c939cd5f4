//! The store path: slots, same-filled pages, batched compression, pool
//! placement, and the all-or-nothing rule for folios.

use super::index::Entry;
use super::stats::bump;
use super::{Inner, SlotRange, StoreError, MAX_FOLIO_PAGES, PAGE_SIZE};
use crate::accel::{JobError, Op};
use crate::codec::{same_filled, CodecError};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// One folio on its way into the store.
struct FolioPlan {
    range: SlotRange,
    order: usize,
    failed: Option<StoreError>,
    /// Entries ready to publish once the whole folio has succeeded.
    staged: Vec<(u32, Entry, u32)>,
    hit_limit: bool,
    /// Pages that did not shrink, kept raw in the pool with no swap file to
    /// hold them: worth it only while the folio as a whole still shrinks.
    raw_without_file: u64,
}

impl FolioPlan {
    fn fail(&mut self, e: StoreError) {
        self.failed.get_or_insert(e);
    }
}

thread_local! {
    /// Compressed output of the pages of one call.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Inner {
    pub(crate) fn store_batch(&self, folios: &[&[u8]]) -> Vec<Result<SlotRange, StoreError>> {
        let mut plans: Vec<Result<FolioPlan, StoreError>> =
            folios.iter().map(|f| self.plan(f)).collect();

        // Same-filled pages need no compression; the rest form one list.
        let mut pending: Vec<(usize, usize)> = Vec::new();
        for (fi, folio) in folios.iter().enumerate() {
            let Ok(plan) = &mut plans[fi] else { continue };
            for (pi, page) in folio.chunks(PAGE_SIZE).enumerate() {
                match same_filled(page) {
                    Some(b) => plan
                        .staged
                        .push((plan.range.first + pi as u32, Entry::Same(b), 0)),
                    None => pending.push((fi, pi)),
                }
            }
        }

        let page = |(fi, pi): (usize, usize)| &folios[fi][pi * PAGE_SIZE..(pi + 1) * PAGE_SIZE];
        let live = |plans: &[Result<FolioPlan, StoreError>], fi: usize| {
            plans[fi].as_ref().is_ok_and(|p| p.failed.is_none())
        };
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let need = pending.len() * PAGE_SIZE;
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let mut outs = scratch[..need].chunks_mut(PAGE_SIZE);
            if !(self.batching && self.device.has_batching()) {
                // Page by page on this thread, as zswap stored before batching.
                for (&at, out) in pending.iter().zip(outs) {
                    if live(&plans, at.0) {
                        let result = self.codec.compress(page(at), out).map_err(JobError::from);
                        self.place(&mut plans, at, page(at), result, out);
                    }
                }
                return;
            }
            // Keep two batches in flight on the engines and place each result
            // in the pool as soon as it is done, while later pages are still
            // being compressed (submit, then poll in order).
            let window = 2 * self.device.batch_size();
            self.device.scope(|s| {
                let mut in_flight = VecDeque::with_capacity(window);
                let mut next = 0;
                loop {
                    while in_flight.len() < window && next < pending.len() {
                        let at = pending[next];
                        let out = outs.next().expect("one output per pending page");
                        next += 1;
                        if live(&plans, at.0) {
                            in_flight.push_back((
                                at,
                                s.submit(self.codec.as_ref(), Op::Compress, page(at), out),
                            ));
                        }
                    }
                    let Some((at, ticket)) = in_flight.pop_front() else {
                        break;
                    };
                    let (result, out) = s.wait(ticket);
                    if live(&plans, at.0) {
                        self.place(&mut plans, at, page(at), result, out);
                    }
                }
            });
        });

        plans
            .into_iter()
            .map(|p| p.and_then(|plan| self.finish(plan)))
            .collect()
    }

    /// Checks the folio's shape and gives it a contiguous run of slots.
    fn plan(&self, folio: &[u8]) -> Result<FolioPlan, StoreError> {
        let pages = folio.len() / PAGE_SIZE;
        if !folio.len().is_multiple_of(PAGE_SIZE)
            || !pages.is_power_of_two()
            || pages > MAX_FOLIO_PAGES
        {
            return Err(StoreError::BadFolio);
        }
        let order = pages.trailing_zeros() as usize;
        let Some(first) = self.allocator.alloc(order) else {
            if order > 0 {
                bump(&self.counters.swpout_fallback_by_order[order], 1);
            }
            return Err(StoreError::NoSlots);
        };
        Ok(FolioPlan {
            range: SlotRange {
                first,
                pages: pages as u32,
            },
            order,
            failed: None,
            staged: Vec::with_capacity(pages),
            hit_limit: false,
            raw_without_file: 0,
        })
    }

    fn place(
        &self,
        plans: &mut [Result<FolioPlan, StoreError>],
        (fi, pi): (usize, usize),
        page: &[u8],
        result: Result<usize, JobError>,
        out: &[u8],
    ) {
        let Ok(plan) = &mut plans[fi] else {
            unreachable!("pending pages belong to planned folios")
        };
        let slot = plan.range.first + pi as u32;
        match result {
            Ok(n) => self.put(plan, slot, &out[..n], false, page),
            // The kernel keeps a page that does not shrink raw when it can
            // be written back later, and rejects it otherwise. A page of a
            // large folio is kept raw either way: the folio is stored or
            // refused whole, and the rest of it may well shrink enough
            // (`finish` decides).
            Err(JobError::Codec(CodecError::DoesNotFit)) if self.backing.is_some() => {
                self.put(plan, slot, page, true, page)
            }
            Err(JobError::Codec(CodecError::DoesNotFit)) if plan.range.pages > 1 => {
                plan.raw_without_file += 1;
                self.put(plan, slot, page, true, page)
            }
            Err(JobError::Codec(CodecError::DoesNotFit)) => {
                bump(&self.counters.reject_compress_poor, 1);
                plan.fail(StoreError::CompressPoor);
            }
            Err(_) => {
                bump(&self.counters.reject_compress_fail, 1);
                plan.fail(StoreError::CompressFail);
            }
        }
    }

    /// Puts stored bytes in the pool, or the page in the swap file when the
    /// pool refuses.
    fn put(&self, plan: &mut FolioPlan, slot: u32, bytes: &[u8], raw: bool, page: &[u8]) {
        if !self.pool_accepts() {
            if !plan.hit_limit {
                plan.hit_limit = true;
                bump(&self.counters.pool_limit_hit, 1);
            }
            return self.put_in_file(plan, slot, page, StoreError::PoolLimit);
        }
        match self.pool.alloc(bytes.len()) {
            Ok(handle) => {
                self.pool.write(handle, bytes);
                let entry = Entry::Pool {
                    handle,
                    len: bytes.len(),
                    raw,
                };
                plan.staged.push((slot, entry, crc32c::crc32c(bytes)));
            }
            Err(_) => {
                bump(&self.counters.reject_alloc_fail, 1);
                self.put_in_file(plan, slot, page, StoreError::AllocFail);
            }
        }
    }

    fn put_in_file(&self, plan: &mut FolioPlan, slot: u32, page: &[u8], without_file: StoreError) {
        let Some(backing) = &self.backing else {
            return plan.fail(without_file);
        };
        match backing.write_page(slot, page) {
            Ok(()) => plan.staged.push((slot, Entry::File, crc32c::crc32c(page))),
            Err(_) => {
                bump(&self.counters.swap_write_errors, 1);
                plan.fail(StoreError::Io);
            }
        }
    }

    /// Whether the pool takes new objects, with the kernel's hysteresis:
    /// once full, nothing until it has drained below the accept threshold.
    pub(crate) fn pool_accepts(&self) -> bool {
        let total = self.pool.total_size();
        if total >= self.max_pool {
            if !self.pool_full.swap(true, Ordering::AcqRel) {
                self.worker.request();
            }
        } else if self.pool_full.load(Ordering::Acquire) && total <= self.accept_below {
            self.pool_full.store(false, Ordering::Release);
        }
        !self.pool_full.load(Ordering::Acquire)
    }

    /// Publishes a folio that stored completely, or undoes one that did not.
    /// A folio holding raw pages with no swap file behind them is refused
    /// unless it saves at least one page: keeping the rest compressed is
    /// worth one page held raw, a folio that barely shrinks is not.
    fn finish(&self, mut plan: FolioPlan) -> Result<SlotRange, StoreError> {
        if plan.failed.is_none() && plan.raw_without_file > 0 {
            let stored: usize = plan
                .staged
                .iter()
                .map(|(_, entry, _)| match entry {
                    Entry::Pool { len, .. } => *len,
                    _ => 0,
                })
                .sum();
            if stored + PAGE_SIZE > plan.range.pages as usize * PAGE_SIZE {
                bump(&self.counters.reject_compress_poor, plan.raw_without_file);
                plan.fail(StoreError::CompressPoor);
            }
        }
        if let Some(e) = plan.failed {
            for &(_, entry, _) in &plan.staged {
                if let Entry::Pool { handle, .. } = entry {
                    self.pool.free(handle);
                }
            }
            self.allocator
                .free_run(plan.range.first, plan.range.pages as usize);
            return Err(e);
        }
        let (mut pooled, mut same, mut filed) = (0, 0, 0);
        for &(slot, entry, crc) in &plan.staged {
            self.index.publish_new(slot, entry, crc);
            match entry {
                Entry::Pool { len, raw, .. } => {
                    pooled += 1;
                    self.account_pool_object(len, raw, true);
                    self.lru.add(&self.index, slot);
                }
                Entry::Same(_) => same += 1,
                Entry::File => filed += 1,
                Entry::Empty | Entry::Busy | Entry::Stale(_) => {
                    unreachable!("only stored states are staged")
                }
            }
        }
        bump(&self.counters.zswpout, pooled);
        bump(&self.counters.swpout_zero, same);
        bump(&self.counters.pswpout, filed);
        bump(&self.counters.zswpout_by_order[plan.order], 1);
        Ok(plan.range)
    }
}

//! The store path: slots, same-filled pages, batched compression, pool
//! placement, and the all-or-nothing rule for folios.

use super::index::{Entry, Part};
use super::stats::bump;
use super::{Inner, Layout, SlotRange, StoreError, MAX_FOLIO_PAGES, PAGE_SIZE};
use crate::accel::{byn, JobError, Op};
use crate::codec::{same_filled, CodecError};
use crate::zpool::Handle;
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

/// What one compression covers.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// Page `.1` of folio `.0`.
    Page(usize, usize),
    /// All of folio `.0`, as one object.
    Folio(usize),
}

thread_local! {
    /// Compressed output of the pages and folios of one call.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Inner {
    pub(crate) fn store_batch(&self, folios: &[&[u8]]) -> Vec<Result<SlotRange, StoreError>> {
        let mut plans: Vec<Result<FolioPlan, StoreError>> =
            folios.iter().map(|f| self.plan(f)).collect();

        let mut units: Vec<Unit> = Vec::new();
        for (fi, folio) in folios.iter().enumerate() {
            if let Ok(plan) = &mut plans[fi] {
                if self.stores_whole(folio) {
                    units.push(Unit::Folio(fi));
                } else {
                    stage_same_filled(plan, fi, folio, &mut units);
                }
            }
        }
        // Folios that would not save a page as one object go page by page.
        let by_page = self.compress(&mut plans, folios, &units);
        if !by_page.is_empty() {
            units.clear();
            for fi in by_page {
                if let Ok(plan) = &mut plans[fi] {
                    stage_same_filled(plan, fi, folios[fi], &mut units);
                }
            }
            let again = self.compress(&mut plans, folios, &units);
            debug_assert!(again.is_empty(), "pages are never sent back");
        }

        plans
            .into_iter()
            .map(|p| p.and_then(|plan| self.finish(plan)))
            .collect()
    }

    /// Whether `folio` is to be compressed as one object: the layout says
    /// so, it has several pages, and not all of them are same-filled (those
    /// cost nothing page by page).
    fn stores_whole(&self, folio: &[u8]) -> bool {
        matches!(self.layout, Layout::Folio { .. })
            && folio.len() > PAGE_SIZE
            && folio.chunks(PAGE_SIZE).any(|p| same_filled(p).is_none())
    }

    /// Compresses `units` and places each result; returns the folios that
    /// would not save a page as one object.
    fn compress(
        &self,
        plans: &mut [Result<FolioPlan, StoreError>],
        folios: &[&[u8]],
        units: &[Unit],
    ) -> Vec<usize> {
        let src = |u: Unit| match u {
            Unit::Page(fi, pi) => &folios[fi][pi * PAGE_SIZE..(pi + 1) * PAGE_SIZE],
            Unit::Folio(fi) => folios[fi],
        };
        // A folio's object must save a page, or it is not worth its chunks.
        let capacity = |u: Unit| match u {
            Unit::Page(..) => PAGE_SIZE,
            Unit::Folio(fi) => folios[fi].len() - PAGE_SIZE,
        };
        let live = |plans: &[Result<FolioPlan, StoreError>], u: Unit| {
            let (Unit::Page(fi, _) | Unit::Folio(fi)) = u;
            plans[fi].as_ref().is_ok_and(|p| p.failed.is_none())
        };
        let mut by_page = Vec::new();
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let need: usize = units.iter().map(|&u| capacity(u)).sum();
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let mut rest: &mut [u8] = &mut scratch[..need];
            let mut jobs: Vec<(Unit, &mut [u8])> = Vec::with_capacity(units.len());
            for &u in units {
                let (out, tail) = std::mem::take(&mut rest).split_at_mut(capacity(u));
                rest = tail;
                let segments = match (u, self.layout) {
                    (Unit::Folio(_), Layout::Folio { segments }) => segments,
                    _ => 1,
                };
                if segments == 1 {
                    jobs.push((u, out));
                } else if live(plans, u) {
                    // A by_n frame is a batch of its own on the engines.
                    let result =
                        byn::compress(&self.device, self.codec.as_ref(), segments, src(u), out)
                            .map_err(JobError::from);
                    self.place(plans, u, src(u), result, out, &mut by_page);
                }
            }
            if !(self.batching && self.device.has_batching()) {
                // One by one on this thread, as zswap stored before batching.
                for (u, out) in jobs {
                    if live(plans, u) {
                        let result = self.codec.compress(src(u), out).map_err(JobError::from);
                        self.place(plans, u, src(u), result, out, &mut by_page);
                    }
                }
                return;
            }
            // Keep two batches in flight on the engines and place each result
            // in the pool as soon as it is done, while later ones are still
            // being compressed (submit, then poll in order).
            let window = 2 * self.device.batch_size();
            self.device.scope(|s| {
                let mut in_flight = VecDeque::with_capacity(window);
                let mut jobs = jobs.into_iter();
                loop {
                    while in_flight.len() < window {
                        let Some((u, out)) = jobs.next() else { break };
                        if live(plans, u) {
                            in_flight.push_back((
                                u,
                                s.submit(self.codec.as_ref(), Op::Compress, src(u), out),
                            ));
                        }
                    }
                    let Some((u, ticket)) = in_flight.pop_front() else {
                        break;
                    };
                    let (result, out) = s.wait(ticket);
                    if live(plans, u) {
                        self.place(plans, u, src(u), result, out, &mut by_page);
                    }
                }
            });
        });
        by_page
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

    /// Places one compression's result, or records why it failed; a folio
    /// that did not shrink by a page goes on `by_page`.
    fn place(
        &self,
        plans: &mut [Result<FolioPlan, StoreError>],
        unit: Unit,
        src: &[u8],
        result: Result<usize, JobError>,
        out: &[u8],
        by_page: &mut Vec<usize>,
    ) {
        let (Unit::Page(fi, _) | Unit::Folio(fi)) = unit;
        let Ok(plan) = &mut plans[fi] else {
            unreachable!("units belong to planned folios")
        };
        let pi = match unit {
            Unit::Page(_, pi) => pi,
            Unit::Folio(_) => {
                match result {
                    Ok(n) => self.put_whole(plan, &out[..n], src),
                    Err(JobError::Codec(CodecError::DoesNotFit | CodecError::BadArgument)) => {
                        bump(&self.counters.folio_object_fallback, 1);
                        by_page.push(fi);
                    }
                    Err(_) => {
                        bump(&self.counters.reject_compress_fail, 1);
                        plan.fail(StoreError::CompressFail);
                    }
                }
                return;
            }
        };
        let slot = plan.range.first + pi as u32;
        match result {
            Ok(n) => self.put(plan, slot, &out[..n], false, src),
            // The kernel keeps a page that does not shrink raw when it can
            // be written back later, and rejects it otherwise. A page of a
            // large folio is kept raw either way: the folio is stored or
            // refused whole, and the rest of it may well shrink enough
            // (`finish` decides).
            Err(JobError::Codec(CodecError::DoesNotFit)) if self.backing.is_some() => {
                self.put(plan, slot, src, true, src)
            }
            Err(JobError::Codec(CodecError::DoesNotFit)) if plan.range.pages > 1 => {
                plan.raw_without_file += 1;
                self.put(plan, slot, src, true, src)
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

    /// Puts a folio's object in the pool in page-sized chunks (see the
    /// index's layout), or the folio's pages in the swap file when the pool
    /// refuses.
    fn put_whole(&self, plan: &mut FolioPlan, object: &[u8], folio: &[u8]) {
        let framed = matches!(self.layout, Layout::Folio { segments } if segments > 1);
        let order = plan.order;
        let part = |at: usize, chunk: Option<(Handle, usize)>| {
            Entry::Whole(Part {
                at,
                order,
                framed,
                chunk,
            })
        };
        let refused = if self.pool_accepts(object.len()) {
            let mut chunks: Vec<(Handle, u32)> = Vec::new();
            for chunk in object.chunks(PAGE_SIZE) {
                let Ok(handle) = self.pool.alloc(chunk.len()) else {
                    break;
                };
                self.pool.write(handle, chunk);
                chunks.push((handle, crc32c::crc32c(chunk)));
            }
            if chunks.len() == object.len().div_ceil(PAGE_SIZE) {
                let first = plan.range.first;
                for (at, (&(handle, crc), chunk)) in
                    chunks.iter().zip(object.chunks(PAGE_SIZE)).enumerate()
                {
                    let entry = part(at, Some((handle, chunk.len())));
                    plan.staged.push((first + at as u32, entry, crc));
                }
                for at in chunks.len()..plan.range.pages as usize {
                    plan.staged.push((first + at as u32, part(at, None), 0));
                }
                return;
            }
            bump(&self.counters.reject_alloc_fail, 1);
            for (handle, _) in chunks {
                self.pool.free(handle);
            }
            StoreError::AllocFail
        } else {
            if !plan.hit_limit {
                plan.hit_limit = true;
                bump(&self.counters.pool_limit_hit, 1);
            }
            StoreError::PoolLimit
        };
        for (pi, page) in folio.chunks(PAGE_SIZE).enumerate() {
            self.put_in_file(plan, plan.range.first + pi as u32, page, refused);
        }
    }

    /// Puts stored bytes in the pool, or the page in the swap file when the
    /// pool refuses.
    fn put(&self, plan: &mut FolioPlan, slot: u32, bytes: &[u8], raw: bool, page: &[u8]) {
        if !self.pool_accepts(bytes.len()) {
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

    /// Whether the pool takes `len` more bytes, with the kernel's
    /// hysteresis: once full, nothing until it has drained below the accept
    /// threshold. The new bytes count, so that a folio's object (up to
    /// 2 MiB) cannot take the pool far past its limit.
    pub(crate) fn pool_accepts(&self, len: usize) -> bool {
        let total = self.pool.total_size();
        if total + len > self.max_pool {
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
                    Entry::Whole(part) => part.chunk.map_or(0, |(_, len)| len),
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
                match entry {
                    Entry::Pool { handle, .. }
                    | Entry::Whole(Part {
                        chunk: Some((handle, _)),
                        ..
                    }) => self.pool.free(handle),
                    _ => {}
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
                Entry::Whole(part) => {
                    pooled += 1;
                    self.account_pool_object(part.chunk.map_or(0, |(_, len)| len), false, true);
                    // The folio is written back whole, found by its first slot.
                    if part.at == 0 {
                        self.lru.add(&self.index, slot);
                    }
                }
                Entry::Same(_) => same += 1,
                Entry::File => filed += 1,
                Entry::Empty | Entry::Busy | Entry::Stale(_) => {
                    unreachable!("only stored states are staged")
                }
            }
        }
        if plan
            .staged
            .iter()
            .any(|(_, e, _)| matches!(e, Entry::Whole(_)))
        {
            bump(&self.counters.folio_objects_stored, 1);
        }
        bump(&self.counters.zswpout, pooled);
        bump(&self.counters.swpout_zero, same);
        bump(&self.counters.pswpout, filed);
        bump(&self.counters.zswpout_by_order[plan.order], 1);
        Ok(plan.range)
    }
}

/// Records the folio's same-filled pages without compressing them and puts
/// every other page on `units`.
fn stage_same_filled(plan: &mut FolioPlan, fi: usize, folio: &[u8], units: &mut Vec<Unit>) {
    for (pi, page) in folio.chunks(PAGE_SIZE).enumerate() {
        match same_filled(page) {
            Some(b) => plan
                .staged
                .push((plan.range.first + pi as u32, Entry::Same(b), 0)),
            None => units.push(Unit::Page(fi, pi)),
        }
    }
}

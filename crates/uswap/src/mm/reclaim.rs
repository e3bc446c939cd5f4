//! Reclaim: when resident managed memory passes `memory_high`, evict cold
//! folios.
//!
//! Order: FIFO of folios in fault-in order; a folio that refaulted soon
//! after its eviction (refault distance shorter than what fits in memory,
//! the kernel's workingset test) is marked active and gets one more pass.
//! Victims are collected in a plug of up to `compress_batchsize` folios
//! (flushed when full, before a 2M folio, and after a short timeout). At a
//! flush they are write-protected, copied out in one `process_vm_readv`,
//! stored with one `store_batch`, then dropped (MADV_DONTNEED). Adjacent
//! folios of the plug (sequential access makes them the rule) share one
//! write-protect call and one MADV_DONTNEED, so the TLB flushes and the
//! REMOVE event round trips are paid per run, not per folio. A folio the
//! store refuses is unprotected and stays resident.
//!
//! The copy-out goes through `process_vm_readv` rather than a plain memory
//! copy so that a range the program unmapped or moved meanwhile is an error
//! to handle, not a crash.

use super::folio::{self, ACTIVE, DROPPED, EVICTING, GONE, MOVED, RESIDENT, UNTOUCHED};
use super::region::RegionInner;
use super::{FolioRef, Shared};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Victim {
    region: Arc<RegionInner>,
    folio: usize,
}

pub(crate) fn reclaim_loop(shared: &Shared) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    shared.reclaimer_tid.store(tid, Ordering::Relaxed);
    let mut plug: Vec<Victim> = Vec::new();
    let mut plugged_at = Instant::now();
    let mut staging: Vec<u8> = Vec::new();
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            release_plug(&mut plug);
            return;
        }
        let over = shared.resident.load(Ordering::Acquire) > shared.config.memory_high;
        let victim = if over { next_victim(shared) } else { None };
        match victim {
            Some(v) => {
                if v.region.folio_size >= 2 << 20 && !plug.is_empty() {
                    flush(shared, &mut plug, &mut staging);
                }
                if plug.is_empty() {
                    plugged_at = Instant::now();
                }
                plug.push(v);
                if plug.len() >= shared.config.compress_batchsize {
                    flush(shared, &mut plug, &mut staging);
                }
            }
            None => {
                if !plug.is_empty() && (plugged_at.elapsed() >= shared.config.plug_timeout || !over) {
                    flush(shared, &mut plug, &mut staging);
                    continue;
                }
                if over && plug.is_empty() {
                    // Nothing left to evict.
                    shared.reclaim_stuck.store(true, Ordering::Release);
                    shared.reclaimed.1.notify_all();
                }
                let (lock, cv) = &shared.reclaim_signal;
                let mut kicked = lock.lock().expect("reclaim signal lock");
                if !*kicked {
                    let wait = if plug.is_empty() { Duration::from_millis(10) } else { shared.config.plug_timeout };
                    kicked = cv.wait_timeout(kicked, wait).expect("reclaim signal lock").0;
                }
                *kicked = false;
            }
        }
    }
}

/// Pops folios until one can be taken for eviction (state EVICTING).
fn next_victim(shared: &Shared) -> Option<Victim> {
    loop {
        let FolioRef { region, folio: i } = shared.fifo.lock().expect("fifo lock").pop_front()?;
        let Some(region) = shared.region_by_id(region) else { continue };
        let i = i as usize;
        let f = &region.folios[i];
        let w = f.load();
        if folio::state(w) != RESIDENT {
            continue;
        }
        if w & ACTIVE != 0 {
            f.clear_flag(ACTIVE);
            shared.fifo.lock().expect("fifo lock").push_back(FolioRef {
                region: region.id,
                folio: i as u32,
            });
            continue;
        }
        if !f.transition(w, EVICTING) {
            continue;
        }
        return Some(Victim { region, folio: i });
    }
}

/// Runs of plug entries that are adjacent folios of one region: (first
/// index into the plug, count).
fn runs(plug: &[Victim]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (k, v) in plug.iter().enumerate() {
        match out.last_mut() {
            Some((first, count))
                if plug[*first].region.id == v.region.id && plug[*first].folio + *count == v.folio =>
            {
                *count += 1
            }
            _ => out.push((k, 1)),
        }
    }
    out
}

fn run_range(plug: &[Victim], (first, count): (usize, usize)) -> (usize, usize) {
    let v = &plug[first];
    (v.region.folio_addr(v.folio), count * v.region.folio_size)
}

/// Write-protects, copies out and stores the plugged folios as one batch,
/// and drops the stored ones from memory.
fn flush(shared: &Shared, plug: &mut Vec<Victim>, staging: &mut Vec<u8>) {
    // Keep the plug sorted so that adjacent folios form runs.
    plug.sort_by_key(|v| (v.region.id, v.folio));
    let mut protected = vec![true; plug.len()];
    for run in runs(plug) {
        let (start, len) = run_range(plug, run);
        if shared.uffd.write_protect(start, len, true, &mut std::thread::yield_now).is_err() {
            // The range is gone or changing: these folios stay as they were.
            protected[run.0..run.0 + run.1].fill(false);
        }
    }
    let sizes: usize = plug.iter().map(|v| v.region.folio_size).sum();
    if staging.len() < sizes {
        staging.resize(sizes, 0);
    }
    let copied = protected.iter().all(|&p| p) && copy_out(plug, &mut staging[..sizes]);
    let mut folios: Vec<&[u8]> = Vec::with_capacity(plug.len());
    let mut at = 0;
    for v in plug.iter() {
        folios.push(&staging[at..at + v.region.folio_size]);
        at += v.region.folio_size;
    }
    let results: Vec<Result<crate::zswap::SlotRange, crate::zswap::StoreError>> = if copied {
        shared.store.store_batch(&folios)
    } else {
        plug.iter().map(|_| Err(crate::zswap::StoreError::Io)).collect()
    };
    shared.counters.reclaim_batches.fetch_add(1, Ordering::Relaxed);

    // Drop the stored folios, a run of adjacent ones at a time (not those
    // the program has partly moved away meanwhile).
    let stored: Vec<bool> = results
        .iter()
        .zip(plug.iter())
        .map(|(r, v)| r.is_ok() && v.region.folios[v.folio].load() & MOVED == 0)
        .collect();
    let mut k = 0;
    while k < plug.len() {
        if !stored[k] {
            k += 1;
            continue;
        }
        let mut n = 1;
        while k + n < plug.len()
            && stored[k + n]
            && plug[k + n].region.id == plug[k].region.id
            && plug[k + n].folio == plug[k].folio + n
        {
            n += 1;
        }
        let (start, len) = run_range(plug, (k, n));
        // The event thread consumes this mark with the REMOVE event that our
        // MADV_DONTNEED raises (the call returns once the event is read,
        // possibly before it is handled).
        shared.own_removes.lock().expect("own removes lock").push(start);
        // SAFETY: dropping pages of a managed range that is write-protected
        // and owned by this thread (every folio in it is EVICTING).
        if unsafe { libc::madvise(start as *mut _, len, libc::MADV_DONTNEED) } != 0 {
            // No event was raised for a failed call.
            shared.own_removes.lock().expect("own removes lock").retain(|&s| s != start);
        }
        k += n;
    }

    let mut progress = false;
    for (((v, result), was_protected), dropped_here) in plug.drain(..).zip(results).zip(protected).zip(stored) {
        let region = &v.region;
        let f = &region.folios[v.folio];
        let start = region.folio_addr(v.folio);
        let fs = region.folio_size;
        let result = match result {
            // Stored, but its pages were kept in place: the copy is void.
            Ok(range) if !dropped_here => {
                shared.store.invalidate(range);
                f.clear_flag(MOVED);
                Err(crate::zswap::StoreError::Io)
            }
            other => other,
        };
        match result {
            Ok(range) => {
                let clock = shared.evictions.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
                region.evicted_at[v.folio].store(clock, Ordering::Relaxed);
                shared.resident.fetch_sub(fs, Ordering::AcqRel);
                if f.load() & DROPPED != 0 {
                    // The program dropped or moved it meanwhile.
                    shared.store.invalidate(range);
                    f.set(UNTOUCHED);
                } else {
                    f.set(folio::swapped(range.first));
                }
                shared.counters.evicted_folios.fetch_add(1, Ordering::Relaxed);
                progress = true;
                // Writers held on the write protection refault and load it.
                let _ = shared.uffd.wake(start, fs);
            }
            Err(_) => {
                if was_protected {
                    // Lifting the protection wakes the writers held on it.
                    let _ = shared.uffd.write_protect(start, fs, false, &mut std::thread::yield_now);
                } else {
                    let _ = shared.uffd.wake(start, fs);
                }
                let dropped = f.load() & DROPPED != 0;
                f.set(if dropped { GONE } else { RESIDENT });
                if dropped {
                    shared.resident.fetch_sub(fs, Ordering::AcqRel);
                } else {
                    shared.fifo.lock().expect("fifo lock").push_back(FolioRef {
                        region: region.id,
                        folio: v.folio as u32,
                    });
                }
                shared.counters.eviction_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    shared.reclaim_stuck.store(!progress, Ordering::Release);
    shared.reclaimed.1.notify_all();
}

/// Reads the plugged folios into `staging` with one `process_vm_readv`.
fn copy_out(plug: &[Victim], staging: &mut [u8]) -> bool {
    let mut local = Vec::with_capacity(plug.len());
    let mut remote = Vec::with_capacity(plug.len());
    let mut at = 0;
    for v in plug {
        let fs = v.region.folio_size;
        local.push(libc::iovec {
            iov_base: staging[at..].as_mut_ptr().cast(),
            iov_len: fs,
        });
        remote.push(libc::iovec {
            iov_base: v.region.folio_addr(v.folio) as *mut _,
            iov_len: fs,
        });
        at += fs;
    }
    let mut done = 0usize;
    let total = staging.len();
    // Long plugs may exceed IOV_MAX: copy in groups.
    for (l, r) in local.chunks(512).zip(remote.chunks(512)) {
        // SAFETY: the local iovecs cover `staging`; the remote ones name
        // this process's memory, which the kernel checks (an unmapped range
        // is an error, not a fault).
        let n = unsafe {
            libc::process_vm_readv(libc::getpid(), l.as_ptr(), l.len() as _, r.as_ptr(), r.len() as _, 0)
        };
        if n < 0 {
            return false;
        }
        done += n as usize;
    }
    done == total
}

/// On shutdown: leave plugged folios resident (they are not protected
/// until a flush).
fn release_plug(plug: &mut Vec<Victim>) {
    for v in plug.drain(..) {
        v.region.folios[v.folio].set(RESIDENT);
    }
}

//! The runtime's own counters (the store's are in [`crate::zswap::ZswapStats`]),
//! each documented once, here.

use crate::zswap::ZswapStats;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What is there now rather than what happened, read for a snapshot (each
/// documented in [`RuntimeStats`]).
pub(crate) struct Gauges {
    pub resident_bytes: u64,
    pub unfit_bytes: u64,
    pub evicting_folios: u64,
    pub children: u64,
    pub regions: u64,
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub $name: AtomicU64,)*
        }

        /// A snapshot of the runtime's counters.
        #[derive(Debug, Clone, Default)]
        pub struct RuntimeStats {
            /// The store's counters (zswpout, zswpin, pswpout, ...).
            pub store: ZswapStats,
            $($(#[$doc])* pub $name: u64,)*
            /// Managed memory of the runtime's own process resident now.
            pub resident_bytes: u64,
            /// The part of `resident_bytes` that would not compress, with
            /// no swap file to hold it raw (`folio::UNFIT`).
            pub unfit_bytes: u64,
            /// Folios the reclaimer has taken for eviction and not yet
            /// finished with: waiting in a plug or in a flush now.
            pub evicting_folios: u64,
            /// Forked address spaces being served now.
            pub children: u64,
            /// Regions tracked now, in every address space served: one per
            /// managed range, forgotten once the program has unmapped or
            /// moved away all of it.
            pub regions: u64,
        }

        impl Counters {
            pub fn snapshot(&self, store: ZswapStats, gauges: Gauges) -> RuntimeStats {
                RuntimeStats {
                    store,
                    $($name: self.$name.load(Relaxed),)*
                    resident_bytes: gauges.resident_bytes,
                    unfit_bytes: gauges.unfit_bytes,
                    evicting_folios: gauges.evicting_folios,
                    children: gauges.children,
                    regions: gauges.regions,
                }
            }
        }

        impl RuntimeStats {
            /// Every counter as (name, value), the store's first.
            pub fn named(&self) -> Vec<(String, u64)> {
                let mut v = self.store.named();
                $(v.push((stringify!($name).to_string(), self.$name));)*
                v.push(("resident_bytes".to_string(), self.resident_bytes));
                v.push(("unfit_bytes".to_string(), self.unfit_bytes));
                v.push(("evicting_folios".to_string(), self.evicting_folios));
                v.push(("children".to_string(), self.children));
                v.push(("regions".to_string(), self.regions));
                v
            }
        }
    };
}

counters! {
    /// Folios brought back from the store or the swap file (major faults).
    pgmajfault,
    /// Page-fault events received, from every address space.
    faults,
    /// Folios filled with zero pages for a first touch, those filled
    /// ahead of it included.
    zero_fills,
    /// First touches that filled the untouched folios after theirs with
    /// zeros too (`RuntimeConfig::zero_fill_ahead`): a program going through
    /// new memory in order.
    zero_fills_ahead,
    /// Faults in registered memory that no region tracks (grown in place
    /// by mremap, moved out of a region, the ends of a managed mapping),
    /// served with one zero page each: memory not yet managed.
    untracked_faults,
    /// Writes that met a folio being evicted and waited.
    wp_faults,
    /// Faults whose folio the event thread handed to a filler to bring in
    /// (`RuntimeConfig::handoff_pages`), so that it could read the next
    /// fault meanwhile.
    swapins_handed_off,
    /// Pages brought in ahead of a fault (page_cluster).
    swap_ra,
    /// Faults that waited for reclaim because memory was over the limit.
    throttled,
    /// Folios evicted.
    evicted_folios,
    /// Folios the store refused (they stayed resident).
    eviction_refused,
    /// Pages of stored folios discarded by moving them out (no event; see
    /// `mm/scratch.rs`).
    discarded_by_move,
    /// Pages of stored folios dropped in place (MADV_DONTNEED, which raises
    /// a REMOVE event): where nothing moves (moves turned off, a kernel
    /// without UFFDIO_MOVE, a scratch that cannot be emptied, an agent
    /// gone), or a move failed otherwise than by refusing the memory.
    discarded_in_place,
    /// Pages of stored folios that stayed in memory because their move out
    /// stopped at a page shared with another process (a forked child, KSM)
    /// or pinned: dropped, it would not be freed while the other process
    /// keeps it. The folios stay resident and are tried again later.
    discard_refused_shared,
    /// Pages of stored folios that stayed in memory because what their
    /// move out took differed from the copy stored of them: written
    /// without a write-protect fault, by a device while they were pinned
    /// (an O_DIRECT read into them). Moved back at once; the folios stay
    /// resident and are tried again later.
    discard_refused_changed,
    /// Moves out whose pages differed from their copy and could not all go
    /// back (an event of the program came in right after the move): the
    /// pages not back had no copy anywhere, and their folios were poisoned
    /// (touch = SIGBUS). Expected 0.
    stale_moves,
    /// Folios held out of the reclaim queue because their process was
    /// found stopped (SIGSTOP, job control, a debugger): its agent answers
    /// only once the process runs again, and reclaim for every process
    /// would wait as long. They go back to the queue's front when it runs.
    stopped_folios_held,
    /// Runs of an eviction whose move or drop was not asked because their
    /// process was found stopped right before: they stay in memory.
    stopped_runs_left,
    /// Discards (moves out, drops in place) that took the reclaimer
    /// `DISCARD_STALL_MS` or longer: another process's agent answers only
    /// while its process runs, and one that stopped after the reclaimer
    /// looked holds it until continued. Meanwhile faults do not wait for
    /// room, and memory may pass the limit.
    slow_discards,
    /// Times the reclaimer passed over a folio the program had dropped
    /// pages of, in its grace (`drop_grace`): the kernel may not have
    /// zapped them yet (`folio::DROPPED`).
    drop_grace_waits,
    /// Times a space's events, held while the reclaimer's drop in place
    /// was in flight, were read again because the hold reached its bound
    /// with the drop still in flight (`fault.rs`, `HOLD_MAX_MS`): the
    /// window the hold closes was open again.
    event_holds_expired,
    /// Drops in place not made because the check right before the madvise
    /// found an event of the process unread, or the range no longer wholly
    /// registered (a part unmapped, new memory mapped there): looked at
    /// again, and the folios stay where it changed.
    drop_in_place_changed,
    /// Drops (MADV_DONTNEED) of stored folios that failed: the folios
    /// stayed resident and their stored copies were freed.
    eviction_drop_failed,
    /// Folios the store refused because their pages do not compress, with
    /// no swap file to hold them raw: left resident, write-protected and
    /// out of the reclaim queue until written (`folio::UNFIT`).
    unfit_folios,
    /// Folios left out of reclaim because their memory is locked (mlock)
    /// and nothing moves: the drop in place was refused. They stay
    /// resident and counted.
    unevictable_folios,
    /// Folios the kernel would not move out (read-only or locked memory,
    /// or memory also executable or of a protection key: unlike the
    /// scratch): left resident, write-protected and out of the reclaim
    /// queue until written (`folio::UNFIT`), rather than dropped in place
    /// (see `mm/reclaim.rs`).
    unmovable_folios,
    /// Plugs flushed to the store.
    reclaim_batches,
    /// Times the reclaimer backed off because the store refused a plug for
    /// want of room (pool full and no swap file), or a whole queue's worth of
    /// folios in a row would not compress: it waits instead of
    /// recompressing the same folios.
    reclaim_backoffs,
    /// Refaulted folios given a second pass (short refault distance).
    refaults_activated,
    /// Folios whose stored data was unusable: their missing pages were
    /// poisoned, and a touch raises SIGBUS.
    sigbus,
    /// Fork events: child address spaces taken into service.
    forks,
    /// Forks whose child was copied while a drop (MADV_DONTNEED) of its
    /// parent's was told but not yet done: the child got the old bytes of
    /// the dropped swapped pages, as it has those of the resident ones
    /// (one per fork, however many drops).
    forks_before_a_zap,
    /// Ranges of managed memory a fork gave its child other than as they
    /// were: empty (MADV_WIPEONFORK) or not at all (MADV_DONTFORK), which
    /// the child's view then holds as zeros or as unmapped.
    fork_advice_ranges,
    /// Served address spaces (forked children, attached processes) found
    /// gone (exit or exec) and released.
    children_exited,
    /// Folios a program dropped, unmapped or moved only in part.
    partial_folio_events,
    /// Installs that had to go page by page because the folio spans more
    /// than one mapping (mprotect, mlock, partial munmap split it).
    split_installs,
    /// Folios brought back for a read that kept their stored copy (CLEAN).
    clean_installs,
    /// CLEAN folios evicted again by a discard alone, with no compression.
    clean_evictions,
    /// CLEAN folios whose copy was dropped: written to, a page went
    /// missing, or the program dropped, unmapped, moved or forked them.
    clean_dropped,
    /// CLEAN folios taken for eviction with a page missing or not
    /// write-protected, with the process alive and no change of its
    /// mappings in flight to explain it: their copy may not hold what they
    /// hold, so it was dropped and they were stored anew. Expected to stay
    /// 0; anything else is a lost protection or a zap nothing told, caught
    /// before it lost a write.
    clean_unverified,
}

//! Counters with the kernel's names (/proc/vmstat and zswap's debugfs), in
//! total and per folio size.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Folio orders 0..=9: 4 KiB .. 2 MiB.
pub const SIZE_ORDERS: usize = 10;

/// The kernel's label for a folio order: `4kB`, `64kB`, `2048kB`.
pub fn size_label(order: usize) -> String {
    format!("{}kB", 4usize << order)
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub $name: AtomicU64,)*
            pub zswpout_by_order: [AtomicU64; SIZE_ORDERS],
            pub swpout_fallback_by_order: [AtomicU64; SIZE_ORDERS],
        }

        /// A snapshot of the store's counters.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct ZswapStats {
            $($(#[$doc])* pub $name: u64,)*
            /// Folios stored, by order (the kernel's per-size `zswpout`).
            pub zswpout_by_order: [u64; SIZE_ORDERS],
            /// Folios that found no contiguous slot run, by order.
            pub swpout_fallback_by_order: [u64; SIZE_ORDERS],
            /// Bytes of pages the pool holds.
            pub pool_total_size: u64,
            /// Bytes of empty zspages the pool keeps resident for reuse
            /// rather than returning each to the OS (at most 2 MiB).
            pub pool_kept_size: u64,
            /// Pages currently stored in the pool (compressed or raw).
            pub stored_pages: u64,
            /// Pages currently stored raw in the pool because they did not shrink.
            pub stored_incompressible_pages: u64,
            /// Bytes of the objects currently in the pool.
            pub stored_bytes: u64,
        }

        impl Counters {
            pub fn snapshot(&self) -> ZswapStats {
                ZswapStats {
                    $($name: self.$name.load(Relaxed),)*
                    zswpout_by_order: std::array::from_fn(|i| self.zswpout_by_order[i].load(Relaxed)),
                    swpout_fallback_by_order: std::array::from_fn(|i| self.swpout_fallback_by_order[i].load(Relaxed)),
                    pool_total_size: 0,
                    pool_kept_size: 0,
                    stored_pages: 0,
                    stored_incompressible_pages: 0,
                    stored_bytes: 0,
                }
            }
        }

        impl ZswapStats {
            /// Every counter as (name, value), in the kernel's spelling.
            pub fn named(&self) -> Vec<(String, u64)> {
                let mut v: Vec<(String, u64)> = vec![$((stringify!($name).to_string(), self.$name),)*];
                v.push(("pool_total_size".into(), self.pool_total_size));
                v.push(("pool_kept_size".into(), self.pool_kept_size));
                v.push(("stored_pages".into(), self.stored_pages));
                v.push(("stored_incompressible_pages".into(), self.stored_incompressible_pages));
                v.push(("stored_bytes".into(), self.stored_bytes));
                for order in 0..SIZE_ORDERS {
                    v.push((format!("zswpout_{}", size_label(order)), self.zswpout_by_order[order]));
                }
                for order in 0..SIZE_ORDERS {
                    v.push((format!("swpout_fallback_{}", size_label(order)), self.swpout_fallback_by_order[order]));
                }
                v
            }
        }
    };
}

counters! {
    /// Pages stored in the pool (compressed, or raw when they did not shrink).
    zswpout,
    /// Pages loaded from the pool.
    zswpin,
    /// Pages written back from the pool to the swap file.
    zswpwb,
    /// Pages written to the swap file (directly, or by writeback).
    pswpout,
    /// Pages read from the swap file.
    pswpin,
    /// Same-filled pages recorded without compression or pool space.
    swpout_zero,
    /// Same-filled pages restored on load.
    swpin_zero,
    /// Stores refused because the pool was at its limit.
    pool_limit_hit,
    /// Pages that did not shrink and were refused with their folio (no swap
    /// file, and the folio would not save a page with them kept raw).
    reject_compress_poor,
    /// Pages whose compression failed.
    reject_compress_fail,
    /// Pages for which the pool could not allocate.
    reject_alloc_fail,
    /// Loads of an object that failed its checksum or did not decompress.
    decompress_fail,
    /// Pages moved from the pool to the swap file by writeback (debugfs name).
    written_back_pages,
    /// Folios stored as one compressed object (`Layout::Folio`); their
    /// pages count in `zswpout` too.
    folio_objects_stored,
    /// Folios that would not have saved a page as one object and were
    /// stored page by page instead.
    folio_object_fallback,
    /// Writes to the swap file that failed (ENOSPC, EIO, short writes).
    swap_write_errors,
    /// Reads from the swap file that failed.
    swap_read_errors,
}

impl ZswapStats {
    /// The counters in /proc/vmstat's "name value" format, one per line.
    pub fn vmstat(&self) -> String {
        let mut out = String::new();
        for (name, value) in self.named() {
            let _ = writeln!(out, "{name} {value}");
        }
        out
    }
}

pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

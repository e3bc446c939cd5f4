//! Where the pool's pages come from: large anonymous mappings of our own,
//! carved into zspages. An empty zspage's pages are kept, still resident,
//! for the next zspage of the same length; when the kept ones add up to more
//! than [`KEPT_PAGES`], half of them go back to the OS together
//! (`MADV_DONTNEED`) and only their address ranges are kept.
//!
//! Why keep any: in a steady swap-in/swap-out stream the pool frees and
//! allocates zspages all the time, and every `MADV_DONTNEED` in a
//! multi-threaded process flushes the TLB of every CPU that runs one of its
//! threads (an interrupt to each), after which the next zspage faults its
//! pages in again, zeroed. The kernel's zsmalloc hands a freed zspage to the
//! page allocator at no such cost. Measured with `perf record -e
//! syscalls:sys_enter_madvise` on `uswap usemem 1536M -n 2 --memory-high 1G
//! --compressor lzo-rle`: about 230,000 two-page releases, and 12% of all
//! cycles in the TLB shootdowns they caused. Of those, 131,000 were zspages
//! allocated again soon after (kept now: no release, no page fault), and
//! most of the rest came when the pool emptied at the end (released by the
//! range now).

use std::ptr::NonNull;
use std::sync::Mutex;

use super::{MAX_PAGES_PER_ZSPAGE, PAGE_SIZE};

/// Each mapping the pool makes.
const EXTENT_SIZE: usize = 2 << 20;
/// Pages of empty zspages kept resident for reuse (2 MiB).
pub(crate) const KEPT_PAGES: usize = 512;

struct Extent {
    base: NonNull<u8>,
    len: usize,
}

struct Inner {
    extents: Vec<Extent>,
    /// Empty zspages whose pages are still resident, by length in pages.
    kept: [Vec<NonNull<u8>>; MAX_PAGES_PER_ZSPAGE + 1],
    /// Pages in `kept`.
    kept_pages: usize,
    /// Released zspage address ranges, by length in pages.
    free: [Vec<NonNull<u8>>; MAX_PAGES_PER_ZSPAGE + 1],
    /// The unused tail of the newest extent.
    bump: Option<(NonNull<u8>, usize)>,
}

/// A source of page-aligned, zero-filled runs of 1..=8 pages.
pub(crate) struct PageSource {
    inner: Mutex<Inner>,
}

// SAFETY: the raw pointers name memory this struct owns (its mappings); all
// access to the bookkeeping goes through the mutex.
unsafe impl Send for PageSource {}
// SAFETY: as above.
unsafe impl Sync for PageSource {}

impl PageSource {
    pub fn new() -> PageSource {
        PageSource {
            inner: Mutex::new(Inner {
                extents: Vec::new(),
                kept: Default::default(),
                kept_pages: 0,
                free: Default::default(),
                bump: None,
            }),
        }
    }

    /// A run of `pages` pages (its contents undefined), or `None` if the OS
    /// refuses memory.
    pub fn alloc(&self, pages: usize) -> Option<NonNull<u8>> {
        debug_assert!((1..=MAX_PAGES_PER_ZSPAGE).contains(&pages));
        let mut inner = self.inner.lock().expect("page source lock");
        if let Some(run) = inner.kept[pages].pop() {
            inner.kept_pages -= pages;
            return Some(run);
        }
        if let Some(run) = inner.free[pages].pop() {
            return Some(run);
        }
        let bytes = pages * PAGE_SIZE;
        match inner.bump {
            Some((next, left)) if left >= bytes => {
                // SAFETY: `next + bytes` stays inside the extent (left >= bytes).
                let after = unsafe { NonNull::new_unchecked(next.as_ptr().add(bytes)) };
                inner.bump = Some((after, left - bytes));
                Some(next)
            }
            _ => {
                let base = crate::sys::map_anonymous(EXTENT_SIZE).ok()?;
                inner.extents.push(Extent {
                    base,
                    len: EXTENT_SIZE,
                });
                // SAFETY: bytes <= 8 pages < EXTENT_SIZE.
                let after = unsafe { NonNull::new_unchecked(base.as_ptr().add(bytes)) };
                inner.bump = Some((after, EXTENT_SIZE - bytes));
                Some(base)
            }
        }
    }

    /// Takes back a run nobody uses any more, kept resident. Once the kept
    /// pages pass [`KEPT_PAGES`], half of them go back to the OS at once,
    /// lowest addresses first and neighbours in one `MADV_DONTNEED`, so that
    /// a pool that shrinks (or is torn down) flushes the TLB once per range
    /// rather than once per zspage.
    pub fn free(&self, run: NonNull<u8>, pages: usize) {
        let mut release: Vec<(usize, usize)> = {
            let mut inner = self.inner.lock().expect("page source lock");
            inner.kept_pages += pages;
            inner.kept[pages].push(run);
            if inner.kept_pages <= KEPT_PAGES {
                return;
            }
            let mut all: Vec<(usize, usize)> = Vec::new();
            for (len, runs) in inner.kept.iter_mut().enumerate() {
                all.extend(runs.drain(..).map(|r| (r.as_ptr() as usize, len)));
            }
            all.sort_unstable();
            // The lowest runs go; the rest stay kept.
            let mut gone = 0;
            let split = all
                .iter()
                .position(|&(_, len)| {
                    gone += len;
                    gone > KEPT_PAGES / 2
                })
                .unwrap_or(all.len());
            for &(addr, len) in &all[split..] {
                inner.kept[len].push(NonNull::new(addr as *mut u8).expect("a run is not null"));
            }
            inner.kept_pages = all[split..].iter().map(|&(_, len)| len).sum();
            all.truncate(split);
            all
        };
        let mut at = 0;
        while at < release.len() {
            let (start, _) = release[at];
            let mut end = at;
            let mut bytes = 0;
            while end < release.len() && release[end].0 == start + bytes {
                bytes += release[end].1 * PAGE_SIZE;
                end += 1;
            }
            // SAFETY: each run came from `alloc`, so [start, start + bytes)
            // is mapped, page-aligned memory of ours (neighbouring runs of
            // one extent) that nobody uses any more.
            let released =
                unsafe { libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_DONTNEED) };
            if released != 0 {
                // Still resident: keep these runs rather than lose them.
                let mut inner = self.inner.lock().expect("page source lock");
                for &(addr, len) in &release[at..end] {
                    inner.kept_pages += len;
                    inner.kept[len].push(NonNull::new(addr as *mut u8).expect("a run is not null"));
                }
                release.drain(at..end);
                continue;
            }
            at = end;
        }
        let mut inner = self.inner.lock().expect("page source lock");
        for (addr, len) in release {
            inner.free[len].push(NonNull::new(addr as *mut u8).expect("a run is not null"));
        }
    }

    /// Bytes of empty zspages kept resident.
    pub fn kept_bytes(&self) -> usize {
        self.inner.lock().expect("page source lock").kept_pages * PAGE_SIZE
    }
}

impl Drop for PageSource {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().expect("page source lock");
        for e in inner.extents.drain(..) {
            // SAFETY: each extent is a mapping made by `map` and unmapped once.
            unsafe {
                libc::munmap(e.base.as_ptr().cast(), e.len);
            }
        }
    }
}

//! Where the pool's pages come from: large anonymous mappings of our own,
//! carved into zspages; an empty zspage's pages go back to the OS
//! (`MADV_DONTNEED`) and its address range is kept for the next zspage of the
//! same length.

use std::ptr::NonNull;
use std::sync::Mutex;

use super::{MAX_PAGES_PER_ZSPAGE, PAGE_SIZE};

/// Each mapping the pool makes.
const EXTENT_SIZE: usize = 2 << 20;

struct Extent {
    base: NonNull<u8>,
    len: usize,
}

struct Inner {
    extents: Vec<Extent>,
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
                free: Default::default(),
                bump: None,
            }),
        }
    }

    /// A run of `pages` pages, or `None` if the OS refuses memory.
    pub fn alloc(&self, pages: usize) -> Option<NonNull<u8>> {
        debug_assert!((1..=MAX_PAGES_PER_ZSPAGE).contains(&pages));
        let mut inner = self.inner.lock().expect("page source lock");
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

    /// Gives a run's memory back to the OS and keeps its address range.
    pub fn free(&self, run: NonNull<u8>, pages: usize) {
        // SAFETY: `run` came from `alloc(pages)`, so it is a mapped, page-
        // aligned range of `pages` pages that nobody uses any more.
        unsafe {
            libc::madvise(run.as_ptr().cast(), pages * PAGE_SIZE, libc::MADV_DONTNEED);
        }
        self.inner.lock().expect("page source lock").free[pages].push(run);
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

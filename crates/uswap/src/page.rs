//! The page: the unit every layer counts in.

/// Bytes per page (the base page of x86-64 and of the kernel's swap).
pub const PAGE_SIZE: usize = 4096;

/// The largest folio: 512 pages (2 MiB).
pub const MAX_FOLIO_PAGES: usize = 512;

/// The page-aligned address at or below `addr`.
pub fn page_floor(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

/// A set of page indices within one folio (0..512).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageMask([u64; MAX_FOLIO_PAGES / 64]);

impl PageMask {
    /// Adds pages `lo..hi`.
    pub fn insert_range(&mut self, lo: usize, hi: usize) {
        for p in lo..hi.min(MAX_FOLIO_PAGES) {
            self.0[p / 64] |= 1 << (p % 64);
        }
    }

    /// Whether page `p` is in the set.
    pub fn contains(&self, p: usize) -> bool {
        p < MAX_FOLIO_PAGES && self.0[p / 64] & (1 << (p % 64)) != 0
    }

    /// Whether every page of `0..pages` is in the set.
    pub fn covers(&self, pages: usize) -> bool {
        (0..pages).all(|p| self.contains(p))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// Takes out every page of `other`.
    pub fn remove(&mut self, other: &PageMask) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a &= !b;
        }
    }

    /// Adds every page of `other`.
    pub fn union(&mut self, other: &PageMask) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }
}

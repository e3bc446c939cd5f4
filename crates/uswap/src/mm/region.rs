//! Regions: ranges of memory the runtime manages, folio by folio.

use super::folio::{self, Folio};
use super::Shared;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// The runtime's view of one managed range.
pub(crate) struct RegionInner {
    pub id: u32,
    /// Start address; changes when the program moves the range (mremap).
    pub base: AtomicUsize,
    pub len: usize,
    pub folio_size: usize,
    pub folios: Box<[Folio]>,
    /// The workingset clock at each folio's last eviction.
    pub evicted_at: Box<[AtomicU32]>,
    /// Whether the runtime mapped the memory (and unmaps it on drop).
    pub owned: bool,
}

impl RegionInner {
    pub fn new(id: u32, base: usize, len: usize, folio_size: usize, initial: u64, owned: bool) -> RegionInner {
        let n = len / folio_size;
        RegionInner {
            id,
            base: AtomicUsize::new(base),
            len,
            folio_size,
            folios: (0..n).map(|_| Folio::new(initial)).collect(),
            evicted_at: (0..n).map(|_| AtomicU32::new(0)).collect(),
            owned,
        }
    }

    pub fn base(&self) -> usize {
        self.base.load(Ordering::Acquire)
    }

    pub fn contains(&self, addr: usize) -> bool {
        let base = self.base();
        addr >= base && addr < base + self.len
    }

    /// Start address of folio `i`.
    pub fn folio_addr(&self, i: usize) -> usize {
        self.base() + i * self.folio_size
    }

    /// The folio holding `addr`.
    pub fn folio_of(&self, addr: usize) -> usize {
        (addr - self.base()) / self.folio_size
    }

    pub fn pages_per_folio(&self) -> u32 {
        (self.folio_size / super::PAGE_SIZE) as u32
    }

    /// The store's slot range of a swapped folio word.
    pub fn slots_of(&self, word: u64) -> crate::zswap::SlotRange {
        crate::zswap::SlotRange {
            first: folio::slot(word),
            pages: self.pages_per_folio(),
        }
    }
}

/// Memory managed by a [`super::Runtime`]: what does not fit under its limit
/// is compressed away and comes back on touch, transparently.
///
/// Any thread may read and write it (through [`Region::as_ptr`]); dropping
/// the region unmaps it and frees its slots. A region made with
/// [`super::Runtime::manage`] is instead returned to the caller intact: its
/// swapped folios are brought back and the range unregistered.
pub struct Region {
    pub(crate) shared: Arc<Shared>,
    pub(crate) inner: Arc<RegionInner>,
}

impl Region {
    /// The start of the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.base() as *mut u8
    }

    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The memory as a slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the range is mapped, readable and writable for `len` bytes
        // for as long as the region lives, and `&mut self` excludes other
        // borrows made through this handle.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.inner.len) }
    }

    /// The folio size the region is managed in.
    pub fn folio_size(&self) -> usize {
        self.inner.folio_size
    }

    /// The program moved the region (mremap): where it is now.
    pub fn current_base(&self) -> usize {
        self.inner.base()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.shared.drop_region(&self.inner);
        self.shared.release_user();
    }
}

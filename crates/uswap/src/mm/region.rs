//! The public handle of a managed range.

use super::space::RegionInner;
use super::Shared;
use std::sync::Arc;

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
    /// The start of the memory (where it is now, if the program moved it
    /// whole with mremap).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.base() as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether it has no bytes (never: regions hold at least one folio).
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

//! `zpool`: a compressed-object allocator on the model of the kernel's
//! zsmalloc.
//!
//! Objects of 1..=4096 bytes are packed into *zspages* (runs of 1..=8 pages)
//! by size class ([`class`]); a [`Handle`] names an object and stays valid
//! when [`Pool::compact`] moves objects out of sparse zspages into dense
//! ones (`handle`). Pages come from large mappings of our own, and an
//! empty zspage's pages go back to the OS at once (`pages`).
//!
//! Per-object metadata, outside the pages, is the handle's 8-byte location
//! word; each zspage adds a 16-byte record. As in zsmalloc, the free slots
//! of a zspage are chained through the free slots themselves, and
//! compaction finds a zspage's objects through the handle table rather than
//! through a back pointer per object.

pub mod class;
mod handle;
mod pages;

pub use class::ClassShape;
pub use handle::Handle;

use handle::{HandleTable, Location};
use pages::PageSource;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Bytes per page.
pub use crate::page::PAGE_SIZE;
/// The longest zspage, in pages.
pub const MAX_PAGES_PER_ZSPAGE: usize = 8;
/// The largest object.
pub const MAX_OBJECT: usize = class::MAX_SIZE;

/// End of a zspage's free-slot chain.
const NO_SLOT: u16 = u16::MAX;

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// Zero bytes or more than [`MAX_OBJECT`].
    BadSize,
    /// The OS gave no memory (or a test injected the failure).
    NoMemory,
}

/// One zspage: a run of pages cut into equal slots. Each free slot's first
/// two bytes hold the next free slot.
struct ZsPage {
    base: NonNull<u8>,
    used: u16,
    free_head: u16,
    /// Position in the class's `partial` list, or `u32::MAX`.
    partial_at: u32,
}

const UNLISTED: u32 = u32::MAX;

/// One size class and its zspages.
struct Class {
    shape: ClassShape,
    zspages: Vec<Option<ZsPage>>,
    free_ids: Vec<u32>,
    /// Zspages with at least one free slot.
    partial: Vec<u32>,
    objects: usize,
}

impl Class {
    fn zspage(&mut self, id: u32) -> &mut ZsPage {
        self.zspages[id as usize]
            .as_mut()
            .expect("a live zspage id")
    }

    fn list_partial(&mut self, id: u32) {
        let at = self.partial.len() as u32;
        let zs = self.zspage(id);
        if zs.partial_at == UNLISTED {
            zs.partial_at = at;
            self.partial.push(id);
        }
    }

    fn unlist_partial(&mut self, id: u32) {
        let at = std::mem::replace(&mut self.zspage(id).partial_at, UNLISTED);
        if at == UNLISTED {
            return;
        }
        self.partial.swap_remove(at as usize);
        if let Some(&moved) = self.partial.get(at as usize) {
            self.zspage(moved).partial_at = at;
        }
    }

    fn slot_ptr(&self, zspage: u32, slot: u16) -> *mut u8 {
        let zs = self.zspages[zspage as usize]
            .as_ref()
            .expect("a live zspage id");
        // SAFETY: slot < objs_per_zspage, so the offset stays inside the
        // zspage's pages.
        unsafe { zs.base.as_ptr().add(slot as usize * self.shape.size) }
    }

    /// Takes a free slot of a zspage off its chain.
    fn pop_free(&mut self, id: u32) -> u16 {
        let slot = self.zspage(id).free_head;
        assert_ne!(slot, NO_SLOT, "a listed zspage has a free slot");
        let ptr = self.slot_ptr(id, slot);
        // SAFETY: a free slot is at least 32 bytes inside a live zspage of
        // this (locked) class; its first two bytes are the chain link.
        let next = unsafe { ptr.cast::<u16>().read_unaligned() };
        let zs = self.zspage(id);
        zs.free_head = next;
        zs.used += 1;
        slot
    }

    /// Puts a slot back on its zspage's chain.
    fn push_free(&mut self, id: u32, slot: u16) {
        let head = self.zspage(id).free_head;
        let ptr = self.slot_ptr(id, slot);
        // SAFETY: as in `pop_free`; the slot no longer holds an object.
        unsafe { ptr.cast::<u16>().write_unaligned(head) };
        let zs = self.zspage(id);
        zs.free_head = slot;
        zs.used -= 1;
    }

    fn is_full(&self, id: u32) -> bool {
        self.zspages[id as usize]
            .as_ref()
            .expect("a live zspage id")
            .used as usize
            == self.shape.objs_per_zspage
    }

    fn metadata_bytes(&self) -> usize {
        self.zspages.capacity() * std::mem::size_of::<Option<ZsPage>>()
            + (self.free_ids.capacity() + self.partial.capacity()) * 4
    }
}

/// Statistics of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassStats {
    /// Object slot size in bytes: every object in the class takes this
    /// much, whatever its length.
    pub size: usize,
    /// Pages chained into one zspage.
    pub pages_per_zspage: usize,
    /// Objects one zspage holds.
    pub objs_per_zspage: usize,
    /// Object slots in this class's zspages.
    pub objs_allocated: usize,
    /// Slots holding an object.
    pub objs_used: usize,
    /// Zspages the class holds now.
    pub zspages: usize,
    /// Pages those zspages take (`zspages * pages_per_zspage`).
    pub pages_used: usize,
}

/// The compressed-object pool.
pub struct Pool {
    classes: Vec<Mutex<Class>>,
    step_to_class: Vec<u8>,
    handles: HandleTable,
    pages: PageSource,
    pages_used: AtomicUsize,
    fail_next_allocs: AtomicU32,
}

// SAFETY: zspage pointers name memory owned by `pages`; every access to a
// zspage goes through its class's mutex.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Default for Pool {
    fn default() -> Self {
        Pool::new()
    }
}

impl Pool {
    /// An empty pool: it takes pages from the OS only as objects arrive.
    pub fn new() -> Pool {
        let (shapes, step_to_class) = class::build();
        Pool {
            classes: shapes
                .into_iter()
                .map(|shape| {
                    Mutex::new(Class {
                        shape,
                        zspages: Vec::new(),
                        free_ids: Vec::new(),
                        partial: Vec::new(),
                        objects: 0,
                    })
                })
                .collect(),
            step_to_class,
            handles: HandleTable::new(),
            pages: PageSource::new(),
            pages_used: AtomicUsize::new(0),
            fail_next_allocs: AtomicU32::new(0),
        }
    }

    /// The class an object of `len` bytes goes to.
    fn class_of(&self, len: usize) -> usize {
        self.step_to_class[class::step_of(len)] as usize
    }

    /// Allocates room for an object of `len` bytes.
    pub fn alloc(&self, len: usize) -> Result<Handle, AllocError> {
        if len == 0 || len > MAX_OBJECT {
            return Err(AllocError::BadSize);
        }
        let injected = self
            .fail_next_allocs
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if injected {
            return Err(AllocError::NoMemory);
        }
        let class_index = self.class_of(len);
        let mut class = self.classes[class_index].lock().expect("class lock");
        let id = match class.partial.last() {
            Some(&id) => id,
            None => self.new_zspage(&mut class)?,
        };
        let slot = class.pop_free(id);
        let loc = Location {
            class: class_index as u8,
            zspage: id,
            slot,
        };
        let Some(handle) = self.handles.alloc(loc) else {
            class.push_free(id, slot);
            return Err(AllocError::NoMemory);
        };
        if class.is_full(id) {
            class.unlist_partial(id);
        }
        class.objects += 1;
        Ok(handle)
    }

    fn new_zspage(&self, class: &mut Class) -> Result<u32, AllocError> {
        let shape = class.shape;
        let base = self
            .pages
            .alloc(shape.pages_per_zspage)
            .ok_or(AllocError::NoMemory)?;
        self.pages_used
            .fetch_add(shape.pages_per_zspage, Ordering::Relaxed);
        // Chain every slot onto the free list: slot i points at slot i + 1.
        let objs = shape.objs_per_zspage;
        for slot in 0..objs {
            let next = if slot + 1 < objs {
                (slot + 1) as u16
            } else {
                NO_SLOT
            };
            // SAFETY: the slot lies inside the fresh run of pages.
            unsafe {
                base.as_ptr()
                    .add(slot * shape.size)
                    .cast::<u16>()
                    .write_unaligned(next)
            };
        }
        let zs = ZsPage {
            base,
            used: 0,
            free_head: 0,
            partial_at: UNLISTED,
        };
        let id = match class.free_ids.pop() {
            Some(id) => {
                class.zspages[id as usize] = Some(zs);
                id
            }
            None => {
                class.zspages.push(Some(zs));
                (class.zspages.len() - 1) as u32
            }
        };
        class.list_partial(id);
        Ok(id)
    }

    /// Runs `f` on the object's slot (its class size in bytes) with the
    /// object pinned in place.
    fn with_slot<R>(&self, h: Handle, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let class_index = self.handles.get(h).class as usize;
        let class = self.classes[class_index].lock().expect("class lock");
        // Re-read under the lock: compaction may have moved the object (but
        // never to another class).
        let loc = self.handles.get(h);
        let ptr = class.slot_ptr(loc.zspage, loc.slot);
        // SAFETY: the slot is `size` bytes inside a live zspage, owned by
        // this handle; the class lock keeps it from moving or being freed.
        let slot = unsafe { std::slice::from_raw_parts_mut(ptr, class.shape.size) };
        f(slot)
    }

    /// Writes `data` at the start of the object.
    pub fn write(&self, h: Handle, data: &[u8]) {
        self.with_slot(h, |slot| slot[..data.len()].copy_from_slice(data));
    }

    /// Copies the first `out.len()` bytes of the object into `out`.
    pub fn read(&self, h: Handle, out: &mut [u8]) {
        self.with_slot(h, |slot| out.copy_from_slice(&slot[..out.len()]));
    }

    /// Fault injection: flips a byte of the stored object at `offset`.
    #[cfg(feature = "fault-injection")]
    pub fn corrupt(&self, h: Handle, offset: usize) {
        self.with_slot(h, |slot| slot[offset] ^= 0x40);
    }

    /// Frees an object. Its handle must not be used again.
    pub fn free(&self, h: Handle) {
        let class_index = self.handles.get(h).class;
        let mut class = self.classes[class_index as usize]
            .lock()
            .expect("class lock");
        let loc = self.handles.get(h);
        let was_full = class.is_full(loc.zspage);
        class.push_free(loc.zspage, loc.slot);
        class.objects -= 1;
        // Under the class lock, so that compaction never sees a handle that
        // names a slot already on the free chain.
        self.handles.free(h);
        if class.zspage(loc.zspage).used == 0 {
            self.release_zspage(&mut class, loc.zspage);
        } else if was_full {
            class.list_partial(loc.zspage);
        }
    }

    fn release_zspage(&self, class: &mut Class, id: u32) {
        class.unlist_partial(id);
        let zs = class.zspages[id as usize].take().expect("a live zspage id");
        let pages = class.shape.pages_per_zspage;
        self.pages.free(zs.base, pages);
        self.pages_used.fetch_sub(pages, Ordering::Relaxed);
        class.free_ids.push(id);
    }

    /// Moves objects from the sparsest zspages of each class into the
    /// densest ones and releases the zspages that empties. Returns the
    /// number of pages freed.
    pub fn compact(&self) -> usize {
        let mut freed = 0;
        for (class_index, class) in self.classes.iter().enumerate() {
            let mut class = class.lock().expect("class lock");
            freed += self.compact_class(&mut class, class_index as u8);
        }
        freed
    }

    fn compact_class(&self, class: &mut Class, class_index: u8) -> usize {
        if class.partial.len() < 2 {
            return 0;
        }
        let objs = class.shape.objs_per_zspage;
        let size = class.shape.size;
        // The objects of every partly filled zspage, found in one scan.
        let mut live: HashMap<u32, Vec<(u16, Handle)>> = HashMap::new();
        self.handles.for_each_in_class(class_index, |h, loc| {
            if class.zspages[loc.zspage as usize]
                .as_ref()
                .is_some_and(|z| z.partial_at != UNLISTED)
            {
                live.entry(loc.zspage).or_default().push((loc.slot, h));
            }
        });
        let mut freed = 0;
        loop {
            if class.partial.len() < 2 {
                return freed;
            }
            let mut by_use: Vec<(u16, u32)> = class
                .partial
                .iter()
                .map(|&id| {
                    (
                        class.zspages[id as usize].as_ref().expect("listed").used,
                        id,
                    )
                })
                .collect();
            by_use.sort_unstable();
            let (src_used, src) = by_use[0];
            let room: usize = by_use[1..]
                .iter()
                .map(|&(used, _)| objs - used as usize)
                .sum();
            if room < src_used as usize {
                return freed;
            }
            // Empty the sparsest zspage into the fullest ones.
            let objects = live.remove(&src).unwrap_or_default();
            debug_assert_eq!(objects.len(), src_used as usize);
            let mut targets = by_use[1..].iter().rev().map(|&(_, id)| id);
            let mut dst = targets.next().expect("at least two partial zspages");
            for (from_slot, handle) in objects {
                while class.is_full(dst) {
                    dst = targets.next().expect("room was counted");
                }
                let to_slot = class.pop_free(dst);
                let from = class.slot_ptr(src, from_slot);
                let to = class.slot_ptr(dst, to_slot);
                // SAFETY: two distinct slots of `size` bytes in live
                // zspages of this locked class.
                unsafe { std::ptr::copy_nonoverlapping(from, to, size) };
                self.handles.set(
                    handle,
                    Location {
                        class: class_index,
                        zspage: dst,
                        slot: to_slot,
                    },
                );
                live.entry(dst).or_default().push((to_slot, handle));
                if class.is_full(dst) {
                    class.unlist_partial(dst);
                }
            }
            self.release_zspage(class, src);
            freed += class.shape.pages_per_zspage;
        }
    }

    /// Bytes of pages the pool holds (the kernel's `pool_total_size`).
    pub fn total_size(&self) -> usize {
        self.pages_used.load(Ordering::Relaxed) * PAGE_SIZE
    }

    /// Bytes of empty zspages kept resident for reuse, beside
    /// [`Pool::total_size`]: at most 2 MiB (see `pages`).
    pub fn kept_size(&self) -> usize {
        self.pages.kept_bytes()
    }

    /// Objects stored.
    pub fn objects(&self) -> usize {
        self.classes
            .iter()
            .map(|c| c.lock().expect("class lock").objects)
            .sum()
    }

    /// Per-class statistics, for classes that hold pages.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        self.classes
            .iter()
            .filter_map(|c| {
                let c = c.lock().expect("class lock");
                let zspages = c.zspages.iter().flatten().count();
                (zspages > 0).then(|| ClassStats {
                    size: c.shape.size,
                    pages_per_zspage: c.shape.pages_per_zspage,
                    objs_per_zspage: c.shape.objs_per_zspage,
                    objs_allocated: zspages * c.shape.objs_per_zspage,
                    objs_used: c.objects,
                    zspages,
                    pages_used: zspages * c.shape.pages_per_zspage,
                })
            })
            .collect()
    }

    /// Bytes of bookkeeping outside the pages (handle table, slot back
    /// pointers, free-slot stacks, zspage records).
    pub fn metadata_bytes(&self) -> usize {
        self.handles.metadata_bytes()
            + self
                .classes
                .iter()
                .map(|c| c.lock().expect("class lock").metadata_bytes())
                .sum::<usize>()
    }

    /// Fault injection: the next `count` allocations fail with `NoMemory`.
    pub fn fail_next_allocs(&self, count: u32) {
        self.fail_next_allocs.fetch_add(count, Ordering::Relaxed);
    }
}

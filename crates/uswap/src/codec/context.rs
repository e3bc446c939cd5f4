//! Per-thread codec contexts.
//!
//! Compressors need scratch state (hash tables, zstd and libdeflate contexts)
//! that is too large to build per call. Each codec instance gets a unique key;
//! each thread keeps one context per key, created on the first call on that
//! thread and reused afterwards, so a warmed-up call allocates nothing.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// More live codecs than this on one thread only costs re-creating contexts.
const MAX_CONTEXTS_PER_THREAD: usize = 16;

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A fresh key for a codec instance.
pub(crate) fn new_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    static CONTEXTS: RefCell<Vec<(u64, Box<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's context for `key`, creating it with `make` on
/// first use. Returns `None` only when `make` fails.
///
/// The context is taken out of the thread's table while `f` runs, so `f` may
/// itself use other codecs (by_n does) without a re-entrant borrow.
pub(crate) fn with_context<C: 'static, R>(
    key: u64,
    make: impl FnOnce() -> Option<C>,
    f: impl FnOnce(&mut C) -> R,
) -> Option<R> {
    let taken = CONTEXTS.with(|table| {
        let mut table = table.borrow_mut();
        let at = table.iter().position(|(k, _)| *k == key)?;
        Some(table.swap_remove(at).1)
    });
    let mut boxed: Box<dyn Any> = match taken {
        Some(boxed) => boxed,
        None => Box::new(make()?),
    };
    let ctx = boxed
        .downcast_mut::<C>()
        .expect("a context key always maps to the same context type");
    let result = f(ctx);
    CONTEXTS.with(|table| {
        let mut table = table.borrow_mut();
        // Contexts of codecs that were dropped are never asked for again;
        // bound the table so they cannot pile up in a long-lived thread.
        if table.len() >= MAX_CONTEXTS_PER_THREAD {
            table.remove(0);
        }
        table.push((key, boxed));
    });
    Some(result)
}

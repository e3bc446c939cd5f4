//! The program's own fork, seen from inside its process.
//!
//! glibc's fork() takes every malloc lock, then makes the system call, and
//! the kernel holds the forking thread until the runtime's event thread has
//! read the fork event. A runtime thread that needed malloc then, or a lock
//! held by a thread that did, would never let the event thread read it: the
//! program would hang in fork. So fork handlers (pthread_atfork), which run
//! before glibc takes its locks, prepare every runtime of the process:
//!
//! - prepare: take the event gate's write side (no runtime thread is then
//!   inside a section the event thread would wait for) and raise
//!   `fork_pending`; the event thread then reads, without the gate and
//!   without allocating, until it has the fork event (see `fault.rs`).
//!   The list of runtimes stays locked until the fork has returned, so a
//!   runtime cannot start meanwhile unprepared;
//! - parent: lower `fork_pending` and give the gate back; the event thread
//!   applies what it read, and the fork returns once it has;
//! - child: the child is a copy with none of the runtime's threads: its
//!   runtimes are marked, so that dropping them or their regions there
//!   touches nothing, and its copies of their userfaultfds are replaced by
//!   /dev/null. A copy would keep the descriptor alive after the parent's
//!   runtime has let go of it, and with it the registration of whatever the
//!   parent left registered: the parent's next fork would then wait for
//!   ever on a FORK event nobody reads.
//!
//! A runtime that is ending is prepared like any other until it is gone:
//! its event thread reads fork events until it has let go of its
//! descriptors, which it does only while no fork is in flight ([`quiet`]).

use super::Shared;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Once, RwLockWriteGuard, TryLockError, Weak};

/// Every live runtime of the process.
static RUNTIMES: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// The runtimes a fork in progress has prepared, with their gates held. The
/// guard comes first so that it is dropped before the runtime it borrows.
type Held = (RwLockWriteGuard<'static, ()>, Arc<Shared>);

/// What a fork's prepare handler holds until its parent or child handler:
/// the one-fork lock, the list of runtimes (so that no runtime starts, and
/// registers memory the fork would wait on, without being prepared), and
/// the runtimes it prepared.
type Prepared = (
    MutexGuard<'static, ()>,
    MutexGuard<'static, Vec<Weak<Shared>>>,
    Vec<Held>,
);

/// One fork through these handlers at a time: two threads forking at once
/// would otherwise take the runtimes' gates in each other's way.
static ONE_FORK: Mutex<()> = Mutex::new(());

thread_local! {
    /// Per forking thread: the handlers of one fork run on the thread that
    /// calls it, and a lock guard must be released where it was taken.
    static PREPARED: RefCell<Option<Prepared>> = const { RefCell::new(None) };
}

static HANDLERS: Once = Once::new();

/// Registers a runtime (and, once per process, the fork handlers).
pub(crate) fn register(shared: &Arc<Shared>) {
    HANDLERS.call_once(|| {
        // SAFETY: registering plain functions that live for the whole
        // process.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        assert_eq!(r, 0, "pthread_atfork");
    });
    let mut all = RUNTIMES.lock().expect("runtimes lock");
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(shared));
}

/// Holds forks off while the caller has it: no fork is in flight (between
/// its prepare and parent handlers). `None` while one is.
pub(crate) fn quiet() -> Option<MutexGuard<'static, ()>> {
    match ONE_FORK.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::WouldBlock) => None,
        Err(TryLockError::Poisoned(_)) => panic!("fork lock poisoned"),
    }
}

extern "C" fn prepare() {
    let one = ONE_FORK.lock().expect("fork lock");
    // Held until the fork has returned: a runtime started after this look
    // and before the system call would have memory registered that the
    // kernel waits on, and an event thread free to need malloc meanwhile.
    let all = RUNTIMES.lock().expect("runtimes lock");
    let runtimes: Vec<Arc<Shared>> = all.iter().filter_map(Weak::upgrade).collect();
    let mut prepared = Vec::with_capacity(runtimes.len());
    for shared in runtimes {
        if shared.forked_copy.load(Ordering::Acquire) {
            continue;
        }
        let guard = shared.gate.write().expect("event gate");
        // SAFETY: the guard borrows `shared.gate`, which lives as long as the
        // Arc stored beside it; the pair is dropped guard first (`Held`).
        let guard: RwLockWriteGuard<'static, ()> = unsafe { std::mem::transmute(guard) };
        shared.fork_pending.store(true, Ordering::SeqCst);
        prepared.push((guard, shared));
    }
    PREPARED.with(|p| *p.borrow_mut() = Some((one, all, prepared)));
}

extern "C" fn parent() {
    let Some((one, all, prepared)) = PREPARED.with(|p| p.borrow_mut().take()) else {
        return;
    };
    let mut runtimes = Vec::with_capacity(prepared.len());
    for (guard, shared) in prepared {
        shared.fork_pending.store(false, Ordering::SeqCst);
        drop(guard);
        runtimes.push(shared);
    }
    drop(all);
    drop(one);
    // The fork returns to the program only once each runtime has applied
    // what its event thread read meanwhile, the fork's event among them:
    // the event reads the parent's mappings for what the kernel did not
    // copy as it was (`events::on_fork`), and a madvise, munmap or mremap
    // the program made right after its fork would otherwise be read as
    // made before it. The fork's event was read before the kernel let this
    // thread go, and `unapplied` was raised before that read (an event
    // thread that read nothing lowers it at its next turn): the event
    // gate's read side, for any thread, waits until it is low. Applying
    // allocates: glibc has let malloc go before these handlers, but an
    // allocator whose own fork handlers were registered after this one's
    // holds its locks until they run, after this wait. Such an allocator's
    // locks are already held in `prepare`, which allocates too, so no
    // setup that forked before waits here for ever.
    for shared in runtimes {
        drop(shared.read_gate());
    }
}

extern "C" fn child() {
    // The child's copies of the runtimes only need to know they are copies;
    // their locks are released (by this same thread) so that the child may
    // fork in turn.
    let Some((one, all, prepared)) = PREPARED.with(|p| p.borrow_mut().take()) else {
        return;
    };
    // SAFETY: opening /dev/null; checked below.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    for (guard, shared) in prepared {
        shared.forked_copy.store(true, Ordering::Release);
        // No runtime thread exists here to hold the lock for writing.
        if let (true, Ok(spaces)) = (null >= 0, shared.spaces.try_read()) {
            for space in spaces.iter() {
                let scratch = space
                    .memory
                    .get()
                    .and_then(|m| m.scratch())
                    .map(|s| s.uffd());
                let kept_space = space.uffd.let_go(null).is_err();
                let kept_scratch = scratch.is_some_and(|uffd| uffd.let_go(null).is_err());
                if kept_space || kept_scratch {
                    // What is left is at worst the hang described above
                    // (never wrong data): say so, without allocating.
                    const MSG: &[u8] = b"uswap: a forked child kept a copy of a userfaultfd\n";
                    // SAFETY: writing a static buffer to stderr.
                    unsafe { libc::write(2, MSG.as_ptr().cast(), MSG.len()) };
                }
            }
        }
        drop(guard);
        // Never dropped here: this may be the last reference (the runtime
        // was ending in the parent), and its drop would wait for threads
        // that do not exist in the child.
        std::mem::forget(shared);
    }
    if null >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(null) };
    }
    drop(all);
    drop(one);
}

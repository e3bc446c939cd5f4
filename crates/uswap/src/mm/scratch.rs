//! Scratch: where the reclaimer discards the pages of folios it has stored,
//! without an event.
//!
//! Dropping stored pages where they are (MADV_DONTNEED) raises a REMOVE
//! event on the program's userfaultfd, and blocks until the event thread has
//! read it. Worse, the event says nothing about who dropped: the program's
//! own MADV_DONTNEED of the same range at the same moment looks the same,
//! and can only be told apart by its range (`Shared::is_own_drop`). So the
//! reclaimer moves the pages instead (UFFDIO_MOVE, Linux 6.8) into a mapping
//! of its own, and drops them there later, a scratch's worth at a time:
//!
//! ```text
//!   program's folio  --UFFDIO_MOVE (no copy)-->  scratch [ moved | empty ]
//!   (registered for missing     through the program's     registered for
//!    and write-protect faults)  own descriptor            write-protect faults
//!                                                          only, same descriptor
//!   scratch full: unregister it, MADV_DONTNEED (no event: not registered),
//!                 register it again
//! ```
//!
//! Every REMOVE event the program's descriptor raises is then the
//! program's own. Measured on this project's 2-core machine (a C probe, 8
//! folios of 64 KiB at a time): 13-15 us against 56-66 us for the drop with
//! its event read by another thread, and 44 us against 60-106 us while a
//! third thread keeps the other CPU busy (a move flushes the TLB page by
//! page).
//!
//! Why the program's own descriptor, and not one of the scratch's own: a
//! move through it is refused (EAGAIN) while an event of the program is
//! unread. The reclaimer moves under the settled gate, where no event is
//! read; so an unmap the program makes meanwhile (which waits, unread)
//! stops the move, where a descriptor without events would let it take the
//! pages of whatever another thread of the program has mapped at that
//! address since. The kernel checks this together with the move, under the
//! same locks: nothing can slip in between.
//!
//! Another process's pages (`uswap run`) are moved the same way by its
//! agent thread (UFFDIO_MOVE works only inside the caller's own address
//! space), into a scratch the agent maps and registers in that process
//! (`uswap-agent`; `DropPages::move_out_all`, one request for a whole
//! eviction batch).
//!
//! Only pages this address space maps alone can move: one a forked child
//! still shares, KSM merged or something pinned answers EBUSY, and a
//! mapping of other protection (mprotect, mlock) EINVAL. (Pages shared with
//! a forked child are rare here: the copy-out before the move pins them,
//! and pinning gives the parent a copy of its own.) A page that answers
//! EBUSY stays in memory (dropped, it would not be freed while it is
//! shared); whatever else did not move is dropped in place, by the caller.
//!
//! What moved is checked against the caller's copy ([`MoveRange`]): a page
//! pinned for a device's write before the reclaimer write-protected it
//! changes with no fault, and moves once unpinned. Where it differs, the
//! pages move back from the scratch:
//!
//! ```text
//!   move out --> scratch part == copy? --yes--> gone (the copy is right)
//!                      |no (or the move stopped part way)
//!                      v
//!                move back --ok--> nothing moved (`changed`, `shared`)
//!                      |refused (an event came in)
//!                      v
//!                `stale`: the caller poisons what is not back
//! ```

use super::uffd::{Partial, Uffd, UffdError};
use crate::page::PAGE_SIZE;
use std::sync::Mutex;

/// The scratch mapping's size: the most one move takes (the reclaimer
/// moves at most this much at a time, in whole folios).
pub const SCRATCH_LEN: usize = 2 << 20;

/// A mapping the reclaimer moves stored pages into.
pub(crate) struct Scratch {
    /// A copy of the program's descriptor (the runtime's own), which the
    /// scratch is registered with for write-protect faults only (see
    /// [`Uffd::register_for_moves`]): the program may read the scratch (a
    /// debugger, or `mlockall`, which populates every mapping) and then
    /// finds zeros, where a registration for missing pages would hold it
    /// until the event thread served it.
    uffd: Uffd,
    base: usize,
    state: Mutex<State>,
}

/// Where a scratch stands.
struct State {
    /// Bytes from the base that hold moved pages (copies already stored);
    /// `None` once the scratch could not be made ready again, or was let
    /// go, after which nothing moves.
    filled: Option<usize>,
    /// Registered with the descriptor: from the first discard (not when
    /// the runtime starts, when no event thread would read the fork event
    /// a registered mapping raises) until let go.
    registered: bool,
}

/// A range of stored pages to move out, and the copy stored of it (none:
/// nothing to check against).
///
/// Why the copy: a page pinned for a device's write (an O_DIRECT read into
/// it) before the reclaimer write-protected it takes the device's bytes
/// with no write-protect fault, and the move, which refuses only a page
/// pinned at that instant, takes it once unpinned: the stored copy would be
/// the old bytes. What moved is compared with the copy (by another
/// process's agent, with its hash: `uswap_protocol::content_hash`); where
/// it differs the pages go back (see [`Discarded::shared`],
/// [`Discarded::stale`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveRange<'a> {
    /// Page-aligned start.
    pub start: usize,
    /// Bytes, at most [`SCRATCH_LEN`].
    pub len: usize,
    /// What the moved bytes must be (as long as the range), if known.
    pub copy: Option<&'a [u8]>,
}

/// What a discard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Discarded {
    /// Bytes from the start that are gone (moved out).
    pub bytes: usize,
    /// The move was refused because an event of the address space is
    /// unread (or, for another process, the range changed since it was
    /// checked): nothing moved; settle the events, check the range again,
    /// and ask again.
    pub again: bool,
    /// The move stopped at a page that is not this address space's alone
    /// (EBUSY: a forked child shares it, KSM merged it) or that is pinned.
    /// It stays in memory: dropped, it would not be freed while the other
    /// process keeps it (and a drop in place has a window, see
    /// `mm/reclaim.rs`).
    pub shared: bool,
    /// The kernel refused to move what is at the stop, and will again
    /// (EINVAL: a mapping of other protection, which a move needs writable,
    /// or locked memory). It stays in memory: a drop in place zaps whatever
    /// the range holds once its event is read, memory the program moved
    /// there meanwhile included, and no check closes that window (see
    /// `mm/reclaim.rs`). False where nothing can move here at all (no
    /// scratch, or none that works): the caller drops in place.
    pub unmovable: bool,
    /// What moved did not hold the bytes stored for it (see
    /// [`MoveRange`]): it went back, and nothing moved (`shared` too, as
    /// for a pinned page), unless `stale` says otherwise.
    pub changed: bool,
    /// What moved did not hold the bytes stored for it, or stopped part way
    /// and could not be checked, and some of it could not go back (an event
    /// of the program came in after the move out, or a change of its
    /// protection): the pages not back may hold bytes nobody else has.
    /// `bytes` is what the move took.
    pub stale: bool,
}

impl Scratch {
    /// A scratch mapping to be registered with `uffd` (the runtime's own
    /// descriptor) at the first discard, or `None` where the kernel cannot
    /// move pages (before Linux 6.8).
    pub fn new(uffd: &Uffd) -> Option<Scratch> {
        if !uffd.moves() {
            return None;
        }
        let uffd = uffd.try_clone().ok()?;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to
        // it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SCRATCH_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        // Pages come in one by one; a huge page would only have to be split.
        // A forked child gets the scratch empty, not a copy of what lies
        // there. Advice only: the scratch works without.
        // SAFETY: advice on our own mapping.
        unsafe {
            libc::madvise(base, SCRATCH_LEN, libc::MADV_NOHUGEPAGE);
            libc::madvise(base, SCRATCH_LEN, libc::MADV_WIPEONFORK);
        }
        Some(Scratch {
            uffd,
            base: base as usize,
            // Full: the first discard empties it, which registers it.
            state: Mutex::new(State {
                filled: Some(SCRATCH_LEN),
                registered: false,
            }),
        })
    }

    /// The descriptor, so that a forked child can let go of its copy.
    pub fn uffd(&self) -> &Uffd {
        &self.uffd
    }

    /// Moves the pages of `range` (stored, owned by the caller, at most
    /// [`SCRATCH_LEN`]) out of the program's memory, checked against its
    /// copy (see [`MoveRange`]). The caller holds the settled gate. Returns
    /// how many bytes from the start are gone that way (the caller drops
    /// the rest in place), or that the move must wait for the events.
    pub fn discard(&self, range: MoveRange<'_>) -> Discarded {
        let MoveRange { start, len, .. } = range;
        debug_assert!(len <= SCRATCH_LEN);
        let mut state = self.state.lock().expect("scratch lock");
        let mut emptied = false;
        loop {
            let Some(at) = state.filled else {
                return Discarded {
                    bytes: 0,
                    again: false,
                    shared: false,
                    unmovable: false,
                    ..Default::default()
                };
            };
            if at + len > SCRATCH_LEN {
                self.empty(&mut state);
                emptied = true;
                continue;
            }
            let result = self.uffd.move_pages(self.base + at, start, len);
            let (moved, again, shared, unmovable) = match result {
                Ok(()) => (len, false, false, false),
                // An event came in since the settled probe (or while
                // this call looked: see `Uffd::no_mapping`), or nothing is
                // mapped at the start: a hole the program unmapped (the
                // probe passes over holes).
                Err(Partial {
                    filled: 0,
                    error: UffdError::Again | UffdError::NoMapping,
                }) => (0, true, false, false),
                Err(Partial {
                    filled: 0,
                    error: UffdError::Exists | UffdError::Os(_),
                }) if !emptied => {
                    // EEXIST: something read the scratch and the kernel put
                    // zero pages there. EINVAL: the program locked its
                    // memory (mlockall) since the scratch was last emptied,
                    // or the range is of other protection. Empty it all
                    // (which unlocks it), once, and try again.
                    self.empty(&mut state);
                    emptied = true;
                    continue;
                }
                Err(Partial {
                    filled: n,
                    error: UffdError::Busy,
                }) => (n / PAGE_SIZE * PAGE_SIZE, false, true, false),
                // A move that stopped part way answers EAGAIN whatever
                // stopped it (a page shared with a forked child or pinned,
                // whose EBUSY comes only when it is the first): the rest is
                // tried again, which says why.
                Err(Partial {
                    filled: n,
                    error: UffdError::Again,
                }) => (n / PAGE_SIZE * PAGE_SIZE, true, false, false),
                // Not movable from there on (read-only or locked): the rest
                // stays in memory.
                Err(Partial {
                    filled: n,
                    error: UffdError::Os(e),
                }) if e.raw_os_error() == Some(libc::EINVAL) => {
                    (n / PAGE_SIZE * PAGE_SIZE, false, false, true)
                }
                // Anything else: the caller drops the rest in place.
                Err(Partial { filled: n, .. }) => (n / PAGE_SIZE * PAGE_SIZE, false, false, false),
            };
            let discarded = Discarded {
                bytes: moved,
                again,
                shared,
                unmovable,
                changed: false,
                stale: false,
            };
            let checked = self.checked(at, range, discarded);
            // The next move goes after what this one left.
            state.filled = Some(at + checked.bytes);
            return checked;
        }
    }

    /// `discarded`, a move of pages from `range.start` into the scratch at
    /// `at`, once checked against `range.copy` (see [`MoveRange`]): where
    /// what moved differs from it, or where the move stopped part way
    /// (what moved cannot be checked alone; the kernel answers EAGAIN to a
    /// move stopped by any page, mostly one shared or pinned), the pages go
    /// back and nothing moved, `shared` (and `changed` where the move was
    /// whole); `stale` where they did not all go back.
    ///
    /// A move out and back leaves the pages writable (the kernel makes a
    /// moved page's entry writable and drops its write-protect bit): the
    /// caller takes them as resident, and protects them again before any
    /// other try.
    fn checked(&self, at: usize, range: MoveRange<'_>, discarded: Discarded) -> Discarded {
        let moved = discarded.bytes;
        let Some(copy) = range.copy.filter(|_| moved > 0) else {
            return discarded;
        };
        let whole = moved == range.len;
        if whole {
            // SAFETY: our own scratch, `moved` bytes from `at` (inside it:
            // the move took no more than what was left of it); holes in it
            // read as zeros, and only this thread, under the scratch lock,
            // moves pages in or out.
            let there = unsafe { std::slice::from_raw_parts((self.base + at) as *const u8, moved) };
            if there == copy {
                return discarded;
            }
        }
        match self.uffd.move_pages(range.start, self.base + at, moved) {
            Ok(()) => Discarded {
                bytes: 0,
                again: false,
                shared: true,
                unmovable: false,
                changed: whole,
                stale: false,
            },
            Err(_) => Discarded {
                changed: true,
                stale: true,
                ..discarded
            },
        }
    }

    /// Drops what the moves left in the scratch. Unregistered while it
    /// drops, so that the drop raises no event; registered again after.
    /// Unlocked first: a program that called mlockall locked the scratch
    /// with everything else, and a move between locked and unlocked memory
    /// is refused, as is a drop of locked memory (the program's locked
    /// memory is never evicted). Leaves it empty and registered, or (said)
    /// out of use.
    fn empty(&self, state: &mut State) {
        // SAFETY: our own mapping.
        let unlocked = unsafe { libc::munlock(self.base as *const _, SCRATCH_LEN) } == 0;
        let unregistered = unlocked && self.uffd.unregister(self.base, SCRATCH_LEN).is_ok();
        if unregistered {
            state.registered = false;
        }
        // SAFETY: our own mapping; its pages are copies already stored.
        let dropped = unregistered
            && unsafe { libc::madvise(self.base as *mut _, SCRATCH_LEN, libc::MADV_DONTNEED) } == 0;
        if dropped && self.uffd.register_for_moves(self.base, SCRATCH_LEN).is_ok() {
            state.registered = true;
            state.filled = Some(0);
            return;
        }
        state.filled = None;
        // Nothing is lost (the caller drops in place from now on), but it
        // must not pass unseen.
        eprintln!(
            "uswap: the scratch could not be emptied ({}); stored pages are dropped in place from now on",
            std::io::Error::last_os_error()
        );
    }
}

impl Scratch {
    /// Unregisters the scratch and lets go of its descriptor (see
    /// [`Uffd::let_go`]), as the runtime ends: a registration left behind
    /// would keep the userfaultfd alive with nobody reading it, and the
    /// program's next fork or munmap of the scratch would wait for ever
    /// for its event to be read. Returns whether all of it went.
    pub fn let_go(&self, placeholder: i32) -> bool {
        let mut state = self.state.lock().expect("scratch lock");
        state.filled = None;
        state.registered &= !self.unregister();
        self.uffd.let_go(placeholder).is_ok() && !state.registered
    }

    /// Unregisters the scratch; false (said) if it stays registered.
    fn unregister(&self) -> bool {
        match self.uffd.unregister(self.base, SCRATCH_LEN) {
            Ok(()) | Err(UffdError::ProcessGone) => true,
            Err(e) => {
                eprintln!("uswap: unregistering the scratch: {e}");
                false
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Unregistered first: unmapping registered memory would raise an
        // event and wait for a reader that may be gone.
        let registered = self.state.get_mut().map_or(true, |s| s.registered);
        if registered && !self.unregister() {
            return;
        }
        // SAFETY: our own mapping, which nothing refers to any more.
        unsafe { libc::munmap(self.base as *mut _, SCRATCH_LEN) };
    }
}

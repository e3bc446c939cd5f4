//! Another process served by the runtime: what `uswap run` builds on.
//!
//! The process creates a userfaultfd and hands it over (a unix socket,
//! SCM_RIGHTS); the runtime adopts it, and from then on the process is one
//! more address space, evicted from like the runtime's own: its resident
//! managed memory counts towards the same `memory_high`, its faults are
//! served by the same event thread, its forks give child spaces. What the
//! runtime cannot do from outside, dropping pages, a [`DropPages`] given
//! with it does (see [`super::memory`]).
//!
//! The caller says which ranges to manage ([`Attached::manage`]); a range
//! is registered first and looked at after (`/proc/PID/pagemap`), so that
//! a page the program touches in between either faults (and is served) or
//! is seen present. When the process exits or execs, its space is released
//! with everything it held in the store.

use super::folio::{RESIDENT, UNTOUCHED};
use super::memory::{DropPages, Memory};
use super::space::{Owner, RegionInner, Space};
use super::uffd::{Features, Uffd, UffdError};
use super::{Runtime, Shared};
use crate::page::PAGE_SIZE;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The bytes of an attached process's agent pages that `beacon` names in
/// [`Runtime::attach`]: the beacon, then the fence, a page the process
/// touches after each fork of its own and leaves unpopulated again. The
/// fence's fault is read after the fork's event and served once that event
/// is applied, so the forking thread goes on only then: what the event
/// reads of the parent's mappings (see `events::on_fork`) is what the
/// kernel copied, not what the thread changed right after.
pub const BEACON_SPAN: usize = 2 * PAGE_SIZE;

/// A process the runtime serves from outside (see [`Runtime::attach`]).
pub struct Attached {
    shared: Arc<Shared>,
    space: Arc<Space>,
    pid: libc::pid_t,
}

impl Runtime {
    /// Serves process `pid` through `uffd`, a userfaultfd it created (not
    /// yet negotiated), with `dropper` to drop its pages. `beacon`: a page
    /// of the process that it never touches (see [`Runtime::adopt`]), and
    /// its fence after it ([`BEACON_SPAN`] in all). For a
    /// supervisor: a process that does not itself fork while it serves.
    pub fn attach(
        &self,
        uffd: OwnedFd,
        pid: libc::pid_t,
        beacon: Option<usize>,
        dropper: Box<dyn DropPages>,
    ) -> io::Result<Attached> {
        let shared = &self.shared;
        let uffd = Uffd::adopt(
            uffd,
            Features {
                fork: shared.config.serve_forks,
            },
        )?;
        if let Some(page) = beacon {
            uffd.register(page, BEACON_SPAN)
                .map_err(|e| io::Error::other(format!("registering the beacon page: {e}")))?;
        }
        if shared.config.discard_by_move && !uffd.moves() {
            say_drops_in_place();
        }
        let memory = Memory::remote(pid, dropper, shared.config.discard_by_move && uffd.moves())?;
        let space = Arc::new(Space::new(
            shared.next_space_id(),
            uffd,
            Owner::Attached,
            Some(memory),
            beacon,
        ));
        shared
            .spaces
            .write()
            .expect("spaces lock")
            .push(space.clone());
        shared.announce_space();
        Ok(Attached {
            shared: shared.clone(),
            space,
            pid,
        })
    }
}

impl Runtime {
    /// Evicts from a forked child of an attached process too: `pid` is the
    /// child, `dropper` drops its pages. The child's space came with its
    /// parent's fork event, which does not say whose it is; the child says
    /// it by touching its copy of the parent's beacon page (the fault
    /// carries its thread id, which is its pid: a forked child's only
    /// thread), before it asks to be adopted. `before` runs with the
    /// child's descriptor once the child is found and before anything of
    /// it is evicted (a supervisor answers the child there); its error
    /// calls the adoption off. The child's resident folios count from then
    /// on.
    pub fn adopt(
        &self,
        pid: libc::pid_t,
        dropper: Box<dyn DropPages>,
        before: impl FnOnce(std::os::fd::BorrowedFd) -> io::Result<()>,
    ) -> io::Result<Attached> {
        let shared = &self.shared;
        let id = shared
            .beacon_hits
            .lock()
            .expect("beacon lock")
            .remove(&pid)
            .ok_or_else(|| {
                // A child that touched its beacon and exited (or exec'd)
                // before its request was read had its space, and with it
                // the touch, released already: gone, like any process that
                // went meanwhile.
                if has_no_memory(pid) {
                    io::Error::from_raw_os_error(libc::ESRCH)
                } else {
                    io::Error::other(format!(
                        "process {pid} is not a forked child that touched its beacon"
                    ))
                }
            })?;
        // Released meanwhile: it exited or exec'd (gone, like above).
        let space = shared
            .space(id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        let memory = Memory::remote(
            pid,
            dropper,
            shared.config.discard_by_move && space.uffd.moves(),
        )?;
        // SAFETY: the descriptor lives as long as the space, held here.
        before(unsafe { std::os::fd::BorrowedFd::borrow_raw(space.uffd.raw_fd()) })?;
        // Under the gate's write side: no folio of the space is published
        // meanwhile, so each resident one is counted exactly once.
        let gate = shared.write_gate();
        if space.memory.set(memory).is_err() {
            return Err(io::Error::other(format!(
                "process {pid} is adopted already"
            )));
        }
        for region in space.regions.read().expect("regions lock").iter() {
            shared.count_resident_region(&space, region);
        }
        drop(gate);
        Ok(Attached {
            shared: shared.clone(),
            space,
            pid,
        })
    }
}

impl Attached {
    /// The process id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether the process (this image of it) is still served: false once
    /// it has exited or exec'd.
    pub fn is_alive(&self) -> bool {
        self.space.alive.load(Ordering::Acquire) && self.space.uffd.is_alive()
    }

    /// Faults served so far in registered memory of the process that no
    /// region tracks, one page at a time: memory the program uses that the
    /// supervisor has yet to manage (mapped by growing a managed mapping in
    /// place, which raises no event). A count that moved says a scan is
    /// due.
    pub fn untracked_faults(&self) -> u64 {
        self.space.untracked_faults.load(Ordering::Relaxed)
    }

    /// The ranges managed so far, as `(start, len)` where they are now,
    /// less what the program unmapped or moved away: new memory the kernel
    /// mapped there is not managed yet.
    pub fn managed(&self) -> Vec<(usize, usize)> {
        self.space
            .regions
            .read()
            .expect("regions lock")
            .iter()
            .flat_map(|r| r.live_ranges())
            .collect()
    }

    /// Manages `start..start + len` of the process, which must be private
    /// anonymous memory, page aligned, holding at least one whole, aligned
    /// folio. Its whole folios become a region: those with a page in memory
    /// (or in the kernel's swap) count as resident; the others are
    /// untouched. The parts of folios at its ends are registered too, as
    /// strays (`Space::strays`: never evicted; a page missing there reads
    /// as zero), so that a mapping the caller passes whole stays one
    /// registered mapping to the kernel, which refuses an mremap over a
    /// mapping registered in part. A range registered with another
    /// userfaultfd (the program uses userfaultfd itself) is refused with
    /// `EBUSY`.
    pub fn manage(&self, start: usize, len: usize) -> io::Result<()> {
        let shared = &self.shared;
        let fs = shared.config.folio_size;
        let end = start + len;
        let (first, last) = (start.next_multiple_of(fs), end / fs * fs);
        if !start.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) || first >= last {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "manage: the range must be whole pages holding a whole, aligned folio",
            ));
        }
        // Under the gate: no event is applied between the registration and
        // the region's entry (an unmap of the range meanwhile would find no
        // region, and leave this one over memory that is gone).
        let _gate = shared.read_gate();
        // Pages a move carried here whose folio's owner has yet to install
        // them: a region here would take them for untouched memory and fill
        // them with zeros. The next scan takes the range once they are in.
        if self.space.awaits_moved_pages(start, start + len) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("manage: {start:#x}+{len:#x} awaits pages a move carried there"),
            ));
        }
        // A region moved here whole since the caller looked (mremap): its
        // pages are tracked already. A second region over them would evict
        // them while the first still takes them for resident, and a fault
        // there would find the first and read zeros.
        if self.space.tracks_any(start, start + len) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("manage: {start:#x}+{len:#x} is managed already"),
            ));
        }
        self.space.uffd.register(start, len).map_err(|e| match e {
            UffdError::Os(os) => os,
            other => io::Error::other(format!("registering {start:#x}+{len:#x}: {other}")),
        })?;
        let memory = self.space.memory.get().expect("attached memory");
        // The caller read the process's mappings a moment ago, and an
        // unregistered range raises no event when the program replaces it:
        // what was registered is looked at again, and let go unless it is
        // still the memory a runtime manages (a change since the
        // registration raises an event, applied once the gate is let go).
        if !memory.is_private_anonymous(start, end) {
            return match self.space.uffd.unregister(start, len) {
                Ok(()) | Err(UffdError::NoMapping | UffdError::ProcessGone) => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("manage: {start:#x}+{len:#x} is not private anonymous memory"),
                )),
                Err(e) => Err(io::Error::other(format!(
                    "unregistering {start:#x}+{len:#x}, which is not private anonymous memory: {e}"
                ))),
            };
        }
        let id = shared.next_region.fetch_add(1, Ordering::Relaxed);
        let region = Arc::new(RegionInner::new(
            id,
            first,
            last - first,
            fs,
            UNTOUCHED,
            false,
        ));
        for (i, f) in region.folios.iter().enumerate() {
            if !memory.present_pages(first + i * fs, fs).is_empty() {
                f.set(RESIDENT);
            }
        }
        // Strays the region now covers (an earlier mapping's end, since
        // merged with this one by the kernel) are the region's.
        self.space.forget_strays(first, last);
        let mut strays = self.space.strays.lock().expect("strays lock");
        strays.extend(
            [(start, first), (last, end)]
                .into_iter()
                .filter(|(a, b)| a < b),
        );
        drop(strays);
        self.space
            .regions
            .write()
            .expect("regions lock")
            .push(region.clone());
        shared.count_resident_region(&self.space, &region);
        Ok(())
    }
}

/// Whether process `pid` has no address space (any more): gone, or a
/// zombie, whose /proc/PID/statm reads all zeros.
fn has_no_memory(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .map_or(true, |statm| statm.split_whitespace().next() == Some("0"))
}

/// Says, once per supervisor, that stored pages will be dropped in place
/// because the kernel cannot move them: a drop in place has a window no
/// check closes (`mm/reclaim.rs`), which a user asked for moves should know of.
fn say_drops_in_place() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "uswap: this kernel cannot move pages (UFFDIO_MOVE, Linux 6.8): stored pages are dropped in place, which can lose memory the program moves or maps into a range being dropped (README, Known issues)"
        );
    }
}

//! How the reclaimer reaches the memory of an address space it evicts from:
//! reading pages out, dropping them, and asking which are still there.
//!
//! The userfaultfd already acts on its own process whoever calls it
//! (register, write-protect, copy). What it cannot do is the rest of an
//! eviction, and here the runtime's own process and another one differ:
//!
//! | step                 | own process               | another process (`uswap run`)          |
//! |----------------------|---------------------------|----------------------------------------|
//! | copy pages out       | `process_vm_readv(self)`  | `process_vm_readv(pid)`                |
//! | drop them            | move to a scratch, or `madvise(MADV_DONTNEED)` | asked of a thread inside it ([`DropPages`]): the same |
//! | which are present    | `mincore`                 | `/proc/PID/pagemap`                    |
//! | whether mapped       | `mincore` (ENOMEM)        | `/proc/PID/maps`                       |
//!
//! A remote MADV_DONTNEED is refused by the kernel (`process_madvise` gives
//! EINVAL for it on another process), hence [`DropPages`]: the supervisor's
//! agent inside the program carries the drops out.

use super::scratch::Scratch;
pub use super::scratch::{Discarded, MoveRange, SCRATCH_LEN};
use super::uffd::{Uffd, UffdError};
use crate::page::{PageMask, PAGE_SIZE};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Why a drop did not happen as asked.
#[derive(Debug)]
pub enum DropError {
    /// Part of the range is not mapped (the program unmapped it meanwhile);
    /// the rest was dropped.
    Unmapped,
    /// Nothing was dropped: right before the madvise, an event of the
    /// process was unread, or the range was no longer one registered
    /// mapping without holes (see [`DropPages::drop_pages`]). The caller
    /// looks at the range again.
    Changed,
    /// The process is gone.
    Gone,
    /// Anything else: the pages may still be there.
    Failed(io::Error),
}

impl std::fmt::Display for DropError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropError::Unmapped => write!(f, "part of the range is not mapped"),
            DropError::Changed => write!(f, "the range changed before the drop"),
            DropError::Gone => write!(f, "the process is gone"),
            DropError::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Drops pages in an address space the caller cannot reach with madvise:
/// each call returns once they are gone.
pub trait DropPages: Send + Sync {
    /// Drops `start..start + len` (page aligned) in place (MADV_DONTNEED),
    /// once a write-protect probe of the range through the process's
    /// userfaultfd, right before, has found no event unread and no mapping
    /// in the range unregistered, `mincore` no hole in it (the probe
    /// passes over holes since Linux 6.3), and the process's maps one
    /// mapping covering it, as when the caller checked it:
    /// [`DropError::Changed`] otherwise, nothing dropped.
    ///
    /// Why the probe: the madvise acts on whatever is mapped in the range
    /// when it runs, mapping by mapping, and drops memory that is not
    /// registered without an event. The caller checked the range under its
    /// event gate, but lets the gate go before the drop (whose event must be
    /// read): meanwhile another thread of the program may unmap part of it
    /// (its event read at once), map new memory there and write it. The
    /// probe finds that memory unregistered, or the hole before it is
    /// mapped. A mapping split meanwhile (the program's mprotect of part of
    /// it) makes the drop raise one event per piece, which the event thread
    /// tells from the program's own drops by the maps when it reads them,
    /// wrongly where the split was undone by then. What is left is the
    /// moment between the probe and the madvise taking the address space's
    /// lock.
    fn drop_pages(&self, start: usize, len: usize) -> Result<(), DropError>;

    /// Moves the stored pages of `start..start + len` (at most
    /// [`SCRATCH_LEN`]) out of the process without an event (see
    /// `mm/scratch.rs`): how many bytes from `start` went that way (0 where
    /// pages cannot move), and why the rest did not (see [`Discarded`]).
    fn move_out(&self, start: usize, len: usize) -> Discarded;

    /// [`DropPages::move_out`] for each of `ranges`, in order, its outcome
    /// pushed to `out`: where moving means asking another thread (an agent
    /// in the process), the implementation asks for them all at once, so
    /// that an eviction batch of folios that are not adjacent costs one
    /// round trip, not one per folio. A mover that can compare what it
    /// moved with each range's copy ([`MoveRange`]) does so (the agent
    /// does, by its hash); this default, for movers that cannot, passes it
    /// over.
    fn move_out_all(&self, ranges: &[MoveRange<'_>], out: &mut Vec<Discarded>) {
        out.extend(ranges.iter().map(|r| self.move_out(r.start, r.len)));
    }

    /// Asked only while a [`DropPages::move_out_all`] is in flight, from
    /// other threads: whether every move it asked for has returned already
    /// (an agent's answer has come, not yet taken by the caller). The
    /// runtime reads none of the process's events while its moves are in
    /// flight (see `reclaim.rs`, `move_out`); from here on it may, as it
    /// would once the call has returned. False where only the return says
    /// so.
    fn moves_answered(&self) -> bool {
        false
    }
}

/// A dropper shared with its owner (who keeps a handle to it, as
/// `uswap run` keeps its agent link) drops pages as itself.
impl<T: DropPages + ?Sized> DropPages for std::sync::Arc<T> {
    fn drop_pages(&self, start: usize, len: usize) -> Result<(), DropError> {
        (**self).drop_pages(start, len)
    }

    fn move_out(&self, start: usize, len: usize) -> Discarded {
        (**self).move_out(start, len)
    }

    fn move_out_all(&self, ranges: &[MoveRange<'_>], out: &mut Vec<Discarded>) {
        (**self).move_out_all(ranges, out)
    }

    fn moves_answered(&self) -> bool {
        (**self).moves_answered()
    }
}

/// The memory of an address space the runtime evicts from.
pub(crate) enum Memory {
    /// The runtime's own process, with the scratch its stored pages are
    /// discarded through where the kernel can move pages.
    Own {
        scratch: Option<Scratch>,
        maps: Maps,
        /// `/proc/self/pagemap`, open.
        pagemap: File,
    },
    /// Another process.
    Remote {
        pid: libc::pid_t,
        /// `/proc/PID/pagemap`, open.
        pagemap: File,
        /// `/proc/PID/stat`, open (see [`Memory::stopped_now`]).
        stat: File,
        maps: Maps,
        dropper: Box<dyn DropPages>,
        /// Stored pages may leave by a move (`RuntimeConfig::discard_by_move`).
        moves: bool,
        /// When the process was last found stopped (see [`Memory::held`]).
        stopped_at: std::sync::Mutex<Option<std::time::Instant>>,
    },
}

/// How long a process found stopped is taken as stopped before its state
/// is read again.
pub(crate) const STOPPED_RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether the process whose `/proc/PID/stat` is open as `stat` is stopped
/// (SIGSTOP or job control: state T; a debugger's stop: t), read with one
/// system call and no allocation (it is asked before every request to the
/// process's agent). A process gone is not.
fn is_stopped(stat: &File) -> bool {
    // The command name, at most 64 bytes here, comes before the state.
    let mut buf = [0u8; 128];
    let n = stat.read_at(&mut buf, 0).unwrap_or(0);
    matches!(crate::sys::state_in_stat(&buf[..n]), Some(b'T' | b't'))
}

/// Pagemap entry bits: the page is in memory, or in the kernel's swap.
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
/// Pagemap entry bit: the page is write-protected through userfaultfd.
const PM_UFFD_WP: u64 = 1 << 57;

impl Memory {
    /// The memory of process `pid`, whose pages `dropper` drops (and, with
    /// `moves`, moves out).
    pub fn remote(
        pid: libc::pid_t,
        dropper: Box<dyn DropPages>,
        moves: bool,
    ) -> io::Result<Memory> {
        Ok(Memory::Remote {
            pid,
            pagemap: File::open(format!("/proc/{pid}/pagemap"))?,
            stat: File::open(format!("/proc/{pid}/stat"))?,
            maps: Maps::open(format!("/proc/{pid}/maps")),
            dropper,
            moves,
            stopped_at: std::sync::Mutex::new(None),
        })
    }

    /// Whether the process is stopped now (SIGSTOP, job control, a
    /// debugger), read afresh: its agent cannot move or drop pages until it
    /// runs again, and a request made meanwhile would keep the reclaimer
    /// waiting for the answer as long, every process's faults past the
    /// limit with it. Remembered for [`Memory::held`]. The runtime's own
    /// process is never stopped while it runs this.
    pub fn stopped_now(&self) -> bool {
        let Memory::Remote {
            stat, stopped_at, ..
        } = self
        else {
            return false;
        };
        let stopped = is_stopped(stat);
        *stopped_at.lock().expect("stopped lock") = stopped.then(std::time::Instant::now);
        stopped
    }

    /// Whether the moves out asked of another process's agent in a
    /// [`DropPages::move_out_all`] still in flight have all returned (see
    /// [`DropPages::moves_answered`]); never for the runtime's own memory,
    /// whose moves are made under the event gate.
    pub fn moves_answered(&self) -> bool {
        match self {
            Memory::Remote { dropper, .. } => dropper.moves_answered(),
            Memory::Own { .. } => false,
        }
    }

    /// Whether the process was stopped when last looked at (by
    /// [`Memory::stopped_now`]), looked at again once [`STOPPED_RECHECK`]
    /// has passed: no read at all while it runs.
    pub fn held(&self) -> bool {
        let Memory::Remote { stopped_at, .. } = self else {
            return false;
        };
        let since = *stopped_at.lock().expect("stopped lock");
        match since {
            None => false,
            Some(at) if at.elapsed() < STOPPED_RECHECK => true,
            Some(_) => self.stopped_now(),
        }
    }

    /// The runtime's own memory, discarded through `scratch` where moves
    /// work.
    pub fn own(scratch: Option<Scratch>) -> io::Result<Memory> {
        Ok(Memory::Own {
            scratch,
            maps: Maps::open("/proc/self/maps".into()),
            pagemap: File::open("/proc/self/pagemap")?,
        })
    }

    fn pid(&self) -> libc::pid_t {
        match self {
            // SAFETY: getpid has no preconditions.
            Memory::Own { .. } => unsafe { libc::getpid() },
            Memory::Remote { pid, .. } => *pid,
        }
    }

    /// The process's mappings with fork advice, in address order; none
    /// where its listing cannot be read (the process is gone).
    pub fn fork_advice(&self) -> Vec<(usize, usize, ForkAdvice)> {
        match File::open(format!("/proc/{}/smaps", self.pid())) {
            Ok(smaps) => fork_advice_in(io::BufReader::new(smaps)),
            Err(_) => Vec::new(),
        }
    }

    /// Copies the `remote` ranges into the `local` buffers; returns the
    /// bytes copied (an unmapped range ends the copy early: an error to
    /// handle, not a crash).
    pub fn read(&self, local: &[libc::iovec], remote: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: the local iovecs are the caller's writable buffers; the
        // remote ones name memory of the process, which the kernel checks.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid(),
                local.as_ptr(),
                local.len() as _,
                remote.as_ptr(),
                remote.len() as _,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Discards the stored pages of each of `ranges` (start, length; each at
    /// most [`SCRATCH_LEN`]) without raising an event (see
    /// [`super::scratch`]): per range, in order, pushed to `out`, how many
    /// bytes from its start are gone that way, or that the move waits for
    /// events to be read. The caller drops the rest with
    /// [`Memory::drop_pages`].
    ///
    /// The caller holds the settled event gate (`settled`), under which
    /// every move of the program's mappings so far is in the bookkeeping,
    /// and checked every range under it. Moves in this process are made
    /// under it. Another process's pages are moved by its agent thread (a
    /// whole eviction batch per request), which may be slow to answer or never
    /// do (a stopped program): the gate is let go first, as for a drop in
    /// place, lest the event thread stop reading every process's events
    /// meanwhile. The caller keeps that process's events unread until the
    /// answers (`reclaim.rs`, `move_out`), and the agent checks again, just
    /// before each move, that no event is unread and the range is still
    /// registered: whatever the program did to a range since the check
    /// waits unread, and the move is refused.
    pub fn discard_quietly(
        &self,
        ranges: &[MoveRange<'_>],
        settled: std::sync::RwLockReadGuard<'_, ()>,
        out: &mut Vec<Discarded>,
    ) {
        match self {
            Memory::Own {
                scratch: Some(scratch),
                ..
            } => out.extend(ranges.iter().map(|&r| scratch.discard(r))),
            Memory::Own { scratch: None, .. } | Memory::Remote { moves: false, .. } => {
                out.extend(ranges.iter().map(|_| Discarded::default()))
            }
            Memory::Remote { dropper, .. } => {
                drop(settled);
                dropper.move_out_all(ranges, out)
            }
        }
    }

    /// The scratch, if any (a forked child lets go of its descriptor; the
    /// runtime's end, of its registration).
    pub fn scratch(&self) -> Option<&Scratch> {
        match self {
            Memory::Own {
                scratch: Some(scratch),
                ..
            } => Some(scratch),
            _ => None,
        }
    }

    /// Drops `start..start + len` in place, as [`DropPages::drop_pages`]
    /// says; in the runtime's own process, probing through `uffd` (another
    /// process's agent probes through its own copy).
    pub fn drop_pages(&self, uffd: &Uffd, start: usize, len: usize) -> Result<(), DropError> {
        match self {
            Memory::Own { maps, pagemap, .. } => {
                // Every page of a stored run keeps its write protection
                // until the drop; one in memory without it is memory the
                // program mapped (and wrote) since the run was checked,
                // which the probe below passes once it is managed. Read
                // first: the probe protects it too.
                match any_unprotected(pagemap, start, len) {
                    Ok(false) => {}
                    Ok(true) | Err(_) => return Err(DropError::Changed),
                }
                match uffd.write_protect(start, len, true) {
                    // The write-protect passes over holes (Linux 6.3 on).
                    Ok(()) if crate::sys::any_unmapped(start, start + len) => {
                        return Err(DropError::Changed)
                    }
                    Ok(()) if !maps.covers(start, start + len) => return Err(DropError::Changed),
                    Ok(()) => {}
                    Err(UffdError::Again | UffdError::NoMapping) => return Err(DropError::Changed),
                    Err(UffdError::ProcessGone) => return Err(DropError::Gone),
                    Err(UffdError::Os(e)) => return Err(DropError::Failed(e)),
                    Err(e) => return Err(DropError::Failed(io::Error::other(e))),
                }
                // SAFETY: the caller owns the range's folios (EVICTING) and
                // has stored their bytes.
                if unsafe { libc::madvise(start as *mut _, len, libc::MADV_DONTNEED) } == 0 {
                    return Ok(());
                }
                let e = io::Error::last_os_error();
                Err(match e.raw_os_error() {
                    Some(libc::ENOMEM) => DropError::Unmapped,
                    _ => DropError::Failed(e),
                })
            }
            Memory::Remote { dropper, .. } => dropper.drop_pages(start, len),
        }
    }

    /// Which pages of `start..start + len` (at most a folio) are in memory
    /// (or in the kernel's swap); none of those not mapped.
    pub fn present_pages(&self, start: usize, len: usize) -> PageMask {
        self.present_folios(start, len, 1)[0]
    }

    /// Which pages of each of the `count` folios of `folio_len` bytes from
    /// `start` on are in memory (or in the kernel's swap), looked at in one
    /// call while all of them are mapped; none of those not mapped.
    pub fn present_folios(&self, start: usize, folio_len: usize, count: usize) -> Vec<PageMask> {
        let per = folio_len / PAGE_SIZE;
        let len = folio_len * count;
        // One byte per page, its low bit set where the page is present.
        let mut pages = vec![0u8; per * count];
        match self {
            Memory::Own { .. } => {
                // SAFETY: mincore writes one byte per page of the range into
                // `pages`, which has one per page; an unmapped range is an
                // error.
                if unsafe { libc::mincore(start as *mut _, len, pages.as_mut_ptr()) } != 0 {
                    if count > 1 {
                        // Part of it is not mapped: a folio at a time.
                        return (0..count)
                            .map(|k| self.present_pages(start + k * folio_len, folio_len))
                            .collect();
                    }
                    // Part of the folio is not mapped: page by page.
                    for (p, page) in pages.iter_mut().enumerate() {
                        // SAFETY: as above, for one page.
                        let r = unsafe {
                            libc::mincore((start + p * PAGE_SIZE) as *mut _, PAGE_SIZE, page)
                        };
                        if r != 0 {
                            *page = 0;
                        }
                    }
                }
            }
            Memory::Remote { pagemap, .. } => {
                if let Ok(entries) = pagemap_entries(pagemap, start, len) {
                    for (page, e) in pages.iter_mut().zip(entries) {
                        *page = u8::from(e & (PM_PRESENT | PM_SWAPPED) != 0);
                    }
                }
            }
        }
        let mut masks = vec![PageMask::default(); count];
        for p in (0..pages.len()).filter(|&p| pages[p] & 1 != 0) {
            masks[p / per].insert_range(p % per, p % per + 1);
        }
        masks
    }

    /// Whether every page of `start..start + len` is in memory (or in the
    /// kernel's swap) and write-protected through userfaultfd, as a CLEAN
    /// folio's pages are from their install on; false also where the map
    /// cannot be read.
    pub fn all_protected(&self, start: usize, len: usize) -> bool {
        let (Memory::Own { pagemap, .. } | Memory::Remote { pagemap, .. }) = self;
        pagemap_entries(pagemap, start, len).is_ok_and(|entries| {
            entries
                .iter()
                .all(|&e| e & (PM_PRESENT | PM_SWAPPED) != 0 && e & PM_UFFD_WP != 0)
        })
    }

    /// The mapping (VMA) that holds `addr` now, if any.
    pub fn mapping_at(&self, addr: usize) -> Option<(usize, usize)> {
        self.maps().mapping_at(addr)
    }

    /// Whether `start..end` is private anonymous memory now, wholly: the
    /// only memory a runtime manages (a shared page's drop would bring an
    /// old copy back over another process's change; a file's private page
    /// dropped would read as the file's again; a huge page answers none of
    /// the runtime's 4 KiB calls).
    pub fn is_private_anonymous(&self, start: usize, end: usize) -> bool {
        let mut at = start;
        while at < end {
            match self.maps().at(at) {
                Some(Mapping {
                    end,
                    kind: MappingKind::PrivateAnonymous,
                    ..
                }) => at = end,
                _ => return false,
            }
        }
        true
    }

    /// The process's list of mappings.
    fn maps(&self) -> &Maps {
        match self {
            Memory::Own { maps, .. } | Memory::Remote { maps, .. } => maps,
        }
    }

    /// Whether any page of `start..end` is unmapped.
    pub fn any_unmapped(&self, start: usize, end: usize) -> bool {
        match self {
            Memory::Own { .. } => crate::sys::any_unmapped(start, end),
            // Mapping after mapping from `start`, as long as they adjoin.
            Memory::Remote { maps, .. } => {
                let mut at = start;
                while at < end {
                    match maps.mapping_at(at) {
                        Some((_, hi)) => at = hi,
                        None => return true,
                    }
                }
                false
            }
        }
    }
}

/// A process's list of mappings (`/proc/PID/maps`), open, to ask which
/// mapping holds an address. The kernel answers one mapping at a time
/// (PROCMAP_QUERY, Linux 6.11), where reading the listing costs a line per
/// mapping of the process; before 6.11, the listing is read.
pub(crate) struct Maps {
    path: String,
    /// Open once; `None` where it could not be (no /proc: every question
    /// then reads the listing, and finds none).
    file: Option<File>,
}

/// `struct procmap_query` (include/uapi/linux/fs.h): the mapping that
/// covers `query_addr`, with its name and build id not asked for.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = 0xC000_0000
    | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;

impl Maps {
    /// Whether one mapping covers `start..end` now.
    fn covers(&self, start: usize, end: usize) -> bool {
        self.mapping_at(start)
            .is_some_and(|(lo, hi)| lo <= start && hi >= end)
    }

    fn open(path: String) -> Maps {
        Maps {
            file: File::open(&path).ok(),
            path,
        }
    }

    /// The mapping that holds `addr` now, if any.
    fn mapping_at(&self, addr: usize) -> Option<(usize, usize)> {
        self.at(addr).map(|m| (m.start, m.end))
    }

    /// What the mapping that holds `addr` now is, if any.
    fn at(&self, addr: usize) -> Option<Mapping> {
        use std::os::fd::AsRawFd;
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr as u64,
            ..ProcmapQuery::default()
        };
        if let Some(file) = &self.file {
            // SAFETY: the ioctl reads and writes `q`, a `struct
            // procmap_query` of the size it says, and names no other memory
            // (no name or build id buffers).
            let r = unsafe { libc::ioctl(file.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
            if r == 0 {
                let kind = if q.inode == 0
                    && q.vma_flags & PROCMAP_QUERY_VMA_SHARED == 0
                    && q.vma_page_size == PAGE_SIZE as u64
                {
                    MappingKind::PrivateAnonymous
                } else {
                    MappingKind::Other
                };
                return Some(Mapping {
                    start: q.vma_start as usize,
                    end: q.vma_end as usize,
                    kind,
                });
            }
            // No mapping holds it.
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
                return None;
            }
        }
        // A kernel before 6.11 (or the process gone: the listing then says
        // nothing either).
        mapping_in(&std::fs::read_to_string(&self.path).ok()?, addr)
    }
}

/// One mapping of a process, as far as managing it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    kind: MappingKind,
}

/// What a mapping is, as far as managing it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MappingKind {
    /// Private, anonymous, of 4 KiB pages.
    PrivateAnonymous,
    /// Anything else: shared, of a file (shmem and memfd included), huge
    /// pages.
    Other,
}

/// `PROCMAP_QUERY_VMA_SHARED` (include/uapi/linux/fs.h).
const PROCMAP_QUERY_VMA_SHARED: u64 = 8;

/// The mapping holding `addr` in a /proc/PID/maps listing.
fn mapping_in(maps: &str, addr: usize) -> Option<Mapping> {
    maps.lines()
        .filter_map(maps_line)
        .find(|m| m.start <= addr && addr < m.end)
}

/// One line of /proc/PID/maps (`start-end perms offset dev inode [path]`).
/// A hugetlb mapping has an inode of its own.
fn maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (lo, hi) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let inode = fields.nth(2)?;
    let kind = if perms.ends_with('p') && inode == "0" {
        MappingKind::PrivateAnonymous
    } else {
        MappingKind::Other
    };
    Some(Mapping {
        start: usize::from_str_radix(lo, 16).ok()?,
        end: usize::from_str_radix(hi, 16).ok()?,
        kind,
    })
}

/// What a process told the kernel (madvise) about handing a mapping to a
/// forked child, where it said anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForkAdvice {
    /// MADV_WIPEONFORK (`wf` in the mapping's VmFlags): the child gets the
    /// mapping empty; it reads as zero there. The mark stays on the
    /// child's mapping, so the child's own children get it empty too.
    Wipe,
    /// MADV_DONTFORK (`dc`): the child has no mapping there at all.
    DontCopy,
}

/// The mappings with fork advice in a /proc/PID/smaps listing, in its
/// order. Only smaps shows the flags (PROCMAP_QUERY tells read, write,
/// execute and shared only).
fn fork_advice_in(mut smaps: impl io::BufRead) -> Vec<(usize, usize, ForkAdvice)> {
    let mut out = Vec::new();
    let mut mapping = None;
    // Bytes, not text: a mapping's name (a file's, a memfd's) need not be
    // UTF-8, and a line that is not would end a read of text there.
    let mut raw = Vec::new();
    while matches!(smaps.read_until(b'\n', &mut raw), Ok(n) if n > 0) {
        let line = String::from_utf8_lossy(&raw);
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let has = |flag| flags.split_whitespace().any(|f| f == flag);
            // Not copied at all wins over copied empty (as in the kernel's
            // fork).
            let advice = if has("dc") {
                Some(ForkAdvice::DontCopy)
            } else if has("wf") {
                Some(ForkAdvice::Wipe)
            } else {
                None
            };
            if let (Some((lo, hi)), Some(advice)) = (mapping.take(), advice) {
                out.push((lo, hi, advice));
            }
        } else if let Some(m) = maps_line(&line) {
            mapping = Some((m.start, m.end));
        }
        raw.clear();
    }
    out
}

/// Whether a page of `start..start + len` is in memory without the
/// userfaultfd write protection.
fn any_unprotected(pagemap: &File, start: usize, len: usize) -> io::Result<bool> {
    Ok(pagemap_entries(pagemap, start, len)?
        .iter()
        .any(|&e| e & PM_PRESENT != 0 && e & PM_UFFD_WP == 0))
}

/// The pagemap entries of `start..start + len`.
fn pagemap_entries(pagemap: &File, start: usize, len: usize) -> io::Result<Vec<u64>> {
    let pages = len / PAGE_SIZE;
    let mut raw = vec![0u8; pages * 8];
    pagemap.read_exact_at(&mut raw, (start / PAGE_SIZE * 8) as u64)?;
    Ok(raw
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOLIO: usize = 16 * PAGE_SIZE;

    /// Four folios of new private memory with pages `touched` (folio,
    /// page) written, the rest never touched.
    fn four_folios(touched: &[(usize, usize)]) -> usize {
        // SAFETY: a new private mapping of our own.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * FOLIO,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        for &(f, p) in touched {
            // SAFETY: inside the mapping made above.
            unsafe { *((base as usize + f * FOLIO + p * PAGE_SIZE) as *mut u8) = 1 };
        }
        base as usize
    }

    fn mask(pages: &[usize]) -> PageMask {
        let mut m = PageMask::default();
        for &p in pages {
            m.insert_range(p, p + 1);
        }
        m
    }

    #[test]
    fn present_folios_reads_each_folio_of_a_span_as_one_look_would() {
        let memory = Memory::own(None).unwrap();
        let touched = [(0, 0), (0, 3), (1, 15), (3, 7), (3, 8)];
        let base = four_folios(&touched);
        let want = [mask(&[0, 3]), mask(&[15]), mask(&[]), mask(&[7, 8])];
        assert_eq!(memory.present_folios(base, FOLIO, 4), want);
        for (k, w) in want.iter().enumerate() {
            assert_eq!(memory.present_pages(base + k * FOLIO, FOLIO), *w);
        }
        // SAFETY: the mapping made above, which nothing else uses.
        unsafe { libc::munmap(base as *mut _, 4 * FOLIO) };
    }

    #[test]
    fn present_folios_over_a_hole_reads_the_rest() {
        let memory = Memory::own(None).unwrap();
        let base = four_folios(&[(1, 0), (1, 9), (2, 2), (2, 12), (3, 1)]);
        // Pages 4..10 of folio 1 unmapped: the span's single look fails,
        // and each folio is read on its own (folio 1 page by page).
        // SAFETY: part of the mapping made above.
        assert_eq!(
            unsafe { libc::munmap((base + FOLIO + 4 * PAGE_SIZE) as *mut _, 6 * PAGE_SIZE) },
            0
        );
        let want = [mask(&[]), mask(&[0]), mask(&[2, 12]), mask(&[1])];
        assert_eq!(memory.present_folios(base, FOLIO, 4), want);
        // SAFETY: what is left of the mapping made above.
        unsafe { libc::munmap(base as *mut _, 4 * FOLIO) };
    }

    /// A mapping whose name is not UTF-8 does not end the listing.
    #[test]
    fn fork_advice_reads_past_a_name_that_is_not_text() {
        let listing: &[u8] =
            b"7f0000000000-7f0000001000 rw-s 00000000 00:01 7 /memfd:\xff\xfe (deleted)\n\
Size:                  4 kB\n\
VmFlags: rd wr sh mr mw me ms sd\n\
7f0000010000-7f0000020000 rw-p 00000000 00:00 0 \n\
Size:                 64 kB\n\
VmFlags: rd wr mr mw me ac wf\n";
        assert_eq!(
            fork_advice_in(listing),
            [(0x7f00_0001_0000, 0x7f00_0002_0000, ForkAdvice::Wipe)]
        );
    }

    /// The kernel's own listing of this process: a mapping split in four
    /// by advice shows each part with what it was told (and DONTFORK over
    /// WIPEONFORK as not copied).
    #[test]
    fn fork_advice_reads_each_mapping_as_advised() {
        let memory = Memory::own(None).unwrap();
        let base = four_folios(&[]);
        let advise = |folio: usize, count: usize, advice| {
            // SAFETY: advice on part of the mapping made above.
            let r =
                unsafe { libc::madvise((base + folio * FOLIO) as *mut _, count * FOLIO, advice) };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
        };
        advise(0, 1, libc::MADV_WIPEONFORK);
        advise(2, 2, libc::MADV_DONTFORK);
        advise(3, 1, libc::MADV_WIPEONFORK);
        let mine: Vec<_> = memory
            .fork_advice()
            .into_iter()
            .filter(|&(lo, hi, _)| lo < base + 4 * FOLIO && base < hi)
            .collect();
        assert_eq!(
            mine,
            [
                (base, base + FOLIO, ForkAdvice::Wipe),
                (base + 2 * FOLIO, base + 3 * FOLIO, ForkAdvice::DontCopy),
                (base + 3 * FOLIO, base + 4 * FOLIO, ForkAdvice::DontCopy),
            ]
        );
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(base as *mut _, 4 * FOLIO) };
    }
}

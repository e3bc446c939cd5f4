//! userfaultfd, typed: the descriptor, the events it delivers, and one
//! error type for every ioctl outcome the runtime must tell apart.
//!
//! The uapi structures are declared here (libc does not carry them). Each
//! ioctl answers with a [`UffdError`]:
//!
//! | errno    | variant                    | what the caller does                          |
//! |----------|----------------------------|-----------------------------------------------|
//! | `EEXIST` | [`UffdError::Exists`]      | a page is already there: skip it, wake        |
//! | `EAGAIN` | [`UffdError::Again`]       | the mapping is changing: read events, retry   |
//! | `ENOENT` | [`UffdError::NoMapping`]   | no registered mapping covers the whole range  |
//! | `ESRCH`  | [`UffdError::ProcessGone`] | the address space has exited (or exec'd)      |
//! | `EBUSY`  | [`UffdError::Busy`]        | a page cannot move (shared, pinned): keep it  |
//! | other    | [`UffdError::Os`]          | a bug or an unsupported kernel: fail loudly   |
//!
//! A descriptor acts on the address space that created it, whoever calls the
//! ioctls, so the same code serves the runtime's own process and any other
//! address space whose descriptor it holds (a forked child's, which arrives
//! with [`Event::Fork`]).

use crate::page::PAGE_SIZE;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
const IOC_TYPE: u64 = 0xAA;

const fn iowr(nr: u64, size: usize) -> u64 {
    3 << 30 | (size as u64) << 16 | IOC_TYPE << 8 | nr
}

const fn ior(nr: u64, size: usize) -> u64 {
    2 << 30 | (size as u64) << 16 | IOC_TYPE << 8 | nr
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}

/// `struct uffdio_continue`: asked only as a probe (see
/// [`Uffd::registered_anonymous`]).
#[repr(C)]
#[derive(Default)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_CONTINUE: u64 = iowr(0x07, std::mem::size_of::<UffdioContinue>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
const UFFDIO_MOVE: u64 = iowr(0x05, std::mem::size_of::<UffdioMove>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
const UFFDIO_POISON: u64 = iowr(0x08, std::mem::size_of::<UffdioPoison>());
/// `/dev/userfaultfd`'s ioctl for a new descriptor: _IO(0xAA, 0x00).
const USERFAULTFD_IOC_NEW: u64 = IOC_TYPE << 8;

const REGISTER_MODE_MISSING: u64 = 1;
const REGISTER_MODE_WP: u64 = 2;
const COPY_MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;
const WRITEPROTECT_MODE_WP: u64 = 1;
const ZEROPAGE_MODE_DONTWAKE: u64 = 1;
const POISON_MODE_DONTWAKE: u64 = 1;
const MOVE_MODE_DONTWAKE: u64 = 1;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;

const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_EVENT_FORK: u64 = 1 << 1;
const FEATURE_EVENT_REMAP: u64 = 1 << 2;
const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURE_THREAD_ID: u64 = 1 << 8;
const FEATURE_POISON: u64 = 1 << 14;
const FEATURE_MOVE: u64 = 1 << 16;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1;
const PAGEFAULT_FLAG_WP: u64 = 2;

/// The kernel's `struct uffd_msg`: an event code and a three-word union.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct RawMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg: [u64; 3],
}

const RAW_MSG_SIZE: usize = 32;
const _: () = assert!(std::mem::size_of::<RawMsg>() == RAW_MSG_SIZE);

/// What an ioctl on the descriptor answered, when it was not success.
#[derive(Debug)]
pub enum UffdError {
    /// `EEXIST`: a page is already mapped at the address (someone filled it).
    Exists,
    /// `EAGAIN`: the address space is changing under an unread
    /// non-cooperative event; retry after the events have been read.
    Again,
    /// `ENOENT` (or `EINVAL` from a range check): no mapping registered
    /// with this descriptor covers the whole range; it was unmapped, moved,
    /// or split by mprotect and similar calls. From an ioctl that fills or
    /// moves pages, only once no change of the mappings is in flight (see
    /// [`Uffd::no_mapping`]).
    NoMapping,
    /// `ESRCH`: the address space has exited or replaced itself (exec).
    ProcessGone,
    /// `EBUSY` from a move: a page is not this address space's alone (a
    /// forked child shares it, KSM merged it) or is pinned.
    Busy,
    /// Anything else: a bug or an unsupported kernel.
    Os(io::Error),
}

impl UffdError {
    fn last() -> UffdError {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EEXIST) => UffdError::Exists,
            Some(libc::EAGAIN) => UffdError::Again,
            Some(libc::ENOENT) => UffdError::NoMapping,
            Some(libc::ESRCH) => UffdError::ProcessGone,
            Some(libc::EBUSY) => UffdError::Busy,
            _ => UffdError::Os(e),
        }
    }
}

impl fmt::Display for UffdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UffdError::Exists => f.write_str("a page is already mapped there (EEXIST)"),
            UffdError::Again => f.write_str("the mapping is changing (EAGAIN)"),
            UffdError::NoMapping => f.write_str("no registered mapping covers the range (ENOENT)"),
            UffdError::ProcessGone => f.write_str("the address space is gone (ESRCH)"),
            UffdError::Busy => f.write_str("a page is shared or pinned (EBUSY)"),
            UffdError::Os(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for UffdError {}

impl From<UffdError> for io::Error {
    fn from(e: UffdError) -> io::Error {
        match e {
            UffdError::Os(e) => e,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// A filling ioctl that stopped early: how many bytes it had filled, and why
/// it stopped.
#[derive(Debug)]
pub struct Partial {
    /// Bytes filled from the start of the range before the error.
    pub filled: usize,
    /// Why it stopped.
    pub error: UffdError,
}

/// One event read from the descriptor.
#[derive(Debug)]
pub enum Event {
    /// A thread touched a registered page that is missing, or wrote to a
    /// write-protected one.
    PageFault {
        /// The faulting address (not page-aligned).
        addr: usize,
        /// The access was a write.
        write: bool,
        /// The fault is a write-protect fault (the page is present).
        wp: bool,
        /// The faulting thread's id.
        tid: u32,
    },
    /// The address space forked: the child's registered ranges now raise
    /// their events on `child`.
    Fork {
        /// The child's descriptor (same features as this one).
        child: Uffd,
    },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Bytes moved (the old length; a shrink has already unmapped the rest).
        len: usize,
    },
    /// `madvise(MADV_DONTNEED/MADV_REMOVE)` is about to drop `start..end`;
    /// the zap happens after this event is read.
    Remove {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
    },
    /// `munmap` (or a mapping replaced over it) removed `start..end`.
    Unmap {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
    },
}

/// A new userfaultfd descriptor (through /dev/userfaultfd, else the
/// syscall), features not yet negotiated.
fn create() -> io::Result<OwnedFd> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: opening a device node by a NUL-terminated path.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let raw = if dev >= 0 {
        // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument and
        // returns a new descriptor.
        let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW as _, flags) };
        // SAFETY: `dev` is ours and closed once.
        unsafe { libc::close(dev) };
        fd
    } else {
        // SAFETY: the userfaultfd syscall takes only flags.
        unsafe { libc::syscall(libc::SYS_userfaultfd, flags) as libc::c_int }
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("userfaultfd unavailable: {e}"),
        ));
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A userfaultfd descriptor with the features the runtime relies on.
pub struct Uffd {
    fd: OwnedFd,
    /// UFFDIO_MOVE was negotiated (Linux 6.8).
    moves: bool,
}

impl fmt::Debug for Uffd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uffd({})", self.fd.as_raw_fd())
    }
}

/// The features [`Uffd::open`] negotiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Fork events: a child's missing pages keep faulting (on its own
    /// descriptor) instead of reading as zeros. Needs CAP_SYS_PTRACE.
    pub fork: bool,
}

/// The page `Uffd::is_alive` probes: the last below the 47-bit limit of
/// every x86-64 address space, where at most a stack lies, which nothing
/// registers. Not page 0: many kernels (their `validate_range` until a 2026
/// change) refuse a range below `mmap_min_addr` with EINVAL before they
/// look at the address space, so a probe there never saw it gone.
const PROBE_PAGE: usize = (1 << 47) - 2 * PAGE_SIZE;

impl Uffd {
    /// Opens a descriptor (through /dev/userfaultfd, else the syscall) and
    /// negotiates write-protect faults, thread ids, poison, and the remove,
    /// unmap, remap and (when `features.fork`) fork events.
    pub fn open(features: Features) -> io::Result<Uffd> {
        Uffd::adopt(create()?, features)
    }

    /// Takes a userfaultfd another process created (and sent over a unix
    /// socket) and negotiates the same features as [`Uffd::open`], with
    /// moves (UFFDIO_MOVE) where the kernel has them. Its ioctls act on that
    /// process.
    pub fn adopt(fd: OwnedFd, features: Features) -> io::Result<Uffd> {
        let mut wanted = FEATURE_PAGEFAULT_FLAG_WP
            | FEATURE_EVENT_REMAP
            | FEATURE_EVENT_REMOVE
            | FEATURE_EVENT_UNMAP
            | FEATURE_THREAD_ID
            | FEATURE_POISON;
        if features.fork {
            wanted |= FEATURE_EVENT_FORK;
        }
        let uffd = Uffd { fd, moves: true };
        // A kernel without moves refuses the whole request (EINVAL) and
        // takes none of it: ask again without.
        for moves in [true, false] {
            let mut api = UffdioApi {
                api: UFFD_API,
                features: wanted | if moves { FEATURE_MOVE } else { 0 },
                ioctls: 0,
            };
            match uffd.ioctl(UFFDIO_API, &mut api) {
                Ok(()) => return Ok(Uffd { moves, ..uffd }),
                Err(UffdError::Os(e)) if moves && e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => {
                    let hint = if features.fork {
                        " (fork events need CAP_SYS_PTRACE)"
                    } else {
                        ""
                    };
                    return Err(io::Error::other(format!(
                        "UFFDIO_API with write-protect and events{hint}: {e}"
                    )));
                }
            }
        }
        unreachable!("the request without moves either succeeds or fails")
    }

    /// Whether pages can be moved into memory registered with this
    /// descriptor (UFFDIO_MOVE).
    pub fn moves(&self) -> bool {
        self.moves
    }

    /// A second descriptor for the same userfaultfd (dup): it acts on the
    /// same registrations and events.
    pub fn try_clone(&self) -> io::Result<Uffd> {
        Ok(Uffd {
            fd: self.fd.try_clone()?,
            moves: self.moves,
        })
    }

    fn ioctl<T>(&self, request: u64, arg: &mut T) -> Result<(), UffdError> {
        // SAFETY: every request is paired with the structure its number
        // encodes, passed by exclusive reference for the call's duration.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), request as _, arg as *mut T) };
        if r < 0 {
            Err(UffdError::last())
        } else {
            Ok(())
        }
    }

    /// An ioctl that fills or moves pages (copy, zero page, continue,
    /// poison, move), whose ENOENT is taken for what it means (see
    /// [`Uffd::no_mapping`]).
    fn fill_ioctl<T>(&self, request: u64, arg: &mut T) -> Result<(), UffdError> {
        self.ioctl(request, arg).map_err(|e| match e {
            UffdError::NoMapping => self.no_mapping(),
            e => e,
        })
    }

    /// What an ENOENT from an ioctl that fills or moves pages means. Such
    /// an ioctl looks the mapping up, and answers ENOENT where there is
    /// none, before it looks under the address space's lock for a change
    /// of the mappings in flight (an event raised and unread: EAGAIN; a
    /// copy looks once before too, without the lock). So an munmap or
    /// mremap that comes just before the look-up gives ENOENT while the
    /// event that says where the pages went is still unread
    /// (`bench/probes/uffd-copy-enoent.c`: in 11 to 53 of 200
    /// races of a copy against a move of its page on Linux 6.18, the probe
    /// below answering EAGAIN every time). Taken for no mapping, it made an
    /// install skip as unmapped a page that had moved. So it is asked by the
    /// probe, which looks for changes under the lock ([`Uffd::is_changing`]):
    /// `Again` while a change is in flight (the caller reads the events and
    /// tries again, as for EAGAIN), `NoMapping` once none is.
    pub(crate) fn no_mapping(&self) -> UffdError {
        if self.is_changing() {
            UffdError::Again
        } else {
            UffdError::NoMapping
        }
    }

    /// The descriptor, for poll.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Lets go of this process's reference to the userfaultfd, keeping the
    /// descriptor's number taken: it refers to `placeholder` (an open
    /// /dev/null) from then on, until dropped, so that nothing still holding
    /// the number acts on an unrelated file. Once no process holds the
    /// userfaultfd, the kernel unregisters all memory registered with it and
    /// wakes whatever waits on it. Uses no allocation (a forked child's
    /// handler calls it).
    pub fn let_go(&self, placeholder: i32) -> io::Result<()> {
        // SAFETY: replaces our own descriptor's file; `placeholder` is the
        // caller's open descriptor.
        if unsafe { libc::dup3(placeholder, self.fd.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Registers a range for missing and write-protect faults.
    pub fn register(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut reg = UffdioRegister {
            range: range(start, len),
            mode: REGISTER_MODE_MISSING | REGISTER_MODE_WP,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut reg)
    }

    /// Registers a range for write-protect faults only: enough to move
    /// pages into it (UFFDIO_MOVE asks only that the destination be
    /// registered with the descriptor it is made through), while a read of a missing page
    /// there gets a zero page from the kernel instead of waiting on a
    /// descriptor nobody reads.
    pub fn register_for_moves(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut reg = UffdioRegister {
            range: range(start, len),
            mode: REGISTER_MODE_WP,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut reg)
    }

    /// Unregisters a range; threads blocked on it are woken. Where the
    /// range holds no mapping, or one a userfaultfd cannot act on, the
    /// kernel answers EINVAL (not ENOENT as elsewhere): taken as
    /// [`UffdError::NoMapping`].
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), UffdError> {
        match self.ioctl(UFFDIO_UNREGISTER, &mut range(start, len)) {
            Err(UffdError::Os(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                Err(UffdError::NoMapping)
            }
            other => other,
        }
    }

    /// Wakes the threads blocked on faults in the range.
    pub fn wake(&self, start: usize, len: usize) -> Result<(), UffdError> {
        self.ioctl(UFFDIO_WAKE, &mut range(start, len))
    }

    /// One UFFDIO_COPY of `src` to `dst` (whole pages, inside one mapping),
    /// waking nobody; with `write_protect` the pages are installed
    /// write-protected. On error, [`Partial::filled`] says how far it got.
    pub fn copy(&self, dst: usize, src: &[u8], write_protect: bool) -> Result<(), Partial> {
        self.copy_in_mode(
            dst,
            src,
            COPY_MODE_DONTWAKE | if write_protect { COPY_MODE_WP } else { 0 },
        )
    }

    /// One UFFDIO_COPY of `src` to `dst` (whole pages, inside one mapping)
    /// that wakes the threads waiting on faults in the range once the pages
    /// are in: one call fewer than [`Uffd::copy`] and a wake. On error,
    /// [`Partial::filled`] says how far it got (the kernel woke that part).
    pub fn copy_waking(&self, dst: usize, src: &[u8]) -> Result<(), Partial> {
        self.copy_in_mode(dst, src, 0)
    }

    fn copy_in_mode(&self, dst: usize, src: &[u8], mode: u64) -> Result<(), Partial> {
        let mut c = UffdioCopy {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode,
            copy: 0,
        };
        self.fill_ioctl(UFFDIO_COPY, &mut c)
            .map_err(|error| Partial {
                filled: c.copy.max(0) as usize,
                error,
            })
    }

    /// Moves the pages of `src..src + len` (anonymous, this address space's
    /// alone) to `dst`, which must be registered with this descriptor and
    /// empty, without copying them; holes in the source are skipped, and
    /// nobody is woken. On error, [`Partial::filled`] says how much of the
    /// range was done.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize) -> Result<(), Partial> {
        let mut m = UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: MOVE_MODE_DONTWAKE | MOVE_MODE_ALLOW_SRC_HOLES,
            moved: 0,
        };
        self.fill_ioctl(UFFDIO_MOVE, &mut m)
            .map_err(|error| Partial {
                filled: m.moved.max(0) as usize,
                error,
            })
    }

    /// Maps the kernel's zero page (read-only; a write copies it) at the
    /// missing pages of the range, waking nobody; stops at the first page
    /// already there ([`UffdError::Exists`]).
    pub fn zero_pages(&self, start: usize, len: usize) -> Result<(), Partial> {
        let mut z = UffdioZeropage {
            range: range(start, len),
            mode: ZEROPAGE_MODE_DONTWAKE,
            zeropage: 0,
        };
        self.fill_ioctl(UFFDIO_ZEROPAGE, &mut z)
            .map_err(|error| Partial {
                filled: z.zeropage.max(0) as usize,
                error,
            })
    }

    /// Whether the page at `addr` of this descriptor's address space lies
    /// in anonymous memory registered with a userfaultfd, asked without
    /// changing what it holds: UFFDIO_CONTINUE, which installs pages of
    /// shared memory only, is refused with EINVAL for registered anonymous
    /// memory and ENOENT where no registered mapping holds the page (the
    /// kernel looks for the mapping first; which userfaultfd it is
    /// registered with, it does not check). `None` where the kernel would
    /// not say (EAGAIN: the address space is changing under an unread
    /// event; ENOMEM).
    pub fn registered_anonymous(&self, addr: usize) -> Option<bool> {
        let mut c = UffdioContinue {
            range: range(addr, PAGE_SIZE),
            ..UffdioContinue::default()
        };
        match self.fill_ioctl(UFFDIO_CONTINUE, &mut c) {
            Err(UffdError::Os(e)) if e.raw_os_error() == Some(libc::EINVAL) => Some(true),
            Err(UffdError::NoMapping) => Some(false),
            _ => None,
        }
    }

    /// Marks the missing pages of the range poisoned (a touch raises SIGBUS),
    /// waking nobody.
    pub fn poison(&self, start: usize, len: usize) -> Result<(), Partial> {
        let mut p = UffdioPoison {
            range: range(start, len),
            mode: POISON_MODE_DONTWAKE,
            updated: 0,
        };
        self.fill_ioctl(UFFDIO_POISON, &mut p)
            .map_err(|error| Partial {
                filled: p.updated.max(0) as usize,
                error,
            })
    }

    /// Write-protects the range (present and missing pages: writers then
    /// fault and wait), or, with `protect` false, lifts the protection and
    /// wakes them.
    pub fn write_protect(&self, start: usize, len: usize, protect: bool) -> Result<(), UffdError> {
        let mut wp = UffdioWriteprotect {
            range: range(start, len),
            mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
        };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut wp)
    }

    /// A write-protect change of one page that nothing registers: it says
    /// EAGAIN while a change of the mappings is in flight and ESRCH once
    /// the process has exited, both before it looks for the range (ENOENT
    /// otherwise). An empty range would be refused before the address
    /// space is looked at.
    fn probe(&self) -> Result<(), UffdError> {
        self.write_protect(PROBE_PAGE, PAGE_SIZE, false)
    }

    /// Whether the address space behind the descriptor still exists.
    pub fn is_alive(&self) -> bool {
        !matches!(self.probe(), Err(UffdError::ProcessGone))
    }

    /// Whether a change of the address space's mappings is in flight: an
    /// event raised and unread, or read with its thread not yet on its way
    /// (a fork counts from its copy of the page tables on). The kernel
    /// refuses every install then (EAGAIN).
    pub fn is_changing(&self) -> bool {
        matches!(self.probe(), Err(UffdError::Again))
    }

    /// Whether the process is alive with no change of its mappings in
    /// flight.
    pub fn is_quiet(&self) -> bool {
        matches!(self.probe(), Ok(()) | Err(UffdError::NoMapping))
    }

    /// Reads the pending events (at most `most`, at most 64) without
    /// blocking and appends them to `out`; returns how many. A fork's
    /// descriptor is owned as soon as it is read.
    pub fn read_events(&self, out: &mut Vec<Event>, most: usize) -> Result<usize, UffdError> {
        const BATCH: usize = 64;
        let most = most.clamp(1, BATCH);
        let mut buf = [RawMsg {
            event: 0,
            reserved1: 0,
            reserved2: 0,
            reserved3: 0,
            arg: [0; 3],
        }; BATCH];
        // SAFETY: `buf` is writable for its length in bytes; RawMsg is plain
        // data whose every bit pattern is valid.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                most * RAW_MSG_SIZE,
            )
        };
        if n < 0 {
            return match UffdError::last() {
                UffdError::Again => Ok(0),
                e => Err(e),
            };
        }
        let count = n as usize / RAW_MSG_SIZE;
        for msg in &buf[..count] {
            let arg = msg.arg;
            out.push(match msg.event {
                EVENT_PAGEFAULT => Event::PageFault {
                    addr: arg[1] as usize,
                    write: arg[0] & PAGEFAULT_FLAG_WRITE != 0,
                    wp: arg[0] & PAGEFAULT_FLAG_WP != 0,
                    tid: arg[2] as u32,
                },
                EVENT_FORK => Event::Fork {
                    // A child's descriptor shares its parent's features.
                    child: Uffd {
                        // SAFETY: the kernel installed this descriptor in
                        // our table for this message; nothing else owns it.
                        fd: unsafe { OwnedFd::from_raw_fd(arg[0] as u32 as i32) },
                        moves: self.moves,
                    },
                },
                EVENT_REMAP => Event::Remap {
                    from: arg[0] as usize,
                    to: arg[1] as usize,
                    len: arg[2] as usize,
                },
                EVENT_REMOVE => Event::Remove {
                    start: arg[0] as usize,
                    end: arg[1] as usize,
                },
                EVENT_UNMAP => Event::Unmap {
                    start: arg[0] as usize,
                    end: arg[1] as usize,
                },
                other => {
                    return Err(UffdError::Os(io::Error::other(format!(
                        "unknown userfaultfd event {other:#x}"
                    ))))
                }
            });
        }
        Ok(count)
    }
}

fn range(start: usize, len: usize) -> UffdioRange {
    UffdioRange {
        start: start as u64,
        len: len as u64,
    }
}

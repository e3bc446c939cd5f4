//! The agent: the library `uswap run` preloads (LD_PRELOAD) into the
//! program it serves.
//!
//! Before `main`, if the supervisor's socket is named in the environment
//! (`USWAP_AGENT_SOCKET`), the agent creates a userfaultfd, hands it to the
//! supervisor with the program's pid and the range of its own thread's
//! stack, and waits for the verdict:
//!
//! ```text
//! init (before main) --connect--> hello + uffd --> verdict
//!                                                   |- Managed:   start the agent thread, return
//!                                                   |- Unmanaged: close everything, return
//!                                                   '- Exit:      _exit(1)
//! agent thread: loop { request -> UFFDIO_MOVE to the scratch | MADV_DONTNEED -> answer }
//!               Release -> close, end quietly
//!               end of file (the supervisor died) -> kill the program
//! ```
//!
//! Why a thread inside the program: the kernel refuses MADV_DONTNEED on
//! another process (`process_madvise` gives EINVAL), and dropping pages is
//! the last step of every eviction.
//!
//! Dropped in place, stored pages raise a REMOVE event on the program's
//! userfaultfd that looks like the program's own MADV_DONTNEED, and the
//! madvise waits until the supervisor has read it. So the agent first moves
//! them out (UFFDIO_MOVE, Linux 6.8; it works only inside the caller's own
//! address space, hence the agent) through the program's descriptor into
//! a scratch of its own, registered with that descriptor for write-protect
//! faults only, and empties the scratch when it is full (unregistered
//! meanwhile, so that the drop raises no event). Pages shared with a
//! forked child stay (the supervisor is told EBUSY); only pages in a
//! mapping of other protection are dropped in place. The supervisor checks
//! a range under its settled gate and lets the gate go before it asks,
//! reading none of the program's events until the answer, so the agent
//! checks it again right before the move (see `move_out`); and the kernel
//! refuses a move through the program's descriptor while one of its
//! events is unread. The
//! scratch lies right after the agent thread's stack, and both are the
//! agent's own memory, which the supervisor never manages:
//!
//! ```text
//!   own memory:  [ agent thread's stack | scratch (2 MiB) ]
//!                  unregistered           registered with the program's
//!                                         descriptor, write-protect only
//! ```
//!
//! What it never does: allocate through the program's malloc on the agent
//! thread (its loop uses its own stack, which the agent mapped itself and
//! the supervisor leaves unmanaged), touch managed memory, or stand in the
//! program's way when no supervisor answers (one line on stderr, then
//! nothing). It keeps its own copy of the userfaultfd: if the supervisor
//! dies, the program's faults on pages that are gone then wait instead of
//! reading zeros, until the agent thread, seeing the socket close without
//! a Release, ends the program with a message.
//!
//! A forked child (fork handler) lets go of its parent's connection and
//! descriptor, then asks to be adopted: its memory is already served
//! through the descriptor the supervisor got with the fork event, which
//! does not say whose it is, so the child first touches its copy of the
//! beacon, a page the agent keeps unpopulated (the fault reaches the
//! supervisor with the child's pid), makes it unpopulated again for its own
//! children, connects, and starts its own agent thread on its copy of the
//! agent's stack. The supervisor sends it its descriptor, which it keeps
//! for the same reason as above. In the parent, the fork handler touches
//! the fence, the page after the beacon, and so waits until the supervisor
//! has applied the fork (see `forked_parent`). An exec starts the agent
//! afresh in the new image.

#![deny(missing_docs)]

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

mod maps;
mod mremap;
use uswap_protocol::{
    content_hash, wire, Dropped, Hello, MovedOut, Request, Verdict, AGENT_THREAD_NAME_C,
    BEACON_PAGES, DISCARD_RANGES, PACKET, SOCKET_ENV_C,
};

/// The connection to the supervisor (-1: none).
static SOCKET: AtomicI32 = AtomicI32::new(-1);
/// The agent's copy of the userfaultfd (-1: none).
static UFFD: AtomicI32 = AtomicI32::new(-1);
/// This image is served (a forked child asks to be adopted).
static MANAGED: AtomicBool = AtomicBool::new(false);
/// The inode of the connection, to tell it from a descriptor the program
/// opened under the same number after closing ours.
static SOCKET_INODE: AtomicU64 = AtomicU64::new(0);
/// The inode of the agent's copy of the userfaultfd.
static UFFD_INODE: AtomicU64 = AtomicU64::new(0);
/// The agent thread's stack (also a forked child's, at the same address).
static STACK_BASE: AtomicUsize = AtomicUsize::new(0);
/// The beacon page, with the fence after it (see the module docs).
static BEACON: AtomicUsize = AtomicUsize::new(0);
/// The supervisor's socket name, for forked children (no allocation there).
static NAME: OnceLock<([u8; 108], usize)> = OnceLock::new();

const PAGE: usize = 4096;

/// Runs before `main` (and before the constructors of libraries loaded
/// after the agent).
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The agent thread's stack, mapped by the agent.
const STACK: usize = 256 << 10;

/// `_IO(0xAA, 0x00)`: a new userfaultfd from /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;

/// The scratch: one 2 MiB folio, or a run of smaller ones, per move.
const SCRATCH: usize = 2 << 20;

/// `_IOWR(0xAA, nr, size)`.
const fn uffd_iowr(nr: libc::c_ulong, size: usize) -> libc::c_ulong {
    (3 << 30) | ((size as libc::c_ulong) << 16) | (0xAA << 8) | nr
}
/// `_IOR(0xAA, nr, size)`.
const fn uffd_ior(nr: libc::c_ulong, size: usize) -> libc::c_ulong {
    (2 << 30) | ((size as libc::c_ulong) << 16) | (0xAA << 8) | nr
}
/// `struct uffdio_register`: start, len, mode, ioctls.
const UFFDIO_REGISTER: libc::c_ulong = uffd_iowr(0x00, 32);
/// `struct uffdio_range`: start, len.
const UFFDIO_UNREGISTER: libc::c_ulong = uffd_ior(0x01, 16);
/// `struct uffdio_writeprotect`: start, len, mode.
const UFFDIO_WRITEPROTECT: libc::c_ulong = uffd_iowr(0x06, 24);
/// `struct uffdio_move`: dst, src, len, mode, move (bytes moved, or a
/// negative errno).
const UFFDIO_MOVE: libc::c_ulong = uffd_iowr(0x05, 40);
const REGISTER_MODE_WP: u64 = 2;
const WRITEPROTECT_MODE_WP: u64 = 1;
const MOVE_MODE_DONTWAKE: u64 = 1;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;

extern "C" fn init() {
    // SAFETY: before main, one thread; the value is read at once.
    let name = unsafe { libc::getenv(SOCKET_ENV_C.as_ptr()) };
    if name.is_null() {
        return;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    if let Err(what) = start(name) {
        say(&[what, "; the program runs without uswap"]);
    }
}

/// Writes one line to stderr, without allocating.
fn say(parts: &[&str]) {
    // One write (no allocation here: see the module docs), so that the
    // line is not cut by the program's own output in between.
    const MAX: usize = 16;
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iov = [empty; MAX + 2];
    let piece = |s: &str| libc::iovec {
        iov_base: s.as_ptr() as *mut libc::c_void,
        iov_len: s.len(),
    };
    iov[0] = piece("uswap agent: ");
    let n = parts.len().min(MAX);
    for (slot, p) in iov[1..].iter_mut().zip(&parts[..n]) {
        *slot = piece(p);
    }
    iov[n + 1] = piece("\n");
    // SAFETY: every iovec points into a borrowed string that outlives the
    // call; writev only reads them.
    unsafe { libc::writev(2, iov.as_ptr(), (n + 2) as libc::c_int) };
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: closing a descriptor the agent owns.
        unsafe { libc::close(fd) };
    }
}

/// A new userfaultfd (not yet negotiated: the supervisor does that), or the
/// errno that prevented it.
fn new_userfaultfd() -> Result<i32, i32> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: opening a device node by a NUL-terminated path.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev >= 0 {
        // SAFETY: USERFAULTFD_IOC_NEW takes the flags and returns a new
        // descriptor.
        let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW as _, flags) };
        close(dev);
        if fd >= 0 {
            return Ok(fd);
        }
    }
    // SAFETY: the userfaultfd syscall takes only flags.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// Moves a descriptor of the agent's to a high number, out of the way of the
/// low ones programs reuse after closing (it may close ours: see
/// [`still_ours`]).
fn lift(fd: i32) -> i32 {
    // SAFETY: plain fcntl/getrlimit calls on our own descriptor.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        let floor = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            (lim.rlim_cur.min(4096) as i32 - 100).max(3)
        } else {
            3
        };
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor);
        if high < 0 {
            return fd;
        }
        libc::close(fd);
        high
    }
}

/// The inode behind descriptor `fd` (0 if it is not open).
fn inode(fd: i32) -> u64 {
    // SAFETY: fstat into a stack buffer.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) == 0 {
            st.st_ino
        } else {
            0
        }
    }
}

/// Whether `sock` is still the agent's connection: a program may close
/// every descriptor it did not open (daemons do, and so does a child
/// between fork and exec), and open others under the same numbers.
fn still_ours(sock: i32) -> bool {
    inode(sock) == SOCKET_INODE.load(Ordering::Acquire)
}

/// Connects to the abstract unix socket `name`.
fn connect(name: &[u8]) -> Result<i32, &'static str> {
    // SAFETY: a plain socket call.
    let sock = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err("cannot create a unix socket");
    }
    let Some((addr, len)) = wire::abstract_addr(name) else {
        close(sock);
        return Err("the supervisor's socket name is too long");
    };
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    let r = unsafe { libc::connect(sock, (&addr as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        close(sock);
        return Err("no uswap supervisor answers");
    }
    Ok(lift(sock))
}

/// Sends `packet`, with descriptor `fd` attached when it is >= 0.
fn send_packet(sock: i32, packet: &[u8; PACKET], fd: i32) -> bool {
    wire::send(sock, packet, (fd >= 0).then_some(fd)).is_ok()
}

/// Receives one packet: `None` at end of file or on an error.
fn recv_packet(sock: i32) -> Option<[u8; PACKET]> {
    recv_packet_fd(sock).map(|(p, fd)| {
        close(fd);
        p
    })
}

/// Why the agent thread stopped receiving.
enum Ended {
    /// The supervisor hung up without letting go: it died.
    SupervisorGone,
    /// The program closed the agent's connection (or reused its number).
    TakenByProgram,
}

/// Receives one request on the agent thread.
fn next_request(sock: i32) -> Result<Request, Ended> {
    loop {
        if !still_ours(sock) {
            return Err(Ended::TakenByProgram);
        }
        match wire::recv(sock) {
            Ok(Some((packet, fd))) => {
                close(fd.unwrap_or(-1));
                match Request::decode(&packet) {
                    Some(r) => return Ok(r),
                    None => say(&["an unknown request from the supervisor was ignored"]),
                }
            }
            Err(libc::EBADF | libc::ENOTSOCK) => return Err(Ended::TakenByProgram),
            Ok(None) | Err(_) if !still_ours(sock) => return Err(Ended::TakenByProgram),
            Ok(None) | Err(_) => return Err(Ended::SupervisorGone),
        }
    }
}

/// Receives one packet and the descriptor that came with it (-1: none);
/// `None` at end of file or on an error.
fn recv_packet_fd(sock: i32) -> Option<([u8; PACKET], i32)> {
    match wire::recv(sock) {
        Ok(Some((packet, fd))) => Some((packet, fd.unwrap_or(-1))),
        Ok(None) | Err(_) => None,
    }
}

/// Maps one fresh anonymous page-aligned range of `len` bytes.
fn map(len: usize, flags: libc::c_int) -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choice.
    unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    }
}

/// The scratch, as the agent thread sees it (a forked child's thread starts
/// with it `Unready`: what it inherited is registered with the child's
/// descriptor, or not at all).
#[derive(Clone, Copy)]
enum Scratch {
    /// Not yet registered with the program's descriptor (it is negotiated
    /// once the verdict has come; the first discard does it).
    Unready,
    /// Registered; this many bytes from its start hold moved pages.
    Filled(usize),
    /// It could not be made ready: moves answer EOPNOTSUPP, and the
    /// supervisor drops in place.
    Broken,
}

/// The scratch's address (right after the agent thread's stack).
fn scratch_base() -> usize {
    STACK_BASE.load(Ordering::Acquire) + STACK
}

/// One ioctl on the program's descriptor with `arg` (a kernel struct laid
/// out as words); the errno on failure.
fn uffd_ioctl<const N: usize>(request: libc::c_ulong, arg: &mut [u64; N]) -> Result<(), i32> {
    let fd = UFFD.load(Ordering::Acquire);
    // SAFETY: every request is paired with the struct its number encodes,
    // on the caller's frame; the descriptor is the agent's copy of the
    // program's userfaultfd.
    if unsafe { libc::ioctl(fd, request as _, arg.as_mut_ptr()) } == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Empties the scratch: unregistered while its pages are dropped (so that
/// the drop raises no event), then registered with the program's
/// descriptor again, for write-protect faults only: enough for moves, and
/// a read of the scratch (mlockall populates every mapping; a debugger)
/// gets zero pages, where missing-page faults would wait for the
/// supervisor.
///
/// Unlocked first: a program that called mlockall locked the scratch with
/// everything else, and a move between locked and unlocked memory is
/// refused, as is a drop of locked memory. (The program's locked memory
/// stays where it is: it is never evicted.)
fn empty_scratch() -> Scratch {
    let base = scratch_base() as u64;
    let mut range = [base, SCRATCH as u64];
    let mut register = [base, SCRATCH as u64, REGISTER_MODE_WP, 0];
    // SAFETY: the agent's own scratch.
    let unlocked = match unsafe { libc::munlock(base as *const _, SCRATCH) } {
        0 => Ok(()),
        _ => Err(errno()),
    };
    let done = unlocked
        .and_then(|()| uffd_ioctl(UFFDIO_UNREGISTER, &mut range))
        .and_then(|()| {
            // SAFETY: the agent's own scratch; what lies there are copies
            // the supervisor has stored.
            match unsafe { libc::madvise(base as *mut _, SCRATCH, libc::MADV_DONTNEED) } {
                0 => Ok(()),
                _ => Err(errno()),
            }
        })
        .and_then(|()| uffd_ioctl(UFFDIO_REGISTER, &mut register));
    match done {
        Ok(()) => Scratch::Filled(0),
        Err(_) => {
            say(&["cannot ready the scratch; pages are dropped in place from now on"]);
            Scratch::Broken
        }
    }
}

/// Moves the pages of `start..start + len` (at most a scratch's worth) into
/// the scratch, through the program's own descriptor. Returns the bytes
/// from `start` moved, and 0 or the errno that stopped the move: EAGAIN
/// (an event of the program is unread) and ENOENT (the range is no longer
/// wholly registered) before anything moved, so that the supervisor reads
/// the events and checks the range again; EBUSY (shared with a forked
/// child, or pinned) and EINVAL (a mapping of other protection, or locked)
/// wherever the move stopped, the rest to stay in memory; EOPNOTSUPP where
/// the scratch is broken, the rest to be dropped in place.
///
/// The supervisor checked the range under its settled gate and let the
/// gate go before asking, and it reads none of the program's events until
/// this answer: an unmap, move or drop of the range since the check (and
/// with it whatever the program mapped or moved there after) waits with
/// its event unread. So the range is checked again here, right before the
/// move: write-protecting it again changes nothing but answers EAGAIN
/// while an event is unread and ENOENT where part of it is no longer
/// registered; and the move itself is refused while an event is unread.
///
/// `expect` (not 0): the hash of the bytes the supervisor stored for the
/// range, which what moved must match ([`checked`]).
fn move_out(scratch: &mut Scratch, start: usize, len: usize, expect: u64) -> (u64, i32) {
    if len > SCRATCH {
        return (0, libc::EINVAL);
    }
    let mut emptied = false;
    loop {
        let at = match *scratch {
            Scratch::Unready => {
                *scratch = empty_scratch();
                emptied = true;
                continue;
            }
            Scratch::Broken => return (0, libc::EOPNOTSUPP),
            Scratch::Filled(at) if at + len > SCRATCH => {
                *scratch = empty_scratch();
                emptied = true;
                continue;
            }
            Scratch::Filled(at) => at,
        };
        let mut probe = [start as u64, len as u64, WRITEPROTECT_MODE_WP];
        if let Err(e) = uffd_ioctl(UFFDIO_WRITEPROTECT, &mut probe) {
            return (0, e);
        }
        let mut m: [u64; 5] = [
            (scratch_base() + at) as u64,
            start as u64,
            len as u64,
            MOVE_MODE_DONTWAKE | MOVE_MODE_ALLOW_SRC_HOLES,
            0,
        ];
        let r = uffd_ioctl(UFFDIO_MOVE, &mut m);
        match r {
            // EEXIST comes only with nothing moved: something read the
            // scratch and the kernel put zero pages there. EINVAL with
            // nothing moved: the program locked its memory (mlockall) since
            // the scratch was last emptied, or the range is of other
            // protection. Empty it all (which unlocks it), once, and try
            // again.
            Err(libc::EEXIST) if !emptied => {
                *scratch = empty_scratch();
                emptied = true;
                continue;
            }
            Err(libc::EINVAL) if !emptied && m[4] as i64 <= 0 => {
                *scratch = empty_scratch();
                emptied = true;
                continue;
            }
            Ok(()) => return checked(scratch, at, start, len, 0, expect),
            Err(e) => {
                let moved = (m[4] as i64).max(0) as usize / PAGE * PAGE;
                return checked(scratch, at, start, moved, e, expect);
            }
        }
    }
}

/// The outcome of a move of `moved` bytes from `start` into the scratch at
/// `at`, stopped by `errno` (0: none), once checked against `expect` (see
/// [`Request::Discard`]): where what moved does not hash to it (a page
/// pinned for a device's write changed after the supervisor's copy, and
/// moved once unpinned), or where the move stopped part way (what moved
/// cannot be checked alone; the kernel answers EAGAIN to a move stopped by
/// any page, mostly one shared or pinned), the pages go back where they
/// were and nothing moved: ESTALE where the move was whole, EBUSY where it
/// had stopped. ESTALE with what moved counted where they did not all go
/// back: the move back is refused once an event of the program has come
/// in. (Moved out and back, the pages are writable: the supervisor takes
/// them as resident and protects them again before another try.)
fn checked(
    scratch: &mut Scratch,
    at: usize,
    start: usize,
    moved: usize,
    errno: i32,
    expect: u64,
) -> (u64, i32) {
    if expect != 0 && moved > 0 {
        // SAFETY: the agent's own scratch, `moved` bytes from `at` (inside
        // it: the move took no more than what was left of it); holes in
        // it read as zeros, and nothing else writes there.
        let there =
            unsafe { core::slice::from_raw_parts((scratch_base() + at) as *const u8, moved) };
        if errno != 0 || content_hash(there) != expect {
            let mut back: [u64; 5] = [
                start as u64,
                (scratch_base() + at) as u64,
                moved as u64,
                MOVE_MODE_DONTWAKE | MOVE_MODE_ALLOW_SRC_HOLES,
                0,
            ];
            return match uffd_ioctl(UFFDIO_MOVE, &mut back) {
                Ok(()) => {
                    *scratch = Scratch::Filled(at);
                    (
                        0,
                        if errno == 0 {
                            libc::ESTALE
                        } else {
                            libc::EBUSY
                        },
                    )
                }
                Err(_) => {
                    *scratch = Scratch::Filled(at + moved);
                    (moved as u64, libc::ESTALE)
                }
            };
        }
    }
    *scratch = Scratch::Filled(at + moved);
    (moved as u64, errno)
}

/// Drops `start..start + len` in place (MADV_DONTNEED); 0 or an errno.
///
/// The supervisor checked the range under its event gate, then let the gate
/// go and asked: meanwhile another thread of the program may have unmapped
/// part of it and mapped new memory there, which the madvise would drop
/// without an event (it is not registered). So the range is looked at
/// again, and nothing is dropped where it changed:
/// - `mincore`: a hole (ENOMEM, answered as ENOENT; the write-protect
///   below passes over holes since Linux 6.3);
/// - the maps: the range is still one mapping (ENOENT);
/// - the page map: registered memory the program mapped there since, and
///   wrote, is managed by then, but its pages lack the write protection
///   that every page of a stored run keeps until its drop (ENOENT);
/// - re-protecting the range (a change of nothing), which fails with ENOENT
///   where the range is no longer wholly registered (new memory the
///   supervisor does not manage yet) and with EAGAIN while an event is
///   unread (a change the supervisor has not read yet).
///
/// The two last come last and together, right before the madvise: the
/// page map must be read before the write-protect, which protects new
/// pages too, and from the write-protect on a write to the range waits for
/// the supervisor. (MADV_DONTNEED itself answers neither.) What no look can
/// close is the time between the write-protect and the madvise, two calls
/// in a row: an unmap and a new mapping by another thread of the program
/// there would be dropped, as Linux has no drop that refuses memory not
/// registered.
fn drop_in_place(start: usize, len: usize) -> i32 {
    let mut vec = [0u8; 512];
    let mut at = start;
    while at < start + len {
        let chunk = (start + len - at).min(vec.len() * PAGE);
        // SAFETY: mincore writes one byte per page of the range into `vec`,
        // which holds that many; it reads no memory of the range.
        if unsafe { libc::mincore(at as *mut _, chunk, vec.as_mut_ptr()) } != 0 {
            let e = errno();
            return if e == libc::ENOMEM { libc::ENOENT } else { e };
        }
        at += chunk;
    }
    if !within_one_mapping(start, len) {
        return libc::ENOENT;
    }
    match unprotected_page_in(start, len) {
        Ok(false) => {}
        Ok(true) => return libc::ENOENT,
        Err(e) => return e,
    }
    let mut probe = [start as u64, len as u64, WRITEPROTECT_MODE_WP];
    if let Err(e) = uffd_ioctl(UFFDIO_WRITEPROTECT, &mut probe) {
        return e;
    }
    // SAFETY: the supervisor drops only pages of managed folios it has
    // stored (MADV_DONTNEED cannot harm memory safety: the pages read back
    // as the supervisor installs them).
    if unsafe { libc::madvise(start as *mut _, len, libc::MADV_DONTNEED) } == 0 {
        0
    } else {
        errno()
    }
}

/// Page map bits: the page is in memory; it is write-protected through
/// userfaultfd.
const PM_PRESENT: u64 = 1 << 63;
const PM_UFFD_WP: u64 = 1 << 57;

/// Whether a page of `start..start + len` is in memory without the
/// userfaultfd write protection, by `/proc/self/pagemap` (read into the
/// agent's stack; opened each time, for the reason `maps` gives).
fn unprotected_page_in(start: usize, len: usize) -> Result<bool, i32> {
    // SAFETY: opening a proc file by a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/pagemap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    let mut entries = [0u64; 64];
    let mut page = start / PAGE;
    let end = (start + len).div_ceil(PAGE);
    let mut found = Ok(false);
    while page < end {
        let n = (end - page).min(entries.len());
        // SAFETY: pread writes at most `n * 8` bytes into `entries`, which
        // holds 64 entries of 8 bytes.
        let r = unsafe {
            libc::pread(
                fd,
                entries.as_mut_ptr().cast(),
                n * 8,
                (page * 8) as libc::off_t,
            )
        };
        if r != (n * 8) as isize {
            found = Err(if r < 0 { errno() } else { libc::EIO });
            break;
        }
        if entries[..n]
            .iter()
            .any(|&e| e & PM_PRESENT != 0 && e & PM_UFFD_WP == 0)
        {
            found = Ok(true);
            break;
        }
        page += n;
    }
    close(fd);
    found
}

/// Whether one mapping covers `start..start + len`; true where the kernel
/// cannot say (before 6.11, or no listing to ask). The supervisor drops one mapping at a time:
/// the program splitting it meanwhile (an mprotect of part of it) makes
/// the drop raise one event per piece, which the supervisor can take for
/// the program's own drops when the split is undone before it reads them.
fn within_one_mapping(start: usize, len: usize) -> bool {
    match maps::Maps::open().map(|maps| maps.at(start, false)) {
        Ok(Ok(Some(m))) => m.end >= start + len,
        Ok(Ok(None)) => false,
        // An older kernel, or no listing to ask.
        Ok(Err(_)) | Err(_) => true,
    }
}

fn start(name: &[u8]) -> Result<(), &'static str> {
    let mut saved = [0u8; 108];
    if name.len() > saved.len() {
        return Err("the supervisor's socket name is too long");
    }
    saved[..name.len()].copy_from_slice(name);
    let _first = NAME.set((saved, name.len())).is_ok();
    let beacon = map(BEACON_PAGES * PAGE, 0);
    if beacon == libc::MAP_FAILED {
        return Err("cannot map the agent's beacon page");
    }
    let uffd = new_userfaultfd();
    // The stack, then the scratch (see the module docs).
    let stack = map(STACK + SCRATCH, libc::MAP_STACK);
    let unmap_stack = || {
        // SAFETY: our own mapping, never handed out.
        unsafe { libc::munmap(stack, STACK + SCRATCH) };
    };
    if stack == libc::MAP_FAILED {
        close(uffd.unwrap_or(-1));
        return Err("cannot map the agent's stack");
    }
    let sock = match connect(name) {
        Ok(s) => s,
        Err(e) => {
            close(uffd.unwrap_or(-1));
            unmap_stack();
            return Err(e);
        }
    };
    // A forked child gets the scratch empty, not copies of what lies there.
    // SAFETY: advice on the agent's own mapping.
    unsafe {
        let scratch = (stack as usize + STACK) as *mut libc::c_void;
        libc::madvise(scratch, SCRATCH, libc::MADV_NOHUGEPAGE);
        libc::madvise(scratch, SCRATCH, libc::MADV_WIPEONFORK);
    }
    let hello = Hello {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        error: uffd.err().unwrap_or(0),
        own_start: stack as u64,
        own_end: (stack as usize + STACK + SCRATCH) as u64,
        beacon: beacon as u64,
        forked: false,
    };
    let sent = send_packet(sock, &hello.encode(), uffd.unwrap_or(-1));
    let verdict = if sent {
        recv_packet(sock).and_then(|p| Verdict::decode(&p))
    } else {
        None
    };
    match verdict {
        Some(Verdict::Managed) => {
            let uffd = lift(uffd.unwrap_or(-1));
            UFFD_INODE.store(inode(uffd), Ordering::Release);
            UFFD.store(uffd, Ordering::Release);
            SOCKET_INODE.store(inode(sock), Ordering::Release);
            SOCKET.store(sock, Ordering::Release);
            MANAGED.store(true, Ordering::Release);
            STACK_BASE.store(stack as usize, Ordering::Release);
            BEACON.store(beacon as usize, Ordering::Release);
            // SAFETY: registering a plain function for forked children.
            unsafe { libc::pthread_atfork(None, Some(forked_parent), Some(forked_child)) };
            if let Err(e) = start_thread(stack, FRESH) {
                // Managed memory but nobody to drop its pages: the
                // supervisor sees the socket close and lets go.
                close(sock);
                close(uffd);
                SOCKET.store(-1, Ordering::Release);
                UFFD.store(-1, Ordering::Release);
                unmap_stack();
                return Err(e);
            }
            Ok(())
        }
        Some(Verdict::Unmanaged) | None => {
            close(sock);
            close(uffd.unwrap_or(-1));
            unmap_stack();
            if verdict.is_none() {
                Err("the uswap supervisor did not answer")
            } else {
                Ok(())
            }
        }
        Some(Verdict::Exit) => {
            // SAFETY: ends the process before main, as the supervisor asked
            // (it has said why).
            unsafe { libc::_exit(1) }
        }
    }
}

/// How the agent thread begins.
const FRESH: usize = 0;
/// In a forked child: it asks to be adopted first.
const FORKED: usize = 1;

fn start_thread(stack: *mut libc::c_void, how: usize) -> Result<(), &'static str> {
    // SAFETY: the attribute object lives on this frame and is destroyed
    // below; the stack is ours and outlives the thread (never unmapped
    // while it runs).
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return Err("pthread_attr_init failed");
        }
        let ok = libc::pthread_attr_setstack(&mut attr, stack, STACK) == 0
            && libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED) == 0;
        let mut thread: libc::pthread_t = 0;
        // The thread starts with every signal blocked (it inherits the
        // mask): the program's handlers never run on the agent's stack.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut was: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut was);
        let created =
            ok && libc::pthread_create(&mut thread, &attr, serve, how as *mut libc::c_void) == 0;
        libc::pthread_sigmask(libc::SIG_SETMASK, &was, std::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if created {
            Ok(())
        } else {
            Err("cannot start the agent thread")
        }
    }
}

/// The agent thread: drops pages on request until the supervisor lets go.
extern "C" fn serve(how: *mut libc::c_void) -> *mut libc::c_void {
    // Named, so that a supervisor that lost contact with this thread (the
    // program closed its descriptors) can tell when it has ended, and with
    // it any drop it was making.
    // SAFETY: PR_SET_NAME takes a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, AGENT_THREAD_NAME_C.as_ptr()) };
    // The program's signals are for its own threads: this one started with
    // all of them blocked (see `start_thread`).
    if how as usize == FORKED {
        if let Err(what) = ask_adoption() {
            say(&[
                what,
                "; this forked child's memory is served but not compressed",
            ]);
            return std::ptr::null_mut();
        }
    }
    let sock = SOCKET.load(Ordering::Acquire);
    let mut scratch = Scratch::Unready;
    loop {
        match next_request(sock) {
            Ok(Request::Drop { seq, start, len }) => {
                let answer = Dropped {
                    seq,
                    errno: drop_in_place(start as usize, len as usize),
                };
                if !answer_with(sock, &answer.encode()) {
                    return quit_quietly();
                }
            }
            Ok(Request::Discard { seq, count, ranges }) => {
                let mut outcomes = [(0, 0); DISCARD_RANGES];
                for (outcome, &(start, len, expect)) in outcomes.iter_mut().zip(&ranges[..count]) {
                    let (moved, errno) =
                        move_out(&mut scratch, start as usize, len as usize, expect);
                    *outcome = (errno, moved);
                }
                let answer = MovedOut {
                    seq,
                    count,
                    outcomes,
                };
                if !answer_with(sock, &answer.encode()) {
                    return quit_quietly();
                }
            }
            Ok(Request::Release) => {
                close(UFFD.swap(-1, Ordering::AcqRel));
                close(SOCKET.swap(-1, Ordering::AcqRel));
                return std::ptr::null_mut();
            }
            Err(Ended::SupervisorGone) => supervisor_gone(),
            Err(Ended::TakenByProgram) => return quit_quietly(),
        }
    }
}

/// Sends an answer; false if the program took the connection (the caller
/// quits quietly). A supervisor gone ends the program.
fn answer_with(sock: i32, answer: &[u8; PACKET]) -> bool {
    if !still_ours(sock) {
        return false;
    }
    if !send_packet(sock, answer, -1) {
        supervisor_gone();
    }
    true
}

/// The program closed the agent's connection: the supervisor sees it hang
/// up and stops evicting from this image (which it still serves). The
/// agent's copy of the userfaultfd stays, so that pages never read as
/// zeros even if the supervisor dies later; the numbers are forgotten, not
/// closed (they may be the program's now).
fn quit_quietly() -> *mut libc::c_void {
    SOCKET.store(-1, Ordering::Release);
    std::ptr::null_mut()
}

/// The supervisor died without letting go: pages it held are gone, and the
/// program must not go on to read zeros in their place.
fn supervisor_gone() -> ! {
    say(&[
        "the uswap supervisor is gone; ending the program, whose swapped-out memory went with it",
    ]);
    // SAFETY: ends this process.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
        libc::_exit(137)
    }
}

/// In the parent, once its fork has returned: waits until the supervisor
/// has applied the fork's event. The kernel lets the forking thread go as
/// soon as that event is read, and the supervisor then reads the parent's
/// mappings for what the kernel did not copy as it was (MADV_WIPEONFORK,
/// MADV_DONTFORK): a madvise, munmap or mremap the program makes right
/// after its fork would otherwise be read as made before it, and the child
/// would read zeros where it has its copy, or its parent's bytes where it
/// has zeros. A touch of the fence is a fault read after the fork's event
/// and served only once it is applied; the fence is then left unpopulated
/// again, for the next fork and for children copied later.
extern "C" fn forked_parent() {
    if !MANAGED.load(Ordering::Acquire) {
        return;
    }
    let fence = BEACON.load(Ordering::Acquire) + PAGE;
    // SAFETY: the fence is the agent's own page, never handed out.
    unsafe {
        std::ptr::read_volatile(fence as *const u8);
        libc::madvise(fence as *mut _, PAGE, libc::MADV_DONTNEED);
    }
}

/// In a forked child: the agent's connection and descriptor belong to the
/// parent image. The child says which address space is its by touching its
/// beacon (the fault carries this thread's id, the child's pid), leaves the
/// beacon unpopulated again for its own children, and starts its agent
/// thread, which asks to be adopted. The thread does the asking, not this
/// handler: once adopted, the child is evicted from, and an eviction waits
/// for the agent thread, never for the program's threads (which may be
/// waiting on that eviction).
extern "C" fn forked_child() {
    // The parent's connection and descriptor, if they are still the
    // agent's (the numbers may be the program's by now).
    let parent_sock = SOCKET.swap(-1, Ordering::AcqRel);
    if parent_sock >= 0 && still_ours(parent_sock) {
        close(parent_sock);
    }
    let parent_uffd = UFFD.swap(-1, Ordering::AcqRel);
    if parent_uffd >= 0 && inode(parent_uffd) == UFFD_INODE.load(Ordering::Acquire) {
        close(parent_uffd);
    }
    if !MANAGED.load(Ordering::Acquire) {
        return;
    }
    let beacon = BEACON.load(Ordering::Acquire);
    // SAFETY: the beacon is the agent's own page, never handed out.
    unsafe {
        std::ptr::read_volatile(beacon as *const u8);
        libc::madvise(beacon as *mut _, PAGE, libc::MADV_DONTNEED);
    }
    let stack = STACK_BASE.load(Ordering::Acquire) as *mut libc::c_void;
    if let Err(what) = start_thread(stack, FORKED) {
        say(&[
            what,
            "; this forked child's memory is served but not compressed",
        ]);
    }
}

/// On a forked child's agent thread: connects and asks to be adopted; on
/// success the connection and the child's own descriptor are the agent's.
fn ask_adoption() -> Result<(), &'static str> {
    let (name, len) = NAME.get().ok_or("no supervisor name")?;
    adopt(&name[..*len], STACK_BASE.load(Ordering::Acquire))
}

/// Connects, says hello as a forked child, and takes the verdict.
fn adopt(name: &[u8], stack: usize) -> Result<(), &'static str> {
    let sock = connect(name)?;
    let hello = Hello {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        error: 0,
        own_start: stack as u64,
        own_end: (stack + STACK + SCRATCH) as u64,
        beacon: BEACON.load(Ordering::Acquire) as u64,
        forked: true,
    };
    let verdict = if send_packet(sock, &hello.encode(), -1) {
        recv_packet_fd(sock)
    } else {
        None
    };
    match verdict {
        Some((packet, uffd)) if Verdict::decode(&packet) == Some(Verdict::Managed) => {
            let uffd = lift(uffd);
            UFFD_INODE.store(inode(uffd), Ordering::Release);
            UFFD.store(uffd, Ordering::Release);
            SOCKET_INODE.store(inode(sock), Ordering::Release);
            SOCKET.store(sock, Ordering::Release);
            Ok(())
        }
        Some((_, uffd)) => {
            close(uffd);
            close(sock);
            Err("the supervisor did not adopt it")
        }
        None => {
            close(sock);
            Err("the supervisor did not answer")
        }
    }
}

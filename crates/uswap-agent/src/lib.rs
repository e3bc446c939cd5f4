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
//! them out (UFFDIO_MOVE, Linux 6.8) into a scratch of its own, registered
//! with a second userfaultfd that reports no events, and drops them there;
//! only pages that cannot move (shared with a forked child, or in a
//! mapping of other protection) are dropped in place. The scratch lies
//! right after the agent thread's stack, and both are the agent's own
//! memory, which the supervisor never manages:
//!
//! ```text
//!   own memory:  [ agent thread's stack | scratch (2 MiB) ]
//!                  unregistered           registered with the scratch's
//!                                         descriptor (no events)
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
//! for the same reason as above. An exec starts the agent afresh in the
//! new image.

#![deny(missing_docs)]

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use uswap_protocol::{
    wire, Dropped, Hello, Request, Verdict, AGENT_THREAD_NAME_C, PACKET, SOCKET_ENV_C,
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
/// The beacon page (see the module docs).
static BEACON: AtomicUsize = AtomicUsize::new(0);
/// The descriptor the scratch is registered with (-1: none, no moves).
static SCRATCH_UFFD: AtomicI32 = AtomicI32::new(-1);
/// Its inode, to tell it from a descriptor the program opened under the
/// same number after closing ours.
static SCRATCH_INODE: AtomicU64 = AtomicU64::new(0);
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
/// `struct uffdio_api`: api, features, ioctls.
const UFFDIO_API: libc::c_ulong = uffd_iowr(0x3F, 24);
/// `struct uffdio_register`: start, len, mode, ioctls.
const UFFDIO_REGISTER: libc::c_ulong = uffd_iowr(0x00, 32);
/// `struct uffdio_move`: dst, src, len, mode, move (bytes moved, or a
/// negative errno).
const UFFDIO_MOVE: libc::c_ulong = uffd_iowr(0x05, 40);
const UFFD_API: u64 = 0xAA;
const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_MOVE: u64 = 1 << 16;
const REGISTER_MODE_WP: u64 = 2;
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
    let out = |s: &str| {
        // SAFETY: writing a borrowed buffer to stderr.
        unsafe { libc::write(2, s.as_ptr().cast(), s.len()) };
    };
    out("uswap agent: ");
    for p in parts {
        out(p);
    }
    out("\n");
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

/// Makes `scratch` (SCRATCH bytes of the agent's own memory) ready for
/// moves: empties it and registers it with a new userfaultfd that reports
/// no events. Returns the descriptor, or -1 where the kernel cannot move
/// pages (the agent then only drops in place).
fn open_scratch(scratch: usize) -> i32 {
    let Ok(fd) = new_userfaultfd() else {
        return -1;
    };
    let mut api = [UFFD_API, FEATURE_MOVE | FEATURE_PAGEFAULT_FLAG_WP, 0];
    // Write-protect faults only: enough for moves, and a read of the
    // scratch (mlockall populates every mapping; a debugger) gets zero
    // pages, where missing-page faults would wait for ever on a descriptor
    // nobody reads.
    let mut register = [scratch as u64, SCRATCH as u64, REGISTER_MODE_WP, 0];
    // SAFETY: the ioctls take the kernel structs laid out above, which
    // live on this frame; the scratch is the agent's own mapping (a forked
    // child may hold copies of pages a move left there: dropped first).
    let ready = unsafe {
        libc::ioctl(fd, UFFDIO_API as _, api.as_mut_ptr()) == 0
            && libc::madvise(scratch as *mut _, SCRATCH, libc::MADV_DONTNEED) == 0
            && libc::ioctl(fd, UFFDIO_REGISTER as _, register.as_mut_ptr()) == 0
    };
    if !ready {
        close(fd);
        return -1;
    }
    let fd = lift(fd);
    SCRATCH_INODE.store(inode(fd), Ordering::Release);
    SCRATCH_UFFD.store(fd, Ordering::Release);
    fd
}

/// Moves the pages of `start..start + len` into the scratch, a scratch's
/// worth at a time, and drops them there; returns how many bytes from
/// `start` are gone that way. A move stops at the first page that cannot
/// move (EBUSY: shared with a forked child or pinned; EINVAL: a mapping of
/// other protection); the supervisor drops the rest in place.
fn move_out(start: usize, len: usize) -> u64 {
    let fd = SCRATCH_UFFD.load(Ordering::Acquire);
    if fd < 0 || inode(fd) != SCRATCH_INODE.load(Ordering::Acquire) {
        // None, or the program closed it (the number may be the program's).
        return 0;
    }
    let scratch = STACK_BASE.load(Ordering::Acquire) + STACK;
    let mut done = 0;
    let mut emptied = false;
    while done < len {
        let n = (len - done).min(SCRATCH);
        let mut m: [u64; 5] = [
            scratch as u64,
            (start + done) as u64,
            n as u64,
            MOVE_MODE_DONTWAKE | MOVE_MODE_ALLOW_SRC_HOLES,
            0,
        ];
        // SAFETY: UFFDIO_MOVE takes the struct above, on this frame; the
        // source is stored pages the supervisor owns (it evicts them), the
        // destination the agent's empty scratch.
        let r = unsafe { libc::ioctl(fd, UFFDIO_MOVE as _, m.as_mut_ptr()) };
        // EEXIST comes only with nothing moved (a partial move is EAGAIN).
        if r != 0 && errno() == libc::EEXIST && !emptied {
            // Something read the scratch and the kernel put zero pages
            // there: empty it all, once, and try again.
            emptied = true;
            // SAFETY: the agent's own scratch; nothing of value lies there.
            unsafe { libc::madvise(scratch as *mut _, SCRATCH, libc::MADV_DONTNEED) };
            continue;
        }
        let moved = if r == 0 {
            n
        } else {
            (m[4] as i64).max(0) as usize / PAGE * PAGE
        };
        // SAFETY: the scratch is the agent's own; what lies there now are
        // the supervisor's stored pages, to be dropped.
        if moved > 0 && unsafe { libc::madvise(scratch as *mut _, moved, libc::MADV_DONTNEED) } != 0
        {
            // The next move would find pages there; stop moving (nothing is
            // lost: the supervisor drops in place what did not move).
            say(&["cannot empty the scratch; pages are dropped in place from now on"]);
            SCRATCH_UFFD.store(-1, Ordering::Release);
            close(fd);
        }
        done += moved;
        if r != 0 || SCRATCH_UFFD.load(Ordering::Acquire) < 0 {
            break;
        }
    }
    done as u64
}

fn start(name: &[u8]) -> Result<(), &'static str> {
    let mut saved = [0u8; 108];
    if name.len() > saved.len() {
        return Err("the supervisor's socket name is too long");
    }
    saved[..name.len()].copy_from_slice(name);
    let _first = NAME.set((saved, name.len())).is_ok();
    let beacon = map(PAGE, 0);
    if beacon == libc::MAP_FAILED {
        return Err("cannot map the agent's beacon page");
    }
    let uffd = new_userfaultfd();
    // The stack, then the scratch (see the module docs).
    let stack = map(STACK + SCRATCH, libc::MAP_STACK);
    let unmap_stack = || {
        close(SCRATCH_UFFD.swap(-1, Ordering::AcqRel));
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
    let scratch = open_scratch(stack as usize + STACK);
    let hello = Hello {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        error: uffd.err().unwrap_or(0),
        own_start: stack as u64,
        own_end: (stack as usize + STACK + SCRATCH) as u64,
        beacon: beacon as u64,
        forked: false,
        moves: scratch >= 0,
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
            unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
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
    loop {
        match next_request(sock) {
            Ok(Request::Drop { seq, start, len }) => {
                // SAFETY: the supervisor drops only pages of managed folios
                // it has stored (MADV_DONTNEED cannot harm memory safety:
                // the pages read back as the supervisor installs them).
                let r =
                    unsafe { libc::madvise(start as *mut _, len as usize, libc::MADV_DONTNEED) };
                let answer = Dropped {
                    seq,
                    errno: if r == 0 { 0 } else { errno() },
                    moved: 0,
                };
                if !answer_with(sock, &answer) {
                    return quit_quietly();
                }
            }
            Ok(Request::Discard { seq, start, len }) => {
                let answer = Dropped {
                    seq,
                    errno: 0,
                    moved: move_out(start as usize, len as usize),
                };
                if !answer_with(sock, &answer) {
                    return quit_quietly();
                }
            }
            Ok(Request::Release) => {
                let scratch = SCRATCH_UFFD.swap(-1, Ordering::AcqRel);
                if scratch >= 0 && inode(scratch) == SCRATCH_INODE.load(Ordering::Acquire) {
                    close(scratch);
                }
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
fn answer_with(sock: i32, answer: &Dropped) -> bool {
    if !still_ours(sock) {
        return false;
    }
    if !send_packet(sock, &answer.encode(), -1) {
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
    // The child's copy of the scratch is no longer registered (that
    // descriptor asked for no fork events): its agent thread makes its own.
    let parent_scratch = SCRATCH_UFFD.swap(-1, Ordering::AcqRel);
    if parent_scratch >= 0 && inode(parent_scratch) == SCRATCH_INODE.load(Ordering::Acquire) {
        close(parent_scratch);
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
    let stack = STACK_BASE.load(Ordering::Acquire);
    let scratch = open_scratch(stack + STACK);
    let adopted = adopt(&name[..*len], stack, scratch >= 0);
    if adopted.is_err() {
        close(SCRATCH_UFFD.swap(-1, Ordering::AcqRel));
    }
    adopted
}

/// Connects, says hello as a forked child, and takes the verdict.
fn adopt(name: &[u8], stack: usize, moves: bool) -> Result<(), &'static str> {
    let sock = connect(name)?;
    let hello = Hello {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        error: 0,
        own_start: stack as u64,
        own_end: (stack + STACK + SCRATCH) as u64,
        beacon: BEACON.load(Ordering::Acquire) as u64,
        forked: true,
        moves,
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

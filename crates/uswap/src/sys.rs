//! Raw system calls shared by more than one module: mapping fresh
//! anonymous memory, asking whether a range of this process is mapped, the
//! CPUs a thread may run on, a process's state, and eventfds that wake
//! threads asleep in poll.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// A new eventfd (close-on-exec, non-blocking), to be made readable by
/// [`eventfd_signal`].
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: creates an eventfd; no memory is passed.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Makes eventfd `fd` readable, waking whoever polls it. The write fails
/// only where the counter would overflow, after 2^64 - 2 of them, and the
/// eventfd is readable then anyway.
pub fn eventfd_signal(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: an 8-byte write from a live u64 to an open descriptor.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets eventfd `fd` (made by [`eventfd`], non-blocking) to unreadable.
/// A read that finds it unreadable already, another reader having taken
/// it, fails with EAGAIN, which is the same outcome.
pub fn eventfd_take(fd: &OwnedFd) {
    let mut count = 0u64;
    // SAFETY: an 8-byte read into a live u64 from an open descriptor.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

/// Maps `len` bytes of private anonymous memory, read-write, reserving no
/// swap (the pages are only charged when touched).
pub(crate) fn map_anonymous(len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned a null mapping"))
}

/// Whether any page of `start..end` (page aligned) of this process is
/// unmapped: mincore answers ENOMEM for such a range.
pub(crate) fn any_unmapped(start: usize, end: usize) -> bool {
    const CHUNK: usize = 512;
    let mut vec = [0u8; CHUNK];
    let mut at = start;
    while at < end {
        let len = (end - at).min(CHUNK * crate::page::PAGE_SIZE);
        // SAFETY: mincore writes one byte per page of the range into `vec`,
        // which holds CHUNK pages' worth; it reads no memory of the range.
        if unsafe { libc::mincore(at as *mut _, len, vec.as_mut_ptr()) } != 0 {
            return io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
        }
        at += len;
    }
    false
}

/// The CPUs the calling thread may run on, in order (empty if the kernel
/// will not say).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &allowed) })
        .collect()
}

/// Pins the calling thread to `cpu`. Failure only costs locality, so it is
/// not an error: the thread runs wherever the scheduler puts it.
pub(crate) fn pin_to_cpu(cpu: usize) {
    set_affinity(0, &[cpu]);
}

/// Lets thread `tid` (0: the calling thread) of this process run on `cpus`
/// (those below CPU_SETSIZE). Failure only costs locality, so it is not an
/// error.
pub(crate) fn set_affinity(tid: i32, cpus: &[usize]) {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE; the set is a valid cpu_set_t.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given; the kernel
    // refuses an empty set or a thread that is not there.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

/// The state letter of process `pid` in `/proc/PID/stat` (R, S, D, T, t,
/// Z, X, ...), or None where it is gone. The letter follows the command
/// name, which is in parentheses and may hold any byte: it is the first
/// letter after the last ')'.
pub fn process_state(pid: i32) -> Option<u8> {
    state_in_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter in the contents of a `/proc/PID/stat` (see
/// [`process_state`]).
pub(crate) fn state_in_stat(stat: &[u8]) -> Option<u8> {
    let after = stat.iter().rposition(|&b| b == b')')? + 1;
    stat[after..]
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
}

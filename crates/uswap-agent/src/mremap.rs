//! `mremap`, as the program calls it: the agent is preloaded, so the
//! program's calls through its C library reach this one first.
//!
//! Why: Linux 6.17 and later move a range that spans several mappings in
//! one call when it is a pure move (`MREMAP_FIXED`, same length), mapping
//! by mapping, the gaps between them kept. But they refuse it (EFAULT)
//! where any of those mappings is registered with a userfaultfd, which
//! under uswap most of the program's memory is; and uswap itself splits
//! what would be one mapping alone (memory mapped next to managed memory
//! stays a mapping of its own until the supervisor's next scan registers
//! it). So a move the program alone makes fails under uswap.
//!
//! What: on those kernels, such a move, where every mapping in the range
//! is private and anonymous (the kind the kernel moves several of; uswap
//! manages no other), is made here one mapping at a time, as the kernel
//! would make it: each piece to the same offset from the destination, a
//! gap at the start refused (the kernel's EFAULT), a failure part way
//! returned with the pieces before it moved (the kernel leaves those too).
//! Each piece lies in one mapping, a move the kernel makes registered or
//! not (it tells the supervisor with a REMAP event). Every other call goes
//! to the kernel unchanged, as do all calls of a program uswap does not
//! serve and all calls on kernels before 6.17 (which refuse a move across
//! mappings whatever is registered). A mapping the program registered
//! with a userfaultfd of its own is moved with the rest, where the kernel
//! alone would refuse the move.
//!
//! Unlike the kernel's, the pieces are not moved under one lock: another
//! thread of the program that maps or unmaps inside the range meanwhile
//! races with itself either way. What the kernel checks of the whole range
//! before it moves anything is checked here first, or the call is left to
//! it (alignment, overlap, a destination past the lowest address-space
//! limit). errno is left as it was on success, as the C library leaves it.
//!
//! The C declaration is variadic. `new_address` is read only with
//! `MREMAP_FIXED`, as glibc 2.36 reads it, and 0 passed otherwise: a
//! caller that passes four arguments leaves the fifth register undefined,
//! and with `MREMAP_DONTUNMAP` alone the address is only a hint. On x86-64
//! and AArch64 Linux the first variadic argument of integer class travels
//! in the register a fifth fixed one does, so the definition below, with
//! five fixed arguments, reads what the caller passed; on other targets
//! the agent does not define it.

use crate::maps::Maps;
use std::sync::atomic::{AtomicU8, Ordering};

/// Whether the kernel moves several mappings in one call (6.17 and later):
/// 0 not yet known, 1 no, 2 yes.
static MOVES_SEVERAL: AtomicU8 = AtomicU8::new(0);

/// Lowest end of the user address space on the targets below (47 bits on
/// x86-64 with four-level page tables, 48 on AArch64): a destination
/// ending past it is left to the kernel, which checks the whole range.
#[cfg(target_arch = "x86_64")]
const USER_END: usize = 0x7fff_ffff_f000;
#[cfg(target_arch = "aarch64")]
const USER_END: usize = 0xffff_ffff_f000;

/// See the module docs.
///
/// # Safety
///
/// As `mremap(2)`: the program answers for what the move does to its own
/// memory; this function reads none of it.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old_address: *mut libc::c_void,
    old_size: libc::size_t,
    new_size: libc::size_t,
    flags: libc::c_int,
    new_address: *mut libc::c_void,
) -> *mut libc::c_void {
    let to = if flags & libc::MREMAP_FIXED != 0 {
        new_address as usize
    } else {
        0
    };
    let (from, len) = (old_address as usize, old_size);
    let pure_move = flags & libc::MREMAP_FIXED != 0 && page_up(old_size) == page_up(new_size);
    if pure_move && crate::MANAGED.load(Ordering::Relaxed) && kernel_moves_several() {
        // SAFETY: errno is this thread's own.
        let errno = unsafe { libc::__errno_location() };
        // SAFETY: as above.
        let saved = unsafe { *errno };
        if let Some(done) = move_mappings(from, page_up(len), flags, to) {
            let (at, e) = match done {
                Ok(at) => (at as *mut libc::c_void, saved),
                Err(e) => (libc::MAP_FAILED, e),
            };
            // SAFETY: as above.
            unsafe { *errno = e };
            return at;
        }
    }
    // SAFETY: the program's own call, passed on as it made it.
    unsafe { raw_mremap(from, old_size, new_size, flags, to) as *mut _ }
}

/// The system call itself: the address, or -1 with errno set.
///
/// # Safety
///
/// As `mremap(2)`: whatever lies in the ranges named is moved or unmapped.
unsafe fn raw_mremap(from: usize, old: usize, new: usize, flags: i32, to: usize) -> libc::c_long {
    // Every argument travels as a whole word (the flags sign-extended, as
    // the C library passes them): a variadic `int` leaves the register's
    // upper half undefined, and the kernel reads all of it.
    // SAFETY: as this function's contract.
    unsafe {
        libc::syscall(
            libc::SYS_mremap,
            from as libc::c_ulong,
            old as libc::c_ulong,
            new as libc::c_ulong,
            flags as libc::c_long,
            to as libc::c_ulong,
        )
    }
}

/// Whether the kernel is 6.17 or later (asked once).
fn kernel_moves_several() -> bool {
    match MOVES_SEVERAL.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = kernel_at_least(6, 17);
            MOVES_SEVERAL.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: utsname is plain bytes; uname fills it in.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a utsname the call may write.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    let release = u.release.map(|c| c as u8);
    release_at_least(&release, major, minor)
}

/// Whether a kernel release string (`6.17.0-rc1+`, NUL-terminated or not)
/// names `major.minor` or later; false where it names no version.
fn release_at_least(release: &[u8], major: u32, minor: u32) -> bool {
    let mut parts = [0u32; 2];
    let mut k = 0;
    let mut digits = 0;
    for &c in release.iter().take_while(|&&c| c != 0) {
        match c {
            b'0'..=b'9' => {
                digits += 1;
                parts[k] = parts[k]
                    .saturating_mul(10)
                    .saturating_add((c - b'0') as u32)
            }
            b'.' if k == 0 => k = 1,
            _ => break,
        }
    }
    digits > 0 && (parts[0], parts[1]) >= (major, minor)
}

fn page_up(n: usize) -> usize {
    n.saturating_add(crate::PAGE - 1) & !(crate::PAGE - 1)
}

/// Moves `from..from + len` to `to` one mapping at a time where it spans
/// several private anonymous ones (see the module docs): the destination
/// or the errno. None: the kernel's own call gives the answer (one
/// mapping, a gap at the start, a file among them, parameters it refuses,
/// a kernel without the query).
fn move_mappings(from: usize, len: usize, flags: i32, to: usize) -> Option<Result<usize, i32>> {
    let end = from.checked_add(len)?;
    let to_end = to.checked_add(len)?;
    let aligned = from.is_multiple_of(crate::PAGE) && to.is_multiple_of(crate::PAGE);
    if len == 0 || !aligned || to_end > USER_END || (from < to_end && to < end) {
        return None;
    }
    let maps = Maps::open().ok()?;
    let first = maps.at(from, false).ok()??;
    if first.end >= end {
        return None;
    }
    let mut at = from;
    while at < end {
        match maps.at(at, true) {
            Ok(Some(m)) if m.start < end => {
                if !m.anonymous {
                    return None;
                }
                at = m.end;
            }
            Ok(_) => break,
            Err(_) => return None,
        }
    }
    // Moved mapping by mapping, each found afresh: a move can merge what
    // lies at the destination, never what lies ahead at the source.
    let mut at = from;
    while at < end {
        let m = match maps.at(at, true) {
            Ok(Some(m)) if m.start < end => m,
            Ok(_) => break,
            // The listing failing part way (not seen): the move cannot go on.
            Err(_) => return Some(Err(libc::EFAULT)),
        };
        let piece = m.start.max(at);
        let piece_len = m.end.min(end) - piece;
        // SAFETY: a move of the program's own memory that it asked for, in
        // pieces; no memory of the agent is named.
        let r = unsafe { raw_mremap(piece, piece_len, piece_len, flags, to + (piece - from)) };
        if r == -1 {
            return Some(Err(crate::errno()));
        }
        at = piece + piece_len;
    }
    Some(Ok(to))
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn kernel_releases_are_read_by_major_then_minor() {
        assert!(release_at_least(b"6.17.0-rc1+\0junk", 6, 17));
        assert!(release_at_least(b"6.18.0", 6, 17));
        assert!(release_at_least(b"7.0", 6, 17));
        assert!(release_at_least(b"10.1.2", 6, 17));
        assert!(!release_at_least(b"6.16.9", 6, 17));
        assert!(!release_at_least(b"6.9.12", 6, 17));
        assert!(!release_at_least(b"5.99", 6, 17));
        assert!(!release_at_least(b"", 6, 17));
        assert!(!release_at_least(b"linux", 0, 0));
    }
}

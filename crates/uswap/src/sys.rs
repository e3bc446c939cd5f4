//! Raw memory system calls shared by more than one module: mapping fresh
//! anonymous memory, and asking whether a range of this process is mapped.

use std::io;
use std::ptr::NonNull;

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

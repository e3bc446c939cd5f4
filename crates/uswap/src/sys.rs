//! The one raw system call more than one layer needs: mapping fresh
//! anonymous memory.

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

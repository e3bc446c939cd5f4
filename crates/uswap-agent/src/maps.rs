//! The program's mappings, one at a time, as the kernel lists them
//! (`PROCMAP_QUERY`, Linux 6.11), read with no allocation: the agent asks
//! from its own thread and from the program's threads inside an
//! intercepted call, where the program's malloc may be held. The listing
//! is `/proc/thread-self/maps`: `/proc/self` stops answering once the
//! program's main thread has exited while others go on.
//!
//! The listing is opened for each use, never kept: a forked child would
//! read its parent's through a descriptor opened before the fork.

/// `_IOWR('f', 17, struct procmap_query)`, the struct being 13 words.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30) | (104 << 16) | ((b'f' as libc::c_ulong) << 8) | 17;
/// Query flag: the mapping covering the address, or else the first one
/// after it.
const COVERING_OR_NEXT: u64 = 0x10;
/// `vma_flags` bit of a shared mapping.
const VMA_SHARED: u64 = 0x08;

/// One mapping of the program.
pub(crate) struct Mapping {
    /// First byte.
    pub(crate) start: usize,
    /// One past the last byte.
    pub(crate) end: usize,
    /// Private and backed by no file (nor by shared memory).
    pub(crate) anonymous: bool,
}

/// The listing, open.
pub(crate) struct Maps(i32);

impl Maps {
    /// Opens the listing; the errno where it cannot.
    pub(crate) fn open() -> Result<Maps, i32> {
        // SAFETY: opening a proc file by a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c"/proc/thread-self/maps".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            Err(crate::errno())
        } else {
            Ok(Maps(fd))
        }
    }

    /// The mapping covering `addr` (or, with `or_next`, the first one after
    /// it): `Ok(None)` where there is none; the errno of any other answer
    /// (ENOTTY: a kernel older than 6.11).
    pub(crate) fn at(&self, addr: usize, or_next: bool) -> Result<Option<Mapping>, i32> {
        // size, flags, address, then what the kernel fills in: start (3),
        // end (4), flags (5), page size, offset, inode (8), device (9).
        let mut q = [0u64; 13];
        q[0] = 104;
        q[1] = if or_next { COVERING_OR_NEXT } else { 0 };
        q[2] = addr as u64;
        // SAFETY: the request's struct is `q`, of the size it says, naming
        // no other memory (no name or build id buffers).
        if unsafe { libc::ioctl(self.0, PROCMAP_QUERY as _, q.as_mut_ptr()) } != 0 {
            let e = crate::errno();
            return if e == libc::ENOENT { Ok(None) } else { Err(e) };
        }
        Ok(Some(Mapping {
            start: q[3] as usize,
            end: q[4] as usize,
            anonymous: q[5] & VMA_SHARED == 0 && q[8] == 0 && q[9] == 0,
        }))
    }
}

impl Drop for Maps {
    fn drop(&mut self) {
        crate::close(self.0);
    }
}

//! userfaultfd: the few ioctls the runtime needs, with every error spelled
//! out (the uapi structures are declared here; libc does not carry them).
//!
//! Errors the callers must tell apart: `EEXIST` (a page is already there:
//! someone filled it, just wake), `EAGAIN` (the mapping is changing under a
//! non-cooperative event: retry after the event thread has read it),
//! `ENOENT`/`EINVAL` (the range is gone or was never registered), `ESRCH`
//! (the process is exiting).

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
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
/// `/dev/userfaultfd`'s ioctl for a new descriptor: _IO(0xAA, 0x00).
const USERFAULTFD_IOC_NEW: u64 = IOC_TYPE << 8;

const REGISTER_MODE_MISSING: u64 = 1;
const REGISTER_MODE_WP: u64 = 2;
const COPY_MODE_DONTWAKE: u64 = 1;
const ZEROPAGE_MODE_DONTWAKE: u64 = 1;
const WRITEPROTECT_MODE_WP: u64 = 1;

const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_EVENT_REMAP: u64 = 1 << 2;
const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURE_THREAD_ID: u64 = 1 << 8;

/// Event codes of `uffd_msg`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
pub const EVENT_REMAP: u8 = 0x14;
pub const EVENT_REMOVE: u8 = 0x15;
pub const EVENT_UNMAP: u8 = 0x16;
/// Page fault flags.
pub const PAGEFAULT_FLAG_WP: u64 = 2;

/// One message read from the descriptor (the kernel's `struct uffd_msg`).
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct RawMsg {
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// The union: page fault {flags, address, ptid}; remap {from, to, len};
    /// remove/unmap {start, end}.
    pub arg: [u64; 3],
}

impl RawMsg {
    pub const SIZE: usize = 32;
    pub const ZERO: RawMsg = RawMsg {
        event: 0,
        reserved1: 0,
        reserved2: 0,
        reserved3: 0,
        arg: [0; 3],
    };
}

/// A userfaultfd descriptor with the features the runtime relies on.
pub struct Uffd {
    fd: OwnedFd,
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a descriptor (through /dev/userfaultfd, else the syscall) and
    /// negotiates write-protect faults, thread ids and the remove, unmap and
    /// remap events.
    pub fn open() -> io::Result<Uffd> {
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
            return Err(io::Error::new(e.kind(), format!("userfaultfd unavailable: {e}")));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let uffd = Uffd { fd: unsafe { OwnedFd::from_raw_fd(raw) } };
        let wanted =
            FEATURE_PAGEFAULT_FLAG_WP | FEATURE_EVENT_REMAP | FEATURE_EVENT_REMOVE | FEATURE_EVENT_UNMAP | FEATURE_THREAD_ID;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: wanted,
            ioctls: 0,
        };
        uffd.ioctl(UFFDIO_API, &mut api)
            .map_err(|e| io::Error::new(e.kind(), format!("UFFDIO_API with write-protect and events: {e}")))?;
        Ok(uffd)
    }

    fn ioctl<T>(&self, request: u64, arg: &mut T) -> io::Result<()> {
        // SAFETY: every request is paired with the structure its number
        // encodes, passed by exclusive reference for the call's duration.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), request as _, arg as *mut T) })
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Registers a range for missing and write-protect faults.
    pub fn register(&self, start: usize, len: usize) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: REGISTER_MODE_MISSING | REGISTER_MODE_WP,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut reg)
    }

    /// Unregisters a range; threads blocked on it are woken.
    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_UNREGISTER, &mut range)
    }

    /// Wakes the threads blocked on faults in the range.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_WAKE, &mut range)
    }

    /// Installs `src` at `dst` (whole pages) without waking anyone. Pages
    /// that already exist are skipped (EEXIST); a changing mapping (EAGAIN)
    /// is retried. Returns an error only when the range cannot be filled
    /// (gone, or the process is exiting).
    ///
    /// Never call it from the thread that reads the descriptor: EAGAIN
    /// lasts until that thread reads the pending event.
    pub fn copy_dontwake(&self, dst: usize, src: &[u8]) -> io::Result<()> {
        self.copy_with(dst, src, &mut std::thread::yield_now)
    }

    /// [`Uffd::copy_dontwake`], calling `on_eagain` before each retry; the
    /// event thread passes a function that reads the pending events.
    pub fn copy_with(&self, dst: usize, src: &[u8], on_eagain: &mut dyn FnMut()) -> io::Result<()> {
        self.fill(src.len(), on_eagain, |done| {
            let mut c = UffdioCopy {
                dst: (dst + done) as u64,
                src: src[done..].as_ptr() as u64,
                len: (src.len() - done) as u64,
                mode: COPY_MODE_DONTWAKE,
                copy: 0,
            };
            (self.ioctl(UFFDIO_COPY, &mut c), c.copy)
        })
    }

    /// Maps the zero page over the range, without waking; existing pages
    /// are skipped; `on_eagain` runs before each retry of a changing mapping.
    pub fn zeropage_with(&self, start: usize, len: usize, on_eagain: &mut dyn FnMut()) -> io::Result<()> {
        self.fill(len, on_eagain, |done| {
            let mut z = UffdioZeropage {
                range: UffdioRange {
                    start: (start + done) as u64,
                    len: (len - done) as u64,
                },
                mode: ZEROPAGE_MODE_DONTWAKE,
                zeropage: 0,
            };
            (self.ioctl(UFFDIO_ZEROPAGE, &mut z), z.zeropage)
        })
    }

    /// Drives a filling ioctl over `len` bytes: `attempt(done)` fills from
    /// offset `done` and returns its result and the bytes it reports. An
    /// existing page (EEXIST) is skipped, a changing mapping (EAGAIN)
    /// retried after `on_eagain`.
    fn fill(
        &self,
        len: usize,
        on_eagain: &mut dyn FnMut(),
        mut attempt: impl FnMut(usize) -> (io::Result<()>, i64),
    ) -> io::Result<()> {
        let page = 4096;
        let mut done = 0usize;
        while done < len {
            let (result, filled) = attempt(done);
            let Err(e) = result else { return Ok(()) };
            if filled > 0 {
                done += filled as usize;
            }
            match e.raw_os_error() {
                Some(libc::EEXIST) => done += page,
                Some(libc::EAGAIN) => on_eagain(),
                _ => return Err(e),
            }
        }
        Ok(())
    }

    /// Write-protects the range (writers then fault and wait), or, with
    /// `protect` false, lifts the protection and wakes them. A changing
    /// mapping (EAGAIN) is retried after `on_eagain` (the event thread must
    /// read the pending events there: nobody else will).
    pub fn write_protect(&self, start: usize, len: usize, protect: bool, on_eagain: &mut dyn FnMut()) -> io::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
        };
        loop {
            match self.ioctl(UFFDIO_WRITEPROTECT, &mut wp) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => on_eagain(),
                other => return other,
            }
        }
    }

    /// Reads up to `buf.len()` messages without blocking; returns how many.
    pub fn read_messages(&self, buf: &mut [RawMsg]) -> io::Result<usize> {
        // SAFETY: `buf` is writable for its length in bytes; RawMsg is plain
        // data whose every bit pattern is valid.
        let n = unsafe {
            libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), std::mem::size_of_val(buf))
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EAGAIN) { Ok(0) } else { Err(e) };
        }
        Ok(n as usize / RawMsg::SIZE)
    }
}

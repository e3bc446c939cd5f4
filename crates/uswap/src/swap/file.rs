//! The backing swap file, and the interface the store writes through (so
//! tests can put a faulty double in its place).
//!
//! The file is created unlinked (`O_TMPFILE`, mode 0600) in a chosen
//! directory, so nothing is left behind however the process ends, and
//! preallocated. Each slot owns the 4 KiB at `slot * 4096`. Reads and writes
//! use `O_DIRECT` where the filesystem allows it (the page cache would only
//! keep a second copy of what we just evicted).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Mutex;

/// Bytes per slot.
pub const SLOT_SIZE: usize = 4096;

/// Slot-addressed page storage behind the compressed pool.
pub trait Backing: Send + Sync {
    /// Writes one page to `slot`. Any error (ENOSPC, EIO, a short write)
    /// means the slot's old contents are undefined and the page is not stored.
    fn write_page(&self, slot: u32, page: &[u8]) -> io::Result<()>;
    /// Reads `slot` into `out` (one page).
    fn read_page(&self, slot: u32, out: &mut [u8]) -> io::Result<()>;
    /// Slots the backing holds.
    fn slots(&self) -> u32;
}

/// A swap file.
pub struct SwapFile {
    file: File,
    direct: bool,
    slots: u32,
}

thread_local! {
    /// A page-aligned bounce buffer for O_DIRECT transfers.
    static BOUNCE: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 2 * SLOT_SIZE]);
}

fn with_aligned<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        let off = b.as_ptr().align_offset(SLOT_SIZE);
        f(&mut b[off..off + SLOT_SIZE])
    })
}

impl SwapFile {
    /// Creates an unlinked swap file of `bytes` (rounded down to whole
    /// slots) in `dir`.
    pub fn create(dir: &Path, bytes: u64) -> io::Result<SwapFile> {
        let open = |extra: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC | extra)
                .open(dir)
        };
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0)?, false),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("creating a swap file in {}: {e}", dir.display()),
                ))
            }
        };
        let slots = u32::try_from(bytes / SLOT_SIZE as u64).unwrap_or(u32::MAX);
        let len = slots as u64 * SLOT_SIZE as u64;
        // SAFETY: fallocate on a file descriptor we own, within i64 range.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
        if r != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EOPNOTSUPP) => file.set_len(len)?,
                _ => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("preallocating {len} bytes of swap: {e}"),
                    ))
                }
            }
        }
        Ok(SwapFile {
            file,
            direct,
            slots,
        })
    }

    /// Whether transfers bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn check_slot(&self, slot: u32) -> io::Result<u64> {
        if slot < self.slots {
            Ok(slot as u64 * SLOT_SIZE as u64)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} beyond the swap file"),
            ))
        }
    }
}

impl Backing for SwapFile {
    fn write_page(&self, slot: u32, page: &[u8]) -> io::Result<()> {
        let at = self.check_slot(slot)?;
        let n = if self.direct {
            with_aligned(|buf| {
                buf.copy_from_slice(page);
                self.file.write_at(buf, at)
            })?
        } else {
            self.file.write_at(page, at)?
        };
        if n == SLOT_SIZE {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write of slot {slot}: {n} bytes"),
            ))
        }
    }

    fn read_page(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        let at = self.check_slot(slot)?;
        let n = if self.direct {
            with_aligned(|buf| {
                let n = self.file.read_at(buf, at)?;
                out.copy_from_slice(buf);
                Ok::<usize, io::Error>(n)
            })?
        } else {
            self.file.read_at(out, at)?
        };
        if n == SLOT_SIZE {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read of slot {slot}: {n} bytes"),
            ))
        }
    }

    fn slots(&self) -> u32 {
        self.slots
    }
}

/// A fault that [`MemBacking`] injects into its next transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write fails with ENOSPC.
    NoSpace,
    /// The transfer fails with EIO.
    Io,
    /// The write stores half the page, then reports a short write.
    ShortWrite,
}

/// An in-memory backing with fault injection, for tests.
pub struct MemBacking {
    pages: Mutex<HashMap<u32, Vec<u8>>>,
    write_faults: Mutex<Vec<Fault>>,
    read_faults: Mutex<Vec<Fault>>,
    slots: u32,
}

impl MemBacking {
    /// A backing of `slots` slots, none written yet (reading one fails
    /// until it is) and no faults queued.
    pub fn new(slots: u32) -> MemBacking {
        MemBacking {
            pages: Mutex::new(HashMap::new()),
            write_faults: Mutex::new(Vec::new()),
            read_faults: Mutex::new(Vec::new()),
            slots,
        }
    }

    /// The next write fails with `fault`.
    pub fn fail_next_write(&self, fault: Fault) {
        self.write_faults
            .lock()
            .expect("fault lock")
            .insert(0, fault);
    }

    /// The next read fails with `fault`.
    pub fn fail_next_read(&self, fault: Fault) {
        self.read_faults
            .lock()
            .expect("fault lock")
            .insert(0, fault);
    }

    /// Pages holding data.
    pub fn stored_pages(&self) -> usize {
        self.pages.lock().expect("pages lock").len()
    }

    fn error(fault: Fault) -> io::Error {
        match fault {
            Fault::NoSpace => io::Error::from_raw_os_error(libc::ENOSPC),
            Fault::Io => io::Error::from_raw_os_error(libc::EIO),
            Fault::ShortWrite => io::Error::new(io::ErrorKind::WriteZero, "short write"),
        }
    }
}

impl Backing for MemBacking {
    fn write_page(&self, slot: u32, page: &[u8]) -> io::Result<()> {
        if slot >= self.slots {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "slot beyond the backing",
            ));
        }
        if let Some(fault) = self.write_faults.lock().expect("fault lock").pop() {
            if fault == Fault::ShortWrite {
                let mut half = page.to_vec();
                half[SLOT_SIZE / 2..].fill(0xDD);
                self.pages.lock().expect("pages lock").insert(slot, half);
            }
            return Err(Self::error(fault));
        }
        self.pages
            .lock()
            .expect("pages lock")
            .insert(slot, page.to_vec());
        Ok(())
    }

    fn read_page(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        if let Some(fault) = self.read_faults.lock().expect("fault lock").pop() {
            return Err(Self::error(fault));
        }
        match self.pages.lock().expect("pages lock").get(&slot) {
            Some(p) => {
                out.copy_from_slice(p);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot} was never written"),
            )),
        }
    }

    fn slots(&self) -> u32 {
        self.slots
    }
}

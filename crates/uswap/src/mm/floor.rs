//! Floors for the fault benchmark: what userfaultfd itself costs on this
//! machine, with no store behind it, so that the runtime's fault latency can
//! be reported as a ratio to them.

use super::uffd::{RawMsg, Uffd, EVENT_PAGEFAULT};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// One userfaultfd for all floor measurements.
pub struct Probe {
    uffd: Uffd,
}

/// A private anonymous mapping registered with the probe's userfaultfd.
struct Scratch<'a> {
    uffd: &'a Uffd,
    base: usize,
    len: usize,
}

impl Probe {
    pub fn new() -> io::Result<Probe> {
        Ok(Probe { uffd: Uffd::open()? })
    }

    fn scratch(&self, len: usize) -> io::Result<Scratch<'_>> {
        let base = crate::sys::map_anonymous(len)?.as_ptr() as usize;
        self.uffd.register(base, len)?;
        Ok(Scratch {
            uffd: &self.uffd,
            base,
            len,
        })
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let _ = self.uffd.unregister(self.base, self.len);
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

/// Latencies (ns) of `count` first touches, each served by a handler thread
/// that installs a whole `unit` with one UFFDIO_COPY and wakes the toucher:
/// the bare round trip a store-backed fault cannot beat.
pub fn roundtrip_ns(probe: &Probe, unit: usize, count: usize) -> io::Result<Vec<u64>> {
    let scratch = probe.scratch(unit * count)?;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let handler = s.spawn(|| {
            let data = vec![0x5au8; unit];
            let mut msgs = [RawMsg::ZERO; 16];
            let mut pending: VecDeque<RawMsg> = VecDeque::new();
            while !done.load(Ordering::Acquire) {
                if pending.is_empty() {
                    let mut pfd = libc::pollfd {
                        fd: scratch.uffd.raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd for the call.
                    if unsafe { libc::poll(&mut pfd, 1, 20) } <= 0 {
                        continue;
                    }
                    let n = scratch.uffd.read_messages(&mut msgs).unwrap_or(0);
                    pending.extend(&msgs[..n]);
                }
                while let Some(m) = pending.pop_front() {
                    let arg = m.arg;
                    if m.event != EVENT_PAGEFAULT {
                        continue;
                    }
                    // Units are counted from the scratch base, which the
                    // kernel aligned to a page only.
                    let start = scratch.base + (arg[1] as usize - scratch.base) / unit * unit;
                    // As on the runtime's event thread: a changing mapping is
                    // waited out by reading the event that changes it.
                    let _ = scratch.uffd.copy_with(start, &data, &mut || {
                        let n = scratch.uffd.read_messages(&mut msgs).unwrap_or(0);
                        pending.extend(&msgs[..n]);
                        std::thread::yield_now();
                    });
                    let _ = scratch.uffd.wake(start, unit);
                }
            }
        });
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let p = (scratch.base + i * unit) as *const u8;
            let t = Instant::now();
            // SAFETY: inside the scratch mapping; the read faults and the
            // handler fills it.
            let v = unsafe { std::ptr::read_volatile(p) };
            out.push(t.elapsed().as_nanos() as u64);
            assert_eq!(v, 0x5a, "the handler installed the page");
        }
        done.store(true, Ordering::Release);
        handler.join().expect("floor handler");
        Ok(out)
    })
}

/// Latencies (ns) of UFFDIO_COPY alone, `count` installs of `unit` bytes.
pub fn uffdio_copy_ns(probe: &Probe, unit: usize, count: usize) -> io::Result<Vec<u64>> {
    let scratch = probe.scratch(unit * count)?;
    let data = vec![0x5au8; unit];
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let t = Instant::now();
        scratch.uffd.copy_dontwake(scratch.base + i * unit, &data)?;
        out.push(t.elapsed().as_nanos() as u64);
    }
    Ok(out)
}

//! Floors for the fault benchmark: what userfaultfd itself costs on this
//! machine, with no store behind it, so that the runtime's fault latency can
//! be reported as a ratio to them.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use uswap::mm::uffd::{Event, Features, Partial, Uffd, UffdError};

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
        Ok(Probe {
            uffd: Uffd::open(Features { fork: false })?,
        })
    }

    fn scratch(&self, len: usize) -> io::Result<Scratch<'_>> {
        // SAFETY: a fresh private anonymous mapping at an address of the
        // kernel's choosing; the result is checked.
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
        let base = p as usize;
        let scratch = Scratch {
            uffd: &self.uffd,
            base,
            len,
        };
        self.uffd.register(base, len)?;
        Ok(scratch)
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        // Unregistering a range that failed to register is refused; either
        // way the mapping goes.
        if let Err(e) = self.uffd.unregister(self.base, self.len) {
            eprintln!("floor: unregistering the scratch mapping: {e}");
        }
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

/// Installs `data` at `start` and wakes whoever waits there, with the
/// waking UFFDIO_COPY the runtime uses, reading events (with `on_again`)
/// while the address space changes; a page already there is fine.
fn install(uffd: &Uffd, start: usize, data: &[u8], mut on_again: impl FnMut()) -> io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        match uffd.copy_waking(start + done, &data[done..]) {
            Ok(()) => return Ok(()),
            Err(Partial { filled, error }) => {
                done += filled;
                match error {
                    // The kernel woke what it filled; the rest is woken
                    // once it is all there.
                    UffdError::Exists => {
                        done += 4096;
                        if done >= data.len() {
                            uffd.wake(start, data.len())?;
                        }
                    }
                    UffdError::Again => on_again(),
                    e => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

/// How the round trip's handler thread waits for the next fault.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HandlerWaits {
    /// Asleep in poll: the faulting thread's event must wake it.
    Sleeping,
    /// Reading the descriptor in a loop, as the runtime's event thread does
    /// for a while after each event (`RuntimeConfig::event_spin`).
    Spinning,
}

/// Latencies (ns) of `count` first touches, each served by a handler thread
/// that installs a whole `unit` with one waking UFFDIO_COPY: the bare round
/// trip a store-backed fault cannot beat, with the handler waiting as
/// `waits` says. On a virtual machine whose idle CPUs halt, a sleeping
/// handler pays for waking a halted CPU on every fault; a spinning one only
/// for waking the faulting thread.
pub fn roundtrip_ns(
    probe: &Probe,
    unit: usize,
    count: usize,
    waits: HandlerWaits,
) -> io::Result<Vec<u64>> {
    let scratch = probe.scratch(unit * count)?;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let handler = s.spawn(|| -> io::Result<()> {
            let data = vec![0x5au8; unit];
            let mut events: Vec<Event> = Vec::new();
            while !done.load(Ordering::Acquire) {
                if events.is_empty() {
                    if waits == HandlerWaits::Sleeping {
                        let mut pfd = libc::pollfd {
                            fd: scratch.uffd.raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        // SAFETY: one valid pollfd for the call.
                        if unsafe { libc::poll(&mut pfd, 1, 20) } <= 0 {
                            continue;
                        }
                    }
                    if scratch.uffd.read_events(&mut events, 64)? == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                }
                let batch = std::mem::take(&mut events);
                for event in batch {
                    let Event::PageFault { addr, .. } = event else {
                        continue;
                    };
                    // Units are counted from the scratch base, which the
                    // kernel aligned to a page only.
                    let start = scratch.base + (addr - scratch.base) / unit * unit;
                    // As on the runtime's event thread: a changing mapping is
                    // waited out by reading the event that changes it.
                    install(scratch.uffd, start, &data, || {
                        if let Err(e) = scratch.uffd.read_events(&mut events, 64) {
                            eprintln!("floor: reading events: {e}");
                        }
                        std::thread::yield_now();
                    })?;
                }
            }
            Ok(())
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
        handler.join().expect("floor handler")?;
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
        install(
            scratch.uffd,
            scratch.base + i * unit,
            &data,
            std::thread::yield_now,
        )?;
        out.push(t.elapsed().as_nanos() as u64);
    }
    Ok(out)
}

//! The stateful random test of program behaviour: a model of a process's
//! memory, page by page, and a seeded random sequence of what real programs
//! do to theirs (mmap, munmap of whole and partial folios, mprotect that
//! splits folios, MADV_DONTNEED, MADV_FREE, mremap that grows, shrinks,
//! moves and cuts through folios, MADV_WIPEONFORK and MADV_DONTFORK and
//! their undoing, fork with the child checking all of its memory), while two more threads read and write memory of their own, all
//! under eviction pressure (the limit is a fraction of the working set).
//! Every read is checked against the model; at the end every slot and every
//! pool page is back.
//!
//! `USWAP_MODEL_OPS` (operations per case, default 800) and
//! `USWAP_MODEL_SEEDS` (seeds per case, default 3) make it a soak;
//! `USWAP_MODEL_SEED` picks the first seed (to replay a failure);
//! `USWAP_MODEL_TRACE=1` prints every operation. Large folios are stored
//! page by page, as one object or as a by_n frame, by turns from seed to
//! seed; `USWAP_MODEL_LAYOUT` (page, folio, byn:N) holds one.
//! `USWAP_MODEL_CLEAN=drop` runs without clean copies;
//! `USWAP_MODEL_DISCARD=in-place` drops stored pages in place instead of
//! moving them out.

mod common;

use common::{within, Words, MIB};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use uswap::mm::{Region, Runtime, RuntimeConfig};
use uswap::zswap::Layout;

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;

/// What a page holds in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Page {
    /// Content: every word derived from this seed (0: zeros).
    seed: u64,
    /// After MADV_FREE: the kernel may have freed it (zeros) or not (seed)
    /// until it is written again.
    maybe_zero: bool,
    writable: bool,
    /// The region it belongs to (its handle unmaps it), or NONE for pages a
    /// partial move took out of their region.
    owner: u32,
    /// Its mapping is marked MADV_WIPEONFORK: a forked child gets zeros.
    wipe_on_fork: bool,
    /// Its mapping is marked MADV_DONTFORK: a forked child has no mapping
    /// there (whatever the other mark says).
    dont_fork: bool,
}

const NONE: u32 = u32::MAX;

/// Page seeds are odd; one in four (bits 1 and 2 clear) fills its page
/// with noise that does not compress (stored raw with a swap file, left
/// UNFIT without one), the others with words that do.
fn word(seed: u64, k: usize) -> u64 {
    if seed == 0 {
        0
    } else if seed & 6 == 0 {
        // splitmix64 of the word's place.
        let mut z = seed.wrapping_add((k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    } else {
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(k as u64 * 0x2545_F491)
    }
}

fn fill(addr: usize, seed: u64) {
    for k in 0..WORDS {
        // SAFETY: `addr` is a mapped, writable page of the model.
        unsafe { std::ptr::write_volatile((addr as *mut u64).add(k), word(seed, k)) };
    }
}

/// Whether the page at `addr` holds what the model says (reads every word).
fn holds(addr: usize, page: &Page) -> bool {
    let mut as_seed = true;
    let mut as_zero = page.maybe_zero;
    for k in 0..WORDS {
        // SAFETY: `addr` is a mapped, readable page of the model.
        let v = unsafe { std::ptr::read_volatile((addr as *const u64).add(k)) };
        as_seed &= v == word(page.seed, k);
        as_zero &= v == 0;
    }
    as_seed || as_zero
}

struct Case {
    rt: Runtime,
    rng: StdRng,
    pages: BTreeMap<usize, Page>,
    regions: Vec<(u32, Region)>,
    next_region: u32,
    /// Reserved address space that moves land in (bump allocated).
    scratch: (usize, usize),
    scratch_used: usize,
    /// The whole scratch mapping, unmapped at the end of the case but for
    /// `foreign`.
    scratch_map: (usize, usize),
    /// Ranges of the scratch mapping the model freed and could not reserve
    /// again: another thread of this process (the allocator, another test's
    /// runtime) mapped something there meanwhile, which is not ours to
    /// unmap.
    foreign: Vec<(usize, usize)>,
    next_seed: u64,
    folio: usize,
    ops: Counts,
    /// Print every operation (USWAP_MODEL_TRACE=1), to find where a
    /// failing seed goes wrong.
    trace: bool,
}

#[derive(Debug, Default)]
struct Counts {
    maps: u64,
    writes: u64,
    reads: u64,
    partial_unmaps: u64,
    region_drops: u64,
    mprotects: u64,
    dontneeds: u64,
    frees: u64,
    moves: u64,
    resizes: u64,
    forks: u64,
    fork_advice: u64,
    checked_pages: u64,
    /// Freed scratch ranges another mapping took before the model could
    /// reserve them again.
    scratch_taken: u64,
}

impl Case {
    fn seed(&mut self) -> u64 {
        self.next_seed += 1;
        self.next_seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1
    }

    /// Reserves again a range the model has just freed (munmap, mremap)
    /// where it lies inside the scratch mapping, so that the unmap at the
    /// end of the case takes nothing but what the model mapped. Between the
    /// free and this call the range is free address space, which any
    /// thread of the test process may be handed by mmap.
    fn reserve_again(&mut self, start: usize, len: usize) {
        let (lo, hi) = (
            start.max(self.scratch_map.0),
            (start + len).min(self.scratch_map.0 + self.scratch_map.1),
        );
        if lo >= hi {
            return;
        }
        // SAFETY: MAP_FIXED_NOREPLACE maps only where nothing is mapped.
        let r = unsafe {
            libc::mmap(
                lo as *mut _,
                hi - lo,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if r as usize != lo {
            if r != libc::MAP_FAILED {
                // A kernel that took the flag as a hint placed it elsewhere.
                // SAFETY: the mapping just made, nobody else's.
                unsafe { libc::munmap(r, hi - lo) };
            }
            self.foreign.push((lo, hi));
            self.ops.scratch_taken += 1;
        }
    }

    /// A run of up to `max` consecutive model pages (same protection not
    /// required) starting at a random one.
    fn run(&mut self, max: usize) -> Option<(usize, usize)> {
        if self.pages.is_empty() {
            return None;
        }
        let n = self.rng.gen_range(0..self.pages.len());
        let start = *self.pages.keys().nth(n).unwrap();
        let want = self.rng.gen_range(1..=max);
        let mut len = 0;
        while len < want && self.pages.contains_key(&(start + len * PAGE)) {
            len += 1;
        }
        Some((start, len * PAGE))
    }

    fn check(&mut self, start: usize, len: usize, what: &str) {
        for addr in (start..start + len).step_by(PAGE) {
            let page = self.pages[&addr];
            assert!(
                holds(addr, &page),
                "{what}: page {addr:#x} does not hold {page:?}"
            );
            self.ops.checked_pages += 1;
        }
    }

    fn step(&mut self) {
        let fs = self.folio;
        let choice = self.rng.gen_range(0..100);
        if self.trace {
            eprintln!("op {choice} ({:?})", self.ops);
        }
        match choice {
            0..=5 => {
                if self.regions.len() < 6 {
                    let len = fs * self.rng.gen_range(1..=(8 * MIB / fs).clamp(1, 48));
                    let region = self.rt.map(len).expect("map");
                    let base = region.as_ptr() as usize;
                    let owner = self.next_region;
                    self.next_region += 1;
                    for addr in (base..base + len).step_by(PAGE) {
                        self.pages.insert(
                            addr,
                            Page {
                                seed: 0,
                                maybe_zero: false,
                                writable: true,
                                owner,
                                wipe_on_fork: false,
                                dont_fork: false,
                            },
                        );
                    }
                    self.regions.push((owner, region));
                    self.ops.maps += 1;
                }
            }
            6..=35 => {
                if let Some((start, len)) = self.run(64) {
                    for addr in (start..start + len).step_by(PAGE) {
                        if self.pages[&addr].writable {
                            let seed = self.seed();
                            fill(addr, seed);
                            let p = self.pages.get_mut(&addr).unwrap();
                            *p = Page {
                                seed,
                                maybe_zero: false,
                                ..*p
                            };
                        }
                    }
                    self.ops.writes += 1;
                }
            }
            36..=60 => {
                if let Some((start, len)) = self.run(64) {
                    self.check(start, len, "read");
                    self.ops.reads += 1;
                }
            }
            61..=65 => {
                if let Some((start, len)) = self.run(40) {
                    // SAFETY: pages of the model, which only this test uses.
                    assert_eq!(unsafe { libc::munmap(start as *mut _, len) }, 0);
                    self.reserve_again(start, len);
                    for addr in (start..start + len).step_by(PAGE) {
                        self.pages.remove(&addr);
                    }
                    self.ops.partial_unmaps += 1;
                }
            }
            66..=67 => {
                if !self.regions.is_empty() {
                    let k = self.rng.gen_range(0..self.regions.len());
                    let (owner, region) = self.regions.swap_remove(k);
                    // Dropping the handle unmaps what is still the region's
                    // (the pages the model counts as its owner's, wherever
                    // a whole-region move took them); pages moved out of it
                    // stay where they went.
                    let mut freed: Vec<(usize, usize)> = Vec::new();
                    for (&addr, _) in self.pages.iter().filter(|(_, p)| p.owner == owner) {
                        match freed.last_mut() {
                            Some((start, len)) if *start + *len == addr => *len += PAGE,
                            _ => freed.push((addr, PAGE)),
                        }
                    }
                    drop(region);
                    for (start, len) in freed {
                        self.reserve_again(start, len);
                    }
                    self.pages.retain(|_, p| p.owner != owner);
                    self.ops.region_drops += 1;
                }
            }
            68..=74 => {
                if let Some((start, len)) = self.run(24) {
                    let writable = self.rng.gen_bool(0.4);
                    let prot = if writable {
                        libc::PROT_READ | libc::PROT_WRITE
                    } else {
                        libc::PROT_READ
                    };
                    // SAFETY: pages of the model.
                    assert_eq!(unsafe { libc::mprotect(start as *mut _, len, prot) }, 0);
                    for addr in (start..start + len).step_by(PAGE) {
                        self.pages.get_mut(&addr).unwrap().writable = writable;
                    }
                    self.ops.mprotects += 1;
                }
            }
            75..=80 => {
                if let Some((start, len)) = self.run(40) {
                    let free = self.rng.gen_bool(0.3);
                    let advice = if free {
                        libc::MADV_FREE
                    } else {
                        libc::MADV_DONTNEED
                    };
                    // SAFETY: pages of the model.
                    assert_eq!(unsafe { libc::madvise(start as *mut _, len, advice) }, 0);
                    for addr in (start..start + len).step_by(PAGE) {
                        let p = self.pages.get_mut(&addr).unwrap();
                        if free {
                            p.maybe_zero = true;
                        } else {
                            *p = Page {
                                seed: 0,
                                maybe_zero: false,
                                ..*p
                            };
                        }
                    }
                    if free {
                        self.ops.frees += 1;
                    } else {
                        self.ops.dontneeds += 1;
                    }
                }
            }
            81..=88 => self.remap(),
            89..=91 => self.fork(),
            92..=93 => {
                if let Some((start, len)) = self.run(24) {
                    let advice = [
                        libc::MADV_WIPEONFORK,
                        libc::MADV_KEEPONFORK,
                        libc::MADV_DONTFORK,
                        libc::MADV_DOFORK,
                    ][self.rng.gen_range(0..4)];
                    // SAFETY: pages of the model.
                    assert_eq!(unsafe { libc::madvise(start as *mut _, len, advice) }, 0);
                    for addr in (start..start + len).step_by(PAGE) {
                        let p = self.pages.get_mut(&addr).unwrap();
                        match advice {
                            libc::MADV_WIPEONFORK => p.wipe_on_fork = true,
                            libc::MADV_KEEPONFORK => p.wipe_on_fork = false,
                            libc::MADV_DONTFORK => p.dont_fork = true,
                            _ => p.dont_fork = false,
                        }
                    }
                    self.ops.fork_advice += 1;
                }
            }
            _ => {
                if let Some((start, len)) = self.run(16) {
                    self.check(start, len, "read");
                    self.ops.reads += 1;
                }
            }
        }
    }

    /// Moves a run of pages into the scratch area (whole regions, folio
    /// aligned parts and cuts through folios alike), or shrinks or grows one
    /// in place.
    fn remap(&mut self) {
        let Some((start, len)) = self.run(96) else {
            return;
        };
        if self.rng.gen_bool(0.25) {
            // Shrink in place: the tail goes.
            let keep = self.rng.gen_range(0..len / PAGE) * PAGE;
            if keep == 0 {
                return;
            }
            // SAFETY: resizing pages of the model.
            let r = unsafe { libc::mremap(start as *mut _, len, keep, 0) };
            if r != libc::MAP_FAILED {
                self.reserve_again(start + keep, len - keep);
                for addr in (start + keep..start + len).step_by(PAGE) {
                    self.pages.remove(&addr);
                }
                self.ops.resizes += 1;
            }
            return;
        }
        let dst = (self.scratch.0 + self.scratch_used).next_multiple_of(self.folio.min(2 * MIB));
        if dst + len > self.scratch.0 + self.scratch.1 {
            return;
        }
        // A whole region moves with its handle; a part leaves it. The
        // region is the one whose pages these are: a region the program
        // has unmapped all of keeps its handle (and its address), where the
        // kernel may have mapped a newer region since.
        let owner = self.pages[&start].owner;
        let whole = self
            .regions
            .iter()
            .any(|(o, r)| *o == owner && r.as_ptr() as usize == start && r.len() == len);
        // SAFETY: moving pages of the model onto reserved scratch space.
        let r = unsafe {
            libc::mremap(
                start as *mut _,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dst as *mut libc::c_void,
            )
        };
        if r == libc::MAP_FAILED {
            // The run spans mappings (mprotect split it): mremap refuses.
            return;
        }
        self.reserve_again(start, len);
        self.scratch_used = dst + len + PAGE - self.scratch.0;
        for k in 0..len / PAGE {
            let page = self.pages.remove(&(start + k * PAGE)).unwrap();
            self.pages.insert(
                dst + k * PAGE,
                Page {
                    owner: if whole { page.owner } else { NONE },
                    ..page
                },
            );
        }
        if self.trace {
            eprintln!("  moved {start:#x}+{len:#x} to {dst:#x} (whole region: {whole})");
        }
        // The move's event is read before mremap returns and applied right
        // after; the next step's `whole` needs the handle where it went.
        if whole {
            assert!(
                common::eventually(|| self
                    .regions
                    .iter()
                    .any(|(o, r)| *o == owner && r.as_ptr() as usize == dst)),
                "the handle of the region moved whole from {start:#x} to {dst:#x} stayed behind"
            );
        }
        self.ops.moves += 1;
    }

    /// Forks: the child checks every page of the model (MADV_FREE'd pages
    /// may read as zero), writes one page of its own and checks it, and
    /// exits; the parent's memory must be unchanged by the child's write.
    fn fork(&mut self) {
        // What the child has: no page where its parent's mapping is marked
        // MADV_DONTFORK, zeros where it is marked MADV_WIPEONFORK.
        let list: Vec<(usize, Page)> = self
            .pages
            .iter()
            .filter(|(_, p)| !p.dont_fork)
            .map(|(&a, &p)| match p.wipe_on_fork {
                true => (
                    a,
                    Page {
                        seed: 0,
                        maybe_zero: false,
                        ..p
                    },
                ),
                false => (a, p),
            })
            .collect();
        let target = list.iter().position(|(_, p)| p.writable);
        let child_seed = self.seed();
        // Where the child reports what it found wrong: how many pages, then
        // (address, first word read) for the first few.
        const REPORTED: usize = 8;
        // SAFETY: a fresh shared anonymous page, unmapped below.
        let report = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(report, libc::MAP_FAILED);
        let report = report as *mut u64;
        // SAFETY: the child only reads and writes memory and leaves with
        // _exit; it allocates nothing and takes no lock another thread may
        // hold.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let mut bad = 0;
            let mut note = |addr: usize| {
                if bad < REPORTED {
                    // SAFETY: slots of the report page; `addr` is a readable
                    // model page.
                    unsafe {
                        *report.add(1 + 2 * bad) = addr as u64;
                        *report.add(2 + 2 * bad) = std::ptr::read_volatile(addr as *const u64);
                    }
                }
                bad += 1;
            };
            for (addr, page) in &list {
                if !holds(*addr, page) {
                    note(*addr);
                }
            }
            if let Some(t) = target {
                let addr = list[t].0;
                fill(addr, child_seed);
                if !holds(
                    addr,
                    &Page {
                        seed: child_seed,
                        maybe_zero: false,
                        ..list[t].1
                    },
                ) {
                    note(addr);
                }
            }
            // SAFETY: the report's first word; then ends the child at once.
            unsafe {
                *report = bad as u64;
                libc::_exit(if bad == 0 { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            // SAFETY: the report page, written by the child that has exited.
            let bad = unsafe { *report } as usize;
            let mut lines = String::new();
            for k in 0..bad.min(REPORTED) {
                // SAFETY: as above.
                let (addr, first) =
                    unsafe { (*report.add(1 + 2 * k) as usize, *report.add(2 + 2 * k)) };
                let page = list
                    .iter()
                    .find(|(a, _)| *a == addr)
                    .map_or(self.pages[&addr], |x| x.1);
                let region = self.regions.iter().find(|(_, r)| {
                    (r.as_ptr() as usize..r.as_ptr() as usize + r.len()).contains(&addr)
                });
                lines += &format!(
                    "\n  {addr:#x} (folio offset {:#x}): first word {first:#x}, expected {:#x}, {page:?}, in region {:?}, the parent holds it: {}",
                    addr % self.folio,
                    word(page.seed, 0),
                    region.map(|(o, r)| (*o, r.as_ptr())),
                    holds(addr, &page),
                );
            }
            panic!("the forked child saw wrong bytes in {bad} pages (status {status:#x}):{lines}");
        }
        // SAFETY: the report page.
        unsafe { libc::munmap(report.cast(), PAGE) };
        if let Some(t) = target {
            let addr = list[t].0;
            self.check(
                addr,
                PAGE,
                "the parent's page after the child wrote its copy",
            );
        }
        self.ops.forks += 1;
    }
}

/// Two threads reading and writing interleaved words of a region of their
/// own, each checking against its own model, until told to stop.
fn workers(words: Words, stop: &AtomicBool, seed: u64, done: &AtomicU64) {
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ t as u64);
                let mine = (words.count - t).div_ceil(2);
                let mut model = vec![0u64; mine];
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let k = rng.gen_range(0..mine);
                        let i = k * 2 + t;
                        if rng.gen_bool(0.5) {
                            let v = rng.gen::<u64>() | 1;
                            words.write(i, v);
                            model[k] = v;
                        } else {
                            assert_eq!(words.read(i), model[k], "worker {t}: word {i}");
                        }
                    }
                    done.fetch_add(256, Ordering::Relaxed);
                }
                for (k, &v) in model.iter().enumerate() {
                    assert_eq!(
                        words.read(k * 2 + t),
                        v,
                        "worker {t}: word {} at the end",
                        k * 2 + t
                    );
                }
            });
        }
    });
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run_case(folio: usize, layout: Layout, swap_file: bool, seed: u64, ops: u64) {
    let high = if folio >= 2 * MIB { 6 * MIB } else { 2 * MIB };
    let rt = Runtime::new(RuntimeConfig {
        memory_high: high,
        folio_size: folio,
        layout,
        keep_clean_copies: std::env::var("USWAP_MODEL_CLEAN").as_deref() != Ok("drop"),
        discard_by_move: std::env::var("USWAP_MODEL_DISCARD").as_deref() != Ok("in-place"),
        swap_file: swap_file.then(|| (std::env::temp_dir(), 256 << 20)),
        max_pool_bytes: Some(64 << 20),
        ..RuntimeConfig::default()
    })
    .expect("userfaultfd runtime");
    let scratch_len = 256 * MIB;
    // SAFETY: a reservation that moves land in.
    let scratch = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            scratch_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(scratch, libc::MAP_FAILED);
    // Two folios of noise, mapped first and never touched again: the first
    // the reclaimer takes, so that every case stores pages that do not
    // compress (raw with a swap file, UNFIT without one) however its random
    // steps go.
    let noise_region = rt.map(2 * folio).expect("map");
    let noise = |i: usize| (seed << 24 | i as u64) << 3 | 1;
    let noise_base = noise_region.as_ptr() as usize;
    for i in 0..2 * folio / PAGE {
        fill(noise_base + i * PAGE, noise(i));
    }
    let worker_region = rt.map(2 * high).expect("map");
    let stop = AtomicBool::new(false);
    let worker_ops = AtomicU64::new(0);
    let mut case = Case {
        rng: StdRng::seed_from_u64(seed),
        pages: BTreeMap::new(),
        regions: Vec::new(),
        next_region: 0,
        scratch: (
            (scratch as usize).next_multiple_of(2 * MIB),
            scratch_len - 2 * MIB,
        ),
        scratch_used: 0,
        scratch_map: (scratch as usize, scratch_len),
        foreign: Vec::new(),
        next_seed: seed << 20,
        folio,
        ops: Counts::default(),
        trace: std::env::var("USWAP_MODEL_TRACE").is_ok(),
        rt,
    };
    std::thread::scope(|s| {
        let words = Words::of(&worker_region);
        let (stop, worker_ops) = (&stop, &worker_ops);
        let w = s.spawn(move || workers(words, stop, seed, worker_ops));
        /// Stops the workers however the steps end (a failed check
        /// included, which would otherwise leave the scope waiting).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stopper = StopOnDrop(stop);
        for _ in 0..ops {
            case.step();
        }
        drop(stopper);
        w.join().expect("workers");
    });
    // Everything, once more.
    for i in 0..2 * folio / PAGE {
        let page = Page {
            seed: noise(i),
            maybe_zero: false,
            writable: true,
            owner: NONE,
            wipe_on_fork: false,
            dont_fork: false,
        };
        assert!(
            holds(noise_base + i * PAGE, &page),
            "final check: noise page {i} does not hold its bytes"
        );
    }
    drop(noise_region);
    let all: Vec<(usize, Page)> = case.pages.iter().map(|(&a, &p)| (a, p)).collect();
    for (addr, page) in &all {
        assert!(
            holds(*addr, page),
            "final check: page {addr:#x} does not hold {page:?}"
        );
    }
    let stats = case.rt.stats();
    eprintln!(
        "folio {folio} {layout} file {swap_file} seed {seed}: {ops} operations {:?}, worker words {}, page round trips {} in / {} out, folios stored whole {}, clean installs / evictions / dropped {} / {} / {}, pages discarded by move / in place {} / {}, first touches filled ahead {}, {:?}",
        case.ops,
        worker_ops.load(Ordering::Relaxed),
        stats.store.zswpin + stats.store.pswpin + stats.store.swpin_zero,
        stats.store.zswpout + stats.store.pswpout + stats.store.swpout_zero,
        stats.store.folio_objects_stored,
        stats.clean_installs,
        stats.clean_evictions,
        stats.clean_dropped,
        stats.discarded_by_move,
        stats.discarded_in_place,
        stats.zero_fills_ahead,
        (stats.evicted_folios, stats.pgmajfault, stats.forks, stats.partial_folio_events, stats.split_installs, stats.unfit_folios)
    );
    if !swap_file && folio == PAGE {
        assert!(stats.unfit_folios > 0, "no folio was left UNFIT: {stats:?}");
    }
    assert!(
        stats.evicted_folios > 0 && stats.pgmajfault > 0,
        "no pressure: {stats:?}"
    );
    assert_eq!(stats.store.decompress_fail, 0);
    assert_eq!(stats.sigbus, 0);
    if rt_keeps_clean(&case.rt) {
        assert!(stats.clean_installs > 0, "no folio read back stayed clean");
    }
    if layout != Layout::PerPage && folio > PAGE {
        assert!(
            stats.store.folio_objects_stored > 0,
            "no folio was stored whole: {:?}",
            stats.store
        );
    }
    drop(worker_region);
    case.regions.clear();
    // The scratch reservation and whatever moved into it, but for what
    // other threads mapped where the model had freed a range.
    let end = scratch as usize + scratch_len;
    let mut at = scratch as usize;
    case.foreign.sort_unstable();
    for (lo, hi) in case.foreign.iter().copied().chain([(end, end)]) {
        if lo > at {
            // SAFETY: the model's own range: reserved, moved into, or freed.
            assert_eq!(unsafe { libc::munmap(at as *mut _, lo - at) }, 0);
        }
        at = at.max(hi);
    }
    let rt = &case.rt;
    assert!(
        common::eventually(|| rt.stats().children == 0),
        "forked children released"
    );
    assert_eq!(
        rt.stats().unfit_bytes,
        0,
        "UNFIT memory counted after it is gone"
    );
    rt.store().drain_slot_caches();
    assert_eq!(rt.store().slots_in_use(), 0, "every slot is back");
    assert_eq!(
        rt.store().stats().stored_pages,
        0,
        "every pool object is freed"
    );
    assert_eq!(rt.store().compact(), 0);
    assert_eq!(rt.store().pool().total_size(), 0, "every pool page is back");
}

fn rt_keeps_clean(rt: &Runtime) -> bool {
    rt.config().keep_clean_copies
}

fn cases(folio: usize) {
    let ops = env("USWAP_MODEL_OPS", 800);
    let seeds = env("USWAP_MODEL_SEEDS", 3);
    let first = env("USWAP_MODEL_SEED", 1);
    let held: Option<Layout> = std::env::var("USWAP_MODEL_LAYOUT")
        .ok()
        .map(|l| l.parse().expect("USWAP_MODEL_LAYOUT: page, folio or byn:N"));
    let turns = [
        Layout::PerPage,
        Layout::Folio { segments: 1 },
        Layout::Folio { segments: 4 },
    ];
    for seed in first..first + seeds {
        let layout = held.unwrap_or(turns[seed as usize % turns.len()]);
        for swap_file in [false, true] {
            within(Duration::from_secs(600), move || {
                run_case(folio, layout, swap_file, seed * 7919 + folio as u64, ops)
            });
        }
    }
}

#[test]
fn model_4k_folios() {
    cases(4096);
}

#[test]
fn model_64k_folios() {
    cases(64 << 10);
}

#[test]
fn model_2m_folios() {
    cases(2 * MIB);
}

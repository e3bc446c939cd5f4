//! The userfaultfd runtime: contents survive eviction and faults under
//! concurrency for every folio size, plug size and with or without a swap
//! file; writes racing eviction are never lost; the program's madvise,
//! munmap and mremap are followed; the limit holds; a corrupt object is
//! SIGBUS, not data.

mod common;

use common::{eventually, fill_and_evict, runtime, within, Words, MIB};
use rand::{Rng, SeedableRng};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use uswap::mm::{Runtime, RuntimeConfig};

/// Threads own interleaved words (word i belongs to thread i % threads), so
/// they share every folio; each keeps a model of its words. Thread t runs on
/// `cpus[t % cpus.len()]` alone, if `cpus` names any.
fn hammer(rt: &Runtime, words: Words, threads: usize, ops: usize, seed: u64, cpus: &[usize]) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                if !cpus.is_empty() {
                    pin_to(cpus[t % cpus.len()]);
                }
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed + t as u64);
                let mine = (words.count - t).div_ceil(threads);
                let mut model = vec![0u64; mine];
                for _ in 0..ops {
                    let k = rng.gen_range(0..mine);
                    let i = k * threads + t;
                    if rng.gen_bool(0.5) {
                        let v = rng.gen::<u64>() | 1;
                        words.write(i, v);
                        model[k] = v;
                    } else {
                        assert_eq!(words.read(i), model[k], "thread {t}: word {i} changed");
                    }
                }
                for (k, &v) in model.iter().enumerate() {
                    assert_eq!(
                        words.read(k * threads + t),
                        v,
                        "thread {t}: word {} at the end",
                        k * threads + t
                    );
                }
            });
        }
    });
    let stats = rt.stats();
    assert_eq!(stats.store.decompress_fail, 0);
    assert_eq!(stats.sigbus, 0);
}

fn random_access_case(folio: usize, batch: usize, swap_file: bool) {
    let high = 4 * MIB;
    let rt = runtime(high, folio, batch, swap_file);
    let region = rt.map(6 * high).unwrap();
    let ops = if folio >= 2 * MIB { 3_000 } else { 30_000 };
    hammer(
        &rt,
        Words::of(&region),
        3,
        ops,
        folio as u64 + batch as u64,
        &[],
    );
    let stats = rt.stats();
    assert!(stats.evicted_folios > 0, "nothing was evicted: {stats:?}");
    assert!(stats.pgmajfault > 0, "nothing came back from the store");
    // Folios of several pages are brought in by the fillers (the default
    // `handoff_pages`), beside the event thread.
    if folio > 4096 {
        assert!(
            stats.swapins_handed_off > 0,
            "no swap-in was handed to a filler: {stats:?}"
        );
    } else {
        assert_eq!(stats.swapins_handed_off, 0, "a 4K swap-in was handed on");
    }
    drop(region);
    rt.store().drain_slot_caches();
    assert_eq!(
        rt.store().slots_in_use(),
        0,
        "the dropped region's slots came back"
    );
}

#[test]
fn random_access_4k_folios() {
    for (batch, file) in [(1, false), (8, true)] {
        random_access_case(4096, batch, file);
    }
}

#[test]
fn random_access_16k_folios() {
    for (batch, file) in [(8, false), (1, true)] {
        random_access_case(16 << 10, batch, file);
    }
}

#[test]
fn random_access_64k_folios() {
    for (batch, file) in [(1, false), (8, false), (1, true), (8, true)] {
        random_access_case(64 << 10, batch, file);
    }
}

#[test]
fn random_access_2m_folios() {
    for (batch, file) in [(1, true), (8, false)] {
        random_access_case(2 * MIB, batch, file);
    }
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it in.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(r, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: as in `allowed_cpus`; `cpu` is below CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(r, 0, "sched_setaffinity");
}

/// The CPUs the event readers of this process are pinned to: those of its
/// threads named uswap-uffd* allowed on one CPU only.
fn cpus_of_pinned_readers() -> Vec<usize> {
    let mut cpus = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !comm.starts_with("uswap-uffd") {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim();
        if let Ok(cpu) = list.parse::<usize>() {
            cpus.push(cpu);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// With a reader per CPU (the default on a machine of 2 to 4 CPUs), one
/// reader is pinned to each CPU, and threads pinned to different CPUs
/// faulting at once on evicted memory are served by readers taking the
/// event thread's role in turn: every word comes back as written.
#[test]
fn readers_pinned_to_every_cpu_serve_threads_faulting_apart() {
    let cpus = allowed_cpus();
    if !(2..=uswap::mm::EventReaders::PER_CPU_MAX).contains(&cpus.len()) {
        eprintln!("skipped: {} CPUs (one reader, not pinned)", cpus.len());
        return;
    }
    within(Duration::from_secs(120), move || {
        let high = 4 * MIB;
        let rt = Runtime::new(uswap::mm::RuntimeConfig {
            memory_high: high,
            folio_size: 4096,
            max_pool_bytes: Some(64 << 20),
            event_readers: uswap::mm::EventReaders::PerCpu,
            ..uswap::mm::RuntimeConfig::default()
        })
        .unwrap();
        assert_eq!(
            cpus_of_pinned_readers(),
            cpus,
            "a reader pinned to each CPU"
        );
        let region = rt.map(6 * high).unwrap();
        hammer(&rt, Words::of(&region), 2 * cpus.len(), 20_000, 77, &cpus);
        let stats = rt.stats();
        assert!(stats.evicted_folios > 0, "nothing was evicted: {stats:?}");
        assert!(stats.pgmajfault > 0, "nothing came back from the store");
    });
}

/// A reader holding the event thread's role, pinned to a CPU that a
/// real-time thread then keeps busy (woken by the reader's own install, it
/// takes the CPU at once), does not hold every other fault up for as long
/// as that thread runs: a reader waiting for the role lets the holder run
/// on another CPU. Run in a process of its own (the real-time thread
/// keeps one CPU for 600 ms).
#[test]
fn a_role_holder_kept_off_its_cpu_does_not_hold_other_faults_up() {
    const NAME: &str = "a_role_holder_kept_off_its_cpu_does_not_hold_other_faults_up";
    let cpus = allowed_cpus();
    if !(2..=uswap::mm::EventReaders::PER_CPU_MAX).contains(&cpus.len()) {
        eprintln!("skipped: {} CPUs (one reader, not pinned)", cpus.len());
        return;
    }
    if std::env::var("USWAP_TEST_CHILD").is_err() {
        let ended = common::in_child_process(NAME, Duration::from_secs(60));
        assert_eq!(ended, (Some(0), None), "the child's run");
        return;
    }
    let rt = Runtime::new(uswap::mm::RuntimeConfig {
        memory_high: 4 * MIB,
        folio_size: 4096,
        max_pool_bytes: Some(64 << 20),
        event_readers: uswap::mm::EventReaders::PerCpu,
        ..uswap::mm::RuntimeConfig::default()
    })
    .unwrap();
    let region = rt.map(16 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let words = Words::of(&region);
    // The first pages written are the first evicted.
    let (first, second) = (0, 4096 / 8);
    let before = rt.stats().pgmajfault;
    let busy = std::sync::Arc::new(AtomicBool::new(false));
    let over = std::sync::Arc::new(AtomicBool::new(false));
    let (cpu0, cpu1) = (cpus[0], cpus[1]);
    let hog = {
        let (busy, over) = (busy.clone(), over.clone());
        std::thread::spawn(move || {
            pin_to(cpu0);
            let fifo = libc::sched_param { sched_priority: 1 };
            // SAFETY: sets the calling thread's policy from a valid param.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo) } != 0 {
                busy.store(true, Ordering::Release);
                return false;
            }
            assert_eq!(words.read(first), first as u64 ^ 0x5555);
            busy.store(true, Ordering::Release);
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_millis(600) {
                std::hint::spin_loop();
            }
            over.store(true, Ordering::Release);
            let other = libc::sched_param { sched_priority: 0 };
            // SAFETY: as above.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &other) };
            true
        })
    };
    pin_to(cpu1);
    while !busy.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    let start = std::time::Instant::now();
    assert_eq!(words.read(second), second as u64 ^ 0x5555);
    let served_while_hogged = !over.load(Ordering::Acquire);
    eprintln!("the fault on the other CPU took {:?}", start.elapsed());
    if !hog.join().unwrap() {
        eprintln!("skipped: no SCHED_FIFO here");
        return;
    }
    assert!(
        rt.stats().pgmajfault >= before + 2,
        "both words came back from the store"
    );
    assert!(
        served_while_hogged,
        "a fault on another CPU waited for the role until the real-time thread let its CPU go"
    );
}

#[test]
fn writes_racing_eviction_are_never_lost() {
    let high = 2 * MIB;
    let rt = runtime(high, 64 << 10, 8, false);
    let region = rt.map(4 * high).unwrap();
    let words = Words::of(&region);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Writers bump counters in every folio, over and over; each word has
        // a single writer, which checks it reads back what it wrote last.
        let writers: Vec<_> = (0..2)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let mut rounds = 0u64;
                    while !stop.load(Ordering::Relaxed) || rounds < 20 {
                        rounds += 1;
                        let mut i = t;
                        while i < words.count {
                            let before = words.read(i);
                            assert_eq!(before, rounds - 1, "word {i} lost a write");
                            words.write(i, rounds);
                            i += 8192 / 8 * 2;
                        }
                    }
                    rounds
                })
            })
            .collect();
        // Meanwhile, stream through other memory to keep the reclaimer busy.
        let mut j = 1usize;
        for _ in 0..40 {
            while j < words.count {
                words.write(j + 2 - 1, 7);
                j += 4096 / 8;
            }
            j = 1;
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            assert!(w.join().unwrap() >= 20);
        }
    });
    let stats = rt.stats();
    assert!(stats.evicted_folios > 0);
    assert!(
        stats.wp_faults > 0 || stats.pgmajfault > 0,
        "no write ever met eviction: {stats:?}"
    );
}

/// Version `round` of the bytes at `offset..offset + out.len()` (whole
/// words): each word its own offset and two bytes of noise, so that it
/// compresses.
fn file_version(out: &mut [u8], offset: usize, round: u64) {
    for (k, w) in out.chunks_exact_mut(8).enumerate() {
        let at = (offset + 8 * k) as u64;
        let noise = (at ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            >> 48;
        w.copy_from_slice(&((at << 16) | noise).to_le_bytes());
    }
}

/// O_DIRECT reads into memory the reclaimer is taking: a read pins its
/// pages, and the disk writes them with no write-protect fault. One
/// pinned before the reclaimer write-protected and copied it, written
/// after the copy and unpinned before the move out, was stored with its
/// old bytes: the program read them back instead of the file's. What a
/// move takes is now checked against the copy, and put back where it
/// differs (`discard_refused_changed`). Half the managed memory is read
/// into, round after round with new file contents, while two threads
/// write the other half; every page must read as the file. Without the
/// check, 1 run in 3 or 4 read 16-25 pages wrong; with it, 0 in 7, and
/// 9-44 pages put back in 5 of them.
#[test]
fn o_direct_reads_into_memory_being_evicted_keep_the_bytes_read() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let high = 4 * MIB;
    // Batches of 32 in zstd: the copy-out and the move lie hundreds of
    // microseconds apart, as long as a disk's read takes.
    let rt = Runtime::new(RuntimeConfig {
        memory_high: high,
        folio_size: 4096,
        compressor: "zstd".into(),
        compress_batchsize: uswap::mm::BatchSize::Fixed(32),
        max_pool_bytes: Some(64 << 20),
        ..RuntimeConfig::default()
    })
    .expect("userfaultfd runtime");
    let part = 2 * high;
    let region = rt.map(2 * part).unwrap();
    let base = region.as_ptr() as usize;
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("o_direct.{}", std::process::id()));
    let mut file = std::fs::File::create(&path).unwrap();
    let mut data = vec![0u8; part];
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let direct = match direct {
        Ok(f) => f,
        Err(e) => panic!("O_DIRECT in {}: {e}", path.display()),
    };
    let mut wrong = 0;
    let rounds = 24;
    for round in 0..rounds {
        file_version(&mut data, 0, round);
        std::io::Write::write_all(&mut file, &data).unwrap();
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).unwrap();
        file.sync_data().unwrap();
        // The part read into goes in first: the oldest, the reclaimer's next.
        for page in (0..part).step_by(4096) {
            // SAFETY: inside the region, which outlives this test's threads.
            unsafe { std::ptr::write_volatile((base + page) as *mut u8, data[page]) };
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..2 {
                let stop = &stop;
                s.spawn(move || {
                    let mut pass = 0u8;
                    while !stop.load(Ordering::Relaxed) {
                        pass = pass.wrapping_add(1);
                        for page in (part + t * 4096..2 * part).step_by(8192) {
                            // SAFETY: as above.
                            unsafe { std::ptr::write_volatile((base + page) as *mut u8, pass) };
                        }
                    }
                });
            }
            let readers: Vec<_> = (0..2)
                .map(|t| {
                    let fd = direct.as_raw_fd();
                    s.spawn(move || {
                        let chunk = 64 << 10;
                        for at in (t * part / 2..(t + 1) * part / 2).step_by(chunk) {
                            // SAFETY: `base + at` and the chunk after it are
                            // inside the region, page-aligned as O_DIRECT
                            // needs.
                            let n = unsafe {
                                libc::pread(fd, (base + at) as *mut libc::c_void, chunk, at as i64)
                            };
                            assert_eq!(n, chunk as isize, "O_DIRECT read at {at}");
                        }
                    })
                })
                .collect();
            for r in readers {
                r.join().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        // SAFETY: the part, inside the region; no thread writes it now.
        let read = unsafe { std::slice::from_raw_parts(base as *const u8, part) };
        wrong += read
            .chunks(4096)
            .zip(data.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
    }
    std::fs::remove_file(&path).unwrap();
    let stats = rt.stats();
    assert_eq!(wrong, 0, "pages read wrong in {rounds} rounds: {stats:?}");
    assert!(stats.evicted_folios > 0, "{stats:?}");
}

#[test]
fn madvise_dontneed_drops_and_keeps_the_right_bytes() {
    let fs = 64 << 10;
    let rt = runtime(MIB, fs, 8, false);
    let region = rt.map(8 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let w = Words::of(&region);
    let base = region.as_ptr() as usize;
    // Drop 10 whole folios plus half of the next, starting in swapped memory.
    let (start, len) = (base + 2 * fs, 10 * fs + fs / 2);
    let stored_before = rt.stats().store.stored_pages;
    // SAFETY: a range inside our own region.
    assert_eq!(
        unsafe { libc::madvise(start as *mut _, len, libc::MADV_DONTNEED) },
        0
    );
    // Before reading anything back: folios read back keep their stored
    // copies (CLEAN), which would hide the entries the drop freed.
    assert!(
        eventually(|| rt.stats().store.stored_pages < stored_before),
        "dropped folios left the store"
    );
    for i in 0..w.count {
        let addr = base + i * 8;
        let expect = if addr >= start && addr < start + len {
            0
        } else {
            i as u64 ^ 0x5555
        };
        assert_eq!(w.read(i), expect, "word {i}");
    }
}

#[test]
fn munmap_of_part_of_a_region_releases_its_slots() {
    let fs = 64 << 10;
    let rt = runtime(MIB, fs, 8, false);
    let region = rt.map(8 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let base = region.as_ptr() as usize;
    let slots_before = rt.store().slots_in_use();
    // SAFETY: unmapping whole folios of our own region that nothing uses.
    assert_eq!(
        unsafe { libc::munmap((base + 16 * fs) as *mut _, 32 * fs) },
        0
    );
    // munmap returns once the runtime has read its UNMAP event; handling it
    // follows on the event thread.
    assert!(
        eventually(|| {
            rt.store().drain_slot_caches();
            rt.store().slots_in_use() < slots_before
        }),
        "the unmapped folios' slots were not released"
    );
    let w = Words::of(&region);
    for i in 0..w.count {
        let addr = base + i * 8;
        if addr < base + 16 * fs || addr >= base + 48 * fs {
            assert_eq!(w.read(i), i as u64 ^ 0x5555, "word {i}");
        }
    }
    drop(region);
    rt.store().drain_slot_caches();
    assert_eq!(rt.store().slots_in_use(), 0);
}

#[test]
fn mremap_moves_swapped_and_resident_folios_with_the_region() {
    let fs = 64 << 10;
    let rt = runtime(MIB, fs, 8, false);
    let region = rt.map(8 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let old = region.as_ptr() as usize;
    assert!(rt.stats().evicted_folios > 0);
    // SAFETY: a scratch reservation to move onto, then moving our whole
    // region there.
    let target = unsafe {
        let t = libc::mmap(
            std::ptr::null_mut(),
            8 * MIB + fs,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(t, libc::MAP_FAILED);
        let t = (t as usize).next_multiple_of(fs);
        let moved = libc::mremap(
            old as *mut _,
            8 * MIB,
            8 * MIB,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            t as *mut libc::c_void,
        );
        assert_eq!(moved as usize, t);
        t
    };
    assert!(
        eventually(|| region.current_base() == target),
        "the runtime followed the move"
    );
    let w = Words::of(&region);
    for i in 0..w.count {
        assert_eq!(w.read(i), i as u64 ^ 0x5555, "word {i} after the move");
    }
}

#[test]
fn mremap_of_a_part_that_cuts_folios_keeps_every_byte() {
    let fs = 64 << 10;
    let rt = runtime(MIB, fs, 8, false);
    let region = rt.map(8 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let base = region.as_ptr() as usize;
    // Starts and ends inside folios; most of what it covers is swapped out.
    let (from, len) = (base + 5 * fs + 3 * 4096, 7 * fs + 2 * 4096);
    // SAFETY: a scratch reservation to move onto, then moving part of our
    // own region there.
    let to = unsafe {
        let t = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(t, libc::MAP_FAILED);
        let moved = libc::mremap(
            from as *mut _,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            t,
        );
        assert_eq!(moved, t);
        t as usize
    };
    let expect = |addr: usize| ((addr - base) / 8) as u64 ^ 0x5555;
    for off in (0..len).step_by(8) {
        // SAFETY: inside the range just moved to `to`.
        let v = unsafe { std::ptr::read_volatile((to + off) as *const u64) };
        assert_eq!(v, expect(from + off), "moved word at +{off}");
    }
    let w = Words::of(&region);
    for i in 0..w.count {
        let addr = base + i * 8;
        if addr < from || addr >= from + len {
            assert_eq!(w.read(i), expect(addr), "unmoved word {i}");
        }
    }
}

#[test]
fn a_managed_mapping_is_paged_and_given_back_intact() {
    let fs = 64 << 10;
    let len = 8 * MIB;
    // SAFETY: a fresh private anonymous mapping of our own, aligned to the
    // folio size by over-mapping.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len + fs,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        (p as usize).next_multiple_of(fs)
    };
    let words = Words {
        base,
        count: len / 8,
    };
    for i in 0..words.count {
        words.write(i, i as u64 * 3);
    }
    let rt = runtime(MIB, fs, 8, false);
    // SAFETY: the mapping above stays mapped until after the region is dropped.
    let region = unsafe { rt.manage(base as *mut u8, len) }.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rt.stats().evicted_folios == 0 && std::time::Instant::now() < deadline {
        rt.reclaim_now();
        std::thread::yield_now();
    }
    assert!(
        rt.stats().evicted_folios > 0,
        "nothing of the managed mapping was evicted"
    );
    for i in (0..words.count).step_by(97) {
        assert_eq!(words.read(i), i as u64 * 3, "word {i} while managed");
    }
    drop(region);
    // No longer managed: every byte is back in the caller's mapping.
    for i in 0..words.count {
        assert_eq!(
            words.read(i),
            i as u64 * 3,
            "word {i} after the region was dropped"
        );
    }
}

#[test]
fn a_region_dropped_while_swapped_frees_everything() {
    let rt = runtime(MIB, 16 << 10, 8, true);
    for _ in 0..3 {
        let region = rt.map(6 * MIB).unwrap();
        fill_and_evict(&rt, &region);
        assert!(rt.stats().store.stored_pages > 0 || rt.stats().store.pswpout > 0);
        drop(region);
        rt.store().drain_slot_caches();
        assert_eq!(rt.store().slots_in_use(), 0);
        assert_eq!(rt.stats().resident_bytes, 0);
    }
}

#[test]
fn resident_memory_stays_under_the_limit_plus_slack() {
    let high = 4 * MIB;
    let rt = runtime(high, 64 << 10, 8, false);
    let limit = high + rt.slack();
    let region = rt.map(8 * high).unwrap();
    let w = Words::of(&region);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let pages = region.len() / 4096;
            let mut vec = vec![0u8; pages];
            let (mut samples, mut max_counted, mut max_real) = (0, 0, 0);
            let discarded = || {
                let s = rt.stats();
                (s.discarded_by_move + s.discarded_in_place) as usize * 4096
            };
            while !done.load(Ordering::Relaxed) {
                let counted = rt.stats().resident_bytes as usize;
                let before = discarded();
                // SAFETY: mincore over our own region into a vector of one
                // byte per page.
                let r = unsafe {
                    libc::mincore(region.as_ptr().cast(), region.len(), vec.as_mut_ptr())
                };
                assert_eq!(r, 0);
                // mincore walks the region page by page while folios leave
                // and come in: a folio that left behind the walk and one
                // that came in ahead of it are both seen. What left during
                // the walk is taken off; the rest was resident at once.
                let left = discarded() - before;
                let real =
                    (vec.iter().filter(|&&b| b & 1 != 0).count() * 4096).saturating_sub(left);
                max_counted = max_counted.max(counted);
                max_real = max_real.max(real);
                samples += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            (samples, max_counted, max_real)
        });
        for round in 0..3u64 {
            for i in (0..w.count).step_by(64) {
                w.write(i, i as u64 + round);
            }
        }
        done.store(true, Ordering::Relaxed);
        let (samples, max_counted, max_real) = sampler.join().unwrap();
        assert!(samples > 10);
        assert!(max_counted <= limit, "accounted {max_counted} > {limit}");
        assert!(max_real <= limit, "mincore saw {max_real} > {limit}");
    });
    assert!(rt.stats().throttled > 0 || rt.stats().evicted_folios > 0);
}

/// The default plug grows with the limit (`BatchSize::Auto`): 4K folios
/// under 16 MiB are stored 32 to a batch, where a plug of the fixed 8
/// never holds more than 8; and every byte comes back.
#[test]
fn the_default_plug_grows_with_the_limit() {
    let high = 16 * MIB;
    let rt = Runtime::new(RuntimeConfig {
        memory_high: high,
        folio_size: 4096,
        max_pool_bytes: Some(64 << 20),
        ..RuntimeConfig::default()
    })
    .expect("userfaultfd runtime");
    assert_eq!(rt.config().plug_folios(high), 32);
    let region = rt.map(4 * high).unwrap();
    fill_and_evict(&rt, &region);
    let s = rt.stats();
    assert!(
        s.evicted_folios > 12 * s.reclaim_batches,
        "{} folios in {} batches",
        s.evicted_folios,
        s.reclaim_batches
    );
    let w = Words::of(&region);
    for i in 0..w.count {
        assert_eq!(w.read(i), i as u64 ^ 0x5555, "word {i}");
    }
    assert_eq!(rt.stats().store.decompress_fail, 0);
}

#[test]
fn a_corrupt_stored_object_is_sigbus_for_the_faulting_thread() {
    if std::env::var("USWAP_SIGBUS_CHILD").is_ok() {
        sigbus_child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new(exe)
        .args([
            "--exact",
            "a_corrupt_stored_object_is_sigbus_for_the_faulting_thread",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("USWAP_SIGBUS_CHILD", "1")
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "child ended with {status:?}"
    );
}

fn sigbus_child() {
    let fs = 64 << 10;
    let rt = runtime(MIB, fs, 8, false);
    let region = rt.map(4 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let base = region.as_ptr() as usize;
    let victim = (0..region.len() / fs)
        .map(|f| base + f * fs)
        .find(|&a| {
            rt.swapped_slot(a as *const u8)
                .is_some_and(|s| (s..s + 16).any(|slot| rt.store().corrupt_stored_object(slot)))
        })
        .expect("a swapped folio with a pool object");
    // Touching it must kill us with SIGBUS; reaching the exit is a failure.
    let w = Words::of(&region);
    let got = w.read((victim - base) / 8);
    eprintln!("read {got:#x} from a corrupt folio instead of SIGBUS");
    std::process::exit(3);
}

#[test]
fn dropping_the_runtime_with_work_in_flight_does_not_hang() {
    for _ in 0..3 {
        let rt = runtime(MIB, 16 << 10, 8, true);
        let region = rt.map(8 * MIB).unwrap();
        let w = Words::of(&region);
        std::thread::scope(|s| {
            for t in 0..2 {
                s.spawn(move || {
                    for i in (t..w.count).step_by(509) {
                        w.write(i, i as u64);
                    }
                });
            }
        });
        // Folios are swapped, the reclaimer and the writeback worker busy.
        drop(region);
        drop(rt);
    }
}

/// Lowering the limit at run time evicts down to its low mark; raising it
/// lets memory back in without eviction; every byte survives both.
#[test]
fn the_limit_can_be_changed_while_running() {
    within(Duration::from_secs(60), || {
        let rt = runtime(8 * MIB, 64 << 10, 8, false);
        let region = rt.map(8 * MIB).unwrap();
        let w = Words::of(&region);
        for i in 0..w.count {
            w.write(i, i as u64 ^ 0x77);
        }
        assert_eq!(rt.stats().evicted_folios, 0, "nothing over the first limit");
        rt.set_memory_high(2 * MIB);
        assert_eq!(rt.memory_high(), 2 * MIB);
        // Once there, and its last flush finished (a batch may pass the
        // low mark folio by folio), the reclaimer stops: it takes no folio
        // afterwards that it would evict after the limit is raised.
        let low_mark = 2 * MIB - rt.reclaim_margin();
        assert!(low_mark < 2 * MIB, "a margin under 2 MiB");
        assert!(
            eventually(|| {
                rt.reclaim_now();
                let s = rt.stats();
                s.resident_bytes as usize <= low_mark && s.evicting_folios == 0
            }),
            "resident {} after lowering the limit to 2 MiB (low mark {low_mark})",
            rt.stats().resident_bytes
        );
        rt.set_memory_high(16 * MIB);
        let evicted = rt.stats().evicted_folios;
        for i in 0..w.count {
            assert_eq!(w.read(i), i as u64 ^ 0x77, "word {i}");
        }
        assert_eq!(
            rt.stats().evicted_folios,
            evicted,
            "evicted under the raised limit"
        );
    });
}

/// Pages the store holds or has recorded: every folio stored adds its pages.
fn pages_stored(rt: &Runtime) -> u64 {
    let s = rt.stats().store;
    s.zswpout + s.swpout_zero + s.pswpout
}

/// Reads every word twice over memory four times the limit: folios read
/// back keep their stored copies (CLEAN), and the ones evicted again before
/// any write leave by a discard alone, so the second pass stores fewer pages
/// than it evicts. A write then drops a folio's copy, and the bytes written
/// survive the next eviction.
fn clean_case(keep: bool) {
    let fs = 64 << 10;
    let rt = Runtime::new(uswap::mm::RuntimeConfig {
        memory_high: MIB,
        folio_size: fs,
        max_pool_bytes: Some(64 << 20),
        keep_clean_copies: keep,
        ..uswap::mm::RuntimeConfig::default()
    })
    .unwrap();
    let region = rt.map(4 * MIB).unwrap();
    fill_and_evict(&rt, &region);
    let w = Words::of(&region);
    let read_all = |expect: &dyn Fn(usize) -> u64| {
        for i in 0..w.count {
            assert_eq!(w.read(i), expect(i), "word {i}");
        }
    };
    read_all(&|i| i as u64 ^ 0x5555);
    let (evicted, stored) = (rt.stats().evicted_folios, pages_stored(&rt));
    read_all(&|i| i as u64 ^ 0x5555);
    let s = rt.stats();
    let pages = (s.evicted_folios - evicted) * (fs / 4096) as u64;
    let stored = pages_stored(&rt) - stored;
    if keep {
        assert!(s.clean_installs > 0 && s.clean_evictions > 0, "{s:?}");
        assert!(stored < pages, "{stored} pages stored for {pages} evicted");
    } else {
        assert_eq!((s.clean_installs, s.clean_evictions), (0, 0));
        // A plug in flight when the counts were first taken may have been
        // stored before and counted evicted after.
        let plug = (rt.config().plug_folios(rt.memory_high()) * fs / 4096) as u64;
        assert!(
            stored + plug >= pages,
            "{stored} pages stored for {pages} evicted"
        );
    }
    // One write per folio, the last read (resident, clean) first, then
    // everything out and back once more.
    let per_folio = fs / 8;
    for k in (0..w.count / per_folio).rev() {
        w.write(k * per_folio + 3, 0xdead_0000 + k as u64);
    }
    common::evict_to_limit(&rt);
    read_all(&|i| {
        if i % per_folio == 3 {
            0xdead_0000 + (i / per_folio) as u64
        } else {
            i as u64 ^ 0x5555
        }
    });
    if keep {
        assert!(rt.stats().clean_dropped > 0);
    }
    assert_eq!(rt.stats().store.decompress_fail, 0);
}

#[test]
fn clean_folios_leave_without_compression_and_keep_their_writes() {
    clean_case(true);
}

#[test]
fn without_clean_copies_every_eviction_stores() {
    clean_case(false);
}

/// A run of folios that the program split into several mappings (here by
/// madvise; mprotect and mlock split them too) leaves by moves, one
/// mapping at a time: the kernel moves only inside one mapping, and a drop
/// in place instead waits for its event and acts on whatever is mapped
/// there by then (see `mm/reclaim.rs`).
#[test]
fn folios_split_across_mappings_leave_by_moves() {
    within(Duration::from_secs(60), || {
        let folio = 64 << 10;
        let rt = runtime(16 * MIB, folio, 32, false);
        let region = rt.map(8 * folio).unwrap();
        let base = region.as_ptr() as usize;
        // Two mappings boundaries inside folios, both pieces still
        // read-write.
        // SAFETY: advice on part of our own region.
        let r = unsafe {
            libc::madvise(
                (base + folio + folio / 2) as *mut _,
                3 * folio,
                libc::MADV_DONTFORK,
            )
        };
        assert_eq!(r, 0);
        let words = Words::of(&region);
        for i in 0..words.count {
            words.write(i, i as u64 ^ 0xA5A5);
        }
        rt.set_memory_high(folio);
        assert!(eventually(|| rt.stats().evicted_folios >= 7));
        let stats = rt.stats();
        assert_eq!(stats.discarded_in_place, 0, "{stats:?}");
        assert!(stats.discarded_by_move >= 7 * 16, "{stats:?}");
        for i in 0..words.count {
            assert_eq!(words.read(i), i as u64 ^ 0xA5A5, "word {i}");
        }
    });
}

/// A forked child that exits before its request to be adopted is read is
/// gone (ESRCH, which a supervisor passes over in silence), not "a process
/// that never touched its beacon" (said for every such child before).
#[test]
fn adopting_a_child_that_has_exited_finds_it_gone() {
    use uswap::mm::memory::{Discarded, DropError, DropPages};
    struct Nothing;
    impl DropPages for Nothing {
        fn drop_pages(&self, _: usize, _: usize) -> Result<(), DropError> {
            Err(DropError::Gone)
        }
        fn move_out(&self, _: usize, _: usize) -> Discarded {
            Discarded {
                bytes: 0,
                again: false,
                shared: false,
                unmovable: false,
                ..Default::default()
            }
        }
    }
    within(Duration::from_secs(60), || {
        let rt = runtime(16 * MIB, 64 << 10, 8, false);
        // A child that exits at once, left unreaped (a zombie) while it is
        // asked for. Spawned, not forked: a fork would share the pages of
        // the other tests' runtimes with it meanwhile.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        let zombie = eventually(|| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        });
        assert!(zombie, "the child did not exit");
        let asked = rt.adopt(pid, Box::new(Nothing), |_| Ok(()));
        child.wait().unwrap();
        let e = asked.err().expect("an exited child is not adopted");
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    });
}

/// Memory that does not compress, with no swap file to hold it raw, is
/// refused once and then left alone until it is written (`folio::UNFIT`):
/// the reclaimer does not compress it again at every pass. It does not
/// count against the limit, so that a working set that fits under the
/// limit stays in memory instead of being evicted as soon as it comes
/// back. A write takes a folio back into reclaim, and dropping
/// the memory leaves nothing counted.
#[test]
fn memory_that_does_not_compress_is_tried_once_until_written() {
    within(Duration::from_secs(120), || {
        let fs = 64 << 10;
        let rt = runtime(4 * MIB, fs, 8, false);
        let noise = rt.map(5 * MIB).unwrap();
        let data = rt.map(8 * MIB).unwrap();
        let (n, d) = (Words::of(&noise), Words::of(&data));
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let random: Vec<u64> = (0..n.count).map(|_| rng.gen()).collect();
        for (i, &v) in random.iter().enumerate() {
            n.write(i, v);
        }
        let per_page = 4096 / 8;
        let touch = |pages: usize, round: u64| {
            for p in 0..pages {
                d.write(p * per_page, p as u64 + round);
            }
        };
        for round in 0..4 {
            touch(d.count / per_page, round);
        }
        let s = rt.stats();
        let noise_pages = (noise.len() / 4096) as u64;
        assert!(s.unfit_folios > 0 && s.unfit_bytes > 0, "{s:?}");
        assert!(s.unfit_bytes <= noise.len() as u64, "{s:?}");
        assert!(
            s.store.reject_compress_poor <= noise_pages,
            "{} pages refused for {noise_pages} that do not compress",
            s.store.reject_compress_poor
        );
        // A working set of 1.5 MiB, under the limit: after its first pass
        // it stays in memory.
        let set = 3 * MIB / 2 / 4096;
        touch(set, 10);
        let faults = rt.stats().pgmajfault;
        for round in 11..20 {
            touch(set, round);
        }
        let refaults = rt.stats().pgmajfault - faults;
        assert!(
            refaults < (set * 4096 / fs) as u64,
            "{refaults} folios of the working set brought back again"
        );
        // A write takes a folio back into reclaim.
        let unfit = rt.stats().unfit_bytes;
        for f in 0..noise.len() / fs {
            let i = f * fs / 8;
            n.write(i, random[i] ^ 1);
        }
        assert!(rt.stats().unfit_bytes < unfit, "{:?}", rt.stats());
        for (i, &v) in random.iter().enumerate() {
            let want = if i % (fs / 8) == 0 { v ^ 1 } else { v };
            assert_eq!(n.read(i), want, "word {i}");
        }
        for p in 0..d.count / per_page {
            let want = p as u64 + if p < set { 19 } else { 3 };
            assert_eq!(d.read(p * per_page), want, "page {p}");
        }
        drop(noise);
        assert!(
            eventually(|| rt.stats().unfit_bytes == 0),
            "{:?}",
            rt.stats()
        );
        assert_eq!(rt.stats().store.decompress_fail, 0);
    });
}

/// An UNFIT folio that the program gives up whole (MADV_FREE) and writes
/// again is queued for reclaim twice (once as changed, once first as given
/// up): the second entry must not take it again behind the bookkeeping's
/// back, or its bytes are counted UNFIT twice and the limit stays raised
/// after the memory is gone.
#[test]
fn memory_that_does_not_compress_given_up_and_written_again_is_counted_once() {
    within(Duration::from_secs(120), || {
        let fs = 64 << 10;
        let rt = runtime(MIB, fs, 8, false);
        let noise = rt.map(2 * MIB).unwrap();
        let data = rt.map(4 * MIB).unwrap();
        let (n, d) = (Words::of(&noise), Words::of(&data));
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let fill = |rng: &mut rand::rngs::StdRng| {
            for i in 0..n.count {
                n.write(i, rng.gen());
            }
        };
        // Pressure from memory that compresses, so that the reclaimer goes
        // through its queue.
        let press = |round: u64| {
            for r in 0..3 {
                for p in 0..d.count / 512 {
                    d.write(p * 512, p as u64 + round + r);
                }
            }
        };
        fill(&mut rng);
        press(0);
        assert!(rt.stats().unfit_bytes > 0, "{:?}", rt.stats());
        for round in 1..4 {
            // SAFETY: madvise over memory this test owns.
            let r = unsafe {
                libc::madvise(
                    noise.as_ptr() as *mut libc::c_void,
                    noise.len(),
                    libc::MADV_FREE,
                )
            };
            assert_eq!(r, 0);
            fill(&mut rng);
            press(round * 10);
        }
        let s = rt.stats();
        assert!(s.unfit_bytes <= noise.len() as u64, "{s:?}");
        drop(noise);
        assert!(
            eventually(|| rt.stats().unfit_bytes == 0),
            "{:?}",
            rt.stats()
        );
    });
}

/// Swaps a region of 64K folios out and lifts the limit: every folio then
/// comes back by a swap-in of its own, with no reclaim beside it.
fn swapped_out_64k_folios(rt: &Runtime, len: usize) -> uswap::mm::Region {
    let region = rt.map(len).unwrap();
    fill_and_evict(rt, &region);
    rt.set_memory_high(64 * MIB);
    region
}

/// One thread faulting its folios back in turn has no other fault to be
/// served beside its swap-ins: after the first few (at most three, as the
/// verdict on each comes once its filler is done), the event thread brings
/// them in itself rather than waking a filler for each.
#[test]
fn swap_ins_of_one_thread_faulting_in_turn_are_not_handed_on() {
    within(Duration::from_secs(60), || {
        let rt = runtime(MIB, 64 << 10, 8, false);
        let region = swapped_out_64k_folios(&rt, 8 * MIB);
        let w = Words::of(&region);
        let per_folio = (64 << 10) / 8;
        let before = rt.stats();
        for i in (0..w.count).step_by(per_folio) {
            assert_eq!(w.read(i), i as u64 ^ 0x5555, "word {i}");
        }
        let s = rt.stats();
        let swap_ins = s.pgmajfault - before.pgmajfault;
        let handed_on = s.swapins_handed_off - before.swapins_handed_off;
        assert!(swap_ins > 64, "{swap_ins} swap-ins: {s:?}");
        assert!(
            handed_on <= 3,
            "{handed_on} of {swap_ins} swap-ins handed on"
        );
    });
}

/// Threads faulting at once keep their swap-ins handed on: each is
/// brought in beside the others' instead of after them.
#[test]
fn swap_ins_of_threads_faulting_at_once_are_handed_on() {
    within(Duration::from_secs(60), || {
        let rt = runtime(MIB, 64 << 10, 8, false);
        let region = swapped_out_64k_folios(&rt, 16 * MIB);
        let w = Words::of(&region);
        let per_folio = (64 << 10) / 8;
        let folios = w.count / per_folio;
        let before = rt.stats();
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for k in (t..folios).step_by(4) {
                        let i = k * per_folio + 5;
                        assert_eq!(w.read(i), i as u64 ^ 0x5555, "word {i}");
                    }
                });
            }
        });
        let s = rt.stats();
        let swap_ins = s.pgmajfault - before.pgmajfault;
        let handed_on = s.swapins_handed_off - before.swapins_handed_off;
        assert!(
            handed_on * 4 > swap_ins,
            "{handed_on} of {swap_ins} swap-ins handed on"
        );
    });
}

/// A runtime of `folio` folios filling `ahead` bytes ahead of a first
/// touch in order, far under its limit.
fn runtime_filling_ahead(folio: usize, ahead: usize) -> Runtime {
    Runtime::new(uswap::mm::RuntimeConfig {
        memory_high: 64 * MIB,
        folio_size: folio,
        zero_fill_ahead: ahead,
        max_pool_bytes: Some(64 << 20),
        ..uswap::mm::RuntimeConfig::default()
    })
    .expect("userfaultfd runtime")
}

/// A thread writing new memory in order faults once per zero-fill-ahead
/// window (the first folio of the region, which has none before it, once
/// more), not once per folio; going through it backwards (the folio before
/// each touch untouched) or with no window, it faults once per folio. It
/// reads back exactly what it wrote either way.
#[test]
fn a_first_touch_in_order_fills_ahead_and_one_backwards_does_not() {
    within(Duration::from_secs(60), || {
        let folio = 64 << 10;
        for (ahead, backwards) in [(MIB, false), (MIB, true), (0, false)] {
            let rt = runtime_filling_ahead(folio, ahead);
            let region = rt.map(16 * MIB).unwrap();
            let w = Words::of(&region);
            let per_folio = folio / 8;
            let folios = w.count / per_folio;
            let order: Vec<usize> = if backwards {
                (0..folios).rev().collect()
            } else {
                (0..folios).collect()
            };
            for f in order {
                for i in f * per_folio..(f + 1) * per_folio {
                    w.write(i, i as u64 ^ 0xa5a5);
                }
            }
            for i in 0..w.count {
                assert_eq!(w.read(i), i as u64 ^ 0xa5a5, "word {i}");
            }
            // A folio faulted on alone goes in with a copy that wakes its
            // writer before the event thread publishes and counts it.
            eventually(|| rt.stats().zero_fills == folios as u64);
            let s = rt.stats();
            let case = format!("ahead {ahead}, backwards {backwards}: {s:?}");
            assert_eq!(s.zero_fills, folios as u64, "{case}");
            if ahead > 0 && !backwards {
                let window = (ahead / folio) as u64;
                let touches = 1 + (folios as u64 - 1).div_ceil(window);
                assert_eq!(s.faults, touches, "{case}");
                assert_eq!(s.zero_fills_ahead, touches - 1, "{case}");
            } else {
                assert_eq!(s.faults, folios as u64, "{case}");
                assert_eq!(s.zero_fills_ahead, 0, "{case}");
            }
        }
    });
}

/// A fill ahead whose one copy the kernel refuses (here the run crosses
/// into a mapping split off by mprotect, and one copy must lie in one
/// mapping) falls back to a fill of each folio, mapping by mapping: every
/// folio of the window still goes in with that one fault, and every byte
/// reads as written (zeros in the read-only page).
#[test]
fn a_fill_ahead_across_a_mapping_split_goes_in_folio_by_folio() {
    within(Duration::from_secs(60), || {
        let folio = 64 << 10;
        let rt = runtime_filling_ahead(folio, MIB);
        let region = rt.map(MIB).unwrap();
        let w = Words::of(&region);
        let per_folio = folio / 8;
        let folios = w.count / per_folio;
        // The first page of folio 6 read-only: its own mapping.
        let read_only = 6 * per_folio;
        // SAFETY: a page of our own region, untouched yet.
        let page = unsafe { region.as_ptr().add(read_only * 8) };
        // SAFETY: as above; the page is only read from now on.
        assert_eq!(
            unsafe { libc::mprotect(page.cast(), 4096, libc::PROT_READ) },
            0
        );
        let in_read_only = |i: usize| (read_only..read_only + 512).contains(&i);
        for i in 0..w.count {
            if !in_read_only(i) {
                w.write(i, i as u64 ^ 0x3c3c);
            }
        }
        for i in 0..w.count {
            let want = if in_read_only(i) {
                0
            } else {
                i as u64 ^ 0x3c3c
            };
            assert_eq!(w.read(i), want, "word {i}");
        }
        eventually(|| rt.stats().zero_fills == folios as u64);
        let s = rt.stats();
        assert_eq!(s.zero_fills, folios as u64, "{s:?}");
        assert_eq!((s.faults, s.zero_fills_ahead), (2, 1), "{s:?}");
        assert!(s.split_installs > 0, "no install went page by page: {s:?}");
    });
}

/// A page the program dropped (MADV_DONTNEED) inside a resident folio and
/// then writes costs one fault, not two: its zero page goes in
/// write-protected (the reclaimer may be taking the folio), and for a write
/// the protection is lifted by the same service, before the thread is
/// woken, where the write used to come straight back for it. Every byte
/// reads as written.
#[test]
fn a_dropped_page_written_again_faults_once() {
    within(Duration::from_secs(60), || {
        let folio = 64 << 10;
        let rt = runtime_filling_ahead(folio, 0);
        let region = rt.map(MIB).unwrap();
        let w = Words::of(&region);
        for i in 0..w.count {
            w.write(i, i as u64 ^ 0x7777);
        }
        let page_words = 4096 / 8;
        // Four pages in the middle of folio 3.
        let first = 3 * folio / 8 + 4 * page_words;
        let dropped = first..first + 4 * page_words;
        // SAFETY: pages of our own region.
        let start = unsafe { region.as_ptr().add(first * 8) };
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::madvise(start.cast(), 4 * 4096, libc::MADV_DONTNEED) },
            0
        );
        let before = rt.stats().faults;
        for i in dropped.clone() {
            w.write(i, i as u64 ^ 0x9999);
        }
        let faults = rt.stats().faults - before;
        for i in 0..w.count {
            let want = if dropped.contains(&i) { 0x9999 } else { 0x7777 };
            assert_eq!(w.read(i), i as u64 ^ want, "word {i}");
        }
        assert_eq!(faults, 4, "faults for 4 dropped pages written again");
    });
}

//! The store against a model: random store / load / invalidate / writeback /
//! compact sequences with every page checked on load, in every layout;
//! fault injection; pool limits and hysteresis; folios stored as one object.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use uswap::accel::{Device, DeviceConfig};
use uswap::corpus;
use uswap::swap::{Backing, Fault, FreeMode, MemBacking};
use uswap::zswap::{
    Layout, LoadError, PoolLimit, SlotRange, StoreError, Zswap, ZswapConfig, PAGE_SIZE,
};

/// Pages of the corpus workloads in which every page shrinks under lz4
/// (python-pkgdb holds incompressible numpy pages; tests that want those
/// make them on purpose).
fn corpus_pages() -> Vec<u8> {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    workloads
        .iter()
        .filter(|w| w.name != "python-pkgdb")
        .flat_map(|w| w.pages.iter().copied())
        .collect()
}

fn config(max_pool: usize, free_mode: FreeMode) -> ZswapConfig {
    ZswapConfig {
        compressor: "lz4".into(),
        max_pool: PoolLimit::Bytes(max_pool),
        slots: 1 << 14,
        free_mode,
        writeback_worker: false,
        ..ZswapConfig::default()
    }
}

fn store(z: &Zswap, data: &[u8]) -> Result<SlotRange, StoreError> {
    z.store_batch(&[data]).remove(0)
}

/// A folio of `pages` pages: corpus pages, plus zero and random pages.
fn folio(corpus: &[u8], seed: usize, pages: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(pages * PAGE_SIZE);
    for i in 0..pages {
        let k = seed.wrapping_mul(31).wrapping_add(i * 7);
        match k % 11 {
            0 => out.extend(std::iter::repeat_n(0u8, PAGE_SIZE)),
            1 => out.extend(std::iter::repeat_n((k % 251) as u8, PAGE_SIZE)),
            2 => out.extend((0..PAGE_SIZE as u64 / 8).flat_map(|j| (j * k as u64).to_le_bytes())),
            _ => {
                let p = k % (corpus.len() / PAGE_SIZE);
                out.extend_from_slice(&corpus[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]);
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Store { seed: usize, order: usize },
    Load(usize),
    Invalidate(usize),
    Writeback(usize),
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), prop_oneof![Just(0usize), Just(2), Just(4)]).prop_map(|(seed, order)| Op::Store { seed, order }),
        3 => any::<usize>().prop_map(Op::Load),
        1 => any::<usize>().prop_map(Op::Invalidate),
        1 => (1usize..40).prop_map(Op::Writeback),
        1 => Just(Op::Compact),
    ]
}

/// The layouts every model test runs in: page by page, a folio as one
/// stream, a folio as a by_n frame of 4 segments.
const LAYOUTS: [Layout; 3] = [
    Layout::PerPage,
    Layout::Folio { segments: 1 },
    Layout::Folio { segments: 4 },
];

fn run_model(ops: &[Op], with_file: bool, engines: usize, free_mode: FreeMode, layout: Layout) {
    let corpus = corpus_pages();
    let device = Arc::new(Device::new(DeviceConfig::with_engines(engines)).unwrap());
    let backing: Option<Arc<dyn Backing>> =
        with_file.then(|| Arc::new(MemBacking::new(1 << 14)) as Arc<dyn Backing>);
    // A small pool so the limit, the file and writeback all come into play.
    let cfg = ZswapConfig {
        layout,
        ..config(96 << 10, free_mode)
    };
    let z = Zswap::new(cfg, device, backing).unwrap();
    let mut model: Vec<(SlotRange, Vec<u8>)> = Vec::new();
    for op in ops {
        match *op {
            Op::Store { seed, order } => {
                let data = folio(&corpus, seed, 1 << order);
                match store(&z, &data) {
                    Ok(range) => {
                        assert_eq!(range.pages as usize, 1 << order);
                        model.push((range, data));
                    }
                    Err(e) => {
                        assert!(
                            !with_file || e == StoreError::NoSlots,
                            "store failed with a file: {e:?}"
                        );
                    }
                }
            }
            Op::Load(i) if !model.is_empty() => {
                let (range, data) = model.swap_remove(i % model.len());
                let mut out = vec![0u8; data.len()];
                z.load(range, &mut out).unwrap();
                assert!(out == data, "a loaded folio differs from what was stored");
                assert_eq!(
                    z.load(range, &mut out),
                    Err(LoadError::NotStored(range.first)),
                    "loads are exclusive"
                );
            }
            Op::Invalidate(i) if !model.is_empty() => {
                let (range, _) = model.swap_remove(i % model.len());
                z.invalidate(range);
                assert!(range.slots().all(|s| !z.is_stored(s)));
            }
            Op::Writeback(n) => {
                z.writeback(n);
            }
            Op::Compact => {
                z.compact();
            }
            _ => {}
        }
        let stats = z.stats();
        assert!(
            stats.pool_total_size as usize <= (96 << 10) + 8 * PAGE_SIZE,
            "pool over its limit"
        );
    }
    for (range, data) in model.drain(..) {
        let mut out = vec![0u8; data.len()];
        z.load(range, &mut out).unwrap();
        assert!(out == data);
    }
    z.drain_slot_caches();
    assert_eq!(z.slots_in_use(), 0, "every slot came back");
    let stats = z.stats();
    assert_eq!(stats.stored_pages, 0);
    assert_eq!(z.pool().total_size(), 0);
    assert_eq!(stats.decompress_fail, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn store_matches_the_model_with_a_swap_file(ops in proptest::collection::vec(op(), 1..120), engines in 0usize..3, layout in 0usize..3) {
        run_model(&ops, true, engines, FreeMode::Async, LAYOUTS[layout]);
    }

    #[test]
    fn store_matches_the_model_without_a_swap_file(ops in proptest::collection::vec(op(), 1..120), layout in 0usize..3) {
        run_model(&ops, false, 2, FreeMode::Batched, LAYOUTS[layout]);
    }
}

#[test]
fn concurrent_stores_loads_and_invalidations_with_writeback_and_compaction() {
    for layout in LAYOUTS {
        concurrent_run(layout);
    }
}

fn concurrent_run(layout: Layout) {
    let corpus = corpus_pages();
    let device = Arc::new(Device::new(DeviceConfig::with_engines(2)).unwrap());
    let backing = Arc::new(MemBacking::new(1 << 14));
    let mut cfg = config(512 << 10, FreeMode::Async);
    cfg.writeback_worker = true;
    cfg.layout = layout;
    let z = Zswap::new(cfg, device, Some(backing)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut workers = Vec::new();
        for t in 0..3usize {
            let (z, corpus) = (&z, &corpus);
            workers.push(s.spawn(move || {
                let mut mine: Vec<(SlotRange, Vec<u8>)> = Vec::new();
                for i in 0..400usize {
                    let seed = t * 100_000 + i;
                    if i % 3 == 2 && !mine.is_empty() {
                        let (range, data) = mine.swap_remove(seed % mine.len());
                        let mut out = vec![0u8; data.len()];
                        z.load(range, &mut out).unwrap();
                        assert!(out == data, "thread {t}: a folio changed");
                    } else if i % 7 == 6 && !mine.is_empty() {
                        let (range, _) = mine.swap_remove(seed % mine.len());
                        z.invalidate(range);
                    } else {
                        let folios: Vec<Vec<u8>> = (0..3)
                            .map(|k| folio(corpus, seed * 3 + k, [1, 4, 16][k]))
                            .collect();
                        let refs: Vec<&[u8]> = folios.iter().map(|f| f.as_slice()).collect();
                        for (r, f) in z.store_batch(&refs).into_iter().zip(folios) {
                            mine.push((r.expect("store with a file"), f));
                        }
                    }
                }
                for (range, data) in mine {
                    let mut out = vec![0u8; data.len()];
                    z.load(range, &mut out).unwrap();
                    assert!(out == data);
                }
            }));
        }
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                z.compact();
                z.writeback(16);
                std::thread::yield_now();
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let stats = z.stats();
    assert!(stats.written_back_pages > 0, "{layout}: writeback ran");
    assert!(
        stats.pswpin > 0,
        "{layout}: written-back pages were loaded from the file"
    );
    assert_eq!(stats.decompress_fail, 0);
    assert_eq!(
        stats.folio_objects_stored > 0,
        layout != Layout::PerPage,
        "{layout}: folios stored whole only in a folio layout"
    );
    z.drain_slot_caches();
    assert_eq!(z.slots_in_use(), 0);
}

#[test]
fn swap_file_faults_lose_nothing_and_are_reported() {
    let corpus = corpus_pages();
    for fault in [Fault::NoSpace, Fault::Io, Fault::ShortWrite] {
        let device = Arc::new(Device::synchronous());
        let backing = Arc::new(MemBacking::new(4096));
        // A pool of zero bytes: every page goes to the file.
        let z = Zswap::new(
            config(0, FreeMode::Immediate),
            device,
            Some(backing.clone() as Arc<dyn Backing>),
        )
        .unwrap();
        let data = folio(&corpus, 5, 16);
        backing.fail_next_write(fault);
        assert_eq!(store(&z, &data), Err(StoreError::Io), "{fault:?}");
        assert_eq!(z.slots_in_use(), 0, "the failed folio's slots were freed");
        let stats = z.stats();
        assert_eq!(stats.swap_write_errors, 1);
        assert_eq!(stats.pswpout, 0, "nothing counted as written");
        // The same folio stores once the file works again.
        let range = store(&z, &data).unwrap();
        let mut out = vec![0u8; data.len()];
        backing.fail_next_read(Fault::Io);
        assert_eq!(
            z.load(range, &mut out),
            Err(LoadError::Io(range.first + first_file_page(&data)))
        );
        assert_eq!(z.stats().swap_read_errors, 1);
        z.load(range, &mut out).unwrap();
        assert!(out == data, "a failed read left the entry intact");
    }
}

/// Index of the first page that is not same-filled (the first to touch the file).
fn first_file_page(data: &[u8]) -> u32 {
    data.chunks(PAGE_SIZE)
        .position(|p| uswap::codec::same_filled(p).is_none())
        .unwrap() as u32
}

#[test]
fn writeback_errors_keep_the_entry_in_the_pool() {
    let corpus = corpus_pages();
    let backing = Arc::new(MemBacking::new(4096));
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        Some(backing.clone() as Arc<dyn Backing>),
    )
    .unwrap();
    let data = folio(&corpus, 9, 16);
    let range = store(&z, &data).unwrap();
    backing.fail_next_write(Fault::Io);
    assert_eq!(z.writeback(100), 0);
    assert_eq!(z.stats().swap_write_errors, 1);
    let written = z.writeback(100);
    assert!(written > 0);
    assert_eq!(z.stats().written_back_pages, written as u64);
    let mut out = vec![0u8; data.len()];
    z.load(range, &mut out).unwrap();
    assert!(out == data);
    assert_eq!(z.stats().pswpin, written as u64);
}

#[test]
fn pool_allocation_failure_rejects_the_whole_folio() {
    let corpus = corpus_pages();
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        None,
    )
    .unwrap();
    let data = folio(&corpus, 3, 16);
    z.pool().fail_next_allocs(1);
    assert_eq!(store(&z, &data), Err(StoreError::AllocFail));
    let stats = z.stats();
    assert_eq!(stats.reject_alloc_fail, 1);
    assert_eq!(
        stats.stored_pages, 0,
        "pages stored before the failure were dropped"
    );
    assert_eq!(z.pool().total_size(), 0);
    assert_eq!(z.slots_in_use(), 0);
    assert!(store(&z, &data).is_ok());
}

#[test]
fn incompressible_pages_are_rejected_without_a_file_and_stored_raw_with_one() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let random: Vec<u8> = (0..4 * PAGE_SIZE).map(|_| rng.gen()).collect();
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        None,
    )
    .unwrap();
    assert_eq!(store(&z, &random), Err(StoreError::CompressPoor));
    assert!(z.stats().reject_compress_poor >= 1);
    let backing: Arc<dyn Backing> = Arc::new(MemBacking::new(64));
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        Some(backing),
    )
    .unwrap();
    let range = store(&z, &random).unwrap();
    assert_eq!(z.stats().stored_incompressible_pages, 4);
    let mut out = vec![0u8; random.len()];
    z.load(range, &mut out).unwrap();
    assert!(out == random);
}

/// Without a swap file a large folio with a few pages that do not shrink is
/// stored whole, those pages raw, as long as it saves a page; one that
/// would not is refused. (The kernel refuses each such page, which for a
/// folio stored all or nothing kept whole folios of good pages resident.)
#[test]
fn a_large_folio_with_a_few_incompressible_pages_is_stored_without_a_file() {
    let corpus = corpus_pages();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut noise = |n: usize| -> Vec<u8> { (0..n * PAGE_SIZE).map(|_| rng.gen()).collect() };
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        None,
    )
    .unwrap();
    let mut mostly_good = noise(2);
    mostly_good.extend_from_slice(&corpus[..14 * PAGE_SIZE]);
    let range = store(&z, &mostly_good).expect("a folio that shrinks overall");
    let stats = z.stats();
    assert_eq!(stats.stored_incompressible_pages, 2);
    assert_eq!(stats.reject_compress_poor, 0);
    let mut out = vec![0u8; mostly_good.len()];
    z.load(range, &mut out).unwrap();
    assert!(out == mostly_good);

    let mut mostly_noise = noise(15);
    mostly_noise.extend_from_slice(&corpus[..PAGE_SIZE]);
    let pool = z.pool().total_size();
    assert_eq!(store(&z, &mostly_noise), Err(StoreError::CompressPoor));
    assert_eq!(z.stats().reject_compress_poor, 15);
    assert_eq!(
        z.pool().total_size(),
        pool,
        "the refused folio left nothing"
    );
}

#[test]
fn a_corrupt_object_is_a_decompress_fail_never_data() {
    let corpus = corpus_pages();
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::new(DeviceConfig::with_engines(2)).unwrap()),
        None,
    )
    .unwrap();
    let data = folio(&corpus, 4, 16);
    let range = store(&z, &data).unwrap();
    let victim = range.slots().find(|&s| z.corrupt_stored_object(s)).unwrap();
    let mut out = vec![0u8; data.len()];
    assert_eq!(z.load(range, &mut out), Err(LoadError::Corrupt(victim)));
    assert_eq!(z.stats().decompress_fail, 1);
    assert!(
        z.is_stored(victim),
        "the entry is kept, not silently dropped"
    );
}

#[test]
fn an_edited_object_is_caught_by_its_checksum_or_by_the_decoder() {
    let corpus = corpus_pages();
    let z = Zswap::new(
        config(1 << 20, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        None,
    )
    .unwrap();
    let data = folio(&corpus, 4, 4);
    let range = store(&z, &data).unwrap();
    let mut original = Vec::new();
    let cut = |b: &mut Vec<u8>| {
        b.pop();
    };
    let victim = range
        .slots()
        .find(|&s| {
            z.edit_stored_object(s, false, |b| {
                original = b.clone();
                cut(b);
            })
        })
        .unwrap();
    let mut out = vec![0u8; data.len()];
    // The checksum taken at store time catches the cut.
    assert_eq!(z.load(range, &mut out), Err(LoadError::Corrupt(victim)));
    // With the checksum taken after the cut, the decoder catches it.
    assert!(z.edit_stored_object(victim, true, |_| {}));
    assert_eq!(z.load(range, &mut out), Err(LoadError::Corrupt(victim)));
    assert_eq!(z.stats().decompress_fail, 2);
    // Lengths the store could not have recorded are refused.
    assert!(!z.edit_stored_object(victim, true, |b| b.clear()));
    assert!(!z.edit_stored_object(victim, true, |b| b.resize(PAGE_SIZE + 1, 0)));
    // Put back, the folio loads exactly, and nothing is left behind.
    assert!(z.edit_stored_object(victim, true, |b| *b = original.clone()));
    z.load(range, &mut out).unwrap();
    assert!(out == data);
    assert_eq!(
        (z.slots_in_use(), z.pool().objects(), z.stats().stored_bytes),
        (0, 0, 0)
    );
}

#[test]
fn an_engine_that_stops_answering_does_not_block_the_store() {
    let corpus = corpus_pages();
    let device = Arc::new(
        Device::new(DeviceConfig {
            engines: 2,
            stall_timeout: Duration::from_millis(5),
            ..DeviceConfig::default()
        })
        .unwrap(),
    );
    device.pause_engine(0, true);
    let z = Zswap::new(config(4 << 20, FreeMode::Immediate), device.clone(), None).unwrap();
    let data = folio(&corpus, 11, 64);
    let range = store(&z, &data).unwrap();
    let mut out = vec![0u8; data.len()];
    z.load(range, &mut out).unwrap();
    assert!(out == data);
    assert!(
        device.stats().engines[0].stall_recoveries > 0,
        "the stalled engine's jobs were taken back"
    );
}

#[test]
fn pool_limit_holds_and_hysteresis_works_both_ways() {
    let corpus = corpus_pages();
    let max = 256 << 10;
    let z = Zswap::new(
        config(max, FreeMode::Immediate),
        Arc::new(Device::synchronous()),
        None,
    )
    .unwrap();
    let mut stored = Vec::new();
    let mut refused = 0;
    for seed in 0..200 {
        let data = folio(&corpus, seed * 13 + 3, 4);
        match store(&z, &data) {
            Ok(r) => stored.push((r, data)),
            Err(StoreError::PoolLimit) => refused += 1,
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            z.pool().total_size() <= max + 8 * PAGE_SIZE,
            "pool exceeded its limit by more than a zspage"
        );
    }
    assert!(refused > 0);
    let hits = z.stats().pool_limit_hit;
    assert_eq!(hits, refused);
    // Free a little: still above the 90% accept threshold, still refused.
    let mut out = vec![0u8; 4 * PAGE_SIZE];
    while z.pool().total_size() > max * 95 / 100 {
        let (r, data) = stored.pop().unwrap();
        z.load(r, &mut out).unwrap();
        assert!(out == data);
        z.compact();
    }
    if z.pool().total_size() > max * 90 / 100 {
        assert_eq!(
            store(&z, &folio(&corpus, 7, 4)),
            Err(StoreError::PoolLimit),
            "refused until below the threshold"
        );
    }
    // Drain below the threshold: stores are accepted again.
    while z.pool().total_size() > max * 80 / 100 {
        let (r, _) = stored.pop().unwrap();
        z.load(r, &mut out).unwrap();
        z.compact();
    }
    assert!(
        store(&z, &folio(&corpus, 8, 4)).is_ok(),
        "accepted again below the threshold"
    );
}

fn folio_store(layout: Layout, backing: Option<Arc<dyn Backing>>) -> Zswap {
    let cfg = ZswapConfig {
        layout,
        ..config(64 << 20, FreeMode::Immediate)
    };
    Zswap::new(
        cfg,
        Arc::new(Device::new(DeviceConfig::with_engines(2)).unwrap()),
        backing,
    )
    .unwrap()
}

/// 64 KiB folios of consecutive corpus pages, as a program's memory is.
fn corpus_folios(corpus: &[u8], n: usize) -> Vec<&[u8]> {
    corpus.chunks_exact(16 * PAGE_SIZE).take(n).collect()
}

/// The matches between a folio's pages are found only when it is one
/// object: on the corpus the pool holds fewer bytes that way, in both
/// folio layouts, and every folio comes back exactly.
#[test]
fn a_folio_stored_as_one_object_takes_less_room_than_its_pages() {
    let corpus = corpus_pages();
    let folios = corpus_folios(&corpus, 256);
    let stored_bytes = |layout: Layout| {
        let z = folio_store(layout, None);
        let ranges: Vec<SlotRange> = z
            .store_batch(&folios)
            .into_iter()
            .map(|r| r.expect("corpus folios shrink"))
            .collect();
        let stats = z.stats();
        let pages = 16 * folios.len() as u64;
        assert_eq!(stats.zswpout + stats.swpout_zero, pages, "{layout}");
        assert_eq!(stats.stored_pages, stats.zswpout, "{layout}");
        assert_eq!(stats.zswpout_by_order[4] as usize, folios.len(), "{layout}");
        let whole = stats.folio_objects_stored + stats.folio_object_fallback;
        let expected = if layout == Layout::PerPage {
            0
        } else {
            folios.len() as u64
        };
        assert_eq!(whole, expected, "{layout}: every folio tried whole");
        let mut out = vec![0u8; 16 * PAGE_SIZE];
        for (range, data) in ranges.iter().zip(&folios) {
            z.load(*range, &mut out).unwrap();
            assert!(out == *data, "{layout}: a folio came back different");
        }
        z.drain_slot_caches();
        assert_eq!(
            (z.slots_in_use(), z.pool().total_size()),
            (0, 0),
            "{layout}"
        );
        stats.stored_bytes
    };
    let per_page = stored_bytes(Layout::PerPage);
    for layout in [Layout::Folio { segments: 1 }, Layout::Folio { segments: 4 }] {
        let whole = stored_bytes(layout);
        assert!(
            whole < per_page,
            "{layout}: {whole} bytes stored against {per_page} page by page"
        );
    }
}

/// A folio stored whole is read whole: a range that covers part of it is
/// refused and leaves it intact; invalidated, its chunks and slots all go.
#[test]
fn part_of_a_folio_stored_whole_is_refused() {
    let corpus = corpus_pages();
    let z = folio_store(Layout::Folio { segments: 1 }, None);
    let data = &corpus[..16 * PAGE_SIZE];
    let range = store(&z, data).unwrap();
    assert_eq!(z.stats().folio_objects_stored, 1);
    let mut out = vec![0u8; 8 * PAGE_SIZE];
    let head = SlotRange {
        first: range.first,
        pages: 8,
    };
    let tail = SlotRange {
        first: range.first + 8,
        pages: 8,
    };
    assert_eq!(
        z.read(head, &mut out),
        Err(LoadError::PartOfFolio(range.first))
    );
    assert_eq!(
        z.read(tail, &mut out),
        Err(LoadError::PartOfFolio(range.first + 8))
    );
    let mut whole = vec![0u8; 16 * PAGE_SIZE];
    z.load(range, &mut whole).unwrap();
    assert!(whole == data);
    z.drain_slot_caches();
    assert_eq!((z.slots_in_use(), z.pool().objects()), (0, 0));
}

/// A damaged chunk of a folio's object fails the whole folio's load, is
/// counted, and leaves the entries where they are; no byte comes back.
#[test]
fn a_corrupt_chunk_of_a_folio_object_is_a_decompress_fail() {
    let corpus = corpus_pages();
    for layout in [Layout::Folio { segments: 1 }, Layout::Folio { segments: 4 }] {
        let z = folio_store(layout, None);
        let data = &corpus[16 * PAGE_SIZE..32 * PAGE_SIZE];
        let range = store(&z, data).unwrap();
        let victim = range.slots().last().unwrap();
        assert!(
            !z.corrupt_stored_object(victim),
            "{layout}: the last slot holds no chunk"
        );
        let victim = range.slots().find(|&s| z.corrupt_stored_object(s)).unwrap();
        let mut out = vec![0u8; data.len()];
        assert_eq!(
            z.load(range, &mut out),
            Err(LoadError::Corrupt(victim)),
            "{layout}"
        );
        assert_eq!(z.stats().decompress_fail, 1, "{layout}");
        assert!(
            range.slots().all(|s| z.is_stored(s)),
            "{layout}: entries kept"
        );
    }
}

/// Writeback moves a folio stored whole to the file as its pages, frees
/// every chunk, and the folio then loads from the file.
#[test]
fn a_folio_stored_whole_is_written_back_whole() {
    let corpus = corpus_pages();
    let backing: Arc<dyn Backing> = Arc::new(MemBacking::new(1 << 12));
    let z = folio_store(Layout::Folio { segments: 1 }, Some(backing));
    let folios = corpus_folios(&corpus, 4);
    let ranges: Vec<SlotRange> = z
        .store_batch(&folios)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(z.stats().folio_objects_stored, 4);
    // First pass: every folio has its second chance; second: written.
    let written = z.writeback(1000);
    assert_eq!(written, 64);
    let stats = z.stats();
    assert_eq!((stats.written_back_pages, stats.stored_pages), (64, 0));
    z.compact();
    assert_eq!(z.pool().total_size(), 0, "every chunk was freed");
    let mut out = vec![0u8; 16 * PAGE_SIZE];
    for (range, data) in ranges.iter().zip(&folios) {
        z.load(*range, &mut out).unwrap();
        assert!(out == *data);
    }
    assert_eq!(z.stats().pswpin, 64);
}

/// A folio that would not save a page as one object (mostly noise) is
/// stored page by page: without a swap file, refused as before.
#[test]
fn a_folio_that_does_not_shrink_whole_is_stored_page_by_page() {
    let corpus = corpus_pages();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut data: Vec<u8> = (0..15 * PAGE_SIZE).map(|_| rng.gen()).collect();
    data.extend_from_slice(&corpus[..PAGE_SIZE]);
    let backing: Arc<dyn Backing> = Arc::new(MemBacking::new(1 << 12));
    let z = folio_store(Layout::Folio { segments: 1 }, Some(backing));
    let range = store(&z, &data).unwrap();
    let stats = z.stats();
    assert_eq!(
        (stats.folio_objects_stored, stats.folio_object_fallback),
        (0, 1)
    );
    assert_eq!(stats.stored_incompressible_pages, 15);
    let mut out = vec![0u8; data.len()];
    z.load(range, &mut out).unwrap();
    assert!(out == data);
    let z = folio_store(Layout::Folio { segments: 1 }, None);
    assert_eq!(store(&z, &data), Err(StoreError::CompressPoor));
    assert_eq!(z.pool().total_size(), 0);
}

//! `uswap bench store`: the compressed store on the page corpus. Store and
//! load throughput and latency per folio size and codec, batched (each
//! folio's pages as batches on the engines) against sequential (page by page
//! on the caller, as zswap stored before batching), measured in alternating
//! rounds of one run; the store layouts (a folio's pages as objects of
//! their own, or the folio as one object) side by side: room taken, store
//! and load latency; pool efficiency; and the slot free modes under a
//! load-and-release loop.

use super::{progress, quantile, write_json, Latency, Table};
use crate::args;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use uswap::accel::{Device, DeviceConfig};
use uswap::corpus::{self, Workload, PAGE_SIZE};
use uswap::size::format_size;
use uswap::swap::{FreeMode, SwapFile};
use uswap::zswap::{Layout, PoolLimit, SlotRange, Zswap, ZswapConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Corpus directory (default: the project's corpus/).
    #[arg(long, value_parser = args::existing_dir)]
    corpus: Option<PathBuf>,
    /// Codecs, comma-separated.
    #[arg(long, default_value = "lz4,zstd", value_parser = args::codec_name, value_delimiter = ',')]
    codecs: Vec<String>,
    /// Folio sizes.
    #[arg(long, default_value = "4k,64k,2m", value_parser = args::folio_size, value_delimiter = ',')]
    folios: Vec<usize>,
    #[command(flatten)]
    device: args::DeviceArgs,
    /// Rounds per configuration (alternating sequential and batched).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Loads timed per slot free mode.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..))]
    free_ops: u64,
    /// Threads in the slot free loop.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: u32,
    /// Directory for the swap file that holds pages which do not shrink
    /// (default: the system's temporary directory).
    #[arg(long, value_parser = args::existing_dir)]
    swap_dir: Option<PathBuf>,
    /// Store layouts compared on the folio sizes above 4k: page, folio,
    /// byn:N.
    #[arg(long, default_value = "page,folio,byn:4", value_parser = args::layout, value_delimiter = ',')]
    layouts: Vec<Layout>,
    /// Write every figure as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Swap file size for the store benchmarks: room for the corpus several
/// times over; pages that do not shrink are stored raw, as with writeback.
const SWAP_FILE_BYTES: u64 = 256 << 20;

#[derive(Serialize, Clone)]
struct StoreRow {
    folio: String,
    codec: String,
    engines: usize,
    mode: &'static str,
    folios: usize,
    store_pages_per_s: f64,
    load_pages_per_s: f64,
    store_p50_us: f64,
    store_p99_us: f64,
    load_p50_us: f64,
    load_p99_us: f64,
    store_vs_sequential: f64,
    load_vs_sequential: f64,
}

#[derive(Serialize, Clone)]
struct LayoutRow {
    folio: String,
    codec: String,
    layout: String,
    folios: usize,
    /// Bytes of the folios stored.
    original_bytes: u64,
    /// Bytes of the objects in the pool, and of the pool's pages.
    stored_bytes: u64,
    pool_bytes: u64,
    /// original_bytes / pool_bytes: what the memory holds per byte it spends.
    ratio: f64,
    /// ratio against the first layout's.
    ratio_vs_first: f64,
    /// Folios stored as one object, and those that fell back to pages.
    whole: u64,
    fallback: u64,
    store_p50_us: f64,
    store_p99_us: f64,
    load_p50_us: f64,
    load_p99_us: f64,
    store_pages_per_s: f64,
    load_pages_per_s: f64,
}

#[derive(Serialize)]
struct PoolRow {
    codec: String,
    objects: usize,
    stored_bytes: u64,
    pool_bytes: u64,
    efficiency: f64,
    metadata_bytes_per_object: f64,
    after_churn_efficiency: f64,
    compaction_pages_freed: usize,
}

#[derive(Serialize)]
struct FreeModeRow {
    mode: &'static str,
    threads: usize,
    operations: usize,
    #[serde(flatten)]
    latency: Latency,
}

#[derive(Serialize)]
struct Report {
    corpus: String,
    store: Vec<StoreRow>,
    layouts: Vec<LayoutRow>,
    pool: PoolRow,
    free_modes: Vec<FreeModeRow>,
}

/// The folios of one size: whole folios from the index, and for sizes the
/// samples are too small to hold (2 MiB), runs of consecutive pages.
fn folios_of(workloads: &[Workload], size: usize) -> Vec<&[u8]> {
    let whole: Vec<&[u8]> = workloads.iter().flat_map(|w| w.folios(size)).collect();
    if !whole.is_empty() {
        return whole;
    }
    workloads
        .iter()
        .flat_map(|w| w.pages.chunks_exact(size))
        .collect()
}

/// A store with an unbounded pool and a swap file (so that a page that does
/// not shrink is kept raw, as the kernel does when writeback is possible).
fn new_store(
    codec: &str,
    device: Arc<Device>,
    batching: bool,
    free_mode: FreeMode,
    swap_dir: &Path,
) -> Result<Zswap, String> {
    new_store_in(
        codec,
        device,
        batching,
        free_mode,
        swap_dir,
        Layout::PerPage,
    )
}

fn new_store_in(
    codec: &str,
    device: Arc<Device>,
    batching: bool,
    free_mode: FreeMode,
    swap_dir: &Path,
    layout: Layout,
) -> Result<Zswap, String> {
    let file = SwapFile::create(swap_dir, SWAP_FILE_BYTES).map_err(|e| e.to_string())?;
    let config = ZswapConfig {
        compressor: codec.to_string(),
        max_pool: PoolLimit::Bytes(1 << 40),
        free_mode,
        batching,
        writeback_worker: false,
        layout,
        ..ZswapConfig::default()
    };
    Zswap::new(config, device, Some(Arc::new(file))).map_err(|e| e.to_string())
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

struct Samples {
    store_ns: Vec<u64>,
    load_ns: Vec<u64>,
    store_total: f64,
    load_total: f64,
    pages: usize,
}

/// One round: stores every folio (several per call when they are small, so
/// that a call holds at least one batch), then loads and checks them.
fn round(z: &Zswap, folios: &[&[u8]], per_call: usize, s: &mut Samples) -> Result<(), String> {
    let mut ranges: Vec<SlotRange> = Vec::with_capacity(folios.len());
    let t = Instant::now();
    for chunk in folios.chunks(per_call) {
        let t0 = Instant::now();
        let results = z.store_batch(chunk);
        let ns = t0.elapsed().as_nanos() as u64 / chunk.len() as u64;
        for r in results {
            ranges.push(r.map_err(|e| format!("store failed: {e}"))?);
            s.store_ns.push(ns);
        }
    }
    s.store_total += t.elapsed().as_secs_f64();
    let mut buf = vec![0u8; folios[0].len()];
    let t = Instant::now();
    for (range, folio) in ranges.iter().zip(folios) {
        let t0 = Instant::now();
        z.load(*range, &mut buf)
            .map_err(|e| format!("load failed: {e}"))?;
        s.load_ns.push(t0.elapsed().as_nanos() as u64);
        if buf != **folio {
            return Err("a loaded folio differs from the stored one".into());
        }
    }
    s.load_total += t.elapsed().as_secs_f64();
    s.pages += folios.iter().map(|f| f.len() / PAGE_SIZE).sum::<usize>();
    Ok(())
}

fn measure_store(
    codec: &str,
    config: &DeviceConfig,
    folios: &[&[u8]],
    rounds: u32,
    swap_dir: &Path,
) -> Result<[StoreRow; 2], String> {
    let engines = config.engines;
    let device = Arc::new(Device::new(config.clone()).map_err(|e| e.to_string())?);
    let seq = new_store(codec, device.clone(), false, FreeMode::Immediate, swap_dir)?;
    let bat = new_store(codec, device.clone(), true, FreeMode::Immediate, swap_dir)?;
    let pages_per_folio = folios[0].len() / PAGE_SIZE;
    let per_call = (device.batch_size() / pages_per_folio).max(1);
    let new = || Samples {
        store_ns: Vec::new(),
        load_ns: Vec::new(),
        store_total: 0.0,
        load_total: 0.0,
        pages: 0,
    };
    let (mut s_seq, mut s_bat) = (new(), new());
    for r in 0..rounds {
        if r % 2 == 0 {
            round(&seq, folios, per_call, &mut s_seq)?;
            round(&bat, folios, per_call, &mut s_bat)?;
        } else {
            round(&bat, folios, per_call, &mut s_bat)?;
            round(&seq, folios, per_call, &mut s_seq)?;
        }
    }
    let row = |mode, s: &mut Samples| {
        s.store_ns.sort_unstable();
        s.load_ns.sort_unstable();
        StoreRow {
            folio: format_size(folios[0].len() as u64),
            codec: codec.to_string(),
            engines: if mode == "sequential" { 0 } else { engines },
            mode,
            folios: folios.len(),
            store_pages_per_s: s.pages as f64 / s.store_total,
            load_pages_per_s: s.pages as f64 / s.load_total,
            store_p50_us: us(quantile(&s.store_ns, 0.5)),
            store_p99_us: us(quantile(&s.store_ns, 0.99)),
            load_p50_us: us(quantile(&s.load_ns, 0.5)),
            load_p99_us: us(quantile(&s.load_ns, 0.99)),
            store_vs_sequential: 1.0,
            load_vs_sequential: 1.0,
        }
    };
    let seq_row = row("sequential", &mut s_seq);
    let mut bat_row = row("batched", &mut s_bat);
    bat_row.store_vs_sequential = bat_row.store_pages_per_s / seq_row.store_pages_per_s;
    bat_row.load_vs_sequential = bat_row.load_pages_per_s / seq_row.load_pages_per_s;
    Ok([seq_row, bat_row])
}

/// Each layout on the same folios, batched on the same device: the room
/// taken (one untimed pass that stores everything, then loads and checks
/// it), then store and load latency in rounds that rotate the layouts'
/// order.
fn measure_layouts(
    codec: &str,
    config: &DeviceConfig,
    folios: &[&[u8]],
    layouts: &[Layout],
    rounds: u32,
    swap_dir: &Path,
) -> Result<Vec<LayoutRow>, String> {
    let device = Arc::new(Device::new(config.clone()).map_err(|e| e.to_string())?);
    let stores: Vec<Zswap> = layouts
        .iter()
        .map(|&l| {
            new_store_in(
                codec,
                device.clone(),
                true,
                FreeMode::Immediate,
                swap_dir,
                l,
            )
        })
        .collect::<Result<_, _>>()?;
    let per_call = (device.batch_size() / (folios[0].len() / PAGE_SIZE)).max(1);
    let original_bytes: u64 = folios.iter().map(|f| f.len() as u64).sum();
    let mut rows = Vec::new();
    for (&layout, z) in layouts.iter().zip(&stores) {
        let ranges: Vec<SlotRange> = z
            .store_batch(folios)
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("store failed: {e}"))?;
        let st = z.stats();
        let mut buf = vec![0u8; folios[0].len()];
        for (range, folio) in ranges.iter().zip(folios) {
            z.load(*range, &mut buf)
                .map_err(|e| format!("load failed: {e}"))?;
            if buf != **folio {
                return Err(format!(
                    "{layout}: a loaded folio differs from the stored one"
                ));
            }
        }
        rows.push(LayoutRow {
            folio: format_size(folios[0].len() as u64),
            codec: codec.to_string(),
            layout: layout.to_string(),
            folios: folios.len(),
            original_bytes,
            stored_bytes: st.stored_bytes,
            pool_bytes: st.pool_total_size,
            ratio: original_bytes as f64 / st.pool_total_size.max(1) as f64,
            ratio_vs_first: 1.0,
            whole: st.folio_objects_stored,
            fallback: st.folio_object_fallback,
            store_p50_us: 0.0,
            store_p99_us: 0.0,
            load_p50_us: 0.0,
            load_p99_us: 0.0,
            store_pages_per_s: 0.0,
            load_pages_per_s: 0.0,
        });
    }
    let mut samples: Vec<Samples> = layouts
        .iter()
        .map(|_| Samples {
            store_ns: Vec::new(),
            load_ns: Vec::new(),
            store_total: 0.0,
            load_total: 0.0,
            pages: 0,
        })
        .collect();
    for r in 0..rounds as usize {
        for k in 0..layouts.len() {
            let i = (k + r) % layouts.len();
            round(&stores[i], folios, per_call, &mut samples[i])?;
        }
    }
    let first_ratio = rows[0].ratio;
    for (row, s) in rows.iter_mut().zip(&mut samples) {
        s.store_ns.sort_unstable();
        s.load_ns.sort_unstable();
        row.ratio_vs_first = row.ratio / first_ratio;
        row.store_p50_us = us(quantile(&s.store_ns, 0.5));
        row.store_p99_us = us(quantile(&s.store_ns, 0.99));
        row.load_p50_us = us(quantile(&s.load_ns, 0.5));
        row.load_p99_us = us(quantile(&s.load_ns, 0.99));
        row.store_pages_per_s = s.pages as f64 / s.store_total;
        row.load_pages_per_s = s.pages as f64 / s.load_total;
    }
    Ok(rows)
}

fn measure_pool(codec: &str, pages: &[&[u8]], swap_dir: &Path) -> Result<PoolRow, String> {
    let z = new_store(
        codec,
        Arc::new(Device::synchronous()),
        false,
        FreeMode::Immediate,
        swap_dir,
    )?;
    let ranges: Vec<SlotRange> = z
        .store_batch(pages)
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("store failed: {e}"))?;
    let s = z.stats();
    let pool = z.pool();
    let efficiency = s.stored_bytes as f64 / s.pool_total_size as f64;
    let metadata = pool.metadata_bytes() as f64 / pool.objects() as f64;
    let objects = pool.objects();
    // Churn: invalidate a pseudo-random half, then compact.
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for r in &ranges {
        if rng.gen_bool(0.5) {
            z.invalidate(*r);
        }
    }
    let freed = z.compact();
    let after = z.stats();
    Ok(PoolRow {
        codec: codec.to_string(),
        objects,
        stored_bytes: s.stored_bytes,
        pool_bytes: s.pool_total_size,
        efficiency,
        metadata_bytes_per_object: metadata,
        after_churn_efficiency: after.stored_bytes as f64 / after.pool_total_size as f64,
        compaction_pages_freed: freed,
    })
}

/// Loads of random single pages by several threads, each page stored again
/// (untimed) after its load; the released slots go through `mode`.
fn measure_free_mode(
    mode: FreeMode,
    pages: &[&[u8]],
    ops: u64,
    threads: usize,
    swap_dir: &Path,
) -> Result<Vec<u64>, String> {
    let z = new_store(
        "lz4",
        Arc::new(Device::synchronous()),
        false,
        mode,
        swap_dir,
    )?;
    let per_thread = pages.len() / threads;
    let results: Vec<Result<Vec<u64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let z = &z;
                let mine = &pages[t * per_thread..(t + 1) * per_thread];
                s.spawn(move || {
                    let mut ranges: Vec<SlotRange> = Vec::with_capacity(mine.len());
                    for r in z.store_batch(mine) {
                        ranges.push(r.map_err(|e| format!("store failed: {e}"))?);
                    }
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                    let mut buf = vec![0u8; PAGE_SIZE];
                    let mut lat = Vec::with_capacity((ops / threads as u64) as usize);
                    for _ in 0..ops / threads as u64 {
                        let i = rng.gen_range(0..mine.len());
                        let t0 = Instant::now();
                        z.load(ranges[i], &mut buf)
                            .map_err(|e| format!("load failed: {e}"))?;
                        lat.push(t0.elapsed().as_nanos() as u64);
                        if buf != mine[i] {
                            return Err("a loaded page differs".to_string());
                        }
                        ranges[i] = z
                            .store_batch(&[mine[i]])
                            .remove(0)
                            .map_err(|e| format!("store failed: {e}"))?;
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}

pub fn run(args: &Args) -> Result<(), String> {
    let dir = args.corpus.clone().unwrap_or_else(corpus::default_dir);
    let workloads = corpus::load_dir(&dir).map_err(|e| format!("loading the corpus: {e}"))?;
    let device_config = args.device.config();
    let swap_dir = args.swap_dir.clone().unwrap_or_else(std::env::temp_dir);
    let large = args.folios.iter().filter(|&&f| f > PAGE_SIZE).count();
    let steps = args.codecs.len() * (args.folios.len() + large) + 1 + 3;
    let bar = progress(steps as u64, "store");

    let mut rows = Vec::new();
    for codec in &args.codecs {
        for &size in &args.folios {
            bar.set_message(format!("{codec} {}", format_size(size as u64)));
            let folios = folios_of(&workloads, size);
            rows.extend(measure_store(
                codec,
                &device_config,
                &folios,
                args.rounds,
                &swap_dir,
            )?);
            bar.inc(1);
        }
    }
    let mut layout_rows = Vec::new();
    for codec in &args.codecs {
        for &size in args.folios.iter().filter(|&&f| f > PAGE_SIZE) {
            bar.set_message(format!("layouts {codec} {}", format_size(size as u64)));
            let folios = folios_of(&workloads, size);
            layout_rows.extend(measure_layouts(
                codec,
                &device_config,
                &folios,
                &args.layouts,
                args.rounds,
                &swap_dir,
            )?);
            bar.inc(1);
        }
    }
    bar.set_message("pool");
    let pages = folios_of(&workloads, PAGE_SIZE);
    let pool = measure_pool(&args.codecs[0], &pages, &swap_dir)?;
    bar.inc(1);

    let modes = [FreeMode::Immediate, FreeMode::Batched, FreeMode::Async];
    let mut samples: Vec<Vec<u64>> = vec![Vec::new(); modes.len()];
    for r in 0..args.rounds {
        for k in 0..modes.len() {
            // Rotate the order so that no mode always runs first.
            let m = (k + r as usize) % modes.len();
            bar.set_message(format!("free {}", modes[m].name()));
            samples[m].extend(measure_free_mode(
                modes[m],
                &pages,
                args.free_ops / args.rounds as u64,
                args.threads as usize,
                &swap_dir,
            )?);
        }
    }
    let free_rows: Vec<FreeModeRow> = modes
        .iter()
        .zip(samples.iter_mut())
        .map(|(mode, s)| FreeModeRow {
            mode: mode.name(),
            threads: args.threads as usize,
            operations: s.len(),
            latency: Latency::of(s),
        })
        .collect();
    bar.finish_and_clear();

    let mut t = Table::new(&[
        "folio",
        "codec",
        "mode",
        "engines",
        "store pages/s",
        "vs seq",
        "store p50 us",
        "store p99 us",
        "load pages/s",
        "vs seq",
        "load p50 us",
        "load p99 us",
    ]);
    for r in &rows {
        t.row(vec![
            r.folio.clone(),
            r.codec.clone(),
            r.mode.to_string(),
            r.engines.to_string(),
            format!("{:.0}", r.store_pages_per_s),
            format!("{:.2}", r.store_vs_sequential),
            format!("{:.1}", r.store_p50_us),
            format!("{:.1}", r.store_p99_us),
            format!("{:.0}", r.load_pages_per_s),
            format!("{:.2}", r.load_vs_sequential),
            format!("{:.1}", r.load_p50_us),
            format!("{:.1}", r.load_p99_us),
        ]);
    }
    t.print(&format!("Store and load on {} (latency per folio; 2M folios are runs of 512 consecutive sampled pages)", dir.display()));

    let mut t = Table::new(&[
        "folio",
        "codec",
        "layout",
        "ratio",
        "vs first",
        "whole",
        "fallback",
        "store p50 us",
        "store p99 us",
        "load p50 us",
        "load p99 us",
        "store pages/s",
        "load pages/s",
    ]);
    for r in &layout_rows {
        t.row(vec![
            r.folio.clone(),
            r.codec.clone(),
            r.layout.clone(),
            format!("{:.3}", r.ratio),
            format!("{:.3}", r.ratio_vs_first),
            r.whole.to_string(),
            r.fallback.to_string(),
            format!("{:.1}", r.store_p50_us),
            format!("{:.1}", r.store_p99_us),
            format!("{:.1}", r.load_p50_us),
            format!("{:.1}", r.load_p99_us),
            format!("{:.0}", r.store_pages_per_s),
            format!("{:.0}", r.load_pages_per_s),
        ]);
    }
    t.print(&format!(
        "Layouts, batched on {} engines (ratio: folio bytes per pool byte; latency per folio)",
        device_config.engines
    ));

    let mut t = Table::new(&[
        "codec",
        "objects",
        "stored bytes",
        "pool bytes",
        "efficiency",
        "metadata B/object",
        "after churn",
        "pages compacted",
    ]);
    t.row(vec![
        pool.codec.clone(),
        pool.objects.to_string(),
        pool.stored_bytes.to_string(),
        pool.pool_bytes.to_string(),
        format!("{:.3}", pool.efficiency),
        format!("{:.1}", pool.metadata_bytes_per_object),
        format!("{:.3}", pool.after_churn_efficiency),
        pool.compaction_pages_freed.to_string(),
    ]);
    t.print(
        "Pool: every corpus page stored (then half invalidated at random and the pool compacted)",
    );

    let mut t = Table::new(&[&["free mode", "threads", "ops"][..], &Latency::HEADER[..]].concat());
    for r in &free_rows {
        let mut cells = vec![
            r.mode.to_string(),
            r.threads.to_string(),
            r.operations.to_string(),
        ];
        cells.extend(r.latency.cells());
        t.row(cells);
    }
    t.print("Slot free modes: 4K page loads (each releasing its slot) in random order");

    if let Some(path) = &args.json {
        write_json(
            path,
            &Report {
                corpus: dir.display().to_string(),
                store: rows,
                layouts: layout_rows,
                pool,
                free_modes: free_rows,
            },
        )?;
    }
    Ok(())
}

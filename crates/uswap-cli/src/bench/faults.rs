//! `uswap bench faults`: swap-in latency. Memory is filled well above the
//! limit with corpus pages, then threads touch swapped folios in random
//! order; each touch is one fault served from the store. Two modes:
//! `pressure` keeps the limit, so every fault also needs an eviction;
//! `no-pressure` (the kernel's usual swap-in test) first pushes everything
//! out, then lifts the limit, so faults only load. Per mode, folio size and
//! slot free mode: p50/p99/p99.9 per fault and p50 per page, the share of
//! faults per latency bucket, and pages brought in per second.
//! In the same run, the floors: a bare userfaultfd round trip that installs
//! a 4 KiB / 64 KiB unit with no store behind it (its handler spinning for
//! the next fault, and asleep in poll), UFFDIO_COPY alone, and the raw
//! codec's decompression of the same pages.

use super::floor;
use super::{progress, quantile, write_json, Latency, Table};
use crate::args::{self, CleanCopies, Discard};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use uswap::codec::lz4::{lz4_decompress, Lz4State};
use uswap::corpus::{self, PAGE_SIZE};
use uswap::mm::{Runtime, RuntimeConfig};
use uswap::size::format_size;
use uswap::swap::FreeMode;
use uswap::zswap::Layout;

#[derive(clap::Args)]
pub struct Args {
    /// Corpus directory (default: the project's corpus/).
    #[arg(long, value_parser = args::existing_dir)]
    corpus: Option<PathBuf>,
    /// Folio sizes.
    #[arg(long, default_value = "4k,64k", value_parser = args::folio_size, value_delimiter = ',')]
    folios: Vec<usize>,
    /// Memory limit.
    #[arg(long, default_value = "32M", value_parser = args::size)]
    memory_high: u64,
    /// Managed memory filled, several times the limit.
    #[arg(long, default_value = "256M", value_parser = args::size)]
    size: u64,
    /// Touching threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: u32,
    /// Faults timed per configuration.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..))]
    faults: u64,
    /// Compression engines (0..64), or auto (as `uswap usemem` and `uswap
    /// run` choose them for one runtime).
    #[arg(long, default_value = "auto", value_parser = args::engines)]
    engines: args::Engines,
    /// Modes: pressure (every fault also needs an eviction), no-pressure
    /// (everything pushed out first, then the limit lifted).
    #[arg(long, default_value = "pressure,no-pressure", value_delimiter = ',')]
    mode: Vec<Mode>,
    /// How long the event thread looks for the next event before it
    /// sleeps (yielding between looks while memory is near the limit), in
    /// microseconds (the runtime's default is 50); several values are
    /// measured side by side.
    #[arg(long, default_value = "50", value_delimiter = ',')]
    event_spin_us: Vec<u64>,
    /// Swap-ins of folios of at least this many pages are handed by the
    /// event thread to a filler (0: never; the runtime's default is 2);
    /// several values are measured side by side.
    #[arg(long, default_value = "2", value_delimiter = ',')]
    handoff_pages: Vec<usize>,
    /// How stored pages leave memory: `move` (moved out, no event, where
    /// the kernel can) or `in-place` (MADV_DONTNEED); both measured side by
    /// side when both are given.
    #[arg(long, default_value = "move", value_delimiter = ',')]
    discard: Vec<Discard>,
    /// How freed swap slots are returned; several are measured side by side.
    #[arg(long, default_value = "immediate,batched,async", value_delimiter = ',')]
    slot_free: Vec<FreeMode>,
    /// How the store keeps a folio's pages (page, folio, byn:N); several
    /// are measured side by side.
    #[arg(long, default_value = "folio", value_parser = args::layout, value_delimiter = ',')]
    layout: Vec<Layout>,
    /// What a folio read back does with its stored copy (keep, drop);
    /// both measured side by side when both are given.
    #[arg(long, default_value = "keep", value_delimiter = ',')]
    clean_copies: Vec<CleanCopies>,
    /// What each touch does: read a byte, write one, or update one (read,
    /// then write it back changed: the second access of a folio brought
    /// back clean is a write-protect fault).
    #[arg(long, default_value = "read")]
    access: Access,
    /// Write every figure as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the latency distributions as SVG charts in this directory
    /// (one per mode: the share of faults slower than each latency).
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One configuration measured.
#[derive(Clone, Copy)]
struct Setup {
    pressure: Mode,
    folio: usize,
    free: FreeMode,
    discard: Discard,
    layout: Layout,
    clean: CleanCopies,
    spin_us: u64,
    handoff_pages: usize,
}

/// What a touch does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    Read,
    Write,
    Update,
}

/// Whether faults also need evictions.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Pressure,
    NoPressure,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Pressure => "pressure",
            Mode::NoPressure => "no-pressure",
        }
    }
}

#[derive(Serialize)]
struct Row {
    mode: Mode,
    event_spin_us: u64,
    handoff_pages: usize,
    folio: String,
    free_mode: &'static str,
    discard: Discard,
    layout: String,
    clean_copies: CleanCopies,
    access: Access,
    /// As given, and what auto chose for this configuration.
    engines: String,
    faults: usize,
    #[serde(flatten)]
    latency: Latency,
    p50_per_page_us: f64,
    p50_vs_floor: f64,
    /// The runtime's own median time to serve a fault, from reading its
    /// event to waking the thread (its histogram's power-of-two bucket
    /// bound): the rest of `p50_us` is the kernel's round trip.
    served_p50_us: f64,
    /// Pages brought in per second, all threads together.
    pages_per_sec: f64,
}

/// The floors' p50s. A round trip is measured with a handler that spins
/// for the next fault (the floor of a runtime whose event thread spins,
/// `--event-spin-us` above 0) and with one asleep in poll (the floor with
/// no spin).
#[derive(Serialize)]
struct Floors {
    roundtrip_4k_us: f64,
    roundtrip_64k_us: f64,
    roundtrip_4k_sleeping_us: f64,
    roundtrip_64k_sleeping_us: f64,
    uffdio_copy_4k_us: f64,
    decompress_4k_us: f64,
}

impl Floors {
    /// The round trip of a `unit`-byte install with a handler that spins
    /// or not.
    fn roundtrip_us(&self, unit: usize, spinning: bool) -> f64 {
        match (unit == PAGE_SIZE, spinning) {
            (true, true) => self.roundtrip_4k_us,
            (true, false) => self.roundtrip_4k_sleeping_us,
            (false, true) => self.roundtrip_64k_us * unit as f64 / (64 << 10) as f64,
            (false, false) => self.roundtrip_64k_sleeping_us * unit as f64 / (64 << 10) as f64,
        }
    }
}

#[derive(Serialize)]
struct Report {
    memory_high: u64,
    size: u64,
    threads: u32,
    rows: Vec<Row>,
    floors: Floors,
}

fn p50_us(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    quantile(&v, 0.5) as f64 / 1000.0
}

fn measure_floors(pages: &[u8]) -> Result<Floors, String> {
    let e = |e: std::io::Error| format!("userfaultfd floor: {e}");
    let mut state = Lz4State::new();
    let mut compressed: Vec<Vec<u8>> = Vec::new();
    for page in pages.chunks_exact(PAGE_SIZE) {
        let mut buf = vec![0u8; PAGE_SIZE];
        if let Some(n) = state.compress(page, &mut buf, PAGE_SIZE - 1) {
            buf.truncate(n);
            compressed.push(buf);
        }
    }
    let mut out = vec![0u8; PAGE_SIZE];
    let mut dec = Vec::with_capacity(compressed.len());
    for c in &compressed {
        let t = Instant::now();
        lz4_decompress(c, &mut out).map_err(|e| e.to_string())?;
        dec.push(t.elapsed().as_nanos() as u64);
    }
    let probe = floor::Probe::new().map_err(e)?;
    let roundtrip = |unit, count, waits| -> Result<f64, String> {
        Ok(p50_us(
            floor::roundtrip_ns(&probe, unit, count, waits).map_err(e)?,
        ))
    };
    use floor::HandlerWaits::{Sleeping, Spinning};
    Ok(Floors {
        roundtrip_4k_us: roundtrip(PAGE_SIZE, 4000, Spinning)?,
        roundtrip_64k_us: roundtrip(64 << 10, 1000, Spinning)?,
        roundtrip_4k_sleeping_us: roundtrip(PAGE_SIZE, 4000, Sleeping)?,
        roundtrip_64k_sleeping_us: roundtrip(64 << 10, 1000, Sleeping)?,
        uffdio_copy_4k_us: p50_us(floor::uffdio_copy_ns(&probe, PAGE_SIZE, 4000).map_err(e)?),
        decompress_4k_us: p50_us(dec),
    })
}

/// Fills managed memory with corpus pages, then times faults on swapped
/// folios touched in random order. Returns each fault's latency and the
/// wall time of the touching.
/// Also returns the engines the runtime had.
/// What one configuration's run gave.
struct Measured {
    /// Each fault's latency as the touching thread saw it, ns.
    latencies: Vec<u64>,
    wall: Duration,
    engines: usize,
    /// The runtime's median time to serve a fault (bucket bound).
    served: Duration,
}

fn measure(args: &Args, setup: Setup, pages: &[u8]) -> Result<Measured, String> {
    let Setup {
        pressure, folio, ..
    } = setup;
    let engines = args
        .engines
        .choose(1, args::cpus(), "lz4", 8 * folio / PAGE_SIZE);
    let rt = Runtime::new(RuntimeConfig {
        memory_high: args.memory_high as usize,
        folio_size: folio,
        engines,
        slot_free: setup.free,
        event_spin: Duration::from_micros(setup.spin_us),
        handoff_pages: setup.handoff_pages,
        discard_by_move: setup.discard == Discard::Move,
        layout: setup.layout,
        keep_clean_copies: setup.clean == CleanCopies::Keep,
        ..RuntimeConfig::default()
    })
    .map_err(|e| format!("starting the runtime: {e}"))?;
    let mut region = rt
        .map(args.size as usize)
        .map_err(|e| format!("mapping: {e}"))?;
    let n = pages.len() / PAGE_SIZE;
    for (i, page) in region
        .as_mut_slice()
        .chunks_exact_mut(PAGE_SIZE)
        .enumerate()
    {
        let p = (i * 7) % n;
        page.copy_from_slice(&pages[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]);
    }
    if pressure == Mode::NoPressure {
        // Everything out, then room for everything: faults only load.
        rt.set_memory_high(folio);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while rt.stats().resident_bytes as usize > rt.memory_high() && Instant::now() < deadline {
        rt.reclaim_now();
        std::thread::sleep(Duration::from_millis(2));
    }
    if pressure == Mode::NoPressure {
        rt.set_memory_high(2 * args.size as usize);
    }
    // Evictions already under way finish first.
    let mut evicted_before = rt.stats().evicted_folios;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = rt.stats().evicted_folios;
        if now == evicted_before {
            break;
        }
        evicted_before = now;
    }
    let base = region.as_ptr() as usize;
    let folios = region.len() / folio;
    let per_thread = (args.faults / args.threads as u64) as usize;
    // Without pressure every folio comes in once and stays: the threads
    // share one random order of all folios (thread t takes every t-th).
    let mut order: Vec<usize> = (0..folios).collect();
    rand::seq::SliceRandom::shuffle(&mut order[..], &mut rand::rngs::StdRng::seed_from_u64(7));
    let order = &order;
    let threads = args.threads as usize;
    let access = args.access;
    let rt = &rt;
    let started = Instant::now();
    let samples: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 1);
                    let mut lat = Vec::with_capacity(per_thread);
                    let stop = Instant::now() + Duration::from_secs(60);
                    let mut mine = order.iter().skip(t as usize).step_by(threads);
                    while lat.len() < per_thread && Instant::now() < stop {
                        let f = match pressure {
                            Mode::Pressure => rng.gen_range(0..folios),
                            Mode::NoPressure => match mine.next() {
                                Some(&f) => f,
                                None => break,
                            },
                        };
                        let addr =
                            base + f * folio + rng.gen_range(0..folio / PAGE_SIZE) * PAGE_SIZE;
                        if !rt.is_swapped(addr as *const u8) {
                            continue;
                        }
                        let t0 = Instant::now();
                        let p = addr as *mut u8;
                        // SAFETY: an address inside the region, which lives
                        // until the threads are joined.
                        unsafe {
                            match access {
                                Access::Read => {
                                    std::ptr::read_volatile(p);
                                }
                                Access::Write => std::ptr::write_volatile(p, 0x5a),
                                Access::Update => {
                                    std::ptr::write_volatile(p, std::ptr::read_volatile(p) ^ 1)
                                }
                            }
                        }
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                    lat
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("toucher"))
            .collect()
    });
    let wall = started.elapsed();
    let served = rt.fault_latency().percentile(0.5);
    let stats = rt.stats();
    if stats.sigbus > 0 || stats.store.decompress_fail > 0 {
        return Err("faults failed during the benchmark".into());
    }
    if pressure == Mode::NoPressure && stats.evicted_folios != evicted_before {
        return Err("no-pressure mode evicted while touching".into());
    }
    drop(region);
    Ok(Measured {
        latencies: samples.into_iter().flatten().collect(),
        wall,
        engines,
        served,
    })
}

pub fn run(args: &Args) -> Result<(), String> {
    let dir = args.corpus.clone().unwrap_or_else(corpus::default_dir);
    let workloads = corpus::load_dir(&dir).map_err(|e| format!("loading the corpus: {e}"))?;
    let pages: Vec<u8> = workloads
        .iter()
        .flat_map(|w| w.pages.iter().copied())
        .collect();
    if args.size < 2 * args.memory_high {
        return Err(
            "--size must be at least twice --memory-high, so that most of it is swapped".into(),
        );
    }
    let mut setups = Vec::new();
    for &pressure in &args.mode {
        for &folio in &args.folios {
            for &free in &args.slot_free {
                for &discard in &args.discard {
                    for &layout in &args.layout {
                        for &clean in &args.clean_copies {
                            for &spin_us in &args.event_spin_us {
                                for &handoff_pages in &args.handoff_pages {
                                    setups.push(Setup {
                                        pressure,
                                        folio,
                                        free,
                                        discard,
                                        layout,
                                        clean,
                                        spin_us,
                                        handoff_pages,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let bar = progress(setups.len() as u64 + 1, "faults");
    bar.set_message("floors");
    let floors = measure_floors(&pages)?;
    bar.inc(1);
    let mut rows = Vec::new();
    let mut samples: Vec<(Mode, String, Vec<u64>)> = Vec::new();
    for setup in setups {
        bar.set_message(format!(
            "{} {} {} {} {} spin {}us handoff {}",
            setup.pressure.name(),
            format_size(setup.folio as u64),
            setup.free.name(),
            setup.discard.name(),
            setup.layout,
            setup.spin_us,
            setup.handoff_pages
        ));
        let (row, lat) = row(args, &floors, setup, &pages)?;
        let label = format!(
            "{} {} {} {} {}{}{}",
            row.folio,
            row.free_mode,
            row.discard.name(),
            row.layout,
            setup.clean.name(),
            if setup.spin_us > 0 {
                format!(" spin {}us", setup.spin_us)
            } else {
                String::new()
            },
            if setup.handoff_pages > 0 {
                format!(" handoff {}", setup.handoff_pages)
            } else {
                String::new()
            }
        );
        rows.push(row);
        if args.svg.is_some() {
            samples.push((setup.pressure, label, lat));
        }
        bar.inc(1);
    }
    if let Some(dir) = &args.svg {
        super::svg::prepare(dir)?;
        for mode in [Mode::Pressure, Mode::NoPressure] {
            let series: Vec<(String, Vec<u64>)> = samples
                .iter()
                .filter(|(m, _, _)| *m == mode)
                .map(|(_, label, lat)| (label.clone(), lat.clone()))
                .collect();
            if series.is_empty() {
                continue;
            }
            super::svg::latency_tail(
                &dir.join(format!("faults-{}.svg", mode.name())),
                &format!(
                    "Swap-in faults, {} mode: {} threads, {} under {}",
                    mode.name(),
                    args.threads,
                    format_size(args.size),
                    format_size(args.memory_high)
                ),
                &series,
            )?;
        }
    }
    bar.finish_and_clear();
    print_and_write(args, rows, floors)
}

/// Measures one configuration.
fn row(
    args: &Args,
    floors: &Floors,
    setup: Setup,
    pages: &[u8],
) -> Result<(Row, Vec<u64>), String> {
    let folio = setup.folio;
    let Measured {
        latencies: mut lat,
        wall,
        engines,
        served,
    } = measure(args, setup, pages)?;
    let latency = Latency::of(&mut lat);
    let p50 = latency.p50_us;
    let pages_per_folio = (folio / PAGE_SIZE) as f64;
    let floor =
        floors.roundtrip_us(folio, setup.spin_us > 0) + floors.decompress_4k_us * pages_per_folio;
    let row = Row {
        mode: setup.pressure,
        event_spin_us: setup.spin_us,
        handoff_pages: setup.handoff_pages,
        folio: format_size(folio as u64),
        free_mode: setup.free.name(),
        discard: setup.discard,
        layout: setup.layout.to_string(),
        clean_copies: setup.clean,
        access: args.access,
        engines: args.engines.describe_as(engines),
        faults: lat.len(),
        latency,
        p50_per_page_us: p50 / pages_per_folio,
        p50_vs_floor: p50 / floor,
        served_p50_us: served.as_secs_f64() * 1e6,
        pages_per_sec: lat.len() as f64 * pages_per_folio / wall.as_secs_f64(),
    };
    Ok((row, lat))
}

fn print_and_write(args: &Args, rows: Vec<Row>, floors: Floors) -> Result<(), String> {
    let mut t = Table::new(
        &[
            &[
                "mode",
                "folio",
                "free mode",
                "discard",
                "layout",
                "clean",
                "engines",
                "spin us",
                "handoff",
                "faults",
            ][..],
            &Latency::HEADER[..],
            &["p50/page us", "p50/floor", "served p50 us", "pages/s"][..],
        ]
        .concat(),
    );
    for r in &rows {
        let mut cells = vec![
            r.mode.name().to_string(),
            r.folio.clone(),
            r.free_mode.to_string(),
            r.discard.name().to_string(),
            r.layout.clone(),
            r.clean_copies.name().to_string(),
            r.engines.clone(),
            r.event_spin_us.to_string(),
            r.handoff_pages.to_string(),
            r.faults.to_string(),
        ];
        cells.extend(r.latency.cells());
        cells.push(format!("{:.2}", r.p50_per_page_us));
        cells.push(format!("{:.2}", r.p50_vs_floor));
        cells.push(format!("<{:.1}", r.served_p50_us));
        cells.push(format!("{:.0}", r.pages_per_sec));
        t.row(cells);
    }
    t.print(&format!(
        "Swap-in faults: {} threads touching ({:?}) {} of corpus pages under a {} limit (floor = round trip, with a handler that spins when the event thread does, + raw decompression)",
        args.threads,
        args.access,
        format_size(args.size),
        format_size(args.memory_high),
    ));
    let mut t = Table::new(&["floor", "p50 us"]);
    for (what, us) in [
        ("4K install, handler spinning", floors.roundtrip_4k_us),
        ("64K install, handler spinning", floors.roundtrip_64k_us),
        (
            "4K install, handler asleep in poll",
            floors.roundtrip_4k_sleeping_us,
        ),
        (
            "64K install, handler asleep in poll",
            floors.roundtrip_64k_sleeping_us,
        ),
    ] {
        t.row(vec![
            format!("userfaultfd round trip, {what}"),
            format!("{us:.2}"),
        ]);
    }
    t.row(vec![
        "UFFDIO_COPY alone, 4K".into(),
        format!("{:.2}", floors.uffdio_copy_4k_us),
    ]);
    t.row(vec![
        "lz4 decompress, 4K corpus page".into(),
        format!("{:.2}", floors.decompress_4k_us),
    ]);
    t.print("Floors, measured in the same run");

    if let Some(path) = &args.json {
        write_json(
            path,
            &Report {
                memory_high: args.memory_high,
                size: args.size,
                threads: args.threads,
                rows,
                floors,
            },
        )?;
    }
    Ok(())
}

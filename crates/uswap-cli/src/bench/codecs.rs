//! `uswap bench codecs`: per codec and folio size, latency and ratio through
//! our codec layer and through the codec library called directly, side by
//! side in one run; the by_n table; batched against sequential compression
//! on the device's engines.

use super::{progress, write_json, Percentiles, Table};
use crate::args;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use uswap::accel::{byn, Device, DeviceConfig, Job};
use uswap::codec::lz4::{lz4_decompress, Lz4State};
use uswap::codec::lzo::{self, LzoTable, Version};
use uswap::codec::{self, Codec, CodecError, DEFAULT_DICTIONARY};
use uswap::corpus;
use uswap::size::format_size;

#[derive(clap::Args)]
pub struct Args {
    /// Corpus directory (default: the project's corpus/).
    #[arg(long, value_parser = args::existing_dir)]
    corpus: Option<PathBuf>,
    /// Codecs to measure, comma-separated.
    #[arg(long, default_value = "lz4,lzo,lzo-rle,zstd,deflate,canned", value_parser = args::codec_name, value_delimiter = ',')]
    codecs: Vec<String>,
    /// Folio sizes for the codec table.
    #[arg(long, default_value = "4k,16k,64k", value_parser = args::folio_size, value_delimiter = ',')]
    folios: Vec<usize>,
    /// Passes over the corpus per measurement (more = steadier percentiles).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Codec for the by_n and batch tables.
    #[arg(long, default_value = "lz4", value_parser = args::codec_name)]
    table_codec: String,
    #[command(flatten)]
    device: args::DeviceArgs,
    /// Batch sizes for the batch table.
    #[arg(long, default_value = "8,16,32", value_parser = clap::value_parser!(u32).range(1..=512), value_delimiter = ',')]
    batches: Vec<u32>,
    /// Write every figure as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the by_n figures as SVG charts in this directory (latency and
    /// ratio against N).
    #[arg(long)]
    svg: Option<PathBuf>,
}

#[derive(Serialize)]
struct CodecRow {
    codec: String,
    folio: String,
    folios: usize,
    ratio: f64,
    compress_ns: Percentiles,
    decompress_ns: Percentiles,
    raw_compress_ns_p50: u64,
    raw_decompress_ns_p50: u64,
    compress_overhead: f64,
    decompress_overhead: f64,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    roundtrip_ok: bool,
}

#[derive(Serialize)]
struct BynRow {
    codec: String,
    folio: String,
    n: usize,
    engines: usize,
    compress_ns_p50: u64,
    decompress_ns_p50: u64,
    compress_vs_n1: f64,
    ratio: f64,
}

#[derive(Serialize)]
struct BatchRow {
    codec: String,
    batch: usize,
    engines: usize,
    mode: &'static str,
    caller_assist: bool,
    pages_per_s: f64,
    per_page_ns: f64,
    vs_sequential: f64,
}

#[derive(Serialize)]
struct Report {
    corpus: String,
    codecs: Vec<CodecRow>,
    byn: Vec<BynRow>,
    batch: Vec<BatchRow>,
}

/// The codec library called directly, with no layer of ours in between.
enum Raw {
    Lz4(Lz4State),
    Lzo(Version, LzoTable),
    Zstd(
        zstd::bulk::Compressor<'static>,
        zstd::bulk::Decompressor<'static>,
    ),
    Deflate(libdeflater::Compressor, libdeflater::Decompressor),
}

impl Raw {
    fn new(codec: &dyn Codec, spec: &str) -> Raw {
        let level = spec
            .split_once(':')
            .map(|(_, l)| l.parse().expect("validated level"));
        let zstd_with = |dict: &[u8]| {
            let mut c = zstd::bulk::Compressor::with_dictionary(level.unwrap_or(1), dict)
                .expect("zstd context");
            c.include_contentsize(false).expect("parameter");
            c.include_checksum(false).expect("parameter");
            c.include_dictid(false).expect("parameter");
            Raw::Zstd(
                c,
                zstd::bulk::Decompressor::with_dictionary(dict).expect("zstd context"),
            )
        };
        match codec.name() {
            "lz4" => Raw::Lz4(Lz4State::new()),
            "lzo" => Raw::Lzo(Version::Lzo1x, LzoTable::new()),
            "lzo-rle" => Raw::Lzo(Version::Rle, LzoTable::new()),
            "zstd" => zstd_with(&[]),
            "canned" => zstd_with(DEFAULT_DICTIONARY),
            "deflate" => Raw::Deflate(
                libdeflater::Compressor::new(
                    libdeflater::CompressionLvl::new(level.unwrap_or(1)).expect("level"),
                ),
                libdeflater::Decompressor::new(),
            ),
            other => unreachable!("no raw path for {other}"),
        }
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let cap = src.len() - 1;
        match self {
            Raw::Lz4(state) => state.compress(src, dst, cap),
            Raw::Lzo(version, table) => lzo::compress(src, &mut dst[..cap], *version, table),
            Raw::Zstd(c, _) => c.compress_to_buffer(src, &mut dst[..cap]).ok(),
            Raw::Deflate(c, _) => c.deflate_compress(src, &mut dst[..cap]).ok(),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> bool {
        match self {
            Raw::Lz4(_) => lz4_decompress(src, dst).is_ok(),
            Raw::Lzo(..) => lzo::decompress(src, dst).is_ok(),
            Raw::Zstd(_, d) => d
                .decompress_to_buffer(src, dst)
                .is_ok_and(|n| n == dst.len()),
            Raw::Deflate(_, d) => d.deflate_decompress(src, dst).is_ok_and(|n| n == dst.len()),
        }
    }
}

fn ns_since(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Measures one codec on one folio size.
fn measure_codec(spec: &str, folio_size: usize, folios: &[&[u8]], rounds: u32) -> CodecRow {
    let codec = codec::by_name(spec).expect("validated codec");
    let mut raw = Raw::new(codec.as_ref(), spec);
    let mut bufs: Vec<Vec<u8>> = folios.iter().map(|f| vec![0u8; f.len()]).collect();
    let mut sizes = vec![None; folios.len()];
    let mut out = vec![0u8; folio_size];
    let (mut ours_c, mut raw_c, mut ours_d, mut raw_d) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut roundtrip_ok = true;

    for round in 0..rounds {
        // Alternate which side goes first so neither always gets warm caches.
        for side in [round % 2, 1 - round % 2] {
            for (i, folio) in folios.iter().enumerate() {
                let t = Instant::now();
                let n = if side == 0 {
                    codec.compress(folio, &mut bufs[i]).ok()
                } else {
                    raw.compress(folio, &mut bufs[i])
                };
                let ns = ns_since(t);
                if side == 0 {
                    ours_c.push(ns);
                    sizes[i] = n;
                } else {
                    raw_c.push(ns);
                }
            }
        }
        for side in [round % 2, 1 - round % 2] {
            for (i, folio) in folios.iter().enumerate() {
                let Some(n) = sizes[i] else { continue };
                let t = Instant::now();
                let ok = if side == 0 {
                    codec.decompress(&bufs[i][..n], &mut out).is_ok()
                } else {
                    raw.decompress(&bufs[i][..n], &mut out)
                };
                let ns = ns_since(t);
                roundtrip_ok &= ok && out == **folio;
                if side == 0 {
                    ours_d.push(ns);
                } else {
                    raw_d.push(ns);
                }
            }
        }
    }

    let input: usize = folios.iter().map(|f| f.len()).sum();
    let stored: usize = sizes
        .iter()
        .zip(folios)
        .map(|(s, f)| s.unwrap_or(f.len()))
        .sum();
    let decompressed: usize = sizes
        .iter()
        .zip(folios)
        .filter(|(s, _)| s.is_some())
        .map(|(_, f)| f.len())
        .sum();
    let total_c: u64 = ours_c.iter().sum();
    let total_d: u64 = ours_d.iter().sum();
    let (c, rc, d, rd) = (
        Percentiles::of(&mut ours_c),
        Percentiles::of(&mut raw_c),
        Percentiles::of(&mut ours_d),
        Percentiles::of(&mut raw_d),
    );
    CodecRow {
        codec: spec.to_string(),
        folio: format_size(folio_size as u64),
        folios: folios.len(),
        ratio: input as f64 / stored as f64,
        compress_ns: c,
        decompress_ns: d,
        raw_compress_ns_p50: rc.p50,
        raw_decompress_ns_p50: rd.p50,
        compress_overhead: c.p50 as f64 / rc.p50.max(1) as f64,
        decompress_overhead: d.p50 as f64 / rd.p50.max(1) as f64,
        compress_mb_s: (input as f64 * rounds as f64) / (total_c as f64 / 1e9) / 1e6,
        decompress_mb_s: (decompressed as f64 * rounds as f64)
            / (total_d.max(1) as f64 / 1e9)
            / 1e6,
        roundtrip_ok,
    }
}

fn measure_byn(
    spec: &str,
    config: &DeviceConfig,
    folios: &[&[u8]],
    rounds: u32,
) -> Result<Vec<BynRow>, String> {
    let codec = codec::by_name(spec).expect("validated codec");
    let engines = config.engines;
    let device = Device::new(config.clone()).map_err(|e| format!("starting engines: {e}"))?;
    let folio_size = folios[0].len();
    let mut rows: Vec<BynRow> = Vec::new();
    let mut dst = vec![0u8; folio_size];
    let mut out = vec![0u8; folio_size];
    for n in [1usize, 2, 4, 8, 16, 32, 64] {
        let (mut cns, mut dns) = (Vec::new(), Vec::new());
        let mut stored = 0usize;
        for round in 0..rounds {
            for folio in folios {
                let t = Instant::now();
                let r = byn::compress(&device, codec.as_ref(), n, folio, &mut dst);
                cns.push(ns_since(t));
                let len = match r {
                    Ok(len) => len,
                    Err(CodecError::DoesNotFit) => {
                        stored += if round == 0 { folio.len() } else { 0 };
                        continue;
                    }
                    Err(e) => return Err(format!("by_n compress failed: {e}")),
                };
                if round == 0 {
                    stored += len;
                }
                let t = Instant::now();
                byn::decompress(&device, codec.as_ref(), &dst[..len], &mut out)
                    .map_err(|e| format!("by_n decompress failed: {e}"))?;
                dns.push(ns_since(t));
                if out != **folio {
                    return Err(format!("by_n n={n} round trip changed the data"));
                }
            }
        }
        let c = Percentiles::of(&mut cns).p50;
        let base = rows.first().map_or(c, |r| r.compress_ns_p50);
        rows.push(BynRow {
            codec: spec.to_string(),
            folio: format_size(folio_size as u64),
            n,
            engines,
            compress_ns_p50: c,
            decompress_ns_p50: Percentiles::of(&mut dns).p50,
            compress_vs_n1: c as f64 / base.max(1) as f64,
            ratio: (folios.len() * folio_size) as f64 / stored as f64,
        });
    }
    Ok(rows)
}

/// Pages per second compressing `pages` one at a time on the caller.
fn sequential_rate(codec: &dyn Codec, pages: &[&[u8]], rounds: u32) -> f64 {
    let mut buf = vec![0u8; corpus::PAGE_SIZE];
    let t = Instant::now();
    for _ in 0..rounds {
        for page in pages {
            let _ = codec.compress(page, &mut buf);
        }
    }
    (pages.len() as f64 * rounds as f64) / t.elapsed().as_secs_f64()
}

/// Pages per second compressing `pages` in batches of `batch` on `device`.
fn batched_rate(
    device: &Device,
    codec: &dyn Codec,
    pages: &[&[u8]],
    batch: usize,
    rounds: u32,
) -> f64 {
    let mut bufs = vec![vec![0u8; corpus::PAGE_SIZE]; batch];
    let t = Instant::now();
    for _ in 0..rounds {
        for chunk in pages.chunks(batch) {
            let mut jobs: Vec<Job<'_>> = chunk
                .iter()
                .zip(bufs.iter_mut())
                .map(|(p, b)| Job::new(p, b))
                .collect();
            device.compress_batch(codec, &mut jobs);
        }
    }
    (pages.len() as f64 * rounds as f64) / t.elapsed().as_secs_f64()
}

fn measure_batches(
    spec: &str,
    base: &DeviceConfig,
    batches: &[usize],
    pages: &[&[u8]],
    rounds: u32,
) -> Result<Vec<BatchRow>, String> {
    let engines = base.engines;
    let codec: Arc<dyn Codec> = codec::by_name(spec).expect("validated codec");
    let row = |batch, engines, mode, caller_assist, rate: f64, seq: f64| BatchRow {
        codec: spec.to_string(),
        batch,
        engines,
        mode,
        caller_assist,
        pages_per_s: rate,
        per_page_ns: 1e9 / rate,
        vs_sequential: rate / seq,
    };
    let mut configs: Vec<(usize, usize, bool)> = vec![(0, batches[0], false)];
    for &b in batches {
        for assist in [true, false] {
            configs.push((engines, b, assist));
        }
    }
    let devices: Vec<Device> = configs
        .iter()
        .map(|&(engines, batch_size, caller_assist)| {
            Device::new(DeviceConfig {
                engines,
                batch_size,
                caller_assist,
                ..base.clone()
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| format!("starting engines: {e}"))?;
    // Each round measures sequential then every configuration, so every
    // ratio compares figures taken moments apart.
    let mut seq_total = 0.0;
    let mut totals = vec![0.0; configs.len()];
    for _ in 0..rounds {
        seq_total += sequential_rate(codec.as_ref(), pages, 1);
        for (i, (&(_, batch, _), device)) in configs.iter().zip(&devices).enumerate() {
            totals[i] += batched_rate(device, codec.as_ref(), pages, batch, 1);
        }
    }
    let seq = seq_total / rounds as f64;
    let mut rows = vec![row(1, 0, "sequential", false, seq, seq)];
    for (&(engines, batch, assist), total) in configs.iter().zip(totals) {
        rows.push(row(
            batch,
            engines,
            "batched",
            assist,
            total / rounds as f64,
            seq,
        ));
    }
    Ok(rows)
}

pub fn run(args: &Args) -> Result<(), String> {
    let dir = args.corpus.clone().unwrap_or_else(corpus::default_dir);
    let workloads = corpus::load_dir(&dir).map_err(|e| format!("loading the corpus: {e}"))?;
    let device_config = args.device.config();

    let bar = progress((args.codecs.len() * args.folios.len() + 2) as u64, "codecs");
    let mut codec_rows = Vec::new();
    for spec in &args.codecs {
        for &folio_size in &args.folios {
            let folios: Vec<&[u8]> = workloads
                .iter()
                .flat_map(|w| w.folios(folio_size))
                .collect();
            if folios.is_empty() {
                return Err(format!(
                    "the corpus has no whole {} folios",
                    format_size(folio_size as u64)
                ));
            }
            bar.set_message(format!("{spec} {}", format_size(folio_size as u64)));
            codec_rows.push(measure_codec(spec, folio_size, &folios, args.rounds));
            bar.inc(1);
        }
    }
    bar.set_message("by_n");
    let folios64: Vec<&[u8]> = workloads.iter().flat_map(|w| w.folios(64 << 10)).collect();
    let byn_rows = measure_byn(&args.table_codec, &device_config, &folios64, args.rounds)?;
    bar.inc(1);
    bar.set_message("batches");
    let pages: Vec<&[u8]> = workloads
        .iter()
        .flat_map(|w| w.folios(corpus::PAGE_SIZE))
        .collect();
    let batches: Vec<usize> = args.batches.iter().map(|&b| b as usize).collect();
    let batch_rows = measure_batches(
        &args.table_codec,
        &device_config,
        &batches,
        &pages,
        args.rounds.max(3),
    )?;
    bar.finish_and_clear();

    let mut t = Table::new(&[
        "codec",
        "folio",
        "ratio",
        "c p05",
        "c p50",
        "c p99",
        "raw c p50",
        "c ours/raw",
        "d p05",
        "d p50",
        "d p99",
        "raw d p50",
        "d ours/raw",
        "c MB/s",
        "d MB/s",
        "ok",
    ]);
    for r in &codec_rows {
        t.row(vec![
            r.codec.clone(),
            r.folio.clone(),
            format!("{:.2}", r.ratio),
            r.compress_ns.p05.to_string(),
            r.compress_ns.p50.to_string(),
            r.compress_ns.p99.to_string(),
            r.raw_compress_ns_p50.to_string(),
            format!("{:.3}", r.compress_overhead),
            r.decompress_ns.p05.to_string(),
            r.decompress_ns.p50.to_string(),
            r.decompress_ns.p99.to_string(),
            r.raw_decompress_ns_p50.to_string(),
            format!("{:.3}", r.decompress_overhead),
            format!("{:.0}", r.compress_mb_s),
            format!("{:.0}", r.decompress_mb_s),
            if r.roundtrip_ok { "yes" } else { "NO" }.to_string(),
        ]);
    }
    t.print(&format!(
        "Codecs on {} (latency per folio in ns; ours/raw = our layer's p50 over the library's)",
        dir.display()
    ));

    let mut t = Table::new(&[
        "codec",
        "folio",
        "N",
        "engines",
        "compress p50",
        "vs N=1",
        "decompress p50",
        "ratio",
    ]);
    for r in &byn_rows {
        t.row(vec![
            r.codec.clone(),
            r.folio.clone(),
            r.n.to_string(),
            r.engines.to_string(),
            r.compress_ns_p50.to_string(),
            format!("{:.2}", r.compress_vs_n1),
            r.decompress_ns_p50.to_string(),
            format!("{:.2}", r.ratio),
        ]);
    }
    t.print("by_n: one 64K folio as N segments compressed in parallel (ns)");
    if let Some(dir) = &args.svg {
        byn_charts(dir, &byn_rows)?;
    }

    let mut t = Table::new(&[
        "codec",
        "mode",
        "batch",
        "engines",
        "assist",
        "pages/s",
        "ns/page",
        "vs sequential",
    ]);
    for r in &batch_rows {
        t.row(vec![
            r.codec.clone(),
            r.mode.to_string(),
            r.batch.to_string(),
            r.engines.to_string(),
            if r.caller_assist { "yes" } else { "no" }.to_string(),
            format!("{:.0}", r.pages_per_s),
            format!("{:.0}", r.per_page_ns),
            format!("{:.2}", r.vs_sequential),
        ]);
    }
    t.print("Batches: 4K pages one at a time on the caller vs in batches on the engines");

    let failed = codec_rows.iter().any(|r| !r.roundtrip_ok);
    if let Some(path) = &args.json {
        let report = Report {
            corpus: dir.display().to_string(),
            codecs: codec_rows,
            byn: byn_rows,
            batch: batch_rows,
        };
        write_json(path, &report)?;
    }
    if failed {
        return Err("a codec failed its round trip (see the ok column)".into());
    }
    Ok(())
}

/// by_n against N: compress and decompress p50, and the ratio.
fn byn_charts(dir: &std::path::Path, rows: &[BynRow]) -> Result<(), String> {
    super::svg::prepare(dir)?;
    let points = |f: fn(&BynRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (r.n as f64, f(r))).collect()
    };
    let (codec, folio) = rows.first().map_or((String::new(), String::new()), |r| {
        (r.codec.clone(), r.folio.clone())
    });
    super::svg::lines(
        &dir.join("byn-latency.svg"),
        &format!("by_n: one {folio} folio as N segments ({codec}), p50"),
        ("N (segments)", "microseconds"),
        &[
            (
                "compress".into(),
                points(|r| r.compress_ns_p50 as f64 / 1000.0),
            ),
            (
                "decompress".into(),
                points(|r| r.decompress_ns_p50 as f64 / 1000.0),
            ),
        ],
    )?;
    super::svg::lines(
        &dir.join("byn-ratio.svg"),
        &format!("by_n: compression ratio of one {folio} folio as N segments ({codec})"),
        ("N (segments)", "ratio (original / stored)"),
        &[("ratio".into(), points(|r| r.ratio))],
    )
}

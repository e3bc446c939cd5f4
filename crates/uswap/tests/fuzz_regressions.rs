//! Inputs found by the fuzz targets in `fuzz/`, minimised, kept as tests.
//!
//! Some of these only fail with overflow checks on (`cargo test` without
//! `--release`, and every `cargo fuzz` build): in a release build the
//! arithmetic wraps and the bug may not show.

use uswap::codec::by_name;
use uswap::codec::lzo::{compress, decompress, LzoTable, Version};

fn lzo_round_trip(data: &[u8], version: Version) {
    let mut stream = vec![0u8; data.len() + data.len() / 16 + 64];
    let n = compress(data, &mut stream, version, &mut LzoTable::new()).expect("worst-case room");
    let mut out = vec![0u8; data.len()];
    decompress(&stream[..n], &mut out).expect("our own stream decodes");
    assert_eq!(out, data);
}

/// lzo_roundtrip, minimised: `[255; 5]` (a match at distance 1). The lzo-rle
/// compressor computed `distance - 16384` for every match before checking
/// that the match was an M4 (distance above 16384), which overflowed for any
/// nearer match: a panic with overflow checks on.
#[test]
fn lzo_rle_compresses_a_near_match() {
    lzo_round_trip(&[255; 5], Version::Rle);
    // The crash as first found, before minimising.
    lzo_round_trip(&[38, 40, 0, 0, 38, 40, 0, 0], Version::Rle);
    // And through the codec, on a page: every page with a repeat has one.
    let codec = by_name("lzo-rle").unwrap();
    let page: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8 + 1).collect();
    let mut stream = vec![0u8; 4096];
    let n = codec.compress(&page, &mut stream).unwrap();
    let mut out = vec![0u8; 4096];
    codec.decompress(&stream[..n], &mut out).unwrap();
    assert_eq!(out, page);
}

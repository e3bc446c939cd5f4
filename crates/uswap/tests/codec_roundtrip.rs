//! Every codec round-trips every corpus workload and the edge inputs, and
//! keeps the "compress only when it shrinks" contract.

use rand::{Rng, SeedableRng};
use std::sync::Arc;
use uswap::codec::{by_name, same_filled, Codec, CodecError, CODEC_NAMES};
use uswap::corpus;

fn codecs() -> Vec<Arc<dyn Codec>> {
    CODEC_NAMES.iter().map(|n| by_name(n).unwrap()).collect()
}

/// Compresses and decompresses `data`; returns the compressed size, or None
/// when the codec declined because it would not shrink.
fn roundtrip(codec: &dyn Codec, data: &[u8]) -> Option<usize> {
    let mut compressed = vec![0u8; data.len() + 64];
    match codec.compress(data, &mut compressed) {
        Ok(n) => {
            assert!(
                n < data.len(),
                "{} returned {n} bytes for {} input bytes",
                codec.name(),
                data.len()
            );
            let mut out = vec![0xEEu8; data.len()];
            codec
                .decompress(&compressed[..n], &mut out)
                .unwrap_or_else(|e| {
                    panic!("{} failed to decode its own output: {e}", codec.name())
                });
            assert!(out == data, "{} round trip changed the data", codec.name());
            Some(n)
        }
        Err(CodecError::DoesNotFit) => None,
        Err(e) => panic!("{} failed to compress: {e}", codec.name()),
    }
}

fn pattern_words(len: usize) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| (i as u64).to_le_bytes())
        .collect()
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn every_codec_roundtrips_the_corpus_pages_and_folios() {
    let workloads = corpus::load_dir(&corpus::default_dir()).expect("the project's corpus loads");
    assert_eq!(workloads.len(), 4);
    for codec in codecs() {
        for w in &workloads {
            let mut stored = 0usize;
            for i in 0..w.page_count() {
                stored += roundtrip(codec.as_ref(), w.page(i)).unwrap_or(corpus::PAGE_SIZE);
            }
            let ratio = w.pages.len() as f64 / stored as f64;
            assert!(
                ratio > 1.5,
                "{} on {}: ratio {ratio:.2} is implausibly low",
                codec.name(),
                w.name
            );
            for folio in w.folios(64 << 10) {
                roundtrip(codec.as_ref(), folio);
            }
        }
    }
}

#[test]
fn edge_inputs_roundtrip() {
    let mut inputs: Vec<(String, Vec<u8>)> = vec![
        ("zero page".into(), vec![0u8; 4096]),
        ("one repeated byte".into(), vec![0xABu8; 4096]),
        ("p[i] = i".into(), pattern_words(4096)),
        ("p[i] = i, 64K".into(), pattern_words(65536)),
        ("zero 2M".into(), vec![0u8; 2 << 20]),
        (
            "zero then data".into(),
            [vec![0u8; 3000], random_bytes(1096, 9)].concat(),
        ),
        (
            "data then zero".into(),
            [random_bytes(1096, 10), vec![0u8; 3000]].concat(),
        ),
    ];
    for len in [
        1usize,
        2,
        3,
        4,
        5,
        7,
        13,
        17,
        100,
        255,
        256,
        1000,
        4095,
        4097,
        12_345,
        65_537,
        (1 << 20) + 3,
    ] {
        let mut text = b"uswap keeps pages compressed; ".repeat(len / 30 + 1);
        text.truncate(len);
        inputs.push((format!("text of {len} bytes"), text));
    }
    for codec in codecs() {
        for (what, data) in &inputs {
            let n = roundtrip(codec.as_ref(), data);
            if data.len() >= 4096 && same_filled(data).is_some() {
                let n = n.unwrap_or_else(|| panic!("{} did not compress {what}", codec.name()));
                assert!(
                    n < data.len() / 20,
                    "{} compressed {what} to {n} bytes",
                    codec.name()
                );
            }
        }
    }
}

#[test]
fn incompressible_input_is_declined_not_expanded() {
    let data = random_bytes(4096, 1);
    for codec in codecs() {
        let mut dst = vec![0u8; 8192];
        assert_eq!(
            codec.compress(&data, &mut dst),
            Err(CodecError::DoesNotFit),
            "{} accepted random data",
            codec.name()
        );
    }
}

#[test]
fn output_capacity_is_honoured() {
    let data = pattern_words(4096);
    for codec in codecs() {
        let mut roomy = vec![0u8; 4096];
        let n = codec.compress(&data, &mut roomy).unwrap();
        let mut tight = vec![0u8; n - 1];
        assert_eq!(
            codec.compress(&data, &mut tight),
            Err(CodecError::DoesNotFit),
            "{}",
            codec.name()
        );
        // Some libraries (zstd) want a little slack beyond the final size.
        let mut enough = vec![0u8; n + 32];
        assert_eq!(
            codec.compress(&data, &mut enough),
            Ok(n),
            "{}",
            codec.name()
        );
    }
}

#[test]
fn decoding_to_the_wrong_length_is_an_error() {
    let data = pattern_words(4096);
    for codec in codecs() {
        let mut compressed = vec![0u8; 4096];
        let n = codec.compress(&data, &mut compressed).unwrap();
        for len in [0usize, 1, 4095, 4097, 8192] {
            let mut out = vec![0u8; len];
            assert_eq!(
                codec.decompress(&compressed[..n], &mut out),
                Err(CodecError::Corrupt),
                "{} decoded a 4096-byte page into {len} bytes",
                codec.name()
            );
        }
    }
}

#[test]
fn codecs_are_selected_by_kernel_name_with_levels() {
    for name in CODEC_NAMES {
        assert_eq!(by_name(name).unwrap().name(), name);
    }
    assert_eq!(by_name("zstd:3").unwrap().name(), "zstd");
    assert_eq!(by_name("deflate:9").unwrap().name(), "deflate");
    for bad in ["lz5", "zstd:99", "zstd:x", "lz4:1", "deflate:13", ""] {
        assert!(by_name(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn codecs_work_from_many_threads_at_once() {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    let pages: Vec<Vec<u8>> = workloads
        .iter()
        .flat_map(|w| (0..64).map(|i| w.page(i).to_vec()))
        .collect();
    for codec in codecs() {
        std::thread::scope(|s| {
            for t in 0..4 {
                let codec = codec.clone();
                let pages = &pages;
                s.spawn(move || {
                    for page in pages.iter().skip(t) {
                        roundtrip(codec.as_ref(), page);
                    }
                });
            }
        });
    }
}

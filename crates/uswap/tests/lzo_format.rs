//! LZO1X and lzo-rle against the format: streams from an independent LZO1X
//! implementation (rust-lzo, a port of the kernel's code, test-only) decode
//! here and ours decode there; hand-assembled lzo-rle streams decode as the
//! format document says; arbitrary inputs round-trip.

use proptest::prelude::*;
use rust_lzo::{LZOContext, LZOError};
use uswap::codec::lzo::{compress, decompress, LzoTable, Version};
use uswap::corpus;

fn ours(data: &[u8], version: Version) -> Vec<u8> {
    let mut out = vec![0u8; data.len() + data.len() / 16 + 64];
    let n =
        compress(data, &mut out, version, &mut LzoTable::new()).expect("room for the worst case");
    out.truncate(n);
    out
}

fn theirs_compress(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; rust_lzo::worst_compress(data.len())];
    let (slice, err) = LZOContext::new().compress_to_slice(data, &mut out);
    assert!(err == LZOError::OK, "rust-lzo failed to compress");
    slice.to_vec()
}

fn theirs_decompress(stream: &[u8], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let (slice, err) = LZOContext::decompress_to_slice(stream, &mut out);
    assert!(err == LZOError::OK, "rust-lzo rejected our stream");
    assert_eq!(slice.len(), len);
    out
}

fn samples() -> Vec<Vec<u8>> {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    let mut out: Vec<Vec<u8>> = Vec::new();
    for w in &workloads {
        out.extend((0..w.page_count()).step_by(7).map(|i| w.page(i).to_vec()));
        out.extend(w.folios(64 << 10).into_iter().take(4).map(<[u8]>::to_vec));
    }
    out.push(vec![0u8; 4096]);
    out.push((0..512u64).flat_map(|i| i.to_le_bytes()).collect());
    out.push(b"abcabcabcabcabcabc and something else entirely".to_vec());
    out
}

#[test]
fn independent_lzo1x_streams_decode_here() {
    for data in samples() {
        let stream = theirs_compress(&data);
        let mut out = vec![0u8; data.len()];
        decompress(&stream, &mut out).expect("a valid LZO1X stream");
        assert!(out == data);
    }
}

#[test]
fn our_lzo1x_streams_decode_there() {
    for data in samples() {
        let stream = ours(&data, Version::Lzo1x);
        assert!(theirs_decompress(&stream, data.len()) == data);
    }
}

#[test]
fn lzo_rle_streams_carry_the_version_header_and_decode() {
    for data in samples() {
        let stream = ours(&data, Version::Rle);
        assert_eq!(&stream[..2], &[17, 1]);
        let mut out = vec![0u8; data.len()];
        decompress(&stream, &mut out).unwrap();
        assert!(out == data);
    }
}

#[test]
fn hand_assembled_rle_stream_decodes() {
    // Version header, a 1-byte literal run, a run of 4 + (1 << 3 | 3) = 15
    // zeros followed by 2 literals (S = 2), then the end marker.
    let stream = [
        17,
        1,
        18,
        b'x',
        0x18 | 3,
        0xfc | 2,
        0xff,
        1,
        b'y',
        b'z',
        17,
        0,
        0,
    ];
    let mut out = vec![0xEEu8; 18];
    decompress(&stream, &mut out).unwrap();
    let mut expected = vec![b'x'];
    expected.extend([0u8; 15]);
    expected.extend(b"yz");
    assert_eq!(out, expected);
}

#[test]
fn rle_is_not_understood_in_a_version_0_stream() {
    // The same instruction bytes without the header are an M4 match that
    // reaches before the start of the output.
    let stream = [18, b'x', 0x18 | 3, 0xfc | 2, 0xff, 1, b'y', b'z', 17, 0, 0];
    let mut out = vec![0u8; 18];
    assert!(decompress(&stream, &mut out).is_err());
}

#[test]
fn long_zero_runs_use_few_bytes_in_lzo_rle() {
    let zero = vec![0u8; 65536];
    let rle = ours(&zero, Version::Rle);
    // 2 header bytes, 1 literal, ceil(65535 / 2051) RLE instructions of 4
    // bytes, 3 end bytes.
    assert!(rle.len() <= 2 + 2 + 32 * 4 + 3, "{} bytes", rle.len());
    let mut out = vec![1u8; zero.len()];
    decompress(&rle, &mut out).unwrap();
    assert!(out == zero);
    // Runs of every length near the 4-byte minimum and the 2051-byte maximum.
    for run in [3usize, 4, 5, 11, 12, 2050, 2051, 2052, 4102, 4103] {
        let data = [b"head".as_slice(), &vec![0u8; run], b"tail"].concat();
        let stream = ours(&data, Version::Rle);
        let mut out = vec![0u8; data.len()];
        decompress(&stream, &mut out).unwrap();
        assert_eq!(out, data, "zero run of {run}");
    }
}

/// A repeatable stream of pseudo-random bytes (a 64-bit LCG's high bits).
fn random_bytes(seed: u64) -> impl FnMut() -> u8 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u8
    }
}

#[test]
fn rle_and_far_matches_do_not_collide() {
    // Data with repeats more than 16 KiB back (M4 matches) of lengths near
    // 261..264, mixed with zero runs.
    let mut next = random_bytes(7);
    let block: Vec<u8> = (0..300).map(|_| next()).collect();
    for gap in [16_000usize, 16_400, 32_700, 32_800, 49_000] {
        for len in [260usize, 261, 262, 263, 264, 265] {
            let mut data: Vec<u8> = block[..len].to_vec();
            data.extend((0..gap).map(|i| if i % 97 < 10 { 0 } else { next() }));
            data.extend_from_slice(&block[..len]);
            for version in [Version::Lzo1x, Version::Rle] {
                let stream = ours(&data, version);
                let mut out = vec![0u8; data.len()];
                decompress(&stream, &mut out).unwrap();
                assert!(out == data, "gap {gap} len {len} {version:?}");
            }
        }
    }
}

#[test]
fn an_m4_match_that_would_read_as_a_zero_run_is_shortened() {
    // A block repeated 32831 bytes later (distance 16384 + 0x403f) and
    // followed by three literals: the M4's distance bytes are then 0xff
    // (its low six bits and the literal count all ones) and 0x00, and an
    // extended length of 261..264 bytes has a last length byte of
    // 0xfc..0xff, which lzo-rle reads as a zero run unless the match is cut
    // to 260. The gap is one 4-byte pattern repeated: it encodes as one
    // match, which adds nothing to the dictionary, so the block's first
    // position is still there when the repeat comes.
    let mut random = random_bytes(11);
    let mut next = || random() | 1;
    let block: Vec<u8> = (0..300).map(|_| next()).collect();
    for len in 261usize..=264 {
        let mut data: Vec<u8> = block[..len].to_vec();
        data.extend((len..32_831).map(|i| (i % 4) as u8 + 2));
        data.extend_from_slice(&block[..len]);
        data.extend_from_slice(&[0xe1, 0xe3, 0xe5]);
        data.extend((0..64).map(|i| (i % 4) as u8 + 2));
        let stream = ours(&data, Version::Rle);
        let mut out = vec![0u8; data.len()];
        decompress(&stream, &mut out).expect("decodes");
        assert!(out == data, "len {len}");
    }
}

/// Up to 64 KiB a dictionary entry is a whole position, so a repeat can be
/// found further back than an M4 reaches (0xbfff, 0xbffe in lzo-rle); it
/// must then go as literals. The gap is one 4-byte pattern repeated, which
/// adds nothing to the dictionary, so the block's positions are still there.
#[test]
fn a_repeat_beyond_the_farthest_match_goes_as_literals() {
    let mut random = random_bytes(13);
    let mut next = || random() | 1;
    let block: Vec<u8> = (0..300).map(|_| next()).collect();
    for distance in [0xbffe_usize, 0xbfff, 0xc000, 0xc001, 60_000, 65_000] {
        let mut data = block.clone();
        data.extend((block.len()..distance).map(|i| (i % 4) as u8 + 2));
        data.extend_from_slice(&block[..block.len().min((1 << 16) - distance)]);
        assert!(data.len() <= 1 << 16);
        for version in [Version::Lzo1x, Version::Rle] {
            let stream = ours(&data, version);
            let mut out = vec![0u8; data.len()];
            let decoded = decompress(&stream, &mut out);
            assert!(
                decoded.is_ok() && out == data,
                "distance {distance} {version:?}"
            );
        }
    }
}

/// Past 64 KiB the dictionary's 16-bit positions wrap; 2 MiB folios are
/// compressed whole.
#[test]
fn a_two_mib_input_roundtrips() {
    let pages: Vec<u8> = samples().concat();
    let mut data: Vec<u8> = pages.iter().cycle().take(1 << 20).copied().collect();
    data.extend((0..(1u64 << 17)).flat_map(|i| (i * 7).to_le_bytes()));
    assert_eq!(data.len(), 2 << 20);
    for version in [Version::Lzo1x, Version::Rle] {
        let stream = ours(&data, version);
        let mut out = vec![0u8; data.len()];
        decompress(&stream, &mut out).expect("decodes");
        assert!(out == data, "{version:?}");
        assert!(
            stream.len() < data.len() / 2,
            "{version:?}: {}",
            stream.len()
        );
    }
}

#[test]
fn the_stream_depends_on_the_input_alone() {
    // One table for every call, as the codec keeps one per thread: what an
    // earlier input left in it must not show in the next stream.
    let samples = samples();
    let mut table = LzoTable::new();
    for version in [Version::Lzo1x, Version::Rle] {
        for data in &samples {
            let mut out = vec![0u8; data.len() + data.len() / 16 + 64];
            let n = compress(data, &mut out, version, &mut table).unwrap();
            assert!(out[..n] == ours(data, version)[..]);
        }
    }
}

/// Up to 12 runs, each of random bytes (fewer than `random`), of zeros, or
/// of one repeated byte, end to end.
fn mixed_runs(random: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..random),
            (0usize..3000).prop_map(|n| vec![0u8; n]),
            (any::<u8>(), 0usize..600).prop_map(|(b, n)| vec![b; n]),
        ],
        0..12,
    )
    .prop_map(|runs| runs.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_inputs_roundtrip(data in mixed_runs(64)) {
        for version in [Version::Lzo1x, Version::Rle] {
            let stream = ours(&data, version);
            let mut out = vec![0u8; data.len()];
            prop_assert!(decompress(&stream, &mut out).is_ok());
            prop_assert_eq!(&out, &data);
        }
        let theirs = theirs_compress(&data);
        let mut out = vec![0u8; data.len()];
        prop_assert!(decompress(&theirs, &mut out).is_ok());
        prop_assert_eq!(&out, &data);
    }

    /// Room is checked per instruction, for exactly what it writes, and
    /// short literal runs are copied in blocks that may reach past them: a
    /// capacity one byte short of the stream must be declined without a
    /// panic, and the stream's own length must be enough, byte for byte.
    #[test]
    fn a_capacity_short_of_the_stream_is_declined(
        data in mixed_runs(300),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut table = LzoTable::new();
        for version in [Version::Lzo1x, Version::Rle] {
            let full = ours(&data, version);
            let mut exact = vec![0u8; full.len()];
            prop_assert_eq!(compress(&data, &mut exact, version, &mut table), Some(full.len()));
            prop_assert_eq!(&exact, &full);
            let caps: Vec<usize> = if full.len() <= 400 {
                (0..full.len()).collect()
            } else {
                vec![0, 1, full.len() - 1, full.len() - 2, full.len() - 17, cut.index(full.len())]
            };
            for cap in caps {
                let mut short = vec![0u8; cap];
                prop_assert_eq!(compress(&data, &mut short, version, &mut table), None, "capacity {}", cap);
            }
        }
    }

    #[test]
    fn garbage_never_panics(stream in proptest::collection::vec(any::<u8>(), 0..300), len in 0usize..5000) {
        let mut out = vec![0u8; len];
        let _ = decompress(&stream, &mut out);
    }
}

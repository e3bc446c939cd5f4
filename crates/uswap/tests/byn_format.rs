//! by_n framing: every N round-trips on every engine count, raw segments are
//! flagged and stored as they are, and bad arguments are refused.

use rand::{Rng, SeedableRng};
use uswap::accel::{self, Device, DeviceConfig};
use uswap::codec::{by_name, byn, CodecError, CODEC_NAMES};
use uswap::corpus;

#[test]
fn every_n_and_codec_roundtrips_corpus_folios() {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    let folios: Vec<&[u8]> = workloads
        .iter()
        .flat_map(|w| w.folios(64 << 10).into_iter().take(3))
        .collect();
    for engines in [0, 2] {
        let device = Device::new(DeviceConfig::with_engines(engines)).unwrap();
        for name in CODEC_NAMES {
            let codec = by_name(name).unwrap();
            for n in [1usize, 2, 4, 8, 16, 32, 64] {
                for folio in &folios {
                    let mut dst = vec![0u8; folio.len()];
                    let len =
                        match accel::byn::compress(&device, codec.as_ref(), n, folio, &mut dst) {
                            Ok(len) => len,
                            // A poorly compressible folio cut small may not pay
                            // for its header.
                            Err(CodecError::DoesNotFit) => {
                                let mut whole = vec![0u8; folio.len()];
                                let direct =
                                    codec.compress(folio, &mut whole).unwrap_or(folio.len());
                                assert!(
                                    direct * 10 > folio.len() * 9,
                                    "{name} n={n} declined a compressible folio"
                                );
                                continue;
                            }
                            Err(e) => panic!("{name} n={n}: {e}"),
                        };
                    assert!(len < folio.len());
                    let header = byn::parse_header(&dst[..len], folio.len()).unwrap();
                    assert_eq!(header.segments, n);
                    assert_eq!(header.codec, codec.id());
                    let mut out = vec![0u8; folio.len()];
                    accel::byn::decompress(&device, codec.as_ref(), &dst[..len], &mut out).unwrap();
                    assert!(out == **folio, "{name} n={n} engines={engines}");
                }
            }
        }
    }
}

#[test]
fn incompressible_segments_are_stored_raw() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    // Half random, half zero: with N=2 the first segment is stored raw.
    let mut folio: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
    folio.resize(64 << 10, 0);
    let device = Device::new(DeviceConfig::with_engines(2)).unwrap();
    let codec = by_name("lz4").unwrap();
    let mut dst = vec![0u8; folio.len()];
    let len = accel::byn::compress(&device, codec.as_ref(), 2, &folio, &mut dst).unwrap();
    let header = byn::parse_header(&dst[..len], folio.len()).unwrap();
    assert_eq!(header.entries[0], (true, 32 << 10));
    assert!(!header.entries[1].0);
    let mut out = vec![0u8; folio.len()];
    accel::byn::decompress(&device, codec.as_ref(), &dst[..len], &mut out).unwrap();
    assert!(out == folio);

    // Wholly random: nothing shrinks, the frame is refused like any codec's.
    let random: Vec<u8> = (0..64 << 10).map(|_| rng.gen()).collect();
    assert_eq!(
        accel::byn::compress(&device, codec.as_ref(), 4, &random, &mut dst),
        Err(CodecError::DoesNotFit)
    );
}

#[test]
fn bad_segment_counts_are_refused() {
    let device = Device::synchronous();
    let codec = by_name("lz4").unwrap();
    let folio = vec![0u8; 65536];
    let mut dst = vec![0u8; 65536];
    for n in [0usize, 3, 6, 128] {
        assert_eq!(
            accel::byn::compress(&device, codec.as_ref(), n, &folio, &mut dst),
            Err(CodecError::BadArgument),
            "n={n}"
        );
    }
    assert_eq!(
        accel::byn::compress(&device, codec.as_ref(), 4, &folio[..4097], &mut dst),
        Err(CodecError::BadArgument)
    );
}

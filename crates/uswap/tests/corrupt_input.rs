//! Corrupt and truncated input: every decoder and the by_n header parser
//! answer with an error, never a panic, never an out-of-bounds access, and
//! never a result of the wrong length.

use rand::{Rng, SeedableRng};
use uswap::accel::{self, Device, DeviceConfig};
use uswap::codec::{by_name, byn, CodecError, CODEC_NAMES};
use uswap::corpus;

fn sample_pages() -> Vec<Vec<u8>> {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    workloads
        .iter()
        .flat_map(|w| [w.page(5).to_vec(), w.page(500).to_vec()])
        .collect()
}

#[test]
fn truncated_streams_are_errors_for_every_codec() {
    for name in CODEC_NAMES {
        let codec = by_name(name).unwrap();
        for page in sample_pages() {
            let mut buf = vec![0u8; 4096];
            let Ok(n) = codec.compress(&page, &mut buf) else {
                continue;
            };
            for cut in 0..n {
                let mut out = vec![0u8; 4096];
                assert_eq!(
                    codec.decompress(&buf[..cut], &mut out),
                    Err(CodecError::Corrupt),
                    "{name}: a stream cut to {cut} of {n} bytes decoded"
                );
            }
        }
    }
}

#[test]
fn flipped_bits_never_panic_or_change_the_length() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for name in CODEC_NAMES {
        let codec = by_name(name).unwrap();
        for page in sample_pages() {
            let mut buf = vec![0u8; 4096];
            let Ok(n) = codec.compress(&page, &mut buf) else {
                continue;
            };
            for _ in 0..300 {
                let mut bad = buf[..n].to_vec();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..n);
                    bad[at] ^= 1 << rng.gen_range(0..8);
                }
                let mut out = vec![0u8; 4096];
                // An error, or (when the flip hit literal data) a full-length
                // decode; the store's checksum catches the latter.
                let _ = codec.decompress(&bad, &mut out);
            }
        }
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for name in CODEC_NAMES {
        let codec = by_name(name).unwrap();
        for len in [0usize, 1, 2, 3, 4, 5, 8, 17, 100, 1000, 5000] {
            for _ in 0..50 {
                let garbage: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                let mut out = vec![0u8; 4096];
                let _ = codec.decompress(&garbage, &mut out);
            }
        }
    }
}

fn framed(device: &Device, name: &str, n: usize, folio: &[u8]) -> Vec<u8> {
    let codec = by_name(name).unwrap();
    let mut dst = vec![0u8; folio.len()];
    let len = accel::byn::compress(device, codec.as_ref(), n, folio, &mut dst).unwrap();
    dst.truncate(len);
    dst
}

#[test]
fn byn_header_corruption_is_detected() {
    let device = Device::new(DeviceConfig::with_engines(2)).unwrap();
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    let folio = workloads[0].folios(64 << 10)[3].to_vec();
    let codec = by_name("lz4").unwrap();
    for n in [1usize, 4, 64] {
        let good = framed(&device, "lz4", n, &folio);
        let mut out = vec![0u8; folio.len()];
        accel::byn::decompress(&device, codec.as_ref(), &good, &mut out).unwrap();
        assert!(out == folio);

        let header = byn::header_len(n);
        // Truncated anywhere.
        for cut in (0..good.len()).step_by(97).chain(0..header + 2) {
            assert_eq!(
                accel::byn::decompress(&device, codec.as_ref(), &good[..cut], &mut out),
                Err(CodecError::Corrupt),
                "n={n} cut={cut}"
            );
        }
        // Every bit of the header flipped.
        for byte in 0..header {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                let r = accel::byn::decompress(&device, codec.as_ref(), &bad, &mut out);
                assert!(
                    r.is_err(),
                    "n={n}: flipping bit {bit} of header byte {byte} went unnoticed"
                );
            }
        }
        // Lying lengths: the frame asked to fill a buffer of another size.
        for len in [folio.len() - 1, folio.len() + 1, folio.len() / 2] {
            let mut other = vec![0u8; len];
            assert!(accel::byn::decompress(&device, codec.as_ref(), &good, &mut other).is_err());
        }
        // A segment length moved from one segment to its neighbour.
        if n > 1 {
            let mut bad = good.clone();
            let a = u32::from_le_bytes(bad[8..12].try_into().unwrap());
            let b = u32::from_le_bytes(bad[12..16].try_into().unwrap());
            if a & (1 << 31) == 0 && b & (1 << 31) == 0 {
                bad[8..12].copy_from_slice(&(a - 1).to_le_bytes());
                bad[12..16].copy_from_slice(&(b + 1).to_le_bytes());
                assert!(accel::byn::decompress(&device, codec.as_ref(), &bad, &mut out).is_err());
            }
        }
        // The wrong codec.
        let zstd = by_name("zstd").unwrap();
        assert!(accel::byn::decompress(&device, zstd.as_ref(), &good, &mut out).is_err());
    }
}

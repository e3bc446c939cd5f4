//! Our LZO1X and lzo-rle compressors on arbitrary input: the output must
//! decode back to the input, and any capacity short of it must be declined
//! (room is checked per instruction, and literals are copied in blocks that
//! may reach past them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use uswap::codec::lzo::{compress, decompress, LzoTable, Version};

fuzz_target!(|data: &[u8]| {
    let mut table = LzoTable::new();
    for version in [Version::Lzo1x, Version::Rle] {
        let mut stream = vec![0u8; data.len() + data.len() / 16 + 64];
        let n = compress(data, &mut stream, version, &mut table).expect("worst-case room");
        let mut out = vec![0u8; data.len()];
        decompress(&stream[..n], &mut out).expect("our own stream decodes");
        assert_eq!(out, data);
        let short = n - 1 - data.first().map_or(0, |&b| b as usize % 32).min(n - 1);
        let mut tight = vec![0u8; short];
        assert_eq!(compress(data, &mut tight, version, &mut table), None);
    }
});

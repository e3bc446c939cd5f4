//! Our LZO1X and lzo-rle compressors on arbitrary input: the output must
//! decode back to the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uswap::codec::lzo::{compress, decompress, LzoTable, Version};

fuzz_target!(|data: &[u8]| {
    for version in [Version::Lzo1x, Version::Rle] {
        let mut stream = vec![0u8; data.len() + data.len() / 16 + 64];
        let n = compress(data, &mut stream, version, &mut LzoTable::new()).expect("worst-case room");
        let mut out = vec![0u8; data.len()];
        decompress(&stream[..n], &mut out).expect("our own stream decodes");
        assert_eq!(out, data);
    }
});

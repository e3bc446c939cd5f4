//! Every decoder on arbitrary input: the first byte picks the codec, the
//! next two the output length. Decoders must return an error or exactly
//! the requested length, never panic or touch memory out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uswap::codec::{by_name, CODEC_NAMES};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let codec = by_name(CODEC_NAMES[data[0] as usize % CODEC_NAMES.len()]).unwrap();
    let len = u16::from_le_bytes([data[1], data[2]]) as usize;
    let mut out = vec![0u8; len];
    let _ = codec.decompress(&data[3..], &mut out);
});

//! The by_n frame parser and decoder on arbitrary frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uswap::accel::{byn, Device};
use uswap::codec::{by_name, CODEC_NAMES};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let codec = by_name(CODEC_NAMES[data[0] as usize % CODEC_NAMES.len()]).unwrap();
    let len = (u16::from_le_bytes([data[1], data[2]]) as usize) * 4;
    let mut out = vec![0u8; len];
    let device = Device::synchronous();
    let _ = byn::decompress(&device, codec.as_ref(), &data[3..], &mut out);
});

//! Value parsers shared by subcommands, so that a bad value is a usage error
//! (exit status 2) with a message that says what was expected.

use std::path::PathBuf;
use uswap::codec;
use uswap::size::parse_size;

/// A codec name as the kernel spells it, optionally `NAME:LEVEL`.
pub fn codec_name(s: &str) -> Result<String, String> {
    codec::by_name(s).map(|_| s.to_string()).map_err(|e| e.to_string())
}

/// A byte size such as `4k`, `64K`, `2M`.
pub fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A folio size: a power-of-two multiple of 4 KiB up to 2 MiB.
pub fn folio_size(s: &str) -> Result<usize, String> {
    let bytes = size(s)?;
    if bytes.is_power_of_two() && (4096..=2 << 20).contains(&bytes) {
        Ok(bytes as usize)
    } else {
        Err(format!("bad folio size {s:?}: expected a power of two from 4k to 2M"))
    }
}

/// A directory that exists.
pub fn existing_dir(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_dir() {
        Ok(p)
    } else {
        Err(format!("{s}: not a directory"))
    }
}

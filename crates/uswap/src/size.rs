//! Parsing of human sizes ("4k", "64K", "512M", "2G") used by every knob that
//! takes a byte count.

use std::fmt;

/// A size string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSize(pub String);

impl fmt::Display for BadSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad size {:?}: expected a number with an optional k, M, G or T suffix (powers of 1024)",
            self.0
        )
    }
}

impl std::error::Error for BadSize {}

/// Parses `"4096"`, `"64k"`, `"512M"`, `"2G"`, `"1T"` (suffixes are powers of
/// 1024, case-insensitive, an optional trailing `B` or `iB` is accepted).
pub fn parse_size(text: &str) -> Result<u64, BadSize> {
    let bad = || BadSize(text.to_string());
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 10),
        Some('m') => (&stripped[..stripped.len() - 1], 20),
        Some('g') => (&stripped[..stripped.len() - 1], 30),
        Some('t') => (&stripped[..stripped.len() - 1], 40),
        Some(c) if c.is_ascii_digit() => (stripped, 0),
        _ => return Err(bad()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let value: u64 = digits.parse().map_err(|_| bad())?;
    value.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// Formats a byte count the way the benchmarks label folio sizes: `4K`,
/// `64K`, `2M`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{}", bytes / unit, suffix);
        }
    }
    format!("{bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "k",
            "12x",
            "-4k",
            "1.5G",
            "99999999999999999999",
            "16777216T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_folio_labels() {
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(65536), "64K");
        assert_eq!(format_size(2 << 20), "2M");
        assert_eq!(format_size(1000), "1000");
    }
}

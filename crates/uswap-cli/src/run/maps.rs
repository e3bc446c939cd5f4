//! Which memory of a program `uswap run` manages, found in /proc/PID/maps:
//! private, writable, anonymous mappings (the brk heap, malloc arenas,
//! plain anonymous mmaps, JIT and GC heaps), trimmed to whole folios. Not
//! file mappings, shared memory, the main stack, the kernel's special
//! mappings, or the agent thread's own stack.

use std::io;

/// One line of /proc/PID/maps, as far as it matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub perms: String,
    pub inode: u64,
    pub path: String,
}

/// Parses one line (`start-end perms offset dev inode [path]`).
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.to_string();
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.collect::<Vec<_>>().join(" ");
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        perms,
        inode,
        path,
    })
}

/// Whether a mapping is memory `uswap run` manages.
pub fn is_managed_kind(m: &Mapping) -> bool {
    m.perms.starts_with("rw") && m.perms.ends_with('p') && m.inode == 0 && {
        let p = m.path.as_str();
        p.is_empty() || p == "[heap]" || p.starts_with("[anon:")
    }
}

/// The ranges of process `pid` to manage and not yet in `managed` (each
/// `(start, len)`), folio aligned, leaving out `exclude`.
pub fn unmanaged_ranges(
    pid: i32,
    folio: usize,
    managed: &[(usize, usize)],
    exclude: (usize, usize),
) -> io::Result<Vec<(usize, usize)>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut taken: Vec<(usize, usize)> = managed.iter().map(|&(s, l)| (s, s + l)).collect();
    taken.push(exclude);
    taken.sort_unstable();
    let mut out = Vec::new();
    for m in maps.lines().filter_map(parse_line).filter(is_managed_kind) {
        let mut at = m.start.next_multiple_of(folio);
        let end = m.end / folio * folio;
        for &(lo, hi) in &taken {
            if at >= end {
                break;
            }
            if hi <= at || lo >= end {
                continue;
            }
            let gap_end = (lo / folio * folio).min(end);
            if gap_end > at {
                out.push((at, gap_end - at));
            }
            at = at.max(hi.next_multiple_of(folio));
        }
        if end > at {
            out.push((at, end - at));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_private_writable_anonymous_memory_is_managed() {
        let lines = [
            (
                "5555d000-5557e000 rw-p 00000000 00:00 0                          [heap]",
                true,
            ),
            ("7f0000000000-7f0004000000 rw-p 00000000 00:00 0 ", true),
            (
                "7f0000000000-7f0004000000 rw-p 00000000 00:00 0   [anon: glibc: malloc arena]",
                true,
            ),
            (
                "7f0000000000-7f0004000000 rw-s 00000000 00:05 1234  /dev/zero (deleted)",
                false,
            ),
            ("7f0000000000-7f0004000000 r--p 00000000 00:00 0 ", false),
            ("7f0000000000-7f0004000000 ---p 00000000 00:00 0 ", false),
            (
                "7f1000000000-7f1000021000 rw-p 00002000 08:01 4242  /usr/lib/libc.so.6",
                false,
            ),
            (
                "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                  [stack]",
                false,
            ),
            (
                "7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0                  [vdso]",
                false,
            ),
        ];
        for (line, managed) in lines {
            let m = parse_line(line).expect(line);
            assert_eq!(is_managed_kind(&m), managed, "{line}");
        }
    }
}

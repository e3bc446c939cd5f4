//! Which memory of a program `uswap run` manages, found in /proc/PID/maps:
//! private, writable, anonymous mappings (the brk heap, malloc arenas,
//! plain anonymous mmaps, JIT and GC heaps), in whole folios with the
//! parts of folios at their ends (see [`ranges_to_manage`]). Not
//! file mappings, shared memory, the main stack, the kernel's special
//! mappings, the agent's own stack and beacon, or the zero-initialised data
//! (.bss) of shared libraries: the agent thread runs libc code, which reads
//! libc's own variables (`sendmsg` reads `__libc_single_threaded`), and a
//! fault there while the reclaimer waits for that thread to drop pages
//! would never be served. A library's .bss is the anonymous mapping that
//! directly follows its writable file mapping; it is small, so leaving it
//! resident costs little (one larger than [`MAX_LIBRARY_BSS`] is taken for
//! program memory that the kernel merged into it, and managed).

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

/// The largest anonymous mapping after a library's data still taken for
/// its .bss.
pub const MAX_LIBRARY_BSS: usize = 16 << 20;

/// Whether `m` is the .bss of the shared library whose mapping `prev` is
/// (the one just before it in /proc/PID/maps).
pub fn is_library_bss(prev: &Mapping, m: &Mapping) -> bool {
    let name = prev.path.rsplit('/').next().unwrap_or("");
    m.inode == 0
        && m.path.is_empty()
        && prev.end == m.start
        && prev.inode != 0
        && prev.perms.starts_with("rw")
        && (name.ends_with(".so") || name.contains(".so."))
        && m.end - m.start <= MAX_LIBRARY_BSS
}

/// Whether a mapping is memory `uswap run` manages.
pub fn is_managed_kind(m: &Mapping) -> bool {
    m.perms.starts_with("rw") && m.perms.ends_with('p') && m.inode == 0 && {
        let p = m.path.as_str();
        p.is_empty() || p == "[heap]" || p.starts_with("[anon:")
    }
}

/// The ranges of process `pid` to manage and not yet in `managed` (each
/// `(start, len)`; see [`ranges_to_manage`]).
pub fn unmanaged_ranges(
    pid: i32,
    folio: usize,
    managed: &[(usize, usize)],
    exclude: &[(usize, usize)],
) -> io::Result<Vec<(usize, usize)>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(ranges_to_manage(&maps, folio, managed, exclude))
}

/// The ranges to manage in `maps` (the text of /proc/PID/maps) and not yet
/// in `managed`, each `(start, len)`: whole, aligned folios, leaving out
/// the folios that touch any `(start, end)` of `exclude` or of `managed`.
/// A range that reaches the first or last whole folio of its mapping takes
/// the mapping's part of a folio beyond it too (a stray: registered, never
/// evicted), so that the mapping is registered whole. The kernel refuses
/// (EFAULT) an mremap over a mapping that is registered only in part, and
/// glibc's realloc moves large blocks with mremap.
pub fn ranges_to_manage(
    maps: &str,
    folio: usize,
    managed: &[(usize, usize)],
    exclude: &[(usize, usize)],
) -> Vec<(usize, usize)> {
    let mut taken: Vec<(usize, usize)> = managed.iter().map(|&(s, l)| (s, s + l)).collect();
    taken.extend_from_slice(exclude);
    taken.sort_unstable();
    let free = |lo: usize, hi: usize| taken.iter().all(|&(a, b)| b <= lo || hi <= a);
    let mut out = Vec::new();
    let mut prev: Option<Mapping> = None;
    for m in maps.lines().filter_map(parse_line) {
        let skip = !is_managed_kind(&m) || prev.as_ref().is_some_and(|p| is_library_bss(p, &m));
        prev = Some(m.clone());
        if skip {
            continue;
        }
        let first = m.start.next_multiple_of(folio);
        let last = m.end / folio * folio;
        let mut at = first;
        let mut ranges = Vec::new();
        for &(lo, hi) in &taken {
            if at >= last {
                break;
            }
            if hi <= at || lo >= last {
                continue;
            }
            let gap_end = (lo / folio * folio).min(last);
            if gap_end > at {
                ranges.push((at, gap_end));
            }
            at = at.max(hi.next_multiple_of(folio));
        }
        if last > at {
            ranges.push((at, last));
        }
        if let Some(r) = ranges
            .first_mut()
            .filter(|r| r.0 == first && free(m.start, first))
        {
            r.0 = m.start;
        }
        if let Some(r) = ranges
            .last_mut()
            .filter(|r| r.1 == last && free(last, m.end))
        {
            r.1 = m.end;
        }
        out.extend(ranges.into_iter().map(|(s, e)| (s, e - s)));
    }
    out
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

    #[test]
    fn a_librarys_bss_is_not_program_memory() {
        let data = parse_line(
            "7f1000000000-7f1000002000 rw-p 001d3000 08:01 4242  /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        let bss = parse_line("7f1000002000-7f100000f000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(is_library_bss(&data, &bss));
        let exe = parse_line("55550000-55551000 rw-p 00003000 08:01 77  /usr/bin/prog").unwrap();
        let exe_bss = parse_line("55551000-55552000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(
            !is_library_bss(&exe, &exe_bss),
            "the program's own .bss is managed"
        );
        let apart = parse_line("7f1000003000-7f100000f000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(!is_library_bss(&data, &apart), "not adjacent");
        let huge = parse_line("7f1000002000-7f1040002000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(
            !is_library_bss(&data, &huge),
            "program memory merged into it"
        );
    }

    #[test]
    fn a_mapping_is_registered_whole_with_the_parts_of_folios_at_its_ends() {
        const F: usize = 0x10000;
        let maps = "7f0000001000-7f0000041000 rw-p 00000000 00:00 0 \n\
                    7f0000100000-7f0000140000 rw-p 00000000 00:00 0 \n\
                    7f0000201000-7f0000210000 rw-p 00000000 00:00 0 \n";
        // The first holds three whole folios and a part of one at each
        // end; the second is aligned; the third holds no whole folio and
        // is left unregistered (whole, as the kernel then sees it).
        assert_eq!(
            ranges_to_manage(maps, F, &[], &[]),
            vec![(0x7f0000001000, 0x40000), (0x7f0000100000, 0x40000)]
        );
        // Already managed in its middle: the gaps each keep their end.
        let managed = [(0x7f0000020000, F)];
        assert_eq!(
            ranges_to_manage(maps, F, &managed, &[]),
            vec![
                (0x7f0000001000, 0x1f000),
                (0x7f0000030000, 0x11000),
                (0x7f0000100000, 0x40000)
            ]
        );
        // All its whole folios managed: nothing more, its ends included
        // (they were registered with the folios next to them).
        let managed = [(0x7f0000010000, 0x30000)];
        assert_eq!(ranges_to_manage(maps, F, &managed, &[]).len(), 1);
        // An end that touches excluded memory stays out.
        let exclude = [(0x7f0000040000, 0x7f0000041000)];
        assert_eq!(
            ranges_to_manage(maps, F, &[], &exclude)[0],
            (0x7f0000001000, 0x3f000)
        );
    }
}

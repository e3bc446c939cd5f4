//! Page corpora: dumps of real programs' anonymous memory, used by tests and
//! benchmarks.
//!
//! A corpus directory holds, per workload, `NAME.pages` (raw 4 KiB pages) and
//! `NAME.idx` (32 bytes per page, little endian: u64 virtual address, u64
//! kernel page flags, u64 pagemap entry, u32 pid, u32 mapping index). Pages
//! are in address order, so the index tells which runs of pages form whole
//! aligned folios.

use std::io;
use std::path::Path;

/// Bytes per page in a corpus.
pub use crate::page::PAGE_SIZE;
const RECORD_SIZE: usize = 32;

/// What the index says of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRecord {
    /// The page's virtual address in its process.
    pub vaddr: u64,
    /// The kernel's flags for the page (`/proc/kpageflags`) when it was
    /// captured.
    pub flags: u64,
    /// The page's `/proc/PID/pagemap` entry, with the frame number masked
    /// out.
    pub pagemap: u64,
    /// The process the page was taken from.
    pub pid: u32,
    /// Which mapping of that process the page lies in; pages of one folio
    /// share it.
    pub mapping: u32,
}

/// One program's pages.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The workload's name: its file names without `.pages` or `.idx`.
    pub name: String,
    /// The raw pages, 4096 bytes each, in address order.
    pub pages: Vec<u8>,
    /// One record per page, in the same order as `pages`.
    pub records: Vec<PageRecord>,
}

impl Workload {
    /// Pages in the workload.
    pub fn page_count(&self) -> usize {
        self.pages.len() / PAGE_SIZE
    }

    /// The bytes of page `i` (4096 of them). Panics if `i` is past the end.
    pub fn page(&self, i: usize) -> &[u8] {
        &self.pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    /// The page indices that start a whole folio of `folio_size` bytes: the
    /// first address aligned to the folio size, each next page 4096 higher,
    /// all in the same process and mapping. A 4 KiB folio is every page.
    pub fn folio_starts(&self, folio_size: usize) -> Vec<usize> {
        let pages = folio_size / PAGE_SIZE;
        if pages <= 1 {
            return (0..self.page_count()).collect();
        }
        let mut starts = Vec::new();
        let mut i = 0;
        while i + pages <= self.records.len() {
            let first = self.records[i];
            let whole = first.vaddr.is_multiple_of(folio_size as u64)
                && (1..pages).all(|k| {
                    let r = self.records[i + k];
                    r.vaddr == first.vaddr + (k * PAGE_SIZE) as u64
                        && r.pid == first.pid
                        && r.mapping == first.mapping
                });
            if whole {
                starts.push(i);
                i += pages;
            } else {
                i += 1;
            }
        }
        starts
    }

    /// The whole folios of `folio_size` bytes, as slices of the page data.
    pub fn folios(&self, folio_size: usize) -> Vec<&[u8]> {
        self.folio_starts(folio_size)
            .into_iter()
            .map(|i| &self.pages[i * PAGE_SIZE..i * PAGE_SIZE + folio_size])
            .collect()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Loads one workload from `dir/NAME.pages` and `dir/NAME.idx`.
pub fn load_workload(dir: &Path, name: &str) -> io::Result<Workload> {
    let pages_path = dir.join(format!("{name}.pages"));
    let idx_path = dir.join(format!("{name}.idx"));
    let pages = std::fs::read(&pages_path)?;
    let idx = std::fs::read(&idx_path)?;
    if pages.len() % PAGE_SIZE != 0 {
        return Err(invalid(format!(
            "{}: size is not a multiple of 4096",
            pages_path.display()
        )));
    }
    if idx.len() != pages.len() / PAGE_SIZE * RECORD_SIZE {
        return Err(invalid(format!(
            "{}: {} records for {} pages",
            idx_path.display(),
            idx.len() / RECORD_SIZE,
            pages.len() / PAGE_SIZE
        )));
    }
    let u64_at = |r: &[u8], o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |r: &[u8], o: usize| u32::from_le_bytes(r[o..o + 4].try_into().expect("4 bytes"));
    let records = idx
        .chunks_exact(RECORD_SIZE)
        .map(|r| PageRecord {
            vaddr: u64_at(r, 0),
            flags: u64_at(r, 8),
            pagemap: u64_at(r, 16),
            pid: u32_at(r, 24),
            mapping: u32_at(r, 28),
        })
        .collect();
    Ok(Workload {
        name: name.to_string(),
        pages,
        records,
    })
}

/// Loads every workload (`*.pages` with its `.idx`) in `dir`, sorted by name.
pub fn load_dir(dir: &Path) -> io::Result<Vec<Workload>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_suffix(".pages").map(str::to_string)
        })
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(invalid(format!("{}: no *.pages files", dir.display())));
    }
    names.iter().map(|n| load_workload(dir, n)).collect()
}

/// The project's own corpus directory (`corpus/` at the workspace root).
pub fn default_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../corpus")
}

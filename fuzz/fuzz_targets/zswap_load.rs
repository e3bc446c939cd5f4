//! The store's load path on corrupted pool bytes.
//!
//! Each run stores two folios of corpus pages in a `Zswap` (synchronous
//! device, no swap file), lets the input edit the stored object of one page
//! of the first folio (bytes and length), and loads both.
//!
//! Input: `[codec] [flags] [victim] [page selector; pages] [edit program]`.
//! `flags` bit 0: refresh the checksum after the edit; bits 1..: the folio's
//! order (1, 2 or 4 pages). The edit program is a list of instructions:
//! flip, set, truncate, insert, or replace everything with the rest.
//!
//! What must hold:
//! - checksum kept (what a corruption in the pool looks like): the load
//!   returns exactly the stored folio, or `Corrupt(victim)` counted as one
//!   `decompress_fail`, and only when the bytes did change. Never other
//!   bytes, never a panic.
//! - checksum refreshed (the damage gets past the checksum and reaches the
//!   decoder): the load agrees with the codec run alone on the edited bytes:
//!   the same page when it decodes, `Corrupt(victim)` when it does not; the
//!   other pages come back exact.
//! - after a failed load the folio is still stored, and once the original
//!   bytes are put back it loads exactly; the second folio always loads
//!   exactly; afterwards the store holds nothing (no leaked slot or object,
//!   the byte and page counters back to zero).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, LazyLock};
use uswap::accel::Device;
use uswap::codec::{same_filled, CODEC_NAMES};
use uswap::corpus;
use uswap::swap::FreeMode;
use uswap::zswap::{LoadError, PoolLimit, Zswap, ZswapConfig, PAGE_SIZE};

/// One store per codec, kept across runs (each run leaves it empty).
static STORES: LazyLock<Vec<Zswap>> = LazyLock::new(|| {
    CODEC_NAMES
        .iter()
        .map(|name| {
            let config = ZswapConfig {
                compressor: (*name).into(),
                max_pool: PoolLimit::Bytes(64 << 20),
                // Several clusters (512 slots each serve one folio order at a time).
                slots: 4096,
                free_mode: FreeMode::Immediate,
                writeback_worker: false,
                ..ZswapConfig::default()
            };
            Zswap::new(config, Arc::new(Device::synchronous()), None).unwrap()
        })
        .collect()
});

/// Pages to build folios from: a spread of corpus pages that shrink, and a
/// few made ones (a same-filled page is stored without the pool).
static PAGES: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    let mut pages: Vec<Vec<u8>> = Vec::new();
    for w in &workloads {
        pages.extend((0..w.page_count()).step_by(w.page_count() / 14).map(|i| w.page(i).to_vec()));
    }
    pages.push(vec![0; PAGE_SIZE]);
    pages.push((0..PAGE_SIZE).map(|i| i as u8).collect());
    let mut sparse = vec![0u8; PAGE_SIZE];
    sparse[100] = 1;
    sparse[4000] = 0xff;
    pages.push(sparse);
    pages
});

/// The edit program, read front to back.
struct Program<'a>(&'a [u8]);

impl<'a> Program<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.0.split_at_checked(n)?;
        self.0 = tail;
        Some(head)
    }

    fn at(&mut self, len: usize) -> Option<usize> {
        let b = self.take(2)?;
        Some(u16::from_le_bytes([b[0], b[1]]) as usize % len)
    }
}

/// Applies the edit program to a stored object.
fn apply(program: &[u8], bytes: &mut Vec<u8>) -> Option<()> {
    let mut p = Program(program);
    while let Some(&[op]) = p.take(1) {
        match op % 5 {
            0 => {
                let at = p.at(bytes.len().max(1))?;
                let v = p.take(1)?[0];
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= v;
                }
            }
            1 => {
                let at = p.at(bytes.len().max(1))?;
                let v = p.take(1)?[0];
                if let Some(b) = bytes.get_mut(at) {
                    *b = v;
                }
            }
            2 => {
                let len = p.at(bytes.len() + 1)?;
                bytes.truncate(len);
            }
            3 => {
                let at = p.at(bytes.len() + 1)?;
                let n = (p.take(1)?[0] as usize).min(p.0.len());
                let run = p.take(n)?;
                bytes.splice(at..at, run.iter().copied());
            }
            _ => {
                *bytes = p.0.to_vec();
                return Some(());
            }
        }
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let z = &STORES[data[0] as usize % CODEC_NAMES.len()];
    let refresh = data[1] & 1 != 0;
    let pages = 1usize << ((data[1] >> 1) % 3);
    let Some((selectors, program)) = data[3..].split_at_checked(pages) else { return };
    let folio: Vec<u8> = selectors.iter().flat_map(|&s| PAGES[s as usize % PAGES.len()].iter().copied()).collect();
    let neighbour: Vec<u8> = PAGES[0].iter().chain(&PAGES[PAGES.len() / 2]).copied().collect();

    let mut results = z.store_batch(&[&folio, &neighbour]).into_iter();
    let (range, other) = (results.next().unwrap(), results.next().unwrap());
    let other = other.expect("the neighbour folio stores");
    let Ok(range) = range else {
        // A page that does not shrink under this codec, with no swap file.
        let mut out = vec![0u8; neighbour.len()];
        z.load(other, &mut out).unwrap();
        assert!(out == neighbour);
        assert_eq!(z.slots_in_use(), 0);
        return;
    };
    let victim_page = data[2] as usize % pages;
    let victim = range.first + victim_page as u32;

    let (mut original, mut edited) = (Vec::new(), Vec::new());
    let applied = z.edit_stored_object(victim, refresh, |bytes| {
        original = bytes.clone();
        apply(program, bytes);
        edited = bytes.clone();
    });
    if !applied {
        assert!(
            original.is_empty() || edited.is_empty() || edited.len() > PAGE_SIZE,
            "an edit to {} bytes was refused",
            edited.len()
        );
    }
    let changed = applied && edited != original;
    let victim_same = same_filled(&folio[victim_page * PAGE_SIZE..][..PAGE_SIZE]).is_some();
    assert_eq!(victim_same, original.is_empty(), "only a same-filled page has no pool object");

    let fails_before = z.stats().decompress_fail;
    let mut out = vec![0u8; folio.len()];
    match z.load(range, &mut out) {
        Ok(()) if refresh && changed => {
            // The checksum was refreshed: the decoder alone decides.
            let mut alone = vec![0u8; PAGE_SIZE];
            z.codec().decompress(&edited, &mut alone).expect("the load decoded what the codec rejects");
            for (i, (got, want)) in out.chunks(PAGE_SIZE).zip(folio.chunks(PAGE_SIZE)).enumerate() {
                if i == victim_page {
                    assert!(got == alone, "the load and the codec decoded the same bytes differently");
                } else {
                    assert!(got == want, "page {i} changed; only page {victim_page} was edited");
                }
            }
        }
        Ok(()) => assert!(out == folio, "a load returned other bytes than were stored"),
        Err(e) => {
            assert_eq!(e, LoadError::Corrupt(victim), "a load failed for the wrong reason");
            assert!(changed, "the bytes are unchanged, yet the load failed");
            if refresh {
                let mut alone = vec![0u8; PAGE_SIZE];
                assert!(z.codec().decompress(&edited, &mut alone).is_err(), "the codec decodes what the load rejected");
            }
            assert_eq!(z.stats().decompress_fail, fails_before + 1, "a failed load is one decompress_fail");
            assert!(range.slots().all(|s| z.is_stored(s)), "a failed load dropped entries");
            // Put the stored bytes back (and with them the checksum): the
            // folio is intact again.
            assert!(z.edit_stored_object(victim, true, |bytes| *bytes = original.clone()));
            z.load(range, &mut out).expect("the restored folio loads");
            assert!(out == folio, "the restored folio loads other bytes");
        }
    }
    let mut out = vec![0u8; neighbour.len()];
    z.load(other, &mut out).expect("the neighbour folio loads");
    assert!(out == neighbour, "the neighbour folio changed");

    z.drain_slot_caches();
    assert_eq!(z.slots_in_use(), 0, "slots leaked");
    assert_eq!(z.pool().objects(), 0, "pool objects leaked");
    let stats = z.stats();
    assert_eq!((stats.stored_pages, stats.stored_bytes), (0, 0), "the pool counters drifted");
});

//! Letting go of a shared device while jobs are still queued on paused or
//! busy engines: every job still finishes with the result it should have,
//! the device's drop (run by whichever holder lets go last) returns, and no
//! engine thread outlives it.
//!
//! A device cannot be dropped while a batch or scope borrows it, so "in
//! flight" here means: the test's own handle goes while every other holder
//! has jobs queued on engines that are paused (so certainly not done) or
//! busy. The last holder then drops the device with engines still paused.
//!
//! Its own test binary, because it counts the process's engine threads; the
//! tests in it take turns for the same reason.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;
use uswap::accel::{live_engine_threads, Device, DeviceConfig, JobError, Mapping, Op};
use uswap::codec::{by_name, Codec, CodecError};

/// How long a whole scenario may take, the final drop included.
const DEADLINE: Duration = Duration::from_secs(20);

const ENGINES: usize = 3;
const HOLDERS: usize = 4;
const COMPRESS_JOBS: usize = 9;
/// Decompression jobs of input that is not a compressed stream, per holder.
const CORRUPT_JOBS: usize = 3;
const PAGE: usize = 4096;

/// Only one scenario at a time may count engine threads.
static ENGINE_COUNT: Mutex<()> = Mutex::new(());

/// Runs `scenario` on its own thread and fails if it has not finished
/// within [`DEADLINE`], so a drop that hangs fails the test instead of
/// hanging it.
fn within_deadline(scenario: impl FnOnce() + Send + 'static) {
    let _turn = ENGINE_COUNT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (finished, finished_rx) = mpsc::channel();
    let runner = thread::spawn(move || {
        scenario();
        finished.send(()).expect("the test thread waits for this");
    });
    match finished_rx.recv_timeout(DEADLINE) {
        Ok(()) => runner.join().expect("the scenario finished"),
        // The scenario panicked: report its panic.
        Err(RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(runner.join().unwrap_err())
        }
        Err(RecvTimeoutError::Timeout) => {
            panic!("not finished after {DEADLINE:?}: a drop or a wait hangs")
        }
    }
}

/// A compressible page that differs per holder and job.
fn page(holder: usize, job: usize) -> Vec<u8> {
    let line = format!("holder {holder} job {job}: the quick brown fox jumps over the lazy dog\n");
    line.bytes().cycle().take(PAGE).collect()
}

/// Checks that `result` and `out` are what compressing `page` must give.
fn assert_compressed(codec: &dyn Codec, page: &[u8], result: Result<usize, JobError>, out: &[u8]) {
    let n = result.expect("a compressible page compresses");
    let mut back = vec![0u8; PAGE];
    codec
        .decompress(&out[..n], &mut back)
        .expect("the output decompresses");
    assert!(back == page, "the output decompresses to a different page");
}

/// Holders share a device whose engines in `paused` take nothing from their
/// queues; each submits its jobs in a scope and reports how many are not
/// done, then waits for the test to drop its handle before waiting for them.
fn let_go_with_jobs_queued(codec_spec: &'static str, paused: &'static [usize]) {
    within_deadline(move || {
        assert_eq!(live_engine_threads(), 0, "no device is alive yet");
        let codec = by_name(codec_spec).unwrap();
        let device = Arc::new(
            Device::new(DeviceConfig {
                engines: ENGINES,
                mapping: Mapping::Global,
                caller_assist: false,
                verify: true,
                // Holders wait this long for a paused engine before taking
                // its jobs back.
                stall_timeout: Duration::from_millis(5),
                ..DeviceConfig::default()
            })
            .unwrap(),
        );
        assert_eq!(live_engine_threads(), ENGINES);
        for &engine in paused {
            device.pause_engine(engine, true);
        }
        let (not_done_tx, not_done_rx) = mpsc::channel();
        let handle_dropped = Arc::new(Barrier::new(HOLDERS + 1));
        let holders: Vec<_> = (0..HOLDERS)
            .map(|holder| {
                let (device, codec) = (device.clone(), codec.clone());
                let (not_done_tx, handle_dropped) = (not_done_tx.clone(), handle_dropped.clone());
                thread::spawn(move || {
                    let pages: Vec<Vec<u8>> =
                        (0..COMPRESS_JOBS).map(|job| page(holder, job)).collect();
                    let not_compressed = vec![0xffu8; 100];
                    let mut outs = vec![vec![0u8; PAGE]; COMPRESS_JOBS + CORRUPT_JOBS];
                    let (compressed, corrupt) = device.scope(|s| {
                        let mut outs = outs.iter_mut();
                        let mut tickets = Vec::new();
                        for page in &pages {
                            let out = outs.next().unwrap();
                            tickets.push(s.submit(codec.as_ref(), Op::Compress, page, out));
                        }
                        for out in outs {
                            tickets.push(s.submit(
                                codec.as_ref(),
                                Op::Decompress,
                                &not_compressed,
                                out,
                            ));
                        }
                        let not_done = tickets.iter().filter(|t| s.poll(t).is_none()).count();
                        not_done_tx.send(not_done).unwrap();
                        handle_dropped.wait();
                        let mut results = tickets.into_iter().map(|t| {
                            let (result, out) = s.wait(t);
                            (result, out.to_vec())
                        });
                        let compressed: Vec<_> = results.by_ref().take(COMPRESS_JOBS).collect();
                        (compressed, results.collect::<Vec<_>>())
                    });
                    for (page, (result, out)) in pages.iter().zip(&compressed) {
                        assert_compressed(codec.as_ref(), page, *result, out);
                    }
                    for (result, _) in &corrupt {
                        assert_eq!(*result, Err(JobError::Codec(CodecError::Corrupt)));
                    }
                    // The thread's handle goes here; the last one drops the
                    // device.
                })
            })
            .collect();

        let not_done: usize = not_done_rx.iter().take(HOLDERS).sum();
        // Global mapping deals jobs round-robin over the engines, so a
        // paused engine holds its share, untouched: no holder has started
        // waiting (which is what takes stalled jobs back).
        let submitted = HOLDERS * (COMPRESS_JOBS + CORRUPT_JOBS);
        assert!(
            not_done >= submitted * paused.len() / ENGINES,
            "{not_done} of {submitted} jobs not done with engines {paused:?} paused"
        );
        assert_eq!(Arc::strong_count(&device), HOLDERS + 1);
        drop(device);
        handle_dropped.wait();
        for holder in holders {
            if let Err(panic) = holder.join() {
                std::panic::resume_unwind(panic);
            }
        }
        assert_eq!(
            live_engine_threads(),
            0,
            "the last holder's drop stopped every engine"
        );
    });
}

#[test]
fn letting_go_with_jobs_queued_on_paused_engines() {
    let_go_with_jobs_queued("lz4", &[0, 1]);
}

#[test]
fn letting_go_with_jobs_queued_on_all_engines_paused() {
    let_go_with_jobs_queued("lz4", &[0, 1, 2]);
}

#[test]
fn letting_go_with_jobs_queued_on_busy_engines() {
    // A slow codec keeps the running engines busy when the handle goes.
    let_go_with_jobs_queued("zstd:19", &[]);
}

/// A holder that unwinds out of its scope with jobs still queued on a
/// paused engine finishes them before its handle goes; the device, dropped
/// with that engine still paused, stops every engine.
#[test]
fn a_holder_unwinding_with_jobs_queued_finishes_them() {
    within_deadline(|| {
        assert_eq!(live_engine_threads(), 0, "no device is alive yet");
        let codec = by_name("lz4").unwrap();
        let device = Arc::new(
            Device::new(DeviceConfig {
                engines: 1,
                caller_assist: false,
                stall_timeout: Duration::from_millis(5),
                ..DeviceConfig::default()
            })
            .unwrap(),
        );
        device.pause_engine(0, true);
        let holder = {
            let (device, codec) = (device.clone(), codec.clone());
            thread::spawn(move || {
                let pages: Vec<Vec<u8>> = (0..COMPRESS_JOBS).map(|job| page(0, job)).collect();
                let mut outs = vec![vec![0u8; PAGE]; COMPRESS_JOBS];
                device.scope(|s| {
                    for (page, out) in pages.iter().zip(outs.iter_mut()) {
                        let ticket = s.submit(codec.as_ref(), Op::Compress, page, out);
                        assert_eq!(s.poll(&ticket), None, "the only engine is paused");
                    }
                    panic!("holder gives up with its jobs queued");
                });
            })
        };
        let panic = holder.join().expect_err("the holder panicked");
        assert_eq!(
            panic.downcast_ref::<&str>(),
            Some(&"holder gives up with its jobs queued")
        );
        let stats = device.stats();
        assert_eq!(
            stats.total().compress_jobs,
            COMPRESS_JOBS as u64,
            "unwinding waited for every job"
        );
        assert_eq!(
            stats.engines[0].stall_recoveries, COMPRESS_JOBS as u64,
            "taken back from the paused engine"
        );
        assert_eq!(live_engine_threads(), 1);
        drop(device);
        assert_eq!(
            live_engine_threads(),
            0,
            "the drop stopped the paused engine"
        );
    });
}

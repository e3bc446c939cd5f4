//! The multi-engine device: batches give the same bytes as direct calls,
//! full queues fall back to software, verification catches a bad engine,
//! stalled engines are worked around.

use std::sync::Arc;
use std::time::Duration;
use uswap::accel::{Device, DeviceConfig, Job, JobError, Mapping, Op};
use uswap::codec::{by_name, Codec, CodecError};
use uswap::corpus;

fn corpus_pages(count: usize) -> Vec<Vec<u8>> {
    let workloads = corpus::load_dir(&corpus::default_dir()).unwrap();
    workloads
        .iter()
        .flat_map(|w| {
            (0..w.page_count())
                .map(|i| w.page(i).to_vec())
                .collect::<Vec<_>>()
        })
        .step_by(3)
        .take(count)
        .collect()
}

/// Compresses `pages` in batches on `device`; returns the compressed bytes
/// (or None for a page that did not shrink).
fn compress_all(device: &Device, codec: &dyn Codec, pages: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for chunk in pages.chunks(device.batch_size()) {
        let mut bufs: Vec<Vec<u8>> = chunk.iter().map(|p| vec![0u8; p.len()]).collect();
        let mut jobs: Vec<Job<'_>> = chunk
            .iter()
            .zip(bufs.iter_mut())
            .map(|(p, b)| Job::new(p, b))
            .collect();
        device.compress_batch(codec, &mut jobs);
        let results: Vec<_> = jobs
            .iter()
            .map(|j| j.result.expect("every job ran"))
            .collect();
        for (result, buf) in results.into_iter().zip(bufs) {
            out.push(match result {
                Ok(n) => Some(buf[..n].to_vec()),
                Err(JobError::Codec(CodecError::DoesNotFit)) => None,
                Err(e) => panic!("job failed: {e}"),
            });
        }
    }
    out
}

fn direct(codec: &dyn Codec, pages: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    pages
        .iter()
        .map(|p| {
            let mut buf = vec![0u8; p.len()];
            codec.compress(p, &mut buf).ok().map(|n| buf[..n].to_vec())
        })
        .collect()
}

#[test]
fn batches_equal_direct_calls_in_every_configuration() {
    let pages = corpus_pages(200);
    for name in ["lz4", "zstd", "lzo-rle"] {
        let codec = by_name(name).unwrap();
        let expected = direct(codec.as_ref(), &pages);
        for engines in [0, 1, 2, 3] {
            for mapping in [Mapping::Local, Mapping::Global] {
                for caller_assist in [false, true] {
                    for batch_size in [1, 8, 32] {
                        let device = Device::new(DeviceConfig {
                            engines,
                            mapping,
                            caller_assist,
                            batch_size,
                            ..DeviceConfig::default()
                        })
                        .unwrap();
                        let got = compress_all(&device, codec.as_ref(), &pages);
                        assert!(
                            got == expected,
                            "{name} engines={engines} {mapping:?} assist={caller_assist} batch={batch_size}"
                        );
                        let total = device.stats().total();
                        assert_eq!(total.compress_jobs, pages.len() as u64);
                        if engines > 0 && !caller_assist {
                            let by_engines: u64 =
                                device.stats().engines.iter().map(|e| e.compress_jobs).sum();
                            assert!(by_engines > 0, "engines did no work");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn decompress_batch_restores_pages() {
    let pages = corpus_pages(64);
    let codec = by_name("lz4").unwrap();
    let device = Device::new(DeviceConfig::with_engines(2)).unwrap();
    let compressed = compress_all(&device, codec.as_ref(), &pages);
    let stored: Vec<(&Vec<u8>, &Vec<u8>)> = pages
        .iter()
        .zip(&compressed)
        .filter_map(|(p, c)| c.as_ref().map(|c| (p, c)))
        .collect();
    let mut outs: Vec<Vec<u8>> = stored.iter().map(|(p, _)| vec![0u8; p.len()]).collect();
    let mut jobs: Vec<Job<'_>> = stored
        .iter()
        .zip(outs.iter_mut())
        .map(|((_, c), o)| Job::new(c, o))
        .collect();
    device.decompress_batch(codec.as_ref(), &mut jobs);
    assert!(jobs.iter().all(|j| j.result == Some(Ok(4096))));
    drop(jobs);
    for ((page, _), out) in stored.iter().zip(&outs) {
        assert!(*page == out);
    }
}

#[test]
fn full_queues_fall_back_to_software_and_stalled_jobs_are_recovered() {
    let pages = corpus_pages(16);
    let codec = by_name("lz4").unwrap();
    let expected = direct(codec.as_ref(), &pages);
    for caller_assist in [false, true] {
        let device = Device::new(DeviceConfig {
            engines: 2,
            queue_depth: 1,
            batch_size: 16,
            caller_assist,
            submit_retries: 4,
            stall_timeout: Duration::from_millis(20),
            ..DeviceConfig::default()
        })
        .unwrap();
        device.pause_engine(0, true);
        device.pause_engine(1, true);
        let got = compress_all(&device, codec.as_ref(), &pages);
        assert!(got == expected);
        let stats = device.stats();
        let fallbacks: u64 = stats.engines.iter().map(|e| e.sw_fallbacks).sum();
        let retries: u64 = stats.engines.iter().map(|e| e.queue_full_retries).sum();
        let recovered: u64 = stats.engines.iter().map(|e| e.stall_recoveries).sum();
        assert_eq!(
            fallbacks, 14,
            "2 jobs fit the two 1-deep queues, 14 fall back"
        );
        assert_eq!(retries, 14 * 4);
        assert_eq!(
            recovered, 2,
            "the two queued entries were taken back from the stalled engines"
        );
        assert_eq!(
            stats.engines.iter().map(|e| e.compress_jobs).sum::<u64>(),
            0
        );
        device.pause_engine(0, false);
        device.pause_engine(1, false);
        assert!(compress_all(&device, codec.as_ref(), &pages) == expected);
    }
}

#[test]
fn verify_catches_a_corrupted_result() {
    let pages = corpus_pages(8);
    let codec = by_name("lz4").unwrap();
    for engines in [0, 2] {
        let device = Device::new(DeviceConfig {
            engines,
            verify: true,
            ..DeviceConfig::default()
        })
        .unwrap();
        device.inject_corruption(1);
        let mut bufs: Vec<Vec<u8>> = pages.iter().map(|p| vec![0u8; p.len()]).collect();
        let mut jobs: Vec<Job<'_>> = pages
            .iter()
            .zip(bufs.iter_mut())
            .map(|(p, b)| Job::new(p, b))
            .collect();
        device.compress_batch(codec.as_ref(), &mut jobs);
        let failed = jobs
            .iter()
            .filter(|j| j.result == Some(Err(JobError::VerifyFailed)))
            .count();
        assert_eq!(failed, 1, "engines={engines}");
        assert_eq!(device.stats().total().verify_failures, 1);
    }
    // Without verify the same corruption reaches the caller: verification is
    // what caught it above.
    let device = Device::new(DeviceConfig::with_engines(0)).unwrap();
    device.inject_corruption(1);
    let mut buf = vec![0u8; 4096];
    let n = device
        .run_one(codec.as_ref(), Op::Compress, &pages[0], &mut buf)
        .unwrap();
    let mut out = vec![0u8; 4096];
    let decoded = codec.decompress(&buf[..n], &mut out);
    assert!(decoded.is_err() || out != pages[0]);
}

#[test]
fn scope_submit_poll_wait() {
    let pages = corpus_pages(12);
    let codec = by_name("zstd").unwrap();
    let expected = direct(codec.as_ref(), &pages);
    for engines in [0, 2] {
        let device = Device::new(DeviceConfig::with_engines(engines)).unwrap();
        let results = compress_in_scope(&device, codec.as_ref(), &pages, || {});
        assert_eq!(results, expected);
    }
}

/// Compresses `pages` in one scope (submit all, then wait for each in
/// turn), running `then` once every wait has returned, inside the scope.
fn compress_in_scope(
    device: &Device,
    codec: &dyn Codec,
    pages: &[Vec<u8>],
    then: impl FnOnce(),
) -> Vec<Option<Vec<u8>>> {
    let mut bufs: Vec<Vec<u8>> = pages.iter().map(|p| vec![0u8; p.len()]).collect();
    device.scope(|s| {
        let tickets: Vec<_> = pages
            .iter()
            .zip(bufs.iter_mut())
            .map(|(p, b)| s.submit(codec, Op::Compress, p, b))
            .collect();
        let results = tickets
            .into_iter()
            .map(|t| {
                let (r, out) = s.wait(t);
                r.ok().map(|n| out[..n].to_vec())
            })
            .collect();
        then();
        results
    })
}

/// A job that no engine has begun once the caller's poll is over (the
/// engines are busy elsewhere; here, paused) is run by the caller itself.
/// It had nothing to sleep on, so the caller spun, taking the CPU from the
/// very engines it waited for, until the stall timeout: with no poll at
/// all, a usemem run took 164 s instead of 9.
#[test]
fn a_job_still_queued_after_the_poll_is_run_by_its_caller() {
    let pages = corpus_pages(6);
    let codec = by_name("lz4").unwrap();
    let expected = direct(codec.as_ref(), &pages);
    let device = Device::new(DeviceConfig {
        engines: 2,
        wait_poll: Duration::ZERO,
        stall_timeout: Duration::from_secs(10),
        ..DeviceConfig::default()
    })
    .unwrap();
    device.pause_engine(0, true);
    device.pause_engine(1, true);
    let results = compress_in_scope(&device, codec.as_ref(), &pages, || {
        // Every job is done, and none by a stall recovery.
        let stats = device.stats();
        let recovered: u64 = stats.engines.iter().map(|e| e.stall_recoveries).sum();
        assert_eq!(recovered, 0, "the caller waited for the stall timeout");
        assert_eq!(stats.caller.compress_jobs, pages.len() as u64);
        // The engines let go of their queue entries, so the scope can end.
        device.pause_engine(0, false);
        device.pause_engine(1, false);
    });
    assert_eq!(results, expected);
}

#[test]
fn poll_reports_progress_without_blocking() {
    let codec = by_name("lz4").unwrap();
    let device = Device::new(DeviceConfig {
        engines: 1,
        caller_assist: false,
        ..DeviceConfig::default()
    })
    .unwrap();
    device.pause_engine(0, true);
    let page = corpus_pages(1).remove(0);
    let mut buf = vec![0u8; 4096];
    device.scope(|s| {
        let t = s.submit(codec.as_ref(), Op::Compress, &page, &mut buf);
        assert_eq!(s.poll(&t), None, "a paused engine has not run the job");
        device.pause_engine(0, false);
        while s.poll(&t).is_none() {
            std::thread::yield_now();
        }
        let polled = s.poll(&t);
        let (r, out) = s.wait(t);
        assert_eq!(polled, Some(r));
        let n = r.unwrap();
        let mut back = vec![0u8; 4096];
        codec.decompress(&out[..n], &mut back).unwrap();
        assert!(back == page);
    });
}

#[test]
fn concurrent_callers_share_a_device() {
    let pages = Arc::new(corpus_pages(300));
    let codec = by_name("lz4").unwrap();
    let expected = Arc::new(direct(codec.as_ref(), &pages));
    let device = Arc::new(Device::new(DeviceConfig::with_engines(2)).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (device, pages, expected, codec) = (
                device.clone(),
                pages.clone(),
                expected.clone(),
                codec.clone(),
            );
            std::thread::spawn(move || {
                for _ in 0..5 {
                    assert!(compress_all(&device, codec.as_ref(), &pages) == *expected);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// The CPUs thread `tid` of this process may run on, as the kernel lists
/// them (`Cpus_allowed_list`); None once the thread has ended.
fn allowed_cpus(tid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("a Cpus_allowed_list line");
    Some(list.trim().to_string())
}

/// The engine threads of this process now, with the CPUs each may run on.
fn engine_threads() -> Vec<(String, String)> {
    let mut engines = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let tid = task.unwrap().file_name().into_string().unwrap();
        let Ok(comm) = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")) else {
            continue; // the thread has ended
        };
        if comm.starts_with("uswap-engine-") {
            if let Some(cpus) = allowed_cpus(&tid) {
                engines.push((tid, cpus));
            }
        }
    }
    engines
}

/// Engines are not pinned by default: one pinned to a CPU that another
/// process keeps busy cannot move away, and every batch waits for that
/// process's time slices (see `DeviceConfig::pin`).
#[test]
fn engines_may_run_on_every_cpu_the_process_may() {
    let device = Device::new(DeviceConfig::with_engines(2)).unwrap();
    let process = allowed_cpus(&std::process::id().to_string()).unwrap();
    // A new thread takes its name as it starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut engines = engine_threads();
    while engines.len() < 2 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
        engines = engine_threads();
    }
    assert!(engines.len() >= 2, "engine threads found: {engines:?}");
    for (tid, cpus) in engines {
        assert_eq!(cpus, process, "engine thread {tid}");
    }
    drop(device);
}

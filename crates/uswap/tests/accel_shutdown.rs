//! Dropping a device while callers still have jobs in flight neither hangs
//! nor leaks engine threads. (Its own test binary: it counts the process's
//! engine threads.)

use std::sync::Arc;
use std::time::Duration;
use uswap::accel::{live_engine_threads, Device, DeviceConfig, Job};
use uswap::codec::by_name;

#[test]
fn dropping_the_device_with_jobs_in_flight_stops_every_engine() {
    assert_eq!(live_engine_threads(), 0);
    let codec = by_name("zstd").unwrap();
    let page: Vec<u8> = (0..512u64).flat_map(|i| (i * 7).to_le_bytes()).collect();
    for round in 0..20 {
        let device = Arc::new(
            Device::new(DeviceConfig {
                engines: 3,
                stall_timeout: Duration::from_millis(2),
                ..DeviceConfig::default()
            })
            .unwrap(),
        );
        assert_eq!(live_engine_threads(), 3);
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (device, codec, page) = (device.clone(), codec.clone(), page.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let mut bufs = vec![vec![0u8; 4096]; 8];
                        let mut jobs: Vec<Job<'_>> = bufs.iter_mut().map(|b| Job::new(&page, b)).collect();
                        device.compress_batch(codec.as_ref(), &mut jobs);
                        assert!(jobs.iter().all(|j| matches!(j.result, Some(Ok(_)))));
                    }
                })
            })
            .collect();
        if round % 2 == 0 {
            device.pause_engine(round % 3, true);
        }
        // The last holder (main or a worker) runs the device's drop.
        drop(device);
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(live_engine_threads(), 0, "round {round}");
    }
    // A device whose engine is paused when it is dropped still stops.
    let device = Device::new(DeviceConfig::with_engines(2)).unwrap();
    device.pause_engine(1, true);
    drop(device);
    assert_eq!(live_engine_threads(), 0);
}

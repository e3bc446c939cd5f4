//! The start-up probe of batching: both ways are timed on the same pages.

use uswap::accel::probe;
use uswap::codec::by_name;

#[test]
fn the_probe_times_a_batch_both_ways() {
    let codec = by_name("lz4").unwrap();
    for engines in [0, 2] {
        let p = probe::batching(engines, codec.as_ref(), 64).unwrap();
        assert!(
            p.sequential.as_nanos() > 0 && p.batched.as_nanos() > 0,
            "{p:?}"
        );
        assert!(p.ratio().is_finite() && p.ratio() > 0.0, "{p:?}");
        eprintln!("{engines} engines: {p:?} ratio {:.2}", p.ratio());
    }
}

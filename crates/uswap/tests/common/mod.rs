//! Helpers shared by the runtime's test files.
#![allow(dead_code)]

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};
use uswap::mm::{BatchSize, Region, Runtime, RuntimeConfig};

pub const MIB: usize = 1 << 20;

/// A runtime with a 64 MiB pool and, if asked, a swap file.
pub fn runtime(high: usize, folio: usize, batch: usize, swap_file: bool) -> Runtime {
    Runtime::new(RuntimeConfig {
        memory_high: high,
        folio_size: folio,
        compress_batchsize: BatchSize::Fixed(batch),
        swap_file: swap_file.then(|| (std::env::temp_dir(), 256 << 20)),
        max_pool_bytes: Some(64 << 20),
        ..RuntimeConfig::default()
    })
    .expect("userfaultfd runtime")
}

/// Words of memory, read and written through a raw pointer shared by
/// threads.
#[derive(Clone, Copy)]
pub struct Words {
    pub base: usize,
    pub count: usize,
}

impl Words {
    pub fn of(region: &Region) -> Words {
        Words {
            base: region.as_ptr() as usize,
            count: region.len() / 8,
        }
    }

    pub fn read(self, i: usize) -> u64 {
        assert!(i < self.count);
        // SAFETY: `i` is inside the memory, which outlives every user of
        // this view; word accesses are aligned.
        unsafe { std::ptr::read_volatile((self.base as *const u64).add(i)) }
    }

    pub fn write(self, i: usize, v: u64) {
        assert!(i < self.count);
        // SAFETY: as in `read`.
        unsafe { std::ptr::write_volatile((self.base as *mut u64).add(i), v) }
    }
}

/// Polls `condition` until it holds or ten seconds pass.
pub fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::yield_now();
    }
    condition()
}

/// Asks the reclaimer to bring resident memory down to the limit it works
/// to (`memory_high`, plus what cannot go as it is), and
/// waits (at most ten seconds) until it has.
pub fn evict_to_limit(rt: &Runtime) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // The limit reclaim works to leaves out what cannot go as it is
    // (`unfit_bytes`).
    let over = || {
        let stats = rt.stats();
        stats.resident_bytes > rt.memory_high() as u64 + stats.unfit_bytes
    };
    while over() && Instant::now() < deadline {
        rt.reclaim_now();
        std::thread::yield_now();
    }
}

/// Fills the region with a pattern (word i holds i ^ 0x5555) and pushes
/// most of it out.
pub fn fill_and_evict(rt: &Runtime, region: &Region) {
    let w = Words::of(region);
    for i in 0..w.count {
        w.write(i, i as u64 ^ 0x5555);
    }
    evict_to_limit(rt);
}

/// Runs the test `name` of the current test binary again in a child
/// process with `USWAP_TEST_CHILD` set, and returns how it ended: exit
/// code, or the signal that killed it. Fails if it runs past `limit`.
///
/// The child's standard output comes through this test's, each line
/// marked: its harness's summary line would otherwise be counted as a
/// second test result (`.ci/run` sums those lines). Fails too if the
/// child's harness found no test of that name (it would pass, having run
/// nothing).
pub fn in_child_process(name: &str, limit: Duration) -> (Option<i32>, Option<i32>) {
    if std::env::var("USWAP_TEST_CHILD").is_ok() {
        panic!("in_child_process called from the child");
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("USWAP_TEST_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    // What the child's output shows: that its harness found the test (it
    // says so before it runs it), and that the output is over. Over when it
    // closes: at the child's exit (unless a process it forked still holds
    // it), or at its kill below. A send fails only once nobody waits.
    enum Seen {
        Ran,
        End,
    }
    let (seen, sight) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            match line {
                Ok(line) => {
                    if line == "running 1 test" {
                        let _ = seen.send(Seen::Ran);
                    }
                    println!("[child process] {line}");
                }
                Err(e) => println!("[child process] output unreadable: {e}"),
            }
        }
        let _ = seen.send(Seen::End);
    });
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut ran = false;
            while let Ok(s) = sight.recv_timeout(Duration::from_secs(5)) {
                match s {
                    Seen::Ran => ran = true,
                    Seen::End => break,
                }
            }
            assert!(ran, "{name}: the child process found no test of that name");
            return (status.code(), status.signal());
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{name}: the child process did not finish within {limit:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The name of the test function it is used in, as the test harness
/// knows it (for [`in_own_process`]).
#[allow(unused_macros)]
macro_rules! this_test {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let path = path.strip_suffix("::here").expect("a function's path");
        path.rsplit("::").next().expect("a test's name")
    }};
}
#[allow(unused_imports)]
pub(crate) use this_test;

/// Runs `body` as the test `name` in a process of its own (see
/// [`in_child_process`]), away from the other tests, which share one
/// address space:
///
/// - a test that forks: every other test's runtime would get the fork's
///   event and copy its memory into the child, and the fork would wait in
///   the kernel, holding glibc's malloc locks, for a runtime whose event
///   thread another test holds (fault injection) while that test waits for
///   malloc;
/// - a test that unmaps memory and maps new memory at the same address:
///   a thread another test starts meanwhile may get its signal stack mapped
///   in the hole.
///
/// Fails if the body fails or runs past `limit`.
pub fn in_own_process(name: &str, limit: Duration, body: impl FnOnce()) {
    if is_child_process() {
        body();
        return;
    }
    let (code, signal) = in_child_process(name, limit);
    assert_eq!(
        (code, signal),
        (Some(0), None),
        "{name}, in its own process"
    );
}

/// Whether this process is the child of [`in_child_process`].
pub fn is_child_process() -> bool {
    std::env::var("USWAP_TEST_CHILD").is_ok()
}

/// Runs `body` on a thread and fails the test if it does not finish within
/// `limit` (a hang), passing on its panic otherwise.
pub fn within<T: Send + 'static>(limit: Duration, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = body();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("did not finish within {limit:?}: a hang")
        }
    }
}

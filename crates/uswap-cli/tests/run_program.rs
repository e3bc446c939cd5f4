//! `uswap run` on real programs: C programs built here with the system
//! compiler, and python3, sqlite3 and node on scripts, run with and without
//! uswap.

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const USWAP: &str = env!("CARGO_BIN_EXE_uswap");

/// This test process's own directory (under cargo's target/tmp, so that
/// `cargo clean` takes it): the programs it builds and the statistics
/// files of its runs. Those of earlier test processes that are gone are
/// removed when it is made.
fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let prefix = "run_program-";
        for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let pid = name.to_str().and_then(|n| n.strip_prefix(prefix));
            if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
                // Another test process may be removing it too.
                if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        eprintln!("removing {}: {e}", entry.path().display());
                    }
                }
            }
        }
        let dir = root.join(format!("{prefix}{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

/// Compiles tests/programs/NAME.c into this process's directory, once:
/// tests that run the same program at the same time share one build rather
/// than each write the file another may be starting.
fn build(name: &str) -> PathBuf {
    build_with(name, &[])
}

/// [`build`], with more flags for the compiler (`-static`): the build is
/// named after the program and its flags.
fn build_with(name: &str, flags: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let key = std::iter::once(name)
        .chain(flags.iter().copied())
        .collect::<Vec<_>>()
        .join("");
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, exe)) = built.iter().find(|(k, _)| *k == key) {
        return exe.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let exe = scratch_dir().join(&key);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-Wall", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc}: {e}"));
    assert!(
        status.success(),
        "compiling {} with {flags:?}",
        src.display()
    );
    built.push((key, exe.clone()));
    exe
}

/// Waits for `child`, failing the test past `limit` (a hang).
fn wait_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("did not finish within {limit:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn run(cmd: &mut Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_within(child, Duration::from_secs(240))
}

fn counters(path: &Path) -> std::collections::HashMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Runs `exe ARGS` under `uswap run FLAGS`, fails the test unless it
/// exits 0 with `ok` as its last line (`what` names the run in the
/// message), and returns the run's counters.
fn run_to_ok(
    exe: &Path,
    flags: &[&str],
    args: &[&str],
    ok: &str,
    what: &str,
) -> std::collections::HashMap<String, u64> {
    let stats = exe.with_extension("stats");
    let out = run(Command::new(USWAP)
        .arg("run")
        .args(flags)
        .arg("--stats-file")
        .arg(&stats)
        .arg("--")
        .arg(exe)
        .args(args));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && stdout.ends_with(&format!("{ok}\n")),
        "{what}: {:?}: {stdout}{}",
        out.status,
        text(&out.stderr)
    );
    counters(&stats)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The acceptance test: malloc, calloc, realloc and free of small
/// and huge blocks, mmap/munmap/mremap/mprotect, threads, fork (the child
/// checks and changes its copy), exec; under a quarter of its working set
/// (about 220 MiB), the same output as without uswap, and swapping really
/// happened.
#[test]
fn a_program_under_a_quarter_of_its_working_set_prints_what_it_prints_alone() {
    let c = memtest_as_alone(&[]);
    assert!(c["forks"] > 0, "the fork was not served: {c:?}");
    // Its agent moves stored pages out (no REMOVE event to tell from the
    // program's own MADV_DONTNEED); only pages that cannot move, such as
    // those the forked child still shares, are dropped in place.
    assert!(c["discarded_by_move"] > 0, "{c:?}");
}

/// Found in review: a process in a pid namespace of its own (a sandbox, a
/// container, `unshare -p`) says its pid as it sees it, and the supervisor
/// read /proc and the memory of whichever process has that number in its
/// own namespace: process 1, refused ("cannot be managed"), or another
/// process of the run, whose bytes would have been stored for this one's.
/// The supervisor now takes the pid the kernel gives for the connection.
#[test]
fn a_program_in_a_pid_namespace_of_its_own_prints_what_it_prints_alone() {
    memtest_as_alone(&["unshare", "--pid", "--fork"]);
}

/// Runs memtest alone, then under `uswap run` (through `launcher`, if any)
/// with about a quarter of its working set (56M): the same output, and
/// pages stored and loaded. Returns the run's counters.
fn memtest_as_alone(launcher: &[&str]) -> std::collections::HashMap<String, u64> {
    let exe = build("memtest");
    let alone = run(&mut Command::new(&exe));
    assert!(alone.status.success());
    let alone = text(&alone.stdout);
    assert!(alone.contains("parent before fork: ok=1"), "{alone}");
    assert!(alone.contains("done"), "{alone}");
    let stats = exe.with_extension(format!("stats{}", launcher.len()));
    let managed = run(Command::new(USWAP)
        .args(["run", "--memory-high", "56M", "--stats-file"])
        .arg(&stats)
        .arg("--")
        .args(launcher)
        .arg(&exe));
    assert!(
        managed.status.success(),
        "{:?}: {}",
        managed.status,
        text(&managed.stderr)
    );
    assert_eq!(text(&managed.stdout), alone);
    let c = counters(&stats);
    assert!(c["zswpout"] > 0 && c["zswpin"] > 0, "{c:?}");
    c
}

fn status_of(args: &[&str]) -> (ExitStatus, String) {
    let out = run(Command::new(USWAP).args(args));
    (out.status, text(&out.stderr))
}

/// A shell that forks and execs short-lived commands: the supervisor says
/// nothing (children that exec or exit while being adopted are routine),
/// and the output is the shell's.
#[test]
fn a_shell_running_many_short_commands_prints_only_its_own_output() {
    let out = run(Command::new(USWAP).args([
        "run",
        "--memory-high",
        "32M",
        "--",
        "sh",
        "-c",
        "n=0; for i in $(seq 60); do /bin/true; n=$(expr $n + $(echo 1)); done; echo $n",
    ]));
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "60\n");
    assert_eq!(text(&out.stderr), "");
}

/// A program that calls mlockall at start-up runs to the end: the kernel
/// populates every mapping then, and the agent's scratch was registered for
/// missing-page faults on a descriptor nobody reads, so mlockall waited for
/// ever. Its locked memory leaves reclaim once a move of it is refused
/// (it was stored and refused again at every pass), until it is written,
/// and is never dropped in place.
#[test]
fn a_program_that_locks_its_memory_runs_to_the_end() {
    let exe = build("mlocked");
    let stats = exe.with_extension("stats");
    let child = Command::new(USWAP)
        .args(["run", "--memory-high", "32M", "--stats-file"])
        .arg(&stats)
        .arg("--")
        .arg(&exe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(child, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.ends_with("bad 0\n"), "{stdout}");
    let c = counters(&stats);
    if stdout.starts_with("locked 1") {
        // Each locked folio is refused once, then left alone until
        // written.
        assert!(c["unmovable_folios"] > 0, "{c:?}");
        assert_eq!(c["discarded_in_place"], 0, "{c:?}");
        assert_eq!(c["eviction_drop_failed"], 0, "{c:?}");
        // Memory mapped after mlockall(MCL_CURRENT) is not locked: it
        // leaves by a move, although the agent's scratch was locked with
        // everything else.
        assert!(c["discarded_by_move"] > 0, "{c:?}");
        assert!(
            !text(&out.stderr).contains("scratch"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// A forked child that closes every descriptor it did not open and opens
/// its own goes on working under the limit: the agent neither takes that
/// for its supervisor dying (it killed the child) nor uses the program's
/// descriptors.
#[test]
fn a_child_that_closes_all_descriptors_keeps_working() {
    let exe = build("closefds");
    let out = run(Command::new(USWAP)
        .args(["run", "--memory-high", "32M", "--"])
        .arg(&exe));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "child ok\nchild exit 0\n",
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_programs_exit_status_and_death_by_signal_pass_through() {
    let (s, _) = status_of(&["run", "--memory-high", "64M", "--", "sh", "-c", "exit 7"]);
    assert_eq!(s.code(), Some(7));
    let (s, _) = status_of(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(s.signal(), Some(libc::SIGTERM), "{s:?}");
}

/// The kernel reads and writes a program's memory for it, most of it
/// stored (`programs/kernelio.c`): write() from it, read() into it at
/// unaligned places, O_DIRECT reads into it, another process's
/// process_vm_readv. Each faults the memory in through the kernel, not
/// through the program's own touch, and each must read and leave exactly
/// the program's bytes. /proc/PID/mem reads of stored pages fail with EIO
/// (the kernel does not wait for a userfaultfd on a remote access: README,
/// Known issues); they may fail, never give wrong bytes.
#[test]
fn the_kernel_reading_and_writing_stored_memory_for_a_program_moves_its_bytes() {
    let exe = build("kernelio");
    let dir = scratch_dir().to_str().unwrap().to_string();
    for folio in ["4k", "64k"] {
        let c = run_to_ok(
            &exe,
            &["--memory-high", "16M", "--folio-size", folio],
            &["64", &dir],
            "kernelio ok",
            folio,
        );
        assert!(c["evicted_folios"] > 0 && c["zswpin"] > 0, "{folio}: {c:?}");
    }
}

/// An O_DIRECT read into memory the reclaimer is taking keeps the bytes
/// read (`programs/kernelio.c` with a third argument). The read pins its
/// pages while the disk writes them, with no write-protect fault: one
/// pinned before the reclaimer write-protected and copied it, written
/// after the copy, and unpinned by the time it moved out was stored with
/// its old bytes. The agent now checks what it moved against the copy and
/// puts back what differs. Before, it failed in about half the runs: 2 of
/// 4 under the test harness, 16 and 26 pages read wrong (`kernelio 64 DIR
/// 20` alone: 22 and 38 pages in two of three runs; with buffered reads,
/// which do not pin, 0 in three); after, 0 pages wrong in 5 runs, 64 and
/// 96 pages put back (`discard_refused_changed`) in two of them.
#[test]
fn an_o_direct_read_into_memory_being_evicted_keeps_the_bytes_read() {
    let exe = build("kernelio");
    let dir = scratch_dir().to_str().unwrap().to_string();
    run_to_ok(
        &exe,
        &["--memory-high", "16M", "--folio-size", "4k"],
        &["64", &dir, "20"],
        "kernelio ok",
        "O_DIRECT under reclaim",
    );
}

/// A program that does not load the agent (statically linked, so it
/// ignores LD_PRELOAD, as a Go binary does) runs as it would alone, but
/// none of its memory is managed: `uswap run` says so when it ends,
/// rather than pass for a run held to the limit (it said nothing). The
/// same program linked dynamically is managed, and nothing is said.
#[test]
fn a_program_that_does_not_load_the_agent_is_said_to_be_unmanaged() {
    let unmanaged = "none of its memory was managed";
    for (flags, managed) in [(&["-static"][..], false), (&[][..], true)] {
        let exe = build_with("fillsum", flags);
        let stats = exe.with_extension("stats");
        let out = run(Command::new(USWAP)
            .args(["run", "--memory-high", "16M", "--stats-file"])
            .arg(&stats)
            .arg("--")
            .arg(&exe)
            .arg("64"));
        let alone = run(Command::new(&exe).arg("64"));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{flags:?}: {:?} {stderr}", out.status);
        assert_eq!(stdout, text(&alone.stdout), "{flags:?}");
        assert_eq!(stderr.contains(unmanaged), !managed, "{flags:?}: {stderr}");
        assert_eq!(counters(&stats)["evicted_folios"] > 0, managed, "{flags:?}");
    }
}

/// A program that dies with a core dump (`programs/coredump.c` aborts)
/// keeps its core: `uswap run`, dying the same way after it, dumped a core
/// of its own, which took the program's place where the kernel writes
/// cores to one file name in the working directory (`core`, the kernel's
/// default) and came beside it as a second crash otherwise. Its death
/// still passes through, without a core of its own.
#[test]
fn a_program_that_dumps_core_keeps_its_core_and_uswap_adds_none() {
    let exe = build("coredump");
    let dir = scratch_dir().join("cores");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new(USWAP);
    cmd.args(["run", "--memory-high", "16M", "--"])
        .arg(&exe)
        .arg("64")
        .current_dir(&dir);
    // SAFETY: getrlimit and setrlimit are async-signal-safe and touch only
    // the child's own limits.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_CORE, &mut lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_CORE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run(&mut cmd);
    let cores: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let in_cwd = !pattern.starts_with('|') && !pattern.contains('/');
    // Pages of the core that hold one of the program's pages whole.
    let program_pages = cores.first().map_or(0, |core| {
        const CORE_MARK: u64 = 0x5157415043524553;
        let bytes = std::fs::read(core).unwrap();
        let word =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) ^ CORE_MARK;
        (0..bytes.len() / 4096)
            .filter(|k| {
                let first = word(k * 4096);
                first < 16384 && word(k * 4096 + 4088) == first
            })
            .count()
    });
    for core in &cores {
        std::fs::remove_file(core).unwrap();
    }
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}", out.status);
    assert!(
        !out.status.core_dumped(),
        "uswap run dumped a core of its own: {:?}",
        out.status
    );
    if in_cwd {
        assert_eq!(
            cores.len(),
            1,
            "core files: {cores:?} (pattern {pattern:?})"
        );
        // The pages in memory at the end are in the core (those stored are
        // not: see README, Known issues).
        assert!(
            program_pages >= 1024,
            "{program_pages} pages of the program in {cores:?}"
        );
    } else {
        eprintln!("core_pattern {pattern:?}: the core file itself is not looked at");
    }
}

#[test]
fn bad_flags_and_sizes_exit_2_with_a_message() {
    let (s, err) = status_of(&["run", "--memory-high", "lots", "--", "true"]);
    assert_eq!(s.code(), Some(2));
    assert!(err.contains("memory-high"), "{err}");
    let (s, _) = status_of(&["run"]);
    assert_eq!(s.code(), Some(2));
    let (s, err) = status_of(&["run", "--no-such-option", "--", "true"]);
    assert_eq!(s.code(), Some(2));
    assert!(err.contains("--no-such-option"), "{err}");
    let (s, err) = status_of(&["run", "--", "/nonexistent/program"]);
    assert_eq!(s.code(), Some(1));
    assert!(err.contains("/nonexistent/program"), "{err}");
    // Found by a check of bad values: these were taken (a limit below one
    // folio raised to one folio, a swap file of no slot refused only once
    // started, a stats file that cannot be written found out after the
    // program ran, its exit status lost, a number of seconds of `inf`
    // panicking after the work). Now usage errors before anything runs.
    for (args, what) in [
        (
            &["run", "--memory-high", "0", "--", "echo", "STARTED"][..],
            "memory-high",
        ),
        (
            &["run", "--memory-high", "32k", "--", "echo", "STARTED"][..],
            "memory-high",
        ),
        (
            &["run", "--zero-fill-ahead", "6k", "--", "echo", "STARTED"][..],
            "zero-fill-ahead",
        ),
        (
            &["run", "--zero-fill-ahead", "4M", "--", "echo", "STARTED"][..],
            "zero-fill-ahead",
        ),
        (
            &[
                "run",
                "--swap-dir",
                "/tmp",
                "--swap-size",
                "1",
                "--",
                "echo",
                "STARTED",
            ][..],
            "swap-size",
        ),
        (
            &[
                "run",
                "--stats-file",
                "/nonexistent/stats",
                "--",
                "echo",
                "STARTED",
            ][..],
            "/nonexistent/stats",
        ),
        (&["usemem", "1M", "--sleep", "inf"][..], "inf"),
        (
            &["usemem", "1M", "--json", "/nonexistent/out.json"][..],
            "/nonexistent/out.json",
        ),
    ] {
        let out = run(Command::new(USWAP).args(args));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(what),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            !text(&out.stdout).contains("STARTED"),
            "{args:?} ran the program"
        );
    }
}

/// Under a seccomp filter that forbids userfaultfd (Docker's default
/// profile does): refused before its main runs, or run unmanaged when
/// asked.
#[test]
fn a_program_that_may_not_use_userfaultfd_is_refused_or_run_without_uswap() {
    let exe = build("memtest");
    let nouffd = build("nouffd");
    let refused = run(Command::new(USWAP)
        .arg("run")
        .arg("--")
        .arg(&nouffd)
        .arg(&exe));
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stdout).is_empty(),
        "it ran: {}",
        text(&refused.stdout)
    );
    assert!(text(&refused.stderr).contains("may not create a userfaultfd"));
    let fallback = run(Command::new(USWAP)
        .args(["run", "--fallback", "run", "--"])
        .arg(&nouffd)
        .arg(&exe));
    assert!(fallback.status.success());
    assert!(text(&fallback.stdout).contains("done"));
}

/// The agent outside `uswap run` (no supervisor answers): one line on
/// stderr, and the program runs.
#[test]
fn the_agent_stays_out_of_the_way_when_no_supervisor_answers() {
    let out = run(Command::new("sh")
        .args(["-c", "echo still here"])
        .env("LD_PRELOAD", env!("USWAP_AGENT_SO"))
        .env(uswap_protocol::SOCKET_ENV, "uswap-nobody-listens"));
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "still here\n");
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no uswap supervisor answers"), "{err}");
}

/// `programs/holder.c` under `uswap run --memory-high LIMIT`, its stderr
/// as `stderr` says, once it has filled its memory: the supervisor (killed
/// when dropped), the rest of the program's output, and the program's pid.
fn holder_under(
    limit: &str,
    stderr: Stdio,
) -> (
    KillOnDrop,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
    i32,
) {
    let exe = build("holder");
    let mut sup = KillOnDrop(
        Command::new(USWAP)
            .args(["run", "--memory-high", limit, "--"])
            .arg(&exe)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(sup.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let pid = first
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("{first}"))
        .parse()
        .unwrap();
    (sup, lines, pid)
}

/// The supervisor killed under a program whose memory it holds: the program
/// is ended with a message; it never reads zeros in place of its pages.
#[test]
fn a_program_whose_supervisor_dies_is_ended_not_fed_zeros() {
    let (mut sup, lines, pid) = holder_under("16M", Stdio::piped());
    sup.0.kill().unwrap();
    sup.0.wait().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        rest.iter().all(|l| !l.contains("WRONG")),
        "the program read wrong bytes: {rest:?}"
    );
    // SAFETY: signal 0 only asks whether the process exists.
    let gone = || unsafe { libc::kill(pid, 0) } != 0 || is_zombie(pid);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gone() {
        assert!(
            Instant::now() < deadline,
            "the program outlived its supervisor"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut sup.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("supervisor is gone"), "{err}");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

/// A forked child that does not exec is evicted from like its parent: its
/// resident memory stays near the limit while it holds six times as much.
#[test]
fn a_forked_child_is_held_to_the_limit_too() {
    forked_child_held_to_the_limit("64k");
}

/// With 4 KiB folios the agent's beacon page could be taken into a region
/// (a mapping registered beside it merges with it), and a forked child's
/// touch of it was then served as an ordinary fault: the child was never
/// adopted, and its agent waited for ever.
#[test]
fn a_forked_child_is_held_to_the_limit_with_4k_folios() {
    forked_child_held_to_the_limit("4k");
}

fn forked_child_held_to_the_limit(folio: &str) {
    let exe = build("forkgrow");
    let alone = run(&mut Command::new(&exe));
    let alone = text(&alone.stdout);
    let rss_alone: u64 = child_rss(&alone);
    let stats = exe.with_extension(format!("forkgrow-{folio}-stats"));
    let managed = run(Command::new(USWAP)
        .args([
            "run",
            "--memory-high",
            "32M",
            "--folio-size",
            folio,
            "--stats-file",
        ])
        .arg(&stats)
        .arg("--")
        .arg(&exe));
    assert!(managed.status.success(), "{}", text(&managed.stderr));
    let out = text(&managed.stdout);
    assert!(out.contains("parent ok 0"), "{out}");
    let rss = child_rss(&out);
    assert!(
        rss < 96 * 1024 && rss_alone > 190 * 1024,
        "the child held {rss} KiB under uswap, {rss_alone} KiB alone"
    );
    let c = counters(&stats);
    assert_eq!(c["forks"], 1, "{c:?}");
    assert!(c["discarded_by_move"] > 0, "{c:?}");
}

/// Two processes faulting at the same time take turns in the reclaimer's
/// queue; each still gets whole eviction batches (one plug per process).
/// With one plug, flushed whenever the next folio was the other process's,
/// this program's batches held 1.6-1.7 folios on average; with one per
/// process, 7.9 of the 8 a batch holds.
#[test]
fn two_processes_faulting_together_are_evicted_in_whole_batches() {
    let exe = build("twotouch");
    let stats = exe.with_extension("twotouch-stats");
    let managed = run(Command::new(USWAP)
        .args(["run", "--memory-high", "8M", "--folio-size", "4k"])
        .args(["--compress-batchsize", "8", "--stats-file"])
        .arg(&stats)
        .arg("--")
        .arg(&exe));
    assert!(managed.status.success(), "{}", text(&managed.stderr));
    assert!(text(&managed.stdout).contains("twotouch ok"));
    let c = counters(&stats);
    assert_eq!(c["forks"], 1, "{c:?}");
    assert!(
        c["evicted_folios"] >= 4 * c["reclaim_batches"],
        "{} folios evicted in {} batches",
        c["evicted_folios"],
        c["reclaim_batches"]
    );
}

/// One thread drops (MADV_DONTNEED) a block, half of it swapped out, while
/// another forks: each child must find the block all as written or all
/// zeros, as the kernel's zap is one step against the fork's copy. Before
/// the drop kept what it took from swapped folios until its zap, 19 to 32
/// children in 100 found the old bytes of the resident half and zeros for
/// the swapped one. With 2 MiB folios, 1 or 2 in 100 still did until a
/// folio being evicted when the drop came was asked about too.
#[test]
fn a_fork_racing_a_drop_gives_the_child_all_of_the_block_or_none() {
    let exe = build("dropfork");
    for folio in ["64k", "2m"] {
        let stats = exe.with_extension(format!("dropfork-{folio}-stats"));
        let managed = run(Command::new(USWAP)
            .args(["run", "--memory-high", "16M", "--folio-size", folio])
            .arg("--stats-file")
            .arg(&stats)
            .arg("--")
            .arg(&exe)
            .args(["100", "8"]));
        let out = text(&managed.stdout);
        assert!(
            managed.status.success() && out.contains("100 rounds, mixed 0"),
            "{folio} folios: {out}{}",
            text(&managed.stderr)
        );
        let c = counters(&stats);
        assert_eq!(c["forks"], 100, "{c:?}");
        assert!(c["evicted_folios"] > 0, "{c:?}");
    }
}

fn child_rss(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("child ok "))
        .unwrap_or_else(|| panic!("{out}"))
        .trim()
        .parse()
        .unwrap()
}

/// Ends a process when dropped (a test that fails leaves nothing running).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `uswap stats` reads a running supervisor: by its pid or the program's,
/// as `name value` lines or JSON; once the supervisor is gone, it says so.
#[test]
fn uswap_stats_reads_a_running_supervisor() {
    let (mut sup, _lines, program) = holder_under("16M", Stdio::null());
    // Memory the program maps after it starts is picked up by the next scan
    // (every 100 ms): ask until the report shows it swapping.
    let deadline = Instant::now() + Duration::from_secs(30);
    let report = loop {
        let json = run(Command::new(USWAP).args(["stats", "--json", &program.to_string()]));
        assert!(json.status.success(), "{}", text(&json.stderr));
        let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        if report["counters"]["zswpin"].as_u64().unwrap() > 0 || Instant::now() > deadline {
            break report;
        }
    };
    assert_eq!(report["supervisor"], sup.0.id() as i64);
    assert_eq!(report["served"][0], program as i64);
    assert!(
        report["counters"]["zswpin"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        report["fault_latency"]["faults"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        report["compression_ratio"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let plain = run(Command::new(USWAP).args(["stats", &sup.0.id().to_string()]));
    assert!(plain.status.success());
    let plain = text(&plain.stdout);
    assert!(plain.lines().any(|l| l.starts_with("zswpin ")), "{plain}");
    assert!(
        plain
            .lines()
            .any(|l| l.starts_with("fault_latency_p99_us ")),
        "{plain}"
    );
    // SAFETY: asks the supervisor to end (it passes SIGTERM on).
    unsafe { libc::kill(sup.0.id() as i32, libc::SIGTERM) };
    let status = sup.0.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let after = run(Command::new(USWAP).args(["stats", &program.to_string()]));
    assert_eq!(after.status.code(), Some(1));
}

/// `uswap limit` changes a running supervisor's limit: lowered, what is
/// over it goes at once; raised, the program brings its memory back and
/// none is taken again. A limit under one folio, a bad size and a user
/// other than root or the supervisor's own are refused, and the limit
/// stays as it was. The program reads every byte right throughout.
#[test]
fn uswap_limit_changes_a_running_supervisors_limit() {
    let (mut sup, lines, program) = holder_under("256M", Stdio::null());
    let program = program.to_string();
    let report = || -> serde_json::Value {
        let json = run(Command::new(USWAP).args(["stats", "--json", &program]));
        assert!(json.status.success(), "{}", text(&json.stderr));
        serde_json::from_slice(&json.stdout).unwrap()
    };
    // Polls the report until `done` holds, for at most 30 s.
    let wait_for = |what: &str, done: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = report();
            if done(&r) {
                return r;
            }
            assert!(Instant::now() < deadline, "{what}: {r}");
        }
    };
    let mib = 1u64 << 20;
    // The 64 MiB it holds fit under 256M: all of it is picked up (scans
    // every 100 ms), none goes.
    let r = wait_for("the program's memory picked up", &|r| {
        r["resident_bytes"].as_u64().unwrap() >= 60 * mib
    });
    assert_eq!(r["counters"]["zswpout"], 0, "{r}");

    let lowered = run(Command::new(USWAP).args(["limit", "16M", &program]));
    assert!(lowered.status.success(), "{}", text(&lowered.stderr));
    assert_eq!(
        text(&lowered.stdout).trim(),
        format!("memory_high {}", 16 * mib)
    );
    let r = wait_for("resident memory down to the new limit", &|r| {
        r["resident_bytes"].as_u64().unwrap() <= 16 * mib
    });
    assert_eq!(r["memory_high"], 16 * mib, "{r}");
    assert!(r["counters"]["zswpout"].as_u64().unwrap() > 0, "{r}");

    let raised = run(Command::new(USWAP).args(["limit", "1G", &program]));
    assert!(raised.status.success(), "{}", text(&raised.stderr));
    // The program reads all of its memory over and over: all of it comes
    // back, and nothing leaves any more.
    let back = wait_for("the program's memory back in", &|r| {
        r["resident_bytes"].as_u64().unwrap() >= 60 * mib
    });
    let evicted = back["counters"]["evicted_folios"].as_u64().unwrap();

    let refused = |args: &[&str], code: i32, says: &str| {
        let out = run(Command::new(USWAP).args(args));
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    };
    refused(&["limit", "4k", &program], 1, "less than one folio");
    refused(&["limit", "12Q", &program], 2, "bad size");
    refused(
        &["limit", "16M", "1"],
        1,
        "no uswap supervisor is or serves process 1",
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let out = run(Command::new(USWAP)
            .args(["limit", "16M", &program])
            .uid(65534)
            .gid(65534));
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("permission denied"),
            "{}",
            text(&out.stderr)
        );
    }
    let r = report();
    assert_eq!(r["memory_high"], 1u64 << 30, "{r}");
    assert_eq!(
        r["counters"]["evicted_folios"].as_u64().unwrap(),
        evicted,
        "{r}"
    );

    // SAFETY: asks the supervisor to end (it passes SIGTERM on).
    unsafe { libc::kill(sup.0.id() as i32, libc::SIGTERM) };
    sup.0.wait().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|l| l.contains("WRONG")), "{rest:?}");
}

/// Options from a config file; the environment and the command line
/// override it; a bad file exits 2.
#[test]
fn a_config_file_sets_options_that_the_environment_and_flags_override() {
    let stats = scratch_dir().join("config.stats");
    let conf = scratch_dir().join("uswap.conf");
    std::fs::write(
        &conf,
        format!(
            "# test\nmemory-high = 48M\nstats-file = {}\n",
            stats.display()
        ),
    )
    .unwrap();
    let memory_high = |cmd: &mut Command| -> u64 {
        let out = run(cmd.args(["--", "true"]));
        assert!(out.status.success(), "{}", text(&out.stderr));
        counters(&stats)["memory_high"]
    };
    let base = || {
        let mut c = Command::new(USWAP);
        c.arg("run").arg("--config").arg(&conf);
        c
    };
    assert_eq!(memory_high(&mut base()), 48 << 20);
    assert_eq!(
        memory_high(base().env("USWAP_MEMORY_HIGH", "80M")),
        80 << 20
    );
    assert_eq!(memory_high(base().args(["--memory-high", "96M"])), 96 << 20);
    assert_eq!(
        memory_high(Command::new(USWAP).arg("run").env("USWAP_CONFIG", &conf)),
        48 << 20
    );
    std::fs::write(&conf, "memory-high 48M\n").unwrap();
    let (s, err) = status_of(&["run", "--config", conf.to_str().unwrap(), "--", "true"]);
    assert_eq!(s.code(), Some(2));
    assert!(err.contains("name = value"), "{err}");
}

/// Memory a program maps after it starts (here glibc's malloc, whose mmap no
/// symbol interposition sees) is picked up while the program fills it, not
/// at the next periodic scan (set a minute away here): the peak stays far
/// below what it fills.
#[test]
fn memory_filled_fast_after_start_is_held_to_the_limit() {
    let peak_kb = peak_under_64m("fastgrow");
    assert!(
        peak_kb < 256 * 1024,
        "peak {peak_kb} KiB while filling 512 MiB under 64 MiB"
    );
}

/// Memory a program gets by growing a managed mapping in place (mremap
/// without MREMAP_MAYMOVE, as glibc's realloc grows a large block) raises
/// no event; until the supervisor manages it, every page there is a fault
/// of its own (`untracked_faults`). Such a fault makes the scanner's next
/// look (5 ms) a scan, rather than the periodic one (2 s away here): before,
/// the 14,336 pages grown here were faulted one by one.
#[test]
fn memory_grown_in_place_is_managed_once_it_faults() {
    let exe = build("growinplace");
    let c = run_to_ok(
        &exe,
        &["--memory-high", "4G", "--rescan-ms", "2000"],
        &[],
        "growinplace ok",
        "a mapping grown in place",
    );
    let untracked = c["untracked_faults"];
    assert!(
        untracked > 0 && untracked < 2000,
        "{untracked} faults one page at a time in the 14336 pages grown: {c:?}"
    );
}

/// New memory the kernel maps where the program unmapped managed memory
/// (a whole block, then the middle of one) is managed like any other: it
/// used to be taken for the old memory's, and escaped the limit.
#[test]
fn new_memory_where_old_memory_was_is_held_to_the_limit() {
    let peak_kb = peak_under_64m("reuse");
    assert!(
        peak_kb < 160 * 1024,
        "peak {peak_kb} KiB while filling 256 MiB of new memory under 64 MiB"
    );
}

/// Runs test program `name` under `uswap run --memory-high 64M`, with the
/// periodic scan a minute away (new memory must be picked up as it is
/// filled), and returns the peak resident memory it prints (`peak KIB`).
fn peak_under_64m(name: &str) -> u64 {
    let exe = build(name);
    let out = run(Command::new(USWAP)
        .args(["run", "--memory-high", "64M", "--rescan-ms", "60000", "--"])
        .arg(&exe));
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .trim()
        .strip_prefix("peak ")
        .unwrap_or_else(|| panic!("{}", text(&out.stdout)))
        .parse()
        .unwrap()
}

/// A program that keeps changing the layout of its memory from several
/// threads (unmapping blocks and pieces of blocks and mapping new memory at
/// the same addresses, dropping, write-protecting, forking) while it works
/// with three times its limit, and checks every byte against its own model
/// (`programs/churn.c`). It found pages of evicted folios lost when new
/// memory took the place of a part of the folio (`mm_defects`, "new memory
/// in a hole"); a few seeds run here, more by hand:
/// `uswap run --memory-high 16M -- churn THREADS BLOCKS OPS SEED`.
#[test]
fn a_program_that_churns_its_memory_layout_reads_back_what_it_wrote() {
    let exe = build("churn");
    for seed in ["1", "2", "3"] {
        let c = run_to_ok(
            &exe,
            &["--memory-high", "16M"],
            &["3", "64", "3000", seed],
            "churn ok",
            &format!("seed {seed}"),
        );
        assert!(c["evicted_folios"] > 0, "seed {seed}: {c:?}");
        assert!(c["discarded_by_move"] > 0, "seed {seed}: {c:?}");
    }
}

/// A program moves and grows (mremap) a managed mapping that does not
/// start or end on a folio boundary, after its pages went out
/// (`programs/remap.c`). The kernel refuses (EFAULT) an mremap over a
/// mapping that is only partly registered with a userfaultfd, which is
/// what a scan that registered its whole folios alone left. On Linux 6.17
/// and later it also moves the mapping split in three by an mprotect, and
/// with a mapping made just before after its end, in one call each: the
/// kernel refuses both where a mapping is registered, and the agent makes
/// them one mapping at a time.
#[test]
fn a_program_that_moves_a_mapping_with_parts_of_folios_at_its_ends_reads_back_what_it_wrote() {
    let exe = build("remap");
    for folio in ["64k", "4k"] {
        let flags = [
            "--memory-high",
            "8M",
            "--rescan-ms",
            "5",
            "--folio-size",
            folio,
        ];
        let c = run_to_ok(&exe, &flags, &[], "remap ok", folio);
        assert!(c["evicted_folios"] > 0, "{folio}: {c:?}");
    }
}

/// A process of the run stops (SIGSTOP) with its memory managed while
/// another needs room (`programs/stopped.c`): the stopped one's folios are
/// the oldest, and its agent cannot answer until it runs again, which the
/// other lets it do only once its own memory is done. The supervisor asked
/// the stopped agent and waited: the run hung.
#[test]
fn a_stopped_process_does_not_stall_reclaim_for_the_others() {
    let exe = build("stopped");
    let flags = ["--memory-high", "16M", "--rescan-ms", "5"];
    let c = run_to_ok(&exe, &flags, &[], "stopped ok", "stopped");
    assert!(c["evicted_folios"] > 0, "{c:?}");
    assert!(c["stopped_folios_held"] > 0, "{c:?}");
    // Only the runs taken before the stop was seen are left, not runs of
    // the child's folios taken again at every pass while it is stopped
    // (with its folios left in the queue: 458).
    assert!(c["stopped_runs_left"] < 64, "{c:?}");
}

/// A process of the run is stopped and continued over and over while
/// another needs room (`programs/stopflip.c`): a stop that lands while the
/// reclaimer waits for the stopped process's agent held every fault that
/// needed room until that process ran again, which the other lets it do
/// only once its own memory is done; the program's alarm then reported a
/// stalled round (2 of 6 runs at 8f5aacf). Such a stop does not come in every run
/// (`slow_discards` counts those that came); `mm_defects`'s "faults do not
/// wait for room behind a discard that does not return" holds one in every
/// run.
#[test]
fn a_process_stopped_while_its_agent_is_asked_does_not_stall_the_others() {
    let exe = build("stopflip");
    let flags = ["--memory-high", "16M", "--rescan-ms", "5"];
    let c = run_to_ok(&exe, &flags, &["300"], "stopflip ok", "stopflip");
    assert!(c["evicted_folios"] > 0, "{c:?}");
    assert!(c["stopped_folios_held"] > 0, "{c:?}");
}

/// A program marks memory MADV_WIPEONFORK and MADV_DONTFORK, lets it go
/// out, and forks (`programs/forkadvice.c`): the child must read the first
/// as zeros, as the kernel gives it, and new memory it maps where the
/// second was (which the kernel does not give it) as zeros too, once
/// managed. It read the parent's stored bytes in the first, and the second
/// was taken for managed already, so new memory there never was. Then
/// memory the parent advises right after its forks must stay the child's
/// (the first fix read that advice as given before the fork in 3 runs of
/// 3: the child read zeros).
#[test]
fn a_forked_child_gets_wiped_memory_empty_and_not_copied_memory_not_at_all() {
    let exe = build("forkadvice");
    for folio in ["64k", "4k"] {
        let flags = [
            "--memory-high",
            "16M",
            "--rescan-ms",
            "5",
            "--folio-size",
            folio,
        ];
        let c = run_to_ok(&exe, &flags, &[], "forkadvice ok", folio);
        assert!(c["evicted_folios"] > 0, "{folio}: {c:?}");
        // WIPE and GONE at each of the nine forks; KEEP, advised only
        // after its forks, at none.
        assert_eq!(c["fork_advice_ranges"], 18, "{folio}: {c:?}");
    }
}

/// A process of the run is killed while a child it forked with `_Fork`
/// (no fork handlers: it keeps a copy of the agent's socket) sleeps on
/// (`programs/rawfork.c`); another then needs room. The supervisor's
/// reclaimer waited for the dead process's agent to answer, and the end of
/// file never came while the child held the socket: the run (ten such
/// processes killed one after another) hung in 4 of 8. The test runs it
/// four times.
#[test]
fn a_process_killed_while_a_raw_forked_child_holds_its_socket_does_not_stall_reclaim() {
    let exe = build("rawfork");
    for round in 0..4 {
        let flags = ["--memory-high", "16M", "--rescan-ms", "5"];
        run_to_ok(&exe, &flags, &[], "rawfork ok", &format!("round {round}"));
    }
}

/// A program forks children while its memory goes out and exits at once,
/// leaving them to read their copies (`programs/orphans.c`): every child
/// reads what its parent wrote, and the run ends. Faults the children took
/// after the program's exit were handed to filler threads that had ended
/// with the runtime, and the run waited for ever on folios left loading.
#[test]
fn children_that_outlive_the_program_read_their_memory_and_the_run_ends() {
    let exe = build("orphans");
    const KIDS: usize = 4;
    for round in 0..3 {
        let out = run(Command::new(USWAP)
            .args(["run", "--memory-high", "8M", "--"])
            .arg(&exe)
            .args(["32", &KIDS.to_string()]));
        let stdout = text(&out.stdout);
        for k in 0..KIDS {
            assert!(
                out.status.success() && stdout.contains(&format!("child {k} ok\n")),
                "round {round}, child {k}: {:?}: {stdout}{}",
                out.status,
                text(&out.stderr)
            );
        }
    }
}

/// Runs `interpreter` on the script tests/programs/SCRIPT (given as its
/// last argument, or on its standard input with `stdin`) alone, then under
/// `uswap run --memory-high LIMIT`, and checks that the output is the same
/// and that memory went out and came back. Returns the run's counters and
/// stderr. The interpreters are on the machine image (`.ci/run` installs
/// any that is missing); a missing one fails the test.
fn interpreter_case(
    interpreter: &str,
    script: &str,
    stdin: bool,
    limit: &str,
) -> (std::collections::HashMap<String, u64>, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{script}"));
    let command = |cmd: &mut Command| {
        cmd.arg(interpreter);
        if stdin {
            cmd.arg(":memory:")
                .stdin(std::fs::File::open(&path).unwrap());
        } else {
            cmd.arg(&path);
        }
        run(cmd)
    };
    let alone = command(&mut Command::new("env"));
    assert!(
        alone.status.success(),
        "{interpreter} alone: {:?}: {}",
        alone.status,
        text(&alone.stderr)
    );
    let stats = scratch_dir().join(format!("{script}.stats"));
    let mut cmd = Command::new(USWAP);
    cmd.args(["run", "--memory-high", limit, "--stats-file"])
        .arg(&stats)
        .arg("--");
    let managed = command(&mut cmd);
    let err = text(&managed.stderr);
    assert!(managed.status.success(), "{:?}: {err}", managed.status);
    assert_eq!(text(&managed.stdout), text(&alone.stdout), "{err}");
    let c = counters(&stats);
    std::fs::remove_file(&stats).unwrap();
    assert!(c["zswpout"] > 0 && c["pgmajfault"] > 0, "{c:?}");
    assert_eq!((c["sigbus"], c["decompress_fail"]), (0, 0), "{c:?}");
    (c, err)
}

/// Python with dicts, lists and bytes, then a multiprocessing pool whose
/// forked workers read the parent's memory (and copy it on write: every
/// object read has its reference count written).
#[test]
fn python_with_forked_workers_prints_what_it_prints_alone() {
    let (c, err) = interpreter_case("python3", "interp.py", false, "24M");
    assert!(c["forks"] >= 4, "{c:?}");
    assert_eq!(err, "");
}

/// A shell pipeline of unmodified programs (awk, sort with two threads,
/// md5sum, cut, uniq), each a process of its own forked by the shell, all
/// under one limit that sort's buffer does not fit.
#[test]
fn a_pipeline_of_sorts_prints_what_it_prints_alone() {
    let (c, err) = interpreter_case("sh", "pipeline.sh", false, "16M");
    assert!(c["forks"] >= 4, "{c:?}");
    assert_eq!(err, "");
}

/// sqlite3 with an in-memory database larger than its limit: inserts, an
/// index, a join, aggregates, an update.
#[test]
fn sqlite_with_a_database_in_memory_prints_what_it_prints_alone() {
    let (_, err) = interpreter_case("sqlite3", "interp.sql", true, "16M");
    assert_eq!(err, "");
}

/// A JVM with four threads filling HashMaps of arrays on a G1 heap several
/// times its limit: the heap grows, is collected, and is committed anew
/// where it was (untouched memory replacing memory taken for eviction, which
/// once left the reclaimer and the program waiting on each other for good).
#[test]
fn java_with_threads_on_a_heap_over_its_limit_prints_what_it_prints_alone() {
    let (c, err) = interpreter_case("java", "interp.java", false, "64M");
    assert!(c["evicted_folios"] > 0, "{c:?}");
    assert_eq!(err, "");
}

/// node with a worker thread, a Map of objects and 40 MiB that does not
/// compress: that memory is tried once and then left in memory (there is
/// no swap file), and the supervisor says so once at the end.
#[test]
fn node_with_a_worker_and_memory_that_does_not_compress_prints_what_it_prints_alone() {
    let (c, err) = interpreter_case("node", "interp.js", false, "32M");
    assert!(c["unfit_folios"] > 0, "{c:?}");
    assert!(err.contains("did not compress"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

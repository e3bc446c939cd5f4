//! `uswap run -- CMD ARGS...`: runs an unmodified program under a memory
//! limit, as its supervisor.
//!
//! ```text
//! uswap run (this process)                    CMD (LD_PRELOAD = the agent)
//!   runtime: store, engines, event thread       agent, before main: uffd, hello --+
//!   listener (abstract unix socket)  <------------------------------------------+
//!     attach(uffd, pid, agent link) -> manage its memory (/proc/PID/maps) -> verdict
//!   scanner: new memory of every served image, every --rescan-ms
//!   main thread: waits for CMD, passes its exit status (or signal) on
//! ```
//!
//! Every image of the process tree that loads the agent (CMD, and whatever
//! it or its children exec) is attached to the one runtime, so the limit is
//! for all of them together; a fork's child is served through the
//! descriptor its fork event brings, and adopted (evicted from too) once
//! its agent thread asks (see the agent's docs). When CMD exits, the
//! runtime installs what images still alive hold in the store, lets go of
//! them, and the agents end quietly.

mod agent;
pub mod config;
pub mod control;
mod maps;
pub mod report;

use crate::args::RuntimeArgs;
use agent::{AgentLink, Greeting};
use report::Report;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uswap::mm::{Attached, Runtime};
use uswap_protocol::{Verdict, SOCKET_ENV};

/// What to do with a program that cannot be managed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Exit with status 1 before the program's main runs.
    Refuse,
    /// Run it without uswap.
    Run,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// When the program cannot be managed (it may not create a
    /// userfaultfd: seccomp, permissions): refuse to run it, or run it
    /// without uswap.
    #[arg(long, value_enum, default_value = "refuse", env = "USWAP_FALLBACK")]
    fallback: Fallback,
    /// Write the final counters to this file (/proc/vmstat form) when the
    /// program exits.
    #[arg(long, env = "USWAP_STATS_FILE")]
    stats_file: Option<PathBuf>,
    /// Read options from this file (`name = value` lines; the command line
    /// and USWAP_* variables override it).
    #[arg(long, env = config::CONFIG_ENV)]
    config: Option<PathBuf>,
    /// How often new memory of the program is looked for, in milliseconds.
    #[arg(long, default_value_t = 100, env = "USWAP_RESCAN_MS",
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    rescan_ms: u64,
    /// The program, then its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<OsString>,
}

/// A served program image.
struct Served {
    attached: Attached,
    /// The agent's own mappings, never managed: its thread's stack with its
    /// scratch (moved-out pages are dropped there), and its
    /// beacon and fence pages (a fault there must reach the beacon check or
    /// the fence, not a region; a mapping registered beside them merges
    /// with them).
    agent_memory: [(usize, usize); 2],
    /// Said already that the program uses userfaultfd itself.
    said_busy: AtomicBool,
}

/// The agent's own mappings, as its hello gives them: stack and scratch,
/// and beacon with fence.
fn agent_memory(hello: &uswap_protocol::Hello) -> [(usize, usize); 2] {
    let beacon = hello.beacon as usize;
    [
        (hello.own_start as usize, hello.own_end as usize),
        (beacon, beacon + uswap::mm::BEACON_SPAN),
    ]
}

// The agent maps what the runtime registers.
const _: () =
    assert!(uswap_protocol::BEACON_PAGES * uswap::page::PAGE_SIZE == uswap::mm::BEACON_SPAN);

/// The program's pid, for the signal handlers (0: not started).
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// SIGTSTP sent to the supervisor: the program stops, and so does the
/// supervisor, as a job stopped at the terminal would.
extern "C" fn stop_with_program(_: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    // SAFETY: kill and raise are async-signal-safe.
    unsafe {
        if pid > 0 {
            libc::kill(pid, libc::SIGTSTP);
        }
        libc::raise(libc::SIGSTOP);
    }
}

/// The agent library, carried in this binary: written to a private
/// directory for the run (readable by every user, since the program may
/// change its own), removed when the run ends.
const AGENT: &[u8] = include_bytes!(env!("USWAP_AGENT_SO"));

/// Where the agent is for this run; removed on drop.
struct AgentFile {
    path: PathBuf,
    dir: Option<PathBuf>,
}

impl Drop for AgentFile {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                eprintln!("uswap: removing {}: {e}", dir.display());
            }
        }
    }
}

/// How the agent's directories are named: the prefix, the supervisor's
/// pid, a dash, a random part.
const AGENT_DIR_PREFIX: &str = "uswap-run-";

/// Removes the agent directories of supervisors that were killed before
/// they could (a SIGKILL leaves no chance to clean up).
fn remove_stale_agent_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(AGENT_DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "uswap");
        if !alive {
            // Another supervisor may be cleaning it at the same moment.
            let _raced = std::fs::remove_dir_all(e.path()).is_err();
        }
    }
}

/// A path the program's loader can open the agent at (`USWAP_AGENT`
/// overrides it).
fn agent_file() -> Result<AgentFile, String> {
    if let Some(p) = std::env::var_os("USWAP_AGENT") {
        return Ok(AgentFile {
            path: p.into(),
            dir: None,
        });
    }
    remove_stale_agent_dirs();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut template = std::env::temp_dir()
        .join(format!("{AGENT_DIR_PREFIX}{pid}-XXXXXX"))
        .into_os_string()
        .into_vec();
    template.push(0);
    // SAFETY: mkdtemp rewrites the NUL-terminated template in place.
    if unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) }.is_null() {
        return Err(format!(
            "creating a directory for the agent: {}",
            std::io::Error::last_os_error()
        ));
    }
    template.pop();
    let dir = PathBuf::from(std::ffi::OsString::from_vec(template));
    let file = AgentFile {
        path: dir.join("libuswap_agent.so"),
        dir: Some(dir.clone()),
    };
    let write = || -> std::io::Result<()> {
        std::fs::write(&file.path, AGENT)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&file.path, std::fs::Permissions::from_mode(0o755))
    };
    write().map_err(|e| format!("writing the agent to {}: {e}", file.path.display()))?;
    Ok(file)
}

/// The abstract socket name where supervisor `pid` serves its report.
pub fn stats_socket(pid: i32) -> String {
    format!("{STATS_PREFIX}{pid}")
}

/// How stats socket names start (`uswap stats --all` looks for them).
pub const STATS_PREFIX: &str = "uswap-stats-";

/// A name for the agents' socket, unique to this run.
fn agent_socket_name() -> String {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("uswap-{pid}-{nanos:x}")
}

/// The address of abstract unix socket `name`, and its length.
fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    uswap_protocol::wire::abstract_addr(name.as_bytes())
        .expect("uswap's socket names are short enough for a sockaddr_un")
}

/// A socket of `kind` (SOCK_SEQPACKET, SOCK_STREAM) connected to the
/// abstract unix socket `name`.
pub fn connect(name: &str, kind: libc::c_int) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain socket call.
    let raw = unsafe { libc::socket(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let (addr, len) = abstract_addr(name);
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    if unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

/// A listening abstract unix socket of `kind` (SOCK_SEQPACKET, SOCK_STREAM).
fn listen(name: &str, kind: libc::c_int) -> Result<OwnedFd, String> {
    // SAFETY: a plain socket call.
    let raw = unsafe { libc::socket(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let (addr, len) = abstract_addr(name);
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    let bound = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        ) == 0
            && libc::listen(sock.as_raw_fd(), 64) == 0
    };
    if !bound {
        return Err(format!(
            "binding socket {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(sock)
}

/// The credentials of the process at the other end of `sock` when it
/// connected (SO_PEERCRED: the kernel fills them in, translated into this
/// process's namespaces).
fn peer_credentials(sock: &OwnedFd) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, and a ucred-sized buffer with its length.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred)
}

/// Sets how long a receive on `sock` may wait.
fn receive_within(sock: &OwnedFd, wait: Duration) -> std::io::Result<()> {
    let tv = libc::timeval {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_usec: wait.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid socket, and a timeval with its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits (at most 50 ms) for a connection on `listener`; none once `stop`
/// (an eventfd) is readable, which ends the wait at once.
fn accept_within(listener: &OwnedFd, stop: &OwnedFd) -> Option<OwnedFd> {
    let mut pfd = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds.
    if unsafe { libc::poll(pfd.as_mut_ptr(), 2, 50) } <= 0 || pfd[1].revents != 0 {
        return None;
    }
    // SAFETY: accepting on our listening socket.
    let raw = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    // SAFETY: a fresh descriptor nobody else owns.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Everything the supervisor's threads share.
struct Supervisor {
    rt: Runtime,
    fallback: Fallback,
    served: Mutex<Vec<Served>>,
    /// The command line, for reports.
    program: String,
    /// An image was refused (the run then exits 1).
    refused: AtomicBool,
    /// An agent greeted the supervisor, at some time in the run.
    agent_seen: AtomicBool,
    /// The program has exited: the threads below end.
    done: AtomicBool,
    /// An eventfd, readable once `done` is set: the threads waiting for a
    /// connection end at once rather than at their next look (50 ms), which
    /// every run paid at its end.
    stop: OwnedFd,
}

impl Supervisor {
    /// Ends the supervisor's threads (see `done`, `stop`).
    fn finish(&self) {
        self.done.store(true, Ordering::Release);
        uswap::sys::eventfd_signal(&self.stop);
    }
}

impl Supervisor {
    /// Takes one agent connection: attach, manage, verdict.
    fn welcome(&self, sock: OwnedFd) {
        let (link, Greeting { hello, uffd, pid }) = match AgentLink::greet(sock) {
            Ok(g) => g,
            // An image that exec'd or exited while connecting (its agent
            // thread went with it) is no failure.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return,
            Err(e) => {
                eprintln!("uswap: an agent connection failed: {e}");
                return;
            }
        };
        self.agent_seen.store(true, Ordering::Release);
        let link = Arc::new(link);
        let refuse = |why: String| {
            if is_gone(pid) {
                return;
            }
            eprintln!("uswap: process {} cannot be managed: {why}", pid);
            let verdict = match self.fallback {
                Fallback::Run => {
                    eprintln!("uswap: it runs without uswap (--fallback run)");
                    Verdict::Unmanaged
                }
                Fallback::Refuse => {
                    eprintln!("uswap: not running it (--fallback run would run it without uswap)");
                    self.refused.store(true, Ordering::Release);
                    Verdict::Exit
                }
            };
            if let Err(e) = link.verdict(verdict) {
                say_unless_gone(pid, e);
            }
        };
        if hello.forked {
            return self.adopt(link, hello, pid);
        }
        let Some(uffd) = uffd else {
            return refuse(format!(
                "it may not create a userfaultfd ({}; a seccomp filter such as Docker's default, or no permission)",
                std::io::Error::from_raw_os_error(hello.error)
            ));
        };
        let attached = match self.rt.attach(
            uffd,
            pid,
            Some(hello.beacon as usize),
            Box::new(link.clone()),
        ) {
            Ok(a) => a,
            Err(e) => return refuse(e.to_string()),
        };
        let served = Served {
            attached,
            agent_memory: agent_memory(&hello),
            said_busy: AtomicBool::new(false),
        };
        // The verdict goes first: nothing is managed yet, so no drop
        // request can reach the agent before it, and its thread (started
        // on the verdict) reads every request after it.
        if let Err(e) = link.verdict(Verdict::Managed) {
            return say_unless_gone(pid, e);
        }
        if let Err(e) = manage_new_memory(&served, self.rt.config().folio_size) {
            if !is_gone(pid) {
                eprintln!("uswap: reading the memory map of process {}: {e}", pid);
            }
        }
        self.served.lock().expect("served lock").push(served);
    }

    /// A forked child of a served image asks to be evicted from too.
    fn adopt(&self, link: Arc<AgentLink>, hello: uswap_protocol::Hello, pid: libc::pid_t) {
        // The child says which space is its by its thread id in a fault,
        // which the kernel gives in the child's own pid namespace: where
        // that is not this one, two children of different namespaces may
        // say the same number, and one would be taken for the other. Such
        // a child stays served (through its fork event's descriptor), just
        // not compressed.
        if pid != hello.pid {
            if let Err(e) = link.verdict(Verdict::Unmanaged) {
                say_unless_gone(pid, e);
            }
            return;
        }
        // The verdict (with the child's descriptor) is sent before the
        // child is evicted from (see `welcome`).
        let verdict = |uffd: std::os::fd::BorrowedFd| link.adopted(uffd);
        let attached = match self.rt.adopt(pid, Box::new(link.clone()), verdict) {
            Ok(a) => a,
            Err(e) => {
                // Still served (through its fork event's descriptor), just
                // not compressed. A child that exec'd or exited meanwhile
                // (a shell's fork-then-exec does that all the time) is not
                // worth a word.
                let gone = matches!(
                    e.raw_os_error(),
                    Some(libc::ESRCH | libc::ENOENT | libc::EPIPE | libc::ECONNRESET)
                );
                if !gone {
                    eprintln!("uswap: forked process {}: {e}", pid);
                }
                if let Err(e) = link.verdict(Verdict::Unmanaged) {
                    say_unless_gone(pid, e);
                }
                return;
            }
        };
        let served = Served {
            attached,
            agent_memory: agent_memory(&hello),
            said_busy: AtomicBool::new(false),
        };
        // What the child maps from now on is found by the scans; what it
        // had at the fork is its parent's bookkeeping, copied.
        self.served.lock().expect("served lock").push(served);
    }

    /// Accepts agents until the run is over.
    fn accept_loop(&self, listener: OwnedFd) {
        while !self.done.load(Ordering::Acquire) {
            if let Some(sock) = accept_within(&listener, &self.stop) {
                self.welcome(sock);
            }
        }
    }

    /// The report as it stands.
    fn report(&self) -> Report {
        let served = self
            .served
            .lock()
            .expect("served lock")
            .iter()
            .filter(|s| s.attached.is_alive())
            .map(|s| s.attached.pid())
            .collect();
        Report::of(&self.rt, &self.program, served)
    }

    /// Answers `uswap stats`: each connection gets one report (JSON), then
    /// is closed.
    fn stats_loop(&self, listener: OwnedFd) {
        while !self.done.load(Ordering::Acquire) {
            if let Some(sock) = accept_within(&listener, &self.stop) {
                let json = serde_json::to_vec(&self.report()).expect("a report serializes");
                let mut out = std::fs::File::from(sock);
                // A client that went away meanwhile misses nothing.
                if let Err(e) = std::io::Write::write_all(&mut out, &json) {
                    if e.kind() != std::io::ErrorKind::BrokenPipe {
                        eprintln!("uswap: answering uswap stats: {e}");
                    }
                }
            }
        }
    }

    /// Answers `uswap limit` (see [`control`]) until the program has exited.
    fn control_loop(&self, listener: OwnedFd) {
        let folio = self.rt.config().folio_size as u64;
        while !self.done.load(Ordering::Acquire) {
            if let Some(sock) = accept_within(&listener, &self.stop) {
                control::serve_one(&sock, |bytes| {
                    if bytes < folio {
                        return Err(format!(
                            "a limit of {bytes} bytes is less than one folio ({folio} bytes)"
                        ));
                    }
                    self.rt
                        .set_memory_high(bytes.min(usize::MAX as u64) as usize);
                    Ok(self.rt.memory_high() as u64)
                });
            }
        }
    }

    /// Picks up new memory of every served image, and lets go of images
    /// that are gone.
    ///
    /// A full scan reads /proc/PID/maps; it runs every `every`, and sooner
    /// for an image whose resident memory (/proc/PID/statm, cheap to read)
    /// grew by a 32nd of the limit since its last scan: a program that
    /// maps and fills memory fast is caught within milliseconds, whether it
    /// maps through libc's mmap or glibc's malloc does it internally
    /// (which no symbol interposition would see).
    fn scan_loop(&self, every: Duration) {
        const LOOK: Duration = Duration::from_millis(5);
        let folio = self.rt.config().folio_size;
        let growth = (self.rt.memory_high() / 32).max(1 << 20) as u64;
        // Per image: resident bytes, untracked faults and time at its last
        // full scan.
        let mut last: std::collections::HashMap<i32, (u64, u64, Instant)> = Default::default();
        while !self.done.load(Ordering::Acquire) {
            std::thread::sleep(LOOK);
            let mut served = self.served.lock().expect("served lock");
            served.retain(|s| s.attached.is_alive());
            last.retain(|pid, _| served.iter().any(|s| s.attached.pid() == *pid));
            for s in served.iter() {
                let pid = s.attached.pid();
                let rss = resident_bytes(pid);
                let untracked = s.attached.untracked_faults();
                let (then, untracked_then, at) =
                    *last
                        .entry(pid)
                        .or_insert((0, untracked, Instant::now() - every));
                // Faults in registered memory no region tracks: the program
                // grew a managed mapping in place (as glibc's realloc does
                // with mremap), and pays a fault per page there until that
                // memory is managed, by whole folios. Scanned at the next
                // look rather than at the next period.
                if at.elapsed() < every && rss < then + growth && untracked == untracked_then {
                    continue;
                }
                // A process that exits between the check and the scan has
                // nothing more to manage.
                let _gone = manage_new_memory(s, folio).is_err();
                last.insert(pid, (rss, untracked, Instant::now()));
            }
        }
    }
}

/// Whether process `pid` has exited (or is a zombie).
fn is_gone(pid: i32) -> bool {
    uswap::sys::process_state(pid).is_none_or(|state| matches!(state, b'Z' | b'X'))
}

/// Reports a failed send to an agent, unless its process simply went away.
fn say_unless_gone(pid: i32, e: std::io::Error) {
    let hung_up = matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET));
    if !hung_up && !is_gone(pid) {
        eprintln!("uswap: telling process {pid}: {e}");
    }
}

/// Resident bytes of process `pid` (0 if it is gone).
fn resident_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Manages what of an image's memory is not managed yet.
fn manage_new_memory(s: &Served, folio: usize) -> std::io::Result<()> {
    // The program's own userfaultfd holds some of its memory: said once per
    // image, and that memory is left to it.
    let mut said_busy = false;
    let ranges = maps::unmanaged_ranges(
        s.attached.pid(),
        folio,
        &s.attached.managed(),
        &s.agent_memory,
    )?;
    for (start, len) in ranges {
        // A mapping that changed meanwhile (unmapped, or registered by the
        // program's own userfaultfd) is left alone; the next scan sees it
        // as it is then.
        match s.attached.manage(start, len) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if !said_busy && !s.said_busy.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "uswap: process {} uses userfaultfd itself; the memory it registered ({start:#x}+{len:#x}, ...) is left to it",
                        s.attached.pid()
                    );
                }
                said_busy = true;
            }
            Err(e) => {
                if std::env::var_os("USWAP_DEBUG").is_some() {
                    eprintln!("uswap: not managing {start:#x}+{len:#x}: {e}");
                }
            }
        }
    }
    Ok(())
}

impl Args {
    /// Values wrong together, and a stats file that cannot be written: a
    /// usage error (exit 2) before the program starts (after it, the
    /// program's exit status would be lost to the error).
    pub fn check(&self) -> Result<(), String> {
        self.runtime.check()?;
        if let Some(stats) = &self.stats_file {
            crate::args::writable(stats)?;
        }
        Ok(())
    }
}

pub fn run(args: &Args) -> Result<std::convert::Infallible, String> {
    let mut config = args.runtime.config(1);
    config.serve_forks = true;
    let rt = match Runtime::new(config) {
        Ok(rt) => rt,
        Err(e) if args.fallback == Fallback::Run => {
            eprintln!(
                "uswap: cannot start ({e}); running the program without uswap (--fallback run)"
            );
            let err = std::process::Command::new(&args.command[0])
                .args(&args.command[1..])
                .exec();
            return Err(format!("running {:?}: {err}", args.command[0]));
        }
        Err(e) => return Err(format!("starting the runtime: {e}")),
    };
    let name = agent_socket_name();
    let listener = listen(&name, libc::SOCK_SEQPACKET)?;
    // SAFETY: getpid has no preconditions.
    let stats_listener = listen(&stats_socket(unsafe { libc::getpid() }), libc::SOCK_STREAM)?;
    // SAFETY: getpid has no preconditions.
    let control_listener = listen(
        &control::control_socket(unsafe { libc::getpid() }),
        libc::SOCK_SEQPACKET,
    )?;
    let agent = agent_file()?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{} {p}", agent.path.display()),
        _ => agent.path.display().to_string(),
    };
    let mut child = std::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env(SOCKET_ENV, &name)
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", args.command[0]))?;
    CHILD.store(child.id() as i32, Ordering::Release);
    // The terminal's signals reach the whole process group, the program
    // included: the supervisor ignores them and lets the program decide.
    // Signals sent to the supervisor alone are passed on.
    // SAFETY: installing handlers that only call kill.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        for sig in [
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGCONT,
            libc::SIGWINCH,
        ] {
            libc::signal(sig, forward_signal as *const () as libc::sighandler_t);
        }
        libc::signal(
            libc::SIGTSTP,
            stop_with_program as *const () as libc::sighandler_t,
        );
    }
    let stop = uswap::sys::eventfd().map_err(|e| format!("eventfd: {e}"))?;
    let sup = Arc::new(Supervisor {
        rt,
        fallback: args.fallback,
        served: Mutex::new(Vec::new()),
        program: args
            .command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        refused: AtomicBool::new(false),
        agent_seen: AtomicBool::new(false),
        done: AtomicBool::new(false),
        stop,
    });
    let acceptor = {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("uswap-accept".into())
            .spawn(move || sup.accept_loop(listener))
            .map_err(|e| e.to_string())?
    };
    let scanner = {
        let sup = sup.clone();
        let every = Duration::from_millis(args.rescan_ms);
        std::thread::Builder::new()
            .name("uswap-scan".into())
            .spawn(move || sup.scan_loop(every))
            .map_err(|e| e.to_string())?
    };
    let stats = {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("uswap-stats".into())
            .spawn(move || sup.stats_loop(stats_listener))
            .map_err(|e| e.to_string())?
    };
    let control = {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("uswap-control".into())
            .spawn(move || sup.control_loop(control_listener))
            .map_err(|e| e.to_string())?
    };
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("waiting for the program: {e}")),
        }
    };
    sup.finish();
    acceptor.join().map_err(|_| "the accept thread panicked")?;
    scanner.join().map_err(|_| "the scan thread panicked")?;
    stats.join().map_err(|_| "the stats thread panicked")?;
    control.join().map_err(|_| "the control thread panicked")?;
    if let Some(path) = &args.stats_file {
        std::fs::write(path, sup.report().vmstat())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let unfit = sup.rt.stats().unfit_folios;
    if unfit > 0 {
        // Said once, at the end: the limit held for the rest of memory only.
        eprintln!(
            "uswap: {unfit} times a folio did not compress and, with no swap file, \
             stayed in memory on top of --memory-high (--swap-dir gives such memory \
             somewhere to go)"
        );
    }
    let refused = sup.refused.load(Ordering::Acquire);
    if !sup.agent_seen.load(Ordering::Acquire) {
        // The agent comes in through LD_PRELOAD, which a statically linked
        // program (a Go binary, say) and a set-user-ID one ignore: such a
        // run would pass for one held to the limit.
        eprintln!(
            "uswap: no process of this run loaded the agent (a statically linked or \
             set-user-ID program ignores LD_PRELOAD): none of its memory was managed, \
             and --memory-high did not hold it"
        );
    }
    // Images still alive (children that outlived the program) get what the
    // store holds for them, then are let go.
    drop(sup);
    drop(agent);
    if refused {
        std::process::exit(1);
    }
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    let sig = status.signal().unwrap_or(libc::SIGKILL);
    // Die the same way, so that whoever started us sees what happened, but
    // dump no core: the program dumped its own if it was to, and ours
    // would take its place where cores go to one file name (`core`, the
    // kernel's default) or stand beside it as a second crash.
    // SAFETY: a prctl on this process's own flag, restoring the default
    // action, then raising the signal.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            // Dying by a signal that dumps cores would then dump ours.
            std::process::exit(128 + sig);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    std::process::exit(128 + sig);
}

//! The supervisor's end of one agent connection: receiving the hello (and
//! the program's userfaultfd), sending the verdict, and asking the agent
//! thread to drop pages, which is how the core's reclaimer reaches the
//! program ([`DropPages`]).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use uswap::mm::memory::{Discarded, DropError, DropPages, MoveRange};
use uswap_protocol::{wire, Dropped, Hello, MovedOut, Request, Verdict, DISCARD_RANGES, PACKET};

/// One connected agent.
pub struct AgentLink {
    sock: OwnedFd,
    /// The agent's process.
    pid: libc::pid_t,
    /// The last request's number; held for a whole request and answer.
    seq: Mutex<u64>,
    /// Set while the request in flight is the last of a
    /// [`DropPages::move_out_all`] (see [`AgentLink::answered`]).
    last_of_moves: AtomicBool,
}

fn send(sock: RawFd, packet: &[u8; PACKET]) -> io::Result<()> {
    send_with(sock, packet, None)
}

/// Sends one packet, with descriptor `fd` attached if given.
fn send_with(sock: RawFd, packet: &[u8; PACKET], fd: Option<BorrowedFd>) -> io::Result<()> {
    wire::send(sock, packet, fd.map(|f| f.as_raw_fd())).map_err(io::Error::from_raw_os_error)
}

/// One packet, and the descriptor that came with it; `Ok(None)` at end of
/// file.
fn recv(sock: RawFd) -> io::Result<Option<([u8; PACKET], Option<OwnedFd>)>> {
    match wire::recv(sock) {
        Ok(Some((packet, fd))) => Ok(Some((
            packet,
            // SAFETY: a descriptor just received, owned by nobody else.
            fd.map(|raw| unsafe { OwnedFd::from_raw_fd(raw) }),
        ))),
        Ok(None) => Ok(None),
        Err(e) => Err(io::Error::from_raw_os_error(e)),
    }
}

/// What a new connection brought.
pub struct Greeting {
    pub hello: Hello,
    /// The program's userfaultfd (none if it could not create one).
    pub uffd: Option<OwnedFd>,
    /// The process's pid as this process sees it, for its /proc files and
    /// its memory: the hello's is the process's own view, another number
    /// where it runs in a pid namespace of its own (a sandbox, a
    /// container, `unshare -p`), and maybe another process's here.
    pub pid: libc::pid_t,
}

/// The pid of the process at the other end of `sock` when it connected, in
/// this process's pid namespace (SO_PEERCRED: the kernel translates it).
fn peer_pid(sock: &OwnedFd) -> io::Result<libc::pid_t> {
    let cred = super::peer_credentials(sock)?;
    if cred.pid <= 0 {
        return Err(io::Error::other("the agent's process is not visible here"));
    }
    Ok(cred.pid)
}

impl AgentLink {
    /// Reads the hello of a freshly accepted connection.
    pub fn greet(sock: OwnedFd) -> io::Result<(AgentLink, Greeting)> {
        let (packet, uffd) = recv(sock.as_raw_fd())?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the agent hung up before its hello",
            )
        })?;
        let hello = Hello::decode(&packet)
            .ok_or_else(|| io::Error::other("not an agent of this uswap version"))?;
        let pid = peer_pid(&sock)?;
        super::receive_within(&sock, ANSWER_LOOK)?;
        Ok((
            AgentLink {
                sock,
                pid,
                seq: Mutex::new(0),
                last_of_moves: AtomicBool::new(false),
            },
            Greeting { hello, uffd, pid },
        ))
    }

    /// Tells the agent what was decided.
    pub fn verdict(&self, v: Verdict) -> io::Result<()> {
        send(self.sock.as_raw_fd(), &v.encode())
    }

    /// Tells a forked child's agent it is adopted, with its descriptor (it
    /// keeps a copy, see the agent's docs).
    pub fn adopted(&self, uffd: BorrowedFd) -> io::Result<()> {
        send_with(
            self.sock.as_raw_fd(),
            &Verdict::Managed.encode(),
            Some(uffd),
        )
    }
}

impl DropPages for AgentLink {
    fn drop_pages(&self, start: usize, len: usize) -> Result<(), DropError> {
        let answer = self.ask(
            |seq| Request::Drop {
                seq,
                start: start as u64,
                len: len as u64,
            },
            |p| Dropped::decode(p).map(|d| (d.seq, d)),
        )?;
        match answer.errno {
            0 => Ok(()),
            libc::ENOMEM => Err(DropError::Unmapped),
            // From the agent's probe before the madvise: nothing dropped.
            libc::EAGAIN | libc::ENOENT => Err(DropError::Changed),
            e => Err(DropError::Failed(io::Error::from_raw_os_error(e))),
        }
    }

    fn moves_answered(&self) -> bool {
        self.answered()
    }

    fn move_out(&self, start: usize, len: usize) -> Discarded {
        let mut out = Vec::with_capacity(1);
        let range = MoveRange {
            start,
            len,
            copy: None,
        };
        self.move_out_all(&[range], &mut out);
        out[0]
    }

    /// One request per [`DISCARD_RANGES`] ranges: the agent moves them one
    /// after the other, checks each against the hash of its copy, and
    /// answers for all. (Hashed here, with the event gate let go.)
    fn move_out_all(&self, ranges: &[MoveRange<'_>], out: &mut Vec<Discarded>) {
        let requests = ranges.len().div_ceil(DISCARD_RANGES);
        for (k, chunk) in ranges.chunks(DISCARD_RANGES).enumerate() {
            let mut asked = [(0, 0, 0); DISCARD_RANGES];
            for (a, r) in asked.iter_mut().zip(chunk) {
                *a = (
                    r.start as u64,
                    r.len as u64,
                    r.copy.map_or(0, uswap_protocol::content_hash),
                );
            }
            // Before the request goes: its answer is looked for from then on.
            self.last_of_moves
                .store(k + 1 == requests, Ordering::SeqCst);
            let answer = self.ask(
                |seq| Request::Discard {
                    seq,
                    count: chunk.len(),
                    ranges: asked,
                },
                |p| {
                    MovedOut::decode(p)
                        .filter(|m| m.count == chunk.len())
                        .map(|m| (m.seq, m))
                },
            );
            for (k, r) in chunk.iter().enumerate() {
                out.push(match &answer {
                    // A link that broke moved nothing more; the drop in
                    // place that follows finds out what became of the
                    // process.
                    Err(_) => Discarded::default(),
                    Ok(a) => {
                        let (errno, moved) = a.outcomes[k];
                        let bytes = (moved as usize).min(r.len);
                        // What moved differed from the copy: back in place
                        // with nothing moved (as if pinned), or not all of
                        // it (`Discarded::stale`).
                        let changed = errno == libc::ESTALE;
                        Discarded {
                            bytes,
                            // A move that stopped part way answers EAGAIN
                            // whatever stopped it (a page shared with a
                            // forked child or pinned, whose EBUSY comes
                            // only when it is the first): the rest is tried
                            // again, which says why.
                            again: errno == libc::EAGAIN || (bytes == 0 && errno == libc::ENOENT),
                            shared: bytes < r.len && errno == libc::EBUSY || changed && bytes == 0,
                            // A read-only or locked mapping: it stays.
                            unmovable: bytes < r.len && errno == libc::EINVAL,
                            changed,
                            stale: changed && bytes > 0,
                        }
                    }
                });
            }
        }
    }
}

impl AgentLink {
    /// Whether the agent's answer to the request in flight has come (see
    /// `DropPages::moves_answered`): the agent answers a request only once
    /// all its moves have returned, and sends nothing else. Not where the
    /// connection hung up: the agent thread may be inside a move yet (see
    /// [`AgentLink::lost`]).
    ///
    /// Only the last request of a [`DropPages::move_out_all`] counts: the
    /// ranges of the next were checked with the first, and must not have
    /// the process's events read before they move.
    fn answered(&self) -> bool {
        if !self.last_of_moves.load(Ordering::SeqCst) {
            return false;
        }
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        let ready = unsafe { libc::poll(&mut p, 1, 0) };
        ready == 1
            && p.revents & libc::POLLIN != 0
            && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) == 0
    }

    /// Sends the request `make` builds with the next number, and waits for
    /// its answer, which `read` decodes into its number and contents.
    fn ask<T>(
        &self,
        make: impl FnOnce(u64) -> Request,
        read: impl FnOnce(&[u8; PACKET]) -> Option<(u64, T)>,
    ) -> Result<T, DropError> {
        let mut seq = self.seq.lock().expect("agent link lock");
        *seq += 1;
        if send(self.sock.as_raw_fd(), &make(*seq).encode()).is_err() {
            return Err(self.lost());
        }
        // One request at a time (the lock is held): the answer is to it.
        match self.answer() {
            Ok(Some((packet, _))) => match read(&packet) {
                Some((answered, t)) if answered == *seq => Ok(t),
                _ => Err(DropError::Failed(io::Error::other(
                    "the agent answered something else",
                ))),
            },
            Ok(None) => Err(self.lost()),
            // The process exited with the request in flight.
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => Err(self.lost()),
            Err(e) => Err(DropError::Failed(e)),
        }
    }
}

/// How long a wait for an agent's answer goes before it looks whether the
/// agent's thread still runs (see [`AgentLink::answer`]); the connection's
/// receive timeout, set once at its hello.
const ANSWER_LOOK: std::time::Duration = std::time::Duration::from_millis(50);

impl AgentLink {
    /// Waits for the agent's next packet, as [`recv`] does, but not past
    /// the agent thread's end. A process forked without the C library's
    /// fork handlers (`_Fork`, a raw clone) keeps a copy of the agent's
    /// socket, which the handlers would have closed: the agent's process
    /// may die with a request unanswered, and the end of file its death
    /// would bring never comes while that copy lives (the reclaimer, which
    /// asks, then waited for ever, and every process with it). A receive
    /// that times out ([`ANSWER_LOOK`]) looks at the thread; one more is
    /// made once it is found gone, in case it answered just before it
    /// ended.
    fn answer(&self) -> io::Result<Option<([u8; PACKET], Option<OwnedFd>)>> {
        let timed_out =
            |r: &io::Result<_>| matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        loop {
            let r = recv(self.sock.as_raw_fd());
            if !timed_out(&r) {
                return r;
            }
            if !agent_thread_runs(self.pid) {
                let last = recv(self.sock.as_raw_fd());
                return if timed_out(&last) { Ok(None) } else { last };
            }
        }
    }

    /// The link broke with a drop perhaps under way: the process exited, or
    /// closed the agent's descriptors (a daemon, a child between fork and
    /// exec) while the agent thread may still be inside the madvise. Its
    /// outcome is known only once that thread has ended: before, the pages
    /// could still vanish after the caller has found them present and
    /// voided their stored copy (they then read as zeros), and the drop's
    /// REMOVE event could be read after the caller stopped taking it for
    /// its own. So this waits, a few seconds at most, for the thread to end.
    fn lost(&self) -> DropError {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while agent_thread_runs(self.pid) {
            if std::time::Instant::now() > deadline {
                return DropError::Failed(io::Error::other(
                    "the agent stopped answering and its thread goes on",
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        DropError::Gone
    }
}

/// Whether a thread of process `pid` carries the agent thread's name.
fn agent_thread_runs(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("comm"))
            .is_ok_and(|c| c.trim_end() == uswap_protocol::AGENT_THREAD_NAME)
    })
}

impl Drop for AgentLink {
    fn drop(&mut self) {
        // The supervisor lets go: the agent ends quietly. A process already
        // gone cannot hear it, which is fine.
        if let Err(e) = send(self.sock.as_raw_fd(), &Request::Release.encode()) {
            if e.raw_os_error() != Some(libc::EPIPE) && e.raw_os_error() != Some(libc::ECONNRESET) {
                eprintln!("uswap: telling an agent to let go: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link over one end of a socket pair; the other end, the agent's.
    fn link() -> (AgentLink, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: socketpair fills both descriptors on success.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0, "socketpair: {}", io::Error::last_os_error());
        // SAFETY: two new descriptors, owned by nobody else.
        let (ours, agents) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let link = AgentLink {
            sock: ours,
            pid: 0,
            seq: Mutex::new(0),
            last_of_moves: AtomicBool::new(false),
        };
        (link, agents)
    }

    #[test]
    fn moves_count_as_answered_only_for_the_last_request_and_never_once_hung_up() {
        let (link, agent) = link();
        link.last_of_moves.store(true, Ordering::SeqCst);
        assert!(!link.answered(), "no answer has come");
        send(agent.as_raw_fd(), &[0; PACKET]).expect("answering");
        assert!(link.answered(), "the answer to the last request has come");
        link.last_of_moves.store(false, Ordering::SeqCst);
        assert!(
            !link.answered(),
            "an answer to a request with more of the batch to follow"
        );
        link.last_of_moves.store(true, Ordering::SeqCst);
        drop(agent);
        assert!(
            !link.answered(),
            "the agent hung up: its thread may be inside a move yet"
        );
    }
}

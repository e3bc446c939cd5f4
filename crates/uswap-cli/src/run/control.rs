//! The supervisor's control socket: `uswap limit` changes a running
//! supervisor's memory limit through it, as a write to a cgroup's
//! memory.high changes the kernel's.
//!
//! ```text
//! uswap limit SIZE [PID]                     uswap run (supervisor PID)
//!   connect @uswap-control-PID  ---------->   control thread: accept
//!                                              peer's uid: root or ours, else refused
//!   "memory-high BYTES"          ---------->   Runtime::set_memory_high
//!                                <----------   "ok BYTES" | "error WHY"
//! ```
//!
//! One request and one answer per connection, as SOCK_SEQPACKET messages
//! of plain text. The socket is abstract (no file, no file permissions), so
//! the supervisor itself checks who asks: only root and the user it runs as
//! may change its limit. Reading the counters (`uswap stats`) stays open to
//! everyone; changing what the program may keep in memory does not.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// How control socket names start; the supervisor's pid follows.
const CONTROL_PREFIX: &str = "uswap-control-";

/// How long the supervisor waits for a connected client's request: one
/// that connects and says nothing does not hold the control thread.
const REQUEST_WAIT: Duration = Duration::from_secs(1);

/// The longest request or answer.
const MESSAGE_MAX: usize = 256;

/// The abstract socket name where supervisor `pid` takes requests.
pub fn control_socket(pid: i32) -> String {
    format!("{CONTROL_PREFIX}{pid}")
}

/// What a client asks of a supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Set the memory limit to this many bytes.
    MemoryHigh(u64),
}

/// A supervisor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done: the limit is now this many bytes.
    Applied(u64),
    /// Not done, and why.
    Refused(String),
}

impl Request {
    /// The request as sent.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::MemoryHigh(bytes) => format!("memory-high {bytes}").into_bytes(),
        }
    }

    /// A request as received.
    pub fn decode(message: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(message).map_err(|_| "a request that is not text")?;
        match text.split_once(' ') {
            Some(("memory-high", bytes)) => bytes
                .parse()
                .map(Request::MemoryHigh)
                .map_err(|_| format!("a limit that is not a byte count: {bytes:?}")),
            _ => Err(format!("an unknown request: {text:?}")),
        }
    }
}

impl Reply {
    /// The answer as sent.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Applied(bytes) => format!("ok {bytes}").into_bytes(),
            Reply::Refused(why) => format!("error {why}").into_bytes(),
        }
    }

    /// An answer as received.
    pub fn decode(message: &[u8]) -> Result<Reply, String> {
        let text = String::from_utf8_lossy(message);
        match text.split_once(' ') {
            Some(("ok", bytes)) => bytes
                .parse()
                .map(Reply::Applied)
                .map_err(|_| format!("a malformed answer: {text:?}")),
            Some(("error", why)) => Ok(Reply::Refused(why.to_string())),
            _ => Err(format!("a malformed answer: {text:?}")),
        }
    }
}

/// Sends one message on `sock`.
pub(crate) fn send_message(sock: &OwnedFd, message: &[u8]) -> io::Result<()> {
    // SAFETY: a valid socket and buffer; MSG_NOSIGNAL turns a peer gone
    // into EPIPE instead of a signal.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize != message.len() => Err(io::Error::other("a message sent in part")),
        _ => Ok(()),
    }
}

/// Receives one message from `sock` (empty once the peer has closed it).
pub(crate) fn receive_message(sock: &OwnedFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MESSAGE_MAX];
    // SAFETY: a valid socket, and a buffer of `buf.len()` bytes.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Whether a peer with user id `uid` may change the limit of a supervisor
/// running as `own_uid`.
fn may_control(uid: libc::uid_t, own_uid: libc::uid_t) -> bool {
    uid == 0 || uid == own_uid
}

/// Reads one request from `sock` and answers it, with `apply` doing a
/// permitted limit change (it returns the limit now, or why it refused).
pub(super) fn serve_one(sock: &OwnedFd, apply: impl FnOnce(u64) -> Result<u64, String>) {
    let reply = (|| {
        // The request is read before anything is refused: closed with a
        // message unread, the socket would reset, and the client would see
        // that instead of the answer.
        super::receive_within(sock, REQUEST_WAIT).map_err(|e| format!("SO_RCVTIMEO: {e}"))?;
        let message = receive_message(sock).map_err(|e| format!("reading the request: {e}"))?;
        let cred = super::peer_credentials(sock).map_err(|e| format!("SO_PEERCRED: {e}"))?;
        // SAFETY: geteuid has no preconditions.
        let own = unsafe { libc::geteuid() };
        if !may_control(cred.uid, own) {
            return Err(format!(
                "permission denied: user {} may not change the limit of a supervisor \
                 running as user {own}",
                cred.uid
            ));
        }
        match Request::decode(&message)? {
            Request::MemoryHigh(bytes) => apply(bytes),
        }
    })();
    let reply = match reply {
        Ok(bytes) => Reply::Applied(bytes),
        Err(why) => Reply::Refused(why),
    };
    // A client that went away meanwhile misses only its answer.
    if let Err(e) = send_message(sock, &reply.encode()) {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("uswap: answering uswap limit: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_read_back_as_sent() {
        let r = Request::MemoryHigh(16 << 20);
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        for reply in [
            Reply::Applied(1 << 30),
            Reply::Refused("no such thing".into()),
        ] {
            assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        }
    }

    #[test]
    fn malformed_requests_and_replies_are_errors() {
        assert!(Request::decode(b"memory-high").is_err());
        assert!(Request::decode(b"memory-high 12M").is_err());
        assert!(Request::decode(b"memory-low 12").is_err());
        assert!(Request::decode(&[0xff, 0xfe]).is_err());
        assert!(Reply::decode(b"ok twelve").is_err());
        assert!(Reply::decode(b"").is_err());
    }

    #[test]
    fn only_root_and_the_supervisors_own_user_may_change_the_limit() {
        assert!(may_control(0, 1000));
        assert!(may_control(1000, 1000));
        assert!(!may_control(1001, 1000));
        assert!(!may_control(1000, 0));
    }
}

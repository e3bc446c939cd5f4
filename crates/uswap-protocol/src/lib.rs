//! The messages between `uswap run` (the supervisor) and its agent, the
//! library preloaded into the program it serves.
//!
//! One unix `SOCK_SEQPACKET` connection per process image, to the abstract
//! socket named in [`SOCKET_ENV`]. Every message is one fixed-size packet
//! of native-endian words:
//!
//! ```text
//! agent                                   supervisor
//!   Hello {pid, agent's own memory, beacon,  -> (+ the userfaultfd, SCM_RIGHTS,
//!          error, flags}
//!                                               unless error != 0; none for
//!                                               a forked child, whose
//!                                               descriptor came with the
//!                                               fork event)
//!        <------- Verdict {Managed | Unmanaged | Exit}
//!   (agent thread, if Managed)
//!        <------- Discard {seq, start, len}   (moves, where the kernel can)
//!   Dropped {seq, errno, moved} ----------->
//!        <------- Drop {seq, start, len}      (probe, then MADV_DONTNEED in place)
//!   Dropped {seq, errno, moved: 0} -------->
//!        <------- Release          (the supervisor lets go; the agent ends
//!                                    quietly. Without it, end of file means
//!                                    the supervisor died: the agent kills
//!                                    the program rather than let it read
//!                                    pages that are gone.)
//! ```

#![deny(missing_docs)]
#![no_std]

pub mod wire;

/// The agent thread's name (`/proc/PID/task/TID/comm`): the supervisor
/// looks for it to know when a thread it lost contact with has ended.
pub const AGENT_THREAD_NAME: &str = "uswap-agent";
/// The same, for `prctl(PR_SET_NAME)`.
pub const AGENT_THREAD_NAME_C: &core::ffi::CStr = c"uswap-agent";

/// The environment variable naming the supervisor's abstract socket.
pub const SOCKET_ENV: &str = "USWAP_AGENT_SOCKET";
/// Same, NUL-terminated, for `getenv` before `main`.
pub const SOCKET_ENV_C: &core::ffi::CStr = c"USWAP_AGENT_SOCKET";

/// Marks a Hello, and the protocol's version.
pub const MAGIC: u64 = 0x7573_7761_7004;

/// The agent's first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The program's process id.
    pub pid: i32,
    /// 0, or the errno that kept the agent from creating a userfaultfd
    /// (then no descriptor comes with the message).
    pub error: i32,
    /// The agent's own memory, never to be managed: its thread's stack,
    /// then its scratch (see [`Request::Discard`]).
    pub own_start: u64,
    /// End of the agent's own memory.
    pub own_end: u64,
    /// A page the agent never touches; a forked child touches its copy to
    /// say which address space is its.
    pub beacon: u64,
    /// Sent from a forked child (no descriptor comes with it).
    pub forked: bool,
}

/// What the supervisor decided about a program image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Managed: the agent starts its thread.
    Managed,
    /// Run unmanaged (the user asked for it with `--fallback run`).
    Unmanaged,
    /// Do not run: the agent ends the process with status 1.
    Exit,
}

/// A request from the supervisor to the agent thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// MADV_DONTNEED `start..start + len`, once a write-protect probe
    /// through the program's userfaultfd finds the range wholly registered
    /// and no event unread (EAGAIN or ENOENT otherwise, and nothing
    /// dropped); answered with a [`Dropped`].
    Drop {
        /// Echoed in the answer.
        seq: u64,
        /// Page-aligned start.
        start: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The supervisor lets go of the program: the agent ends quietly.
    Release,
    /// Moves the pages of `start..start + len` (at most a scratch's worth,
    /// 2 MiB) out with UFFDIO_MOVE, through the program's userfaultfd, into
    /// the agent's scratch (registered with that descriptor for
    /// write-protect faults only), which the agent empties when it is full:
    /// unlike a drop in place, this raises no REMOVE event. Answered with a
    /// [`Dropped`] that says how many bytes from `start` went, and the
    /// errno that stopped the move: EAGAIN (an event is unread) or ENOENT
    /// (the range is no longer wholly registered) before anything moved,
    /// and the supervisor settles the events and asks again; any other,
    /// and it drops the rest in place.
    Discard {
        /// Echoed in the answer.
        seq: u64,
        /// Page-aligned start.
        start: u64,
        /// Length in bytes.
        len: u64,
    },
}

/// The agent's answer to a [`Request::Drop`] or a [`Request::Discard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// The request's.
    pub seq: u64,
    /// 0, or the errno of madvise (a drop in place) or of the move (a
    /// discard: see [`Request::Discard`]).
    pub errno: i32,
    /// Bytes from the start moved out (a discard).
    pub moved: u64,
}

/// Bytes of every packet. Every kind of packet has codes of its own in its
/// first word (requests 1, 2 and 4, answers 3, verdicts 11-13, hellos
/// [`MAGIC`]),
/// so that none can be read as another.
pub const PACKET: usize = 48;

fn words(w: [u64; 6]) -> [u8; PACKET] {
    let mut out = [0u8; PACKET];
    for (k, v) in w.iter().enumerate() {
        out[k * 8..k * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    out
}

fn unwords(b: &[u8; PACKET]) -> [u64; 6] {
    let mut w = [0u64; 6];
    for (k, v) in w.iter_mut().enumerate() {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[k * 8..k * 8 + 8]);
        *v = u64::from_ne_bytes(x);
    }
    w
}

impl Hello {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        words([
            MAGIC,
            (self.pid as u32 as u64) | ((self.error as u32 as u64) << 32),
            self.own_start,
            self.own_end,
            self.beacon,
            self.forked as u64,
        ])
    }

    /// Reads a packet; `None` if it is not a Hello of this version.
    pub fn decode(b: &[u8; PACKET]) -> Option<Hello> {
        let w = unwords(b);
        (w[0] == MAGIC).then_some(Hello {
            pid: w[1] as u32 as i32,
            error: (w[1] >> 32) as u32 as i32,
            own_start: w[2],
            own_end: w[3],
            beacon: w[4],
            forked: w[5] & 1 != 0,
        })
    }
}

impl Verdict {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        words([
            match self {
                Verdict::Managed => 11,
                Verdict::Unmanaged => 12,
                Verdict::Exit => 13,
            },
            0,
            0,
            0,
            0,
            0,
        ])
    }

    /// Reads a packet.
    pub fn decode(b: &[u8; PACKET]) -> Option<Verdict> {
        match unwords(b)[0] {
            11 => Some(Verdict::Managed),
            12 => Some(Verdict::Unmanaged),
            13 => Some(Verdict::Exit),
            _ => None,
        }
    }
}

impl Request {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        match *self {
            Request::Drop { seq, start, len } => words([1, seq, start, len, 0, 0]),
            Request::Release => words([2, 0, 0, 0, 0, 0]),
            Request::Discard { seq, start, len } => words([4, seq, start, len, 0, 0]),
        }
    }

    /// Reads a packet.
    pub fn decode(b: &[u8; PACKET]) -> Option<Request> {
        let w = unwords(b);
        match w[0] {
            1 => Some(Request::Drop {
                seq: w[1],
                start: w[2],
                len: w[3],
            }),
            2 => Some(Request::Release),
            4 => Some(Request::Discard {
                seq: w[1],
                start: w[2],
                len: w[3],
            }),
            _ => None,
        }
    }
}

impl Dropped {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        words([3, self.seq, self.errno as u32 as u64, self.moved, 0, 0])
    }

    /// Reads a packet.
    pub fn decode(b: &[u8; PACKET]) -> Option<Dropped> {
        let w = unwords(b);
        (w[0] == 3).then_some(Dropped {
            seq: w[1],
            errno: w[2] as u32 as i32,
            moved: w[3],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_as_written() {
        let h = Hello {
            pid: 1234,
            error: -1,
            own_start: 0x7f00_0000_0000,
            own_end: 0x7f00_0024_0000,
            beacon: 0x7f00_0030_0000,
            forked: true,
        };
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        let h = Hello { forked: false, ..h };
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        for v in [Verdict::Managed, Verdict::Unmanaged, Verdict::Exit] {
            assert_eq!(Verdict::decode(&v.encode()), Some(v));
        }
        let r = Request::Drop {
            seq: 7,
            start: 0x1000,
            len: 0x10000,
        };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        let m = Request::Discard {
            seq: 8,
            start: 0x2000,
            len: 0x20000,
        };
        assert_eq!(Request::decode(&m.encode()), Some(m));
        assert_eq!(Dropped::decode(&m.encode()), None);
        assert_eq!(
            Request::decode(&Request::Release.encode()),
            Some(Request::Release)
        );
        let d = Dropped {
            seq: 9,
            errno: 12,
            moved: 0x3000,
        };
        assert_eq!(Dropped::decode(&d.encode()), Some(d));
        // No kind of packet reads as another.
        assert_eq!(Dropped::decode(&r.encode()), None);
        assert_eq!(Hello::decode(&r.encode()), None);
        for v in [Verdict::Managed, Verdict::Unmanaged, Verdict::Exit] {
            assert_eq!(Request::decode(&v.encode()), None);
            assert_eq!(Verdict::decode(&r.encode()), None);
            assert_eq!(Verdict::decode(&Request::Release.encode()), None);
        }
    }
}

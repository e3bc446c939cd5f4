//! The messages between `uswap run` (the supervisor) and its agent, the
//! library preloaded into the program it serves.
//!
//! One unix `SOCK_SEQPACKET` connection per process image, to the abstract
//! socket named in [`SOCKET_ENV`]. Every message is one fixed-size packet
//! of native-endian words ([`PACKET`] bytes, the unused words zero):
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
//!        <------- Discard {seq, ranges}      (moves, where the kernel can;
//!                                             up to DISCARD_RANGES at once,
//!                                             each with the hash of what
//!                                             the supervisor stored of it)
//!   MovedOut {seq, (errno, moved) per range} ->
//!        <------- Drop {seq, start, len}      (probe, then MADV_DONTNEED in place)
//!   Dropped {seq, errno} ----------------->
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
pub const MAGIC: u64 = 0x7573_7761_7007;

/// Pages of the agent's at [`Hello::beacon`]: the beacon, then the fence,
/// which the agent touches in the parent after each fork (the fault waits
/// until the supervisor has applied the fork's event) and leaves
/// unpopulated again.
pub const BEACON_PAGES: usize = 2;

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
    /// say which address space is its. The fence follows it (see
    /// [`BEACON_PAGES`]).
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
// Not boxed: the agent must not allocate (it runs where the program's
// malloc may be held), and one request at a time lives on its stack.
#[allow(clippy::large_enum_variant)]
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
    /// Moves the pages of each of `ranges[..count]` (page-aligned start and
    /// length, each at most a scratch's worth, 2 MiB) out with
    /// UFFDIO_MOVE, through the program's userfaultfd, into the agent's
    /// scratch (registered with that descriptor for write-protect faults
    /// only), which the agent empties when it is full: unlike a drop in
    /// place, this raises no REMOVE event. One request carries a whole
    /// eviction batch's ranges, so that the batch costs one round trip to
    /// the agent rather than one per range. Answered with a [`MovedOut`]
    /// that says, per range, how many bytes from its start went and the
    /// errno that stopped its move: EAGAIN (an event is unread) or ENOENT
    /// (the range is no longer wholly registered) before anything moved,
    /// and the supervisor settles the events and asks again; any other, and
    /// it drops the rest in place.
    ///
    /// A range with an expected hash (not 0) must have moved out holding
    /// the bytes it hashes to ([`content_hash`]): the supervisor's copy,
    /// which it stored. A page pinned for a device's write (O_DIRECT) can
    /// change after that copy with no write-protect fault, and move once
    /// unpinned. So the agent hashes what it moved; where that differs, or
    /// where the move stopped part way (what moved cannot be checked alone),
    /// it moves the pages back and answers ESTALE (EBUSY where the move had
    /// stopped) with nothing moved. ESTALE with the bytes moved counted:
    /// they could not all go back (an event of the program came in
    /// meanwhile), and the pages not back hold bytes the supervisor does not
    /// have.
    Discard {
        /// Echoed in the answer.
        seq: u64,
        /// How many of `ranges` are asked for (at most [`DISCARD_RANGES`]).
        count: usize,
        /// (start, length, expected hash or 0) in bytes; those past `count`
        /// are zero.
        ranges: [(u64, u64, u64); DISCARD_RANGES],
    },
}

/// The most ranges one [`Request::Discard`] carries: a whole eviction
/// batch (`compress_batchsize` is at most 32) of folios not adjacent.
pub const DISCARD_RANGES: usize = 32;

/// The agent's answer to a [`Request::Discard`]: per range asked for, in
/// order, the errno that stopped its move (0: none) and the bytes from its
/// start that moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovedOut {
    /// The request's.
    pub seq: u64,
    /// The request's count.
    pub count: usize,
    /// (errno, bytes moved) per range; those past `count` are zero.
    pub outcomes: [(i32, u64); DISCARD_RANGES],
}

/// The agent's answer to a [`Request::Drop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// The request's.
    pub seq: u64,
    /// 0, or the errno of madvise.
    pub errno: i32,
}

/// Words of every packet: a code, a number, a count, and three words per
/// range of a [`Request::Discard`] (or per outcome of a [`MovedOut`]).
const WORDS: usize = 3 + 3 * DISCARD_RANGES;

/// Bytes of every packet. Every kind of packet has codes of its own in its
/// first word (requests 1, 2 and 4, answers 3 and 5, verdicts 11-13, hellos
/// [`MAGIC`]), so that none can be read as another.
pub const PACKET: usize = 8 * WORDS;

/// A packet of `head` followed by zeros.
fn words(head: &[u64]) -> [u8; PACKET] {
    let mut out = [0u8; PACKET];
    for (k, v) in head.iter().enumerate() {
        out[k * 8..k * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    out
}

fn unwords(b: &[u8; PACKET]) -> [u64; WORDS] {
    let mut w = [0u64; WORDS];
    for (k, v) in w.iter_mut().enumerate() {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[k * 8..k * 8 + 8]);
        *v = u64::from_ne_bytes(x);
    }
    w
}

/// The three words per range of a [`Request::Discard`] or [`MovedOut`].
type Triples = [(u64, u64, u64); DISCARD_RANGES];

/// A packet of `code`, `seq`, `count`, then `count` triples of words.
fn triples(
    code: u64,
    seq: u64,
    count: usize,
    triples: impl Iterator<Item = (u64, u64, u64)>,
) -> [u8; PACKET] {
    debug_assert!(count <= DISCARD_RANGES, "{count} ranges in one packet");
    let mut w = [0u64; WORDS];
    w[0] = code;
    w[1] = seq;
    w[2] = count as u64;
    for (k, (a, b, c)) in triples.take(count.min(DISCARD_RANGES)).enumerate() {
        w[3 + 3 * k] = a;
        w[4 + 3 * k] = b;
        w[5 + 3 * k] = c;
    }
    words(&w)
}

/// The count and triples of a packet [`triples`] wrote; `None` for a count
/// past [`DISCARD_RANGES`].
fn untriples(w: &[u64; WORDS]) -> Option<(usize, Triples)> {
    let count = usize::try_from(w[2])
        .ok()
        .filter(|&c| c <= DISCARD_RANGES)?;
    let mut out = [(0, 0, 0); DISCARD_RANGES];
    for (k, t) in out.iter_mut().enumerate().take(count) {
        *t = (w[3 + 3 * k], w[4 + 3 * k], w[5 + 3 * k]);
    }
    Some((count, out))
}

/// A hash of `bytes` (a whole number of 8-byte words), never 0: the
/// expected contents of a range asked to move out ([`Request::Discard`]).
/// Four lanes of multiply and rotate over the words: each step is a
/// bijection of the lane for a given word and of the word for a given
/// lane, so bytes that differ in one word reach the final mix apart, and two
/// copies of a range that differ anywhere do but for a chance of about
/// 2^-63 (the lowest bit is set, so that 0 can mean "no hash"; two words
/// apart may then hash alike with that chance too). Not a defence against
/// a chosen collision: it checks a copy against the memory it was taken
/// from.
pub fn content_hash(bytes: &[u8]) -> u64 {
    const K: [u64; 4] = [
        0x9e37_79b9_7f4a_7c15,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
        0xd6e8_feb8_6659_fd93,
    ];
    debug_assert!(bytes.len().is_multiple_of(8), "{} bytes", bytes.len());
    let word = |b: &[u8]| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let mut lanes = K;
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane = (*lane ^ word(&block[8 * j..]))
                .wrapping_mul(K[j])
                .rotate_left(29);
        }
    }
    for (j, w) in blocks.remainder().chunks_exact(8).enumerate() {
        lanes[j] = (lanes[j] ^ word(w)).wrapping_mul(K[j]).rotate_left(29);
    }
    let mut h = bytes.len() as u64;
    for lane in lanes {
        h = (h ^ lane).wrapping_mul(K[0]).rotate_left(31);
    }
    // Murmur3's finalizer, a bijection: every bit of `h` reaches all.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h | 1
}

impl Hello {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        words(&[
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
        words(&[match self {
            Verdict::Managed => 11,
            Verdict::Unmanaged => 12,
            Verdict::Exit => 13,
        }])
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
            Request::Drop { seq, start, len } => words(&[1, seq, start, len]),
            Request::Release => words(&[2]),
            Request::Discard { seq, count, ranges } => triples(4, seq, count, ranges.into_iter()),
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
            4 => {
                let (count, ranges) = untriples(&w)?;
                Some(Request::Discard {
                    seq: w[1],
                    count,
                    ranges,
                })
            }
            _ => None,
        }
    }
}

impl Dropped {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        words(&[3, self.seq, self.errno as u32 as u64])
    }

    /// Reads a packet.
    pub fn decode(b: &[u8; PACKET]) -> Option<Dropped> {
        let w = unwords(b);
        (w[0] == 3).then_some(Dropped {
            seq: w[1],
            errno: w[2] as u32 as i32,
        })
    }
}

impl MovedOut {
    /// The packet.
    pub fn encode(&self) -> [u8; PACKET] {
        let outcomes = self.outcomes.iter().map(|&(e, m)| (e as u32 as u64, m, 0));
        triples(5, self.seq, self.count, outcomes)
    }

    /// Reads a packet.
    pub fn decode(b: &[u8; PACKET]) -> Option<MovedOut> {
        let w = unwords(b);
        if w[0] != 5 {
            return None;
        }
        let (count, read) = untriples(&w)?;
        let mut outcomes = [(0, 0); DISCARD_RANGES];
        for (o, &(e, m, _)) in outcomes.iter_mut().zip(&read) {
            *o = (e as u32 as i32, m);
        }
        Some(MovedOut {
            seq: w[1],
            count,
            outcomes,
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
        let mut ranges = [(0, 0, 0); DISCARD_RANGES];
        for (k, r) in ranges.iter_mut().enumerate() {
            *r = (
                0x2000 * (k as u64 + 1),
                0x1000 * (k as u64 + 1),
                k as u64 * 77,
            );
        }
        for count in [1, 3, DISCARD_RANGES] {
            let mut asked = [(0, 0, 0); DISCARD_RANGES];
            asked[..count].copy_from_slice(&ranges[..count]);
            let m = Request::Discard {
                seq: 8,
                count,
                ranges: asked,
            };
            assert_eq!(Request::decode(&m.encode()), Some(m));
            assert_eq!(Dropped::decode(&m.encode()), None);
            assert_eq!(MovedOut::decode(&m.encode()), None);
            let mut outcomes = [(0, 0); DISCARD_RANGES];
            for (k, o) in outcomes.iter_mut().enumerate().take(count) {
                *o = (if k % 2 == 0 { 0 } else { libc::EBUSY }, 0x1000 * k as u64);
            }
            let a = MovedOut {
                seq: 8,
                count,
                outcomes,
            };
            assert_eq!(MovedOut::decode(&a.encode()), Some(a));
            assert_eq!(Request::decode(&a.encode()), None);
            assert_eq!(Dropped::decode(&a.encode()), None);
        }
        // A count past the most a packet holds is not a request.
        let mut bad = Request::Discard {
            seq: 1,
            count: 1,
            ranges,
        }
        .encode();
        bad[16..24].copy_from_slice(&(DISCARD_RANGES as u64 + 1).to_ne_bytes());
        assert_eq!(Request::decode(&bad), None);
        assert_eq!(
            Request::decode(&Request::Release.encode()),
            Some(Request::Release)
        );
        let d = Dropped { seq: 9, errno: 12 };
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

    #[test]
    fn content_hashes_tell_every_changed_word_and_are_never_zero() {
        let mut page = [0u8; 4096];
        for (k, b) in page.iter_mut().enumerate() {
            *b = (k * 7 % 251) as u8;
        }
        let h = content_hash(&page);
        assert_ne!(h, 0);
        assert_eq!(content_hash(&page), h);
        assert_ne!(content_hash(&[0u8; 4096]), 0);
        // One byte changed anywhere (in each lane, and in the tail past the
        // last whole block) changes the hash.
        for at in [0, 1, 8, 17, 31, 32, 4095] {
            let mut changed = page;
            changed[at] ^= 0x40;
            assert_ne!(content_hash(&changed), h, "byte {at}");
        }
        assert_ne!(content_hash(&page[..4088]), content_hash(&page[..4080]));
        // Words swapped between lanes, or between blocks, change it too.
        let mut swapped = page;
        swapped[..8].copy_from_slice(&page[8..16]);
        swapped[8..16].copy_from_slice(&page[..8]);
        assert_ne!(content_hash(&swapped), h);
        let mut swapped = page;
        swapped[..8].copy_from_slice(&page[32..40]);
        swapped[32..40].copy_from_slice(&page[..8]);
        assert_ne!(content_hash(&swapped), h);
    }
}

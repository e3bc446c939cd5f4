//! Packets on the wire: one [`PACKET`] per `sendmsg`/`recvmsg` on a unix
//! `SOCK_SEQPACKET` socket, with at most one descriptor passed alongside
//! (SCM_RIGHTS), and the address of an abstract socket. Shared by both
//! ends; nothing here allocates (the agent calls it where the program's
//! malloc must not be used).

use crate::PACKET;

/// The calling thread's errno.
fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Room for one descriptor's control message, aligned for `cmsghdr`.
type Control = [u64; 4];

/// Sends `packet`, with descriptor `fd` attached if given; retries when
/// interrupted. `Err(errno)` otherwise.
pub fn send(sock: i32, packet: &[u8; PACKET], fd: Option<i32>) -> Result<(), i32> {
    let mut iov = libc::iovec {
        iov_base: packet.as_ptr() as *mut _,
        iov_len: PACKET,
    };
    let mut control: Control = [0; 4];
    // SAFETY: a zeroed msghdr is a valid value; the fields set below point
    // at buffers that live until the call returns.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let size = core::mem::size_of::<i32>() as u32;
        // SAFETY: the control buffer holds one cmsghdr and an int
        // (CMSG_SPACE(4) = 24 <= 32 bytes), which CMSG_FIRSTHDR and
        // CMSG_DATA address inside it.
        unsafe {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(size) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size) as _;
            core::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
        }
    }
    loop {
        // SAFETY: `msg` describes live buffers for the call's duration.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n == PACKET as isize {
            return Ok(());
        }
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        return Err(if n < 0 { errno() } else { libc::EMSGSIZE });
    }
}

/// A packet, and the descriptor that came with it, if any.
pub type Received = ([u8; PACKET], Option<i32>);

/// Receives one packet and the descriptor that came with it (close-on-exec);
/// `Ok(None)` at end of file, `Err(errno)` on an error (a packet of the
/// wrong size is `EMSGSIZE`). Retries when interrupted.
pub fn recv(sock: i32) -> Result<Option<Received>, i32> {
    let mut buf = [0u8; PACKET];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: PACKET,
    };
    let mut control: Control = [0; 4];
    // SAFETY: a zeroed msghdr is a valid value; its pointers are set to
    // buffers that live until the call returns.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = core::mem::size_of::<Control>() as _;
    let n = loop {
        // SAFETY: `msg` describes live buffers for the call's duration.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(errno());
    }
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote into `control`;
    // every descriptor passed is ours from here on.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                // Every descriptor sent in one call comes in one message:
                // the first is kept, any other closed.
                let data = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for k in 0..data / core::mem::size_of::<i32>() {
                    let raw = core::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>().add(k));
                    match fd {
                        None => fd = Some(raw),
                        Some(_) => {
                            libc::close(raw);
                        }
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    match n {
        0 => {
            if let Some(fd) = fd {
                // SAFETY: a descriptor received above, nobody else's.
                unsafe { libc::close(fd) };
            }
            Ok(None)
        }
        // A longer packet comes cut to this size, and says so.
        n if n == PACKET as isize && msg.msg_flags & libc::MSG_TRUNC == 0 => Ok(Some((buf, fd))),
        _ => {
            if let Some(fd) = fd {
                // SAFETY: a descriptor received above, nobody else's.
                unsafe { libc::close(fd) };
            }
            Err(libc::EMSGSIZE)
        }
    }
}

/// The address of the abstract unix socket `name` (a NUL, then the name)
/// and its length; `None` if the name does not fit.
pub fn abstract_addr(name: &[u8]) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: a zeroed sockaddr_un is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > addr.sun_path.len() {
        return None;
    }
    for (k, b) in name.iter().enumerate() {
        addr.sun_path[k + 1] = *b as libc::c_char;
    }
    let len = core::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Some((addr, len as libc::socklen_t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> [i32; 2] {
        let mut fds = [0i32; 2];
        // SAFETY: a plain system call writing two descriptors into `fds`.
        let r =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
        assert_eq!(r, 0);
        fds
    }

    /// Found in review: a peer sending three descriptors in one message
    /// left two of them open in the receiver (only the first of a control
    /// message was looked at).
    #[test]
    fn descriptors_past_the_first_are_closed() {
        let [a, b] = pair();
        let packet = [7u8; PACKET];
        // Three copies of a pipe's read end in one message: once the one
        // kept and the pipe's own are closed, a write finds no reader
        // (EPIPE; SIGPIPE is ignored in Rust programs) unless a copy was
        // left open.
        let mut pipe = [0i32; 2];
        // SAFETY: a plain system call writing two descriptors into `pipe`.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let [r, w] = pipe;
        let sent = [r, r, r];
        let mut control = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: packet.as_ptr() as *mut _,
            iov_len: PACKET,
        };
        // SAFETY: a zeroed msghdr is valid; its pointers go to live buffers,
        // and the control message is written within `control`.
        unsafe {
            let mut msg: libc::msghdr = core::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(12) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(12) as _;
            core::ptr::copy_nonoverlapping(sent.as_ptr(), libc::CMSG_DATA(cmsg).cast(), 3);
            assert_eq!(libc::sendmsg(a, &msg, 0), PACKET as isize);
        }
        let (got, fd) = recv(b).unwrap().unwrap();
        assert_eq!(got, packet);
        let fd = fd.expect("the first descriptor");
        // SAFETY: closing our own descriptors, then writing a byte.
        let wrote = unsafe {
            libc::close(fd);
            libc::close(r);
            libc::write(w, [0u8].as_ptr().cast(), 1)
        };
        assert_eq!(
            (wrote, errno()),
            (-1, libc::EPIPE),
            "a copy of the read end was left open"
        );
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(w);
            libc::close(a);
            libc::close(b);
        }
    }

    /// Found in review: a longer packet came cut to the packet size and was
    /// taken for a whole one.
    #[test]
    fn a_longer_packet_is_refused() {
        let [a, b] = pair();
        let long = [1u8; 2 * PACKET];
        // SAFETY: sending a live buffer.
        let n = unsafe { libc::send(a, long.as_ptr().cast(), long.len(), 0) };
        assert_eq!(n, long.len() as isize);
        assert_eq!(recv(b).err(), Some(libc::EMSGSIZE));
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(a);
            libc::close(b);
        }
    }
}

//! `uswap limit SIZE [PID]`: changes the memory limit of a running `uswap
//! run`, as a write to a cgroup's memory.high does. Lowered, the supervisor
//! compresses away what is over it at once; raised, its program keeps more
//! in memory from then on. The supervisor's control socket takes the
//! request (see `run::control`).

use crate::run::connect;
use crate::run::control::{self, control_socket, Reply, Request};

#[derive(clap::Args)]
pub struct Args {
    /// The new limit (as --memory-high takes it: 512M, 2G, ...), at least
    /// one folio.
    #[arg(value_parser = crate::args::size)]
    size: u64,
    /// A supervisor's pid, or the pid of a program it serves (by default the
    /// only supervisor running).
    pid: Option<i32>,
}

pub fn run(args: &Args) -> Result<(), String> {
    let supervisor = crate::stats::supervisor_of(args.pid)?;
    let sock = connect(&control_socket(supervisor), libc::SOCK_SEQPACKET)
        .map_err(|e| format!("supervisor {supervisor} takes no requests: {e}"))?;
    control::send_message(&sock, &Request::MemoryHigh(args.size).encode())
        .map_err(|e| format!("asking supervisor {supervisor}: {e}"))?;
    let answer = control::receive_message(&sock)
        .map_err(|e| format!("the answer of supervisor {supervisor}: {e}"))?;
    if answer.is_empty() {
        return Err(format!("supervisor {supervisor} ended before it answered"));
    }
    match Reply::decode(&answer)? {
        Reply::Applied(bytes) => {
            println!("memory_high {bytes}");
            Ok(())
        }
        Reply::Refused(why) => Err(format!("supervisor {supervisor} refused: {why}")),
    }
}

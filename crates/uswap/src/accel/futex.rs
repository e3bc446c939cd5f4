//! Sleeping on and waking an atomic word (Linux futex).
//!
//! Completion words live in the caller's batch. An engine may wake the word
//! just after the caller, having seen the work finished, has returned and
//! reused that memory: a futex wake on such an address is harmless (at worst
//! a spurious wake-up, which every futex waiter tolerates), whereas touching
//! a `Thread` handle stored there would not be.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, for at most `timeout`.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT only reads the aligned u32 behind `word`, which is
    // alive for this call; `ts` outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every thread sleeping on the word at `addr`. The memory need not be
/// alive any more: the kernel only uses the address as a key.
pub(crate) fn wake_all(addr: *const AtomicU32) {
    // SAFETY: FUTEX_WAKE does not dereference the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

//! Waiting on several file descriptors at once (`ppoll`).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// What to wait for on one descriptor, and what happened.
#[derive(Debug, Clone, Copy)]
pub struct PollFd {
    pub fd: RawFd,
    pub read: bool,
    pub write: bool,
    /// Set by [`wait`]: readable, or closed / in error (a read will tell which).
    pub readable: bool,
    /// Set by [`wait`]: writable, or in error.
    pub writable: bool,
}

impl PollFd {
    pub fn new(fd: RawFd, read: bool, write: bool) -> PollFd {
        PollFd {
            fd,
            read,
            write,
            readable: false,
            writable: false,
        }
    }
}

/// Wait until one of `fds` is ready or `timeout` passes (zero: only look), then fill in
/// `readable` and `writable`. A signal ends the wait early (not an error).
pub fn wait(fds: &mut [PollFd], timeout: Duration) -> io::Result<()> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|entry| libc::pollfd {
            fd: entry.fd,
            events: (if entry.read { libc::POLLIN } else { 0 })
                | (if entry.write { libc::POLLOUT } else { 0 }),
            revents: 0,
        })
        .collect();
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: pollfds is a valid array of its length; the timespec lives across the call.
    let result = unsafe {
        libc::ppoll(
            pollfds.as_mut_ptr(),
            pollfds.len() as libc::nfds_t,
            &timeout,
            std::ptr::null(),
        )
    };
    for entry in fds.iter_mut() {
        entry.readable = false;
        entry.writable = false;
    }
    if result < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(error);
    }
    let trouble = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
    for (entry, polled) in fds.iter_mut().zip(&pollfds) {
        entry.readable = polled.revents & (libc::POLLIN | trouble) != 0;
        entry.writable = polled.revents & (libc::POLLOUT | trouble) != 0;
    }
    Ok(())
}

/// Give the CPU to another runnable thread, if there is one (busy-poll mode).
pub fn yield_cpu() {
    // SAFETY: no arguments, no memory.
    unsafe {
        libc::sched_yield();
    }
}

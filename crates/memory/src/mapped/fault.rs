//! The fault thread of a [`MappedMemory`](super::MappedMemory): it reads userfaultfd events
//! and serves them.
//!
//! * A **missing page** is fetched with one `read_lines` call (its 64 lines) and installed
//!   with `UFFDIO_COPY`: write-protected when writes are tracked by write-protect faults, so
//!   the first write to it faults again; a write fault on a missing page installs it writable
//!   and dirty at once (the fetched bytes are its clean copy).
//! * A **write-protect fault** marks the page dirty, keeping a copy of its bytes as they were
//!   (the page is protected, so nothing has changed them since it was fetched or persisted),
//!   and lifts the protection.
//! * A fetch that fails is retried with backoff; past the policy's attempts the faulting
//!   thread is sent SIGBUS (see [`FaultPolicy`](super::FaultPolicy)).
//!
//! The thread never touches a page that is not present (that would fault to itself), and
//! holds the view's state lock while it changes a page's protection or presence, so
//! `persist` and `invalidate` see each page either before or after a fault, never halfway.

use std::collections::btree_map::Entry;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use super::{lock, Shared, Tracking, PAGE, PAGE_LINES};
use crate::store::LineStore;
use crate::uffd::{
    UffdMsg, UFFD_EVENT_PAGEFAULT, UFFD_PAGEFAULT_FLAG_WP, UFFD_PAGEFAULT_FLAG_WRITE,
};

/// A page-aligned page: `UFFDIO_COPY` wants an aligned source.
#[repr(C, align(4096))]
struct PageBuf([u8; PAGE]);

/// Serves faults until the stop descriptor becomes readable.
pub(super) fn run<S: LineStore>(shared: &Shared<S>) {
    let mut msgs = [UffdMsg::default(); 16];
    let mut buf = Box::new(PageBuf([0; PAGE]));
    loop {
        match wait(shared.uffd.raw(), shared.stop.raw(), None) {
            Ok(Woken::Stop) => return,
            Ok(Woken::Timeout) => continue,
            Ok(Woken::Events) => {}
            Err(e) => {
                record_os_error(shared, "poll", &e);
                continue;
            }
        }
        let n = match shared.uffd.read_events(&mut msgs) {
            Ok(n) => n,
            Err(e) => {
                record_os_error(shared, "read", &e);
                continue;
            }
        };
        for msg in &msgs[..n] {
            if msg.event != UFFD_EVENT_PAGEFAULT {
                continue;
            }
            let offset = (msg.address as usize).wrapping_sub(shared.map.base);
            if offset >= shared.map.len {
                continue;
            }
            let page = offset / PAGE;
            let served = if msg.flags & UFFD_PAGEFAULT_FLAG_WP != 0 {
                write_protect_fault(shared, page);
                true
            } else {
                missing_fault(shared, page, msg, &mut buf.0)
            };
            if !served {
                return; // stopping
            }
        }
    }
}

fn record_os_error<S>(shared: &Shared<S>, what: &str, e: &io::Error) {
    let mut state = lock(&shared.state);
    state.stats.os_errors += 1;
    state.stats.last_os_error = Some(format!("{what}: {e}"));
}

/// Fetches and installs `page`. False when told to stop while retrying.
fn missing_fault<S: LineStore>(
    shared: &Shared<S>,
    page: usize,
    msg: &UffdMsg,
    buf: &mut [u8; PAGE],
) -> bool {
    let addr = shared.map.base + page * PAGE;
    let first = shared.first_line + (page * PAGE_LINES) as u64;
    if lock(&shared.state).present[page] {
        // Several threads faulted on the page; the first one's fetch installed it.
        let _ = shared.uffd.wake(addr, PAGE);
        return true;
    }
    let policy = &shared.policy;
    let mut backoff = policy.first_backoff;
    let mut failures = 0u32;
    loop {
        let result = lock(&shared.store).read_lines(first, PAGE_LINES as u64, &mut buf[..]);
        let Err(e) = result else { break };
        failures += 1;
        {
            let mut state = lock(&shared.state);
            state.stats.fetch_failures += 1;
            state.stats.last_fetch_error = Some(e);
        }
        if policy.attempts.is_some_and(|a| failures >= a) {
            lock(&shared.state).stats.unserved_faults += 1;
            sigbus(msg.ptid);
            return true;
        }
        if let Ok(Woken::Stop) = wait(shared.stop.raw(), shared.stop.raw(), Some(backoff)) {
            return false;
        }
        backoff = (backoff * 2).min(policy.max_backoff);
    }

    let mut state = lock(&shared.state);
    if state.present[page] {
        // Installed meanwhile (cannot happen while only this thread installs pages).
        let _ = shared.uffd.wake(addr, PAGE);
        return true;
    }
    let wp = shared.tracking == Tracking::WriteProtect;
    let write = msg.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0;
    // SAFETY: `buf` is a readable, page-aligned page; `addr` is a page of the registered
    // mapping, not present.
    let copied = unsafe { shared.uffd.copy(buf.as_ptr(), addr, PAGE, wp && !write) };
    match copied {
        Ok(()) => {
            state.present[page] = true;
            state.stats.missing_faults += 1;
            if wp && write {
                // Installed writable: the faulting thread writes once woken, and the state
                // lock keeps `persist` out until the clean copy is recorded.
                state.dirty.insert(page, Box::new(*buf));
                state.stats.write_faults += 1;
            }
        }
        Err(e) => {
            if e.raw_os_error() == Some(libc::EEXIST) {
                state.present[page] = true;
            } else {
                state.stats.os_errors += 1;
                state.stats.last_os_error = Some(format!("UFFDIO_COPY: {e}"));
            }
            // The faulting thread tries again (and faults again if the page is still
            // missing).
            let _ = shared.uffd.wake(addr, PAGE);
        }
    }
    true
}

/// A write to a write-protected page: dirty it and let the write through.
fn write_protect_fault<S>(shared: &Shared<S>, page: usize) {
    let addr = shared.map.base + page * PAGE;
    let mut state = lock(&shared.state);
    if !state.present[page] {
        // The page was dropped (invalidated) after the fault was raised: the thread will
        // fault again as missing.
        let _ = shared.uffd.wake(addr, PAGE);
        return;
    }
    let state = &mut *state;
    if let Entry::Vacant(entry) = state.dirty.entry(page) {
        let mut clean = Box::new([0u8; PAGE]);
        // SAFETY: the page is present (so reading it does not fault) and write-protected (so
        // no thread changes it while it is copied).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, clean.as_mut_ptr(), PAGE) };
        entry.insert(clean);
        state.stats.write_faults += 1;
    }
    if let Err(e) = shared.uffd.write_protect(addr, PAGE, false) {
        state.stats.os_errors += 1;
        state.stats.last_os_error = Some(format!("UFFDIO_WRITEPROTECT: {e}"));
        let _ = shared.uffd.wake(addr, PAGE);
    }
}

/// Sends SIGBUS to the faulting thread (the whole process if the kernel did not say which).
fn sigbus(tid: u32) {
    // SAFETY: plain system calls; a signal the faulting thread (or process) takes like a bus
    // error on a truncated file mapping.
    unsafe {
        if tid != 0 {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                tid as libc::pid_t,
                libc::SIGBUS,
            );
        } else {
            libc::kill(libc::getpid(), libc::SIGBUS);
        }
    }
}

enum Woken {
    Events,
    Stop,
    Timeout,
}

/// Waits for `fd` to become readable, the stop descriptor, or `timeout`.
fn wait(fd: RawFd, stop: RawFd, timeout: Option<Duration>) -> io::Result<Woken> {
    let mut fds = [
        libc::pollfd {
            fd: stop,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = match timeout {
        Some(t) => t.as_millis().min(i32::MAX as u128) as libc::c_int,
        None => -1,
    };
    // SAFETY: `fds` is an array of two pollfds.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(Woken::Timeout);
        }
        return Err(err);
    }
    if fds[0].revents != 0 {
        Ok(Woken::Stop)
    } else if fds[1].revents != 0 {
        Ok(Woken::Events)
    } else {
        Ok(Woken::Timeout)
    }
}

//! How an event loop waits for its next datagram or timer, CPU pinning, and the clock.

use std::io;
use std::os::fd::RawFd;
use std::str::FromStr;
use std::time::{Duration, Instant};

use pmnet_proto::Time;

/// How a loop with nothing to do waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Sleep in `ppoll(2)` until a socket is readable or the next timer is due. Cheap on CPU,
    /// but a wake-up on another vCPU costs tens of microseconds on a virtual machine.
    #[default]
    Blocking,
    /// Never sleep: poll the sockets in a loop, yielding the CPU between empty polls (so that
    /// several busy processes pinned to one vCPU take turns instead of running out their time
    /// slices). Burns a CPU; gives the lowest latency.
    BusyPoll,
    /// Spin (as [`WaitMode::BusyPoll`]) for this many microseconds after the last turn that
    /// did something, then sleep (as [`WaitMode::Blocking`]): the next request of a busy
    /// client finds the loop awake, and an idle loop costs nothing.
    Spin(u32),
}

impl WaitMode {
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Blocking => "blocking",
            WaitMode::BusyPoll => "busy-poll",
            WaitMode::Spin(_) => "spin-then-block",
        }
    }

    /// The mode in words, for banners: `blocking`, `busy-poll`, `spin 200 µs, then blocking`.
    pub fn describe(self) -> String {
        match self {
            WaitMode::Spin(micros) => format!("spin {micros} µs, then blocking"),
            other => other.name().to_owned(),
        }
    }

    pub fn from_busy_poll(busy_poll: bool) -> WaitMode {
        WaitMode::from_args(busy_poll, 0)
    }

    /// `--busy-poll` wins; else `--spin-us N` (0: blocking).
    pub fn from_args(busy_poll: bool, spin_us: u32) -> WaitMode {
        match (busy_poll, spin_us) {
            (true, _) => WaitMode::BusyPoll,
            (false, 0) => WaitMode::Blocking,
            (false, micros) => WaitMode::Spin(micros),
        }
    }

    /// Whether the loop may sleep in `ppoll` at all.
    pub fn sleeps(self) -> bool {
        !matches!(self, WaitMode::BusyPoll)
    }
}

impl FromStr for WaitMode {
    type Err = String;
    fn from_str(text: &str) -> Result<WaitMode, String> {
        match text {
            "blocking" => Ok(WaitMode::Blocking),
            "busy-poll" | "busy" => Ok(WaitMode::BusyPoll),
            other => Err(format!(
                "unknown wait mode {other:?}: expected blocking or busy-poll"
            )),
        }
    }
}

/// What to wait for on one descriptor, and what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollFd {
    pub fd: RawFd,
    pub read: bool,
    pub write: bool,
    /// Set by [`poll`]: readable, or closed / in error (a read will tell which).
    pub readable: bool,
    /// Set by [`poll`]: writable, or in error.
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
/// `readable` and `writable`. A signal ends the wait early (not an error). The one `ppoll`
/// wrapper of the project: every loop waits through it.
pub fn poll(fds: &mut [PollFd], timeout: Duration) -> io::Result<()> {
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

/// Wait until one of `fds` is readable (or writable, where asked), or `timeout` passes: a
/// shorthand of [`poll`] for sockets always read. Bit `i` of the result is set when `fds[i]`
/// has something to receive (or an error to report); zero after a timeout or a signal. Only
/// the first 64 descriptors are reported.
pub fn wait_for_sockets(fds: &[(RawFd, bool)], timeout: Duration) -> io::Result<u64> {
    let mut polled: Vec<PollFd> = fds
        .iter()
        .map(|&(fd, write)| PollFd::new(fd, true, write))
        .collect();
    poll(&mut polled, timeout)?;
    Ok(polled
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, entry)| entry.readable)
        .fold(0, |mask, (index, _)| mask | 1 << index))
}

/// Give the CPU to another runnable thread on it, if there is one.
pub fn yield_cpu() {
    // SAFETY: no arguments, no memory.
    unsafe {
        libc::sched_yield();
    }
}

/// CPUs this machine has online.
pub fn online_cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let count = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if count > 0 {
        count as usize
    } else {
        1
    }
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<(), String> {
    let online = online_cpu_count();
    if cpu >= online || cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!(
            "cannot pin to CPU {cpu}: this machine has {online} online CPUs (0..={}); choose \
             one of those",
            online.saturating_sub(1)
        ));
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it (cpu is below
    // CPU_SETSIZE); sched_setaffinity reads it.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if result != 0 {
        return Err(format!(
            "cannot pin to CPU {cpu}: {}; check the CPUs this process may use (taskset -p $$)",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The state machines' clock: nanoseconds since the runtime started.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    pub fn now(&self) -> Time {
        Time::since(self.epoch, Instant::now())
    }

    /// The instant `time` stands for.
    pub fn instant(&self, time: Time) -> Instant {
        self.epoch + Duration::from_nanos(time.as_nanos())
    }

    /// How long from now until `deadline` (zero if it has passed).
    pub fn until(&self, deadline: Time) -> Duration {
        deadline.saturating_duration_since(self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_to_a_missing_cpu_says_which_exist() {
        let error = pin_current_thread(100_000).unwrap_err();
        assert!(error.contains("online CPUs"), "{error}");
    }

    #[test]
    fn wait_modes_parse() {
        assert_eq!("busy-poll".parse::<WaitMode>(), Ok(WaitMode::BusyPoll));
        assert_eq!("blocking".parse::<WaitMode>(), Ok(WaitMode::Blocking));
        assert!("sometimes".parse::<WaitMode>().is_err());
    }
}

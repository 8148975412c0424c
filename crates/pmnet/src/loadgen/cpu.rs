//! CPU time per request of each part of the system: the clients, the device and the server.
//!
//! Every figure is CPU time (user and system, as the scheduler accounts it) spent by the part's
//! threads while the mode was measured, divided by the requests measured. The clients read
//! their own thread clocks when they start and stop measuring; the device's and the server's
//! threads (in-process targets) are read from the scheduler's statistics
//! (`/proc/self/task/TID/schedstat`) by the benchmark's main thread at the same two moments,
//! and running processes from the `process_cpu_seconds_total` of their metrics endpoints (which
//! they refresh every 100 ms).
//! Kernel work done for a thread (its sends, its receives, and the loopback delivery its sends
//! trigger) counts as that thread's.

use serde::Serialize;

/// The id of the calling thread, as `/proc` names it.
pub fn current_tid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// CPU time the calling thread has run, in nanoseconds.
pub fn own_cpu_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec that lives across the call.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    if result != 0 {
        return 0;
    }
    (time.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(time.tv_nsec as u64)
}

/// CPU time thread `tid` of this process has run, in nanoseconds; `None` if it has gone or the
/// kernel keeps no scheduler statistics.
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Where a part's CPU time is read.
#[derive(Debug, Clone)]
pub enum CpuSource {
    /// Threads of this process (added up).
    Threads(Vec<i32>),
    /// A running process, from its metrics endpoint.
    Process(std::net::SocketAddr),
}

impl CpuSource {
    fn read_ns(&self) -> Option<u64> {
        match self {
            CpuSource::Threads(tids) => tids.iter().map(|tid| thread_cpu_ns(*tid)).sum(),
            CpuSource::Process(addr) => {
                let addr = *addr;
                let text =
                    pmnet_runtime::metrics::scrape(addr, std::time::Duration::from_secs(2)).ok()?;
                let seconds =
                    pmnet_runtime::metrics::find_sample(&text, "process_cpu_seconds_total", "")?;
                Some((seconds * 1e9) as u64)
            }
        }
    }
}

/// CPU time a thread ran between two readings, in nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSpan {
    start: Option<u64>,
    end: Option<u64>,
}

impl CpuSpan {
    pub fn start(&mut self, now_ns: Option<u64>) {
        self.start = now_ns;
    }

    pub fn end(&mut self, now_ns: Option<u64>) {
        if self.start.is_some() && self.end.is_none() {
            self.end = now_ns;
        }
    }

    pub fn is_started(&self) -> bool {
        self.start.is_some()
    }

    /// Nanoseconds between the readings, if both were taken.
    pub fn ns(&self) -> Option<u64> {
        Some(self.end?.saturating_sub(self.start?))
    }
}

/// The device's and the server's threads (in-process targets), read at the start and the end
/// of a mode's measured stretch.
#[derive(Debug)]
pub struct SystemCpu {
    device: Option<(CpuSource, CpuSpan)>,
    server: Option<(CpuSource, CpuSpan)>,
}

impl SystemCpu {
    /// Where the device's and the server's CPU time is read; `None` for a part that is not on
    /// the mode's path or cannot be read.
    pub fn new(device: Option<CpuSource>, server: Option<CpuSource>) -> SystemCpu {
        SystemCpu {
            device: device.map(|source| (source, CpuSpan::default())),
            server: server.map(|source| (source, CpuSpan::default())),
        }
    }

    pub fn start(&mut self) {
        for (source, span) in [&mut self.device, &mut self.server].into_iter().flatten() {
            span.start(source.read_ns());
        }
    }

    pub fn end(&mut self) {
        for (source, span) in [&mut self.device, &mut self.server].into_iter().flatten() {
            span.end(source.read_ns());
        }
    }

    pub fn is_started(&self) -> bool {
        [&self.device, &self.server]
            .into_iter()
            .flatten()
            .any(|(_, span)| span.is_started())
    }

    /// Per request, with the clients' total `client_ns` (if measured) over `requests`.
    pub fn per_request(&self, client_ns: Option<u64>, requests: u64) -> Option<CpuPerRequest> {
        if requests == 0 {
            return None;
        }
        let per = |ns: Option<u64>| ns.map(|ns| ns as f64 / 1000.0 / requests as f64);
        let span =
            |part: &Option<(CpuSource, CpuSpan)>| part.as_ref().and_then(|(_, span)| span.ns());
        let out = CpuPerRequest {
            client_us: per(client_ns).map(round2),
            device_us: per(span(&self.device)).map(round2),
            server_us: per(span(&self.server)).map(round2),
        };
        (out.client_us.is_some() || out.device_us.is_some() || out.server_us.is_some())
            .then_some(out)
    }
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// CPU µs per request measured, by part (`None`: not measured, e.g. an external process).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuPerRequest {
    pub client_us: Option<f64>,
    pub device_us: Option<f64>,
    pub server_us: Option<f64>,
}

impl CpuPerRequest {
    /// The parts measured, added up.
    pub fn total_us(&self) -> f64 {
        round2(
            [self.client_us, self.device_us, self.server_us]
                .into_iter()
                .flatten()
                .sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_clocks_see_a_busy_thread_and_a_sleeping_one_costs_nothing() {
        let tid = current_tid();
        let sched_before = thread_cpu_ns(tid).expect("this kernel keeps scheduler statistics");
        let own_before = own_cpu_ns();
        // Spin until this thread's own clock says 20 ms of CPU (not wall time: a loaded
        // machine only makes this take longer).
        let mut spin = 0u64;
        while own_cpu_ns() - own_before < 20_000_000 {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        // The scheduler's statistics agree, give or take the tick they may lag by.
        let sched = thread_cpu_ns(tid).unwrap() - sched_before;
        assert!(sched >= 10_000_000, "{sched} ns");
        let before = own_cpu_ns();
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(own_cpu_ns() - before < 5_000_000, "sleeping costs no CPU");
        assert_eq!(thread_cpu_ns(-1), None, "no such thread");
    }

    #[test]
    fn per_request_divides_what_was_measured_and_leaves_out_what_was_not() {
        let mut system = SystemCpu::new(None, None);
        system.start();
        system.end();
        assert_eq!(system.per_request(None, 10), None);
        let cpu = system.per_request(Some(20_000), 10).unwrap();
        assert_eq!(cpu.client_us, Some(2.0));
        assert_eq!(cpu.device_us, None);
        assert_eq!(cpu.total_us(), 2.0);
        assert_eq!(system.per_request(Some(20_000), 0), None);
    }
}

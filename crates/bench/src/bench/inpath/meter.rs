//! What a measured stretch cost, and who paid: CPU time of the device and the server
//! (`/proc/PID/stat`, utime + stime of all their threads), of this process (the load
//! generator: client threads, the UDP sender and receiver, the TCP ends), of the kernel's
//! `ksoftirqd` threads, and of the whole machine (`/proc/stat`); what is left of the machine's
//! busy time is other processes' (a build running beside the benchmark shows there).
//!
//! On veth, the kernel's network work (delivery to the peer, IP forwarding in the router's
//! namespace, the XDP program, the receiver's socket) runs as a softirq in the context of the
//! process that sent the packet, and is that process's CPU time; only what the kernel defers
//! runs in ksoftirqd. (The softirq column of `/proc/stat` counts ticks that fell in that work
//! whichever task it ran for, so it is not added: it would count the same time twice.) The
//! machine's figure comes from ticks, the processes' from the scheduler's clock: they agree to
//! a few percent.

use std::time::{Duration, Instant};

use crate::procs::cpu_seconds_of;

use super::bed::Bed;
use super::traffic::FlowCounters;

/// One reading of the clocks and the counters.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    at: Instant,
    /// Busy CPU seconds of the machine (user, nice, system, irq, softirq, steal).
    machine: f64,
    /// The ksoftirqd threads.
    ksoftirqd: f64,
    /// This process.
    bench: f64,
    device: Option<f64>,
    server: Option<f64>,
    sent: u64,
    received: u64,
}

/// The difference of two readings: seconds of wall time, CPU seconds of each part, counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Span {
    pub seconds: f64,
    pub machine: f64,
    pub ksoftirqd: f64,
    pub bench: f64,
    pub device: Option<f64>,
    pub server: Option<f64>,
    pub sent: u64,
    pub received: u64,
}

impl Span {
    /// CPU seconds of other processes: the machine's busy time less the benchmark's own
    /// processes and ksoftirqd.
    pub fn others(&self) -> f64 {
        (self.machine
            - self.ksoftirqd
            - self.bench
            - self.device.unwrap_or(0.0)
            - self.server.unwrap_or(0.0))
        .max(0.0)
    }
}

/// Busy CPU seconds of the machine so far (`/proc/stat`).
fn machine_seconds() -> f64 {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = text.lines().find(|line| line.starts_with("cpu ")) else {
        return 0.0;
    };
    // user nice system idle iowait irq softirq steal ...
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map_while(|field| field.parse().ok())
        .collect();
    let at = |index: usize| ticks.get(index).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    // SAFETY: sysconf(3) with a valid name reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy as f64 / hz
}

/// The process ids of the kernel's `ksoftirqd/N` threads.
fn ksoftirqd_pids() -> &'static [u32] {
    static PIDS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    PIDS.get_or_init(|| {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.starts_with("ksoftirqd/"))
            })
            .collect()
    })
}

/// Read every clock now, and the flow's counters if there is one.
pub fn read(bed: &Bed, flow: Option<&FlowCounters>) -> Reading {
    use std::sync::atomic::Ordering;
    let (device, server) = bed.cpu_seconds();
    let machine = machine_seconds();
    let ksoftirqd: f64 = ksoftirqd_pids()
        .iter()
        .filter_map(|&pid| cpu_seconds_of(pid))
        .sum();
    Reading {
        at: Instant::now(),
        machine,
        ksoftirqd,
        bench: cpu_seconds_of(std::process::id()).unwrap_or(0.0),
        device,
        server,
        sent: flow.map_or(0, |flow| flow.sent.load(Ordering::Relaxed)),
        received: flow.map_or(0, |flow| flow.received.load(Ordering::Relaxed)),
    }
}

impl Reading {
    pub fn since(&self, before: &Reading) -> Span {
        let diff = |after: Option<f64>, before: Option<f64>| Some(after? - before?);
        Span {
            seconds: self.at.duration_since(before.at).as_secs_f64(),
            machine: self.machine - before.machine,
            ksoftirqd: self.ksoftirqd - before.ksoftirqd,
            bench: self.bench - before.bench,
            device: diff(self.device, before.device),
            server: diff(self.server, before.server),
            sent: self.sent.saturating_sub(before.sent),
            received: self.received.saturating_sub(before.received),
        }
    }
}

/// Read at `start + warmup` and at `start + warmup + duration`, sleeping in between; `None`
/// when `stopped` says the work ended (or was stopped) before the second reading.
pub fn measure(
    bed: &Bed,
    flow: Option<&FlowCounters>,
    start: Instant,
    warmup: Duration,
    duration: Duration,
    stopped: impl Fn() -> bool,
) -> Option<Span> {
    let wait_until = |when: Instant| -> bool {
        loop {
            let now = Instant::now();
            if now >= when {
                return true;
            }
            if stopped() {
                return false;
            }
            std::thread::sleep((when - now).min(Duration::from_millis(20)));
        }
    };
    let from = start + warmup;
    if !wait_until(from) {
        return None;
    }
    let first = read(bed, flow);
    if !wait_until(from + duration) {
        return None;
    }
    Some(read(bed, flow).since(&first))
}

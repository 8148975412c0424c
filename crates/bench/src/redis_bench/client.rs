//! The benchmark's clients: a synchronous RESP connection that counts the requests it sends by
//! the path the pmnet gateway gives them (update or bypass), and the closed loop that runs one
//! client per thread, one operation at a time, and measures the operations of the measured
//! interval.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pmnet_runtime::Shutdown;

use super::conn::{command, ClientOps, Conn, OpError, OpKind};
use super::cpu;
use super::workloads::Workload;
use pmnet::loadgen::{new_histogram, record};

/// Error messages kept per round (the count is kept in full).
const ERROR_SAMPLES: usize = 5;

/// Errors after which a round stops early: something is broken, measuring on is pointless.
const MAX_ERRORS: u64 = 1000;

/// When a round runs and how it is measured.
pub struct RoundPlan<'a> {
    pub addr: SocketAddr,
    pub clients: u32,
    pub round: u32,
    pub warmup: Duration,
    pub duration: Duration,
    pub shutdown: &'a Shutdown,
    /// Print a progress line on stderr (a terminal) every second, with this label.
    pub progress: Option<String>,
    /// The parts whose CPU time is read when the measured interval starts and ends.
    pub cpu_parts: &'a [cpu::Part],
}

/// What one round of one system measured.
pub struct RoundOutcome {
    pub all: Histogram<u64>,
    pub updates: Histogram<u64>,
    /// Operations completed in the measured interval (all, and updates).
    pub ops: u64,
    pub update_ops: u64,
    pub seconds: f64,
    /// Requests of the measured operations, by the gateway's routing.
    pub update_requests: u64,
    pub bypass_requests: u64,
    /// Failed operations (warm-up included) and connections that could not be made.
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub interrupted: bool,
    /// The CPU time each part spent in the measured interval (`None`: the round stopped
    /// before it began).
    pub cpu: Option<cpu::Spent>,
}

struct Tally {
    all: Histogram<u64>,
    updates: Histogram<u64>,
    update_requests: u64,
    bypass_requests: u64,
    errors: u64,
    error_samples: Vec<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            all: new_histogram(),
            updates: new_histogram(),
            update_requests: 0,
            bypass_requests: 0,
            errors: 0,
            error_samples: Vec::new(),
        }
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(what);
        }
    }
}

/// Connect, retrying for a few seconds (a gateway that has just started).
fn connect(addr: SocketAddr) -> io::Result<Conn> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Conn::connect(addr) {
            Ok(conn) => return Ok(conn),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// One client's closed loop until `until` (or a stop), then a fence: a bypass read on the
/// same connection, which the gateway orders after the connection's updates, so that when it
/// returns every update of this client has been applied at Redis.
fn client_loop(
    ops: &mut dyn ClientOps,
    plan: &RoundPlan<'_>,
    measure_from: Instant,
    until: Instant,
    stop: &AtomicBool,
    completed: &AtomicU64,
) -> Tally {
    let mut tally = Tally::new();
    let mut conn = match connect(plan.addr) {
        Ok(conn) => conn,
        Err(error) => {
            tally.error(format!("cannot connect to {}: {error}", plan.addr));
            stop.store(true, Ordering::Relaxed);
            return tally;
        }
    };
    while !stop.load(Ordering::Relaxed) && !plan.shutdown.is_requested() {
        let started = Instant::now();
        if started >= until {
            break;
        }
        let (updates_before, bypass_before) = (conn.update_requests, conn.bypass_requests);
        let result = ops.op(&mut conn);
        let ended = Instant::now();
        completed.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(kind) => {
                if started >= measure_from && ended <= until {
                    let nanos =
                        u64::try_from(ended.duration_since(started).as_nanos()).unwrap_or(u64::MAX);
                    record(&mut tally.all, nanos);
                    if kind == OpKind::Update {
                        record(&mut tally.updates, nanos);
                    }
                    tally.update_requests += conn.update_requests - updates_before;
                    tally.bypass_requests += conn.bypass_requests - bypass_before;
                }
            }
            Err(OpError::Io(error)) => {
                tally.error(format!("connection: {error}"));
                match connect(plan.addr) {
                    Ok(fresh) => conn = fresh,
                    Err(error) => {
                        tally.error(format!("cannot reconnect to {}: {error}", plan.addr));
                        break;
                    }
                }
            }
            Err(error) => tally.error(error.to_string()),
        }
        if tally.errors >= MAX_ERRORS {
            stop.store(true, Ordering::Relaxed);
        }
    }
    if let Err(error) = conn.cmd(command!["EXISTS", "pmnet-bench:fence"]) {
        tally.error(format!("the closing read failed: {error}"));
    }
    tally
}

/// Run `clients` clients of `workload` against `plan.addr` for the warm-up and the measured
/// interval.
pub fn run_round(workload: &dyn Workload, plan: &RoundPlan<'_>) -> RoundOutcome {
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let until = measure_from + plan.duration;
    let stop = AtomicBool::new(false);
    let completed = AtomicU64::new(0);
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (mut cpu_start, mut cpu_end) = (None, None);
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..plan.clients)
            .map(|index| {
                let mut ops = workload.client(index, plan.round);
                let (stop, completed) = (&stop, &completed);
                scope.spawn(move || {
                    client_loop(ops.as_mut(), plan, measure_from, until, stop, completed)
                })
            })
            .collect();
        let mut last_print = Instant::now();
        while !handles.iter().all(|handle| handle.is_finished()) {
            // Wake at the measured interval's start and end to read the parts' CPU time.
            let now = Instant::now();
            if cpu_start.is_none() && now >= measure_from {
                cpu_start = Some(cpu::read(plan.cpu_parts));
            }
            if cpu_end.is_none() && now >= until {
                cpu_end = Some(cpu::read(plan.cpu_parts));
            }
            let next = [
                (cpu_start.is_none()).then_some(measure_from),
                (cpu_end.is_none()).then_some(until),
            ]
            .into_iter()
            .flatten()
            .map(|at| at.saturating_duration_since(now))
            .fold(Duration::from_millis(50), Duration::min);
            std::thread::sleep(next);
            if let Some(label) = plan.progress.as_ref().filter(|_| terminal) {
                if last_print.elapsed() >= Duration::from_secs(1) {
                    last_print = Instant::now();
                    let phase = if Instant::now() < measure_from {
                        "warm-up"
                    } else {
                        "measuring"
                    };
                    eprint!(
                        "\r  {label}: {phase}, {:.0} s of {:.0} s, {} operations   ",
                        start.elapsed().as_secs_f64(),
                        (plan.warmup + plan.duration).as_secs_f64(),
                        completed.load(Ordering::Relaxed)
                    );
                }
            }
        }
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| {
                    let mut tally = Tally::new();
                    tally.error("a client thread panicked".to_owned());
                    tally
                })
            })
            .collect()
    });
    // Cut short by a stop: the measured interval ended when the clients did.
    if cpu_start.is_some() && cpu_end.is_none() {
        cpu_end = Some(cpu::read(plan.cpu_parts));
    }
    let cpu = cpu_start
        .zip(cpu_end)
        .map(|(start, end)| cpu::spent(plan.cpu_parts, &start, &end));
    let measured = Instant::now()
        .saturating_duration_since(measure_from)
        .min(plan.duration);
    if plan.progress.is_some() && terminal {
        eprint!("\r{:100}\r", "");
    }
    let mut outcome = RoundOutcome {
        all: new_histogram(),
        updates: new_histogram(),
        ops: 0,
        update_ops: 0,
        seconds: measured.as_secs_f64(),
        update_requests: 0,
        bypass_requests: 0,
        errors: 0,
        error_samples: Vec::new(),
        interrupted: plan.shutdown.is_requested(),
        cpu,
    };
    for tally in tallies {
        let _ = outcome.all.add(&tally.all);
        let _ = outcome.updates.add(&tally.updates);
        outcome.update_requests += tally.update_requests;
        outcome.bypass_requests += tally.bypass_requests;
        outcome.errors += tally.errors;
        for sample in tally.error_samples {
            if outcome.error_samples.len() < ERROR_SAMPLES {
                outcome.error_samples.push(sample);
            }
        }
    }
    outcome.ops = outcome.all.len();
    outcome.update_ops = outcome.updates.len();
    outcome
}

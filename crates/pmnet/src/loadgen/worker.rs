//! The client threads: closed loops that keep `window` requests in flight and time each one.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pmnet_proto::{ClientEvent, Completion};
use pmnet_runtime::udp::BatchSocket;
use pmnet_runtime::{ClientSession, SessionOptions, WaitMode};
use pmnet_wire::{Header, Packet, PacketType};

use super::latency::{new_histogram, record};
use super::workload::{RequestGenerator, Workload};

/// An echo datagram not answered within this long is counted failed and replaced (UDP echo
/// has no retransmission of its own).
const ECHO_GIVE_UP: Duration = Duration::from_secs(1);

/// Longest single wait of a blocking client, so it notices the end of the run.
pub(super) const MAX_WAIT: Duration = Duration::from_millis(50);

/// A client that completes nothing for this long gives up: the target is not answering.
const STALL_LIMIT: Duration = Duration::from_secs(10);

pub(super) fn stalled(plan: &ClientPlan, last_progress: Instant, now: Instant) -> Option<String> {
    (now.duration_since(last_progress) >= STALL_LIMIT).then(|| {
        format!(
            "no reply from {} for {} s: is it running, and is it what the mode expects?",
            plan.peer,
            STALL_LIMIT.as_secs()
        )
    })
}

/// What every client thread of one mode shares.
#[derive(Debug)]
pub struct Shared {
    /// Set to stop every client now (a signal, or the request count was reached).
    pub stop: AtomicBool,
    /// Requests measured so far, all clients together.
    pub measured: AtomicU64,
    /// Requests completed so far including the warm-up (for the progress line).
    pub completed: AtomicU64,
    /// Requests measured so far by the server their key belongs to (a rack's clients; with a
    /// read cache, the requests that reached a server).
    pub per_server: Vec<AtomicU64>,
    /// Updates each client has drawn so far (a rack's clients): a value read back whose stamp
    /// names client c's write n must have n below this.
    pub writes_drawn: Vec<AtomicU64>,
}

impl Shared {
    /// What the `clients` clients of a run over `servers` servers share.
    pub fn new(servers: u16, clients: u32) -> Arc<Shared> {
        Arc::new(Shared {
            stop: AtomicBool::new(false),
            measured: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            per_server: (0..servers.max(1)).map(|_| AtomicU64::new(0)).collect(),
            writes_drawn: (0..clients).map(|_| AtomicU64::new(0)).collect(),
        })
    }
}

/// How one client thread runs.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    pub index: u32,
    pub peer: SocketAddr,
    /// The device's other workers: the session goes to one of `peer` and these by its id.
    pub more_peers: Vec<SocketAddr>,
    pub server_id: u16,
    /// What `peer` is, for the warning when it does not answer: a device, or the server itself
    /// (baseline mode) ([`SessionOptions::peer_role`]).
    pub peer_role: (&'static str, &'static str),
    /// Raw UDP echo instead of a PMNet session.
    pub echo: bool,
    pub wait: WaitMode,
    pub cpu: Option<usize>,
    pub window: u32,
    pub workload: Workload,
    pub seed: u64,
    /// Authenticate the session's datagrams with these keys.
    pub keys: Option<pmnet_runtime::KeySet>,
    /// Requests started before this are warm-up: not recorded.
    pub measure_from: Instant,
    /// Requests completing after this are not recorded, and the client stops (`None`: stop
    /// when `requests` have been measured).
    pub measure_until: Option<Instant>,
    pub requests: Option<u64>,
    /// A rack client's sessions, one per server (`None`: one session to `peer`).
    pub rack: Option<RackRoute>,
    /// The run's rank → key permutation, when popularity changes during the run.
    pub popularity: Option<super::workload::SharedPopularity>,
}

/// Where a rack client's sessions go: one per server, in server order.
#[derive(Debug, Clone)]
pub struct RackRoute {
    /// The peer of each server's session: the device's port, or (baseline) the server.
    pub peers: Vec<SocketAddr>,
    /// The id of each server.
    pub server_ids: Vec<u16>,
    /// The sessions' first retransmission timeout: longer than a limited server's queue, so
    /// that waiting for tokens does not turn into retransmissions.
    pub retransmit_timeout: Duration,
    /// The device caches reads: updates go as keyed updates, reads as cache reads.
    pub cache: bool,
}

/// What one client thread measured.
#[derive(Debug)]
pub struct ClientOutcome {
    pub updates: Histogram<u64>,
    pub bypass: Histogram<u64>,
    pub failed: u64,
    pub acked_by_device: u64,
    pub answered_by_server: u64,
    pub retransmissions: u64,
    /// When the last measured request completed.
    pub last_measured: Option<Instant>,
    /// CPU time this thread ran from the start of the measured stretch to its end.
    pub cpu_ns: Option<u64>,
    pub error: Option<String>,
    /// Requests measured by the server their key belongs to (a rack client).
    pub per_server: Vec<u64>,
    /// A rack client's reads: answered by the device (a cache hit) and by a server.
    pub reads_by_device: Histogram<u64>,
    pub reads_by_server: Histogram<u64>,
    /// Reads whose reply was checked against the writes drawn, and those that named no write
    /// of their key ever drawn (or did not decode): a value out of nowhere.
    pub reads_checked: u64,
    pub reads_unexplained: u64,
    /// The first unexplained reply, described.
    pub first_unexplained: Option<String>,
}

impl ClientOutcome {
    pub(super) fn new() -> ClientOutcome {
        ClientOutcome {
            updates: new_histogram(),
            bypass: new_histogram(),
            failed: 0,
            acked_by_device: 0,
            answered_by_server: 0,
            retransmissions: 0,
            last_measured: None,
            cpu_ns: None,
            error: None,
            per_server: Vec::new(),
            reads_by_device: new_histogram(),
            reads_by_server: new_histogram(),
            reads_checked: 0,
            reads_unexplained: 0,
            first_unexplained: None,
        }
    }
}

/// This thread's CPU time over the measured stretch: read when `measure_from` is first seen
/// passed, and when the client stops.
#[derive(Debug, Default)]
pub(super) struct ClientCpu(super::cpu::CpuSpan);

impl ClientCpu {
    pub(super) fn tick(&mut self, plan: &ClientPlan, now: Instant) {
        if !self.0.is_started() && now >= plan.measure_from {
            self.0.start(Some(super::cpu::own_cpu_ns()));
        }
    }

    pub(super) fn finish(mut self, outcome: &mut ClientOutcome) {
        self.0.end(Some(super::cpu::own_cpu_ns()));
        outcome.cpu_ns = self.0.ns();
    }
}

/// A request in flight: its sequence number, when it started, whether it is an update.
#[derive(Debug, Clone, Copy)]
pub(super) struct Started {
    pub(super) seq: u32,
    pub(super) at: Instant,
    pub(super) is_update: bool,
}

impl ClientPlan {
    pub(super) fn should_stop(&self, shared: &Shared, now: Instant) -> bool {
        shared.stop.load(Ordering::Relaxed)
            || self.measure_until.is_some_and(|until| now >= until)
            || self
                .requests
                .is_some_and(|requests| shared.measured.load(Ordering::Relaxed) >= requests)
    }

    /// Record a completion of a request that started at `started` and completed `now`.
    /// Returns whether it was measured.
    pub(super) fn record(
        &self,
        shared: &Shared,
        outcome: &mut ClientOutcome,
        started: Started,
        now: Instant,
    ) -> bool {
        shared.completed.fetch_add(1, Ordering::Relaxed);
        if started.at < self.measure_from || self.measure_until.is_some_and(|until| now > until) {
            return false;
        }
        if self
            .requests
            .is_some_and(|requests| shared.measured.load(Ordering::Relaxed) >= requests)
        {
            return false;
        }
        shared.measured.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(now.duration_since(started.at).as_nanos()).unwrap_or(u64::MAX);
        let histogram = if started.is_update {
            &mut outcome.updates
        } else {
            &mut outcome.bypass
        };
        record(histogram, nanos);
        outcome.last_measured = Some(now);
        true
    }
}

pub(super) fn run_session_client(plan: &ClientPlan, shared: &Shared) -> ClientOutcome {
    let mut outcome = ClientOutcome::new();
    let mut options = SessionOptions::new(plan.server_id, plan.peer);
    options.wait = plan.wait;
    options.window = Some(plan.window);
    options.keys = plan.keys.clone();
    options.more_peers = plan.more_peers.clone();
    options.peer_role = plan.peer_role;
    let mut session = match ClientSession::open(options) {
        Ok(session) => session,
        Err(error) => {
            outcome.error = Some(format!("cannot open a client session: {error}"));
            shared.stop.store(true, Ordering::Relaxed);
            return outcome;
        }
    };
    let mut generator = RequestGenerator::new(&plan.workload, plan.seed, plan.index)
        .with_popularity(plan.popularity.clone());
    let mut in_flight: Vec<Started> = Vec::with_capacity(plan.window as usize);
    let mut last_progress = Instant::now();
    let mut cpu = ClientCpu::default();
    loop {
        let now = Instant::now();
        cpu.tick(plan, now);
        if plan.should_stop(shared, now) {
            break;
        }
        if let Some(error) = stalled(plan, last_progress, now) {
            outcome.error = Some(error);
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        while in_flight.len() < plan.window as usize && session.can_send() {
            let request = generator.next_request();
            let at = Instant::now();
            let started = if request.is_update {
                session.start_update(&request.bytes)
            } else {
                session.start_bypass(&request.bytes)
            };
            match started {
                Ok(seq) => in_flight.push(Started {
                    seq,
                    at,
                    is_update: request.is_update,
                }),
                Err(error) => {
                    outcome.error = Some(format!("the session refused a request: {error}"));
                    shared.stop.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
        let deadline = match plan.measure_until {
            Some(until) => until.min(Instant::now() + MAX_WAIT),
            None => Instant::now() + MAX_WAIT,
        };
        let Some(event) = session.next_event(Some(deadline)) else {
            continue;
        };
        let done = Instant::now();
        let (seq, completion) = match event {
            ClientEvent::Completed {
                seq, completion, ..
            } => (seq, Some(completion)),
            ClientEvent::Failed { seq, .. } => (seq, None),
        };
        let Some(position) = in_flight.iter().position(|started| started.seq == seq) else {
            continue;
        };
        let started = in_flight.swap_remove(position);
        match completion {
            Some(completion) => {
                last_progress = done;
                if plan.record(shared, &mut outcome, started, done) {
                    match completion {
                        Completion::Logged { .. } => outcome.acked_by_device += 1,
                        _ => outcome.answered_by_server += 1,
                    }
                }
            }
            None => outcome.failed += 1,
        }
    }
    cpu.finish(&mut outcome);
    outcome.retransmissions = session.counters().retransmitted_fragments;
    outcome
}

/// Wait until `fd` is readable or `timeout` passes.
pub(super) fn wait_readable(fd: std::os::fd::RawFd, timeout: Duration) {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: one valid pollfd; the timespec lives across the call.
    unsafe {
        libc::ppoll(&mut pollfd, 1, &timeout, std::ptr::null());
    }
}

pub(super) fn yield_cpu() {
    // SAFETY: no arguments, no memory.
    unsafe {
        libc::sched_yield();
    }
}

/// Echo mode: a datagram of the size of an update request (a PMNet header and the same SET),
/// sent to the device's echo port and timed until it comes back.
pub(super) fn run_echo_client(plan: &ClientPlan, shared: &Shared) -> ClientOutcome {
    let mut outcome = ClientOutcome::new();
    let bind = if plan.peer.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let mut socket = match BatchSocket::bind(bind, 4096) {
        Ok(socket) => socket,
        Err(error) => {
            outcome.error = Some(format!("cannot open the echo client's socket: {error}"));
            shared.stop.store(true, Ordering::Relaxed);
            return outcome;
        }
    };
    let session_id = pmnet_runtime::random_session_id();
    let mut generator = RequestGenerator::new(&plan.workload, plan.seed, plan.index);
    let mut in_flight: Vec<Started> = Vec::with_capacity(plan.window as usize);
    let mut next_seq: u32 = 1;
    let mut last_progress = Instant::now();
    let mut cpu = ClientCpu::default();
    loop {
        let now = Instant::now();
        cpu.tick(plan, now);
        if plan.should_stop(shared, now) {
            break;
        }
        if let Some(error) = stalled(plan, last_progress, now) {
            outcome.error = Some(error);
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        let before = in_flight.len();
        in_flight.retain(|started| now.duration_since(started.at) < ECHO_GIVE_UP);
        outcome.failed += (before - in_flight.len()) as u64;
        while in_flight.len() < plan.window as usize {
            let request = generator.next_request();
            let seq = next_seq;
            next_seq = next_seq.wrapping_add(1).max(1);
            let datagram = Header::new(PacketType::UpdateRequest, plan.server_id, session_id, seq)
                .encode(&request.bytes);
            let at = Instant::now();
            socket.enqueue(pmnet_proto::Transmit {
                destination: plan.peer,
                bytes: datagram,
            });
            socket.flush();
            in_flight.push(Started {
                seq,
                at,
                is_update: request.is_update,
            });
        }
        let count = socket.receive_batch();
        if count == 0 {
            match plan.wait {
                WaitMode::BusyPoll => yield_cpu(),
                WaitMode::Blocking | WaitMode::Spin(_) => {
                    let mut timeout = MAX_WAIT;
                    if let Some(until) = plan.measure_until {
                        timeout = timeout.min(until.saturating_duration_since(now));
                    }
                    wait_readable(socket.raw_fd(), timeout);
                }
            }
            continue;
        }
        let done = Instant::now();
        for index in 0..count {
            let Some((_, datagram)) = socket.received(index) else {
                continue;
            };
            let Ok(packet) = Packet::new_checked(datagram) else {
                continue;
            };
            let seq = packet.seq();
            if let Some(position) = in_flight.iter().position(|started| started.seq == seq) {
                last_progress = done;
                let started = in_flight.swap_remove(position);
                plan.record(shared, &mut outcome, started, done);
            }
        }
    }
    cpu.finish(&mut outcome);
    outcome
}

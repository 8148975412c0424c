//! A client thread of a rack: one session per server (the protocol orders requests per
//! session, and a session talks to one server), all on one socket, in a closed loop of
//! `window` requests in flight over them. Each request goes on the session of the server its
//! key belongs to.
//!
//! It drives `pmnet_proto::Client` state machines itself, as `ClientSession` drives one, so that
//! one `ppoll` on one socket serves every session of the thread.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pmnet_proto::{Client, ClientConfig, ClientEvent, Completion};
use pmnet_runtime::udp::BatchSocket;
use pmnet_runtime::{random_session_id, Clock, WaitMode};

use super::worker::{
    stalled, wait_readable, yield_cpu, ClientCpu, ClientOutcome, ClientPlan, Shared, Started,
    MAX_WAIT,
};
use super::workload::{GeneratedRequest, RequestGenerator};

/// Datagrams the thread's socket queues to send at most (every session's together).
const QUEUED_MAX: usize = 1 << 14;

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
}

/// A request in flight on session `server`.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    server: u16,
    started: Started,
}

/// The sessions of one rack client and their socket.
struct Sessions {
    clock: Clock,
    socket: BatchSocket,
    clients: Vec<Client>,
}

impl Sessions {
    fn open(plan: &ClientPlan, route: &RackRoute) -> std::io::Result<Sessions> {
        let bind = match route.peers.first() {
            Some(peer) if peer.is_ipv6() => SocketAddr::from(([0u16; 8], 0)),
            _ => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let mut socket = BatchSocket::bind(bind, QUEUED_MAX)?;
        socket.report_unreachable();
        let clients = route
            .peers
            .iter()
            .zip(&route.server_ids)
            .map(|(peer, server_id)| {
                let mut config = ClientConfig::new(random_session_id(), *server_id, *peer);
                config.auth = plan.keys.clone().map(pmnet_auth::Authenticator::new);
                config.window = plan.window.max(1);
                config.retransmit_timeout = route.retransmit_timeout;
                config.retransmit_timeout_max =
                    config.retransmit_timeout_max.max(route.retransmit_timeout);
                Client::new(config)
            })
            .collect();
        Ok(Sessions {
            clock: Clock::new(),
            socket,
            clients,
        })
    }

    /// Start `request` on its server's session; `None` when that session's window is full.
    fn start(&mut self, request: &GeneratedRequest) -> Option<Result<u32, String>> {
        let client = self.clients.get_mut(usize::from(request.server))?;
        if !client.can_send() {
            return None;
        }
        let now = self.clock.now();
        let started = match request.is_update {
            true => client.update(now, &request.bytes),
            false => client.bypass(now, &request.bytes),
        };
        Some(started.map_err(|error| format!("the session refused a request: {error}")))
    }

    /// Send what every session queued.
    fn send(&mut self) {
        for client in &mut self.clients {
            while let Some(transmit) = client.poll_transmit() {
                self.socket.enqueue(transmit);
            }
        }
        self.socket.flush();
    }

    /// Receive a batch and hand each datagram to its session (by the session id in its
    /// header, which authentication leaves in clear); fire due timers. Returns whether
    /// anything arrived or fired.
    fn poll(&mut self) -> bool {
        let count = self.socket.receive_batch();
        let now = self.clock.now();
        for index in 0..count {
            let Some((from, datagram)) = self.socket.received(index) else {
                continue;
            };
            let Some(session) = datagram
                .get(pmnet_wire::field::SESSION_ID)
                .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
                .map(u64::from_be_bytes)
            else {
                continue;
            };
            if let Some(client) = self
                .clients
                .iter_mut()
                .find(|client| client.session_id() == session)
            {
                client.handle(now, from, datagram);
            }
        }
        if self.socket.has_unreachable() {
            // The stall check names the peer that stopped answering.
            let _ = self.socket.take_unreachable();
        }
        let mut fired = false;
        for client in &mut self.clients {
            if client.poll_timeout().is_some_and(|at| at <= now) {
                client.handle_timeout(now);
                fired = true;
            }
        }
        count > 0 || fired
    }

    /// How long until the earliest session timer.
    fn next_timer(&self) -> Option<Duration> {
        self.clients
            .iter()
            .filter_map(Client::poll_timeout)
            .min()
            .map(|at| self.clock.until(at))
    }

    fn retransmissions(&self) -> u64 {
        self.clients
            .iter()
            .map(|client| client.counters().retransmitted_fragments)
            .sum()
    }
}

/// Run one rack client until the plan says stop.
pub fn run_rack_client(plan: &ClientPlan, route: &RackRoute, shared: &Shared) -> ClientOutcome {
    let mut outcome = ClientOutcome::new();
    outcome.per_server = vec![0; route.peers.len()];
    let mut sessions = match Sessions::open(plan, route) {
        Ok(sessions) => sessions,
        Err(error) => {
            outcome.error = Some(format!("cannot open the rack client's socket: {error}"));
            shared.stop.store(true, Ordering::Relaxed);
            return outcome;
        }
    };
    let mut generator = RequestGenerator::new(&plan.workload, plan.seed, plan.index)
        .with_popularity(plan.popularity.clone());
    let mut in_flight: Vec<InFlight> = Vec::with_capacity(plan.window as usize);
    // A request drawn for a session whose window was full: it goes first when there is room.
    let mut held: Option<GeneratedRequest> = None;
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
        if let Err(error) = fill_window(
            plan,
            &mut sessions,
            &mut generator,
            &mut held,
            &mut in_flight,
        ) {
            outcome.error = Some(error);
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        sessions.send();
        let busy = sessions.poll();
        let completed = take_events(plan, shared, &mut sessions, &mut in_flight, &mut outcome);
        if completed > 0 {
            last_progress = Instant::now();
        }
        sessions.send();
        if busy || completed > 0 {
            continue;
        }
        wait(plan, &sessions, now);
    }
    cpu.finish(&mut outcome);
    outcome.retransmissions = sessions.retransmissions();
    outcome
}

/// Start requests until `window` are in flight or the next one's session is full.
fn fill_window(
    plan: &ClientPlan,
    sessions: &mut Sessions,
    generator: &mut RequestGenerator,
    held: &mut Option<GeneratedRequest>,
    in_flight: &mut Vec<InFlight>,
) -> Result<(), String> {
    while in_flight.len() < plan.window as usize {
        let request = held.take().unwrap_or_else(|| generator.next_request());
        let at = Instant::now();
        match sessions.start(&request) {
            None => {
                *held = Some(request);
                return Ok(());
            }
            Some(Err(error)) => return Err(error),
            Some(Ok(seq)) => in_flight.push(InFlight {
                server: request.server,
                started: Started {
                    seq,
                    at,
                    is_update: request.is_update,
                },
            }),
        }
    }
    Ok(())
}

/// Take every session's events: record completions (by server), count failures. Returns how
/// many requests ended.
fn take_events(
    plan: &ClientPlan,
    shared: &Shared,
    sessions: &mut Sessions,
    in_flight: &mut Vec<InFlight>,
    outcome: &mut ClientOutcome,
) -> usize {
    let mut ended = 0;
    let done = Instant::now();
    for (server, client) in sessions.clients.iter_mut().enumerate() {
        while let Some(event) = client.poll_event() {
            let (seq, completion) = match event {
                ClientEvent::Completed {
                    seq, completion, ..
                } => (seq, Some(completion)),
                ClientEvent::Failed { seq, .. } => (seq, None),
            };
            let Some(position) = in_flight.iter().position(|request| {
                usize::from(request.server) == server && request.started.seq == seq
            }) else {
                continue;
            };
            let request = in_flight.swap_remove(position);
            ended += 1;
            let Some(completion) = completion else {
                outcome.failed += 1;
                continue;
            };
            if plan.record(shared, outcome, request.started, done) {
                outcome.per_server[server] += 1;
                if let Some(counter) = shared.per_server.get(server) {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                match completion {
                    Completion::Logged { .. } => outcome.acked_by_device += 1,
                    _ => outcome.answered_by_server += 1,
                }
            }
        }
    }
    ended
}

/// Wait for a datagram, the next session timer, or the end of the run.
fn wait(plan: &ClientPlan, sessions: &Sessions, now: Instant) {
    match plan.wait {
        WaitMode::BusyPoll => yield_cpu(),
        WaitMode::Blocking | WaitMode::Spin(_) => {
            let mut timeout = MAX_WAIT;
            if let Some(timer) = sessions.next_timer() {
                timeout = timeout.min(timer);
            }
            if let Some(until) = plan.measure_until {
                timeout = timeout.min(until.saturating_duration_since(now));
            }
            wait_readable(sessions.socket.raw_fd(), timeout);
        }
    }
}

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

use super::latency::record;
use super::worker::{
    stalled, wait_readable, yield_cpu, ClientCpu, ClientOutcome, ClientPlan, RackRoute, Shared,
    Started, MAX_WAIT,
};
use super::workload::{key_name, GeneratedRequest, RequestGenerator, Stamp, STAMP_LEN};
use pmnet_store::Reply;

/// Datagrams the thread's socket queues to send at most (every session's together).
const QUEUED_MAX: usize = 1 << 14;

/// A request in flight on session `server`: a sequenced request, or a cache read (whose
/// ids are the session's own, apart from sequence numbers).
#[derive(Debug, Clone, Copy)]
struct InFlight {
    server: u16,
    started: Started,
    cache_read: bool,
    key: u64,
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

    /// Start `request` on its server's session (`cache`: as a keyed update or a cache read);
    /// `None` when that session's window is full.
    fn start(&mut self, request: &GeneratedRequest, cache: bool) -> Option<Result<u32, String>> {
        let client = self.clients.get_mut(usize::from(request.server))?;
        if !client.can_send() {
            return None;
        }
        let now = self.clock.now();
        let started = match (request.is_update, cache) {
            (true, false) => client.update(now, &request.bytes),
            (false, false) => client.bypass(now, &request.bytes),
            (true, true) => {
                let reply_after = Reply::Value(request.value.clone()).to_bytes();
                let key = key_name(request.key);
                client.keyed_update(now, key.as_bytes(), Some(&reply_after), &request.bytes)
            }
            (false, true) => {
                let key = key_name(request.key);
                client.cache_read(now, key.as_bytes(), &request.bytes)
            }
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
        let filled = fill_window(
            plan,
            route.cache,
            &mut sessions,
            &mut generator,
            &mut held,
            &mut in_flight,
        );
        if let Some(counter) = shared.writes_drawn.get(plan.index as usize) {
            counter.store(generator.writes_drawn(), Ordering::Release);
        }
        if let Err(error) = filled {
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
    cache: bool,
    sessions: &mut Sessions,
    generator: &mut RequestGenerator,
    held: &mut Option<GeneratedRequest>,
    in_flight: &mut Vec<InFlight>,
) -> Result<(), String> {
    while in_flight.len() < plan.window as usize {
        let request = held.take().unwrap_or_else(|| generator.next_request());
        let at = Instant::now();
        match sessions.start(&request, cache) {
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
                cache_read: cache && !request.is_update,
                key: request.key,
            }),
        }
    }
    Ok(())
}

/// Take every session's events: record completions (by server, reads by who answered),
/// check what reads returned, count failures. Returns how many requests ended.
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
            let Some(request) = take_in_flight(in_flight, server, seq, false) else {
                continue;
            };
            ended += 1;
            let Some(completion) = completion else {
                outcome.failed += 1;
                continue;
            };
            let (by_device, reply) = match completion {
                Completion::Logged { .. } => (true, None),
                Completion::Replied { reply, .. } => (false, Some(reply)),
                _ => (false, None),
            };
            finish(plan, shared, outcome, request, done, by_device, reply);
        }
        while let Some(event) = client.poll_read_event() {
            let Some(request) = take_in_flight(in_flight, server, event.id, true) else {
                continue;
            };
            ended += 1;
            match event.outcome {
                Ok((reply, device_id)) => {
                    finish(
                        plan,
                        shared,
                        outcome,
                        request,
                        done,
                        device_id != 0,
                        Some(reply),
                    );
                }
                Err(_) => outcome.failed += 1,
            }
        }
    }
    ended
}

fn take_in_flight(
    in_flight: &mut Vec<InFlight>,
    server: usize,
    seq: u32,
    cache_read: bool,
) -> Option<InFlight> {
    let position = in_flight.iter().position(|request| {
        usize::from(request.server) == server
            && request.started.seq == seq
            && request.cache_read == cache_read
    })?;
    Some(in_flight.swap_remove(position))
}

/// A request that completed: check a read's reply, and record it if it was measured (a
/// request the device answered does not count for its server).
fn finish(
    plan: &ClientPlan,
    shared: &Shared,
    outcome: &mut ClientOutcome,
    request: InFlight,
    done: Instant,
    by_device: bool,
    reply: Option<Vec<u8>>,
) {
    let is_read = !request.started.is_update;
    if is_read {
        if let Some(reply) = &reply {
            check_read(shared, outcome, request.key, reply);
        }
    }
    if !plan.record(shared, outcome, request.started, done) {
        return;
    }
    let server = usize::from(request.server);
    let reached_server = !(is_read && by_device);
    if reached_server {
        if let Some(count) = outcome.per_server.get_mut(server) {
            *count += 1;
        }
        if let Some(counter) = shared.per_server.get(server) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
    if by_device {
        outcome.acked_by_device += 1;
    } else {
        outcome.answered_by_server += 1;
    }
    if is_read {
        let nanos =
            u64::try_from(done.duration_since(request.started.at).as_nanos()).unwrap_or(u64::MAX);
        let histogram = match by_device {
            true => &mut outcome.reads_by_device,
            false => &mut outcome.reads_by_server,
        };
        record(histogram, nanos);
    }
}

/// A read of `key` returned `reply`: "not found", or a value whose stamp names a write to
/// `key` some client drew. Anything else is a value out of nowhere, counted and described.
fn check_read(shared: &Shared, outcome: &mut ClientOutcome, key: u64, reply: &[u8]) {
    outcome.reads_checked += 1;
    let problem = match Reply::decode(reply) {
        Ok(Reply::NotFound) => None,
        Ok(Reply::Value(value)) => match Stamp::parse(&value) {
            Some(stamp) if stamp.key != key => Some(format!(
                "a read of key {key} returned a value written to key {}",
                stamp.key
            )),
            Some(stamp) => {
                let drawn = shared
                    .writes_drawn
                    .get(stamp.client as usize)
                    .map(|count| count.load(Ordering::Acquire));
                match drawn {
                    Some(drawn) if stamp.write < drawn => None,
                    _ => Some(format!(
                        "a read of key {key} returned write {} of client {}, which it never \
                         drew",
                        stamp.write, stamp.client
                    )),
                }
            }
            // Values shorter than a stamp carry none: nothing to check them against.
            None if value.len() < STAMP_LEN => None,
            None => Some(format!(
                "a read of key {key} returned a value with no stamp ({} bytes)",
                value.len()
            )),
        },
        Ok(other) => Some(format!("a read of key {key} returned {other:?}")),
        Err(error) => Some(format!(
            "a read of key {key} returned an undecodable reply ({error:?})"
        )),
    };
    if let Some(problem) = problem {
        outcome.reads_unexplained += 1;
        outcome.first_unexplained.get_or_insert(problem);
    }
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

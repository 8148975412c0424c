//! One PMNet client session over UDP: the `pmnet client` command and the benchmark use it.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pmnet_proto::{Client, ClientConfig, ClientCounters, ClientError, ClientEvent, Completion};

use crate::event_loop::{wait_once, MAX_SLEEP};
use crate::peers::PeerWatch;
use crate::udp::{BatchSocket, SocketCounters};
use crate::wait::{Clock, PollFd, WaitMode};

/// Datagrams a client session queues for sending at most: a full window of fragmented
/// requests fits.
const CLIENT_MAX_QUEUED: usize = 4096;

/// Cache reads that ended and were not yet taken, kept at most.
const READ_EVENTS_KEPT: usize = 1024;

/// How to open a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The server the requests are for.
    pub server_id: u16,
    /// Where requests go: the device in front of the server, or the server itself.
    pub peer: SocketAddr,
    pub wait: WaitMode,
    /// The session id; `None` draws a random one (sessions of different clients must never
    /// share an id).
    pub session_id: Option<u64>,
    /// Requests in flight at most (`None`: the protocol's default).
    pub window: Option<u32>,
    /// Longest one request is tried before it fails (`None`: the protocol's default, 12 s;
    /// never more than 15 s).
    pub request_lifetime: Option<Duration>,
    /// Authenticate every datagram with these deployment keys (`None`: no authentication).
    pub keys: Option<pmnet_auth::KeySet>,
    /// The other workers of a device run with `--workers` (their addresses, after `peer`'s):
    /// the session goes to one of them by its id, so that every session stays with one
    /// worker and the workers share the sessions.
    pub more_peers: Vec<SocketAddr>,
    /// What the peer is and the command that runs it, for the warning when it does not
    /// answer: a device (`pmnet device`) unless the session talks to a server directly.
    pub peer_role: (&'static str, &'static str),
    /// Devices in series whose acks an update waits for (docs/replication.md); 1 by default.
    pub replicas: u8,
    /// Fan-out replication: devices besides `peer` every update goes to at once
    /// (`ClientConfig::fan_out`).
    pub fan_out: Vec<SocketAddr>,
    /// The controllers of the chain that starts at `peer` (`ClientConfig::controllers`):
    /// asked where it starts when updates go unanswered, and followed.
    pub controllers: Vec<SocketAddr>,
}

impl SessionOptions {
    /// [`SessionOptions::peer_role`] of a session that talks to a device (the default).
    pub const DEVICE_PEER: (&'static str, &'static str) = ("device", "`pmnet device`");
    /// [`SessionOptions::peer_role`] of a session that talks to a server directly.
    pub const SERVER_PEER: (&'static str, &'static str) = ("server", "`pmnet server`");

    pub fn new(server_id: u16, peer: SocketAddr) -> SessionOptions {
        SessionOptions {
            server_id,
            peer,
            wait: WaitMode::Blocking,
            session_id: None,
            window: None,
            request_lifetime: None,
            keys: None,
            more_peers: Vec::new(),
            peer_role: SessionOptions::DEVICE_PEER,
            replicas: 1,
            fan_out: Vec::new(),
            controllers: Vec::new(),
        }
    }

    /// Where session `session_id` goes: `peer`, or one of the device's workers.
    pub fn steer(&self, session_id: u64) -> SocketAddr {
        steer_session(self.peer, &self.more_peers, session_id)
    }
}

/// The worker of a device run with `--workers` that session `session_id` goes to: of `first`
/// and `more`, the one at `session_id` modulo their number. Every session stays with one
/// worker; random session ids spread the sessions evenly.
pub fn steer_session(first: SocketAddr, more: &[SocketAddr], session_id: u64) -> SocketAddr {
    match (session_id % (1 + more.len() as u64)) as usize {
        0 => first,
        index => more[index - 1],
    }
}

/// A client session on its own UDP socket.
#[derive(Debug)]
pub struct ClientSession {
    clock: Clock,
    client: Client,
    socket: BatchSocket,
    wait: WaitMode,
    /// Events taken from the state machine but not yet handed to the caller.
    events: VecDeque<ClientEvent>,
    /// Cache reads that ended, not yet taken (see [`ClientSession::cache_read`]).
    read_events: VecDeque<pmnet_proto::ReadEvent>,
    /// Whether the peer answers.
    watch: PeerWatch,
    /// `client{session=..}`: the session's events carry it.
    span: tracing::Span,
}

impl ClientSession {
    /// Bind an ephemeral port of the peer's address family and start a session.
    /// Devices whose acks an update waits for.
    pub fn replicas(&self) -> u8 {
        self.client.config().replicas
    }

    /// Whether the session authenticates its datagrams (it has keys).
    pub fn is_authenticated(&self) -> bool {
        self.client.config().auth.is_some()
    }

    pub fn open(options: SessionOptions) -> io::Result<ClientSession> {
        let bind: SocketAddr = if options.peer.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let mut socket = BatchSocket::bind(bind, CLIENT_MAX_QUEUED)?;
        socket.report_unreachable();
        let session_id = options.session_id.unwrap_or_else(random_session_id);
        let (role, command) = options.peer_role;
        let watch = PeerWatch::new(role, command, &[options.steer(session_id)]);
        let mut config =
            ClientConfig::new(session_id, options.server_id, options.steer(session_id));
        config.auth = options.keys.clone().map(pmnet_auth::Authenticator::new);
        config.fan_out = options.fan_out.clone();
        config.controllers = options.controllers.clone();
        if let Some(lifetime) = options.request_lifetime {
            config.request_lifetime = lifetime;
        }
        if let Some(window) = options.window {
            config.window = window.max(1);
        }
        config.replicas = options.replicas.clamp(1, pmnet_proto::REPLICAS_MAX);
        Ok(ClientSession {
            clock: Clock::new(),
            client: Client::new(config),
            socket,
            wait: options.wait,
            events: VecDeque::new(),
            read_events: VecDeque::new(),
            watch,
            span: tracing::info_span!("client", session = session_id),
        })
    }

    pub fn session_id(&self) -> u64 {
        self.client.session_id()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr()
    }

    /// Where the session's requests go.
    pub fn peer(&self) -> SocketAddr {
        self.client.config().peer
    }

    pub fn counters(&self) -> &ClientCounters {
        self.client.counters()
    }

    /// The last update the server's reply completed before `replicas` devices acked it whole:
    /// its number and how many devices had (`Client::short_of_replicas`).
    pub fn short_of_replicas(&self) -> Option<(u32, usize)> {
        self.client.short_of_replicas()
    }

    /// Why the peer may not have answered (it never did, it stopped, nothing listens at its
    /// address), for a failure message; `None` while it answers.
    pub fn peer_silence(&self) -> Option<String> {
        self.watch.silence(self.peer())
    }

    /// When datagrams came that failed verification (another key, none, or a key this
    /// client lacks): how many, and the latest one's sender and reason, in words for a
    /// failure message. `None` when every datagram received verified.
    pub fn unverified_answers(&self) -> Option<String> {
        let (count, latest) = self.client.unverified();
        let (from, reason) = latest?;
        let peer = self.peer();
        let who = if from == peer {
            format!("the {} at {peer}", self.watch.role())
        } else {
            format!("{from} (not the {} at {peer})", self.watch.role())
        };
        Some(format!(
            "{who} answered nothing this client could verify: {count} datagram(s) failed \
             verification, the latest {} ({})",
            reason.reason(),
            reason.unverified_hint()
        ))
    }

    /// Whether the peer has answered since the session last sent it a request.
    pub fn peer_answers(&self) -> bool {
        self.watch.answers(self.peer())
    }

    /// How long the session's requests took (to the PMNet-ACK, to the server's reply).
    pub fn latency(&self) -> &pmnet_proto::ClientLatency {
        self.client.latency()
    }

    pub fn socket_counters(&self) -> &SocketCounters {
        self.socket.counters()
    }

    pub fn in_flight_count(&self) -> usize {
        self.client.in_flight_count()
    }

    pub fn can_send(&self) -> bool {
        self.client.can_send()
    }

    /// Start an update request (completes on the device's PMNet-ACK or the server's reply) and
    /// send it at once. Returns its sequence number.
    pub fn start_update(&mut self, payload: &[u8]) -> Result<u32, ClientError> {
        let seq = self.client.update(self.clock.now(), payload)?;
        self.send_pending();
        Ok(seq)
    }

    /// Start an update request like [`ClientSession::start_update`] but leave it queued: it
    /// leaves with the next [`ClientSession::next_event`], together with everything else
    /// queued, in as few `sendmmsg` calls as the batch allows.
    pub fn queue_update(&mut self, payload: &[u8]) -> Result<u32, ClientError> {
        self.client.update(self.clock.now(), payload)
    }

    /// Start a bypass request (completes only on the server's reply) and send it at once.
    pub fn start_bypass(&mut self, payload: &[u8]) -> Result<u32, ClientError> {
        let seq = self.client.bypass(self.clock.now(), payload)?;
        self.send_pending();
        Ok(seq)
    }

    /// Ask the controllers (`SessionOptions::controllers`) for the chain's route and wait for
    /// it until `timeout`: the number of its devices, `None` when no controller answered (or
    /// none is named).
    pub fn fetch_route(&mut self, timeout: Duration) -> Option<usize> {
        if self.client.config().controllers.is_empty() {
            return None;
        }
        self.client.ask_route();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(devices) = self.client.route_devices() {
                return Some(devices.len());
            }
            let step = (Instant::now() + Duration::from_millis(5)).min(deadline);
            if let Some(event) = self.next_event(Some(step)) {
                self.events.push_front(event);
                break;
            }
        }
        self.client.route_devices().map(<[u16]>::len)
    }

    /// Drive the session until it reports an event, or `deadline` passes (`None`).
    pub fn next_event(&mut self, deadline: Option<Instant>) -> Option<ClientEvent> {
        // Taken out for the call (a move, no reference count touched) so the session can be
        // borrowed mutably inside it.
        let span = std::mem::replace(&mut self.span, tracing::Span::none());
        let event = span.in_scope(|| self.drive(deadline));
        self.span = span;
        event
    }

    fn drive(&mut self, deadline: Option<Instant>) -> Option<ClientEvent> {
        loop {
            if let Some(event) = self.events.pop_front() {
                return Some(event);
            }
            let busy = self.poll_once();
            if let Some(event) = self.events.pop_front() {
                return Some(event);
            }
            let wall = Instant::now();
            self.watch.check(wall);
            if deadline.is_some_and(|deadline| wall >= deadline) {
                return None;
            }
            if busy {
                continue;
            }
            self.wait_idle(wall, deadline);
        }
    }

    /// Wait for the socket or the next timer (or `deadline`).
    fn wait_idle(&mut self, wall: Instant, deadline: Option<Instant>) {
        let mut timeout = MAX_SLEEP;
        if let Some(at) = self.client.poll_timeout() {
            timeout = timeout.min(self.clock.until(at));
        }
        if let Some(deadline) = deadline {
            timeout = timeout.min(deadline.saturating_duration_since(wall));
        }
        let mut fds = [PollFd::new(
            self.socket.raw_fd(),
            true,
            self.socket.is_write_blocked(),
        )];
        if wait_once(self.wait, &mut fds, timeout).is_err() {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
    }

    /// Send a keyed update of `key` (the read cache's: `reply_after` is what a read of the key
    /// answers once it is applied) and wait for its completion.
    pub fn keyed_update(
        &mut self,
        key: &[u8],
        reply_after: Option<&[u8]>,
        payload: &[u8],
    ) -> Result<Completion, ClientError> {
        let seq = self
            .client
            .keyed_update(self.clock.now(), key, reply_after, payload)?;
        self.send_pending();
        self.wait_for(seq)
    }

    /// Send a keyed bypass request of `key` (a write whose reply only the server gives) and
    /// wait for the server's reply.
    pub fn keyed_bypass(&mut self, key: &[u8], payload: &[u8]) -> Result<Completion, ClientError> {
        let seq = self.client.keyed_bypass(self.clock.now(), key, payload)?;
        self.send_pending();
        self.wait_for(seq)
    }

    /// Send a cache read of `key` and wait for its reply: `(reply, device id)`, the id 0 when
    /// the server answered.
    pub fn cache_read(
        &mut self,
        key: &[u8],
        payload: &[u8],
    ) -> Result<(Vec<u8>, u16), ClientError> {
        let id = self.client.cache_read(self.clock.now(), key, payload)?;
        self.send_pending();
        loop {
            if let Some(at) = self.read_events.iter().position(|read| read.id == id) {
                let read = self.read_events.remove(at).expect("found");
                return read.outcome;
            }
            // The state machine ends every read (answered, or failed after its bounded
            // retransmissions), so this loop ends.
            if self.poll_once() {
                continue;
            }
            let wall = Instant::now();
            self.watch.check(wall);
            self.wait_idle(wall, None);
        }
    }

    /// Send an update and wait for its completion.
    pub fn update(&mut self, payload: &[u8]) -> Result<Completion, ClientError> {
        let seq = self.start_update(payload)?;
        self.wait_for(seq)
    }

    /// Send a bypass request and wait for the server's reply.
    pub fn bypass(&mut self, payload: &[u8]) -> Result<Completion, ClientError> {
        let seq = self.start_bypass(payload)?;
        self.wait_for(seq)
    }

    /// Wait for the completion of request `seq`; events of other requests are kept for
    /// [`ClientSession::next_event`].
    fn wait_for(&mut self, seq: u32) -> Result<Completion, ClientError> {
        let mut others = Vec::new();
        let result = loop {
            // The state machine always ends a request with Completed or Failed (it gives up
            // after its bounded retransmissions), so this loop ends.
            let Some(event) = self.next_event(None) else {
                continue;
            };
            match event {
                ClientEvent::Completed {
                    seq: done,
                    completion,
                    ..
                } if done == seq => break Ok(completion),
                ClientEvent::Failed {
                    seq: done, error, ..
                } if done == seq => break Err(error),
                other => others.push(other),
            }
        };
        for event in others.into_iter().rev() {
            self.events.push_front(event);
        }
        result
    }

    /// Receive, handle timers, send. Returns whether anything happened.
    fn poll_once(&mut self) -> bool {
        let mut busy = false;
        let count = self.socket.receive_batch();
        if count > 0 {
            busy = true;
            let now = self.clock.now();
            for index in 0..count {
                if let Some((from, datagram)) = self.socket.received(index) {
                    let (unverified, _) = self.client.unverified();
                    self.client.handle(now, from, datagram);
                    // A datagram that does not verify is not the peer answering: it is counted
                    // (and named in a failure) instead.
                    if self.client.unverified().0 == unverified {
                        self.watch.heard(from);
                    }
                }
            }
        }
        if self.socket.has_unreachable() {
            let reports = self.socket.take_unreachable();
            self.watch.unreachable(&reports);
        }
        let now = self.clock.now();
        if self.client.poll_timeout().is_some_and(|at| at <= now) {
            busy = true;
            let before = self.client.counters().retransmitted_fragments;
            self.client.handle_timeout(now);
            let resent = self.client.counters().retransmitted_fragments - before;
            if resent > 0 {
                tracing::debug!(
                    session = self.client.session_id(),
                    peer = %self.peer(),
                    resent,
                    in_flight = self.client.in_flight_count(),
                    "retransmitted unacknowledged fragments"
                );
            }
        }
        self.send_pending();
        while let Some(event) = self.client.poll_event() {
            busy = true;
            if let ClientEvent::Failed { seq, error, .. } = &event {
                tracing::debug!(
                    session = self.client.session_id(),
                    seq,
                    %error,
                    "request failed"
                );
            }
            self.events.push_back(event);
        }
        while let Some(read) = self.client.poll_read_event() {
            busy = true;
            if self.read_events.len() >= READ_EVENTS_KEPT {
                self.read_events.pop_front();
            }
            self.read_events.push_back(read);
        }
        busy
    }

    fn send_pending(&mut self) {
        let mut now = None;
        while let Some(transmit) = self.client.poll_transmit() {
            self.watch
                .sent_datagram(transmit.destination, &transmit.bytes, &mut now);
            self.socket.enqueue(transmit);
        }
        self.socket.flush();
    }
}

/// A random, nonzero session id.
pub fn random_session_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

#[cfg(test)]
mod steer_tests {
    use super::*;

    #[test]
    fn sessions_spread_over_the_workers_and_each_stays_with_one() {
        let mut options = SessionOptions::new(1, "127.0.0.1:7400".parse().unwrap());
        assert_eq!(options.steer(5), options.peer, "one device: always it");
        options.more_peers = vec![
            "127.0.0.1:7401".parse().unwrap(),
            "127.0.0.1:7402".parse().unwrap(),
        ];
        let ports: Vec<u16> = (0..6u64)
            .map(|session| options.steer(session).port())
            .collect();
        assert_eq!(ports, [7400, 7401, 7402, 7400, 7401, 7402]);
        assert_eq!(options.steer(u64::MAX), options.steer(u64::MAX));
    }
}

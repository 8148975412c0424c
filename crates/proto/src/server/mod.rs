//! The server side of PMNet: per-session ordering, exactly-once application, make-up ACKs,
//! gap detection and the recovery poll at start-up.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::{flags, Header, PacketType};

use crate::{encode_fragments, RequestKind, Time, Transmit};

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub server_id: u16,
    /// Devices polled for logged requests at start-up; the server applies nothing new until
    /// each has answered.
    pub devices: Vec<SocketAddr>,
    /// Largest datagram sent; larger replies are split into fragments.
    pub max_datagram_len: usize,
    /// Requests buffered at most this many sequence numbers ahead of the last applied one.
    pub reorder_window: u32,
    /// How long a gap in a session's sequence may last before the server asks for a
    /// retransmission (and again after each further timeout).
    pub gap_timeout: Duration,
    /// Missing sequence numbers (or fragments) requested per gap timeout.
    pub max_retransmit_requests_per_gap: usize,
    /// Replies kept per session for make-up ACKs; at least the client window.
    pub reply_cache_len: usize,
    /// Most sessions tracked; beyond it the longest-idle session without pending requests is
    /// forgotten (and loses duplicate detection).
    pub max_sessions: usize,
    /// Largest request reassembled from fragments.
    pub max_request_len: usize,
    /// Interval between recovery polls to a device that has not answered.
    pub recovery_poll_interval: Duration,
}

impl ServerConfig {
    pub fn new(server_id: u16, devices: Vec<SocketAddr>) -> ServerConfig {
        ServerConfig {
            server_id,
            devices,
            max_datagram_len: pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN,
            reorder_window: 1024,
            gap_timeout: Duration::from_millis(2),
            max_retransmit_requests_per_gap: 16,
            reply_cache_len: 128,
            max_sessions: 1 << 16,
            max_request_len: 1 << 20,
            recovery_poll_interval: Duration::from_millis(50),
        }
    }
}

/// A session as the store recovered it: what exactly-once needs after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredSession {
    pub session_id: u64,
    pub last_seq: u32,
    pub last_reply: Vec<u8>,
}

/// Work for the server's application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// Apply `request`, make its effect, `seq` and its reply durable together, then report
    /// [`Server::on_applied`]. Applies of one session come in sequence order and must be
    /// reported in that order.
    Apply {
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: Vec<u8>,
    },
    /// Every device answered the recovery poll; `entries_resent` is what they said they resent.
    RecoveryComplete { entries_resent: u64 },
}

/// What the server counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerCounters {
    pub request_fragments_received: u64,
    pub requests_applied: u64,
    pub server_acks_sent: u64,
    /// Duplicates of applied requests, answered with a make-up ACK.
    pub makeup_acks_sent: u64,
    /// Make-up ACKs sent without the reply (it was no longer kept).
    pub makeup_acks_without_reply: u64,
    /// Duplicates of requests being applied right now: ignored, their ACK is coming.
    pub duplicates_in_progress: u64,
    /// Requests that arrived ahead of a gap and waited.
    pub requests_reordered: u64,
    pub retransmit_requests_sent: u64,
    pub recovery_polls_sent: u64,
    pub sessions_evicted: u64,
    /// No-op fills for sequence numbers their client gave up on.
    pub noop_fills_received: u64,
    pub dropped: BTreeMap<&'static str, u64>,
}

#[derive(Debug)]
struct Assembly {
    kind: RequestKind,
    parts: Vec<Option<Vec<u8>>>,
    received_count: usize,
    received_len: usize,
}

impl Assembly {
    fn is_complete(&self) -> bool {
        self.received_count == self.parts.len()
    }
}

#[derive(Debug, Default)]
struct Session {
    last_applied: u32,
    /// Highest sequence number handed to the application (≥ `last_applied`).
    issued_through: u32,
    pending: BTreeMap<u32, Assembly>,
    replies: VecDeque<(u32, Vec<u8>)>,
    /// Where this session's requests came from last: the device, or the client directly.
    reply_to: Option<SocketAddr>,
    gap_deadline: Option<Time>,
    last_active: Time,
}

impl Session {
    fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.issued_through == self.last_applied
    }
}

#[derive(Debug)]
struct Recovery {
    awaiting: BTreeSet<SocketAddr>,
    poll_seq: u32,
    next_poll: Time,
    entries_resent: u64,
}

/// The PMNet server state machine.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    sessions: HashMap<u64, Session>,
    gap_timers: BTreeSet<(Time, u64)>,
    recovery: Option<Recovery>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<ServerEvent>,
    counters: ServerCounters,
}

impl Server {
    /// A server whose store recovered `sessions`. With devices configured, it starts by
    /// polling them and applies nothing until all have answered.
    pub fn new(
        config: ServerConfig,
        now: Time,
        sessions: impl IntoIterator<Item = RecoveredSession>,
    ) -> Server {
        assert!(
            config.reply_cache_len >= 1,
            "reply_cache_len must be at least 1"
        );
        assert!(
            config.reorder_window >= 1,
            "reorder_window must be at least 1"
        );
        let sessions = sessions
            .into_iter()
            .map(|recovered| {
                let mut replies = VecDeque::new();
                replies.push_back((recovered.last_seq, recovered.last_reply));
                let session = Session {
                    last_applied: recovered.last_seq,
                    issued_through: recovered.last_seq,
                    replies,
                    last_active: now,
                    ..Session::default()
                };
                (recovered.session_id, session)
            })
            .collect();
        let mut server = Server {
            sessions,
            gap_timers: BTreeSet::new(),
            recovery: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: ServerCounters::default(),
            config,
        };
        if !server.config.devices.is_empty() {
            server.recovery = Some(Recovery {
                awaiting: server.config.devices.iter().copied().collect(),
                poll_seq: 1,
                next_poll: now,
                entries_resent: 0,
            });
            server.send_recovery_polls(now);
        }
        server
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn counters(&self) -> &ServerCounters {
        &self.counters
    }

    /// Whether the start-up recovery poll is still waiting for a device.
    pub fn is_recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// The last sequence number applied for `session_id`, 0 if none.
    pub fn last_applied(&self, session_id: u64) -> u32 {
        self.sessions
            .get(&session_id)
            .map_or(0, |session| session.last_applied)
    }

    /// Sessions with buffered or unapplied requests (for convergence checks).
    pub fn busy_session_count(&self) -> usize {
        self.sessions
            .values()
            .filter(|session| !session.is_idle())
            .count()
    }

    fn count_drop(&mut self, reason: &'static str) {
        *self.counters.dropped.entry(reason).or_insert(0) += 1;
    }

    fn send_recovery_polls(&mut self, now: Time) {
        let Some(recovery) = self.recovery.as_mut() else {
            return;
        };
        recovery.next_poll = now + self.config.recovery_poll_interval;
        let poll = Header::new(
            PacketType::RecoveryPoll,
            self.config.server_id,
            0,
            recovery.poll_seq,
        );
        recovery.poll_seq = recovery.poll_seq.wrapping_add(1);
        let bytes = poll.encode(&[]);
        for &device in &recovery.awaiting {
            self.counters.recovery_polls_sent += 1;
            self.transmits.push_back(Transmit {
                destination: device,
                bytes: bytes.clone(),
            });
        }
    }

    /// Process a datagram from the network. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let (header, payload) = match Header::parse(datagram) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.count_drop(error.reason());
                return;
            }
        };
        if header.server_id != self.config.server_id {
            self.count_drop("wrong_server");
            return;
        }
        match header.packet_type {
            PacketType::UpdateRequest => {
                self.on_request(now, from, RequestKind::Update, &header, payload)
            }
            PacketType::BypassRequest => {
                self.on_request(now, from, RequestKind::Bypass, &header, payload)
            }
            PacketType::RecoveryDone => self.on_recovery_done(now, from, payload),
            _ => self.count_drop("unexpected_type"),
        }
    }

    fn session_for(&mut self, now: Time, session_id: u64) -> Option<&mut Session> {
        if !self.sessions.contains_key(&session_id)
            && self.sessions.len() >= self.config.max_sessions
        {
            let idlest = self
                .sessions
                .iter()
                .filter(|(_, session)| session.is_idle())
                .min_by_key(|(_, session)| session.last_active)
                .map(|(id, _)| *id)?;
            self.sessions.remove(&idlest);
            self.counters.sessions_evicted += 1;
        }
        let session = self.sessions.entry(session_id).or_default();
        session.last_active = now;
        Some(session)
    }

    fn on_request(
        &mut self,
        now: Time,
        from: SocketAddr,
        kind: RequestKind,
        header: &Header,
        payload: &[u8],
    ) {
        self.counters.request_fragments_received += 1;
        if header.has_flag(flags::NOOP_FILL) {
            self.counters.noop_fills_received += 1;
        }
        let seq = header.seq;
        if seq == 0 {
            self.count_drop("zero_seq");
            return;
        }
        let reorder_window = self.config.reorder_window;
        let max_request_len = self.config.max_request_len;
        let Some(session) = self.session_for(now, header.session_id) else {
            self.count_drop("sessions_full");
            return;
        };
        session.reply_to = Some(from);
        if seq <= session.last_applied {
            self.send_makeup_ack(header.session_id, seq, from);
            return;
        }
        if seq <= session.issued_through {
            self.counters.duplicates_in_progress += 1;
            return;
        }
        if seq - session.last_applied > reorder_window {
            self.count_drop("beyond_reorder_window");
            return;
        }
        if header.has_flag(flags::NOOP_FILL) {
            // The client gave up on this number. Whatever part of the request arrived will
            // never be completed; the fill takes its place.
            if session
                .pending
                .get(&seq)
                .is_some_and(|assembly| !assembly.is_complete())
            {
                session.pending.remove(&seq);
            }
        }
        let fragment_count = usize::from(header.fragment_count);
        let assembly = session.pending.entry(seq).or_insert_with(|| Assembly {
            kind,
            parts: vec![None; fragment_count],
            received_count: 0,
            received_len: 0,
        });
        if assembly.kind != kind || assembly.parts.len() != fragment_count {
            self.count_drop("inconsistent_fragment");
            return;
        }
        let index = usize::from(header.fragment_index);
        if assembly.parts[index].is_some() {
            return;
        }
        if assembly.received_len + payload.len() > max_request_len {
            self.count_drop("request_too_large");
            return;
        }
        assembly.parts[index] = Some(payload.to_vec());
        assembly.received_count += 1;
        assembly.received_len += payload.len();
        if seq != session.issued_through + 1 {
            self.counters.requests_reordered += 1;
        }
        self.advance(now, header.session_id);
    }

    /// Hand every request that is next in sequence and complete to the application, then
    /// (re)arm or clear the session's gap timer.
    fn advance(&mut self, now: Time, session_id: u64) {
        let recovering = self.recovery.is_some();
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return;
        };
        if !recovering {
            while let Some(entry) = session.pending.first_entry() {
                if *entry.key() != session.issued_through + 1 || !entry.get().is_complete() {
                    break;
                }
                let (seq, assembly) = entry.remove_entry();
                session.issued_through = seq;
                let request = crate::concat_parts(assembly.parts);
                self.events.push_back(ServerEvent::Apply {
                    session_id,
                    seq,
                    kind: assembly.kind,
                    request,
                });
            }
        }
        let has_gap = !recovering && !session.pending.is_empty();
        match (has_gap, session.gap_deadline) {
            (true, None) => {
                let deadline = now + self.config.gap_timeout;
                session.gap_deadline = Some(deadline);
                self.gap_timers.insert((deadline, session_id));
            }
            (false, Some(deadline)) => {
                session.gap_deadline = None;
                self.gap_timers.remove(&(deadline, session_id));
            }
            _ => {}
        }
    }

    fn send_makeup_ack(&mut self, session_id: u64, seq: u32, to: SocketAddr) {
        let session = &self.sessions[&session_id];
        let cached = session
            .replies
            .iter()
            .find(|(replied_seq, _)| *replied_seq == seq)
            .map(|(_, reply)| reply.clone());
        self.counters.makeup_acks_sent += 1;
        match cached {
            Some(reply) => self.send_server_ack(session_id, seq, flags::MAKEUP, &reply, to),
            None => {
                self.counters.makeup_acks_without_reply += 1;
                let makeup = flags::MAKEUP | flags::REPLY_UNAVAILABLE;
                self.send_server_ack(session_id, seq, makeup, &[], to);
            }
        }
    }

    fn send_server_ack(
        &mut self,
        session_id: u64,
        seq: u32,
        flags: u16,
        reply: &[u8],
        to: SocketAddr,
    ) {
        let mut header = Header::new(
            PacketType::ServerAck,
            self.config.server_id,
            session_id,
            seq,
        );
        header.flags = flags;
        let datagrams = encode_fragments(header, reply, self.config.max_datagram_len)
            .or_else(|| {
                // Replies are bounded by the store; one that still does not fit is reported
                // as unavailable rather than lost silently.
                header.flags |= pmnet_wire::flags::REPLY_UNAVAILABLE;
                encode_fragments(header, &[], self.config.max_datagram_len)
            })
            .expect("an empty reply always fits");
        for bytes in datagrams {
            self.counters.server_acks_sent += 1;
            self.transmits.push_back(Transmit {
                destination: to,
                bytes,
            });
        }
    }

    /// Report that request `seq` of `session_id` is applied and durable, with `reply`. Only
    /// now is the server-ACK sent.
    pub fn on_applied(&mut self, now: Time, session_id: u64, seq: u32, reply: Vec<u8>) {
        let reply_cache_len = self.config.reply_cache_len;
        let session = self
            .sessions
            .get_mut(&session_id)
            .expect("on_applied for a session with an issued request");
        assert!(
            seq == session.last_applied + 1 && seq <= session.issued_through,
            "on_applied out of order: seq {seq}, last applied {}, issued through {}",
            session.last_applied,
            session.issued_through
        );
        session.last_applied = seq;
        session.last_active = now;
        if session.replies.len() >= reply_cache_len {
            session.replies.pop_front();
        }
        session.replies.push_back((seq, reply.clone()));
        let to = session
            .reply_to
            .expect("a session with requests has a reply address");
        self.counters.requests_applied += 1;
        self.send_server_ack(session_id, seq, 0, &reply, to);
    }

    fn on_recovery_done(&mut self, now: Time, from: SocketAddr, payload: &[u8]) {
        let Some(recovery) = self.recovery.as_mut() else {
            return;
        };
        let Ok(entries_resent) = pmnet_wire::decode_recovery_done_payload(payload) else {
            self.count_drop("bad_recovery_done");
            return;
        };
        if !recovery.awaiting.remove(&from) {
            return;
        }
        recovery.entries_resent += u64::from(entries_resent);
        if !recovery.awaiting.is_empty() {
            return;
        }
        let entries_resent = recovery.entries_resent;
        self.recovery = None;
        self.events
            .push_back(ServerEvent::RecoveryComplete { entries_resent });
        // Resume in session-id order: `sessions` is a HashMap whose iteration order differs
        // between maps, and a seed must replay the same applies and acks every time.
        let mut waiting: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, session)| !session.pending.is_empty())
            .map(|(id, _)| *id)
            .collect();
        waiting.sort_unstable();
        for session_id in waiting {
            self.advance(now, session_id);
        }
    }

    /// Ask for what is missing in sessions whose gap lasted too long; re-poll devices that
    /// have not answered the recovery poll.
    pub fn handle_timeout(&mut self, now: Time) {
        if self
            .recovery
            .as_ref()
            .is_some_and(|recovery| recovery.next_poll <= now)
        {
            self.send_recovery_polls(now);
        }
        while let Some(&(deadline, session_id)) = self.gap_timers.first() {
            if deadline > now {
                break;
            }
            self.gap_timers.remove(&(deadline, session_id));
            self.request_missing(now, session_id);
        }
    }

    fn request_missing(&mut self, now: Time, session_id: u64) {
        let limit = self.config.max_retransmit_requests_per_gap;
        let server_id = self.config.server_id;
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return;
        };
        session.gap_deadline = None;
        let (Some(to), Some((&first_pending, assembly))) =
            (session.reply_to, session.pending.first_key_value())
        else {
            return;
        };
        let next = session.issued_through + 1;
        let mut requests = Vec::new();
        if first_pending > next {
            for seq in (next..first_pending).take(limit) {
                let mut header =
                    Header::new(PacketType::RetransmitRequest, server_id, session_id, seq);
                header.flags = flags::ALL_FRAGMENTS;
                requests.push(header.encode(&[]));
            }
        } else {
            let fragment_count = u16::try_from(assembly.parts.len()).unwrap_or(u16::MAX);
            let missing = assembly
                .parts
                .iter()
                .enumerate()
                .filter(|(_, part)| part.is_none());
            for (index, _) in missing.take(limit) {
                let mut header = Header::new(
                    PacketType::RetransmitRequest,
                    server_id,
                    session_id,
                    first_pending,
                );
                header.fragment_index = u16::try_from(index).unwrap_or(0);
                header.fragment_count = fragment_count;
                requests.push(header.encode(&[]));
            }
        }
        let deadline = now + self.config.gap_timeout;
        session.gap_deadline = Some(deadline);
        self.gap_timers.insert((deadline, session_id));
        for bytes in requests {
            self.counters.retransmit_requests_sent += 1;
            self.transmits.push_back(Transmit {
                destination: to,
                bytes,
            });
        }
    }

    /// The next datagram to send, if any. Poll until `None` after every call that changes state.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next request to apply (or recovery notice), if any.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// When [`Server::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Time> {
        let gap = self.gap_timers.first().map(|(deadline, _)| *deadline);
        let poll = self.recovery.as_ref().map(|recovery| recovery.next_poll);
        gap.into_iter().chain(poll).min()
    }
}

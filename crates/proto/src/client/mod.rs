//! The client side of one PMNet session.

mod reads;

pub use reads::ReadEvent;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::{flags, Header, NotLoggedReason, PacketType};

use crate::{
    encode_fragments, fragment_payload_len_max, unsealed_len_max, CountDrop, DropCounts,
    DropReason, LatencyHistogram, RequestKind, Time, Transmit,
};

/// Settings of a client session.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Random per session (the caller draws it), so sessions of different clients never collide.
    pub session_id: u64,
    /// The server the requests are for.
    pub server_id: u16,
    /// Where requests go: the first device on the path, or the server itself without one.
    pub peer: SocketAddr,
    /// Largest datagram sent; larger requests are split into fragments.
    pub datagram_len_max: usize,
    /// Seal every datagram sent and accept only datagrams that verify (see `pmnet-auth`);
    /// `None`: no authentication.
    pub auth: Option<pmnet_auth::Authenticator>,
    /// Most requests in flight at once.
    pub window: u32,
    /// Largest request payload accepted, and largest reply reassembled.
    pub request_len_max: usize,
    /// First retransmission timeout; doubles on each retransmission up to the maximum.
    pub retransmit_timeout: Duration,
    pub retransmit_timeout_max: Duration,
    /// Retransmissions of one request before it fails with [`ClientError::TimedOut`].
    pub retransmits_max: u32,
    /// Longest the session tries one request, from its first transmission; at most
    /// [`pmnet_wire::MAX_REQUEST_LIFETIME_MS`] (a longer setting is cut to it), because a
    /// server skips a number nobody can supply once a gap outlives that.
    pub request_lifetime: Duration,
    /// Failed sequence numbers remembered, so that a server waiting for one can be told to
    /// skip it (see [`flags::NOOP_FILL`]).
    pub abandoned_max: usize,
    /// Devices in series that must each log an update before it completes on their
    /// PMNet-ACKs (1: the first device's ack is enough). With more than one, updates carry
    /// flag `REPLICATED` and every fragment needs acks from this many distinct devices
    /// (docs/replication.md); 1 to [`REPLICAS_MAX`].
    pub replicas: u8,
    /// Fan-out replication: devices besides `peer` that every update fragment is sent to at
    /// once (each logs it, acks this client and forwards it to the server, which applies it
    /// once and frees every copy with its ACK; docs/replication.md, "Fan-out"). Empty: the
    /// devices, if several, are in series behind `peer`. Bypass requests go to `peer` only.
    pub fan_out: Vec<SocketAddr>,
    /// The controllers of the chain that starts at `peer` (`--controller`; docs/replication.md,
    /// "Automatic failover"): asked where the chain starts when requests go unanswered, and
    /// followed. Empty: none.
    pub controllers: Vec<SocketAddr>,
}

/// Retransmissions of a request no device acked after which the client asks the controllers
/// where its chain starts now.
const ASK_AFTER_RETRANSMITS: u32 = 3;

/// Devices in series a client can wait for at most.
pub const REPLICAS_MAX: u8 = 8;

impl ClientConfig {
    /// Defaults for a session `session_id` to `server_id` through `peer`.
    pub fn new(session_id: u64, server_id: u16, peer: SocketAddr) -> ClientConfig {
        ClientConfig {
            session_id,
            server_id,
            peer,
            datagram_len_max: pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN,
            auth: None,
            window: 64,
            request_len_max: 1 << 20,
            retransmit_timeout: Duration::from_millis(2),
            retransmit_timeout_max: Duration::from_millis(200),
            retransmits_max: 64,
            request_lifetime: Duration::from_secs(12),
            abandoned_max: 1024,
            replicas: 1,
            fan_out: Vec::new(),
            controllers: Vec::new(),
        }
    }
}

/// Why a request could not be started or did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// `window` requests are already in flight; wait for a completion.
    WindowFull,
    /// The payload is larger than `request_len_max` or needs more than 65 535 fragments.
    TooLarge,
    /// The session used every sequence number; start a new session.
    SessionExhausted,
    /// No acknowledgement after `retransmits_max` retransmissions or `request_lifetime`. The
    /// request may or may not have been applied. The session sends a no-op fill for it (and
    /// again if the server asks), so a request that never arrived is never applied after its
    /// failure was reported.
    TimedOut,
    /// As [`ClientError::TimedOut`], but the device said why it gave no early ack: it could
    /// not log the request (its log full, say) and the server did not answer either.
    NotLogged(NotLoggedReason),
    /// The server skipped the request's sequence number: it was never applied.
    Skipped,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClientError::WindowFull => "too many requests in flight",
            ClientError::TooLarge => "request larger than the configured maximum",
            ClientError::SessionExhausted => "session sequence numbers exhausted",
            ClientError::TimedOut => "no acknowledgement after the maximum retransmissions",
            ClientError::NotLogged(NotLoggedReason::LogFull) => {
                "the device's log is full and the server did not answer"
            }
            ClientError::NotLogged(NotLoggedReason::Collision) => {
                "the device could not log the request (its slots were taken) and the server \
                 did not answer"
            }
            ClientError::NotLogged(NotLoggedReason::TooLarge) => {
                "the request is too large for the device's log and the server did not answer"
            }
            ClientError::NotLogged(NotLoggedReason::ServerUnverified) => {
                "the device acks nothing until it has verified its server (the server is down, \
                 or it and the device hold different --key-file keys: the device's log says \
                 which), and the server did not answer"
            }
            ClientError::Skipped => "the server skipped the request: it was not applied",
        })
    }
}

impl std::error::Error for ClientError {}

/// How a request completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Every fragment is durable in the log of a device (the PMNet-ACK), which names itself.
    /// The server applies the update later; its reply is consumed quietly.
    Logged { device_id: u16 },
    /// The server applied the request and replied.
    Replied { reply: Vec<u8>, makeup: bool },
    /// The server had applied the request before (a make-up ACK) but no longer keeps its reply.
    ReplyUnavailable,
}

/// What the session reports to its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    Completed {
        seq: u32,
        kind: RequestKind,
        completion: Completion,
    },
    Failed {
        seq: u32,
        kind: RequestKind,
        error: ClientError,
    },
}

/// What the session counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCounters {
    pub requests_started: u64,
    pub fragments_sent: u64,
    pub retransmitted_fragments: u64,
    pub retransmit_requests_answered: u64,
    pub pmnet_acks_received: u64,
    pub server_acks_received: u64,
    /// Acks and replies for requests already complete, consumed quietly.
    pub late_acks_consumed: u64,
    /// Datagrams that failed to parse, belong to another session or type, or do not match
    /// their request, by reason.
    pub dropped: DropCounts,
    pub requests_failed: u64,
    /// No-op fills sent for abandoned sequence numbers (on giving up, and when asked).
    pub noop_fills_sent: u64,
    /// Notices from a device that it could not log a fragment.
    pub not_logged_notices: u64,
    /// Cache reads started, answered (by anyone; by a device), and failed.
    pub cache_reads_started: u64,
    pub cache_replies_received: u64,
    pub cache_reads_served_by_device: u64,
    pub cache_reads_failed: u64,
    /// Updates waiting for the acks of several devices (`replicas` > 1) that the server's
    /// reply completed while fewer devices had acked them whole: a chain shorter than
    /// `replicas`, or acks lost on the way. [`Client::short_of_replicas`] names the last.
    pub updates_short_of_replicas: u64,
    /// Routes taken from the controllers (the chain's first device moved, or its devices).
    pub routes_taken: u64,
}

impl ClientCounters {
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

#[derive(Debug)]
struct InFlight {
    kind: RequestKind,
    /// The encoded datagrams, kept for retransmission.
    fragments: Vec<Vec<u8>>,
    /// The devices that acked each fragment (update requests only), and how many fragments
    /// each device acked: the request is logged once the replicas wanted each acked every
    /// fragment — not merely once each fragment was acked by some device: with devices in
    /// series, one whose log is full for a fragment passes it on and the next logs it, and
    /// then no device could give the server the whole request.
    logged: Vec<Ackers>,
    acked_by: AckCounts,
    reply: Option<ReplyAssembly>,
    deadline: Time,
    timeout: Duration,
    retransmit_count: u32,
    /// Past this the request fails, whatever its retransmission count.
    expires: Time,
    /// Why a device last said it could not log a fragment, if it did.
    not_logged: Option<NotLoggedReason>,
    /// When the request was started (its first send).
    started: Time,
}

/// The distinct devices that acked one fragment, up to [`REPLICAS_MAX`] (no allocation: the
/// ack path is the hot one).
#[derive(Debug, Clone, Copy, Default)]
struct Ackers {
    ids: [u16; REPLICAS_MAX as usize],
    len: u8,
}

impl Ackers {
    fn ids(&self) -> &[u16] {
        &self.ids[..usize::from(self.len)]
    }

    fn contains(&self, device_id: u16) -> bool {
        self.ids().contains(&device_id)
    }

    /// Count `device_id`'s ack (once per device, up to [`REPLICAS_MAX`] devices); `true` when
    /// it is new.
    fn add(&mut self, device_id: u16) -> bool {
        let len = usize::from(self.len);
        if len < self.ids.len() && !self.contains(device_id) {
            self.ids[len] = device_id;
            self.len += 1;
            return true;
        }
        false
    }
}

/// Fragments acked, per device, up to [`REPLICAS_MAX`] devices (no allocation).
#[derive(Debug, Clone, Copy, Default)]
struct AckCounts {
    devices: [(u16, u32); REPLICAS_MAX as usize],
    len: u8,
}

impl AckCounts {
    /// One more fragment acked by `device_id`.
    fn add(&mut self, device_id: u16) {
        let len = usize::from(self.len);
        if let Some(entry) = self.devices[..len]
            .iter_mut()
            .find(|(id, _)| *id == device_id)
        {
            entry.1 += 1;
        } else if len < self.devices.len() {
            self.devices[len] = (device_id, 1);
            self.len += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ids(&self) -> impl Iterator<Item = u16> + '_ {
        self.devices[..usize::from(self.len)]
            .iter()
            .map(|(id, _)| *id)
    }

    /// Devices that acked all `fragments`: each holds the request whole.
    fn whole(&self, fragments: usize) -> usize {
        self.devices[..usize::from(self.len)]
            .iter()
            .filter(|(_, count)| *count as usize == fragments)
            .count()
    }
}

/// How long requests took, from their first send: to the PMNet-ACKs of every fragment (updates
/// a device logged), and to the server's reply (requests that completed on it: bypass requests,
/// and updates no device acked first; a device keeps the server's reply to an update it acked
/// from the client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLatency {
    pub pmnet_ack: LatencyHistogram,
    pub server_reply: LatencyHistogram,
    /// Cache reads, to their reply (from a device or the server).
    pub cache_read: LatencyHistogram,
}

impl ClientLatency {
    /// Add every sample of `other`.
    pub fn merge(&mut self, other: &ClientLatency) {
        self.pmnet_ack.merge(&other.pmnet_ack);
        self.server_reply.merge(&other.server_reply);
        self.cache_read.merge(&other.cache_read);
    }
}

#[derive(Debug)]
struct ReplyAssembly {
    flags: u16,
    parts: Vec<Option<Vec<u8>>>,
    received_count: usize,
    received_len: usize,
}

/// One client session: sequencing, windowing, fragmentation, retransmission and completion.
#[derive(Debug)]
pub struct Client {
    config: ClientConfig,
    next_seq: u32,
    in_flight: BTreeMap<u32, InFlight>,
    /// Sequence numbers that failed, oldest first (bounded by `abandoned_max`).
    abandoned: VecDeque<u32>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<ClientEvent>,
    counters: ClientCounters,
    /// The receiving edge's warnings (datagrams that failed verification).
    edge: crate::edge::Edge,
    latency: ClientLatency,
    /// See [`Client::short_of_replicas`].
    short_of_replicas: Option<(u32, usize)>,
    /// Cache reads in flight (see `reads.rs`).
    reads: reads::Reads,
    /// Devices taken out of the path for good ([`Client::change_path`]): their acks count for
    /// nothing. At most [`REPLICAS_MAX`], the newest kept.
    lost_devices: Vec<u16>,
    /// The controllers' side of this session (asked when requests go unanswered).
    follower: Option<crate::route::Follower>,
    /// The chain's devices as the last route named them: acks of others count for nothing.
    route_devices: Option<Vec<u16>>,
    /// The replicas asked for at the start (a route of a shorter chain waits for fewer).
    replicas_wanted: u8,
}

impl Client {
    /// A new session; sequence numbers start at 1.
    pub fn new(config: ClientConfig) -> Client {
        assert!(config.window >= 1, "window must be at least 1");
        assert!(
            fragment_payload_len_max(unsealed_len_max(config.datagram_len_max, &config.auth)) >= 1,
            "datagram_len_max must exceed the header"
        );
        let follower = (!config.controllers.is_empty()).then(|| {
            let follow = crate::route::FollowerConfig::new(
                config.controllers.clone(),
                pmnet_wire::route::Role::Client,
                config.server_id,
                config.session_id,
            );
            crate::route::Follower::new(follow, Time::ZERO)
        });
        let replicas_wanted = config.replicas;
        Client {
            next_seq: 1,
            in_flight: BTreeMap::new(),
            abandoned: VecDeque::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: ClientCounters::default(),
            edge: crate::edge::Edge::default(),
            latency: ClientLatency::default(),
            short_of_replicas: None,
            reads: reads::Reads::default(),
            lost_devices: Vec::new(),
            follower,
            route_devices: None,
            replicas_wanted,
            config,
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The path changed under the session (the operator reconnected a chain around device
    /// `lost`, lost for good): send to `peer` from now on, and wait for `replicas` devices'
    /// acks (requests in flight included). The device lost holds nothing any more: the acks
    /// requests in flight had gathered are forgotten, each is acked anew by the devices on the
    /// new path (they ack a resend of what they logged), and an ack of the lost device still
    /// on its way counts for nothing (`mismatch`).
    pub fn change_path(&mut self, peer: SocketAddr, replicas: u8, lost: u16) {
        self.move_path(peer, replicas);
        if self.lost_devices.len() >= usize::from(REPLICAS_MAX) {
            self.lost_devices.remove(0);
        }
        self.lost_devices.push(lost);
    }

    /// Send to `peer` from now on and wait for `replicas` devices' acks: the acks requests in
    /// flight gathered on the old path are forgotten (the devices on the new one ack again).
    fn move_path(&mut self, peer: SocketAddr, replicas: u8) {
        self.config.peer = peer;
        self.config.replicas = replicas;
        for request in self.in_flight.values_mut() {
            request.logged.fill(Ackers::default());
            request.acked_by = AckCounts::default();
        }
    }

    /// The configured request lifetime, cut to the protocol's maximum.
    /// Distinct devices that must ack each fragment of an update.
    fn replicas(&self) -> u8 {
        self.config.replicas.clamp(1, REPLICAS_MAX)
    }

    fn request_lifetime(&self) -> Duration {
        self.config
            .request_lifetime
            .min(Duration::from_millis(pmnet_wire::MAX_REQUEST_LIFETIME_MS))
    }

    pub fn session_id(&self) -> u64 {
        self.config.session_id
    }

    /// Datagrams that could not be verified (failed authentication, or sealed while this
    /// client holds no key), in all, and the latest one's sender and reason.
    pub fn unverified(&self) -> (u64, Option<(SocketAddr, DropReason)>) {
        (
            self.edge.auth_warnings.total(),
            self.edge.auth_warnings.latest(),
        )
    }

    /// The last update the server's reply completed before `replicas` devices acked it
    /// whole (its number, and how many devices had), if any: [`ClientCounters::
    /// updates_short_of_replicas`].
    pub fn short_of_replicas(&self) -> Option<(u32, usize)> {
        self.short_of_replicas
    }

    pub fn counters(&self) -> &ClientCounters {
        &self.counters
    }

    /// How long the session's completed requests took.
    pub fn latency(&self) -> &ClientLatency {
        &self.latency
    }

    /// Requests started and not yet completed or failed.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// The sequence numbers started and not yet completed or failed, in order.
    pub fn in_flight_seqs(&self) -> impl Iterator<Item = u32> + '_ {
        self.in_flight.keys().copied()
    }

    /// Whether another request can start now.
    pub fn can_send(&self) -> bool {
        self.in_flight.len() + self.reads.len() < self.config.window as usize
            && self.next_seq != u32::MAX
    }

    /// Start an update: completes on the PMNet-ACKs of every fragment or on the server's reply,
    /// whichever comes first. Returns its sequence number. Poll transmits afterwards.
    pub fn update(&mut self, now: Time, payload: &[u8]) -> Result<u32, ClientError> {
        self.start(now, RequestKind::Update, payload)
    }

    /// Start a bypass request: never logged by a device, completes only on the server's reply.
    pub fn bypass(&mut self, now: Time, payload: &[u8]) -> Result<u32, ClientError> {
        self.start(now, RequestKind::Bypass, payload)
    }

    fn start(&mut self, now: Time, kind: RequestKind, payload: &[u8]) -> Result<u32, ClientError> {
        self.start_with_flags(now, kind, payload, 0)
    }

    fn start_with_flags(
        &mut self,
        now: Time,
        kind: RequestKind,
        payload: &[u8],
        header_flags: u16,
    ) -> Result<u32, ClientError> {
        if self.next_seq == u32::MAX {
            return Err(ClientError::SessionExhausted);
        }
        if self.in_flight.len() + self.reads.len() >= self.config.window as usize {
            return Err(ClientError::WindowFull);
        }
        if payload.len() > self.config.request_len_max {
            return Err(ClientError::TooLarge);
        }
        let seq = self.next_seq;
        let mut header = Header::new(
            kind.packet_type(),
            self.config.server_id,
            self.config.session_id,
            seq,
        );
        header.flags |= header_flags;
        if kind == RequestKind::Update && self.replicas() > 1 {
            header.flags |= pmnet_wire::replication::REPLICATED;
        }
        let fragments = encode_fragments(
            header,
            payload,
            unsealed_len_max(self.config.datagram_len_max, &self.config.auth),
        )
        .ok_or(ClientError::TooLarge)?;
        self.next_seq += 1;
        for fragment in &fragments {
            // A copy with room for the trailer: sealing it then needs no second allocation.
            self.queue_request(kind, pmnet_wire::to_sendable(fragment));
        }
        self.counters.requests_started += 1;
        let fragment_count = fragments.len();
        self.in_flight.insert(
            seq,
            InFlight {
                kind,
                fragments,
                logged: vec![Ackers::default(); fragment_count],
                acked_by: AckCounts::default(),
                reply: None,
                deadline: now + self.config.retransmit_timeout,
                timeout: self.config.retransmit_timeout,
                retransmit_count: 0,
                expires: now + self.request_lifetime(),
                not_logged: None,
                started: now,
            },
        );
        Ok(seq)
    }

    /// A request's fragment: to `peer`, and an update's with fan-out to every other device too.
    fn queue_request(&mut self, kind: RequestKind, bytes: Vec<u8>) {
        if kind == RequestKind::Update {
            for &destination in &self.config.fan_out {
                self.counters.fragments_sent += 1;
                self.transmits.push_back(Transmit {
                    destination,
                    bytes: bytes.clone(),
                });
            }
        }
        self.queue(bytes);
    }

    fn queue(&mut self, bytes: Vec<u8>) {
        self.counters.fragments_sent += 1;
        self.transmits.push_back(Transmit {
            destination: self.config.peer,
            bytes,
        });
    }

    /// Process a datagram received from the network. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let verified =
            match self
                .edge
                .verify(now, "client", from, self.config.auth.as_mut(), datagram)
            {
                Ok(inner) => inner,
                Err(reason) => {
                    self.counters.dropped.record(reason);
                    return;
                }
            };
        let datagram: &[u8] = &verified;
        let (header, payload) = match Header::parse(datagram) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.counters.dropped.record(DropReason::Parse(error));
                return;
            }
        };
        if header.session_id != self.config.session_id {
            self.counters.dropped.record(DropReason::WrongSession);
            return;
        }
        match header.packet_type {
            PacketType::PmnetAck => self.on_pmnet_ack(now, &header),
            // A replica's ack to its primary says nothing of what the server applied.
            PacketType::ServerAck if header.has_flag(pmnet_wire::replication::REPLICA) => {
                self.counters.dropped.record(DropReason::UnexpectedSource)
            }
            PacketType::ServerAck => self.on_server_ack(now, &header, payload),
            PacketType::RetransmitRequest => self.on_retransmit_request(&header),
            PacketType::NotLogged => self.on_not_logged(&header, payload),
            PacketType::Reserved(pmnet_wire::cache::CACHE_REPLY) => {
                self.on_cache_reply(now, &header, payload)
            }
            PacketType::Reserved(pmnet_wire::route::ROUTE) if self.follower.is_some() => {
                self.on_route(now, from, &header, payload)
            }
            _ => self.counters.dropped.record(DropReason::UnexpectedType),
        }
    }

    fn on_pmnet_ack(&mut self, now: Time, header: &Header) {
        self.counters.pmnet_acks_received += 1;
        if let Some(follower) = self.follower.as_mut() {
            follower.answered();
        }
        let wanted = usize::from(self.replicas());
        let Some(request) = self.in_flight.get_mut(&header.seq) else {
            self.counters.late_acks_consumed += 1;
            return;
        };
        let index = usize::from(header.fragment_index);
        let matches = request.kind == RequestKind::Update
            && usize::from(header.fragment_count) == request.fragments.len()
            && !self.lost_devices.contains(&header.device_id)
            && self
                .route_devices
                .as_ref()
                .is_none_or(|devices| devices.contains(&header.device_id));
        if !matches {
            self.counters.dropped.record(DropReason::Mismatch);
            return;
        }
        if request.logged[index].add(header.device_id) {
            request.acked_by.add(header.device_id);
        }
        if request.acked_by.whole(request.fragments.len()) >= wanted {
            let device_id = header.device_id;
            self.latency
                .pmnet_ack
                .record(now.saturating_duration_since(request.started));
            self.complete(header.seq, Completion::Logged { device_id });
        }
    }

    fn on_not_logged(&mut self, header: &Header, payload: &[u8]) {
        self.counters.not_logged_notices += 1;
        let reason = payload
            .first()
            .and_then(|code| NotLoggedReason::from_code(*code));
        match (self.in_flight.get_mut(&header.seq), reason) {
            (Some(request), Some(reason)) if payload.len() == 1 => {
                request.not_logged = Some(reason);
            }
            (Some(_), _) => self.counters.dropped.record(DropReason::BadPayload),
            (None, _) => self.counters.late_acks_consumed += 1,
        }
    }

    fn on_server_ack(&mut self, now: Time, header: &Header, payload: &[u8]) {
        self.counters.server_acks_received += 1;
        if let Some(follower) = self.follower.as_mut() {
            follower.answered();
        }
        let max_reply_len = self.config.request_len_max;
        let wanted = usize::from(self.replicas());
        let Some(request) = self.in_flight.get_mut(&header.seq) else {
            self.counters.late_acks_consumed += 1;
            return;
        };
        let fragment_count = usize::from(header.fragment_count);
        let assembly = request.reply.get_or_insert_with(|| ReplyAssembly {
            flags: header.flags,
            parts: vec![None; fragment_count],
            received_count: 0,
            received_len: 0,
        });
        let index = usize::from(header.fragment_index);
        if assembly.parts.len() != fragment_count {
            self.counters
                .dropped
                .record(DropReason::InconsistentFragment);
            return;
        }
        if assembly.parts[index].is_some() {
            return;
        }
        if assembly.received_len + payload.len() > max_reply_len {
            self.counters.dropped.record(DropReason::TooLarge);
            return;
        }
        assembly.parts[index] = Some(payload.to_vec());
        assembly.received_count += 1;
        assembly.received_len += payload.len();
        if assembly.received_count < fragment_count {
            return;
        }
        let flags = assembly.flags;
        if flags & flags::SKIPPED != 0 {
            self.fail(header.seq, ClientError::Skipped);
            return;
        }
        let reply = crate::concat_parts(std::mem::take(&mut assembly.parts));
        if request.kind == RequestKind::Update && wanted > 1 {
            let whole = request.acked_by.whole(request.fragments.len());
            if whole < wanted {
                self.counters.updates_short_of_replicas += 1;
                self.short_of_replicas = Some((header.seq, whole));
            }
        }
        self.latency
            .server_reply
            .record(now.saturating_duration_since(request.started));
        let completion = if flags & flags::REPLY_UNAVAILABLE != 0 {
            Completion::ReplyUnavailable
        } else {
            Completion::Replied {
                reply,
                makeup: flags & flags::MAKEUP != 0,
            }
        };
        self.complete(header.seq, completion);
    }

    fn on_retransmit_request(&mut self, header: &Header) {
        let Some(request) = self.in_flight.get(&header.seq) else {
            if self.abandoned.contains(&header.seq) {
                // The server waits for a request we reported failed: let it skip the number.
                self.send_noop_fill(header.seq);
                return;
            }
            // Complete requests are durable in a device log or applied; nothing to resend.
            self.counters.late_acks_consumed += 1;
            return;
        };
        self.counters.retransmit_requests_answered += 1;
        let resend: Vec<Vec<u8>> = if header.has_flag(flags::ALL_FRAGMENTS) {
            request
                .fragments
                .iter()
                .map(|fragment| pmnet_wire::to_sendable(fragment))
                .collect()
        } else {
            let index = usize::from(header.fragment_index);
            request
                .fragments
                .get(index)
                .map(|fragment| pmnet_wire::to_sendable(fragment))
                .into_iter()
                .collect()
        };
        for bytes in resend {
            self.counters.retransmitted_fragments += 1;
            self.queue(bytes);
        }
    }

    fn send_noop_fill(&mut self, seq: u32) {
        self.counters.noop_fills_sent += 1;
        self.queue(pmnet_wire::encode_noop_fill(
            self.config.server_id,
            self.config.session_id,
            seq,
        ));
    }

    /// Give up on `seq`: report it failed, remember it, and tell the server to skip it (a
    /// lost fill is sent again when the server asks).
    fn fail(&mut self, seq: u32, error: ClientError) {
        let request = self
            .in_flight
            .remove(&seq)
            .expect("failing an in-flight request");
        self.counters.requests_failed += 1;
        if self.abandoned.len() >= self.config.abandoned_max {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back(seq);
        if error != ClientError::Skipped {
            self.send_noop_fill(seq);
        }
        self.events.push_back(ClientEvent::Failed {
            seq,
            kind: request.kind,
            error,
        });
    }

    fn complete(&mut self, seq: u32, completion: Completion) {
        let request = self
            .in_flight
            .remove(&seq)
            .expect("completing an in-flight request");
        self.events.push_back(ClientEvent::Completed {
            seq,
            kind: request.kind,
            completion,
        });
    }

    /// Retransmit what timed out; fail requests that exhausted their retransmissions.
    pub fn handle_timeout(&mut self, now: Time) {
        self.read_timeouts(now);
        if let Some(follower) = self.follower.as_mut() {
            follower.handle_timeout(now);
            while let Some(transmit) = follower.poll_transmit() {
                self.transmits.push_back(transmit);
            }
        }
        let wanted = usize::from(self.replicas());
        let due: Vec<u32> = self
            .in_flight
            .iter()
            .filter(|(_, request)| request.deadline.min(request.expires) <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            let request = self.in_flight.get_mut(&seq).expect("due request");
            if request.retransmit_count >= self.config.retransmits_max || request.expires <= now {
                let error = request
                    .not_logged
                    .map_or(ClientError::TimedOut, ClientError::NotLogged);
                self.fail(seq, error);
                continue;
            }
            request.retransmit_count += 1;
            let unanswered = request.kind == RequestKind::Update && request.acked_by.is_empty();
            if request.retransmit_count >= ASK_AFTER_RETRANSMITS && unanswered {
                if let Some(follower) = self.follower.as_mut() {
                    follower.ask();
                }
            }
            request.timeout = (request.timeout * 2).min(self.config.retransmit_timeout_max);
            request.deadline = now + request.timeout;
            // Fragments every device that logged any of the request logged too need no
            // resend (the server gets them from the devices); the others go again, so that a
            // device that logged some fragments logs the rest, or more devices log them.
            let acked_any = request.acked_by;
            let kind = request.kind;
            let resend: Vec<Vec<u8>> = request
                .fragments
                .iter()
                .zip(&request.logged)
                .filter(|(_, ackers)| {
                    ackers.ids().len() < wanted || acked_any.ids().any(|id| !ackers.contains(id))
                })
                .map(|(bytes, _)| pmnet_wire::to_sendable(bytes))
                .collect();
            for bytes in resend {
                self.counters.retransmitted_fragments += 1;
                self.queue_request(kind, bytes);
            }
        }
    }

    /// The next datagram to send, if any. Poll until `None` after every call that changes state.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut transmit = self.transmits.pop_front()?;
        if let Some(auth) = self.config.auth.as_mut() {
            auth.seal(&mut transmit.bytes);
        }
        Some(transmit)
    }

    /// The next completion or failure, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// When [`Client::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.in_flight
            .values()
            .map(|request| request.deadline.min(request.expires))
            .chain(self.reads.next_deadline())
            .chain(
                self.follower
                    .as_ref()
                    .and_then(|follower| follower.poll_timeout()),
            )
            .min()
    }

    /// Ask the controllers where the chain starts and how long it is (`pmnet client` does at
    /// its start, to refuse a `--replicas` longer than the chain); nothing without them.
    pub fn ask_route(&mut self) {
        if let Some(follower) = self.follower.as_mut() {
            follower.ask();
        }
    }

    /// The devices of the chain, as the last route from a controller named them (`None`: no
    /// route yet).
    pub fn route_devices(&self) -> Option<&[u16]> {
        self.route_devices.as_deref()
    }

    /// A route from a controller: the chain's first device becomes this session's peer, acks
    /// count only from the chain's devices, and the client waits for no more of them than
    /// the chain has.
    fn on_route(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let follower = self.follower.as_mut().expect("checked by the caller");
        match follower.on_route(from, header, payload) {
            Err(reason) => self.counters.dropped.record(reason),
            Ok(false) => {}
            Ok(true) => {
                let Some(route) = follower.take_route() else {
                    return;
                };
                self.counters.routes_taken += 1;
                let devices: Vec<u16> = route.chain.devices.iter().map(|(id, _)| *id).collect();
                let replicas = self
                    .replicas_wanted
                    .min(u8::try_from(devices.len()).unwrap_or(u8::MAX));
                let first = route.chain.first().1;
                if first != self.config.peer || self.route_devices.as_ref() != Some(&devices) {
                    // As an operator's reconnection ([`Client::change_path`]): the acks
                    // gathered so far are forgotten; the devices on the new path ack again,
                    // and every request goes to them now.
                    self.move_path(first, replicas);
                    let timeout = self.config.retransmit_timeout;
                    for request in self.in_flight.values_mut() {
                        request.timeout = timeout;
                        request.deadline = request.deadline.min(now);
                    }
                }
                self.route_devices = Some(devices);
            }
        }
    }
}

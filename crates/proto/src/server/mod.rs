//! The server side of PMNet: per-session ordering, exactly-once application, make-up ACKs,
//! gaps (retransmission requests, and skipping what no client or device can supply any more),
//! requests the store has no room for yet, and the recovery poll at start-up.

mod apply;
mod devices;
mod forward_log;
mod gap;
mod hold;
mod order;
mod reads;
mod receive;
mod replicate;
mod table;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::{flags, Header, PacketType};

use crate::edge::Arrived;
use crate::{encode_fragments, CountDrop, DropCounts, DropReason, RequestKind, Time, Transmit};
pub use apply::{Applied, Stager};
pub use forward_log::{ForwardLogOpened, ForwardLogRecovery, FORWARD_RECORD_HEADER_LEN};
pub use reads::{ReadCounters, HELD_READS_MAX, READS_IN_FLIGHT_MAX};
pub use replicate::{
    ReplicationCounters, REPLICATION_BYTES_MAX, REPLICATION_PENDING_MAX, REPLICA_SERVERS_MAX,
};
use table::{Assembly, CachedReply, Deferral, Session, Table};

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub server_id: u16,
    /// Every device in front of this server: polled for logged requests at start-up (the
    /// server applies nothing new until each has answered) and asked before a sequence
    /// number is skipped. A device missing here could hold acknowledged requests the server
    /// would skip.
    pub devices: Vec<SocketAddr>,
    /// Largest datagram sent; larger replies are split into fragments.
    pub datagram_len_max: usize,
    /// Seal every datagram sent and accept only datagrams that verify (see `pmnet-auth`);
    /// `None`: no authentication.
    pub auth: Option<pmnet_auth::Authenticator>,
    /// Requests buffered at most this many sequence numbers ahead of the last applied one.
    pub reorder_window: u32,
    /// How long a gap in a session's sequence may last before the server asks for a
    /// retransmission; the interval doubles after each request, up to `gap_timeout_max`.
    pub gap_timeout: Duration,
    pub gap_timeout_max: Duration,
    /// Missing sequence numbers (or fragments) requested per gap timeout.
    pub retransmit_requests_per_gap_max: usize,
    /// A gap that lasts this long is resolved without its client: once every device says it
    /// holds none of the missing requests whole, the server skips them. Must exceed the
    /// longest request lifetime of any client ([`pmnet_wire::MAX_REQUEST_LIFETIME_MS`]), so
    /// that no client can still be acked for a skipped number.
    pub gap_fill_after: Duration,
    /// Replies kept per session for make-up ACKs; at least the client window.
    pub reply_cache_len: usize,
    /// Most sessions tracked; beyond it the longest-idle session without pending requests is
    /// forgotten (and loses duplicate detection).
    pub sessions_max: usize,
    /// Largest request reassembled from fragments.
    pub request_len_max: usize,
    /// Bytes all sessions together may buffer for reassembly and reordering; beyond it
    /// fragments are dropped (the device or the client sends them again).
    pub buffered_bytes_max: usize,
    /// Bytes one session may buffer.
    pub session_buffered_bytes_max: usize,
    /// Interval between recovery polls to a device that has not answered.
    pub recovery_poll_interval: Duration,
    /// First wait before retrying a request the application had no room for; doubles while
    /// the store stays full, up to `defer_interval_max`.
    pub defer_interval: Duration,
    pub defer_interval_max: Duration,
    /// Replica servers (at most [`REPLICA_SERVERS_MAX`]): this server is their primary; it
    /// forwards every request it applies to each and sends a server-ACK only once all of them
    /// acked it (see `replicate.rs`). Empty: not replicated.
    pub replicas: Vec<SocketAddr>,
    /// The first number of this run's hold queries (`hold.rs`): a random value, so that an
    /// answer of an earlier run replayed matches no query of this one.
    pub boot_nonce: u32,
    /// The controllers this server sends its status to and takes routes from (`--controller`;
    /// docs/replication.md, "Automatic failover"). `None`: none.
    pub follow: Option<crate::route::FollowerConfig>,
}

impl ServerConfig {
    pub fn new(server_id: u16, devices: Vec<SocketAddr>) -> ServerConfig {
        ServerConfig {
            server_id,
            devices,
            datagram_len_max: pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN,
            auth: None,
            reorder_window: 1024,
            gap_timeout: Duration::from_millis(2),
            gap_timeout_max: Duration::from_secs(1),
            retransmit_requests_per_gap_max: 16,
            gap_fill_after: Duration::from_millis(pmnet_wire::MAX_REQUEST_LIFETIME_MS)
                + Duration::from_secs(5),
            reply_cache_len: 128,
            sessions_max: 1 << 20,
            request_len_max: 1 << 20,
            buffered_bytes_max: 256 << 20,
            session_buffered_bytes_max: 16 << 20,
            recovery_poll_interval: Duration::from_millis(50),
            defer_interval: Duration::from_millis(1),
            defer_interval_max: Duration::from_millis(100),
            replicas: Vec::new(),
            boot_nonce: 0,
            follow: None,
        }
    }

    /// The keeping time: the longest after its client first sent a request that a copy of
    /// it can still arrive anywhere other than from a device's log — a retransmission, up to
    /// `gap_fill_after` (beyond any client's request lifetime), and, with keys, a replay of
    /// the last one the authenticator still accepts, twice the replay window plus a second
    /// (a margin) after it was sealed. A session is kept at least this long after its last
    /// activity, and this long before the oldest entry a device holds (`hold.rs`).
    pub fn session_keep(&self) -> Duration {
        let replay = self.auth.as_ref().map_or(Duration::ZERO, |auth| {
            Duration::from_millis(2 * auth.replay_window_ms() + 1000)
        });
        self.gap_fill_after + replay
    }
}

/// A session as the store recovered it: what exactly-once needs after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredSession {
    pub session_id: u64,
    pub last_seq: u32,
    pub last_reply: Vec<u8>,
    /// Replies of earlier requests the store still keeps (numbers below `last_seq`), so that
    /// a request resent after the restart gets its reply, not a make-up ACK without one.
    pub earlier_replies: Vec<(u32, Vec<u8>)>,
}

/// Work for the server's application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// Apply `request`, make its effect, `seq` and its reply durable together, then report
    /// [`Server::on_applied`] — or, if the store has no room for it, make nothing durable and
    /// report [`Server::on_deferred`]. Applies of one session come in sequence order and must
    /// be reported in that order.
    Apply {
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: Vec<u8>,
    },
    /// The recovery after a start is over: every device answered the recovery poll (and
    /// said it resends `entries_resent` logged entries), at least that many requests came
    /// from the devices since, and no session waits for anything any more — every request
    /// received is applied and every gap resolved (`numbers_skipped` sequence numbers
    /// skipped that no device held and no client could send any more), `took` after the
    /// last device answered.
    RecoveryComplete(RecoveryReport),
    /// Answer cache read `id` of `session_id` (a GET of the application, unsequenced: record
    /// nothing) on what is applied, then report [`Server::on_read_reply`].
    Read {
        session_id: u64,
        id: u32,
        request: Vec<u8>,
    },
    /// Answer cache read `id` of `session_id` with the application's error saying
    /// [`WAITS_FOR_ROOM`] (then report [`Server::on_read_reply_with`], not cacheable): the
    /// write it must see is acknowledged, but the store has no room for it yet.
    ReadWaitsForRoom { session_id: u64, id: u32 },
}

/// How a recovery went (see [`ServerEvent::RecoveryComplete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Logged entries the devices said they resend.
    pub entries_resent: u64,
    /// Sequence numbers skipped from the last device's answer to the end.
    pub numbers_skipped: u64,
    /// From the last device's answer to the end.
    pub took: Duration,
}

/// How often a server that has heard from every device checks whether the resent entries are
/// all applied.
const DRAIN_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// Mark a request going to replica number `replica` (from 0) as replication traffic naming
/// it ([`pmnet_wire::replication::REPLICA`]); its server-ACK names it back.
fn name_replica(bytes: &mut [u8], replica: usize) {
    let is_request = bytes.len() >= pmnet_wire::HEADER_LEN
        && (bytes[pmnet_wire::field::TYPE] == PacketType::UpdateRequest.code()
            || bytes[pmnet_wire::field::TYPE] == PacketType::BypassRequest.code());
    if !is_request {
        return;
    }
    let mut packet = pmnet_wire::Packet::new_unchecked(bytes);
    packet.set_flags(packet.flags() | pmnet_wire::replication::REPLICA);
    packet.set_device_id(u16::try_from(replica + 1).unwrap_or(u16::MAX));
    packet.fill_checksum();
}

/// A replica's answers to its primary's hold queries that wait for its forward log, at most.
pub(super) const HOLD_REPLIES_WAITING_MAX: usize = 64;

/// Why a read is answered with an error instead of a value: the write it must see was
/// acknowledged (it is durable in a device's log) but the server's store is full.
pub const WAITS_FOR_ROOM: &str = "the last acknowledged write this read must see waits for room \
    in the server's store, which is full: it is durable in the device's log and is applied once \
    room is made (delete keys, or move the data to a larger store); read again later";

/// What the server counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerCounters {
    pub request_fragments_received: u64,
    /// Routes taken from the controllers (the chain's last device moved).
    pub routes_taken: u64,
    /// Hold queries sent to devices, and the answers taken (`hold.rs`).
    pub hold_queries_sent: u64,
    pub hold_replies: u64,
    /// On a replica: its primary's hold queries answered (`hold.rs`).
    pub primary_hold_queries: u64,
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
    /// Retransmission requests not sent because the session's source had not sent enough
    /// bytes to pay for them.
    pub retransmit_requests_unpaid: u64,
    pub recovery_polls_sent: u64,
    /// Devices' probes answered (docs/security.md, "Devices and their servers").
    pub probes_answered: u64,
    pub sessions_evicted: u64,
    /// No-op fills for sequence numbers their client gave up on.
    pub noop_fills_received: u64,
    /// Fill queries sent to devices before skipping a gap.
    pub fill_queries_sent: u64,
    /// Sequence numbers skipped because no client or device could supply them any more.
    pub sequence_numbers_skipped: u64,
    /// Requests the application had no room for, handed back to wait (never refused).
    pub requests_deferred: u64,
    /// Keyed writes that waited for another session's earlier write to the same key.
    pub keyed_writes_held: u64,
    /// Waits given up because the session waited for had no room in the table.
    pub keyed_order_given_up: u64,
    /// Waits given up after `ORDER_WAIT_MAX` (the write waited for never came).
    pub keyed_order_timed_out: u64,
    /// Keyed writes whose descriptor did not parse (handed to the application as they came).
    pub keyed_bad_descriptors: u64,
    /// Cache reads (the read cache's misses).
    pub reads: ReadCounters,
    /// Batches received (each entry is counted as the datagram it is, too).
    pub batches_received: u64,
    /// What the server packed into batches for the peers that send it batches.
    pub batches: crate::BatchCounters,
    /// A primary's replication (all zero without replicas).
    pub replication: ReplicationCounters,
    pub dropped: DropCounts,
}

/// Every device answered the recovery poll; what they resend is still coming in.
#[derive(Debug)]
struct Draining {
    entries_resent: u64,
    /// Request fragments received from devices since.
    received: u64,
    since: Time,
    skipped_before: u64,
    next_check: Time,
}

#[derive(Debug)]
struct Recovery {
    awaiting: BTreeSet<SocketAddr>,
    poll_seq: u32,
    next_poll: Time,
    entries_resent: u64,
    /// Request fragments received from devices so far (a device that answered replays at
    /// once).
    received: u64,
}

/// The PMNet server state machine.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    /// A route that changes this server's part (primary or replica, its replicas, its
    /// primary): for its owner to restart it in place with these devices and replicas
    /// (`devices.rs`).
    restart: Option<(Vec<SocketAddr>, Vec<SocketAddr>)>,
    /// The applied position the last status gave, and when it was computed.
    position: Option<(Time, u64)>,
    /// The controllers' side of this server: statuses out, routes in.
    follower: Option<crate::route::Follower>,
    table: Table,
    gap_timers: BTreeSet<(Time, u64)>,
    defer_timers: BTreeSet<(Time, u64)>,
    recovery: Option<Recovery>,
    draining: Option<Draining>,
    transmits: VecDeque<Transmit>,
    /// Packs what a turn sends each peer that sends batches (see `batch.rs`).
    batcher: crate::Batcher,
    events: VecDeque<ServerEvent>,
    counters: ServerCounters,
    /// The receiving edge's warnings (failed verification; plain traffic, when asked).
    edge: crate::edge::Edge,
    /// Requests that became whole so far (see `Assembly::completed`).
    requests_completed: u64,
    /// Skips logged (rate-limited, see `gap.rs`).
    skip_notes: gap::SkipNotes,
    /// Sessions whose next request is a keyed write that waits: (the session it waits for,
    /// the number, the waiting session). See `order.rs`.
    order_waiters: BTreeSet<(u64, u32, u64)>,
    /// When each wait is given up: (deadline, waiting session). See `order.rs`.
    order_timers: BTreeSet<(Time, u64)>,
    /// Cache reads held or at the application (see `reads.rs`).
    reads: reads::Reads,
    /// A primary's requests held for its replicas (see `replicate.rs`).
    replication: replicate::Replication,
    /// The forward log (see `forward_log.rs`): a primary's forwards, a replica's requests
    /// from its primary; `None` without one.
    forward_log: Option<forward_log::ForwardLog>,
    /// A replica's requests waiting for their records, in order, each with its record's
    /// index (`None`: needs none; it waits only behind the others).
    retained_waiting: VecDeque<(Issued, Option<u64>)>,
    /// A replica's answers to its primary's hold queries, each waiting for the forward log
    /// batch that gives its copies up to be durable.
    hold_replies_waiting: crate::AfterDurable<Transmit>,
    /// What the devices still hold: when a session may be forgotten (`hold.rs`).
    holds: hold::Holds,
}

/// A request handed on from the session table.
#[derive(Debug)]
pub(super) struct Issued {
    pub session_id: u64,
    pub seq: u32,
    pub kind: RequestKind,
    pub fill: bool,
    /// Forwarded by this server's primary.
    pub from_primary: bool,
    pub request: Vec<u8>,
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
        assert!(config.sessions_max >= 1, "sessions_max must be at least 1");
        assert!(
            config.replicas.len() <= REPLICA_SERVERS_MAX,
            "at most {REPLICA_SERVERS_MAX} replicas"
        );
        let holds = hold::Holds::new(&config.devices, config.boot_nonce, config.session_keep())
            .with_replicas(&config.replicas);
        let mut table = Table::new(config.sessions_max).keeping_sessions_for(holds.keep());
        for recovered in sessions {
            let mut earlier = recovered.earlier_replies;
            earlier.retain(|(seq, _)| *seq < recovered.last_seq);
            earlier.sort_unstable_by_key(|(seq, _)| *seq);
            earlier.dedup_by_key(|(seq, _)| *seq);
            let keep = config.reply_cache_len - 1;
            let mut replies: VecDeque<(u32, CachedReply)> = earlier
                .into_iter()
                .rev()
                .take(keep)
                .rev()
                .map(|(seq, reply)| (seq, CachedReply::Reply(reply)))
                .collect();
            replies.push_back((recovered.last_seq, CachedReply::Reply(recovered.last_reply)));
            let session = Session {
                last_applied: recovered.last_seq,
                issued_through: recovered.last_seq,
                highest_seen: recovered.last_seq,
                replies,
                ..Session::default()
            };
            table.insert(now, recovered.session_id, session);
        }
        let batcher = crate::Batcher::new(
            crate::unsealed_len_max(config.datagram_len_max, &config.auth),
            0,
        );
        let mut server = Server {
            batcher,
            table,
            gap_timers: BTreeSet::new(),
            defer_timers: BTreeSet::new(),
            recovery: None,
            draining: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: ServerCounters::default(),
            edge: crate::edge::Edge::default(),
            requests_completed: 0,
            skip_notes: gap::SkipNotes::default(),
            order_waiters: BTreeSet::new(),
            order_timers: BTreeSet::new(),
            reads: reads::Reads::default(),
            replication: replicate::Replication::default(),
            forward_log: None,
            retained_waiting: VecDeque::new(),
            hold_replies_waiting: crate::AfterDurable::new(HOLD_REPLIES_WAITING_MAX),
            holds,
            restart: None,
            position: None,
            follower: config
                .follow
                .clone()
                .map(|follow| crate::route::Follower::new(follow, now)),
            config,
        };
        if !server.config.devices.is_empty() {
            server.recovery = Some(Recovery {
                awaiting: server.config.devices.iter().copied().collect(),
                poll_seq: 1,
                next_poll: now,
                entries_resent: 0,
                received: 0,
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

    /// The devices the start-up recovery poll still waits for (empty once recovered).
    pub fn recovery_awaiting(&self) -> Vec<SocketAddr> {
        self.recovery
            .as_ref()
            .map(|recovery| recovery.awaiting.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The last sequence number applied (or skipped) for `session_id`, 0 if none.
    pub fn last_applied(&self, session_id: u64) -> u32 {
        self.table
            .sessions
            .get(&session_id)
            .map_or(0, |session| session.last_applied)
    }

    /// How far this server got: the sum of its sessions' last applied numbers. Replicas
    /// apply in their primary's order, so of two replicas of one primary the one with the
    /// higher value holds everything the other does: the one to promote.
    pub fn applied_position(&self) -> u64 {
        self.table
            .sessions
            .values()
            .map(|session| u64::from(session.last_applied))
            .sum()
    }

    /// Sessions with buffered or unapplied requests (for convergence checks).
    pub fn busy_session_count(&self) -> usize {
        self.table
            .sessions
            .values()
            .filter(|session| !session.is_idle())
            .count()
    }

    /// The busy sessions in words (for a failure report): each one's numbers applied,
    /// handed over and seen, what it buffers, and its gap.
    pub fn busy_sessions_text(&self) -> String {
        let mut busy: Vec<(&u64, &table::Session)> = self
            .table
            .sessions
            .iter()
            .filter(|(_, session)| !session.is_idle())
            .collect();
        busy.sort_unstable_by_key(|(id, _)| **id);
        let texts: Vec<String> = busy
            .iter()
            .map(|(id, session)| {
                let timer = session
                    .gap
                    .as_ref()
                    .is_some_and(|gap| self.gap_timers.contains(&(gap.deadline, **id)));
                let order_timer = session
                    .waiting_until
                    .map(|until| (until, self.order_timers.contains(&(until, **id))));
                format!(
                    "s={id:x}: {} order timer {order_timer:?}",
                    session.describe(timer)
                )
            })
            .collect();
        texts.join("; ")
    }

    /// Sessions tracked.
    pub fn session_count(&self) -> usize {
        self.table.len()
    }

    /// Requests waiting because the application had no room for them.
    pub fn deferred_session_count(&self) -> usize {
        self.defer_timers.len()
    }

    /// A primary's replication state in words (for a failure report): the requests at the
    /// head of its forwarding order and the replicas that acked each.
    pub fn replication_text(&self) -> String {
        self.replication.text()
    }

    /// Requests a primary holds back until every replica acked them.
    pub fn replication_pending(&self) -> usize {
        self.replication.pending_len()
    }

    /// Bytes buffered for reassembly and reordering, all sessions together.
    pub fn buffered_bytes(&self) -> usize {
        self.table.buffered_bytes
    }

    fn count_drop(&mut self, reason: DropReason) {
        self.counters.dropped.record(reason);
    }

    /// Datagrams that could not be verified (failed authentication, or sealed while this
    /// server holds no key), in all: a caller noting who it hears from counts only the others.
    pub fn unverified_total(&self) -> u64 {
        self.edge.auth_warnings.total()
    }

    fn is_device(&self, address: SocketAddr) -> bool {
        self.config.devices.contains(&address)
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

    /// Without keys: warn, at most once a minute, of unauthenticated datagrams from peers off
    /// this host (a server started with `--insecure` on an address others reach).
    pub fn warn_of_plain_traffic(&mut self) {
        if self.config.auth.is_none() {
            self.edge.plain_warnings = Some(crate::PlainTrafficWarnings::default());
        }
    }

    /// Bytes of header and payload a datagram may have (the trailer, if any, comes on top).
    fn datagram_budget(&self) -> usize {
        crate::unsealed_len_max(self.config.datagram_len_max, &self.config.auth)
    }

    /// Process a datagram from the network: verified first (with keys configured), then
    /// parsed. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        self.handle_datagram(now, from, datagram);
        self.ask_devices_if_waiting(now);
    }

    /// Sessions an eviction wanted and the devices have not cleared: ask them.
    fn ask_devices_if_waiting(&mut self, now: Time) {
        for session_id in std::mem::take(&mut self.table.waits_for_devices) {
            self.holds.want(now, session_id);
        }
    }

    fn handle_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let verified =
            match self
                .edge
                .verify(now, "server", from, self.config.auth.as_mut(), datagram)
            {
                Ok(inner) => inner,
                Err(reason) => {
                    self.count_drop(reason);
                    if matches!(
                        reason,
                        DropReason::SealedWithoutKey
                            | DropReason::Auth(pmnet_auth::AuthError::Unauthenticated)
                    ) {
                        self.answer_probe_it_cannot_verify(from, datagram);
                    }
                    return;
                }
            };
        crate::edge::unpack(&verified, |arrived| match arrived {
            Arrived::Datagram {
                header, payload, ..
            } => self.handle_parsed(now, from, &header, payload),
            // The peer unpacks batches, so what goes back to it is packed too.
            Arrived::Batch => {
                self.counters.batches_received += 1;
                self.batcher.add_peer(from);
            }
            Arrived::Dropped(reason) => self.count_drop(reason),
        });
    }

    /// A device's probe this server cannot verify (sealed, at a server without keys; in
    /// clear, at a server with keys): answered as this server sends everything (in clear,
    /// or sealed), so that the device learns at once that the two do not understand each
    /// other (an answer it cannot verify) instead of taking the silence for an outage and
    /// acking writes this server would drop. No larger than the probe, to its sender only.
    fn answer_probe_it_cannot_verify(&mut self, from: SocketAddr, datagram: &[u8]) {
        let Ok((header, _)) = Header::parse(pmnet_auth::without_trailer(datagram)) else {
            return;
        };
        if header.packet_type != PacketType::Probe || header.flags & flags::ANSWER != 0 {
            return;
        }
        self.counters.probes_answered += 1;
        self.transmits.push_back(Transmit {
            destination: from,
            bytes: Header {
                flags: flags::ANSWER,
                ..header
            }
            .encode(&[]),
        });
    }

    fn handle_parsed(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let header = *header;
        if header.server_id != self.config.server_id {
            self.count_drop(DropReason::WrongServer);
            return;
        }
        if let Some(replica) = self.replica_index(from) {
            match header.packet_type {
                PacketType::ServerAck => self.on_replica_ack(now, replica, &header),
                _ => self.on_replica_message(now, from, &header, payload),
            }
            return;
        }
        match header.packet_type {
            // A client's address a device carries to the next device of a chain: never part
            // of a request (docs/protocol.md, "Devices in series").
            PacketType::UpdateRequest
                if header.has_flag(pmnet_wire::replication::CLIENT_ADDRESS) =>
            {
                self.count_drop(DropReason::BadClientAddress)
            }
            PacketType::UpdateRequest => {
                self.on_request(now, from, RequestKind::Update, &header, payload)
            }
            PacketType::BypassRequest => {
                self.on_request(now, from, RequestKind::Bypass, &header, payload)
            }
            PacketType::RecoveryDone => self.on_recovery_done(now, from, payload),
            // A device asks whether this server verifies what it sends: the answer, sealed
            // like everything this server sends, tells it so, and that it can verify this
            // server. The same size as the probe, to its sender only.
            // An answer is never answered (a forged source could make two endpoints answer
            // each other for ever).
            PacketType::Probe if header.flags & flags::ANSWER != 0 => {
                self.count_drop(DropReason::UnexpectedType)
            }
            PacketType::Probe => {
                self.counters.probes_answered += 1;
                self.transmits.push_back(Transmit {
                    destination: from,
                    bytes: Header {
                        flags: flags::ANSWER,
                        ..header
                    }
                    .encode(&[]),
                });
            }
            PacketType::Reserved(pmnet_wire::cache::CACHE_READ) => {
                self.on_cache_read(now, from, &header, payload)
            }
            PacketType::Reserved(pmnet_wire::route::ROUTE) if self.follower.is_some() => {
                let follower = self.follower.as_mut().expect("checked");
                match follower.on_route(from, &header, payload) {
                    Err(reason) => self.count_drop(reason),
                    Ok(false) => {}
                    Ok(true) => {
                        if let Some(route) = follower.take_route() {
                            self.counters.routes_taken += 1;
                            self.follow_route(now, &route);
                        }
                    }
                }
            }
            PacketType::FillReply if self.is_device(from) => {
                if !self.on_device_fill_reply_for_replicas(from, &header, payload) {
                    self.on_fill_reply(now, from, &header, payload)
                }
            }
            PacketType::FillReply => self.count_drop(DropReason::UnexpectedSource),
            PacketType::HoldReply => self.on_hold_reply(from, &header, payload),
            // A replica's primary (its only device) asks what it keeps for a promotion.
            PacketType::HoldQuery if self.is_device(from) && !self.is_primary() => {
                self.on_primary_hold_query(now, from, &header, payload)
            }
            _ => self.count_drop(DropReason::UnexpectedType),
        }
    }

    /// A device's answer to a hold query (`hold.rs`).
    pub(super) fn on_hold_reply(&mut self, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(held) = pmnet_wire::decode_hold_reply_payload(payload) else {
            self.count_drop(DropReason::BadPayload);
            return;
        };
        if !self.holds.answered(from, header.seq, &held) {
            self.count_drop(DropReason::StaleHoldReply);
            return;
        }
        self.counters.hold_replies = self.holds.replies;
    }

    /// Hand every request that is next in sequence and complete to the application, then
    /// (re)arm or clear the session's gap timer.
    fn advance(&mut self, now: Time, session_id: u64) {
        if self.recovery.is_none() {
            while self.issue_next(now, session_id) {}
        }
        self.update_gap(now, session_id);
    }

    /// When the session's next request in sequence became whole, if it is whole and may be
    /// handed to the application now.
    fn next_completed(&self, session_id: u64) -> Option<u64> {
        self.next_issuable(session_id).ok()
    }

    /// [`Server::next_completed`], or what stops it.
    fn next_issuable(&self, session_id: u64) -> Result<u64, order::Blocked> {
        let session = self
            .table
            .sessions
            .get(&session_id)
            .ok_or(order::Blocked::Nothing)?;
        if session.deferral.is_some() {
            return Err(order::Blocked::Nothing);
        }
        let (&seq, assembly) = session
            .pending
            .first_key_value()
            .ok_or(order::Blocked::Nothing)?;
        if seq != session.issued_through + 1 || !assembly.is_complete() {
            return Err(order::Blocked::Nothing);
        }
        if session.order_given_up {
            return Ok(assembly.completed);
        }
        match order::afters_of(assembly)
            .into_iter()
            .find(|&(after, through)| !self.order_satisfied(session_id, after, through))
        {
            Some((after, through)) => Err(order::Blocked::After(after, through)),
            None => Ok(assembly.completed),
        }
    }

    /// Hand the session's next request in sequence to the application, if it may go now.
    fn issue_next(&mut self, now: Time, session_id: u64) -> bool {
        match self.next_issuable(session_id) {
            Ok(_) => {}
            Err(order::Blocked::Nothing) => return false,
            Err(order::Blocked::After(after, through)) => {
                // A wait given up at once (no room in the table for the session waited
                // for) lets the request go now.
                return self.wait_for(now, session_id, after, through)
                    && self.issue_next(now, session_id);
            }
        }
        let (len, from_primary) = self.table.sessions[&session_id]
            .pending
            .first_key_value()
            .map_or((0, false), |(_, assembly)| {
                (assembly.received_len, assembly.from_primary)
            });
        if !self.replication_room(session_id, len, from_primary) {
            return false;
        }
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("session with a request to issue");
        let (seq, assembly) = session
            .pending
            .pop_first()
            .expect("session with a request to issue");
        session.buffered_bytes -= assembly.cost();
        self.table.buffered_bytes -= assembly.cost();
        session.issued_through = seq;
        session.order_given_up = false;
        // A request that goes waits no more: its wait, and the wait's timer, end with it.
        if let Some(deadline) = session.waiting_until.take() {
            self.order_timers.remove(&(deadline, session_id));
        }
        if let Some((after, through)) = session.waiting_for.take() {
            self.order_waiters.remove(&(after, through, session_id));
        }
        if assembly.fill {
            session.fills_issued.push_back(seq);
        }
        let request = if assembly.fill {
            Vec::new()
        } else {
            // A keyed write reaches the application without its descriptor.
            let strip = if assembly.keyed {
                let first = assembly.parts.first().and_then(Option::as_deref);
                let len = order::descriptor_len(first.unwrap_or_default());
                if len.is_none() {
                    self.counters.keyed_bad_descriptors += 1;
                }
                len.unwrap_or(0)
            } else {
                0
            };
            let mut request = crate::concat_parts(assembly.parts);
            request.drain(..strip);
            request
        };
        let issued = Issued {
            session_id,
            seq,
            kind: assembly.kind,
            fill: assembly.fill,
            from_primary,
            request,
        };
        self.hand_on(now, issued);
        true
    }

    fn send_makeup_ack(&mut self, session_id: u64, seq: u32, to: SocketAddr, replica_id: u16) {
        let session = &self.table.sessions[&session_id];
        let cached = session
            .replies
            .iter()
            .find(|(replied_seq, _)| *replied_seq == seq)
            .map(|(_, reply)| reply.clone())
            .or_else(|| session.was_skipped(seq).then_some(CachedReply::Skipped));
        self.counters.makeup_acks_sent += 1;
        match cached {
            Some(CachedReply::Reply(reply)) => {
                self.send_server_ack(session_id, seq, flags::MAKEUP, &reply, to, replica_id)
            }
            Some(CachedReply::Skipped) => {
                let skipped = flags::MAKEUP | flags::REPLY_UNAVAILABLE | flags::SKIPPED;
                self.send_server_ack(session_id, seq, skipped, &[], to, replica_id);
            }
            None => {
                self.counters.makeup_acks_without_reply += 1;
                let makeup = flags::MAKEUP | flags::REPLY_UNAVAILABLE;
                self.send_server_ack(session_id, seq, makeup, &[], to, replica_id);
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
        replica_id: u16,
    ) {
        let mut header = Header::new(
            PacketType::ServerAck,
            self.config.server_id,
            session_id,
            seq,
        );
        header.flags = flags;
        // A replica answers its primary as the replica the primary named.
        if replica_id != 0 {
            header.flags |= pmnet_wire::replication::REPLICA;
            header.device_id = replica_id;
        }
        let datagrams = encode_fragments(header, reply, self.datagram_budget())
            .or_else(|| {
                // Replies are bounded by the store; one that still does not fit is reported
                // as unavailable rather than lost silently.
                header.flags |= pmnet_wire::flags::REPLY_UNAVAILABLE;
                encode_fragments(header, &[], self.datagram_budget())
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
        let defer_interval = self.config.defer_interval;
        let session = self
            .table
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
        session.defer_interval = defer_interval;
        session.waits_for_room = false;
        if session.replies.len() >= reply_cache_len {
            session.replies.pop_front();
        }
        let was_fill = session.fills_issued.front() == Some(&seq);
        if was_fill {
            session.fills_issued.pop_front();
            session.replies.push_back((seq, CachedReply::Skipped));
        } else {
            session
                .replies
                .push_back((seq, CachedReply::Reply(reply.clone())));
        }
        // None: a request a primary took in again from its forward log, not resent since
        // (its device or client is answered with a make-up ACK when it resends).
        let to = session.reply_to;
        let replica_id = session.take_replica_stamp(seq);
        self.table.touch(now, session_id);
        self.counters.requests_applied += 1;
        let (ack_flags, reply) = if was_fill {
            (
                flags::MAKEUP | flags::REPLY_UNAVAILABLE | flags::SKIPPED,
                &[][..],
            )
        } else {
            (0, &reply[..])
        };
        if let Some(to) = to {
            self.send_server_ack(session_id, seq, ack_flags, reply, to, replica_id);
        }
        self.update_gap(now, session_id);
        self.release_waiters(now, session_id, seq);
        self.release_reads(now, session_id, seq);
        if let Some(log) = self.forward_log.as_mut() {
            // Applied durably: a primary's forward is freed (the replicas and this server
            // have it); a replica's request from its primary is kept until its slots are
            // needed.
            log.applied((session_id, seq));
            self.unstall(now);
        }
    }

    /// Report that the application had no room for request `seq` of `session_id` and made
    /// nothing of it durable. The request goes back to wait, with every later request of the
    /// session already handed out; no server-ACK is sent, so every device keeps its log entry
    /// (the write stays durable there), and the server tries again after a backoff.
    pub fn on_deferred(
        &mut self,
        now: Time,
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: Vec<u8>,
    ) {
        let defer_interval_max = self.config.defer_interval_max;
        let first_interval = self.config.defer_interval;
        let mut handed_back = vec![(seq, kind, request)];
        let events = std::mem::take(&mut self.events);
        for event in events {
            match event {
                ServerEvent::Apply {
                    session_id: owner,
                    seq,
                    kind,
                    request,
                } if owner == session_id => handed_back.push((seq, kind, request)),
                other => self.events.push_back(other),
            }
        }
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("on_deferred for a session with an issued request");
        assert!(
            seq == session.last_applied + 1 && seq <= session.issued_through,
            "on_deferred out of order: seq {seq}, last applied {}, issued through {}",
            session.last_applied,
            session.issued_through
        );
        // On a primary, what it forwarded after it and has not applied comes back too; on a
        // replica, what waits for its record.
        handed_back.extend(self.replication.take_session(session_id));
        handed_back.extend(self.take_retained_of(session_id));
        let session = self
            .table
            .sessions
            .get_mut(&session_id)
            .expect("on_deferred for a session with an issued request");
        for (seq, kind, request) in handed_back {
            let fill = session.fills_issued.contains(&seq);
            let assembly = Assembly::whole(kind, fill, request);
            session.buffered_bytes += assembly.cost();
            self.table.buffered_bytes += assembly.cost();
            session.pending.insert(seq, assembly);
        }
        session.fills_issued.retain(|issued| *issued < seq);
        session.issued_through = seq - 1;
        let interval = session.defer_interval.max(first_interval);
        session.defer_interval = (interval * 2).min(defer_interval_max);
        if let Some(old) = session.deferral.take() {
            self.defer_timers.remove(&(old.retry_at, session_id));
        }
        let retry_at = now + interval;
        session.deferral = Some(Deferral { retry_at });
        session.waits_for_room = true;
        self.defer_timers.insert((retry_at, session_id));
        self.counters.requests_deferred += 1;
        self.update_gap(now, session_id);
        self.refuse_reads_waiting_for(session_id);
    }

    fn on_recovery_done(&mut self, now: Time, from: SocketAddr, payload: &[u8]) {
        let Some(recovery) = self.recovery.as_mut() else {
            self.count_drop(DropReason::LateRecoveryDone);
            return;
        };
        let Ok(entries_resent) = pmnet_wire::decode_recovery_done_payload(payload) else {
            self.count_drop(DropReason::BadRecoveryDone);
            return;
        };
        if !recovery.awaiting.remove(&from) {
            self.count_drop(DropReason::LateRecoveryDone);
            return;
        }
        recovery.entries_resent += u64::from(entries_resent);
        if !recovery.awaiting.is_empty() {
            return;
        }
        let (entries_resent, received) = (recovery.entries_resent, recovery.received);
        self.recovery = None;
        self.draining = Some(Draining {
            entries_resent,
            received,
            since: now,
            skipped_before: self.counters.sequence_numbers_skipped,
            next_check: now,
        });
        self.issue_in_arrival_order(now);
    }

    /// Whether the server still says its recovery is under way (every device answered, and
    /// what they resend is not all applied yet).
    pub fn is_draining(&self) -> bool {
        self.draining.is_some()
    }

    /// A request fragment from `from` arrived (counted towards the resent entries while
    /// draining).
    pub(super) fn note_received(&mut self, from: SocketAddr) {
        if (self.draining.is_none() && self.recovery.is_none()) || !self.is_device(from) {
            return;
        }
        if let Some(recovery) = self.recovery.as_mut() {
            recovery.received += 1;
        }
        if let Some(draining) = self.draining.as_mut() {
            draining.received += 1;
        }
    }

    /// Say the recovery is complete once the devices sent at least as many requests as they
    /// resend and no session waits for anything (checked every [`DRAIN_CHECK_INTERVAL`]).
    fn check_drained(&mut self, now: Time) {
        let Some(draining) = self.draining.as_mut() else {
            return;
        };
        if draining.next_check > now {
            return;
        }
        draining.next_check = now + DRAIN_CHECK_INTERVAL;
        if draining.received < draining.entries_resent || self.busy_session_count() > 0 {
            return;
        }
        let draining = self.draining.take().expect("checked above");
        self.events
            .push_back(ServerEvent::RecoveryComplete(RecoveryReport {
                entries_resent: draining.entries_resent,
                numbers_skipped: self.counters.sequence_numbers_skipped - draining.skipped_before,
                took: now.saturating_duration_since(draining.since),
            }));
    }

    /// Hand on every request waiting to go, in the order the requests became whole.
    fn issue_in_arrival_order(&mut self, now: Time) {
        // Hand on what was held back in the order it arrived, across sessions as within
        // each: a request a device forwarded after another session's acked update must not
        // overtake it (a read would miss the write its reader was told is done). Ties cannot
        // occur (each request has its own arrival number), so a seed replays the same
        // applies every time.
        let waiting: Vec<u64> = self
            .table
            .sessions
            .iter()
            .filter(|(_, session)| !session.pending.is_empty() || !session.is_idle())
            .map(|(id, _)| *id)
            .collect();
        let mut ready: BinaryHeap<Reverse<(u64, u64)>> = waiting
            .iter()
            .filter_map(|&id| Some(Reverse((self.next_completed(id)?, id))))
            .collect();
        while let Some(Reverse((_, session_id))) = ready.pop() {
            self.issue_next(now, session_id);
            if let Some(completed) = self.next_completed(session_id) {
                ready.push(Reverse((completed, session_id)));
            }
        }
        // What could not go yet (a keyed write that waits, a gap) is now waited for.
        let mut waiting = waiting;
        waiting.sort_unstable();
        for session_id in waiting {
            self.advance(now, session_id);
        }
    }

    /// Ask for what is missing in sessions whose gap lasted too long, skip what nobody can
    /// supply any more, retry deferred requests, re-poll devices that have not answered the
    /// recovery poll.
    pub fn handle_timeout(&mut self, now: Time) {
        if self
            .follower
            .as_ref()
            .is_some_and(|follower| follower.status_due(now))
        {
            let position = self.status_position(now);
            let follower = self.follower.as_mut().expect("checked");
            follower.set_position(position);
            follower.handle_timeout(now);
            while let Some(transmit) = follower.poll_transmit() {
                self.transmits.push_back(transmit);
            }
        }
        if self.holds.poll_timeout().is_some_and(|at| at <= now) {
            let pending = self.pending_sessions();
            self.holds.handle_timeout(
                now,
                self.config.server_id,
                &mut self.transmits,
                &|session| pending.contains(&session),
            );
        }
        self.counters.hold_queries_sent = self.holds.queries_sent;
        if self
            .recovery
            .as_ref()
            .is_some_and(|recovery| recovery.next_poll <= now)
        {
            self.send_recovery_polls(now);
        }
        while let Some(&(retry_at, session_id)) = self.defer_timers.first() {
            if retry_at > now {
                break;
            }
            self.defer_timers.remove(&(retry_at, session_id));
            if let Some(session) = self.table.sessions.get_mut(&session_id) {
                session.deferral = None;
            }
            self.advance(now, session_id);
        }
        while let Some(&(deadline, session_id)) = self.gap_timers.first() {
            if deadline > now {
                break;
            }
            self.gap_timers.remove(&(deadline, session_id));
            self.on_gap_timeout(now, session_id);
        }
        while let Some(&(deadline, session_id)) = self.order_timers.first() {
            if deadline > now {
                break;
            }
            self.order_timers.remove(&(deadline, session_id));
            self.on_order_timeout(now, session_id, deadline);
        }
        self.resend_forwards(now);
        self.skip_notes.flush(now);
        self.check_drained(now);
        self.ask_devices_if_waiting(now);
    }

    /// The next datagram to send, if any. Poll until `None` after every call that changes state.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut transmit = match self.batcher.pop() {
            Some(transmit) => transmit,
            None => {
                let transmits = &mut self.transmits;
                self.batcher.fill(|| transmits.pop_front());
                self.counters.batches = self.batcher.counters;
                self.batcher.pop()?
            }
        };
        if let Some(replica) = self.replica_index(transmit.destination) {
            name_replica(&mut transmit.bytes, replica);
        }
        if let Some(auth) = self.config.auth.as_mut() {
            auth.seal(&mut transmit.bytes);
        }
        Some(transmit)
    }

    /// What following the controllers counted (`None`: no controller).
    pub fn follower(&self) -> Option<&crate::route::Follower> {
        self.follower.as_ref()
    }

    /// The next request to apply (or recovery notice), if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// When [`Server::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let gap = self.gap_timers.first().map(|(deadline, _)| *deadline);
        let defer = self.defer_timers.first().map(|(retry_at, _)| *retry_at);
        let poll = self.recovery.as_ref().map(|recovery| recovery.next_poll);
        let order = self.order_timers.first().map(|(deadline, _)| *deadline);
        let forwards = self.next_forward_resend();
        let drained = self.draining.as_ref().map(|draining| draining.next_check);
        let holds = self.holds.poll_timeout();
        let follow = self
            .follower
            .as_ref()
            .and_then(|follower| follower.poll_timeout());
        gap.into_iter()
            .chain(holds)
            .chain(follow)
            .chain(drained)
            .chain(defer)
            .chain(poll)
            .chain(order)
            .chain(forwards)
            .min()
    }
}

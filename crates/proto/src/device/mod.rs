//! The PMNet device: logs update requests in persistent memory, acks them early, forwards
//! every request to its server, and replays its log when a server asks.

mod hold;
mod replay;
mod rtt;
mod seen;
mod trust;
mod upstream;

pub use trust::{PROBE_INTERVAL_FIRST, PROBE_INTERVAL_MAX, WARN_AFTER as UNVERIFIED_WARN_AFTER};

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_pm::log::RecoveredEntry;
use pmnet_pm::EntryKey;
use pmnet_pm::LogWork;
use pmnet_wire::cache::{CACHE_READ, CACHE_REPLY};
use pmnet_wire::{flags, Header, NotLoggedReason, PacketType};

use crate::{
    CountDrop, DropCounts, DropReason, LatencyHistogram, NetworkFunction, PersistBatch, Time,
    Transmit, Verdict,
};

/// Settings of a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Named in every PMNet-ACK this device sends.
    pub device_id: u16,
    /// The servers behind this device and their ids: one for the "NIC" deployment, several
    /// for the "switch".
    pub servers: Vec<(u16, SocketAddr)>,
    /// When false the device forwards everything without logging: a plain switch.
    pub logging: bool,
    /// Slots of the persistent log (must match the log the runtime opened).
    pub slot_count: u32,
    /// Largest datagram a slot holds; larger update fragments are forwarded without logging.
    pub logged_packet_len_max: usize,
    /// Slots tried, from the one the hash picks, before counting a collision. Linear probing
    /// clusters: with 4, a log an eighth full already turned away one update in a few
    /// thousand; with 32, a collision needs a log nearly full.
    pub probe_limit: u32,
    /// Most live entries at once; at the limit, updates are forwarded without logging.
    pub live_entries_max: u32,
    /// A logged entry the server has not acked is resent to it after this long at least (or
    /// after the time the server's acks take, when that is longer: `rtt.rs`), then with
    /// exponential backoff up to the maximum, for as long as the entry is live.
    pub resend_timeout: Duration,
    pub resend_timeout_max: Duration,
    /// Most client addresses remembered (one per session); the oldest is forgotten first.
    pub sessions_max: usize,
    /// Most datagrams queued for sending; beyond it, datagrams are dropped and counted.
    pub transmit_queue_len_max: usize,
    /// Log entries resent to one server and not yet acked, at most: resends after a timeout
    /// and the replay after a recovery poll go out at the pace the server acks them, in
    /// (session, seq) order, instead of all at once into its receive buffer.
    pub resends_in_flight_max: u32,
    /// The devices before this one in chains, by server id (`--previous-device`): fill queries
    /// are passed on to them and answered once they answered (`upstream.rs`).
    pub previous_devices: Vec<(u16, SocketAddr)>,
    /// The controllers this device sends its status to and takes routes from (`--controller`;
    /// docs/replication.md, "Automatic failover"). `None`: none.
    pub follow: Option<crate::route::FollowerConfig>,
}

impl DeviceConfig {
    /// Defaults for device `device_id` in front of `servers`, logging on, with a log of
    /// `slot_count` slots of `logged_packet_len_max` bytes each.
    pub fn new(
        device_id: u16,
        servers: Vec<(u16, SocketAddr)>,
        slot_count: u32,
        logged_packet_len_max: usize,
    ) -> DeviceConfig {
        DeviceConfig {
            device_id,
            servers,
            logging: true,
            slot_count,
            logged_packet_len_max,
            probe_limit: 32,
            live_entries_max: slot_count,
            resend_timeout: Duration::from_millis(20),
            resend_timeout_max: Duration::from_secs(1),
            sessions_max: 1 << 16,
            transmit_queue_len_max: 2 * slot_count as usize + 4096,
            resends_in_flight_max: 256,
            previous_devices: Vec::new(),
            follow: None,
        }
    }
}

/// What the device counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    pub updates_received: u64,
    /// PMNet-ACKs and not-logged notices of the next device of a chain, passed on towards
    /// the client.
    pub chain_acks_relayed: u64,
    /// Updates forwarded to the next device of a chain with their client's address, so that
    /// it acks the client directly (docs/protocol.md, "Devices in series").
    pub client_addresses_carried: u64,
    /// PMNet-ACKs sent straight to a client whose address the device before this one carried.
    pub acks_sent_direct: u64,
    /// Carried client addresses not honoured: the sender is not a device named by
    /// `--previous-device` (its source was acked instead).
    pub client_addresses_ignored: u64,
    /// Cache reads forwarded to their server.
    pub cache_reads_forwarded: u64,
    /// Cache replies from a server forwarded to their client.
    pub cache_replies_forwarded: u64,
    pub updates_logged: u64,
    /// Updates forwarded without logging because every probed slot was taken.
    pub log_collisions: u64,
    /// Updates forwarded without logging because the live-entry limit was reached.
    pub log_full: u64,
    /// Updates forwarded without logging because they do not fit a slot (or logging is off).
    pub forwarded_without_log: u64,
    /// Retransmitted updates that were already logged (re-acked, not forwarded again).
    pub duplicate_updates: u64,
    pub bypass_forwarded: u64,
    pub pmnet_acks_sent: u64,
    pub server_acks_forwarded: u64,
    /// Server-ACKs of updates whose every fragment this device had PMNet-acked: not
    /// forwarded (the client completed on the PMNet-ACKs).
    pub server_acks_absorbed: u64,
    pub entries_invalidated: u64,
    pub retransmit_requests_received: u64,
    pub resent_from_log: u64,
    pub retransmit_requests_passed_to_client: u64,
    /// Unacked entries resent to their server after the resend timeout.
    pub resend_timeouts: u64,
    pub recovery_polls: u64,
    pub recovery_entries_resent: u64,
    /// Entries queued to be resent at the server's pace, and sent from that queue.
    pub replay_queued: u64,
    pub replay_sent: u64,
    /// Not-logged notices sent to clients (log full, collision, too large).
    pub not_logged_notices_sent: u64,
    /// Fill queries answered; of those, how many found a request held whole.
    pub fill_queries: u64,
    pub fill_queries_held: u64,
    /// Fill queries passed on to the devices before this one in chains (`upstream.rs`).
    pub fill_queries_passed_on: u64,
    /// Hold queries of servers answered (or passed on), `server/hold.rs`.
    pub hold_queries: u64,
    /// Clients' no-op fills sent to a server again (it asked for a number whose client gave
    /// up on it).
    pub fills_resent: u64,
    /// Entries rebuilt from the log at start-up.
    pub entries_recovered: u64,
    /// Updates forwarded without logging or acking because their server is not verified yet
    /// (`trust.rs`); probes sent to servers and answers that verified; probes of the device
    /// before this one in a chain answered.
    pub unverified_forwards: u64,
    pub probes_sent: u64,
    pub probes_answered: u64,
    pub probes_served: u64,
    pub dropped: DropCounts,
}

impl DeviceCounters {
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    /// The log write is issued and not yet reported durable: no ack may be sent.
    Persisting,
    /// Durable in the log: acked (or ackable).
    Durable,
}

#[derive(Debug)]
struct Entry {
    key: EntryKey,
    state: EntryState,
    generation: u64,
    /// The update as received, shared with its log write (one copy).
    packet: std::sync::Arc<[u8]>,
    fragment_count: u16,
    /// Where the update came from (the client, or the device before this one in a chain):
    /// where the PMNet-ACK goes unless `ack_to` says otherwise, and what it is relayed to.
    client: Option<SocketAddr>,
    /// The client's own address, carried by the device before this one (volatile: a
    /// recovered entry has none): its PMNet-ACK, and the next device's it relays, go there.
    ack_to: Option<SocketAddr>,
    /// The server acked while the write was persisting: free the slot once it completes.
    invalidate_when_persisted: bool,
    /// This device queued a PMNet-ACK for the entry (false for entries recovered from the
    /// log: whether their ack left before the crash is unknown).
    ack_sent: bool,
    resend_deadline: Time,
    resend_timeout: Duration,
    /// Resent from the replay queue and not yet acked or timed out: counts against
    /// `resends_in_flight_max`.
    in_replay: bool,
    /// When the update was logged and forwarded (`None` for entries recovered from the log).
    logged_at: Option<Time>,
    /// Sent to its server more than once (its ack says nothing of the round trip).
    resent: bool,
    /// Acks of later devices of a chain passed on to the client for this fragment.
    relayed: u8,
    /// Its client waits for several devices' acks (flag `REPLICATED`).
    replicated: bool,
}

/// Where a session's client is, and what its traffic has paid for.
#[derive(Debug, Clone, Copy)]
struct ClientRoute {
    address: SocketAddr,
    /// Bytes received from the client not yet spent on unsolicited messages to it.
    credit_bytes: u32,
}

/// Bytes of credit a client route keeps at most.
const MAX_CREDIT_BYTES: u32 = 64 * 1024;

/// Entries of one server waiting to be resent, and how many are out.
#[derive(Debug, Default)]
struct Replay {
    queue: BTreeSet<EntryKey>,
    in_flight: u32,
}

/// The PMNet device state machine.
#[derive(Debug)]
pub struct Device {
    config: DeviceConfig,
    servers: HashMap<u16, SocketAddr>,
    /// The "servers" that sent PMNet-ACKs: the next devices of chains. Updates forwarded to
    /// them carry `REPLICATED`, so that the next device passes the server-ACK back to this
    /// one instead of keeping it back for a client it takes this device for
    /// (docs/replication.md). At most one per configured server.
    next_devices: std::collections::BTreeSet<SocketAddr>,
    /// Live entries by slot.
    entries: HashMap<u32, Entry>,
    /// Live entries by key, in (server, session, seq, fragment) order for recovery resends.
    index: BTreeMap<EntryKey, u32>,
    resend_timers: BTreeSet<(Time, u32)>,
    next_generation: u64,
    clients: HashMap<u64, ClientRoute>,
    client_order: VecDeque<u64>,
    replay: HashMap<u16, Replay>,
    transmits: VecDeque<Transmit>,
    /// Log work in numbered batches, each with the writes it makes (slot, generation).
    batches: crate::NumberedBatches<LogWork, (u32, u64)>,
    /// Hold replies waiting for the batch they name to be durable (`hold.rs`), in order.
    hold_replies_waiting: crate::AfterDurable<(SocketAddr, Header, Vec<bool>)>,
    counters: DeviceCounters,
    /// How long entries logged by this device stayed in the log: from logging and forwarding
    /// the update to its server-ACK.
    residency: LatencyHistogram,
    /// How long each server takes to ack (the first resend timeout, `rtt.rs`).
    round_trips: rtt::RoundTrips,
    /// When each session's numbers were first seen, and its client's no-op fills (`seen.rs`).
    seen: seen::SeenSessions,
    /// Which servers are known to verify what this device sends and to send what it
    /// verifies: only their writes are acked (`trust.rs`).
    trust: trust::Trust,
    /// The devices before this one, and fill queries waiting for their answers.
    upstream: upstream::Upstream,
    /// The client's address carried by the update being handled (noted by the pipeline,
    /// which stripped it: [`NetworkFunction::note_client_address`]).
    carried_client: Option<SocketAddr>,
    /// The controllers' side of this device: statuses out, routes in.
    follower: Option<crate::route::Follower>,
}

/// An update request as forwarded to the next device of a chain: flagged `REPLICATED` (the
/// header re-encoded, its checksum with it); anything else unchanged.
fn mark_for_next_device(bytes: Vec<u8>) -> Vec<u8> {
    let replicated = pmnet_wire::replication::REPLICATED;
    let marked = pmnet_wire::Packet::new_checked(&bytes[..])
        .is_ok_and(|packet| packet.flags() & replicated != 0);
    if marked {
        return bytes;
    }
    match Header::parse(&bytes) {
        Ok((mut header, payload))
            if header.packet_type == PacketType::UpdateRequest && !header.has_flag(replicated) =>
        {
            header.flags |= replicated;
            pmnet_wire::to_sendable(&header.encode(payload))
        }
        _ => bytes,
    }
}

impl Device {
    /// The update requests the log holds, as logged (a keyed write with its order written
    /// in): what [`crate::KeyedOrdering`] is rebuilt from.
    pub fn logged_packets(&self) -> impl Iterator<Item = &[u8]> {
        self.entries.values().map(|entry| &*entry.packet)
    }

    /// A device whose log held `recovered` at start-up (empty for a new log). Entries are
    /// resent to their servers right away: the server-ACKs of their first delivery may have
    /// been lost with the device.
    pub fn new(config: DeviceConfig, now: Time, recovered: Vec<RecoveredEntry>) -> Device {
        assert!(config.slot_count >= 1, "a log needs at least one slot");
        assert!(config.probe_limit >= 1, "probe_limit must be at least 1");
        let servers = config.servers.iter().copied().collect();
        let trust = trust::Trust::new(&config.servers, now, config.logging);
        let mut device = Device {
            trust,
            servers,
            next_devices: std::collections::BTreeSet::new(),
            entries: HashMap::new(),
            index: BTreeMap::new(),
            resend_timers: BTreeSet::new(),
            next_generation: 1,
            clients: HashMap::new(),
            client_order: VecDeque::new(),
            replay: HashMap::new(),
            transmits: VecDeque::new(),
            batches: crate::NumberedBatches::starting_at(1),
            hold_replies_waiting: crate::AfterDurable::new(hold::HOLD_REPLIES_WAITING_MAX),
            counters: DeviceCounters::default(),
            residency: LatencyHistogram::new(),
            round_trips: rtt::RoundTrips::default(),
            seen: seen::SeenSessions::new(config.sessions_max),
            upstream: upstream::Upstream::new(&config.previous_devices),
            carried_client: None,
            follower: config
                .follow
                .clone()
                .map(|follow| crate::route::Follower::new(follow, now)),
            config,
        };
        for entry in recovered {
            device.rebuild(now, entry);
        }
        device
    }

    fn rebuild(&mut self, now: Time, recovered: RecoveredEntry) {
        let (fragment_count, replicated) = match Header::parse(&recovered.packet) {
            Ok((header, _)) if header.packet_type == PacketType::UpdateRequest => (
                header.fragment_count,
                header.has_flag(pmnet_wire::replication::REPLICATED),
            ),
            // The log checked its own CRC; a packet that still fails to parse is dropped
            // rather than replayed, and the slot freed.
            _ => {
                self.count_drop(DropReason::UnexpectedType);
                self.batches.push(LogWork::Invalidate {
                    slot: recovered.slot,
                });
                return;
            }
        };
        // The log checked every slot's own index against its position: an entry outside the
        // log, or two for one slot, is a bug of the log (or of the runtime's geometry), not
        // damage to count.
        assert!(
            recovered.slot < self.config.slot_count,
            "recovered slot {} of a log of {} slots",
            recovered.slot,
            self.config.slot_count
        );
        assert!(
            !self.entries.contains_key(&recovered.slot),
            "slot {} recovered twice",
            recovered.slot
        );
        let generation = self.take_generation();
        // Logged before this start: first seen by now at the latest.
        let key = recovered.key;
        self.seen.note(key.server_id, key.session_id, key.seq, now);
        if let Some(client) = recovered.return_address {
            self.remember_client(recovered.key.session_id, client, 0);
        }
        self.index.insert(recovered.key, recovered.slot);
        self.resend_timers.insert((now, recovered.slot));
        self.entries.insert(
            recovered.slot,
            Entry {
                key: recovered.key,
                state: EntryState::Durable,
                generation,
                packet: recovered.packet.into(),
                fragment_count,
                client: recovered.return_address,
                ack_to: None,
                invalidate_when_persisted: false,
                ack_sent: false,
                resend_deadline: now,
                resend_timeout: self.config.resend_timeout,
                in_replay: false,
                logged_at: None,
                resent: true,
                relayed: 0,
                replicated,
            },
        );
        self.counters.entries_recovered += 1;
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Whether server `server_id` is known to verify what this device sends and to send what
    /// it verifies: until it is, the device acks none of its writes.
    pub fn server_verified(&self, server_id: u16) -> bool {
        self.trust.is_verified(server_id)
    }

    /// Whether every server is verified.
    pub fn servers_verified(&self) -> bool {
        self.trust.all_verified()
    }

    /// Why server `server_id` is not verified yet, in words naming it (`None` once it is).
    pub fn server_unverified_reason(&self, server_id: u16, now: Time) -> Option<String> {
        self.trust.unverified_reason(server_id, now)
    }

    /// A datagram from `from` failed verification before the device saw it (the pipeline
    /// verifies): if `from` is a server, that is why it is not verified.
    pub fn on_unverified(&mut self, from: SocketAddr, reason: DropReason) {
        self.trust.failed(from, reason);
    }

    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    /// How long the entries this device logged (not those recovered at start-up) stayed in
    /// the log, from logging and forwarding the update to the server-ACK that freed them.
    pub fn entry_residency(&self) -> &LatencyHistogram {
        &self.residency
    }

    /// Live entries by server id.
    pub fn live_entries_by_server(&self) -> BTreeMap<u16, usize> {
        let mut counts = BTreeMap::new();
        for key in self.index.keys() {
            *counts.entry(key.server_id).or_insert(0) += 1;
        }
        counts
    }

    /// Live entries recovered from the log at start-up (not yet acked by their servers).
    pub fn recovered_entries_live(&self) -> usize {
        self.entries
            .values()
            .filter(|entry| entry.logged_at.is_none())
            .count()
    }

    /// Client sessions whose address the device knows.
    pub fn known_session_count(&self) -> usize {
        self.clients.len()
    }

    /// Entries waiting in the replay queues (to be resent at the servers' pace), and entries
    /// resent from them and not yet acked.
    pub fn replay_backlog(&self) -> (usize, u32) {
        self.replay.values().fold((0, 0), |(queued, out), replay| {
            (queued + replay.queue.len(), out + replay.in_flight)
        })
    }

    /// Entries in the log that their server has not yet acked.
    pub fn live_entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Live entries rebuilt from the log at start-up that their server has not yet acked (the
    /// replay's progress). Walks every live entry: for occasional progress reports.
    pub fn recovered_live_count(&self) -> usize {
        self.entries
            .values()
            .filter(|entry| !entry.ack_sent)
            .count()
    }

    /// The live entry keys, in order (for tests and the simulator's convergence check).
    pub fn live_keys(&self) -> impl Iterator<Item = &EntryKey> {
        self.index.keys()
    }

    fn take_generation(&mut self) -> u64 {
        let generation = self.next_generation;
        self.next_generation += 1;
        generation
    }

    fn count_drop(&mut self, reason: DropReason) {
        self.counters.dropped.record(reason);
    }

    /// Queue a datagram; false when the queue is full (dropped and counted).
    fn send(&mut self, destination: SocketAddr, mut bytes: Vec<u8>) -> bool {
        if self.transmits.len() >= self.config.transmit_queue_len_max {
            self.count_drop(DropReason::QueueFull);
            return false;
        }
        if self.next_devices.contains(&destination) {
            bytes = mark_for_next_device(bytes);
        }
        self.transmits.push_back(Transmit { destination, bytes });
        true
    }

    /// Remember where `session_id`'s client is; `earned` bytes it just sent add to its
    /// credit (a new address starts from nothing).
    fn remember_client(&mut self, session_id: u64, client: SocketAddr, earned: usize) {
        let earned = u32::try_from(earned).unwrap_or(u32::MAX);
        if let Some(known) = self.clients.get_mut(&session_id) {
            if known.address != client {
                *known = ClientRoute {
                    address: client,
                    credit_bytes: 0,
                };
            }
            known.credit_bytes = known
                .credit_bytes
                .saturating_add(earned)
                .min(MAX_CREDIT_BYTES);
            return;
        }
        while self.clients.len() >= self.config.sessions_max {
            let Some(oldest) = self.client_order.pop_front() else {
                break;
            };
            self.clients.remove(&oldest);
        }
        self.clients.insert(
            session_id,
            ClientRoute {
                address: client,
                credit_bytes: earned.min(MAX_CREDIT_BYTES),
            },
        );
        self.client_order.push_back(session_id);
    }

    /// Where `session_id`'s client is, if known.
    fn client_of(&self, session_id: u64) -> Option<SocketAddr> {
        self.clients.get(&session_id).map(|route| route.address)
    }

    /// Send an unsolicited datagram to `session_id`'s client if its traffic paid for it.
    fn send_paid(&mut self, session_id: u64, bytes: Vec<u8>) -> bool {
        let cost = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let Some(route) = self.clients.get_mut(&session_id) else {
            self.count_drop(DropReason::NoClientRoute);
            return false;
        };
        if route.credit_bytes < cost {
            self.count_drop(DropReason::Unpaid);
            return false;
        }
        route.credit_bytes -= cost;
        let address = route.address;
        self.send(address, bytes)
    }

    /// Process a datagram from the network. Never panics on its contents. (A device in a
    /// [`crate::Pipeline`] is offered datagrams already parsed, through [`NetworkFunction`].)
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let (header, payload) = match Header::parse(datagram) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.count_drop(DropReason::Parse(error));
                return;
            }
        };
        let client_address = pmnet_wire::replication::CLIENT_ADDRESS;
        if header.packet_type == PacketType::UpdateRequest && header.has_flag(client_address) {
            // As a pipeline offers it: without the address, noted beside it.
            match pmnet_wire::replication::without_client_address(&header, payload) {
                Ok((inner, client)) => {
                    self.carried_client = Some(client);
                    self.handle(now, from, &inner);
                    self.carried_client = None;
                }
                Err(_) => self.count_drop(DropReason::BadClientAddress),
            }
            return;
        }
        if self.handle_parsed(now, from, &header, datagram) == Verdict::Pass {
            self.count_drop(DropReason::Parse(pmnet_wire::ParseError::UnknownType));
        }
    }

    /// Handle a parsed datagram of a core-protocol type; pass on the types reserved for the
    /// other in-network functions.
    fn handle_parsed(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        datagram: &[u8],
    ) -> Verdict {
        let cache_type = matches!(
            header.packet_type,
            PacketType::Reserved(CACHE_READ | CACHE_REPLY)
        );
        if crate::route::is_route(header) {
            if let Some(follower) = self.follower.as_mut() {
                let payload = &datagram[pmnet_wire::HEADER_LEN..];
                if let Err(reason) = follower.on_route(from, header, payload) {
                    self.count_drop(reason);
                }
                return Verdict::Consumed;
            }
        }
        if let PacketType::Reserved(_) = header.packet_type {
            if !cache_type {
                return Verdict::Pass;
            }
        }
        let payload = &datagram[pmnet_wire::HEADER_LEN..];
        let Some(&server) = self.servers.get(&header.server_id) else {
            self.count_drop(DropReason::UnknownServer);
            return Verdict::Consumed;
        };
        if cache_type {
            self.on_cache_datagram(from, server, header, datagram);
            return Verdict::Consumed;
        }
        match header.packet_type {
            // What a primary sends its replica: never a client's request, never logged.
            PacketType::UpdateRequest | PacketType::BypassRequest
                if header.has_flag(pmnet_wire::replication::REPLICA) =>
            {
                self.count_drop(DropReason::UnexpectedSource);
            }
            PacketType::UpdateRequest => {
                self.on_update_request(now, from, server, header, datagram)
            }
            PacketType::BypassRequest => {
                self.remember_client(header.session_id, from, datagram.len());
                self.note_seen(now, header);
                self.counters.bypass_forwarded += 1;
                // A keyed bypass (a write whose reply the server gives, such as an INCR) comes
                // with its order among the key's writes written in (`crate::KeyedOrdering`).
                self.send(server, pmnet_wire::to_sendable(datagram));
            }
            // A replica's ack to its primary says nothing of what the server applied.
            PacketType::ServerAck if header.has_flag(pmnet_wire::replication::REPLICA) => {
                self.count_drop(DropReason::UnexpectedSource);
            }
            PacketType::ServerAck
            | PacketType::RetransmitRequest
            | PacketType::RecoveryPoll
            | PacketType::FillQuery
            | PacketType::HoldQuery
                if from != server =>
            {
                self.count_drop(DropReason::UnexpectedSource);
            }
            // The server's answer to this device's probe; a probe from the device before
            // this one in a chain (whose "server" this device is), answered in kind.
            PacketType::Probe if from == server && header.flags & flags::ANSWER != 0 => {
                if self.trust.answered(header.server_id, header.seq) {
                    self.ack_held(header.server_id);
                }
                self.counters.probes_answered = self.trust.probes_answered;
            }
            // An answer is never answered, and a server asks nothing (a forged source could
            // make two endpoints answer each other for ever).
            PacketType::Probe if from == server || header.flags & flags::ANSWER != 0 => {
                self.count_drop(DropReason::UnexpectedType);
            }
            PacketType::Probe => {
                self.counters.probes_served += 1;
                if self
                    .upstream
                    .probe_worth_warning(now, header.server_id, from)
                {
                    tracing::warn!(
                        "{from} probed this device for server {} but is not named by \
                         --previous-device: if it is a device forwarding to this one, name it \
                         ({}={from}), or a gap in what it holds could be skipped",
                        header.server_id,
                        header.server_id
                    );
                }
                let answer = Header {
                    device_id: self.config.device_id,
                    flags: flags::ANSWER,
                    ..*header
                };
                self.send(from, answer.encode(&[]));
            }
            PacketType::ServerAck => {
                if self.trust.proven(header.server_id) {
                    self.ack_held(header.server_id);
                }
                self.on_server_ack(now, header, datagram);
                self.pump_replay(now, header.server_id);
            }
            // The next device of a chain (this device's "server") acked or could not log an
            // update: passed on towards the client, which counts distinct devices' acks
            // (docs/replication.md).
            PacketType::PmnetAck | PacketType::NotLogged if from == server => {
                if header.packet_type == PacketType::PmnetAck && self.trust.proven(header.server_id)
                {
                    self.ack_held(header.server_id);
                }
                self.next_devices.insert(server);
                self.relay_chain_ack(header, datagram);
            }
            PacketType::RetransmitRequest => self.on_retransmit_request(header, datagram),
            PacketType::RecoveryPoll => self.on_recovery_poll(now, server, header),
            PacketType::FillQuery => self.on_fill_query(now, server, header, payload),
            PacketType::HoldQuery => self.on_hold_query(server, header, payload),
            // A device before this one answering a hold query passed on to it.
            PacketType::HoldReply if self.upstream.is_previous(header.server_id, from) => {
                self.on_previous_hold_reply(server, from, header, payload);
            }
            // A device before this one answering a fill query passed on to it.
            PacketType::FillReply if self.upstream.is_previous(header.server_id, from) => {
                self.on_previous_fill_reply(now, server, from, header, payload);
            }
            PacketType::PmnetAck
            | PacketType::RecoveryDone
            | PacketType::FillReply
            | PacketType::HoldReply
            | PacketType::NotLogged
            // Batches are unpacked by the pipeline; one reaching the function is misrouted.
            | PacketType::Batch
            | PacketType::Reserved(_) => {
                self.count_drop(DropReason::UnexpectedType);
            }
        }
        Verdict::Consumed
    }

    /// A cache read from a client goes to its server (with the keyed write to its key it must
    /// follow written in, by [`crate::KeyedOrdering`]); a cache reply from the server goes to
    /// the read's client.
    fn on_cache_datagram(
        &mut self,
        from: SocketAddr,
        server: SocketAddr,
        header: &Header,
        datagram: &[u8],
    ) {
        if header.packet_type == PacketType::Reserved(CACHE_REPLY) {
            if from != server {
                self.count_drop(DropReason::UnexpectedSource);
                return;
            }
            match self.client_of(header.session_id) {
                Some(client) => {
                    self.counters.cache_replies_forwarded += 1;
                    self.send(client, pmnet_wire::to_sendable(datagram));
                }
                None => self.count_drop(DropReason::NoClientRoute),
            }
            return;
        }
        let payload = &datagram[pmnet_wire::HEADER_LEN..];
        if header.fragment_count != 1 || pmnet_wire::cache::ReadDescriptor::parse(payload).is_err()
        {
            self.count_drop(DropReason::BadCacheRead);
            return;
        }
        self.remember_client(header.session_id, from, datagram.len());
        // With the keyed write it must follow written in (`crate::KeyedOrdering`).
        self.counters.cache_reads_forwarded += 1;
        self.send(server, pmnet_wire::to_sendable(datagram));
    }

    fn on_update_request(
        &mut self,
        now: Time,
        client: SocketAddr,
        server: SocketAddr,
        header: &Header,
        datagram: &[u8],
    ) {
        self.counters.updates_received += 1;
        if header.seq == 0 {
            self.count_drop(DropReason::ZeroSeq);
            return;
        }
        self.remember_client(header.session_id, client, datagram.len());
        self.note_seen(now, header);
        let (direct, carry) = self.client_address(header.server_id, client);
        let ack_to = direct.unwrap_or(client);
        // A keyed write comes with its order written in (`crate::KeyedOrdering`): it is
        // logged and forwarded as it is.
        let key = entry_key(header);
        if let Some(&slot) = self.index.get(&key) {
            // A retransmission: the client lost our ack. The entry's own resend timer takes
            // care of the server.
            self.counters.duplicate_updates += 1;
            let entry = self.entries.get_mut(&slot).expect("indexed");
            if entry.state == EntryState::Durable {
                self.send_pmnet_ack(slot, ack_to, direct.is_some());
            } else {
                entry.client = Some(client);
                entry.ack_to = direct;
            }
            if header.has_flag(pmnet_wire::replication::REPLICATED) {
                // The client may miss a later device's ack, not only ours: the next device
                // answers its own copy (and forwards nothing it already holds).
                self.forward_update(server, header, datagram, carry);
            }
            return;
        }
        let not_logged = if !self.config.logging {
            self.counters.forwarded_without_log += 1;
            None
        } else if !self.trust.logs_for(header.server_id, now) {
            // Logging it would promise what the server may never apply: forwarded, and the
            // client told why no ack comes.
            self.counters.unverified_forwards += 1;
            Some(NotLoggedReason::ServerUnverified)
        } else if datagram.len() > self.config.logged_packet_len_max {
            self.counters.forwarded_without_log += 1;
            Some(NotLoggedReason::TooLarge)
        } else if self.entries.len() >= self.config.live_entries_max as usize {
            self.counters.log_full += 1;
            Some(NotLoggedReason::LogFull)
        } else if let Some(slot) = self.free_slot(&key) {
            self.log(now, slot, header, client, direct, datagram);
            None
        } else {
            self.counters.log_collisions += 1;
            Some(NotLoggedReason::Collision)
        };
        // Logged or not, it goes to the server (a keyed write with its order written in).
        self.forward_update(server, header, datagram, carry);
        if let Some(reason) = not_logged {
            // The client waits for the server's reply now; tell it why, so that a failure
            // can say the log was full rather than that nothing answered.
            let mut notice = Header {
                packet_type: PacketType::NotLogged,
                device_id: self.config.device_id,
                ..*header
            };
            notice.flags = 0;
            self.counters.not_logged_notices_sent += 1;
            self.send_paid(header.session_id, notice.encode(&[reason as u8]));
        }
    }

    /// What the update being handled, from `source`, says of its client: the client's own
    /// address to ack (`None`: ack the source) and the address to carry to the next device of
    /// a chain (`None`: none — the next device acks this one, which relays).
    ///
    /// An address the device before this one carried is believed only from a device named by
    /// `--previous-device` for the server: anyone else could make this device send its acks
    /// wherever it liked. An update from such a device without an address (its first forwards,
    /// before it knew this device for a device, or its replay after a restart) is acked to it
    /// and goes on without one: its source is no client. From any other source the update
    /// comes from its client, whose address the next device may ack directly.
    fn client_address(
        &mut self,
        server_id: u16,
        source: SocketAddr,
    ) -> (Option<SocketAddr>, Option<SocketAddr>) {
        let previous = self.upstream.is_previous(server_id, source);
        match self.carried_client {
            Some(client) if previous => (Some(client), Some(client)),
            Some(_) => {
                self.counters.client_addresses_ignored += 1;
                (None, None)
            }
            None if previous => (None, None),
            None => (None, Some(source)),
        }
    }

    /// Send a received update on to `server`; to the next device of a chain with its client's
    /// address when this device knows it (`carry`), so that the next device acks the client
    /// directly (docs/protocol.md, "Devices in series").
    fn forward_update(
        &mut self,
        server: SocketAddr,
        header: &Header,
        datagram: &[u8],
        carry: Option<SocketAddr>,
    ) {
        if let Some(client) = carry.filter(|_| self.next_devices.contains(&server)) {
            let marked = Header {
                flags: header.flags | pmnet_wire::replication::REPLICATED,
                ..*header
            };
            let payload = &datagram[pmnet_wire::HEADER_LEN..];
            if let Some(bytes) =
                pmnet_wire::replication::with_client_address(&marked, payload, client)
            {
                self.counters.client_addresses_carried += 1;
                self.send(server, bytes);
                return;
            }
        }
        self.send(server, pmnet_wire::to_sendable(datagram));
    }

    /// The first free slot among `probe_limit` from the one the key hashes to.
    fn free_slot(&self, key: &EntryKey) -> Option<u32> {
        let home = slot_hash(key) % u64::from(self.config.slot_count);
        (0..u64::from(self.config.probe_limit))
            .map(|probe| ((home + probe) % u64::from(self.config.slot_count)) as u32)
            .find(|slot| !self.entries.contains_key(slot))
    }

    fn log(
        &mut self,
        now: Time,
        slot: u32,
        header: &Header,
        client: SocketAddr,
        ack_to: Option<SocketAddr>,
        datagram: &[u8],
    ) {
        let key = entry_key(header);
        let fragment_count = header.fragment_count;
        let generation = self.take_generation();
        let timeout = self.round_trips.timeout(
            key.server_id,
            self.config.resend_timeout,
            self.config.resend_timeout_max,
        );
        let deadline = now + timeout;
        let known = self.index.insert(key, slot);
        assert!(
            known.is_none(),
            "{key:?} logged twice (slots {known:?} and {slot})"
        );
        assert!(
            self.resend_timers.insert((deadline, slot)),
            "slot {slot} has a resend timer already"
        );
        let packet: std::sync::Arc<[u8]> = std::sync::Arc::from(datagram);
        let held = self.entries.insert(
            slot,
            Entry {
                key,
                state: EntryState::Persisting,
                generation,
                packet: packet.clone(),
                fragment_count,
                client: Some(client),
                ack_to,
                invalidate_when_persisted: false,
                ack_sent: false,
                resend_deadline: deadline,
                resend_timeout: timeout,
                in_replay: false,
                logged_at: Some(now),
                resent: false,
                relayed: 0,
                replicated: header.has_flag(pmnet_wire::replication::REPLICATED),
            },
        );
        assert!(held.is_none(), "slot {slot} logged while it holds an entry");
        self.counters.updates_logged += 1;
        self.assert_bounds();
        self.batches.push(LogWork::Write {
            slot,
            key,
            return_address: Some(client),
            packet,
        });
        self.batches.wait((slot, generation));
    }

    /// Report that every batch of log work up to and including `through` is durable. Only
    /// now may the entries those batches wrote be acked.
    pub fn on_persisted(&mut self, _now: Time, through: u64) {
        for (slot, generation) in self.batches.durable_through(through) {
            self.on_write_durable(slot, generation);
        }
        self.release_hold_replies(through);
    }

    fn on_write_durable(&mut self, slot: u32, generation: u64) {
        let Some(entry) = self.entries.get_mut(&slot) else {
            panic!("log write of slot {slot} completed with no entry in it");
        };
        assert_eq!(entry.generation, generation, "stale persist completion");
        assert_eq!(entry.state, EntryState::Persisting, "write completed twice");
        entry.state = EntryState::Durable;
        if entry.invalidate_when_persisted {
            self.free(slot);
            return;
        }
        let direct = entry.ack_to.is_some();
        if let Some(client) = entry.ack_to.or(entry.client) {
            self.send_pmnet_ack(slot, client, direct);
        }
    }

    /// Pass on towards the client an ack (or not-logged notice) of the next device of a
    /// chain. It answers the client's own request, like this device's ack: free while this
    /// device holds the fragment it answers, up to one per possible device of a chain
    /// (`REPLICAS_MAX − 1`), so a chain of R devices sends a client at most R answers per
    /// fragment it logged; anything else is paid for from the client's credit.
    fn relay_chain_ack(&mut self, header: &Header, datagram: &[u8]) {
        let key = entry_key(header);
        let client = self.index.get(&key).and_then(|slot| {
            let entry = self.entries.get_mut(slot)?;
            if entry.relayed >= crate::REPLICAS_MAX - 1 {
                return None;
            }
            entry.relayed += 1;
            entry.ack_to.or(entry.client)
        });
        self.counters.chain_acks_relayed += 1;
        match client {
            Some(client) => {
                self.send(client, pmnet_wire::to_sendable(datagram));
            }
            None => {
                self.send_paid(header.session_id, pmnet_wire::to_sendable(datagram));
            }
        }
    }

    /// Send the PMNet-ACK of the entry in `slot` to `client` (`direct`: the client's own
    /// address, carried by the device before this one, not the source's).
    fn send_pmnet_ack(&mut self, slot: u32, client: SocketAddr, direct: bool) {
        let entry = &self.entries[&slot];
        if !self.trust.acks_for(entry.key.server_id) {
            // The server showed it cannot verify this device (or be verified): the client
            // waits for the server's reply (the entry is replayed meanwhile).
            return;
        }
        // The promise of a PMNet-ACK: the entry is durable in the log.
        assert_eq!(
            entry.state,
            EntryState::Durable,
            "PMNet-ACK before the log write is durable"
        );
        let header = Header {
            packet_type: PacketType::PmnetAck,
            flags: 0,
            server_id: entry.key.server_id,
            session_id: entry.key.session_id,
            seq: entry.key.seq,
            fragment_index: entry.key.fragment_index,
            fragment_count: entry.fragment_count,
            device_id: self.config.device_id,
        };
        self.counters.pmnet_acks_sent += 1;
        if direct {
            self.counters.acks_sent_direct += 1;
        }
        if self.send(client, header.encode(&[])) {
            self.entries
                .get_mut(&slot)
                .expect("acked entry is live")
                .ack_sent = true;
        }
    }

    /// Server `server_id` was just verified: ack the durable entries this device logged for it
    /// while it waited (their clients may still wait; an ack of a request a client is done
    /// with is consumed quietly).
    fn ack_held(&mut self, server_id: u16) {
        // In key order (the index is ordered): a seed replays the same acks.
        let held: Vec<(u32, SocketAddr, bool)> = self
            .index
            .iter()
            .filter(|(key, _)| key.server_id == server_id)
            .filter_map(|(_, slot)| {
                let entry = &self.entries[slot];
                let waiting = entry.state == EntryState::Durable
                    && !entry.ack_sent
                    && entry.logged_at.is_some();
                let client = entry.ack_to.or(entry.client).filter(|_| waiting)?;
                Some((*slot, client, entry.ack_to.is_some()))
            })
            .collect();
        for (slot, client, direct) in held {
            self.send_pmnet_ack(slot, client, direct);
        }
    }

    /// Server `server_id` is still unverified after the start-up grace: the clients of the
    /// entries logged for it meanwhile are told why their acks do not come (a not-logged
    /// notice, paid from their traffic); the entries stay in the log and are resent.
    fn tell_held_unverified(&mut self, server_id: u16) {
        let held: Vec<EntryKey> = self
            .index
            .iter()
            .filter(|(key, slot)| {
                let entry = &self.entries[slot];
                key.server_id == server_id && !entry.ack_sent && entry.logged_at.is_some()
            })
            .map(|(key, _)| *key)
            .collect();
        for key in held {
            let slot = self.index[&key];
            let notice = Header {
                packet_type: PacketType::NotLogged,
                flags: 0,
                server_id: key.server_id,
                session_id: key.session_id,
                seq: key.seq,
                fragment_index: key.fragment_index,
                fragment_count: self.entries[&slot].fragment_count,
                device_id: self.config.device_id,
            };
            self.counters.not_logged_notices_sent += 1;
            self.send_paid(
                key.session_id,
                notice.encode(&[NotLoggedReason::ServerUnverified as u8]),
            );
        }
    }

    /// Drop a durable entry: index, timer, and (persistently) its slot.
    fn free(&mut self, slot: u32) {
        let entry = self.entries.remove(&slot).expect("freeing a live slot");
        debug_assert_eq!(entry.state, EntryState::Durable);
        if self.index.get(&entry.key) == Some(&slot) {
            self.index.remove(&entry.key);
            if let Some(replay) = self.replay.get_mut(&entry.key.server_id) {
                replay.queue.remove(&entry.key);
            }
        }
        if entry.in_replay {
            self.replay
                .get_mut(&entry.key.server_id)
                .expect("an entry in replay has a replay state")
                .in_flight -= 1;
        }
        self.resend_timers.remove(&(entry.resend_deadline, slot));
        self.counters.entries_invalidated += 1;
        self.batches.push(LogWork::Invalidate { slot });
        self.assert_bounds();
    }

    /// What every log and free keeps true: live entries within their bound, and no more keys
    /// in the index or resend timers than live entries (each names one).
    fn assert_bounds(&self) {
        assert!(
            self.entries.len() <= self.config.live_entries_max as usize
                && self.index.len() <= self.entries.len()
                && self.resend_timers.len() <= self.entries.len(),
            "live entries {} (bound {}) with an index of {} keys and {} resend timers",
            self.entries.len(),
            self.config.live_entries_max,
            self.index.len(),
            self.resend_timers.len()
        );
    }

    fn slots_of(&self, server_id: u16, session_id: u64, seq: u32) -> Vec<u32> {
        let first = EntryKey {
            server_id,
            session_id,
            seq,
            fragment_index: 0,
        };
        let last = EntryKey {
            fragment_index: u16::MAX,
            ..first
        };
        self.index
            .range(first..=last)
            .map(|(_, slot)| *slot)
            .collect()
    }

    fn on_server_ack(&mut self, now: Time, header: &Header, datagram: &[u8]) {
        let slots = self.slots_of(header.server_id, header.session_id, header.seq);
        // The client completed this update on our PMNet-ACKs, one per fragment: the server's
        // reply (a fixed OK) would only wake it to be thrown away. Had an ack been lost, the
        // client retransmits and is acked again (or answered by the server's make-up ACK).
        let client_has_every_ack = slots.first().is_some_and(|slot| {
            // A client waiting for several devices' acks needs the server's ack passed on, and
            // so does a device before this one in a chain, which this device cannot tell from
            // a client: such a device marks what it forwards `REPLICATED` once it heard our
            // acks (see `next_devices`; docs/replication.md).
            !self.entries[slot].replicated
                && usize::from(self.entries[slot].fragment_count) == slots.len()
                && slots.iter().all(|slot| {
                    let entry = &self.entries[slot];
                    entry.state == EntryState::Durable && entry.ack_sent
                })
        });
        for slot in slots {
            let entry = self.entries.get_mut(&slot).expect("indexed slot");
            if let Some(logged_at) = entry.logged_at {
                let residency = now.saturating_duration_since(logged_at);
                self.residency.record(residency);
                if !entry.resent {
                    self.round_trips.sample(header.server_id, residency);
                }
            }
            match entry.state {
                EntryState::Durable => self.free(slot),
                EntryState::Persisting => {
                    // Keep the slot until the write completes, but forget the key: the request
                    // is applied, and no ack is owed any more.
                    entry.invalidate_when_persisted = true;
                    if std::mem::take(&mut entry.in_replay) {
                        self.replay
                            .get_mut(&header.server_id)
                            .expect("an entry in replay has a replay state")
                            .in_flight -= 1;
                    }
                    let key = entry.key;
                    let deadline = entry.resend_deadline;
                    self.index.remove(&key);
                    self.resend_timers.remove(&(deadline, slot));
                }
            }
        }
        if client_has_every_ack {
            self.counters.server_acks_absorbed += 1;
            return;
        }
        match self.client_of(header.session_id) {
            Some(client) => {
                self.counters.server_acks_forwarded += 1;
                self.send(client, pmnet_wire::to_sendable(datagram));
            }
            // Replays after a device restart: the client got its PMNet-ACK long ago.
            None => self.count_drop(DropReason::NoClientRoute),
        }
    }

    /// The next datagram to send, if any. Poll until `None` after every call that changes state.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The log work asked for since the last batch, if any, as the next numbered batch.
    /// Carry it out in order (e.g. with [`pmnet_pm::PmLog::persist_batch`]) and report it
    /// with [`Device::on_persisted`].
    #[must_use]
    pub fn poll_persist(&mut self) -> Option<PersistBatch<LogWork>> {
        self.batches.poll()
    }

    /// When [`Device::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let resend = self.resend_timers.first().map(|(deadline, _)| *deadline);
        let follow = self
            .follower
            .as_ref()
            .and_then(|follower| follower.poll_timeout());
        [resend, self.trust.poll_timeout(), follow]
            .into_iter()
            .flatten()
            .min()
    }

    /// The controllers' route, once taken: the device's owner restarts it in place with the
    /// next hop and previous device it names ([`crate::route::device_place`]).
    pub fn take_route(&mut self) -> Option<pmnet_wire::route::Route> {
        self.follower.as_mut()?.take_route()
    }

    /// What following the controllers counted (`None`: no controller).
    pub fn follower(&self) -> Option<&crate::route::Follower> {
        self.follower.as_ref()
    }

    /// Statuses due to the controllers.
    fn send_statuses(&mut self, now: Time) {
        let Some(follower) = self.follower.as_mut() else {
            return;
        };
        follower.handle_timeout(now);
        let mut statuses = Vec::new();
        while let Some(transmit) = follower.poll_transmit() {
            statuses.push(transmit);
        }
        for transmit in statuses {
            self.send(transmit.destination, transmit.bytes);
        }
    }

    /// Probes due: each unverified server is asked again whether it verifies what this
    /// device sends (`trust.rs`).
    fn send_probes(&mut self, now: Time) {
        for (server_id, address, seq) in self.trust.handle_timeout(now) {
            let probe = Header {
                device_id: self.config.device_id,
                ..Header::new(PacketType::Probe, server_id, 0, seq)
            };
            self.send(address, probe.encode(&[]));
        }
        self.counters.probes_sent = self.trust.probes_sent;
        for server_id in self.trust.take_grace_over(now) {
            self.tell_held_unverified(server_id);
        }
    }
}

/// The log entry an update fragment is kept in.
fn entry_key(header: &Header) -> EntryKey {
    EntryKey {
        server_id: header.server_id,
        session_id: header.session_id,
        seq: header.seq,
        fragment_index: header.fragment_index,
    }
}

/// Where an entry lives in the log: a hash of its identity (FNV-1a, then a final mix so
/// neighbouring sequence numbers land far apart).
fn slot_hash(key: &EntryKey) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = key
        .session_id
        .to_le_bytes()
        .into_iter()
        .chain(key.seq.to_le_bytes())
        .chain(key.fragment_index.to_le_bytes())
        .chain(key.server_id.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

impl NetworkFunction for Device {
    type Work = LogWork;

    fn dropped(&self) -> DropCounts {
        self.counters.dropped.clone()
    }

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        self.handle_parsed(now, from, header, datagram)
    }
    fn on_persisted(&mut self, now: Time, through: u64) {
        Device::on_persisted(self, now, through)
    }
    fn handle_timeout(&mut self, now: Time) {
        Device::handle_timeout(self, now)
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        Device::poll_transmit(self)
    }
    fn poll_persist(&mut self) -> Option<PersistBatch<LogWork>> {
        Device::poll_persist(self)
    }
    fn poll_timeout(&self) -> Option<Time> {
        Device::poll_timeout(self)
    }
    fn on_unverified(&mut self, _now: Time, from: SocketAddr, reason: DropReason) {
        Device::on_unverified(self, from, reason)
    }
    fn note_client_address(&mut self, client: Option<SocketAddr>) {
        self.carried_client = client;
    }
}

//! A deterministic world: clients, devices and servers wired through an in-memory network with
//! a virtual clock, after quinn's `Pair`. No sockets, no threads, no sleeping.
//!
//! Devices persist into a real [`PmLog`] on a [`SimRegion`], so a device can crash and reopen
//! its log from what the crash model says survived. Servers apply requests through a
//! [`ServerApp`] that records what was applied (the durable record a test checks) and, when
//! asked, applies them to a real [`KvStore`] on a [`SimRegion`] as well.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_pm::{EntryKey, LogWork, PmLog, SimRegion};
use pmnet_proto::{
    Client, ClientConfig, ClientEvent, Completion, Device, DeviceConfig, DevicePipeline,
    FrontFunction, Nothing, PersistBatch, RecoveredSession, RequestKind, Server, ServerConfig,
    ServerEvent, StackWork, Time, Transmit,
};
use pmnet_store::{Application, KvConfig, KvStore};
use pmnet_wire::{Header, PacketType};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Id of the first server; server `i` has id `SERVER_ID + i`.
pub const SERVER_ID: u16 = 1;
/// Id of the first device; device `j` has id `DEVICE_ID + j`.
pub const DEVICE_ID: u16 = 7;
/// Slot size of every simulated device log.
pub const SLOT_SIZE: u32 = 2048;

fn host(network: u8, index: usize, port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, network, index as u8 + 1], port))
}

/// Address of server `index`.
pub fn server_addr(index: usize) -> SocketAddr {
    host(1, index, 51000)
}

/// Address of device `index`.
pub fn device_addr(index: usize) -> SocketAddr {
    host(2, index, 51000)
}

/// Address of client `index`.
pub fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 100, 1], 40000 + index as u16))
}

/// The name of the node at `addr` in traces: `client0`, `device1`, `server0`, or the address.
pub fn node_name(addr: SocketAddr) -> String {
    if let SocketAddr::V4(v4) = addr {
        let [a, b, c, d] = v4.ip().octets();
        match (a, b, c, d, v4.port()) {
            (10, 0, 1, host, 51000) if host > 0 => return format!("server{}", host - 1),
            (10, 0, 2, host, 51000) if host > 0 => return format!("device{}", host - 1),
            (10, 0, 100, 1, port) if port >= 40000 => return format!("client{}", port - 40000),
            _ => {}
        }
    }
    addr.to_string()
}

/// A header as traces show it: type, session, sequence number, fragment, flags.
pub fn describe_header(header: &Header) -> String {
    let mut text = format!(
        "{} s={:x} seq={}",
        header.packet_type, header.session_id, header.seq
    );
    if header.fragment_count > 1 {
        text.push_str(&format!(
            " frag={}/{}",
            header.fragment_index, header.fragment_count
        ));
    }
    if header.device_id != 0 {
        text.push_str(&format!(" dev={}", header.device_id));
    }
    for (bit, name) in [
        (pmnet_wire::flags::MAKEUP, "makeup"),
        (pmnet_wire::flags::REPLY_UNAVAILABLE, "reply-unavailable"),
        (pmnet_wire::flags::ALL_FRAGMENTS, "all-fragments"),
        (pmnet_wire::flags::NOOP_FILL, "noop-fill"),
    ] {
        if header.flags & bit != 0 {
            text.push_str(&format!(" +{name}"));
        }
    }
    text
}

fn describe_key(key: &EntryKey) -> String {
    format!(
        "server{} s={:x} seq={} frag={}",
        key.server_id.wrapping_sub(SERVER_ID),
        key.session_id,
        key.seq,
        key.fragment_index
    )
}

fn describe_client_event(event: &ClientEvent) -> String {
    match event {
        ClientEvent::Completed {
            seq,
            kind,
            completion,
        } => {
            let how = match completion {
                Completion::Logged { device_id } => {
                    format!(
                        "logged by device{} (pmnet_ack)",
                        device_id.wrapping_sub(DEVICE_ID)
                    )
                }
                Completion::Replied {
                    reply,
                    makeup: false,
                } => format!("server reply, {} bytes", reply.len()),
                Completion::Replied {
                    reply,
                    makeup: true,
                } => format!("make-up server reply, {} bytes", reply.len()),
                Completion::ReplyUnavailable => "make-up ack, reply no longer kept".to_string(),
            };
            format!("completed {kind:?} seq={seq}: {how}")
        }
        ClientEvent::Failed { seq, kind, error } => {
            format!("FAILED {kind:?} seq={seq}: {error}")
        }
    }
}

/// One datagram put on the network, for assertions and traces.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Time,
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub header: Header,
    pub dropped: bool,
}

/// The server's application: records every request applied, in order, and checks the
/// protocol's promise to it (each session's requests exactly once, in sequence order).
///
/// Without a store, an update's reply is `b"ok"` and a bypass's reply is the number of updates
/// of its session applied before it (u32, big-endian), so tests can check read-your-writes.
/// With a store ([`World::with_kv_store`]), the store's replies are returned.
#[derive(Debug, Default)]
pub struct ServerApp {
    pub applied: Vec<(u64, u32, RequestKind, Vec<u8>)>,
    pub sessions: HashMap<u64, (u32, Vec<u8>)>,
    pub updates_per_session: HashMap<u64, u32>,
    pub kv: Option<KvStore<SimRegion>>,
    /// The request the store last had no room for, handed back to the server.
    pub last_refused: Option<Vec<u8>>,
}

impl ServerApp {
    /// The reply, or `None` when the store has no room (the request is in `last_refused`).
    fn apply(
        &mut self,
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: Vec<u8>,
    ) -> Option<Vec<u8>> {
        // Numbers a server skipped (a gap no client or device could fill) leave holes; the
        // run's end checks that each hole is a request its client reported failed.
        let last = self.sessions.get(&session_id).map_or(0, |(seq, _)| *seq);
        assert!(
            seq > last,
            "invariant: session {session_id:x} applied seq {seq} after {last} (out of order or twice)"
        );
        let reply = match (self.kv.as_mut(), kind) {
            (Some(kv), _) => match kv.apply(session_id, seq, &request) {
                Ok(reply) => reply,
                Err(pmnet_store::NoSpace) => {
                    self.last_refused = Some(request);
                    return None;
                }
            },
            (None, RequestKind::Update) => b"ok".to_vec(),
            (None, RequestKind::Bypass) => {
                let count = self
                    .updates_per_session
                    .get(&session_id)
                    .copied()
                    .unwrap_or(0);
                count.to_be_bytes().to_vec()
            }
        };
        if kind == RequestKind::Update {
            *self.updates_per_session.entry(session_id).or_insert(0) += 1;
        }
        self.applied.push((session_id, seq, kind, request));
        self.sessions.insert(session_id, (seq, reply.clone()));
        Some(reply)
    }

    /// Crash the store (losing what was not persisted) and reopen it.
    fn crash_store(&mut self) {
        if let Some(kv) = self.kv.take() {
            let region = kv.into_region().crash_losing_unpersisted();
            self.kv = Some(KvStore::open(region).expect("reopen the store after a crash"));
        }
    }

    fn recovered_sessions(&self) -> Vec<RecoveredSession> {
        if let Some(kv) = &self.kv {
            return kv
                .sessions()
                .into_iter()
                .map(|record| RecoveredSession {
                    session_id: record.session_id,
                    last_seq: record.last_seq,
                    last_reply: record.last_reply,
                })
                .collect();
        }
        self.sessions
            .iter()
            .map(|(session_id, (last_seq, last_reply))| RecoveredSession {
                session_id: *session_id,
                last_seq: *last_seq,
                last_reply: last_reply.clone(),
            })
            .collect()
    }

    /// How often `(session, seq)` was applied.
    pub fn times_applied(&self, session_id: u64, seq: u32) -> usize {
        self.applied
            .iter()
            .filter(|(s, q, _, _)| *s == session_id && *q == seq)
            .count()
    }
}

#[derive(Debug)]
pub struct DeviceNode {
    /// The device's functions: a front function ([`Nothing`] unless a test puts one there),
    /// then the log.
    pub pipeline: DevicePipeline,
    pub log: PmLog<SimRegion>,
    /// When set, persistence batches wait in `held` until released; a crash loses them.
    pub hold_persistence: bool,
    pub held: VecDeque<PersistBatch<LogWork>>,
    /// Builds the front function, at start and after each restart (its state is volatile).
    pub new_front: fn() -> Box<dyn FrontFunction>,
    pub config: DeviceConfig,
    pub up: bool,
    /// Every key this device's log has held durably: a PMNet-ACK must name one of them.
    pub ever_durable: HashSet<EntryKey>,
    /// Restarts, and slots the log rejected at reopen (torn or corrupted entries).
    pub restart_count: u64,
    pub rejected_slot_count: u64,
}

impl DeviceNode {
    /// The device's log function.
    pub fn device(&self) -> &Device {
        self.pipeline.device()
    }
}

fn no_front() -> Box<dyn FrontFunction> {
    Box::new(Nothing)
}

#[derive(Debug)]
pub struct ServerNode {
    pub server: Server,
    pub app: ServerApp,
    pub config: ServerConfig,
    pub up: bool,
    pub restart_count: u64,
    /// A store-full fault: while set, the application has no room for any update and hands
    /// each back ([`Server::on_deferred`]); nothing of it becomes durable.
    pub store_full: bool,
    /// Updates handed back while `store_full` was set.
    pub deferred_count: u64,
    /// Sequence numbers skipped by earlier incarnations of this server.
    pub skipped_before_restart: u64,
}

#[derive(Debug)]
pub struct ClientNode {
    pub client: Client,
    pub completed: Vec<ClientEvent>,
    /// The client went away for good (its process ended): it receives nothing and sends
    /// nothing more. `abandoned` are the requests it had in flight then, neither completed
    /// nor reported failed.
    pub gone: bool,
    pub abandoned: Vec<u32>,
}

/// Random network faults, from one seed: loss, duplication, delay spread (which reorders),
/// and corruption of bytes in flight.
#[derive(Debug)]
pub struct Faults {
    pub rng: ChaCha8Rng,
    pub loss: f64,
    pub duplicate: f64,
    pub jitter: Duration,
    pub corrupt: f64,
}

/// What the network did, for the swarm's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkCounters {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub partitioned: u64,
}

type DropRule = Box<dyn FnMut(&Seen) -> bool>;

/// A datagram in flight: delivery time, tie-breaking sequence, source, destination, bytes.
type InFlight = Reverse<(Time, u64, SocketAddr, SocketAddr, Vec<u8>)>;

/// The shape of a world.
#[derive(Debug, Clone)]
pub struct Topology {
    pub client_count: usize,
    /// Slot count of each device; empty for clients talking to servers directly.
    pub device_slot_counts: Vec<u32>,
    pub server_count: usize,
}

#[allow(missing_debug_implementations)] // holds boxed drop rules
pub struct World {
    pub now: Time,
    pub latency: Duration,
    pub faults: Option<Faults>,
    /// Links that deliver nothing: `(from, to)`; a symmetric partition blocks both directions.
    pub blocked: HashSet<(SocketAddr, SocketAddr)>,
    pub network: NetworkCounters,
    queue: BinaryHeap<InFlight>,
    sequence: u64,
    /// Every datagram sent, when `record_seen` is on (tests); off in long swarms.
    pub seen: Vec<Seen>,
    pub record_seen: bool,
    /// A readable event log, when on: one line an event, `<virtual time>  <node>  <event>`.
    pub trace: Option<Vec<String>>,
    /// Keep datagram lines (`send`, `recv`) in `trace`; they are hashed either way.
    pub trace_datagrams: bool,
    /// PMNet-ACKs checked against the persistence model (invariant 4).
    pub acks_checked: u64,
    trace_hash: u32,
    drop_rules: Vec<DropRule>,
    pub clients: Vec<ClientNode>,
    pub devices: Vec<DeviceNode>,
    pub servers: Vec<ServerNode>,
}

impl World {
    /// `client_count` clients, one device with `slot_count` slots in front of one server (or
    /// no device), a network delay of 5 µs per hop.
    pub fn new(client_count: usize, slot_count: Option<u32>) -> World {
        World::with_topology(Topology {
            client_count,
            device_slot_counts: slot_count.into_iter().collect(),
            server_count: 1,
        })
    }

    pub fn with_topology(topology: Topology) -> World {
        assert!(topology.server_count >= 1);
        let servers: Vec<(u16, SocketAddr)> = (0..topology.server_count)
            .map(|index| (SERVER_ID + index as u16, server_addr(index)))
            .collect();
        let devices: Vec<DeviceNode> = topology
            .device_slot_counts
            .iter()
            .enumerate()
            .map(|(index, &slot_count)| {
                let region_len = PmLog::<SimRegion>::required_region_len(slot_count, SLOT_SIZE);
                let log = PmLog::format(SimRegion::new(region_len), slot_count, SLOT_SIZE)
                    .expect("format a device log");
                let config = DeviceConfig::new(
                    DEVICE_ID + index as u16,
                    servers.clone(),
                    slot_count,
                    log.max_packet_len(),
                );
                DeviceNode {
                    pipeline: DevicePipeline::with_front(
                        no_front(),
                        Device::new(config.clone(), Time::ZERO, Vec::new()),
                    ),
                    new_front: no_front,
                    log,
                    hold_persistence: false,
                    held: VecDeque::new(),
                    config,
                    up: true,
                    ever_durable: HashSet::new(),
                    restart_count: 0,
                    rejected_slot_count: 0,
                }
            })
            .collect();
        let device_addrs: Vec<SocketAddr> = (0..devices.len()).map(device_addr).collect();
        let servers: Vec<ServerNode> = servers
            .iter()
            .map(|&(server_id, _)| {
                let config = ServerConfig::new(server_id, device_addrs.clone());
                ServerNode {
                    server: Server::new(config.clone(), Time::ZERO, Vec::new()),
                    app: ServerApp::default(),
                    config,
                    up: true,
                    restart_count: 0,
                    store_full: false,
                    deferred_count: 0,
                    skipped_before_restart: 0,
                }
            })
            .collect();
        let clients = (0..topology.client_count)
            .map(|index| {
                let peer = if device_addrs.is_empty() {
                    server_addr(index % servers.len())
                } else {
                    device_addrs[index % device_addrs.len()]
                };
                let server_id = SERVER_ID + (index % servers.len()) as u16;
                let session_id = 0x5E55_0000_0000_0000 | (index as u64 + 1);
                ClientNode {
                    client: Client::new(ClientConfig::new(session_id, server_id, peer)),
                    completed: Vec::new(),
                    gone: false,
                    abandoned: Vec::new(),
                }
            })
            .collect();
        let mut world = World {
            now: Time::ZERO,
            latency: Duration::from_micros(5),
            faults: None,
            blocked: HashSet::new(),
            network: NetworkCounters::default(),
            queue: BinaryHeap::new(),
            sequence: 0,
            seen: Vec::new(),
            record_seen: true,
            trace: None,
            trace_datagrams: true,
            acks_checked: 0,
            trace_hash: 0,
            drop_rules: Vec::new(),
            clients,
            devices,
            servers,
        };
        world.flush_outputs();
        world
    }

    /// Change client `index`'s settings; only before it sent anything.
    pub fn reconfigure_client(&mut self, index: usize, change: impl FnOnce(&mut ClientConfig)) {
        let node = &mut self.clients[index];
        assert_eq!(
            node.client.counters().requests_started,
            0,
            "reconfigure a client before it starts"
        );
        let mut config = node.client.config().clone();
        change(&mut config);
        node.client = Client::new(config);
    }

    /// Client `index` goes away for good, with whatever it had in flight.
    pub fn client_leaves(&mut self, index: usize) {
        let node = &mut self.clients[index];
        node.gone = true;
        node.abandoned = node.client.in_flight_seqs().collect();
        let text = format!(
            "leaves for good with requests {:?} in flight",
            node.abandoned
        );
        self.note_by(&format!("client{index}"), &text);
    }

    /// Put a real key-value store (on a simulated region of `len` bytes) behind every server.
    pub fn with_kv_store(mut self, len: usize) -> World {
        for node in &mut self.servers {
            let store =
                KvStore::format(SimRegion::new(len), KvConfig::default()).expect("format a store");
            node.app.kv = Some(store);
        }
        self
    }

    /// Put the function `new_front` builds in front of every device's log (a fresh one after
    /// each restart).
    pub fn with_front(mut self, new_front: fn() -> Box<dyn FrontFunction>) -> World {
        for node in &mut self.devices {
            node.new_front = new_front;
            let device = std::mem::replace(
                node.pipeline.device_mut(),
                Device::new(node.config.clone(), Time::ZERO, Vec::new()),
            );
            node.pipeline = DevicePipeline::with_front(new_front(), device);
        }
        self
    }

    pub fn device(&self, index: usize) -> &DeviceNode {
        &self.devices[index]
    }

    pub fn device_mut(&mut self, index: usize) -> &mut DeviceNode {
        &mut self.devices[index]
    }

    pub fn session(&self, client: usize) -> u64 {
        self.clients[client].client.session_id()
    }

    /// The server index client `client` talks to.
    pub fn server_of(&self, client: usize) -> usize {
        usize::from(self.clients[client].client.config().server_id - SERVER_ID)
    }

    /// A hash of every event so far: the same seed must give the same hash.
    pub fn trace_hash(&self) -> u32 {
        self.trace_hash
    }

    /// Hash an event by `actor` (a node name, `network`, `sim`, `check`) and keep it in the
    /// trace when the trace is on.
    fn note(&mut self, actor: &str, event: impl FnOnce() -> String) {
        let text = format!("{:>16}  {actor:<8} {}", self.now.to_string(), event());
        self.trace_hash = crc32c::crc32c_append(self.trace_hash, text.as_bytes());
        if let Some(trace) = self.trace.as_mut() {
            trace.push(text);
        }
    }

    /// A datagram event: hashed always, kept in the trace unless `trace_datagrams` is off.
    fn note_datagram(&mut self, actor: &str, event: impl FnOnce() -> String) {
        let keep = self.trace_datagrams;
        let trace = if keep { None } else { self.trace.take() };
        self.note(actor, event);
        if !keep {
            self.trace = trace;
        }
    }

    /// Note an event of the caller's (faults, crashes, checks) in the trace, by `sim`.
    pub fn note_event(&mut self, text: &str) {
        self.note("sim", || text.to_string());
    }

    /// Note an event of the caller's by `actor` (`device0`, `network`, `check`, ...).
    pub fn note_by(&mut self, actor: &str, text: &str) {
        self.note(actor, || text.to_string());
    }

    /// Drop every datagram for which `rule` returns true (rules stay until cleared).
    pub fn drop_when(&mut self, rule: impl FnMut(&Seen) -> bool + 'static) {
        self.drop_rules.push(Box::new(rule));
    }

    /// Drop the first datagram for which `matches` returns true, and only that one.
    pub fn drop_first(&mut self, mut matches: impl FnMut(&Seen) -> bool + 'static) {
        let mut dropped = false;
        self.drop_when(move |seen| {
            let lose = !dropped && matches(seen);
            dropped |= lose;
            lose
        });
    }

    pub fn clear_drop_rules(&mut self) {
        self.drop_rules.clear();
    }

    pub fn update(&mut self, client: usize, payload: &[u8]) -> u32 {
        let now = self.now;
        let seq = self.clients[client]
            .client
            .update(now, payload)
            .expect("update accepted");
        self.note(&format!("client{client}"), || {
            format!("issue Update seq={seq} ({} bytes)", payload.len())
        });
        self.flush_outputs();
        seq
    }

    pub fn bypass(&mut self, client: usize, payload: &[u8]) -> u32 {
        let now = self.now;
        let seq = self.clients[client]
            .client
            .bypass(now, payload)
            .expect("bypass accepted");
        self.note(&format!("client{client}"), || {
            format!("issue Bypass seq={seq} ({} bytes)", payload.len())
        });
        self.flush_outputs();
        seq
    }

    fn enqueue(&mut self, from: SocketAddr, transmit: Transmit) {
        let header = match Header::parse(&transmit.bytes) {
            Ok((header, _)) => header,
            Err(error) => panic!("invariant: {from} sent an invalid datagram: {error}"),
        };
        self.network.sent += 1;
        let mut seen = Seen {
            at: self.now,
            from,
            to: transmit.destination,
            header,
            dropped: false,
        };
        // What happened to the datagram, for the trace.
        let mut fate = String::new();
        seen.dropped = self.drop_rules.iter_mut().any(|rule| rule(&seen));
        if seen.dropped {
            fate.push_str(" [dropped by a test rule]");
        }
        if self.blocked.contains(&(from, transmit.destination)) {
            seen.dropped = true;
            self.network.partitioned += 1;
            fate.push_str(" [cut by a partition]");
        }
        let mut bytes = transmit.bytes;
        let mut copies = 1;
        let mut delays = [self.latency; 2];
        if let Some(faults) = self.faults.as_mut() {
            if !seen.dropped && faults.rng.random_bool(faults.loss) {
                seen.dropped = true;
                self.network.lost += 1;
                fate.push_str(" [lost]");
            }
            if faults.rng.random_bool(faults.duplicate) {
                copies = 2;
                self.network.duplicated += 1;
                if !seen.dropped {
                    fate.push_str(" [duplicated]");
                }
            }
            let jitter_ns = u64::try_from(faults.jitter.as_nanos()).unwrap_or(u64::MAX);
            for delay in &mut delays {
                *delay += Duration::from_nanos(faults.rng.random_range(0..=jitter_ns));
            }
            if faults.rng.random_bool(faults.corrupt) {
                let bit = faults.rng.random_range(0..bytes.len() * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
                self.network.corrupted += 1;
                if !seen.dropped {
                    fate.push_str(&format!(
                        " [corrupted: bit {} of byte {}]",
                        bit % 8,
                        bit / 8
                    ));
                }
            }
        }
        let dropped = seen.dropped;
        let header = seen.header;
        let to = seen.to;
        if from_device_ack(from, &header) {
            fate.push_str(" [checked durable]");
        }
        self.note_datagram(&node_name(from), || {
            format!(
                "send {} -> {}{fate}",
                describe_header(&header),
                node_name(to)
            )
        });
        if self.record_seen {
            self.seen.push(seen);
        }
        if dropped {
            return;
        }
        for delay in &delays[..copies] {
            self.sequence += 1;
            let at = self.now + *delay;
            self.queue.push(Reverse((
                at,
                self.sequence,
                from,
                transmit.destination,
                bytes.clone(),
            )));
        }
    }

    /// Inject raw bytes (for malformed-input tests).
    pub fn inject(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        self.sequence += 1;
        self.queue.push(Reverse((
            self.now + self.latency,
            self.sequence,
            from,
            to,
            bytes,
        )));
    }

    /// Run persistence work (unless held), applications, and collect every node's output.
    pub fn flush_outputs(&mut self) {
        loop {
            let mut progressed = false;
            for index in 0..self.devices.len() {
                if !self.devices[index].up {
                    continue;
                }
                let now = self.now;
                let node = &mut self.devices[index];
                let mut persisted = Vec::new();
                while let Some(batch) = node.pipeline.poll_persist() {
                    let batch = PersistBatch {
                        number: batch.number,
                        work: batch.work.into_iter().map(StackWork::into_back).collect(),
                    };
                    if node.hold_persistence {
                        persisted.push(format!(
                            "persistence held: {} waits",
                            describe_batch(&batch)
                        ));
                    }
                    node.held.push_back(batch);
                }
                if !node.hold_persistence {
                    while let Some(batch) = node.held.pop_front() {
                        progressed = true;
                        persisted.push(execute_batch(node, now, batch));
                    }
                }
                let mut out = Vec::new();
                while let Some(transmit) = node.pipeline.poll_transmit() {
                    out.push(transmit);
                }
                let actor = format!("device{index}");
                for text in persisted {
                    self.note(&actor, || text);
                }
                for transmit in out {
                    progressed = true;
                    self.check_pmnet_ack(index, &transmit);
                    self.enqueue(device_addr(index), transmit);
                }
            }
            for index in 0..self.servers.len() {
                if !self.servers[index].up {
                    continue;
                }
                let now = self.now;
                let node = &mut self.servers[index];
                let mut applied = Vec::new();
                while let Some(event) = node.server.poll_event() {
                    progressed = true;
                    match event {
                        ServerEvent::Apply {
                            session_id,
                            seq,
                            kind,
                            request,
                        } => {
                            let what = match (kind, request.is_empty()) {
                                (RequestKind::Bypass, true) => "no-op fill".to_string(),
                                _ => format!("{kind:?} ({} bytes)", request.len()),
                            };
                            if node.store_full && kind == RequestKind::Update {
                                node.deferred_count += 1;
                                node.server.on_deferred(now, session_id, seq, kind, request);
                                applied.push(format!(
                                    "no room for s={session_id:x} seq={seq} {what}: deferred, \
                                     nothing durable, no server-ACK"
                                ));
                                continue;
                            }
                            match node.app.apply(session_id, seq, kind, request) {
                                Some(reply) => {
                                    node.server.on_applied(now, session_id, seq, reply);
                                    applied.push(format!(
                                        "apply s={session_id:x} seq={seq} {what} [in order, once]"
                                    ));
                                }
                                None => {
                                    node.deferred_count += 1;
                                    let request = node.app.last_refused.take().unwrap_or_default();
                                    node.server.on_deferred(now, session_id, seq, kind, request);
                                    applied.push(format!(
                                        "the store has no room for s={session_id:x} seq={seq}: \
                                         deferred"
                                    ));
                                }
                            }
                        }
                        ServerEvent::RecoveryComplete { entries_resent } => {
                            applied.push(format!(
                                "recovery complete: {entries_resent} logged entries resent"
                            ));
                        }
                    }
                }
                let mut out = Vec::new();
                while let Some(transmit) = node.server.poll_transmit() {
                    out.push(transmit);
                }
                let actor = format!("server{index}");
                for text in applied {
                    self.note(&actor, || text);
                }
                for transmit in out {
                    progressed = true;
                    self.enqueue(server_addr(index), transmit);
                }
            }
            for index in 0..self.clients.len() {
                let mut out = Vec::new();
                let mut events = Vec::new();
                let node = &mut self.clients[index];
                if node.gone {
                    while node.client.poll_transmit().is_some() {}
                    continue;
                }
                while let Some(event) = node.client.poll_event() {
                    events.push(event.clone());
                    node.completed.push(event);
                }
                while let Some(transmit) = node.client.poll_transmit() {
                    out.push(transmit);
                }
                let actor = format!("client{index}");
                for event in events {
                    self.note(&actor, || describe_client_event(&event));
                }
                for transmit in out {
                    progressed = true;
                    self.enqueue(client_addr(index), transmit);
                }
            }
            if !progressed {
                break;
            }
        }
    }

    /// An ack is a promise: a PMNet-ACK may name only an entry the device's log has held
    /// durably, by the persistence model's account rather than the device's.
    fn check_pmnet_ack(&mut self, device: usize, transmit: &Transmit) {
        let Ok((header, _)) = Header::parse(&transmit.bytes) else {
            return;
        };
        if header.packet_type != PacketType::PmnetAck {
            return;
        }
        let key = EntryKey {
            server_id: header.server_id,
            session_id: header.session_id,
            seq: header.seq,
            fragment_index: header.fragment_index,
        };
        assert!(
            self.devices[device].ever_durable.contains(&key),
            "invariant: device {device} acked {key:?} before its log write was durable"
        );
        self.acks_checked += 1;
    }

    /// Release held persistence work of device `index`, `count` batches (all when `None`).
    pub fn release_persistence(&mut self, index: usize, count: Option<usize>) {
        let now = self.now;
        let node = &mut self.devices[index];
        let count = count.unwrap_or(node.held.len());
        let mut persisted = Vec::new();
        for _ in 0..count {
            let Some(batch) = node.held.pop_front() else {
                break;
            };
            persisted.push(execute_batch(node, now, batch));
        }
        let actor = format!("device{index}");
        for text in persisted {
            self.note(&actor, || format!("released: {text}"));
        }
        self.flush_outputs();
    }

    fn next_timeout(&self) -> Option<Time> {
        let devices = self.devices.iter().filter(|node| node.up);
        let servers = self.servers.iter().filter(|node| node.up);
        devices
            .filter_map(|node| node.pipeline.poll_timeout())
            .chain(servers.filter_map(|node| node.server.poll_timeout()))
            .chain(
                self.clients
                    .iter()
                    .filter(|node| !node.gone)
                    .filter_map(|node| node.client.poll_timeout()),
            )
            .min()
    }

    /// When the next datagram arrives or the next timer fires.
    pub fn next_event_time(&self) -> Option<Time> {
        let next_packet = self.queue.peek().map(|Reverse((at, ..))| *at);
        next_packet.into_iter().chain(self.next_timeout()).min()
    }

    /// Deliver the next datagram or fire the next timer, whichever is earlier. False when
    /// nothing is left to do.
    pub fn step(&mut self) -> bool {
        let next_packet = self.queue.peek().map(|Reverse((at, ..))| *at);
        let next_timer = self.next_timeout();
        match (next_packet, next_timer) {
            (None, None) => return false,
            (Some(at), timer) if timer.is_none_or(|timer| at <= timer) => {
                let Reverse((at, _, from, to, bytes)) = self.queue.pop().expect("peeked");
                self.now = self.now.max(at);
                self.deliver(from, to, &bytes);
            }
            (_, Some(timer)) => {
                self.now = self.now.max(timer);
                self.fire_timers();
            }
            (Some(_), None) => unreachable!("handled by the guard above"),
        }
        self.flush_outputs();
        true
    }

    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        let now = self.now;
        let up = if let Some(index) = (0..self.servers.len()).find(|i| server_addr(*i) == to) {
            self.servers[index].up
        } else if let Some(index) = (0..self.devices.len()).find(|i| device_addr(*i) == to) {
            self.devices[index].up
        } else {
            true
        };
        self.note_datagram(&node_name(to), || {
            let what = match Header::parse(bytes) {
                Ok((header, _)) => describe_header(&header),
                Err(error) => format!(
                    "a datagram of {} bytes that does not parse ({error})",
                    bytes.len()
                ),
            };
            let fate = if up { "" } else { " [lost: the node is down]" };
            format!("recv {what} from {}{fate}", node_name(from))
        });
        if let Some(node) = (0..self.servers.len()).find(|i| server_addr(*i) == to) {
            let node = &mut self.servers[node];
            if node.up {
                node.server.handle(now, from, bytes);
            }
        } else if let Some(node) = (0..self.devices.len()).find(|i| device_addr(*i) == to) {
            let node = &mut self.devices[node];
            if node.up {
                node.pipeline.handle(now, from, bytes);
            }
        } else if let Some(index) = (0..self.clients.len()).find(|i| client_addr(*i) == to) {
            if !self.clients[index].gone {
                self.clients[index].client.handle(now, from, bytes);
            }
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now;
        for node in self.devices.iter_mut().filter(|node| node.up) {
            if node.pipeline.poll_timeout().is_some_and(|t| t <= now) {
                node.pipeline.handle_timeout(now);
            }
        }
        for node in self.servers.iter_mut().filter(|node| node.up) {
            if node.server.poll_timeout().is_some_and(|t| t <= now) {
                node.server.handle_timeout(now);
            }
        }
        for node in self.clients.iter_mut().filter(|node| !node.gone) {
            if node.client.poll_timeout().is_some_and(|t| t <= now) {
                node.client.handle_timeout(now);
            }
        }
    }

    /// Step until `done` holds; panics after `max_steps` (a liveness failure, not a hang).
    pub fn drive_until(&mut self, max_steps: usize, mut done: impl FnMut(&World) -> bool) {
        for _ in 0..max_steps {
            if done(self) {
                return;
            }
            if !self.step() {
                break;
            }
        }
        assert!(
            done(self),
            "condition not reached within {max_steps} steps at {}",
            self.now
        );
    }

    /// Deliver datagrams and fire timers up to `duration` from now.
    pub fn run_for(&mut self, duration: Duration) {
        let until = self.now + duration;
        while self.next_event_time().is_some_and(|at| at <= until) {
            self.step();
        }
        self.now = self.now.max(until);
    }

    /// Every datagram of `packet_type` seen so far.
    pub fn seen_of(&self, packet_type: PacketType) -> Vec<&Seen> {
        self.seen
            .iter()
            .filter(|seen| seen.header.packet_type == packet_type)
            .collect()
    }

    pub fn completion(&self, client: usize, seq: u32) -> Option<&ClientEvent> {
        self.clients[client]
            .completed
            .iter()
            .find(|event| match event {
                ClientEvent::Completed { seq: s, .. } | ClientEvent::Failed { seq: s, .. } => {
                    *s == seq
                }
            })
    }

    /// Crash device `index` (volatile state and held persistence lost; the log keeps what was
    /// persisted) and restart it.
    pub fn restart_device(&mut self, index: usize) {
        self.restart_device_with(index, |region| region.crash_losing_unpersisted());
    }

    /// Crash device `index`, leaving its log as `crash` builds it from the region, and
    /// restart it on the reopened log.
    pub fn restart_device_with(
        &mut self,
        index: usize,
        crash: impl FnOnce(&SimRegion) -> SimRegion,
    ) {
        let now = self.now;
        let node = &mut self.devices[index];
        let held_lost = node.held.len();
        let region = crash(node.log.region());
        let (log, recovery) = PmLog::open(region).expect("reopen a device log after a crash");
        node.rejected_slot_count += u64::from(recovery.rejected_slot_count);
        let recovered = recovery.entries.len();
        // Whatever the reopened log holds is durable now, whether or not it was before.
        node.ever_durable
            .extend(recovery.entries.iter().map(|entry| entry.key));
        node.pipeline = DevicePipeline::with_front(
            (node.new_front)(),
            Device::new(node.config.clone(), now, recovery.entries),
        );
        node.log = log;
        node.held.clear();
        node.hold_persistence = false;
        node.up = true;
        node.restart_count += 1;
        let rejected = recovery.rejected_slot_count;
        self.note(&format!("device{index}"), || {
            format!(
                "restarted: log reopened, {recovered} entries recovered, {rejected} slots \
                 rejected (torn or corrupt), {held_lost} held persistence work lost"
            )
        });
        self.flush_outputs();
    }

    /// Take device `index` down: it receives nothing and its timers stop until restarted.
    pub fn stop_device(&mut self, index: usize) {
        self.devices[index].up = false;
        self.note_by(&format!("device{index}"), "down");
    }

    /// Take server `index` down: it receives nothing until [`World::start_server`].
    pub fn stop_server(&mut self, index: usize) {
        self.servers[index].up = false;
        self.note_by(&format!("server{index}"), "down (crashed)");
    }

    /// Start server `index` again (a new process) from its application's durable state.
    pub fn start_server(&mut self, index: usize) {
        let now = self.now;
        let node = &mut self.servers[index];
        node.app.crash_store();
        let sessions = node.app.recovered_sessions();
        let session_count = sessions.len();
        node.skipped_before_restart += node.server.counters().sequence_numbers_skipped;
        node.server = Server::new(node.config.clone(), now, sessions);
        node.up = true;
        node.restart_count += 1;
        self.note_by(
            &format!("server{index}"),
            &format!(
                "started: store reopened, {session_count} sessions recovered; polling devices"
            ),
        );
        self.flush_outputs();
    }

    /// Sequence numbers of `session_id` applied by any server, in order.
    pub fn applied_seqs(&self, session_id: u64) -> Vec<u32> {
        self.servers
            .iter()
            .flat_map(|node| &node.app.applied)
            .filter(|(s, ..)| *s == session_id)
            .map(|(_, seq, ..)| *seq)
            .collect()
    }

    /// The trace of datagrams seen, for failure messages.
    pub fn seen_trace(&self) -> String {
        let mut out = String::new();
        for seen in &self.seen {
            out.push_str(&format!(
                "{} {} -> {} {} s={:x} seq={} frag={}/{}{}\n",
                seen.at,
                seen.from,
                seen.to,
                seen.header.packet_type,
                seen.header.session_id,
                seen.header.seq,
                seen.header.fragment_index,
                seen.header.fragment_count,
                if seen.dropped { " DROPPED" } else { "" }
            ));
        }
        out
    }
}

/// A batch of persistence work as traces show it.
fn describe_batch(batch: &PersistBatch<LogWork>) -> String {
    let items: Vec<String> = batch
        .work
        .iter()
        .map(|work| match work {
            LogWork::Write { slot, key, .. } => {
                format!("log write of slot {slot} ({})", describe_key(key))
            }
            LogWork::Invalidate { slot } => format!("invalidation of slot {slot}"),
        })
        .collect();
    format!("batch {}: {}", batch.number, items.join(", "))
}

/// Carry out a batch of persistence work on the device's log with the executor production
/// uses ([`PmLog::persist_batch`]), check that every write is durable by the persistence
/// model's account, and report the batch; returns what happened, for the trace.
fn execute_batch(node: &mut DeviceNode, now: Time, batch: PersistBatch<LogWork>) -> String {
    let text = format!("{}: durable [checked]", describe_batch(&batch));
    node.log.persist_batch(&batch.work);
    for work in &batch.work {
        if let LogWork::Write { slot, key, .. } = work {
            let range = node.log.slot_range(*slot);
            assert!(
                node.log.region().is_durable(range.start, range.len()),
                "invariant: the log returned from a batch whose write to slot {slot} is not durable"
            );
            node.ever_durable.insert(*key);
        }
    }
    node.pipeline.on_persisted(now, batch.number);
    text
}

/// Whether a datagram is a PMNet-ACK from a device (checked durable before it is sent).
fn from_device_ack(from: SocketAddr, header: &Header) -> bool {
    header.packet_type == PacketType::PmnetAck && node_name(from).starts_with("device")
}

//! An in-memory network with a virtual clock that wires clients, devices and a server
//! together, after quinn's `Pair`: deterministic, no sockets, no sleeping.
//!
//! Devices persist into a real [`PmLog`] on a [`SimRegion`], so a test can crash one and
//! reopen the log from what the crash model says survived. The server applies requests to a
//! [`RecordingApp`] whose durable part survives a server restart.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_pm::{PmLog, SimRegion};
use pmnet_proto::{
    Client, ClientConfig, ClientEvent, Device, DeviceConfig, PersistWork, RecoveredSession,
    RequestKind, Server, ServerConfig, ServerEvent, Time, Transmit,
};
use pmnet_store::{Application, KvConfig, KvStore};
use pmnet_wire::{Header, PacketType};

pub const SERVER_ID: u16 = 1;
pub const DEVICE_ID: u16 = 7;
pub const SLOT_SIZE: u32 = 2048;

pub fn addr(host: u8, port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, host], port))
}
pub const SERVER: fn() -> SocketAddr = || addr(1, 51000);
pub const DEVICE: fn() -> SocketAddr = || addr(2, 51000);
pub fn client_addr(index: usize) -> SocketAddr {
    addr(100, 40000 + index as u16)
}

/// One datagram seen on the network, for assertions.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Time,
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub header: Header,
    pub dropped: bool,
}

/// The server's application for protocol tests: records what it applied, in order.
///
/// An update's reply is `b"ok"`; a bypass's reply is the number of updates of its session
/// applied before it (u32, big-endian), so a test can check read-your-writes.
#[derive(Default)]
pub struct RecordingApp {
    pub applied: Vec<(u64, u32, RequestKind, Vec<u8>)>,
    pub sessions: HashMap<u64, (u32, Vec<u8>)>,
    pub updates_per_session: HashMap<u64, u32>,
    /// When set, requests are also applied to this real store, whose replies are returned.
    pub kv: Option<KvStore<SimRegion>>,
}

impl RecordingApp {
    fn apply(&mut self, session_id: u64, seq: u32, kind: RequestKind, request: Vec<u8>) -> Vec<u8> {
        let last = self.sessions.get(&session_id).map_or(0, |(seq, _)| *seq);
        assert_eq!(
            seq,
            last + 1,
            "applied out of order or twice: session {session_id:x}"
        );
        let reply = match kind {
            RequestKind::Update => {
                *self.updates_per_session.entry(session_id).or_insert(0) += 1;
                b"ok".to_vec()
            }
            RequestKind::Bypass => {
                let count = self
                    .updates_per_session
                    .get(&session_id)
                    .copied()
                    .unwrap_or(0);
                count.to_be_bytes().to_vec()
            }
        };
        let reply = match self.kv.as_mut() {
            Some(kv) => kv.apply(session_id, seq, &request),
            None => reply,
        };
        self.applied.push((session_id, seq, kind, request));
        self.sessions.insert(session_id, (seq, reply.clone()));
        reply
    }

    /// Crash the store (losing what was not persisted) and reopen it.
    fn crash_store(&mut self) {
        if let Some(kv) = self.kv.take() {
            let region = kv.into_region().crash_losing_unpersisted();
            self.kv = Some(KvStore::open(region).expect("reopen the store"));
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

pub struct DeviceNode {
    pub device: Device,
    pub log: PmLog<SimRegion>,
    /// When set, persistence work waits in `held` until the test releases it.
    pub hold_persistence: bool,
    pub held: VecDeque<PersistWork>,
    pub config: DeviceConfig,
}

pub struct ServerNode {
    pub server: Server,
    pub app: RecordingApp,
    pub config: ServerConfig,
    pub up: bool,
}

pub struct ClientNode {
    pub client: Client,
    pub completed: Vec<ClientEvent>,
}

type DropRule = Box<dyn FnMut(&Seen) -> bool>;

/// A datagram in flight: delivery time, tie-breaking sequence, source, destination, bytes.
type InFlight = Reverse<(Time, u64, SocketAddr, SocketAddr, Vec<u8>)>;

/// Random network faults: loss, duplication and delay spread (which reorders), from one seed.
pub struct Faults {
    pub rng: rand_chacha::ChaCha8Rng,
    pub loss: f64,
    pub duplicate: f64,
    pub jitter: Duration,
}

pub struct World {
    pub now: Time,
    pub faults: Option<Faults>,
    pub latency: Duration,
    queue: BinaryHeap<InFlight>,
    sequence: u64,
    pub seen: Vec<Seen>,
    drop_rules: Vec<DropRule>,
    pub clients: Vec<ClientNode>,
    pub device: Option<DeviceNode>,
    pub server: ServerNode,
}

impl World {
    /// A world with `client_count` clients, a device with `slot_count` slots in front of the
    /// server (or none), and a network delay of 5 µs per hop.
    pub fn new(client_count: usize, slot_count: Option<u32>) -> World {
        let device = slot_count.map(|slot_count| {
            let region = SimRegion::new(PmLog::<SimRegion>::required_region_len(
                slot_count, SLOT_SIZE,
            ));
            let log = PmLog::format(region, slot_count, SLOT_SIZE).expect("format log");
            let config = DeviceConfig::new(
                DEVICE_ID,
                vec![(SERVER_ID, SERVER())],
                slot_count,
                log.max_packet_len(),
            );
            DeviceNode {
                device: Device::new(config.clone(), Time::ZERO, Vec::new()),
                log,
                hold_persistence: false,
                held: VecDeque::new(),
                config,
            }
        });
        let peer = if device.is_some() { DEVICE() } else { SERVER() };
        let devices = if device.is_some() {
            vec![DEVICE()]
        } else {
            Vec::new()
        };
        let server_config = ServerConfig::new(SERVER_ID, devices);
        let server = ServerNode {
            server: Server::new(server_config.clone(), Time::ZERO, Vec::new()),
            app: RecordingApp::default(),
            config: server_config,
            up: true,
        };
        let clients = (0..client_count)
            .map(|index| ClientNode {
                client: Client::new(ClientConfig::new(
                    0x5E55_0000_0000_0000 | (index as u64 + 1),
                    SERVER_ID,
                    peer,
                )),
                completed: Vec::new(),
            })
            .collect();
        let mut world = World {
            now: Time::ZERO,
            faults: None,
            latency: Duration::from_micros(5),
            queue: BinaryHeap::new(),
            sequence: 0,
            seen: Vec::new(),
            drop_rules: Vec::new(),
            clients,
            device,
            server,
        };
        world.flush_outputs();
        world
    }

    /// Put a real key-value store (on a simulated region of `len` bytes) behind the server.
    pub fn with_kv_store(mut self, len: usize) -> World {
        let store = KvStore::format(SimRegion::new(len), KvConfig::default()).expect("format");
        self.server.app.kv = Some(store);
        self
    }

    pub fn session(&self, client: usize) -> u64 {
        self.clients[client].client.session_id()
    }

    /// Drop every datagram for which `rule` returns true (rules stay until cleared).
    pub fn drop_when(&mut self, rule: impl FnMut(&Seen) -> bool + 'static) {
        self.drop_rules.push(Box::new(rule));
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
        self.flush_outputs();
        seq
    }

    pub fn bypass(&mut self, client: usize, payload: &[u8]) -> u32 {
        let now = self.now;
        let seq = self.clients[client]
            .client
            .bypass(now, payload)
            .expect("bypass accepted");
        self.flush_outputs();
        seq
    }

    fn enqueue(&mut self, from: SocketAddr, transmit: Transmit) {
        let header = match Header::parse(&transmit.bytes) {
            Ok((header, _)) => header,
            Err(error) => panic!("a node sent an invalid datagram: {error}"),
        };
        let mut seen = Seen {
            at: self.now,
            from,
            to: transmit.destination,
            header,
            dropped: false,
        };
        seen.dropped = self.drop_rules.iter_mut().any(|rule| rule(&seen));
        let mut copies = 1;
        let mut delays = [self.latency; 2];
        if let Some(faults) = self.faults.as_mut() {
            use rand::Rng;
            seen.dropped |= faults.rng.random_bool(faults.loss);
            if faults.rng.random_bool(faults.duplicate) {
                copies = 2;
            }
            for delay in &mut delays {
                let spread = faults.rng.random_range(0..=faults.jitter.as_nanos() as u64);
                *delay += Duration::from_nanos(spread);
            }
        }
        let dropped = seen.dropped;
        self.seen.push(seen);
        if dropped {
            return;
        }
        for delay in &delays[..copies] {
            self.sequence += 1;
            self.queue.push(Reverse((
                self.now + *delay,
                self.sequence,
                from,
                transmit.destination,
                transmit.bytes.clone(),
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
            if let Some(node) = self.device.as_mut() {
                while let Some(work) = node.device.poll_persist() {
                    node.held.push_back(work);
                }
                if !node.hold_persistence {
                    while let Some(work) = node.held.pop_front() {
                        progressed = true;
                        execute_persist(node, self.now, work);
                    }
                }
                let mut out = Vec::new();
                while let Some(transmit) = node.device.poll_transmit() {
                    out.push(transmit);
                }
                for transmit in out {
                    progressed = true;
                    self.enqueue(DEVICE(), transmit);
                }
            }
            if self.server.up {
                while let Some(event) = self.server.server.poll_event() {
                    progressed = true;
                    if let ServerEvent::Apply {
                        session_id,
                        seq,
                        kind,
                        request,
                    } = event
                    {
                        let reply = self.server.app.apply(session_id, seq, kind, request);
                        self.server
                            .server
                            .on_applied(self.now, session_id, seq, reply);
                    }
                }
                let mut out = Vec::new();
                while let Some(transmit) = self.server.server.poll_transmit() {
                    out.push(transmit);
                }
                for transmit in out {
                    progressed = true;
                    self.enqueue(SERVER(), transmit);
                }
            }
            for index in 0..self.clients.len() {
                let mut out = Vec::new();
                let node = &mut self.clients[index];
                while let Some(event) = node.client.poll_event() {
                    node.completed.push(event);
                }
                while let Some(transmit) = node.client.poll_transmit() {
                    out.push(transmit);
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

    /// Release held persistence work of the device, `count` items (all when `None`).
    pub fn release_persistence(&mut self, count: Option<usize>) {
        let now = self.now;
        let node = self.device.as_mut().expect("a device");
        let count = count.unwrap_or(node.held.len());
        for _ in 0..count {
            let Some(work) = node.held.pop_front() else {
                break;
            };
            execute_persist(node, now, work);
        }
        self.flush_outputs();
    }

    fn next_timeout(&self) -> Option<Time> {
        let mut deadlines = Vec::new();
        if let Some(node) = &self.device {
            deadlines.extend(node.device.poll_timeout());
        }
        if self.server.up {
            deadlines.extend(self.server.server.poll_timeout());
        }
        for node in &self.clients {
            deadlines.extend(node.client.poll_timeout());
        }
        deadlines.into_iter().min()
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
        if to == SERVER() {
            if self.server.up {
                self.server.server.handle(now, from, bytes);
            }
        } else if to == DEVICE() {
            if let Some(node) = self.device.as_mut() {
                node.device.handle(now, from, bytes);
            }
        } else if let Some(index) = (0..self.clients.len()).find(|i| client_addr(*i) == to) {
            self.clients[index].client.handle(now, from, bytes);
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now;
        if let Some(node) = self.device.as_mut() {
            if node.device.poll_timeout().is_some_and(|t| t <= now) {
                node.device.handle_timeout(now);
            }
        }
        if self.server.up && self.server.server.poll_timeout().is_some_and(|t| t <= now) {
            self.server.server.handle_timeout(now);
        }
        for node in &mut self.clients {
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

    /// Deliver only what is in flight and fire due timers until the network is quiet and no
    /// timer is due before `until`.
    pub fn run_for(&mut self, duration: Duration) {
        let until = self.now + duration;
        loop {
            let next_packet = self.queue.peek().map(|Reverse((at, ..))| *at);
            let next = next_packet.into_iter().chain(self.next_timeout()).min();
            match next {
                Some(at) if at <= until => {
                    self.step();
                }
                _ => break,
            }
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

    /// Crash the device: volatile state lost, the log keeps what the crash model leaves
    /// (here: only what was persisted). Then restart it on the reopened log.
    pub fn restart_device(&mut self) {
        self.restart_device_with(|region| region.crash_losing_unpersisted());
    }

    /// Crash the device, leaving the log as `crash` builds it from the region, and restart.
    pub fn restart_device_with(&mut self, crash: impl FnOnce(&SimRegion) -> SimRegion) {
        let now = self.now;
        let node = self.device.take().expect("a device");
        let region = crash(&node.log.into_region());
        let (log, recovery) = PmLog::open(region).expect("reopen log");
        let device = Device::new(node.config.clone(), now, recovery.entries);
        self.device = Some(DeviceNode {
            device,
            log,
            hold_persistence: false,
            held: VecDeque::new(),
            config: node.config,
        });
        self.flush_outputs();
    }

    /// Take the server down: it receives nothing until [`World::start_server`].
    pub fn stop_server(&mut self) {
        self.server.up = false;
    }

    /// Start the server again from its application's durable state.
    pub fn start_server(&mut self) {
        self.server.app.crash_store();
        let sessions = self.server.app.recovered_sessions();
        self.server.server = Server::new(self.server.config.clone(), self.now, sessions);
        self.server.up = true;
        self.flush_outputs();
    }

    /// Applied requests of `session`, in order.
    pub fn applied_seqs(&self, session_id: u64) -> Vec<u32> {
        self.server
            .app
            .applied
            .iter()
            .filter(|(s, ..)| *s == session_id)
            .map(|(_, seq, ..)| *seq)
            .collect()
    }

    /// Time-ordered summary of the trace, for failure messages.
    pub fn trace(&self) -> String {
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

fn execute_persist(node: &mut DeviceNode, now: Time, work: PersistWork) {
    match work {
        PersistWork::LogWrite {
            token,
            key,
            return_address,
            packet,
        } => {
            node.log
                .write_with_return_address(token.slot, &key, Some(return_address), &packet);
            // The log says the write is durable; the simulated region must agree.
            let range = node.log.slot_range(token.slot);
            assert!(node.log.region().is_durable(range.start, range.len()));
            node.device.on_persisted(now, token);
        }
        PersistWork::LogInvalidate { slot } => node.log.invalidate(slot),
    }
}

/// A map of how often each `(session, seq)` was applied, for exactly-once checks.
pub fn application_counts(app: &RecordingApp) -> BTreeMap<(u64, u32), usize> {
    let mut counts = BTreeMap::new();
    for (session, seq, ..) in &app.applied {
        *counts.entry((*session, *seq)).or_insert(0) += 1;
    }
    counts
}

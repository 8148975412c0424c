//! The nodes of a world and how they are named: addresses, the server's application, the
//! device, server and client nodes, network faults and counters, the shape of a world.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;

use pmnet_pm::{EntryKey, LogWork, PmLog, SimRegion};
use pmnet_proto::route::{Planner, PlannerConfig, PlannerCounters};
use pmnet_proto::{
    Client, ClientConfig, ClientEvent, Device, DeviceConfig, DevicePipeline, FrontFunction,
    PersistBatch, RecoveredSession, RequestKind, Server, ServerConfig, Time,
};
use pmnet_store::{Application, KvStore};
use pmnet_wire::route::ChainRoute;

#[cfg(doc)]
use super::World;

/// Id of the first server; server `i` has id `SERVER_ID + i`.
pub const SERVER_ID: u16 = 1;
/// Id of the first device; device `j` has id `DEVICE_ID + j`.
pub const DEVICE_ID: u16 = 7;
/// Slot size of every simulated device log (and primary's forward log).
pub const SLOT_SIZE: u32 = 2048;
/// Slots of a primary's forward log.
pub const FORWARD_LOG_SLOTS: u32 = 1024;

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

/// Address of replica server `index` (see [`Topology::server_replicas`]).
pub fn replica_addr(index: usize) -> SocketAddr {
    host(3, index, 51000)
}

/// Address of client `index`.
pub fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 100, 1], 40000 + index as u16))
}

/// Address of the controller that plans the devices in series ([`World::with_controller`]).
pub fn controller_addr() -> SocketAddr {
    host(4, 0, 51000)
}

/// The name of the node at `addr` in traces: `client0`, `device1`, `server0` (the chain
/// store's world: `member0`, `controller`, `client0`; replicated memory's: `memnode0`,
/// `device`, `client0`), or the address.
pub fn node_name(addr: SocketAddr) -> String {
    if let SocketAddr::V4(v4) = addr {
        let [a, b, c, d] = v4.ip().octets();
        match (a, b, c, d, v4.port()) {
            (10, 0, 1, host, 51000) if host > 0 => return format!("server{}", host - 1),
            (10, 0, 2, host, 51000) if host > 0 => return format!("device{}", host - 1),
            (10, 0, 3, host, 51000) if host > 0 => return format!("replica{}", host - 1),
            (10, 0, 4, 1, 51000) => return "controller".to_string(),
            (10, 0, 100, 1, port) if port >= 40000 => return format!("client{}", port - 40000),
            // The chain store's world.
            (10, 0, 5, 100, 7700) => return "controller".to_string(),
            (10, 0, 5, 101, 7700) => return "controller-b".to_string(),
            (10, 0, 5, host, 7600) if host > 0 => return format!("member{}", host - 1),
            (10, 0, 6, host, 40000) if host > 0 => return format!("client{}", host - 1),
            // Replicated memory's world.
            (10, 0, 7, 100, 7900) => return "device".to_string(),
            (10, 0, 7, host, 7800) if host > 0 => return format!("memnode{}", host - 1),
            (10, 0, 8, host, 41000) if host > 0 => return format!("client{}", host - 1),
            _ => {}
        }
    }
    addr.to_string()
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
    /// Servers' tables may forget sessions (small tables: [`World::with_session_tables`]).
    pub sessions_forgotten: bool,
    /// No-op fills of old numbers staged by a server that forgot their session: the store
    /// refused them as stale, applying nothing.
    pub late_fills: u64,
}

impl ServerApp {
    /// Whether `request` is the no-op fill (an empty bypass) of an old number, which a
    /// server whose table forgot the session may stage (see `Application::stage`).
    fn is_late_fill(&self, kind: RequestKind, request: &[u8]) -> bool {
        self.sessions_forgotten && kind == RequestKind::Bypass && request.is_empty()
    }

    /// How far it got: the sum of its sessions' last applied numbers. Replicas apply in their
    /// primary's order, so of two replicas of one primary the one further along holds
    /// everything the other does (the one an operator promotes).
    pub fn applied_position(&self) -> u64 {
        self.sessions.values().map(|(seq, _)| u64::from(*seq)).sum()
    }

    /// Stage a request (the store's stage is durable on return, and its commit does nothing):
    /// the reply, or `None` when the store has no room (nothing staged).
    pub(super) fn stage(
        &mut self,
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: &[u8],
    ) -> Option<Vec<u8>> {
        // Numbers a server skipped (a gap no client or device could fill) leave holes; the
        // run's end checks that each hole is a request its client reported failed.
        let last = self.sessions.get(&session_id).map_or(0, |(seq, _)| *seq);
        if seq <= last && self.is_late_fill(kind, request) {
            // A session the server's table forgot (evicted while idle, its devices holding
            // nothing of it) starts again from nothing; its client answers a question about
            // one of its old numbers with the no-op fill of a request it gave up on. The store
            // refuses it as stale; nothing of the session's earlier life comes back.
            // The store refuses it as stale or, having forgotten the session too, applies
            // it as the empty request it is: no effect either way.
            let reply = match self.kv.as_mut() {
                Some(kv) => kv.stage(session_id, seq, request).ok()?,
                None => pmnet_store::stale_reply(seq, last),
            };
            self.late_fills += 1;
            return Some(reply);
        }
        assert!(
            seq > last,
            "invariant: session {session_id:x} applied seq {seq} after {last} (out of order or twice)"
        );
        let reply = match (self.kv.as_mut(), kind) {
            (Some(kv), _) => match kv.stage(session_id, seq, request) {
                Ok(reply) => reply,
                Err(pmnet_store::NoSpace) => return None,
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
        self.applied.push((session_id, seq, kind, request.to_vec()));
        self.sessions.insert(session_id, (seq, reply.clone()));
        Some(reply)
    }

    /// A cache read: the store's answer; without a store, the reading session's applied
    /// update count, as a bypass read answers.
    pub(super) fn read(&mut self, request: &[u8]) -> Vec<u8> {
        match self.kv.as_mut() {
            Some(kv) => kv.read(request),
            None => Vec::new(),
        }
    }

    /// The server's time, for the store.
    pub(super) fn note_time(&mut self, now_ms: u64) {
        if let Some(kv) = self.kv.as_mut() {
            kv.note_time(now_ms);
        }
    }

    /// The session the store would forget next (see `Application::eviction_candidate`).
    pub(super) fn eviction_candidate(&mut self, for_session: u64) -> Option<(u64, u64)> {
        self.kv.as_mut()?.eviction_candidate(for_session)
    }

    /// The store may forget `session_id`.
    pub(super) fn permit_eviction(&mut self, session_id: u64) {
        if let Some(kv) = self.kv.as_mut() {
            kv.permit_eviction(session_id);
        }
    }

    /// Make what was staged durable (the store's commit).
    pub(super) fn commit(&mut self) {
        if let Some(kv) = self.kv.as_mut() {
            kv.commit();
        }
    }

    /// Requests one commit covers at most.
    pub(super) fn max_staged(&self) -> usize {
        self.kv.as_ref().map_or(usize::MAX, |kv| kv.max_staged())
    }

    /// Crash the store (losing what was not persisted) and reopen it.
    pub(super) fn crash_store(&mut self) {
        if let Some(kv) = self.kv.take() {
            let region = kv.into_region().crash_losing_unpersisted();
            self.kv = Some(KvStore::open(region).expect("reopen the store after a crash"));
        }
    }

    pub(super) fn recovered_sessions(&self) -> Vec<RecoveredSession> {
        if let Some(kv) = &self.kv {
            return kv
                .sessions()
                .into_iter()
                .map(|record| RecoveredSession {
                    session_id: record.session_id,
                    last_seq: record.last_seq,
                    last_reply: record.last_reply,
                    earlier_replies: Vec::new(),
                })
                .collect();
        }
        self.sessions
            .iter()
            .map(|(session_id, (last_seq, last_reply))| RecoveredSession {
                session_id: *session_id,
                last_seq: *last_seq,
                last_reply: last_reply.clone(),
                earlier_replies: Vec::new(),
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
    /// The front function's persistent region, if it persists anything (a chain store's
    /// table); its writes are durable as soon as the function asks.
    pub front_executor: pmnet_proto::RegionExecutor<SimRegion>,
    /// Lost for good ([`World::lose_device`]): its log is gone and the chain goes around it.
    pub lost: bool,
    /// The device's functions: those a test puts in front of the log (none unless told), the
    /// ordering of keyed writes, then the log.
    pub pipeline: DevicePipeline,
    pub log: PmLog<SimRegion>,
    /// When set, persistence batches wait in `held` until released; a crash loses them.
    pub hold_persistence: bool,
    pub held: VecDeque<PersistBatch<LogWork>>,
    /// Build the functions in front of the log, at start and after each restart (their state
    /// is volatile).
    pub new_fronts: Vec<fn() -> Box<dyn FrontFunction>>,
    /// The device's authenticator (kept across restarts: the key file outlives the process).
    pub auth: Option<pmnet_proto::Authenticator>,
    /// Whether the device packs what a step sends each server into batches, and how long a
    /// batch of update requests may wait for more.
    pub batch: bool,
    pub batch_hold: std::time::Duration,
    pub config: DeviceConfig,
    pub up: bool,
    /// Every key this device's log has held durably: a PMNet-ACK must name one of them.
    pub ever_durable: HashSet<EntryKey>,
    /// Restarts, and slots the log rejected at reopen (torn or corrupted entries).
    pub restart_count: u64,
    pub rejected_slot_count: u64,
    /// PMNet-ACKs the device sent straight to clients of a chain (a client's address carried
    /// by the device before it) in its runs before the current one.
    pub acks_sent_direct_before_restart: u64,
    /// A device that follows the controller ([`World::with_controller`]): its command line,
    /// which a crash restarts it from (a new boot number, epoch 0), while `config` is what it
    /// runs now (the routes it took since).
    pub command_line: Option<DeviceConfig>,
    /// Restarts in place for the controller's routes, and routes taken.
    pub restarts_in_place: u64,
    pub routes_taken: u64,
}

impl DeviceNode {
    /// Device `index`: a freshly formatted log of `slot_count` slots in front of `servers`.
    pub(super) fn new(index: usize, slot_count: u32, servers: &[(u16, SocketAddr)]) -> DeviceNode {
        let region_len = PmLog::<SimRegion>::required_region_len(slot_count, SLOT_SIZE);
        let log = PmLog::format(SimRegion::new(region_len), slot_count, SLOT_SIZE)
            .expect("format a device log");
        let config = DeviceConfig::new(
            DEVICE_ID + index as u16,
            servers.to_vec(),
            slot_count,
            log.max_packet_len(),
        );
        DeviceNode {
            pipeline: DevicePipeline::with_fronts(
                Vec::new(),
                Device::new(config.clone(), Time::ZERO, Vec::new()),
            ),
            new_fronts: Vec::new(),
            auth: None,
            batch: false,
            batch_hold: std::time::Duration::ZERO,
            log,
            hold_persistence: false,
            held: VecDeque::new(),
            config,
            up: true,
            ever_durable: HashSet::new(),
            restart_count: 0,
            rejected_slot_count: 0,
            acks_sent_direct_before_restart: 0,
            command_line: None,
            restarts_in_place: 0,
            routes_taken: 0,
            lost: false,
            front_executor: pmnet_proto::RegionExecutor::default(),
        }
    }

    /// The device with `previous` named as the devices before it in a chain
    /// (`--previous-device`), started afresh.
    pub(super) fn with_previous_devices(mut self, previous: Vec<(u16, SocketAddr)>) -> DeviceNode {
        self.config.previous_devices = previous;
        self.pipeline = self.pipeline_for(Device::new(self.config.clone(), Time::ZERO, Vec::new()));
        self
    }

    /// The device's log function.
    pub fn device(&self) -> &Device {
        self.pipeline.device()
    }

    /// A pipeline around `device` as this node runs it: new functions in front of the log,
    /// its authenticator, batching when on.
    pub fn pipeline_for(&self, device: Device) -> DevicePipeline {
        let fronts = self
            .new_fronts
            .iter()
            .map(|new_front| new_front())
            .collect();
        let pipeline = DevicePipeline::with_fronts(fronts, device).with_auth(self.auth.clone());
        if !self.batch {
            return pipeline;
        }
        let servers: Vec<SocketAddr> = self.config.servers.iter().map(|(_, addr)| *addr).collect();
        pipeline
            .with_batching(
                &servers,
                pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN,
                self.config.device_id,
            )
            .with_batch_hold(self.batch_hold)
    }
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
    /// Down for good: a replica whose store was promoted to primary
    /// ([`World::promote_replica`]), or a server lost with its store ([`World::lose_server`]).
    pub lost: bool,
    /// When it went down (crashed), while it is down.
    pub down_since: Option<Time>,
    /// A server that follows the controller ([`World::with_controller`]): its command line,
    /// which a crash restarts it from (a new boot number, epoch 0), while `config` is what it
    /// runs now (the routes it took since).
    pub command_line: Option<ServerConfig>,
    /// Restarts in place for the controller's routes.
    pub restarts_in_place: u64,
    /// Tells this node's boot numbers from those of the other servers of its id (random in
    /// production): a route replayed to another node of the chain is for another boot.
    pub(super) boot_kind: u8,
    /// The forward log (docs/replication.md): a primary's forwards, a replica's requests from
    /// its primary.
    pub forward_log: Option<PmLog<SimRegion>>,
    /// What the forward log gave back at the last start.
    pub forward_log_recovery: pmnet_proto::ForwardLogRecovery,
    /// Session evictions and hold queries of the runs before this one (a restart starts the
    /// counters again), and the store's eviction count when this run started.
    pub churn_before_restart: SessionChurn,
    store_evictions_at_boot: u64,
    /// Routes of the controller taken in the runs before this one.
    pub routes_taken_before_restart: u64,
}

/// Sessions forgotten to make room, and the hold queries that cleared them (docs/protocol.md,
/// "Sessions").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionChurn {
    /// Sessions the server's table evicted.
    pub server_evictions: u64,
    /// Sessions the store (its exactly-once records) evicted.
    pub store_evictions: u64,
    pub hold_queries_sent: u64,
}

impl SessionChurn {
    pub fn add(&mut self, other: &SessionChurn) {
        self.server_evictions += other.server_evictions;
        self.store_evictions += other.store_evictions;
        self.hold_queries_sent += other.hold_queries_sent;
    }
}

impl ServerNode {
    /// Start again (a new process) from the application's durable state; the number of
    /// sessions recovered.
    pub(super) fn restart(&mut self, now: Time) -> usize {
        let churn = self.churn();
        self.churn_before_restart.add(&churn);
        self.routes_taken_before_restart += self.server.counters().routes_taken;
        self.app.crash_store();
        self.store_evictions_at_boot = self.store_evictions();
        let sessions = self.app.recovered_sessions();
        let session_count = sessions.len();
        if let Some(command_line) = &self.command_line {
            // A new process, from its command line: the routes it took are forgotten (the
            // controller sends it the route again).
            self.config = command_line.clone();
        }
        self.boot(now, sessions);
        self.up = true;
        self.down_since = None;
        self.restart_count += 1;
        session_count
    }

    /// Restart in place for a controller's route, as the runtime does: at the end of a turn
    /// (everything applied, persisted and sent), the store and the forward log closed and
    /// opened again — nothing lost — and a new state machine with the route's `devices` and
    /// `replicas`, its follower's boot number and epoch kept. The number of sessions
    /// recovered.
    pub(super) fn restart_in_place(
        &mut self,
        now: Time,
        devices: Vec<SocketAddr>,
        replicas: Vec<SocketAddr>,
    ) -> usize {
        let follow = self
            .server
            .follower()
            .map(|follower| follower.config().clone());
        let churn = self.churn();
        self.churn_before_restart.add(&churn);
        self.routes_taken_before_restart += self.server.counters().routes_taken;
        self.skipped_before_restart += self.server.counters().sequence_numbers_skipped;
        // Everything staged was committed: reopening loses nothing.
        self.app.crash_store();
        self.store_evictions_at_boot = self.store_evictions();
        let sessions = self.app.recovered_sessions();
        let session_count = sessions.len();
        self.config.devices = devices;
        self.config.replicas = replicas;
        self.restart_count += 1;
        self.restarts_in_place += 1;
        self.boot_with(now, sessions, follow);
        session_count
    }

    /// Session evictions and hold queries of this run.
    pub fn churn(&self) -> SessionChurn {
        let counters = self.server.counters();
        SessionChurn {
            server_evictions: counters.sessions_evicted,
            store_evictions: self.store_evictions() - self.store_evictions_at_boot,
            hold_queries_sent: counters.hold_queries_sent,
        }
    }

    fn store_evictions(&self) -> u64 {
        self.app
            .kv
            .as_ref()
            .map_or(0, |kv| kv.stats().evicted_sessions)
    }

    /// A new server state machine on `sessions` and its forward log as a crash left it (a
    /// new one if it has none).
    pub(super) fn boot(&mut self, now: Time, sessions: Vec<RecoveredSession>) {
        self.boot_with(now, sessions, None);
    }

    /// [`ServerNode::boot`], with `follow` (a restart in place: the follower's boot number
    /// and epoch kept) instead of a new process's.
    fn boot_with(
        &mut self,
        now: Time,
        sessions: Vec<RecoveredSession>,
        follow: Option<pmnet_proto::route::FollowerConfig>,
    ) {
        let log = match self.forward_log.take() {
            // What a crash leaves: every batch was persisted whole before anything it let
            // out was sent, so only what no one saw may be lost.
            Some(log) => log.region().crash_losing_unpersisted(),
            None => {
                let region_len =
                    PmLog::<SimRegion>::required_region_len(FORWARD_LOG_SLOTS, SLOT_SIZE);
                PmLog::format(SimRegion::new(region_len), FORWARD_LOG_SLOTS, SLOT_SIZE)
                    .expect("format a forward log")
                    .into_region()
            }
        };
        let (log, recovery) = PmLog::open(log).expect("reopen a forward log");
        let opened = pmnet_proto::ForwardLogOpened {
            slot_count: log.slot_count(),
            max_packet_len: log.max_packet_len(),
            entries: recovery.entries,
        };
        // Each run numbers its hold queries from its own start (the runtime's is random).
        let mut config = self.config.clone();
        config.boot_nonce = u32::from(config.server_id)
            .wrapping_mul(0x9E37_79B9)
            .wrapping_add(self.restart_count.wrapping_mul(0x85EB_CA6B) as u32);
        // A new process: a boot number of its own, its command line's route (epoch 0).
        if let Some(follow) = config.follow.as_mut() {
            follow.boot = boot_number(self.boot_kind, config.server_id, self.restart_count);
            follow.epoch = 0;
        }
        if let (Some(kept), Some(follow)) = (follow, config.follow.as_mut()) {
            *follow = kept;
        }
        let (server, recovered) = Server::with_forward_log(config, now, sessions, opened);
        self.server = server;
        self.forward_log = Some(log);
        self.forward_log_recovery = recovered;
    }

    /// Carry out the forward log's batches and report each; whether there was any.
    pub(super) fn persist_forwards(&mut self, now: Time) -> bool {
        let Some(log) = self.forward_log.as_mut() else {
            return false;
        };
        let mut persisted = false;
        while let Some(batch) = self.server.poll_persist() {
            log.persist_batch(&batch.work);
            self.server.on_persisted(now, batch.number);
            persisted = true;
        }
        persisted
    }

    /// Server `server_id`, new, polling `devices` for what they logged, primary of
    /// `replicas` (if any).
    pub(super) fn new(
        server_id: u16,
        devices: &[SocketAddr],
        replicas: Vec<SocketAddr>,
    ) -> ServerNode {
        let mut config = ServerConfig::new(server_id, devices.to_vec());
        config.replicas = replicas;
        let mut node = ServerNode {
            server: Server::new(config.clone(), Time::ZERO, Vec::new()),
            app: ServerApp::default(),
            config,
            up: true,
            restart_count: 0,
            store_full: false,
            deferred_count: 0,
            skipped_before_restart: 0,
            lost: false,
            down_since: None,
            command_line: None,
            restarts_in_place: 0,
            boot_kind: 0x5E,
            forward_log: None,
            forward_log_recovery: Default::default(),
            churn_before_restart: SessionChurn::default(),
            store_evictions_at_boot: 0,
            routes_taken_before_restart: 0,
        };
        node.boot(Time::ZERO, Vec::new());
        node
    }
}

/// The boot number of a node's `start`-th process (`kind` tells servers and devices apart):
/// random in production, different for each start here.
pub(super) fn boot_number(kind: u8, id: u16, start: u64) -> u64 {
    // SplitMix64's finalizer: one to one, so every start's number differs.
    let mut z =
        (u64::from(kind) << 56 | u64::from(id) << 40 | start).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The controller of the devices in series ([`World::with_controller`]): the production
/// planner ([`Planner`]) at [`controller_addr`], its plan saved where a deployment keeps it in
/// etcd.
#[derive(Debug)]
pub struct ControllerNode {
    pub planner: Planner,
    /// The plan as last saved ([`Planner::poll_save`]).
    pub saved: Option<Vec<u8>>,
    /// Live devices the planner took out (silent past the suspicion delay though not lost):
    /// each counts as a device lost.
    pub wrongly_suspected: u64,
    /// The planner's configuration: a crashed controller starts again with it, from the
    /// saved plan ([`World::crash_controller`]).
    pub config: PlannerConfig,
    /// The controller's process runs; crashed, it receives nothing and sends nothing, and
    /// what it held in memory (the nodes' statuses, routes not yet sent) is gone.
    pub up: bool,
    /// When a crashed controller starts again (`None`: only when told,
    /// [`World::restart_controller`]).
    pub restart_at: Option<pmnet_proto::Time>,
    /// Crash right after the next save, before any route of that plan goes out, and stay
    /// down this long ([`World::crash_controller_at_next_save`]).
    pub crash_at_next_save: Option<std::time::Duration>,
    /// Crashes, those right after a save, and restarts from the saved plan.
    pub crashes: u64,
    pub crashes_at_save: u64,
    pub restarts: u64,
    /// Devices and servers lost for good while the controller was down (it takes them out
    /// once it is back).
    pub losses_while_down: u64,
    /// What the planners before the last restart counted (a new planner counts from zero).
    pub counters_before: PlannerCounters,
    /// Every epoch any incarnation of the planner saved and sent, with its chains: an epoch
    /// names one plan (checked at every save and every route a device takes).
    pub epochs: std::collections::BTreeMap<u64, Vec<ChainRoute>>,
}

impl ControllerNode {
    /// When the controller is next due to act: the planner's timer, or a crashed
    /// controller's restart.
    pub fn next_timeout(&self, now: pmnet_proto::Time) -> Option<pmnet_proto::Time> {
        if self.up {
            Some(self.planner.poll_timeout(now))
        } else {
            self.restart_at
        }
    }

    /// What every incarnation of the planner counted.
    pub fn counters(&self) -> PlannerCounters {
        let (now, before) = (self.planner.counters(), self.counters_before);
        PlannerCounters {
            statuses: now.statuses + before.statuses,
            routes_sent: now.routes_sent + before.routes_sent,
            client_questions: now.client_questions + before.client_questions,
            devices_removed: now.devices_removed + before.devices_removed,
            spares_joined: now.spares_joined + before.spares_joined,
            primaries_replaced: now.primaries_replaced + before.primaries_replaced,
            replicas_removed: now.replicas_removed + before.replicas_removed,
            newer_epochs_heard: now.newer_epochs_heard + before.newer_epochs_heard,
        }
    }
}

#[derive(Debug)]
pub struct ClientNode {
    pub client: Client,
    pub completed: Vec<ClientEvent>,
    /// Cache reads that completed or failed, in order.
    pub reads: Vec<pmnet_proto::ReadEvent>,
    /// The client went away for good (its process ended): it receives nothing and sends
    /// nothing more. `abandoned` are the requests it had in flight then, neither completed
    /// nor reported failed.
    pub gone: bool,
    pub abandoned: Vec<u32>,
    /// The client's process has not started yet: it sends nothing until a test starts it
    /// (the swarm's clients that come and go, each a new session).
    pub arrives_later: bool,
}

impl ClientNode {
    /// Client `index`, in front of a device when there are `devices` (one each in turn),
    /// talking to one of `server_count` servers in turn.
    pub(super) fn new(index: usize, server_count: usize, devices: &[SocketAddr]) -> ClientNode {
        let peer = if devices.is_empty() {
            server_addr(index % server_count)
        } else {
            devices[index % devices.len()]
        };
        let server_id = SERVER_ID + (index % server_count) as u16;
        let session_id = 0x5E55_0000_0000_0000 | (index as u64 + 1);
        ClientNode {
            client: Client::new(ClientConfig::new(session_id, server_id, peer)),
            completed: Vec::new(),
            reads: Vec::new(),
            gone: false,
            abandoned: Vec::new(),
            arrives_later: false,
        }
    }
}

/// The shape of a world.
#[derive(Debug, Clone)]
pub struct Topology {
    pub client_count: usize,
    /// Slot count of each device; empty for clients talking to servers directly.
    pub device_slot_counts: Vec<u32>,
    pub server_count: usize,
    /// The devices are in series (docs/replication.md): clients send to the first, each
    /// device forwards to the next, the last to the servers, and the servers know only the
    /// last. Otherwise each device is in front of every server and clients are spread
    /// over them.
    pub chain: bool,
    /// Replica servers of each server (docs/replication.md, "Replicated servers"): server
    /// `i`'s replicas are `World::replicas[i * k .. (i + 1) * k]`, with server `i`'s id, and
    /// server `i` as their only device. 0: servers are not replicated.
    pub server_replicas: usize,
}

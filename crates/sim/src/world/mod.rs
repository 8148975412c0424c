//! A deterministic world: clients, devices and servers wired through an in-memory network with
//! a virtual clock, after quinn's `Pair`. No sockets, no threads, no sleeping.
//!
//! Devices persist into a real [`PmLog`] on a [`SimRegion`], so a device can crash and reopen
//! its log from what the crash model says survived. Servers apply requests through a
//! [`ServerApp`] that records what was applied (the durable record a test checks) and, when
//! asked, applies them to a real [`KvStore`] on a [`SimRegion`] as well.
//!
//! The world's parts: `nodes` (addresses, the nodes and their application), `network` (the
//! world's use of the one [`Network`] every world runs on: datagrams in flight, their faults,
//! the trace), `outputs` (what the nodes emit after each event) and `trace` (how the world's
//! events read, and its notes in the network's trace). This file builds a world and drives
//! it.

mod controller;
mod network;
mod nodes;
mod outputs;
mod trace;

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_pm::{PmLog, SimRegion};
use pmnet_proto::route::{ChainSpec, FollowerConfig, Planner, PlannerConfig};
use pmnet_proto::{Client, ClientConfig, ClientEvent, Device, FrontFunction, Time};
use pmnet_store::{KvConfig, KvStore};
use pmnet_wire::route::Role;
use pmnet_wire::PacketType;

use crate::network::{Delay, Network};
pub use crate::network::{Faults, Seen};
use nodes::boot_number;
pub use nodes::{
    client_addr, controller_addr, device_addr, node_name, replica_addr, server_addr, ClientNode,
    ControllerNode, DeviceNode, ServerApp, ServerNode, SessionChurn, Topology, DEVICE_ID,
    SERVER_ID, SLOT_SIZE,
};

pub use crate::network::SIM_EPOCH_MS;

/// Events at one virtual time past which a world is livelocked.
const EVENTS_AT_ONE_TIME_MAX: u64 = 1_000_000;

/// Between two statuses of a device or server that follows the controller
/// ([`World::with_controller`]).
pub const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// How long the controller waits without a device's status before it takes the device out of
/// its chain: twenty statuses, each lost with at most the network's loss and corruption
/// (about a third: all twenty lost about once in 3·10⁹ windows), and four thousand times the
/// longest delay. No partition cuts the controller off (the main world's partitions are
/// between a device and a client or a server), no device is down for longer than its crash
/// (restarted at once): only a device lost for good stays silent.
pub const SUSPECT_AFTER: Duration = Duration::from_secs(2);
/// How long the controller waits without a server's status (a primary's or a replica's, on
/// a chain with replica servers) before it replaces the primary by the replica furthest along
/// or takes the replica out.
pub const SERVER_SUSPECT_AFTER: Duration = Duration::from_secs(4);
/// On a world with [`World::restart_servers_after`] (the swarm's chains with replica
/// servers), a crashed server or replica is started again after at most this long, as a
/// supervisor restarts a process: it then sends a status at once, so a live server is silent
/// for at most this plus the loss of every status in [`SERVER_SUSPECT_AFTER`] less this
/// (thirty statuses; all lost about once in 2·10¹⁴ at the worst loss and corruption): only a
/// server lost for good is replaced or taken out.
pub const SERVER_DOWN_MAX: Duration = Duration::from_secs(1);

#[allow(missing_debug_implementations)] // holds boxed drop rules
pub struct World {
    pub now: Time,
    /// The wall clock authenticators stamp seals with: [`SIM_EPOCH_MS`] plus `now`, kept in
    /// step by [`World::step`] and [`World::run_for`].
    wall: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Events handled at the current virtual time: past [`EVENTS_AT_ONE_TIME_MAX`] the world
    /// is livelocked (a timer that fires without moving, datagrams answered at once for
    /// ever), a failure, not a hang.
    events_now: (Time, u64),
    /// The network every datagram goes through: its queue, faults, partitions, capture,
    /// counters and the world's trace.
    pub network: Network,
    /// PMNet-ACKs checked against the persistence model (invariant 4).
    pub acks_checked: u64,
    /// The swarm's workload sends keyed updates and cache reads (the devices run the read
    /// cache), and notes each cache read here: (client, read id, the session's requests
    /// issued before it).
    pub keyed: bool,
    pub cache_reads: Vec<(usize, u32, u32)>,
    pub clients: Vec<ClientNode>,
    pub devices: Vec<DeviceNode>,
    pub servers: Vec<ServerNode>,
    /// Replica servers (see [`Topology::server_replicas`]), at [`replica_addr`].
    pub replicas: Vec<ServerNode>,
    /// With devices in series: the devices on the path, in order (as the controller plans
    /// them, when there is one: [`World::with_controller`]).
    pub chain: Vec<usize>,
    /// The controller of the devices in series, if any.
    pub controller: Option<ControllerNode>,
    /// Devices of the chain the swarm may still lose for good: one fewer than the fewest
    /// acks a client waits for, so that every acknowledged update keeps a copy.
    pub device_losses_allowed: usize,
    /// For each server, the replica a controller's route made its primary (at the replica's
    /// own address, [`World::with_controller`]), if one did: see [`World::primary`].
    pub promoted: Vec<Option<usize>>,
    /// A crashed server or replica starts again once it has been down this long (the swarm's
    /// chains with replica servers: [`SERVER_DOWN_MAX`]); `None`: only when told.
    pub restart_servers_after: Option<Duration>,
    /// The swarm's seeds whose controller crashes: convergence also waits for the plan to
    /// have taken every node lost for good out and for every live node to run the plan's
    /// epoch (failover resumed once the controller is back).
    pub plan_must_settle: bool,
}

impl World {
    /// `client_count` clients, one device with `slot_count` slots in front of one server (or
    /// no device), a network delay of 5 µs per hop.
    pub fn new(client_count: usize, slot_count: Option<u32>) -> World {
        World::with_topology(Topology {
            client_count,
            device_slot_counts: slot_count.into_iter().collect(),
            server_count: 1,
            chain: false,
            server_replicas: 0,
        })
    }

    pub fn with_topology(topology: Topology) -> World {
        assert!(topology.server_count >= 1);
        let servers: Vec<(u16, SocketAddr)> = (0..topology.server_count)
            .map(|index| (SERVER_ID + index as u16, server_addr(index)))
            .collect();
        let device_count = topology.device_slot_counts.len();
        let devices: Vec<DeviceNode> = topology
            .device_slot_counts
            .iter()
            .enumerate()
            .map(|(index, &slot_count)| {
                let node = if topology.chain && index + 1 < device_count {
                    // Every server is reached through the next device.
                    let next: Vec<(u16, SocketAddr)> = servers
                        .iter()
                        .map(|&(server_id, _)| (server_id, device_addr(index + 1)))
                        .collect();
                    DeviceNode::new(index, slot_count, &next)
                } else {
                    DeviceNode::new(index, slot_count, &servers)
                };
                if topology.chain && index > 0 {
                    // The device before it, as its operator names it.
                    let previous = servers
                        .iter()
                        .map(|&(server_id, _)| (server_id, device_addr(index - 1)))
                        .collect();
                    node.with_previous_devices(previous)
                } else {
                    node
                }
            })
            .collect();
        let device_addrs: Vec<SocketAddr> = (0..device_count).map(device_addr).collect();
        let (server_side, client_side) = if topology.chain && device_count > 0 {
            (vec![device_addr(device_count - 1)], vec![device_addr(0)])
        } else {
            (device_addrs.clone(), device_addrs)
        };
        let k = topology.server_replicas;
        let replicas: Vec<ServerNode> = servers
            .iter()
            .enumerate()
            .flat_map(|(index, &(server_id, _))| {
                (0..k).map(move |_| ServerNode::new(server_id, &[server_addr(index)], Vec::new()))
            })
            .collect();
        let servers: Vec<ServerNode> = servers
            .iter()
            .enumerate()
            .map(|(index, &(server_id, _))| {
                let replicas = (index * k..(index + 1) * k).map(replica_addr).collect();
                ServerNode::new(server_id, &server_side, replicas)
            })
            .collect();
        let clients = (0..topology.client_count)
            .map(|index| ClientNode::new(index, servers.len(), &client_side))
            .collect();
        let mut world = World {
            now: Time::ZERO,
            wall: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(SIM_EPOCH_MS)),
            events_now: (Time::ZERO, 0),
            network: Network::new(Delay::Latency(Duration::from_micros(5)), node_name),
            acks_checked: 0,
            keyed: false,
            cache_reads: Vec::new(),
            clients,
            devices,
            servers,
            replicas,
            device_losses_allowed: 0,
            promoted: vec![None; topology.server_count],
            restart_servers_after: None,
            plan_must_settle: false,
            controller: None,
            chain: if topology.chain {
                (0..device_count).collect()
            } else {
                Vec::new()
            },
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
        for node in self.servers.iter_mut().chain(&mut self.replicas) {
            let store =
                KvStore::format(SimRegion::new(len), KvConfig::default()).expect("format a store");
            node.app.kv = Some(store);
        }
        self
    }

    /// Give every server (and replica) a session table of `sessions_max`, and its store,
    /// when it has one, room for as many sessions, so that sessions that come and go fill
    /// them and are evicted (docs/protocol.md, "Sessions"). Before anything was sent.
    pub fn with_session_tables(mut self, sessions_max: usize) -> World {
        let config = KvConfig {
            max_sessions: u32::try_from(sessions_max).expect("a small table"),
        };
        for node in self.servers.iter_mut().chain(&mut self.replicas) {
            assert_eq!(
                node.server.counters().requests_applied,
                0,
                "size the tables before the server applies anything"
            );
            node.config.sessions_max = sessions_max;
            node.app.sessions_forgotten = true;
            if let Some(store) = node.app.kv.take() {
                let len = pmnet_pm::PmRegion::len(store.region());
                node.app.kv =
                    Some(KvStore::format(SimRegion::new(len), config).expect("format a store"));
            }
            node.forward_log = None;
            node.boot(self.now, Vec::new());
        }
        self.flush_outputs();
        self
    }

    /// Put the function `new_front` builds in front of every device's log (a fresh one after
    /// each restart).
    pub fn with_front(self, new_front: fn() -> Box<dyn FrontFunction>) -> World {
        self.with_fronts(&[new_front])
    }

    /// Put the functions `new_fronts` build in front of every device's log, in order (fresh
    /// ones after each restart).
    pub fn with_fronts(mut self, new_fronts: &[fn() -> Box<dyn FrontFunction>]) -> World {
        for node in &mut self.devices {
            node.new_fronts = new_fronts.to_vec();
            let device = std::mem::replace(
                node.pipeline.device_mut(),
                Device::new(node.config.clone(), Time::ZERO, Vec::new()),
            );
            node.pipeline = node.pipeline_for(device);
        }
        self
    }

    /// Every device packs what a step sends each server into batches, a batch of update
    /// requests waiting up to `hold` for more (the servers answer in batches); the devices start
    /// again (before anything reached them: nothing is lost).
    pub fn with_batching(mut self, hold: Duration) -> World {
        for node in &mut self.devices {
            node.batch = true;
            node.batch_hold = hold;
            let device = std::mem::replace(
                node.pipeline.device_mut(),
                Device::new(node.config.clone(), Time::ZERO, Vec::new()),
            );
            node.pipeline = node.pipeline_for(device);
        }
        self.flush_outputs();
        self
    }

    /// Authenticate every datagram of every node with `keys` (see `pmnet-auth`): devices,
    /// servers and clients seal what they send and drop what does not verify. The servers
    /// start again (their first recovery poll is sealed too).
    pub fn with_auth(self, keys: pmnet_proto::KeySet) -> World {
        self.with_keys(Some(keys.clone()), Some(keys.clone()), Some(keys))
    }

    /// Give the devices, the servers (and replicas) and the clients each their own keys, or
    /// none: a deployment whose key files do not match. The servers start again.
    pub fn with_keys(
        mut self,
        devices: Option<pmnet_proto::KeySet>,
        servers: Option<pmnet_proto::KeySet>,
        clients: Option<pmnet_proto::KeySet>,
    ) -> World {
        // One prefix for the world; each node's copy derives its own (see `Authenticator`'s
        // `Clone`), so nonces never repeat and a seed replays exactly.
        let clock = self.wall_clock();
        let authenticator = |keys: Option<pmnet_proto::KeySet>| {
            keys.map(|keys| {
                pmnet_proto::Authenticator::with_nonce_prefix(keys, 0x706d_6e65_745f_7369)
                    .with_clock(clock.clone())
            })
        };
        let (auth, server_auth, client_auth) = (
            authenticator(devices),
            authenticator(servers),
            authenticator(clients),
        );
        self.network.clear();
        for node in &mut self.devices {
            node.auth = auth.clone();
            let device = std::mem::replace(
                node.pipeline.device_mut(),
                Device::new(node.config.clone(), Time::ZERO, Vec::new()),
            );
            node.pipeline = node.pipeline_for(device);
        }
        for node in self.servers.iter_mut().chain(&mut self.replicas) {
            node.config.auth = server_auth.clone();
            node.forward_log = None;
            node.boot(self.now, Vec::new());
        }
        for index in 0..self.clients.len() {
            self.reconfigure_client(index, |config| config.auth = client_auth.clone());
        }
        self.flush_outputs();
        self
    }

    /// Put a controller in charge of the devices in series (docs/replication.md, "Automatic
    /// failover"): the production [`Planner`] at [`controller_addr`], with the chain as
    /// configured (and a spare device of `spare_slots` slots, if given, which it puts in
    /// before the server when the chain is short of a device); every device and the server
    /// send it their statuses every [`STATUS_INTERVAL`] and take its routes (a device restarted
    /// in place by the world, as the runtime does; the server replaces its devices itself),
    /// and every client asks it where the chain starts when its updates go unanswered. A
    /// device silent for [`SUSPECT_AFTER`] is taken out of the chain. One server (a device
    /// that follows a controller is in one chain), perhaps with replica servers
    /// (docs/replication.md, "Replicated servers on the controller"): each follows the
    /// controller too (its role a server's, its id the primary's), the plan lists them as the
    /// primary's replicas, and a server silent for [`SERVER_SUSPECT_AFTER`] is replaced (the
    /// primary: by the replica furthest along, the primary now at its own address; see
    /// [`World::primary`]) or taken out (a replica). A server restarts in place when a route
    /// changes its part, as the runtime does. Before anything was sent.
    pub fn with_controller(mut self, spare_slots: Option<u32>) -> World {
        assert!(
            !self.chain.is_empty() && self.servers.len() == 1,
            "a controller plans one chain of devices in series in front of one server"
        );
        let controllers = vec![controller_addr()];
        let server_id = self.servers[0].config.server_id;
        let server = server_addr(0);
        let devices: Vec<(u16, SocketAddr)> = self
            .chain
            .iter()
            .map(|&index| (self.devices[index].config.device_id, device_addr(index)))
            .collect();
        let mut spares = Vec::new();
        if let Some(slot_count) = spare_slots {
            // A device of the same make, in front of the server, in no chain yet.
            let index = self.devices.len();
            let mut node = DeviceNode::new(index, slot_count, &[(server_id, server)]);
            let model = &self.devices[0];
            node.auth = model.auth.clone();
            node.batch = model.batch;
            node.batch_hold = model.batch_hold;
            node.new_fronts = model.new_fronts.clone();
            spares.push((node.config.device_id, device_addr(index)));
            self.devices.push(node);
        }
        self.network.clear();
        for node in &mut self.devices {
            let device_id = node.config.device_id;
            let mut follow = FollowerConfig::new(
                controllers.clone(),
                Role::Device,
                server_id,
                boot_number(0xDE, device_id, node.restart_count),
            );
            follow.device_id = device_id;
            follow.interval = STATUS_INTERVAL;
            node.config.follow = Some(follow);
            node.command_line = Some(node.config.clone());
            node.pipeline =
                node.pipeline_for(Device::new(node.config.clone(), self.now, Vec::new()));
        }
        for (index, node) in self.replicas.iter_mut().enumerate() {
            // Boot numbers of their own (random in production).
            node.boot_kind = 0x60 + index as u8;
        }
        for node in self.servers.iter_mut().chain(&mut self.replicas) {
            let mut follow = FollowerConfig::new(controllers.clone(), Role::Server, server_id, 0);
            follow.interval = STATUS_INTERVAL;
            node.config.follow = Some(follow);
            node.command_line = Some(node.config.clone());
            node.forward_log = None;
            node.boot(self.now, Vec::new());
        }
        for index in 0..self.clients.len() {
            self.reconfigure_client(index, |config| config.controllers = controllers.clone());
        }
        let config = PlannerConfig {
            chains: vec![ChainSpec {
                server_id,
                server,
                devices,
                spares,
                replicas: (0..self.replicas.len()).map(replica_addr).collect(),
            }],
            suspect_after: SUSPECT_AFTER,
            server_suspect_after: SERVER_SUSPECT_AFTER,
            auth: self.servers[0].config.auth.clone(),
        };
        let planner =
            Planner::new(config.clone(), self.now, None).expect("a valid plan of the chain");
        self.controller = Some(ControllerNode {
            planner,
            saved: None,
            wrongly_suspected: 0,
            config,
            up: true,
            restart_at: None,
            crash_at_next_save: None,
            crashes: 0,
            crashes_at_save: 0,
            restarts: 0,
            losses_while_down: 0,
            counters_before: Default::default(),
            epochs: Default::default(),
        });
        self.flush_outputs();
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

    /// A keyed update of `key` (see `Client::keyed_update`).
    pub fn keyed_update(
        &mut self,
        client: usize,
        key: &[u8],
        reply_after: Option<&[u8]>,
        request: &[u8],
    ) -> u32 {
        let now = self.now;
        let seq = self.clients[client]
            .client
            .keyed_update(now, key, reply_after, request)
            .expect("keyed update accepted");
        self.note(&format!("client{client}"), || {
            format!("issue keyed Update seq={seq} ({} bytes)", request.len())
        });
        self.flush_outputs();
        seq
    }

    /// A cache read of `key`; its outcome is in [`World::read_event`].
    pub fn cache_read(&mut self, client: usize, key: &[u8], request: &[u8]) -> u32 {
        let now = self.now;
        let id = self.clients[client]
            .client
            .cache_read(now, key, request)
            .expect("cache read accepted");
        self.note(&format!("client{client}"), || {
            format!("issue cache read id={id}")
        });
        self.flush_outputs();
        id
    }

    /// How cache read `id` of client `client` ended, if it has.
    pub fn read_event(&self, client: usize, id: u32) -> Option<&pmnet_proto::ReadEvent> {
        self.clients[client].reads.iter().find(|read| read.id == id)
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

    fn next_timeout(&self) -> Option<Time> {
        let devices = self.devices.iter().filter(|node| node.up);
        let servers = self
            .servers
            .iter()
            .chain(&self.replicas)
            .filter(|node| node.up);
        devices
            .filter_map(|node| node.pipeline.poll_timeout())
            .chain(servers.filter_map(|node| node.server.poll_timeout()))
            .chain(
                self.clients
                    .iter()
                    .filter(|node| !node.gone)
                    .filter_map(|node| node.client.poll_timeout()),
            )
            .chain((self.controller.as_ref()).and_then(|node| node.next_timeout(self.now)))
            .min()
    }

    /// When the next datagram arrives or the next timer fires.
    pub fn next_event_time(&self) -> Option<Time> {
        let next_packet = self.network.next_due();
        next_packet.into_iter().chain(self.next_timeout()).min()
    }

    /// Deliver the next datagram or fire the next timer, whichever is earlier. False when
    /// nothing is left to do.
    pub fn step(&mut self) -> bool {
        self.restart_overdue_servers();
        let next_packet = self.network.next_due();
        let next_timer = self.next_timeout();
        match (next_packet, next_timer) {
            (None, None) => return false,
            (Some(at), timer) if timer.is_none_or(|timer| at <= timer) => {
                let (at, from, to, bytes) = self.network.pop_next().expect("peeked");
                self.now = self.now.max(at);
                self.sync_wall();
                self.deliver(from, to, &bytes);
            }
            (_, Some(timer)) => {
                self.now = self.now.max(timer);
                self.sync_wall();
                self.fire_timers();
            }
            (Some(_), None) => unreachable!("handled by the guard above"),
        }
        self.flush_outputs();
        if self.events_now.0 == self.now {
            self.events_now.1 += 1;
            assert!(
                self.events_now.1 <= EVENTS_AT_ONE_TIME_MAX,
                "livelock: {EVENTS_AT_ONE_TIME_MAX} events at virtual time {} (the next \
                 timers: {:?}; datagrams queued: {})",
                self.now,
                self.timers_due(),
                self.network.in_flight()
            );
        } else {
            self.events_now = (self.now, 1);
        }
        true
    }

    /// Each node's next timer, named.
    fn timers_due(&self) -> Vec<(String, Time)> {
        let devices = (self.devices.iter().enumerate())
            .filter(|(_, node)| node.up)
            .filter_map(|(index, node)| {
                Some((format!("device {index}"), node.pipeline.poll_timeout()?))
            });
        let servers = (self.servers.iter().enumerate())
            .filter(|(_, node)| node.up)
            .filter_map(|(index, node)| {
                Some((format!("server {index}"), node.server.poll_timeout()?))
            });
        let clients = (self.clients.iter().enumerate())
            .filter(|(_, node)| !node.gone)
            .filter_map(|(index, node)| {
                Some((format!("client {index}"), node.client.poll_timeout()?))
            });
        let controller = (self.controller.as_ref())
            .and_then(|node| Some(("controller".to_string(), node.next_timeout(self.now)?)));
        let mut due: Vec<(String, Time)> = devices
            .chain(servers)
            .chain(clients)
            .chain(controller)
            .collect();
        due.sort_by_key(|(_, at)| *at);
        due.truncate(6);
        due
    }

    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        let now = self.now;
        let up = if let Some(index) = (0..self.servers.len()).find(|i| server_addr(*i) == to) {
            self.servers[index].up
        } else if let Some(index) = (0..self.replicas.len()).find(|i| replica_addr(*i) == to) {
            self.replicas[index].up
        } else if let Some(index) = (0..self.devices.len()).find(|i| device_addr(*i) == to) {
            self.devices[index].up
        } else if to == controller_addr() {
            self.controller.as_ref().is_none_or(|node| node.up)
        } else {
            true
        };
        let fate = if up { "" } else { " [lost: the node is down]" };
        self.network.note_recv(now, from, to, bytes, fate);
        if let Some(node) = (0..self.servers.len()).find(|i| server_addr(*i) == to) {
            let node = &mut self.servers[node];
            if node.up {
                node.server.handle(now, from, bytes);
            }
        } else if let Some(node) = (0..self.replicas.len()).find(|i| replica_addr(*i) == to) {
            let node = &mut self.replicas[node];
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
        } else if to == controller_addr() {
            if let Some(node) = self.controller.as_mut().filter(|node| node.up) {
                node.planner.handle(now, from, bytes);
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
        let servers = self.servers.iter_mut().chain(&mut self.replicas);
        for node in servers.filter(|node| node.up) {
            if node.server.poll_timeout().is_some_and(|t| t <= now) {
                node.server.handle_timeout(now);
            }
        }
        for node in self.clients.iter_mut().filter(|node| !node.gone) {
            if node.client.poll_timeout().is_some_and(|t| t <= now) {
                node.client.handle_timeout(now);
            }
        }
        if let Some(node) = self.controller.as_mut() {
            if !node.up {
                if node.restart_at.is_some_and(|at| at <= now) {
                    self.restart_controller_now();
                }
            } else if node.planner.poll_timeout(now) <= now {
                node.planner.handle_timeout(now);
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
        self.sync_wall();
    }

    fn sync_wall(&mut self) {
        self.wall.store(
            SIM_EPOCH_MS + self.now.as_nanos() / 1_000_000,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The wall clock of the simulated world (Unix milliseconds), for authenticators.
    pub fn wall_clock(&self) -> pmnet_auth::WallClock {
        let wall = self.wall.clone();
        std::sync::Arc::new(move || wall.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Every datagram of `packet_type` seen so far.
    pub fn seen_of(&self, packet_type: PacketType) -> Vec<&Seen> {
        self.network
            .seen
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
        node.acks_sent_direct_before_restart += node.device().counters().acks_sent_direct;
        if let Some(command_line) = &node.command_line {
            // A new process, from its command line: the routes it took are forgotten, and it
            // has a new boot number (the controller sends it the route again).
            let mut config = command_line.clone();
            if let Some(follow) = config.follow.as_mut() {
                follow.boot = boot_number(0xDE, config.device_id, node.restart_count + 1);
            }
            node.config = config;
        }
        node.pipeline = node.pipeline_for(Device::new(node.config.clone(), now, recovery.entries));
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
        self.servers[index].down_since = Some(self.now);
        self.note_by(&format!("server{index}"), "down (crashed)");
    }

    /// Start server `index` again (a new process) from its application's durable state.
    pub fn start_server(&mut self, index: usize) {
        let now = self.now;
        let node = &mut self.servers[index];
        node.skipped_before_restart += node.server.counters().sequence_numbers_skipped;
        let session_count = node.restart(now);
        self.note_by(
            &format!("server{index}"),
            &format!(
                "started: store reopened, {session_count} sessions recovered; polling devices"
            ),
        );
        self.flush_outputs();
    }

    /// Take replica `index` down: it receives nothing until [`World::start_replica`].
    pub fn stop_replica(&mut self, index: usize) {
        self.replicas[index].up = false;
        self.replicas[index].down_since = Some(self.now);
        self.note_by(&format!("replica{index}"), "down (crashed)");
    }

    /// Start replica `index` again (a new process) from its application's durable state.
    pub fn start_replica(&mut self, index: usize) {
        let now = self.now;
        let node = &mut self.replicas[index];
        node.skipped_before_restart += node.server.counters().sequence_numbers_skipped;
        node.restart(now);
        self.note_by(&format!("replica{index}"), "started: store reopened");
        self.flush_outputs();
    }

    /// Server `server`'s primary is lost for good (its store with it); its replica `replica`
    /// takes its place — its store, at the primary's address, which its devices and the other
    /// replicas know — and the other live replicas of `server` stay its replicas. Replica
    /// `replica` is down for good afterwards (its store moved).
    pub fn promote_replica(&mut self, server: usize, replica: usize) {
        let now = self.now;
        let app = std::mem::take(&mut self.replicas[replica].app);
        let forward_log = self.replicas[replica].forward_log.take();
        self.replicas[replica].up = false;
        self.replicas[replica].lost = true;
        let node = &mut self.servers[server];
        node.config
            .replicas
            .retain(|&addr| addr != replica_addr(replica));
        node.app = app;
        node.skipped_before_restart = 0;
        // The lost primary's forward log is gone with it; the replica's comes along.
        node.forward_log = forward_log;
        node.restart(now);
        self.note_by(
            &format!("server{server}"),
            &format!("lost for good; replica{replica} promoted in its place"),
        );
        self.flush_outputs();
    }

    /// Device `index` is lost for good: its log is gone and it never starts again. Nothing
    /// else changes: the controller ([`World::with_controller`]) takes it out of its chain
    /// once it has been silent for [`SUSPECT_AFTER`], and every node follows its routes.
    pub fn lose_device(&mut self, index: usize) {
        self.note_loss_while_controller_down();
        let now = self.now;
        let node = &mut self.devices[index];
        assert!(!node.lost, "device {index} is lost once");
        node.up = false;
        node.lost = true;
        let (slot_count, slot_size) = (node.log.slot_count(), node.log.slot_size());
        let region_len = PmLog::<SimRegion>::required_region_len(slot_count, slot_size);
        node.log = PmLog::format(SimRegion::new(region_len), slot_count, slot_size)
            .expect("format a device log");
        node.held.clear();
        node.hold_persistence = false;
        node.acks_sent_direct_before_restart += node.device().counters().acks_sent_direct;
        node.pipeline = node.pipeline_for(Device::new(node.config.clone(), now, Vec::new()));
        let text = if self.controller.is_some() {
            format!(
                "lost for good (log gone, never restarted); the controller takes it out of the \
                 chain once it has been silent for {SUSPECT_AFTER:?}"
            )
        } else {
            "lost for good (log gone, never restarted)".to_string()
        };
        self.note_by(&format!("device{index}"), &text);
    }

    /// The devices of the chain that are not lost, in order, as the controller plans it.
    pub fn live_chain(&self) -> Vec<usize> {
        (self.chain.iter().copied())
            .filter(|&index| !self.devices[index].lost)
            .collect()
    }

    /// Server `server`'s primary now: the server itself, or the replica a controller's route
    /// promoted in its place ([`World::promoted`]).
    pub fn primary(&self, server: usize) -> &ServerNode {
        match self.promoted[server] {
            Some(replica) => &self.replicas[replica],
            None => &self.servers[server],
        }
    }

    pub fn primary_mut(&mut self, server: usize) -> &mut ServerNode {
        match self.promoted[server] {
            Some(replica) => &mut self.replicas[replica],
            None => &mut self.servers[server],
        }
    }

    /// Server `server`'s replicas (indexes into [`World::replicas`]) that are neither lost
    /// nor its primary now.
    pub fn live_replicas(&self, server: usize) -> Vec<usize> {
        let per_server = self.replicas.len() / self.servers.len();
        (server * per_server..(server + 1) * per_server)
            .filter(|&replica| !self.replicas[replica].lost)
            .filter(|&replica| self.promoted[server] != Some(replica))
            .collect()
    }

    /// Server `server`'s primary now is lost for good: its store and forward log are gone
    /// and it never starts again. Nothing else changes: the controller
    /// ([`World::with_controller`]) replaces it by the replica furthest along once it has been
    /// silent for [`SERVER_SUSPECT_AFTER`], and every node follows its routes.
    pub fn lose_server(&mut self, server: usize) {
        self.note_loss_while_controller_down();
        let (actor, node) = match self.promoted[server] {
            Some(replica) => (format!("replica{replica}"), &mut self.replicas[replica]),
            None => (format!("server{server}"), &mut self.servers[server]),
        };
        assert!(!node.lost, "{actor} is lost once");
        Self::lose_server_node(node);
        self.note_by(
            &actor,
            &format!(
                "primary lost for good (store and forward log gone, never restarted); the \
                 controller replaces it once it has been silent for {SERVER_SUSPECT_AFTER:?}"
            ),
        );
    }

    /// Replica `index` (not a primary) is lost for good: the controller takes it out of its
    /// primary's list once it has been silent for [`SERVER_SUSPECT_AFTER`].
    pub fn lose_replica(&mut self, index: usize) {
        self.note_loss_while_controller_down();
        let node = &mut self.replicas[index];
        assert!(!node.lost, "replica{index} is lost once");
        Self::lose_server_node(node);
        self.note_by(
            &format!("replica{index}"),
            &format!(
                "lost for good (store and forward log gone, never restarted); the controller \
                 takes it out once it has been silent for {SERVER_SUSPECT_AFTER:?}"
            ),
        );
    }

    /// A node lost for good while the controller is down: counted (it is taken out once the
    /// controller is back).
    fn note_loss_while_controller_down(&mut self) {
        if let Some(node) = self.controller.as_mut().filter(|node| !node.up) {
            node.losses_while_down += 1;
        }
    }

    fn lose_server_node(node: &mut ServerNode) {
        node.up = false;
        node.lost = true;
        node.down_since = None;
        node.forward_log = None;
        node.app = ServerApp::default();
    }

    /// Start every server and replica (not lost) down for longer than
    /// [`World::restart_servers_after`].
    fn restart_overdue_servers(&mut self) {
        let Some(after) = self.restart_servers_after else {
            return;
        };
        let now = self.now;
        let overdue = |node: &ServerNode| {
            !node.up && !node.lost && node.down_since.is_some_and(|since| now - since >= after)
        };
        for index in 0..self.servers.len() {
            if overdue(&self.servers[index]) {
                self.start_server(index);
            }
        }
        for index in 0..self.replicas.len() {
            if overdue(&self.replicas[index]) {
                self.start_replica(index);
            }
        }
    }

    /// Sequence numbers of `session_id` applied by any server (each server's primary now),
    /// in order.
    pub fn applied_seqs(&self, session_id: u64) -> Vec<u32> {
        (0..self.servers.len())
            .map(|server| self.primary(server))
            .flat_map(|node| &node.app.applied)
            .filter(|(s, ..)| *s == session_id)
            .map(|(_, seq, ..)| *seq)
            .collect()
    }
}

//! Replicated memory's world as one seed sets it up: 3 or 5 memory nodes (each a
//! `MemNodeFunction` in a device's pipeline over its lines on simulated persistent memory), the
//! coordinating device (`AbdFunction` in a device's pipeline) with 1–3 client sessions through
//! it, 1–3 client-driven coordinators, the network with keys and the replaying attacker.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_abd::{
    AbdClient, AbdFunction, ClientConfig, Coordinator, CoordinatorConfig, MemNode, MemNodeFunction,
    NodeConfig, LEARN_WAIT, LINE,
};
use pmnet_lincheck::{Operation, RegisterInput, RegisterOutput};
use pmnet_pm::SimRegion;
use pmnet_pmtable::{Geometry, Table, TableFile};
use pmnet_proto::{PersistBatch, RegionWrite, Time};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::stores_checker::Stores;
use super::{AbdReport, LINES};
use crate::function_host::FunctionHost;
use crate::network::{Attacker, Network, NetworkKeys};
use crate::world::{node_name, SIM_EPOCH_MS};

/// How long the faults last (virtual time, after the group formed).
pub(super) const SAFETY: Duration = Duration::from_secs(3);
/// A batch of line writes takes 1 µs to this long to be durable (each after the one before):
/// as long as a datagram's way at times, so that a crash finds stores not yet durable.
const PERSIST_MAX_US: u64 = 300;
/// The device's writer id; client-driven coordinators take 2, 3, ...
const DEVICE_WRITER: u16 = 1;

pub(super) fn node_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 7, index as u8 + 1], 7800))
}

pub(super) fn device_addr() -> SocketAddr {
    SocketAddr::from(([10, 0, 7, 100], 7900))
}

pub(super) fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 8, index as u8 + 1], 41000))
}

fn geometry() -> Geometry {
    Geometry {
        buckets: LINES + 1,
        key_max: 4,
        value_max: LINE as u16,
    }
}

/// A memory node as `pmnet memnode` runs it: [`MemNodeFunction`] in a device's pipeline, its
/// line writes carried out on its region by the device's front executor.
pub(super) struct Node {
    pub(super) host: FunctionHost<MemNodeFunction>,
    pub(super) up: bool,
    pub(super) restart_at: Option<Time>,
    /// Restart on a new, empty table (the memory was lost).
    pub(super) restart_empty: bool,
    /// Batches of line writes under way: each durable at its time, in order.
    pub(super) persisting: VecDeque<(Time, PersistBatch<RegionWrite>)>,
    /// Whether the node was a member when last looked at (to count joins).
    pub(super) was_member: bool,
}

impl Node {
    pub(super) fn node(&self) -> &MemNode {
        self.host.function().node()
    }
}

/// A client: a session through the device, or a coordinator of its own.
pub(super) enum Engine {
    Device(AbdClient),
    Direct(Coordinator),
}

pub(super) struct Client {
    pub(super) engine: Engine,
    /// Operations this client keeps in flight at most.
    pub(super) depth: usize,
    pub(super) next_at: Time,
    /// Operations in flight by token.
    pub(super) in_flight: HashMap<u64, InFlight>,
    /// Operations to run once healed (the liveness check), not yet started.
    pub(super) final_ops: u32,
}

pub(super) struct InFlight {
    pub(super) first: u32,
    pub(super) count: u16,
    /// The values written, one per line (empty for a read).
    pub(super) values: Vec<u64>,
    pub(super) call: u64,
    /// Started once healed with every node a member: must complete.
    pub(super) must_complete: bool,
}

pub(super) type History = Vec<(u32, Operation<RegisterInput<u64>, RegisterOutput<u64>>)>;

/// One seed's world.
pub(super) struct AbdWorld {
    pub(super) rng: ChaCha8Rng,
    /// Device clients starting over with new sessions, from a generator of its own.
    pub(super) churn: ChaCha8Rng,
    /// Virtual time.
    pub(super) now: Time,
    pub(super) network: Network,
    pub(super) tolerated: usize,
    pub(super) device_clients: usize,
    pub(super) direct_clients: usize,
    pub(super) report: AbdReport,
    pub(super) nodes: Vec<Node>,
    /// The coordinating device as `pmnet device --abd-node` runs it: [`AbdFunction`] in a
    /// device's pipeline (it persists nothing).
    pub(super) device: FunctionHost<AbdFunction>,
    pub(super) device_up: bool,
    pub(super) device_restart_at: Option<Time>,
    pub(super) clients: Vec<Client>,
    pub(super) stores: Stores,
    pub(super) history: History,
    pub(super) next_value: u64,
    pub(super) next_token: u64,
    /// Each line's highest timestamp of a write answered ok.
    pub(super) acked: [u64; LINES as usize],
    /// When the group formed (the safety phase began), once it did.
    pub(super) start: Option<Time>,
    pub(super) faults: Vec<(Time, u8)>,
    pub(super) end_of_safety: Time,
    pub(super) healed: bool,
    /// A node that became a member (after learning) in this step.
    pub(super) joined: Option<usize>,
}

fn node_config(index: usize, nodes: usize) -> NodeConfig {
    NodeConfig {
        peers: (0..nodes)
            .filter(|other| *other != index)
            .map(node_addr)
            .collect(),
        lines: LINES,
        // The nodes' clocks: the world's wall clock at its time zero (a node's bound on a
        // stored counter moves only with its start, which is conservative by the run's length).
        counter_clock: Some(pmnet_abd::counter_floor_at(SIM_EPOCH_MS * 1_000)),
    }
}

/// Node `index`'s pipeline over `table`, persisting on `region`, started at `now` with its
/// keys from `network`.
pub(super) fn node_host(
    index: usize,
    nodes: usize,
    table: Table,
    region: SimRegion,
    now: Time,
    network: &mut Network,
) -> FunctionHost<MemNodeFunction> {
    let node = MemNode::new(node_config(index, nodes), table, now);
    let auth = network.pipeline_keys(now, node_addr(index));
    FunctionHost::new(MemNodeFunction::new(node, geometry()), Some(region), auth)
}

/// Node `index` on a new, empty table.
pub(super) fn fresh_node(
    index: usize,
    nodes: usize,
    now: Time,
    network: &mut Network,
) -> Result<FunctionHost<MemNodeFunction>, String> {
    let file = TableFile::format(SimRegion::new(geometry().region_len()), geometry())
        .map_err(|error| format!("format: {error}"))?;
    Ok(node_host(
        index,
        nodes,
        Table::new_direct(geometry()),
        file.into_region(),
        now,
        network,
    ))
}

/// The device, started at `now` with session `session`. It stamps above its clock's counter
/// floor, as a process starts it: a restarted device's counters are above its earlier lives'
/// (whose stores may sit on nodes its first majority does not include).
pub(super) fn device_host(
    nodes: usize,
    session: u64,
    now: Time,
    network: &mut Network,
) -> FunctionHost<AbdFunction> {
    let addrs = (0..nodes).map(node_addr).collect();
    let mut config = CoordinatorConfig::new(addrs, LINES, DEVICE_WRITER, session);
    config.counter_floor =
        pmnet_abd::counter_floor_at((SIM_EPOCH_MS + now.as_nanos() / 1_000_000) * 1_000);
    let auth = network.pipeline_keys(now, device_addr());
    FunctionHost::new(AbdFunction::new(Coordinator::new(config)), None, auth)
}

/// Send what `from` emits, noting every store a coordinator sends.
pub(super) fn send_all(
    from: SocketAddr,
    now: Time,
    network: &mut Network,
    stores: &mut Stores,
    transmits: impl IntoIterator<Item = pmnet_proto::Transmit>,
) {
    for transmit in transmits {
        match network.observe(now, &transmit.bytes) {
            Some(plain) => stores.note(now, &plain),
            None => stores.unreadable += 1,
        }
        network.send(now, from, transmit.destination, transmit.bytes);
    }
}

/// Hand the node's new batches to its persistent memory, complete those due, send what it
/// has to send.
pub(super) fn flush_node(
    node: &mut Node,
    index: usize,
    now: Time,
    network: &mut Network,
    rng: &mut ChaCha8Rng,
) {
    while let Some(batch) = node.host.poll_persist() {
        let after = node.persisting.back().map_or(now, |(at, ..)| *at);
        let at = after.max(now) + Duration::from_micros(rng.random_range(1..PERSIST_MAX_US));
        node.persisting.push_back((at, batch));
    }
    while node.persisting.front().is_some_and(|(at, ..)| *at <= now) {
        let (_, batch) = node.persisting.pop_front().expect("checked");
        node.host.persist(now, batch);
    }
    while let Some(transmit) = node.host.poll_transmit() {
        network.send(now, node_addr(index), transmit.destination, transmit.bytes);
    }
}

impl AbdWorld {
    /// Seed `seed`'s world at time zero: every node empty, about to form the group. Its trace
    /// keeps its lines when `keep` (`Some(false)`: without the datagram lines).
    pub(super) fn new(seed: u64, keep: Option<bool>) -> Result<AbdWorld, String> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let loss = rng.random_range(0.0..0.1);
        let duplicate = rng.random_range(0.0..0.05);
        let mut network = Network::uniform(seed ^ 0xabd0, loss, duplicate, node_name);
        // Keys on every endpoint; an attacker replaying what it captured.
        network.keys = Some(NetworkKeys::for_seed(seed));
        let node_count = if rng.random_bool(0.5) { 3 } else { 5 };
        let device_clients = rng.random_range(1..=3usize);
        let direct_clients = rng.random_range(1..=3usize);
        if let Some(datagrams) = keep {
            network.trace.keep(datagrams);
        }
        network.trace.note(Time::ZERO, "sim", || {
            format!(
                "seed {seed}: {node_count} memory nodes, {device_clients} clients through the \
                 device, {direct_clients} client-driven; loss {:.1}%, duplication {:.1}%, \
                 delay 10-400 us",
                loss * 100.0,
                duplicate * 100.0
            )
        });
        let mut nodes = Vec::with_capacity(node_count);
        for index in 0..node_count {
            nodes.push(Node {
                host: fresh_node(index, node_count, Time::ZERO, &mut network)?,
                up: true,
                restart_at: None,
                restart_empty: false,
                persisting: VecDeque::new(),
                was_member: false,
            });
        }
        let device = device_host(node_count, rng.random(), Time::ZERO, &mut network);
        let clients = new_clients(&mut rng, node_count, device_clients, direct_clients);
        network.attacker = Some(attacker(seed, node_count, clients.len()));
        Ok(AbdWorld {
            rng,
            churn: ChaCha8Rng::seed_from_u64(seed ^ 0xc4_abd0),
            now: Time::ZERO,
            network,
            tolerated: (node_count - 1) / 2,
            device_clients,
            direct_clients,
            report: AbdReport {
                seed,
                nodes: node_count as u64,
                device_clients: device_clients as u64,
                direct_clients: direct_clients as u64,
                ..AbdReport::default()
            },
            nodes,
            device,
            device_up: true,
            device_restart_at: None,
            clients,
            stores: Stores::default(),
            history: Vec::new(),
            next_value: 0,
            next_token: 1,
            acked: [0; LINES as usize],
            start: None,
            faults: Vec::new(),
            end_of_safety: Time::ZERO,
            healed: false,
            joined: None,
        })
    }

    /// Whether the group formed (the safety phase began).
    pub(super) fn running(&self) -> bool {
        self.start.is_some()
    }

    /// Past the safety phase: the faults heal.
    pub(super) fn healing(&self) -> bool {
        self.running() && self.now >= self.end_of_safety
    }

    /// Before the safety phase: once every node is a member (each learnt that no other holds
    /// a line), the faults are scheduled and the clients start.
    pub(super) fn form_group(&mut self) -> Result<(), String> {
        let now = self.now;
        if self.start.is_some() {
            return Ok(());
        }
        if !self.nodes.iter().all(|node| node.node().is_member()) {
            let formed_by = Time::ZERO + LEARN_WAIT + Duration::from_millis(200);
            if now > formed_by {
                return Err(format!("{now}: the group did not form"));
            }
            return Ok(());
        }
        self.start = Some(now);
        for node in &mut self.nodes {
            node.was_member = true;
        }
        self.end_of_safety = now + SAFETY;
        let rng = &mut self.rng;
        self.faults = (0..rng.random_range(2..10))
            .map(|_| {
                let at = rng.random_range(1..SAFETY.as_millis() as u64);
                (now + Duration::from_millis(at), rng.random_range(0..11u8))
            })
            .collect();
        self.faults.sort();
        for client in &mut self.clients {
            client.next_at = now + Duration::from_micros(self.rng.random_range(0..2000));
        }
        let faults = format!("{:?}", self.faults);
        self.note("sim", || format!("the group formed; faults at {faults}"));
        Ok(())
    }

    /// The coordinators' and nodes' counters, into the report.
    pub(super) fn count_state_machines(&mut self) {
        let counters = self.device.function().coordinator().counters();
        self.report.write_backs += counters.write_backs;
        self.report.reads_one_phase += counters.reads_one_phase;
        for client in &self.clients {
            if let Engine::Direct(coordinator) = &client.engine {
                self.report.write_backs += coordinator.counters().write_backs;
                self.report.reads_one_phase += coordinator.counters().reads_one_phase;
            }
        }
        for node in &self.nodes {
            self.report.lines_learnt += node.node().counters().sync_lines_taken;
        }
        self.report.replays_refused += self.device.function().counters().replays_refused;
        if let Some(attacker) = &self.network.attacker {
            self.report.replayed = attacker.replayed;
            self.report.replayed_past_window = attacker.replayed_past_window;
            self.report.replay_bursts = attacker.bursts_after_restarts;
        }
        self.report.stale_dropped += self.network.keys.as_ref().map_or(0, NetworkKeys::stale);
        self.report.stale_dropped += self.device.stale_dropped();
        for node in &self.nodes {
            self.report.stale_dropped += node.host.stale_dropped();
        }
    }
}

/// The clients: `device_clients` sessions through the device, then `direct_clients`
/// client-driven coordinators (writer ids 2, 3, ...; they never restart and count from 0),
/// each keeping one or two operations in flight.
fn new_clients(
    rng: &mut ChaCha8Rng,
    node_count: usize,
    device_clients: usize,
    direct_clients: usize,
) -> Vec<Client> {
    (0..device_clients + direct_clients)
        .map(|index| {
            let engine = if index < device_clients {
                Engine::Device(AbdClient::new(ClientConfig::new(
                    device_addr(),
                    rng.random(),
                )))
            } else {
                let writer = DEVICE_WRITER + 1 + (index - device_clients) as u16;
                Engine::Direct(Coordinator::new(CoordinatorConfig::new(
                    (0..node_count).map(node_addr).collect(),
                    LINES,
                    writer,
                    rng.random(),
                )))
            };
            Client {
                engine,
                depth: if rng.random_bool(0.7) { 1 } else { 2 },
                next_at: Time::ZERO,
                in_flight: HashMap::new(),
                final_ops: 2,
            }
        })
        .collect()
}

/// The attacker: it replays client requests first, and spares stores and their acks unless
/// `PMNET_ABD_REPLAY_STORES` is set (docs/simulation.md, "What is not modelled").
fn attacker(seed: u64, node_count: usize, clients: usize) -> Attacker {
    let endpoints: Vec<SocketAddr> = (0..node_count)
        .map(node_addr)
        .chain((0..clients).map(client_addr))
        .chain([device_addr()])
        .collect();
    let mut attacker =
        Attacker::replaying(seed, (0..clients).map(client_addr).collect(), endpoints);
    if std::env::var_os("PMNET_ABD_REPLAY_STORES").is_none() {
        attacker.spared_types = vec![pmnet_wire::abd::ABD_STORE, pmnet_wire::abd::ABD_STORE_ACK];
    }
    attacker
}

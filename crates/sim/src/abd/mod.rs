//! The replicated memory's world (docs/simulation.md, "Replicated memory"): the production
//! state machines of `pmnet-abd` — memory nodes over their direct-mapped tables on the
//! simulated persistent memory, a coordinating device ([`AbdFunction`]) with client sessions
//! through it ([`AbdClient`]), and client-driven coordinators ([`Coordinator`] in the client,
//! each with its own writer id), all at once on one memory of 16 lines (8 of them contended,
//! 8 rarely touched) — on the chain store's network (loss, duplication, reordering,
//! partitions). One seed decides everything.
//!
//! Faults: memory node crashes (the batches of line writes under way cut at random; every
//! unfenced line kept, lost or torn) and restarts on what the crash left; a node's memory lost
//! for good (it restarts on a new, empty table and must learn); partitions; device restarts
//! (the coordinator's operations and its sessions' memory lost). At most a minority of the
//! nodes are down, learning or cut off at once, except in a power failure: every node crashes
//! at once, its persistent memory kept.
//!
//! Checked: every line's history is linearizable (`pmnet-lincheck`'s register; a multi-line
//! operation is one operation per line with its call and return times; an operation that
//! failed "unavailable" or "in doubt" may or may not have taken effect); one timestamp is
//! never stored with two values of a line; after every crash, when a node joins and at the
//! end, each node's durable line is one a coordinator stored with that timestamp (a line and
//! its timestamp are never torn apart); when a node joins after learning, each line's highest
//! acknowledged timestamp (or a higher one) is durable on enough of the nodes with memory that
//! every majority of them includes one (`checks::durable_on_majority`), and at the end, on a
//! majority of the nodes; once the faults heal, every node is a member again and every client's next
//! operations complete.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use crate::world::SIM_EPOCH_MS;
use pmnet_abd::{
    AbdClient, AbdError, AbdFunction, ClientConfig, Coordinator, CoordinatorConfig, MemNode,
    MemNodeFunction, NodeConfig, OpKind, LEARN_WAIT, LINE,
};
use pmnet_lincheck::{check_by_key, Operation, Register, RegisterInput, RegisterOutput, PENDING};
use pmnet_pm::SimRegion;
use pmnet_pmtable::{Geometry, Table, TableFile};
use pmnet_proto::{PersistBatch, RegionWrite, Time};
use pmnet_wire::Header;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::function_host::FunctionHost;
use crate::net::Net;
use crate::net_attacker::{NetAuth, Replayer};

mod checks;
mod report;

use checks::{durable_on_majority, Stores};
pub use report::AbdReport;

/// Lines of the memory: [`HOT`] that clients contend for, the rest written and read rarely
/// (so that a line's latest write can sit on a bare majority for a while: what a node that
/// lost its memory must learn from the others).
pub const LINES: u32 = 16;
/// Lines `0 .. HOT` take nearly every operation.
const HOT: u32 = 8;
/// Of the operations, those on the lines past [`HOT`].
const COLD_SHARE: f64 = 0.004;
/// How long the faults last (virtual time, after the group formed).
const SAFETY: Duration = Duration::from_secs(3);
/// Once healed: every node a member and every client's operations in flight done within this.
const LIVENESS_BOUND: Duration = Duration::from_secs(15);
/// A batch of line writes takes 1 µs to this long to be durable (each after the one before):
/// as long as a datagram's way at times, so that a crash finds stores not yet durable.
const PERSIST_MAX_US: u64 = 300;
/// The device's writer id; client-driven coordinators take 2, 3, ...
const DEVICE_WRITER: u16 = 1;

fn node_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 7, index as u8 + 1], 7800))
}

fn device_addr() -> SocketAddr {
    SocketAddr::from(([10, 0, 7, 100], 7900))
}

fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 8, index as u8 + 1], 41000))
}

fn geometry() -> Geometry {
    Geometry {
        buckets: LINES + 1,
        key_max: 4,
        value_max: LINE as u16,
    }
}

/// The bytes of a line holding `value`: its 8 bytes, 8 times (0 is the line every node
/// starts with).
fn line_bytes(value: u64) -> [u8; LINE] {
    let mut line = [0; LINE];
    for chunk in line.chunks_mut(8) {
        chunk.copy_from_slice(&value.to_be_bytes());
    }
    line
}

/// The value a line's bytes hold, if they are a line some write wrote.
fn line_value(bytes: &[u8]) -> Option<u64> {
    let value = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    (bytes.len() == LINE && bytes == line_bytes(value)).then_some(value)
}

/// A memory node as `pmnet memnode` runs it: [`MemNodeFunction`] in a device's pipeline, its
/// line writes carried out on its region by the device's front executor.
struct Node {
    host: FunctionHost<MemNodeFunction>,
    up: bool,
    restart_at: Option<Time>,
    /// Restart on a new, empty table (the memory was lost).
    restart_empty: bool,
    /// Batches of line writes under way: each durable at its time, in order.
    persisting: VecDeque<(Time, PersistBatch<RegionWrite>)>,
    /// Whether the node was a member when last looked at (to count joins).
    was_member: bool,
}

/// A client: a session through the device, or a coordinator of its own.
enum Engine {
    Device(AbdClient),
    Direct(Coordinator),
}

struct Client {
    engine: Engine,
    /// Operations this client keeps in flight at most.
    depth: usize,
    next_at: Time,
    /// Operations in flight by token.
    in_flight: HashMap<u64, InFlight>,
    /// Operations to run once healed (the liveness check), not yet started.
    final_ops: u32,
}

struct InFlight {
    first: u32,
    count: u16,
    /// The values written, one per line (empty for a read).
    values: Vec<u64>,
    call: u64,
    /// Started once healed with every node a member: must complete.
    must_complete: bool,
}

type History = Vec<(u32, Operation<RegisterInput<u64>, RegisterOutput<u64>>)>;

impl Node {
    fn node(&self) -> &MemNode {
        self.host.function().node()
    }
}

/// The coordinating device as `pmnet device --abd-node` runs it: [`AbdFunction`] in a device's
/// pipeline (it persists nothing).
fn device_host(coordinator: Coordinator) -> FunctionHost<AbdFunction> {
    FunctionHost::new(AbdFunction::new(coordinator), None)
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

/// Node `index`'s pipeline over `table`, persisting on `region`.
fn node_host(
    index: usize,
    nodes: usize,
    table: Table,
    region: SimRegion,
    now: Time,
) -> FunctionHost<MemNodeFunction> {
    let node = MemNode::new(node_config(index, nodes), table, now);
    FunctionHost::new(MemNodeFunction::new(node, geometry()), Some(region))
}

/// Node `index` on a new, empty table.
fn fresh_node(
    index: usize,
    nodes: usize,
    now: Time,
) -> Result<FunctionHost<MemNodeFunction>, String> {
    let file = TableFile::format(SimRegion::new(geometry().region_len()), geometry())
        .map_err(|error| format!("format: {error}"))?;
    Ok(node_host(
        index,
        nodes,
        Table::new_direct(geometry()),
        file.into_region(),
        now,
    ))
}

fn send_all(
    from: SocketAddr,
    net: &mut Net,
    stores: &mut Stores,
    transmits: impl IntoIterator<Item = pmnet_proto::Transmit>,
) {
    for transmit in transmits {
        stores.note(net.now, &transmit.bytes);
        net.send(from, transmit.destination, transmit.bytes);
    }
}

/// The node's process crashes: of its batches of line writes under way, a prefix was started
/// (records stored and flushed, not fenced), and the crash keeps, loses or tears each line of
/// them; it restarts 1–150 ms later on what the crash left.
fn crash(node: &mut Node, now: Time, rng: &mut ChaCha8Rng) -> Result<(), String> {
    let started = rng.random_range(0..=node.persisting.len());
    let cut: Vec<_> = node
        .persisting
        .drain(..)
        .take(started)
        .map(|(_, batch)| batch)
        .collect();
    node.host.crash(&cut, rng);
    node.up = false;
    node.restart_empty = false;
    node.restart_at = Some(now + Duration::from_millis(rng.random_range(1..150)));
    Ok(())
}

/// Hand the node's new batches to its persistent memory, complete those due, send what it
/// has to send.
fn flush_node(node: &mut Node, index: usize, net: &mut Net, rng: &mut ChaCha8Rng) {
    let now = net.now;
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
        net.send(node_addr(index), transmit.destination, transmit.bytes);
    }
}

/// Run one seed; `Err` names what failed.
pub fn run_seed(seed: u64) -> Result<AbdReport, String> {
    run(seed).map_err(|error| format!("seed {seed}: {error}"))
}

fn run(seed: u64) -> Result<AbdReport, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let loss = rng.random_range(0.0..0.1);
    let duplicate = rng.random_range(0.0..0.05);
    let mut net = Net::new(ChaCha8Rng::seed_from_u64(seed ^ 0xabd0), loss, duplicate);
    // Keys on every endpoint; an attacker replaying what it captured; device clients starting
    // over with new sessions (a generator of its own).
    net.auth = Some(NetAuth::for_seed(seed));
    let mut churn = ChaCha8Rng::seed_from_u64(seed ^ 0xc4_abd0);
    let node_count = if rng.random_bool(0.5) { 3 } else { 5 };
    let tolerated = (node_count - 1) / 2;
    let device_clients = rng.random_range(1..=3usize);
    let direct_clients = rng.random_range(1..=3usize);
    let trace = std::env::var_os("PMNET_ABD_TRACE").is_some();
    let trace_all = trace && std::env::var_os("PMNET_ABD_TRACE_ALL").is_some();
    let mut report = AbdReport {
        seed,
        nodes: node_count as u64,
        device_clients: device_clients as u64,
        direct_clients: direct_clients as u64,
        ..AbdReport::default()
    };
    if trace {
        eprintln!(
            "seed {seed}: {node_count} nodes, {device_clients} clients through the device, \
             {direct_clients} client-driven; loss {loss:.3}, duplication {duplicate:.3}"
        );
    }
    let node_addrs: Vec<SocketAddr> = (0..node_count).map(node_addr).collect();
    let mut nodes = Vec::with_capacity(node_count);
    for index in 0..node_count {
        nodes.push(Node {
            host: fresh_node(index, node_count, Time::ZERO)?,
            up: true,
            restart_at: None,
            restart_empty: false,
            persisting: VecDeque::new(),
            was_member: false,
        });
    }
    // The device stamps above its clock's counter floor, as a process starts it: a restarted
    // device's counters are above its earlier lives' (whose stores may sit on nodes its first
    // majority does not include). The client-driven coordinators never restart; they count
    // from 0.
    let device_config = |session: u64, now: Time| {
        let mut config = CoordinatorConfig::new(node_addrs.clone(), LINES, DEVICE_WRITER, session);
        config.counter_floor =
            pmnet_abd::counter_floor_at((SIM_EPOCH_MS + now.as_nanos() / 1_000_000) * 1_000);
        config
    };
    let mut device = device_host(Coordinator::new(device_config(rng.random(), Time::ZERO)));
    let mut device_up = true;
    let mut device_restart_at: Option<Time> = None;
    let mut clients: Vec<Client> = (0..device_clients + direct_clients)
        .map(|index| {
            let engine = if index < device_clients {
                Engine::Device(AbdClient::new(ClientConfig::new(
                    device_addr(),
                    rng.random(),
                )))
            } else {
                let writer = DEVICE_WRITER + 1 + (index - device_clients) as u16;
                Engine::Direct(Coordinator::new(CoordinatorConfig::new(
                    node_addrs.clone(),
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
        .collect();
    let endpoints: Vec<SocketAddr> = (0..node_count)
        .map(node_addr)
        .chain((0..clients.len()).map(client_addr))
        .chain([device_addr()])
        .collect();
    let mut replayer = Replayer::new(
        seed,
        (0..clients.len()).map(client_addr).collect(),
        endpoints,
    );
    if std::env::var_os("PMNET_ABD_REPLAY_STORES").is_none() {
        replayer.spared_types = vec![pmnet_wire::abd::ABD_STORE, pmnet_wire::abd::ABD_STORE_ACK];
    }
    net.replayer = Some(replayer);
    let mut stores = Stores::default();
    let mut history: History = Vec::new();
    let mut next_value = 0u64;
    let mut next_token = 1u64;
    // Each line's highest timestamp of a write answered ok.
    let mut acked = [0u64; LINES as usize];

    // The group forms: every node starts empty, learns that no other holds a line, joins.
    let formed_by = Time::ZERO + LEARN_WAIT + Duration::from_millis(200);
    let mut start: Option<Time> = None;
    let mut faults: Vec<(Time, u8)> = Vec::new();
    let mut end_of_safety = Time::ZERO;
    let mut healed = false;
    let nanos = |time: Time| time.as_nanos();
    // A node that became a member (after learning) in this step.
    let mut joined: Option<usize> = None;
    loop {
        let now = net.now;
        if start.is_none() {
            if nodes.iter().all(|node| node.node().is_member()) {
                start = Some(now);
                for node in &mut nodes {
                    node.was_member = true;
                }
                end_of_safety = now + SAFETY;
                faults = (0..rng.random_range(2..10))
                    .map(|_| {
                        let at = rng.random_range(1..SAFETY.as_millis() as u64);
                        (now + Duration::from_millis(at), rng.random_range(0..11u8))
                    })
                    .collect();
                faults.sort();
                for client in &mut clients {
                    client.next_at = now + Duration::from_micros(rng.random_range(0..2000));
                }
                if trace {
                    eprintln!("{now} the group formed; faults at {faults:?}");
                }
            } else if now > formed_by {
                return Err(format!("{now}: the group did not form"));
            }
        }
        let running = start.is_some();
        let healing = running && now >= end_of_safety;
        // Faults.
        while faults.first().is_some_and(|(at, _)| *at <= now) {
            let (_, kind) = faults.remove(0);
            let index = rng.random_range(0..node_count);
            // Nodes down, learning or cut off from everyone: at most a minority.
            let out = |nodes: &[Node], net: &Net, but: usize| {
                nodes
                    .iter()
                    .enumerate()
                    .filter(|(other, node)| {
                        *other != but
                            && (!node.up
                                || !node.node().is_member()
                                || net.isolated(node_addr(*other)))
                    })
                    .count()
            };
            let may_fail = nodes[index].up && out(&nodes, &net, index) < tolerated;
            match kind {
                // A crash, the memory kept.
                0..=2 if may_fail => {
                    crash(&mut nodes[index], now, &mut rng)?;
                    report.crashes += 1;
                    if trace {
                        eprintln!("{now} node {index} crashes");
                    }
                }
                // A power failure: every node crashes at once, its persistent memory kept.
                // Beyond the minority the other faults keep to: a crash loses nothing a node
                // acknowledged, so no number of them is a danger to what was written (only
                // to progress, until they restart).
                10 if nodes.iter().all(|node| node.up) => {
                    for node in &mut nodes {
                        crash(node, now, &mut rng)?;
                    }
                    report.crashes += node_count as u64;
                    report.power_failures += 1;
                    if trace {
                        eprintln!("{now} power failure: every node crashes");
                    }
                }
                // The memory lost for good: back on a new, empty table.
                3 if may_fail => {
                    let node = &mut nodes[index];
                    node.persisting.clear();
                    node.up = false;
                    node.restart_empty = true;
                    node.restart_at = Some(now + Duration::from_millis(rng.random_range(1..100)));
                    report.losses += 1;
                    if trace {
                        eprintln!("{now} node {index} loses its memory");
                    }
                }
                // A node cut off from everyone.
                4 | 5 if may_fail => {
                    let until = now + Duration::from_millis(rng.random_range(20..300));
                    net.cut.push((node_addr(index), None, until));
                    report.partitions += 1;
                    if trace {
                        eprintln!("{now} node {index} cut off until {until}");
                    }
                }
                // A coordinator (the device or a client-driven client) cut off from a node,
                // or from everyone.
                6 | 7 => {
                    // Longer than an operation's deadline at times: its operations fail.
                    let until = now + Duration::from_millis(rng.random_range(20..800));
                    let coordinator = match rng.random_range(0..=direct_clients) {
                        0 => device_addr(),
                        k => client_addr(device_clients + k - 1),
                    };
                    let other = rng.random_bool(0.6).then(|| node_addr(index));
                    net.cut.push((coordinator, other, until));
                    report.partitions += 1;
                    if trace {
                        eprintln!("{now} {coordinator} cut off from {other:?} until {until}");
                    }
                }
                // The device restarts: its operations and what it knew of sessions lost.
                8 | 9 if device_up => {
                    device_up = false;
                    device_restart_at = Some(now + Duration::from_millis(rng.random_range(1..50)));
                    report.device_restarts += 1;
                    if trace {
                        eprintln!("{now} the device restarts");
                    }
                }
                _ => {}
            }
        }
        // Restarts.
        for (index, node) in nodes.iter_mut().enumerate() {
            if !(node.restart_at.is_some_and(|at| at <= now) || (healing && !node.up)) {
                continue;
            }
            node.restart_at = None;
            node.up = true;
            if node.restart_empty {
                node.host = fresh_node(index, node_count, now)?;
                node.was_member = false;
                if trace {
                    eprintln!("{now} node {index} restarts empty, learning");
                }
                continue;
            }
            net.restarted(node_addr(index));
            let region = node.host.region().expect("a node's lines").clone();
            let (file, recovered) =
                TableFile::open(region).map_err(|error| format!("reopen: {error}"))?;
            report.torn_records += recovered.damaged_records;
            let table = Table::recover_direct(file.geometry(), recovered);
            node.host = node_host(index, node_count, table, file.into_region(), now);
            stores.check_node(
                node.node(),
                &format!("{now}: node {index} reopened after a crash"),
            )?;
            if trace {
                eprintln!("{now} node {index} restarts ({})", node.node().state_text());
            }
        }
        if device_restart_at.is_some_and(|at| at <= now) || (healing && !device_up) {
            device_restart_at = None;
            device_up = true;
            let old = std::mem::replace(
                &mut device,
                device_host(Coordinator::new(device_config(rng.random(), now))),
            );
            let old = old.function();
            report.replays_refused += old.counters().replays_refused;
            net.restarted(device_addr());
            let counters = old.coordinator().counters();
            report.write_backs += counters.write_backs;
            report.reads_one_phase += counters.reads_one_phase;
        }
        if healing && !healed {
            healed = true;
            net.cut.clear();
            net.loss = 0.0;
            if trace {
                eprintln!("{now} healed");
            }
        }
        // Clients start operations.
        for (index, client) in clients.iter_mut().enumerate() {
            if let Engine::Device(session) = &mut client.engine {
                if !healing && client.in_flight.is_empty() && churn.random_bool(0.001) {
                    *session = AbdClient::new(ClientConfig::new(device_addr(), churn.random()));
                    report.session_churn += 1;
                }
            }
            if !running || client.in_flight.len() >= client.depth || now < client.next_at {
                continue;
            }
            if healing {
                // Once healed and every node is a member again: each client's next operations
                // must complete.
                let members = nodes.iter().all(|node| node.up && node.node().is_member());
                if client.final_ops == 0 || !client.in_flight.is_empty() || !members {
                    continue;
                }
                client.final_ops -= 1;
            }
            let token = next_token;
            next_token += 1;
            let (first, count) = if !healing && rng.random_bool(0.01) {
                // Beyond the memory's end: refused, and never takes effect.
                (rng.random_range(LINES - 2..LINES + 2), 3)
            } else {
                // A hot line, or now and then a cold one; several lines at times.
                let (first, end) = if rng.random_bool(COLD_SHARE) {
                    (rng.random_range(HOT..LINES), LINES)
                } else {
                    (rng.random_range(0..HOT), HOT)
                };
                let count = if rng.random_bool(0.6) {
                    1
                } else {
                    rng.random_range(2..=4u32).min(end - first)
                };
                (first, count as u16)
            };
            // The first operation once healed is a write, the second a read.
            let write = if healing {
                client.final_ops == 1
            } else {
                rng.random_bool(0.5)
            };
            let (kind, values) = if write {
                let values: Vec<u64> = (0..count)
                    .map(|_| {
                        next_value += 1;
                        next_value
                    })
                    .collect();
                let bytes = values.iter().flat_map(|v| line_bytes(*v)).collect();
                (OpKind::Write(bytes), values)
            } else {
                (OpKind::Read, Vec::new())
            };
            let started = match &mut client.engine {
                Engine::Device(session) => session.start(now, token, first, count, kind),
                Engine::Direct(coordinator) => coordinator.start(now, token, first, count, kind),
            };
            report.operations += 1;
            if write {
                report.writes += 1;
            } else {
                report.reads += 1;
            }
            if count > 1 {
                report.multi_line += 1;
            }
            if trace {
                eprintln!(
                    "{now} client {index} starts {} lines {first}+{count} {values:?}: {started:?}",
                    if write { "write" } else { "read" }
                );
            }
            let beyond = first + u32::from(count) > LINES;
            match started {
                Ok(()) => {
                    let op = InFlight {
                        first,
                        count,
                        values,
                        call: nanos(now),
                        must_complete: healing,
                    };
                    client.in_flight.insert(token, op);
                }
                Err(AbdError::OutOfRange) if beyond => report.out_of_range += 1,
                Err(error) => {
                    return Err(format!(
                        "{now}: client {index}'s operation on lines {first}+{count} refused: \
                         {error:?}"
                    ))
                }
            }
            client.next_at = now + Duration::from_micros(rng.random_range(0..3000));
        }
        // Clients: timers, sends, results.
        for (index, client) in clients.iter_mut().enumerate() {
            let mut done = Vec::new();
            match &mut client.engine {
                Engine::Device(session) => {
                    session.handle_timeout(now);
                    send_all(
                        client_addr(index),
                        &mut net,
                        &mut stores,
                        std::iter::from_fn(|| session.poll_transmit()),
                    );
                    while let Some(d) = session.poll_done() {
                        done.push((d.token, d.result));
                    }
                }
                Engine::Direct(coordinator) => {
                    coordinator.handle_timeout(now);
                    send_all(
                        client_addr(index),
                        &mut net,
                        &mut stores,
                        std::iter::from_fn(|| coordinator.poll_transmit()),
                    );
                    while let Some(d) = coordinator.poll_done() {
                        done.push((d.token, d.result));
                    }
                }
            }
            for (token, result) in done {
                let InFlight {
                    first,
                    count,
                    values,
                    call,
                    must_complete,
                } = client
                    .in_flight
                    .remove(&token)
                    .ok_or_else(|| format!("{now}: client {index}: an answer to no operation"))?;
                if trace {
                    let shown = result
                        .as_ref()
                        .map(|data| data.chunks(LINE).map(line_value).collect::<Vec<_>>());
                    eprintln!(
                        "{now} client {index} lines {first}+{count} {values:?} called {call} \
                         -> {shown:?}"
                    );
                }
                let beyond = first + u32::from(count) > LINES;
                let lines = first..first + u32::from(count);
                let client_id = index as u64;
                match result {
                    Err(AbdError::OutOfRange) if beyond => report.out_of_range += 1,
                    // Refused, but its answer lost: sent again, it is "in doubt" (or given up)
                    // like any write the coordinator does not remember. Took no effect either way.
                    Err(AbdError::InDoubt | AbdError::Unavailable) if beyond => {}
                    _ if beyond => {
                        return Err(format!(
                            "{now}: client {index}'s operation on lines {first}+{count}, beyond \
                             the end, answered {result:?}"
                        ))
                    }
                    Ok(data) if values.is_empty() => {
                        if data.len() != usize::from(count) * LINE {
                            return Err(format!(
                                "{now}: client {index}'s read of lines {first}+{count} returned \
                                 {} bytes",
                                data.len()
                            ));
                        }
                        report.completed += 1;
                        for (line, bytes) in lines.zip(data.chunks(LINE)) {
                            let value = line_value(bytes).ok_or_else(|| {
                                format!(
                                    "{now}: client {index} read line {line} holding bytes no \
                                     write wrote: {bytes:02x?}"
                                )
                            })?;
                            history.push((
                                line,
                                Operation {
                                    client: client_id,
                                    call,
                                    ret: nanos(now),
                                    input: RegisterInput::Read,
                                    output: RegisterOutput::Value(Some(value)),
                                },
                            ));
                        }
                    }
                    Ok(_) => {
                        report.completed += 1;
                        for (line, value) in lines.zip(values) {
                            let ts = stores.ts_of(value).ok_or_else(|| {
                                format!(
                                    "{now}: client {index}'s write of {value} to line {line} \
                                     acknowledged, but no coordinator ever stored it"
                                )
                            })?;
                            acked[line as usize] = acked[line as usize].max(ts);
                            history.push((
                                line,
                                Operation {
                                    client: client_id,
                                    call,
                                    ret: nanos(now),
                                    input: RegisterInput::Write(Some(value)),
                                    output: RegisterOutput::Written,
                                },
                            ));
                        }
                    }
                    Err(error @ (AbdError::Unavailable | AbdError::InDoubt)) => {
                        if error == AbdError::Unavailable {
                            report.unavailable += 1;
                        } else {
                            report.in_doubt += 1;
                        }
                        if must_complete {
                            return Err(format!(
                                "{now}: client {index}'s operation on lines {first}+{count}, \
                                 started once healed with every node a member, failed: \
                                 {error:?}"
                            ));
                        }
                        // May or may not have taken effect (a read's takes none).
                        for (line, value) in lines.zip(values) {
                            history.push((
                                line,
                                Operation {
                                    client: client_id,
                                    call,
                                    ret: PENDING,
                                    input: RegisterInput::Write(Some(value)),
                                    output: RegisterOutput::Unknown,
                                },
                            ));
                        }
                    }
                    Err(error) => {
                        return Err(format!(
                            "{now}: client {index}'s operation on lines {first}+{count} \
                             failed: {error:?}"
                        ))
                    }
                }
            }
        }
        // The network.
        net.strike();
        while let Some((from, to, bytes)) = net.pop_due() {
            let sealed = net.sealed.take();
            let Ok((header, payload)) = Header::parse(&bytes) else {
                continue;
            };
            if trace_all {
                eprintln!(
                    "{now} {from} -> {to} {:?} session {:x} seq {} {:02x?}",
                    header.packet_type,
                    header.session_id,
                    header.seq,
                    &payload[..payload.len().min(24)]
                );
            }
            if let Some(index) = (0..node_count).find(|&index| node_addr(index) == to) {
                let node = &mut nodes[index];
                if node.up {
                    node.host.handle(now, from, &bytes, None);
                    flush_node(node, index, &mut net, &mut rng);
                }
            } else if to == device_addr() {
                if device_up {
                    device.handle(now, from, &bytes, sealed);
                    send_all(
                        device_addr(),
                        &mut net,
                        &mut stores,
                        std::iter::from_fn(|| device.poll_transmit()),
                    );
                }
            } else if let Some(index) = (0..clients.len()).find(|&index| client_addr(index) == to) {
                match &mut clients[index].engine {
                    Engine::Device(session) => session.handle(now, &header, payload),
                    Engine::Direct(coordinator) => coordinator.handle(now, from, &header, payload),
                }
            }
        }
        for (index, node) in nodes.iter_mut().enumerate() {
            if node.up {
                node.host.handle_timeout(now);
                flush_node(node, index, &mut net, &mut rng);
                let member = node.node().is_member();
                if member && !node.was_member && running {
                    report.joins += 1;
                    stores.check_node(node.node(), &format!("{now}: node {index} joined"))?;
                    joined = Some(index);
                    if trace {
                        eprintln!("{now} node {index} is a member again");
                    }
                }
                node.was_member = member;
            }
        }
        if let Some(index) = joined.take() {
            durable_on_majority(&nodes, &acked)
                .map_err(|error| format!("{now}: once node {index} joined, {error}"))?;
        }
        if device_up {
            device.handle_timeout(now);
            send_all(
                device_addr(),
                &mut net,
                &mut stores,
                std::iter::from_fn(|| device.poll_transmit()),
            );
        }
        if let Some(clash) = &stores.clash {
            return Err(clash.clone());
        }
        // Done: healed, every node a member, every client's final operations done.
        if healing {
            let members = nodes.iter().all(|node| node.up && node.node().is_member());
            let idle = clients
                .iter()
                .all(|client| client.final_ops == 0 && client.in_flight.is_empty());
            if members && idle {
                break;
            }
            if now >= end_of_safety + LIVENESS_BOUND {
                return Err(format!(
                    "not live {LIVENESS_BOUND:?} after the faults healed: nodes {:?}, clients' \
                     operations in flight {:?}, final operations left {:?}",
                    nodes
                        .iter()
                        .map(|node| node.node().state_text())
                        .collect::<Vec<_>>(),
                    clients
                        .iter()
                        .map(|client| client.in_flight.len())
                        .collect::<Vec<_>>(),
                    clients
                        .iter()
                        .map(|client| client.final_ops)
                        .collect::<Vec<_>>(),
                ));
            }
        }
        // Advance to the next event.
        let mut next = now + Duration::from_millis(1);
        let mut consider = |at: Option<Time>| {
            if let Some(at) = at {
                next = next.min(at);
            }
        };
        consider(net.next_due());
        consider(faults.first().map(|(at, _)| *at));
        consider(device_restart_at);
        if device_up {
            consider(device.poll_timeout());
        }
        if running && !healing {
            consider(Some(end_of_safety));
        }
        for node in &nodes {
            consider(node.restart_at);
            if node.up {
                consider(node.host.poll_timeout());
                consider(node.persisting.front().map(|(at, ..)| *at));
            }
        }
        for client in &clients {
            if running && client.in_flight.len() < client.depth {
                consider(Some(client.next_at));
            }
            consider(match &client.engine {
                Engine::Device(session) => session.poll_timeout(),
                Engine::Direct(coordinator) => coordinator.poll_timeout(),
            });
        }
        net.now = next.max(now + Duration::from_micros(1));
    }
    // Counters of the coordinators and nodes.
    let counters = device.function().coordinator().counters();
    report.write_backs += counters.write_backs;
    report.reads_one_phase += counters.reads_one_phase;
    for client in &clients {
        if let Engine::Direct(coordinator) = &client.engine {
            report.write_backs += coordinator.counters().write_backs;
            report.reads_one_phase += coordinator.counters().reads_one_phase;
        }
    }
    for (index, node) in nodes.iter().enumerate() {
        report.lines_learnt += node.node().counters().sync_lines_taken;
        stores.check_node(node.node(), &format!("at the end, node {index}"))?;
    }
    // Durability: every acknowledged write's timestamp, or a higher one, is durable on a
    // majority of the nodes.
    durable_on_majority(&nodes, &acked).map_err(|error| format!("at the end, {error}"))?;
    let verdict = check_by_key(&Register { initial: Some(0) }, &history, 100_000_000);
    if !verdict.is_linearizable() {
        // The operation it could not place, and those of its line around it.
        let detail = match &verdict {
            pmnet_lincheck::Verdict::NotLinearizable { stuck, .. } => {
                let (line, op) = &history[*stuck];
                let around: Vec<_> = history
                    .iter()
                    .filter(|(l, other)| {
                        l == line
                            && other.ret.saturating_add(5_000_000) >= op.call
                            && other.call <= op.ret.min(op.call + 5_000_000)
                    })
                    .map(|(_, other)| other)
                    .take(40)
                    .collect();
                format!(
                    "; stuck at line {line}'s {op:?}; its line's operations around it: {around:?}"
                )
            }
            _ => String::new(),
        };
        return Err(format!(
            "a line's history is not linearizable: {verdict:?}{detail}"
        ));
    }
    if report.completed == 0 {
        return Err("no operation completed".to_owned());
    }
    report.replays_refused += device.function().counters().replays_refused;
    if let Some(replayer) = &net.replayer {
        report.replayed = replayer.replayed;
        report.replayed_past_window = replayer.replayed_past_window;
        report.replay_bursts = replayer.bursts_after_restarts;
    }
    report.stale_dropped = net.auth.as_ref().map_or(0, NetAuth::stale);
    Ok(report)
}

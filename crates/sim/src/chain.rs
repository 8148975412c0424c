//! The chain store's world (docs/simulation.md, "Chain stores"): the NetChain members' and
//! controller's production state machines, four members (three in the chains, one spare),
//! clients taking the chains from the controller, on a lossy, duplicating, reordering
//! network, with member crashes (tables reopened from what the crash left in persistent
//! memory), a member lost for good, partitions (a member cut off from the controller, or from
//! everyone) and controller restarts. One seed decides everything. [`run_seed_fixed`] runs the
//! same world with the fixed chains of `--chain-member` (no controller; crashes only).
//!
//! Checked: every key's history of completed reads, writes and compare-and-sets, with the
//! versions they returned, is linearizable (`pmnet-lincheck`'s versioned register, so lock
//! recipes on compare-and-set are safe);
//! once the faults heal, the chains are whole again (as many members as are alive, up to
//! three) with no recovery under way, and every client's last request completes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_lincheck::{
    check_by_key, Operation, VersionedInput, VersionedOutput, VersionedRegister, PENDING,
};
use pmnet_netchain::{
    ChainClient, ChainConfig, ChainFunction, ChainNode, ClientConfig, ClientOp, Controller,
    ControllerConfig, Geometry, Outcome, Table, TableFile,
};
use pmnet_pm::SimRegion;
use pmnet_proto::Time;
use pmnet_wire::netchain::control::Layout;
use pmnet_wire::Header;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::function_host::FunctionHost;
use crate::net::Net;
use crate::net_attacker::{NetAuth, Replayer};

const MEMBERS: usize = 4;
const CHAIN: usize = 3;
const GROUPS: u16 = 4;
const CLIENTS: usize = 4;
const SAFETY: Duration = Duration::from_secs(2);
const LIVENESS_BOUND: Duration = Duration::from_secs(30);

fn member_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 5, index as u8 + 1], 7600))
}

fn controller_addr() -> SocketAddr {
    SocketAddr::from(([10, 0, 5, 100], 7700))
}

fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 6, index as u8 + 1], 40000))
}

fn geometry() -> Geometry {
    Geometry {
        buckets: 256,
        key_max: 16,
        value_max: 32,
    }
}

const LIFETIME: Duration = Duration::from_millis(400);

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainReport {
    pub seed: u64,
    pub operations: u64,
    pub completed: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub controller_restarts: u64,
    pub members_lost: u64,
    pub removals: u64,
    pub recoveries: u64,
    pub reads_here: u64,
    pub reads_relayed: u64,
    /// The final configuration's epoch.
    pub epoch: u64,
    /// The attacker's replays of captured genuine datagrams, those captured longer than the
    /// replay window (and its second) before, and its bursts after a member restarted.
    pub replayed: u64,
    pub replayed_past_window: u64,
    pub replay_bursts: u64,
    /// Datagrams the endpoints dropped as sealed outside the replay window, and head writes
    /// of unknown sessions refused as sealed before a member forgot a session or started.
    pub stale_dropped: u64,
    pub replays_refused: u64,
    /// Client sessions that started over with a new session id.
    pub session_churn: u64,
}

impl ChainReport {
    /// Add `other`'s counts to these (for a swarm's totals; the seed and epoch are not
    /// counts).
    pub fn add(&mut self, other: &ChainReport) {
        self.operations += other.operations;
        self.completed += other.completed;
        self.crashes += other.crashes;
        self.partitions += other.partitions;
        self.controller_restarts += other.controller_restarts;
        self.members_lost += other.members_lost;
        self.removals += other.removals;
        self.recoveries += other.recoveries;
        self.reads_here += other.reads_here;
        self.reads_relayed += other.reads_relayed;
        self.replayed += other.replayed;
        self.replayed_past_window += other.replayed_past_window;
        self.replay_bursts += other.replay_bursts;
        self.stale_dropped += other.stale_dropped;
        self.replays_refused += other.replays_refused;
        self.session_churn += other.session_churn;
    }
}

/// A chain member as `pmnet device --chain-member` runs it: [`ChainFunction`] in a device's
/// pipeline, its table writes carried out on its region by the device's front executor.
struct Member {
    host: FunctionHost<ChainFunction>,
    up: bool,
    lost: bool,
    restart_at: Option<Time>,
}

struct Client {
    session: ChainClient,
    current: Option<(Vec<u8>, ClientOp, u64)>,
    /// The present version (0: no value) this client last saw of each key: what its
    /// compare-and-sets expect.
    seen: std::collections::HashMap<Vec<u8>, u64>,
}

type History = Vec<(
    Vec<u8>,
    Operation<VersionedInput<Vec<u8>>, VersionedOutput<Vec<u8>>>,
)>;

fn fixed_chains() -> Vec<Vec<SocketAddr>> {
    let members: Vec<SocketAddr> = (0..CHAIN).map(member_addr).collect();
    pmnet_netchain::rotated_groups(&members, GROUPS)
}

fn member_config(index: usize, controlled: bool) -> ChainConfig {
    let mut config = if controlled {
        ChainConfig::controlled(member_addr(index), 1, controller_addr())
    } else {
        ChainConfig::new(member_addr(index), 1, fixed_chains())
    };
    config.request_lifetime = LIFETIME;
    config
}

fn controller_config() -> ControllerConfig {
    ControllerConfig {
        chain_length: CHAIN,
        ..ControllerConfig::default()
    }
}

impl Member {
    fn node(&self) -> &ChainNode {
        self.host.function().node()
    }
}

/// A member's pipeline over `table`, persisting on `region`.
fn member_host(
    index: usize,
    controlled: bool,
    table: Table,
    region: SimRegion,
    now: Time,
) -> FunctionHost<ChainFunction> {
    let node = ChainNode::new(member_config(index, controlled), table, now);
    FunctionHost::new(ChainFunction::new(node), Some(region))
}

fn flush_member(member: &mut Member, index: usize, net: &mut Net) {
    member.host.persist_all(net.now);
    while let Some(transmit) = member.host.poll_transmit() {
        net.send(member_addr(index), transmit.destination, transmit.bytes);
    }
}

fn flush_controller(controller: &mut Controller, saved: &mut Layout, net: &mut Net) {
    // Saved before anything of the same step is sent.
    if let Some(layout) = controller.poll_save() {
        *saved = layout;
    }
    while let Some(transmit) = controller.poll_transmit() {
        net.send(controller_addr(), transmit.destination, transmit.bytes);
    }
}

/// Run one seed; `Err` names what failed.
pub fn run_seed(seed: u64) -> Result<ChainReport, String> {
    run(seed, true)
}

/// Run one seed with fixed chains (no controller): member crashes and restarts on the
/// network's faults; linearizability, and every client's last request completes once healed.
pub fn run_seed_fixed(seed: u64) -> Result<ChainReport, String> {
    run(seed, false)
}

fn run(seed: u64, controlled: bool) -> Result<ChainReport, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let loss = rng.random_range(0.0..0.1);
    let duplicate = rng.random_range(0.0..0.05);
    let mut net = Net::new(ChaCha8Rng::seed_from_u64(seed ^ 0x4e57), loss, duplicate);
    // Keys on every endpoint, and an attacker replaying what it captured.
    net.auth = Some(NetAuth::for_seed(seed));
    let endpoints: Vec<SocketAddr> = (0..MEMBERS)
        .map(member_addr)
        .chain((0..CLIENTS).map(client_addr))
        .chain([controller_addr()])
        .collect();
    net.replayer = Some(Replayer::new(
        seed,
        (0..CLIENTS).map(client_addr).collect(),
        endpoints,
    ));
    // Clients starting over with a new session (a client process restarted), from a
    // generator of its own.
    let mut churn = ChaCha8Rng::seed_from_u64(seed ^ 0xc4_0e55);
    let mut generation = 0u64;
    let mut report = ChainReport {
        seed,
        ..ChainReport::default()
    };
    let mut members: Vec<Member> = (0..MEMBERS)
        .map(|index| Member {
            host: member_host(
                index,
                controlled,
                Table::new(geometry()),
                TableFile::format(SimRegion::new(geometry().region_len()), geometry())
                    .expect("format")
                    .into_region(),
                Time::ZERO,
            ),
            up: true,
            lost: false,
            restart_at: None,
        })
        .collect();
    let addresses: Vec<SocketAddr> = (0..MEMBERS).map(member_addr).collect();
    let mut controller = Controller::new(controller_config(), &addresses, GROUPS, Time::ZERO)
        .map_err(|error| error.to_string())?;
    let mut saved = controller.layout().clone();
    let mut controller_up = controlled;
    let mut controller_restart_at: Option<Time> = None;
    flush_controller(&mut controller, &mut saved, &mut net);

    let keys: Vec<Vec<u8>> = (0..6u8).map(|index| vec![b'k', index]).collect();
    let mut clients: Vec<Client> = (0..CLIENTS)
        .map(|index| {
            let session = 0x5e55_0000 + index as u64;
            let mut config = if controlled {
                ClientConfig::controlled(session, controller_addr())
            } else {
                ClientConfig::new(session, fixed_chains())
            };
            config.retransmit_timeout_max = Duration::from_millis(20);
            config.request_lifetime = LIFETIME - Duration::from_millis(50);
            Client {
                session: ChainClient::new(config),
                current: None,
                seen: std::collections::HashMap::new(),
            }
        })
        .collect();
    let mut history: History = Vec::new();
    let mut next_value = 0u32;
    // The faults of the safety phase, each at a random time.
    let mut faults: Vec<(Time, u8)> = (0..rng.random_range(2..8))
        .map(|_| {
            (
                Time::ZERO + Duration::from_millis(rng.random_range(50..SAFETY.as_millis() as u64)),
                rng.random_range(0..4u8),
            )
        })
        .collect();
    faults.sort();
    let lose_one = rng.random_bool(0.5);
    let mut lost_one = false;
    let nanos = |time: Time| time.as_nanos();
    let trace = std::env::var_os("PMNET_CHAIN_TRACE").is_some();
    let mut traced_epoch = 0;
    let end_of_safety = Time::ZERO + SAFETY;
    loop {
        let now = net.now;
        let healing = now >= end_of_safety;
        if trace && controller.layout().epoch != traced_epoch {
            traced_epoch = controller.layout().epoch;
            eprintln!(
                "{now} epoch {traced_epoch}: {:?}",
                controller.layout().groups
            );
        }
        // Faults.
        while faults.first().is_some_and(|(at, _)| *at <= now) {
            let (_, kind) = faults.remove(0);
            // Fixed chains: crashes only (nothing takes a member out or brings one in).
            let kind = if controlled { kind } else { 0 };
            let index = rng.random_range(0..MEMBERS);
            if trace {
                eprintln!("{now} fault {kind} on member {index}");
            }
            // Whether every chain `index` is in has another member up and reachable: the
            // faults leave each group a live copy (the chains tolerate losing all but one).
            let layout = controller.layout();
            let others_live = |index: usize| {
                layout.groups.iter().all(|group| {
                    !group.chain.contains(&(index as u8))
                        || group.chain.iter().any(|other| {
                            let other = usize::from(*other);
                            other != index
                                && members[other].up
                                && !net.cut.iter().any(|(side, _, until)| {
                                    *side == member_addr(other) && now < *until
                                })
                        })
                })
            };
            match kind {
                0 if members[index].up && others_live(index) => {
                    // A member's process crashes (a batch may be cut); it restarts later.
                    let member = &mut members[index];
                    let cut = member.host.poll_persist();
                    member.host.crash(&cut, &mut rng);
                    member.up = false;
                    member.restart_at = Some(now + Duration::from_millis(rng.random_range(1..150)));
                    report.crashes += 1;
                }
                // Lost for good: only while each of its chains has another live member (the
                // chains tolerate losing all but one copy, not every copy).
                1 if lose_one && !lost_one && members[index].up && others_live(index) => {
                    members[index].up = false;
                    members[index].lost = true;
                    lost_one = true;
                    report.members_lost += 1;
                }
                2 if others_live(index) => {
                    let until = now + Duration::from_millis(rng.random_range(20..250));
                    let other = if rng.random_bool(0.5) {
                        Some(controller_addr())
                    } else {
                        None
                    };
                    net.cut.push((member_addr(index), other, until));
                    report.partitions += 1;
                }
                3 if controller_up => {
                    controller_up = false;
                    controller_restart_at =
                        Some(now + Duration::from_millis(rng.random_range(1..100)));
                    report.controller_restarts += 1;
                }
                _ => {}
            }
        }
        // Restarts.
        for (index, member) in members.iter_mut().enumerate() {
            if member.restart_at.is_some_and(|at| at <= now)
                || (healing && !member.up && !member.lost)
            {
                member.restart_at = None;
                let region = member.host.region().expect("a member's table").clone();
                let (file, recovered) = TableFile::open(region)
                    .map_err(|error| format!("seed {seed}: reopen: {error}"))?;
                let table = Table::recover(file.geometry(), recovered);
                report.replays_refused += member.node().counters().replays_refused;
                member.host = member_host(index, controlled, table, file.into_region(), now);
                member.up = true;
                net.restarted(member_addr(index));
            }
        }
        if controlled
            && (controller_restart_at.is_some_and(|at| at <= now) || (healing && !controller_up))
        {
            controller_restart_at = None;
            controller = Controller::restore(controller_config(), saved.clone(), &[], now)
                .map_err(|error| error.to_string())?;
            controller_up = true;
            flush_controller(&mut controller, &mut saved, &mut net);
        }
        if healing {
            net.cut.clear();
            net.loss = 0.0;
        }
        // Clients.
        for (index, client) in clients.iter_mut().enumerate() {
            if client.current.is_none() && !healing && churn.random_bool(0.002) {
                generation += 1;
                let session = 0x5e55_0000 + index as u64 + (generation << 8);
                let mut config = if controlled {
                    ClientConfig::controlled(session, controller_addr())
                } else {
                    ClientConfig::new(session, fixed_chains())
                };
                config.retransmit_timeout_max = Duration::from_millis(20);
                config.request_lifetime = LIFETIME - Duration::from_millis(50);
                client.session = ChainClient::new(config);
                report.session_churn += 1;
            }
            if client.current.is_none() && !healing && rng.random_bool(0.02) {
                let key = keys[rng.random_range(0..keys.len())].clone();
                next_value += 1;
                let value = next_value.to_be_bytes().to_vec();
                let op = match rng.random_range(0..20) {
                    0..=7 => ClientOp::Get,
                    8..=13 => ClientOp::Put(value),
                    14..=15 => ClientOp::Delete,
                    // Compare-and-set on what this client saw last: a lock's take and release.
                    _ => ClientOp::CompareAndSet {
                        expected: client.seen.get(&key).copied().unwrap_or(0),
                        value,
                    },
                };
                client
                    .session
                    .start(now, &key, op.clone())
                    .map_err(|_| "busy".to_owned())?;
                client.current = Some((key, op, nanos(now)));
                report.operations += 1;
            }
            client.session.handle_timeout(now);
            while let Some(transmit) = client.session.poll_transmit() {
                net.send(client_addr(index), transmit.destination, transmit.bytes);
            }
            while let Some((_, outcome)) = client.session.poll_outcome() {
                let (key, op, call) = client.current.take().expect("a request in flight");
                let input = match &op {
                    ClientOp::Get => VersionedInput::Read,
                    ClientOp::Put(value) => VersionedInput::Write(Some(value.clone())),
                    ClientOp::Delete => VersionedInput::Write(None),
                    ClientOp::CompareAndSet { expected, value } => VersionedInput::CompareAndSet {
                        expected: *expected,
                        value: value.clone(),
                    },
                };
                let (output, ret) = match outcome {
                    Outcome::Value { version, value } => {
                        let present = if value.is_some() { version } else { 0 };
                        client.seen.insert(key.clone(), present);
                        (VersionedOutput::Value { version, value }, nanos(now))
                    }
                    Outcome::Written { version } => {
                        let present = if matches!(op, ClientOp::Delete) {
                            0
                        } else {
                            version
                        };
                        client.seen.insert(key.clone(), present);
                        (VersionedOutput::Written { version }, nanos(now))
                    }
                    Outcome::CompareFailed { version, value } => {
                        client.seen.insert(key.clone(), version);
                        let value = (version != 0).then_some(value);
                        (
                            VersionedOutput::CompareFailed { version, value },
                            nanos(now),
                        )
                    }
                    Outcome::Unknown => (VersionedOutput::Unknown, PENDING),
                    other => return Err(format!("seed {seed}: unexpected outcome {other:?}")),
                };
                if ret != PENDING {
                    report.completed += 1;
                }
                if trace {
                    eprintln!("{now} client {index} {key:?} {op:?} called {call} -> {output:?}",);
                }
                history.push((
                    key,
                    Operation {
                        client: index as u64,
                        call,
                        ret,
                        input,
                        output,
                    },
                ));
            }
        }
        // The network.
        net.strike();
        while let Some((from, to, bytes)) = net.pop_due() {
            let sealed = net.sealed.take();
            let Ok((header, payload)) = Header::parse(&bytes) else {
                continue;
            };
            if trace && std::env::var_os("PMNET_CHAIN_TRACE_ALL").is_some() {
                eprintln!(
                    "{now} {from} -> {to} {:?} session {} seq {} {:02x?}",
                    header.packet_type,
                    header.session_id,
                    header.seq,
                    &payload[..payload.len().min(40)]
                );
            }
            if let Some(index) = (0..MEMBERS).find(|&index| member_addr(index) == to) {
                if members[index].up {
                    members[index].host.handle(now, from, &bytes, sealed);
                    flush_member(&mut members[index], index, &mut net);
                }
            } else if to == controller_addr() {
                if controller_up {
                    controller.handle(now, from, &bytes);
                    flush_controller(&mut controller, &mut saved, &mut net);
                }
            } else if let Some(index) = (0..CLIENTS).find(|&index| client_addr(index) == to) {
                if trace {
                    eprintln!("{now} client {index} <- {from} {:?}", header.packet_type);
                }
                clients[index].session.handle_from(now, from, &bytes);
                while let Some(transmit) = clients[index].session.poll_transmit() {
                    net.send(client_addr(index), transmit.destination, transmit.bytes);
                }
            }
        }
        for (index, member) in members.iter_mut().enumerate() {
            if member.up {
                member.host.handle_timeout(now);
                flush_member(member, index, &mut net);
            }
        }
        if controller_up {
            controller.handle_timeout(now);
            flush_controller(&mut controller, &mut saved, &mut net);
        }
        // Done: healed, the chains whole, no recovery under way, every client idle.
        if healing && !controlled {
            if members.iter().all(|member| member.up)
                && clients.iter().all(|client| client.current.is_none())
            {
                break;
            }
            if now >= end_of_safety + LIVENESS_BOUND {
                return Err(format!(
                    "seed {seed}: clients busy {LIVENESS_BOUND:?} after healing"
                ));
            }
        } else if healing {
            let layout = controller.layout();
            let alive = members.iter().filter(|member| !member.lost).count();
            let whole = layout.groups.iter().all(|group| {
                group.chain.len() == alive.min(CHAIN) && group.joining.is_none() && !group.paused
            });
            let current = members
                .iter()
                .filter(|member| !member.lost)
                .all(|member| member.node().epoch() == layout.epoch);
            if whole && current && clients.iter().all(|client| client.current.is_none()) {
                break;
            }
            if now >= end_of_safety + LIVENESS_BOUND {
                return Err(format!(
                    "seed {seed}: not whole {LIVENESS_BOUND:?} after the faults healed: \
                     chains {:?}, epoch {}, members at {:?}, clients busy {}; each member's \
                     latest version of each key {:?}",
                    layout.groups,
                    layout.epoch,
                    members
                        .iter()
                        .map(|m| (m.up, m.lost, m.node().epoch()))
                        .collect::<Vec<_>>(),
                    clients.iter().filter(|c| c.current.is_some()).count(),
                    members
                        .iter()
                        .map(|member| keys
                            .iter()
                            .map(|key| member.node().table().latest(key).map(|v| v.seq))
                            .collect::<Vec<_>>())
                        .collect::<Vec<_>>()
                ));
            }
        }
        // Advance to the next event.
        let due = net.next_due();
        let wake = members
            .iter()
            .filter(|member| member.up)
            .filter_map(|member| member.host.poll_timeout())
            .min();
        let next = [due, wake, Some(now + Duration::from_micros(200))]
            .into_iter()
            .flatten()
            .min()
            .expect("a time");
        net.now = next.max(now + Duration::from_micros(1));
    }
    let counters = controller.counters();
    report.removals = counters.removed;
    report.recoveries = counters.recoveries_done;
    report.epoch = controller.layout().epoch;
    for member in &members {
        report.reads_here += member.node().counters().reads_answered_here;
        report.reads_relayed += member.node().counters().reads_relayed;
        report.replays_refused += member.node().counters().replays_refused;
    }
    if let Some(replayer) = &net.replayer {
        report.replayed = replayer.replayed;
        report.replayed_past_window = replayer.replayed_past_window;
        report.replay_bursts = replayer.bursts_after_restarts;
    }
    report.stale_dropped = net.auth.as_ref().map_or(0, NetAuth::stale);
    let verdict = check_by_key(&VersionedRegister::default(), &history, 100_000_000);
    if !verdict.is_linearizable() {
        return Err(format!(
            "seed {seed}: a key's history is not linearizable: {verdict:?}"
        ));
    }
    let distinct: HashSet<u64> = history.iter().map(|(_, op)| op.client).collect();
    if report.completed == 0 || distinct.is_empty() {
        return Err(format!("seed {seed}: no operation completed"));
    }
    Ok(report)
}

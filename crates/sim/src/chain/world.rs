//! The chain store's world as one seed sets it up: four members (each a `ChainFunction` in a
//! device's pipeline over its table on simulated persistent memory), the controller, four
//! clients, the network with keys and the replaying attacker, and the faults' schedule.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_lincheck::{Operation, VersionedInput, VersionedOutput};
use pmnet_netchain::{
    ChainClient, ChainConfig, ChainFunction, ChainNode, ClientConfig, ClientOp, Controller,
    ControllerConfig, Geometry, Table, TableFile,
};
use pmnet_pm::SimRegion;
use pmnet_proto::Time;
use pmnet_wire::netchain::control::Layout;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::ChainReport;
use crate::function_host::FunctionHost;
use crate::network::{Attacker, Network, NetworkKeys};
use crate::world::node_name;

pub(super) const MEMBERS: usize = 4;
pub(super) const CHAIN: usize = 3;
const GROUPS: u16 = 4;
pub(super) const CLIENTS: usize = 4;
const SAFETY: Duration = Duration::from_secs(2);
pub(super) const LIVENESS_BOUND: Duration = Duration::from_secs(30);
const LIFETIME: Duration = Duration::from_millis(400);

pub(super) fn member_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 5, index as u8 + 1], 7600))
}

/// Controller `index`'s address: two controllers, one leading at a time (`pmnet controller` on
/// etcd; the other stands by and takes over at some restarts).
pub(super) fn controller_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 5, 100 + index as u8], 7700))
}

pub(super) fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 6, index as u8 + 1], 40000))
}

fn geometry() -> Geometry {
    Geometry {
        buckets: 256,
        key_max: 16,
        value_max: 32,
    }
}

/// A chain member as `pmnet device --chain-member` runs it: [`ChainFunction`] in a device's
/// pipeline, its table writes carried out on its region by the device's front executor.
pub(super) struct Member {
    pub(super) host: FunctionHost<ChainFunction>,
    pub(super) up: bool,
    pub(super) lost: bool,
    pub(super) restart_at: Option<Time>,
}

impl Member {
    pub(super) fn node(&self) -> &ChainNode {
        self.host.function().node()
    }
}

pub(super) struct Client {
    pub(super) session: ChainClient,
    pub(super) current: Option<(Vec<u8>, ClientOp, u64)>,
    /// The present version (0: no value) this client last saw of each key: what its
    /// compare-and-sets expect.
    pub(super) seen: HashMap<Vec<u8>, u64>,
}

pub(super) type History = Vec<(
    Vec<u8>,
    Operation<VersionedInput<Vec<u8>>, VersionedOutput<Vec<u8>>>,
)>;

/// One seed's world.
pub(super) struct ChainWorld {
    pub(super) seed: u64,
    /// With the controller (false: the fixed chains of `--chain-member`).
    pub(super) controlled: bool,
    pub(super) rng: ChaCha8Rng,
    /// Clients starting over with a new session, from a generator of its own.
    pub(super) churn: ChaCha8Rng,
    pub(super) generation: u64,
    /// Virtual time.
    pub(super) now: Time,
    pub(super) network: Network,
    pub(super) report: ChainReport,
    pub(super) members: Vec<Member>,
    pub(super) controller: Controller,
    /// What the controller saved (it restarts on it).
    pub(super) saved: Layout,
    pub(super) controller_up: bool,
    pub(super) controller_restart_at: Option<Time>,
    /// Which of the two controllers leads (the other's datagrams go nowhere).
    pub(super) leader: usize,
    pub(super) keys: Vec<Vec<u8>>,
    pub(super) clients: Vec<Client>,
    pub(super) history: History,
    pub(super) next_value: u32,
    /// The faults of the safety phase, each at a random time.
    pub(super) faults: Vec<(Time, u8)>,
    /// Whether this seed loses a member for good, and whether it did.
    pub(super) lose_one: bool,
    pub(super) lost_one: bool,
    traced_epoch: u64,
    pub(super) end_of_safety: Time,
}

fn fixed_chains() -> Vec<Vec<SocketAddr>> {
    let members: Vec<SocketAddr> = (0..CHAIN).map(member_addr).collect();
    pmnet_netchain::rotated_groups(&members, GROUPS)
}

fn member_config(index: usize, controlled: bool) -> ChainConfig {
    let mut config = if controlled {
        ChainConfig {
            standby_controllers: vec![controller_addr(1)],
            ..ChainConfig::controlled(member_addr(index), 1, controller_addr(0))
        }
    } else {
        ChainConfig::new(member_addr(index), 1, fixed_chains())
    };
    config.request_lifetime = LIFETIME;
    config
}

pub(super) fn controller_config() -> ControllerConfig {
    ControllerConfig {
        chain_length: CHAIN,
        ..ControllerConfig::default()
    }
}

/// A client's session `session`.
pub(super) fn client_session(session: u64, controlled: bool) -> ChainClient {
    let mut config = if controlled {
        ClientConfig {
            standby_controllers: vec![controller_addr(1)],
            ..ClientConfig::controlled(session, controller_addr(0))
        }
    } else {
        ClientConfig::new(session, fixed_chains())
    };
    config.retransmit_timeout_max = Duration::from_millis(20);
    config.request_lifetime = LIFETIME - Duration::from_millis(50);
    ChainClient::new(config)
}

/// Member `index`'s pipeline over `table`, persisting on `region`, started at `now` with its
/// keys from `network`.
pub(super) fn member_host(
    index: usize,
    controlled: bool,
    table: Table,
    region: SimRegion,
    now: Time,
    network: &mut Network,
) -> FunctionHost<ChainFunction> {
    let node = ChainNode::new(member_config(index, controlled), table, now);
    let auth = network.pipeline_keys(now, member_addr(index));
    FunctionHost::new(ChainFunction::new(node), Some(region), auth)
}

/// Member `index` at time zero, on a new table.
fn new_member(index: usize, controlled: bool, network: &mut Network) -> Member {
    let region = TableFile::format(SimRegion::new(geometry().region_len()), geometry())
        .expect("format")
        .into_region();
    Member {
        host: member_host(
            index,
            controlled,
            Table::new(geometry()),
            region,
            Time::ZERO,
            network,
        ),
        up: true,
        lost: false,
        restart_at: None,
    }
}

/// The faults of the safety phase, 2 to 7, each at a random time: (when, which).
fn schedule_faults(rng: &mut ChaCha8Rng) -> Vec<(Time, u8)> {
    let mut faults: Vec<(Time, u8)> = (0..rng.random_range(2..8))
        .map(|_| {
            let at = rng.random_range(50..SAFETY.as_millis() as u64);
            (
                Time::ZERO + Duration::from_millis(at),
                rng.random_range(0..4u8),
            )
        })
        .collect();
    faults.sort();
    faults
}

/// Carry out what member `index` asks to persist, then send what it has to send.
pub(super) fn flush_member(member: &mut Member, index: usize, now: Time, network: &mut Network) {
    member.host.persist_all(now);
    while let Some(transmit) = member.host.poll_transmit() {
        network.send(
            now,
            member_addr(index),
            transmit.destination,
            transmit.bytes,
        );
    }
}

pub(super) fn flush_controller(
    controller: &mut Controller,
    from: SocketAddr,
    saved: &mut Layout,
    now: Time,
    network: &mut Network,
) {
    // Saved before anything of the same step is sent.
    if let Some(layout) = controller.poll_save() {
        *saved = layout;
    }
    while let Some(transmit) = controller.poll_transmit() {
        network.send(now, from, transmit.destination, transmit.bytes);
    }
}

impl ChainWorld {
    /// Seed `seed`'s world at time zero. Its trace keeps its lines when `keep` (`Some(false)`:
    /// without the datagram lines).
    pub(super) fn new(
        seed: u64,
        controlled: bool,
        keep: Option<bool>,
    ) -> Result<ChainWorld, String> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let loss = rng.random_range(0.0..0.1);
        let duplicate = rng.random_range(0.0..0.05);
        let mut network = Network::uniform(seed ^ 0x4e57, loss, duplicate, node_name);
        if let Some(datagrams) = keep {
            network.trace.keep(datagrams);
        }
        network.trace.note(Time::ZERO, "sim", || {
            format!(
                "seed {seed}: {MEMBERS} members, chains of {CHAIN}, {CLIENTS} clients, {}; loss \
                 {:.1}%, duplication {:.1}%, delay 10-400 us",
                if controlled {
                    "the controller"
                } else {
                    "fixed chains"
                },
                loss * 100.0,
                duplicate * 100.0
            )
        });
        // Keys on every endpoint, and an attacker replaying what it captured.
        network.keys = Some(NetworkKeys::for_seed(seed));
        let endpoints: Vec<SocketAddr> = (0..MEMBERS)
            .map(member_addr)
            .chain((0..CLIENTS).map(client_addr))
            .chain([controller_addr(0), controller_addr(1)])
            .collect();
        network.attacker = Some(Attacker::replaying(
            seed,
            (0..CLIENTS).map(client_addr).collect(),
            endpoints,
        ));
        let members = (0..MEMBERS)
            .map(|index| new_member(index, controlled, &mut network))
            .collect();
        let addresses: Vec<SocketAddr> = (0..MEMBERS).map(member_addr).collect();
        let mut controller = Controller::new(controller_config(), &addresses, GROUPS, Time::ZERO)
            .map_err(|error| error.to_string())?;
        let mut saved = controller.layout().clone();
        flush_controller(
            &mut controller,
            controller_addr(0),
            &mut saved,
            Time::ZERO,
            &mut network,
        );
        let clients = (0..CLIENTS)
            .map(|index| Client {
                session: client_session(0x5e55_0000 + index as u64, controlled),
                current: None,
                seen: HashMap::new(),
            })
            .collect();
        let faults = schedule_faults(&mut rng);
        let lose_one = rng.random_bool(0.5);
        Ok(ChainWorld {
            seed,
            controlled,
            rng,
            churn: ChaCha8Rng::seed_from_u64(seed ^ 0xc4_0e55),
            generation: 0,
            now: Time::ZERO,
            network,
            report: ChainReport {
                seed,
                ..ChainReport::default()
            },
            members,
            controller,
            saved,
            controller_up: controlled,
            controller_restart_at: None,
            leader: 0,
            keys: (0..6u8).map(|index| vec![b'k', index]).collect(),
            clients,
            history: Vec::new(),
            next_value: 0,
            faults,
            lose_one,
            lost_one: false,
            traced_epoch: 0,
            end_of_safety: Time::ZERO + SAFETY,
        })
    }

    /// Past the safety phase: the faults heal.
    pub(super) fn healing(&self) -> bool {
        self.now >= self.end_of_safety
    }

    /// Note each new configuration of the controller in the trace.
    pub(super) fn trace_epoch(&mut self) {
        if self.controlled && self.controller.layout().epoch != self.traced_epoch {
            self.traced_epoch = self.controller.layout().epoch;
            let (epoch, groups) = (self.traced_epoch, &self.controller.layout().groups);
            let text = format!("epoch {epoch}: {groups:?}");
            self.note("controller", || text);
        }
    }

    /// Note an event of the world's by `actor` in the network's trace.
    pub(super) fn note(&mut self, actor: &str, event: impl FnOnce() -> String) {
        self.network.trace.note(self.now, actor, event);
    }

    /// The report once the run is over: the counts the state machines kept, the attacker's.
    pub(super) fn final_report(&self) -> ChainReport {
        let mut report = self.report.clone();
        let counters = self.controller.counters();
        report.removals = counters.removed;
        report.recoveries = counters.recoveries_done;
        report.epoch = self.controller.layout().epoch;
        for member in &self.members {
            report.reads_here += member.node().counters().reads_answered_here;
            report.reads_relayed += member.node().counters().reads_relayed;
            report.replays_refused += member.node().counters().replays_refused;
        }
        if let Some(attacker) = &self.network.attacker {
            report.replayed = attacker.replayed;
            report.replayed_past_window = attacker.replayed_past_window;
            report.replay_bursts = attacker.bursts_after_restarts;
        }
        report.stale_dropped += self.network.keys.as_ref().map_or(0, NetworkKeys::stale);
        for member in &self.members {
            report.stale_dropped += member.host.stale_dropped();
        }
        report
    }
}

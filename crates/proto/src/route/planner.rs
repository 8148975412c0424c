//! The controller's side of automatic failover for devices in series: the plan of every
//! chain (its devices in order, its server, its spares), the nodes' statuses, a device silent
//! past [`PlannerConfig::suspect_after`] taken out of its chain and a heard spare put in before
//! the server. Each change is a new epoch, saved ([`Planner::poll_save`]) before any node sees
//! it, and an event line ([`Planner::poll_event`]).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::replication::{decode_client_address, encode_client_address, CLIENT_ADDRESS_LEN};
use pmnet_wire::route::{
    ChainRoute, NodeStatus, Role, Route, MAX_CHAIN_DEVICES, MAX_CHAIN_REPLICAS, NODE_STATUS, ROUTE,
};
use pmnet_wire::{Header, PacketType};

use crate::{CountDrop, DropCounts, DropReason, Time, Transmit};

/// Chains one controller plans, at most.
pub const CHAINS_MAX: usize = 64;
/// Routes sent to clients per second, at most (a client's question costs a route; without
/// keys anyone can ask).
const CLIENT_ROUTES_PER_SECOND: u32 = 1000;
/// A node of a chain that changed, and that has not yet said it runs the new epoch, gets this
/// much longer before it is suspected: it may be restarting in place (a device recovering a
/// log of tens of thousands of entries took 260 ms), and sends no status meanwhile.
pub const RESTART_GRACE: Duration = Duration::from_secs(1);
/// Version of the saved plan's encoding.
const STATE_VERSION: u8 = 1;
/// A device not heard at all since the planner started (the controller's start, or a new
/// leader's) is suspected only after this long at least: the nodes of a chain may start after
/// their controller.
pub const START_GRACE: Duration = Duration::from_secs(5);
/// Epochs a status may carry: above, it is refused (no deployment changes a plan that often;
/// the planner moves its epoch past a node's, [`Planner::handle`], and must never wrap).
pub const EPOCH_LIMIT: u64 = 1 << 62;

/// One chain as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    pub server_id: u16,
    pub server: SocketAddr,
    /// (device id, address), the first device first.
    pub devices: Vec<(u16, SocketAddr)>,
    /// Devices put in, before the server, when one is taken out.
    pub spares: Vec<(u16, SocketAddr)>,
    /// The primary's replica servers (its `--replica` list): the one furthest along replaces
    /// a lost primary.
    pub replicas: Vec<SocketAddr>,
}

/// A planner's settings.
#[derive(Debug, Clone)]
pub struct PlannerConfig {
    pub chains: Vec<ChainSpec>,
    /// A device with no status for this long is taken out of its chain.
    pub suspect_after: Duration,
    /// A server (the primary, a replica) with no status for this long is replaced or taken
    /// out: longer than a device's delay, since a server restarts in place (its store opened
    /// again) when a route changes its part, and sends no status meanwhile.
    pub server_suspect_after: Duration,
    /// Seal every datagram sent and accept only datagrams that verify.
    pub auth: Option<pmnet_auth::Authenticator>,
}

/// What the planner counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlannerCounters {
    pub statuses: u64,
    pub routes_sent: u64,
    pub client_questions: u64,
    pub devices_removed: u64,
    pub spares_joined: u64,
    pub primaries_replaced: u64,
    pub replicas_removed: u64,
    /// Statuses of an epoch newer than the plan's (a plan restored from an older save, or
    /// none): the plan's epoch moved past it, so that no epoch names two chains.
    pub newer_epochs_heard: u64,
}

/// A change of a plan, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannerEvent {
    Removed {
        server_id: u16,
        device: (u16, SocketAddr),
        silent: Duration,
        epoch: u64,
    },
    SpareJoined {
        server_id: u16,
        device: (u16, SocketAddr),
        after: (u16, SocketAddr),
        epoch: u64,
    },
    /// The primary was silent: the replica furthest along is the primary now.
    Promoted {
        server_id: u16,
        lost: SocketAddr,
        primary: SocketAddr,
        position: u64,
        silent: Duration,
        epoch: u64,
    },
    /// A replica server was silent: the primary goes on without it.
    ReplicaRemoved {
        server_id: u16,
        replica: SocketAddr,
        silent: Duration,
        epoch: u64,
    },
    /// A device's first status of a boot.
    Heard {
        server_id: u16,
        role: Role,
        address: SocketAddr,
        boot: u64,
    },
}

impl fmt::Display for PlannerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlannerEvent::Removed {
                server_id,
                device: (id, address),
                silent,
                epoch,
            } => write!(
                f,
                "chain of server {server_id}: device {id} ({address}) suspected (no status for \
                 {} ms) and removed; epoch {epoch}",
                silent.as_millis()
            ),
            PlannerEvent::SpareJoined {
                server_id,
                device: (id, address),
                after: (after_id, after),
                epoch,
            } => write!(
                f,
                "chain of server {server_id}: spare device {id} ({address}) joined after device \
                 {after_id} ({after}), which replays its log to it; epoch {epoch}"
            ),
            PlannerEvent::Promoted {
                server_id,
                lost,
                primary,
                position,
                silent,
                epoch,
            } => write!(
                f,
                "chain of server {server_id}: primary {lost} suspected (no status for {} ms) \
                 and replaced by its replica {primary} (applied position {position}, the \
                 furthest along); epoch {epoch}",
                silent.as_millis()
            ),
            PlannerEvent::ReplicaRemoved {
                server_id,
                replica,
                silent,
                epoch,
            } => write!(
                f,
                "chain of server {server_id}: replica server {replica} suspected (no status for \
                 {} ms) and removed; the primary goes on without it; epoch {epoch}",
                silent.as_millis()
            ),
            PlannerEvent::Heard {
                server_id,
                role,
                address,
                boot,
            } => write!(
                f,
                "chain of server {server_id}: {} {address} heard (boot {boot:016x})",
                role.name()
            ),
        }
    }
}

/// One chain as planned ([`Planner::chains`]): its server id, its devices in order and its
/// server, its spares, the devices taken out (the latest last).
pub type PlannedChain<'a> = (
    u16,
    &'a ChainRoute,
    &'a [(u16, SocketAddr)],
    &'a [(u16, SocketAddr)],
);

/// What the planner knows of one node.
#[derive(Debug, Clone, Copy)]
struct View {
    boot: u64,
    epoch: u64,
    stamp: u64,
    position: u64,
    heard: Time,
}

#[derive(Debug)]
struct Chain {
    server_id: u16,
    route: ChainRoute,
    /// Devices the chain is meant to have (as configured): a heard spare is put in while it
    /// has fewer.
    wanted: u8,
    spares: Vec<(u16, SocketAddr)>,
    removed: Vec<(u16, SocketAddr)>,
    /// Servers taken out (a lost primary, a silent replica), the latest last.
    servers_removed: Vec<SocketAddr>,
    views: BTreeMap<SocketAddr, View>,
    /// Since when the live devices are watched (the planner's start): a device is suspected
    /// only after this long without a status.
    since: Time,
    /// When this planner last changed the chain (nodes not yet running the new epoch get
    /// [`RESTART_GRACE`] from then).
    changed_at: Option<Time>,
    /// The chain has replica servers (as configured): its server may change (a replica
    /// promoted), and its devices and spares are sent a route only once its server is
    /// known to run as the primary ([`Chain::primary_heard`]).
    replicated: bool,
    /// The plan's server was heard running the plan's epoch since this planner started or
    /// since its last promotion: it took the route that made it the primary. Until then a
    /// device or spare whose route would send it requests is not sent it: a replica that has
    /// not yet taken its promotion would apply them as a server without replicas and
    /// acknowledge them, and the other replicas would never hold them (swarm seed 424397).
    primary_heard: bool,
}

impl Chain {
    /// Whether its devices and spares may be sent the plan's route now.
    fn routes_devices(&self) -> bool {
        !self.replicated || self.primary_heard
    }
}

/// The controller's side. See the module docs.
#[derive(Debug)]
pub struct Planner {
    auth: Option<pmnet_auth::Authenticator>,
    suspect_after: Duration,
    server_suspect_after: Duration,
    epoch: u64,
    chains: Vec<Chain>,
    save: bool,
    transmits: VecDeque<Transmit>,
    events: VecDeque<PlannerEvent>,
    counters: PlannerCounters,
    drops: DropCounts,
    client_tokens: u32,
    tokens_at: Time,
}

impl Planner {
    /// A planner for `config`'s chains; `saved` (from [`Planner::poll_save`]) takes back the
    /// plan of every chain it holds. Errors name what is wrong with the configuration or the
    /// saved plan.
    pub fn new(config: PlannerConfig, now: Time, saved: Option<&[u8]>) -> Result<Planner, String> {
        if config.chains.len() > CHAINS_MAX {
            return Err(format!("at most {CHAINS_MAX} chains"));
        }
        // A first plan is epoch 1: every node, running its command line (epoch 0), is sent it.
        let (mut epoch, mut saved_chains) = (1, BTreeMap::new());
        if let Some(bytes) = saved {
            let (saved_epoch, chains) = decode_plan(bytes)
                .ok_or_else(|| "the saved plan of the device chains is damaged".to_owned())?;
            epoch = saved_epoch;
            saved_chains = chains;
        }
        let mut chains = Vec::new();
        for spec in config.chains {
            if chains
                .iter()
                .any(|chain: &Chain| chain.server_id == spec.server_id)
            {
                return Err(format!("server {} has two chains", spec.server_id));
            }
            let configured = spec.devices.len().clamp(1, MAX_CHAIN_DEVICES) as u8;
            let (wanted, route, spares, removed, servers_removed) =
                match saved_chains.remove(&spec.server_id) {
                    Some(saved) => saved,
                    None => {
                        let route = ChainRoute {
                            devices: spec.devices.clone(),
                            server: spec.server,
                            replicas: spec.replicas.clone(),
                        };
                        route.check().map_err(|_| {
                            format!(
                                "the chain of server {}: 1 to {MAX_CHAIN_DEVICES} devices and at \
                             most {MAX_CHAIN_REPLICAS} replica servers, each id and address \
                             once",
                                spec.server_id
                            )
                        })?;
                        (
                            configured,
                            route,
                            spec.spares.clone(),
                            Vec::new(),
                            Vec::new(),
                        )
                    }
                };
            chains.push(Chain {
                server_id: spec.server_id,
                route,
                wanted,
                spares,
                removed,
                servers_removed,
                views: BTreeMap::new(),
                since: now,
                changed_at: None,
                replicated: !spec.replicas.is_empty(),
                primary_heard: false,
            });
        }
        Ok(Planner {
            auth: config.auth,
            suspect_after: config.suspect_after,
            server_suspect_after: config.server_suspect_after.max(config.suspect_after),
            epoch,
            chains,
            save: saved.is_none(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: PlannerCounters::default(),
            drops: DropCounts::default(),
            client_tokens: CLIENT_ROUTES_PER_SECOND,
            tokens_at: now,
        })
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn counters(&self) -> PlannerCounters {
        self.counters
    }

    pub fn drops(&self) -> &DropCounts {
        &self.drops
    }

    /// Each chain as planned: (server id, route, spares, devices taken out).
    pub fn chains(&self) -> impl Iterator<Item = PlannedChain<'_>> {
        self.chains.iter().map(|chain| {
            (
                chain.server_id,
                &chain.route,
                &chain.spares[..],
                &chain.removed[..],
            )
        })
    }

    /// How long ago each node of chain `server_id` was last heard.
    pub fn heard(&self, server_id: u16, now: Time) -> Vec<(SocketAddr, Duration)> {
        self.chains
            .iter()
            .filter(|chain| chain.server_id == server_id)
            .flat_map(|chain| chain.views.iter())
            .map(|(address, view)| (*address, now - view.heard))
            .collect()
    }

    /// A datagram from `from`: a node's status.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let verified = match self.auth.as_mut().map(|auth| auth.verify(datagram)) {
            None => std::borrow::Cow::Borrowed(datagram),
            Some(Ok(bytes)) => bytes,
            Some(Err(error)) => {
                self.drops.record(DropReason::Auth(error));
                return;
            }
        };
        let (header, payload) = match Header::parse(&verified) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.drops.record(DropReason::Parse(error));
                return;
            }
        };
        if header.packet_type != PacketType::Reserved(NODE_STATUS) {
            self.drops.record(DropReason::UnexpectedType);
            return;
        }
        let Ok(status) = NodeStatus::parse(payload) else {
            self.drops.record(DropReason::BadPayload);
            return;
        };
        if status.epoch >= EPOCH_LIMIT {
            self.drops.record(DropReason::BadPayload);
            return;
        }
        let Some(index) = self
            .chains
            .iter()
            .position(|chain| chain.server_id == header.server_id)
        else {
            self.drops.record(DropReason::UnknownServer);
            return;
        };
        self.counters.statuses += 1;
        if status.role == Role::Client {
            self.answer_client(now, index, from, &status);
            return;
        }
        let chain = &self.chains[index];
        let known = match status.role {
            Role::Device => chain
                .route
                .devices
                .iter()
                .chain(&chain.spares)
                .chain(&chain.removed)
                .any(|&(id, address)| id == header.device_id && address == from),
            _ => from == chain.route.server || chain.route.replicas.contains(&from),
        };
        if !known {
            self.drops.record(DropReason::UnexpectedSource);
            return;
        }
        let chain = &mut self.chains[index];
        let view = chain.views.get(&from).copied();
        if let Some(view) = view {
            if view.boot == status.boot && status.stamp <= view.stamp {
                self.drops.record(DropReason::StaleData);
                return;
            }
        }
        self.move_past(status.epoch);
        let chain = &mut self.chains[index];
        let new_boot = view.is_none_or(|view| view.boot != status.boot);
        if new_boot {
            // A device taken out that started again (its log recovered, its addresses its
            // command line's) is a spare now.
            if let Some(at) = chain
                .removed
                .iter()
                .position(|&(id, address)| id == header.device_id && address == from)
            {
                let device = chain.removed.remove(at);
                chain.spares.push(device);
                self.epoch += 1;
                self.save = true;
            }
            self.events.push_back(PlannerEvent::Heard {
                server_id: chain.server_id,
                role: status.role,
                address: from,
                boot: status.boot,
            });
        }
        chain.views.insert(
            from,
            View {
                boot: status.boot,
                epoch: status.epoch,
                stamp: status.stamp,
                position: status.position,
                heard: now,
            },
        );
        // A node of the chain that runs another epoch is sent the route, a spare too (it
        // forwards to the chain's server, which a promotion moves); a device taken out is
        // not.
        let in_route = status.role == Role::Server
            || chain.routes_devices()
                && chain
                    .route
                    .devices
                    .iter()
                    .chain(&chain.spares)
                    .any(|&(_, address)| address == from);
        if in_route && status.epoch != self.epoch && !self.save {
            self.send_route(index, from, status.boot);
        }
        // The primary runs the plan: its devices and spares may send it requests now.
        let chain = &mut self.chains[index];
        if chain.replicated
            && from == chain.route.server
            && status.epoch == self.epoch
            && !chain.primary_heard
            && !self.save
        {
            chain.primary_heard = true;
            let waiting: Vec<(SocketAddr, u64)> = chain
                .route
                .devices
                .iter()
                .chain(&chain.spares)
                .filter_map(|(_, address)| {
                    let view = chain.views.get(address)?;
                    (view.epoch != self.epoch).then_some((*address, view.boot))
                })
                .collect();
            for (address, boot) in waiting {
                self.send_route(index, address, boot);
            }
        }
    }

    /// A node runs `epoch`, newer than the plan's: the plan was restored from an older save
    /// (or none: a controller whose saved plan was lost), and epochs up to the node's may have
    /// named other chains. The plan moves past it — a new epoch, saved, then sent to every
    /// node — so that an epoch never names two chains and every node takes the plan's route
    /// (a node takes only a route newer than the one it runs).
    fn move_past(&mut self, epoch: u64) {
        if epoch > self.epoch {
            self.epoch = epoch + 1;
            self.save = true;
            self.counters.newer_epochs_heard += 1;
        }
    }

    fn answer_client(&mut self, now: Time, index: usize, from: SocketAddr, status: &NodeStatus) {
        self.counters.client_questions += 1;
        self.move_past(status.epoch);
        let elapsed = now - self.tokens_at;
        if elapsed >= Duration::from_secs(1) {
            self.client_tokens = CLIENT_ROUTES_PER_SECOND;
            self.tokens_at = now;
        }
        if self.client_tokens == 0 || self.save {
            self.drops.record(DropReason::Backlog);
            return;
        }
        self.client_tokens -= 1;
        if status.epoch != self.epoch {
            self.send_route(index, from, status.boot);
        }
    }

    fn send_route(&mut self, index: usize, to: SocketAddr, boot: u64) {
        let chain = &self.chains[index];
        let route = Route {
            epoch: self.epoch,
            boot,
            to,
            chain: chain.route.clone(),
        };
        let mut payload = Vec::new();
        route.emit(&mut payload);
        let header = Header::new(PacketType::Reserved(ROUTE), chain.server_id, boot, 0);
        let mut bytes = pmnet_wire::to_sendable(&header.encode(&payload));
        if let Some(auth) = self.auth.as_mut() {
            auth.seal(&mut bytes);
        }
        self.counters.routes_sent += 1;
        self.transmits.push_back(Transmit {
            destination: to,
            bytes,
        });
    }

    /// Take out the devices silent past the suspicion delay (never a chain's last one), and
    /// put a heard spare in for each.
    pub fn handle_timeout(&mut self, now: Time) {
        for index in 0..self.chains.len() {
            let epoch_before = self.epoch;
            self.change_chain(index, now);
            if self.epoch != epoch_before {
                self.chains[index].changed_at = Some(now);
            }
        }
    }

    /// Chain `index`'s silent devices and servers taken out or replaced, spares put in.
    fn change_chain(&mut self, index: usize, now: Time) {
        while let Some((at, silence)) = self.silent_device(index, now) {
            self.epoch += 1;
            self.save = true;
            let chain = &mut self.chains[index];
            let device = chain.route.devices.remove(at);
            chain.removed.retain(|removed| *removed != device);
            push_bounded(&mut chain.removed, device, MAX_CHAIN_DEVICES);
            self.counters.devices_removed += 1;
            self.events.push_back(PlannerEvent::Removed {
                server_id: chain.server_id,
                device,
                silent: silence,
                epoch: self.epoch,
            });
        }
        self.check_servers(index, now);
        // A chain short of its devices takes a heard spare.
        while usize::from(self.chains[index].wanted) > self.chains[index].route.devices.len() {
            if !self.join_spare(index, now) {
                break;
            }
        }
    }

    /// A silent primary replaced by the replica furthest along (one heard within the
    /// suspicion delay); silent replicas taken out.
    fn check_servers(&mut self, index: usize, now: Time) {
        let suspect_after = self.server_suspect_after;
        let chain = &self.chains[index];
        let primary = chain.route.server;
        if !chain.route.replicas.is_empty() && self.suspect_at(chain, primary) <= now {
            let best = chain
                .route
                .replicas
                .iter()
                .filter_map(|replica| {
                    let view = chain.views.get(replica)?;
                    (view.heard >= chain.since && now - view.heard < suspect_after)
                        .then_some((view.position, *replica))
                })
                // The highest position; of equal ones, the first in the primary's list.
                .fold(
                    None,
                    |best: Option<(u64, SocketAddr)>, (position, replica)| match best {
                        Some((top, _)) if top >= position => best,
                        _ => Some((position, replica)),
                    },
                );
            if let Some((position, promoted)) = best {
                let silent = now - self.heard_or_since(chain, primary);
                self.epoch += 1;
                self.save = true;
                self.counters.primaries_replaced += 1;
                let chain = &mut self.chains[index];
                chain.route.replicas.retain(|replica| *replica != promoted);
                chain.route.server = promoted;
                chain.primary_heard = false;
                push_bounded(&mut chain.servers_removed, primary, MAX_CHAIN_REPLICAS);
                self.events.push_back(PlannerEvent::Promoted {
                    server_id: chain.server_id,
                    lost: primary,
                    primary: promoted,
                    position,
                    silent,
                    epoch: self.epoch,
                });
            }
        }
        loop {
            let chain = &self.chains[index];
            let Some(replica) = chain
                .route
                .replicas
                .iter()
                .copied()
                .find(|replica| self.suspect_at(chain, *replica) <= now)
            else {
                break;
            };
            let silent = now - self.heard_or_since(chain, replica);
            self.epoch += 1;
            self.save = true;
            self.counters.replicas_removed += 1;
            let chain = &mut self.chains[index];
            chain.route.replicas.retain(|other| *other != replica);
            push_bounded(&mut chain.servers_removed, replica, MAX_CHAIN_REPLICAS);
            self.events.push_back(PlannerEvent::ReplicaRemoved {
                server_id: chain.server_id,
                replica,
                silent,
                epoch: self.epoch,
            });
        }
    }

    /// When `address` was last heard, or the planner's start if later (or never heard).
    fn heard_or_since(&self, chain: &Chain, address: SocketAddr) -> Time {
        chain
            .views
            .get(&address)
            .map_or(chain.since, |view| view.heard.max(chain.since))
    }

    /// When a live device of chain `index` is due to be suspected: its last status plus the
    /// suspicion delay, or, never heard since the planner started, the start plus
    /// [`START_GRACE`] (at least the delay).
    fn suspect_at(&self, chain: &Chain, address: SocketAddr) -> Time {
        let delay = if address == chain.route.server || chain.route.replicas.contains(&address) {
            self.server_suspect_after
        } else {
            self.suspect_after
        };
        let due = match chain.views.get(&address) {
            Some(view) if view.heard >= chain.since => view.heard + delay,
            _ => chain.since + delay.max(START_GRACE),
        };
        match (chain.changed_at, chain.views.get(&address)) {
            (Some(changed), Some(view)) if view.epoch < self.epoch => {
                due.max(changed + delay + RESTART_GRACE)
            }
            _ => due,
        }
    }

    /// A device of chain `index` silent past its time (never the chain's last device), with
    /// how long it was silent.
    fn silent_device(&self, index: usize, now: Time) -> Option<(usize, Duration)> {
        let chain = &self.chains[index];
        if chain.route.devices.len() < 2 {
            return None;
        }
        chain
            .route
            .devices
            .iter()
            .enumerate()
            .find_map(|(at, &(_, address))| {
                (self.suspect_at(chain, address) <= now)
                    .then(|| (at, now - self.heard_or_since(chain, address)))
            })
    }

    /// Put the first spare heard within the suspicion delay in before the server (a new
    /// epoch); `false` when there is none.
    fn join_spare(&mut self, index: usize, now: Time) -> bool {
        let suspect_after = self.suspect_after;
        let chain = &mut self.chains[index];
        if chain.route.devices.len() >= MAX_CHAIN_DEVICES {
            return false;
        }
        let live = chain.spares.iter().position(|(_, address)| {
            chain
                .views
                .get(address)
                .is_some_and(|view| now - view.heard < suspect_after)
        });
        let Some(at) = live else { return false };
        let spare = chain.spares.remove(at);
        let after = chain.route.last();
        chain.route.devices.push(spare);
        self.epoch += 1;
        self.save = true;
        self.counters.spares_joined += 1;
        self.events.push_back(PlannerEvent::SpareJoined {
            server_id: chain.server_id,
            device: spare,
            after,
            epoch: self.epoch,
        });
        true
    }

    /// The plan to save before anything else goes out (every change, and the first start).
    pub fn poll_save(&mut self) -> Option<Vec<u8>> {
        if !self.save {
            return None;
        }
        self.save = false;
        // Saved: every node of a changed chain hears of it now (the others on their next
        // status).
        for index in 0..self.chains.len() {
            let targets: Vec<(SocketAddr, u64)> = {
                let chain = &self.chains[index];
                let devices = chain
                    .routes_devices()
                    .then_some(chain.route.devices.iter().chain(&chain.spares));
                devices
                    .into_iter()
                    .flatten()
                    .map(|(_, address)| *address)
                    .chain([chain.route.server])
                    .chain(chain.route.replicas.iter().copied())
                    .filter_map(|address| {
                        let view = chain.views.get(&address)?;
                        (view.epoch != self.epoch).then_some((address, view.boot))
                    })
                    .collect()
            };
            for (address, boot) in targets {
                self.send_route(index, address, boot);
            }
        }
        Some(encode_plan(self.epoch, &self.chains))
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<PlannerEvent> {
        self.events.pop_front()
    }

    /// When a live device is next due to be suspected (or a spare may be put in).
    pub fn poll_timeout(&self, now: Time) -> Time {
        let mut next = now + self.suspect_after;
        for chain in &self.chains {
            if chain.route.devices.len() >= 2 {
                for (_, address) in &chain.route.devices {
                    next = next.min(self.suspect_at(chain, *address));
                }
            }
            if !chain.route.replicas.is_empty() {
                for address in chain.route.replicas.iter().chain([&chain.route.server]) {
                    next = next.min(self.suspect_at(chain, *address));
                }
            }
        }
        next.max(now)
    }
}

/// Push `item`, dropping the oldest past `max`.
fn push_bounded<T>(list: &mut Vec<T>, item: T, max: usize) {
    list.push(item);
    if list.len() > max {
        list.remove(0);
    }
}

fn push_device(out: &mut Vec<u8>, (id, address): (u16, SocketAddr)) {
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&encode_client_address(address));
}

fn push_devices(out: &mut Vec<u8>, devices: &[(u16, SocketAddr)]) {
    out.push(devices.len() as u8);
    for device in devices {
        push_device(out, *device);
    }
}

/// The plan as saved: version, epoch, then per chain its server id and address, its devices,
/// spares and devices removed (each a count and (id, address) entries).
fn encode_plan(epoch: u64, chains: &[Chain]) -> Vec<u8> {
    let mut out = vec![STATE_VERSION];
    out.extend_from_slice(&epoch.to_be_bytes());
    out.push(chains.len() as u8);
    for chain in chains {
        out.extend_from_slice(&chain.server_id.to_be_bytes());
        out.extend_from_slice(&encode_client_address(chain.route.server));
        out.push(chain.wanted);
        push_devices(&mut out, &chain.route.devices);
        push_devices(&mut out, &chain.spares);
        push_devices(&mut out, &chain.removed);
        push_addresses(&mut out, &chain.route.replicas);
        push_addresses(&mut out, &chain.servers_removed);
    }
    out
}

fn push_addresses(out: &mut Vec<u8>, addresses: &[SocketAddr]) {
    out.push(addresses.len() as u8);
    for address in addresses {
        out.extend_from_slice(&encode_client_address(*address));
    }
}

type SavedChain = (
    u8,
    ChainRoute,
    Vec<(u16, SocketAddr)>,
    Vec<(u16, SocketAddr)>,
    Vec<SocketAddr>,
);

/// A saved plan; `None` when damaged. Never panics.
fn decode_plan(bytes: &[u8]) -> Option<(u64, BTreeMap<u16, SavedChain>)> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, len: usize) -> Option<&'a [u8]> {
            (self.0.len() >= len).then(|| {
                let (front, rest) = self.0.split_at(len);
                self.0 = rest;
                front
            })
        }
        fn address(&mut self) -> Option<SocketAddr> {
            decode_client_address(self.take(CLIENT_ADDRESS_LEN)?).ok()
        }
        fn addresses(&mut self) -> Option<Vec<SocketAddr>> {
            let count = usize::from(self.take(1)?[0]);
            if count > 2 * MAX_CHAIN_REPLICAS {
                return None;
            }
            (0..count).map(|_| self.address()).collect()
        }
        fn devices(&mut self) -> Option<Vec<(u16, SocketAddr)>> {
            let count = usize::from(self.take(1)?[0]);
            if count > 2 * MAX_CHAIN_DEVICES {
                return None;
            }
            (0..count)
                .map(|_| {
                    let id = u16::from_be_bytes(self.take(2)?.try_into().ok()?);
                    Some((id, self.address()?))
                })
                .collect()
        }
    }
    let mut reader = Reader(bytes);
    if reader.take(1)? != [STATE_VERSION] {
        return None;
    }
    let epoch = u64::from_be_bytes(reader.take(8)?.try_into().ok()?);
    let count = usize::from(reader.take(1)?[0]);
    let mut chains = BTreeMap::new();
    for _ in 0..count {
        let server_id = u16::from_be_bytes(reader.take(2)?.try_into().ok()?);
        let server = reader.address()?;
        let wanted = reader.take(1)?[0];
        let devices = reader.devices()?;
        let spares = reader.devices()?;
        let removed = reader.devices()?;
        let replicas = reader.addresses()?;
        let servers_removed = reader.addresses()?;
        let route = ChainRoute {
            devices,
            server,
            replicas,
        };
        route.check().ok()?;
        chains.insert(server_id, (wanted, route, spares, removed, servers_removed));
    }
    reader.0.is_empty().then_some((epoch, chains))
}

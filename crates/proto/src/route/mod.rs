//! Automatic failover of devices in series (docs/replication.md, "Automatic failover"): the
//! controller's side ([`Planner`]: the chains, the nodes' statuses, a device silent too long
//! taken out, a spare put in) and a node's ([`Follower`]: its statuses, and the routes it takes).
//!
//! A node — a device of a chain, the chain's server, or a client — names the controllers
//! (`--controller`). A device and a server send each of them a status every
//! [`FollowerConfig::interval`]; a client sends one only when its requests go unanswered (it
//! asks where the chain starts now). The controller answers a status that runs an older epoch
//! than its own with a route: the chain's devices in order and its server. The node takes a
//! route only from a controller's address, only for its own boot number (a route replayed
//! after a restart changes nothing), and only newer than the epoch it runs; what it changes (a
//! device's next hop and the device before it, a server's device, a client's first device)
//! its owner applies as a restart in place with the new addresses — the procedure an operator
//! follows by hand, which the swarm and the tests prove.

mod planner;

pub use planner::{
    ChainSpec, PlannedChain, Planner, PlannerConfig, PlannerCounters, PlannerEvent, EPOCH_LIMIT,
    START_GRACE,
};

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::route::{ChainRoute, NodeStatus, Role, Route, NODE_STATUS, ROUTE};
use pmnet_wire::{Header, PacketType};

use crate::{DropReason, Time, Transmit};

/// Controllers a node names, at most.
pub const CONTROLLERS_MAX: usize = 7;

/// A node's settings for following the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerConfig {
    /// The controllers (the leader answers; the others stand by). Empty: no controller.
    pub controllers: Vec<SocketAddr>,
    pub role: Role,
    /// The chain's server id.
    pub server_id: u16,
    /// A device's id (0 for a server or client).
    pub device_id: u16,
    /// Random at each start of the process (kept across restarts in place).
    pub boot: u64,
    /// The epoch of the route the node runs (0: its command line).
    pub epoch: u64,
    /// Between two statuses (a device's and a server's heartbeat; a client's fastest
    /// question).
    pub interval: Duration,
}

impl FollowerConfig {
    pub fn new(controllers: Vec<SocketAddr>, role: Role, server_id: u16, boot: u64) -> Self {
        FollowerConfig {
            controllers,
            role,
            server_id,
            device_id: 0,
            boot,
            epoch: 0,
            interval: Duration::from_millis(10),
        }
    }
}

/// What a follower counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowerCounters {
    pub statuses_sent: u64,
    /// Routes of a newer epoch taken.
    pub routes_taken: u64,
    /// Routes for another boot or an epoch not newer than the one run: ignored.
    pub routes_stale: u64,
}

/// A node's side. See the module docs.
#[derive(Debug)]
pub struct Follower {
    config: FollowerConfig,
    /// A server's applied position, as its owner last gave it.
    position: u64,
    next_status: Time,
    /// A client asks only while this is set (its requests go unanswered).
    asking: bool,
    /// The last route taken, for its owner to apply.
    taken: Option<Route>,
    transmits: VecDeque<Transmit>,
    counters: FollowerCounters,
}

impl Follower {
    pub fn new(config: FollowerConfig, now: Time) -> Follower {
        assert!(
            config.controllers.len() <= CONTROLLERS_MAX,
            "at most {CONTROLLERS_MAX} controllers"
        );
        Follower {
            config,
            position: 0,
            next_status: now,
            asking: false,
            taken: None,
            transmits: VecDeque::new(),
            counters: FollowerCounters::default(),
        }
    }

    pub fn config(&self) -> &FollowerConfig {
        &self.config
    }

    pub fn is_on(&self) -> bool {
        !self.config.controllers.is_empty()
    }

    pub fn epoch(&self) -> u64 {
        self.config.epoch
    }

    pub fn counters(&self) -> FollowerCounters {
        self.counters
    }

    /// Whether `from` is one of the controllers.
    pub fn is_controller(&self, from: SocketAddr) -> bool {
        self.config.controllers.contains(&from)
    }

    /// A client: ask the controllers where the chain starts now (its requests go
    /// unanswered), once per interval, until its requests are answered again
    /// ([`Follower::answered`]): the route that moves the chain's start may come only once
    /// the controller took the lost device out.
    pub fn ask(&mut self) {
        self.asking = true;
    }

    /// A server's applied position, for its next statuses (the controller promotes the
    /// replica furthest along).
    pub fn set_position(&mut self, position: u64) {
        self.position = position;
    }

    /// Whether a status is due at `now`.
    pub fn status_due(&self, now: Time) -> bool {
        self.is_on() && now >= self.next_status
    }

    /// A client's requests are answered again: it stops asking.
    pub fn answered(&mut self) {
        self.asking = false;
    }

    /// A route from `from` (header and payload already verified by the owner's keys): taken
    /// when it is from a controller, for this boot and newer than the epoch run. `Ok(true)`:
    /// taken ([`Follower::take_route`] has it); `Ok(false)`: stale, ignored.
    pub fn on_route(
        &mut self,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) -> Result<bool, DropReason> {
        if !self.is_controller(from) {
            return Err(DropReason::UnexpectedSource);
        }
        if header.server_id != self.config.server_id {
            return Err(DropReason::WrongServer);
        }
        let route = Route::parse(payload).map_err(|_| DropReason::BadPayload)?;
        if route.boot != self.config.boot || route.epoch <= self.config.epoch {
            self.counters.routes_stale += 1;
            return Ok(false);
        }
        self.config.epoch = route.epoch;
        self.counters.routes_taken += 1;
        self.taken = Some(route);
        Ok(true)
    }

    /// The route last taken, once.
    pub fn take_route(&mut self) -> Option<Route> {
        self.taken.take()
    }

    pub fn handle_timeout(&mut self, now: Time) {
        if !self.is_on() || now < self.next_status {
            return;
        }
        self.next_status = now + self.config.interval;
        if self.config.role == Role::Client && !self.asking {
            return;
        }
        let status = NodeStatus {
            role: self.config.role,
            boot: self.config.boot,
            epoch: self.config.epoch,
            // The owner's clock in milliseconds, plus one: rising within a boot (a restart in
            // place keeps the clock).
            stamp: now.as_nanos() / 1_000_000 + 1,
            position: self.position,
        };
        let header = Header {
            device_id: self.config.device_id,
            ..Header::new(
                PacketType::Reserved(NODE_STATUS),
                self.config.server_id,
                self.config.boot,
                0,
            )
        };
        let mut payload = Vec::with_capacity(pmnet_wire::route::NODE_STATUS_LEN);
        status.emit(&mut payload);
        let bytes = pmnet_wire::to_sendable(&header.encode(&payload));
        for &controller in &self.config.controllers {
            self.counters.statuses_sent += 1;
            self.transmits.push_back(Transmit {
                destination: controller,
                bytes: bytes.clone(),
            });
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        let waiting = self.config.role != Role::Client || self.asking;
        (self.is_on() && waiting).then_some(self.next_status)
    }
}

/// Whether `header` is a route (its owner hands it to [`Follower::on_route`]).
pub fn is_route(header: &Header) -> bool {
    header.packet_type == PacketType::Reserved(ROUTE)
}

/// What a route changes for the device `device_id`: its next hop and the device before it
/// (`None` when it is the first). `None` when the route leaves it out of the chain.
pub fn device_place(
    chain: &ChainRoute,
    device_id: u16,
) -> Option<(SocketAddr, Option<(u16, SocketAddr)>)> {
    let (_, address) = chain.devices.iter().find(|(id, _)| *id == device_id)?;
    chain.place_of(*address)
}

/// A device's place in a chain as its settings: what its owner restarts it in place with
/// when it takes a route (the runtime's device, the simulator's world).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSettings {
    /// Where it forwards: the next device, or the chain's server.
    pub next: SocketAddr,
    /// The device before it, `None` when it is the first (it takes requests from clients).
    pub previous: Option<(u16, SocketAddr)>,
    /// [`crate::DeviceConfig::servers`]: the chain's server id, reached through `next`.
    pub servers: Vec<(u16, SocketAddr)>,
    /// [`crate::DeviceConfig::previous_devices`]: the device before it for the chain's server
    /// id, if any.
    pub previous_devices: Vec<(u16, SocketAddr)>,
}

/// The settings of device `device_id` at its place in `chain`, the chain of server
/// `server_id`; `None` when the route leaves it out of the chain.
pub fn device_settings(
    chain: &ChainRoute,
    server_id: u16,
    device_id: u16,
) -> Option<DeviceSettings> {
    let (next, previous) = device_place(chain, device_id)?;
    Some(DeviceSettings {
        next,
        previous,
        servers: vec![(server_id, next)],
        previous_devices: previous
            .map(|(_, address)| (server_id, address))
            .into_iter()
            .collect(),
    })
}

/// The settings of a spare device of the chain of server `server_id` (a device the route
/// does not place): it forwards to the chain's server, and no device comes before it. A
/// route sent to a spare moves it when a replica was promoted, so that what its log holds
/// (and what it logs until it joins) goes to the primary there is now.
pub fn spare_settings(chain: &ChainRoute, server_id: u16) -> DeviceSettings {
    DeviceSettings {
        next: chain.server,
        previous: None,
        servers: vec![(server_id, chain.server)],
        previous_devices: Vec::new(),
    }
}

#[cfg(test)]
mod tests;

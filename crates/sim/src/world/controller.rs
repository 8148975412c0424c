//! The controller of the devices in series ([`World::with_controller`]): the production
//! planner's saves, routes and events, and each device's taken route applied as the runtime
//! applies it (`crates/runtime/src/device/route.rs`): a restart in place with the next hop and
//! the device before it that its place in the chain gives, the follower's epoch carried over.

use std::net::SocketAddr;

use pmnet_pm::PmLog;
use pmnet_proto::route::{device_settings, spare_settings, PlannerEvent};
use pmnet_proto::Device;

use super::{controller_addr, device_addr, replica_addr, server_addr, World};

#[cfg(doc)]
use super::SERVER_DOWN_MAX;
#[cfg(doc)]
use pmnet_proto::Server;

impl World {
    /// The controller's plan saved, its routes sent and its events noted; whether anything
    /// happened.
    pub(super) fn flush_controller(&mut self) -> bool {
        let Some(node) = self.controller.as_mut() else {
            return false;
        };
        let mut progressed = false;
        // Saved before any route of the new plan goes out (it queues them).
        if let Some(plan) = node.planner.poll_save() {
            node.saved = Some(plan);
            progressed = true;
        }
        let mut events = Vec::new();
        while let Some(event) = node.planner.poll_event() {
            events.push(event);
        }
        let mut out = Vec::new();
        while let Some(transmit) = node.planner.poll_transmit() {
            out.push(transmit);
        }
        progressed |= !events.is_empty() || !out.is_empty();
        for event in events {
            self.on_planner_event(event);
        }
        for transmit in out {
            self.enqueue(controller_addr(), transmit);
        }
        progressed
    }

    /// A change of the plan: the chain as the world knows it follows it. A live device taken
    /// out (suspected wrongly) counts as a device lost: the seed's losses allow it, or the
    /// run fails.
    fn on_planner_event(&mut self, event: PlannerEvent) {
        self.note("controller", || event.to_string());
        if let PlannerEvent::Removed {
            device: (_, address),
            ..
        } = event
        {
            let index = (0..self.devices.len())
                .find(|&index| device_addr(index) == address)
                .expect("a device of the world");
            if !self.devices[index].lost {
                assert!(
                    self.device_losses_allowed > 0,
                    "invariant: device {index}, live, was taken out of the chain (no status for \
                     the suspicion delay) beyond the losses the seed allows"
                );
                self.device_losses_allowed -= 1;
                if let Some(node) = self.controller.as_mut() {
                    node.wrongly_suspected += 1;
                }
                self.note_by(
                    "controller",
                    &format!("device{index} is live: taken out wrongly, counted as a device lost"),
                );
            }
        }
        match event {
            PlannerEvent::Promoted { lost, primary, .. } => {
                self.check_server_lost(lost, "replaced as the primary");
                let replica = (0..self.replicas.len())
                    .find(|&index| replica_addr(index) == primary)
                    .expect("a replica of the world");
                // One chain: server 0's.
                self.promoted[0] = Some(replica);
            }
            PlannerEvent::ReplicaRemoved { replica, .. } => {
                self.check_server_lost(replica, "taken out of the primary's replicas");
            }
            _ => {}
        }
        let Some(node) = self.controller.as_ref() else {
            return;
        };
        let chain: Vec<usize> = node
            .planner
            .chains()
            .flat_map(|(_, route, _, _)| route.devices.iter())
            .filter_map(|(_, address)| {
                (0..self.devices.len()).find(|&i| device_addr(i) == *address)
            })
            .collect();
        self.chain = chain;
    }

    /// The server at `address` was replaced or taken out: it must be one lost for good. A
    /// live server is never silent for the suspicion delay ([`SERVER_DOWN_MAX`]), so one taken
    /// out fails the run.
    fn check_server_lost(&mut self, address: SocketAddr, what: &str) {
        let node = if let Some(index) = (0..self.servers.len()).find(|&i| server_addr(i) == address)
        {
            &self.servers[index]
        } else {
            let index = (0..self.replicas.len())
                .find(|&i| replica_addr(i) == address)
                .expect("a server of the world");
            &self.replicas[index]
        };
        assert!(
            node.lost,
            "invariant: {}, live, was {what} (no status for the suspicion delay)",
            super::node_name(address)
        );
    }

    /// Server `index` (replica `index` if `replica`), if up, was asked by a route to restart
    /// in place (a replica promoted, a replica's primary replaced, the primary's replicas
    /// changed: [`Server::take_restart`]): at the end of its turn, as the runtime does, it
    /// reopens its store and forward log with the route's devices and replicas. Whether it
    /// did.
    pub(super) fn follow_server_route(&mut self, replica: bool, index: usize) -> bool {
        let node = if replica {
            &mut self.replicas[index]
        } else {
            &mut self.servers[index]
        };
        if !node.up {
            return false;
        }
        let Some((devices, replicas)) = node.server.take_restart() else {
            return false;
        };
        // The end of its turn: what it applied, persisted and sent is done.
        while self.flush_server(replica, index) {}
        let now = self.now;
        let (node, actor) = if replica {
            (&mut self.replicas[index], format!("replica{index}"))
        } else {
            (&mut self.servers[index], format!("server{index}"))
        };
        let names = |addresses: &[SocketAddr]| {
            let names: Vec<String> = addresses.iter().map(|a| super::node_name(*a)).collect();
            format!("[{}]", names.join(", "))
        };
        let text = format!(
            "route epoch {}: restarting in place with devices {} and replicas {} (was devices \
                 {}, replicas {})",
            node.server
                .follower()
                .map_or(0, |follower| follower.epoch()),
            names(&devices),
            names(&replicas),
            names(&node.server.config().devices),
            names(&node.config.replicas),
        );
        let sessions = node.restart_in_place(now, devices, replicas);
        self.note_by(&actor, &text);
        self.note_by(
            &actor,
            &format!(
                "restarted in place: store and forward log reopened, {sessions} sessions \
                 recovered"
            ),
        );
        true
    }

    /// Device `index` (if up) took a route: its settings follow its place in the chain, and
    /// when they changed it restarts in place. Whether it took one.
    pub(super) fn follow_device_route(&mut self, index: usize) -> bool {
        let node = &mut self.devices[index];
        if !node.up {
            return false;
        }
        let Some(route) = node.pipeline.device_mut().take_route() else {
            return false;
        };
        node.routes_taken += 1;
        let device_id = node.config.device_id;
        let Some(follow) = node.config.follow.as_mut() else {
            return true;
        };
        follow.epoch = route.epoch;
        let (server_id, epoch) = (follow.server_id, route.epoch);
        let name = |address| super::node_name(address);
        let current: Vec<String> = (node.config.servers.iter())
            .map(|(_, address)| name(*address))
            .collect();
        let current = current.join(", ");
        let actor = format!("device{index}");
        let Some(place) = device_settings(&route.chain, server_id, device_id) else {
            // A spare: it forwards to the chain's server, wherever a promotion moved it.
            let spare = spare_settings(&route.chain, server_id);
            if spare.servers == node.config.servers
                && spare.previous_devices == node.config.previous_devices
            {
                self.note_by(
                    &actor,
                    &format!(
                        "route epoch {epoch}: a spare, forwarding to the chain's server \
                         {current}"
                    ),
                );
                return true;
            }
            let next = name(spare.next);
            node.config.servers = spare.servers;
            node.config.previous_devices = spare.previous_devices;
            self.note_by(
                &actor,
                &format!(
                    "route epoch {epoch}: a spare, now forwarding to the chain's server {next} \
                     (was forwarding to {current}); restarting in place"
                ),
            );
            self.restart_device_in_place(index);
            return true;
        };
        let after = place
            .previous
            .map_or_else(|| "the clients".to_string(), |(_, address)| name(address));
        let next = name(place.next);
        if place.servers == node.config.servers
            && place.previous_devices == node.config.previous_devices
        {
            self.note_by(
                &actor,
                &format!(
                    "route epoch {epoch}: its place is unchanged (after {after}, forwarding to \
                     {next})"
                ),
            );
            return true;
        }
        let was_after = node
            .config
            .previous_devices
            .first()
            .map_or_else(|| "the clients".to_string(), |(_, address)| name(*address));
        node.config.servers = place.servers;
        node.config.previous_devices = place.previous_devices;
        self.note_by(
            &actor,
            &format!(
                "route epoch {epoch}: now after {after}, forwarding to {next} (was after \
                 {was_after}, forwarding to {current}); restarting in place"
            ),
        );
        self.restart_device_in_place(index);
        true
    }

    /// Restart device `index` in place, as the runtime does for a route: at the end of a
    /// turn, its persistence work carried out and what it sent gone out; the log closed,
    /// opened and recovered again, and the state machine rebuilt from it with the settings
    /// as they are now (its follower's boot and epoch among them), every entry replayed to
    /// the new next hop.
    fn restart_device_in_place(&mut self, index: usize) {
        let hold = self.devices[index].hold_persistence;
        self.devices[index].hold_persistence = false;
        while self.flush_device(index) {}
        self.devices[index].hold_persistence = hold;
        let now = self.now;
        let node = &mut self.devices[index];
        // Every write is persisted: the log as it was closed.
        let region = node.log.region().crash_losing_unpersisted();
        let (log, recovery) = PmLog::open(region).expect("reopen a device log in place");
        node.rejected_slot_count += u64::from(recovery.rejected_slot_count);
        let recovered = recovery.entries.len();
        node.ever_durable
            .extend(recovery.entries.iter().map(|entry| entry.key));
        node.acks_sent_direct_before_restart += node.device().counters().acks_sent_direct;
        node.pipeline = node.pipeline_for(Device::new(node.config.clone(), now, recovery.entries));
        node.log = log;
        node.restarts_in_place += 1;
        self.note_by(
            &format!("device{index}"),
            &format!(
                "restarted in place: log reopened, {recovered} entries recovered and replayed"
            ),
        );
    }
}

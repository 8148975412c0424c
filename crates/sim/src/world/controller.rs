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
        let Some(node) = self.controller.as_mut().filter(|node| node.up) else {
            return false;
        };
        let mut progressed = false;
        let mut crash_for = None;
        // Saved before any route of the new plan goes out (it queues them).
        if let Some(plan) = node.planner.poll_save() {
            node.saved = Some(plan);
            progressed = true;
            crash_for = node.crash_at_next_save.take();
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
        self.check_plan_epoch();
        // The saved plan's changes stand (the restarted planner holds them), whether or not
        // its routes go out.
        for event in events {
            self.on_planner_event(event);
        }
        if let Some(down) = crash_for {
            let routes = out.len();
            self.note_by(
                "controller",
                &format!("CRASH right after saving its plan: {routes} route(s) of it never sent"),
            );
            if let Some(node) = self.controller.as_mut() {
                node.crashes_at_save += 1;
            }
            self.crash_controller(Some(down));
            return true;
        }
        for transmit in out {
            self.enqueue(controller_addr(), transmit);
        }
        progressed
    }

    /// The plan the controller holds now (saved: every route goes out from a saved plan) is
    /// the one its epoch named before, in this incarnation or an earlier one: an epoch never
    /// names two plans.
    fn check_plan_epoch(&mut self) {
        let Some(node) = self.controller.as_mut() else {
            return;
        };
        let epoch = node.planner.epoch();
        let chains: Vec<&pmnet_wire::route::ChainRoute> = node
            .planner
            .chains()
            .map(|(_, route, _, _)| route)
            .collect();
        match node.epochs.get(&epoch) {
            Some(known) => assert!(
                known.iter().eq(chains.iter().copied()),
                "invariant: epoch {epoch} names two plans: {known:?} and now {chains:?} (the \
                 controller restarted {} time(s))",
                node.restarts
            ),
            None => {
                let chains = chains.into_iter().cloned().collect();
                node.epochs.insert(epoch, chains);
            }
        }
    }

    /// The controller's process crashes: what it held in memory (the nodes' statuses, the
    /// routes it had not sent) is gone, its saved plan stays (etcd holds it). While down it
    /// receives nothing and sends nothing; it starts again after `down` if given (else when
    /// told, [`World::restart_controller`]).
    pub fn crash_controller(&mut self, down: Option<std::time::Duration>) {
        let now = self.now;
        let Some(node) = self.controller.as_mut().filter(|node| node.up) else {
            return;
        };
        node.up = false;
        node.crashes += 1;
        node.restart_at = down.map(|down| now + down);
        let epoch = node.planner.epoch();
        let until = match down {
            Some(down) => format!("down for {down:?}"),
            None => "down".to_string(),
        };
        self.note_by(
            "controller",
            &format!(
                "CRASH: its memory lost (statuses heard, routes not sent), the plan it saved \
                 (epoch {epoch}) kept; {until}"
            ),
        );
    }

    /// Crash the controller right after its next save, before any route of that plan goes
    /// out (a process killed between its etcd write and its sends), down for `down` then.
    pub fn crash_controller_at_next_save(&mut self, down: std::time::Duration) {
        if let Some(node) = self.controller.as_mut() {
            node.crash_at_next_save = Some(down);
        }
    }

    /// Start a crashed controller again, from the plan it last saved, as
    /// `pmnet controller` starts (or a standby takes over) from the plan in etcd.
    pub fn restart_controller(&mut self) {
        self.restart_controller_now();
        self.flush_outputs();
    }

    /// [`World::restart_controller`] without flushing what it sends.
    pub(super) fn restart_controller_now(&mut self) {
        let now = self.now;
        let Some(node) = self.controller.as_mut().filter(|node| !node.up) else {
            return;
        };
        let before = node.counters();
        let planner =
            pmnet_proto::route::Planner::new(node.config.clone(), now, node.saved.as_deref())
                .expect("the controller starts again from the plan it saved");
        node.planner = planner;
        node.counters_before = before;
        node.up = true;
        node.restart_at = None;
        node.restarts += 1;
        let epoch = node.planner.epoch();
        self.note_by(
            "controller",
            &format!(
                "restarted from its saved plan (epoch {epoch}); every node unheard (a device \
                 never heard since is suspected only after {:?})",
                pmnet_proto::route::START_GRACE
            ),
        );
        self.check_nodes_behind_plan();
        self.follow_plan();
    }

    /// Every node runs an epoch the restored plan has reached: routes go out only from a
    /// saved plan, so no node can run one newer than the last save.
    fn check_nodes_behind_plan(&self) {
        let Some(node) = self.controller.as_ref() else {
            return;
        };
        let epoch = node.planner.epoch();
        let devices = (self.devices.iter().enumerate()).filter_map(|(index, node)| {
            let follower = node.device().follower()?;
            Some((format!("device{index}"), follower.epoch()))
        });
        let servers = (self.servers.iter().enumerate())
            .map(|(index, node)| (format!("server{index}"), node))
            .chain(
                (self.replicas.iter().enumerate())
                    .map(|(index, node)| (format!("replica{index}"), node)),
            )
            .filter_map(|(name, node)| Some((name, node.server.follower()?.epoch())));
        for (name, runs) in devices.chain(servers) {
            assert!(
                runs <= epoch,
                "invariant: {name} runs epoch {runs}, newer than the plan the controller \
                 restarted from (epoch {epoch}): a route went out before its plan was saved"
            );
        }
    }

    /// The chain as the world knows it: the plan's devices in order.
    fn follow_plan(&mut self) {
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
        self.follow_plan();
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
        // The follower's rules: only a newer route than the one run, and only a plan the
        // controller saved and sent under that epoch.
        assert!(
            route.epoch > follow.epoch,
            "invariant: device{index} took the route of epoch {}, not newer than the epoch {} \
             it runs",
            route.epoch,
            follow.epoch
        );
        if let Some(known) = (self.controller.as_ref()).and_then(|c| c.epochs.get(&route.epoch)) {
            assert!(
                known.contains(&route.chain),
                "invariant: device{index} took a route of epoch {} naming {:?}, which the \
                 plan of that epoch did not ({known:?})",
                route.epoch,
                route.chain
            );
        } else {
            panic!(
                "invariant: device{index} took a route of epoch {}, which no plan the \
                 controller saved had",
                route.epoch
            );
        }
        let node = &mut self.devices[index];
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

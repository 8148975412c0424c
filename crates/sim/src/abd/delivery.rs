//! Replicated memory's world's network step: the attacker's replays, each datagram due
//! delivered to its node or the device (through their pipelines) or its client; then the
//! nodes' timers (a node that became a member again checked), the device's; then the clock
//! moves to the next event.

use std::time::Duration;

use pmnet_wire::Header;

use super::durability_checker::durable_on_majority;
use super::world::{client_addr, device_addr, flush_node, node_addr, send_all};
use super::world::{AbdWorld, Engine};

impl AbdWorld {
    /// Deliver every datagram due now.
    pub(super) fn deliver(&mut self) {
        let now = self.now;
        self.network.strike(now);
        while let Some(delivery) = self.network.deliver_due(now) {
            let (from, to, bytes) = (delivery.from, delivery.to, delivery.bytes);
            let up = match (0..self.nodes.len()).find(|&index| node_addr(index) == to) {
                Some(index) => self.nodes[index].up,
                None => to != device_addr() || self.device_up,
            };
            let fate = if up { "" } else { " [lost: the node is down]" };
            self.network.note_recv(now, from, to, &bytes, fate);
            if let Some(index) = (0..self.nodes.len()).find(|&index| node_addr(index) == to) {
                let node = &mut self.nodes[index];
                if node.up {
                    node.host.handle(now, from, &bytes);
                    flush_node(node, index, now, &mut self.network, &mut self.rng);
                }
            } else if to == device_addr() {
                if self.device_up {
                    self.device.handle(now, from, &bytes);
                    let device = &mut self.device;
                    send_all(
                        device_addr(),
                        now,
                        &mut self.network,
                        &mut self.stores,
                        std::iter::from_fn(|| device.poll_transmit()),
                    );
                }
            } else if let Some(index) = (0..self.clients.len()).find(|&i| client_addr(i) == to) {
                let Ok((header, payload)) = Header::parse(&bytes) else {
                    continue;
                };
                match &mut self.clients[index].engine {
                    Engine::Device(session) => session.handle(now, &header, payload),
                    Engine::Direct(coordinator) => coordinator.handle(now, from, &header, payload),
                }
            }
        }
    }

    /// The nodes' timers (each node that became a member again is checked: its lines, and
    /// every acknowledged write still findable), then the device's. A timestamp stored with
    /// two values fails the run here.
    pub(super) fn fire_timers(&mut self) -> Result<(), String> {
        let now = self.now;
        let running = self.running();
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            if !node.up {
                continue;
            }
            node.host.handle_timeout(now);
            flush_node(node, index, now, &mut self.network, &mut self.rng);
            let member = node.node().is_member();
            if member && !node.was_member && running {
                self.report.joins += 1;
                self.stores
                    .check_node(node.node(), &format!("{now}: node {index} joined"))?;
                self.joined = Some(index);
                let text = format!("memnode{index} is a member again");
                self.network.trace.note(now, "sim", || text);
            }
            node.was_member = member;
        }
        if let Some(index) = self.joined.take() {
            durable_on_majority(&self.nodes, &self.acked)
                .map_err(|error| format!("{now}: once node {index} joined, {error}"))?;
        }
        if self.device_up {
            self.device.handle_timeout(now);
            let device = &mut self.device;
            send_all(
                device_addr(),
                now,
                &mut self.network,
                &mut self.stores,
                std::iter::from_fn(|| device.poll_transmit()),
            );
        }
        match &self.stores.clash {
            Some(clash) => Err(clash.clone()),
            None => Ok(()),
        }
    }

    /// Move the clock to the next event (at most 1 ms on).
    pub(super) fn advance(&mut self) {
        let now = self.now;
        let running = self.running();
        let healing = self.healing();
        let mut next = now + Duration::from_millis(1);
        let mut consider = |at: Option<pmnet_proto::Time>| {
            if let Some(at) = at {
                next = next.min(at);
            }
        };
        consider(self.network.next_due());
        consider(self.faults.first().map(|(at, _)| *at));
        consider(self.device_restart_at);
        if self.device_up {
            consider(self.device.poll_timeout());
        }
        if running && !healing {
            consider(Some(self.end_of_safety));
        }
        for node in &self.nodes {
            consider(node.restart_at);
            if node.up {
                consider(node.host.poll_timeout());
                consider(node.persisting.front().map(|(at, ..)| *at));
            }
        }
        for client in &self.clients {
            if running && client.in_flight.len() < client.depth {
                consider(Some(client.next_at));
            }
            consider(match &client.engine {
                Engine::Device(session) => session.poll_timeout(),
                Engine::Direct(coordinator) => coordinator.poll_timeout(),
            });
        }
        self.now = next.max(now + Duration::from_micros(1));
        self.network.set_wall(self.now);
    }
}

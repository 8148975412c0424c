//! The chain store's world's network step: the attacker's replays, each datagram due
//! delivered to its member (through the member's pipeline), the controller or its client;
//! then the members' and the controller's timers; then the clock moves to the next event.

use std::time::Duration;

use super::world::{
    client_addr, controller_addr, flush_controller, flush_member, member_addr, ChainWorld, CLIENTS,
    MEMBERS,
};

impl ChainWorld {
    /// Deliver every datagram due now (what the receiver sends in answer goes on the network).
    pub(super) fn deliver(&mut self) {
        let now = self.now;
        self.network.strike(now);
        while let Some(delivery) = self.network.deliver_due(now) {
            let (from, to, bytes) = (delivery.from, delivery.to, delivery.bytes);
            let up = match (0..MEMBERS).find(|&index| member_addr(index) == to) {
                Some(index) => self.members[index].up,
                None => to != controller_addr(self.leader) || self.controller_up,
            };
            let fate = if to == controller_addr(1 - self.leader) {
                " [ignored: that controller stands by]"
            } else if up {
                ""
            } else {
                " [lost: the node is down]"
            };
            self.network.note_recv(now, from, to, &bytes, fate);
            if let Some(index) = (0..MEMBERS).find(|&index| member_addr(index) == to) {
                let member = &mut self.members[index];
                if member.up {
                    member.host.handle(now, from, &bytes);
                    flush_member(member, index, now, &mut self.network);
                }
            } else if to == controller_addr(self.leader) {
                if self.controller_up {
                    self.controller.handle(now, from, &bytes);
                    flush_controller(
                        &mut self.controller,
                        controller_addr(self.leader),
                        &mut self.saved,
                        now,
                        &mut self.network,
                    );
                }
            } else if let Some(index) = (0..CLIENTS).find(|&index| client_addr(index) == to) {
                let session = &mut self.clients[index].session;
                session.handle_from(now, from, &bytes);
                while let Some(transmit) = session.poll_transmit() {
                    self.network.send(
                        now,
                        client_addr(index),
                        transmit.destination,
                        transmit.bytes,
                    );
                }
            }
        }
    }

    /// The members' and the controller's timers.
    pub(super) fn fire_timers(&mut self) {
        let now = self.now;
        for (index, member) in self.members.iter_mut().enumerate() {
            if member.up {
                member.host.handle_timeout(now);
                flush_member(member, index, now, &mut self.network);
            }
        }
        if self.controller_up {
            self.controller.handle_timeout(now);
            flush_controller(
                &mut self.controller,
                controller_addr(self.leader),
                &mut self.saved,
                now,
                &mut self.network,
            );
        }
    }

    /// Move the clock to the next datagram or timer due (at most 200 µs on).
    pub(super) fn advance(&mut self) {
        let now = self.now;
        let due = self.network.next_due();
        let wake = self
            .members
            .iter()
            .filter(|member| member.up)
            .filter_map(|member| member.host.poll_timeout())
            .min();
        let next = [due, wake, Some(now + Duration::from_micros(200))]
            .into_iter()
            .flatten()
            .min()
            .expect("a time");
        self.now = next.max(now + Duration::from_micros(1));
        self.network.set_wall(self.now);
    }
}

//! The devices a server asks, changed while it runs: the controller's route moved the last
//! device of its chain (docs/replication.md, "Automatic failover"). Every question still open
//! with a device no longer asked — a gap's fill query, a hold round, the start-up recovery poll
//! — is asked of the new devices instead (a replica's fill query a primary asked its devices
//! for is forgotten: the replica asks again): a gap is skipped only once every device that
//! could hold it, as the chain is now, said it does not.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::route::Route;

use super::Server;
use crate::Time;

/// The applied position a server's statuses give is computed again at most this often (it
/// sums every session's last applied number).
const POSITION_INTERVAL: Duration = Duration::from_millis(100);

impl Server {
    /// A controller's route: this server's part in the chain. The primary (the route's
    /// server) asks the chain's last device; a replica asks its primary. Only a primary whose
    /// replicas stay the same changes its device live; any other change (a replica promoted,
    /// a replica's primary replaced, the primary's replicas changed) is a restart in place
    /// ([`Server::take_restart`]): the start-up a restart with new addresses goes through.
    pub(super) fn follow_route(&mut self, now: Time, route: &Route) {
        let chain = &route.chain;
        let (devices, replicas) = if route.to == chain.server {
            (vec![chain.last().1], chain.replicas.clone())
        } else if chain.replicas.contains(&route.to) {
            (vec![chain.server], Vec::new())
        } else {
            tracing::warn!(
                "route epoch {}: the controller took this server ({}) out of the chain of server \
                 {}; it answers what still comes to it",
                route.epoch,
                route.to,
                self.config.server_id
            );
            return;
        };
        if devices == self.config.devices && replicas == self.config.replicas {
            return;
        }
        if route.to == chain.server && replicas == self.config.replicas {
            tracing::info!(
                "route epoch {}: asking device {} from now on",
                route.epoch,
                chain.last().1
            );
            self.replace_devices(now, devices);
            return;
        }
        self.restart = Some((devices, replicas));
    }

    /// A restart in place the controller's route asks for: (devices, replicas), once.
    pub fn take_restart(&mut self) -> Option<(Vec<SocketAddr>, Vec<SocketAddr>)> {
        self.restart.take()
    }

    /// The applied position for a status, computed again at most every
    /// [`POSITION_INTERVAL`].
    pub(super) fn status_position(&mut self, now: Time) -> u64 {
        match self.position {
            Some((at, position)) if now - at < POSITION_INTERVAL => position,
            _ => {
                let position = self.applied_position();
                self.position = Some((now, position));
                position
            }
        }
    }

    /// The devices are now `devices`.
    pub fn replace_devices(&mut self, now: Time, devices: Vec<SocketAddr>) {
        if devices == self.config.devices {
            return;
        }
        let gone: Vec<SocketAddr> = self
            .config
            .devices
            .iter()
            .filter(|device| !devices.contains(device))
            .copied()
            .collect();
        let added: Vec<SocketAddr> = devices
            .iter()
            .filter(|device| !self.config.devices.contains(device))
            .copied()
            .collect();
        self.config.devices = devices.clone();
        self.holds.replace_devices(now, &devices);
        if let Some(recovery) = self.recovery.as_mut() {
            if gone.iter().any(|device| recovery.awaiting.remove(device)) {
                recovery.awaiting.extend(added.iter().copied());
                recovery.next_poll = now;
            }
        }
        let mut asked_again = Vec::new();
        for (session_id, session) in &mut self.table.sessions {
            let mut changed = false;
            for fill in &mut session.fills {
                if gone.iter().any(|device| fill.awaiting.remove(device)) {
                    fill.awaiting.extend(added.iter().copied());
                    changed = true;
                }
            }
            if changed {
                asked_again.push(*session_id);
            }
        }
        for session_id in asked_again {
            self.send_fill_queries(session_id);
        }
        self.replication.forget_fills_awaiting(&gone);
    }
}

//! The devices a server asks, changed while it runs: the controller's route moved the last
//! device of its chain (docs/replication.md, "Automatic failover"). Every question still open
//! with a device no longer asked — a gap's fill query, a hold round, the start-up recovery poll
//! — is asked of the new devices instead: a gap is skipped only once every device that could
//! hold it, as the chain is now, said it does not.

use std::net::SocketAddr;

use super::Server;
use crate::Time;

impl Server {
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
    }
}

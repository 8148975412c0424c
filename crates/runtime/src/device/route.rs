//! A device following the controllers' routes (docs/replication.md, "Automatic failover"): a
//! route that moves its next hop, or the device before it, restarts the device in place — its
//! log closed and recovered again, the state machine rebuilt from it and every entry it holds
//! replayed to the new next hop, as a restart of the process with the new addresses does —
//! while its sockets (and what waits in them) and its metrics endpoint stay.

use pmnet_proto::Device;

use super::open::{log_device_config, make_pipeline, open_device_log};
use super::{DeviceRuntime, ReplayProgress, REPLAY_REPORT_INTERVAL};
use crate::peers::PeerWatch;
use crate::RuntimeError;

impl DeviceRuntime {
    /// Take the route the device was handed, if any.
    pub(super) fn follow_route(&mut self) {
        let Some(route) = self.pipeline.device_mut().take_route() else {
            return;
        };
        let Some(follow) = self.options.follow.as_mut() else {
            return;
        };
        follow.epoch = route.epoch;
        let server_id = follow.server_id;
        let epoch = route.epoch;
        let current = self
            .options
            .servers
            .iter()
            .map(|(_, address)| address.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let Some(place) =
            pmnet_proto::route::device_settings(&route.chain, server_id, self.options.device_id)
        else {
            // A spare (the route does not place it): it forwards to the chain's server,
            // which a promotion moves.
            let spare = pmnet_proto::route::spare_settings(&route.chain, server_id);
            if spare.servers == self.options.servers
                && spare.previous_devices == self.options.previous_devices
            {
                tracing::info!(
                    "route epoch {epoch}: a spare of the chain of server {server_id}, \
                     forwarding to its server {current}"
                );
                return;
            }
            tracing::warn!(
                "route epoch {epoch}: a spare of the chain of server {server_id}, now \
                 forwarding to its server {} (was forwarding to {current}); restarting in \
                 place: what the log holds is replayed there",
                spare.next
            );
            self.options.servers = spare.servers;
            self.options.previous_devices = spare.previous_devices;
            if let Err(error) = self.restart_in_place() {
                tracing::error!("restarting in place for route epoch {epoch} failed: {error}");
                self.failed = Some(error.to_string());
                self.shutdown.request();
            }
            return;
        };
        let next = place.next;
        let after = place.previous.map_or_else(
            || "the clients".to_owned(),
            |(id, address)| format!("device {id} ({address})"),
        );
        if place.servers == self.options.servers
            && place.previous_devices == self.options.previous_devices
        {
            tracing::info!(
                "route epoch {epoch}: this device's place is unchanged (after {after}, \
                 forwarding to {next})"
            );
            return;
        }
        let was_after = self.options.previous_devices.first().map_or_else(
            || "the clients".to_owned(),
            |(_, address)| address.to_string(),
        );
        tracing::warn!(
            "route epoch {epoch}: now after {after}, forwarding to {next} (was after {was_after}, \
             forwarding to {current}); restarting in place: the log is recovered and what it \
             holds replayed to {next}"
        );
        self.options.servers = place.servers;
        self.options.previous_devices = place.previous_devices;
        if let Err(error) = self.restart_in_place() {
            tracing::error!("restarting in place for route epoch {epoch} failed: {error}");
            self.failed = Some(error.to_string());
            self.shutdown.request();
        }
    }

    /// Close the log, open and recover it again and rebuild the state machine from it with
    /// the options as they are now.
    fn restart_in_place(&mut self) -> Result<(), RuntimeError> {
        let now = self.clock.now();
        // Nothing is owed: every turn carries out its persistence work before it ends.
        self.executor.log = None;
        let (log, startup) = open_device_log(&self.options)?;
        let Some((log, entries)) = log else {
            return Err(RuntimeError::Config(
                "a device that follows a controller logs (it has no --no-log)".to_owned(),
            ));
        };
        let config = log_device_config(&self.options, &log);
        let device = Device::new(config, now, entries);
        self.pipeline = make_pipeline(&self.options, Vec::new(), device);
        self.executor.log = Some(log);
        let servers: Vec<_> = self.options.servers.iter().map(|(_, addr)| *addr).collect();
        self.servers = PeerWatch::new(
            "server",
            "`pmnet server` (or `pmnet redis-adaptor`)",
            &servers,
        );
        let recovered = startup.recovered_entry_count;
        let started = std::time::Instant::now();
        self.replay = (recovered > 0).then_some(ReplayProgress {
            recovered,
            started,
            next_report: started + REPLAY_REPORT_INTERVAL,
        });
        self.startup = startup;
        self.restarts_in_place += 1;
        self.drain();
        Ok(())
    }
}

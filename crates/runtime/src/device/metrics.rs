//! What a device tells about itself: the periodic report line and its metrics.

use pmnet_proto::{DeviceCounters, DevicePipeline};

use super::DeviceRuntime;
use crate::metrics::Metrics;
use crate::{socket_digest, socket_metrics};

impl DeviceRuntime {
    /// A line of the most telling counters: the log's, or, for a process that serves as a
    /// function without a log (`serve_as`), the function's.
    pub fn report_line(&self) -> String {
        let dropped = self.pipeline.dropped();
        if self.role != "device" {
            if let Some(report) = self.pipeline.front_report() {
                // Named by its address: such a process has no device id.
                let mut line = format!(
                    "{} {}: {report}; {}; dropped {}",
                    self.role,
                    self.addresses.data,
                    socket_digest(&self.data.counters()),
                    dropped.values().sum::<u64>()
                );
                for (reason, count) in &dropped {
                    line.push_str(&format!(" {reason}={count}"));
                }
                line.push_str(&format!("; medium {}", self.startup.medium_text()));
                return line;
            }
        }
        let counters = self.pipeline.device().counters();
        let mut line = format!(
            "device {}: {}; log {}/{} live; updates {} logged {} acked {}; server-acks \
             forwarded {} absorbed {}; collisions {} log-full {} forwarded-without-log {}; \
             resends {} (timeout) {} (asked); dropped {}",
            self.options.device_id,
            socket_digest(&self.data.counters()),
            self.pipeline.device().live_entry_count(),
            self.startup.slot_count,
            counters.updates_received,
            counters.updates_logged,
            counters.pmnet_acks_sent,
            counters.server_acks_forwarded,
            counters.server_acks_absorbed,
            counters.log_collisions,
            counters.log_full,
            counters.forwarded_without_log,
            counters.resend_timeouts,
            counters.resent_from_log,
            dropped.values().sum::<u64>(),
        );
        for (reason, count) in &dropped {
            line.push_str(&format!(" {reason}={count}"));
        }
        if let Some((_, socket)) = &self.forward {
            line.push_str(&format!(
                "; forward port {}",
                socket_digest(socket.counters())
            ));
        }
        if self.echo.is_some() {
            line.push_str(&format!("; echoed {}", self.counters.echoed));
        }
        if let Some(xdp) = self.data.xdp() {
            let (steered, passed, malformed) = xdp.steering_counters();
            let counters = xdp.xdp_counters();
            line.push_str(&format!(
                "; xdp steered {steered} passed {passed} malformed {malformed}, frames sent {} \
                 through the kernel {} (ring full {})",
                counters.frames_sent, counters.sent_through_kernel, counters.tx_ring_full
            ));
            for (reason, count) in &counters.malformed {
                line.push_str(&format!(" bad_frame_{reason}={count}"));
            }
        }
        if self.executor.log.is_some() {
            line.push_str(&format!(
                "; log batches {} fences {}",
                self.executor.batches, self.executor.fences
            ));
        }
        line.push_str(&format!("; medium {}", self.startup.medium_text()));
        line
    }

    /// The device's state for `/status` and `pmnet status`.
    pub fn status(&self) -> serde_json::Value {
        let device = self.pipeline.device();
        let counters = device.counters();
        let now = self.clock.now();
        let live = device.live_entry_count();
        let (queued, resent_unacked) = device.replay_backlog();
        let recovered_left = device.recovered_entries_live();
        let slot_size = u64::from(self.startup.slot_size);
        let log = self.startup.log_path.as_ref().map(|path| {
            let by_server: serde_json::Map<String, serde_json::Value> = device
                .live_entries_by_server()
                .into_iter()
                .map(|(server, count)| (server.to_string(), count.into()))
                .collect();
            serde_json::json!({
                "path": path.display().to_string(),
                "slots": self.startup.slot_count,
                "slot_size": self.startup.slot_size,
                "entries_used": live,
                "bytes_used": live as u64 * slot_size,
                "bytes_total": u64::from(self.startup.slot_count) * slot_size,
                "entries_by_server": by_server,
                "recovered_at_start": self.startup.recovered_entry_count,
                "rejected_at_start": self.startup.rejected_slot_count,
            })
        });
        let servers: Vec<serde_json::Value> = self
            .options
            .servers
            .iter()
            .map(|(id, addr)| {
                let mut peer = crate::peer_book::peer_json(
                    "server",
                    *addr,
                    Some(*id),
                    self.peers.last_heard(*addr),
                    now,
                );
                // Whether the device acks this server's writes, and why not.
                peer["verified"] = device.server_verified(*id).into();
                if let Some(why) = device.server_unverified_reason(*id, now) {
                    peer["unverified_because"] = why.into();
                }
                peer
            })
            .collect();
        let known: Vec<std::net::SocketAddr> =
            self.options.servers.iter().map(|(_, addr)| *addr).collect();
        let (client_count, clients) = crate::peer_book::clients_json(&self.peers, &known, now, 10);
        serde_json::json!({
            "pmnet_status": 1,
            "role": "device",
            "id": self.options.device_id,
            "listen": self.addresses.data.to_string(),
            "medium": self.startup.medium_text(),
            "log": log,
            "sessions_known": device.known_session_count(),
            "recovery": {
                "in_progress": recovered_left > 0,
                "recovered_entries_left": recovered_left,
            },
            "replay": {
                "in_progress": queued > 0 || resent_unacked > 0,
                "queued": queued,
                "resent_unacked": resent_unacked,
            },
            "peers": {
                "servers": servers,
                "client_count": client_count,
                "clients": clients,
                "untracked_datagrams": self.peers.untracked(),
            },
            "counters": {
                "updates_received": counters.updates_received,
                "updates_logged": counters.updates_logged,
                "pmnet_acks_sent": counters.pmnet_acks_sent,
                "server_acks_absorbed": counters.server_acks_absorbed,
                "server_acks_forwarded": counters.server_acks_forwarded,
                "bypass_forwarded": counters.bypass_forwarded,
                "log_full": counters.log_full,
                "log_collisions": counters.log_collisions,
                "forwarded_without_log": counters.forwarded_without_log,
                "resend_timeouts": counters.resend_timeouts,
                "dropped": self.pipeline.dropped().values().sum::<u64>(),
            },
        })
    }

    /// Every counter of the device, its sockets and its log.
    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        self.log_gauges(&mut out);
        device_counter_metrics(&mut out, "pmnet", &self.pipeline, self.drop_metrics);
        for (name, help, value) in self.pipeline.front_samples() {
            // Counters end in `_total`; anything else a function reports is a level now.
            if name.ends_with("_total") {
                out.counter(name, help, &[], value);
            } else {
                out.gauge(name, help, &[], value as f64);
            }
        }
        out.histogram(
            "pmnet_device_log_entry_residency_seconds",
            "Time a log entry stayed in the log: from logging and forwarding the update to its \
             server-ACK (entries recovered at start-up are not counted).",
            &[],
            self.pipeline.device().entry_residency(),
        );
        if let Some((forward, _)) = &self.forward {
            device_counter_metrics(&mut out, "forward", forward, self.drop_metrics);
        }
        self.runtime_counter_metrics(&mut out);
        socket_metrics(&mut out, "device", &self.data.counters());
        if let Some(xdp) = self.data.xdp() {
            let (steered, passed, malformed) = xdp.steering_counters();
            let counters = xdp.xdp_counters();
            for (name, help, value) in [
                (
                    "pmnet_device_xdp_steered_total",
                    "Frames the XDP program steered to the device's AF_XDP sockets.",
                    steered,
                ),
                (
                    "pmnet_device_xdp_passed_total",
                    "Frames the XDP program passed on to the kernel (not the device's).",
                    passed,
                ),
                (
                    "pmnet_device_xdp_short_frames_total",
                    "Frames the XDP program found too short to parse (passed on).",
                    malformed,
                ),
                (
                    "pmnet_device_xdp_frames_sent_total",
                    "Datagrams the device sent as frames on an AF_XDP socket.",
                    counters.frames_sent,
                ),
                (
                    "pmnet_device_xdp_sent_through_kernel_total",
                    "Datagrams the AF_XDP datapath sent through the kernel's UDP socket (no \
                     neighbour known, too large, or the ring full).",
                    counters.sent_through_kernel,
                ),
            ] {
                out.counter(name, help, &[], value);
            }
            for (reason, count) in &counters.malformed {
                out.counter(
                    "pmnet_device_xdp_bad_frames_total",
                    "Frames from the AF_XDP rings that did not parse, by reason (dropped).",
                    &[("reason", reason)],
                    *count,
                );
            }
        }
        if let Some((_, socket)) = &self.forward {
            socket_metrics(&mut out, "forward", socket.counters());
        }
        if let Some(socket) = &self.echo {
            socket_metrics(&mut out, "echo", socket.counters());
        }
        out
    }

    /// The device's identity and medium, and the log's geometry, occupancy and recovery.
    fn log_gauges(&self, out: &mut Metrics) {
        let medium = self.startup.medium;
        out.gauge(
            "pmnet_device_info",
            "The device's identity, persistence medium and whether its traffic is authenticated (value always 1).",
            &[
                ("device_id", &self.options.device_id.to_string()),
                ("medium", medium.map_or("none", |m| m.medium.name())),
                ("flush", medium.map_or("none", |m| m.flush.name())),
                (
                    "guarantee",
                    medium.map_or("logging off", |m| m.medium.guarantee()),
                ),
                ("wait", self.options.loop_options.wait.name()),
                (
                    "traffic",
                    crate::keys::traffic_label(self.options.keys.as_ref()),
                ),
            ],
            1.0,
        );
        out.gauge(
            "pmnet_device_log_slots",
            "Slots of the persistent log.",
            &[],
            f64::from(self.startup.slot_count),
        );
        out.gauge(
            "pmnet_device_log_live_entries",
            "Log entries the server has not acknowledged yet (log occupancy).",
            &[],
            self.pipeline.device().live_entry_count() as f64,
        );
        out.gauge(
            "pmnet_device_log_recovered_entries",
            "Entries found in the log at start-up (and resent to their servers).",
            &[],
            self.startup.recovered_entry_count as f64,
        );
        out.gauge(
            "pmnet_device_log_rejected_slots",
            "Torn or corrupt slots freed at start-up, never replayed.",
            &[],
            f64::from(self.startup.rejected_slot_count),
        );
    }

    /// What the runtime counts itself: the log executor's work, echoes, the loop's turns.
    fn runtime_counter_metrics(&self, out: &mut Metrics) {
        for (name, help, value) in [
            (
                "pmnet_device_log_writes_total",
                "Log writes carried out (each persisted before its ack).",
                self.executor.writes,
            ),
            (
                "pmnet_device_log_invalidations_total",
                "Log slots freed after the server's ACK.",
                self.executor.invalidations,
            ),
            (
                "pmnet_device_log_batches_total",
                "Batches of log work carried out (each durable before it is reported).",
                self.executor.batches,
            ),
            (
                "pmnet_device_log_fences_total",
                "Fences issued for log batches: two per batch with writes (three when it \
                 reuses a slot it frees), one per batch of invalidations only.",
                self.executor.fences,
            ),
            (
                "pmnet_echo_datagrams_total",
                "Datagrams answered by the echo port.",
                self.counters.echoed,
            ),
            (
                "pmnet_loop_iterations_total",
                "Turns of the event loop.",
                self.counters.event_loop.iterations,
            ),
            (
                "pmnet_loop_idle_waits_total",
                "Turns that found nothing to do and waited (or yielded).",
                self.counters.event_loop.idle_waits,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
    }
}

/// The state machine's counters, labelled with the port they belong to.
fn device_counter_metrics(
    out: &mut Metrics,
    port: &str,
    pipeline: &DevicePipeline,
    drop_metrics: (&'static str, &'static str),
) {
    let counters = pipeline.device().counters();
    let labels = [("port", port)];
    update_metrics(out, &labels, counters);
    log_entry_metrics(out, &labels, counters);
    notice_and_drop_metrics(out, port, pipeline, drop_metrics);
    if let Some(seals) = pipeline.seal_counts() {
        for (how, value) in [("computed", seals.computed), ("reused", seals.reused)] {
            out.counter(
                "pmnet_device_seals_total",
                "Datagrams sealed: MAC computed, or the trailer of the datagram just verified \
                 reused (forwarding what was received unchanged).",
                &[("port", port), ("mac", how)],
                value,
            );
        }
    }
}

/// Updates and acknowledgements: received, logged or forwarded without logging (and why),
/// bypasses forwarded, PMNet-ACKs sent, server-ACKs forwarded or absorbed.
fn update_metrics(out: &mut Metrics, labels: &[(&str, &str)], counters: &DeviceCounters) {
    for (name, help, value) in [
        (
            "pmnet_device_updates_received_total",
            "Update requests received.",
            counters.updates_received,
        ),
        (
            "pmnet_device_updates_logged_total",
            "Update requests written to the log.",
            counters.updates_logged,
        ),
        (
            "pmnet_device_chain_acks_relayed_total",
            "PMNet-ACKs and not-logged notices of the next device of a chain passed on towards the client.",
            counters.chain_acks_relayed,
        ),
        (
            "pmnet_device_client_addresses_carried_total",
            "Updates forwarded to the next device of a chain with their client's address, so that it acks the client directly.",
            counters.client_addresses_carried,
        ),
        (
            "pmnet_device_acks_sent_direct_total",
            "PMNet-ACKs sent straight to a client whose address the device before this one carried.",
            counters.acks_sent_direct,
        ),
        (
            "pmnet_device_client_addresses_ignored_total",
            "Client addresses carried by a sender not named by --previous-device: ignored, its source acked.",
            counters.client_addresses_ignored,
        ),
        (
            "pmnet_device_log_collisions_total",
            "Updates forwarded without logging: every probed slot was taken.",
            counters.log_collisions,
        ),
        (
            "pmnet_device_log_full_total",
            "Updates forwarded without logging: the live-entry limit was reached.",
            counters.log_full,
        ),
        (
            "pmnet_device_forwarded_without_log_total",
            "Updates forwarded without logging: too large for a slot, or logging off.",
            counters.forwarded_without_log,
        ),
        (
            "pmnet_device_duplicate_updates_total",
            "Retransmitted updates already logged (re-acked, not forwarded again).",
            counters.duplicate_updates,
        ),
        (
            "pmnet_device_bypass_forwarded_total",
            "Bypass requests forwarded.",
            counters.bypass_forwarded,
        ),
        (
            "pmnet_device_pmnet_acks_sent_total",
            "PMNet-ACKs sent (each after its log write was durable).",
            counters.pmnet_acks_sent,
        ),
        (
            "pmnet_device_server_acks_forwarded_total",
            "Server-ACKs forwarded to clients.",
            counters.server_acks_forwarded,
        ),
        (
            "pmnet_device_server_acks_absorbed_total",
            "Server-ACKs of updates this device had PMNet-acked in full: not forwarded.",
            counters.server_acks_absorbed,
        ),
    ] {
        out.counter(name, help, labels, value);
    }
}

/// The log's entries after they were logged: invalidated, resent (asked for, timed out,
/// polled for in recovery, replayed at the server's pace), recovered at start-up.
fn log_entry_metrics(out: &mut Metrics, labels: &[(&str, &str)], counters: &DeviceCounters) {
    for (name, help, value) in [
        (
            "pmnet_device_entries_invalidated_total",
            "Log entries dropped after the server's ACK.",
            counters.entries_invalidated,
        ),
        (
            "pmnet_device_retransmit_requests_received_total",
            "Retransmission requests from servers.",
            counters.retransmit_requests_received,
        ),
        (
            "pmnet_device_resent_from_log_total",
            "Entries resent from the log on a server's retransmission request.",
            counters.resent_from_log,
        ),
        (
            "pmnet_device_retransmit_requests_passed_to_client_total",
            "Retransmission requests passed on to clients (not in the log).",
            counters.retransmit_requests_passed_to_client,
        ),
        (
            "pmnet_device_resend_timeouts_total",
            "Entries resent to their server because it had not acknowledged them in time.",
            counters.resend_timeouts,
        ),
        (
            "pmnet_device_recovery_polls_total",
            "Recovery polls received from restarting servers.",
            counters.recovery_polls,
        ),
        (
            "pmnet_device_recovery_entries_resent_total",
            "Entries resent in answer to recovery polls.",
            counters.recovery_entries_resent,
        ),
        (
            "pmnet_device_entries_recovered_total",
            "Entries rebuilt from the log at start-up.",
            counters.entries_recovered,
        ),
        (
            "pmnet_device_replay_queued_total",
            "Entries queued to be resent at the server's pace (timeouts, recovery polls).",
            counters.replay_queued,
        ),
        (
            "pmnet_device_replay_sent_total",
            "Entries resent from the replay queue.",
            counters.replay_sent,
        ),
    ] {
        out.counter(name, help, labels, value);
    }
}

/// What the device answered instead of logging (not-logged notices to clients, fill queries
/// from servers), and the datagrams it dropped, by reason and in all.
fn notice_and_drop_metrics(
    out: &mut Metrics,
    port: &str,
    pipeline: &DevicePipeline,
    (per_reason, all): (&'static str, &'static str),
) {
    let counters = pipeline.device().counters();
    let dropped = pipeline.dropped();
    let labels = [("port", port)];
    for (name, help, value) in [
        (
            "pmnet_device_not_logged_notices_sent_total",
            "Notices to clients that an update was forwarded without logging (log full, \
         collision, too large).",
            counters.not_logged_notices_sent,
        ),
        (
            "pmnet_device_fill_queries_total",
            "Fill queries answered for servers resolving a gap.",
            counters.fill_queries,
        ),
        (
            "pmnet_device_fill_queries_passed_on_total",
            "Fill queries passed on to the devices before this one in a chain (answered once \
             they answered).",
            counters.fill_queries_passed_on,
        ),
        (
            "pmnet_device_unverified_forwards_total",
            "Updates forwarded without logging or an ack: their server is not verified yet \
             (down, or another --key-file).",
            counters.unverified_forwards,
        ),
        (
            "pmnet_device_probes_sent_total",
            "Probes sent to servers not verified yet.",
            counters.probes_sent,
        ),
        (
            "pmnet_device_probes_answered_total",
            "Answers to this device's probes that verified.",
            counters.probes_answered,
        ),
        (
            "pmnet_device_probes_served_total",
            "Probes of the device before this one in a chain, answered.",
            counters.probes_served,
        ),
        (
            "pmnet_device_fill_queries_held_total",
            "Fill queries that found a request held whole (resent; the server skips nothing).",
            counters.fill_queries_held,
        ),
        (
            "pmnet_device_fills_resent_total",
            "Clients' no-op fills sent to their server again when it asked for their numbers.",
            counters.fills_resent,
        ),
    ] {
        out.counter(name, help, &labels, value);
    }
    for (reason, value) in &dropped {
        out.counter(
            per_reason,
            "Datagrams dropped before or by the protocol, by port and reason.",
            &[("port", port), ("reason", reason)],
            *value,
        );
    }
    out.gauge(
        "pmnet_device_servers_verified",
        "1 once every server verifies what this device sends and sends what it verifies (its \
         writes are acked), 0 before.",
        &labels,
        f64::from(u8::from(pipeline.device().servers_verified())),
    );
    out.counter(
        all,
        "Datagrams dropped before or by the protocol, all reasons.",
        &labels,
        dropped.values().sum(),
    );
}

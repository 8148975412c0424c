//! The adaptor's report line and metrics (by area: its Redis, requests, connections to Redis,
//! the protocol server and the loop, the UDP socket).

use pmnet_runtime::metrics::Metrics;

use super::Adaptor;

impl Adaptor {
    pub fn report_line(&self) -> String {
        let counters = &self.counters;
        let server = self.server.counters();
        let socket = self.socket.counters();
        let up = self
            .conns
            .iter()
            .filter(|conn| conn.stream.is_some())
            .count();
        let mut line = format!(
            "redis-adaptor {}: udp in {} out {}; writes {} reads {} redone-recognised {} \
             groups {}/{} replies-gone {} command-errors {} noop-fills {} bad-payloads {} refused {}; \
             make-up acks {}; outstanding {} held {}; redis connections up {}/{} \
             reconnects {} transient-errors {} resent {} failed-fast {}{}; dropped {}",
            self.options.server_id,
            socket.received_total(),
            socket.sent_total(),
            counters.writes_applied,
            counters.reads,
            counters.redone_recognised,
            counters.grouped_writes,
            counters.groups,
            counters.replies_gone,
            counters.command_errors,
            counters.noop_fills,
            counters.bad_payloads,
            counters.refused,
            server.makeup_acks_sent,
            self.outstanding,
            counters.held_back,
            up,
            self.conns.len(),
            counters.reconnects,
            counters.transient_errors,
            counters.resent,
            counters.failed_fast,
            if self.server.is_recovering() {
                "; RECOVERING (waiting for devices)"
            } else {
                ""
            },
            server.dropped.values().sum::<u64>(),
        );
        for (reason, count) in &server.dropped {
            line.push_str(&format!(" {reason}={count}"));
        }
        line
    }

    /// Every counter, in the Prometheus text format's model.
    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        self.info_metrics(&mut out);
        self.request_metrics(&mut out);
        self.connection_metrics(&mut out);
        self.server_metrics(&mut out);
        self.socket_metrics(&mut out);
        out
    }

    /// Which Redis, and how durable it is.
    fn info_metrics(&self, out: &mut Metrics) {
        out.gauge(
            "pmnet_redis_adaptor_info",
            "The adaptor's Redis and its durability (value always 1).",
            &[
                ("server_id", &self.options.server_id.to_string()),
                ("redis", &self.options.redis.to_string()),
                ("appendonly", &self.startup.appendonly),
                ("appendfsync", &self.startup.appendfsync),
                ("wait", self.options.wait.name()),
            ],
            1.0,
        );
    }

    /// What became of the requests: applied, read, redone, refused, failed.
    fn request_metrics(&self, out: &mut Metrics) {
        let counters = &self.counters;
        counter_table(
            out,
            &[
                (
                    "pmnet_redis_writes_applied_total",
                    "Writes applied and recorded.",
                    counters.writes_applied,
                ),
                ("pmnet_redis_reads_total", "Reads answered.", counters.reads),
                (
                    "pmnet_redis_write_groups_total",
                    "Group script calls answered (several writes in one script call).",
                    counters.groups,
                ),
                (
                    "pmnet_redis_grouped_writes_total",
                    "Writes sent to Redis in group script calls.",
                    counters.grouped_writes,
                ),
                (
                    "pmnet_redis_redone_recognised_total",
                    "Redone requests Redis had applied before, answered with the stored reply.",
                    counters.redone_recognised,
                ),
                (
                    "pmnet_redis_replies_gone_total",
                    "Redone requests whose reply was no longer kept.",
                    counters.replies_gone,
                ),
                (
                    "pmnet_redis_command_errors_total",
                    "Commands Redis answered with an error.",
                    counters.command_errors,
                ),
                (
                    "pmnet_redis_noop_fills_total",
                    "No-op fills recorded.",
                    counters.noop_fills,
                ),
                (
                    "pmnet_redis_bad_payloads_total",
                    "Payloads that are not one RESP command.",
                    counters.bad_payloads,
                ),
                (
                    "pmnet_redis_refused_total",
                    "Commands refused by the adaptor.",
                    counters.refused,
                ),
                (
                    "pmnet_redis_script_failures_total",
                    "Script calls Redis failed for good.",
                    counters.script_failures,
                ),
            ],
        );
    }

    /// The connections to Redis: errors, reconnections, requests sent again or held back.
    fn connection_metrics(&self, out: &mut Metrics) {
        let counters = &self.counters;
        counter_table(
            out,
            &[
                (
                    "pmnet_redis_transient_errors_total",
                    "Transient Redis errors (retried).",
                    counters.transient_errors,
                ),
                (
                    "pmnet_redis_connection_failures_total",
                    "Connections to Redis lost or refused.",
                    counters.connection_failures,
                ),
                (
                    "pmnet_redis_reconnects_total",
                    "Connections to Redis opened again.",
                    counters.reconnects,
                ),
                (
                    "pmnet_redis_resent_total",
                    "Requests sent to Redis again after a lost connection.",
                    counters.resent,
                ),
                (
                    "pmnet_redis_held_back_total",
                    "Requests held back by the per-session limit.",
                    counters.held_back,
                ),
                (
                    "pmnet_redis_failed_fast_total",
                    "Bypass requests answered with an error, not applied, while Redis was down.",
                    counters.failed_fast,
                ),
            ],
        );
    }

    /// The protocol server and the event loop: applied, made-up acks, turns, what is
    /// outstanding, recovery, drops.
    fn server_metrics(&self, out: &mut Metrics) {
        let server = self.server.counters();
        counter_table(
            out,
            &[
                (
                    "pmnet_server_requests_applied_total",
                    "Requests applied (each exactly once).",
                    server.requests_applied,
                ),
                (
                    "pmnet_server_makeup_acks_sent_total",
                    "Duplicates answered with the stored reply.",
                    server.makeup_acks_sent,
                ),
                (
                    "pmnet_loop_iterations_total",
                    "Turns of the event loop.",
                    self.event_loop.iterations,
                ),
                (
                    "pmnet_loop_idle_waits_total",
                    "Turns that found nothing to do.",
                    self.event_loop.idle_waits,
                ),
            ],
        );
        out.gauge(
            "pmnet_redis_outstanding",
            "Requests taken from the protocol and not yet answered by Redis.",
            &[],
            self.outstanding as f64,
        );
        out.gauge(
            "pmnet_server_recovering",
            "1 while the start-up recovery poll waits for a device.",
            &[],
            if self.server.is_recovering() {
                1.0
            } else {
                0.0
            },
        );
        for (reason, value) in &server.dropped {
            out.counter(
                "pmnet_server_dropped_total",
                "Datagrams the server dropped, by reason.",
                &[("reason", reason)],
                *value,
            );
        }
    }

    /// The UDP socket towards the devices.
    fn socket_metrics(&self, out: &mut Metrics) {
        let socket = self.socket.counters();
        out.counter(
            "pmnet_packets_received_total",
            "Datagrams received.",
            &[("socket", "adaptor")],
            socket.received_total(),
        );
        out.counter(
            "pmnet_packets_sent_total",
            "Datagrams sent.",
            &[("socket", "adaptor")],
            socket.sent_total(),
        );
        for (reason, value) in [
            ("truncated", socket.truncated),
            ("unknown_source", socket.unknown_source),
            ("send_error", socket.send_errors),
            ("send_queue_full", socket.send_queue_full),
            ("receive_error", socket.receive_errors),
        ] {
            out.counter(
                "pmnet_socket_dropped_total",
                "Datagrams the runtime dropped, by reason.",
                &[("socket", "adaptor"), ("reason", reason)],
                value,
            );
        }
    }
}

/// Unlabelled counters, in order.
fn counter_table(out: &mut Metrics, rows: &[(&str, &'static str, u64)]) {
    for &(name, help, value) in rows {
        out.counter(name, help, &[], value);
    }
}

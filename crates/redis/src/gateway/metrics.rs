//! The gateway's report line and metrics.

use pmnet_runtime::metrics::Metrics;

use super::Gateway;

impl Gateway {
    pub fn report_line(&self) -> String {
        let counters = &self.counters;
        let socket = self.socket.counters();
        format!(
            "gateway: connections open {} accepted {} refused {} closed {}; commands local {} \
             update {} bypass {} cache-read {} (answered by the device {}) direct {} rejected {}; updates acked by device {} by server {} (short of --replicas {}); timed \
             out {} replies unavailable {} malformed replies {} protocol errors {}; udp in {} \
             out {} unknown-session {} no-op fills for reads {}; direct connections open {} \
             opened {} sticky {} refused {} failed {} barriers {}; input paused {}; path {}",
            self.open_count(),
            counters.connections_accepted,
            counters.connections_refused,
            counters.connections_closed,
            counters.commands_local,
            counters.commands_update,
            counters.commands_bypass,
            counters.commands_cache_read,
            counters.cache_reads_from_device,
            counters.commands_direct,
            counters.commands_rejected,
            counters.updates_acked_by_device,
            counters.updates_answered_by_server,
            counters.updates_short_of_replicas,
            counters.requests_timed_out,
            counters.replies_unavailable,
            counters.malformed_replies,
            counters.protocol_errors,
            socket.received_total(),
            socket.sent_total(),
            counters.datagrams_unknown_session,
            counters.noop_fills_for_reads,
            self.direct_open,
            counters.direct_opened,
            counters.direct_sticky,
            counters.direct_refused,
            counters.direct_failed,
            counters.direct_barriers,
            counters.input_paused,
            match self
                .health
                .as_ref()
                .filter(|health| health.watching())
                .map(|health| health.down())
            {
                None => "not watched".to_owned(),
                Some(None) => "up".to_owned(),
                Some(Some((_, why))) => format!(
                    "DOWN ({why}); refused: {} connections, {} commands",
                    counters.connections_refused_down, counters.commands_refused_down
                ),
            },
        )
    }

    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        out.gauge(
            "pmnet_gateway_connections_open",
            "Client connections open (each a PMNet session).",
            &[],
            self.open_count() as f64,
        );
        out.gauge(
            "pmnet_gateway_direct_connections_open",
            "Direct connections to Redis open (blocking commands, pub/sub, MONITOR, ...).",
            &[],
            self.direct_open as f64,
        );
        self.connection_metrics(&mut out);
        self.command_metrics(&mut out);
        self.direct_metrics(&mut out);
        self.socket_metrics(&mut out);
        let mut latency = self.latency_of_closed.clone();
        for conn in self.conns.iter().flatten() {
            latency.merge(conn.client.latency());
        }
        pmnet_runtime::client_latency_metrics(&mut out, &latency);
        out
    }

    /// The client connections, the fate of requests and of the datagrams for them.
    fn connection_metrics(&self, out: &mut Metrics) {
        let counters = &self.counters;
        for (name, help, value) in [
            (
                "pmnet_gateway_connections_accepted_total",
                "Client connections accepted.",
                counters.connections_accepted,
            ),
            (
                "pmnet_gateway_connections_refused_total",
                "Client connections refused (too many open).",
                counters.connections_refused,
            ),
            (
                "pmnet_gateway_connections_closed_total",
                "Client connections closed.",
                counters.connections_closed,
            ),
            (
                "pmnet_gateway_connections_refused_down_total",
                "Client connections refused because the path behind was down.",
                counters.connections_refused_down,
            ),
            (
                "pmnet_gateway_commands_refused_down_total",
                "Commands answered with an error, unsent, because the path behind was down.",
                counters.commands_refused_down,
            ),
            (
                "pmnet_gateway_updates_acked_by_device_total",
                "Updates answered on the device's ack.",
                counters.updates_acked_by_device,
            ),
            (
                "pmnet_gateway_updates_answered_by_server_total",
                "Updates answered by the server first.",
                counters.updates_answered_by_server,
            ),
            (
                "pmnet_gateway_updates_short_of_replicas_total",
                "Updates the server's reply answered before --replicas devices had acked them.",
                counters.updates_short_of_replicas,
            ),
            (
                "pmnet_gateway_requests_timed_out_total",
                "Requests that timed out.",
                counters.requests_timed_out,
            ),
            (
                "pmnet_gateway_replies_unavailable_total",
                "Requests whose reply was no longer kept.",
                counters.replies_unavailable,
            ),
            (
                "pmnet_gateway_malformed_replies_total",
                "Server replies that were not one RESP value.",
                counters.malformed_replies,
            ),
            (
                "pmnet_gateway_protocol_errors_total",
                "Connections closed for bad RESP input.",
                counters.protocol_errors,
            ),
            (
                "pmnet_gateway_datagrams_unknown_session_total",
                "Datagrams for no open session.",
                counters.datagrams_unknown_session,
            ),
            (
                "pmnet_gateway_noop_fills_for_reads_total",
                "No-op fills sent for completed reads a restarted adaptor asked for.",
                counters.noop_fills_for_reads,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
    }

    /// Commands by the path they took.
    fn command_metrics(&self, out: &mut Metrics) {
        let counters = &self.counters;
        for (path, value) in [
            ("local", counters.commands_local),
            ("update", counters.commands_update),
            ("bypass", counters.commands_bypass),
            ("rejected", counters.commands_rejected),
            ("cache_read", counters.commands_cache_read),
            ("direct", counters.commands_direct),
        ] {
            out.counter(
                "pmnet_gateway_commands_total",
                "Commands by path.",
                &[("path", path)],
                value,
            );
        }
        out.counter(
            "pmnet_gateway_cache_reads_from_device_total",
            "Cache reads (GET) the device answered from its cache.",
            &[],
            counters.cache_reads_from_device,
        );
    }

    /// Direct connections to Redis and the input bound.
    fn direct_metrics(&self, out: &mut Metrics) {
        let counters = &self.counters;
        for (name, help, value) in [
            (
                "pmnet_gateway_direct_connections_opened_total",
                "Direct connections to Redis opened.",
                counters.direct_opened,
            ),
            (
                "pmnet_gateway_direct_connections_closed_total",
                "Direct connections to Redis closed.",
                counters.direct_closed,
            ),
            (
                "pmnet_gateway_direct_connections_refused_total",
                "Direct commands refused: --max-direct-connections open.",
                counters.direct_refused,
            ),
            (
                "pmnet_gateway_direct_connections_failed_total",
                "Direct connections that failed under a command.",
                counters.direct_failed,
            ),
            (
                "pmnet_gateway_direct_sticky_total",
                "Client connections that went direct for good (pub/sub, MONITOR, tracking).",
                counters.direct_sticky,
            ),
            (
                "pmnet_gateway_direct_barriers_total",
                "Barriers (bypass PINGs) sent around direct commands.",
                counters.direct_barriers,
            ),
            (
                "pmnet_gateway_input_paused_total",
                "Times a connection was not read: clients' unparsed input over --max-input-bytes.",
                counters.input_paused,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
    }

    /// The UDP socket shared by every session.
    fn socket_metrics(&self, out: &mut Metrics) {
        let socket = self.socket.counters();
        out.counter(
            "pmnet_packets_received_total",
            "Datagrams received.",
            &[("socket", "gateway")],
            socket.received_total(),
        );
        out.counter(
            "pmnet_packets_sent_total",
            "Datagrams sent.",
            &[("socket", "gateway")],
            socket.sent_total(),
        );
        out.counter(
            "pmnet_socket_dropped_total",
            "Datagrams dropped because the send queue was full.",
            &[("socket", "gateway"), ("reason", "send_queue_full")],
            socket.send_queue_full,
        );
    }
}

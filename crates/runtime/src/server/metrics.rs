//! What the server reports: its report line and its metrics.

use super::*;

impl ServerRuntime {
    pub fn report_line(&self) -> String {
        let counters = self.server.counters();
        let mut line = format!(
            "server {}: {}; applied {} acks {} make-up {} reordered {} retransmit-requests {}{}; \
             dropped {}",
            self.options.server_id,
            socket_digest(self.socket.counters()),
            counters.requests_applied,
            counters.server_acks_sent,
            counters.makeup_acks_sent,
            counters.requests_reordered,
            counters.retransmit_requests_sent,
            if self.server.is_recovering() {
                "; RECOVERING (waiting for devices)"
            } else {
                ""
            },
            counters.dropped.values().sum::<u64>(),
        );
        for (reason, count) in &counters.dropped {
            line.push_str(&format!(" {reason}={count}"));
        }
        if let ServerApp::Kv(store) = &self.app {
            let stats = store.stats();
            line.push_str(&format!(
                "; store keys {} records {} compactions {}",
                store.len(),
                stats.records_appended,
                stats.compactions
            ));
        }
        if let ServerApp::Engine(store) = &self.app {
            let stats = store.stats();
            line.push_str(&format!(
                "; {} store keys {} batches {} in-place {} written {} freed {}",
                store.engine().name(),
                store.key_count(),
                stats.batches,
                stats.records_received_in_place,
                stats.records_written,
                stats.records_freed
            ));
            if let Some(receiver) = &self.receiver {
                let counters = receiver.counters();
                line.push_str(&format!(
                    " received {} (in slots {}, spilled {}, truncated {})",
                    counters.datagrams, counters.in_slot, counters.spilled, counters.truncated
                ));
            }
        }
        if let Some(xdp) = &self.xdp {
            let counters = xdp.receiver.counters();
            let (held, target) = xdp.receiver.fill_level();
            let kernel = xdp.receiver.socket().stats().kernel.unwrap_or_default();
            line.push_str(&format!(
                "; AF_XDP {}: frames {} (in slots {}, copied out {}, malformed {}), fill ring \
                 {held}/{target}, kernel drops {} (fill ring empty {}){}",
                xdp.receiver.socket().ifname(),
                counters.frames,
                counters.in_slot,
                counters.copied_out,
                counters.malformed.iter().sum::<u64>(),
                kernel.rx_dropped + kernel.rx_ring_full,
                kernel.rx_fill_ring_empty_descs,
                if xdp.off {
                    ", STEERING OFF (store full)"
                } else {
                    ""
                }
            ));
        }
        if let Some(capacity) = self.capacity_text() {
            line.push_str(&format!(
                "; capacity: {capacity}, out of tokens {} times",
                self.counters.capacity_waits
            ));
        }
        line.push_str(&format!("; medium {}", self.startup.medium_text()));
        line
    }

    /// The server's state for `/status` and `pmnet status`.
    pub fn status(&self) -> serde_json::Value {
        let counters = self.server.counters();
        let now = self.clock.now();
        let awaiting = self.server.recovery_awaiting();
        let devices: Vec<serde_json::Value> = self
            .options
            .devices
            .iter()
            .map(|addr| {
                let mut peer = crate::peer_book::peer_json(
                    "device",
                    *addr,
                    None,
                    self.peers.last_heard(*addr),
                    now,
                );
                peer["recovery_answered"] = (!awaiting.contains(addr)).into();
                peer
            })
            .collect();
        let (client_count, clients) =
            crate::peer_book::clients_json(&self.peers, &self.options.devices, now, 10);
        let store = match &self.app {
            ServerApp::Kv(store) => serde_json::json!({
                "keys": store.len(),
                "sessions": store.session_count(),
                "used_bytes": store.used_bytes(),
                "capacity_bytes": store.capacity_bytes(),
            }),
            ServerApp::Engine(store) => serde_json::json!({
                "keys": store.key_count(),
                "free_bytes": store.free_bytes(),
            }),
            ServerApp::Ideal(_) => serde_json::Value::Null,
        };
        serde_json::json!({
            "pmnet_status": 1,
            "role": "server",
            "id": self.options.server_id,
            "listen": self.addresses.data.to_string(),
            "engine": self.startup.engine,
            "medium": self.startup.medium_text(),
            "receive": self.startup.receive,
            "data_file": self.startup.data_path.as_ref().map(|path| path.display().to_string()),
            "store": store,
            "capacity": self.bucket.as_ref().map(|bucket| serde_json::json!({
                "max_ops_per_s": bucket.rate_per_s(),
                "burst_max": bucket.depth(),
                "emulated": true,
                "out_of_tokens": self.counters.capacity_waits,
            })),
            "sessions_known": self.server.session_count(),
            "sessions_waiting_for_room": self.server.deferred_session_count(),
            "recovery": {
                "in_progress": self.server.is_recovering(),
                "devices_awaited": awaiting.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "entries_resent_by_devices": self.counters.recovery_entries_resent,
            },
            "peers": {
                "devices": devices,
                "client_count": client_count,
                "clients": clients,
                "untracked_datagrams": self.peers.untracked(),
            },
            "counters": {
                "request_fragments_received": counters.request_fragments_received,
                "requests_applied": counters.requests_applied,
                "server_acks_sent": counters.server_acks_sent,
                "makeup_acks_sent": counters.makeup_acks_sent,
                "requests_reordered": counters.requests_reordered,
                "requests_deferred": counters.requests_deferred,
                "retransmit_requests_sent": counters.retransmit_requests_sent,
                "dropped": counters.dropped.values().sum::<u64>(),
            },
            "applied_position": self.server.applied_position(),
            "forward_log": self.forward_log.as_ref().map(|file| {
                    let (requests, free_slots) =
                        self.server.forward_log_usage().unwrap_or_default();
                    serde_json::json!({
                        "path": file.path.display().to_string(),
                        "medium": file.log.medium().to_string(),
                        "requests": requests,
                        "free_slots": free_slots,
                        "slots": file.log.slot_count(),
                        "taken_in_at_start": file.recovery.requests,
                    })
                }),
            "replication": (!self.options.replicas.is_empty()).then(|| serde_json::json!({
                "replicas": self.options.replicas.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "pending": self.server.replication_pending(),
                "forwarded": counters.replication.forwarded,
                "released": counters.replication.released,
            })),
        })
    }

    /// A primary's replication (docs/replication.md); nothing without replicas.
    fn replication_metrics(&self, out: &mut Metrics, counters: &pmnet_proto::ServerCounters) {
        if self.options.replicas.is_empty() {
            return;
        }
        let replication = &counters.replication;
        for (name, help, value) in [
            (
                "pmnet_server_replica_forwards_total",
                "Requests forwarded to the replicas (once each) before they are applied here.",
                replication.forwarded,
            ),
            (
                "pmnet_server_replica_forwards_resent_total",
                "Forwards sent again (a device resent the request, or a replica asked).",
                replication.forwards_resent,
            ),
            (
                "pmnet_server_replica_duplicates_forwarded_total",
                "Resent duplicates of applied requests forwarded to the replicas.",
                replication.duplicates_forwarded,
            ),
            (
                "pmnet_server_replica_acks_total",
                "Replicas' acks counted.",
                replication.acks_received,
            ),
            (
                "pmnet_server_replica_released_total",
                "Requests applied once every replica acked them.",
                replication.released,
            ),
            (
                "pmnet_server_replica_skips_total",
                "Replicas that answered a request with skipped (a replica that lost its store).",
                replication.replica_skips,
            ),
            (
                "pmnet_server_replica_fill_conflicts_total",
                "Fills forwarded for numbers a replica had applied as the request itself (lost here in a crash; its client gave up).",
                replication.fill_conflicts,
            ),
            (
                "pmnet_server_replica_stalls_total",
                "Times a session waited because the requests held for replicas reached the bound.",
                replication.stalls,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
        out.gauge(
            "pmnet_server_replica_pending",
            "Requests forwarded and held until every replica acks them.",
            &[],
            self.server.replication_pending() as f64,
        );
    }

    /// The forward log (every server with a store) and how far the server got.
    fn forward_log_metrics(&self, out: &mut Metrics) {
        if let Some((requests, free_slots)) = self.server.forward_log_usage() {
            out.gauge(
                "pmnet_server_forward_log_requests",
                "Requests in the forward log: a primary's forwarded and not applied yet, a replica's kept from its primary.",
                &[],
                requests as f64,
            );
            out.gauge(
                "pmnet_server_forward_log_free_slots",
                "Free slots in the forward log; at none, the next request waits for one to be applied.",
                &[],
                free_slots as f64,
            );
        }
        out.gauge(
            "pmnet_server_applied_position",
            "The sum of the sessions' last applied numbers: of two replicas of one primary, promote the one with the higher value.",
            &[],
            self.server.applied_position() as f64,
        );
    }

    /// Every counter of the server, its socket and its store.
    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        self.identity_metrics(&mut out);
        self.protocol_metrics(&mut out);
        self.capacity_metrics(&mut out);
        self.store_metrics(&mut out);
        self.xdp_metrics(&mut out);
        socket_metrics(&mut out, "server", self.socket.counters());
        out
    }

    /// The AF_XDP receive path's counters (`--xdp`): the receiver's, the kernel's for the
    /// socket and the XDP program's.
    fn xdp_metrics(&self, out: &mut Metrics) {
        let Some(xdp) = &self.xdp else {
            return;
        };
        let counters = xdp.receiver.counters();
        let (held, target) = xdp.receiver.fill_level();
        out.gauge(
            "pmnet_server_xdp_fill_slots",
            "Store slots posted on the AF_XDP fill ring (free space the kernel may write).",
            &[],
            held as f64,
        );
        out.gauge(
            "pmnet_server_xdp_fill_target",
            "Store slots the AF_XDP fill ring is kept at.",
            &[],
            target as f64,
        );
        out.gauge(
            "pmnet_server_xdp_steering_off",
            "1 while steering is off because the store cannot supply the fill ring.",
            &[],
            if xdp.off { 1.0 } else { 0.0 },
        );
        for (name, help, value) in [
            (
                "pmnet_server_xdp_frames_total",
                "Frames taken from the AF_XDP socket's RX ring.",
                counters.frames,
            ),
            (
                "pmnet_server_xdp_in_slot_total",
                "Datagrams handed over in the store slot the kernel wrote them into.",
                counters.in_slot,
            ),
            (
                "pmnet_server_xdp_copied_out_total",
                "Datagrams copied out of their slot (not at its datagram area, or too short).",
                counters.copied_out,
            ),
            (
                "pmnet_server_xdp_unknown_descs_total",
                "RX descriptors naming no slot the kernel held (ignored).",
                counters.unknown_descs,
            ),
            (
                "pmnet_server_xdp_slots_posted_total",
                "Store slots posted on the fill ring.",
                counters.posted,
            ),
            (
                "pmnet_server_xdp_steering_off_total",
                "Times steering was switched off because the store was full.",
                xdp.counters.steering_off,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
        for error in pmnet_xdp::frame::FrameError::ALL {
            out.counter(
                "pmnet_server_xdp_malformed_total",
                "Frames that did not parse as IPv4/UDP, by reason (their slot went back).",
                &[("reason", error.name())],
                counters.malformed[error.index()],
            );
        }
        if let Some(kernel) = xdp.receiver.socket().stats().kernel {
            for (name, help, value) in [
                (
                    "pmnet_server_xdp_kernel_rx_dropped_total",
                    "Frames the kernel dropped for the socket (too long for a buffer, ...).",
                    kernel.rx_dropped,
                ),
                (
                    "pmnet_server_xdp_kernel_rx_ring_full_total",
                    "Frames the kernel dropped because the RX ring was full.",
                    kernel.rx_ring_full,
                ),
                (
                    "pmnet_server_xdp_kernel_fill_ring_empty_total",
                    "Times the kernel found the fill ring empty (frames dropped).",
                    kernel.rx_fill_ring_empty_descs,
                ),
                (
                    "pmnet_server_xdp_kernel_invalid_fill_total",
                    "Fill-ring entries the kernel refused.",
                    kernel.rx_invalid_descs,
                ),
            ] {
                out.counter(name, help, &[], value);
            }
        }
        let program = xdp.steering.counters();
        for (name, help, value) in [
            (
                "pmnet_server_xdp_program_steered_total",
                "Frames the XDP program redirected to the AF_XDP socket.",
                program.steered,
            ),
            (
                "pmnet_server_xdp_program_passed_total",
                "Frames the XDP program passed to the kernel.",
                program.passed,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
    }

    /// The server's identity, medium and recovery state.
    fn identity_metrics(&self, out: &mut Metrics) {
        let medium = self.startup.medium;
        out.gauge(
            "pmnet_server_info",
            "The server's identity, persistence medium and whether its traffic is authenticated (value always 1).",
            &[
                ("server_id", &self.options.server_id.to_string()),
                ("application", self.app.name()),
                ("medium", medium.map_or("none", |m| m.medium.name())),
                ("flush", medium.map_or("none", |m| m.flush.name())),
                (
                    "guarantee",
                    medium.map_or("nothing kept", |m| m.medium.guarantee()),
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
            "pmnet_server_recovering",
            "1 while the start-up recovery poll waits for a device.",
            &[],
            if self.server.is_recovering() {
                1.0
            } else {
                0.0
            },
        );
        out.gauge(
            "pmnet_server_recovery_draining",
            "1 once every device answered the recovery poll and until what they resent is all \
             applied and no session waits (the \"recovery complete\" line).",
            &[],
            if self.server.is_draining() { 1.0 } else { 0.0 },
        );
    }

    /// The emulated capacity, when the server has one.
    fn capacity_metrics(&self, out: &mut Metrics) {
        let Some(bucket) = &self.bucket else {
            return;
        };
        out.gauge(
            "pmnet_server_capacity_max_ops_per_s",
            "The server's emulated capacity (--max-ops-per-s): requests taken per second at most.",
            &[],
            bucket.rate_per_s() as f64,
        );
        out.counter(
            "pmnet_server_capacity_waits_total",
            "Turns that left datagrams in the socket for want of tokens (emulated capacity).",
            &[],
            self.counters.capacity_waits,
        );
        out.counter(
            "pmnet_server_capacity_paid_total",
            "Requests paid for with tokens (emulated capacity): request fragments and cache reads.",
            &[],
            self.counters.capacity_paid,
        );
    }

    /// The state machine's counters and drops.
    fn protocol_metrics(&self, out: &mut Metrics) {
        let counters = self.server.counters();
        for (name, help, value) in [
            (
                "pmnet_server_request_fragments_received_total",
                "Request datagrams received.",
                counters.request_fragments_received,
            ),
            (
                "pmnet_server_cache_reads_received_total",
                "Cache reads received (a device's cache misses and fetches).",
                counters.reads.received,
            ),
            (
                "pmnet_server_cache_reads_answered_total",
                "Cache reads answered.",
                counters.reads.answered,
            ),
            (
                "pmnet_server_requests_applied_total",
                "Requests applied (each exactly once).",
                counters.requests_applied,
            ),
            (
                "pmnet_server_acks_sent_total",
                "Server-ACK datagrams sent.",
                counters.server_acks_sent,
            ),
            (
                "pmnet_server_makeup_acks_sent_total",
                "Duplicates of applied requests answered with the stored reply.",
                counters.makeup_acks_sent,
            ),
            (
                "pmnet_server_makeup_acks_without_reply_total",
                "Make-up ACKs whose reply was no longer kept.",
                counters.makeup_acks_without_reply,
            ),
            (
                "pmnet_server_duplicates_in_progress_total",
                "Duplicates of requests being applied, ignored.",
                counters.duplicates_in_progress,
            ),
            (
                "pmnet_server_requests_reordered_total",
                "Requests that arrived ahead of a gap and waited.",
                counters.requests_reordered,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
        self.gap_and_recovery_metrics(out, counters);
        self.replication_metrics(out, counters);
        self.forward_log_metrics(out);
        for (reason, value) in &counters.dropped {
            out.counter(
                "pmnet_server_dropped_total",
                "Datagrams the server dropped, by reason.",
                &[("reason", reason)],
                *value,
            );
        }
    }

    /// Counters of gaps, recovery, eviction, fills and deferrals.
    fn gap_and_recovery_metrics(&self, out: &mut Metrics, counters: &ServerCounters) {
        for (name, help, value) in [
            (
                "pmnet_server_retransmit_requests_sent_total",
                "Retransmission requests sent for gaps.",
                counters.retransmit_requests_sent,
            ),
            (
                "pmnet_server_recovery_polls_sent_total",
                "Recovery polls sent to devices.",
                counters.recovery_polls_sent,
            ),
            (
                "pmnet_server_recovery_entries_resent_total",
                "Logged entries the devices said they resent at recovery.",
                self.counters.recovery_entries_resent,
            ),
            (
                "pmnet_server_sessions_evicted_total",
                "Sessions forgotten to make room.",
                counters.sessions_evicted,
            ),
            (
                "pmnet_server_noop_fills_received_total",
                "No-op fills for sequence numbers clients gave up on.",
                counters.noop_fills_received,
            ),
            (
                "pmnet_server_retransmit_requests_unpaid_total",
                "Retransmission requests not sent: the source had not sent enough to pay for them.",
                counters.retransmit_requests_unpaid,
            ),
            (
                "pmnet_server_fill_queries_sent_total",
                "Fill queries sent to devices before skipping a gap no client can close.",
                counters.fill_queries_sent,
            ),
            (
                "pmnet_server_sequence_numbers_skipped_total",
                "Sequence numbers skipped: no client or device could supply them any more.",
                counters.sequence_numbers_skipped,
            ),
            (
                "pmnet_server_requests_deferred_total",
                "Requests the store had no room for, kept waiting (never refused).",
                counters.requests_deferred,
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

    /// The store's own counters, by engine.
    fn store_metrics(&self, out: &mut Metrics) {
        match &self.app {
            ServerApp::Kv(store) => kv_metrics(out, store),
            ServerApp::Engine(store) => engine_metrics(out, store),
            ServerApp::Ideal(_) => {}
        }
    }
}

/// The key-value store's counters.
fn kv_metrics(out: &mut Metrics, store: &KvStore<MmapRegion>) {
    let stats = store.stats();
    out.gauge(
        "pmnet_store_keys",
        "Live keys in the store.",
        &[],
        store.len() as f64,
    );
    out.gauge(
        "pmnet_store_sessions",
        "Sessions with an exactly-once record in the store.",
        &[],
        store.session_count() as f64,
    );
    out.gauge(
        "pmnet_store_used_bytes",
        "Bytes of live data in the store.",
        &[],
        store.used_bytes() as f64,
    );
    out.gauge(
        "pmnet_store_capacity_bytes",
        "Bytes of live data the store admits.",
        &[],
        store.capacity_bytes() as f64,
    );
    for (name, help, value) in [
        (
            "pmnet_store_records_appended_total",
            "Requests applied by appending one record.",
            stats.records_appended,
        ),
        (
            "pmnet_store_compactions_total",
            "Compactions (each also applied one request).",
            stats.compactions,
        ),
        (
            "pmnet_store_evicted_sessions_total",
            "Sessions evicted from the store to admit new ones.",
            stats.evicted_sessions,
        ),
        (
            "pmnet_store_full_replies_total",
            "Reads answered \"store full\" (a reply too long to keep).",
            stats.store_full_replies,
        ),
        (
            "pmnet_store_no_space_total",
            "Updates the store had no room for (nothing stored; kept and retried).",
            stats.no_space,
        ),
        (
            "pmnet_store_recovered_records_total",
            "Records replayed when the store was opened.",
            stats.recovered_records,
        ),
        (
            "pmnet_store_rejected_tail_records_total",
            "Torn records found at the end of the log when opened.",
            stats.rejected_tail_records,
        ),
    ] {
        out.counter(name, help, &[], value);
    }
}

/// A packet-store engine's counters.
fn engine_metrics(out: &mut Metrics, store: &Store<MmapRegion>) {
    let stats = store.stats();
    out.gauge(
        "pmnet_store_keys",
        "Live keys in the store.",
        &[],
        store.key_count() as f64,
    );
    out.gauge(
        "pmnet_store_free_bytes",
        "Bytes free for new records.",
        &[],
        store.free_bytes() as f64,
    );
    out.gauge(
        "pmnet_store_capacity_bytes",
        "Bytes of live data the store admits (its data area; it grows with the data file).",
        &[],
        store.geometry().data_len as f64,
    );
    for (name, help, value) in [
        (
            "pmnet_store_batches_total",
            "Batches committed (two fences each).",
            stats.batches,
        ),
        (
            "pmnet_store_records_received_in_place_total",
            "Records that are the received datagrams themselves (no copy).",
            stats.records_received_in_place,
        ),
        (
            "pmnet_store_records_written_total",
            "Records the store wrote itself.",
            stats.records_written,
        ),
        (
            "pmnet_store_records_freed_total",
            "Overwritten, deleted or superseded records reclaimed.",
            stats.records_freed,
        ),
        (
            "pmnet_store_read_verify_failures_total",
            "Reads that found a record failing its checksum.",
            stats.read_verify_failures,
        ),
        (
            "pmnet_store_full_replies_total",
            "Reads answered \"store full\" (a reply too long to keep).",
            stats.store_full_replies,
        ),
        (
            "pmnet_store_no_space_total",
            "Updates the store had no room for (nothing stored; kept and retried).",
            stats.no_space,
        ),
    ] {
        out.counter(name, help, &[], value);
    }
}

//! What a run exercised: the fault mix a seed chose, the faults counted by class, and the
//! totals over a swarm of seeds.

use crate::world::{SessionChurn, World};

use super::Report;

/// The fault mix a seed chose, and what was exercised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSummary {
    pub client_count: usize,
    pub device_count: usize,
    pub server_count: usize,
    pub loss: f64,
    pub duplicate: f64,
    pub jitter_us: u64,
    pub corrupt: f64,
    pub counts: FaultCounts,
}

/// What a run exercised, by fault class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub datagrams_sent: u64,
    pub datagrams_lost: u64,
    pub datagrams_duplicated: u64,
    pub datagrams_corrupted: u64,
    pub datagrams_partitioned: u64,
    pub partitions_symmetric: u64,
    pub partitions_one_way: u64,
    pub device_crashes: u64,
    pub device_crashes_torn: u64,
    pub device_crashes_with_held_writes: u64,
    pub device_crashes_mid_write: u64,
    pub server_crashes: u64,
    pub server_crashes_during_recovery: u64,
    pub entries_corrupted_at_rest: u64,
    pub log_slots_rejected: u64,
    pub requests_failed: u64,
    pub noop_fills: u64,
    /// Sequence numbers never applied (filled or skipped): each one its client reported failed.
    pub sequence_numbers_skipped: u64,
    /// Gaps the server closed without the client (after every device said it held nothing).
    pub gaps_skipped_by_server: u64,
    /// Clients that gave up on a request and went away for good.
    pub clients_gone: u64,
    /// Requests the server's store had no room for and handed back to wait.
    pub requests_deferred_store_full: u64,
    /// Seeds with an attacker (every node authenticating), the datagrams it forged, the
    /// authentication failures the nodes counted (forgeries, less those the network lost),
    /// and the captured datagrams it replayed.
    pub seeds_with_attacker: u64,
    /// Seeds whose devices send servers batches, and the batches devices and servers sent
    /// (counted when the seed ends: a crash forgets a node's count).
    pub seeds_with_batches: u64,
    pub batches_sent: u64,
    /// Seeds whose devices run the read cache, the cache reads checked and those a device
    /// served.
    pub seeds_with_cache: u64,
    /// Seeds whose servers have replica servers, replica crashes, primaries lost for good
    /// (a replica promoted), and requests checked on live replicas.
    pub seeds_with_replicas: u64,
    /// Seeds whose devices are in series, and devices of theirs lost for good.
    pub seeds_with_chains: u64,
    /// Seeds whose clients fan every update out to two devices side by side.
    pub seeds_with_fanout: u64,
    pub devices_lost: u64,
    /// Devices the controller took out of their chain (silent past the suspicion delay),
    /// those of them that were live (suspected wrongly: each counted as a device lost), spare
    /// devices it put in, routes the devices, servers and clients took, and devices restarted
    /// in place for a route.
    pub devices_taken_out: u64,
    pub devices_wrongly_suspected: u64,
    pub spares_joined: u64,
    pub routes_taken: u64,
    pub restarts_in_place: u64,
    /// PMNet-ACKs devices of chains sent straight to their clients (docs/replication.md).
    pub acks_sent_direct: u64,
    pub replica_crashes: u64,
    pub primaries_lost: u64,
    pub replica_requests_checked: u64,
    /// Seeds whose chain's server has replica servers under the controller, replicas lost
    /// for good there, primaries the controller replaced by a replica, replicas it took out,
    /// and servers restarted in place for a route.
    pub seeds_with_replicated_chains: u64,
    pub replicas_lost: u64,
    pub primaries_replaced: u64,
    pub replicas_taken_out: u64,
    pub server_restarts_in_place: u64,
    /// Seeds whose controller crashes, its crashes (those right after a save, before its
    /// routes went out), its restarts from the saved plan, and the devices and servers lost
    /// for good while it was down (taken out once it was back).
    pub seeds_with_controller_crashes: u64,
    pub controller_crashes: u64,
    pub controller_crashes_at_save: u64,
    pub controller_restarts: u64,
    pub losses_while_controller_down: u64,
    pub cache_reads_checked: u64,
    pub cache_reads_served_by_device: u64,
    pub forged_datagrams: u64,
    pub forgeries_dropped: u64,
    pub replayed_datagrams: u64,
    /// Of the replays, those of archived datagrams (captured long before), those of them
    /// replayed past the replay window, and the replays the nodes dropped as sealed outside
    /// it (`stale`, `from_the_future`).
    pub replayed_late: u64,
    pub replayed_past_window: u64,
    pub replays_dropped_stale: u64,
    /// Seeds whose sessions come and go through small tables, the clients started in the
    /// place of others, the sessions servers' tables and stores evicted, and the hold
    /// queries servers sent before evicting.
    pub seeds_with_churn: u64,
    pub clients_turned_over: u64,
    pub sessions_evicted_by_servers: u64,
    pub sessions_evicted_by_stores: u64,
    pub hold_queries_sent: u64,
}

impl FaultCounts {
    /// Add `other`'s counts to these.
    pub fn add(&mut self, other: &FaultCounts) {
        self.datagrams_sent += other.datagrams_sent;
        self.datagrams_lost += other.datagrams_lost;
        self.datagrams_duplicated += other.datagrams_duplicated;
        self.datagrams_corrupted += other.datagrams_corrupted;
        self.datagrams_partitioned += other.datagrams_partitioned;
        self.partitions_symmetric += other.partitions_symmetric;
        self.partitions_one_way += other.partitions_one_way;
        self.device_crashes += other.device_crashes;
        self.device_crashes_torn += other.device_crashes_torn;
        self.device_crashes_with_held_writes += other.device_crashes_with_held_writes;
        self.device_crashes_mid_write += other.device_crashes_mid_write;
        self.seeds_with_attacker += other.seeds_with_attacker;
        self.seeds_with_batches += other.seeds_with_batches;
        self.batches_sent += other.batches_sent;
        self.seeds_with_cache += other.seeds_with_cache;
        self.seeds_with_replicas += other.seeds_with_replicas;
        self.seeds_with_chains += other.seeds_with_chains;
        self.seeds_with_fanout += other.seeds_with_fanout;
        self.devices_lost += other.devices_lost;
        self.devices_taken_out += other.devices_taken_out;
        self.devices_wrongly_suspected += other.devices_wrongly_suspected;
        self.spares_joined += other.spares_joined;
        self.routes_taken += other.routes_taken;
        self.restarts_in_place += other.restarts_in_place;
        self.acks_sent_direct += other.acks_sent_direct;
        self.replica_crashes += other.replica_crashes;
        self.primaries_lost += other.primaries_lost;
        self.replica_requests_checked += other.replica_requests_checked;
        self.seeds_with_replicated_chains += other.seeds_with_replicated_chains;
        self.replicas_lost += other.replicas_lost;
        self.primaries_replaced += other.primaries_replaced;
        self.replicas_taken_out += other.replicas_taken_out;
        self.server_restarts_in_place += other.server_restarts_in_place;
        self.seeds_with_controller_crashes += other.seeds_with_controller_crashes;
        self.controller_crashes += other.controller_crashes;
        self.controller_crashes_at_save += other.controller_crashes_at_save;
        self.controller_restarts += other.controller_restarts;
        self.losses_while_controller_down += other.losses_while_controller_down;
        self.cache_reads_checked += other.cache_reads_checked;
        self.cache_reads_served_by_device += other.cache_reads_served_by_device;
        self.forged_datagrams += other.forged_datagrams;
        self.forgeries_dropped += other.forgeries_dropped;
        self.replayed_datagrams += other.replayed_datagrams;
        self.replayed_late += other.replayed_late;
        self.replayed_past_window += other.replayed_past_window;
        self.replays_dropped_stale += other.replays_dropped_stale;
        self.server_crashes += other.server_crashes;
        self.server_crashes_during_recovery += other.server_crashes_during_recovery;
        self.entries_corrupted_at_rest += other.entries_corrupted_at_rest;
        self.log_slots_rejected += other.log_slots_rejected;
        self.requests_failed += other.requests_failed;
        self.noop_fills += other.noop_fills;
        self.sequence_numbers_skipped += other.sequence_numbers_skipped;
        self.gaps_skipped_by_server += other.gaps_skipped_by_server;
        self.clients_gone += other.clients_gone;
        self.requests_deferred_store_full += other.requests_deferred_store_full;
        self.seeds_with_churn += other.seeds_with_churn;
        self.clients_turned_over += other.clients_turned_over;
        self.sessions_evicted_by_servers += other.sessions_evicted_by_servers;
        self.sessions_evicted_by_stores += other.sessions_evicted_by_stores;
        self.hold_queries_sent += other.hold_queries_sent;
    }

    /// The counts with their names, one fault class a line.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let mut lines = vec![
            ("datagrams sent", self.datagrams_sent),
            ("datagrams lost", self.datagrams_lost),
            ("datagrams duplicated", self.datagrams_duplicated),
            ("datagrams corrupted in flight", self.datagrams_corrupted),
            ("datagrams cut by partitions", self.datagrams_partitioned),
            ("partitions, symmetric", self.partitions_symmetric),
            ("partitions, one-way", self.partitions_one_way),
            ("device crashes", self.device_crashes),
            (
                "device crashes with torn unpersisted lines",
                self.device_crashes_torn,
            ),
            (
                "device crashes between log write and persist",
                self.device_crashes_with_held_writes,
            ),
            (
                "device crashes in the middle of a batch of log writes",
                self.device_crashes_mid_write,
            ),
            ("server crashes", self.server_crashes),
            (
                "server crashes during recovery",
                self.server_crashes_during_recovery,
            ),
            (
                "log entries corrupted at rest",
                self.entries_corrupted_at_rest,
            ),
            ("log slots rejected at recovery", self.log_slots_rejected),
            ("requests failed (timed out)", self.requests_failed),
            ("no-op fills", self.noop_fills),
            (
                "sequence numbers never applied (failed requests)",
                self.sequence_numbers_skipped,
            ),
            (
                "sequence numbers skipped by a server",
                self.gaps_skipped_by_server,
            ),
            ("clients that gave up and left", self.clients_gone),
            (
                "requests deferred by a full store",
                self.requests_deferred_store_full,
            ),
            ("seeds with batches to servers", self.seeds_with_batches),
            ("batches sent (devices and servers)", self.batches_sent),
            ("seeds with the read cache", self.seeds_with_cache),
            ("cache reads checked", self.cache_reads_checked),
            (
                "cache reads served by a device",
                self.cache_reads_served_by_device,
            ),
            ("seeds with an attacker", self.seeds_with_attacker),
            ("datagrams forged by the attacker", self.forged_datagrams),
            ("authentication failures dropped", self.forgeries_dropped),
            (
                "datagrams replayed by the attacker",
                self.replayed_datagrams,
            ),
            ("archived datagrams replayed much later", self.replayed_late),
            ("replayed past the replay window", self.replayed_past_window),
            ("replays dropped as stale", self.replays_dropped_stale),
        ];
        // Devices in series and replicated servers are on a few seeds each: their lines
        // appear when a seed had them.
        if self.seeds_with_chains > 0 {
            lines.extend([
                ("seeds with devices in series", self.seeds_with_chains),
                ("devices lost for good", self.devices_lost),
                (
                    "devices taken out by the controller",
                    self.devices_taken_out,
                ),
                ("spare devices put in by the controller", self.spares_joined),
                (
                    "routes taken (devices, servers, clients)",
                    self.routes_taken,
                ),
                (
                    "devices restarted in place for a route",
                    self.restarts_in_place,
                ),
                (
                    "PMNet-ACKs sent to the client directly by a later device",
                    self.acks_sent_direct,
                ),
            ]);
        }
        // Never on a sound run: a live device taken out counts as a device lost.
        if self.devices_wrongly_suspected > 0 {
            lines.push((
                "live devices taken out (counted as lost)",
                self.devices_wrongly_suspected,
            ));
        }
        if self.seeds_with_fanout > 0 {
            lines.push((
                "seeds with fan-out to two devices side by side",
                self.seeds_with_fanout,
            ));
        }
        if self.seeds_with_replicas > 0 {
            lines.extend([
                ("seeds with replica servers", self.seeds_with_replicas),
                ("replica server crashes", self.replica_crashes),
                (
                    "primaries lost for good (a replica promoted)",
                    self.primaries_lost,
                ),
                (
                    "requests checked on live replicas",
                    self.replica_requests_checked,
                ),
            ]);
        }
        if self.seeds_with_replicated_chains > 0 {
            lines.extend([
                (
                    "seeds with replica servers under the controller",
                    self.seeds_with_replicated_chains,
                ),
                ("replica servers lost for good", self.replicas_lost),
                (
                    "primaries replaced by the controller (a replica promoted)",
                    self.primaries_replaced,
                ),
                (
                    "replica servers taken out by the controller",
                    self.replicas_taken_out,
                ),
                (
                    "servers restarted in place for a route",
                    self.server_restarts_in_place,
                ),
            ]);
        }
        if self.seeds_with_controller_crashes > 0 {
            lines.extend([
                (
                    "seeds with controller crashes",
                    self.seeds_with_controller_crashes,
                ),
                (
                    "controller crashes (memory lost, saved plan kept)",
                    self.controller_crashes,
                ),
                (
                    "controller crashes right after a save (its routes never sent)",
                    self.controller_crashes_at_save,
                ),
                (
                    "controller restarts from its saved plan",
                    self.controller_restarts,
                ),
                (
                    "devices and servers lost while the controller was down",
                    self.losses_while_controller_down,
                ),
            ]);
        }
        if self.seeds_with_churn > 0 {
            lines.extend([
                (
                    "seeds with sessions that come and go",
                    self.seeds_with_churn,
                ),
                (
                    "clients started in the place of others",
                    self.clients_turned_over,
                ),
                (
                    "sessions evicted by servers' tables",
                    self.sessions_evicted_by_servers,
                ),
                (
                    "sessions evicted by stores",
                    self.sessions_evicted_by_stores,
                ),
                ("hold queries sent by servers", self.hold_queries_sent),
            ]);
        }
        lines
    }
}

/// Copy what the world counted (network faults, rejected log slots) into `summary`.
pub(super) fn count_world_faults(world: &World, summary: &mut FaultSummary) {
    summary.counts.datagrams_sent = world.network.counters.sent;
    summary.counts.datagrams_lost = world.network.counters.lost;
    summary.counts.datagrams_duplicated = world.network.counters.duplicated;
    summary.counts.datagrams_corrupted = world.network.counters.corrupted;
    summary.counts.datagrams_partitioned = world.network.counters.partitioned;
    summary.counts.log_slots_rejected = world
        .devices
        .iter()
        .map(|node| node.rejected_slot_count)
        .sum();
    summary.counts.acks_sent_direct = world
        .devices
        .iter()
        .map(|node| {
            node.acks_sent_direct_before_restart + node.device().counters().acks_sent_direct
        })
        .sum();
    if let Some(node) = &world.controller {
        let counters = node.counters();
        summary.counts.controller_crashes = node.crashes;
        summary.counts.controller_crashes_at_save = node.crashes_at_save;
        summary.counts.controller_restarts = node.restarts;
        summary.counts.losses_while_controller_down = node.losses_while_down;
        summary.counts.devices_taken_out = counters.devices_removed;
        summary.counts.spares_joined = counters.spares_joined;
        summary.counts.devices_wrongly_suspected = node.wrongly_suspected;
        summary.counts.primaries_replaced = counters.primaries_replaced;
        summary.counts.replicas_taken_out = counters.replicas_removed;
    }
    summary.counts.server_restarts_in_place = (world.servers.iter().chain(&world.replicas))
        .map(|node| node.restarts_in_place)
        .sum();
    summary.counts.routes_taken = world
        .devices
        .iter()
        .map(|node| node.routes_taken)
        .chain(
            (world.servers.iter().chain(&world.replicas))
                .map(|node| node.routes_taken_before_restart + node.server.counters().routes_taken),
        )
        .chain((world.clients.iter()).map(|node| node.client.counters().routes_taken))
        .sum();
    summary.counts.restarts_in_place = world
        .devices
        .iter()
        .map(|node| node.restarts_in_place)
        .sum();
    summary.counts.requests_deferred_store_full =
        world.servers.iter().map(|node| node.deferred_count).sum();
    summary.counts.gaps_skipped_by_server = world
        .servers
        .iter()
        .map(|node| node.skipped_before_restart + node.server.counters().sequence_numbers_skipped)
        .sum();
    let mut churn = SessionChurn::default();
    for node in world.servers.iter().chain(&world.replicas) {
        churn.add(&node.churn_before_restart);
        churn.add(&node.churn());
    }
    summary.counts.sessions_evicted_by_servers = churn.server_evictions;
    summary.counts.sessions_evicted_by_stores = churn.store_evictions;
    summary.counts.hold_queries_sent = churn.hold_queries_sent;
}

/// Totals over a swarm of seeds: what was exercised, for the summary `pmnet sim` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwarmSummary {
    pub seeds: u64,
    pub requests_completed: u64,
    pub seeds_with_loss: u64,
    pub seeds_with_duplication: u64,
    pub seeds_with_corruption_in_flight: u64,
    pub seeds_with_partitions: u64,
    pub seeds_with_device_crashes: u64,
    pub seeds_with_server_crashes: u64,
    pub counts: FaultCounts,
}

impl SwarmSummary {
    /// Count one seed's report in.
    pub fn add(&mut self, report: &Report) {
        let counts = &report.faults.counts;
        self.seeds += 1;
        self.requests_completed += report.requests_completed;
        self.seeds_with_loss += u64::from(counts.datagrams_lost > 0);
        self.seeds_with_duplication += u64::from(counts.datagrams_duplicated > 0);
        self.seeds_with_corruption_in_flight += u64::from(counts.datagrams_corrupted > 0);
        let partitions = counts.partitions_symmetric + counts.partitions_one_way;
        self.seeds_with_partitions += u64::from(partitions > 0);
        self.seeds_with_device_crashes += u64::from(counts.device_crashes > 0);
        self.seeds_with_server_crashes += u64::from(counts.server_crashes > 0);
        self.counts.add(counts);
    }

    /// The summary as `(name, value)` lines, one fault class a line.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let mut lines = vec![
            ("seeds run", self.seeds),
            ("requests completed", self.requests_completed),
            ("seeds with loss", self.seeds_with_loss),
            ("seeds with duplication", self.seeds_with_duplication),
            (
                "seeds with corruption in flight",
                self.seeds_with_corruption_in_flight,
            ),
            ("seeds with partitions", self.seeds_with_partitions),
            ("seeds with device crashes", self.seeds_with_device_crashes),
            ("seeds with server crashes", self.seeds_with_server_crashes),
        ];
        lines.extend(self.counts.lines());
        lines
    }
}

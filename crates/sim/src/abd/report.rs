//! What one seed of replicated memory's world did.

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AbdReport {
    pub seed: u64,
    /// The hash of the seed's trace (the same seed must give the same hash).
    pub trace_hash: u32,
    /// Memory nodes (3 or 5).
    pub nodes: u64,
    pub device_clients: u64,
    pub direct_clients: u64,
    pub operations: u64,
    pub reads: u64,
    pub writes: u64,
    /// Operations on more than one line.
    pub multi_line: u64,
    /// Operations answered ok.
    pub completed: u64,
    /// Operations that failed "unavailable": they may or may not have taken effect.
    pub unavailable: u64,
    /// Writes answered "in doubt" (sent again to a coordinator that no longer knew them).
    pub in_doubt: u64,
    /// Operations beyond the memory's end, refused as such.
    pub out_of_range: u64,
    /// Node crashes (each node of a power failure counted).
    pub crashes: u64,
    /// Every node crashing at once.
    pub power_failures: u64,
    /// Nodes that lost their memory for good (restarted empty, then learnt).
    pub losses: u64,
    pub partitions: u64,
    pub device_restarts: u64,
    /// Nodes that became members after learning (the group's first formation not counted).
    pub joins: u64,
    /// Records a reopened table rejected (torn by a crash).
    pub torn_records: u64,
    /// Reads that wrote the highest lines back before answering.
    pub write_backs: u64,
    pub reads_one_phase: u64,
    /// Lines taken from other nodes while learning.
    pub lines_learnt: u64,
    /// The attacker's replays of captured genuine datagrams, those captured longer than the
    /// replay window (and its second) before, its bursts after a restart, the datagrams
    /// dropped as sealed outside the window, the device's refusals of requests of unknown
    /// sessions sealed before it forgot one or started, and client sessions started over.
    pub replayed: u64,
    pub replayed_past_window: u64,
    pub replay_bursts: u64,
    pub stale_dropped: u64,
    pub replays_refused: u64,
    pub session_churn: u64,
}

impl AbdReport {
    /// Add `other`'s counts to these (for a swarm's totals).
    pub fn add(&mut self, other: &AbdReport) {
        self.nodes += other.nodes;
        self.device_clients += other.device_clients;
        self.direct_clients += other.direct_clients;
        self.operations += other.operations;
        self.reads += other.reads;
        self.writes += other.writes;
        self.multi_line += other.multi_line;
        self.completed += other.completed;
        self.unavailable += other.unavailable;
        self.in_doubt += other.in_doubt;
        self.out_of_range += other.out_of_range;
        self.crashes += other.crashes;
        self.power_failures += other.power_failures;
        self.losses += other.losses;
        self.partitions += other.partitions;
        self.device_restarts += other.device_restarts;
        self.joins += other.joins;
        self.torn_records += other.torn_records;
        self.write_backs += other.write_backs;
        self.reads_one_phase += other.reads_one_phase;
        self.lines_learnt += other.lines_learnt;
        self.replayed += other.replayed;
        self.replayed_past_window += other.replayed_past_window;
        self.replay_bursts += other.replay_bursts;
        self.stale_dropped += other.stale_dropped;
        self.replays_refused += other.replays_refused;
        self.session_churn += other.session_churn;
    }
}

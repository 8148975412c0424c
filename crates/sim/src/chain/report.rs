//! What a seed of the chain store's world did, and a swarm's totals.

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainReport {
    pub seed: u64,
    /// The hash of the seed's trace (the same seed must give the same hash).
    pub trace_hash: u32,
    pub operations: u64,
    pub completed: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub controller_restarts: u64,
    /// Restarts at which the standby controller took over (a new term at its address).
    pub controller_takeovers: u64,
    pub members_lost: u64,
    pub removals: u64,
    pub recoveries: u64,
    pub reads_here: u64,
    pub reads_relayed: u64,
    /// The final configuration's epoch.
    pub epoch: u64,
    /// The attacker's replays of captured genuine datagrams, those captured longer than the
    /// replay window (and its second) before, and its bursts after a member restarted.
    pub replayed: u64,
    pub replayed_past_window: u64,
    pub replay_bursts: u64,
    /// Datagrams the endpoints dropped as sealed outside the replay window, and head writes
    /// of unknown sessions refused as sealed before a member forgot a session or started.
    pub stale_dropped: u64,
    pub replays_refused: u64,
    /// Client sessions that started over with a new session id.
    pub session_churn: u64,
}

impl ChainReport {
    /// Add `other`'s counts to these (for a swarm's totals; the seed and epoch are not
    /// counts).
    pub fn add(&mut self, other: &ChainReport) {
        self.operations += other.operations;
        self.completed += other.completed;
        self.crashes += other.crashes;
        self.partitions += other.partitions;
        self.controller_restarts += other.controller_restarts;
        self.controller_takeovers += other.controller_takeovers;
        self.members_lost += other.members_lost;
        self.removals += other.removals;
        self.recoveries += other.recoveries;
        self.reads_here += other.reads_here;
        self.reads_relayed += other.reads_relayed;
        self.replayed += other.replayed;
        self.replayed_past_window += other.replayed_past_window;
        self.replay_bursts += other.replay_bursts;
        self.stale_dropped += other.stale_dropped;
        self.replays_refused += other.replays_refused;
        self.session_churn += other.session_churn;
    }
}

//! `pmnet sim --chain-store`: what the chain store's world's seeds add up to
//! (`pmnet_sim::chain`); the runner is `sim/worlds.rs`.

use pmnet_sim::chain::ChainReport;

use crate::sim::worlds::WorldReport;

impl WorldReport for ChainReport {
    fn add(&mut self, other: &ChainReport) {
        ChainReport::add(self, other);
    }

    fn summary(&self, passed: u64) -> String {
        format!(
            "{passed} seeds passed: {} operations ({} completed), {} member crashes, {} members \
             lost for good, {} partitions, {} controller restarts ({} taken over by the standby); {} \
             members taken out of \
             chains, {} recoveries; {} reads answered where they came, {} relayed to the tail; \
             {} clients started over; the attacker replayed {} datagrams ({} past the window, \
             {} bursts after restarts): {} dropped as stale, {} writes refused by a head's \
             replay floor",
            self.operations,
            self.completed,
            self.crashes,
            self.members_lost,
            self.partitions,
            self.controller_restarts,
            self.controller_takeovers,
            self.removals,
            self.recoveries,
            self.reads_here,
            self.reads_relayed,
            self.session_churn,
            self.replayed,
            self.replayed_past_window,
            self.replay_bursts,
            self.stale_dropped,
            self.replays_refused
        )
    }

    fn coverage(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("operations completed", self.completed),
            ("member crashes", self.crashes),
            ("members lost for good", self.members_lost),
            ("partitions", self.partitions),
            ("controller restarts", self.controller_restarts),
            (
                "takeovers by the standby controller",
                self.controller_takeovers,
            ),
            ("members taken out of chains", self.removals),
            ("group recoveries", self.recoveries),
            ("reads relayed to the tail", self.reads_relayed),
            ("clients started over", self.session_churn),
            ("datagrams replayed by the attacker", self.replayed),
            ("replays dropped as stale", self.stale_dropped),
            (
                "writes refused by a head's replay floor",
                self.replays_refused,
            ),
        ]
    }
}

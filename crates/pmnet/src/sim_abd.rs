//! `pmnet sim --abd`: what replicated memory's world's seeds add up to (`pmnet_sim::abd`); the
//! runner is `sim/worlds.rs`.

use pmnet_sim::abd::AbdReport;

use crate::sim::worlds::WorldReport;

impl WorldReport for AbdReport {
    fn add(&mut self, other: &AbdReport) {
        AbdReport::add(self, other);
    }

    fn summary(&self, passed: u64) -> String {
        format!(
            "{passed} seeds passed ({} memory nodes in all; {} clients through the device, {} \
             client-driven): {} operations ({} reads, {} writes, {} of several lines), {} \
             answered ok, {} unavailable, {} in doubt, {} beyond the end refused; faults: {} \
             node crashes ({} power failures among them; {} torn records rejected on \
             reopening), {} memories lost for good ({} nodes rejoined after learning, {} lines \
             copied), {} partitions, {} device restarts; {} reads in one phase, {} with a \
             write-back; {} device clients started over; the attacker replayed {} datagrams \
             ({} past the window, {} bursts after restarts): {} dropped as stale, {} refused \
             by the device's replay floor",
            self.nodes,
            self.device_clients,
            self.direct_clients,
            self.operations,
            self.reads,
            self.writes,
            self.multi_line,
            self.completed,
            self.unavailable,
            self.in_doubt,
            self.out_of_range,
            self.crashes,
            self.power_failures,
            self.torn_records,
            self.losses,
            self.joins,
            self.lines_learnt,
            self.partitions,
            self.device_restarts,
            self.reads_one_phase,
            self.write_backs,
            self.session_churn,
            self.replayed,
            self.replayed_past_window,
            self.replay_bursts,
            self.stale_dropped,
            self.replays_refused,
        )
    }

    fn coverage(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("operations answered ok", self.completed),
            ("operations unavailable", self.unavailable),
            ("writes in doubt", self.in_doubt),
            ("node crashes", self.crashes),
            ("power failures", self.power_failures),
            ("torn records rejected on reopening", self.torn_records),
            ("memories lost for good", self.losses),
            ("nodes rejoined after learning", self.joins),
            ("partitions", self.partitions),
            (
                "device restarts (coordinator crashes)",
                self.device_restarts,
            ),
            ("reads with a write-back", self.write_backs),
            ("device clients started over", self.session_churn),
            ("datagrams replayed by the attacker", self.replayed),
            ("replays dropped as stale", self.stale_dropped),
            (
                "requests refused by the device's replay floor",
                self.replays_refused,
            ),
        ]
    }
}

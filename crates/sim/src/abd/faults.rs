//! Replicated memory's world's faults: a node's crash (of its batches of line writes under
//! way, a prefix stored and flushed without the fence; it restarts 1–150 ms later on what the
//! crash left), a power failure (every node crashes at once), a node's memory lost for good
//! (it restarts on a new, empty table and learns), a node cut off from everyone, a coordinator
//! cut off from a node or from everyone, the device restarting; the restarts due; the healing
//! at the end of the safety phase. At most a minority of the nodes are down, learning or cut
//! off at once, but in a power failure.

use std::time::Duration;

use pmnet_pmtable::{Table, TableFile};
use rand::Rng;

use super::world::{client_addr, device_addr, device_host, fresh_node, node_addr, node_host};
use super::world::{AbdWorld, Node};
use crate::network::{Cut, Network};
use pmnet_proto::Time;

/// The node's process crashes: of its batches of line writes under way, a prefix was started
/// (records stored and flushed, not fenced), and the crash keeps, loses or tears each line of
/// them; it restarts 1–150 ms later on what the crash left.
fn crash(node: &mut Node, now: pmnet_proto::Time, rng: &mut rand_chacha::ChaCha8Rng) {
    let started = rng.random_range(0..=node.persisting.len());
    let cut: Vec<_> = node
        .persisting
        .drain(..)
        .take(started)
        .map(|(_, batch)| batch)
        .collect();
    node.host.crash(&cut, rng);
    node.up = false;
    node.restart_empty = false;
    node.restart_at = Some(now + Duration::from_millis(rng.random_range(1..150)));
}

/// Nodes other than `but` down, learning or cut off from everyone.
fn out(nodes: &[Node], network: &Network, now: Time, but: usize) -> usize {
    nodes
        .iter()
        .enumerate()
        .filter(|(other, node)| {
            *other != but
                && (!node.up
                    || !node.node().is_member()
                    || network.isolated(now, node_addr(*other)))
        })
        .count()
}

impl AbdWorld {
    /// Inject the faults whose time has come.
    pub(super) fn inject_due_faults(&mut self) {
        let now = self.now;
        while self.faults.first().is_some_and(|(at, _)| *at <= now) {
            let (_, kind) = self.faults.remove(0);
            let index = self.rng.random_range(0..self.nodes.len());
            // Nodes down, learning or cut off from everyone: at most a minority.
            let may_fail = self.nodes[index].up
                && out(&self.nodes, &self.network, now, index) < self.tolerated;
            match kind {
                // A crash, the memory kept.
                0..=2 if may_fail => {
                    crash(&mut self.nodes[index], now, &mut self.rng);
                    self.report.crashes += 1;
                    self.note("sim", || format!("node {index} crashes"));
                }
                // A power failure: every node crashes at once, its persistent memory kept.
                // Beyond the minority the other faults keep to: a crash loses nothing a node
                // acknowledged, so no number of them is a danger to what was written (only
                // to progress, until they restart).
                10 if self.nodes.iter().all(|node| node.up) => {
                    for node in &mut self.nodes {
                        crash(node, now, &mut self.rng);
                    }
                    self.report.crashes += self.nodes.len() as u64;
                    self.report.power_failures += 1;
                    self.note("sim", || "power failure: every node crashes".to_string());
                }
                // The memory lost for good: back on a new, empty table.
                3 if may_fail => {
                    let node = &mut self.nodes[index];
                    node.persisting.clear();
                    node.up = false;
                    node.restart_empty = true;
                    node.restart_at =
                        Some(now + Duration::from_millis(self.rng.random_range(1..100)));
                    self.report.losses += 1;
                    self.note("sim", || format!("node {index} loses its memory"));
                }
                // A node cut off from everyone.
                4 | 5 if may_fail => {
                    let until = now + Duration::from_millis(self.rng.random_range(20..300));
                    let side = node_addr(index);
                    (self.network.cuts).push(Cut {
                        side,
                        other: None,
                        until,
                    });
                    self.report.partitions += 1;
                    self.note("sim", || format!("node {index} cut off until {until}"));
                }
                // A coordinator (the device or a client-driven client) cut off from a node,
                // or from everyone.
                6 | 7 => self.cut_coordinator(index),
                // The device restarts: its operations and what it knew of sessions lost.
                8 | 9 if self.device_up => {
                    self.device_up = false;
                    self.device_restart_at =
                        Some(now + Duration::from_millis(self.rng.random_range(1..50)));
                    self.report.device_restarts += 1;
                    self.note("sim", || "the device restarts".to_string());
                }
                _ => {}
            }
        }
    }

    /// A coordinator (the device or a client-driven client) cut off from node `index` or from
    /// everyone, longer than an operation's deadline at times: its operations fail.
    fn cut_coordinator(&mut self, index: usize) {
        let now = self.now;
        let until = now + Duration::from_millis(self.rng.random_range(20..800));
        let coordinator = match self.rng.random_range(0..=self.direct_clients) {
            0 => device_addr(),
            k => client_addr(self.device_clients + k - 1),
        };
        let other = self.rng.random_bool(0.6).then(|| node_addr(index));
        let side = coordinator;
        self.network.cuts.push(Cut { side, other, until });
        self.report.partitions += 1;
        self.note("sim", || {
            format!("{coordinator} cut off from {other:?} until {until}")
        });
    }

    /// Restart the nodes and the device whose time has come (all of them once healing).
    pub(super) fn restart_due(&mut self) -> Result<(), String> {
        let now = self.now;
        let healing = self.healing();
        for index in 0..self.nodes.len() {
            let node = &self.nodes[index];
            if node.restart_at.is_some_and(|at| at <= now) || (healing && !node.up) {
                self.restart_node(index)?;
            }
        }
        if self.device_restart_at.is_some_and(|at| at <= now) || (healing && !self.device_up) {
            self.device_restart_at = None;
            self.device_up = true;
            let session = self.rng.random();
            let host = device_host(self.nodes.len(), session, now, &mut self.network);
            let old = std::mem::replace(&mut self.device, host);
            self.report.stale_dropped += old.stale_dropped();
            let old = old.function();
            self.report.replays_refused += old.counters().replays_refused;
            self.network.restarted(now, device_addr());
            let counters = old.coordinator().counters();
            self.report.write_backs += counters.write_backs;
            self.report.reads_one_phase += counters.reads_one_phase;
        }
        if healing && !self.healed {
            self.healed = true;
            self.network.cuts.clear();
            if let Some(faults) = self.network.faults.as_mut() {
                faults.loss = 0.0;
            }
            self.note("sim", || "healed".to_string());
        }
        Ok(())
    }

    /// Node `index` restarts: on a new, empty table if it lost its memory (it learns), else
    /// on what its crash left, each durable line checked to be one a coordinator stored.
    fn restart_node(&mut self, index: usize) -> Result<(), String> {
        let now = self.now;
        let count = self.nodes.len();
        let node = &mut self.nodes[index];
        node.restart_at = None;
        node.up = true;
        self.report.stale_dropped += node.host.stale_dropped();
        if node.restart_empty {
            node.host = fresh_node(index, count, now, &mut self.network)?;
            node.was_member = false;
            self.note("sim", || format!("node {index} restarts empty, learning"));
            return Ok(());
        }
        self.network.restarted(now, node_addr(index));
        let region = node.host.region().expect("a node's lines").clone();
        let (file, recovered) =
            TableFile::open(region).map_err(|error| format!("reopen: {error}"))?;
        self.report.torn_records += recovered.damaged_records;
        let table = Table::recover_direct(file.geometry(), recovered);
        let region = file.into_region();
        node.host = node_host(index, count, table, region, now, &mut self.network);
        self.stores.check_node(
            node.node(),
            &format!("{now}: node {index} reopened after a crash"),
        )?;
        let state = node.node().state_text();
        self.note("sim", || format!("node {index} restarts ({state})"));
        Ok(())
    }

    /// Note an event of the world's by `actor` in the network's trace.
    pub(super) fn note(&mut self, actor: &str, event: impl FnOnce() -> String) {
        self.network.trace.note(self.now, actor, event);
    }
}

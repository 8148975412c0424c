//! The chain store's world's faults: a member's crash (a batch of table writes cut before its
//! fence; the member restarts on what the crash left), a member lost for good, partitions (a
//! member cut off from the controller or from everyone), controller restarts; the restarts
//! due, and the healing at the end of the safety phase. A fault that would leave a group's
//! chain with no other member up and reachable is not injected.

use std::time::Duration;

use pmnet_netchain::{Controller, Table, TableFile};
use rand::Rng;

use crate::network::Cut;

use super::world::{
    controller_addr, controller_config, flush_controller, member_addr, member_host, ChainWorld,
    MEMBERS,
};

impl ChainWorld {
    /// Whether every chain member `index` is in has another member up and reachable: the
    /// faults leave each group a live copy (the chains tolerate losing all but one).
    fn others_live(&self, index: usize) -> bool {
        let now = self.now;
        self.controller.layout().groups.iter().all(|group| {
            !group.chain.contains(&(index as u8))
                || group.chain.iter().any(|other| {
                    let other = usize::from(*other);
                    other != index
                        && self.members[other].up
                        && !self.network.partly_cut(now, member_addr(other))
                })
        })
    }

    /// Inject the faults whose time has come.
    pub(super) fn inject_due_faults(&mut self) {
        let now = self.now;
        while self.faults.first().is_some_and(|(at, _)| *at <= now) {
            let (_, kind) = self.faults.remove(0);
            // Fixed chains: crashes only (nothing takes a member out or brings one in).
            let kind = if self.controlled { kind } else { 0 };
            let index = self.rng.random_range(0..MEMBERS);
            self.note("sim", || format!("fault {kind} on member{index}"));
            match kind {
                0 if self.members[index].up && self.others_live(index) => self.crash(index),
                // Lost for good: only while each of its chains has another live member (the
                // chains tolerate losing all but one copy, not every copy).
                1 if self.lose_one
                    && !self.lost_one
                    && self.members[index].up
                    && self.others_live(index) =>
                {
                    self.members[index].up = false;
                    self.members[index].lost = true;
                    self.lost_one = true;
                    self.report.members_lost += 1;
                }
                2 if self.others_live(index) => {
                    let until = now + Duration::from_millis(self.rng.random_range(20..250));
                    let other = if self.rng.random_bool(0.5) {
                        Some(controller_addr(self.leader))
                    } else {
                        None
                    };
                    let side = member_addr(index);
                    self.network.cuts.push(Cut { side, other, until });
                    self.report.partitions += 1;
                }
                3 if self.controller_up => {
                    self.controller_up = false;
                    self.controller_restart_at =
                        Some(now + Duration::from_millis(self.rng.random_range(1..100)));
                    self.report.controller_restarts += 1;
                }
                _ => {}
            }
        }
    }

    /// Member `index`'s process crashes (a batch it asked for cut before its fence); it
    /// restarts later.
    fn crash(&mut self, index: usize) {
        let now = self.now;
        let member = &mut self.members[index];
        let cut = member.host.poll_persist();
        member.host.crash(&cut, &mut self.rng);
        member.up = false;
        member.restart_at = Some(now + Duration::from_millis(self.rng.random_range(1..150)));
        self.report.crashes += 1;
    }

    /// Restart the members and the controller whose time has come (all of them once healing,
    /// but the member lost for good).
    pub(super) fn restart_due(&mut self) -> Result<(), String> {
        let now = self.now;
        let healing = self.healing();
        for index in 0..self.members.len() {
            let member = &mut self.members[index];
            let due = member.restart_at.is_some_and(|at| at <= now)
                || (healing && !member.up && !member.lost);
            if !due {
                continue;
            }
            member.restart_at = None;
            let region = member.host.region().expect("a member's table").clone();
            let (file, recovered) = TableFile::open(region)
                .map_err(|error| format!("seed {}: reopen: {error}", self.seed))?;
            let table = Table::recover(file.geometry(), recovered);
            self.report.replays_refused += member.node().counters().replays_refused;
            self.report.stale_dropped += member.host.stale_dropped();
            let region = file.into_region();
            let network = &mut self.network;
            member.host = member_host(index, self.controlled, table, region, now, network);
            member.up = true;
            self.network.restarted(now, member_addr(index));
        }
        if self.controlled
            && (self.controller_restart_at.is_some_and(|at| at <= now)
                || (healing && !self.controller_up))
        {
            self.controller_restart_at = None;
            self.controller =
                Controller::restore(controller_config(), self.saved.clone(), &[], now)
                    .map_err(|error| error.to_string())?;
            // Half the time the standby takes over (the leader's etcd lease ran out while it
            // was down): the other address, a new term, members and clients following it.
            if self.rng.random_bool(0.5) {
                self.leader = 1 - self.leader;
                self.controller.begin_term();
                self.report.controller_takeovers += 1;
                let leader = self.leader;
                self.note("sim", || format!("controller {leader} takes over"));
            }
            self.controller_up = true;
            flush_controller(
                &mut self.controller,
                controller_addr(self.leader),
                &mut self.saved,
                now,
                &mut self.network,
            );
        }
        Ok(())
    }

    /// Once healing: no partition, no loss.
    pub(super) fn heal_when_due(&mut self) {
        if self.healing() {
            self.network.cuts.clear();
            if let Some(faults) = self.network.faults.as_mut() {
                faults.loss = 0.0;
            }
        }
    }
}

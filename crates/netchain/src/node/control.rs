//! A member's side of the controller (docs/netchain.md, "The controller"): its status every
//! few milliseconds, the lease each grant renews, configurations that change the chains,
//! and recovery — as the source of a joining member, pages of its table; as the joining
//! member, those pages taken into its own table.
//!
//! Safety rests on the lease: a member answers clients only until `stamp + lease`, where
//! `stamp` is its own clock when it sent the status the last grant answered. The controller
//! stops granting to a member it suspects and waits a lease after its last grant before it
//! takes the member out of a chain, so a member cut off from the controller has stopped
//! answering reads before any write can commit without it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{CountDrop, DropReason, Time};
use pmnet_wire::netchain::control::{
    Grant, Joining, Layout, MemberStatus, Phase, Report, ReportKind, SyncData, SyncEntry,
    SyncRequest, CHAIN_CONFIG, CHAIN_GRANT, CHAIN_STATUS, CHAIN_SYNC, CHAIN_SYNC_DATA, SYNC_DONE,
};
use pmnet_wire::Header;

use super::{group_of, ChainConfig, ChainNode};
use pmnet_pmtable::Version;

/// How often a member sends the controller its status (its heartbeat).
pub const STATUS_INTERVAL: Duration = Duration::from_millis(5);
/// A sync request with no page back is sent again after this long.
pub const SYNC_RESEND: Duration = Duration::from_millis(20);
/// Bytes of keys and values in one sync page, at most.
pub const SYNC_PAGE_BYTES: usize = 8 * 1024;

pub(super) fn is_control(code: u8) -> bool {
    matches!(
        code,
        CHAIN_CONFIG | CHAIN_GRANT | CHAIN_SYNC | CHAIN_SYNC_DATA
    )
}

/// A joining member's progress in one group.
#[derive(Debug)]
struct Recovery {
    joining: Joining,
    source: SocketAddr,
    /// Copy: 0 (everything); delta: the source's change number when the copy began.
    since: u64,
    /// Copy: the source's change number at the first page.
    copy_change: Option<u64>,
    /// The next page to ask for; `None`: every page is here.
    cursor: Option<u32>,
    resend_at: Time,
    /// Keys taken from the source (through both phases), with the newest version taken: a
    /// page with an older one (a page sent before, replayed or late) never moves a key back.
    received: HashMap<Vec<u8>, u64>,
    /// Delta: keys of the group the source does not hold, written as deletions.
    phantoms_cleared: bool,
    /// Everything taken is durable: the report the phase ends with.
    done: Option<Report>,
}

impl Recovery {
    /// The name a sync request of this phase carries in its header (session: the epoch the
    /// phase started in; number: the low bits of `since`), and the source's pages repeat: a
    /// page of another phase or recovery (late, or replayed) is not taken for this one's.
    fn request_name(&self) -> (u64, u32) {
        (self.joining.since_epoch, self.since as u32)
    }
}

/// The control side's state.
#[derive(Debug)]
pub(super) struct Control {
    controller: Option<SocketAddr>,
    /// The other controllers (`ChainConfig::standby_controllers`).
    standbys: Vec<SocketAddr>,
    interval: Duration,
    layout: Option<Layout>,
    lease_until: Option<Time>,
    /// Random at each start: the controller tells a restart from a late status.
    boot: u64,
    next_status: Option<Time>,
    recoveries: HashMap<u16, Recovery>,
    /// Whether the member answered clients at the last timer (to say when that changes).
    was_serving: bool,
    /// A lapse of the lease was reported and no grant came since.
    lapsed: bool,
}

impl Control {
    pub(super) fn new(config: &ChainConfig, now: Time) -> Control {
        // Distinct across starts: the time the member started, its address and the start's
        // nonce (the process's own, given by the runtime).
        let boot = {
            let mut hash = now.as_nanos() ^ 0x9e37_79b9_7f4a_7c15;
            for byte in config.me.to_string().bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            hash ^ config.boot_nonce
        };
        Control {
            controller: config.controller,
            standbys: config
                .standby_controllers
                .iter()
                .copied()
                .take(super::MAX_CONTROLLERS - 1)
                .collect(),
            interval: config.status_interval,
            layout: None,
            lease_until: None,
            boot,
            next_status: config.controller.map(|_| now),
            recoveries: HashMap::new(),
            was_serving: false,
            lapsed: false,
        }
    }
}

fn stamp_of(now: Time) -> u64 {
    now.as_nanos() / 1_000
}

impl ChainNode {
    /// Whether this member answers clients now: always without a controller; with one, while
    /// it holds a configuration and a lease.
    pub fn is_serving(&self, now: Time) -> bool {
        self.control.controller.is_none()
            || (self.control.layout.is_some()
                && self.control.lease_until.is_some_and(|until| now < until))
    }

    /// Whether `group` takes no writes now.
    pub(super) fn paused(&self, group: u16) -> bool {
        self.control
            .layout
            .as_ref()
            .and_then(|layout| layout.groups.get(usize::from(group)))
            .is_some_and(|group| group.paused)
    }

    /// The configuration epoch this member runs (0: static, or none yet).
    pub fn epoch(&self) -> u64 {
        self.control
            .layout
            .as_ref()
            .map_or(0, |layout| layout.epoch)
    }

    pub(super) fn on_control(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        code: u8,
        payload: &[u8],
    ) {
        let from_controller =
            self.control.controller == Some(from) || self.control.standbys.contains(&from);
        match code {
            CHAIN_CONFIG if from_controller => match Layout::parse(payload) {
                Ok(layout) => self.take_layout(now, layout),
                Err(_) => self.counters.dropped.record(DropReason::BadPayload),
            },
            CHAIN_GRANT if from_controller => match Grant::parse(payload) {
                Ok(grant) if grant.epoch == self.epoch() && grant.epoch != 0 => {
                    let until = Time::from_nanos(grant.stamp.saturating_mul(1_000)) + self.lease();
                    if until <= now + self.lease() {
                        // (A stamp from the future is no stamp of this member's.)
                        let lease = &mut self.control.lease_until;
                        *lease = Some(lease.map_or(until, |old| old.max(until)));
                    }
                }
                Ok(_) => {}
                Err(_) => self.counters.dropped.record(DropReason::BadPayload),
            },
            CHAIN_SYNC => match SyncRequest::parse(payload) {
                Ok(request) => self.on_sync_request(from, header, request),
                Err(_) => self.counters.dropped.record(DropReason::BadPayload),
            },
            CHAIN_SYNC_DATA => match SyncData::parse(payload) {
                Ok(data) => self.on_sync_data(now, from, header, &data),
                Err(_) => self.counters.dropped.record(DropReason::BadPayload),
            },
            _ => self.counters.dropped.record(DropReason::UnexpectedType),
        }
    }

    fn lease(&self) -> Duration {
        Duration::from_millis(
            self.control
                .layout
                .as_ref()
                .map_or(0, |layout| u64::from(layout.lease_ms)),
        )
    }

    /// A newer configuration: the chains change; writes passed on and not committed go to
    /// the new next member at once (or, at the tail now, are answered and committed).
    fn take_layout(&mut self, now: Time, layout: Layout) {
        if layout.epoch <= self.epoch() {
            return;
        }
        self.counters.configs += 1;
        let me = self.config.me;
        let chains = layout.chains();
        let mut joined = Vec::new();
        for (group, chain) in chains.iter().enumerate() {
            let was_in = self
                .config
                .groups
                .get(group)
                .is_some_and(|old| old.contains(&me));
            let was_head = self
                .config
                .groups
                .get(group)
                .is_some_and(|old| old.first() == Some(&me));
            let head = chain.first() == Some(&me);
            if self.control.layout.is_some() && chain.contains(&me) && !was_in {
                joined.push(group as u16);
            }
            if self.control.layout.is_some()
                && ((chain.contains(&me) && !was_in) || (head && !was_head))
            {
                // This member did not see the group's history, or becomes its head: a
                // retransmitted write it does not know may have been stamped before — by the
                // head before it, whose write never reached this member while a later one
                // did. For a request lifetime such a write is answered "in doubt"; one
                // sealed before this configuration came (a replay: a client's transmissions
                // are sealed afresh) is refused.
                self.forgot_at = Some(now);
                self.refuse_sealed_before_now();
            }
        }
        if !joined.is_empty() {
            self.forget_groups(&joined, chains.len());
        }
        self.config.groups = chains;
        self.resends.clear();
        for ((key, version), unacked) in &mut self.unacked {
            unacked.resend_at = now;
            self.resends.insert((now, key.clone(), *version));
        }
        // Recoveries: keep the ones that go on (a copy turning into its delta keeps what it
        // took), start the new ones.
        let my_index = layout.index_of(me);
        let mut recoveries = std::mem::take(&mut self.control.recoveries);
        for (group, settings) in layout.groups.iter().enumerate() {
            let group = group as u16;
            let Some(joining) = settings
                .joining
                .filter(|joining| Some(joining.member) == my_index)
            else {
                continue;
            };
            let source = layout.members[usize::from(joining.source)];
            let recovery = match recoveries.remove(&group) {
                Some(old) if old.joining == joining => old,
                Some(old)
                    if old.joining.phase == Phase::Copy
                        && joining.phase == Phase::Delta
                        && old.joining.source == joining.source
                        && old.done.is_some() =>
                {
                    Recovery {
                        joining,
                        source,
                        since: old.copy_change.unwrap_or(0),
                        copy_change: old.copy_change,
                        cursor: Some(0),
                        resend_at: now,
                        received: old.received,
                        phantoms_cleared: false,
                        done: None,
                    }
                }
                // A delta with no copy behind it (this member restarted): nothing to do
                // until the controller starts the copy again.
                _ if joining.phase == Phase::Delta => continue,
                _ => Recovery {
                    joining,
                    source,
                    since: 0,
                    copy_change: None,
                    cursor: Some(0),
                    resend_at: now,
                    received: HashMap::new(),
                    phantoms_cleared: false,
                    done: None,
                },
            };
            self.control.recoveries.insert(group, recovery);
        }
        self.control.layout = Some(layout);
        // Tell the controller at once.
        self.control.next_status = Some(now);
    }

    fn on_sync_request(&mut self, from: SocketAddr, header: &Header, request: SyncRequest) {
        let Some(layout) = &self.control.layout else {
            self.counters.dropped.record(DropReason::NotServed);
            return;
        };
        let me = layout.index_of(self.config.me);
        let asker = layout.index_of(from);
        let allowed = layout
            .groups
            .get(usize::from(request.group))
            .and_then(|group| group.joining)
            .is_some_and(|joining| Some(joining.source) == me && Some(joining.member) == asker);
        if !allowed {
            self.counters.dropped.record(DropReason::UnexpectedSource);
            return;
        }
        let groups = self.group_count();
        let page = self.table.page(
            |key| group_of(key, groups) == request.group,
            request.since,
            request.cursor,
            SYNC_PAGE_BYTES,
        );
        let data = SyncData {
            group: request.group,
            cursor: request.cursor,
            next: page.next.unwrap_or(SYNC_DONE),
            change: page.change,
            entries: page
                .entries
                .iter()
                .map(|(key, version)| SyncEntry {
                    version: version.seq,
                    key,
                    value: version.value.as_deref(),
                })
                .collect(),
        };
        let mut payload = Vec::new();
        data.emit(&mut payload);
        self.counters.sync_pages_sent += 1;
        // The page names the request it answers (its header's session and number).
        self.send(
            from,
            CHAIN_SYNC_DATA,
            header.session_id,
            header.seq,
            &payload,
        );
    }

    fn on_sync_data(&mut self, now: Time, from: SocketAddr, header: &Header, data: &SyncData<'_>) {
        let groups = self.group_count();
        let Some(recovery) = self.control.recoveries.get_mut(&data.group) else {
            self.counters.dropped.record(DropReason::Mismatch);
            return;
        };
        if recovery.source != from
            || recovery.cursor != Some(data.cursor)
            || (header.session_id, header.seq) != recovery.request_name()
        {
            // Not the page asked for (late, duplicated, or not from the source).
            self.counters.dropped.record(DropReason::Mismatch);
            return;
        }
        if recovery.joining.phase == Phase::Copy && data.cursor == 0 {
            recovery.copy_change = Some(data.change);
        }
        let mut taken = Vec::with_capacity(data.entries.len());
        for entry in &data.entries {
            if group_of(entry.key, groups) != data.group {
                continue;
            }
            taken.push((
                entry.key.to_vec(),
                Version {
                    seq: entry.version,
                    value: entry.value.map(<[u8]>::to_vec),
                },
            ));
        }
        recovery.cursor = (data.next != SYNC_DONE).then_some(data.next);
        recovery.resend_at = now;
        for (key, version) in taken {
            let seq = version.seq;
            if recovery
                .received
                .get(&key)
                .is_some_and(|newest| *newest > seq)
            {
                // Older than what this recovery took already: a stale page.
                self.counters.dropped.record(DropReason::StaleData);
                continue;
            }
            match self.table.replace(&key, version) {
                Ok(_) => {
                    self.counters.sync_versions_taken += 1;
                    recovery.received.insert(key, seq);
                }
                // No room for the source's key: the recovery cannot end; counted, and the
                // operator gives the member a larger table.
                Err(_) => self.counters.refused_full += 1,
            }
        }
        self.advance_recoveries(now);
    }

    /// Ask for the pages due, clear phantoms at the end of a delta, and note the phases whose
    /// versions are all durable.
    fn advance_recoveries(&mut self, now: Time) {
        let groups = self.group_count();
        let in_flight: Vec<u16> = self.control.recoveries.keys().copied().collect();
        for group in in_flight {
            let Some(recovery) = self.control.recoveries.get_mut(&group) else {
                continue;
            };
            if let Some(cursor) = recovery.cursor {
                if recovery.resend_at <= now {
                    recovery.resend_at = now + SYNC_RESEND;
                    let request = SyncRequest {
                        group,
                        since: recovery.since,
                        cursor,
                    };
                    let source = recovery.source;
                    let (session, number) = recovery.request_name();
                    let mut payload = Vec::new();
                    request.emit(&mut payload);
                    self.send(source, CHAIN_SYNC, session, number, &payload);
                }
                continue;
            }
            if recovery.done.is_some() {
                continue;
            }
            if recovery.joining.phase == Phase::Delta && !recovery.phantoms_cleared {
                // Keys of the group this member holds and the source does not: versions no
                // chain committed (written here before this member left the chain).
                recovery.phantoms_cleared = true;
                let received = &recovery.received;
                let phantoms = self.table.keys_where(|key| {
                    group_of(key, groups) == group && !received.contains_key(key)
                });
                for key in phantoms {
                    // As the chain holds it: never written (version 0), so that the next
                    // version the head stamps is newer here too. (A deletion at the phantom's
                    // own version would make that next version look stale.) It takes the
                    // key's own bucket: never refused.
                    let never = Version {
                        seq: 0,
                        value: None,
                    };
                    let _ = self.table.replace(&key, never);
                    if let Some(recovery) = self.control.recoveries.get_mut(&group) {
                        recovery.received.insert(key, 0);
                    }
                }
            }
            let Some(recovery) = self.control.recoveries.get(&group) else {
                continue;
            };
            if recovery.received.keys().all(|key| self.table.is_clean(key)) {
                let report = match recovery.joining.phase {
                    Phase::Copy => Report {
                        group,
                        kind: ReportKind::Copied,
                        value: recovery.copy_change.unwrap_or(0),
                    },
                    Phase::Delta => Report {
                        group,
                        kind: ReportKind::Synced,
                        value: 0,
                    },
                };
                if let Some(recovery) = self.control.recoveries.get_mut(&group) {
                    recovery.done = Some(report);
                }
            }
        }
    }

    /// The status to send now: the epoch, and what the controller waits for.
    fn status(&self, now: Time) -> MemberStatus {
        let mut reports: Vec<Report> = self
            .control
            .recoveries
            .values()
            .filter_map(|recovery| recovery.done)
            .collect();
        if let Some(layout) = &self.control.layout {
            for (group, settings) in layout.groups.iter().enumerate() {
                let group = group as u16;
                if settings.paused && self.place(group).is_some_and(|(at, _)| at == 0) {
                    let busy = self
                        .unacked
                        .values()
                        .any(|unacked| unacked.held.group == group)
                        || self.held.values().flatten().any(|held| held.group == group);
                    if !busy {
                        reports.push(Report {
                            group,
                            kind: ReportKind::Drained,
                            value: 0,
                        });
                    }
                }
            }
        }
        reports.truncate(pmnet_wire::netchain::control::MAX_GROUPS);
        MemberStatus {
            epoch: self.epoch(),
            boot: self.control.boot,
            stamp: stamp_of(now),
            reports,
        }
    }

    pub(super) fn control_timeout(&mut self, now: Time) {
        let Some(controller) = self.control.controller else {
            return;
        };
        self.advance_recoveries(now);
        self.note_serving(now, controller);
        if self.control.next_status.is_some_and(|at| at <= now) {
            self.control.next_status = Some(now + self.control.interval);
            let mut payload = Vec::new();
            self.status(now).emit(&mut payload);
            self.send(controller, CHAIN_STATUS, 0, 0, &payload);
            for standby in self.control.standbys.clone() {
                self.send(standby, CHAIN_STATUS, 0, 0, &payload);
            }
        }
    }

    /// Say when the member stops answering clients for want of a grant (a lease that ran
    /// out: the controller is gone, cut off, or stopped for want of etcd), and when it answers
    /// again.
    fn note_serving(&mut self, now: Time, controller: SocketAddr) {
        let serving = self.is_serving(now);
        if self.control.was_serving && !serving {
            self.counters.leases_lapsed += 1;
            self.control.lapsed = true;
            let mut controllers = vec![controller.to_string()];
            controllers.extend(self.control.standbys.iter().map(ToString::to_string));
            tracing::warn!(
                "chain member {}: the controller's lease ran out ({} ms without a grant from {}): \
                 answering clients \"not here\" until one comes. Is a controller running, and \
                 (`pmnet controller`) can it reach etcd?",
                self.config.me,
                self.lease().as_millis(),
                controllers.join(" or ")
            );
        } else if serving && self.control.lapsed {
            self.control.lapsed = false;
            tracing::info!(
                "chain member {}: a controller's grant came: answering clients again",
                self.config.me
            );
        }
        self.control.was_serving = serving;
    }

    pub(super) fn control_poll_timeout(&self) -> Option<Time> {
        let recovery = self
            .control
            .recoveries
            .values()
            .filter(|recovery| recovery.cursor.is_some())
            .map(|recovery| recovery.resend_at)
            .min();
        match (self.control.next_status, recovery) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

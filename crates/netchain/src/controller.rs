//! The chain controller (docs/netchain.md, "The controller"): membership and the chains of
//! the virtual groups, heartbeats and leases, failover, and recovery of a member into the
//! groups that lack one. No I/O: statuses and time in; configurations, grants and the state
//! to save out. The runtime saves [`Controller::poll_save`]'s state durably *before* it
//! sends the datagrams of the same step: no member ever runs an epoch the controller could
//! forget.
//!
//! Failover: a member whose status stops for `suspect_after` is suspected; the controller
//! grants it nothing more and, a lease after its last grant (when the member has stopped
//! answering clients), takes it out of every chain it is in (never the last member of one).
//! Only its neighbours' roles change. Recovery: one group at a time, a live member not in the
//! group's chain copies the group's keys from the tail while writes go on (copy), writes to
//! the group pause and drain, it copies what changed since (delta), joins the chain as its
//! tail, and writes resume once every member of the group runs that configuration.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{
    AuthWarnings, Authenticator, CountDrop, DropCounts, DropReason, PlainTrafficWarnings, Time,
    Transmit,
};
use pmnet_wire::netchain::control::Grant;
use pmnet_wire::netchain::control::{
    Fetch, GroupLayout, Joining, Layout, MemberStatus, Phase, ReportKind, CHAIN_CONFIG,
    CHAIN_FETCH, CHAIN_GRANT, CHAIN_STATUS, MAX_GROUPS, MAX_MEMBERS,
};
use pmnet_wire::{Header, PacketType};

use crate::node::rotated_groups;

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub server_id: u16,
    /// Members in each group's chain when all is well.
    pub chain_length: usize,
    /// A member with no status for this long is suspected.
    pub suspect_after: Duration,
    /// How long a grant lets a member answer clients, from the status it answers.
    pub lease: Duration,
    /// Configurations sent to clients that ask, per second at most.
    pub fetches_per_second: u32,
    /// Seal every datagram sent and accept only datagrams that verify (the members and
    /// clients hold the same deployment keys); `None`: no authentication.
    pub auth: Option<Authenticator>,
}

impl Default for ControllerConfig {
    fn default() -> ControllerConfig {
        ControllerConfig {
            server_id: 1,
            chain_length: 3,
            suspect_after: Duration::from_millis(30),
            lease: Duration::from_millis(30),
            fetches_per_second: 2_000,
            auth: None,
        }
    }
}

/// What the controller counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerCounters {
    pub statuses: u64,
    pub grants: u64,
    pub configs_sent: u64,
    pub fetches_answered: u64,
    pub fetches_refused: u64,
    pub suspected: u64,
    pub removed: u64,
    pub recoveries_started: u64,
    pub recoveries_done: u64,
    pub recoveries_aborted: u64,
    /// Datagrams dropped: failed authentication, unparsable, or a status from an address that
    /// is no member ([`Controller::drops`] has them by reason).
    pub dropped: u64,
}

/// A change the controller made or saw, told to its operator as one line each
/// ([`Controller::poll_event`]; `pmnet chain-controller` prints them, and counts them in its
/// metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerEvent {
    /// A member in a chain sent no status for the suspicion delay (`silent`: since its last
    /// one; `None`: none since the controller started).
    Suspected {
        member: SocketAddr,
        silent: Option<Duration>,
    },
    /// A suspected member sent a status again before it was taken out.
    Back { member: SocketAddr },
    /// A suspected member whose lease ran out, taken out of these groups' chains.
    Removed {
        member: SocketAddr,
        groups: Vec<u16>,
    },
    /// A member starts copying a group from the group's tail, to join its chain.
    Copying {
        member: SocketAddr,
        group: u16,
        source: SocketAddr,
    },
    /// The copy is done; the group's writes pause while the joining member takes the rest.
    CatchingUp { member: SocketAddr, group: u16 },
    /// The member is in the group's chain now, at position `at` (0: the head) of `of`.
    Joined {
        member: SocketAddr,
        group: u16,
        at: usize,
        of: usize,
    },
    /// Every member runs the configuration with the new tail: the group's writes resume.
    Resumed { group: u16 },
    /// A copy abandoned (and started again, or not), and why.
    Abandoned {
        member: SocketAddr,
        group: u16,
        why: &'static str,
    },
}

impl std::fmt::Display for ControllerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControllerEvent::Suspected {
                member,
                silent: Some(silent),
            } => write!(
                f,
                "member {member} suspected: no status for {} ms",
                silent.as_millis()
            ),
            ControllerEvent::Suspected {
                member,
                silent: None,
            } => write!(
                f,
                "member {member} suspected: no status since the controller started"
            ),
            ControllerEvent::Back { member } => {
                write!(
                    f,
                    "member {member} back: a status came before it was taken out"
                )
            }
            ControllerEvent::Removed { member, groups } => {
                let groups: Vec<String> = groups.iter().map(|group| format!("g{group}")).collect();
                write!(
                    f,
                    "member {member} removed from {} (its lease ran out)",
                    if groups.is_empty() {
                        "no chain".to_owned()
                    } else {
                        groups.join(", ")
                    }
                )
            }
            ControllerEvent::Copying {
                member,
                group,
                source,
            } => write!(f, "member {member} copying g{group} from {source}"),
            ControllerEvent::CatchingUp { member, group } => write!(
                f,
                "member {member} copied g{group}: its writes pause while it catches up"
            ),
            ControllerEvent::Joined {
                member,
                group,
                at,
                of,
            } => {
                let place = if *at + 1 == *of {
                    "as its tail".to_owned()
                } else if *at == 0 {
                    "as its head, where the member taken out was".to_owned()
                } else {
                    format!(
                        "at position {} of {of}, where the member taken out was",
                        at + 1
                    )
                };
                write!(f, "member {member} joined g{group} {place}")
            }
            ControllerEvent::Resumed { group } => {
                write!(
                    f,
                    "g{group} resumes writes: every member runs its new chain"
                )
            }
            ControllerEvent::Abandoned { member, group, why } => {
                write!(f, "member {member}'s copy of g{group} abandoned: {why}")
            }
        }
    }
}

/// What the controller knows of a member, for its status (`pmnet status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    pub addr: SocketAddr,
    /// Chains it is in, and heads.
    pub chains: usize,
    pub heads: usize,
    pub suspected: bool,
    /// Since its last status; `None`: none since the controller started.
    pub heard_ago: Option<Duration>,
    /// The configuration's epoch its last status said it runs.
    pub epoch: u64,
}

/// Events kept for [`Controller::poll_event`] at most (the oldest go first).
pub const EVENTS_MAX: usize = 1024;

/// What the controller knows of a member (volatile).
#[derive(Debug, Clone, Default)]
struct View {
    last_status: Option<Time>,
    boot: Option<u64>,
    epoch: u64,
    status: Option<MemberStatus>,
    /// The last grant sent (a restarted controller counts its start: the grants of its
    /// earlier run were sent before).
    last_grant: Option<Time>,
    suspected: bool,
}

/// The recovery under way: the boots of the joining member and its source when the phase
/// began (a restart of either starts the copy again).
#[derive(Debug, Clone, Copy)]
struct Boots {
    joining: Option<u64>,
    source: Option<u64>,
}

/// The chain controller.
#[derive(Debug)]
pub struct Controller {
    config: ControllerConfig,
    layout: Layout,
    views: Vec<View>,
    boots: Option<Boots>,
    /// A group whose new member joined: writes resume once every member runs this epoch.
    switched: Option<(u16, u64)>,
    save: Option<Layout>,
    transmits: VecDeque<Transmit>,
    fetch_tokens: f64,
    fetch_refill: Time,
    counters: ControllerCounters,
    /// Datagrams dropped, by reason (the drop vocabulary of `pmnet-proto`).
    drops: DropCounts,
    /// Warnings of datagrams that failed authentication (rate-limited).
    auth_warnings: AuthWarnings,
    /// Without keys, and asked to: warnings of datagrams from other hosts (rate-limited).
    plain_warnings: Option<PlainTrafficWarnings>,
    /// Changes for the operator, oldest first (at most [`EVENTS_MAX`]).
    events: VecDeque<ControllerEvent>,
    /// Per group, where the members taken out of its chain were (positions, the latest
    /// last; at most `chain_length`): a member brought in takes the latest one's place
    /// (NetChain's placement; a lost head's place is taken by the member after it, and the
    /// new one comes second), so the chains come back as they were. Kept in memory only:
    /// after a restart a member brought in becomes the tail.
    holes: Vec<Vec<u8>>,
}

/// Why a controller's state could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    NotAState(&'static str),
    /// The saved state and the settings disagree.
    Mismatch(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::NotAState(why) => write!(f, "not a chain controller's state: {why}"),
            StateError::Mismatch(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for StateError {}

const STATE_MAGIC: &[u8; 8] = b"PMNCTRL1";

/// No member is suspected sooner than this after the controller starts.
pub const START_GRACE: Duration = Duration::from_secs(1);

/// The bytes a controller's state is saved as: magic, length (u32 LE), the configuration as
/// sent on the wire, CRC-32C of all before it (u32 LE).
pub fn encode_state(layout: &Layout) -> Vec<u8> {
    let mut body = Vec::new();
    layout.emit(&mut body);
    let mut out = Vec::with_capacity(body.len() + 16);
    out.extend_from_slice(STATE_MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The configuration saved in `bytes`. Never panics.
pub fn decode_state(bytes: &[u8]) -> Result<Layout, StateError> {
    if bytes.len() < 16 || &bytes[..8] != STATE_MAGIC {
        return Err(StateError::NotAState("no magic"));
    }
    let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    if bytes.len() != 16 + len {
        return Err(StateError::NotAState("its length does not match"));
    }
    let crc = u32::from_le_bytes(bytes[12 + len..].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&bytes[..12 + len]) {
        return Err(StateError::NotAState("its checksum fails (a damaged file)"));
    }
    Layout::parse(&bytes[12..12 + len]).map_err(|_| StateError::NotAState("a bad configuration"))
}

impl Controller {
    /// A first start: the groups' chains rotate over the first `chain_length` members (the
    /// rest are spares).
    pub fn new(
        config: ControllerConfig,
        members: &[SocketAddr],
        groups: u16,
        now: Time,
    ) -> Result<Controller, StateError> {
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return Err(StateError::Mismatch(format!(
                "a controller has 1 to {MAX_MEMBERS} members, not {}",
                members.len()
            )));
        }
        if groups == 0 || usize::from(groups) > MAX_GROUPS {
            return Err(StateError::Mismatch(format!(
                "a controller has 1 to {MAX_GROUPS} groups, not {groups}"
            )));
        }
        let active = config.chain_length.clamp(1, members.len());
        let chains = rotated_groups(&members[..active], groups);
        let layout = Layout {
            epoch: 1,
            lease_ms: config.lease.as_millis() as u32,
            members: members.to_vec(),
            groups: chains
                .iter()
                .map(|chain| GroupLayout {
                    chain: chain
                        .iter()
                        .map(|member| members.iter().position(|m| m == member).unwrap() as u8)
                        .collect(),
                    paused: false,
                    joining: None,
                })
                .collect(),
        };
        let mut controller = Controller::restore(config, layout, &[], now)?;
        controller.save = Some(controller.layout.clone());
        Ok(controller)
    }

    /// A restart on a saved configuration; `members` not in it join as spares. A recovery
    /// under way starts its phase again; writes paused for one resume.
    pub fn restore(
        config: ControllerConfig,
        mut layout: Layout,
        members: &[SocketAddr],
        now: Time,
    ) -> Result<Controller, StateError> {
        let mut changed = false;
        for member in members {
            if !layout.members.contains(member) {
                if layout.members.len() >= MAX_MEMBERS {
                    return Err(StateError::Mismatch(format!(
                        "adding {member} would make more than {MAX_MEMBERS} members"
                    )));
                }
                layout.members.push(*member);
                changed = true;
            }
        }
        // A recovery under way stops (its member is not in the chain yet, so writes may
        // resume); a group whose new member just joined stays paused until every member runs
        // the configuration that has it.
        let mut switched = None;
        for (index, group) in layout.groups.iter_mut().enumerate() {
            if group.joining.take().is_some() {
                group.paused = false;
                changed = true;
            } else if group.paused && switched.is_none() {
                switched = Some(index as u16);
                changed = true;
            } else if group.paused {
                group.paused = false;
                changed = true;
            }
        }
        let lease_ms = config.lease.as_millis() as u32;
        if layout.lease_ms != lease_ms {
            // A shorter lease takes effect only once the old one has run out: the
            // controller waits the longer of the two before any removal (see `views`).
            changed = true;
        }
        let wait_from = now
            + Duration::from_millis(u64::from(layout.lease_ms.max(lease_ms)))
                .saturating_sub(config.lease);
        layout.lease_ms = lease_ms;
        // Members get a grace at the controller's start (they may be starting too): the
        // longer of a second and the suspicion delay.
        let grace = START_GRACE.saturating_sub(config.suspect_after);
        let views = vec![
            View {
                last_status: Some(now + grace),
                last_grant: Some(wait_from),
                ..View::default()
            };
            layout.members.len()
        ];
        let mut controller = Controller {
            config,
            layout,
            views,
            boots: None,
            switched: None,
            save: None,
            transmits: VecDeque::new(),
            fetch_tokens: 0.0,
            fetch_refill: now,
            counters: ControllerCounters::default(),
            drops: DropCounts::default(),
            auth_warnings: AuthWarnings::default(),
            plain_warnings: None,
            events: VecDeque::new(),
            holes: Vec::new(),
        };
        controller.holes = vec![Vec::new(); controller.layout.groups.len()];
        if changed {
            controller.bump();
        }
        controller.switched = switched.map(|group| (group, controller.layout.epoch));
        Ok(controller)
    }

    /// The next change to tell the operator, if any. Poll until `None` after every call.
    pub fn poll_event(&mut self) -> Option<ControllerEvent> {
        self.events.pop_front()
    }

    fn event(&mut self, event: ControllerEvent) {
        if self.events.len() >= EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// Each member as the controller knows it now.
    pub fn member_states(&self, now: Time) -> Vec<MemberState> {
        (0..self.layout.members.len())
            .map(|index| {
                let view = &self.views[index];
                let in_chain = |group: &&pmnet_wire::netchain::control::GroupLayout| {
                    group.chain.contains(&(index as u8))
                };
                MemberState {
                    addr: self.layout.members[index],
                    chains: self.layout.groups.iter().filter(in_chain).count(),
                    heads: self
                        .layout
                        .groups
                        .iter()
                        .filter(|group| group.chain.first() == Some(&(index as u8)))
                        .count(),
                    suspected: view.suspected,
                    heard_ago: view
                        .boot
                        .and(view.last_status)
                        .map(|at| now.saturating_duration_since(at)),
                    epoch: view.epoch,
                }
            })
            .collect()
    }

    fn member(&self, index: u8) -> SocketAddr {
        self.layout.members[usize::from(index)]
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn counters(&self) -> &ControllerCounters {
        &self.counters
    }

    /// Datagrams dropped, by reason (`unauthenticated`, `bad_tag`, … with keys configured).
    pub fn drops(&self) -> &DropCounts {
        &self.drops
    }

    /// Whether datagrams are authenticated.
    pub fn is_authenticated(&self) -> bool {
        self.config.auth.is_some()
    }

    /// Without keys: warn, at most once a minute, of unauthenticated datagrams from peers off
    /// this host (a controller started with `--insecure` on an address others reach).
    pub fn warn_of_plain_traffic(&mut self) {
        if self.config.auth.is_none() {
            self.plain_warnings = Some(PlainTrafficWarnings::default());
        }
    }

    fn count_drop(&mut self, reason: DropReason) {
        self.counters.dropped += 1;
        self.drops.record(reason);
    }

    /// The state to save before sending what this step produced.
    pub fn poll_save(&mut self) -> Option<Layout> {
        self.save.take()
    }

    /// The next datagram to send, sealed when keys are configured.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut transmit = self.transmits.pop_front()?;
        if let Some(auth) = self.config.auth.as_mut() {
            auth.seal(&mut transmit.bytes);
        }
        Some(transmit)
    }

    /// When [`Controller::handle_timeout`] is next due.
    pub fn poll_timeout(&self, now: Time) -> Time {
        now + Duration::from_millis(2)
    }

    fn send(&mut self, to: SocketAddr, code: u8, payload: &[u8]) {
        let header = Header::new(PacketType::Reserved(code), self.config.server_id, 0, 0);
        self.transmits.push_back(Transmit {
            destination: to,
            bytes: header.encode(payload),
        });
    }

    fn send_layout(&mut self, to: SocketAddr) {
        let mut payload = Vec::new();
        self.layout.emit(&mut payload);
        self.counters.configs_sent += 1;
        self.send(to, CHAIN_CONFIG, &payload);
    }

    /// A new epoch: saved, then sent to every member.
    /// Start a leadership term (a controller that just took over from etcd's state): a new
    /// epoch, saved before it is sent, so that every member and client takes this
    /// controller's configurations over any the previous leader sent.
    pub fn begin_term(&mut self) {
        if self.save.is_none() {
            self.bump();
        }
    }

    fn bump(&mut self) {
        self.layout.epoch += 1;
        self.save = Some(self.layout.clone());
        for member in self.layout.members.clone() {
            self.send_layout(member);
        }
    }

    /// A datagram from the network: verified first (with keys configured; one that fails is
    /// counted by reason and dropped, never answered), then parsed. Never panics on its
    /// contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let verified = match self.config.auth.as_mut().map(|auth| auth.verify(datagram)) {
            None => {
                if let Some(warnings) = self.plain_warnings.as_mut() {
                    warnings.received(now, "chain controller", from);
                }
                std::borrow::Cow::Borrowed(datagram)
            }
            Some(Ok(inner)) => inner,
            Some(Err(error)) => {
                self.auth_warnings.failed(
                    now,
                    "chain controller",
                    from,
                    pmnet_proto::DropReason::Auth(error),
                );
                self.count_drop(DropReason::Auth(error));
                return;
            }
        };
        let (header, payload) = match Header::parse(&verified) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.count_drop(DropReason::Parse(error));
                return;
            }
        };
        match header.packet_type {
            PacketType::Reserved(CHAIN_STATUS) => match MemberStatus::parse(payload) {
                Ok(status) => self.on_status(now, from, status),
                Err(_) => self.count_drop(DropReason::BadPayload),
            },
            PacketType::Reserved(CHAIN_FETCH) => match Fetch::parse(payload) {
                Ok(fetch) => self.on_fetch(now, from, fetch),
                Err(_) => self.count_drop(DropReason::BadPayload),
            },
            _ => self.count_drop(DropReason::UnexpectedType),
        }
        self.advance(now);
    }

    fn on_status(&mut self, now: Time, from: SocketAddr, status: MemberStatus) {
        let Some(index) = self.layout.index_of(from) else {
            self.count_drop(DropReason::UnexpectedSource);
            return;
        };
        self.counters.statuses += 1;
        let epoch = self.layout.epoch;
        let view = &mut self.views[usize::from(index)];
        view.last_status = Some(now);
        view.boot = Some(status.boot);
        view.epoch = status.epoch;
        if view.suspected {
            // Back before it was taken out (nothing changed), or back after it was (it is
            // in no chain: a candidate to join them again).
            view.suspected = false;
            if self.layout.groups.iter().any(|g| g.chain.contains(&index)) {
                self.event(ControllerEvent::Back { member: from });
            }
        }
        let view = &mut self.views[usize::from(index)];
        let grant = (!view.suspected && status.epoch == epoch).then_some(status.stamp);
        if grant.is_some() {
            view.last_grant = Some(view.last_grant.map_or(now, |at| at.max(now)));
        }
        view.status = Some(status);
        if let Some(stamp) = grant {
            let mut payload = Vec::new();
            Grant { epoch, stamp }.emit(&mut payload);
            self.counters.grants += 1;
            self.send(from, CHAIN_GRANT, &payload);
        } else if self.views[usize::from(index)].epoch < epoch {
            self.send_layout(from);
        }
    }

    fn on_fetch(&mut self, now: Time, from: SocketAddr, fetch: Fetch) {
        if fetch.epoch >= self.layout.epoch {
            return;
        }
        let rate = f64::from(self.config.fetches_per_second);
        let elapsed = now
            .saturating_duration_since(self.fetch_refill)
            .as_secs_f64();
        self.fetch_refill = now;
        self.fetch_tokens = (self.fetch_tokens + elapsed * rate).min(rate / 10.0 + 1.0);
        if self.fetch_tokens < 1.0 {
            self.counters.fetches_refused += 1;
            return;
        }
        self.fetch_tokens -= 1.0;
        self.counters.fetches_answered += 1;
        self.send_layout(from);
    }

    /// Suspicion, removals and recovery: what time alone moves on.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
    }

    fn alive(&self, index: u8, now: Time) -> bool {
        let view = &self.views[usize::from(index)];
        !view.suspected
            && view
                .last_status
                .is_some_and(|at| now.saturating_duration_since(at) < self.config.suspect_after)
    }

    fn reports(&self, index: u8, kind: ReportKind, group: u16) -> Option<u64> {
        let view = &self.views[usize::from(index)];
        let status = view.status.as_ref()?;
        if status.epoch != self.layout.epoch {
            return None;
        }
        status
            .reports
            .iter()
            .find(|report| report.kind == kind && report.group == group)
            .map(|report| report.value)
    }

    fn advance(&mut self, now: Time) {
        self.suspect(now);
        if self.remove_dead(now) {
            return;
        }
        self.recover(now);
    }

    fn suspect(&mut self, now: Time) {
        let in_chains: Vec<u8> = (0..self.layout.members.len() as u8)
            .filter(|index| self.layout.groups.iter().any(|g| g.chain.contains(index)))
            .collect();
        for index in in_chains {
            let suspect_after = self.config.suspect_after;
            let view = &mut self.views[usize::from(index)];
            if !view.suspected
                && view
                    .last_status
                    .is_none_or(|at| now.saturating_duration_since(at) >= suspect_after)
            {
                view.suspected = true;
                // A member never heard from has only the start grace as its "last status".
                let silent = view
                    .boot
                    .and(view.last_status)
                    .map(|at| now.saturating_duration_since(at));
                self.counters.suspected += 1;
                let member = self.member(index);
                self.event(ControllerEvent::Suspected { member, silent });
            }
        }
    }

    /// Take out of every chain the suspected members whose lease has run out. Whether the
    /// configuration changed.
    fn remove_dead(&mut self, now: Time) -> bool {
        let lease = self.config.lease + Duration::from_millis(1);
        let dead: Vec<u8> = (0..self.layout.members.len() as u8)
            .filter(|index| {
                let view = &self.views[usize::from(*index)];
                view.suspected
                    && view.last_grant.is_none_or(|at| now >= at + lease)
                    && self.layout.groups.iter().any(|g| g.chain.contains(index))
            })
            .collect();
        let mut changed = false;
        for index in dead {
            let mut removed_from = Vec::new();
            for group in 0..self.layout.groups.len() {
                let settings = &mut self.layout.groups[group];
                if settings.chain.len() > 1 && settings.chain.contains(&index) {
                    let at = settings.chain.iter().position(|member| *member == index);
                    let holes = &mut self.holes[group];
                    if let Some(at) = at {
                        if holes.len() >= self.config.chain_length.max(1) {
                            holes.remove(0);
                        }
                        holes.push(at as u8);
                    }
                    settings.chain.retain(|member| *member != index);
                    changed = true;
                    removed_from.push(group as u16);
                    if let Some(joining) = settings.joining.take() {
                        self.counters.recoveries_aborted += 1;
                        self.boots = None;
                        settings.paused = false;
                        let member = self.member(joining.member);
                        self.event(ControllerEvent::Abandoned {
                            member,
                            group: group as u16,
                            why: "a member of its chain was taken out",
                        });
                    }
                    // A group whose new member just joined stays paused: the wait for every
                    // member to run the configuration starts again below.
                }
            }
            // A member that is the last of each of its chains stays in them (it is all they
            // have): nothing removed, nothing to tell — at every turn.
            if !removed_from.is_empty() {
                self.counters.removed += 1;
                let member = self.member(index);
                self.event(ControllerEvent::Removed {
                    member,
                    groups: removed_from,
                });
            }
        }
        // A joining member or a source that is suspected: that recovery stops.
        for group in 0..self.layout.groups.len() {
            if let Some(joining) = self.layout.groups[group].joining {
                if !self.alive(joining.member, now) || !self.alive(joining.source, now) {
                    let settings = &mut self.layout.groups[group];
                    settings.joining = None;
                    settings.paused = false;
                    self.boots = None;
                    self.counters.recoveries_aborted += 1;
                    changed = true;
                    let why = if self.alive(joining.member, now) {
                        "its source is suspected"
                    } else {
                        "the joining member is suspected"
                    };
                    let member = self.member(joining.member);
                    self.event(ControllerEvent::Abandoned {
                        member,
                        group: group as u16,
                        why,
                    });
                }
            }
        }
        if changed {
            self.bump();
            if let Some((group, _)) = self.switched {
                self.switched = Some((group, self.layout.epoch));
            }
        }
        changed
    }

    fn recover(&mut self, now: Time) {
        let epoch = self.layout.epoch;
        if let Some((group, at)) = self.switched {
            let settings = &self.layout.groups[usize::from(group)];
            if settings
                .chain
                .iter()
                .all(|member| self.views[usize::from(*member)].epoch >= at)
            {
                self.layout.groups[usize::from(group)].paused = false;
                self.switched = None;
                self.counters.recoveries_done += 1;
                self.event(ControllerEvent::Resumed { group });
                self.bump();
            }
            return;
        }
        let under_way = self
            .layout
            .groups
            .iter()
            .position(|settings| settings.joining.is_some());
        let Some(group) = under_way else {
            self.start_recovery(now);
            return;
        };
        let group16 = group as u16;
        let settings = self.layout.groups[group].clone();
        let joining = settings.joining.expect("under way");
        let boot = |controller: &Controller, index: u8| controller.views[usize::from(index)].boot;
        let current = Boots {
            joining: boot(self, joining.member),
            source: boot(self, joining.source),
        };
        match self.boots {
            None => self.boots = Some(current),
            Some(started)
                if started.joining != current.joining || started.source != current.source =>
            {
                // The joining member or its source restarted: the copy starts again.
                self.boots = Some(current);
                let member = self.member(joining.member);
                self.event(ControllerEvent::Abandoned {
                    member,
                    group: group16,
                    why: "it or its source restarted; the copy starts again",
                });
                let settings = &mut self.layout.groups[group];
                settings.paused = false;
                settings.joining = Some(Joining {
                    phase: Phase::Copy,
                    since_epoch: epoch + 1,
                    ..joining
                });
                self.bump();
                return;
            }
            Some(_) => {}
        }
        match (joining.phase, settings.paused) {
            (Phase::Copy, false) => {
                if self
                    .reports(joining.member, ReportKind::Copied, group16)
                    .is_some()
                {
                    self.layout.groups[group].paused = true;
                    let member = self.member(joining.member);
                    self.event(ControllerEvent::CatchingUp {
                        member,
                        group: group16,
                    });
                    self.bump();
                }
            }
            (Phase::Copy, true) => {
                let head = settings.chain[0];
                if self.reports(head, ReportKind::Drained, group16).is_some() {
                    self.layout.groups[group].joining = Some(Joining {
                        phase: Phase::Delta,
                        since_epoch: epoch + 1,
                        ..joining
                    });
                    self.bump();
                }
            }
            (Phase::Delta, _) => {
                if self
                    .reports(joining.member, ReportKind::Synced, group16)
                    .is_some()
                {
                    let settings = &mut self.layout.groups[group];
                    // In the place of the member taken out last (the group is paused and
                    // drained, and the joining member holds every committed version: any
                    // place in the chain is safe), else as the tail. Never as the head: a new
                    // head knows none of the group's sessions and answers every
                    // retransmission "in doubt" for a request lifetime, so the member that
                    // took over heading keeps it and the new one comes right after it.
                    let at = self.holes[group]
                        .pop()
                        .map(|at| usize::from(at).max(1))
                        .filter(|at| *at <= settings.chain.len())
                        .unwrap_or(settings.chain.len());
                    settings.chain.insert(at, joining.member);
                    let of = settings.chain.len();
                    if of >= self.config.chain_length {
                        self.holes[group].clear();
                    }
                    settings.joining = None;
                    settings.paused = true;
                    self.boots = None;
                    let member = self.member(joining.member);
                    self.event(ControllerEvent::Joined {
                        member,
                        group: group16,
                        at,
                        of,
                    });
                    self.bump();
                    self.switched = Some((group16, self.layout.epoch));
                }
            }
        }
    }

    /// A group short of members and a live member to bring in, if any: start its copy.
    fn start_recovery(&mut self, now: Time) {
        let epoch = self.layout.epoch;
        let candidates: Vec<u8> = (0..self.layout.members.len() as u8)
            .filter(|index| {
                self.alive(*index, now) && self.views[usize::from(*index)].epoch == epoch
            })
            .collect();
        for group in 0..self.layout.groups.len() {
            let settings = &self.layout.groups[group];
            if settings.chain.len() >= self.config.chain_length {
                continue;
            }
            let tail = *settings.chain.last().expect("a chain has a member");
            if !self.alive(tail, now) {
                continue;
            }
            // The candidate in fewest chains, so the load spreads.
            let load = |index: u8| {
                self.layout
                    .groups
                    .iter()
                    .filter(|g| g.chain.contains(&index))
                    .count()
            };
            let Some(member) = candidates
                .iter()
                .copied()
                .filter(|index| !settings.chain.contains(index))
                .min_by_key(|index| (load(*index), *index))
            else {
                continue;
            };
            self.layout.groups[group].joining = Some(Joining {
                member,
                source: tail,
                phase: Phase::Copy,
                since_epoch: epoch + 1,
            });
            self.boots = None;
            self.counters.recoveries_started += 1;
            self.event(ControllerEvent::Copying {
                member: self.member(member),
                group: group as u16,
                source: self.member(tail),
            });
            self.bump();
            return;
        }
    }
}

//! A chain member: the NetChain function of one device (docs/netchain.md, "The chain").
//!
//! Per virtual group the configuration names the chain, head first. The head stamps each
//! write with the key's next version (a compare-and-set is decided there, on the head's latest
//! version), makes it durable in its table, and passes it down; each member makes it durable
//! before passing it on; the tail, once it is durable there, answers the client and sends a
//! commit up the chain. A member resends a write it passed on until the commit for it (or a
//! newer one) comes back, so every version the head stamped reaches the tail.
//!
//! Reads: the tail answers from its durable version; any other member answers a key whose
//! latest version is committed (clean, CRAQ's apportioned queries) and relays a read of a
//! dirty key to the tail, passing the tail's answer back.
//!
//! A member's table is in persistent memory: a restarted member keeps every durable version;
//! what it knew of commits is volatile (a restarted member relays reads until commits come
//! again).
//!
//! With a controller ([`ChainConfig::controller`]), the chains come from its configuration
//! and change with it, and a member answers clients only while its lease holds: the
//! control side is in `control.rs`.

mod control;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{CountDrop, DropCounts, DropReason, PersistBatch, ReplayFloor, Time, Transmit};
use pmnet_wire::netchain::{
    Commit, Decision, Op, Reply, Request, Status, Write, CHAIN_COMMIT, CHAIN_DECISION, CHAIN_REPLY,
    CHAIN_REQUEST, CHAIN_WRITE, RELAYED,
};
use pmnet_wire::{Header, PacketType};

use pmnet_pmtable::{Refused, Table, TableWork, Version, Written};

/// A write passed on is sent again after this long without its commit, doubling up to
/// [`RESEND_MAX`].
pub const RESEND_FIRST: Duration = Duration::from_millis(20);
pub const RESEND_MAX: Duration = Duration::from_secs(1);
/// Sessions whose last write the head remembers (for retransmissions), reads a member
/// relays, and writes waiting for durability, at most.
pub const SESSIONS_MAX: usize = 1 << 16;
pub const RELAYED_MAX: usize = 1 << 14;
pub const HELD_MAX: usize = 1 << 16;
/// Versions of one key the head has stamped and not seen committed, at most: a write beyond
/// it waits (the client sends it again). This bounds how far the head can be ahead of any
/// member on a key, which is what lets members refuse versions no head issued.
pub const VERSIONS_IN_FLIGHT_MAX: usize = 1024;
/// How far above its own latest version of a key a member takes a write from its
/// predecessor: the head's lead (at most [`VERSIONS_IN_FLIGHT_MAX`]), with room for a head
/// that restarted and stamped anew beyond versions it had in flight (docs/netchain.md,
/// "Versions no head issued"). Anything further is no head's, and is refused.
pub const VERSION_STEP_MAX: u64 = 4 * VERSIONS_IN_FLIGHT_MAX as u64;

/// The virtual group of `key` among `groups`: FNV-1a of the key, then a final mix (the same on
/// clients and members).
pub fn group_of(key: &[u8], groups: u16) -> u16 {
    (pmnet_pmtable::key_hash(key) % u64::from(groups.max(1))) as u16
}

/// The chains of `groups` virtual groups over `members`: group g's chain is every member, in
/// order, starting at member g modulo their number (so each member heads some groups and is
/// the tail of others). The static configuration every member and client derives alike.
pub fn rotated_groups(members: &[SocketAddr], groups: u16) -> Vec<Vec<SocketAddr>> {
    assert!(!members.is_empty(), "at least one member");
    (0..usize::from(groups.max(1)))
        .map(|group| {
            (0..members.len())
                .map(|at| members[(group + at) % members.len()])
                .collect()
        })
        .collect()
}

/// A member's settings.
#[derive(Debug, Clone)]
pub struct ChainConfig {
    /// This member's address, as the chains name it.
    pub me: SocketAddr,
    /// The server id written in the headers this member sends.
    pub server_id: u16,
    /// Each virtual group's chain, head first (at most 65 535 groups).
    pub groups: Vec<Vec<SocketAddr>>,
    /// The longest a client sends a request again ([`pmnet_wire::MAX_REQUEST_LIFETIME_MS`]
    /// by default): for this long after a start, or after forgetting a session, the head
    /// answers a retransmitted write it does not know with "in doubt".
    pub request_lifetime: Duration,
    /// The chain controller: when set, `groups` is empty until its configuration comes, the
    /// member answers clients only while the controller's lease holds, and it sends the
    /// controller its status every `status_interval`.
    pub controller: Option<SocketAddr>,
    /// The other controllers of an etcd control plane (one of them leads at a time): the
    /// member sends them its status too and takes a configuration or a grant from whichever
    /// leads (the epochs, saved in etcd before any is sent, order them). At most
    /// [`MAX_CONTROLLERS`] − 1.
    pub standby_controllers: Vec<SocketAddr>,
    pub status_interval: Duration,
    /// Distinct for each start of the process (the runtime draws it from the wall clock and
    /// a random number; a simulation from its seed): with the start time and the address it
    /// makes the boot id that lets the controller tell a restart from a late status. The
    /// state machine reads no clock of its own.
    pub boot_nonce: u64,
}

/// Controllers a member or a client names at most (the leader and its standbys).
pub const MAX_CONTROLLERS: usize = 7;

impl ChainConfig {
    pub fn new(me: SocketAddr, server_id: u16, groups: Vec<Vec<SocketAddr>>) -> ChainConfig {
        ChainConfig {
            me,
            server_id,
            groups,
            request_lifetime: Duration::from_millis(pmnet_wire::MAX_REQUEST_LIFETIME_MS),
            controller: None,
            standby_controllers: Vec::new(),
            status_interval: control::STATUS_INTERVAL,
            boot_nonce: 0,
        }
    }

    /// A member configured by the controller at `controller`.
    pub fn controlled(me: SocketAddr, server_id: u16, controller: SocketAddr) -> ChainConfig {
        ChainConfig {
            controller: Some(controller),
            ..ChainConfig::new(me, server_id, Vec::new())
        }
    }
}

/// What a member counted; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainCounters {
    pub requests: u64,
    /// Times the controller's lease ran out while the member answered clients.
    pub leases_lapsed: u64,
    pub writes_stamped: u64,
    pub writes_passed_on: u64,
    /// Failed compare-and-sets' decisions passed down the chain (the tail answers them).
    pub decisions_passed_on: u64,
    pub writes_resent: u64,
    pub replies_sent: u64,
    pub reads_answered_here: u64,
    pub reads_relayed: u64,
    pub commits: u64,
    pub duplicates: u64,
    /// Retransmitted writes the head could not tell from ones applied before a restart.
    pub in_doubt: u64,
    /// Writes sealed before the head forgot a session or started (of a session it knows:
    /// before it learned the session): possibly replays, refused (dropped, not answered).
    pub replays_refused: u64,
    pub refused_full: u64,
    /// Requests answered "not here" because the member holds no lease (or no configuration).
    pub not_serving: u64,
    /// Configurations taken from the controller.
    pub configs: u64,
    /// Sync pages sent to joining members, and versions taken from a source.
    pub sync_pages_sent: u64,
    pub sync_versions_taken: u64,
    /// Writes and commits refused because no head can have issued their version: a write
    /// more than [`VERSION_STEP_MAX`] above this member's latest of the key, a commit above
    /// it (docs/netchain.md, "Versions no head issued").
    pub versions_refused: u64,
    /// Writes the head made wait: [`VERSIONS_IN_FLIGHT_MAX`] versions of the key in flight.
    pub key_versions_full: u64,

    /// Datagrams dropped, by reason: unparsable, from a member that is not this one's
    /// neighbour, for a group this member does not serve, too much waiting already.
    pub dropped: DropCounts,
}

/// A write waiting until this member holds a version at least as new durably.
#[derive(Debug, Clone)]
struct Held {
    version: u64,
    value: Option<Vec<u8>>,
    group: u16,
    client: SocketAddr,
    session: u64,
    request: u32,
}

/// What became of a session's last write request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decided {
    /// Stamped at this version.
    Stamped(u64),
    /// A compare-and-set that failed: the present version and value it was answered with
    /// (answered the same again if the request comes again).
    Failed { version: u64, value: Vec<u8> },
}

/// A read relayed to the tail.
#[derive(Debug, Clone)]
struct Relayed {
    client: SocketAddr,
    tail: SocketAddr,
    key: Vec<u8>,
    /// A compare-and-set the head could not decide on its own (its version of the key is
    /// not committed yet): the version it expected. The tail's committed version decides a
    /// failure; if it matches, the client sends it again.
    compare: Option<u64>,
}

/// A key's last write passed on, resent until its commit comes back.
#[derive(Debug, Clone)]
struct Unacked {
    held: Held,
    resend_at: Time,
    interval: Duration,
}

/// A chain member.
#[derive(Debug)]
pub struct ChainNode {
    config: ChainConfig,
    table: Table,
    held: HashMap<Vec<u8>, Vec<Held>>,
    held_count: usize,
    committed: HashMap<Vec<u8>, u64>,
    /// Writes passed on and not committed, by key and version: each is resent (with its own
    /// client's identity, which the next members remember) until a commit covers it.
    unacked: BTreeMap<(Vec<u8>, u64), Unacked>,
    resends: BTreeSet<(Time, Vec<u8>, u64)>,
    /// The head's last write of each session: (request, key, version stamped). Clients send
    /// one request at a time per session.
    sessions: HashMap<u64, (u32, Vec<u8>, Decided)>,
    session_order: VecDeque<u64>,
    /// When this member started on a table that holds something (an earlier incarnation may
    /// have applied writes), and when it last forgot a session: for a request lifetime after
    /// either, a retransmitted write it does not know is in doubt.
    started: Option<Time>,
    forgot_at: Option<Time>,
    /// With keys: the seal time of the datagram being handled, each remembered session's
    /// latest (what the floor rises to when it is forgotten), and the floor below which a
    /// write of an unknown session is refused (set when the first sealed datagram comes),
    /// and each remembered session's floor when it was learned: a write of it sealed at or
    /// before that was sent before this member knew the session, and is refused too.
    sealed_ms: Option<u64>,
    session_sealed: HashMap<u64, u64>,
    floor: Option<ReplayFloor>,
    learned_under: HashMap<u64, ReplayFloor>,
    /// Reads relayed to the tail: (session, request) → who asked and what for.
    relayed: HashMap<(u64, u32), Relayed>,
    /// The flags of the replies to the request being handled ([`RELAYED`] for a relayed read).
    reply_flags: u16,
    transmits: VecDeque<Transmit>,
    counters: ChainCounters,
    control: control::Control,
}

impl ChainNode {
    /// A member over `table` (new, or as a restart recovered it), starting at `now`.
    pub fn new(config: ChainConfig, table: Table, now: Time) -> ChainNode {
        assert!(
            config.groups.len() <= usize::from(u16::MAX),
            "at most 65 535 groups"
        );
        let started = (!table.is_empty()).then_some(now);
        let control = control::Control::new(&config, now);
        ChainNode {
            config,
            table,
            held: HashMap::new(),
            held_count: 0,
            committed: HashMap::new(),
            unacked: BTreeMap::new(),
            resends: BTreeSet::new(),
            sessions: HashMap::new(),
            session_order: VecDeque::new(),
            started,
            forgot_at: None,
            sealed_ms: None,
            session_sealed: HashMap::new(),
            floor: None,
            learned_under: HashMap::new(),
            relayed: HashMap::new(),
            reply_flags: 0,
            transmits: VecDeque::new(),
            counters: ChainCounters::default(),
            control,
        }
    }

    pub fn counters(&self) -> &ChainCounters {
        &self.counters
    }

    pub fn table(&self) -> &Table {
        &self.table
    }

    fn group_count(&self) -> u16 {
        self.config.groups.len() as u16
    }

    /// This member's place in `group`'s chain: (position, chain length).
    fn place(&self, group: u16) -> Option<(usize, usize)> {
        let chain = self.config.groups.get(usize::from(group))?;
        let position = chain.iter().position(|member| *member == self.config.me)?;
        Some((position, chain.len()))
    }

    fn neighbour(&self, group: u16, offset: isize) -> Option<SocketAddr> {
        let (position, len) = self.place(group)?;
        let at = position.checked_add_signed(offset)?;
        (at < len).then(|| self.config.groups[usize::from(group)][at])
    }

    fn send(
        &mut self,
        to: SocketAddr,
        packet_type: u8,
        session: u64,
        request: u32,
        payload: &[u8],
    ) {
        self.send_flagged(to, packet_type, 0, (session, request), payload);
    }

    fn send_flagged(
        &mut self,
        to: SocketAddr,
        packet_type: u8,
        flags: u16,
        (session, request): (u64, u32),
        payload: &[u8],
    ) {
        let mut header = Header::new(
            PacketType::Reserved(packet_type),
            self.config.server_id,
            session,
            request,
        );
        header.flags = flags;
        self.transmits.push_back(Transmit {
            destination: to,
            bytes: header.encode(payload),
        });
    }

    fn reply(&mut self, to: SocketAddr, session: u64, request: u32, reply: Reply<'_>) {
        let mut payload = Vec::new();
        reply.emit(&mut payload);
        self.counters.replies_sent += 1;
        let flags = self.reply_flags;
        self.send_flagged(to, CHAIN_REPLY, flags, (session, request), &payload);
    }

    /// A datagram of one of NetChain's types (the caller checked the type); anything else in
    /// it is counted and dropped. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        match header.packet_type {
            PacketType::Reserved(CHAIN_REQUEST) => self.on_request(now, from, header, payload),
            PacketType::Reserved(CHAIN_WRITE) => self.on_write(now, from, header, payload),
            PacketType::Reserved(CHAIN_COMMIT) => self.on_commit(from, payload),
            PacketType::Reserved(CHAIN_DECISION) => self.on_decision(now, from, header, payload),
            PacketType::Reserved(CHAIN_REPLY) => self.on_tail_reply(now, from, header, payload),
            PacketType::Reserved(code) if control::is_control(code) => {
                self.on_control(now, from, header, code, payload)
            }
            _ => self.counters.dropped.record(DropReason::UnexpectedType),
        }
    }

    fn on_request(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        self.counters.requests += 1;
        let Ok(request) = Request::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        let relayed = header.has_flag(RELAYED);
        if relayed && request.op != Op::Get {
            // Members relay reads only.
            self.counters.dropped.record(DropReason::UnexpectedType);
            return;
        }
        // The answers to a relayed read carry its flag too.
        self.reply_flags = if relayed { RELAYED } else { 0 };
        self.on_request_parsed(now, from, header, &request);
        self.reply_flags = 0;
    }

    fn on_request_parsed(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        request: &Request<'_>,
    ) {
        let (session, request_id) = (header.session_id, header.seq);
        let not_here = Reply {
            status: Status::NotHere,
            version: 0,
            value: &[],
        };
        if !self.is_serving(now) {
            self.counters.not_serving += 1;
            self.reply(from, session, request_id, not_here);
            return;
        }
        if request.group >= self.group_count()
            || group_of(request.key, self.group_count()) != request.group
        {
            self.reply(from, session, request_id, not_here);
            return;
        }
        let Some((position, len)) = self.place(request.group) else {
            self.reply(from, session, request_id, not_here);
            return;
        };
        match request.op {
            Op::Get => self.on_read(from, session, request_id, request, position + 1 == len),
            _ if position != 0 => self.reply(from, session, request_id, not_here),
            _ if self.paused(request.group) => self.reply(
                from,
                session,
                request_id,
                Reply {
                    status: Status::Paused,
                    version: 0,
                    value: &[],
                },
            ),
            _ => {
                let retransmitted = header.has_flag(pmnet_wire::netchain::RETRANSMITTED);
                self.on_head_write(now, from, (session, request_id, retransmitted), request)
            }
        }
    }

    fn on_read(
        &mut self,
        from: SocketAddr,
        session: u64,
        request_id: u32,
        request: &Request<'_>,
        tail: bool,
    ) {
        if tail || self.is_clean(request.key) {
            self.counters.reads_answered_here += 1;
            let durable = self.table.durable(request.key).cloned();
            let reply = match &durable {
                Some(Version {
                    seq,
                    value: Some(value),
                }) => Reply {
                    status: Status::Ok,
                    version: *seq,
                    value,
                },
                Some(Version { seq, value: None }) => Reply {
                    status: Status::NotFound,
                    version: *seq,
                    value: &[],
                },
                None => Reply {
                    status: Status::NotFound,
                    version: 0,
                    value: &[],
                },
            };
            self.reply(from, session, request_id, reply);
            return;
        }
        if self.reply_flags & RELAYED != 0 {
            // Relayed here, but this member is no longer the tail: the relaying member tells
            // its client to ask again.
            self.reply(
                from,
                session,
                request_id,
                Reply {
                    status: Status::NotHere,
                    version: 0,
                    value: &[],
                },
            );
            return;
        }
        // Dirty here: the tail's committed version answers.
        self.relay(
            from,
            (session, request_id),
            request.group,
            request.key,
            None,
        );
    }

    /// Ask the tail of `group` for the committed version of `key` on behalf of `client`.
    fn relay(
        &mut self,
        client: SocketAddr,
        (session, request_id): (u64, u32),
        group: u16,
        key: &[u8],
        compare: Option<u64>,
    ) {
        let Some(&tail) = self.config.groups[usize::from(group)].last() else {
            return;
        };
        if self.relayed.len() >= RELAYED_MAX {
            // Reads whose answers never came: forget them; their clients ask again.
            self.relayed.clear();
        }
        self.relayed.insert(
            (session, request_id),
            Relayed {
                client,
                tail,
                key: key.to_vec(),
                compare,
            },
        );
        self.counters.reads_relayed += 1;
        let mut payload = Vec::new();
        Request {
            op: Op::Get,
            group,
            key,
            value: &[],
        }
        .emit(&mut payload);
        self.send_flagged(
            tail,
            CHAIN_REQUEST,
            RELAYED,
            (session, request_id),
            &payload,
        );
    }

    /// Whether the key's latest version here is durable and committed (CRAQ's clean).
    fn is_clean(&self, key: &[u8]) -> bool {
        self.table.is_clean(key)
            && self
                .table
                .durable(key)
                .is_none_or(|durable| self.committed.get(key).copied().unwrap_or(0) >= durable.seq)
    }

    fn on_tail_reply(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let at = (header.session_id, header.seq);
        if !header.has_flag(RELAYED)
            || self
                .relayed
                .get(&at)
                .is_none_or(|relayed| relayed.tail != from)
        {
            // Not the answer of a read relayed to that member.
            self.counters.dropped.record(DropReason::Mismatch);
            return;
        }
        let relayed = self.relayed.remove(&at).expect("looked up");
        let Ok(reply) = Reply::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        let Some(expected) = relayed.compare else {
            self.counters.replies_sent += 1;
            self.send(relayed.client, CHAIN_REPLY, at.0, at.1, payload);
            return;
        };
        let present = match reply.status {
            Status::Ok => Some(reply.version),
            Status::NotFound => Some(0),
            // The tail did not answer the read (not serving, or not the tail any more).
            _ => None,
        };
        if self
            .sessions
            .get(&at.0)
            .is_some_and(|(last, ..)| *last >= at.1)
        {
            // The request came again meanwhile and was decided here: that decision stands.
            return;
        }
        if let Some(present) = present.filter(|present| *present != expected) {
            let value = if present == 0 { &[][..] } else { reply.value };
            let group = group_of(&relayed.key, self.group_count());
            self.decide_failed(
                now,
                (relayed.client, at.0, at.1),
                group,
                &relayed.key,
                (present, value),
            );
            return;
        }
        // The committed version is the one expected; the head's newer one is on its way: the
        // client sends it again once that is decided.
        let paused = Reply {
            status: Status::Paused,
            version: 0,
            value: &[],
        };
        self.reply(relayed.client, at.0, at.1, paused);
    }

    fn on_head_write(
        &mut self,
        now: Time,
        from: SocketAddr,
        (session, request_id, retransmitted): (u64, u32, bool),
        request: &Request<'_>,
    ) {
        let sealed = self.sealed_ms.take();
        let floor = if self.sessions.contains_key(&session) {
            self.learned_under.get(&session).copied()
        } else {
            self.floor
        };
        if ReplayFloor::refuses(floor, sealed) {
            // Sealed before this head forgot a session, or before it started (for a session
            // it knows: before it learned it): it may replay a write from before, which this
            // head no longer knows. A genuine client's next transmission is sealed afresh
            // and admitted.
            self.counters.replays_refused += 1;
            return;
        }
        if let Some(sealed) = sealed {
            let latest = self.session_sealed.entry(session).or_insert(0);
            *latest = (*latest).max(sealed);
            if self.session_sealed.len() > 2 * SESSIONS_MAX {
                // Bounded: seal times of sessions never remembered are dropped, and the floor
                // rises past them as if they had been forgotten.
                let sessions = &self.sessions;
                let floor = &mut self.floor;
                self.session_sealed.retain(|id, sealed| {
                    let keep = sessions.contains_key(id);
                    if !keep {
                        if let Some(floor) = floor.as_mut() {
                            floor.forget(*sealed);
                        }
                    }
                    keep
                });
            }
        }
        match self.sessions.get(&session).cloned() {
            Some((last, key, decided)) if last == request_id => {
                // A retransmission (or a duplicate): decided already, and decided once.
                self.counters.duplicates += 1;
                if key == request.key {
                    match decided {
                        Decided::Stamped(version) => {
                            self.repeat((from, session, request_id), &key, version)
                        }
                        Decided::Failed { version, value } => self.pass_decision(
                            (from, session, request_id),
                            request.group,
                            &key,
                            (version, &value),
                        ),
                    }
                }
                return;
            }
            Some((last, ..)) if last > request_id => {
                // Older than the session's last write: a late duplicate.
                self.counters.duplicates += 1;
                return;
            }
            _ => {}
        }
        let lifetime = self.config.request_lifetime;
        let may_have_forgotten = self
            .started
            .is_some_and(|at| now.saturating_duration_since(at) < lifetime)
            || self
                .forgot_at
                .is_some_and(|at| now.saturating_duration_since(at) < lifetime)
            // With keys, by the seal time too: a transmission sealed less than a lifetime
            // after the floor may belong to a request started before it — and a replay of it
            // can come later than a lifetime after the floor (up to the replay window).
            || matches!((floor, sealed), (Some(floor), Some(sealed))
                if sealed.saturating_sub(lifetime.as_millis() as u64) <= floor.floor_ms());
        if retransmitted && may_have_forgotten {
            // Its first transmission may have been stamped before this member restarted (or
            // forgot the session): applying it again could apply it twice.
            self.counters.in_doubt += 1;
            self.reply(
                from,
                session,
                request_id,
                Reply {
                    status: Status::InDoubt,
                    version: 0,
                    value: &[],
                },
            );
            return;
        }
        let current = self.table.latest(request.key).cloned();
        let current_version = current.as_ref().map_or(0, |version| version.seq);
        let present_version = current
            .as_ref()
            .filter(|version| version.value.is_some())
            .map_or(0, |version| version.seq);
        if let Op::CompareAndSet { expected } = request.op {
            let tail = self
                .place(request.group)
                .is_some_and(|(at, len)| at + 1 == len);
            if expected != present_version && !tail && !self.is_clean(request.key) {
                // The version it fails on is not known committed: answering with it could
                // show a version a read does not see yet. The tail's committed version
                // decides.
                self.relay(
                    from,
                    (session, request_id),
                    request.group,
                    request.key,
                    Some(expected),
                );
                return;
            }
            if expected != present_version {
                let value = current
                    .as_ref()
                    .and_then(|version| version.value.clone())
                    .unwrap_or_default();
                self.decide_failed(
                    now,
                    (from, session, request_id),
                    request.group,
                    request.key,
                    (present_version, &value),
                );
                return;
            }
        }
        if self.held_count >= HELD_MAX || self.unacked.len() >= HELD_MAX {
            // Too much waiting for durability or commits: the client sends it again.
            self.counters.dropped.record(DropReason::Backlog);
            return;
        }
        if self.versions_in_flight(request.key) >= VERSIONS_IN_FLIGHT_MAX {
            // The head stays within a bounded lead of every member on the key (members refuse
            // versions further ahead): the client sends it again once commits come back.
            self.counters.key_versions_full += 1;
            return;
        }
        let value = match request.op {
            Op::Delete => None,
            _ => Some(request.value.to_vec()),
        };
        let version = current_version + 1;
        match self.table.write(
            request.key,
            Version {
                seq: version,
                value: value.clone(),
            },
        ) {
            Ok(Written::Pending) => {}
            Ok(Written::Stale) => unreachable!("a version above the latest is never stale"),
            Err(refused) => {
                let status = match refused {
                    Refused::Full => {
                        self.counters.refused_full += 1;
                        Status::Full
                    }
                    Refused::BadKey | Refused::ValueTooLarge => Status::BadRequest,
                };
                self.reply(
                    from,
                    session,
                    request_id,
                    Reply {
                        status,
                        version: current_version,
                        value: &[],
                    },
                );
                return;
            }
        }
        self.counters.writes_stamped += 1;
        let stamped = Decided::Stamped(version);
        self.remember(now, session, request_id, request.key.to_vec(), stamped);
        self.hold(
            request.key.to_vec(),
            Held {
                version,
                value,
                group: request.group,
                client: from,
                session,
                request: request_id,
            },
        );
    }

    /// A compare-and-set of `client`'s `session` decided failed here, on `version` (`value`:
    /// the key's value then): remembered for the session, then passed on
    /// ([`ChainNode::pass_decision`]).
    fn decide_failed(
        &mut self,
        now: Time,
        (client, session, request): (SocketAddr, u64, u32),
        group: u16,
        key: &[u8],
        (version, value): (u64, &[u8]),
    ) {
        let failed = Decided::Failed {
            version,
            value: value.to_vec(),
        };
        self.remember(now, session, request, key.to_vec(), failed);
        self.pass_decision((client, session, request), group, key, (version, value));
    }

    /// A failed compare-and-set's decision, remembered here: it goes down the chain and the
    /// tail answers the client, so that every member knows it before the client does —
    /// whichever member heads the group next answers a retransmission of it the same
    /// (docs/netchain.md, "Decided once"). At the tail, the answer.
    fn pass_decision(
        &mut self,
        (client, session, request): (SocketAddr, u64, u32),
        group: u16,
        key: &[u8],
        (version, value): (u64, &[u8]),
    ) {
        match self.neighbour(group, 1) {
            Some(next) => {
                let mut payload = Vec::new();
                Decision {
                    group,
                    version,
                    client,
                    key,
                    value,
                }
                .emit(&mut payload);
                self.counters.decisions_passed_on += 1;
                self.send(next, CHAIN_DECISION, session, request, &payload);
            }
            _ => self.reply(
                client,
                session,
                request,
                Reply {
                    status: Status::CompareFailed,
                    version,
                    value,
                },
            ),
        }
    }

    /// A failed compare-and-set's decision from the member before this one: remembered for
    /// its session, then passed on (or, at the tail, answered).
    fn on_decision(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(decision) = Decision::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        if decision.group >= self.group_count()
            || group_of(decision.key, self.group_count()) != decision.group
        {
            self.counters.dropped.record(DropReason::NotServed);
            return;
        }
        if self.neighbour(decision.group, -1) != Some(from) {
            self.counters.dropped.record(DropReason::UnexpectedSource);
            return;
        }
        let (session, request) = (header.session_id, header.seq);
        if self
            .sessions
            .get(&session)
            .is_some_and(|(last, ..)| *last > request)
        {
            // Older than the session's last write here: a late duplicate.
            self.counters.duplicates += 1;
            return;
        }
        self.decide_failed(
            now,
            (decision.client, session, request),
            decision.group,
            decision.key,
            (decision.version, decision.value),
        );
    }

    /// A retransmitted write stamped at `version`: once this member holds it durably, it goes
    /// down the chain again (the tail answers the client again).
    fn repeat(
        &mut self,
        (client, session, request): (SocketAddr, u64, u32),
        key: &[u8],
        version: u64,
    ) {
        // Committed (a commit at least as new came back): the write held, whatever came
        // after it. Not yet: it is on its way down, and the tail answers when it gets there.
        // (Never passed on again under this request's name: a version names one request, so
        // a member that becomes the head knows which requests it holds.)
        if self.committed.get(key).copied().unwrap_or(0) >= version {
            self.reply(
                client,
                session,
                request,
                Reply {
                    status: Status::Ok,
                    version,
                    value: &[],
                },
            );
        }
    }

    /// Remember a session's write (the head's, or one passed down: a member that becomes the
    /// head knows what reached it). Only a newer request replaces what is known.
    /// The seal time of the datagram handled next, and the wall clock now (with keys): see
    /// [`pmnet_proto::NetworkFunction::note_seal`].
    pub fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        self.sealed_ms = Some(sealed_at_ms);
        self.floor
            .get_or_insert_with(|| ReplayFloor::starting_at(started_ms));
    }

    /// Refuse every write sealed at or before the datagram being handled (this member may
    /// not know what was decided before it), of known sessions as of unknown ones.
    pub(super) fn refuse_sealed_before_now(&mut self) {
        let (Some(floor), Some(sealed)) = (self.floor.as_mut(), self.sealed_ms) else {
            return;
        };
        floor.forget(sealed);
        let floor = *floor;
        for learned in self.learned_under.values_mut() {
            *learned = floor;
        }
    }

    /// This member (re)joins the chains of `groups` (of `count`): what it remembers of their
    /// writes from an earlier time in them is stale — a version it stamped then may never
    /// have committed, and the chain may have given that version to another write since (a
    /// retransmission answered from it would acknowledge a write that was lost). Forget the
    /// sessions whose last write was to those groups (their retransmissions are answered "in
    /// doubt" for a request lifetime: the caller marks the time) and the writes it passed on
    /// there and never saw committed.
    pub(super) fn forget_groups(&mut self, groups: &[u16], count: usize) {
        let count = u16::try_from(count).unwrap_or(u16::MAX);
        let stale: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, (_, key, _))| groups.contains(&group_of(key, count)))
            .map(|(session, _)| *session)
            .collect();
        for session in stale {
            self.sessions.remove(&session);
            self.learned_under.remove(&session);
            let sealed = self.session_sealed.remove(&session).unwrap_or(0);
            if let Some(floor) = self.floor.as_mut() {
                floor.forget(sealed);
            }
        }
        self.session_order
            .retain(|session| self.sessions.contains_key(session));
        self.unacked
            .retain(|_, unacked| !groups.contains(&unacked.held.group));
    }

    fn remember(&mut self, now: Time, session: u64, request: u32, key: Vec<u8>, decided: Decided) {
        if let Some(known) = self.sessions.get_mut(&session) {
            if request >= known.0 {
                *known = (request, key, decided);
            }
            return;
        }
        self.sessions.insert(session, (request, key, decided));
        if let Some(floor) = self.floor {
            self.learned_under.insert(session, floor);
        }
        self.session_order.push_back(session);
        if self.session_order.len() > SESSIONS_MAX {
            if let Some(oldest) = self.session_order.pop_front() {
                self.sessions.remove(&oldest);
                self.learned_under.remove(&oldest);
                self.forgot_at = Some(now);
                let sealed = self.session_sealed.remove(&oldest).unwrap_or(0);
                if let Some(floor) = self.floor.as_mut() {
                    floor.forget(sealed);
                }
            }
        }
    }

    /// Versions of `key` this member holds for durability or has passed on and not seen
    /// committed.
    fn versions_in_flight(&self, key: &[u8]) -> usize {
        let held = self.held.get(key).map_or(0, Vec::len);
        let unacked = self
            .unacked
            .range((key.to_vec(), 0)..=(key.to_vec(), u64::MAX))
            .count();
        held + unacked
    }

    /// This member's latest version of `key` (0: none).
    fn latest_version(&self, key: &[u8]) -> u64 {
        self.table.latest(key).map_or(0, |version| version.seq)
    }

    fn hold(&mut self, key: Vec<u8>, held: Held) {
        self.held_count += 1;
        self.held.entry(key).or_default().push(held);
    }

    fn on_write(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(write) = Write::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        let refused = if write.group >= self.group_count() {
            Some(DropReason::NotServed)
        } else if self.neighbour(write.group, -1) != Some(from) {
            Some(DropReason::UnexpectedSource)
        } else if write.version == 0 {
            Some(DropReason::BadPayload)
        } else if self.unacked.len() >= HELD_MAX {
            // Bounded: what waits for commits (the predecessor sends it again later).
            Some(DropReason::Backlog)
        } else {
            None
        };
        if let Some(reason) = refused {
            self.counters.dropped.record(reason);
            return;
        }
        if write.version
            > self
                .latest_version(write.key)
                .saturating_add(VERSION_STEP_MAX)
        {
            // No head can have issued it: the head is never more than its in-flight bound
            // ahead of this member. Taken, it would make every later version of the key stale
            // here and below (a forger's version 2^62 would hold the tail out of step for good).
            self.counters.versions_refused += 1;
            return;
        }
        let held = Held {
            version: write.version,
            value: write.value.map(<[u8]>::to_vec),
            group: write.group,
            client: write.client,
            session: header.session_id,
            request: header.seq,
        };
        let key = write.key.to_vec();
        self.remember(
            now,
            header.session_id,
            header.seq,
            key.clone(),
            Decided::Stamped(write.version),
        );
        match self.table.write(
            &key,
            Version {
                seq: write.version,
                value: held.value.clone(),
            },
        ) {
            Ok(Written::Pending) => {
                if self.held_count >= HELD_MAX {
                    self.counters.dropped.record(DropReason::Backlog);
                    return;
                }
                self.hold(key, held);
            }
            Ok(Written::Stale) => {
                if self
                    .table
                    .durable(&key)
                    .is_some_and(|durable| durable.seq >= write.version)
                {
                    // Already durable here (a resend): pass it on again.
                    self.release(now, &key, held);
                } else if self.held_count < HELD_MAX {
                    self.hold(key, held);
                }
            }
            // A member refusing a write the head accepted: its table is smaller. Counted;
            // the predecessor resends, and the operator must give it room.
            Err(_) => self.counters.refused_full += 1,
        }
    }

    fn on_commit(&mut self, from: SocketAddr, payload: &[u8]) {
        let Ok(commit) = Commit::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        if commit.group >= self.group_count() {
            self.counters.dropped.record(DropReason::NotServed);
            return;
        }
        if self.neighbour(commit.group, 1) != Some(from) {
            self.counters.dropped.record(DropReason::UnexpectedSource);
            return;
        }
        if commit.version > self.latest_version(commit.key) {
            // The tail commits only what passed through this member: a commit of a version
            // this member never held is no tail's (it would make a dirty key look clean).
            self.counters.versions_refused += 1;
            return;
        }
        self.counters.commits += 1;
        self.mark_committed(commit.key, commit.version);
        if let Some(previous) = self.neighbour(commit.group, -1) {
            let mut payload = Vec::new();
            commit.emit(&mut payload);
            self.send(previous, CHAIN_COMMIT, 0, 0, &payload);
        }
    }

    fn mark_committed(&mut self, key: &[u8], version: u64) {
        if self.table.latest(key).is_none() {
            // A commit for a key this member does not hold (a forgery, or damage): nothing
            // to mark, and no room spent on it.
            return;
        }
        let committed = self.committed.entry(key.to_vec()).or_insert(0);
        *committed = (*committed).max(version);
        let covered: Vec<(Vec<u8>, u64)> = self
            .unacked
            .range((key.to_vec(), 0)..=(key.to_vec(), version))
            .map(|(at, _)| at.clone())
            .collect();
        for at in covered {
            let unacked = self.unacked.remove(&at).expect("looked up");
            self.resends.remove(&(unacked.resend_at, at.0, at.1));
        }
    }

    /// `held` is durable here (a version at least as new is): pass it down the chain, or, at
    /// the tail, answer the client and send the commit up.
    fn release(&mut self, now: Time, key: &[u8], held: Held) {
        if self.place(held.group).is_none() {
            // Not in the group's chain (any more): the chain goes on without this member.
            return;
        }
        match self.neighbour(held.group, 1) {
            Some(next) => {
                self.pass_on(next, key, &held);
                let resend_at = now + RESEND_FIRST;
                let version = held.version;
                if let Some(old) = self.unacked.insert(
                    (key.to_vec(), version),
                    Unacked {
                        held,
                        resend_at,
                        interval: RESEND_FIRST,
                    },
                ) {
                    self.resends.remove(&(old.resend_at, key.to_vec(), version));
                }
                self.resends.insert((resend_at, key.to_vec(), version));
            }
            None => {
                self.reply(
                    held.client,
                    held.session,
                    held.request,
                    Reply {
                        status: Status::Ok,
                        version: held.version,
                        value: &[],
                    },
                );
                self.mark_committed(key, held.version);
                if let Some(previous) = self.neighbour(held.group, -1) {
                    let mut payload = Vec::new();
                    Commit {
                        group: held.group,
                        version: held.version,
                        key,
                    }
                    .emit(&mut payload);
                    self.send(previous, CHAIN_COMMIT, 0, 0, &payload);
                }
            }
        }
    }

    fn pass_on(&mut self, next: SocketAddr, key: &[u8], held: &Held) {
        let mut payload = Vec::new();
        Write {
            value: held.value.as_deref(),
            group: held.group,
            version: held.version,
            client: held.client,
            key,
        }
        .emit(&mut payload);
        self.counters.writes_passed_on += 1;
        self.send(next, CHAIN_WRITE, held.session, held.request, &payload);
    }

    /// The table's work asked for since the last batch.
    pub fn poll_persist(&mut self) -> Option<PersistBatch<TableWork>> {
        self.table.poll_persist()
    }

    /// Table batches through `through` are durable: what waited on them goes on.
    pub fn on_persisted(&mut self, now: Time, through: u64) {
        for (key, seq) in self.table.on_persisted(through) {
            let Some(mut waiting) = self.held.remove(&key) else {
                continue;
            };
            let (ready, later): (Vec<Held>, Vec<Held>) =
                waiting.drain(..).partition(|held| held.version <= seq);
            self.held_count -= ready.len();
            if !later.is_empty() {
                self.held.insert(key.clone(), later);
            }
            for held in ready {
                self.release(now, &key, held);
            }
        }
    }

    /// Resend what is passed on and not committed (at the tail now, after a configuration
    /// took the next member away: answer and commit it), and the control side's timers.
    pub fn handle_timeout(&mut self, now: Time) {
        while let Some((at, key, version)) = self.resends.first().cloned() {
            if at > now {
                break;
            }
            self.resends.remove(&(at, key.clone(), version));
            let slot = (key, version);
            let Some(group) = self.unacked.get(&slot).map(|unacked| unacked.held.group) else {
                continue;
            };
            if self.neighbour(group, 1).is_none() {
                let unacked = self.unacked.remove(&slot).expect("looked up");
                self.release(now, &slot.0, unacked.held);
                continue;
            }
            let Some(unacked) = self.unacked.get_mut(&slot) else {
                continue;
            };
            unacked.interval = (unacked.interval * 2).min(RESEND_MAX);
            unacked.resend_at = now + unacked.interval;
            let (held, resend_at) = (unacked.held.clone(), unacked.resend_at);
            self.resends.insert((resend_at, slot.0.clone(), version));
            if let Some(next) = self.neighbour(held.group, 1) {
                self.counters.writes_resent += 1;
                self.pass_on(next, &slot.0, &held);
            }
        }
        self.control_timeout(now);
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        let resend = self.resends.first().map(|(at, _, _)| *at);
        match (resend, self.control_poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

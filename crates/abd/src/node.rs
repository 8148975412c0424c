//! The memory node: 64-byte lines in persistent memory, each with its timestamp in one record
//! (a direct-mapped `pmnet-pmtable` table: a line and its timestamp are durable together or
//! not at all), answering coordinators' queries and stores (docs/abd.md).
//!
//! A node takes a stored line only if its timestamp is higher than the line's, and acks a
//! store only once the line holds that timestamp or a higher one durably. A query is answered
//! from the durable lines.
//!
//! A node whose file is new (it never had memory, or lost it) is *learning*: its answers say
//! so and count in no quorum. It first waits [`LEARN_WAIT`], so that every operation its
//! previous life may have acknowledged has ended (coordinators give an operation at most
//! [`crate::OP_DEADLINE`]), then copies every line from as many other nodes as make a
//! majority of the group (each through its own cursor: the highest timestamp wins), and only
//! then writes its
//! membership record and answers as a member. If every other node answers that it holds no
//! line (a new group), it becomes a member at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_pmtable::{direct_key, Table, Version, Written};
use pmnet_proto::{CountDrop, DropCounts, DropReason, PersistBatch, Time, Transmit};
use pmnet_wire::abd::{
    NodeStatus, Query, QueryReply, Store, StoreAck, Sync, SyncReply, ABD_QUERY, ABD_QUERY_REPLY,
    ABD_STORE, ABD_STORE_ACK, ABD_SYNC, ABD_SYNC_REPLY, LINE, SYNC_ENTRIES_MAX,
};
use pmnet_wire::{Header, PacketType};

/// How long a node that lost its memory waits before it copies lines: longer than any
/// operation lives ([`crate::OP_DEADLINE`]), with room for datagrams still in the network.
pub const LEARN_WAIT: Duration = Duration::from_secs(1);
/// A learning node sends an unanswered sync request again after this long.
pub const SYNC_RESEND: Duration = Duration::from_millis(20);
/// Lines one sync request looks at, at most (bounds what a request costs the node).
pub const SYNC_SCAN: u16 = 4096;
/// Stores waiting for their lines to be durable, at most; past it a store is dropped unacked
/// (its coordinator sends it again).
pub const WAITERS_MAX: usize = 8192;
/// How far above the node's clock a stored timestamp's counter may be, in counter ticks (4 µs:
/// about 4.8 hours). A coordinator stamps the higher of its clock's counter floor
/// ([`crate::counter_floor_at`]) and one more than the highest counter of a majority, so every
/// counter a coordinator issued is at most the clock's floor plus what writes faster than one
/// per tick gained on it, plus the clocks' skew. A counter further ahead is no coordinator's
/// (without keys, anyone's: the maximum would make the line refuse every later write), and a
/// store holding one is refused whole, unacked, and counted (docs/abd.md, "Timestamps no
/// coordinator issued"). The ceiling moves with the clock, so forgeries cannot ratchet it.
pub const COUNTER_LEAD_MAX: u64 = 1 << 32;
/// Without a clock ([`NodeConfig::counter_clock`] unset: tests, the simulator), how far above
/// the line's latest counter a stored counter may be.
pub const COUNTER_STEP_MAX: u64 = 1 << 20;

/// A memory node's configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The other memory nodes of the group (a learning node copies from them).
    pub peers: Vec<SocketAddr>,
    /// Lines the node holds: `0 .. lines`.
    pub lines: u32,
    /// The counter floor of the node's clock at its time zero ([`crate::counter_floor_at`]
    /// of the wall clock then): stored counters beyond that clock's floor plus
    /// [`COUNTER_LEAD_MAX`] are refused. `None`: no clock; counters beyond the line's latest
    /// plus [`COUNTER_STEP_MAX`] are refused instead.
    pub counter_clock: Option<u64>,
}

impl NodeConfig {
    /// Nodes in the group, this one included.
    pub fn group_size(&self) -> usize {
        self.peers.len() + 1
    }

    /// A majority of the group.
    pub fn majority(&self) -> usize {
        self.group_size() / 2 + 1
    }
}

/// What a memory node counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounters {
    pub queries: u64,
    pub stores: u64,
    /// Stored lines whose timestamp was not higher than the line's (nothing to write).
    pub stale_lines: u64,
    pub acks: u64,
    /// Stores dropped unacked because [`WAITERS_MAX`] stores were waiting.
    pub waiters_full: u64,
    /// Datagrams that did not parse, or named lines out of range, by reason.
    pub dropped: DropCounts,
    /// Stores refused because a line's timestamp is beyond what a coordinator can have issued
    /// ([`COUNTER_STEP_MAX`] above the line's latest counter), or a one-node memory's counter
    /// would run out.
    pub timestamps_refused: u64,
    /// Answers sent as a learning node.
    pub learning_answers: u64,
    pub sync_requests_served: u64,
    /// Lines taken from other nodes while learning.
    pub sync_lines_taken: u64,
}

/// A store waiting for its lines to be durable.
#[derive(Debug)]
struct Waiter {
    to: SocketAddr,
    session: u64,
    request: u32,
    first: u32,
    /// Each line's timestamp the ack waits for.
    stamps: Vec<u64>,
}

/// The learning node's progress with one other node.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The next line to ask for; `lines` when done.
    next: u32,
    /// When the request for `next` was sent (`None`: not yet).
    sent: Option<Time>,
    /// The node answered as a member at least once since it was asked from 0 (its lines count).
    member: bool,
    /// What the node's last answer said: whether it holds any line.
    holds_lines: Option<bool>,
}

#[derive(Debug)]
enum State {
    Member,
    /// Lost its memory: waiting [`LEARN_WAIT`] from `since`, then copying.
    Learning {
        since: Time,
        cursors: Vec<Cursor>,
    },
    /// Every line copied: waiting for them to be durable, then for the membership record.
    Joining {
        record_written: bool,
    },
}

/// The memory node's state machine. No I/O: the caller carries out its persistence work.
#[derive(Debug)]
pub struct MemNode {
    config: NodeConfig,
    table: Table,
    state: State,
    waiters: VecDeque<Waiter>,
    transmits: VecDeque<Transmit>,
    counters: NodeCounters,
    /// The session its sync requests carry (any number: only the answers' lines matter).
    session: u64,
}

/// The membership record's key: the bucket after the last line.
fn member_key(lines: u32) -> [u8; 4] {
    direct_key(lines)
}

impl MemNode {
    /// A node over `table` (a direct-mapped table of `config.lines + 1` buckets: the last
    /// holds the membership record). A table without the record is a learning node's.
    pub fn new(config: NodeConfig, table: Table, now: Time) -> MemNode {
        assert_eq!(
            table.geometry().buckets,
            config.lines + 1,
            "a memory node's table has a bucket per line and one for its membership"
        );
        let member = table.durable(&member_key(config.lines)).is_some();
        let state = if member {
            State::Member
        } else {
            State::Learning {
                since: now,
                cursors: vec![
                    Cursor {
                        next: 0,
                        sent: None,
                        member: false,
                        holds_lines: None,
                    };
                    config.peers.len()
                ],
            }
        };
        MemNode {
            config,
            table,
            state,
            waiters: VecDeque::new(),
            transmits: VecDeque::new(),
            counters: NodeCounters::default(),
            session: now.as_nanos() ^ 0x6162_6400_0000_0000,
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    pub fn counters(&self) -> &NodeCounters {
        &self.counters
    }

    /// Whether the node counts in quorums.
    pub fn is_member(&self) -> bool {
        matches!(self.state, State::Member)
    }

    /// The state in words, for banners and status.
    pub fn state_text(&self) -> &'static str {
        match self.state {
            State::Member => "member",
            State::Learning { .. } => "learning (copying lines from the other nodes)",
            State::Joining { .. } => "joining (its copied lines becoming durable)",
        }
    }

    /// Line `line`'s durable timestamp and value (0 and zeros if never written).
    pub fn durable_line(&self, line: u32) -> (u64, Vec<u8>) {
        match self.table.durable(&direct_key(line)) {
            Some(Version {
                seq,
                value: Some(value),
            }) => (*seq, value.clone()),
            _ => (0, vec![0; LINE]),
        }
    }

    /// Lines written at least once.
    pub fn lines_held(&self) -> usize {
        let record = self.table.latest(&member_key(self.config.lines)).is_some();
        self.table.len() - usize::from(record)
    }

    fn status(&self) -> NodeStatus {
        if self.is_member() {
            NodeStatus::Ok
        } else {
            NodeStatus::Learning
        }
    }

    fn in_range(&self, first: u32, count: u16) -> bool {
        u64::from(first) + u64::from(count) <= u64::from(self.config.lines)
    }

    fn send(
        &mut self,
        to: SocketAddr,
        packet_type: u8,
        session: u64,
        request: u32,
        payload: &[u8],
    ) {
        let header = Header::new(PacketType::Reserved(packet_type), 0, session, request);
        self.transmits.push_back(Transmit {
            destination: to,
            bytes: header.encode(payload),
        });
    }

    /// A datagram of types `0x32`, `0x34`, `0x36` or `0x37`. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let PacketType::Reserved(code) = header.packet_type else {
            self.counters.dropped.record(DropReason::UnexpectedType);
            return;
        };
        match code {
            ABD_QUERY => self.on_query(from, header, payload),
            ABD_STORE => self.on_store(now, from, header, payload),
            ABD_SYNC => self.on_sync(from, header, payload),
            ABD_SYNC_REPLY => self.on_sync_reply(now, from, payload),
            _ => self.counters.dropped.record(DropReason::UnexpectedType),
        }
    }

    fn on_query(&mut self, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(query) = Query::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        self.counters.queries += 1;
        let mut status = self.status();
        if !self.in_range(query.first, query.count) {
            status = NodeStatus::OutOfRange;
        }
        let mut lines = Vec::new();
        if status == NodeStatus::Ok {
            for line in query.first..query.first + u32::from(query.count) {
                let (ts, value) = self.durable_line(line);
                lines.extend_from_slice(&ts.to_be_bytes());
                if query.values {
                    lines.extend_from_slice(&value);
                }
            }
        } else if status == NodeStatus::Learning {
            self.counters.learning_answers += 1;
        }
        let mut out = Vec::new();
        QueryReply {
            status,
            values: query.values,
            first: query.first,
            count: query.count,
            lines: &lines,
        }
        .emit(&mut out);
        self.send(from, ABD_QUERY_REPLY, header.session_id, header.seq, &out);
    }

    fn on_store(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(store) = Store::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        if !self.in_range(store.first, store.count) {
            self.counters.dropped.record(DropReason::NotServed);
            self.ack(
                from,
                header,
                store.first,
                store.count,
                NodeStatus::OutOfRange,
            );
            return;
        }
        self.counters.stores += 1;
        let beyond = (0..usize::from(store.count)).any(|i| {
            let (ts, _) = store.line(i);
            let latest = self.latest_counter(store.first + i as u32);
            let bound = if ts == 0 && self.config.peers.is_empty() {
                // A one-node memory stamps the line's next counter itself: it must not run
                // out of counters (a timestamp that wrapped to 0 would be acked unwritten).
                pmnet_wire::abd::counter_of(u64::MAX)
            } else {
                self.counter_ceiling(now, latest)
            };
            if ts == 0 {
                latest >= bound
            } else {
                pmnet_wire::abd::counter_of(ts) > bound
            }
        });
        if beyond {
            self.counters.timestamps_refused += 1;
            return;
        }
        let mut stamps = Vec::with_capacity(usize::from(store.count));
        for i in 0..usize::from(store.count) {
            let (mut ts, value) = store.line(i);
            let line = store.first + i as u32;
            if ts == 0 && self.config.peers.is_empty() {
                // A memory of one node (no replication): the node orders the writes itself,
                // each a counter above the line's latest.
                let latest = self
                    .table
                    .latest(&direct_key(line))
                    .map_or(0, |version| version.seq);
                ts = pmnet_wire::abd::timestamp(pmnet_wire::abd::counter_of(latest) + 1, 0);
            }
            stamps.push(ts);
            if ts == 0 {
                continue; // the timestamp every line has from the start
            }
            let version = Version {
                seq: ts,
                value: Some(value.to_vec()),
            };
            match self.table.write(&direct_key(line), version) {
                Ok(Written::Pending) => {}
                Ok(Written::Stale) | Err(_) => self.counters.stale_lines += 1,
            }
        }
        if !self.is_member() {
            // Taken, but a learning node's ack counts in no quorum.
            self.counters.learning_answers += 1;
            self.ack(from, header, store.first, store.count, NodeStatus::Learning);
            return;
        }
        let waiter = Waiter {
            to: from,
            session: header.session_id,
            request: header.seq,
            first: store.first,
            stamps,
        };
        if self.is_durable(&waiter) {
            self.ack(from, header, store.first, store.count, NodeStatus::Ok);
        } else if self.waiters.len() >= WAITERS_MAX {
            self.counters.waiters_full += 1;
        } else {
            self.waiters.push_back(waiter);
        }
    }

    /// The highest counter a coordinator can have issued by `now`, for a line whose latest
    /// counter here is `latest` (see [`COUNTER_LEAD_MAX`]).
    fn counter_ceiling(&self, now: Time, latest: u64) -> u64 {
        match self.config.counter_clock {
            Some(at_zero) => at_zero
                .saturating_add(now.as_nanos() / (crate::COUNTER_TICK_US * 1_000))
                .saturating_add(COUNTER_LEAD_MAX),
            None => latest.saturating_add(COUNTER_STEP_MAX),
        }
    }

    /// The counter of line `line`'s latest timestamp (0: never written).
    fn latest_counter(&self, line: u32) -> u64 {
        self.table
            .latest(&direct_key(line))
            .map_or(0, |version| pmnet_wire::abd::counter_of(version.seq))
    }

    fn is_durable(&self, waiter: &Waiter) -> bool {
        waiter.stamps.iter().enumerate().all(|(i, ts)| {
            *ts == 0
                || self
                    .table
                    .durable(&direct_key(waiter.first + i as u32))
                    .is_some_and(|version| version.seq >= *ts)
        })
    }

    fn ack(&mut self, to: SocketAddr, header: &Header, first: u32, count: u16, status: NodeStatus) {
        self.ack_to(to, header.session_id, header.seq, first, count, status);
    }

    fn ack_to(
        &mut self,
        to: SocketAddr,
        session: u64,
        request: u32,
        first: u32,
        count: u16,
        status: NodeStatus,
    ) {
        if status == NodeStatus::Ok {
            self.counters.acks += 1;
        }
        let mut out = Vec::new();
        StoreAck {
            status,
            first,
            count,
        }
        .emit(&mut out);
        self.send(to, ABD_STORE_ACK, session, request, &out);
    }

    fn on_sync(&mut self, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(sync) = Sync::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        if sync.first >= self.config.lines {
            self.counters.dropped.record(DropReason::NotServed);
            return;
        }
        self.counters.sync_requests_served += 1;
        let end = (u64::from(sync.first) + u64::from(sync.count.min(SYNC_SCAN)))
            .min(u64::from(self.config.lines)) as u32;
        let holds_lines = self.lines_held() > 0;
        let mut entries = Vec::new();
        let mut looked = end;
        if self.is_member() {
            let mut taken = 0;
            for line in sync.first..end {
                if taken == SYNC_ENTRIES_MAX {
                    looked = line;
                    break;
                }
                let (ts, value) = self.durable_line(line);
                if ts != 0 {
                    entries.push((line, ts, value));
                    taken += 1;
                }
            }
        }
        let bytes = SyncReply::encode_entries(
            entries
                .iter()
                .map(|(line, ts, value)| (*line, *ts, &value[..])),
        );
        let mut out = Vec::new();
        SyncReply {
            status: self.status(),
            holds_lines,
            first: sync.first,
            count: (looked - sync.first) as u16,
            entries: &bytes,
        }
        .emit(&mut out);
        self.send(from, ABD_SYNC_REPLY, header.session_id, header.seq, &out);
    }

    fn on_sync_reply(&mut self, now: Time, from: SocketAddr, payload: &[u8]) {
        let Ok(reply) = SyncReply::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        let Some(peer) = self.config.peers.iter().position(|peer| *peer == from) else {
            self.counters.dropped.record(DropReason::UnexpectedSource);
            return;
        };
        let State::Learning { cursors, .. } = &mut self.state else {
            return; // a late answer: the node has its lines already
        };
        let cursor = &mut cursors[peer];
        cursor.holds_lines = Some(reply.holds_lines);
        if reply.first != cursor.next || cursor.next >= self.config.lines {
            return; // an answer to an earlier request, sent again
        }
        if reply.status != NodeStatus::Ok {
            // A learning node: nothing of its counts; ask it again from the start, after the
            // resend interval (two learning nodes must not ping-pong at network speed).
            cursor.next = 0;
            cursor.member = false;
            return;
        }
        if cursor.next == 0 {
            cursor.member = true;
        }
        cursor.next = (u64::from(reply.first) + u64::from(reply.count))
            .min(u64::from(self.config.lines)) as u32;
        cursor.sent = None;
        for i in 0..reply.entry_count() {
            let (line, ts, value) = reply.entry(i);
            if line >= self.config.lines {
                continue;
            }
            let version = Version {
                seq: ts,
                value: Some(value.to_vec()),
            };
            if let Ok(Written::Pending) = self.table.write(&direct_key(line), version) {
                self.counters.sync_lines_taken += 1;
            }
        }
        self.advance_learning(now);
    }

    /// Send what learning needs now, and join once a majority's lines are copied (or every
    /// other node holds none).
    fn advance_learning(&mut self, now: Time) {
        let lines = self.config.lines;
        let majority = self.config.majority();
        let held = self.lines_held();
        let State::Learning { since, cursors } = &mut self.state else {
            return;
        };
        if now < *since + LEARN_WAIT {
            return;
        }
        // A majority of the group *besides this node*: a write its previous life acknowledged
        // is on at least majority - 1 of the others, and any majority of the others meets
        // those (majority - 1 + majority > the others).
        let copied = cursors
            .iter()
            .filter(|cursor| cursor.member && cursor.next >= lines)
            .count();
        // A node alone has nobody to copy from (what it holds came in stores it never
        // acknowledged); otherwise a group whose other nodes all hold nothing is new.
        let new_group = cursors.is_empty()
            || held == 0
                && cursors
                    .iter()
                    .all(|cursor| cursor.holds_lines == Some(false));
        if copied >= majority || new_group {
            self.state = State::Joining {
                record_written: false,
            };
            self.try_join();
            return;
        }
        let mut requests = Vec::new();
        for (peer, cursor) in cursors.iter_mut().enumerate() {
            if cursor.next >= lines && cursor.member {
                continue;
            }
            if cursor.next >= lines {
                cursor.next = 0;
            }
            if cursor.sent.is_some_and(|sent| now < sent + SYNC_RESEND) {
                continue;
            }
            cursor.sent = Some(now);
            requests.push((peer, cursor.next));
        }
        for (peer, next) in requests {
            let count = (lines - next).min(u32::from(SYNC_SCAN)) as u16;
            let mut out = Vec::new();
            Sync { first: next, count }.emit(&mut out);
            let to = self.config.peers[peer];
            self.send(to, ABD_SYNC, self.session, next, &out);
        }
    }

    /// Joining: once every line is durable, write the membership record; once that is
    /// durable, the node is a member.
    fn try_join(&mut self) {
        let State::Joining { record_written } = self.state else {
            return;
        };
        let member_key = member_key(self.config.lines);
        if record_written {
            if self.table.durable(&member_key).is_some() {
                self.state = State::Member;
            }
            return;
        }
        if (0..self.config.lines).all(|line| self.table.is_clean(&direct_key(line))) {
            let record = Version {
                seq: 1,
                value: Some(vec![0; LINE]),
            };
            self.table
                .write(&member_key, record)
                .expect("the membership bucket is the table's last");
            self.state = State::Joining {
                record_written: true,
            };
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.advance_learning(now);
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        match &self.state {
            State::Learning { since, cursors } => {
                let wait_end = *since + LEARN_WAIT;
                let resend = cursors
                    .iter()
                    .filter_map(|cursor| cursor.sent)
                    .map(|sent| sent + SYNC_RESEND)
                    .min();
                Some(match resend {
                    Some(at) => at.max(wait_end),
                    None => wait_end,
                })
            }
            _ => None,
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_persist(&mut self) -> Option<PersistBatch<pmnet_pmtable::TableWork>> {
        self.table.poll_persist()
    }

    /// Batches through `through` are durable: ack the stores waiting for them.
    pub fn on_persisted(&mut self, _now: Time, through: u64) {
        let _durable = self.table.on_persisted(through);
        self.try_join();
        if !self.is_member() {
            return;
        }
        let mut still = VecDeque::with_capacity(self.waiters.len());
        while let Some(waiter) = self.waiters.pop_front() {
            if self.is_durable(&waiter) {
                self.ack_to(
                    waiter.to,
                    waiter.session,
                    waiter.request,
                    waiter.first,
                    waiter.stamps.len() as u16,
                    NodeStatus::Ok,
                );
            } else {
                still.push_back(waiter);
            }
        }
        self.waiters = still;
    }
}

//! The ABD coordinator: runs a read or a write of consecutive lines against the memory nodes
//! (docs/abd.md). The same state machine runs in a device ([`crate::AbdFunction`], for its
//! clients) and in a client (the client-driven mode).
//!
//! - **Write:** query every node for its timestamps; on a majority's answers, take a counter
//!   higher than any seen and stamp every line with (counter, this coordinator's writer id);
//!   store the lines at every node; done on a majority's acks (each node acks once the lines
//!   are durable there).
//! - **Read:** query every node for timestamps and values; on a majority's answers take each
//!   line's highest. If every answer had each line's highest timestamp, that value is on a
//!   majority already and the read is done; otherwise store the highest lines at every node
//!   and finish on a majority's acks (the write-back).
//!
//! With a single node (no replication) a write is one store that the node stamps itself.
//!
//! Unanswered nodes are asked again with a doubling interval; an operation that has no
//! majority by its deadline fails (it may or may not have taken effect). State per operation
//! is bounded (the lines, one bit per node), and so is the number of operations.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{CountDrop, DropCounts, DropReason, Time, Transmit};
use pmnet_wire::abd::{
    counter_of, timestamp, NodeStatus, Query, QueryReply, Store, StoreAck, ABD_QUERY,
    ABD_QUERY_REPLY, ABD_STORE, ABD_STORE_ACK, LINE, LINES_MAX,
};
use pmnet_wire::{Header, PacketType};

use crate::AbdError;

/// An operation that has no majority after this long fails. A node that lost its memory waits
/// longer than this before it copies lines ([`crate::LEARN_WAIT`]).
pub const OP_DEADLINE: Duration = Duration::from_millis(500);
/// First wait before unanswered nodes are asked again; it doubles up to [`RESEND_MAX`].
pub const RESEND_FIRST: Duration = Duration::from_millis(2);
pub const RESEND_MAX: Duration = Duration::from_millis(64);
/// Operations in flight at once, at most.
pub const OPS_MAX: usize = 4096;
/// Memory nodes a coordinator knows, at most.
pub const NODES_MAX: usize = 16;

/// A coordinator's configuration.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The memory nodes (1 to 16): an operation needs a majority of them.
    pub nodes: Vec<SocketAddr>,
    /// Lines the memory holds.
    pub lines: u32,
    /// This coordinator's writer id, in every timestamp it makes: unique among the writers
    /// of one memory.
    pub writer: u16,
    /// The session its messages to the nodes carry (random: answers to another coordinator,
    /// or to an earlier life of this one, are told apart by it).
    pub session: u64,
    pub deadline: Duration,
    pub resend_first: Duration,
    /// The lowest counter this coordinator stamps writes with. A coordinator that restarts
    /// with the same writer id must stamp above every counter its previous life did (two
    /// values under one timestamp would break the register): the runtime passes the time
    /// since [`COUNTER_EPOCH_UNIX_S`] in units of [`COUNTER_TICK_US`] (see
    /// [`counter_floor_at`]).
    pub counter_floor: u64,
}

/// The epoch of [`counter_floor_at`]: 2025-01-01 00:00:00 UTC, in seconds since 1970.
pub const COUNTER_EPOCH_UNIX_S: u64 = 1_735_689_600;
/// A counter floor's unit: 4 µs (48 bits of them last 35 years from the epoch).
pub const COUNTER_TICK_US: u64 = 4;

/// The counter floor of a coordinator starting `unix_micros` µs after 1970: above every
/// counter a previous life with the same writer id stamped, unless that life stamped more
/// than one write every 4 µs on average (250 000 writes a second, all its life).
pub fn counter_floor_at(unix_micros: u64) -> u64 {
    unix_micros.saturating_sub(COUNTER_EPOCH_UNIX_S * 1_000_000) / COUNTER_TICK_US
}

impl CoordinatorConfig {
    pub fn new(nodes: Vec<SocketAddr>, lines: u32, writer: u16, session: u64) -> Self {
        CoordinatorConfig {
            nodes,
            lines,
            writer,
            session,
            deadline: OP_DEADLINE,
            resend_first: RESEND_FIRST,
            counter_floor: 0,
        }
    }

    pub fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }
}

/// What a coordinator counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorCounters {
    pub reads: u64,
    pub writes: u64,
    /// Reads done after the first phase (a majority had every line's highest timestamp).
    pub reads_one_phase: u64,
    pub write_backs: u64,
    pub resends: u64,
    pub failed: u64,
    /// Answers that counted in no quorum: from a learning node, late, duplicated, or for no
    /// operation in flight.
    pub answers_ignored: u64,
    /// Answers that did not parse, or from an address that is no node, by reason.
    pub dropped: DropCounts,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Read,
    /// The lines' bytes (`64 * count`).
    Write(Vec<u8>),
}

/// A finished operation: the caller's token and the read's lines (empty for a write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub token: u64,
    pub result: Result<Vec<u8>, AbdError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Query,
    Store,
}

#[derive(Debug)]
struct Operation {
    token: u64,
    kind: OpKind,
    first: u32,
    count: u16,
    phase: Phase,
    /// Nodes that answered in this phase.
    answered: u16,
    answers: usize,
    /// Read: each line's highest (timestamp, value) and whether every answer had it. Write:
    /// the highest timestamp seen, in `best[0].0`.
    best: Vec<(u64, [u8; LINE], bool)>,
    /// The store phase's payload.
    store: Vec<u8>,
    deadline: Time,
    resend_at: Time,
    interval: Duration,
}

/// The coordinator's state machine. No I/O.
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    ops: HashMap<u32, Operation>,
    timers: BTreeSet<(Time, u32)>,
    next_request: u32,
    transmits: VecDeque<Transmit>,
    done: VecDeque<Done>,
    counters: CoordinatorCounters,
    /// The highest counter this coordinator stamped a write with: its next write's counter
    /// is higher still, so that two of its writes in flight at once (of one line) never
    /// share a timestamp.
    stamped: u64,
}

impl Coordinator {
    /// Panics on no node, more than [`NODES_MAX`], or a node twice (the caller checks its
    /// configuration).
    pub fn new(config: CoordinatorConfig) -> Coordinator {
        assert!(
            !config.nodes.is_empty() && config.nodes.len() <= NODES_MAX,
            "1 to 16 memory nodes"
        );
        let mut unique = config.nodes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            config.nodes.len(),
            "a memory node named twice"
        );
        Coordinator {
            ops: HashMap::new(),
            timers: BTreeSet::new(),
            next_request: 1,
            transmits: VecDeque::new(),
            done: VecDeque::new(),
            counters: CoordinatorCounters::default(),
            stamped: config.counter_floor,
            config,
        }
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    pub fn counters(&self) -> &CoordinatorCounters {
        &self.counters
    }

    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    /// Start an operation on lines `first .. first + count`. Refused at once (no operation
    /// started) if the lines are out of range, `count` is 0 or above 16, a write's bytes do
    /// not match, or [`OPS_MAX`] operations are in flight.
    pub fn start(
        &mut self,
        now: Time,
        token: u64,
        first: u32,
        count: u16,
        kind: OpKind,
    ) -> Result<(), AbdError> {
        if count == 0 || count > LINES_MAX {
            return Err(AbdError::BadRequest);
        }
        if u64::from(first) + u64::from(count) > u64::from(self.config.lines) {
            return Err(AbdError::OutOfRange);
        }
        if let OpKind::Write(data) = &kind {
            if data.len() != usize::from(count) * LINE {
                return Err(AbdError::BadRequest);
            }
        }
        if self.ops.len() >= OPS_MAX {
            return Err(AbdError::Busy);
        }
        match kind {
            OpKind::Read => self.counters.reads += 1,
            OpKind::Write(_) => self.counters.writes += 1,
        }
        let request = self.next_request;
        self.next_request = self.next_request.wrapping_add(1).max(1);
        let op = Operation {
            token,
            kind,
            first,
            count,
            phase: Phase::Query,
            answered: 0,
            answers: 0,
            best: vec![(0, [0; LINE], true); usize::from(count)],
            store: Vec::new(),
            deadline: now + self.config.deadline,
            resend_at: now + self.config.resend_first,
            interval: self.config.resend_first,
        };
        let mut op = op;
        if self.config.nodes.len() == 1 {
            if let OpKind::Write(data) = &op.kind {
                // One node, no replication: one store, stamped by the node itself (timestamp
                // 0 asks it to); there are no other copies to order against.
                op.store = Store::encode_lines(data.chunks(LINE).map(|line| (0, line)));
                op.phase = Phase::Store;
            }
        }
        self.timers.insert((op.resend_at.min(op.deadline), request));
        self.ops.insert(request, op);
        self.send_phase(request, u16::MAX);
        Ok(())
    }

    /// Send the operation's current phase to the nodes in `to` (a bit per node) that have not
    /// answered.
    fn send_phase(&mut self, request: u32, to: u16) {
        let op = &self.ops[&request];
        let mut payload = Vec::new();
        let packet_type = match op.phase {
            Phase::Query => {
                Query {
                    values: matches!(op.kind, OpKind::Read),
                    first: op.first,
                    count: op.count,
                }
                .emit(&mut payload);
                ABD_QUERY
            }
            Phase::Store => {
                Store {
                    first: op.first,
                    count: op.count,
                    lines: &op.store,
                }
                .emit(&mut payload);
                ABD_STORE
            }
        };
        let header = Header::new(
            PacketType::Reserved(packet_type),
            0,
            self.config.session,
            request,
        );
        let bytes = header.encode(&payload);
        let pending = to & !op.answered;
        for (i, node) in self.config.nodes.iter().enumerate() {
            if pending & (1 << i) != 0 {
                self.transmits.push_back(Transmit {
                    destination: *node,
                    bytes: bytes.clone(),
                });
            }
        }
    }

    /// A memory node's answer (types `0x33`, `0x35`). Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Some(node) = self.config.nodes.iter().position(|node| *node == from) else {
            self.counters.dropped.record(DropReason::UnexpectedSource);
            return;
        };
        if header.session_id != self.config.session {
            self.counters.answers_ignored += 1;
            return;
        }
        let request = header.seq;
        match header.packet_type {
            PacketType::Reserved(ABD_QUERY_REPLY) => match QueryReply::parse(payload) {
                Ok(reply) => self.on_query_reply(now, node, request, &reply),
                Err(_) => self.counters.dropped.record(DropReason::BadPayload),
            },
            PacketType::Reserved(ABD_STORE_ACK) => match StoreAck::parse(payload) {
                Ok(ack) => self.on_store_ack(now, node, request, &ack),
                Err(_) => self.counters.dropped.record(DropReason::BadPayload),
            },
            _ => self.counters.dropped.record(DropReason::UnexpectedType),
        }
    }

    /// The operation `request` if an answer from `node` in `phase` for these lines counts.
    fn counting(
        &mut self,
        node: usize,
        request: u32,
        phase: Phase,
        first: u32,
        count: u16,
        status: NodeStatus,
    ) -> Option<&mut Operation> {
        let counts = self.ops.get(&request).is_some_and(|op| {
            op.phase == phase
                && op.first == first
                && op.count == count
                && op.answered & (1 << node) == 0
                && status == NodeStatus::Ok
        });
        if !counts {
            self.counters.answers_ignored += 1;
            return None;
        }
        let op = self.ops.get_mut(&request).expect("checked");
        op.answered |= 1 << node;
        op.answers += 1;
        Some(op)
    }

    fn on_query_reply(&mut self, now: Time, node: usize, request: u32, reply: &QueryReply<'_>) {
        let majority = self.config.majority();
        let writer = self.config.writer;
        let stamped = self.stamped;
        let Some(op) = self.counting(
            node,
            request,
            Phase::Query,
            reply.first,
            reply.count,
            reply.status,
        ) else {
            return;
        };
        let read = matches!(op.kind, OpKind::Read);
        if reply.values != read {
            // Answers a query of the other kind: not this operation's.
            op.answered &= !(1 << node);
            op.answers -= 1;
            self.counters.answers_ignored += 1;
            return;
        }
        let first_answer = op.answers == 1;
        for (i, best) in op.best.iter_mut().enumerate() {
            let (ts, value) = reply.line(i);
            if read {
                if first_answer {
                    *best = (ts, value.try_into().expect("64 bytes"), true);
                } else if ts > best.0 {
                    *best = (ts, value.try_into().expect("64 bytes"), false);
                } else if ts < best.0 {
                    best.2 = false;
                }
            } else if ts > best.0 {
                best.0 = ts;
            }
        }
        if op.answers < majority {
            return;
        }
        if read {
            if op.best.iter().all(|(_, _, everyone)| *everyone) {
                self.counters.reads_one_phase += 1;
                self.finish(request, Ok(()));
                return;
            }
            op.store = Store::encode_lines(op.best.iter().map(|(ts, value, _)| (*ts, &value[..])));
        } else {
            let highest = op.best.iter().map(|(ts, ..)| *ts).max().unwrap_or(0);
            let counter = counter_of(highest).max(stamped);
            if counter >= (1 << 48) - 1 {
                // A timestamp no writer could have made honestly: refuse to wrap around.
                self.finish(request, Err(AbdError::Unavailable));
                return;
            }
            let ts = timestamp(counter + 1, writer);
            let OpKind::Write(data) = &op.kind else {
                unreachable!("a write")
            };
            op.store = Store::encode_lines(data.chunks(LINE).map(|line| (ts, line)));
            self.stamped = counter + 1;
        }
        if read {
            self.counters.write_backs += 1;
        }
        let op = self.ops.get_mut(&request).expect("in flight");
        op.phase = Phase::Store;
        op.answered = 0;
        op.answers = 0;
        self.reset_timer(now, request);
        self.send_phase(request, u16::MAX);
    }

    fn on_store_ack(&mut self, _now: Time, node: usize, request: u32, ack: &StoreAck) {
        let majority = self.config.majority();
        let Some(op) = self.counting(
            node,
            request,
            Phase::Store,
            ack.first,
            ack.count,
            ack.status,
        ) else {
            return;
        };
        if op.answers >= majority {
            self.finish(request, Ok(()));
        }
    }

    fn reset_timer(&mut self, now: Time, request: u32) {
        let op = self.ops.get_mut(&request).expect("in flight");
        self.timers
            .remove(&(op.resend_at.min(op.deadline), request));
        op.interval = self.config.resend_first;
        op.resend_at = now + op.interval;
        self.timers.insert((op.resend_at.min(op.deadline), request));
    }

    fn finish(&mut self, request: u32, result: Result<(), AbdError>) {
        let op = self.ops.remove(&request).expect("in flight");
        self.timers
            .remove(&(op.resend_at.min(op.deadline), request));
        let result = result.map(|()| match op.kind {
            OpKind::Read => op
                .best
                .iter()
                .flat_map(|(_, value, _)| value.iter().copied())
                .collect(),
            OpKind::Write(_) => Vec::new(),
        });
        if result.is_err() {
            self.counters.failed += 1;
        }
        self.done.push_back(Done {
            token: op.token,
            result,
        });
    }

    pub fn handle_timeout(&mut self, now: Time) {
        while let Some(&(at, request)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let op = self.ops.get_mut(&request).expect("a timer's operation");
            if now >= op.deadline {
                self.timers.insert((op.resend_at.min(op.deadline), request));
                self.finish(request, Err(AbdError::Unavailable));
                continue;
            }
            op.interval = (op.interval * 2).min(RESEND_MAX);
            op.resend_at = now + op.interval;
            self.timers.insert((op.resend_at.min(op.deadline), request));
            self.counters.resends += 1;
            self.send_phase(request, u16::MAX);
        }
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.first().map(|(at, _)| *at)
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next finished operation.
    pub fn poll_done(&mut self) -> Option<Done> {
        self.done.pop_front()
    }
}

//! Replicated memory's two in-network functions, each composed in a device's pipeline like
//! the log and the chain member:
//! - [`AbdFunction`]: the coordinator for clients (types `0x30`, `0x33`, `0x35`);
//! - [`MemNodeFunction`]: a memory node (types `0x32`, `0x34`, `0x36`, `0x37`), its line
//!   writes [`RegionWrite`]s on its table's region.
//!
//! The coordinator keeps, per client session, which request numbers it has seen in a window
//! of 64 and how each recent write ended, so a write sent again (or duplicated by the
//! network) is answered, not applied twice: applying a write twice could bring back a value
//! another writer has overwritten since. A write it cannot place (older than the window, or
//! of a session it forgot or had before a restart, when flagged as sent again) is answered
//! "in doubt".

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use pmnet_pmtable::Geometry;
use pmnet_proto::{
    CountDrop, DropCounts, DropReason, NetworkFunction, PersistBatch, RegionWrite, ReplayFloor,
    Time, Transmit, Verdict,
};
use pmnet_wire::abd::{
    Op, Reply, Request, Status, ABD_QUERY, ABD_QUERY_REPLY, ABD_REPLY, ABD_REQUEST, ABD_STORE,
    ABD_STORE_ACK, ABD_SYNC, ABD_SYNC_REPLY, RETRANSMITTED,
};
use pmnet_wire::{Header, PacketType};

use crate::coordinator::{Coordinator, OpKind};
use crate::node::MemNode;
use crate::AbdError;

/// Client sessions a coordinating device keeps, at most (the least recently used is
/// forgotten first).
pub const SESSIONS_MAX: usize = 4096;
/// Request numbers below a session's highest that the coordinator tells apart.
const WINDOW: u32 = 64;

#[derive(Debug)]
struct Session {
    addr: SocketAddr,
    highest: u32,
    /// Bit `i`: request `highest - i` was seen.
    seen: u64,
    /// How recent writes ended, oldest first (at most [`WINDOW`]).
    writes: VecDeque<(u32, Status)>,
    used: u64,
    /// Its operations in flight (a session with some is never forgotten).
    in_flight: u32,
    /// When its latest request was sealed (Unix ms; 0 without keys): what the replay floor
    /// rises to when the session is forgotten.
    sealed_ms: u64,
    /// With keys: the replay floor when this device learned the session. A request of it
    /// sealed at or before that was sent before, and may have run in an earlier life (or
    /// before the session was forgotten): refused.
    learned_under: Option<ReplayFloor>,
    /// The first request this device saw sent for the first time (not flagged) in this
    /// session. A client sends its requests for the first time in order, so a request from it
    /// on was first sent to this device (this life, since the session was last forgotten); a
    /// write sent again from before it (or before any) may have run in an earlier life.
    since: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    session: u64,
    request: u32,
    write: bool,
    first: u32,
    count: u16,
    to: SocketAddr,
}

/// What the coordinating function counts besides its coordinator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionCounters {
    pub requests: u64,
    pub replies: u64,
    /// Requests already in flight, received again.
    pub duplicates: u64,
    /// Writes answered from what the coordinator remembers of them.
    pub answered_again: u64,
    pub in_doubt: u64,
    pub busy: u64,
    pub sessions_forgotten: u64,
    /// Requests of a session this device does not know, sealed before it forgot a session or
    /// before it started: possibly replays of a forgotten session's requests, refused
    /// (dropped, not answered).
    pub replays_refused: u64,
    /// Requests that did not parse, by reason.
    pub dropped: DropCounts,
}

/// The ABD coordinator in a device's pipeline.
#[derive(Debug)]
pub struct AbdFunction {
    coordinator: Coordinator,
    sessions: HashMap<u64, Session>,
    pending: HashMap<u64, Pending>,
    in_flight: HashMap<(u64, u32), u64>,
    next_token: u64,
    clock: u64,
    replies: VecDeque<Transmit>,
    counters: FunctionCounters,
    /// With keys: the seal time of the datagram being handled, and the floor below which a
    /// request of an unknown session is refused (set when the first sealed datagram comes:
    /// nothing of an earlier life is known).
    sealed_ms: Option<u64>,
    floor: Option<ReplayFloor>,
}

fn status_of(error: AbdError) -> Status {
    match error {
        AbdError::BadRequest => Status::BadRequest,
        AbdError::OutOfRange => Status::OutOfRange,
        AbdError::Unavailable => Status::Unavailable,
        AbdError::InDoubt => Status::InDoubt,
        AbdError::Busy => Status::Busy,
    }
}

impl AbdFunction {
    pub fn new(coordinator: Coordinator) -> AbdFunction {
        AbdFunction {
            coordinator,
            sessions: HashMap::new(),
            pending: HashMap::new(),
            in_flight: HashMap::new(),
            next_token: 1,
            clock: 0,
            replies: VecDeque::new(),
            counters: FunctionCounters::default(),
            sealed_ms: None,
            floor: None,
        }
    }

    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    pub fn counters(&self) -> &FunctionCounters {
        &self.counters
    }

    fn reply(&mut self, to: SocketAddr, session: u64, request: u32, reply: Reply<'_>) {
        let mut payload = Vec::new();
        reply.emit(&mut payload);
        let header = Header::new(PacketType::Reserved(ABD_REPLY), 0, session, request);
        self.counters.replies += 1;
        self.replies.push_back(Transmit {
            destination: to,
            bytes: header.encode(&payload),
        });
    }

    fn on_request(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) {
        let Ok(request) = Request::parse(payload) else {
            self.counters.dropped.record(DropReason::BadPayload);
            return;
        };
        self.counters.requests += 1;
        let write = request.op == Op::Write;
        let (session_id, seq) = (header.session_id, header.seq);
        let again = header.flags & RETRANSMITTED != 0;
        let reply_status = |this: &mut Self, status: Status| {
            let reply = Reply {
                status,
                first: request.first,
                count: request.count,
                data: &[],
            };
            this.reply(from, session_id, seq, reply);
        };
        if self.in_flight.contains_key(&(session_id, seq)) {
            self.counters.duplicates += 1;
            return;
        }
        self.clock += 1;
        let sealed_ms = self.sealed_ms.take();
        if !self.sessions.contains_key(&session_id) {
            if ReplayFloor::refuses(self.floor, sealed_ms) {
                // Sealed before this device forgot a session, or before it started: it may
                // be a replay of a session it no longer knows. A genuine client's next
                // transmission is sealed afresh and admitted.
                self.counters.replays_refused += 1;
                return;
            }
            if again && write {
                self.counters.in_doubt += 1;
                reply_status(self, Status::InDoubt);
                return;
            }
            self.make_room();
            self.sessions.insert(
                session_id,
                Session {
                    addr: from,
                    highest: seq,
                    seen: 0,
                    writes: VecDeque::new(),
                    used: self.clock,
                    sealed_ms: 0,
                    learned_under: self.floor,
                    since: None,
                    in_flight: 0,
                },
            );
        }
        let session = self.sessions.get_mut(&session_id).expect("made above");
        if ReplayFloor::refuses(session.learned_under, sealed_ms) {
            // Sent before this device learned the session: from an earlier life of it here
            // (a replay, or a datagram delayed that long). Its sender's next transmission is
            // sealed afresh and admitted.
            self.counters.replays_refused += 1;
            return;
        }
        session.addr = from;
        session.used = self.clock;
        session.sealed_ms = session.sealed_ms.max(sealed_ms.unwrap_or(0));
        if !again && session.since.is_none() {
            session.since = Some(seq);
        }
        let known = session
            .since
            .is_some_and(|since| (seq.wrapping_sub(since) as i32) >= 0);
        // Where the request number falls in the session's window.
        let behind = session.highest.wrapping_sub(seq);
        if (behind as i32) < 0 {
            // A new highest.
            let ahead = seq.wrapping_sub(session.highest);
            session.seen = if ahead >= WINDOW {
                0
            } else {
                session.seen << ahead
            };
            session.highest = seq;
            session.seen |= 1;
        } else if behind < WINDOW {
            if session.seen & (1 << behind) != 0 && write {
                // Seen and not in flight: done. Answer as it ended, if remembered.
                let ended = session
                    .writes
                    .iter()
                    .find(|(request, _)| *request == seq)
                    .map(|(_, status)| *status);
                match ended {
                    Some(status) => {
                        self.counters.answered_again += 1;
                        reply_status(self, status);
                    }
                    None => {
                        self.counters.in_doubt += 1;
                        reply_status(self, Status::InDoubt);
                    }
                }
                return;
            }
            session.seen |= 1 << behind;
        } else if write {
            self.counters.in_doubt += 1;
            reply_status(self, Status::InDoubt);
            return;
        }
        if again && write && !known {
            // Not seen in this life, and perhaps run in an earlier one.
            self.counters.in_doubt += 1;
            reply_status(self, Status::InDoubt);
            return;
        }
        let kind = if write {
            OpKind::Write(request.data.to_vec())
        } else {
            OpKind::Read
        };
        let token = self.next_token;
        self.next_token += 1;
        match self
            .coordinator
            .start(now, token, request.first, request.count, kind)
        {
            Ok(()) => {
                self.pending.insert(
                    token,
                    Pending {
                        session: session_id,
                        request: seq,
                        write,
                        first: request.first,
                        count: request.count,
                        to: from,
                    },
                );
                self.in_flight.insert((session_id, seq), token);
                if let Some(session) = self.sessions.get_mut(&session_id) {
                    session.in_flight += 1;
                }
            }
            Err(error) => {
                if error == AbdError::Busy {
                    self.counters.busy += 1;
                    // Not taken: the request may come again and run then.
                    self.unsee(session_id, seq);
                }
                reply_status(self, status_of(error));
            }
        }
    }

    fn unsee(&mut self, session_id: u64, seq: u32) {
        if let Some(session) = self.sessions.get_mut(&session_id) {
            let behind = session.highest.wrapping_sub(seq);
            if behind < WINDOW {
                session.seen &= !(1 << behind);
            }
        }
    }

    /// Forget the least recently used session if the table is full.
    fn make_room(&mut self) {
        if self.sessions.len() < SESSIONS_MAX {
            return;
        }
        if let Some(oldest) = self
            .sessions
            .iter()
            .filter(|(_, session)| session.in_flight == 0)
            .min_by_key(|(_, session)| session.used)
            .map(|(id, _)| *id)
        {
            if let Some(forgotten) = self.sessions.remove(&oldest) {
                if let Some(floor) = self.floor.as_mut() {
                    floor.forget(forgotten.sealed_ms);
                }
            }
            self.counters.sessions_forgotten += 1;
        }
    }

    fn collect_done(&mut self) {
        while let Some(done) = self.coordinator.poll_done() {
            let Some(pending) = self.pending.remove(&done.token) else {
                continue;
            };
            self.in_flight.remove(&(pending.session, pending.request));
            if let Some(session) = self.sessions.get_mut(&pending.session) {
                session.in_flight = session.in_flight.saturating_sub(1);
            }
            let (status, data) = match &done.result {
                Ok(data) => (Status::Ok, &data[..]),
                Err(error) => (status_of(*error), &[][..]),
            };
            if pending.write {
                if let Some(session) = self.sessions.get_mut(&pending.session) {
                    if session.writes.len() >= WINDOW as usize {
                        session.writes.pop_front();
                    }
                    session.writes.push_back((pending.request, status));
                }
            }
            let data = data.to_vec();
            let reply = Reply {
                status,
                first: pending.first,
                count: pending.count,
                data: &data,
            };
            self.reply(pending.to, pending.session, pending.request, reply);
        }
    }
}

impl NetworkFunction for AbdFunction {
    type Work = RegionWrite;

    fn dropped(&self) -> DropCounts {
        self.counters
            .dropped
            .clone()
            .merged(&self.coordinator.counters().dropped)
    }

    fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        self.sealed_ms = Some(sealed_at_ms);
        self.floor
            .get_or_insert_with(|| ReplayFloor::starting_at(started_ms));
    }

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        let payload = datagram.get(pmnet_wire::HEADER_LEN..).unwrap_or_default();
        match header.packet_type {
            PacketType::Reserved(ABD_REQUEST) => self.on_request(now, from, header, payload),
            PacketType::Reserved(ABD_QUERY_REPLY | ABD_STORE_ACK) => {
                self.coordinator.handle(now, from, header, payload);
                self.collect_done();
            }
            _ => return Verdict::Pass,
        }
        Verdict::Consumed
    }

    fn handle_timeout(&mut self, now: Time) {
        self.coordinator.handle_timeout(now);
        self.collect_done();
    }

    fn on_persisted(&mut self, _now: Time, _through: u64) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.replies
            .pop_front()
            .or_else(|| self.coordinator.poll_transmit())
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.coordinator.poll_timeout()
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        let f = &self.counters;
        let c = self.coordinator.counters();
        vec![
            ("pmnet_abd_requests_total", "Clients' requests received.", f.requests),
            ("pmnet_abd_replies_total", "Replies sent to clients.", f.replies),
            ("pmnet_abd_reads_total", "Reads started.", c.reads),
            ("pmnet_abd_writes_total", "Writes started.", c.writes),
            ("pmnet_abd_reads_one_phase_total", "Reads done without a write-back (a majority had every line's highest timestamp).", c.reads_one_phase),
            ("pmnet_abd_write_backs_total", "Reads that wrote the highest lines back to the nodes.", c.write_backs),
            ("pmnet_abd_resends_total", "Phases sent again to nodes that had not answered.", c.resends),
            ("pmnet_abd_failed_total", "Operations without a majority by their deadline.", c.failed),
            ("pmnet_abd_duplicates_total", "Requests in flight received again.", f.duplicates),
            ("pmnet_abd_answered_again_total", "Writes sent again, answered from what the coordinator remembers.", f.answered_again),
            ("pmnet_abd_in_doubt_total", "Writes sent again that the coordinator no longer knows, answered in doubt.", f.in_doubt),
            ("pmnet_abd_busy_total", "Requests refused: as many operations in flight as the coordinator keeps.", f.busy),
            ("pmnet_abd_sessions_forgotten_total", "Client sessions forgotten to make room.", f.sessions_forgotten),
            ("pmnet_abd_replays_refused_total", "Requests sealed before a session was forgotten or the device started (or learned the session): refused.", f.replays_refused),
            ("pmnet_abd_answers_ignored_total", "Nodes' answers that counted in no quorum (learning, late, duplicated).", c.answers_ignored),
            ("pmnet_abd_in_flight", "Operations in flight.", self.coordinator.in_flight() as u64),
            ("pmnet_abd_sessions", "Client sessions kept.", self.sessions.len() as u64),
        ]
    }
}

/// A memory node in a pipeline: its table writes are [`RegionWrite`]s on the table's region,
/// carried out by the device's front executor.
#[derive(Debug)]
pub struct MemNodeFunction {
    node: MemNode,
    geometry: Geometry,
}

impl MemNodeFunction {
    pub fn new(node: MemNode, geometry: Geometry) -> MemNodeFunction {
        MemNodeFunction { node, geometry }
    }

    pub fn node(&self) -> &MemNode {
        &self.node
    }
}

impl NetworkFunction for MemNodeFunction {
    type Work = RegionWrite;

    fn report(&self) -> Option<String> {
        let c = self.node.counters();
        let membership = if self.node.is_member() {
            "member (counts in quorums)"
        } else {
            "LEARNING (copying lines from the other nodes; not counted in quorums)"
        };
        Some(format!(
            "{membership}; lines held {} of {}; queries {} stores {} (stale lines {}) acks {}; \
             refused: timestamps {} waiters-full {}; learning answers {}, sync requests served \
             {}, lines taken {}",
            self.node.lines_held(),
            self.node.config().lines,
            c.queries,
            c.stores,
            c.stale_lines,
            c.acks,
            c.timestamps_refused,
            c.waiters_full,
            c.learning_answers,
            c.sync_requests_served,
            c.sync_lines_taken
        ))
    }

    fn dropped(&self) -> DropCounts {
        self.node.counters().dropped.clone()
    }

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        match header.packet_type {
            PacketType::Reserved(ABD_QUERY | ABD_STORE | ABD_SYNC | ABD_SYNC_REPLY) => {
                let payload = datagram.get(pmnet_wire::HEADER_LEN..).unwrap_or_default();
                self.node.handle(now, from, header, payload);
                Verdict::Consumed
            }
            _ => Verdict::Pass,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        self.node.handle_timeout(now);
    }

    fn on_persisted(&mut self, now: Time, through: u64) {
        self.node.on_persisted(now, through);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.node.poll_transmit()
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        Some(pmnet_pmtable::region_batch(
            self.node.poll_persist()?,
            &self.geometry,
        ))
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.node.poll_timeout()
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        let c = self.node.counters();
        vec![
            (
                "pmnet_memnode_queries_total",
                "Coordinators' queries answered.",
                c.queries,
            ),
            (
                "pmnet_memnode_stores_total",
                "Coordinators' stores received.",
                c.stores,
            ),
            (
                "pmnet_memnode_stale_lines_total",
                "Stored lines not newer than the line held.",
                c.stale_lines,
            ),
            (
                "pmnet_memnode_acks_total",
                "Stores acknowledged (their lines durable here).",
                c.acks,
            ),
            (
                "pmnet_memnode_waiters_full_total",
                "Stores dropped unacknowledged: too many waiting.",
                c.waiters_full,
            ),
            (
                "pmnet_memnode_timestamps_refused_total",
                "Stores refused: a timestamp no coordinator can have issued.",
                c.timestamps_refused,
            ),
            (
                "pmnet_memnode_learning_answers_total",
                "Answers sent while learning (counted in no quorum).",
                c.learning_answers,
            ),
            (
                "pmnet_memnode_sync_served_total",
                "Sync requests of learning nodes served.",
                c.sync_requests_served,
            ),
            (
                "pmnet_memnode_sync_lines_taken_total",
                "Lines taken from other nodes while learning.",
                c.sync_lines_taken,
            ),
            (
                "pmnet_memnode_member",
                "1 once the node counts in quorums, 0 while learning.",
                u64::from(self.node.is_member()),
            ),
            (
                "pmnet_memnode_lines_held",
                "Lines written at least once.",
                self.node.lines_held() as u64,
            ),
        ]
    }
}

//! A client's session with a coordinating device: requests numbered per session, at most
//! [`WINDOW`] in flight, sent again (flagged) until answered, given up after a deadline.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{Time, Transmit};
use pmnet_wire::abd::{Op, Reply, Request, Status, ABD_REPLY, ABD_REQUEST, LINE, RETRANSMITTED};
use pmnet_wire::{Header, PacketType};

use crate::coordinator::OpKind;
use crate::AbdError;

/// Requests a session has in flight, at most (well inside the coordinator's window of 64).
pub const WINDOW: usize = 32;
/// A busy coordinator's request is sent again after this long.
const BUSY_RETRY: Duration = Duration::from_millis(1);

/// A client session's configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub coordinator: SocketAddr,
    /// Random per session.
    pub session: u64,
    pub resend_first: Duration,
    pub resend_max: Duration,
    /// A request unanswered this long fails (longer than the coordinator's own deadline, so
    /// its answer normally comes first).
    pub deadline: Duration,
}

impl ClientConfig {
    pub fn new(coordinator: SocketAddr, session: u64) -> ClientConfig {
        ClientConfig {
            coordinator,
            session,
            resend_first: Duration::from_millis(5),
            resend_max: Duration::from_millis(200),
            deadline: crate::OP_DEADLINE * 4,
        }
    }
}

/// A finished request: the caller's token, and the read's lines (empty for a write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientDone {
    pub token: u64,
    pub result: Result<Vec<u8>, AbdError>,
}

#[derive(Debug)]
struct InFlight {
    token: u64,
    header: Header,
    payload: Vec<u8>,
    first: u32,
    count: u16,
    read: bool,
    deadline: Time,
    resend_at: Time,
    interval: Duration,
}

/// The session's state machine. No I/O.
#[derive(Debug)]
pub struct AbdClient {
    config: ClientConfig,
    next_seq: u32,
    in_flight: HashMap<u32, InFlight>,
    timers: BTreeSet<(Time, u32)>,
    transmits: VecDeque<Transmit>,
    done: VecDeque<ClientDone>,
}

impl AbdClient {
    pub fn new(config: ClientConfig) -> AbdClient {
        AbdClient {
            config,
            next_seq: 1,
            in_flight: HashMap::new(),
            timers: BTreeSet::new(),
            transmits: VecDeque::new(),
            done: VecDeque::new(),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether another request fits in the window.
    pub fn has_room(&self) -> bool {
        self.in_flight.len() < WINDOW
    }

    /// Send a request for lines `first .. first + count`. Refused at once if the window is
    /// full ([`AbdError::Busy`]) or the request is malformed.
    pub fn start(
        &mut self,
        now: Time,
        token: u64,
        first: u32,
        count: u16,
        kind: OpKind,
    ) -> Result<(), AbdError> {
        if !self.has_room() {
            return Err(AbdError::Busy);
        }
        if count == 0 || count > pmnet_wire::abd::LINES_MAX {
            return Err(AbdError::BadRequest);
        }
        let (op, data) = match &kind {
            OpKind::Read => (Op::Read, &[][..]),
            OpKind::Write(data) => (Op::Write, &data[..]),
        };
        if op == Op::Write && data.len() != usize::from(count) * LINE {
            return Err(AbdError::BadRequest);
        }
        let mut payload = Vec::new();
        Request {
            op,
            first,
            count,
            data,
        }
        .emit(&mut payload);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        let header = Header::new(
            PacketType::Reserved(ABD_REQUEST),
            0,
            self.config.session,
            seq,
        );
        self.transmits.push_back(Transmit {
            destination: self.config.coordinator,
            bytes: header.encode(&payload),
        });
        let entry = InFlight {
            token,
            header,
            payload,
            first,
            count,
            read: op == Op::Read,
            deadline: now + self.config.deadline,
            resend_at: now + self.config.resend_first,
            interval: self.config.resend_first,
        };
        self.timers
            .insert((entry.resend_at.min(entry.deadline), seq));
        self.in_flight.insert(seq, entry);
        Ok(())
    }

    /// A datagram from the coordinator. Never panics on its contents; anything that is not an
    /// answer to a request in flight is ignored.
    pub fn handle(&mut self, now: Time, header: &Header, payload: &[u8]) {
        if header.packet_type != PacketType::Reserved(ABD_REPLY)
            || header.session_id != self.config.session
        {
            return;
        }
        let Ok(reply) = Reply::parse(payload) else {
            return;
        };
        let seq = header.seq;
        let Some(entry) = self.in_flight.get(&seq) else {
            return;
        };
        if reply.first != entry.first || reply.count != entry.count {
            return;
        }
        let result = match reply.status {
            Status::Ok if entry.read && reply.data.len() == usize::from(entry.count) * LINE => {
                Ok(reply.data.to_vec())
            }
            Status::Ok if !entry.read && reply.data.is_empty() => Ok(Vec::new()),
            Status::Ok => return, // a malformed answer: wait for another
            Status::Busy => {
                // Not taken: send it again shortly (not flagged: it never ran).
                let entry = self.in_flight.get_mut(&seq).expect("checked");
                self.timers
                    .remove(&(entry.resend_at.min(entry.deadline), seq));
                entry.resend_at = now + BUSY_RETRY;
                self.timers
                    .insert((entry.resend_at.min(entry.deadline), seq));
                return;
            }
            Status::BadRequest => Err(AbdError::BadRequest),
            Status::OutOfRange => Err(AbdError::OutOfRange),
            Status::Unavailable => Err(AbdError::Unavailable),
            Status::InDoubt => Err(AbdError::InDoubt),
        };
        self.finish(seq, result);
    }

    fn finish(&mut self, seq: u32, result: Result<Vec<u8>, AbdError>) {
        let entry = self.in_flight.remove(&seq).expect("in flight");
        self.timers
            .remove(&(entry.resend_at.min(entry.deadline), seq));
        self.done.push_back(ClientDone {
            token: entry.token,
            result,
        });
    }

    pub fn handle_timeout(&mut self, now: Time) {
        while let Some(&(at, seq)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let entry = self.in_flight.get_mut(&seq).expect("a timer's request");
            if now >= entry.deadline {
                self.timers
                    .insert((entry.resend_at.min(entry.deadline), seq));
                self.finish(seq, Err(AbdError::Unavailable));
                continue;
            }
            entry.interval = (entry.interval * 2).min(self.config.resend_max);
            entry.resend_at = now + entry.interval;
            self.timers
                .insert((entry.resend_at.min(entry.deadline), seq));
            let mut header = entry.header;
            header.flags |= RETRANSMITTED;
            self.transmits.push_back(Transmit {
                destination: self.config.coordinator,
                bytes: header.encode(&entry.payload),
            });
        }
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.first().map(|(at, _)| *at)
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_done(&mut self) -> Option<ClientDone> {
        self.done.pop_front()
    }
}

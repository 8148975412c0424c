//! A client session of the chain store (docs/netchain.md, "Clients"): one request at a time,
//! sent where it goes (writes to the head of the key's group, reads spread over the group's
//! members), sent again with flag `RETRANSMITTED` until a reply comes or the request lifetime
//! runs out. No I/O: datagrams and time in, datagrams and outcomes out.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{AuthWarnings, Authenticator, CountDrop, DropCounts, DropReason, Time, Transmit};
use pmnet_wire::netchain::control::{Fetch, Layout, CHAIN_CONFIG, CHAIN_FETCH};
use pmnet_wire::netchain::{
    Op, Reply, Request, Status, CHAIN_REPLY, CHAIN_REQUEST, RELAYED, RETRANSMITTED,
};
use pmnet_wire::{Header, PacketType};

use crate::node::group_of;

/// Which member of a key's group a read goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadFrom {
    /// The group's members in turn (CRAQ: every member answers a clean key).
    #[default]
    AnyMember,
    /// The tail only, as NetChain reads (the read-scaling benchmark's comparison).
    Tail,
}

/// After a "paused" answer, the request is sent again this soon.
pub const PAUSED_RETRY: Duration = Duration::from_millis(1);

/// A client's settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub session_id: u64,
    pub server_id: u16,
    /// Each virtual group's chain, head first: the members' configuration.
    pub groups: Vec<Vec<SocketAddr>>,
    /// Wait before sending a request again (doubling up to `retransmit_timeout_max`).
    pub retransmit_timeout: Duration,
    pub retransmit_timeout_max: Duration,
    /// A request with no reply this long fails (timed out: its outcome is unknown).
    pub request_lifetime: Duration,
    /// The chain controller: `groups` comes from its configuration (asked for at the first
    /// request, and again whenever a member says "not here" or a request is sent again).
    pub controller: Option<SocketAddr>,
    /// The other controllers of an etcd control plane: a request for the configuration goes
    /// to each, and the configuration of whichever leads is taken (newer epochs only).
    pub standby_controllers: Vec<SocketAddr>,
    /// Where reads go (default: any member).
    pub reads: ReadFrom,
    /// Seal every datagram sent and accept only datagrams that verify (the members and the
    /// controller hold the same deployment keys); `None`: no authentication.
    pub auth: Option<Authenticator>,
}

impl ClientConfig {
    pub fn new(session_id: u64, groups: Vec<Vec<SocketAddr>>) -> ClientConfig {
        ClientConfig {
            session_id,
            server_id: 1,
            groups,
            retransmit_timeout: Duration::from_millis(5),
            retransmit_timeout_max: Duration::from_millis(500),
            request_lifetime: Duration::from_secs(10),
            controller: None,
            standby_controllers: Vec::new(),
            reads: ReadFrom::AnyMember,
            auth: None,
        }
    }

    /// A client that takes the chains from the controller at `controller`.
    pub fn controlled(session_id: u64, controller: SocketAddr) -> ClientConfig {
        ClientConfig {
            controller: Some(controller),
            ..ClientConfig::new(session_id, Vec::new())
        }
    }
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    Get,
    Put(Vec<u8>),
    Delete,
    /// Put `value` if the key holds version `expected` (0: the key is absent).
    CompareAndSet {
        expected: u64,
        value: Vec<u8>,
    },
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A read: the key's version and value (`None`: absent; version 0: never written).
    Value {
        version: u64,
        value: Option<Vec<u8>>,
    },
    /// A write, applied at this version.
    Written { version: u64 },
    /// A compare-and-set that did not hold: the key's version and value now.
    CompareFailed { version: u64, value: Vec<u8> },
    /// No answer within the request lifetime, or an answer of "in doubt": the write may or
    /// may not have been applied.
    Unknown,
    /// Refused: the key's neighbourhood in the table is full.
    Full,
    /// The member is not where this goes (the configuration differs from the members'), or
    /// the request was malformed.
    Refused(Status),
}

/// The client is waiting for a reply already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

#[derive(Debug)]
struct Pending {
    request: u32,
    key: Vec<u8>,
    op: ClientOp,
    started: Time,
    sends: u32,
    resend_at: Time,
    interval: Duration,
}

/// A client session.
#[derive(Debug)]
pub struct ChainClient {
    config: ClientConfig,
    next_request: u32,
    pending: Option<Pending>,
    /// Spreads reads over a group's members.
    next_reader: usize,
    transmits: VecDeque<Transmit>,
    outcomes: VecDeque<(u32, Outcome)>,
    /// The controller's configuration epoch the chains come from (0: none, or static).
    epoch: u64,
    /// Datagrams that failed authentication, by reason.
    drops: DropCounts,
    /// Warnings of datagrams that failed authentication (rate-limited).
    auth_warnings: AuthWarnings,
}

impl ChainClient {
    pub fn new(config: ClientConfig) -> ChainClient {
        assert!(
            !config.groups.is_empty() || config.controller.is_some(),
            "at least one group, or a controller"
        );
        ChainClient {
            epoch: 0,
            next_reader: config.session_id as usize,
            config,
            next_request: 1,
            pending: None,
            transmits: VecDeque::new(),
            outcomes: VecDeque::new(),
            drops: DropCounts::default(),
            auth_warnings: AuthWarnings::default(),
        }
    }

    /// Datagrams dropped for failing authentication, by reason.
    pub fn drops(&self) -> &DropCounts {
        &self.drops
    }

    /// `datagram` once verified (with keys configured): `None`, counted by reason and warned
    /// of (when the sender is known), if it does not verify.
    fn verified<'a>(
        &mut self,
        sender: Option<(Time, SocketAddr)>,
        datagram: &'a [u8],
    ) -> Option<std::borrow::Cow<'a, [u8]>> {
        match self.config.auth.as_mut().map(|auth| auth.verify(datagram)) {
            None => Some(std::borrow::Cow::Borrowed(datagram)),
            Some(Ok(inner)) => Some(inner),
            Some(Err(error)) => {
                if let Some((now, from)) = sender {
                    self.auth_warnings.failed(
                        now,
                        "chain client",
                        from,
                        pmnet_proto::DropReason::Auth(error),
                    );
                }
                self.drops.record(DropReason::Auth(error));
                None
            }
        }
    }

    pub fn is_busy(&self) -> bool {
        self.pending.is_some()
    }

    /// Start a request on `key` (1 to 255 bytes); its number (outcomes name it).
    pub fn start(&mut self, now: Time, key: &[u8], op: ClientOp) -> Result<u32, Busy> {
        if self.pending.is_some() {
            return Err(Busy);
        }
        assert!(
            !key.is_empty() && key.len() <= 255,
            "a key is 1 to 255 bytes"
        );
        let request = self.next_request;
        self.next_request = self.next_request.wrapping_add(1).max(1);
        self.pending = Some(Pending {
            request,
            key: key.to_vec(),
            op,
            started: now,
            sends: 0,
            resend_at: now,
            interval: self.config.retransmit_timeout,
        });
        self.send(now);
        Ok(request)
    }

    /// The controller's configuration epoch the client routes by (0: none, or static).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn fetch(&mut self) {
        let Some(controller) = self.config.controller else {
            return;
        };
        let mut payload = Vec::new();
        Fetch { epoch: self.epoch }.emit(&mut payload);
        let header = Header::new(
            PacketType::Reserved(CHAIN_FETCH),
            self.config.server_id,
            self.config.session_id,
            0,
        );
        let bytes = header.encode(&payload);
        for destination in std::iter::once(controller)
            .chain(self.config.standby_controllers.iter().copied())
            .take(crate::node::MAX_CONTROLLERS)
        {
            self.transmits.push_back(Transmit {
                destination,
                bytes: bytes.clone(),
            });
        }
    }

    fn send(&mut self, now: Time) {
        let groups = self.config.groups.len() as u16;
        if groups == 0 {
            // No configuration yet: ask for it, and try again at the retransmission time.
            self.fetch();
            if let Some(pending) = self.pending.as_mut() {
                pending.resend_at = now + pending.interval;
                pending.interval = (pending.interval * 2).min(self.config.retransmit_timeout_max);
            }
            return;
        }
        if self
            .pending
            .as_ref()
            .is_some_and(|pending| pending.sends > 0)
        {
            // Sent again: the chains may have changed.
            self.fetch();
        }
        let Some(pending) = self.pending.as_mut() else {
            return;
        };
        let group = group_of(&pending.key, groups);
        let chain = &self.config.groups[usize::from(group)];
        let (op, value): (Op, &[u8]) = match &pending.op {
            ClientOp::Get => (Op::Get, &[]),
            ClientOp::Put(value) => (Op::Put, value),
            ClientOp::Delete => (Op::Delete, &[]),
            ClientOp::CompareAndSet { expected, value } => (
                Op::CompareAndSet {
                    expected: *expected,
                },
                value,
            ),
        };
        let to = match (op, self.config.reads) {
            (Op::Get, ReadFrom::AnyMember) => {
                self.next_reader = self.next_reader.wrapping_add(1);
                chain[self.next_reader % chain.len()]
            }
            (Op::Get, ReadFrom::Tail) => chain[chain.len() - 1],
            _ => chain[0],
        };
        let mut payload = Vec::new();
        Request {
            op,
            group,
            key: &pending.key,
            value,
        }
        .emit(&mut payload);
        let mut header = Header::new(
            PacketType::Reserved(CHAIN_REQUEST),
            self.config.server_id,
            self.config.session_id,
            pending.request,
        );
        if pending.sends > 0 {
            header.flags = RETRANSMITTED;
        }
        pending.sends += 1;
        pending.resend_at = now + pending.interval;
        pending.interval = (pending.interval * 2).min(self.config.retransmit_timeout_max);
        self.transmits.push_back(Transmit {
            destination: to,
            bytes: header.encode(&payload),
        });
    }

    /// A datagram from `from`: the controller's configuration (taken if newer, and the
    /// request in flight sent at once where it now goes), or what [`ChainClient::handle`]
    /// takes. Never panics on its contents.
    pub fn handle_from(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let Some(datagram) = self.verified(Some((now, from)), datagram) else {
            return;
        };
        let Ok((header, payload)) = Header::parse(&datagram) else {
            return;
        };
        if header.packet_type == PacketType::Reserved(CHAIN_CONFIG) {
            if self.config.controller != Some(from)
                && !self.config.standby_controllers.contains(&from)
            {
                return;
            }
            let Ok(layout) = Layout::parse(payload) else {
                return;
            };
            if layout.epoch <= self.epoch {
                return;
            }
            self.epoch = layout.epoch;
            self.config.groups = layout.chains();
            if self.pending.is_some() {
                self.send(now);
            }
            return;
        }
        if header.packet_type == PacketType::Reserved(CHAIN_REPLY)
            && header.session_id == self.config.session_id
            && Reply::parse(payload).is_ok_and(|reply| reply.status == Status::Paused)
        {
            // Paused for a moment (a member joining the group): try again soon, not at the
            // backed-off retransmission time.
            if let Some(pending) = self.pending.as_mut().filter(|p| p.request == header.seq) {
                pending.resend_at = pending.resend_at.min(now + PAUSED_RETRY);
            }
            return;
        }
        self.take_reply(&header, payload);
    }

    /// A datagram from the network; anything but the reply to the request in flight is
    /// ignored. Never panics on its contents. (With a controller, use
    /// [`ChainClient::handle_from`], which takes configurations too.)
    pub fn handle(&mut self, datagram: &[u8]) {
        let Some(datagram) = self.verified(None, datagram) else {
            return;
        };
        if let Ok((header, payload)) = Header::parse(&datagram) {
            self.take_reply(&header, payload);
        }
    }

    /// The reply to the request in flight, if `header` and `payload` are it.
    fn take_reply(&mut self, header: &Header, payload: &[u8]) {
        if header.packet_type != PacketType::Reserved(CHAIN_REPLY)
            || header.session_id != self.config.session_id
            || header.has_flag(RELAYED)
        {
            // Not a reply to this client: another session's, or a tail's answer to a read a
            // member relayed on its behalf (sent here by someone replaying it).
            return;
        }
        let Some(pending) = &self.pending else {
            return;
        };
        if header.seq != pending.request {
            return;
        }
        let Ok(reply) = Reply::parse(payload) else {
            return;
        };
        match reply.status {
            // Writes to the group pause for a moment: send again at the retransmission time.
            Status::Paused => return,
            // The chains changed: ask the controller, send again once it answers. With fixed
            // chains, a member's "not here" says nothing of what the head did with the
            // request (an attacker can replay it to another member, whose genuine answer
            // comes back): wait for the head's answer or the lifetime's end (unknown).
            Status::NotHere => {
                if self.config.controller.is_some() {
                    self.fetch();
                }
                return;
            }
            _ => {}
        }
        let outcome = match (&pending.op, reply.status) {
            (ClientOp::Get, Status::Ok) => Outcome::Value {
                version: reply.version,
                value: Some(reply.value.to_vec()),
            },
            (ClientOp::Get, Status::NotFound) => Outcome::Value {
                version: reply.version,
                value: None,
            },
            (_, Status::Ok) => Outcome::Written {
                version: reply.version,
            },
            (_, Status::CompareFailed) => Outcome::CompareFailed {
                version: reply.version,
                value: reply.value.to_vec(),
            },
            (_, Status::InDoubt) => Outcome::Unknown,
            (_, Status::Full) => Outcome::Full,
            (_, status) => Outcome::Refused(status),
        };
        let request = pending.request;
        self.pending = None;
        self.outcomes.push_back((request, outcome));
    }

    /// Send again what waited too long; fail what outlived its lifetime.
    pub fn handle_timeout(&mut self, now: Time) {
        let Some(pending) = &self.pending else {
            return;
        };
        if now.saturating_duration_since(pending.started) >= self.config.request_lifetime {
            let request = pending.request;
            self.pending = None;
            self.outcomes.push_back((request, Outcome::Unknown));
            return;
        }
        if pending.resend_at <= now {
            self.send(now);
        }
    }

    /// The next datagram to send, sealed when keys are configured.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut transmit = self.transmits.pop_front()?;
        if let Some(auth) = self.config.auth.as_mut() {
            auth.seal(&mut transmit.bytes);
        }
        Some(transmit)
    }

    /// The next finished request: its number and outcome.
    pub fn poll_outcome(&mut self) -> Option<(u32, Outcome)> {
        self.outcomes.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        self.pending.as_ref().map(|pending| {
            pending
                .resend_at
                .min(pending.started + self.config.request_lifetime)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> ChainClient {
        let members: Vec<SocketAddr> = (1..=3)
            .map(|host| SocketAddr::from(([10, 0, 0, host], 7600)))
            .collect();
        let mut config = ClientConfig::new(7, vec![members]);
        config.request_lifetime = Duration::from_millis(100);
        ChainClient::new(config)
    }

    #[test]
    fn writes_go_to_the_head_resends_are_marked_and_a_lifetime_ends_in_unknown() {
        let mut client = client();
        let now = Time::ZERO;
        let request = client
            .start(now, b"k", ClientOp::Put(b"v".to_vec()))
            .unwrap();
        assert_eq!(client.start(now, b"k", ClientOp::Get), Err(Busy));
        let first = client.poll_transmit().unwrap();
        assert_eq!(first.destination, SocketAddr::from(([10, 0, 0, 1], 7600)));
        let (header, _) = Header::parse(&first.bytes).unwrap();
        assert!(!header.has_flag(RETRANSMITTED));
        client.handle_timeout(now + Duration::from_millis(6));
        let again = client.poll_transmit().unwrap();
        let (header, _) = Header::parse(&again.bytes).unwrap();
        assert!(header.has_flag(RETRANSMITTED));
        assert_eq!(header.seq, request);
        client.handle_timeout(now + Duration::from_millis(100));
        assert_eq!(client.poll_outcome(), Some((request, Outcome::Unknown)));
        assert!(!client.is_busy());
    }

    /// Where the reads of one key go: (any member, tail only).
    fn read_destinations(reads: ReadFrom) -> Vec<SocketAddr> {
        let mut client = client();
        client.config.reads = reads;
        (0..6)
            .map(|index| {
                let request = client.start(Time::ZERO, b"k", ClientOp::Get).unwrap();
                let sent = client.poll_transmit().unwrap();
                let mut payload = Vec::new();
                Reply {
                    status: Status::NotFound,
                    version: 0,
                    value: b"",
                }
                .emit(&mut payload);
                client.handle(
                    &Header::new(PacketType::Reserved(CHAIN_REPLY), 1, 7, request).encode(&payload),
                );
                assert!(client.poll_outcome().is_some(), "read {index} answered");
                sent.destination
            })
            .collect()
    }

    #[test]
    fn reads_go_to_every_member_in_turn_or_to_the_tail_only() {
        let spread = read_destinations(ReadFrom::AnyMember);
        for host in 1..=3 {
            let member = SocketAddr::from(([10, 0, 0, host], 7600));
            assert_eq!(spread.iter().filter(|&&to| to == member).count(), 2);
        }
        let tail = SocketAddr::from(([10, 0, 0, 3], 7600));
        assert!(read_destinations(ReadFrom::Tail)
            .iter()
            .all(|&to| to == tail));
    }

    #[test]
    fn only_the_reply_to_the_request_in_flight_ends_it_and_junk_is_ignored() {
        let mut client = client();
        let request = client
            .start(
                Time::ZERO,
                b"k",
                ClientOp::CompareAndSet {
                    expected: 0,
                    value: b"me".to_vec(),
                },
            )
            .unwrap();
        let reply = |session: u64, seq: u32, status: Status| {
            let mut payload = Vec::new();
            Reply {
                status,
                version: 4,
                value: b"you",
            }
            .emit(&mut payload);
            Header::new(PacketType::Reserved(CHAIN_REPLY), 1, session, seq).encode(&payload)
        };
        client.handle(&reply(8, request, Status::Ok));
        client.handle(&reply(7, request + 1, Status::Ok));
        // The tail's answer to the read a head relayed for this very compare-and-set (its
        // session and number): not the write's outcome.
        let mut relayed = reply(7, request, Status::Ok);
        let (mut header, _) = Header::parse(&relayed).unwrap();
        header.flags = RELAYED;
        let payload = relayed.split_off(pmnet_wire::HEADER_LEN);
        client.handle(&header.encode(&payload));
        client.handle(&[0xff; 40]);
        client.handle(&[]);
        assert_eq!(client.poll_outcome(), None);
        client.handle(&reply(7, request, Status::CompareFailed));
        assert_eq!(
            client.poll_outcome(),
            Some((
                request,
                Outcome::CompareFailed {
                    version: 4,
                    value: b"you".to_vec()
                }
            ))
        );
    }
}

//! Keyed updates and cache reads: what a session sends so that a device's read cache can see
//! the key of its writes and serve its reads (docs/cache.md).
//!
//! A keyed update is an update with flag `KEYED` whose payload starts with a write descriptor
//! (the key, the reply a read of the key gives after it); it is sequenced, logged and completed
//! like any update. A cache read (type `0x10`) is unsequenced: it has an id of its own, carries
//! the session's last request number (`read_after`, so a server answers it only once the
//! session's earlier requests are applied: read-your-writes), and completes on the first cache
//! reply (type `0x11`), from a device that holds the key or from the server. It is idempotent,
//! so it is simply sent again until answered.

use std::collections::BTreeMap;
use std::time::Duration;

use pmnet_wire::cache::{
    ReadDescriptor, WriteDescriptor, WriteOrder, AFTER_LEN, CACHE_READ, KEYED, REPLY_AFTER_MAX,
};

/// Afters a barrier has room for at most: sessions with keyed writes in flight through the
/// device that a barrier can be ordered after (docs/cache.md, "Barriers").
pub const BARRIER_ROOM_MAX: usize = 96;
use pmnet_wire::{Header, PacketType};

use super::{Client, ClientError};
use crate::{unsealed_len_max, CountDrop, RequestKind, Time};

/// How a cache read ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadEvent {
    pub id: u32,
    /// The reply, and who gave it: the device's id, or 0 for the server.
    pub outcome: Result<(Vec<u8>, u16), ClientError>,
}

#[derive(Debug)]
struct ReadInFlight {
    datagram: Vec<u8>,
    /// The reply's fragments as they come (a server's reply may take several).
    parts: Vec<Option<Vec<u8>>>,
    received_len: usize,
    deadline: Time,
    timeout: Duration,
    retransmit_count: u32,
    expires: Time,
    started: Time,
}

/// The session's cache reads in flight, and their outcomes not yet polled.
#[derive(Debug, Default)]
pub(super) struct Reads {
    in_flight: BTreeMap<u32, ReadInFlight>,
    next_id: u32,
    events: std::collections::VecDeque<ReadEvent>,
}

impl Reads {
    pub(super) fn len(&self) -> usize {
        self.in_flight.len()
    }

    pub(super) fn next_deadline(&self) -> Option<Time> {
        self.in_flight
            .values()
            .map(|read| read.deadline.min(read.expires))
            .min()
    }
}

impl Client {
    /// Start a keyed update of `key`: `request` is the application's update, `reply_after`
    /// the reply a read of `key` gives once it is applied (`None`, or one longer than
    /// [`REPLY_AFTER_MAX`]: the write only invalidates what a cache holds). An empty `key` makes
    /// it a *barrier*, a write that may change any key (a cache drops everything, and fetches
    /// nothing until the server has applied it). Completes like [`Client::update`].
    pub fn keyed_update(
        &mut self,
        now: Time,
        key: &[u8],
        reply_after: Option<&[u8]>,
        request: &[u8],
    ) -> Result<u32, ClientError> {
        if key.len() > usize::from(u8::MAX) {
            return Err(ClientError::TooLarge);
        }
        if key.is_empty() {
            let payload = self.barrier_payload(request);
            return self.start_with_flags(now, RequestKind::Update, &payload, KEYED);
        }
        // The descriptor must be whole in the first fragment, where a device reads it: a
        // reply-after that does not fit goes (the write then only drops a cached copy).
        let first_fragment = self.first_fragment_len();
        let mut descriptor = WriteDescriptor {
            order: WriteOrder::default(),
            key,
            reply_after: reply_after.filter(|reply| reply.len() <= REPLY_AFTER_MAX),
            afters: &[],
        };
        if descriptor.len() > first_fragment {
            descriptor.reply_after = None;
        }
        let mut payload = Vec::with_capacity(descriptor.len() + request.len());
        descriptor.emit(&mut payload);
        payload.extend_from_slice(request);
        self.start_with_flags(now, RequestKind::Update, &payload, KEYED)
    }

    /// Start a keyed bypass request of `key`: a write whose reply only the server can give
    /// (an increment): it completes on the server's reply, and a device's cache drops the key
    /// (and orders its next fetch after it). An empty `key` makes it a barrier (see
    /// [`Client::keyed_update`]).
    pub fn keyed_bypass(
        &mut self,
        now: Time,
        key: &[u8],
        request: &[u8],
    ) -> Result<u32, ClientError> {
        if key.len() > usize::from(u8::MAX) {
            return Err(ClientError::TooLarge);
        }
        if key.is_empty() {
            let payload = self.barrier_payload(request);
            return self.start_with_flags(now, RequestKind::Bypass, &payload, KEYED);
        }
        let descriptor = WriteDescriptor {
            order: WriteOrder::default(),
            key,
            reply_after: None,
            afters: &[],
        };
        let mut payload = Vec::with_capacity(descriptor.len() + request.len());
        descriptor.emit(&mut payload);
        payload.extend_from_slice(request);
        self.start_with_flags(now, RequestKind::Bypass, &payload, KEYED)
    }

    /// Payload bytes of a first fragment at most.
    fn first_fragment_len(&self) -> usize {
        crate::fragment_payload_len_max(unsealed_len_max(
            self.config.datagram_len_max,
            &self.config.auth,
        ))
    }

    /// A barrier's payload: its descriptor, with room for as many afters as fit in the first
    /// fragment (at most [`BARRIER_ROOM_MAX`]; a device fills in one per session whose keyed
    /// writes it has not seen acknowledged), then the request.
    fn barrier_payload(&self, request: &[u8]) -> Vec<u8> {
        let bare = WriteDescriptor::barrier(0).len();
        let room =
            (self.first_fragment_len().saturating_sub(bare) / AFTER_LEN).min(BARRIER_ROOM_MAX);
        let mut payload = WriteDescriptor::barrier(room);
        payload.extend_from_slice(request);
        payload
    }

    /// Start a cache read of `key` (`request`: the application's read of it). Returns the
    /// read's id; its outcome comes from [`Client::poll_read_event`].
    pub fn cache_read(
        &mut self,
        now: Time,
        key: &[u8],
        request: &[u8],
    ) -> Result<u32, ClientError> {
        if self.in_flight.len() + self.reads.len() >= self.config.window as usize {
            return Err(ClientError::WindowFull);
        }
        if key.is_empty() || key.len() > usize::from(u8::MAX) {
            return Err(ClientError::TooLarge);
        }
        let descriptor = ReadDescriptor {
            read_after: self.next_seq - 1,
            after_session: 0,
            after_seq: 0,
            key,
        };
        let mut payload = Vec::with_capacity(descriptor.len() + request.len());
        descriptor.emit(&mut payload);
        payload.extend_from_slice(request);
        let limit = unsealed_len_max(self.config.datagram_len_max, &self.config.auth);
        if pmnet_wire::HEADER_LEN + payload.len() > limit {
            return Err(ClientError::TooLarge);
        }
        self.reads.next_id = self.reads.next_id.wrapping_add(1).max(1);
        let id = self.reads.next_id;
        let header = Header::new(
            PacketType::Reserved(CACHE_READ),
            self.config.server_id,
            self.config.session_id,
            id,
        );
        let datagram = header.encode(&payload);
        self.queue(pmnet_wire::to_sendable(&datagram));
        self.counters.cache_reads_started += 1;
        self.reads.in_flight.insert(
            id,
            ReadInFlight {
                datagram,
                parts: Vec::new(),
                received_len: 0,
                deadline: now + self.config.retransmit_timeout,
                timeout: self.config.retransmit_timeout,
                retransmit_count: 0,
                expires: now + self.request_lifetime(),
                started: now,
            },
        );
        Ok(id)
    }

    /// The next cache read that completed or failed, if any.
    #[must_use]
    pub fn poll_read_event(&mut self) -> Option<ReadEvent> {
        self.reads.events.pop_front()
    }

    pub(super) fn on_cache_reply(&mut self, now: Time, header: &Header, payload: &[u8]) {
        self.counters.cache_replies_received += 1;
        let max_reply_len = self.config.request_len_max;
        let Some(read) = self.reads.in_flight.get_mut(&header.seq) else {
            self.counters.late_acks_consumed += 1;
            return;
        };
        let count = usize::from(header.fragment_count);
        if read.parts.is_empty() {
            read.parts = vec![None; count];
        }
        let index = usize::from(header.fragment_index);
        if read.parts.len() != count || index >= count {
            self.counters
                .dropped
                .record(crate::DropReason::InconsistentFragment);
            return;
        }
        if read.parts[index].is_some() {
            return;
        }
        if read.received_len + payload.len() > max_reply_len {
            self.counters.dropped.record(crate::DropReason::TooLarge);
            return;
        }
        read.received_len += payload.len();
        read.parts[index] = Some(payload.to_vec());
        if read.parts.iter().any(Option::is_none) {
            return;
        }
        let read = self
            .reads
            .in_flight
            .remove(&header.seq)
            .expect("the read answered");
        self.latency
            .cache_read
            .record(now.saturating_duration_since(read.started));
        if header.device_id != 0 {
            self.counters.cache_reads_served_by_device += 1;
        }
        self.reads.events.push_back(ReadEvent {
            id: header.seq,
            outcome: Ok((crate::concat_parts(read.parts), header.device_id)),
        });
    }

    /// Send again the reads that timed out; fail those past their retransmissions or lifetime.
    pub(super) fn read_timeouts(&mut self, now: Time) {
        let due: Vec<u32> = self
            .reads
            .in_flight
            .iter()
            .filter(|(_, read)| read.deadline.min(read.expires) <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let read = self.reads.in_flight.get_mut(&id).expect("a due read");
            if read.retransmit_count >= self.config.retransmits_max || read.expires <= now {
                self.reads.in_flight.remove(&id);
                self.counters.cache_reads_failed += 1;
                self.reads.events.push_back(ReadEvent {
                    id,
                    outcome: Err(ClientError::TimedOut),
                });
                continue;
            }
            read.retransmit_count += 1;
            read.timeout = (read.timeout * 2).min(self.config.retransmit_timeout_max);
            read.deadline = now + read.timeout;
            // Partly answered: start over (the reply is whole again on the next answer).
            read.parts.clear();
            read.received_len = 0;
            let bytes = pmnet_wire::to_sendable(&read.datagram);
            self.counters.retransmitted_fragments += 1;
            self.queue(bytes);
        }
    }
}

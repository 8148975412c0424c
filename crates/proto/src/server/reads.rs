//! Cache reads (type `0x10`) that reach the server: the read cache's misses.
//!
//! A cache read is unsequenced and idempotent: `seq` is the read's id, not a number of the
//! session's sequence. The server hands it to the application ([`ServerEvent::Read`]) once
//! two things hold: the reading session has applied through the read's `read_after` (its own
//! last update: read-your-writes), and the keyed write a device named in the read's descriptor
//! (one it acknowledged whose server-ACK had not come back) is applied. Until then the read is
//! held, in a bounded table (the oldest held read is dropped when it is full: its client sends
//! it again). The application answers with [`Server::on_read_reply`], which sends the cache
//! reply (type `0x11`, `device_id` 0) to where the read came from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;

use pmnet_wire::cache::{ReadDescriptor, CACHE_REPLY};
use pmnet_wire::{Header, PacketType};

use super::{Server, ServerEvent};
use crate::{encode_fragments, DropReason, Time};

/// Reads held (waiting for their session or a named write) at most.
pub const HELD_READS_MAX: usize = 4096;
/// Reads handed to the application and not yet answered at most.
pub const READS_IN_FLIGHT_MAX: usize = 4096;

/// A read (`session`, `id`) waiting for session `.0` to apply through `.1`.
type HeldKey = (u64, u32, u64, u32);

#[derive(Debug)]
pub(super) struct HeldRead {
    from: SocketAddr,
    read_after: u32,
    after: Option<(u64, u32)>,
    request: Vec<u8>,
}

/// The server's reads: held, and handed to the application.
#[derive(Debug, Default)]
pub(super) struct Reads {
    held: BTreeMap<HeldKey, HeldRead>,
    /// Held keys, oldest first (entries already released are skipped).
    held_order: VecDeque<HeldKey>,
    in_flight: HashMap<(u64, u32), SocketAddr>,
}

/// What the server counted of cache reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadCounters {
    pub received: u64,
    /// Held for their session's updates or a named keyed write.
    pub held: u64,
    /// Dropped: the table of held reads was full (the oldest went).
    pub dropped_held_full: u64,
    /// Dropped: too many reads at the application already.
    pub dropped_in_flight_full: u64,
    pub answered: u64,
    /// Answered with [`super::WAITS_FOR_ROOM`]: the write they must see waits for room.
    pub waits_for_room: u64,
}

impl Server {
    pub(super) fn on_cache_read(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        self.counters.reads.received += 1;
        if header.fragment_count != 1 {
            self.count_drop(DropReason::BadCacheRead);
            return;
        }
        let Ok((descriptor, _)) = ReadDescriptor::parse(payload) else {
            self.count_drop(DropReason::BadCacheRead);
            return;
        };
        let key = (header.session_id, header.seq);
        if self.reads.in_flight.contains_key(&key) {
            return; // a retransmission: the reply is coming
        }
        let read = HeldRead {
            from,
            read_after: descriptor.read_after,
            after: descriptor.after(),
            request: payload.to_vec(),
        };
        self.place_read(now, header.session_id, header.seq, read);
    }

    /// What a read of `session_id` still waits for: (session, through), or `None`.
    fn read_blocker(&self, session_id: u64, read: &HeldRead) -> Option<(u64, u32)> {
        let applied = |session: u64| {
            self.table
                .sessions
                .get(&session)
                .map_or(0, |state| state.last_applied)
        };
        if read.read_after > 0 && applied(session_id) < read.read_after {
            return Some((session_id, read.read_after));
        }
        match read.after {
            Some((after, through)) if applied(after) < through => Some((after, through)),
            _ => None,
        }
    }

    /// Hand `read` to the application, or hold it for what it waits for (or, when that is a
    /// write the store has no room for, have it answered so).
    fn place_read(&mut self, now: Time, session_id: u64, id: u32, read: HeldRead) {
        let Some((blocker, through)) = self.read_blocker(session_id, &read) else {
            self.hand_read(session_id, id, read);
            return;
        };
        if self
            .table
            .sessions
            .get(&blocker)
            .is_some_and(|session| session.waits_for_room)
        {
            self.refuse_read(session_id, id, read.from);
            return;
        }
        let key = (blocker, through, session_id, id);
        if self.reads.held.contains_key(&key) {
            return;
        }
        while self.reads.held.len() >= HELD_READS_MAX {
            let Some(oldest) = self.reads.held_order.pop_front() else {
                break;
            };
            if self.reads.held.remove(&oldest).is_some() {
                self.counters.reads.dropped_held_full += 1;
            }
        }
        self.counters.reads.held += 1;
        if blocker != session_id {
            // A keyed write named by a device: make sure its session is asked for or skipped.
            self.make_known(now, blocker, through, Some(read.from));
        }
        self.reads.held.insert(key, read);
        self.reads.held_order.push_back(key);
        if self.reads.held_order.len() > 2 * HELD_READS_MAX {
            let held = &self.reads.held;
            self.reads.held_order.retain(|key| held.contains_key(key));
        }
    }

    fn hand_read(&mut self, session_id: u64, id: u32, read: HeldRead) {
        if self.reads.in_flight.len() >= READS_IN_FLIGHT_MAX {
            self.counters.reads.dropped_in_flight_full += 1;
            return;
        }
        let Ok((descriptor, request)) = ReadDescriptor::parse(&read.request) else {
            return; // parsed when it arrived
        };
        let request = request.to_vec();
        let _ = descriptor;
        self.reads.in_flight.insert((session_id, id), read.from);
        self.events.push_back(ServerEvent::Read {
            session_id,
            id,
            request,
        });
    }

    /// Have read `id` of `session_id` answered with [`super::WAITS_FOR_ROOM`].
    fn refuse_read(&mut self, session_id: u64, id: u32, from: SocketAddr) {
        if self.reads.in_flight.len() >= READS_IN_FLIGHT_MAX {
            self.counters.reads.dropped_in_flight_full += 1;
            return;
        }
        self.counters.reads.waits_for_room += 1;
        self.reads.in_flight.insert((session_id, id), from);
        self.events
            .push_back(ServerEvent::ReadWaitsForRoom { session_id, id });
    }

    /// The store had no room for the next request of `session_id`: the reads held for it are
    /// answered so, rather than left waiting for room that may not come.
    pub(super) fn refuse_reads_waiting_for(&mut self, session_id: u64) {
        let waiting: Vec<HeldKey> = self
            .reads
            .held
            .range((session_id, 0, 0, 0)..=(session_id, u32::MAX, u64::MAX, u32::MAX))
            .map(|(key, _)| *key)
            .collect();
        for key in waiting {
            if let Some(read) = self.reads.held.remove(&key) {
                self.refuse_read(key.2, key.3, read.from);
            }
        }
    }

    /// Session `session_id` applied through `last_applied`: place again the reads that waited
    /// for it (each hands itself on or waits for what is left).
    pub(super) fn release_reads(&mut self, now: Time, session_id: u64, last_applied: u32) {
        let released: Vec<HeldKey> = self
            .reads
            .held
            .range((session_id, 0, 0, 0)..=(session_id, last_applied, u64::MAX, u32::MAX))
            .map(|(key, _)| *key)
            .collect();
        for key in released {
            if let Some(read) = self.reads.held.remove(&key) {
                self.place_read(now, key.2, key.3, read);
            }
        }
    }

    /// The application's answer to read `id` of `session_id` ([`ServerEvent::Read`]).
    pub fn on_read_reply(&mut self, session_id: u64, id: u32, reply: &[u8]) {
        self.on_read_reply_with(session_id, id, reply, true);
    }

    /// [`Server::on_read_reply`], saying whether a cache may keep the reply (`false`: a
    /// value that changes without a write, such as a Redis key with a time to live; the reply
    /// carries flag `NOT_CACHEABLE`).
    pub fn on_read_reply_with(&mut self, session_id: u64, id: u32, reply: &[u8], cacheable: bool) {
        let Some(to) = self.reads.in_flight.remove(&(session_id, id)) else {
            return;
        };
        let mut header = Header::new(
            PacketType::Reserved(CACHE_REPLY),
            self.config.server_id,
            session_id,
            id,
        );
        if !cacheable {
            header.flags |= pmnet_wire::cache::NOT_CACHEABLE;
        }
        let Some(datagrams) = encode_fragments(header, reply, self.datagram_budget()) else {
            self.counters.reads.dropped_in_flight_full += 1;
            return;
        };
        self.counters.reads.answered += 1;
        for bytes in datagrams {
            self.transmits.push_back(crate::Transmit {
                destination: to,
                bytes,
            });
        }
    }

    /// Reads held now (for tests and status).
    pub fn held_read_count(&self) -> usize {
        self.reads.held.len()
    }
}

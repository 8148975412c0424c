//! A primary's forward log (docs/replication.md, "The forward log"): every request a primary
//! forwards to its replicas is durable in the primary's own persistent memory before the
//! first replica can see it, and stays there until the primary applied it.
//!
//! Without it a primary that crashes between forwarding a request and applying it would lose
//! a request its replicas may have applied; if no device holds it (a bypass request, or an
//! update no device could log), its client gives up, sends a no-op fill, and the primary would
//! apply the fill where the replicas applied the request. With it, a restarted primary finds
//! every request it forwarded and did not apply, and takes them in again, in the order it
//! forwarded them, before anything else: a client's fill for such a number then finds the
//! request, and the replicas and the primary apply the same thing.
//!
//! The log is the device log's code ([`pmnet_pm::PmLog`], persisted in numbered batches by
//! [`pmnet_pm::PmLog::persist_batch`]), its slots keyed by (server, session, sequence number,
//! part). A request larger than a slot takes several slots, each holding a record:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | forward index (u64, little-endian): the order forwarded |
//! | 8..10 | parts (u16): slots the request takes |
//! | 10 | kind: 1 update, 2 bypass |
//! | 11 | flags: bit 0 no-op fill; bit 1 retained (received from a primary) |
//! | 12.. | this part of the request, as the application gets it |
//!
//! A request whose parts are not all there (a crash while its batch was written: it was never
//! forwarded) is dropped at start-up. A request forwarded again after the application had no
//! room for it keeps its record and its place: its replicas may have applied it already, in
//! the order it first went out.

use std::collections::{BTreeMap, HashMap, HashSet};

use pmnet_pm::{EntryKey, LogWork, RecoveredEntry};

use crate::function::{NumberedBatches, PersistBatch};
use crate::RequestKind;

/// Bytes of a forward log record before its part of the request.
pub const FORWARD_RECORD_HEADER_LEN: usize = 12;

/// A forward log as the runtime (or the simulator) opened it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardLogOpened {
    /// Slots in the log.
    pub slot_count: u32,
    /// Largest record a slot holds ([`pmnet_pm::PmLog::max_packet_len`]).
    pub max_packet_len: usize,
    /// What [`pmnet_pm::PmLog::open`] found in it.
    pub entries: Vec<RecoveredEntry>,
}

/// What a primary took back from its forward log at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardLogRecovery {
    /// Requests forwarded and not applied before the restart: taken in again.
    pub requests: u64,
    /// Requests applied before the restart whose slots were not freed yet (or, received from
    /// a primary, kept until their slots are needed).
    pub applied: u64,
    /// On a server without replicas: requests received from a primary and not applied,
    /// applied from their records when the primary sends them again.
    pub kept: u64,
    /// On a primary: requests it applied as a replica (before a promotion), sent to its
    /// replicas again, which may lack them.
    pub resent_to_replicas: u64,
    /// Incomplete or unreadable records (never forwarded) and superseded copies: freed.
    pub discarded_slots: u64,
}

/// A request found in the forward log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LoggedForward {
    pub index: u64,
    pub session_id: u64,
    pub seq: u32,
    pub kind: RequestKind,
    pub fill: bool,
    /// Received from a primary (kept by a replica), not forwarded by this server.
    pub retained: bool,
    pub request: Vec<u8>,
}

/// Record flag: a no-op fill.
const FLAG_FILL: u8 = 1;
/// Record flag: received from a primary.
const FLAG_RETAINED: u8 = 2;

/// Requests found in a log at start-up, with their slots, in forward order.
pub(super) type Found = Vec<(LoggedForward, Vec<u32>)>;

/// A forward waiting for its record: (session, seq) and its forward index.
type Waiting = ((u64, u32), u64);

/// Copies of one request found at start-up, by forward index: (parts, kind, fill, and each
/// part found by part number: its slot and bytes).
type Copies = BTreeMap<u64, (u16, RequestKind, u8, BTreeMap<u16, (u32, Vec<u8>)>)>;

/// A request in the log.
#[derive(Debug)]
struct Logged {
    index: u64,
    slots: Vec<u32>,
    /// Its records are durable.
    durable: bool,
    /// Received from a primary: kept after it is applied, until its slots are needed.
    retained: bool,
    /// What it holds (fill, length, CRC-32C of the request): a different request under the
    /// same number replaces it.
    content: (bool, usize, u32),
}

/// What a record holds, to tell two requests under one number apart.
fn content_of(fill: bool, request: &[u8]) -> (bool, usize, u32) {
    (fill, request.len(), crc32c::crc32c(request))
}

/// One slot's record, parsed.
struct Record<'a> {
    index: u64,
    parts: u16,
    kind: RequestKind,
    flags: u8,
    bytes: &'a [u8],
}

fn parse_record(packet: &[u8]) -> Option<Record<'_>> {
    let header = packet.get(..FORWARD_RECORD_HEADER_LEN)?;
    let index = u64::from_le_bytes(header[0..8].try_into().ok()?);
    let parts = u16::from_le_bytes(header[8..10].try_into().ok()?);
    let kind = match header[10] {
        1 => RequestKind::Update,
        2 => RequestKind::Bypass,
        _ => return None,
    };
    if parts == 0 || header[11] & !(FLAG_FILL | FLAG_RETAINED) != 0 {
        return None;
    }
    Some(Record {
        index,
        parts,
        kind,
        flags: header[11],
        bytes: &packet[FORWARD_RECORD_HEADER_LEN..],
    })
}

/// A primary's forward log: which slots hold what, and the work not yet durable.
#[derive(Debug)]
pub(super) struct ForwardLog {
    server_id: u16,
    /// Request bytes one slot holds.
    chunk: usize,
    slot_count: u32,
    free: Vec<u32>,
    /// Each request logged: not yet applied, or retained.
    live: HashMap<(u64, u32), Logged>,
    /// Retained requests applied here, by index: the oldest is freed when a slot is needed.
    evictable: BTreeMap<u64, (u64, u32)>,
    /// Slots those take.
    evictable_slots: usize,
    next_index: u64,
    /// Work asked for and batches in flight, each with the forwards (request, forward
    /// index) that go out once it is durable.
    batches: NumberedBatches<LogWork, Waiting>,
}

impl ForwardLog {
    /// The log of `opened`, and the requests it holds (sorted by forward index). Damaged,
    /// incomplete and superseded records are freed (in the first batch). Never panics on what
    /// the file held.
    pub(super) fn open(
        server_id: u16,
        opened: ForwardLogOpened,
    ) -> (
        ForwardLog,
        Vec<(LoggedForward, Vec<u32>)>,
        ForwardLogRecovery,
    ) {
        let chunk = opened
            .max_packet_len
            .saturating_sub(FORWARD_RECORD_HEADER_LEN);
        assert!(chunk > 0, "forward log slots too small for a record");
        let mut groups: BTreeMap<(u64, u32), Copies> = BTreeMap::new();
        let mut discarded: Vec<u32> = Vec::new();
        for entry in &opened.entries {
            let Some(record) = parse_record(&entry.packet) else {
                discarded.push(entry.slot);
                continue;
            };
            let key = (entry.key.session_id, entry.key.seq);
            let copy = groups
                .entry(key)
                .or_default()
                .entry(record.index)
                .or_insert((record.parts, record.kind, record.flags, BTreeMap::new()));
            let consistent = copy.0 == record.parts
                && copy.1 == record.kind
                && copy.2 == record.flags
                && entry.key.fragment_index < record.parts
                && !copy.3.contains_key(&entry.key.fragment_index);
            if consistent {
                copy.3.insert(
                    entry.key.fragment_index,
                    (entry.slot, record.bytes.to_vec()),
                );
            } else {
                discarded.push(entry.slot);
            }
        }
        let mut found: Found = Vec::new();
        let mut next_index = 0;
        for ((session_id, seq), copies) in groups {
            let mut kept = false;
            // The latest complete copy counts; every other one is freed.
            for (index, (parts, kind, flags, pieces)) in copies.into_iter().rev() {
                let slots: Vec<u32> = pieces.values().map(|(slot, _)| *slot).collect();
                if kept || pieces.len() != usize::from(parts) {
                    discarded.extend(slots);
                    continue;
                }
                kept = true;
                next_index = next_index.max(index + 1);
                let request: Vec<u8> = pieces.into_values().flat_map(|(_, bytes)| bytes).collect();
                found.push((
                    LoggedForward {
                        index,
                        session_id,
                        seq,
                        kind,
                        fill: flags & FLAG_FILL != 0,
                        retained: flags & FLAG_RETAINED != 0,
                        request,
                    },
                    slots,
                ));
            }
        }
        found.sort_unstable_by_key(|(forward, _)| forward.index);
        let mut used = vec![false; opened.slot_count as usize];
        for slot in found.iter().flat_map(|(_, slots)| slots) {
            if let Some(flag) = used.get_mut(*slot as usize) {
                *flag = true;
            }
        }
        let mut log = ForwardLog {
            server_id,
            chunk,
            slot_count: opened.slot_count,
            free: (0..opened.slot_count)
                .rev()
                .filter(|slot| !used[*slot as usize])
                .collect(),
            live: HashMap::new(),
            evictable: BTreeMap::new(),
            evictable_slots: 0,
            next_index,
            batches: NumberedBatches::default(),
        };
        let recovery = ForwardLogRecovery {
            discarded_slots: discarded.len() as u64,
            ..ForwardLogRecovery::default()
        };
        // Discarded slots are free already (not `used`); their records are cleared in the
        // first batch, before any write can reuse them (the writes come after in `work`).
        for slot in discarded {
            if slot < log.slot_count {
                log.batches.push(LogWork::Invalidate { slot });
            }
        }
        (log, found, recovery)
    }

    /// Slots a request of `len` bytes takes.
    fn slots_for(&self, len: usize) -> usize {
        len.div_ceil(self.chunk).max(1)
    }

    /// Whether a request of `len` bytes fits now (freeing retained requests if need be).
    pub(super) fn fits(&self, len: usize) -> bool {
        self.free.len() + self.evictable_slots >= self.slots_for(len)
    }

    /// Whether a request of `len` bytes could ever fit (the whole log, empty).
    pub(super) fn could_fit(&self, len: usize) -> bool {
        self.slots_for(len) <= self.slot_count as usize
    }

    /// Keep the slots of a request found at start-up: taken in again, or (`applied`, a
    /// retained one) kept until its slots are needed.
    pub(super) fn keep(&mut self, forward: &LoggedForward, slots: Vec<u32>, applied: bool) {
        let key = (forward.session_id, forward.seq);
        self.live.insert(
            key,
            Logged {
                index: forward.index,
                slots,
                durable: true,
                retained: forward.retained,
                content: content_of(forward.fill, &forward.request),
            },
        );
        if applied {
            self.applied(key);
        }
    }

    /// Request `key` is applied (durably): a forward's slots are freed, a retained request
    /// is kept until its slots are needed.
    pub(super) fn applied(&mut self, key: (u64, u32)) {
        let Some(logged) = self.live.get(&key) else {
            return;
        };
        if !logged.retained {
            self.release(key);
        } else if self.evictable.insert(logged.index, key).is_none() {
            self.evictable_slots += logged.slots.len();
        }
    }

    /// Free the oldest retained requests until `slots` slots are free.
    fn evict_for(&mut self, slots: usize) {
        while self.free.len() < slots {
            let Some((_, &key)) = self.evictable.first_key_value() else {
                return;
            };
            self.release(key);
        }
    }

    /// Whether request `key`'s record with forward index `index` is durable.
    pub(super) fn is_durable(&self, key: (u64, u32), index: u64) -> bool {
        self.live
            .get(&key)
            .is_some_and(|logged| logged.index == index && logged.durable)
    }

    /// Log a request to be forwarded: its forward index, and whether its record is durable
    /// already (a request forwarded again after the application had no room for it keeps its
    /// record and its place). One not durable yet goes out once [`ForwardLog::on_persisted`]
    /// says so. The caller checked [`ForwardLog::fits`].
    pub(super) fn append(
        &mut self,
        key: (u64, u32),
        kind: RequestKind,
        fill: bool,
        retained: bool,
        request: &[u8],
    ) -> (u64, bool) {
        let content = content_of(fill, request);
        if let Some(logged) = self.live.get(&key) {
            if logged.content == content {
                return (logged.index, logged.durable);
            }
            // Another request under that number (a fill where a request was): it replaces
            // the record. Nothing was applied from the old one, so a crash that leaves
            // neither loses nothing.
            self.release(key);
        }
        let index = self.next_index;
        self.next_index += 1;
        let parts = self.slots_for(request.len());
        self.evict_for(parts);
        let parts_u16 = u16::try_from(parts).expect("a request fits in u16::MAX slots");
        let chunks: Vec<&[u8]> = if request.is_empty() {
            vec![&[][..]]
        } else {
            request.chunks(self.chunk).collect()
        };
        let mut slots = Vec::with_capacity(parts);
        for (part, bytes) in chunks.into_iter().enumerate() {
            let slot = self.free.pop().expect("the caller checked that it fits");
            let mut packet = Vec::with_capacity(FORWARD_RECORD_HEADER_LEN + bytes.len());
            packet.extend_from_slice(&index.to_le_bytes());
            packet.extend_from_slice(&parts_u16.to_le_bytes());
            packet.push(match kind {
                RequestKind::Update => 1,
                RequestKind::Bypass => 2,
            });
            packet
                .push(if fill { FLAG_FILL } else { 0 } | if retained { FLAG_RETAINED } else { 0 });
            packet.extend_from_slice(bytes);
            self.batches.push(LogWork::Write {
                slot,
                key: EntryKey {
                    server_id: self.server_id,
                    session_id: key.0,
                    seq: key.1,
                    fragment_index: part as u16,
                },
                return_address: None,
                packet: packet.into(),
            });
            slots.push(slot);
        }
        self.live.insert(
            key,
            Logged {
                index,
                slots,
                durable: false,
                retained,
                content,
            },
        );
        self.batches.wait((key, index));
        (index, false)
    }

    /// Request `key` is applied (durably): its slots are freed.
    pub(super) fn release(&mut self, key: (u64, u32)) {
        if let Some(logged) = self.live.remove(&key) {
            if self.evictable.remove(&logged.index).is_some() {
                self.evictable_slots -= logged.slots.len();
            }
            for slot in logged.slots {
                self.batches.push(LogWork::Invalidate { slot });
                self.free.push(slot);
            }
        }
    }

    /// Give up the copies of requests of `sessions` received from a primary and applied
    /// (`hold.rs`). Returns the sessions of which a record must stay (a request not applied
    /// yet, or one this server forwarded), and those of which copies were given up.
    pub(super) fn give_up_retained_of(
        &mut self,
        sessions: &HashSet<u64>,
    ) -> (HashSet<u64>, HashSet<u64>) {
        let mut kept = HashSet::new();
        let mut released = Vec::new();
        for (&key, logged) in &self.live {
            if !sessions.contains(&key.0) {
                continue;
            }
            if logged.retained && self.evictable.contains_key(&logged.index) {
                released.push(key);
            } else {
                kept.insert(key.0);
            }
        }
        let mut released_sessions = HashSet::new();
        for key in released {
            released_sessions.insert(key.0);
            self.release(key);
        }
        (kept, released_sessions)
    }

    /// The batch to wait for to be sure of every release asked for so far (`None`: all
    /// durable).
    pub(super) fn pushed_through(&self) -> Option<u64> {
        self.batches.pushed_through()
    }

    /// The work asked for since the last batch, as the next numbered batch.
    pub(super) fn poll_persist(&mut self) -> Option<PersistBatch<LogWork>> {
        self.batches.poll()
    }

    /// Batches through `through` are durable: the forwards that may go now.
    pub(super) fn on_persisted(&mut self, through: u64) -> Vec<Waiting> {
        let mut ready = Vec::new();
        for (key, index) in self.batches.durable_through(through) {
            match self.live.get_mut(&key) {
                Some(logged) if logged.index == index => logged.durable = true,
                // Applied already? Not before it was sent; released otherwise.
                _ => continue,
            }
            ready.push((key, index));
        }
        ready
    }

    /// Requests logged and not yet applied.
    pub(super) fn live_len(&self) -> usize {
        self.live.len()
    }

    /// Free slots.
    pub(super) fn free_len(&self) -> usize {
        self.free.len()
    }
}

impl super::Server {
    /// A primary server (`config.replicas` not empty) whose store recovered `sessions` and
    /// whose forward log is `opened`: every request the log holds that the store has not
    /// applied is taken in again, ahead of anything that arrives, in the order it was first
    /// forwarded. Panics if the log cannot hold the largest request (`request_len_max`): a
    /// bug of the caller, which sizes the log.
    pub fn with_forward_log(
        config: super::ServerConfig,
        now: crate::Time,
        sessions: impl IntoIterator<Item = super::RecoveredSession>,
        opened: ForwardLogOpened,
    ) -> (super::Server, ForwardLogRecovery) {
        let request_len_max = config.request_len_max;
        let server_id = config.server_id;
        let mut server = super::Server::new(config, now, sessions);
        let (mut log, found, mut recovery) = ForwardLog::open(server_id, opened);
        assert!(
            log.could_fit(request_len_max),
            "a forward log of {} slots of {} bytes cannot hold a request of {request_len_max} bytes",
            log.slot_count,
            log.chunk
        );
        let primary = server.is_primary();
        let mut resend = Vec::new();
        for (forward, slots) in found {
            let applied = server.last_applied(forward.session_id) >= forward.seq;
            if applied {
                // Applied before the restart: a forward's slots are freed, a retained request
                // is kept until its slots are needed; a replica promoted sends those again.
                recovery.applied += 1;
                log.keep(&forward, slots, true);
                if primary && forward.retained {
                    resend.push(forward);
                }
                continue;
            }
            if !primary
                || server
                    .table
                    .get_or_create(now, forward.session_id, &|_, _| false)
                    .is_none()
            {
                // A replica's request from its primary, not applied: applied from this
                // record when the primary sends it again.
                recovery.kept += 1;
                log.keep(&forward, slots, false);
                continue;
            }
            let index_slots = slots;
            let mut assembly =
                super::table::Assembly::whole(forward.kind, forward.fill, forward.request.clone());
            server.requests_completed += 1;
            assembly.completed = server.requests_completed;
            server.table.buffered_bytes += assembly.cost();
            let session = server
                .table
                .sessions
                .get_mut(&forward.session_id)
                .expect("created above");
            session.buffered_bytes += assembly.cost();
            session.note_seen(forward.seq, now);
            session.pending.insert(forward.seq, assembly);
            log.keep(&forward, index_slots, false);
            recovery.requests += 1;
        }
        server.forward_log = Some(log);
        for forward in resend {
            if server.resend_applied_to_replicas(now, &forward) {
                recovery.resent_to_replicas += 1;
            }
        }
        if server.recovery.is_none() {
            server.issue_in_arrival_order(now);
        }
        (server, recovery)
    }

    /// The forward log work asked for since the last batch, if any, as the next numbered
    /// batch (a primary with a forward log only). Carry it out in order (with
    /// [`pmnet_pm::PmLog::persist_batch`]) and report it with [`super::Server::on_persisted`].
    #[must_use]
    pub fn poll_persist(&mut self) -> Option<PersistBatch<LogWork>> {
        self.forward_log.as_mut()?.poll_persist()
    }

    /// Forward log batches through `through` are durable: what waited on them is forwarded
    /// (a primary) or applied (a replica), and hold replies that waited are sent.
    pub fn on_persisted(&mut self, now: crate::Time, through: u64) {
        self.send_logged_forwards(now, through);
        self.release_retained();
        self.unstall(now);
        let replies = self.hold_replies_waiting.durable_through(through);
        self.transmits.extend(replies);
    }

    /// A replica's primary asks which of the listed sessions it holds copies of (`hold.rs`):
    /// the copies of requests it applied are given up, except for a session active within
    /// the keeping time, or with a request not applied yet (answered held). The answer goes
    /// once the release is durable: a crash before would bring the copies back.
    pub(super) fn on_primary_hold_query(
        &mut self,
        now: crate::Time,
        from: std::net::SocketAddr,
        header: &pmnet_wire::Header,
        payload: &[u8],
    ) {
        let Ok(sessions) = pmnet_wire::decode_hold_query_payload(payload) else {
            self.count_drop(crate::DropReason::BadPayload);
            return;
        };
        self.counters.primary_hold_queries += 1;
        let keep = self.holds.keep();
        let waiting: HashSet<u64> = self
            .retained_waiting
            .iter()
            .map(|(request, _)| request.session_id)
            .collect();
        let busy = |session_id: u64| {
            waiting.contains(&session_id)
                || self
                    .table
                    .sessions
                    .get(&session_id)
                    .is_some_and(|session| now < session.last_active + keep)
        };
        let given_up: HashSet<u64> = sessions.iter().copied().filter(|&s| !busy(s)).collect();
        let kept = match self.forward_log.as_mut() {
            Some(log) => log.give_up_retained_of(&given_up).0,
            None => HashSet::new(),
        };
        let held: Vec<bool> = sessions
            .iter()
            .map(|session_id| !given_up.contains(session_id) || kept.contains(session_id))
            .collect();
        let reply = pmnet_wire::Header::new(
            pmnet_wire::PacketType::HoldReply,
            self.config.server_id,
            0,
            header.seq,
        )
        .encode(&pmnet_wire::encode_hold_reply_payload(&held));
        let reply = crate::Transmit {
            destination: from,
            bytes: reply,
        };
        match self
            .forward_log
            .as_ref()
            .and_then(ForwardLog::pushed_through)
        {
            None => self.transmits.push_back(reply),
            Some(needed) => {
                if self.hold_replies_waiting.hold(needed, reply).is_err() {
                    // The primary asks again in its next round.
                    self.count_drop(crate::DropReason::QueueFull);
                }
            }
        }
    }

    /// A replica hands a request on: one from its primary is kept in the forward log first
    /// and applied once its record is durable (after a promotion it can send it to the other
    /// replicas, which may lack it); requests stay in order behind one that waits.
    pub(super) fn apply_as_replica(&mut self, request: super::Issued) {
        let index = match (self.forward_log.as_mut(), request.from_primary) {
            (Some(log), true) => {
                let key = (request.session_id, request.seq);
                Some(
                    log.append(key, request.kind, request.fill, true, &request.request)
                        .0,
                )
            }
            _ => None,
        };
        self.retained_waiting.push_back((request, index));
        self.release_retained();
    }

    /// Hand the application every request at the front of the replica's queue whose record
    /// is durable (or that needs none).
    fn release_retained(&mut self) {
        while let Some((request, index)) = self.retained_waiting.front() {
            let durable = match (index, self.forward_log.as_ref()) {
                (Some(index), Some(log)) => {
                    log.is_durable((request.session_id, request.seq), *index)
                }
                _ => true,
            };
            if !durable {
                return;
            }
            let (request, _) = self.retained_waiting.pop_front().expect("looked at");
            self.events.push_back(super::ServerEvent::Apply {
                session_id: request.session_id,
                seq: request.seq,
                kind: request.kind,
                request: request.request,
            });
        }
    }

    /// Take back every request of `session_id` waiting for its record (the application had
    /// no room for an earlier one): (seq, kind, request).
    pub(super) fn take_retained_of(&mut self, session_id: u64) -> Vec<(u32, RequestKind, Vec<u8>)> {
        let (taken, kept) = std::mem::take(&mut self.retained_waiting)
            .into_iter()
            .partition(|(request, _)| request.session_id == session_id);
        self.retained_waiting = kept;
        taken
            .into_iter()
            .map(|(request, _): (super::Issued, _)| (request.seq, request.kind, request.request))
            .collect()
    }

    /// A request this server applied as a replica, found in its log after it started as a
    /// primary: sent to its replicas (as a duplicate is), held until each acked. Whether it
    /// was.
    fn resend_applied_to_replicas(&mut self, now: crate::Time, forward: &LoggedForward) -> bool {
        let key = (forward.session_id, forward.seq);
        let datagrams = if forward.fill {
            vec![pmnet_wire::encode_noop_fill(
                self.config.server_id,
                forward.session_id,
                forward.seq,
            )]
        } else {
            let header = pmnet_wire::Header::new(
                forward.kind.packet_type(),
                self.config.server_id,
                forward.session_id,
                forward.seq,
            );
            crate::encode_fragments(header, &forward.request, self.datagram_budget())
                .unwrap_or_default()
        };
        let mut held = false;
        for (fragment, bytes) in datagrams.iter().enumerate() {
            let fragment = u16::try_from(fragment).unwrap_or(u16::MAX);
            let Some(acked) = self.hold_makeup(now, key, None, fragment, bytes) else {
                return held;
            };
            held = true;
            self.send_to_replicas(std::slice::from_ref(bytes), acked);
        }
        held
    }

    /// Requests in the forward log (forwarded or about to be, not applied yet) and free
    /// slots; `None` without a forward log.
    pub fn forward_log_usage(&self) -> Option<(usize, usize)> {
        self.forward_log
            .as_ref()
            .map(|log| (log.live_len(), log.free_len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmnet_pm::{PmLog, SimRegion};

    const SLOTS: u32 = 16;
    const SLOT_SIZE: u32 = 256;

    fn empty_log() -> PmLog<SimRegion> {
        let len = PmLog::<SimRegion>::required_region_len(SLOTS, SLOT_SIZE);
        PmLog::format(SimRegion::new(len), SLOTS, SLOT_SIZE).expect("format")
    }

    fn reopen(log: PmLog<SimRegion>) -> (PmLog<SimRegion>, ForwardLog, Found, ForwardLogRecovery) {
        let region = log.region().crash_losing_unpersisted();
        let (log, recovery) = PmLog::open(region).expect("reopen");
        let opened = ForwardLogOpened {
            slot_count: log.slot_count(),
            max_packet_len: log.max_packet_len(),
            entries: recovery.entries,
        };
        let (forward_log, found, recovered) = ForwardLog::open(3, opened);
        (log, forward_log, found, recovered)
    }

    fn persist_all(log: &mut PmLog<SimRegion>, forward_log: &mut ForwardLog) -> Vec<u64> {
        let mut sent = Vec::new();
        while let Some(batch) = forward_log.poll_persist() {
            log.persist_batch(&batch.work);
            sent.extend(
                forward_log
                    .on_persisted(batch.number)
                    .into_iter()
                    .map(|(_, index)| index),
            );
        }
        sent
    }

    #[test]
    fn requests_come_back_in_forward_order_whole_and_applied_ones_do_not() {
        let (mut log, mut forward_log, found, _) = reopen(empty_log());
        assert!(found.is_empty());
        let large: Vec<u8> = (0..forward_log.chunk * 2 + 10)
            .map(|byte| byte as u8)
            .collect();
        assert_eq!(
            forward_log.slots_for(large.len()),
            3,
            "a request over three slots"
        );
        let a = forward_log.append((9, 2), RequestKind::Update, false, false, &large);
        let b = forward_log.append((5, 7), RequestKind::Bypass, false, false, b"read");
        let c = forward_log.append((9, 3), RequestKind::Bypass, true, false, b"");
        assert_eq!(
            forward_log.append((5, 7), RequestKind::Bypass, false, false, b"read"),
            (b.0, false),
            "forwarded again: the same record and place"
        );
        assert_eq!(persist_all(&mut log, &mut forward_log), vec![a.0, b.0, c.0]);
        forward_log.release((5, 7));
        persist_all(&mut log, &mut forward_log);
        assert_eq!(forward_log.free_len(), SLOTS as usize - 4);
        let (_, forward_log, found, recovery) = reopen(log);
        assert_eq!(recovery.discarded_slots, 0);
        let found: Vec<LoggedForward> = found.into_iter().map(|(forward, _)| forward).collect();
        assert_eq!(
            found,
            vec![
                LoggedForward {
                    index: a.0,
                    session_id: 9,
                    seq: 2,
                    kind: RequestKind::Update,
                    fill: false,
                    retained: false,
                    request: large,
                },
                LoggedForward {
                    index: c.0,
                    session_id: 9,
                    seq: 3,
                    kind: RequestKind::Bypass,
                    fill: true,
                    retained: false,
                    request: Vec::new(),
                },
            ]
        );
        assert_eq!(forward_log.next_index, c.0 + 1, "new forwards come after");
    }

    #[test]
    fn a_request_missing_a_part_or_with_a_damaged_record_is_freed_not_taken_back() {
        let (mut log, mut forward_log, ..) = reopen(empty_log());
        let three_parts = vec![7; forward_log.chunk * 3];
        forward_log.append((1, 1), RequestKind::Update, false, false, &three_parts);
        forward_log.append((1, 2), RequestKind::Update, false, false, b"whole");
        persist_all(&mut log, &mut forward_log);
        // A part lost (as if its write never completed) and a record the log's checksum
        // accepts but that does not parse.
        let lost = forward_log.live[&(1, 1)].slots[1];
        log.persist_batch(&[LogWork::Invalidate { slot: lost }]);
        log.persist_batch(&[LogWork::Write {
            slot: 15,
            key: EntryKey {
                server_id: 3,
                session_id: 4,
                seq: 4,
                fragment_index: 0,
            },
            return_address: None,
            packet: vec![0xff; 40].into(),
        }]);
        let (_, mut forward_log, found, recovery) = reopen(log);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0.request, b"whole");
        assert_eq!(
            recovery.discarded_slots, 3,
            "two parts left and the damaged record"
        );
        assert_eq!(forward_log.free_len(), SLOTS as usize - 1);
        let first = forward_log.batches.poll().expect("the clearing batch");
        assert_eq!(first.work.len(), 3, "their records are cleared first");
    }

    #[test]
    fn any_bytes_in_a_slot_are_handled_without_panicking() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for round in 0..200u32 {
            let mut log = empty_log();
            for slot in 0..SLOTS {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let len = (rng % 80) as usize;
                let mut packet: Vec<u8> = (0..len).map(|i| (rng >> (i % 56)) as u8).collect();
                if round % 2 == 0 && packet.len() >= 12 {
                    packet[8] = (rng % 3) as u8;
                    packet[9] = 0;
                    packet[10] = 1 + (rng % 2) as u8;
                    packet[11] = (rng % 2) as u8;
                }
                log.persist_batch(&[LogWork::Write {
                    slot,
                    key: EntryKey {
                        server_id: 3,
                        session_id: rng % 3,
                        seq: (rng % 4) as u32,
                        fragment_index: (rng % 3) as u16,
                    },
                    return_address: None,
                    packet: packet.into(),
                }]);
            }
            let (_, forward_log, found, recovery) = reopen(log);
            let kept: usize = found.iter().map(|(_, slots)| slots.len()).sum();
            assert_eq!(
                kept + recovery.discarded_slots as usize,
                SLOTS as usize,
                "round {round}: every slot kept or freed"
            );
            assert_eq!(forward_log.free_len(), SLOTS as usize - kept);
        }
    }

    #[test]
    fn a_replica_keeps_what_it_applied_until_the_slots_are_needed_oldest_first() {
        let (mut log, mut forward_log, ..) = reopen(empty_log());
        for seq in 1..=SLOTS {
            assert!(forward_log.fits(5));
            forward_log.append((1, seq), RequestKind::Update, false, true, b"value");
            persist_all(&mut log, &mut forward_log);
            forward_log.applied((1, seq));
        }
        assert_eq!(forward_log.free_len(), 0);
        assert!(forward_log.fits(5), "the oldest applied one makes room");
        forward_log.append((2, 1), RequestKind::Update, false, true, b"new");
        persist_all(&mut log, &mut forward_log);
        assert!(!forward_log.live.contains_key(&(1, 1)), "the oldest went");
        assert!(forward_log.live.contains_key(&(1, 2)));
        // Not applied yet: never evicted.
        assert_eq!(forward_log.evictable_slots, SLOTS as usize - 1);
        // A different request under a number replaces its record.
        let (index, durable) = forward_log.append((2, 1), RequestKind::Bypass, true, true, b"");
        assert!(!durable);
        persist_all(&mut log, &mut forward_log);
        assert!(forward_log.is_durable((2, 1), index));
        let (_, _, found, _) = reopen(log);
        let retained: Vec<(u64, u32, bool)> = found
            .iter()
            .map(|(forward, _)| (forward.session_id, forward.seq, forward.fill))
            .filter(|(session, ..)| *session == 2)
            .collect();
        assert_eq!(retained, vec![(2, 1, true)]);
        assert!(found.iter().all(|(forward, _)| forward.retained));
    }
}

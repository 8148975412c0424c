//! Replicated servers (docs/replication.md, "Replicated servers"): a primary applies each
//! request, forwards it to its replica servers, and sends the server-ACK — which frees the
//! entries in every device and answers the client — only once every replica has applied it
//! durably.
//!
//! A replica is an ordinary server whose only device is the primary: it applies what the
//! primary forwards in each session's order, exactly once (its own session table), and answers
//! with a server-ACK, which the primary counts. The primary forwards every request it applies
//! (fills as fills) as it arrived — update or bypass, same session and number — behind a
//! barrier descriptor (`KEYED`, no key) whose order names the request the primary applied just
//! before it: a replica applies in the primary's order across sessions too, with the keyed-write
//! machinery every server has (see `order.rs`).
//!
//! The primary keeps what it forwarded until every replica acked it, but sends it again only
//! when asked: the server-ACK it holds back makes every device (or client) in front of it
//! resend the request, and a resent request that is already applied is forwarded again — as
//! first forwarded, to the replicas that have not acked it. One the primary no longer holds
//! (it restarted since) is forwarded as it arrived: a replica applies it if it lacks it, or
//! answers with a make-up ACK; the make-up ACK goes upstream once every replica acked. So loss
//! between primary and replicas, a replica's restart and the primary's own restart are all
//! repaired by the resends a device makes anyway, and an entry leaves a device's log only once
//! every replica holds the request. (Across sessions, a replica applies in the primary's order
//! except for requests the primary applied before a restart and forwards after it.)
//!
//! A replica skips a gap in what the primary forwards only when the primary holds none of it
//! for that replica (its fill queries are answered from what the primary holds back): a
//! request a device logged comes again from the device's resends long before a gap may be
//! skipped (docs/replication.md). What a replica may miss for good is a request no one
//! resends — applied by a primary that crashed before its replicas had it, never logged by a
//! device, its client gone or reporting it failed: never acknowledged to anyone, it is then
//! applied on the primary and not on that replica.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use pmnet_wire::cache::{WriteDescriptor, WriteOrder, KEYED};
use pmnet_wire::replication::FROM_PRIMARY;
use pmnet_wire::{flags, Header, PacketType};

use super::table::CachedReply;
use super::Server;
use crate::{encode_fragments, DropReason, RequestKind, Time, Transmit};

/// Most replica servers a primary forwards to.
pub const REPLICA_SERVERS_MAX: usize = 8;

/// Requests a primary holds (applied or being applied, not yet acked by every replica) at
/// most; beyond it, it hands nothing new to its application until replicas catch up, and
/// resent duplicates wait for their device's next resend.
pub const REPLICATION_PENDING_MAX: usize = 1 << 16;

/// Skipped numbers a primary tells its replicas about at once, per skip.
pub const SKIP_FILLS_MAX: usize = 1024;

/// What a primary counted about its replicas; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationCounters {
    /// Applied requests forwarded to the replicas (once each, to every replica).
    pub forwarded: u64,
    /// Resent duplicates of applied requests forwarded again to replicas that had not acked.
    pub duplicates_forwarded: u64,
    /// Replicas' acks counted.
    pub acks_received: u64,
    /// Replicas' acks for requests not held (late duplicates).
    pub acks_late: u64,
    /// Server-ACKs (and make-up ACKs) released once every replica acked.
    pub acks_released: u64,
    /// Replicas that answered with "skipped" (a replica that lost what it applied).
    pub replica_skips: u64,
    /// Times a session's next request waited because too many requests were held.
    pub stalls: u64,
    /// Resent fills of numbers the primary applied as real requests and no longer holds,
    /// forwarded to the replicas (one that lacks the request applies the fill).
    pub fills_for_real_requests: u64,
    /// Numbers skipped here and sent to the replicas as no-op fills.
    pub skips_forwarded: u64,
    /// Replicas' retransmission requests passed on to the session's device (or client).
    pub retransmit_requests_passed_on: u64,
    /// Replicas' retransmission requests for what is held here (the next resend brings it)
    /// or not applied yet.
    pub retransmit_requests_ignored: u64,
}

/// Bytes of forwarded requests a primary keeps (to forward again when a device resends) at
/// most; beyond it, as beyond [`REPLICATION_PENDING_MAX`] requests.
pub const REPLICATION_BYTES_MAX: usize = 64 << 20;

/// What the primary sends upstream once every replica acked.
#[derive(Debug)]
enum Release {
    /// The request's own server-ACK; `forwarded`: the datagrams sent to the replicas, sent
    /// again to those that have not acked when a device resends the request (with their
    /// order, so a replica applies in the primary's order whichever copy arrives).
    Ack {
        flags: u16,
        reply: Vec<u8>,
        forwarded: Vec<Vec<u8>>,
    },
    /// A make-up ACK for a resent duplicate (from the reply cache, as without replicas).
    Makeup,
}

#[derive(Debug)]
struct Pending {
    /// Where the server-ACK goes (the session's device or client).
    to: SocketAddr,
    /// Replicas that acked, one bit each.
    acked: u16,
    release: Release,
}

/// Replicas' fill queries a primary has open with its devices, at most.
pub const REPLICA_FILLS_MAX: usize = 4096;

/// A replica's fill query, asked of the primary's devices.
#[derive(Debug)]
struct ReplicaFill {
    last: u32,
    awaiting: std::collections::BTreeSet<SocketAddr>,
    held_from: u64,
}

/// A primary's state about its replicas.
#[derive(Debug, Default)]
pub(super) struct Replication {
    /// Replicas' fill queries open with the devices: (session, first, replica index).
    fills: HashMap<(u64, u32, usize), ReplicaFill>,
    /// Requests handed to the application, kept until applied (then forwarded) or handed back.
    issued: HashMap<(u64, u32), (RequestKind, Vec<u8>)>,
    /// Applied (or duplicates) waiting for replicas' acks.
    pending: HashMap<(u64, u32), Pending>,
    /// The request applied last: the next one forwarded follows it.
    last_applied: Option<(u64, u32)>,
    /// Sessions whose next request waits for room.
    stalled: BTreeSet<u64>,
    /// Bytes of `forwarded` datagrams and issued requests held.
    bytes: usize,
}

impl Replication {
    fn is_full(&self) -> bool {
        self.issued.len() + self.pending.len() >= REPLICATION_PENDING_MAX
            || self.bytes >= REPLICATION_BYTES_MAX
    }

    /// The application handed a request back: it was not applied.
    pub(super) fn issued_remove(&mut self, session_id: u64, seq: u32) {
        if let Some((_, request)) = self.issued.remove(&(session_id, seq)) {
            self.bytes -= request.len();
        }
    }

    fn remove_pending(&mut self, key: (u64, u32)) -> Option<Pending> {
        let pending = self.pending.remove(&key)?;
        if let Release::Ack { forwarded, .. } = &pending.release {
            self.bytes -= forwarded.iter().map(Vec::len).sum::<usize>();
        }
        Some(pending)
    }

    /// Requests held back for replicas right now.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

impl Server {
    fn replicas(&self) -> &[SocketAddr] {
        &self.config.replicas
    }

    pub(super) fn is_primary(&self) -> bool {
        !self.config.replicas.is_empty()
    }

    fn all_replicas_mask(&self) -> u16 {
        (1u16 << self.config.replicas.len()) - 1
    }

    /// Whether a session's next request may be handed to the application now; if not, the
    /// session waits for room.
    pub(super) fn replication_room(&mut self, session_id: u64) -> bool {
        if !self.is_primary() || !self.replication.is_full() {
            return true;
        }
        if self.replication.stalled.insert(session_id) {
            self.counters.replication.stalls += 1;
        }
        false
    }

    /// A request went to the application: keep it until it is applied.
    pub(super) fn replication_issued(
        &mut self,
        session_id: u64,
        seq: u32,
        kind: RequestKind,
        request: &[u8],
    ) {
        if self.is_primary() {
            self.replication.bytes += request.len();
            self.replication
                .issued
                .insert((session_id, seq), (kind, request.to_vec()));
        }
    }

    /// Request `seq` of `session_id` is applied: forward it to every replica and hold its
    /// server-ACK until they all acked. `false` without replicas (send the ACK now).
    pub(super) fn replicate_applied(
        &mut self,
        session_id: u64,
        seq: u32,
        ack_flags: u16,
        reply: &[u8],
        to: SocketAddr,
    ) -> bool {
        if !self.is_primary() {
            return false;
        }
        let (kind, request) = self
            .replication
            .issued
            .remove(&(session_id, seq))
            .unwrap_or((RequestKind::Update, Vec::new()));
        self.replication.bytes -= request.len();
        let fill = ack_flags & flags::SKIPPED != 0;
        let mut header = Header::new(
            match kind {
                RequestKind::Update => PacketType::UpdateRequest,
                RequestKind::Bypass => PacketType::BypassRequest,
            },
            self.config.server_id,
            session_id,
            seq,
        );
        let mut payload = Vec::new();
        if fill {
            header.flags = flags::NOOP_FILL;
        } else {
            header.flags = KEYED | FROM_PRIMARY;
            let (after_session, after_seq) = self.replication.last_applied.unwrap_or((0, 0));
            let descriptor = WriteDescriptor {
                order: WriteOrder {
                    after_session,
                    after_seq,
                    stamp: 0,
                },
                key: &[],
                reply_after: None,
                afters: &[],
            };
            payload.reserve(descriptor.len() + request.len());
            descriptor.emit(&mut payload);
            payload.extend_from_slice(&request);
        }
        self.replication.last_applied = Some((session_id, seq));
        self.counters.replication.forwarded += 1;
        // A request the server took in fits in as many fragments again, with the descriptor.
        let forwarded =
            encode_fragments(header, &payload, self.datagram_budget()).unwrap_or_default();
        self.send_to_replicas(&forwarded, 0);
        self.replication.bytes += forwarded.iter().map(Vec::len).sum::<usize>();
        self.replication.pending.insert(
            (session_id, seq),
            Pending {
                to,
                acked: 0,
                release: Release::Ack {
                    flags: ack_flags,
                    reply: reply.to_vec(),
                    forwarded,
                },
            },
        );
        true
    }

    fn send_to_replicas(&mut self, datagrams: &[Vec<u8>], acked: u16) {
        for (index, &replica) in self.config.replicas.iter().enumerate() {
            if acked & (1 << index) != 0 {
                continue;
            }
            for bytes in datagrams {
                self.transmits.push_back(Transmit {
                    destination: replica,
                    bytes: bytes.clone(),
                });
            }
        }
    }

    /// A resent fragment of a request already applied: forward it again to the replicas that
    /// have not acked it; the (make-up) ACK goes to `from` once every replica did. `false`
    /// without replicas (answer it now).
    pub(super) fn replicate_duplicate(
        &mut self,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) -> bool {
        if !self.is_primary() {
            return false;
        }
        let key = (header.session_id, header.seq);
        if let Some(pending) = self.replication.pending.get_mut(&key) {
            pending.to = from;
            if let Release::Ack { forwarded, .. } = &pending.release {
                // Sent again as first forwarded (with its order, or as the fill it was);
                // once per resend of its first fragment.
                if header.fragment_index == 0 {
                    let (acked, forwarded) = (pending.acked, forwarded.clone());
                    self.counters.replication.duplicates_forwarded += 1;
                    self.send_to_replicas(&forwarded, acked);
                }
                return true;
            }
        }
        // Not held: forwarded as what this primary applied under that number, as far as it
        // remembers (a fill or the request), as it arrived if it does not remember.
        let applied_as_fill = self
            .table
            .sessions
            .get(&header.session_id)
            .is_some_and(|s| {
                s.was_skipped(header.seq)
                    || s.replies
                        .iter()
                        .any(|(seq, reply)| *seq == header.seq && *reply == CachedReply::Skipped)
            });
        let bytes = match (header.has_flag(flags::NOOP_FILL), applied_as_fill) {
            // Its client gave up on a number this server applied for real and holds no more:
            // a replica that has the request applies it (a whole request is kept over a
            // fill); one that lacks it — no one resends it: it was never acknowledged —
            // applies the fill now rather than skip it after its own gap timeout.
            (true, false) => {
                self.counters.replication.fills_for_real_requests += 1;
                header.encode(payload)
            }
            (false, true) if header.fragment_index != 0 => return true,
            (false, true) => {
                // The client's fill came first and was applied: the replicas apply it too.
                let mut fill = Header::new(
                    PacketType::BypassRequest,
                    header.server_id,
                    header.session_id,
                    header.seq,
                );
                fill.flags = flags::NOOP_FILL;
                fill.encode(&[])
            }
            _ => header.encode(payload),
        };
        let full = self.replication.is_full();
        let acked = match self.replication.pending.get(&key) {
            Some(pending) => pending.acked,
            None if full => {
                self.count_drop(DropReason::ReplicationFull);
                return true;
            }
            None => {
                self.replication.pending.insert(
                    key,
                    Pending {
                        to: from,
                        acked: 0,
                        release: Release::Makeup,
                    },
                );
                0
            }
        };
        self.counters.replication.duplicates_forwarded += 1;
        for (index, &replica) in self.config.replicas.iter().enumerate() {
            if acked & (1 << index) == 0 {
                self.transmits.push_back(Transmit {
                    destination: replica,
                    bytes: bytes.clone(),
                });
            }
        }
        true
    }

    /// Numbers `first ..= last` of `session_id` were skipped here (no one could supply them):
    /// tell the replicas at once, as no-op fills they apply in their place (at most
    /// [`SKIP_FILLS_MAX`]; a fill lost on the way, or one beyond that, the replica finds
    /// with its own gap timer, which this primary answers with "not held").
    pub(super) fn replicate_skip(&mut self, session_id: u64, first: u32, last: u32) {
        if !self.is_primary() {
            return;
        }
        for seq in (first..=last).take(SKIP_FILLS_MAX) {
            // As a client's no-op fill: a bypass request (no device logs it).
            let mut header = Header::new(
                PacketType::BypassRequest,
                self.config.server_id,
                session_id,
                seq,
            );
            header.flags = flags::NOOP_FILL;
            let bytes = header.encode(&[]);
            self.counters.replication.skips_forwarded += 1;
            for &replica in &self.config.replicas {
                self.transmits.push_back(Transmit {
                    destination: replica,
                    bytes: bytes.clone(),
                });
            }
        }
    }

    /// Whether `from` is one of this primary's replicas.
    pub(super) fn replica_index(&self, from: SocketAddr) -> Option<usize> {
        self.replicas().iter().position(|&replica| replica == from)
    }

    /// A replica's server-ACK (any fragment: it is sent only once the request is applied).
    pub(super) fn on_replica_ack(&mut self, now: Time, replica: usize, header: &Header) {
        let key = (header.session_id, header.seq);
        let all = self.all_replicas_mask();
        let Some(pending) = self.replication.pending.get_mut(&key) else {
            self.counters.replication.acks_late += 1;
            return;
        };
        self.counters.replication.acks_received += 1;
        let real =
            matches!(pending.release, Release::Ack { flags: f, .. } if f & flags::SKIPPED == 0);
        if real && header.has_flag(flags::SKIPPED) {
            self.counters.replication.replica_skips += 1;
        }
        pending.acked |= 1 << replica;
        if pending.acked != all {
            return;
        }
        let pending = self
            .replication
            .remove_pending(key)
            .expect("looked up above");
        self.counters.replication.acks_released += 1;
        match pending.release {
            Release::Ack { flags, reply, .. } => {
                self.send_server_ack(key.0, key.1, flags, &reply, pending.to)
            }
            Release::Makeup => {
                if self.table.sessions.contains_key(&key.0) {
                    self.send_makeup_ack(key.0, key.1, pending.to);
                }
            }
        }
        if !self.replication.is_full() && !self.replication.stalled.is_empty() {
            let stalled = std::mem::take(&mut self.replication.stalled);
            for session_id in stalled {
                self.advance(now, session_id);
            }
        }
    }

    /// A replica's gap outlived every request's lifetime and it asks whether to skip
    /// `header.seq ..= last`. Held here (for it): no. Otherwise the primary's devices are
    /// asked, as for its own gaps — a device that holds one resends it (it comes on to the
    /// replica) — and the replica gets the answer once each device gave its own; without
    /// devices, at once.
    fn on_replica_fill_query(&mut self, from: SocketAddr, header: &Header, last: u32) {
        let Some(replica) = self.replica_index(from) else {
            return;
        };
        let session_id = header.session_id;
        let first = header.seq;
        let held_here = (first..=last).take(1 << 16).find(|&seq| {
            self.replication
                .pending
                .get(&(session_id, seq))
                .is_some_and(|pending| pending.acked & (1 << replica) == 0)
        });
        if held_here.is_some() || self.config.devices.is_empty() {
            let held_from = held_here.unwrap_or(last.wrapping_add(1));
            self.send_replica_fill_reply(from, session_id, first, last, held_from);
            return;
        }
        let key = (session_id, first, replica);
        if !self.replication.fills.contains_key(&key) {
            if self.replication.fills.len() >= REPLICA_FILLS_MAX {
                // Queries a device never answered (it is down) pile up: forget them all;
                // each replica asks again at its next gap timeout.
                self.replication.fills.clear();
            }
            self.replication.fills.insert(
                key,
                ReplicaFill {
                    last,
                    awaiting: self.config.devices.iter().copied().collect(),
                    held_from: u64::from(last) + 1,
                },
            );
        }
        let query = Header::new(
            PacketType::FillQuery,
            self.config.server_id,
            session_id,
            first,
        );
        let bytes = query.encode(&pmnet_wire::encode_fill_query_payload(last));
        for &device in &self.config.devices {
            self.transmits.push_back(Transmit {
                destination: device,
                bytes: bytes.clone(),
            });
        }
    }

    fn send_replica_fill_reply(
        &mut self,
        to: SocketAddr,
        session_id: u64,
        first: u32,
        last: u32,
        held_from: u32,
    ) {
        let reply = Header::new(
            PacketType::FillReply,
            self.config.server_id,
            session_id,
            first,
        );
        let bytes = reply.encode(&pmnet_wire::encode_fill_reply_payload(last, held_from));
        self.transmits.push_back(Transmit {
            destination: to,
            bytes,
        });
    }

    /// A device's fill reply that answers replicas' fill queries (`true`; the replica is
    /// answered once every device did), or none (`false`: the server's own).
    pub(super) fn on_device_fill_reply_for_replicas(
        &mut self,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) -> bool {
        let Ok((last, held_from)) = pmnet_wire::decode_fill_reply_payload(payload) else {
            return false;
        };
        let mut answered = false;
        for replica in 0..self.config.replicas.len() {
            let key = (header.session_id, header.seq, replica);
            let Some(fill) = self.replication.fills.get_mut(&key) else {
                continue;
            };
            if fill.last != last || !fill.awaiting.remove(&from) {
                continue;
            }
            answered = true;
            if (header.seq..=last).contains(&held_from) {
                fill.held_from = fill.held_from.min(u64::from(held_from));
            }
            if fill.awaiting.is_empty() {
                let fill = self
                    .replication
                    .fills
                    .remove(&key)
                    .expect("looked up above");
                let held_from = u32::try_from(fill.held_from).unwrap_or(last.wrapping_add(1));
                let to = self.config.replicas[replica];
                self.send_replica_fill_reply(to, header.session_id, header.seq, last, held_from);
            }
        }
        answered
    }

    /// A replica misses a request this primary applied and holds no more (or one it holds:
    /// the next resend brings it). Asked of where the session's requests come from, as the
    /// primary asks for its own gaps: a device answers from its log or asks the client, which
    /// sends the request again, or its no-op fill; either comes back here as a duplicate and
    /// goes on to the replica. Paid for from the session's credit unless it comes through
    /// one of this server's devices.
    fn pass_on_retransmit_request(&mut self, header: &Header) {
        let key = (header.session_id, header.seq);
        let Some(session) = self.table.sessions.get(&header.session_id) else {
            self.counters.replication.retransmit_requests_ignored += 1;
            return;
        };
        if header.seq > session.last_applied || self.replication.pending.contains_key(&key) {
            self.counters.replication.retransmit_requests_ignored += 1;
            return;
        }
        let Some(to) = session.reply_to else {
            self.counters.replication.retransmit_requests_ignored += 1;
            return;
        };
        if !self.is_device(to) {
            let cost = pmnet_wire::HEADER_LEN as u32;
            let session = self
                .table
                .sessions
                .get_mut(&header.session_id)
                .expect("looked up above");
            if session.credit_bytes < cost {
                self.counters.retransmit_requests_unpaid += 1;
                return;
            }
            session.credit_bytes -= cost;
        }
        self.counters.replication.retransmit_requests_passed_on += 1;
        self.transmits.push_back(Transmit {
            destination: to,
            bytes: header.encode(&[]),
        });
    }

    /// A datagram from a replica other than a server-ACK: its recovery poll is answered at
    /// once (the devices resend what is missing), its fill queries from what is held back for
    /// it, its retransmission requests by passing them on where the requests come from.
    pub(super) fn on_replica_message(&mut self, from: SocketAddr, header: &Header, payload: &[u8]) {
        let server_id = self.config.server_id;
        match header.packet_type {
            PacketType::RecoveryPoll => {
                let done = Header::new(PacketType::RecoveryDone, server_id, 0, header.seq);
                let bytes = done.encode(&pmnet_wire::encode_recovery_done_payload(0));
                self.transmits.push_back(Transmit {
                    destination: from,
                    bytes,
                });
            }
            PacketType::FillQuery => {
                let Ok(last) = pmnet_wire::decode_fill_query_payload(payload) else {
                    self.count_drop(DropReason::BadPayload);
                    return;
                };
                self.on_replica_fill_query(from, header, last);
            }
            PacketType::RetransmitRequest => self.pass_on_retransmit_request(header),
            _ => self.count_drop(DropReason::UnexpectedType),
        }
    }
}

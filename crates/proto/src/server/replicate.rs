//! Replicated servers (docs/replication.md, "Replicated servers"): a primary forwards each
//! request, in the order it hands requests to its application, to its replica servers, and
//! applies it only once every replica has applied it durably; only then does it send the
//! server-ACK, which frees the entries in every device and answers the client.
//!
//! A replica is an ordinary server whose only device is the primary: it applies what the
//! primary forwards in each session's order, exactly once (its own session table), and answers
//! with a server-ACK, which the primary counts. The primary forwards each request (fills as
//! fills) with its session and number, update or bypass, behind a barrier descriptor (`KEYED`,
//! no key) whose order names the request forwarded just before it and flag `FROM_PRIMARY`: a
//! replica applies in the primary's order across sessions too, with the keyed-write machinery
//! every server has (see `order.rs`). The primary applies in the same order.
//!
//! Replicating before applying means that what the primary applied, every replica holds: a
//! primary that crashes loses only requests it had not applied, which its devices (or clients)
//! send again, and a promoted replica holds everything its primary applied. The primary keeps
//! what it forwarded until every replica acked it and sends it again when a device resends the
//! request or a replica asks for it. A resent request the primary already applied is forwarded
//! as it arrived, to every replica, and its make-up ACK goes upstream once all acked: after a
//! promotion, a replica may lack what the new primary applied while it was a replica itself.
//!
//! A replica skips a gap only when the primary says it holds none of it and no device in front
//! of the primary holds it either (the primary asks them); the primary tells its replicas at
//! once what it skips itself.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::cache::{WriteDescriptor, WriteOrder, KEYED};
use pmnet_wire::replication::FROM_PRIMARY;
use pmnet_wire::{flags, Header, PacketType};

use super::table::CachedReply;
use super::{Server, ServerEvent};
use crate::{encode_fragments, DropReason, RequestKind, Time, Transmit};

/// Sessions unknown here that replicas asked about, remembered at most (past it the oldest
/// answers are forgotten, and those sessions asked about afresh).
const UNKNOWN_ASKED_MAX: usize = 4096;

/// Most replica servers a primary forwards to.
pub const REPLICA_SERVERS_MAX: usize = 8;

/// Requests a primary holds for its replicas (forwarded and not yet acked by every one) at
/// most; beyond it, it forwards nothing new until replicas catch up, and resent duplicates
/// wait for their device's next resend.
pub const REPLICATION_PENDING_MAX: usize = 1 << 16;

/// Bytes of forwarded requests a primary keeps at most; beyond it, as beyond
/// [`REPLICATION_PENDING_MAX`] requests.
pub const REPLICATION_BYTES_MAX: usize = 64 << 20;

/// Skipped numbers a primary tells its replicas about at once, per skip.
pub const SKIP_FILLS_MAX: usize = 1024;

/// Replicas' fill queries a primary has open with its devices, at most.
pub const REPLICA_FILLS_MAX: usize = 4096;

/// What a primary counted about its replicas; monotonically increasing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationCounters {
    /// Requests forwarded to the replicas (once each, to every replica).
    pub forwarded: u64,
    /// Forwarded requests sent again (a device resent the request, or a replica asked).
    pub forwards_resent: u64,
    /// Resent duplicates of applied requests forwarded to the replicas.
    pub duplicates_forwarded: u64,
    /// Replicas' acks counted.
    pub acks_received: u64,
    /// Replicas' acks for requests not held (late duplicates).
    pub acks_late: u64,
    /// Requests handed to the application once every replica acked them.
    pub released: u64,
    /// Make-up ACKs sent once every replica acked.
    pub makeups_released: u64,
    /// Replicas that answered a request with "skipped" (one that lost its store).
    pub replica_skips: u64,
    /// Times a session's next request waited because too many requests were held.
    pub stalls: u64,
    /// Resent fills of numbers the primary applied as real requests, forwarded to the
    /// replicas (one that has the request keeps it).
    pub fills_for_real_requests: u64,
    /// Numbers skipped here and sent to the replicas as no-op fills.
    pub skips_forwarded: u64,
    /// Fills forwarded for numbers a replica had applied as the request itself (forwarded
    /// before a crash of this primary that lost it): that request differs between them.
    pub fill_conflicts: u64,
    /// Replicas' retransmission requests passed on to the session's device (or client).
    pub retransmit_requests_passed_on: u64,
    /// Replicas' retransmission requests for what is on its way.
    pub retransmit_requests_ignored: u64,
}

/// A request forwarded to the replicas, not yet applied here.
#[derive(Debug)]
struct Forwarded {
    kind: RequestKind,
    /// As the application gets it.
    request: Vec<u8>,
    /// As the replicas got it.
    datagrams: Vec<Vec<u8>>,
    /// Forwarded as a no-op fill.
    fill: bool,
    /// Replicas that acked, one bit each.
    acked: u16,
    /// Sent to the replicas (with a forward log, only once its record is durable).
    sent: bool,
    /// Its forward index in the primary's forward log, if it keeps one.
    log_index: Option<u64>,
    /// When it is sent again to the replicas that have not acked, and the wait after that.
    resend_at: Time,
    interval: Duration,
}

/// A request forwarded to the replicas is sent again to those that have not acked it after
/// this long, then after twice as long each time, up to [`REPLICA_RESEND_MAX`].
pub const REPLICA_RESEND_FIRST: Duration = Duration::from_millis(20);
pub const REPLICA_RESEND_MAX: Duration = Duration::from_secs(1);

/// The next resend of something held for the replicas: the wait doubles, up to
/// [`REPLICA_RESEND_MAX`]. Returns the new time.
fn back_off(interval: &mut Duration, resend_at: &mut Time, now: Time) -> Time {
    *interval = (*interval * 2).min(REPLICA_RESEND_MAX);
    *resend_at = now + *interval;
    *resend_at
}

/// A resent duplicate of an applied request forwarded to the replicas (its make-up ACK goes
/// to `to` once every replica acked), or a number skipped here sent as a fill (`to`: none).
/// Sent again on the same timer as forwarded requests until every replica acked.
#[derive(Debug)]
struct Makeup {
    to: Option<SocketAddr>,
    acked: u16,
    /// By fragment index.
    datagrams: std::collections::BTreeMap<u16, Vec<u8>>,
    resend_at: Time,
    interval: Duration,
}

/// A replica's fill query, asked of the primary's devices.
#[derive(Debug)]
struct ReplicaFill {
    last: u32,
    awaiting: BTreeSet<SocketAddr>,
    held_from: u64,
}

/// A primary's state about its replicas.
#[derive(Debug, Default)]
pub(super) struct Replication {
    /// Sessions a replica asked about that this primary does not remember, and when it was
    /// first asked: answered held until a round of hold queries sent after that found no
    /// device holding any of it (at most [`UNKNOWN_ASKED_MAX`]).
    unknown_asked: HashMap<u64, Time>,
    forwarded: HashMap<(u64, u32), Forwarded>,
    /// The keys of `forwarded` in the order forwarded.
    order: VecDeque<(u64, u32)>,
    /// When each forwarded request is sent again (entries whose request is gone, or whose
    /// time changed, are stale and skipped).
    resends: BTreeSet<(Time, u64, u32)>,
    makeups: HashMap<(u64, u32), Makeup>,
    /// The request forwarded last: the next one follows it.
    last_forwarded: Option<(u64, u32)>,
    /// Sessions whose next request waits for room.
    stalled: BTreeSet<u64>,
    /// Bytes of forwarded requests held.
    bytes: usize,
    /// Replicas' fill queries open with the devices: (session, first, replica index).
    fills: HashMap<(u64, u32, usize), ReplicaFill>,
}

impl Replication {
    /// The primary's devices changed (a controller's route): replicas' fill queries still
    /// waiting for a device no longer asked are forgotten; each replica asks again at its next
    /// gap timeout, and its question goes to the devices as they are now.
    pub(super) fn forget_fills_awaiting(&mut self, gone: &[SocketAddr]) {
        self.fills
            .retain(|_, fill| !gone.iter().any(|device| fill.awaiting.contains(device)));
    }

    fn is_full(&self) -> bool {
        self.forwarded.len() + self.makeups.len() >= REPLICATION_PENDING_MAX
            || self.bytes >= REPLICATION_BYTES_MAX
    }

    fn cost(forwarded: &Forwarded) -> usize {
        forwarded.request.len() + forwarded.datagrams.iter().map(Vec::len).sum::<usize>()
    }

    pub(super) fn text(&self) -> String {
        let head: Vec<String> = self
            .order
            .iter()
            .take(4)
            .map(|key| {
                let acked = self.forwarded.get(key).map(|forwarded| forwarded.acked);
                format!("{:x}#{} acked {acked:?}", key.0, key.1)
            })
            .collect();
        format!(
            "{} forwarded (head: {}), {} make-ups",
            self.forwarded.len(),
            head.join(", "),
            self.makeups.len()
        )
    }

    /// Requests held for the replicas right now.
    pub(super) fn pending_len(&self) -> usize {
        self.forwarded.len() + self.makeups.len()
    }

    /// Take back every forwarded request of `session_id` not yet applied (the application had
    /// no room for an earlier one): (seq, kind, request), in order.
    pub(super) fn take_session(&mut self, session_id: u64) -> Vec<(u32, RequestKind, Vec<u8>)> {
        let mut taken: Vec<(u32, RequestKind, Vec<u8>)> = Vec::new();
        let keys: Vec<(u64, u32)> = self
            .forwarded
            .keys()
            .filter(|(session, _)| *session == session_id)
            .copied()
            .collect();
        for key in keys {
            let forwarded = self.forwarded.remove(&key).expect("listed above");
            self.resends.remove(&(forwarded.resend_at, key.0, key.1));
            self.bytes -= Replication::cost(&forwarded);
            taken.push((key.1, forwarded.kind, forwarded.request));
        }
        if !taken.is_empty() {
            // Forwarded again when issued again, in their new place.
            self.order.retain(|(session, _)| *session != session_id);
        }
        taken.sort_unstable_by_key(|(seq, ..)| *seq);
        taken
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

    /// Whether a session's next request (of about `len` bytes) may be handed on now; if not,
    /// the session waits for room (held requests, or the forward log's slots).
    /// A replica's request from its primary (`from_primary`) waits only for the log.
    pub(super) fn replication_room(
        &mut self,
        session_id: u64,
        len: usize,
        from_primary: bool,
    ) -> bool {
        let logged = self.is_primary() || from_primary;
        let log_full = logged && self.forward_log.as_ref().is_some_and(|log| !log.fits(len));
        let full = self.is_primary() && self.replication.is_full();
        if !full && !log_full {
            return true;
        }
        if self.replication.stalled.insert(session_id) {
            self.counters.replication.stalls += 1;
        }
        false
    }

    /// Hand request `seq` of `session_id` to the application — on a primary, once every
    /// replica has it: forwarded now, applied on their acks (see the module docs).
    pub(super) fn hand_on(&mut self, now: Time, issued: super::Issued) {
        if !self.is_primary() {
            self.apply_as_replica(issued);
            return;
        }
        let super::Issued {
            session_id,
            seq,
            kind,
            fill,
            request,
            ..
        } = issued;
        let mut header = Header::new(kind.packet_type(), self.config.server_id, session_id, seq);
        let mut payload = Vec::new();
        if fill {
            header.flags = flags::NOOP_FILL;
        } else {
            header.flags = KEYED | FROM_PRIMARY;
            let (after_session, after_seq) = self.replication.last_forwarded.unwrap_or((0, 0));
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
        self.replication.last_forwarded = Some((session_id, seq));
        self.counters.replication.forwarded += 1;
        // A request the server took in fits in as many fragments again, with the descriptor.
        let datagrams =
            encode_fragments(header, &payload, self.datagram_budget()).unwrap_or_default();
        // With a forward log, the request goes out once its record is durable there.
        let logged = self
            .forward_log
            .as_mut()
            .map(|log| log.append((session_id, seq), kind, fill, false, &request));
        let log_index = logged.map(|(index, _)| index);
        let sent = logged.is_none_or(|(_, durable)| durable);
        let resend_at = now + REPLICA_RESEND_FIRST;
        if sent {
            self.send_to_replicas(&datagrams, 0);
            self.replication
                .resends
                .insert((resend_at, session_id, seq));
        }
        let forwarded = Forwarded {
            kind,
            request,
            datagrams,
            fill,
            acked: 0,
            sent,
            log_index,
            resend_at,
            interval: REPLICA_RESEND_FIRST,
        };
        self.replication.bytes += Replication::cost(&forwarded);
        self.replication
            .forwarded
            .insert((session_id, seq), forwarded);
        self.replication.order.push_back((session_id, seq));
    }

    pub(super) fn send_to_replicas(&mut self, datagrams: &[Vec<u8>], acked: u16) {
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

    /// A resent fragment of a request forwarded and not yet applied: its first fragment sends
    /// the forward again to the replicas that have not acked it.
    pub(super) fn replicate_in_progress(&mut self, header: &Header) {
        if header.fragment_index != 0 {
            return;
        }
        let key = (header.session_id, header.seq);
        let Some(forwarded) = self.replication.forwarded.get(&key) else {
            return;
        };
        if !forwarded.sent {
            return;
        }
        let (acked, datagrams) = (forwarded.acked, forwarded.datagrams.clone());
        self.counters.replication.forwards_resent += 1;
        self.send_to_replicas(&datagrams, acked);
    }

    /// Forward log batches through `through` are durable: send what waited on them.
    pub(super) fn send_logged_forwards(&mut self, now: Time, through: u64) {
        let Some(log) = self.forward_log.as_mut() else {
            return;
        };
        for (key, index) in log.on_persisted(through) {
            let Some(forwarded) = self.replication.forwarded.get_mut(&key) else {
                // Handed back since (the application had no room): logged again when
                // forwarded again.
                continue;
            };
            if forwarded.sent || forwarded.log_index != Some(index) {
                // Applied, or forwarded again (with its record durable) since.
                continue;
            }
            forwarded.sent = true;
            forwarded.resend_at = now + REPLICA_RESEND_FIRST;
            let (acked, datagrams) = (forwarded.acked, forwarded.datagrams.clone());
            self.replication
                .resends
                .insert((now + REPLICA_RESEND_FIRST, key.0, key.1));
            self.send_to_replicas(&datagrams, acked);
        }
    }

    /// Send again what a replica has not acked for too long (its ack, or the forward, was
    /// lost: a replica that already applied it answers with a make-up ACK).
    pub(super) fn resend_forwards(&mut self, now: Time) {
        while let Some(&(at, session_id, seq)) = self.replication.resends.first() {
            if at > now {
                break;
            }
            self.replication.resends.remove(&(at, session_id, seq));
            let key = (session_id, seq);
            let Some(forwarded) = self.replication.forwarded.get_mut(&key) else {
                self.resend_makeup(now, key, at);
                continue;
            };
            if forwarded.resend_at != at {
                continue;
            }
            let next = back_off(&mut forwarded.interval, &mut forwarded.resend_at, now);
            let (acked, datagrams) = (forwarded.acked, forwarded.datagrams.clone());
            self.replication.resends.insert((next, session_id, seq));
            self.counters.replication.forwards_resent += 1;
            self.send_to_replicas(&datagrams, acked);
        }
    }

    fn resend_makeup(&mut self, now: Time, key: (u64, u32), at: Time) {
        let Some(makeup) = self.replication.makeups.get_mut(&key) else {
            return;
        };
        if makeup.resend_at != at {
            return;
        }
        let next = back_off(&mut makeup.interval, &mut makeup.resend_at, now);
        let acked = makeup.acked;
        let datagrams: Vec<Vec<u8>> = makeup.datagrams.values().cloned().collect();
        self.replication.resends.insert((next, key.0, key.1));
        self.counters.replication.forwards_resent += 1;
        self.send_to_replicas(&datagrams, acked);
    }

    /// When [`Server::resend_forwards`] must next run.
    pub(super) fn next_forward_resend(&self) -> Option<Time> {
        self.replication.resends.first().map(|(at, ..)| *at)
    }

    /// Hand the application every forwarded request every replica acked, in the order
    /// forwarded (stopping at the first one still waiting).
    fn release_forwarded(&mut self, now: Time) {
        let all = self.all_replicas_mask();
        while let Some(&key) = self.replication.order.front() {
            match self.replication.forwarded.get(&key) {
                None => {
                    debug_assert!(false, "{key:?} in the order, not forwarded");
                    self.replication.order.pop_front();
                }
                Some(forwarded) if forwarded.acked == all => {
                    self.replication.order.pop_front();
                    let forwarded = self.replication.forwarded.remove(&key).expect("found");
                    self.replication
                        .resends
                        .remove(&(forwarded.resend_at, key.0, key.1));
                    self.replication.bytes -= Replication::cost(&forwarded);
                    self.counters.replication.released += 1;
                    self.events.push_back(ServerEvent::Apply {
                        session_id: key.0,
                        seq: key.1,
                        kind: forwarded.kind,
                        request: forwarded.request,
                    });
                }
                Some(_) => break,
            }
        }
        self.unstall(now);
    }

    pub(super) fn unstall(&mut self, now: Time) {
        if !self.replication.is_full() && !self.replication.stalled.is_empty() {
            let stalled = std::mem::take(&mut self.replication.stalled);
            for session_id in stalled {
                self.advance(now, session_id);
            }
        }
    }

    /// A resent fragment of a request already applied: forward it again to the replicas that
    /// have not acked it; the (make-up) ACK goes to `from` once every replica did. `false`
    /// without replicas (answer it now).
    pub(super) fn replicate_duplicate(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) -> bool {
        if !self.is_primary() {
            return false;
        }
        let key = (header.session_id, header.seq);
        // Forwarded as what this primary applied under that number, as far as it remembers
        // (a fill or the request), as it arrived if it does not remember.
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
        let mut fragment = header.fragment_index;
        let bytes = match (header.has_flag(flags::NOOP_FILL), applied_as_fill) {
            // Its client gave up on a number this server applied for real and holds no more:
            // a replica that has the request applies it (a whole request is kept over a
            // fill); one that lacks it — no one resends it: it was never acknowledged —
            // applies the fill now rather than skip it after its own gap timeout.
            (true, false) => {
                self.counters.replication.fills_for_real_requests += 1;
                header.encode(payload)
            }
            (false, true) => {
                // The client's fill came first and was applied (or the number was skipped):
                // the replicas apply the fill too, whichever fragment came again.
                fragment = 0;
                pmnet_wire::encode_noop_fill(header.server_id, header.session_id, header.seq)
            }
            _ => header.encode(payload),
        };
        let Some(acked) = self.hold_makeup(now, key, Some(from), fragment, &bytes) else {
            self.count_drop(DropReason::ReplicationFull);
            return true;
        };
        self.counters.replication.duplicates_forwarded += 1;
        self.send_to_replicas(std::slice::from_ref(&bytes), acked);
        true
    }

    /// Hold `bytes` (fragment `fragment` of `key`) for the replicas until each acked it,
    /// answering `to` then; the replicas that acked so far, or `None` when full.
    pub(super) fn hold_makeup(
        &mut self,
        now: Time,
        key: (u64, u32),
        to: Option<SocketAddr>,
        fragment: u16,
        bytes: &[u8],
    ) -> Option<u16> {
        let full = self.replication.is_full();
        if let Some(makeup) = self.replication.makeups.get_mut(&key) {
            if to.is_some() {
                makeup.to = to;
            }
            if !makeup.datagrams.contains_key(&fragment) && makeup.datagrams.len() < 1 << 12 {
                self.replication.bytes += bytes.len();
                makeup.datagrams.insert(fragment, bytes.to_vec());
            }
            return Some(makeup.acked);
        }
        if full {
            return None;
        }
        let resend_at = now + REPLICA_RESEND_FIRST;
        self.replication.bytes += bytes.len();
        self.replication.makeups.insert(
            key,
            Makeup {
                to,
                acked: 0,
                datagrams: [(fragment, bytes.to_vec())].into(),
                resend_at,
                interval: REPLICA_RESEND_FIRST,
            },
        );
        self.replication.resends.insert((resend_at, key.0, key.1));
        Some(0)
    }

    fn remove_makeup(&mut self, key: (u64, u32)) -> Option<Makeup> {
        let makeup = self.replication.makeups.remove(&key)?;
        self.replication
            .resends
            .remove(&(makeup.resend_at, key.0, key.1));
        self.replication.bytes -= makeup.datagrams.values().map(Vec::len).sum::<usize>();
        Some(makeup)
    }

    /// Numbers `first ..= last` of `session_id` were skipped here (no one could supply them):
    /// tell the replicas, as no-op fills they apply in their place, held until each acked (at
    /// most [`SKIP_FILLS_MAX`]; one beyond that the replica finds with its own gap timer, and
    /// this primary's devices say they hold none of it).
    pub(super) fn replicate_skip(&mut self, now: Time, session_id: u64, first: u32, last: u32) {
        if !self.is_primary() {
            return;
        }
        for seq in (first..=last).take(SKIP_FILLS_MAX) {
            // As a client's no-op fill: a bypass request (no device logs it).
            let bytes = pmnet_wire::encode_noop_fill(self.config.server_id, session_id, seq);
            self.counters.replication.skips_forwarded += 1;
            // Held and sent again until every replica acked it (when there is room).
            let _ = self.hold_makeup(now, (session_id, seq), None, 0, &bytes);
            self.send_to_replicas(std::slice::from_ref(&bytes), 0);
        }
    }

    /// Whether `from` is one of this primary's replicas.
    pub(super) fn replica_index(&self, from: SocketAddr) -> Option<usize> {
        self.replicas().iter().position(|&replica| replica == from)
    }

    /// A replica's server-ACK (any fragment: it is sent only once the request is applied).
    pub(super) fn on_replica_ack(&mut self, now: Time, replica: usize, header: &Header) {
        if !header.has_flag(pmnet_wire::replication::REPLICA)
            || usize::from(header.device_id) != replica + 1
        {
            // Not this replica's ack: a server's, or another replica's, replayed from its
            // address.
            self.count_drop(DropReason::Mismatch);
            return;
        }
        let key = (header.session_id, header.seq);
        let all = self.all_replicas_mask();
        if let Some(forwarded) = self.replication.forwarded.get_mut(&key) {
            self.counters.replication.acks_received += 1;
            let fill = forwarded.fill;
            if header.has_flag(flags::SKIPPED) && !fill {
                self.counters.replication.replica_skips += 1;
            }
            if fill && header.has_flag(flags::MAKEUP) && !header.has_flag(flags::SKIPPED) {
                // The replica applied the request itself, forwarded before a crash of this
                // primary that lost it; its client gave up since (docs/replication.md).
                self.counters.replication.fill_conflicts += 1;
            }
            forwarded.acked |= 1 << replica;
            if forwarded.acked == all {
                self.release_forwarded(now);
            }
            return;
        }
        let Some(makeup) = self.replication.makeups.get_mut(&key) else {
            self.counters.replication.acks_late += 1;
            return;
        };
        self.counters.replication.acks_received += 1;
        makeup.acked |= 1 << replica;
        if makeup.acked != all {
            return;
        }
        let makeup = self.remove_makeup(key).expect("looked up above");
        self.counters.replication.makeups_released += 1;
        if let Some(to) = makeup.to {
            if self.table.sessions.contains_key(&key.0) {
                self.send_makeup_ack(key.0, key.1, to, 0);
            }
        }
        self.unstall(now);
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
        // On its way: forwarded and not acked by it, a resent one forwarded as it arrived, or
        // one not applied here yet (what this primary skips, it says). A session this primary
        // does not remember has nothing here on its way: whatever of it comes again comes
        // from a device, and the devices are asked. (A replica knows of such a session only
        // from this primary's forwards, each acked by every replica before this primary let
        // the session go: typically a session the replica forgot too, made known again by a
        // forward whose order names one of its requests. Answered "held" here, that gap
        // never closed, and the session stayed busy in the replica's table for ever.)
        let applied_here = self.table.sessions.get(&session_id).map(|s| s.last_applied);
        let held_here = (first..=last).take(1 << 16).find(|&seq| {
            let key = (session_id, seq);
            applied_here.is_some_and(|applied| seq > applied)
                || self
                    .replication
                    .forwarded
                    .get(&key)
                    .is_some_and(|forwarded| forwarded.acked & (1 << replica) == 0)
                || self
                    .replication
                    .makeups
                    .get(&key)
                    .is_some_and(|makeup| makeup.acked & (1 << replica) == 0)
        });
        if held_here.is_some() || self.config.devices.is_empty() {
            let held_from = held_here.unwrap_or(last.wrapping_add(1));
            self.send_replica_fill_reply(from, session_id, first, last, held_from);
            return;
        }
        let key = (session_id, first, replica);
        // A round for the same first number but another range (the replica's gap grew or
        // shrank since) is replaced: the devices answer the range asked now, and a round
        // kept for the old one would match none of their answers, for ever.
        let asked = self.replication.fills.get(&key).map(|fill| fill.last);
        if asked != Some(last) {
            if asked.is_none() && self.replication.fills.len() >= REPLICA_FILLS_MAX {
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

    /// A replica misses a request: one held here is sent again; one this primary applied and
    /// holds no more (after a promotion) is asked for where the session's requests come from,
    /// as the primary asks for its own gaps: a device answers from its log or asks the client,
    /// which sends the request again, or its no-op fill; either comes back here as a
    /// duplicate and goes on to the replica. Paid for from the session's credit unless it
    /// goes to one of this server's devices.
    fn on_replica_retransmit_request(&mut self, to_replica: SocketAddr, header: &Header) {
        let key = (header.session_id, header.seq);
        let Some(session) = self.table.sessions.get(&header.session_id) else {
            self.counters.replication.retransmit_requests_ignored += 1;
            return;
        };
        if let Some(forwarded) = self.replication.forwarded.get(&key).filter(|f| f.sent) {
            // Held here: sent again at once.
            let (acked, datagrams) = (forwarded.acked, forwarded.datagrams.clone());
            self.counters.replication.forwards_resent += 1;
            self.send_to_replicas(&datagrams, acked);
            return;
        }
        if let Some(makeup) = self.replication.makeups.get(&key) {
            let datagrams: Vec<Vec<u8>> = makeup.datagrams.values().cloned().collect();
            self.counters.replication.forwards_resent += 1;
            for bytes in datagrams {
                self.transmits.push_back(Transmit {
                    destination: to_replica,
                    bytes,
                });
            }
            return;
        }
        if header.seq > session.last_applied {
            self.counters.replication.retransmit_requests_ignored += 1;
            return;
        }
        let Some(to) = session.reply_to else {
            self.counters.replication.retransmit_requests_ignored += 1;
            return;
        };
        if !self.pay_for_unsolicited(header.session_id, to) {
            return;
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
    pub(super) fn on_replica_message(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
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
            PacketType::RetransmitRequest => self.on_replica_retransmit_request(from, header),
            PacketType::HoldQuery => self.on_replica_hold_query(now, from, header, payload),
            // A replica's answer to this primary's own hold query (`hold.rs`).
            PacketType::HoldReply => self.on_hold_reply(from, header, payload),
            _ => self.count_drop(DropReason::UnexpectedType),
        }
    }

    /// Sessions with requests held for the replicas (forwarded, or make-ups, not acked by
    /// every replica).
    pub(super) fn pending_sessions(&self) -> HashSet<u64> {
        (self.replication.forwarded.keys())
            .chain(self.replication.makeups.keys())
            .map(|&(session_id, _)| session_id)
            .collect()
    }

    /// A replica asks which of the listed sessions a request could still reach it of from
    /// here (`hold.rs`): one this primary holds for its replicas, or one of a session it
    /// has not forgotten and its own devices have not cleared (a device's resend of a
    /// request applied here is forwarded to the replicas as it arrives).
    fn on_replica_hold_query(
        &mut self,
        now: Time,
        from: SocketAddr,
        header: &Header,
        payload: &[u8],
    ) {
        let Ok(sessions) = pmnet_wire::decode_hold_query_payload(payload) else {
            self.count_drop(DropReason::BadPayload);
            return;
        };
        let pending = self.pending_sessions();
        let keep = self.holds.keep();
        // What this primary kept from its own time as a replica is sent to its replicas again
        // at its next start: given up for the sessions with nothing pending, and answered
        // held until that is durable (a crash before would bring it back).
        let mut own_copies = HashSet::new();
        if let Some(log) = self.forward_log.as_mut() {
            let candidates: HashSet<u64> = sessions
                .iter()
                .copied()
                .filter(|session_id| !pending.contains(session_id))
                .collect();
            let (kept, released) = log.give_up_retained_of(&candidates);
            own_copies = kept;
            if log.pushed_through().is_some() {
                own_copies.extend(released);
            }
        }
        let mut held = Vec::with_capacity(sessions.len());
        for session_id in sessions {
            // A session this primary does not remember may still have entries in a device's
            // log (one this server never had room for, or forgot as a replica before its
            // promotion): the devices are asked, in a round sent after the question. Unless
            // this primary evicted it itself, in this run, and has not taken it in since: it
            // evicted it only once nothing was pending for the replicas and no device held a
            // request of it it could have applied, so what the devices hold of it now no
            // server applied, and the replicas hold what it held. Its replicas may forget it
            // too; else a replica's table full of sessions its primary forgot, whose new
            // requests wait in the devices for room here, would wait on this primary while
            // this primary's next request waits on the replica.
            let since = match self.table.sessions.get(&session_id) {
                Some(session) => session.last_active,
                None if self.table.evicted_here(session_id) => {
                    held.push(pending.contains(&session_id) || own_copies.contains(&session_id));
                    continue;
                }
                None => {
                    if self.replication.unknown_asked.len() >= UNKNOWN_ASKED_MAX
                        && !self.replication.unknown_asked.contains_key(&session_id)
                    {
                        self.replication.unknown_asked.clear();
                    }
                    let asked = *self
                        .replication
                        .unknown_asked
                        .entry(session_id)
                        .or_insert(now);
                    Time::from_nanos(
                        asked
                            .as_nanos()
                            .saturating_sub(u64::try_from(keep.as_nanos()).unwrap_or(u64::MAX)),
                    )
                }
            };
            let devices_may_hold = !self.holds.cleared(session_id, since);
            if devices_may_hold {
                self.holds.want(now, session_id);
            }
            held.push(
                pending.contains(&session_id)
                    || devices_may_hold
                    || own_copies.contains(&session_id),
            );
        }
        let reply = Header::new(PacketType::HoldReply, self.config.server_id, 0, header.seq);
        self.transmits.push_back(Transmit {
            destination: from,
            bytes: reply.encode(&pmnet_wire::encode_hold_reply_payload(&held)),
        });
    }
}

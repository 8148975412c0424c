//! The order of keyed writes (flag `KEYED`, the read cache's) to each key, as this device
//! acknowledges them (docs/cache.md, "Order of writes to one key").
//!
//! When the device logs a keyed write to key K (or forwards it unlogged: log full, a slot
//! collision, a keyed bypass), it writes into the write's descriptor, in place and before the
//! log write, the request the write must follow: the latest keyed write
//! to K it logged whose server-ACK has not come back (none if every earlier one is
//! acknowledged), and its stamp (a count of the keyed writes it logged). A server applies the
//! write only after the one it names, so the writes to K are applied in the order this device
//! acknowledged them. A cache read forwarded to the server carries the same "after", so a
//! miss is not answered before a write the device acknowledged.
//!
//! A *barrier* (a keyed write with no key: it may change any key) is ordered after everything
//! before it: the device writes into its room the latest unacknowledged keyed write of every
//! other session that has one (a server applies a session's requests in order, so that covers
//! all of them), and every later keyed write or read follows the latest unacknowledged barrier
//! when it is newer than the key's own latest write. So the device's order of keyed writes
//! and barriers is the order the server applies them in, key by key. A barrier without room
//! enough for the sessions it must follow is refused (dropped: its client sends it again).
//!
//! Bounded: a key is remembered only while a keyed write to it awaits its server's ack, and at
//! most `PLACED_MAX` writes are placed.

use std::collections::{BTreeSet, HashMap};

use pmnet_wire::cache::{ReadDescriptor, WriteDescriptor, WriteOrder, KEYED};
use pmnet_wire::Header;

/// The logged keyed writes to each key not yet acknowledged by their server, by stamp: the
/// latest is the one later writes and reads follow. All of them are kept, not only the latest:
/// a write resent after its server-ACK (a late duplicate, logged again) is acknowledged at once
/// and must not take away the order of an older write still on its way.
#[derive(Debug, Default)]
pub(crate) struct KeyedOrder {
    /// Key → its writes in order: (stamp, session, seq).
    unacked: HashMap<Vec<u8>, BTreeSet<(u64, u64, u32)>>,
    /// Each write in `unacked`, by (session, seq): its key and the order it was given (a
    /// retransmission forwarded again, such as a keyed bypass's, gets the same order: a new
    /// one could follow a write that follows it).
    keys: HashMap<(u64, u32), Placed>,
    next_stamp: u64,
    /// Each session's highest number a server acknowledged (a server applies a session's
    /// requests in order, so everything up to it is applied): a keyed write at or below it is
    /// a late duplicate, which no write or read may follow (its number is applied whatever
    /// order it is given now). Bounded: the oldest session forgotten first.
    applied: HashMap<u64, u32>,
    applied_order: std::collections::VecDeque<u64>,
}

/// Sessions whose acknowledged numbers are remembered at most.
const APPLIED_SESSIONS_MAX: usize = 65_536;

/// Where a keyed write (or barrier) was placed: its scoped key, its order and, for a
/// barrier, its afters.
#[derive(Debug, Clone)]
struct Placed {
    key: Vec<u8>,
    order: WriteOrder,
    afters: Vec<(u64, u32)>,
}

impl Placed {
    /// A barrier's scoped key is its server id alone.
    fn is_barrier(&self) -> bool {
        self.key.len() == 2
    }

    /// `payload` (a keyed write's, from its client) with this placement written in.
    fn write_into(&self, payload: &[u8]) -> Vec<u8> {
        let mut new_payload = payload.to_vec();
        self.order.write_into(&mut new_payload);
        if self.is_barrier() {
            WriteDescriptor::write_barrier_afters(&mut new_payload, &self.afters);
        }
        new_payload
    }
}

/// Why a keyed write was not placed (the device drops it; its client sends it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// A barrier that must follow more sessions than it has room for.
    Barrier,
    /// [`PLACED_MAX`] keyed writes are placed and not yet acknowledged (keyed bypasses are
    /// not bounded by the log).
    Full,
}

impl NoRoom {
    pub(crate) fn reason(self) -> crate::DropReason {
        match self {
            NoRoom::Barrier => crate::DropReason::BarrierNoRoom,
            NoRoom::Full => crate::DropReason::KeyedOrderFull,
        }
    }
}

/// Keyed writes placed and not yet acknowledged by their server, at most.
const PLACED_MAX: usize = 131_072;

/// Keys are kept per server (a write is ordered only among writes to its own server, which is
/// the one that waits): the server id, then the key. A server's barriers are kept under its
/// id alone (no key is empty).
fn scoped(server_id: u16, key: &[u8]) -> Vec<u8> {
    let mut scoped = Vec::with_capacity(2 + key.len());
    scoped.extend_from_slice(&server_id.to_be_bytes());
    scoped.extend_from_slice(key);
    scoped
}

/// The pseudo-key of the barriers of the server of `scoped_key`.
fn barriers_of(scoped_key: &[u8]) -> &[u8] {
    &scoped_key[..2.min(scoped_key.len())]
}

/// A keyed write as it is to be logged: the datagram with its order written, its key (empty
/// for a barrier) and its order.
pub(crate) struct Stamped {
    pub(crate) datagram: Vec<u8>,
    placed: Placed,
}

impl KeyedOrder {
    /// Write the order into the first fragment of a keyed update. `None` when the datagram
    /// is not one (other fragments, other updates) or its descriptor does not parse (it is
    /// then logged as it came, and the server hands it on as it came).
    pub(crate) fn stamp(
        &mut self,
        header: &Header,
        datagram: &[u8],
    ) -> Result<Option<Stamped>, NoRoom> {
        if !header.has_flag(KEYED) || header.fragment_index != 0 {
            return Ok(None);
        }
        let Some(payload) = datagram.get(pmnet_wire::HEADER_LEN..) else {
            return Ok(None);
        };
        let Ok((descriptor, _)) = WriteDescriptor::parse(payload) else {
            return Ok(None);
        };
        if self
            .applied
            .get(&header.session_id)
            .is_some_and(|&through| header.seq <= through)
        {
            // A late duplicate of an applied write: forwarded as it came (the server answers
            // it with a make-up ACK), ordering nothing.
            return Ok(None);
        }
        let key = scoped(header.server_id, descriptor.key);
        let known = self.keys.contains_key(&(header.session_id, header.seq));
        if !known && self.keys.len() >= PLACED_MAX {
            return Err(NoRoom::Full);
        }
        let placed = match self.keys.get(&(header.session_id, header.seq)) {
            // A retransmission of a write already placed: the same order again.
            Some(placed) if placed.key == key => placed.clone(),
            _ if descriptor.is_barrier() => {
                let room = descriptor.afters.len() / pmnet_wire::cache::AFTER_LEN;
                self.place_barrier(header, key, room)?
            }
            _ => self.place_write(header, key),
        };
        Ok(Some(Stamped {
            datagram: header.encode(&placed.write_into(payload)),
            placed,
        }))
    }

    /// A barrier follows the latest unacknowledged keyed write (or barrier) of every other
    /// session.
    ///
    /// A barrier that arrives after a later write of its own session (any key) is placed just
    /// before the earliest such write (its stamp) and follows only what was placed before
    /// that: what came after may follow that write, which follows this barrier.
    fn place_barrier(
        &mut self,
        header: &Header,
        key: Vec<u8>,
        room: usize,
    ) -> Result<Placed, NoRoom> {
        let (me, number) = (header.session_id, header.seq);
        let server = header.server_id.to_be_bytes();
        let later_own = self
            .keys
            .iter()
            .filter(|(&(session, seq), _)| session == me && seq > number)
            .map(|(_, placed)| placed.order.stamp)
            .min();
        let mut latest: HashMap<u64, u32> = HashMap::new();
        for (&(session, seq), placed) in &self.keys {
            if session != me
                && placed.key.starts_with(&server)
                && later_own.is_none_or(|bound| placed.order.stamp < bound)
            {
                let entry = latest.entry(session).or_insert(seq);
                *entry = (*entry).max(seq);
            }
        }
        let mut afters: Vec<(u64, u32)> = latest.into_iter().collect();
        afters.sort_unstable();
        if afters.len() > room {
            return Err(NoRoom::Barrier);
        }
        let stamp = match later_own {
            Some(stamp) => stamp,
            None => {
                self.next_stamp += 1;
                self.next_stamp
            }
        };
        let order = WriteOrder {
            after_session: 0,
            after_seq: 0,
            stamp,
        };
        Ok(Placed { key, order, afters })
    }

    fn place_write(&mut self, header: &Header, key: Vec<u8>) -> Placed {
        let (stamp, after) = self.place(&key, header.session_id, header.seq);
        let (after_session, after_seq) = after.unwrap_or((0, 0));
        Placed {
            key,
            order: WriteOrder {
                after_session,
                after_seq,
                stamp,
            },
            afters: Vec::new(),
        }
    }

    /// Where a new keyed write of (session, seq) to `key` goes among the key's unacknowledged
    /// writes: its stamp, and the write it follows. Normally last (the next stamp, after the
    /// latest). But a session's writes are ordered by their numbers whatever order they came
    /// in: one that arrives after a later write of its own session takes that write's stamp
    /// (writes of one stamp are ordered by session and number, so it comes just before it) and
    /// follows what that one followed.
    /// The session's own barriers count as its later writes too.
    fn place(&mut self, key: &[u8], session_id: u64, seq: u32) -> (u64, Option<(u64, u32)>) {
        let sets = || {
            [key, barriers_of(key)]
                .into_iter()
                .filter_map(|k| self.unacked.get(k))
        };
        let later_own = sets()
            .filter_map(|writes| {
                writes
                    .iter()
                    .find(|&&(_, session, number)| session == session_id && number > seq)
                    .copied()
            })
            .min();
        match later_own {
            Some(later) => {
                let bound = (later.0, session_id, seq);
                let before = sets()
                    .filter_map(|writes| writes.range(..bound).next_back())
                    .max()
                    .map(|&(_, session, number)| (session, number));
                (later.0, before)
            }
            None => {
                self.next_stamp += 1;
                (self.next_stamp, self.latest_with_barriers(key))
            }
        }
    }

    /// The keyed write (session, seq) was logged (or, a keyed bypass, forwarded): later
    /// writes and reads follow it.
    pub(crate) fn logged(&mut self, stamped: &Stamped, session_id: u64, seq: u32) {
        self.record(stamped.placed.clone(), session_id, seq);
    }

    fn record(&mut self, placed: Placed, session_id: u64, seq: u32) {
        if let Some(old) = self.keys.remove(&(session_id, seq)) {
            self.forget(&old.key, old.order.stamp, session_id, seq);
        }
        self.unacked.entry(placed.key.clone()).or_default().insert((
            placed.order.stamp,
            session_id,
            seq,
        ));
        self.keys.insert((session_id, seq), placed);
    }

    /// The latest unacknowledged keyed write to `key` (for the empty key: barrier).
    fn latest_stamped(&self, key: &[u8]) -> Option<(u64, u64, u32)> {
        self.unacked
            .get(key)
            .and_then(|writes| writes.last())
            .copied()
    }

    /// What a new write or read of `key` follows: the key's latest unacknowledged write, or
    /// the latest unacknowledged barrier if that is newer (a barrier follows everything before
    /// it, so either way everything the device acked before is covered).
    fn latest_with_barriers(&self, key: &[u8]) -> Option<(u64, u32)> {
        let own = self.latest_stamped(key);
        let barrier = self.latest_stamped(barriers_of(key));
        own.max(barrier).map(|(_, session, seq)| (session, seq))
    }

    fn forget(&mut self, key: &[u8], stamp: u64, session_id: u64, seq: u32) {
        if let Some(writes) = self.unacked.get_mut(key) {
            writes.remove(&(stamp, session_id, seq));
            if writes.is_empty() {
                self.unacked.remove(key);
            }
        }
    }

    /// The server acknowledged (session, seq): it no longer orders anything, and the session
    /// is applied through it.
    pub(crate) fn acked(&mut self, session_id: u64, seq: u32) {
        match self.applied.get_mut(&session_id) {
            Some(through) => *through = (*through).max(seq),
            None => {
                if self.applied.len() >= APPLIED_SESSIONS_MAX {
                    if let Some(oldest) = self.applied_order.pop_front() {
                        self.applied.remove(&oldest);
                    }
                }
                self.applied.insert(session_id, seq);
                self.applied_order.push_back(session_id);
            }
        }
        if let Some(placed) = self.keys.remove(&(session_id, seq)) {
            self.forget(&placed.key, placed.order.stamp, session_id, seq);
        }
    }

    /// A keyed write found in the log at start-up (its first fragment): ordered by its stamp
    /// among the key's writes, and new stamps continue after the highest.
    pub(crate) fn recovered(&mut self, header: &Header, packet: &[u8]) {
        if !header.has_flag(KEYED) || header.fragment_index != 0 {
            return;
        }
        let Some(Ok((descriptor, _))) = packet
            .get(pmnet_wire::HEADER_LEN..)
            .map(WriteDescriptor::parse)
        else {
            return;
        };
        self.next_stamp = self.next_stamp.max(descriptor.order.stamp);
        let placed = Placed {
            key: scoped(header.server_id, descriptor.key),
            order: descriptor.order,
            afters: descriptor.barrier_afters().collect(),
        };
        self.record(placed, header.session_id, header.seq);
    }

    /// Write into a cache read the keyed write to its key it must follow, if any. `None` when
    /// there is none (forward it as it came) or the descriptor does not parse.
    pub(crate) fn order_read(&self, header: &Header, datagram: &[u8]) -> Option<Vec<u8>> {
        let payload = datagram.get(pmnet_wire::HEADER_LEN..)?;
        let (descriptor, _) = ReadDescriptor::parse(payload).ok()?;
        let (session, seq) =
            self.latest_with_barriers(&scoped(header.server_id, descriptor.key))?;
        let mut new_payload = payload.to_vec();
        ReadDescriptor::write_after(&mut new_payload, session, seq);
        Some(header.encode(&new_payload))
    }

    /// Keys with a keyed write in the log (barriers count as one).
    pub(crate) fn len(&self) -> usize {
        self.unacked.len()
    }
}

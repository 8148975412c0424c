//! The order of keyed writes (flag `KEYED`, the read cache's) to each key, as this device
//! acknowledges them (docs/cache.md, "Order of writes to one key").
//!
//! When the device logs a keyed write to key K, it writes into the write's descriptor, in
//! place and before the log write, the request the write must follow: the latest keyed write
//! to K it logged whose server-ACK has not come back (none if every earlier one is
//! acknowledged), and its stamp (a count of the keyed writes it logged). A server applies the
//! write only after the one it names, so the writes to K are applied in the order this device
//! acknowledged them. A cache read forwarded to the server carries the same "after", so a
//! miss is not answered before a write the device acknowledged.
//!
//! Bounded: a key is remembered only while a keyed write to it is in the log.

use std::collections::{BTreeSet, HashMap};

use pmnet_wire::cache::{ReadDescriptor, WriteDescriptor, WriteOrder, KEYED};
use pmnet_wire::Header;

/// The logged keyed writes to each key not yet acknowledged by their server, by stamp: the
/// latest is the one later writes and reads follow. All of them are kept, not only the latest:
/// a write resent after its server-ACK (a late duplicate, logged again) is acknowledged at once
/// and must not take away the order of an older write still on its way.
#[derive(Debug, Default)]
pub(super) struct KeyedOrder {
    /// Key → its writes in order: (stamp, session, seq).
    unacked: HashMap<Vec<u8>, BTreeSet<(u64, u64, u32)>>,
    /// The key and stamp of each write in `unacked`, by (session, seq).
    keys: HashMap<(u64, u32), (Vec<u8>, u64)>,
    next_stamp: u64,
}

/// A keyed write as it is to be logged: the datagram with its order written, and its key.
pub(super) struct Stamped {
    pub(super) datagram: Vec<u8>,
    pub(super) key: Vec<u8>,
    pub(super) stamp: u64,
}

impl KeyedOrder {
    /// Write the order into the first fragment of a keyed update. `None` when the datagram
    /// is not one (other fragments, other updates) or its descriptor does not parse (it is
    /// then logged as it came, and the server hands it on as it came).
    pub(super) fn stamp(&mut self, header: &Header, datagram: &[u8]) -> Option<Stamped> {
        if !header.has_flag(KEYED) || header.fragment_index != 0 {
            return None;
        }
        let payload = datagram.get(pmnet_wire::HEADER_LEN..)?;
        let (descriptor, _) = WriteDescriptor::parse(payload).ok()?;
        if descriptor.is_barrier() {
            // A barrier names no key to order it among; the cache keeps itself coherent
            // around it (it fetches nothing until the server has applied it).
            return None;
        }
        let key = descriptor.key.to_vec();
        let (stamp, after) = self.place(&key, header.session_id, header.seq);
        let (after_session, after_seq) = after.unwrap_or((0, 0));
        let order = WriteOrder {
            after_session,
            after_seq,
            stamp,
        };
        let mut new_payload = payload.to_vec();
        order.write_into(&mut new_payload);
        Some(Stamped {
            datagram: header.encode(&new_payload),
            key,
            stamp,
        })
    }

    /// Where a new keyed write of (session, seq) to `key` goes among the key's unacknowledged
    /// writes: its stamp, and the write it follows. Normally last (the next stamp, after the
    /// latest). But a session's writes are ordered by their numbers whatever order they came
    /// in: one that arrives after a later write of its own session takes that write's stamp
    /// (writes of one stamp are ordered by session and number, so it comes just before it) and
    /// follows what that one followed.
    fn place(&mut self, key: &[u8], session_id: u64, seq: u32) -> (u64, Option<(u64, u32)>) {
        let writes = self.unacked.get(key);
        let later_own = writes.and_then(|writes| {
            writes
                .iter()
                .find(|&&(_, session, number)| session == session_id && number > seq)
                .copied()
        });
        match (writes, later_own) {
            (Some(writes), Some(later)) => {
                let before = writes
                    .range(..later)
                    .next_back()
                    .map(|&(_, session, number)| (session, number));
                (later.0, before)
            }
            _ => {
                self.next_stamp += 1;
                (self.next_stamp, self.latest(key))
            }
        }
    }

    /// The keyed write (session, seq) to `key` was logged: later writes and reads follow it.
    pub(super) fn logged(&mut self, key: Vec<u8>, session_id: u64, seq: u32, stamp: u64) {
        if let Some((old_key, old_stamp)) = self.keys.remove(&(session_id, seq)) {
            self.forget(&old_key, old_stamp, session_id, seq);
        }
        self.unacked
            .entry(key.clone())
            .or_default()
            .insert((stamp, session_id, seq));
        self.keys.insert((session_id, seq), (key, stamp));
    }

    /// The latest unacknowledged keyed write to `key`.
    fn latest(&self, key: &[u8]) -> Option<(u64, u32)> {
        self.unacked
            .get(key)
            .and_then(|writes| writes.last())
            .map(|&(_, session, seq)| (session, seq))
    }

    fn forget(&mut self, key: &[u8], stamp: u64, session_id: u64, seq: u32) {
        if let Some(writes) = self.unacked.get_mut(key) {
            writes.remove(&(stamp, session_id, seq));
            if writes.is_empty() {
                self.unacked.remove(key);
            }
        }
    }

    /// The server acknowledged (session, seq): it no longer orders anything.
    pub(super) fn acked(&mut self, session_id: u64, seq: u32) {
        if let Some((key, stamp)) = self.keys.remove(&(session_id, seq)) {
            self.forget(&key, stamp, session_id, seq);
        }
    }

    /// A keyed write found in the log at start-up (its first fragment): ordered by its stamp
    /// among the key's writes, and new stamps continue after the highest.
    pub(super) fn recovered(&mut self, header: &Header, packet: &[u8]) {
        if !header.has_flag(KEYED) || header.fragment_index != 0 {
            return;
        }
        let Some(Ok((descriptor, _))) = packet
            .get(pmnet_wire::HEADER_LEN..)
            .map(WriteDescriptor::parse)
        else {
            return;
        };
        if descriptor.is_barrier() {
            return;
        }
        let stamp = descriptor.order.stamp;
        self.next_stamp = self.next_stamp.max(stamp);
        self.logged(
            descriptor.key.to_vec(),
            header.session_id,
            header.seq,
            stamp,
        );
    }

    /// Write into a cache read the keyed write to its key it must follow, if any. `None` when
    /// there is none (forward it as it came) or the descriptor does not parse.
    pub(super) fn order_read(&self, header: &Header, datagram: &[u8]) -> Option<Vec<u8>> {
        let payload = datagram.get(pmnet_wire::HEADER_LEN..)?;
        let (descriptor, _) = ReadDescriptor::parse(payload).ok()?;
        let (session, seq) = self.latest(descriptor.key)?;
        let mut new_payload = payload.to_vec();
        ReadDescriptor::write_after(&mut new_payload, session, seq);
        Some(header.encode(&new_payload))
    }

    /// Keys with a keyed write in the log.
    pub(super) fn len(&self) -> usize {
        self.unacked.len()
    }
}

//! Keyed writes to one key applied in the order their device acknowledged them.
//!
//! A keyed update (flag `KEYED`) starts with a write descriptor whose order names the request
//! it must follow (a barrier, one per session it follows, each in turn): the device's latest earlier keyed write to the same key that was not yet
//! acknowledged by its server (docs/cache.md, "Order of writes to one key"). The server hands
//! such a write to its application only once that session has applied through that number.
//! A session that waits is neither a gap nor a deferral: its next request is here, whole.
//!
//! The request waited for always comes: its device logged it and holds it until this server
//! acknowledges it, resending it as it resends every unacknowledged entry. A session the server
//! does not know is made known (no requests, the awaited number as the highest seen), so the gap
//! machinery asks for what it misses and, if no device holds it any more, skips it: a session
//! never waits for a request that cannot come. Every `after` points to a write the device acked
//! before, and the device's ack order agrees with every session's own order, so waits cannot
//! form a cycle.

use pmnet_wire::cache::WriteDescriptor;

use super::table::Assembly;

/// The longest a keyed write waits for the write it must follow. The write waited for is in a
/// device's log and comes unless that device lost it: a keyed bypass (never logged) that a
/// device forgot in a crash, and that, sent again, was ordered after a write that waits for
/// it, would otherwise hold both sessions for ever. Past this the wait is given up (counted:
/// `keyed_order_timed_out`) and the write is applied; the order of the two writes is then the
/// order they reach the server. Longer than any request's lifetime, so that a write still on
/// its way is not overtaken.
pub(super) const ORDER_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);
use super::Server;
use crate::Time;

/// What stops a session's next request from going to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blocked {
    /// Nothing to issue: the next number is missing, incomplete, or the session is deferred.
    Nothing,
    /// Whole, but a keyed write that must follow request `.1` of session `.0`.
    After(u64, u32),
}

/// The requests a whole keyed write must follow: the one its order names, and a barrier's
/// afters (none for anything else, and for a keyed write whose descriptor does not parse: it
/// is handed on as it came).
pub(super) fn afters_of(assembly: &Assembly) -> Vec<(u64, u32)> {
    if !assembly.keyed || assembly.fill {
        return Vec::new();
    }
    let Some(Some(first)) = assembly.parts.first() else {
        return Vec::new();
    };
    let Ok((descriptor, _)) = WriteDescriptor::parse(first) else {
        return Vec::new();
    };
    descriptor
        .order
        .after()
        .into_iter()
        .chain(descriptor.barrier_afters())
        .collect()
}

/// How many bytes of a keyed write's request its descriptor takes, read from the first
/// fragment (where a device's cache reads it); `None` when that fragment holds no whole
/// descriptor: a keyed write whose key a device could not read must not change that key, so it
/// is handed on as it came (the application refuses what it cannot decode).
pub(super) fn descriptor_len(first: &[u8]) -> Option<usize> {
    WriteDescriptor::parse(first)
        .ok()
        .map(|(descriptor, _)| descriptor.len())
}

impl Server {
    /// A wait of `session_id` reached its deadline: given up if it is still the same one.
    pub(super) fn on_order_timeout(&mut self, now: Time, session_id: u64, deadline: Time) {
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return;
        };
        if session.waiting_until != Some(deadline) {
            return;
        }
        session.waiting_until = None;
        if let Some((after, through)) = session.waiting_for.take() {
            session.order_given_up = true;
            self.order_waiters.remove(&(after, through, session_id));
            self.counters.keyed_order_timed_out += 1;
            self.advance(now, session_id);
        }
    }

    /// Whether session `session_id` may apply a request that must follow `(after, through)`.
    pub(super) fn order_satisfied(&self, session_id: u64, after: u64, through: u32) -> bool {
        // A session's own earlier requests are issued before it, in order.
        after == session_id
            || self
                .table
                .sessions
                .get(&after)
                .is_some_and(|session| session.last_applied >= through)
    }

    /// Session `session_id` waits until `after` has applied through `through`: remember it,
    /// and make sure `after` is known, so that what it misses is asked for or skipped. `true`
    /// when the wait was given up at once (no room in the table for `after`): the request
    /// may go now.
    pub(super) fn wait_for(
        &mut self,
        now: Time,
        session_id: u64,
        after: u64,
        through: u32,
    ) -> bool {
        let Some(session) = self.table.sessions.get_mut(&session_id) else {
            return false;
        };
        if session.waiting_for == Some((after, through)) && session.waiting_until.is_some() {
            return false;
        }
        session.waiting_for = Some((after, through));
        let deadline = *session.waiting_until.get_or_insert(now + ORDER_WAIT_MAX);
        self.order_timers.insert((deadline, session_id));
        let reply_to = session.reply_to;
        self.order_waiters.insert((after, through, session_id));
        self.counters.keyed_writes_held += 1;
        if !self.make_known(now, after, through, reply_to) {
            // No room for it: the wait is given up (counted) rather than held for ever.
            self.counters.keyed_order_given_up += 1;
            self.order_waiters.remove(&(after, through, session_id));
            if let Some(session) = self.table.sessions.get_mut(&session_id) {
                session.waiting_for = None;
                session.order_given_up = true;
            }
            return true;
        }
        false
    }

    /// Make sure session `after` is known and that its number `through` is awaited, so that
    /// the gap machinery asks for what it misses and skips what no device holds. `false` when
    /// the table has no room for it.
    pub(super) fn make_known(
        &mut self,
        now: Time,
        after: u64,
        through: u32,
        reply_to: Option<std::net::SocketAddr>,
    ) -> bool {
        let known = self.table.sessions.contains_key(&after);
        let holds = &self.holds;
        let cleared = |session, active| holds.cleared(session, active);
        let Some(awaited) = self.table.get_or_create(now, after, &cleared) else {
            return false;
        };
        if !known {
            // Its requests, if any come, come through the device that sent what waits.
            awaited.reply_to = reply_to;
        }
        awaited.note_issued(through, now);
        awaited.awaited_through = awaited.awaited_through.max(through);
        self.counters.sessions_evicted = self.table.evicted;
        self.update_gap(now, after);
        true
    }

    /// Session `session_id` applied through `last_applied`: let go of the sessions that waited
    /// for it.
    pub(super) fn release_waiters(&mut self, now: Time, session_id: u64, last_applied: u32) {
        let released: Vec<(u64, u32, u64)> = self
            .order_waiters
            .range((session_id, 0, 0)..=(session_id, last_applied, u64::MAX))
            .copied()
            .collect();
        for entry in released {
            self.order_waiters.remove(&entry);
            let waiting = entry.2;
            if let Some(session) = self.table.sessions.get_mut(&waiting) {
                session.waiting_for = None;
            }
            self.advance(now, waiting);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RequestKind;
    use pmnet_wire::cache::WriteOrder;

    fn keyed(after: Option<(u64, u32)>) -> Vec<u8> {
        let (after_session, after_seq) = after.unwrap_or((0, 0));
        let mut payload = Vec::new();
        WriteDescriptor {
            order: WriteOrder {
                after_session,
                after_seq,
                stamp: 9,
            },
            key: b"k",
            reply_after: Some(b"v"),
            afters: &[],
        }
        .emit(&mut payload);
        payload.extend_from_slice(b"k=v");
        payload
    }

    #[test]
    fn a_keyed_write_names_what_it_follows_and_reaches_the_application_without_its_descriptor() {
        let mut assembly = Assembly::whole(RequestKind::Update, false, keyed(Some((7, 3))));
        assert_eq!(afters_of(&assembly), vec![], "not keyed: no order");
        assembly.keyed = true;
        assert_eq!(afters_of(&assembly), vec![(7, 3)]);
        let first = Assembly {
            keyed: true,
            ..Assembly::whole(RequestKind::Update, false, keyed(None))
        };
        assert_eq!(afters_of(&first), vec![]);
        let whole = keyed(None);
        assert_eq!(descriptor_len(&whole), Some(whole.len() - b"k=v".len()));
        // A descriptor cut by the first fragment's end: handed on whole, refused.
        assert_eq!(descriptor_len(&whole[..10]), None);
        assert_eq!(descriptor_len(b"junk"), None);
    }
}

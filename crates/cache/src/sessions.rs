//! What the cache knows of each session's requests: which numbers passed through the device
//! (so a read is served from the cache only when every request its session sent before it is
//! accounted for: read-your-writes), and which keyed writes are not yet acked by the log.
//!
//! A read carries `read_after`, the session's last request number. The cache may serve it only
//! if all of the session's requests up to that number reached this device and every keyed write
//! among them is acked (its value, or its invalidation, is in the table). Anything unknown is a
//! miss, which the server answers in order: a miss is always safe. Bounded: sessions (least
//! recently used forgotten), and the out-of-order numbers remembered per session.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// Sessions remembered at most.
pub const SESSIONS_MAX: usize = 65_536;
/// Numbers seen out of order remembered per session at most (beyond: the session is forgotten).
const ABOVE_MAX: usize = 256;

#[derive(Debug, Default, Clone)]
struct Seen {
    /// Every number up to this one passed through the device.
    through: u32,
    /// Numbers above `through` that passed.
    above: BTreeSet<u32>,
    /// Keyed writes that passed and are not yet acked (or refused) by the log.
    unacked: BTreeSet<u32>,
    /// The highest read id seen.
    reads_through: u32,
}

/// The sessions' requests as the cache saw them.
#[derive(Debug, Default)]
pub struct Sessions {
    seen: HashMap<u64, Seen>,
    order: VecDeque<u64>,
    pub forgotten: u64,
}

impl Sessions {
    /// Request `seq` of `session` passed through the device (`keyed`: a keyed write, not yet
    /// acked). `false` if the number had passed before (a duplicate).
    pub fn passed(&mut self, session: u64, seq: u32, keyed: bool) -> bool {
        if !self.seen.contains_key(&session) {
            // A session first seen: what came before is unknown, so `through` stays 0 until a
            // server's answer vouches for it (`applied_through`). Its first request is 1.
            self.insert_new(session, Seen::default());
        }
        let state = self.seen.get_mut(&session).expect("inserted");
        if seq <= state.through || state.above.contains(&seq) {
            return false;
        }
        if keyed {
            state.unacked.insert(seq);
        }
        if seq == state.through + 1 {
            state.through = seq;
            while state.above.remove(&(state.through + 1)) {
                state.through += 1;
            }
        } else {
            state.above.insert(seq);
            if state.above.len() > ABOVE_MAX {
                self.seen.remove(&session);
                self.forgotten += 1;
            }
        }
        true
    }

    /// Remember a session not known yet (forgetting the oldest one if the table is full).
    fn insert_new(&mut self, session: u64, seen: Seen) {
        if self.seen.len() >= SESSIONS_MAX {
            self.forget_oldest();
        }
        self.order.push_back(session);
        self.seen.insert(session, seen);
    }

    /// Read `id` of `session` came in: whether it is newer than every read of the session
    /// this device saw before (a session's first read here is). Only such a read may start a
    /// fetch: an older id is a retransmission or a replay, and an old answer to it (replayed
    /// too) would put an old value in the table.
    pub fn read_is_new(&mut self, session: u64, id: u32) -> bool {
        if !self.seen.contains_key(&session) {
            self.insert_new(
                session,
                Seen {
                    reads_through: id,
                    ..Seen::default()
                },
            );
            return true;
        }
        let state = self.seen.get_mut(&session).expect("present");
        if id <= state.reads_through {
            return false;
        }
        state.reads_through = id;
        true
    }

    /// The log acked (or refused to log) keyed write `seq` of `session`.
    pub fn settled(&mut self, session: u64, seq: u32) {
        if let Some(state) = self.seen.get_mut(&session) {
            state.unacked.remove(&seq);
        }
    }

    /// A server answered a read of `session` that came after `read_after`: every request of
    /// the session up to it is applied, so none is still on its way through this device.
    pub fn applied_through(&mut self, session: u64, read_after: u32) {
        if let Some(state) = self.seen.get_mut(&session) {
            if read_after > state.through {
                state.through = read_after;
                state.above.retain(|seq| *seq > read_after);
                while state.above.remove(&(state.through + 1)) {
                    state.through += 1;
                }
            }
            state.unacked.retain(|seq| *seq > read_after);
        } else if read_after > 0 {
            self.insert_new(
                session,
                Seen {
                    through: read_after,
                    ..Seen::default()
                },
            );
        }
    }

    /// Whether a read of `session` after `read_after` may be served by the cache.
    pub fn may_serve(&self, session: u64, read_after: u32) -> bool {
        if read_after == 0 {
            return true;
        }
        self.seen.get(&session).is_some_and(|state| {
            state.through >= read_after && state.unacked.range(..=read_after).next().is_none()
        })
    }

    fn forget_oldest(&mut self) {
        while let Some(oldest) = self.order.pop_front() {
            if self.seen.remove(&oldest).is_some() {
                self.forgotten += 1;
                return;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_served_only_when_its_session_s_earlier_requests_are_accounted_for() {
        let mut sessions = Sessions::default();
        assert!(sessions.may_serve(1, 0), "a session that sent nothing");
        assert!(
            !sessions.may_serve(1, 1),
            "unknown session, one request before"
        );
        assert!(sessions.passed(1, 1, false));
        assert!(sessions.may_serve(1, 1));
        // Request 3 (a keyed write) passed, 2 did not yet: a read after 3 is a miss.
        assert!(sessions.passed(1, 3, true));
        assert!(!sessions.may_serve(1, 3));
        assert!(sessions.passed(1, 2, false));
        assert!(!sessions.may_serve(1, 3), "the keyed write is not acked");
        sessions.settled(1, 3);
        assert!(sessions.may_serve(1, 3));
        assert!(!sessions.passed(1, 2, false), "a duplicate");
        // A server's answer vouches for what came before it.
        sessions.applied_through(9, 40);
        assert!(sessions.may_serve(9, 40));
        assert!(!sessions.may_serve(9, 41));
    }

    #[test]
    fn only_a_read_newer_than_every_read_seen_of_its_session_is_new() {
        let mut sessions = Sessions::default();
        assert!(sessions.read_is_new(7, 3), "a session's first read here");
        assert!(
            !sessions.read_is_new(7, 3),
            "again: a retransmission or a replay"
        );
        assert!(!sessions.read_is_new(7, 2), "an older one");
        assert!(sessions.read_is_new(7, 4));
        assert!(sessions.read_is_new(8, 1), "sessions are apart");
    }
}

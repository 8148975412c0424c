//! The store's contents in memory: keys, the session table ordered by activity, and the
//! byte accounting that bounds what a snapshot of them needs.

use std::collections::{BTreeMap, HashMap};

use crate::codec::{MAX_KEY_LEN, MAX_REPLY_LEN, MAX_VALUE_LEN};

use super::layout::SNAPSHOT_RECORD_SIZE;
use super::{
    key_record_size, session_excess, session_record_size, Effect, Outcome, SESSION_FLOOR_BYTES,
};

/// A session's dedupe record in memory.
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) last_seq: u32,
    pub(super) last_reply: Vec<u8>,
    /// Logical clock value of its last apply: orders eviction.
    pub(super) activity: u64,
    /// The server's time (milliseconds) of its last apply, as [`super::KvStore::note_time`]
    /// last told it; 0 for a session recovered at open (not persisted).
    pub(super) seen_ms: u64,
}

/// The store's contents in memory, and the byte accounting that bounds its snapshot.
#[derive(Debug)]
pub(super) struct State {
    pub(super) max_sessions: u32,
    pub(super) keys: HashMap<Vec<u8>, Vec<u8>>,
    pub(super) sessions: HashMap<u64, Session>,
    /// activity → session id: the first entry is the eviction candidate.
    pub(super) sessions_by_activity: BTreeMap<u64, u64>,
    /// Activity of the latest apply (logical clock, one tick per apply).
    pub(super) clock: u64,
    /// Sum of the KEY records a snapshot would hold.
    pub(super) key_bytes: usize,
    /// Sum of the SESSION records a snapshot would hold.
    pub(super) session_bytes: usize,
    /// Sum of [`session_excess`] over sessions.
    pub(super) session_excess_bytes: usize,
}

impl State {
    pub(super) fn new(max_sessions: u32) -> State {
        State {
            max_sessions,
            keys: HashMap::new(),
            sessions: HashMap::new(),
            sessions_by_activity: BTreeMap::new(),
            clock: 0,
            key_bytes: 0,
            session_bytes: 0,
            session_excess_bytes: 0,
        }
    }

    /// Exact size of a snapshot of this state.
    pub(super) fn snapshot_bytes(&self) -> usize {
        SNAPSHOT_RECORD_SIZE + self.key_bytes + self.session_bytes
    }

    /// Upper bound on the snapshot of this state or of any state reachable from it by ERROR
    /// replies alone: every session slot, used or not, at least a store ERROR reply.
    pub(super) fn committed_bytes(&self) -> usize {
        SNAPSHOT_RECORD_SIZE
            + self.key_bytes
            + self.max_sessions as usize * SESSION_FLOOR_BYTES
            + self.session_excess_bytes
    }

    /// [`State::committed_bytes`] after `outcome` were applied for `session_id`.
    pub(super) fn committed_bytes_after(&self, session_id: u64, outcome: &Outcome<'_>) -> usize {
        let mut key_bytes = self.key_bytes;
        let (key, new_value_len) = match &outcome.effect {
            Effect::None => (None, None),
            Effect::Put { key, value } => (Some(*key), Some(value.len())),
            Effect::Delete { key } => (Some(*key), None),
        };
        if let Some(key) = key {
            if let Some(old) = self.keys.get(key) {
                key_bytes -= key_record_size(key.len(), old.len());
            }
            if let Some(value_len) = new_value_len {
                key_bytes += key_record_size(key.len(), value_len);
            }
        }
        let mut excess = self.session_excess_bytes;
        match self.sessions.get(&session_id) {
            Some(session) => excess -= session_excess(session.last_reply.len()),
            None if self.sessions.len() == self.max_sessions as usize => {
                let evicted = self
                    .sessions_by_activity
                    .values()
                    .next()
                    .expect("table is full");
                excess -= session_excess(self.sessions[evicted].last_reply.len());
            }
            None => {}
        }
        excess += session_excess(outcome.reply.len());
        SNAPSHOT_RECORD_SIZE + key_bytes + self.max_sessions as usize * SESSION_FLOOR_BYTES + excess
    }

    pub(super) fn put(&mut self, key: &[u8], value: &[u8]) {
        assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
        assert!(value.len() <= MAX_VALUE_LEN);
        self.key_bytes += key_record_size(key.len(), value.len());
        if let Some(old) = self.keys.get_mut(key) {
            self.key_bytes -= key_record_size(key.len(), old.len());
            old.clear();
            old.extend_from_slice(value);
        } else {
            self.keys.insert(key.to_vec(), value.to_vec());
        }
    }

    pub(super) fn delete(&mut self, key: &[u8]) {
        if let Some(old) = self.keys.remove(key) {
            self.key_bytes -= key_record_size(key.len(), old.len());
        }
    }

    /// Record that `session_id` applied `seq` with `reply` at `activity`; returns the session
    /// evicted to make room, if any.
    pub(super) fn touch_session(
        &mut self,
        session_id: u64,
        seq: u32,
        reply: Vec<u8>,
        activity: u64,
        seen_ms: u64,
    ) -> Option<u64> {
        assert!(activity > self.clock, "activity clock went backwards");
        assert!(reply.len() <= MAX_REPLY_LEN);
        self.clock = activity;
        let mut evicted = None;
        if let Some(old) = self.sessions.remove(&session_id) {
            assert!(seq > old.last_seq);
            self.forget_session(session_id, &old);
        } else if self.sessions.len() == self.max_sessions as usize {
            let oldest_id = *self
                .sessions_by_activity
                .values()
                .next()
                .expect("table is full");
            let oldest = self
                .sessions
                .remove(&oldest_id)
                .expect("indexed session exists");
            self.forget_session(oldest_id, &oldest);
            evicted = Some(oldest_id);
        }
        self.insert_session(
            session_id,
            Session {
                last_seq: seq,
                last_reply: reply,
                activity,
                seen_ms,
            },
        );
        assert!(self.sessions.len() <= self.max_sessions as usize);
        evicted
    }

    /// The session [`State::touch_session`] would evict to admit a new one: the one whose
    /// last apply is oldest, when the table is full.
    pub(super) fn eviction_candidate(&self) -> Option<(u64, &Session)> {
        if self.sessions.len() < self.max_sessions as usize {
            return None;
        }
        let oldest = self.sessions_by_activity.values().next()?;
        Some((*oldest, self.sessions.get(oldest)?))
    }

    pub(super) fn insert_session(&mut self, session_id: u64, session: Session) {
        self.session_bytes += session_record_size(session.last_reply.len());
        self.session_excess_bytes += session_excess(session.last_reply.len());
        let previous = self
            .sessions_by_activity
            .insert(session.activity, session_id);
        assert!(previous.is_none(), "two sessions with one activity");
        let previous = self.sessions.insert(session_id, session);
        assert!(previous.is_none());
    }

    /// Remove a session (already taken out of `sessions`) from the index and the accounting.
    fn forget_session(&mut self, session_id: u64, session: &Session) {
        let indexed = self.sessions_by_activity.remove(&session.activity);
        assert_eq!(indexed, Some(session_id));
        self.session_bytes -= session_record_size(session.last_reply.len());
        self.session_excess_bytes -= session_excess(session.last_reply.len());
    }
}

#[cfg(any(test, debug_assertions))]
impl State {
    /// The byte accounting is the sum over the contents, the activity index is the session
    /// table ordered, and everything is within the codec's and the table's bounds.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut key_bytes = 0;
        for (key, value) in &self.keys {
            if key.is_empty() || key.len() > MAX_KEY_LEN || value.len() > MAX_VALUE_LEN {
                return Err(format!(
                    "a key of {} bytes holds a value of {} bytes",
                    key.len(),
                    value.len()
                ));
            }
            key_bytes += key_record_size(key.len(), value.len());
        }
        if key_bytes != self.key_bytes {
            return Err(format!(
                "the keys' records take {key_bytes} bytes, the count says {}",
                self.key_bytes
            ));
        }
        if self.sessions.len() > self.max_sessions as usize {
            return Err(format!(
                "{} sessions, at most {} allowed",
                self.sessions.len(),
                self.max_sessions
            ));
        }
        // Activities are distinct keys, so an index as long as the table that names each
        // session at its own activity names every session once.
        if self.sessions_by_activity.len() != self.sessions.len() {
            return Err(format!(
                "{} sessions by activity, {} sessions",
                self.sessions_by_activity.len(),
                self.sessions.len()
            ));
        }
        for (activity, session_id) in &self.sessions_by_activity {
            let session = self.sessions.get(session_id).ok_or_else(|| {
                format!("activity {activity} names session {session_id}, which is not there")
            })?;
            if session.activity != *activity {
                return Err(format!(
                    "activity {activity} names session {session_id}, last active at {}",
                    session.activity
                ));
            }
            if *activity > self.clock {
                return Err(format!(
                    "session {session_id} was active at {activity}, after the clock ({})",
                    self.clock
                ));
            }
        }
        let (mut session_bytes, mut excess_bytes) = (0, 0);
        for session in self.sessions.values() {
            if session.last_reply.len() > MAX_REPLY_LEN {
                return Err(format!("a reply of {} bytes", session.last_reply.len()));
            }
            session_bytes += session_record_size(session.last_reply.len());
            excess_bytes += session_excess(session.last_reply.len());
        }
        if (session_bytes, excess_bytes) != (self.session_bytes, self.session_excess_bytes) {
            return Err(format!(
                "the sessions' records take {session_bytes} bytes, {excess_bytes} beyond their \
                 reserve; the counts say {} and {}",
                self.session_bytes, self.session_excess_bytes
            ));
        }
        Ok(())
    }
}

//! The store's DRAM view of the client sessions, by client-chosen session id.
//!
//! Every write looks its session up, and consecutive writes nearly always come from the same
//! session (a client's window arrives together, and a receive batch holds runs of one
//! client's datagrams). So the states live in a dense vector, a hash map gives a session's
//! position, and the position of the session looked up last is remembered: a write of the
//! same session as the one before compares one id instead of hashing and probing. The hint is
//! only ever checked against the id stored at that position, so a stale hint costs a map
//! lookup, never a wrong answer.

use hashbrown::HashMap;

/// Where a session's last applied request, and the reply to repeat for it, is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The session's last applied request is the record with this id (reply derived from it).
    Record(u32),
    /// The session table holds it.
    Table,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionState {
    pub last_seq: u32,
    pub source: Source,
    /// The session-table entry the session owns, if any.
    pub table: Option<u32>,
    /// The store's activity counter when the session last applied a request (eviction order).
    pub last_active: u64,
    /// The server's time (milliseconds) of its last apply ([`Store::note_time`]); 0 for a
    /// session recovered at open.
    ///
    /// [`Store::note_time`]: crate::Store
    pub seen_ms: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// Session id → position in `states`. A seeded hash (foldhash), so ids cannot be chosen to
    /// collide.
    positions: HashMap<u64, u32>,
    states: Vec<(u64, SessionState)>,
    /// The position of the session looked up last (checked against its id before use).
    recent: u32,
}

impl Sessions {
    pub fn len(&self) -> usize {
        self.states.len()
    }

    fn position(&self, session_id: u64) -> Option<usize> {
        let recent = self.recent as usize;
        if self
            .states
            .get(recent)
            .is_some_and(|(id, _)| *id == session_id)
        {
            return Some(recent);
        }
        self.positions.get(&session_id).map(|&at| at as usize)
    }

    pub fn get(&self, session_id: u64) -> Option<&SessionState> {
        self.position(session_id).map(|at| &self.states[at].1)
    }

    pub fn get_mut(&mut self, session_id: u64) -> Option<&mut SessionState> {
        let at = self.position(session_id)?;
        self.recent = at as u32;
        Some(&mut self.states[at].1)
    }

    /// The state of `session_id`, entered as `new()` if it has none.
    pub fn get_or_insert_with(
        &mut self,
        session_id: u64,
        new: impl FnOnce() -> SessionState,
    ) -> &mut SessionState {
        let at = match self.position(session_id) {
            Some(at) => at,
            None => {
                let at = self.states.len();
                self.states.push((session_id, new()));
                self.positions.insert(session_id, at as u32);
                at
            }
        };
        self.recent = at as u32;
        &mut self.states[at].1
    }

    /// Enter `state` for `session_id`, replacing any it had.
    pub fn insert(&mut self, session_id: u64, state: SessionState) {
        *self.get_or_insert_with(session_id, || state) = state;
    }

    pub fn remove(&mut self, session_id: u64) -> Option<SessionState> {
        let at = self.positions.remove(&session_id)? as usize;
        let (_, state) = self.states.swap_remove(at);
        if let Some((moved, _)) = self.states.get(at) {
            self.positions.insert(*moved, at as u32);
        }
        Some(state)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &SessionState)> {
        self.states.iter().map(|(id, state)| (*id, state))
    }

    pub fn values(&self) -> impl Iterator<Item = &SessionState> {
        self.states.iter().map(|(_, state)| state)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut SessionState> {
        self.states.iter_mut().map(|(_, state)| state)
    }
}

#[cfg(any(test, debug_assertions))]
impl Sessions {
    /// The map gives every session's position and nothing else.
    pub fn check(&self) -> Result<(), String> {
        if self.positions.len() != self.states.len() {
            return Err(format!(
                "{} session positions for {} sessions",
                self.positions.len(),
                self.states.len()
            ));
        }
        for (at, (session_id, _)) in self.states.iter().enumerate() {
            if self.positions.get(session_id) != Some(&(at as u32)) {
                return Err(format!(
                    "session {session_id} is at {at}, its position says {:?}",
                    self.positions.get(session_id)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap as Model;

    fn state(seq: u32) -> SessionState {
        SessionState {
            last_seq: seq,
            source: Source::Table,
            table: None,
            last_active: 0,
            seen_ms: 0,
        }
    }

    proptest! {
        /// Whatever the order of inserts, updates, lookups and removals, the sessions agree
        /// with a plain map (the remembered position never answers for another session).
        #[test]
        fn sessions_agree_with_a_map(ops in proptest::collection::vec((0u8..4, 0u64..6, any::<u32>()), 0..200)) {
            let mut sessions = Sessions::default();
            let mut model: Model<u64, u32> = Model::new();
            for (op, id, seq) in ops {
                match op {
                    0 => {
                        sessions.get_or_insert_with(id, || state(seq)).last_seq = seq;
                        model.insert(id, seq);
                    }
                    1 => {
                        let got = sessions.get_mut(id).map(|s| s.last_seq);
                        prop_assert_eq!(got, model.get(&id).copied());
                    }
                    2 => {
                        let removed = sessions.remove(id).map(|s| s.last_seq);
                        prop_assert_eq!(removed, model.remove(&id));
                    }
                    _ => {
                        sessions.insert(id, state(seq));
                        model.insert(id, seq);
                    }
                }
                prop_assert_eq!(sessions.len(), model.len());
                for (id, seq) in &model {
                    prop_assert_eq!(sessions.get(*id).map(|s| s.last_seq), Some(*seq));
                }
                let mut listed: Vec<(u64, u32)> =
                    sessions.iter().map(|(id, s)| (id, s.last_seq)).collect();
                listed.sort_unstable();
                let mut expected: Vec<(u64, u32)> = model.iter().map(|(id, seq)| (*id, *seq)).collect();
                expected.sort_unstable();
                prop_assert_eq!(listed, expected);
            }
        }
    }
}

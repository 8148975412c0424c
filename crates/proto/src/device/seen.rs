//! What a device remembers of each session's traffic besides its log: when it first saw each
//! new highest number of the session, logged or not, so that it can date a gap for its server
//! (every number below one seen at `t` was first sent by its client before `t`, and the
//! client gives up on it at most [`pmnet_wire::MAX_REQUEST_LIFETIME_MS`] later), and the
//! no-op fills its client sent (numbers the client gave up on), which the device sends the
//! server again when it asks for those numbers: a fill sent while the server was down is
//! lost, and its client may be gone by the time the server is back.
//!
//! Volatile and bounded: a device that restarts, or forgets a session, knows less, and a
//! server that learns less waits longer; nothing here is ever needed for safety.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::Time;

/// Seen points a session keeps; past it the two closest in time are merged.
const SEEN_POINTS_MAX: usize = 16;
/// A new highest number seen within this long of the point before the last moves the last
/// point instead of adding one (points are at least this far apart, every other one).
const SEEN_POINT_SPACING: Duration = Duration::from_millis(10);
/// No-op fills a session keeps, the newest.
const FILLS_KEPT: usize = 32;

#[derive(Debug, Default)]
struct Seen {
    /// `(bound, time)`: every number below `bound` was first sent by `time`; ascending in
    /// both. A point dropped or moved only makes a number's date later, never earlier.
    points: VecDeque<(u32, Time)>,
    highest: u32,
    /// Numbers the client sent a no-op fill for, newest last.
    fills: VecDeque<u32>,
}

impl Seen {
    fn note(&mut self, seq: u32, now: Time) {
        if seq <= self.highest && !self.points.is_empty() {
            return;
        }
        self.highest = self.highest.max(seq);
        let bound = seq.saturating_add(1);
        let len = self.points.len();
        if len >= 2 && now.saturating_duration_since(self.points[len - 2].1) < SEEN_POINT_SPACING {
            *self.points.back_mut().expect("two points") = (bound, now);
            return;
        }
        self.points.push_back((bound, now));
        if self.points.len() > SEEN_POINTS_MAX {
            // Merge the two points closest in time: the numbers of the earlier one are dated
            // by the later one from now on.
            let closest = (0..self.points.len() - 1)
                .min_by_key(|&i| {
                    self.points[i + 1]
                        .1
                        .saturating_duration_since(self.points[i].1)
                })
                .expect("more than one point");
            self.points.remove(closest);
        }
    }

    fn first_seen_through(&self, seq: u32) -> Option<Time> {
        self.points
            .iter()
            .find(|(bound, _)| *bound > seq)
            .map(|(_, at)| *at)
    }
}

/// What the device remembers of each (server, session), the oldest session forgotten first.
#[derive(Debug)]
pub(super) struct SeenSessions {
    sessions: HashMap<(u16, u64), Seen>,
    order: VecDeque<(u16, u64)>,
    sessions_max: usize,
}

impl SeenSessions {
    pub(super) fn new(sessions_max: usize) -> SeenSessions {
        SeenSessions {
            sessions: HashMap::new(),
            order: VecDeque::new(),
            sessions_max: sessions_max.max(1),
        }
    }

    fn session(&mut self, server_id: u16, session_id: u64) -> &mut Seen {
        let key = (server_id, session_id);
        if !self.sessions.contains_key(&key) {
            while self.sessions.len() >= self.sessions_max {
                let Some(oldest) = self.order.pop_front() else {
                    break;
                };
                self.sessions.remove(&oldest);
            }
            self.order.push_back(key);
        }
        self.sessions.entry(key).or_default()
    }

    /// Number `seq` of the session passed through the device at `now` (or was found in the
    /// log at start-up, `now` being the start).
    pub(super) fn note(&mut self, server_id: u16, session_id: u64, seq: u32, now: Time) {
        self.session(server_id, session_id).note(seq, now);
    }

    /// The client sent a no-op fill for `seq`: it gave up on that number.
    pub(super) fn note_fill(&mut self, server_id: u16, session_id: u64, seq: u32, now: Time) {
        let seen = self.session(server_id, session_id);
        seen.note(seq, now);
        if seen.fills.contains(&seq) {
            return;
        }
        if seen.fills.len() >= FILLS_KEPT {
            seen.fills.pop_front();
        }
        seen.fills.push_back(seq);
    }

    /// When this device first saw `seq` or a later number of the session, if it remembers:
    /// every number up to `seq` was sent by then.
    pub(super) fn first_seen_through(
        &self,
        server_id: u16,
        session_id: u64,
        seq: u32,
    ) -> Option<Time> {
        self.sessions
            .get(&(server_id, session_id))?
            .first_seen_through(seq)
    }

    /// The numbers in `first ..= last` the session's client sent a no-op fill for, ascending.
    pub(super) fn fills_in(
        &self,
        server_id: u16,
        session_id: u64,
        first: u32,
        last: u32,
    ) -> Vec<u32> {
        let Some(seen) = self.sessions.get(&(server_id, session_id)) else {
            return Vec::new();
        };
        let mut fills: Vec<u32> = seen
            .fills
            .iter()
            .copied()
            .filter(|seq| (first..=last).contains(seq))
            .collect();
        fills.sort_unstable();
        fills
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Time {
        Time::from_nanos(millis * 1_000_000)
    }

    #[test]
    fn a_number_is_dated_by_its_first_sight_or_a_later_one_and_never_too_early() {
        let mut seen = SeenSessions::new(4);
        // Sessions's numbers at 1 ms apart, then a far later burst.
        let mut truth = Vec::new();
        for seq in 1..=2000u32 {
            let at = ms(u64::from(seq));
            seen.note(1, 7, seq, at);
            truth.push(at);
        }
        for seq in 2001..=2100u32 {
            let at = ms(60_000 + u64::from(seq));
            seen.note(1, 7, seq, at);
            truth.push(at);
        }
        seen.note(1, 7, 5, ms(90_000)); // lower: changes nothing
        for seq in 1..2100u32 {
            // `seq` itself was first seen then: it was sent by then, and so was every number
            // below it.
            let real = truth[seq as usize - 1];
            let dated = seen.first_seen_through(1, 7, seq).expect("dated");
            assert!(dated >= real, "{seq}: dated {dated:?}, seen {real:?}");
        }
        // The two bursts stay apart: the first one is not dated by the second.
        assert!(seen.first_seen_through(1, 7, 1000).expect("dated") < ms(10_000));
        assert_eq!(seen.first_seen_through(1, 7, 2101), None);
        assert_eq!(
            seen.first_seen_through(2, 7, 1),
            None,
            "another server's session"
        );
        assert!(seen.sessions[&(1, 7)].points.len() <= SEEN_POINTS_MAX);
    }

    #[test]
    fn fills_are_kept_per_session_bounded_and_sessions_forgotten_oldest_first() {
        let mut seen = SeenSessions::new(2);
        for seq in 1..=100u32 {
            seen.note_fill(1, 7, seq, ms(1));
        }
        assert_eq!(seen.fills_in(1, 7, 60, 70), (69..=70).collect::<Vec<_>>());
        assert_eq!(seen.fills_in(1, 7, 1, 100).len(), FILLS_KEPT);
        seen.note(1, 8, 1, ms(2));
        seen.note(1, 9, 1, ms(3));
        assert!(seen.fills_in(1, 7, 1, 100).is_empty(), "forgotten");
        assert_eq!(seen.sessions.len(), 2);
    }
}

//! The devices before this one in chains, and the fill queries passed on to them.
//!
//! A server skips a missing sequence number only once every device that could hold it says
//! it does not (`server/gap.rs`). With devices in series the server asks the last device
//! only, and a device before it may hold — and have acked — what the last one never logged
//! (its log was full, or a partition kept the request from it). So a device that has devices
//! before it answers a fill query only after it has asked each of them the same question (as
//! their "server") and heard every answer: the reply names the lowest number any of them
//! holds whole (each resends what it holds towards the server) and the earliest date any of
//! them can vouch for. A device before it that never answers (down, or cut off) holds the
//! gap open; the server asks again on its gap timer, and the question is passed on again.
//!
//! Hold queries (the server asks whether its devices hold an entry of sessions it would
//! forget: `server/hold.rs`) are passed on the same way: a session is held when this device
//! or any before it holds one, and a device before it that never answers keeps the server
//! from forgetting those sessions.
//!
//! Which devices are before this one is configuration (`--previous-device`), never learned
//! from traffic: a genuine probe replayed from another source address would otherwise make a
//! device wait for answers from a host that never gives any, and every gap stay open. A probe
//! from an address that is not named is worth a warning (rate-limited): it may be a device
//! of a chain whose operator forgot to name it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use crate::Time;

/// Devices before this one per server id, at most.
pub(super) const PREVIOUS_DEVICES_MAX: usize = 8;
/// Fill queries waiting for the devices before this one, at most; past it the oldest is
/// forgotten (its server asks again).
const PENDING_MAX: usize = 4096;

/// A question unanswered this long is worth a warning (at most one per [`WARN_INTERVAL`]).
const WARN_AFTER: Duration = Duration::from_secs(10);
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// A fill query of the server, asked of the devices before this one.
#[derive(Debug)]
struct Pending {
    /// When it was first asked.
    since: Time,
    awaiting: BTreeSet<SocketAddr>,
    /// The lowest number held whole by one of them that answered; `None` for none.
    held_from: Option<u32>,
    /// The oldest sighting of the range's last number (or a later one) they reported, in
    /// milliseconds before their answer.
    seen_ms: Option<u32>,
}

/// Hold queries waiting for the devices before this one, at most (a server sends at most
/// four a second); past it the oldest is forgotten.
const HOLDS_PENDING_MAX: usize = 64;

/// A hold query of the server, asked of the devices before this one.
#[derive(Debug)]
struct PendingHold {
    awaiting: BTreeSet<SocketAddr>,
    /// Per session asked about: whether this device or one that answered holds an entry.
    held: Vec<bool>,
}

/// Key of a pending query: (server id, session, first, last).
pub(super) type QueryKey = (u16, u64, u32, u32);

/// What the previous devices said of one query, once all of them answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Answered {
    pub(super) held_from: Option<u32>,
    pub(super) seen_ms: Option<u32>,
}

#[derive(Debug)]
pub(super) struct Upstream {
    configured: BTreeMap<u16, BTreeSet<SocketAddr>>,
    /// When a probe from an address not named last drew a warning.
    probe_warned_at: Option<Time>,
    pending: BTreeMap<QueryKey, Pending>,
    order: VecDeque<QueryKey>,
    warned_at: Option<Time>,
    /// Hold queries by (server id, number), oldest first in `hold_order`.
    holds: BTreeMap<(u16, u32), PendingHold>,
    hold_order: VecDeque<(u16, u32)>,
}

impl Upstream {
    pub(super) fn new(configured: &[(u16, SocketAddr)]) -> Upstream {
        let mut by_server: BTreeMap<u16, BTreeSet<SocketAddr>> = BTreeMap::new();
        for &(server_id, address) in configured {
            let set = by_server.entry(server_id).or_default();
            if set.len() < PREVIOUS_DEVICES_MAX {
                set.insert(address);
            }
        }
        Upstream {
            configured: by_server,
            probe_warned_at: None,
            pending: BTreeMap::new(),
            order: VecDeque::new(),
            warned_at: None,
            holds: BTreeMap::new(),
            hold_order: VecDeque::new(),
        }
    }

    /// The server sent hold query `number`; `held` says, per session asked about, whether
    /// this device holds an entry of it. `None` when there are no devices before this one
    /// (answer at once); otherwise the ones to ask: all of them for a new query, those that
    /// have not answered for a repeated one (its answer waits for them all).
    pub(super) fn ask_hold(
        &mut self,
        server_id: u16,
        number: u32,
        held: Vec<bool>,
    ) -> Option<Vec<SocketAddr>> {
        let previous = self.previous(server_id);
        if previous.is_empty() {
            return None;
        }
        if let Some(pending) = self.holds.get(&(server_id, number)) {
            return Some(pending.awaiting.iter().copied().collect());
        }
        while self.holds.len() >= HOLDS_PENDING_MAX {
            let Some(oldest) = self.hold_order.pop_front() else {
                break;
            };
            self.holds.remove(&oldest);
        }
        self.holds.insert(
            (server_id, number),
            PendingHold {
                awaiting: previous.iter().copied().collect(),
                held,
            },
        );
        self.hold_order.push_back((server_id, number));
        Some(previous)
    }

    /// Device `from` answered hold query `number` with `held`. Once every one answered,
    /// `Ok(Some(held))`: per session, whether any of them or this device holds an entry.
    /// `Err(())` when no such query waits for `from`, or the answer does not fit it.
    pub(super) fn hold_answered(
        &mut self,
        from: SocketAddr,
        server_id: u16,
        number: u32,
        held: &[bool],
    ) -> Result<Option<Vec<bool>>, ()> {
        let key = (server_id, number);
        let Some(pending) = self.holds.get_mut(&key) else {
            return Err(());
        };
        if held.len() != pending.held.len() || !pending.awaiting.remove(&from) {
            return Err(());
        }
        for (mine, theirs) in pending.held.iter_mut().zip(held) {
            *mine |= *theirs;
        }
        if !pending.awaiting.is_empty() {
            return Ok(None);
        }
        let pending = self.holds.remove(&key).expect("present");
        self.hold_order.retain(|&queued| queued != key);
        Ok(Some(pending.held))
    }

    /// `address` probed this device about `server_id` at `now`: true when it is not named as
    /// a device before this one and no such warning was given within [`WARN_INTERVAL`].
    pub(super) fn probe_worth_warning(
        &mut self,
        now: Time,
        server_id: u16,
        address: SocketAddr,
    ) -> bool {
        if self.is_previous(server_id, address)
            || self
                .probe_warned_at
                .is_some_and(|at| now.saturating_duration_since(at) < WARN_INTERVAL)
        {
            return false;
        }
        self.probe_warned_at = Some(now);
        true
    }

    /// Whether `address` is a device before this one for `server_id`.
    pub(super) fn is_previous(&self, server_id: u16, address: SocketAddr) -> bool {
        self.configured
            .get(&server_id)
            .is_some_and(|set| set.contains(&address))
    }

    /// The devices before this one for `server_id`.
    pub(super) fn previous(&self, server_id: u16) -> Vec<SocketAddr> {
        self.configured
            .get(&server_id)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The server asked about `first ..= last` of the session at `now`: the devices before
    /// this one still to answer (all of them for a new question; those that have not answered
    /// for a repeated one), to be asked (again).
    pub(super) fn ask(&mut self, now: Time, key: QueryKey) -> Vec<SocketAddr> {
        if let Some(pending) = self.pending.get(&key) {
            let waiting: Vec<SocketAddr> = pending.awaiting.iter().copied().collect();
            let long = now.saturating_duration_since(pending.since) >= WARN_AFTER;
            let quiet = self
                .warned_at
                .is_none_or(|at| now.saturating_duration_since(at) >= WARN_INTERVAL);
            if long && quiet {
                self.warned_at = Some(now);
                let names: Vec<String> = waiting.iter().map(ToString::to_string).collect();
                tracing::warn!(
                    "a gap of server {} waits {:.0} s on the device(s) before this one that \
                     have not answered: {}. If one is lost for good, take it out of the chain: \
                     restart this device without it (--previous-device); until then the gap \
                     stays open",
                    key.0,
                    now.saturating_duration_since(pending.since).as_secs_f64(),
                    names.join(", ")
                );
            }
            return waiting;
        }
        let previous = self.previous(key.0);
        if previous.is_empty() {
            return previous;
        }
        while self.pending.len() >= PENDING_MAX {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.pending.remove(&oldest);
        }
        self.pending.insert(
            key,
            Pending {
                since: now,
                awaiting: previous.iter().copied().collect(),
                held_from: None,
                seen_ms: None,
            },
        );
        self.order.push_back(key);
        previous
    }

    /// Device `from` answered a question passed on to it. What all of them said, once the
    /// last one answered; `Err(())` when no such question waits for `from` (stale or forged).
    pub(super) fn answered(
        &mut self,
        from: SocketAddr,
        key: QueryKey,
        held_from: u32,
        seen_ms: Option<u32>,
    ) -> Result<Option<Answered>, ()> {
        let (_, _, first, last) = key;
        let Some(pending) = self.pending.get_mut(&key) else {
            return Err(());
        };
        if !pending.awaiting.remove(&from) {
            return Err(());
        }
        if (first..=last).contains(&held_from) {
            pending.held_from = Some(pending.held_from.map_or(held_from, |h| h.min(held_from)));
        }
        if let Some(age) = seen_ms {
            pending.seen_ms = Some(pending.seen_ms.map_or(age, |known| known.max(age)));
        }
        if !pending.awaiting.is_empty() {
            return Ok(None);
        }
        let pending = self.pending.remove(&key).expect("present");
        self.order.retain(|&queued| queued != key);
        Ok(Some(Answered {
            held_from: pending.held_from,
            seen_ms: pending.seen_ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_question_is_answered_once_every_previous_device_answered_with_the_lowest_hold_and_oldest_date(
    ) {
        let mut upstream = Upstream::new(&[(1, addr(1)), (1, addr(2))]);
        assert!(upstream.previous(2).is_empty(), "another server");
        let key = (1, 7, 30, 40);
        assert_eq!(upstream.ask(Time::ZERO, key), vec![addr(1), addr(2)]);
        assert_eq!(upstream.answered(addr(3), key, 41, None), Err(()));
        assert_eq!(upstream.answered(addr(1), key, 35, Some(10)), Ok(None));
        assert_eq!(
            upstream.answered(addr(1), key, 35, Some(10)),
            Err(()),
            "twice"
        );
        assert_eq!(upstream.ask(Time::ZERO, key), vec![addr(2)], "asked again");
        assert_eq!(
            upstream.answered(addr(2), key, 31, Some(5_000)),
            Ok(Some(Answered {
                held_from: Some(31),
                seen_ms: Some(5_000)
            }))
        );
        assert_eq!(upstream.answered(addr(2), key, 31, None), Err(()), "done");
        // Answers naming nothing of the range hold nothing.
        upstream.ask(Time::ZERO, key);
        upstream.answered(addr(1), key, 41, None).unwrap();
        assert_eq!(
            upstream.answered(addr(2), key, 7, None),
            Ok(Some(Answered {
                held_from: None,
                seen_ms: None
            }))
        );
    }

    #[test]
    fn a_hold_query_is_answered_once_every_previous_device_answered_with_what_any_holds() {
        let mut upstream = Upstream::new(&[(1, addr(1)), (1, addr(2))]);
        assert_eq!(
            upstream.ask_hold(2, 5, vec![false]),
            None,
            "none for server 2"
        );
        let mine = vec![true, false, false];
        assert_eq!(
            upstream.ask_hold(1, 5, mine.clone()),
            Some(vec![addr(1), addr(2)])
        );
        // A repeat (a duplicate, or the server asking again) is not answered alone: the
        // devices that have not answered are asked again.
        assert_eq!(
            upstream.ask_hold(1, 5, mine.clone()),
            Some(vec![addr(1), addr(2)])
        );
        assert_eq!(upstream.hold_answered(addr(3), 1, 5, &[false; 3]), Err(()));
        assert_eq!(
            upstream.hold_answered(addr(1), 1, 5, &[false; 2]),
            Err(()),
            "misfit"
        );
        assert_eq!(
            upstream.hold_answered(addr(1), 1, 5, &[false, true, false]),
            Ok(None)
        );
        assert_eq!(
            upstream.ask_hold(1, 5, mine),
            Some(vec![addr(2)]),
            "only the one still silent"
        );
        assert_eq!(
            upstream.hold_answered(addr(1), 1, 5, &[false; 3]),
            Err(()),
            "twice"
        );
        assert_eq!(
            upstream.hold_answered(addr(2), 1, 5, &[false; 3]),
            Ok(Some(vec![true, true, false]))
        );
        assert_eq!(
            upstream.hold_answered(addr(2), 1, 5, &[false; 3]),
            Err(()),
            "done"
        );
        for number in 0..(HOLDS_PENDING_MAX as u32 + 10) {
            upstream.ask_hold(1, 1000 + number, vec![false]);
        }
        assert_eq!(upstream.holds.len(), HOLDS_PENDING_MAX);
    }

    #[test]
    fn previous_devices_and_questions_are_bounded_and_probes_teach_nothing() {
        let named: Vec<(u16, SocketAddr)> = (0..100).map(|port| (1, addr(port))).collect();
        let mut upstream = Upstream::new(&named);
        assert_eq!(upstream.previous(1).len(), PREVIOUS_DEVICES_MAX);
        let second = Duration::from_secs(1);
        assert!(
            !upstream.probe_worth_warning(Time::ZERO, 1, addr(0)),
            "named"
        );
        assert!(upstream.probe_worth_warning(Time::ZERO, 1, addr(500)));
        assert!(!upstream.probe_worth_warning(Time::ZERO + second, 1, addr(501)));
        assert!(upstream.probe_worth_warning(Time::ZERO + 61 * second, 1, addr(501)));
        assert!(
            !upstream.is_previous(1, addr(500)),
            "a probe teaches nothing"
        );
        for session in 0..(PENDING_MAX as u64 + 10) {
            upstream.ask(Time::ZERO, (1, session, 1, 1));
        }
        assert_eq!(upstream.pending.len(), PENDING_MAX);
        assert!(
            !upstream.pending.contains_key(&(1, 0, 1, 1)),
            "oldest forgotten"
        );
    }
}

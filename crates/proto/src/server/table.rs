//! The server's session table: sessions by id, the order they were last active in (for
//! evicting the idlest when the table is full), and the bytes every session buffers for
//! reassembly, within bounds a sender cannot lift.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use crate::{RequestKind, Time};

/// Sessions examined per eviction before the table counts itself full: busy sessions (with
/// buffered or unapplied requests) are never evicted, and the scan must stay short when an
/// attacker keeps many of them busy.
const EVICTION_SCAN_LIMIT: usize = 256;

/// Sessions remembered as evicted, at most (the oldest forgotten first; see
/// [`Table::evicted_here`]).
const EVICTED_REMEMBERED_MAX: usize = 16_384;

/// Bytes an unsolicited message may spend from a source's credit, at most: a source earns
/// credit by the bytes it sends, so the server never sends more than it received towards an
/// address it has not verified (no reflection amplification).
pub(super) const MAX_CREDIT_BYTES: u32 = 64 * 1024;

/// A request being reassembled, or whole and waiting for its turn.
#[derive(Debug)]
pub(super) struct Assembly {
    pub(super) kind: RequestKind,
    /// A no-op fill (`NOOP_FILL`): applied as an empty request, answered as skipped.
    pub(super) fill: bool,
    /// A keyed write (`KEYED`): its payload starts with a write descriptor (see `order.rs`).
    pub(super) keyed: bool,
    /// Forwarded by a primary as it applied it (`FROM_PRIMARY`, see `replicate.rs`).
    pub(super) from_primary: bool,
    pub(super) parts: Vec<Option<Vec<u8>>>,
    pub(super) received_count: usize,
    pub(super) received_len: usize,
    /// When the request became whole, in the server's count of completed requests: the
    /// order in which requests held back (while recovering) are handed on across sessions.
    pub(super) completed: u64,
}

impl Assembly {
    pub(super) fn new(kind: RequestKind, fill: bool, fragment_count: usize) -> Assembly {
        Assembly {
            kind,
            fill,
            keyed: false,
            from_primary: false,
            parts: vec![None; fragment_count],
            received_count: 0,
            received_len: 0,
            completed: 0,
        }
    }

    /// A request already reassembled (handed back by the application, see
    /// `Server::on_deferred`).
    pub(super) fn whole(kind: RequestKind, fill: bool, request: Vec<u8>) -> Assembly {
        let received_len = request.len();
        Assembly {
            kind,
            fill,
            keyed: false,
            from_primary: false,
            parts: vec![Some(request)],
            received_count: 1,
            received_len,
            completed: 0,
        }
    }

    pub(super) fn is_complete(&self) -> bool {
        self.received_count == self.parts.len()
    }

    /// What this assembly costs the reassembly budget: its fragment table and its payload.
    pub(super) fn cost(&self) -> usize {
        Assembly::table_cost(self.parts.len()) + self.received_len
    }

    pub(super) fn table_cost(fragment_count: usize) -> usize {
        fragment_count * std::mem::size_of::<Option<Vec<u8>>>()
    }
}

/// A reply kept for make-up ACKs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CachedReply {
    Reply(Vec<u8>),
    /// The number was filled or skipped: no request was applied for it.
    Skipped,
}

/// A gap in a session's sequence: something later arrived, the next request did not.
#[derive(Debug)]
pub(super) struct Gap {
    /// When the missing number's client has given up on it for sure (and nothing of it is
    /// still in flight): a lifetime and a margin (`gap_fill_after`) after a later number was
    /// first seen, here or by a device, or after the gap began.
    pub(super) fill_at: Time,
    /// `issued_through` when the gap began; progress resets the gap.
    pub(super) at: u32,
    pub(super) deadline: Time,
    /// The current interval between retransmission requests (doubles to a maximum).
    pub(super) interval: Duration,
    /// The devices were asked about this gap (what they hold, when they saw it) already.
    pub(super) asked: bool,
}

/// A fill round in progress: the devices asked whether they hold any of `first ..= last`
/// whole, and since when they know of a later number.
#[derive(Debug)]
pub(super) struct Fill {
    pub(super) first: u32,
    pub(super) last: u32,
    pub(super) awaiting: BTreeSet<SocketAddr>,
    /// The lowest number some device holds whole, so far (`last + 1` if none).
    pub(super) held_from: u64,
    /// When the round was first sent: every answer describes the device at that moment or
    /// later.
    pub(super) sent_at: Time,
}

/// Updates the application could not store yet (no room): retried after `retry_at`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deferral {
    pub(super) retry_at: Time,
}

#[derive(Debug, Default)]
pub(super) struct Session {
    pub(super) last_applied: u32,
    /// Highest sequence number handed to the application (≥ `last_applied`).
    pub(super) issued_through: u32,
    /// Highest sequence number seen, buffered or not (set through [`Session::note_seen`]).
    pub(super) highest_seen: u32,
    /// When each new highest number was first seen, oldest first: (bound, time), every number
    /// below `bound` issued by its client before `time` (a number seen at t was issued after
    /// every one below it), so its client gave up on it by t plus the longest request
    /// lifetime. At most [`SEEN_POINTS_MAX`]; a point
    /// forgotten only makes a later deadline.
    pub(super) seen_points: VecDeque<(u32, Time)>,
    pub(super) pending: BTreeMap<u32, Assembly>,
    /// What `pending` costs the reassembly budget.
    pub(super) buffered_bytes: usize,
    /// No-op fills handed to the application and not yet applied, oldest first.
    pub(super) fills_issued: VecDeque<u32>,
    pub(super) replies: VecDeque<(u32, CachedReply)>,
    /// Ranges skipped without a request, newest last (a few, for make-up ACKs).
    pub(super) skipped: VecDeque<(u32, u32)>,
    /// Where this session's requests came from last: the device, or the client directly.
    pub(super) reply_to: Option<SocketAddr>,
    /// Bytes received from `reply_to` not yet spent on unsolicited messages to it.
    pub(super) credit_bytes: u32,
    pub(super) gap: Option<Gap>,
    /// Fill rounds in progress, one per missing range (at most `FILL_RANGES_MAX`).
    pub(super) fills: Vec<Fill>,
    /// Ranges ahead that no device holds whole and no client can send any more, ascending:
    /// skipped as soon as the session reaches them.
    pub(super) resolved: VecDeque<(u32, u32)>,
    /// Devices' dates: `(bound, deadline)`, every number below `bound` given up by its
    /// client, with nothing of it in flight, by `deadline`; ascending in both.
    pub(super) dated: Vec<(u32, Time)>,
    pub(super) deferral: Option<Deferral>,
    /// The store had no room for the session's next request (deferred), and nothing of the
    /// session has been applied since: reads that must see it are answered with
    /// [`super::WAITS_FOR_ROOM`] instead of waiting.
    pub(super) waits_for_room: bool,
    /// The next request is a keyed write that waits for this session to apply through this
    /// number (see `order.rs`).
    pub(super) waiting_for: Option<(u64, u32)>,
    /// When that wait is given up (see `order.rs`, `ORDER_WAIT_MAX`).
    pub(super) waiting_until: Option<Time>,
    /// The highest number of this session another session's keyed write waits for.
    pub(super) awaited_through: u32,
    /// A wait of this session was given up (no room for the session it waited for).
    pub(super) order_given_up: bool,
    /// The wait before retrying a deferred request; doubles while the store stays full.
    pub(super) defer_interval: Duration,
    pub(super) last_active: Time,
    /// Numbers not applied yet that a primary sent as to its replica number `id`: their
    /// server-ACKs carry [`pmnet_wire::replication::REPLICA`] and that number (at most
    /// [`REPLICA_STAMPS_MAX`]; a number whose stamp was dropped is acked plainly, which the
    /// primary does not count, and acked again, stamped, when the primary resends it).
    pub(super) replica_stamps: VecDeque<(u32, u16)>,
}

/// Replica stamps a session keeps (see `Session::replica_stamps`).
pub(super) const REPLICA_STAMPS_MAX: usize = 256;

/// Seen points a session keeps (see `Session::seen_points`).
pub(super) const SEEN_POINTS_MAX: usize = 16;
/// Devices' dates a session keeps (see `Session::dated`).
const DATED_MAX: usize = 8;
/// Resolved ranges a session keeps (see `Session::resolved`).
const RESOLVED_MAX: usize = 64;

impl Session {
    /// Number `seq` came from a primary as to its replica number `id`.
    pub(super) fn note_replica_stamp(&mut self, seq: u32, id: u16) {
        if let Some(stamp) = self.replica_stamps.iter_mut().find(|(s, _)| *s == seq) {
            stamp.1 = id;
            return;
        }
        if self.replica_stamps.len() >= REPLICA_STAMPS_MAX {
            self.replica_stamps.pop_front();
        }
        self.replica_stamps.push_back((seq, id));
    }

    /// The replica number `seq` came stamped with (0: none), forgotten.
    pub(super) fn take_replica_stamp(&mut self, seq: u32) -> u16 {
        let Some(position) = self.replica_stamps.iter().position(|(s, _)| *s == seq) else {
            return 0;
        };
        self.replica_stamps.remove(position).map_or(0, |(_, id)| id)
    }

    /// Number `seq` of this session was seen at `now` (a fragment of it at least): it and
    /// every number below it were issued by then — `seq` too, which matters when the rest of
    /// it never comes (its client left with a fragment lost: nothing else dates it).
    pub(super) fn note_seen(&mut self, seq: u32, now: Time) {
        if seq > self.highest_seen {
            self.highest_seen = seq;
            self.add_seen_point(seq.saturating_add(1), now);
        }
    }

    /// Number `seq` of this session is known to have been issued by `now` (another session's
    /// keyed write waits for it) without being seen here.
    pub(super) fn note_issued(&mut self, seq: u32, now: Time) {
        if seq > self.highest_seen {
            self.highest_seen = seq;
            self.add_seen_point(seq.saturating_add(1), now);
        }
    }

    /// Every number below `bound` was issued by `now`.
    fn add_seen_point(&mut self, bound: u32, now: Time) {
        // Points that cover only what is applied tell nothing any more.
        while self
            .seen_points
            .front()
            .is_some_and(|(seen, _)| *seen <= self.last_applied.saturating_add(1))
        {
            self.seen_points.pop_front();
        }
        if self.seen_points.len() >= SEEN_POINTS_MAX {
            // The new point covers the numbers the dropped one did, from a later time.
            self.seen_points.pop_back();
        }
        self.seen_points.push_back((bound, now));
    }

    /// When `seq` or a number above it was first seen, if one was (and is remembered): `seq`
    /// was issued by then.
    pub(super) fn first_seen_through(&self, seq: u32) -> Option<Time> {
        self.seen_points
            .iter()
            .find(|(seen, _)| *seen > seq)
            .map(|(_, at)| *at)
    }

    /// The highest number whose client has given up on it by `now` for certain: a number
    /// seen `lifetime` ago or more.
    pub(super) fn given_up_through(&self, now: Time, lifetime: Duration) -> Option<u32> {
        self.seen_points
            .iter()
            .rev()
            .find(|(_, at)| now.saturating_duration_since(*at) >= lifetime)
            .map(|(seen, _)| seen - 1)
    }

    /// A device dated every number below `bound`: given up for sure by `deadline`.
    pub(super) fn note_dated(&mut self, bound: u32, deadline: Time) {
        let applied = self.last_applied.saturating_add(1);
        self.dated.retain(|&(seen, _)| seen > applied);
        if bound <= applied
            || self
                .dated
                .iter()
                .any(|&(seen, at)| seen >= bound && at <= deadline)
        {
            return;
        }
        self.dated
            .retain(|&(seen, at)| !(seen <= bound && at >= deadline));
        if self.dated.len() >= DATED_MAX {
            // The lowest numbers are reached first; a date lost only makes a skip later.
            self.dated.remove(0);
        }
        let at = self.dated.partition_point(|&(seen, _)| seen < bound);
        self.dated.insert(at, (bound, deadline));
    }

    /// When the client of `seq` has given up on it for sure, with nothing of it in flight:
    /// `fill_after` after this server first saw a later number, or a device's date.
    pub(super) fn given_up_at(&self, seq: u32, fill_after: Duration) -> Option<Time> {
        let own = self.first_seen_through(seq).map(|seen| seen + fill_after);
        let dated = self
            .dated
            .iter()
            .find(|(bound, _)| *bound > seq)
            .map(|(_, at)| *at);
        own.into_iter().chain(dated).min()
    }

    /// The highest number given up for sure by `now` ([`Session::given_up_through`] with
    /// the devices' dates).
    pub(super) fn given_up_by(&self, now: Time, fill_after: Duration) -> Option<u32> {
        let own = self.given_up_through(now, fill_after);
        let dated = self
            .dated
            .iter()
            .rev()
            .find(|(_, at)| *at <= now)
            .map(|(bound, _)| bound - 1);
        own.max(dated)
    }

    /// Remember that `first ..= last` can be skipped once reached. The ranges stay disjoint
    /// and ascending (a range resolved again, or overlapping one kept, is merged into it);
    /// when there are [`RESOLVED_MAX`], the highest is forgotten, as it is reached last (a
    /// forgotten range is only asked about again).
    pub(super) fn add_resolved(&mut self, first: u32, last: u32) {
        let next = self.issued_through.saturating_add(1);
        while self.resolved.front().is_some_and(|&(_, end)| end < next) {
            self.resolved.pop_front();
        }
        if last < next || first > last {
            return;
        }
        let (mut first, mut last) = (first.max(next), last);
        // Ranges that overlap or touch the new one are merged into it.
        let start = self
            .resolved
            .partition_point(|&(_, end)| end.saturating_add(1) < first);
        let mut end = start;
        while end < self.resolved.len() && self.resolved[end].0 <= last.saturating_add(1) {
            first = first.min(self.resolved[end].0);
            last = last.max(self.resolved[end].1);
            end += 1;
        }
        self.resolved.drain(start..end);
        self.resolved.insert(start, (first, last));
        if self.resolved.len() > RESOLVED_MAX {
            self.resolved.pop_back();
        }
    }

    /// Whether every number of `first ..= last` is in a resolved range (no need to ask).
    pub(super) fn is_resolved(&self, first: u32, last: u32) -> bool {
        self.resolved
            .iter()
            .any(|&(start, end)| start <= first && last <= end)
    }

    /// The last number to skip now, if the next number is in a resolved range: through the
    /// range's end, or to just before a whole request that came since.
    pub(super) fn resolved_through(&mut self) -> Option<u32> {
        let next = self.issued_through.checked_add(1)?;
        while self.resolved.front().is_some_and(|&(_, end)| end < next) {
            self.resolved.pop_front();
        }
        let &(start, end) = self.resolved.front()?;
        if start > next {
            return None;
        }
        let whole = self
            .pending
            .range(next..=end)
            .find(|(_, assembly)| assembly.is_complete())
            .map(|(&seq, _)| seq);
        match whole {
            Some(seq) if seq == next => None,
            Some(seq) => Some(seq - 1),
            None => Some(end),
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.pending.is_empty()
            && self.issued_through == self.last_applied
            && self.highest_seen <= self.last_applied
    }

    /// This session's state in words (for a failure report); `gap_timer`: its gap's timer is
    /// armed.
    pub(super) fn describe(&self, gap_timer: bool) -> String {
        let pending: Vec<String> = self
            .pending
            .iter()
            .map(|(seq, assembly)| {
                let part = if assembly.is_complete() { "" } else { "(part)" };
                format!("{seq}{part}")
            })
            .collect();
        let gap = self.gap.as_ref().map(|gap| {
            format!(
                "at {} fill at {:?} asked {} timer {gap_timer}",
                gap.at, gap.fill_at, gap.asked
            )
        });
        format!(
            "applied {} issued {} seen {} pending [{}] gap {gap:?} fills {} deferral {} \
             waiting {:?}",
            self.last_applied,
            self.issued_through,
            self.highest_seen,
            pending.join(" "),
            self.fills.len(),
            self.deferral.is_some(),
            self.waiting_for,
        )
    }

    /// Whether `seq` was skipped or filled (as far as this session still remembers).
    pub(super) fn was_skipped(&self, seq: u32) -> bool {
        self.skipped
            .iter()
            .any(|&(first, last)| (first..=last).contains(&seq))
    }
}

/// Sessions by id, with eviction of the idlest and the reassembly budget.
#[derive(Debug)]
pub(super) struct Table {
    pub(super) sessions: HashMap<u64, Session>,
    /// Sessions in the order they became active, oldest first, lazily: an entry whose time
    /// is not its session's `last_active` any more is stale and skipped.
    activity: VecDeque<(Time, u64)>,
    /// Bytes buffered for reassembly by all sessions.
    pub(super) buffered_bytes: usize,
    /// Sessions evicted to make room.
    pub(super) evicted: u64,
    sessions_max: usize,
    /// A session is evicted only once idle longer than this (the keeping time, `hold.rs`).
    keep_for: Duration,
    /// Sessions an eviction wanted and the devices have not cleared (`hold.rs`): the
    /// server asks them.
    pub(super) waits_for_devices: Vec<u64>,
    /// Sessions this table evicted in this run and has not taken in again.
    evicted_here: Evicted,
}

/// Sessions evicted and not taken in again, the most recent [`EVICTED_REMEMBERED_MAX`].
#[derive(Debug, Default)]
struct Evicted {
    next: u64,
    by_order: BTreeMap<u64, u64>,
    order_of: HashMap<u64, u64>,
}

impl Evicted {
    fn insert(&mut self, session_id: u64) {
        self.remove(session_id);
        let order = self.next;
        self.next += 1;
        self.by_order.insert(order, session_id);
        self.order_of.insert(session_id, order);
        if self.order_of.len() > EVICTED_REMEMBERED_MAX {
            if let Some((_, oldest)) = self.by_order.pop_first() {
                self.order_of.remove(&oldest);
            }
        }
    }

    fn remove(&mut self, session_id: u64) {
        if let Some(order) = self.order_of.remove(&session_id) {
            self.by_order.remove(&order);
        }
    }
}

impl Table {
    pub(super) fn new(sessions_max: usize) -> Table {
        Table {
            sessions: HashMap::new(),
            activity: VecDeque::new(),
            buffered_bytes: 0,
            evicted: 0,
            sessions_max,
            keep_for: Duration::ZERO,
            waits_for_devices: Vec::new(),
            evicted_here: Evicted::default(),
        }
    }

    /// Whether this table evicted `session_id` in this run and has not taken it in again
    /// since (remembered for the most recent evictions only; `false` when not known).
    pub(super) fn evicted_here(&self, session_id: u64) -> bool {
        self.evicted_here.order_of.contains_key(&session_id)
    }

    /// The same table keeping every session at least `keep_for` after its last activity.
    pub(super) fn keeping_sessions_for(mut self, keep_for: Duration) -> Table {
        self.keep_for = keep_for;
        self
    }

    pub(super) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Mark `session_id` active at `now`.
    pub(super) fn touch(&mut self, now: Time, session_id: u64) {
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return;
        };
        if session.last_active == now && now != Time::ZERO {
            return;
        }
        session.last_active = now;
        self.activity.push_back((now, session_id));
        if self.activity.len() > 4 * self.sessions.len() + 4096 {
            self.compact_activity();
        }
    }

    fn compact_activity(&mut self) {
        let mut order: Vec<(Time, u64)> = self
            .sessions
            .iter()
            .map(|(id, session)| (session.last_active, *id))
            .collect();
        order.sort_unstable();
        self.activity = order.into();
    }

    /// Insert a session recovered from the store.
    pub(super) fn insert(&mut self, now: Time, session_id: u64, session: Session) {
        self.evicted_here.remove(session_id);
        self.sessions.insert(session_id, session);
        self.touch(now, session_id);
    }

    /// The session `session_id`, created if new; `None` when the table is full of sessions
    /// that cannot be evicted. Evicting forgets a session's duplicate detection; only idle
    /// sessions are evicted, the one idle longest first, only once idle longer than the
    /// table keeps sessions, and only one `cleared(session, last_active)` says no device can
    /// still resend a request of (`hold.rs`).
    pub(super) fn get_or_create(
        &mut self,
        now: Time,
        session_id: u64,
        cleared: &dyn Fn(u64, Time) -> bool,
    ) -> Option<&mut Session> {
        if !self.sessions.contains_key(&session_id) {
            if self.sessions.len() >= self.sessions_max && !self.evict_idlest(now, cleared) {
                return None;
            }
            self.evicted_here.remove(session_id);
            self.sessions.insert(session_id, Session::default());
        }
        self.touch(now, session_id);
        self.sessions.get_mut(&session_id)
    }

    /// Evict the session idle longest; false if none was found within the scan limit, or the
    /// idlest was active too recently to be forgotten. Idle sessions not cleared are kept
    /// in their place and noted in `waits_for_devices`.
    fn evict_idlest(&mut self, now: Time, cleared: &dyn Fn(u64, Time) -> bool) -> bool {
        let mut not_cleared = Vec::new();
        let evicted = self.evict_scan(now, cleared, &mut not_cleared);
        for entry in not_cleared.into_iter().rev() {
            self.activity.push_front(entry);
        }
        evicted
    }

    fn evict_scan(
        &mut self,
        now: Time,
        cleared: &dyn Fn(u64, Time) -> bool,
        not_cleared: &mut Vec<(Time, u64)>,
    ) -> bool {
        for _ in 0..EVICTION_SCAN_LIMIT {
            let Some((time, session_id)) = self.activity.pop_front() else {
                return false;
            };
            let Some(session) = self.sessions.get(&session_id) else {
                continue;
            };
            if session.last_active != time {
                continue;
            }
            if now.saturating_duration_since(time) <= self.keep_for {
                // The idlest of all was active too recently: so was every other one.
                self.activity.push_front((time, session_id));
                return false;
            }
            if !session.is_idle() {
                // Busy: it is touched again when it makes progress. Keep it in the order.
                self.activity.push_back((time, session_id));
                continue;
            }
            if !cleared(session_id, time) {
                not_cleared.push((time, session_id));
                self.waits_for_devices.push(session_id);
                continue;
            }
            self.sessions.remove(&session_id);
            self.evicted_here.insert(session_id);
            self.evicted += 1;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: u64) -> Time {
        Time::from_nanos(millis * 1_000_000)
    }

    #[test]
    fn the_idlest_session_is_evicted_and_busy_ones_never() {
        let mut table = Table::new(3);
        for (millis, id) in [(1, 10), (2, 20), (3, 30)] {
            table
                .get_or_create(at(millis), id, &|_, _| true)
                .expect("room");
        }
        // 10 is busy (a request buffered); 20 is then the idlest of the idle ones.
        table
            .sessions
            .get_mut(&10)
            .expect("session")
            .pending
            .insert(2, Assembly::new(RequestKind::Update, false, 1));
        table
            .get_or_create(at(4), 40, &|_, _| true)
            .expect("room by evicting 20");
        assert!(table.sessions.contains_key(&10));
        assert!(!table.sessions.contains_key(&20));
        assert_eq!(table.evicted, 1);
        // Touching 30 makes 40 the idlest.
        table.touch(at(5), 30);
        table
            .get_or_create(at(6), 50, &|_, _| true)
            .expect("room by evicting 40");
        assert!(!table.sessions.contains_key(&40));
        assert!(table.sessions.contains_key(&30));
    }

    #[test]
    fn a_session_active_within_the_keeping_time_or_not_cleared_is_never_evicted() {
        let mut table = Table::new(2).keeping_sessions_for(Duration::from_millis(100));
        let all = |_: u64, _: Time| true;
        table.get_or_create(at(1), 10, &all).expect("room");
        table.get_or_create(at(2), 20, &all).expect("room");
        // 10 was last active 100 ms ago: kept, so the new session finds no room.
        assert!(table.get_or_create(at(101), 30, &all).is_none());
        assert!(table.sessions.contains_key(&10));
        // Idle longer, but the devices have not cleared it: 20 goes instead, 10 is asked
        // about and keeps its place as the idlest.
        let not_10 = |session: u64, _: Time| session != 10;
        table
            .get_or_create(at(200), 30, &not_10)
            .expect("room by evicting 20");
        assert!(table.sessions.contains_key(&10) && !table.sessions.contains_key(&20));
        assert_eq!(table.waits_for_devices, vec![10]);
        table
            .get_or_create(at(300), 40, &all)
            .expect("room by evicting 10");
        assert!(!table.sessions.contains_key(&10));
        assert_eq!(table.evicted, 2);
    }

    #[test]
    fn resolved_ranges_merge_and_keep_the_lowest_when_full() {
        let mut table = Table::new(1);
        let session = table.get_or_create(at(1), 7, &|_, _| true).expect("room");
        session.last_applied = 21;
        session.issued_through = 21;
        // The same ranges resolved round after round are kept once.
        for _ in 0..100 {
            for seq in (33..=33 + 2 * RESOLVED_MAX as u32).step_by(2) {
                session.add_resolved(seq, seq);
            }
        }
        assert_eq!(session.resolved.len(), RESOLVED_MAX);
        assert_eq!(session.resolved.front(), Some(&(33, 33)));
        // A full list still takes the range the session reaches next: the highest goes.
        session.add_resolved(22, 22);
        assert_eq!(session.resolved.len(), RESOLVED_MAX);
        assert_eq!(session.resolved.front(), Some(&(22, 22)));
        assert_eq!(session.resolved_through(), Some(22));
        // Overlapping and touching ranges merge; a range inside one kept changes nothing.
        session.add_resolved(23, 32);
        assert_eq!(session.resolved.front(), Some(&(22, 33)));
        session.add_resolved(25, 26);
        assert_eq!(session.resolved.front(), Some(&(22, 33)));
        assert!(session.is_resolved(24, 30) && !session.is_resolved(30, 34));
        let mut previous_end = 0;
        for &(start, end) in &session.resolved {
            assert!(
                start <= end && start > previous_end + 1,
                "{:?}",
                session.resolved
            );
            previous_end = end;
        }
    }

    #[test]
    fn a_table_full_of_busy_sessions_refuses_new_ones() {
        let mut table = Table::new(2);
        for id in [1, 2] {
            let session = table.get_or_create(at(id), id, &|_, _| true).expect("room");
            session
                .pending
                .insert(5, Assembly::new(RequestKind::Update, false, 1));
        }
        assert!(table.get_or_create(at(9), 3, &|_, _| true).is_none());
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn many_more_sessions_than_the_table_holds_keep_the_order_bounded() {
        let mut table = Table::new(1024);
        for id in 0..200_000u64 {
            table
                .get_or_create(at(id + 1), id, &|_, _| true)
                .expect("room");
            table.touch(at(id + 1), id / 2);
        }
        assert_eq!(table.len(), 1024);
        // The lazy order is compacted: it never grows far beyond the table.
        assert!(table.activity.len() <= 4 * 1024 + 4096 + 1);
        assert_eq!(table.evicted, 200_000 - 1024);
    }

    #[test]
    fn a_number_counts_as_given_up_a_lifetime_after_it_or_a_later_one_was_first_seen() {
        let lifetime = Duration::from_secs(20);
        let at = |secs: u64| Time::ZERO + Duration::from_secs(secs);
        let mut session = Session::default();
        session.note_seen(5, at(1));
        session.note_seen(3, at(2)); // lower: changes nothing
        session.note_seen(9, at(4));
        assert_eq!(session.highest_seen, 9);
        assert_eq!(session.first_seen_through(2), Some(at(1)));
        assert_eq!(
            session.first_seen_through(5),
            Some(at(1)),
            "5 itself was seen"
        );
        assert_eq!(session.first_seen_through(6), Some(at(4)));
        assert_eq!(session.first_seen_through(9), Some(at(4)));
        assert_eq!(session.first_seen_through(10), None);
        assert_eq!(session.given_up_through(at(20), lifetime), None);
        assert_eq!(session.given_up_through(at(21), lifetime), Some(5));
        assert_eq!(session.given_up_through(at(24), lifetime), Some(9));
        // Bounded: a point dropped only makes deadlines later, never earlier.
        for seq in 10..100 {
            session.note_seen(seq, at(u64::from(seq)));
        }
        assert!(session.seen_points.len() <= SEEN_POINTS_MAX);
        assert_eq!(session.first_seen_through(2), Some(at(1)));
        for x in 1..100u32 {
            // When x or a number above it was really first seen.
            let truth = match x {
                0..=5 => at(1),
                6..=9 => at(4),
                _ => at(u64::from(x)),
            };
            let seen = session.first_seen_through(x).expect("seen");
            assert!(seen >= truth, "{x}: {seen:?} before {truth:?}");
        }
        // Points at or below what is applied are let go.
        session.last_applied = 50;
        session.note_seen(100, at(100));
        assert!(session.seen_points.iter().all(|(seq, _)| *seq > 51));
        // A number known to be issued (awaited by another session) counts itself.
        let mut awaited = Session::default();
        awaited.note_issued(5, at(1));
        assert_eq!(awaited.highest_seen, 5);
        assert_eq!(awaited.given_up_through(at(21), lifetime), Some(5));
    }
}

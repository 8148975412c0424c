//! What the devices still hold: when a server may forget a session.
//!
//! A server that forgets a session forgets which of its requests it applied. A request of
//! it can still come back later from two places: a client (its retransmission, or a replay
//! of one of its datagrams the authenticator accepts) — never later than the keeping time
//! after the client first sent it — and a device's log, whose resend is not bounded in time
//! at all (a device cut off from its server keeps resending after the cut). So a session,
//! last active at `L`, is forgotten (by the session table, or the application's own) only
//! once
//! 1. it was idle longer than the keeping time, and
//! 2. every device in front of this server answered a *hold query* naming it, sent at a
//!    moment `q` later than `L` plus the keeping time, saying it holds no entry of it
//!    ([`PacketType::HoldReply`]).
//!
//! Why 2 is enough: a copy of a request this server applied reaches a device at most the
//! keeping time after its client first sent it (it is the first transmission, a
//! retransmission or an accepted replay), so before `L` plus the keeping time, before `q`.
//! Had it been logged, it would have been held at `q` (it is freed only by its server-ACK).
//! A device in a chain answers for the devices before it too (`device/upstream.rs`); a
//! device that does not answer keeps the sessions asked about from being forgotten.
//!
//! A primary asks its replicas too: each keeps copies of the requests it applied (to send
//! them to the others should it be promoted), and a promoted replica's copy of a request of
//! a session another replica forgot would be applied there again. A replica asked about a
//! session gives its copies of it up (they are of requests every replica acked: the primary
//! asks replicas only about sessions with nothing pending for them, and a replica keeps the
//! copies of a session active within the keeping time) and answers once that is durable
//! (`forward_log.rs`). A replica's own question comes to its primary, which answers it from
//! what it holds for its replicas, its devices' answers and its replicas'.
//!
//! Queries go out on demand only — naming the sessions an eviction wanted and could not
//! take — in rounds of at most [`pmnet_wire::HOLD_QUERY_SESSIONS_MAX`] sessions, at most one
//! round per [`ROUND_INTERVAL`]. Each round carries a number the server chose (starting
//! from its boot nonce), and an answer counts only for a round of this run not yet answered
//! by that device, so a replayed answer of another run or an earlier round changes nothing.
//!
//! [`PacketType::HoldReply`]: pmnet_wire::PacketType::HoldReply

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::{Header, PacketType, HOLD_QUERY_SESSIONS_MAX};

use crate::{Time, Transmit};

/// Rounds of hold queries go out at most this often.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(50);
/// Sessions waiting to be asked about, at most.
const WANTED_MAX: usize = 4096;
/// Rounds awaiting answers, at most; past it the oldest is forgotten (its sessions are
/// asked about again when wanted again).
const ROUNDS_MAX: usize = 16;
/// Sessions remembered as held by no device, at most (the oldest answers forgotten first).
const CLEARED_MAX: usize = 16_384;
/// A round unanswered this long is worth a warning (at most one per minute).
const WARN_AFTER: Duration = Duration::from_secs(30);
const WARN_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Round {
    sent_at: Time,
    sessions: Vec<u64>,
    awaiting: BTreeSet<SocketAddr>,
    /// Per session: held by a device that answered (or, on a primary, pending for its
    /// replicas when the round went out).
    held: Vec<bool>,
    /// The positions in `sessions` of those the replicas were asked about.
    asked_replicas: Vec<usize>,
}

/// The devices' answers to hold queries (see the module docs).
#[derive(Debug)]
pub(super) struct Holds {
    devices: Vec<SocketAddr>,
    /// A primary's replicas, asked too.
    replicas: Vec<SocketAddr>,
    keep: Duration,
    next_number: u32,
    /// When the next round goes out; `None`: nothing wants one.
    round_at: Option<Time>,
    last_round: Option<Time>,
    wanted: VecDeque<u64>,
    wanted_set: HashSet<u64>,
    rounds: BTreeMap<u32, Round>,
    /// Sessions no device held an entry of when asked at the given moment.
    cleared: HashMap<u64, Time>,
    cleared_order: VecDeque<(u64, Time)>,
    warned_at: Option<Time>,
    pub(super) queries_sent: u64,
    pub(super) replies: u64,
}

impl Holds {
    pub(super) fn new(devices: &[SocketAddr], boot_nonce: u32, keep: Duration) -> Holds {
        Holds {
            devices: devices.to_vec(),
            replicas: Vec::new(),
            keep,
            next_number: boot_nonce,
            round_at: None,
            last_round: None,
            wanted: VecDeque::new(),
            wanted_set: HashSet::new(),
            rounds: BTreeMap::new(),
            cleared: HashMap::new(),
            cleared_order: VecDeque::new(),
            warned_at: None,
            queries_sent: 0,
            replies: 0,
        }
    }

    /// A primary asks its replicas too (see the module docs).
    pub(super) fn with_replicas(mut self, replicas: &[SocketAddr]) -> Holds {
        self.replicas = replicas.to_vec();
        self
    }

    /// Whether anyone is asked: devices, or a primary's replicas.
    fn asks_anyone(&self) -> bool {
        !self.devices.is_empty() || !self.replicas.is_empty()
    }

    /// The keeping time.
    pub(super) fn keep(&self) -> Duration {
        self.keep
    }

    /// Whether no device can still resend a request of `session_id`, last active at
    /// `last_active`, that this server applied (condition 2 of the module docs).
    pub(super) fn cleared(&self, session_id: u64, last_active: Time) -> bool {
        !self.asks_anyone()
            || self
                .cleared
                .get(&session_id)
                .is_some_and(|&asked| last_active + self.keep < asked)
    }

    /// Whether `session_id`, last active at `last_active`, may be forgotten at `now`.
    pub(super) fn may_forget(&self, now: Time, session_id: u64, last_active: Time) -> bool {
        last_active + self.keep < now && self.cleared(session_id, last_active)
    }

    /// An eviction wanted `session_id` and could not take it: ask the devices about it (in
    /// the next round, at most one per [`ROUND_INTERVAL`]).
    pub(super) fn want(&mut self, now: Time, session_id: u64) {
        if !self.asks_anyone() {
            return;
        }
        if self.wanted.len() < WANTED_MAX && self.wanted_set.insert(session_id) {
            self.wanted.push_back(session_id);
        }
        if self.round_at.is_none() {
            let at = self
                .last_round
                .map_or(now, |last| (last + ROUND_INTERVAL).max(now));
            self.round_at = Some(at);
        }
    }

    /// The devices are now `devices` (the controller's route moved the chain's last device):
    /// a round waiting for a device no longer asked is dropped and its sessions asked about
    /// again, of the devices as they are now.
    pub(super) fn replace_devices(&mut self, now: Time, devices: &[SocketAddr]) {
        let gone: Vec<SocketAddr> = self
            .devices
            .iter()
            .filter(|device| !devices.contains(device))
            .copied()
            .collect();
        self.devices = devices.to_vec();
        let stale: Vec<u32> = self
            .rounds
            .iter()
            .filter(|(_, round)| gone.iter().any(|device| round.awaiting.contains(device)))
            .map(|(number, _)| *number)
            .collect();
        for number in stale {
            if let Some(round) = self.rounds.remove(&number) {
                for session_id in round.sessions {
                    self.want(now, session_id);
                }
            }
        }
    }

    /// When the next round is due.
    pub(super) fn poll_timeout(&self) -> Option<Time> {
        self.round_at
    }

    /// Send a round if one is due. `pending`: whether a session has requests held for the
    /// replicas (counted as held, and not asked about: the replicas would give up copies
    /// one of them may still need).
    pub(super) fn handle_timeout(
        &mut self,
        now: Time,
        server_id: u16,
        transmits: &mut VecDeque<Transmit>,
        pending: &dyn Fn(u64) -> bool,
    ) {
        if self.round_at.is_none_or(|at| at > now) {
            return;
        }
        self.round_at = None;
        self.warn_of_silence(now);
        let count = self.wanted.len().min(HOLD_QUERY_SESSIONS_MAX);
        if count == 0 {
            return;
        }
        let sessions: Vec<u64> = self.wanted.drain(..count).collect();
        for session_id in &sessions {
            self.wanted_set.remove(session_id);
        }
        self.last_round = Some(now);
        if !self.wanted.is_empty() {
            self.round_at = Some(now + ROUND_INTERVAL);
        }
        let number = self.next_number;
        self.next_number = self.next_number.wrapping_add(1);
        let mut awaiting = BTreeSet::new();
        let mut ask = |peers: &[SocketAddr], asked: &[u64]| {
            if asked.is_empty() {
                return;
            }
            let bytes = Header::new(PacketType::HoldQuery, server_id, 0, number)
                .encode(&pmnet_wire::encode_hold_query_payload(asked));
            for &peer in peers {
                self.queries_sent += 1;
                awaiting.insert(peer);
                transmits.push_back(Transmit {
                    destination: peer,
                    bytes: bytes.clone(),
                });
            }
        };
        ask(&self.devices, &sessions);
        let with_replicas = !self.replicas.is_empty();
        let held: Vec<bool> = sessions
            .iter()
            .map(|&session| with_replicas && pending(session))
            .collect();
        let asked_replicas: Vec<usize> = (0..sessions.len())
            .filter(|&index| with_replicas && !held[index])
            .collect();
        let asked: Vec<u64> = asked_replicas
            .iter()
            .map(|&index| sessions[index])
            .collect();
        ask(&self.replicas, &asked);
        while self.rounds.len() >= ROUNDS_MAX {
            self.rounds.pop_first();
        }
        self.rounds.insert(
            number,
            Round {
                sent_at: now,
                held,
                sessions,
                awaiting,
                asked_replicas,
            },
        );
    }

    /// Device `from` answered round `number` with `held`. False when no round of this run
    /// waits for `from` under that number, or the answer does not fit it (stale, replayed or
    /// forged).
    pub(super) fn answered(&mut self, from: SocketAddr, number: u32, held: &[bool]) -> bool {
        let Some(round) = self.rounds.get_mut(&number) else {
            return false;
        };
        // A replica was asked about `asked_replicas` only; a device about every session.
        let positions: Vec<usize> =
            if self.replicas.contains(&from) && !self.devices.contains(&from) {
                round.asked_replicas.clone()
            } else {
                (0..round.sessions.len()).collect()
            };
        if held.len() != positions.len() || !round.awaiting.contains(&from) {
            return false;
        }
        round.awaiting.remove(&from);
        self.replies += 1;
        for (index, theirs) in positions.into_iter().zip(held) {
            round.held[index] |= *theirs;
        }
        if !round.awaiting.is_empty() {
            return true;
        }
        let round = self.rounds.remove(&number).expect("present");
        for (session_id, held) in round.sessions.into_iter().zip(round.held) {
            if held {
                continue;
            }
            while self.cleared_order.len() >= CLEARED_MAX {
                let Some((old, at)) = self.cleared_order.pop_front() else {
                    break;
                };
                if self.cleared.get(&old) == Some(&at) {
                    self.cleared.remove(&old);
                }
            }
            self.cleared.insert(session_id, round.sent_at);
            self.cleared_order.push_back((session_id, round.sent_at));
        }
        true
    }

    fn warn_of_silence(&mut self, now: Time) {
        if self
            .warned_at
            .is_some_and(|at| now.saturating_duration_since(at) < WARN_INTERVAL)
        {
            return;
        }
        let silent: BTreeSet<SocketAddr> = self
            .rounds
            .values()
            .filter(|round| now.saturating_duration_since(round.sent_at) >= WARN_AFTER)
            .flat_map(|round| round.awaiting.iter().copied())
            .collect();
        if silent.is_empty() {
            return;
        }
        self.warned_at = Some(now);
        let names: Vec<String> = silent.iter().map(ToString::to_string).collect();
        tracing::warn!(
            "idle sessions cannot be forgotten: device(s) or replica(s) {} have not said for {} s whether              they hold entries of them (a resend of theirs could otherwise be applied twice);              new sessions wait while the session table is full",
            names.join(", "),
            WARN_AFTER.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn at(millis: u64) -> Time {
        Time::from_nanos(millis * 1_000_000)
    }

    fn round(holds: &mut Holds, now: Time) -> (u32, Vec<u64>) {
        let mut sent = VecDeque::new();
        holds.handle_timeout(now, 1, &mut sent, &|_| false);
        let (header, payload) = Header::parse(&sent[0].bytes).unwrap();
        assert_eq!(header.packet_type, PacketType::HoldQuery);
        let sessions = pmnet_wire::decode_hold_query_payload(payload).unwrap();
        (header.seq, sessions)
    }

    #[test]
    fn a_session_is_forgotten_only_once_every_device_said_it_holds_none_of_it() {
        let keep = Duration::from_secs(20);
        let mut holds = Holds::new(&[addr(1), addr(2)], 7, keep);
        let active = at(1_000);
        assert!(!holds.may_forget(at(30_000), 10, active), "never asked");
        holds.want(at(30_000), 10);
        holds.want(at(30_000), 11);
        holds.want(at(30_000), 10);
        let (number, sessions) = round(&mut holds, at(30_000));
        assert_eq!(
            (number, sessions),
            (7, vec![10, 11]),
            "numbered from the boot nonce"
        );
        assert!(!holds.answered(addr(3), 7, &[false, false]), "not a device");
        assert!(!holds.answered(addr(1), 6, &[false, false]), "never asked");
        assert!(!holds.answered(addr(1), 7, &[false]), "does not fit");
        assert!(holds.answered(addr(1), 7, &[false, true]));
        assert!(
            !holds.answered(addr(1), 7, &[false, false]),
            "answered already: a replay"
        );
        assert!(!holds.may_forget(at(30_000), 10, active), "device 2 silent");
        assert!(holds.answered(addr(2), 7, &[false, false]));
        assert!(holds.may_forget(at(30_000), 10, active));
        assert!(
            !holds.may_forget(at(30_000), 11, active),
            "device 1 holds one"
        );
        // Active again after the answer: asked again.
        assert!(!holds.may_forget(at(60_000), 10, at(31_000)));
        // Within the keeping time of the answer: kept.
        assert!(!holds.may_forget(at(60_000), 10, at(10_000)));
        holds.want(at(30_000), 10);
        assert_eq!(holds.poll_timeout(), Some(at(30_050)), "paced");
    }

    #[test]
    fn a_primary_asks_its_replicas_about_the_sessions_with_nothing_pending_for_them() {
        let keep = Duration::from_secs(20);
        let (device, replica) = (addr(1), addr(9));
        let mut holds = Holds::new(&[device], 3, keep).with_replicas(&[replica]);
        let active = at(1_000);
        for session in [10, 11, 12] {
            holds.want(at(30_000), session);
        }
        let mut sent = VecDeque::new();
        // Session 11 has a request the replicas have not all acked.
        holds.handle_timeout(at(30_000), 1, &mut sent, &|session| session == 11);
        let asked = |to: SocketAddr| {
            let transmit = sent.iter().find(|t| t.destination == to).unwrap();
            let (_, payload) = Header::parse(&transmit.bytes).unwrap();
            pmnet_wire::decode_hold_query_payload(payload).unwrap()
        };
        assert_eq!(asked(device), vec![10, 11, 12]);
        assert_eq!(asked(replica), vec![10, 12], "not about the pending one");
        assert!(
            !holds.answered(replica, 3, &[false, false, false]),
            "an answer that does not fit what the replica was asked"
        );
        assert!(holds.answered(device, 3, &[false, false, false]));
        assert!(
            !holds.may_forget(at(30_000), 10, active),
            "the replica is silent"
        );
        assert!(holds.answered(replica, 3, &[false, true]));
        assert!(holds.may_forget(at(30_000), 10, active));
        assert!(
            !holds.may_forget(at(30_000), 11, active),
            "pending at the primary"
        );
        assert!(
            !holds.may_forget(at(30_000), 12, active),
            "the replica keeps copies"
        );
    }

    #[test]
    fn without_devices_only_the_keeping_time_counts_and_no_query_is_sent() {
        let mut holds = Holds::new(&[], 0, Duration::from_secs(20));
        assert!(holds.may_forget(at(50_000), 1, at(29_999)));
        assert!(!holds.may_forget(at(50_000), 1, at(30_000)));
        holds.want(at(50_000), 1);
        assert_eq!(holds.poll_timeout(), None);
    }
}

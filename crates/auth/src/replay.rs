//! Refusing replays of sessions a table no longer remembers.
//!
//! A session table answers a replayed datagram of a session it remembers from what it knows
//! (exactly once by sequence number). A table that can forget — one of bounded size that
//! evicts, or one held in memory and lost at a restart — keeps a [`ReplayFloor`]: the latest
//! seal time of anything it forgot. A datagram of a session the table does not know, sealed at
//! or before the floor, may belong to a forgotten session and is refused; one sealed after it
//! belongs to a session that is new, or that sent it after being forgotten (a fresh datagram,
//! not a replay). Seal times are the authenticated ones ([`crate::Authenticator::sealed_at`]),
//! so a replay cannot claim to be newer than it is.

/// The latest seal time (Unix milliseconds) of anything a session table forgot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplayFloor {
    floor_ms: u64,
}

impl ReplayFloor {
    /// A table that has forgotten nothing.
    pub fn new() -> ReplayFloor {
        ReplayFloor { floor_ms: 0 }
    }

    /// A table started at `now_ms` with nothing of its previous life: every datagram sealed
    /// before it started may belong to a session it forgot.
    pub fn starting_at(now_ms: u64) -> ReplayFloor {
        ReplayFloor { floor_ms: now_ms }
    }

    /// The table forgets a session whose latest datagram was sealed at `last_sealed_ms`.
    pub fn forget(&mut self, last_sealed_ms: u64) {
        self.floor_ms = self.floor_ms.max(last_sealed_ms);
    }

    /// Whether a datagram of a session the table does not know, sealed at `sealed_ms`, may
    /// start (or restart) that session.
    pub fn admits_unknown(&self, sealed_ms: u64) -> bool {
        sealed_ms > self.floor_ms
    }

    /// Whether a datagram of an unknown session sealed at `sealed_ms` is refused by `floor`:
    /// only with keys (a seal time) and a floor set.
    pub fn refuses(floor: Option<ReplayFloor>, sealed_ms: Option<u64>) -> bool {
        matches!((floor, sealed_ms), (Some(floor), Some(sealed)) if !floor.admits_unknown(sealed))
    }

    /// The floor, in Unix milliseconds.
    pub fn floor_ms(&self) -> u64 {
        self.floor_ms
    }
}

#[cfg(test)]
mod tests {
    use super::ReplayFloor;

    #[test]
    fn a_forgotten_session_s_datagrams_are_refused_and_later_ones_admitted() {
        let mut floor = ReplayFloor::new();
        assert!(floor.admits_unknown(1));
        floor.forget(1_000);
        assert!(!floor.admits_unknown(999));
        assert!(!floor.admits_unknown(1_000));
        assert!(floor.admits_unknown(1_001));
        floor.forget(500);
        assert_eq!(floor.floor_ms(), 1_000, "the floor never goes back");
    }

    #[test]
    fn a_restarted_table_refuses_what_was_sealed_before_it_started() {
        let floor = ReplayFloor::starting_at(5_000);
        assert!(!floor.admits_unknown(4_999));
        assert!(floor.admits_unknown(5_001));
    }
}

//! An emulated capacity (`pmnet server --max-ops-per-s N`, and a chain member's
//! `--chain-max-ops-per-s`): a token bucket that lets the server take at most N requests per
//! second from its socket. What it does not take stays
//! in the kernel's socket buffer, in arrival order, until tokens are due: no queue of the
//! server's own. The evaluation of NetCache emulates its storage servers' capacity this way,
//! and the rack of `pmnet bench --servers` does too.
//!
//! The bucket owns no clock: time comes in as an argument, so the tests drive it with a
//! virtual one.

use crate::Time;

/// The largest capacity accepted: beyond it a server on one thread is the limit, not the
/// bucket.
pub const MAX_OPS_PER_S_MAX: u64 = 100_000_000;

/// One token in the bucket's units: a token accrues in `UNIT / rate` nanoseconds, so the level
/// grows by `rate` units per nanosecond, in integers.
const UNIT: i128 = 1_000_000_000;

/// A server out of tokens sleeps until this long's worth (and at least one) has accrued, so a
/// saturated server wakes at most about a thousand times a second whatever its capacity.
const WAKE_GRANULARITY_NS: u64 = 1_000_000;

/// The capacity text every banner and report line carries.
pub fn capacity_text(ops_per_s: u64) -> String {
    format!(
        "at most {ops_per_s} requests/s (emulated, as NetCache's evaluation emulates its storage \
         servers)"
    )
}

/// Whether `ops_per_s` is a capacity a server accepts, or why not.
pub fn check_max_ops_per_s(ops_per_s: u64) -> Result<u64, String> {
    if ops_per_s == 0 || ops_per_s > MAX_OPS_PER_S_MAX {
        return Err(format!(
            "a capacity of {ops_per_s} requests/s is out of range: give 1 to {MAX_OPS_PER_S_MAX} \
             (leave the option out for a server without an emulated limit)"
        ));
    }
    Ok(ops_per_s)
}

/// A token bucket of `rate` tokens per second, `depth` tokens deep; one token pays for one
/// request datagram the server takes. It may go into debt: the server learns how many
/// requests a datagram held (a device's batch holds several) only after it took it, and pays
/// for all of them; the next datagram waits until the debt is paid. The debt is bounded by
/// what one receive can bring.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_s: u64,
    depth: u64,
    /// Tokens × [`UNIT`]; below zero while in debt.
    level: i128,
    /// When `level` was last brought up to date.
    updated: Time,
}

impl TokenBucket {
    /// A full bucket of `rate_per_s` tokens per second (1..=[`MAX_OPS_PER_S_MAX`]), deep a
    /// hundredth of a second's worth and at least one token, so that bursts stay short.
    pub fn new(rate_per_s: u64, now: Time) -> TokenBucket {
        assert!(
            (1..=MAX_OPS_PER_S_MAX).contains(&rate_per_s),
            "rate checked by check_max_ops_per_s"
        );
        let depth = (rate_per_s / 100).max(1);
        TokenBucket {
            rate_per_s,
            depth,
            level: i128::from(depth) * UNIT,
            updated: now,
        }
    }

    pub fn rate_per_s(&self) -> u64 {
        self.rate_per_s
    }

    /// Most tokens the bucket holds: the longest burst.
    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// Bring the level up to `now` (a `now` earlier than the last is taken as the last).
    fn refill(&mut self, now: Time) {
        if now <= self.updated {
            return;
        }
        let elapsed_ns = i128::from(now.as_nanos() - self.updated.as_nanos());
        let full = i128::from(self.depth) * UNIT;
        // Capped before the product can grow: elapsed time beyond a full refill adds nothing.
        let room = full - self.level;
        let accrued = elapsed_ns.saturating_mul(i128::from(self.rate_per_s));
        self.level += accrued.min(room).max(0);
        self.updated = now;
        debug_assert!(self.level <= full);
    }

    /// Whole tokens available at `now` (0 while in debt).
    pub fn available(&mut self, now: Time) -> u64 {
        self.refill(now);
        if self.level <= 0 {
            return 0;
        }
        u64::try_from(self.level / UNIT).unwrap_or(u64::MAX)
    }

    /// Pay for `count` requests taken at `now` (the bucket may go into debt).
    pub fn take(&mut self, now: Time, count: u64) {
        self.refill(now);
        self.level -= i128::from(count) * UNIT;
    }

    /// When a server that found no token at `now` should look again: once a millisecond's
    /// worth of tokens, and at least one, has accrued (`None`: a token is available now).
    pub fn next_wake(&self, now: Time) -> Option<Time> {
        let level = self.level_at(now);
        if level >= UNIT {
            return None;
        }
        let per_millisecond = self.rate_per_s.saturating_mul(WAKE_GRANULARITY_NS) / 1_000_000_000;
        let wanted = i128::from(per_millisecond.clamp(1, self.depth)) * UNIT;
        let missing = wanted - level;
        let rate = i128::from(self.rate_per_s);
        let wait_ns = (missing + rate - 1) / rate;
        let wait_ns = u64::try_from(wait_ns).unwrap_or(u64::MAX);
        Some(Time::from_nanos(now.as_nanos().saturating_add(wait_ns)))
    }

    /// The level `now` would find, without changing the bucket.
    fn level_at(&self, now: Time) -> i128 {
        let mut copy = self.clone();
        copy.refill(now);
        copy.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Time {
        Time::from_nanos(ms * 1_000_000)
    }

    /// Take a request whenever a token is there, at every step of a virtual clock; returns
    /// how many were taken by the end.
    fn drain(bucket: &mut TokenBucket, from_ns: u64, until_ns: u64, step_ns: u64) -> u64 {
        let mut taken = 0;
        let mut now = from_ns;
        while now <= until_ns {
            let time = Time::from_nanos(now);
            let available = bucket.available(time);
            bucket.take(time, available);
            taken += available;
            now += step_ns;
        }
        taken
    }

    #[test]
    fn a_saturated_bucket_passes_its_rate_and_its_depth_once() {
        for rate in [1, 7, 100, 2_000, 1_000_000] {
            let mut bucket = TokenBucket::new(rate, Time::ZERO);
            let depth = bucket.depth();
            assert_eq!(depth, (rate / 100).max(1));
            // Ten virtual seconds in steps of 37 µs: the first burst plus ten seconds' worth at
            // most; a full bucket between two looks keeps no more than its depth, so a little
            // less is fine (under 1 % with a look every 37 µs).
            let taken = drain(&mut bucket, 0, 10_000_000_000, 37_000);
            assert!(taken <= depth + rate * 10, "rate {rate}: {taken} taken");
            assert!(taken >= rate * 10 * 99 / 100, "rate {rate}: {taken} taken");
        }
    }

    #[test]
    fn an_idle_bucket_holds_at_most_its_depth() {
        let mut bucket = TokenBucket::new(2_000, Time::ZERO);
        assert_eq!(bucket.available(Time::ZERO), 20);
        bucket.take(Time::ZERO, 20);
        assert_eq!(bucket.available(Time::ZERO), 0);
        assert_eq!(bucket.available(at_ms(1)), 2);
        // An hour idle: still one burst of `depth`, no more.
        assert_eq!(bucket.available(at_ms(3_600_000)), 20);
        // Time running backwards changes nothing.
        assert_eq!(bucket.available(at_ms(5)), 20);
    }

    #[test]
    fn a_debt_is_paid_before_the_next_token() {
        let mut bucket = TokenBucket::new(1_000, Time::ZERO);
        assert_eq!(bucket.depth(), 10);
        // A batch of 30 requests taken on the strength of one token.
        bucket.take(Time::ZERO, 30);
        assert_eq!(bucket.available(at_ms(19)), 0);
        assert_eq!(
            bucket.available(at_ms(20)),
            0,
            "the debt of 20 is paid, nothing more"
        );
        assert_eq!(bucket.available(at_ms(21)), 1);
    }

    #[test]
    fn an_empty_bucket_wakes_when_tokens_are_due() {
        // 2 000/s: a token every 500 µs; it wakes after a millisecond's worth, two tokens.
        let mut bucket = TokenBucket::new(2_000, Time::ZERO);
        bucket.take(Time::ZERO, 20);
        assert_eq!(bucket.next_wake(Time::ZERO), Some(at_ms(1)));
        assert_eq!(bucket.available(at_ms(1)), 2);
        assert_eq!(bucket.next_wake(at_ms(1)), None);
        // 10/s: one token, 100 ms.
        let mut slow = TokenBucket::new(10, Time::ZERO);
        slow.take(Time::ZERO, 1);
        assert_eq!(slow.next_wake(Time::ZERO), Some(at_ms(100)));
        assert_eq!(slow.next_wake(at_ms(40)), Some(at_ms(100)));
        assert_eq!(slow.available(at_ms(99)), 0);
        assert_eq!(slow.available(at_ms(100)), 1);
        // 10 000 000/s: a millisecond's worth, 10 000 tokens (the depth is 100 000).
        let mut fast = TokenBucket::new(10_000_000, Time::ZERO);
        fast.take(Time::ZERO, fast.depth());
        let wake = fast.next_wake(Time::ZERO).unwrap();
        assert_eq!(wake, at_ms(1));
        assert_eq!(fast.available(wake), 10_000);
        // 50/s, a depth of 1: a millisecond's worth is less than a token, so one token.
        let mut one = TokenBucket::new(50, Time::ZERO);
        one.take(Time::ZERO, 1);
        assert_eq!(one.next_wake(Time::ZERO), Some(at_ms(20)));
    }

    #[test]
    fn capacities_out_of_range_are_refused() {
        assert!(check_max_ops_per_s(0).unwrap_err().contains("1 to"));
        assert!(check_max_ops_per_s(MAX_OPS_PER_S_MAX + 1).is_err());
        assert_eq!(check_max_ops_per_s(2_000), Ok(2_000));
        assert!(capacity_text(5).contains("emulated"));
    }
}

//! `pmnet device --chain-max-ops-per-s N`: an emulated capacity for a chain store's member,
//! as `pmnet server --max-ops-per-s` emulates a server's (the same token bucket). The member
//! takes at most N chain requests a second (client requests and reads relayed to it by other
//! members); the rest wait, in arrival order, until tokens are due. Writes passed down the
//! chain and commits passed up are not limited: they are the chain's own work for requests
//! already taken. The read-scaling benchmark (`pmnet coord-bench --read-scaling`) gives every
//! member the same capacity, so that reads spread over the members and reads at the tail
//! only are compared on capacity rather than on CPU.

use std::collections::VecDeque;
use std::net::SocketAddr;

use pmnet_proto::{
    CountDrop, DropCounts, DropReason, NetworkFunction, PersistBatch, Time, TokenBucket, Transmit,
    Verdict,
};
use pmnet_wire::netchain::CHAIN_REQUEST;
use pmnet_wire::{Header, PacketType};

/// Requests waiting for tokens, at most; beyond it a request is dropped (its client sends it
/// again).
pub const WAITING_MAX: usize = 16_384;

/// A request that waits for a token.
#[derive(Debug)]
struct Waiting {
    from: SocketAddr,
    header: Header,
    datagram: Vec<u8>,
    /// With keys: its seal time and the clock when it came ([`NetworkFunction::note_seal`]),
    /// told the member when it is handed on.
    seal: Option<(u64, u64)>,
}

/// `inner` (a chain member) behind a token bucket for its chain requests.
#[derive(Debug)]
pub struct CapacityLimited<F> {
    inner: F,
    bucket: TokenBucket,
    waiting: VecDeque<Waiting>,
    /// When the first waiting request may have a token (`None`: none waits).
    wake_at: Option<Time>,
    delayed: u64,
    /// Requests dropped because [`WAITING_MAX`] waited (`backlog`).
    dropped: DropCounts,
    /// The seal time of the datagram offered next, until it is handed on or queued.
    seal: Option<(u64, u64)>,
}

impl<F: NetworkFunction> CapacityLimited<F> {
    /// `inner` taking at most `ops_per_s` chain requests a second (checked by
    /// `pmnet_proto::check_max_ops_per_s`).
    pub fn new(inner: F, ops_per_s: u64, now: Time) -> CapacityLimited<F> {
        CapacityLimited {
            inner,
            bucket: TokenBucket::new(ops_per_s, now),
            waiting: VecDeque::new(),
            wake_at: None,
            delayed: 0,
            dropped: DropCounts::new(),
            seal: None,
        }
    }

    /// Hand the waiting requests that have tokens at `now` to the member, in order.
    fn release(&mut self, now: Time) {
        while !self.waiting.is_empty() && self.bucket.available(now) > 0 {
            let waiting = self.waiting.pop_front().expect("checked");
            self.bucket.take(now, 1);
            if let Some((sealed_at_ms, started_ms)) = waiting.seal {
                self.inner.note_seal(sealed_at_ms, started_ms);
            }
            let verdict = self
                .inner
                .handle(now, waiting.from, &waiting.header, &waiting.datagram);
            debug_assert_eq!(
                verdict,
                Verdict::Consumed,
                "a chain request is the member's"
            );
        }
        self.wake_at = if self.waiting.is_empty() {
            None
        } else {
            Some(self.bucket.next_wake(now).unwrap_or(now))
        };
    }
}

impl<F: NetworkFunction> NetworkFunction for CapacityLimited<F> {
    type Work = F::Work;

    fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        self.seal = Some((sealed_at_ms, started_ms));
    }

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        let seal = self.seal.take();
        let pass = |inner: &mut F| {
            if let Some((sealed_at_ms, started_ms)) = seal {
                inner.note_seal(sealed_at_ms, started_ms);
            }
            inner.handle(now, from, header, datagram)
        };
        if header.packet_type != PacketType::Reserved(CHAIN_REQUEST) {
            return pass(&mut self.inner);
        }
        self.release(now);
        if self.waiting.is_empty() && self.bucket.available(now) > 0 {
            self.bucket.take(now, 1);
            return pass(&mut self.inner);
        }
        if self.waiting.len() >= WAITING_MAX {
            self.dropped.record(DropReason::Backlog);
            return Verdict::Consumed;
        }
        self.delayed += 1;
        self.waiting.push_back(Waiting {
            from,
            header: *header,
            datagram: datagram.to_vec(),
            seal,
        });
        self.wake_at = Some(self.bucket.next_wake(now).unwrap_or(now));
        Verdict::Consumed
    }

    fn handle_timeout(&mut self, now: Time) {
        if self.wake_at.is_some_and(|at| at <= now) {
            self.release(now);
        }
        if self.inner.poll_timeout().is_some_and(|at| at <= now) {
            self.inner.handle_timeout(now);
        }
    }

    fn on_persisted(&mut self, now: Time, through: u64) {
        self.inner.on_persisted(now, through);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.inner.poll_transmit()
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<F::Work>> {
        self.inner.poll_persist()
    }

    fn poll_timeout(&self) -> Option<Time> {
        match (self.inner.poll_timeout(), self.wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_sent(&mut self, transmit: &Transmit) {
        self.inner.on_sent(transmit);
    }

    fn on_unverified(&mut self, now: Time, from: SocketAddr, reason: DropReason) {
        self.inner.on_unverified(now, from, reason);
    }

    fn dropped(&self) -> DropCounts {
        self.inner.dropped().merged(&self.dropped)
    }

    fn report(&self) -> Option<String> {
        self.inner.report()
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut samples = self.inner.counter_samples();
        samples.extend([
            (
                "pmnet_chain_capacity_max_ops_per_s",
                "The member's emulated capacity: chain requests taken per second at most.",
                self.bucket.rate_per_s(),
            ),
            (
                "pmnet_chain_capacity_delayed_total",
                "Chain requests that waited for the emulated capacity.",
                self.delayed,
            ),
            (
                "pmnet_chain_capacity_waiting",
                "Chain requests waiting for the emulated capacity now.",
                self.waiting.len() as u64,
            ),
        ]);
        samples
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    /// Counts what it is handed: chain requests (their sequence numbers, in order) and others.
    #[derive(Debug, Default)]
    struct Counter {
        requests: Vec<u32>,
        others: u32,
    }

    impl NetworkFunction for Counter {
        type Work = Infallible;

        fn handle(&mut self, _: Time, _: SocketAddr, header: &Header, _: &[u8]) -> Verdict {
            if header.packet_type == PacketType::Reserved(CHAIN_REQUEST) {
                self.requests.push(header.seq);
            } else {
                self.others += 1;
            }
            Verdict::Consumed
        }
        fn handle_timeout(&mut self, _: Time) {}
        fn on_persisted(&mut self, _: Time, _: u64) {}
        fn poll_transmit(&mut self) -> Option<Transmit> {
            None
        }
        fn poll_persist(&mut self) -> Option<PersistBatch<Infallible>> {
            None
        }
        fn poll_timeout(&self) -> Option<Time> {
            None
        }
    }

    fn datagram(packet_type: PacketType, seq: u32) -> (Header, Vec<u8>) {
        let header = Header::new(packet_type, 1, 9, seq);
        let bytes = header.encode(&[]);
        (header, bytes)
    }

    fn at_ms(ms: u64) -> Time {
        Time::from_nanos(ms * 1_000_000)
    }

    /// `count` chain requests arriving at `at`, numbered from `first`.
    fn offer(limited: &mut CapacityLimited<Counter>, at: Time, first: u32, count: u32) {
        let from = SocketAddr::from(([127, 0, 0, 1], 9));
        for seq in first..first + count {
            let (header, bytes) = datagram(PacketType::Reserved(CHAIN_REQUEST), seq);
            assert_eq!(limited.handle(at, from, &header, &bytes), Verdict::Consumed);
        }
    }

    /// Run the timers up to `until` as a device's loop would.
    fn run_until(limited: &mut CapacityLimited<Counter>, until: Time) {
        let mut turns = 0;
        while let Some(at) = limited.poll_timeout().filter(|at| *at <= until) {
            limited.handle_timeout(at);
            turns += 1;
            assert!(turns < 1_000_000, "the timers converge");
        }
    }

    #[test]
    fn requests_beyond_the_rate_wait_and_go_in_order_at_the_rate() {
        // 1 000/s, 10 deep: a burst of 500 at once passes 10, the rest over ~490 ms.
        let mut limited = CapacityLimited::new(Counter::default(), 1_000, Time::ZERO);
        offer(&mut limited, Time::ZERO, 0, 500);
        assert_eq!(limited.inner.requests.len(), 10);
        assert!(limited.poll_timeout().is_some());
        run_until(&mut limited, at_ms(100));
        let by_100_ms = limited.inner.requests.len();
        assert!((105..=111).contains(&by_100_ms), "{by_100_ms} by 100 ms");
        run_until(&mut limited, at_ms(1_000));
        assert_eq!(limited.inner.requests, (0..500).collect::<Vec<_>>());
        assert_eq!(limited.poll_timeout(), None);
        assert_eq!(limited.delayed, 490);
    }

    #[test]
    fn other_datagrams_pass_at_once_and_the_waiting_are_bounded() {
        let mut limited = CapacityLimited::new(Counter::default(), 1, Time::ZERO);
        offer(&mut limited, Time::ZERO, 0, WAITING_MAX as u32 + 5);
        assert_eq!(limited.inner.requests.len(), 1);
        assert_eq!(limited.waiting.len(), WAITING_MAX);
        assert_eq!(
            limited.dropped().get("backlog"),
            Some(&4),
            "counted by reason"
        );
        let from = SocketAddr::from(([127, 0, 0, 1], 9));
        let (header, bytes) = datagram(PacketType::UpdateRequest, 1);
        assert_eq!(
            limited.handle(Time::ZERO, from, &header, &bytes),
            Verdict::Consumed
        );
        assert_eq!(limited.inner.others, 1);
    }
}

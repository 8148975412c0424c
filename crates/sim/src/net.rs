//! The network of the chain store's and the replicated memory's worlds: one delivery queue in
//! virtual time, from one seed's generator, that loses, duplicates and delays (so reorders)
//! datagrams, and partitions (`cut`) that drop what crosses them when it is delivered.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::Time;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::net_attacker::{NetAuth, Replayer};

/// A datagram on its way: (from, to, bytes).
pub(crate) type InFlight = (SocketAddr, SocketAddr, Vec<u8>);

pub(crate) struct Net {
    pub(crate) now: Time,
    pub(crate) rng: ChaCha8Rng,
    /// Datagrams by delivery time (and the order they were sent in, for ties).
    pub(crate) queue: BTreeMap<(Time, u64), InFlight>,
    pub(crate) next: u64,
    /// Probability that a datagram is lost.
    pub(crate) loss: f64,
    /// Probability that a datagram is delivered twice (each copy with its own delay).
    pub(crate) duplicate: f64,
    /// Pairs that cannot reach each other, until a time: `(side, Some(other), until)` cuts
    /// one pair, `(side, None, until)` cuts `side` off from everyone.
    pub(crate) cut: Vec<(SocketAddr, Option<SocketAddr>, Time)>,
    /// Keys: every datagram sealed by its sender and verified by its receiver.
    pub(crate) auth: Option<NetAuth>,
    /// The attacker that captures and replays genuine datagrams.
    pub(crate) replayer: Option<Replayer>,
    /// When the datagram [`Net::pop_due`] last returned was sealed, and the wall clock then
    /// (Unix ms), with keys: what the receiver's `note_seal` takes.
    pub(crate) sealed: Option<(u64, u64)>,
}

impl Net {
    /// A network at time zero with its own generator.
    pub(crate) fn new(rng: ChaCha8Rng, loss: f64, duplicate: f64) -> Net {
        Net {
            now: Time::ZERO,
            rng,
            queue: BTreeMap::new(),
            next: 0,
            loss,
            duplicate,
            cut: Vec::new(),
            auth: None,
            replayer: None,
            sealed: None,
        }
    }

    /// The attacker replays what it chose to replay now.
    pub(crate) fn strike(&mut self) {
        if let Some(replayer) = self.replayer.as_mut() {
            for (at, from, to, bytes) in replayer.strike(self.now) {
                self.inject(at, from, to, bytes);
            }
        }
    }

    /// `restarted` restarted now: the attacker replays what was sent to it.
    pub(crate) fn restarted(&mut self, restarted: SocketAddr) {
        if let Some(replayer) = self.replayer.as_mut() {
            for (at, from, to, bytes) in replayer.after_restart(self.now, restarted) {
                self.inject(at, from, to, bytes);
            }
        }
    }

    /// Put bytes on the network as they are (the attacker's), delivered at `at`.
    fn inject(&mut self, at: Time, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        self.next += 1;
        self.queue.insert((at, self.next), (from, to, bytes));
    }

    /// Send a datagram: lost, or delivered once or twice, each copy 10–400 µs later.
    pub(crate) fn send(&mut self, from: SocketAddr, to: SocketAddr, mut bytes: Vec<u8>) {
        if let Some(auth) = self.auth.as_mut() {
            auth.seal(self.now, from, &mut bytes);
        }
        if let Some(replayer) = self.replayer.as_mut() {
            replayer.capture(self.now, from, to, &bytes);
        }
        if self.rng.random_bool(self.loss) {
            return;
        }
        let copies = if self.rng.random_bool(self.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_micros(self.rng.random_range(10..400));
            self.next += 1;
            self.queue
                .insert((self.now + delay, self.next), (from, to, bytes.clone()));
        }
    }

    /// Whether a partition separates `from` and `to` now.
    pub(crate) fn blocked(&self, from: SocketAddr, to: SocketAddr) -> bool {
        self.cut.iter().any(|(side, other, until)| {
            self.now < *until
                && match other {
                    Some(other) => {
                        (from == *side && to == *other) || (from == *other && to == *side)
                    }
                    None => from == *side || to == *side,
                }
        })
    }

    /// Whether `side` is cut off from everyone now.
    pub(crate) fn isolated(&self, side: SocketAddr) -> bool {
        self.cut
            .iter()
            .any(|(cut, other, until)| *cut == side && other.is_none() && self.now < *until)
    }

    /// The next datagram due by now that no partition drops and that verifies, with keys (as
    /// the receiver's parser expects it; what is dropped is taken off the queue on the way).
    pub(crate) fn pop_due(&mut self) -> Option<InFlight> {
        loop {
            let (from, to, bytes) = self.pop_due_raw()?;
            let Some(auth) = self.auth.as_mut() else {
                return Some((from, to, bytes));
            };
            if let Some((plain, sealed)) = auth.open(self.now, to, &bytes) {
                self.sealed = Some(sealed);
                return Some((from, to, plain));
            }
        }
    }

    fn pop_due_raw(&mut self) -> Option<InFlight> {
        while let Some((&(at, order), _)) = self.queue.first_key_value() {
            if at > self.now {
                return None;
            }
            let (from, to, bytes) = self.queue.remove(&(at, order)).expect("present");
            if self.blocked(from, to) {
                continue;
            }
            return Some((from, to, bytes));
        }
        None
    }

    /// When the next datagram is due.
    pub(crate) fn next_due(&self) -> Option<Time> {
        self.queue.first_key_value().map(|(key, _)| key.0)
    }
}

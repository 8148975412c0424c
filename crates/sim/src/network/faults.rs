//! The network's fault knobs and what they do to one datagram: loss, duplication, the delay
//! of each copy (a fixed latency plus jitter, or a uniform range: the world's choice),
//! corruption in flight; and the counts of what the network did.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Random network faults, from one seed: loss, duplication, delay spread (which reorders),
/// and corruption of bytes in flight.
#[derive(Debug)]
pub struct Faults {
    pub rng: ChaCha8Rng,
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice (each copy with its own delay).
    pub duplicate: f64,
    /// With [`Delay::Latency`]: each copy's delay is the latency plus up to this.
    pub jitter: Duration,
    /// Probability that a random bit of a datagram is flipped in flight.
    pub corrupt: f64,
}

impl Faults {
    /// Loss and duplication only, drawn from `rng` (no jitter, no corruption).
    pub fn lossy(rng: ChaCha8Rng, loss: f64, duplicate: f64) -> Faults {
        Faults {
            rng,
            loss,
            duplicate,
            jitter: Duration::ZERO,
            corrupt: 0.0,
        }
    }
}

/// How long a datagram takes, chosen by the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delay {
    /// A fixed latency, plus up to the faults' jitter for each copy (the main world's).
    Latency(Duration),
    /// Uniform in `min..max` for each copy, with faults (the chain store's and replicated
    /// memory's worlds: 10–400 µs); `min` without.
    Uniform { min: Duration, max: Duration },
}

impl Delay {
    /// The delay without faults (and of injected datagrams).
    pub fn base(self) -> Duration {
        match self {
            Delay::Latency(latency) => latency,
            Delay::Uniform { min, .. } => min,
        }
    }
}

/// What the network did, for the swarm's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkCounters {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Dropped by a partition: a blocked link when sent, a timed cut when due.
    pub partitioned: u64,
    /// Dropped by the network's keys as they did not verify (see `NetworkKeys`).
    pub unverified: u64,
}

impl Faults {
    /// What the random faults do to one datagram, in a fixed order of draws (loss unless
    /// already dropped, duplication, the delay of each copy, corruption): counted in
    /// `counters`, noted in `fate`; returns the copies to deliver.
    pub(super) fn strike(
        &mut self,
        delay: Delay,
        counters: &mut NetworkCounters,
        dropped: &mut bool,
        bytes: &mut [u8],
        delays: &mut [Duration; 2],
        fate: &mut String,
    ) -> usize {
        let mut copies = 1;
        if !*dropped && self.rng.random_bool(self.loss) {
            *dropped = true;
            counters.lost += 1;
            fate.push_str(" [lost]");
        }
        if self.rng.random_bool(self.duplicate) {
            copies = 2;
            counters.duplicated += 1;
            if !*dropped {
                fate.push_str(" [duplicated]");
            }
        }
        match delay {
            Delay::Latency(_) => {
                let jitter_ns = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
                for delay in delays.iter_mut() {
                    *delay += Duration::from_nanos(self.rng.random_range(0..=jitter_ns));
                }
            }
            Delay::Uniform { min, max } => {
                for delay in delays.iter_mut() {
                    *delay = self
                        .rng
                        .random_range(min..max.max(min + Duration::from_nanos(1)));
                }
            }
        }
        if self.rng.random_bool(self.corrupt) {
            let bit = self.rng.random_range(0..bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            counters.corrupted += 1;
            if !*dropped {
                fate.push_str(&format!(
                    " [corrupted: bit {} of byte {}]",
                    bit % 8,
                    bit / 8
                ));
            }
        }
        copies
    }
}

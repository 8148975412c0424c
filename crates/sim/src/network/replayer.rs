//! The network's eavesdropper: an attacker without the key that captures genuine datagrams
//! as they are sent (recent ones, and an archive sampled over the whole run) and replays them
//! verbatim, from their source, at random times (to their destination or another endpoint),
//! and in bursts after a restart of the endpoint they were sent to: just after it, and once a
//! new second of seal time has begun. Client requests, writes above all, are what it replays
//! most. Its choices come from a generator of its own.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::Time;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::keys::REPLAY_WINDOW_MS;

/// A captured datagram: when, from, to, the bytes as sent.
type Captured = (Time, SocketAddr, SocketAddr, Vec<u8>);

const RECENT_MAX: usize = 256;
const ARCHIVE_MAX: usize = 256;

/// The eavesdropper that replays.
#[derive(Debug)]
pub struct Replayer {
    rng: ChaCha8Rng,
    recent: VecDeque<Captured>,
    archive: Vec<Captured>,
    /// Endpoints whose requests it prefers (the clients) and where it may send anything.
    clients: Vec<SocketAddr>,
    endpoints: Vec<SocketAddr>,
    next_strike: Time,
    /// Datagrams replayed, and those captured more than the window and a second before.
    pub(crate) replayed: u64,
    pub(crate) replayed_past_window: u64,
    pub(crate) bursts_after_restarts: u64,
    /// Packet types it does not replay (captured, never sent again).
    pub(crate) spared_types: Vec<u8>,
}

impl Replayer {
    pub(crate) fn new(seed: u64, clients: Vec<SocketAddr>, endpoints: Vec<SocketAddr>) -> Replayer {
        Replayer {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7265_706c_6179_0001),
            recent: VecDeque::new(),
            archive: Vec::new(),
            clients,
            endpoints,
            next_strike: Time::ZERO,
            replayed: 0,
            replayed_past_window: 0,
            bursts_after_restarts: 0,
            spared_types: Vec::new(),
        }
    }

    /// See a datagram sent (sealed, before the network loses or duplicates it).
    pub(crate) fn capture(&mut self, now: Time, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        if bytes.len() > 3 && self.spared_types.contains(&bytes[3]) {
            return;
        }
        let entry = (now, from, to, bytes.to_vec());
        if self.rng.random_bool(0.05) {
            if self.archive.len() < ARCHIVE_MAX {
                self.archive.push(entry.clone());
            } else {
                let index = self.rng.random_range(0..ARCHIVE_MAX);
                self.archive[index] = entry.clone();
            }
        }
        if self.recent.len() == RECENT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(entry);
    }

    /// Replays due at `now`, each `(deliver at, from, to, bytes)`: every few milliseconds, one
    /// to four captured datagrams (recent or archived, client requests preferred).
    pub(crate) fn strike(&mut self, now: Time) -> Vec<(Time, SocketAddr, SocketAddr, Vec<u8>)> {
        if now < self.next_strike {
            return Vec::new();
        }
        self.next_strike = now + Duration::from_micros(self.rng.random_range(500..20_000));
        let mut out = Vec::new();
        for _ in 0..self.rng.random_range(1..=4) {
            let from_archive = self.rng.random_bool(0.4);
            let pool: Vec<&Captured> = if from_archive {
                self.archive.iter().collect()
            } else {
                self.recent.iter().collect()
            };
            let preferred: Vec<&Captured> = pool
                .iter()
                .copied()
                .filter(|entry| self.clients.contains(&entry.1))
                .collect();
            let pool = if !preferred.is_empty() && self.rng.random_bool(0.7) {
                preferred
            } else {
                pool
            };
            if pool.is_empty() {
                continue;
            }
            let (at, from, mut to, bytes) = pool[self.rng.random_range(0..pool.len())].clone();
            if self.rng.random_bool(0.2) {
                to = self.endpoints[self.rng.random_range(0..self.endpoints.len())];
            }
            self.count(now, at);
            out.push((now + self.delay(), from, to, bytes));
        }
        out
    }

    /// After `restarted` restarts at `now`: replay what was captured on its way to it, client
    /// requests first — some at once, some after the next second of seal time begins (what a
    /// genuine client's fresh transmission would be sealed in).
    pub(crate) fn after_restart(
        &mut self,
        now: Time,
        restarted: SocketAddr,
    ) -> Vec<(Time, SocketAddr, SocketAddr, Vec<u8>)> {
        let mut sent_to: Vec<Captured> = self
            .recent
            .iter()
            .chain(&self.archive)
            .filter(|entry| entry.2 == restarted)
            .cloned()
            .collect();
        if sent_to.is_empty() {
            return Vec::new();
        }
        self.bursts_after_restarts += 1;
        // Client requests first (a stable sort keeps capture order within each kind).
        sent_to.sort_by_key(|entry| !self.clients.contains(&entry.1));
        let mut out = Vec::new();
        for (at, from, to, bytes) in sent_to.into_iter().take(16) {
            let later = if self.rng.random_bool(0.5) {
                self.delay()
            } else {
                Duration::from_millis(self.rng.random_range(1000..1600))
            };
            self.count(now + later, at);
            out.push((now + later, from, to, bytes));
        }
        out
    }

    fn count(&mut self, when: Time, captured_at: Time) {
        self.replayed += 1;
        let age = when.saturating_duration_since(captured_at);
        if age > Duration::from_millis(u64::from(REPLAY_WINDOW_MS) + 1000) {
            self.replayed_past_window += 1;
        }
    }

    fn delay(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(10..2000))
    }
}

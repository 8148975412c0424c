//! The one attacker of every world: a host without the key that captures genuine datagrams as
//! they are sent (the recent ones, and an archive of them over the whole run) and replays them
//! verbatim, from their source, to their destination or another endpoint; what it replays
//! must verify and change nothing.
//!
//! The chain store's and replicated memory's worlds let it strike on its own schedule
//! ([`Attacker::replaying`]): it archives a share of what it captures, replays one to four
//! datagrams every few milliseconds, and bursts after a restart of the endpoint they were
//! sent to — just after it, and once a new second of seal time has begun. Client requests,
//! writes above all, are what it replays most. The main world drives it from its safety
//! phase ([`Attacker::capturing`]; `vopr/attacker.rs`, which also forges): what to archive
//! and when to replay what, recent or archived, drawn from the main world's generators, so
//! that its seeds draw what they drew before the worlds shared one attacker.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::Time;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::keys::REPLAY_WINDOW_MS;

/// A captured datagram: when, from, to, the bytes as sent.
pub type Captured = (Time, SocketAddr, SocketAddr, Vec<u8>);

/// What the replaying attacker keeps of the recent datagrams, and archives at most.
const RECENT_MAX: usize = 256;
const ARCHIVE_MAX: usize = 256;
/// The share of what it captures the replaying attacker archives.
const ARCHIVE_SHARE: f64 = 0.05;

/// The attacker that captures and replays.
#[derive(Debug)]
pub struct Attacker {
    rng: ChaCha8Rng,
    recent: VecDeque<Captured>,
    recent_max: usize,
    archive: Vec<Captured>,
    archive_max: usize,
    /// The share of captured datagrams archived as they are captured (0: only when the
    /// world asks, [`Attacker::archive_latest`]).
    archive_share: f64,
    /// The replay window of the world's keys (milliseconds): what is older is stale.
    window_ms: u64,
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

impl Attacker {
    /// The attacker that strikes on its own schedule ([`Attacker::strike`],
    /// [`Attacker::after_restart`]), from a generator seeded with `seed`: it prefers what
    /// `clients` sent, and may send anything to any of `endpoints`.
    pub(crate) fn replaying(
        seed: u64,
        clients: Vec<SocketAddr>,
        endpoints: Vec<SocketAddr>,
    ) -> Attacker {
        Attacker {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7265_706c_6179_0001),
            recent: VecDeque::new(),
            recent_max: RECENT_MAX,
            archive: Vec::new(),
            archive_max: ARCHIVE_MAX,
            archive_share: ARCHIVE_SHARE,
            window_ms: u64::from(REPLAY_WINDOW_MS),
            clients,
            endpoints,
            next_strike: Time::ZERO,
            replayed: 0,
            replayed_past_window: 0,
            bursts_after_restarts: 0,
            spared_types: Vec::new(),
        }
    }

    /// The attacker a world drives (the main world's): it keeps the last `recent_max`
    /// datagrams sent and archives up to `archive_max` when told to; what it replays, and when,
    /// the world chooses. `window_ms`: the replay window of the world's keys.
    pub fn capturing(recent_max: usize, archive_max: usize, window_ms: u64) -> Attacker {
        Attacker {
            rng: ChaCha8Rng::seed_from_u64(0),
            recent: VecDeque::new(),
            recent_max,
            archive: Vec::new(),
            archive_max,
            archive_share: 0.0,
            window_ms,
            clients: Vec::new(),
            endpoints: Vec::new(),
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
        if self.archive_share > 0.0 && self.rng.random_bool(self.archive_share) {
            Self::archive_into(
                &mut self.archive,
                self.archive_max,
                entry.clone(),
                &mut self.rng,
            );
        }
        if self.recent.len() == self.recent_max {
            self.recent.pop_front();
        }
        self.recent.push_back(entry);
    }

    /// Archive `entry`, in the place of one at random (`rng`) when the archive is full.
    fn archive_into(archive: &mut Vec<Captured>, max: usize, entry: Captured, rng: &mut impl Rng) {
        if archive.len() < max {
            archive.push(entry);
        } else {
            let index = rng.random_range(0..max);
            archive[index] = entry;
        }
    }

    /// The recent datagrams captured, oldest first.
    pub fn recent(&self) -> &VecDeque<Captured> {
        &self.recent
    }

    /// Whether it archived anything.
    pub fn archived_nothing(&self) -> bool {
        self.archive.is_empty()
    }

    /// Archive the newest datagram captured, as captured `now`, in the place of one chosen with
    /// `rng` when the archive is full. False when nothing was captured.
    pub fn archive_latest(&mut self, now: Time, rng: &mut impl Rng) -> bool {
        let Some((_, from, to, bytes)) = self.recent.back() else {
            return false;
        };
        let entry = (now, *from, *to, bytes.clone());
        Self::archive_into(&mut self.archive, self.archive_max, entry, rng);
        true
    }

    /// An archived datagram chosen with `rng`, one archived within the replay window (and the
    /// second a seal time counts in) when `within` and there is one. None if the archive is
    /// empty.
    pub fn pick_archived(&self, now: Time, within: bool, rng: &mut impl Rng) -> Option<&Captured> {
        if self.archive.is_empty() {
            return None;
        }
        let fresh = |entry: &Captured| {
            now.as_nanos().saturating_sub(entry.0.as_nanos()) / 1_000_000 <= self.window_ms + 1000
        };
        let candidates: Vec<usize> = if within {
            (0..self.archive.len())
                .filter(|&index| fresh(&self.archive[index]))
                .collect()
        } else {
            Vec::new()
        };
        let index = if candidates.is_empty() {
            rng.random_range(0..self.archive.len())
        } else {
            candidates[rng.random_range(0..candidates.len())]
        };
        Some(&self.archive[index])
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
        if age > Duration::from_millis(self.window_ms + 1000) {
            self.replayed_past_window += 1;
        }
    }

    fn delay(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(10..2000))
    }
}

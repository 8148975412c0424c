//! Keys and an eavesdropping attacker on the network of the chain store's and the replicated
//! memory's worlds.
//!
//! [`NetAuth`]: every endpoint seals what it sends and verifies what it receives, as its
//! pipeline does in a deployment, with a key set whose replay window is one second (the
//! worlds run for seconds: replays past the window happen) and the world's virtual wall clock
//! (`SIM_EPOCH_MS` plus virtual time). What does not verify is dropped and counted by reason;
//! the seal time of what does is handed to the receiver (`note_seal`), for the chain head's
//! and the coordinator's replay floors.
//!
//! [`Replayer`]: an attacker without the key that captures genuine datagrams as they are sent
//! (recent ones, and an archive sampled over the whole run) and replays them verbatim, from
//! their source, at random times (to their destination or another endpoint), and in bursts
//! after a restart of the endpoint they were sent to (the chain's members, the coordinating
//! device): just after it, and once a new second of seal time has begun. Client requests,
//! writes above all, are what it replays most. Its choices come from a generator of its own.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_proto::Time;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::world::SIM_EPOCH_MS;

/// The replay window of these worlds' keys.
pub(crate) const REPLAY_WINDOW_MS: u32 = 1000;

/// Every endpoint's authenticator, on the world's virtual wall clock.
pub(crate) struct NetAuth {
    template: Authenticator,
    endpoints: HashMap<SocketAddr, Authenticator>,
    wall: Arc<AtomicU64>,
    /// Datagrams dropped because they did not verify, by reason (`stale`, `bad_tag`, ...).
    pub(crate) dropped: BTreeMap<&'static str, u64>,
}

impl NetAuth {
    /// Keys drawn from `seed`.
    pub(crate) fn for_seed(seed: u64) -> NetAuth {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6e65_745f_6b65_7973);
        let keys = KeySet::new(vec![DeploymentKey::new(1, rng.random())])
            .with_replay_window_ms(REPLAY_WINDOW_MS)
            .encrypting_payloads(rng.random_bool(0.5));
        let wall = Arc::new(AtomicU64::new(SIM_EPOCH_MS));
        let clock = wall.clone();
        let template = Authenticator::with_nonce_prefix(keys, rng.random())
            .with_clock(Arc::new(move || clock.load(Ordering::Relaxed)));
        NetAuth {
            template,
            endpoints: HashMap::new(),
            wall,
            dropped: BTreeMap::new(),
        }
    }

    fn sync(&self, now: Time) {
        self.wall
            .store(SIM_EPOCH_MS + now.as_nanos() / 1_000_000, Ordering::Relaxed);
    }

    fn endpoint(&mut self, addr: SocketAddr) -> &mut Authenticator {
        let template = &self.template;
        self.endpoints
            .entry(addr)
            .or_insert_with(|| template.clone())
    }

    /// Seal what `from` sends at `now`.
    pub(crate) fn seal(&mut self, now: Time, from: SocketAddr, bytes: &mut Vec<u8>) {
        self.sync(now);
        self.endpoint(from).seal(bytes);
    }

    /// Verify what `to` receives at `now`: the datagram as the parser expects it and when it
    /// was sealed (with the wall clock now), or `None` (dropped and counted).
    pub(crate) fn open(
        &mut self,
        now: Time,
        to: SocketAddr,
        bytes: &[u8],
    ) -> Option<(Vec<u8>, (u64, u64))> {
        self.sync(now);
        let auth = self.endpoint(to);
        match auth.verify(bytes) {
            Ok(plain) => {
                let plain = plain.into_owned();
                Some((plain, (auth.sealed_at(), auth.now_ms())))
            }
            Err(error) => {
                *self.dropped.entry(error.reason()).or_default() += 1;
                None
            }
        }
    }

    /// Datagrams dropped as sealed outside the replay window (replays).
    pub(crate) fn stale(&self) -> u64 {
        ["stale", "from_the_future"]
            .iter()
            .filter_map(|reason| self.dropped.get(reason))
            .sum()
    }
}

/// A captured datagram: when, from, to, the bytes as sent.
type Captured = (Time, SocketAddr, SocketAddr, Vec<u8>);

const RECENT_MAX: usize = 256;
const ARCHIVE_MAX: usize = 256;

/// The eavesdropper that replays.
pub(crate) struct Replayer {
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

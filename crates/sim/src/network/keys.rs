//! The deployment keys of the chain store's and replicated memory's worlds, on the world's
//! virtual wall clock (`SIM_EPOCH_MS` plus virtual time), with a replay window of one second
//! (those worlds run for seconds: replays past the window happen).
//!
//! [`NetworkKeys`]: an endpoint with a pipeline (a chain member, a memory node, the
//! coordinating device) takes its authenticator from here ([`NetworkKeys::for_pipeline`]) and
//! seals and verifies in its own pipeline, as in a deployment: its functions learn each
//! datagram's seal time there, for the chain head's and the coordinator's replay floors. For
//! the endpoints without one (the clients, the controller: their state machines take plain
//! datagrams, as the runtime's sockets hand them over), the network seals what they send and
//! verifies what they receive. What does not verify is dropped and counted by reason.
//!
//! The main world's nodes all hold their keys and verify in their own pipelines; it gives its
//! network none.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_proto::Time;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::SIM_EPOCH_MS;

/// The replay window of these worlds' keys.
pub(crate) const REPLAY_WINDOW_MS: u32 = 1000;

/// Every endpoint's authenticator, on the world's virtual wall clock.
#[derive(Debug)]
pub struct NetworkKeys {
    template: Authenticator,
    endpoints: HashMap<SocketAddr, Authenticator>,
    /// Endpoints that seal and verify in their own pipelines.
    pipelines: HashSet<SocketAddr>,
    /// The simulation's own view of what pipelines send (for its checkers).
    observer: Authenticator,
    wall: Arc<AtomicU64>,
    /// Datagrams dropped because they did not verify, by reason (`stale`, `bad_tag`, ...).
    pub(crate) dropped: BTreeMap<&'static str, u64>,
}

impl NetworkKeys {
    /// Keys drawn from `seed`.
    pub(crate) fn for_seed(seed: u64) -> NetworkKeys {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6e65_745f_6b65_7973);
        let keys = KeySet::new(vec![DeploymentKey::new(1, rng.random())])
            .with_replay_window_ms(REPLAY_WINDOW_MS)
            .encrypting_payloads(rng.random_bool(0.5));
        let wall = Arc::new(AtomicU64::new(SIM_EPOCH_MS));
        let clock = wall.clone();
        let template = Authenticator::with_nonce_prefix(keys, rng.random())
            .with_clock(Arc::new(move || clock.load(Ordering::Relaxed)));
        NetworkKeys {
            observer: template.clone(),
            template,
            endpoints: HashMap::new(),
            pipelines: HashSet::new(),
            wall,
            dropped: BTreeMap::new(),
        }
    }

    /// The authenticator of `addr`'s pipeline, on the wall clock at `now` (its start, for the
    /// replay floors of its functions): from now on `addr` seals and verifies itself.
    pub(crate) fn for_pipeline(&mut self, now: Time, addr: SocketAddr) -> Authenticator {
        self.sync(now);
        self.pipelines.insert(addr);
        self.template.clone()
    }

    /// A datagram as sent at `now`, opened when a pipeline sealed it: what the simulation's
    /// checkers read (`None`: sealed and not opened, which a sender never does).
    pub(crate) fn observe(&mut self, now: Time, bytes: &[u8]) -> Option<Vec<u8>> {
        self.sync(now);
        match pmnet_wire::Header::parse(pmnet_auth::without_trailer(bytes)) {
            Ok((header, _)) if header.flags & pmnet_wire::flags::AUTHENTICATED != 0 => self
                .observer
                .verify(bytes)
                .ok()
                .map(|plain| plain.into_owned()),
            _ => Some(bytes.to_vec()),
        }
    }

    /// Whether the network verifies what `to` receives (it has no pipeline).
    pub(crate) fn verified_here(&self, to: SocketAddr) -> bool {
        !self.pipelines.contains(&to)
    }

    /// Set the world's wall clock to `now`.
    pub(crate) fn sync(&self, now: Time) {
        self.wall
            .store(SIM_EPOCH_MS + now.as_nanos() / 1_000_000, Ordering::Relaxed);
    }

    fn endpoint(&mut self, addr: SocketAddr) -> &mut Authenticator {
        let template = &self.template;
        self.endpoints
            .entry(addr)
            .or_insert_with(|| template.clone())
    }

    /// Seal what `from` sends at `now`, as its pipeline would, unless its pipeline did.
    pub(crate) fn seal(&mut self, now: Time, from: SocketAddr, bytes: &mut Vec<u8>) {
        self.sync(now);
        if self.pipelines.contains(&from) {
            return;
        }
        self.endpoint(from).seal(bytes);
    }

    /// Verify what `to` receives at `now`, for a receiver without a pipeline (a receiver with
    /// one verifies itself: the bytes as they are): the datagram as its parser expects it, or
    /// why it was dropped (counted).
    pub(crate) fn verify_for_receiver(
        &mut self,
        now: Time,
        to: SocketAddr,
        bytes: Vec<u8>,
    ) -> Result<Vec<u8>, &'static str> {
        self.sync(now);
        if self.pipelines.contains(&to) {
            return Ok(bytes);
        }
        let auth = self.endpoint(to);
        match auth.verify(&bytes) {
            Ok(plain) => Ok(plain.into_owned()),
            Err(error) => {
                *self.dropped.entry(error.reason()).or_default() += 1;
                Err(error.reason())
            }
        }
    }

    /// Datagrams the network dropped as sealed outside the replay window (replays).
    pub(crate) fn stale(&self) -> u64 {
        ["stale", "from_the_future"]
            .iter()
            .filter_map(|reason| self.dropped.get(reason))
            .sum()
    }
}

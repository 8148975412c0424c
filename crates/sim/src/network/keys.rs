//! Sealing and verifying in the network, for the worlds whose nodes do not hold keys
//! themselves (the chain store's and replicated memory's: their clients have no pipeline).
//!
//! [`NetworkKeys`]: the network seals what each endpoint sends and verifies what each
//! receives, as the endpoint's pipeline does in a deployment, with a key set whose replay
//! window is one second (those worlds run for seconds: replays past the window happen) and
//! the world's virtual wall clock (`SIM_EPOCH_MS` plus virtual time). What does not verify is
//! dropped and counted by reason; the seal time of what does is handed to the receiver
//! (`note_seal`), for the chain head's and the coordinator's replay floors.
//!
//! The main world's nodes hold their keys and verify in their own pipelines; it gives its
//! network none.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_proto::Time;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::world::SIM_EPOCH_MS;

/// The replay window of these worlds' keys.
pub(crate) const REPLAY_WINDOW_MS: u32 = 1000;

/// Every endpoint's authenticator, on the world's virtual wall clock.
#[derive(Debug)]
pub struct NetworkKeys {
    template: Authenticator,
    endpoints: HashMap<SocketAddr, Authenticator>,
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

    /// Seal what `from` sends at `now`, as its pipeline would.
    pub(crate) fn seal(&mut self, now: Time, from: SocketAddr, bytes: &mut Vec<u8>) {
        self.sync(now);
        self.endpoint(from).seal(bytes);
    }

    /// Verify what `to` receives at `now`, as its pipeline would: the datagram as the parser
    /// expects it and when it was sealed (with the wall clock now), or why it was dropped
    /// (counted).
    pub(crate) fn verify_for_receiver(
        &mut self,
        now: Time,
        to: SocketAddr,
        bytes: &[u8],
    ) -> Result<(Vec<u8>, (u64, u64)), &'static str> {
        self.sync(now);
        let auth = self.endpoint(to);
        match auth.verify(bytes) {
            Ok(plain) => {
                let plain = plain.into_owned();
                Ok((plain, (auth.sealed_at(), auth.now_ms())))
            }
            Err(error) => {
                *self.dropped.entry(error.reason()).or_default() += 1;
                Err(error.reason())
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

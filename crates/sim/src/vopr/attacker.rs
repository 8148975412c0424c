//! The attacker: on some seeds every node authenticates its traffic and a host without the key
//! injects forged datagrams — of every packet type the wire crate lists and of the reserved
//! ranges, so a type added later is covered without a change here — with real session ids and
//! sequence numbers near the live ones, spoofing the addresses of real nodes, both without a
//! trailer and with a guessed one. It also eavesdrops: it keeps the last datagrams sent and
//! replays them, verbatim (they verify), later, to where they went or to another node. Forged
//! datagrams must be counted as authentication failures; no forgery or replay may change what
//! any node does: the invariants are checked as on every seed.
//!
//! Its choices come from a generator of its own, seeded from the run's seed, so the seeds
//! without an attacker draw exactly what they drew before it existed.

use std::net::SocketAddr;

use pmnet_proto::{DeploymentKey, KeySet};
use pmnet_wire::{flags, Header, PacketType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::world::{client_addr, device_addr, server_addr, World, SERVER_ID};

use super::FaultSummary;

/// Share of seeds with an attacker.
const ATTACKER_SEED_SHARE: f64 = 0.3;
/// Chance that the attacker strikes after each safety action.
const STRIKE_PROBABILITY: f64 = 0.05;
/// Chance that a strike replays a captured datagram rather than forging one.
const REPLAY_PROBABILITY: f64 = 0.4;
/// Datagrams the attacker keeps to replay (the last ones sent).
pub(super) const CAPTURED_MAX: usize = 512;

pub(super) struct Attacker {
    rng: ChaCha8Rng,
    key_id: u16,
}

impl Attacker {
    /// The attacker of `seed`, if the seed has one, and the deployment keys every node then
    /// holds (the attacker does not).
    pub(super) fn for_seed(seed: u64) -> Option<(Attacker, KeySet)> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xA77A_C4E5_5EED_0017);
        if !rng.random_bool(ATTACKER_SEED_SHARE) {
            return None;
        }
        let key_id: u16 = rng.random_range(1..=4);
        let secret: [u8; 32] = rng.random();
        // Half of these seeds encrypt payloads as well.
        let keys = KeySet::new(vec![DeploymentKey::new(key_id, secret)])
            .encrypting_payloads(rng.random_bool(0.5));
        Some((Attacker { rng, key_id }, keys))
    }

    /// Maybe inject one forged or replayed datagram.
    pub(super) fn strike(&mut self, world: &mut World, summary: &mut FaultSummary) {
        if !self.rng.random_bool(STRIKE_PROBABILITY) {
            return;
        }
        if self.rng.random_bool(REPLAY_PROBABILITY) && !world.captured.is_empty() {
            self.replay(world, summary);
        } else {
            self.forge(world, summary);
        }
    }

    /// Send a captured datagram again, unchanged, from its source: to its destination, or
    /// now and then to another node.
    fn replay(&mut self, world: &mut World, summary: &mut FaultSummary) {
        let index = self.rng.random_range(0..world.captured.len());
        let (from, mut to, bytes) = world.captured[index].clone();
        if self.rng.random_bool(0.25) {
            to = self.node(world);
        }
        summary.counts.replayed_datagrams += 1;
        let what = Header::parse(pmnet_auth::without_trailer(&bytes))
            .map(|(header, _)| {
                format!(
                    "{} s={:x} seq={}",
                    header.packet_type.name(),
                    header.session_id,
                    header.seq
                )
            })
            .unwrap_or_else(|_| "datagram".into());
        world.note_by(
            "attacker",
            &format!(
                "replays a {what} captured {} datagrams ago, from {from} to {to}",
                world.captured.len() - index
            ),
        );
        world.inject(from, to, bytes);
    }

    /// Inject one forged datagram.
    fn forge(&mut self, world: &mut World, summary: &mut FaultSummary) {
        let types = PacketType::ALL.len() + 1;
        let packet_type = match self.rng.random_range(0..types) {
            index if index < PacketType::ALL.len() => PacketType::ALL[index],
            _ => PacketType::Reserved(self.rng.random_range(0x10..=0x3F)),
        };
        let session_id = if self.rng.random_bool(0.8) {
            world.session(self.rng.random_range(0..world.clients.len()))
        } else {
            self.rng.random()
        };
        let mut header = Header::new(
            packet_type,
            SERVER_ID + self.rng.random_range(0..world.servers.len()) as u16,
            session_id,
            self.rng.random_range(0..64),
        );
        // Any flag but AUTHENTICATED (set below with a guessed trailer), ENCRYPTED included.
        header.flags = self.rng.random::<u16>() & !flags::AUTHENTICATED;
        if self.rng.random_bool(0.2) {
            header.fragment_count = 2;
            header.fragment_index = self.rng.random_range(0..2);
        }
        let payload: Vec<u8> = (0..self.rng.random_range(0..48))
            .map(|_| self.rng.random())
            .collect();
        let guess_trailer = self.rng.random_bool(0.5);
        if guess_trailer {
            header.flags |= flags::AUTHENTICATED;
        }
        let mut bytes = header.encode(&payload);
        if guess_trailer {
            let key_id = if self.rng.random_bool(0.8) {
                self.key_id
            } else {
                self.rng.random()
            };
            bytes.extend_from_slice(&key_id.to_be_bytes());
            bytes.extend((2..pmnet_auth::TRAILER_LEN).map(|_| self.rng.random::<u8>()));
        }
        let from = self.node(world);
        let to = self.node(world);
        summary.counts.forged_datagrams += 1;
        world.note_by(
            "attacker",
            &format!(
                "forges a {} for s={session_id:x} seq={} ({}), from {from} to {to}",
                packet_type.name(),
                header.seq,
                if guess_trailer {
                    "with a guessed tag"
                } else {
                    "without a tag"
                }
            ),
        );
        world.inject(from, to, bytes);
    }

    /// A real node's address (or, now and then, the attacker's own).
    fn node(&mut self, world: &World) -> SocketAddr {
        match self.rng.random_range(0..4) {
            0 => device_addr(self.rng.random_range(0..world.devices.len())),
            1 => server_addr(self.rng.random_range(0..world.servers.len())),
            2 => client_addr(self.rng.random_range(0..world.clients.len())),
            _ => "10.66.66.66:6666".parse().expect("an address"),
        }
    }
}

/// Datagrams the nodes dropped as authentication failures.
pub(super) fn auth_drops(world: &World) -> u64 {
    let reasons = [
        "unauthenticated",
        "bad_tag",
        "unknown_key",
        "auth_truncated",
    ];
    let count = |dropped: &std::collections::BTreeMap<&'static str, u64>| -> u64 {
        reasons
            .iter()
            .filter_map(|reason| dropped.get(reason))
            .sum()
    };
    world
        .devices
        .iter()
        .map(|node| count(&node.pipeline.dropped()))
        .chain(
            world
                .servers
                .iter()
                .map(|node| count(&node.server.counters().dropped)),
        )
        .chain(
            world
                .clients
                .iter()
                .map(|node| count(&node.client.counters().dropped)),
        )
        .sum()
}

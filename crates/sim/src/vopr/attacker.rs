//! The attacker: on some seeds every node authenticates its traffic and a host without the key
//! injects forged datagrams — of every packet type the wire crate lists and of the reserved
//! ranges, so a type added later is covered without a change here — with real session ids and
//! sequence numbers near the live ones, spoofing the addresses of real nodes, both without a
//! trailer and with a guessed one. It also eavesdrops: it keeps the last datagrams sent and
//! replays them, verbatim (they verify), later, to where they went or to another node. Besides
//! those recent ones it keeps an archive of genuine datagrams sampled over the whole run, with
//! the time it captured each, and replays them much later: within the replay window (after
//! device and server crashes and restarts, after other sessions came and went: what a session
//! table that forgot must refuse) and past it (what every receiver must refuse as stale), and
//! a burst of them as the liveness phase restarts every process. Forged datagrams must be
//! counted as authentication failures; no forgery or replay may change what any node does: the
//! invariants are checked as on every seed (a replayed update applied a second time, or an
//! old one applied after a newer one, fails the server application's check that each session
//! applies in increasing sequence order, at once).
//!
//! Its choices come from generators of its own, seeded from the run's seed, so the seeds
//! without an attacker draw exactly what they drew before it existed. What it captures and
//! archives, and the choice of an archived datagram, are the network's attacker's
//! (`crate::network::Attacker`, the one every world has), which this one drives: when to
//! archive, what to replay and when, and the forgeries.

use std::net::SocketAddr;

use pmnet_proto::{DeploymentKey, KeySet};
use pmnet_wire::{flags, Header, PacketType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::network::Attacker as Eavesdropper;
use crate::world::{client_addr, controller_addr, device_addr, server_addr, World, SERVER_ID};

use super::FaultSummary;

/// Share of seeds with an attacker.
const ATTACKER_SEED_SHARE: f64 = 0.3;
/// Chance that the attacker strikes after each safety action.
const STRIKE_PROBABILITY: f64 = 0.05;
/// Chance that a strike replays a captured datagram rather than forging one.
const REPLAY_PROBABILITY: f64 = 0.4;
/// Datagrams the attacker keeps to replay (the last ones sent).
pub(super) const CAPTURED_MAX: usize = 512;
/// Genuine datagrams the attacker archives for much later, at most.
const ARCHIVE_MAX: usize = 256;
/// Chance that the attacker archives the newest datagram sent, after each safety action (an
/// archived datagram is replaced at random, so the archive holds datagrams of every age).
const ARCHIVE_PROBABILITY: f64 = 0.3;
/// Chance that the attacker replays archived datagrams, after each safety action.
const LATE_STRIKE_PROBABILITY: f64 = 0.04;
/// Archived datagrams the attacker replays as the liveness phase restarts every process.
const FINAL_BURST: usize = 24;

pub(super) struct Attacker {
    rng: ChaCha8Rng,
    key_id: u16,
    /// The generator of the archive and of late replays (its own, so that the forgeries and
    /// recent replays draw what they drew before it).
    late: ChaCha8Rng,
    /// The world's count of datagrams sent when the attacker last archived one.
    archived_at_sent: u64,
    /// The replay window of the deployment's keys (milliseconds).
    window_ms: u64,
}

impl Attacker {
    /// The attacker of `seed`, if the seed has one, and the deployment keys every node then
    /// holds (the attacker does not). [`Attacker::eavesdropper`] is what it puts on the
    /// network.
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
        let window_ms = u64::from(keys.replay_window_ms());
        let late = ChaCha8Rng::seed_from_u64(seed ^ 0x1a7e_4e91_a75e_ed00);
        Some((
            Attacker {
                rng,
                key_id,
                late,
                archived_at_sent: 0,
                window_ms,
            },
            keys,
        ))
    }

    /// What it puts on the network to capture what is sent.
    pub(super) fn eavesdropper(&self) -> Eavesdropper {
        Eavesdropper::capturing(CAPTURED_MAX, ARCHIVE_MAX, self.window_ms)
    }

    /// Archive the newest datagram sent now and then; now and then replay archived ones.
    pub(super) fn archive_and_replay_late(
        &mut self,
        world: &mut World,
        summary: &mut FaultSummary,
    ) {
        let sent = world.network.counters.sent;
        let now = world.now;
        let Some(eavesdropper) = world.network.attacker.as_mut() else {
            return;
        };
        if sent != self.archived_at_sent
            && self.late.random_bool(ARCHIVE_PROBABILITY)
            && eavesdropper.archive_latest(now, &mut self.late)
        {
            self.archived_at_sent = sent;
        }
        if eavesdropper.archived_nothing() || !self.late.random_bool(LATE_STRIKE_PROBABILITY) {
            return;
        }
        // Mostly datagrams still inside the replay window (the authenticator accepts them:
        // the session tables must answer them), else any (mostly stale: refused).
        let within = self.late.random_bool(0.7);
        for _ in 0..self.late.random_range(1..=4) {
            self.replay_archived(world, summary, within);
        }
    }

    /// The last strike, as the liveness phase heals the faults and restarts every process: a
    /// burst of archived datagrams, mostly still inside the replay window.
    pub(super) fn final_burst(&mut self, world: &mut World, summary: &mut FaultSummary) {
        let archived = world.network.attacker.as_ref();
        if archived.is_none_or(Eavesdropper::archived_nothing) {
            return;
        }
        for _ in 0..FINAL_BURST {
            let within = self.late.random_bool(0.8);
            self.replay_archived(world, summary, within);
        }
    }

    /// Replay one archived datagram (one captured within the replay window, plus the second
    /// a seal time counts in, when `within` and there is one), from its source, to its
    /// destination or now and then to another node.
    fn replay_archived(&mut self, world: &mut World, summary: &mut FaultSummary, within: bool) {
        let now = world.now;
        let picked = (world.network.attacker.as_ref())
            .and_then(|eavesdropper| eavesdropper.pick_archived(now, within, &mut self.late));
        let Some((at, from, mut to, bytes)) = picked.cloned() else {
            return;
        };
        if self.late.random_bool(0.2) {
            to = match self.late.random_range(0..3) {
                0 => device_addr(self.late.random_range(0..world.devices.len())),
                1 => server_addr(self.late.random_range(0..world.servers.len())),
                _ => client_addr(self.late.random_range(0..world.clients.len())),
            };
        }
        let age_ms = now.as_nanos().saturating_sub(at.as_nanos()) / 1_000_000;
        summary.counts.replayed_datagrams += 1;
        summary.counts.replayed_late += 1;
        if age_ms > self.window_ms + 1000 {
            summary.counts.replayed_past_window += 1;
        }
        let what = describe(&bytes);
        world.note_by(
            "attacker",
            &format!("replays a {what} captured {age_ms} ms ago, from {from} to {to}"),
        );
        world.inject(from, to, bytes);
    }

    /// Maybe inject one forged or replayed datagram.
    pub(super) fn strike(&mut self, world: &mut World, summary: &mut FaultSummary) {
        if !self.rng.random_bool(STRIKE_PROBABILITY) {
            return;
        }
        let captured =
            (world.network.attacker.as_ref()).map_or(0, |eavesdropper| eavesdropper.recent().len());
        if self.rng.random_bool(REPLAY_PROBABILITY) && captured > 0 {
            self.replay(world, summary);
        } else {
            self.forge(world, summary);
        }
    }

    /// Send a captured datagram again, unchanged, from its source: to its destination, or
    /// now and then to another node.
    fn replay(&mut self, world: &mut World, summary: &mut FaultSummary) {
        let recent = world.network.attacker.as_ref().map(Eavesdropper::recent);
        let Some(recent) = recent.filter(|recent| !recent.is_empty()) else {
            return;
        };
        let index = self.rng.random_range(0..recent.len());
        let captured = recent.len() - index;
        let (_, from, mut to, bytes) = recent[index].clone();
        if self.rng.random_bool(0.25) {
            to = self.node(world);
        }
        summary.counts.replayed_datagrams += 1;
        let what = describe(&bytes);
        world.note_by(
            "attacker",
            &format!(
                "replays a {what} captured {} datagrams ago, from {from} to {to}",
                captured
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

    /// A real node's address — the controller's too, when there is one — or, now and then,
    /// the attacker's own.
    fn node(&mut self, world: &World) -> SocketAddr {
        let nodes = if world.controller.is_some() { 5 } else { 4 };
        match self.rng.random_range(0..nodes) {
            0 => device_addr(self.rng.random_range(0..world.devices.len())),
            1 => server_addr(self.rng.random_range(0..world.servers.len())),
            2 => client_addr(self.rng.random_range(0..world.clients.len())),
            4 => controller_addr(),
            _ => "10.66.66.66:6666".parse().expect("an address"),
        }
    }
}

/// A captured datagram's type, session and number, for the trace.
fn describe(bytes: &[u8]) -> String {
    Header::parse(pmnet_auth::without_trailer(bytes))
        .map(|(header, _)| {
            format!(
                "{} s={:x} seq={}",
                header.packet_type.name(),
                header.session_id,
                header.seq
            )
        })
        .unwrap_or_else(|_| "datagram".into())
}

/// Datagrams the nodes dropped as authentication failures.
pub(super) fn auth_drops(world: &World) -> u64 {
    drops(
        world,
        &[
            "unauthenticated",
            "bad_tag",
            "unknown_key",
            "auth_truncated",
        ],
    )
}

/// Genuine datagrams the nodes dropped as sealed outside their replay window (replays).
pub(super) fn stale_drops(world: &World) -> u64 {
    drops(world, &["stale", "from_the_future"])
}

/// Datagrams the nodes dropped for one of `reasons` (a crash forgets a node's counts).
fn drops(world: &World, reasons: &[&str]) -> u64 {
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
        .chain((world.controller.iter()).map(|node| count(node.planner.drops())))
        .sum()
}

//! The safety phase: requests spread over the whole phase, so that faults meet traffic, and
//! among them the faults the seed chose — device and server crashes, held persistence,
//! partitions, clients that leave, a full store — with the network stepped in between.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::world::{client_addr, device_addr, node_name, server_addr, World};

use super::attacker::Attacker;
use super::device_crash::crash_device;
use super::workload::{issue, Issued};
use super::{FaultSummary, Options};

/// The faults a seed turned on for its safety phase, and how often they strike.
pub(super) struct FaultMix {
    pub(super) partitions: bool,
    pub(super) clients_leave: bool,
    pub(super) store_full: bool,
    /// Each client's request lifetime, when the seed made it short.
    pub(super) short_lifetimes: Vec<Option<Duration>>,
    /// Out of 3: how often a device crash strikes (0: never).
    pub(super) device_crash_weight: u32,
    /// Out of 3: how often a server crash strikes (0: never).
    pub(super) server_crash_weight: u32,
    /// Clients leave and others, each a new session, start in their place (set by the
    /// seed's churn, not drawn here).
    pub(super) turnover: bool,
    /// The controller crashes and restarts from its saved plan (set by the seed's own
    /// generator, not drawn here).
    pub(super) controller_crashes: bool,
}

/// How long a crashed controller stays down, at least and at most (log-uniform between):
/// from well under the suspicion delays to well over them.
pub(super) const CONTROLLER_DOWN_MIN: Duration = Duration::from_millis(20);
pub(super) const CONTROLLER_DOWN_MAX: Duration = Duration::from_secs(20);

impl FaultMix {
    /// Choose the mix for a world of `client_count` clients.
    pub(super) fn choose(rng: &mut ChaCha8Rng, client_count: usize) -> FaultMix {
        let partitions = rng.random_bool(0.5);
        let clients_leave = rng.random_bool(0.3);
        let store_full = rng.random_bool(0.3);
        // Some clients give up early (a short request lifetime), so that failed requests, the
        // no-op fills they send and the gaps they leave meet the other faults.
        let short_lifetimes: Vec<Option<Duration>> = (0..client_count)
            .map(|_| {
                rng.random_bool(0.3)
                    .then(|| Duration::from_millis(rng.random_range(20..2_000)))
            })
            .collect();
        let device_crash_weight = rng.random_range(0..4);
        let server_crash_weight = rng.random_range(0..4);
        FaultMix {
            partitions,
            clients_leave,
            store_full,
            short_lifetimes,
            device_crash_weight,
            server_crash_weight,
            turnover: false,
            controller_crashes: false,
        }
    }
}

/// Run the safety phase: `options.safety_actions` actions, each a request, a fault or a few
/// network steps.
pub(super) fn run(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    summary: &mut FaultSummary,
    issued: &mut [Vec<Issued>],
    mix: &FaultMix,
    options: &Options,
    attacker: &mut Option<Attacker>,
) {
    let client_count = world.clients.len();
    let total_requests = options.requests_per_client as f64 * client_count as f64;
    let issue_probability = (1.5 * total_requests / f64::from(options.safety_actions)).min(1.0);
    for _ in 0..options.safety_actions {
        if let Some(attacker) = attacker.as_mut() {
            attacker.strike(world, summary);
            attacker.archive_and_replay_late(world, summary);
        }
        if rng.random_bool(issue_probability) {
            let client = rng.random_range(0..client_count);
            issue(world, rng, issued, client, options.requests_per_client);
            continue;
        }
        match rng.random_range(0..100) {
            0..=3 if mix.device_crash_weight > 0 => {
                crash_device(world, rng, summary, mix.device_crash_weight);
            }
            4 if rng.random_range(0..4) < mix.server_crash_weight => {
                crash_server(world, rng, summary);
            }
            5..=7 => restart_server(world, rng),
            8 if !world.replicas.is_empty() && rng.random_range(0..4) < mix.server_crash_weight => {
                crash_replica(world, rng, summary);
            }
            9..=10 if !world.replicas.is_empty() => restart_replica(world, rng),
            11 if !world.replicas.is_empty() && rng.random_bool(0.2) => {
                lose_primary(world, rng, summary);
            }
            12 if world.device_losses_allowed > 0 && rng.random_bool(0.5) => {
                lose_device(world, rng, summary);
            }
            13 if mix.controller_crashes && rng.random_bool(0.3) => crash_controller(world, rng),
            43..=44 => toggle_held_persistence(world, rng),
            45 if mix.partitions => partition(world, rng, summary),
            48 if mix.clients_leave => client_leaves(world, rng, summary),
            49..=50 if mix.store_full => toggle_store_full(world, rng),
            51..=53 if mix.turnover => client_turns_over(world, rng, summary),
            46..=47 if mix.partitions && !world.network.blocked.is_empty() => {
                world.network.blocked.clear();
                world.note_by("network", "partitions healed");
            }
            _ => {
                for _ in 0..rng.random_range(1..20) {
                    world.step();
                }
            }
        }
    }
}

/// The controller crashes, when it is up, for a time from well under to well over the
/// suspicion delays: now (a third of the time: right after its next save, before the routes
/// of that plan go out). It starts again from the plan it saved.
fn crash_controller(world: &mut World, rng: &mut ChaCha8Rng) {
    let Some(node) = world.controller.as_ref() else {
        return;
    };
    if !node.up || node.crash_at_next_save.is_some() {
        return;
    }
    let (min, max) = (
        CONTROLLER_DOWN_MIN.as_secs_f64().ln(),
        CONTROLLER_DOWN_MAX.as_secs_f64().ln(),
    );
    let down = Duration::from_secs_f64(rng.random_range(min..max).exp());
    if rng.random_bool(1.0 / 3.0) {
        world.note_by(
            "controller",
            &format!("will crash right after its next save, down for {down:?}"),
        );
        world.crash_controller_at_next_save(down);
    } else {
        world.crash_controller(Some(down));
    }
}

/// Crash a replica server, when it is up (its store survives).
fn crash_replica(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let index = rng.random_range(0..world.replicas.len());
    if world.replicas[index].up {
        summary.counts.replica_crashes += 1;
        world.stop_replica(index);
    }
}

/// Start a crashed replica server again.
fn restart_replica(world: &mut World, rng: &mut ChaCha8Rng) {
    let index = rng.random_range(0..world.replicas.len());
    let node = &world.replicas[index];
    if !node.up && !node.lost {
        world.start_replica(index);
    }
}

/// A primary is lost for good (its store with it) and one of its replicas is promoted in its
/// place: at most R − 1 of a server's R copies are lost in a seed.
fn lose_primary(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    if world.controller.is_some() {
        lose_server_or_replica(world, rng, summary);
        return;
    }
    let server = rng.random_range(0..world.servers.len());
    let per_server = world.replicas.len() / world.servers.len();
    let replicas = server * per_server..(server + 1) * per_server;
    let lost = replicas.clone().filter(|&r| world.replicas[r].lost).count();
    if lost >= per_server {
        return;
    }
    // The operator promotes the replica furthest along (docs/replication.md).
    let Some(replica) = replicas
        .clone()
        .filter(|&r| !world.replicas[r].lost)
        .max_by_key(|&r| {
            (
                world.replicas[r].app.applied_position(),
                std::cmp::Reverse(r),
            )
        })
    else {
        return;
    };
    summary.counts.primaries_lost += 1;
    world.promote_replica(server, replica);
}

/// Under the controller, the chain's primary (whichever node it is now) or one of its
/// replicas is lost for good, store and all; the controller replaces the primary by the
/// replica furthest along, or takes the replica out, once it has been silent long enough. At
/// least one copy is always left: of the server's nodes not lost, one stays. Rarer than a
/// primary's loss by hand (about one a seed), so that seeds with two replicas often keep a
/// live one to check (invariant 6).
fn lose_server_or_replica(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    if !rng.random_bool(0.15) {
        return;
    }
    let replicas = world.live_replicas(0);
    let primary_live = !world.primary(0).lost;
    if replicas.len() + usize::from(primary_live) < 2 {
        return;
    }
    if primary_live && rng.random_bool(0.5) {
        summary.counts.primaries_lost += 1;
        world.lose_server(0);
    } else if !replicas.is_empty() {
        let replica = replicas[rng.random_range(0..replicas.len())];
        summary.counts.replicas_lost += 1;
        world.lose_replica(replica);
    }
}

/// A device of the chain, as the controller plans it, is lost for good (its log with it; the
/// controller takes it out once it has been silent long enough): at most one fewer than the
/// fewest acks a client waits for, per seed, and never the chain's last live device.
fn lose_device(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let live = world.live_chain();
    if live.len() < 2 {
        return;
    }
    let index = live[rng.random_range(0..live.len())];
    world.device_losses_allowed -= 1;
    summary.counts.devices_lost += 1;
    world.lose_device(index);
}

/// Crash a server, when it is up (noting a crash during its start-up recovery).
fn crash_server(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let index = rng.random_range(0..world.servers.len());
    if let Some(replica) = world.promoted[index] {
        // The primary now is a promoted replica.
        if world.replicas[replica].up {
            summary.counts.server_crashes += 1;
            world.stop_replica(replica);
        }
        return;
    }
    if world.servers[index].up {
        if world.servers[index].server.is_recovering() {
            summary.counts.server_crashes_during_recovery += 1;
            world.note_by(
                &format!("server{index}"),
                "crash during its start-up recovery poll",
            );
        }
        summary.counts.server_crashes += 1;
        world.stop_server(index);
    }
}

/// Restart a server, when it is down.
fn restart_server(world: &mut World, rng: &mut ChaCha8Rng) {
    let index = rng.random_range(0..world.servers.len());
    if !world.servers[index].up && !world.servers[index].lost {
        world.start_server(index);
    }
}

/// Hold a device's persistence (its log writes issued but not complete, its acks waiting), or
/// release it.
fn toggle_held_persistence(world: &mut World, rng: &mut ChaCha8Rng) {
    let index = rng.random_range(0..world.devices.len());
    if world.devices[index].lost {
        return;
    }
    let node = world.device_mut(index);
    node.hold_persistence = !node.hold_persistence;
    if node.hold_persistence {
        world.note_by(
            &format!("device{index}"),
            "persistence held: log writes are issued but do not complete; acks wait",
        );
    } else {
        world.note_by(&format!("device{index}"), "persistence released");
        world.release_persistence(index, None);
    }
}

/// Cut a device off from a server or a client: one way, or both ways.
fn partition(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let device = device_addr(rng.random_range(0..world.devices.len()));
    let other = if rng.random_bool(0.5) {
        server_addr(rng.random_range(0..world.servers.len()))
    } else {
        client_addr(rng.random_range(0..world.clients.len()))
    };
    let (from, to) = if rng.random_bool(0.5) {
        (device, other)
    } else {
        (other, device)
    };
    world.network.blocked.insert((from, to));
    if rng.random_bool(0.5) {
        world.network.blocked.insert((to, from));
        summary.counts.partitions_symmetric += 1;
        world.note_by(
            "network",
            &format!("partition {} <-> {}", node_name(from), node_name(to)),
        );
    } else {
        summary.counts.partitions_one_way += 1;
        world.note_by(
            "network",
            &format!(
                "partition {} -> {} (one-way)",
                node_name(from),
                node_name(to)
            ),
        );
    }
}

/// A client gives up on its requests and goes away for good.
fn client_leaves(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let client = rng.random_range(0..world.clients.len());
    // Leave while something is in flight (that is what leaves a gap behind), and after
    // something completed (a run that completed nothing proves nothing).
    let node = &world.clients[client];
    if !node.gone && node.client.in_flight_count() > 0 && !node.completed.is_empty() {
        summary.counts.clients_gone += 1;
        world.client_leaves(client);
    }
}

/// A client leaves (with or without requests in flight) and the next client that arrives
/// later, a new session, starts in its place.
fn client_turns_over(world: &mut World, rng: &mut ChaCha8Rng, summary: &mut FaultSummary) {
    let Some(next) = world.clients.iter().position(|node| node.arrives_later) else {
        return;
    };
    let running: Vec<usize> = (0..world.clients.len())
        .filter(|&index| !world.clients[index].gone && !world.clients[index].arrives_later)
        .collect();
    if let Some(&leaving) = running.get(rng.random_range(0..running.len().max(1))) {
        if world.clients[leaving].client.in_flight_count() > 0 {
            summary.counts.clients_gone += 1;
        }
        world.client_leaves(leaving);
    }
    summary.counts.clients_turned_over += 1;
    world.clients[next].arrives_later = false;
    world.note_by(&format!("client{next}"), "starts (a new session)");
}

/// Fill a server's store (every update handed back), or give it room again.
fn toggle_store_full(world: &mut World, rng: &mut ChaCha8Rng) {
    let index = rng.random_range(0..world.servers.len());
    let node = world.primary_mut(index);
    node.store_full = !node.store_full;
    let text = if node.store_full {
        "store full: every update is handed back, nothing durable, no server-ACK"
    } else {
        "store has room again"
    };
    world.note_by(&format!("server{index}"), text);
}

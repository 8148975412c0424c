//! The liveness phase: heal every fault, let every client finish its requests, and converge
//! within the bound.

use std::time::Duration;

use rand_chacha::ChaCha8Rng;

use crate::world::World;

use super::convergence_checker::{converged, fail_not_converged, note_converged};
use super::workload::{issue, Issued};
use super::Options;

/// Run the liveness phase, which must converge within `bound`; returns the virtual time it
/// took.
pub(super) fn run(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    issued: &mut [Vec<Issued>],
    options: &Options,
    bound: Duration,
) -> Duration {
    world.note_event(&format!(
        "liveness phase: faults healed, held persistence released, every node up; \
         must converge within {:?}",
        bound
    ));
    heal(world);
    for index in 0..world.clients.len() {
        if world.clients[index].arrives_later {
            // Its turn never came: it never starts.
            world.clients[index].arrives_later = false;
            world.clients[index].gone = true;
        }
    }
    let liveness_start = world.now;
    let deadline = world.now + bound;
    loop {
        for client in 0..world.clients.len() {
            issue(world, rng, issued, client, options.requests_per_client);
        }
        if all_issued(world, issued, options) && converged(world) {
            break;
        }
        match world.next_event_time() {
            Some(at) if at <= deadline => {
                world.step();
            }
            _ => fail_not_converged(world, bound),
        }
    }
    let virtual_time_to_converge = world.now.saturating_duration_since(liveness_start);
    note_converged(world, virtual_time_to_converge);
    virtual_time_to_converge
}

/// Heal every fault: no more network faults or partitions, every store with room, every
/// device's persistence released (a crashed device restarted), every server up.
fn heal(world: &mut World) {
    world.network.faults = None;
    world.network.blocked.clear();
    for node in world.servers.iter_mut().chain(&mut world.replicas) {
        node.store_full = false;
    }
    for index in 0..world.devices.len() {
        world.device_mut(index).hold_persistence = false;
        if world.devices[index].up {
            world.release_persistence(index, None);
        } else if !world.devices[index].lost {
            world.restart_device(index);
        }
    }
    for index in 0..world.servers.len() {
        if !world.servers[index].up && !world.servers[index].lost {
            world.start_server(index);
        }
    }
    for index in 0..world.replicas.len() {
        if !world.replicas[index].up && !world.replicas[index].lost {
            world.start_replica(index);
        }
    }
    if let Some(node) = world.controller.as_mut() {
        node.crash_at_next_save = None;
        if !node.up {
            world.restart_controller();
        }
    }
}

/// Whether every client still there issued all its requests.
fn all_issued(world: &World, issued: &[Vec<Issued>], options: &Options) -> bool {
    issued
        .iter()
        .zip(&world.clients)
        .all(|(requests, node)| node.gone || requests.len() as u32 >= options.requests_per_client)
}

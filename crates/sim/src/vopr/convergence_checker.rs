//! Invariant 5, convergence: once the faults are healed, every session converges within a
//! bounded virtual time.

use std::time::Duration;

use crate::world::{device_addr, replica_addr, World};

/// Whether every session converged: nothing in flight at a client that is still there, no
/// live log entry and no held persistence work at any device, no server recovering or holding
/// a busy session, and no server whose primary is lost for good (not yet replaced).
pub(super) fn converged(world: &World) -> bool {
    world
        .clients
        .iter()
        .all(|node| node.gone || node.client.in_flight_count() == 0)
        && world.devices.iter().all(|node| {
            node.lost || (node.device().live_entry_count() == 0 && node.held.is_empty())
        })
        && (0..world.servers.len())
            .map(|server| world.primary(server))
            .all(|node| {
                // A primary lost for good is not converged until a replica replaced it.
                !node.lost && !node.server.is_recovering() && node.server.busy_session_count() == 0
            })
        && (!world.plan_must_settle || plan_settled(world))
}

/// On seeds whose controller crashes: the controller is up, its plan has taken every device
/// and server lost for good out (failover resumed once it was back), and every live node
/// runs the plan's epoch (the routes of a plan saved just before a crash reached them).
fn plan_settled(world: &World) -> bool {
    plan_unsettled(world).is_none()
}

/// What keeps the plan from settling, in words.
fn plan_unsettled(world: &World) -> Option<String> {
    let node = world.controller.as_ref()?;
    if !node.up {
        return Some("the controller is down".to_string());
    }
    let epoch = node.planner.epoch();
    for (_, route, _, _) in node.planner.chains() {
        for (_, address) in &route.devices {
            let index = (0..world.devices.len()).find(|&i| device_addr(i) == *address)?;
            if world.devices[index].lost {
                return Some(format!("device{index}, lost, is still in the plan"));
            }
        }
        for (index, replica) in world.replicas.iter().enumerate() {
            if replica.lost && route.replicas.contains(&replica_addr(index)) {
                return Some(format!("replica{index}, lost, is still in the plan"));
            }
        }
    }
    for (index, device) in world.devices.iter().enumerate() {
        let runs = device.device().follower().map_or(epoch, |f| f.epoch());
        if !device.lost && runs != epoch {
            return Some(format!("device{index} runs epoch {runs}, the plan {epoch}"));
        }
    }
    let servers = (world.servers.iter().enumerate())
        .map(|(index, node)| (format!("server{index}"), node))
        .chain((world.replicas.iter().enumerate()).map(|(i, node)| (format!("replica{i}"), node)));
    for (name, server) in servers {
        let runs = server.server.follower().map_or(epoch, |f| f.epoch());
        if !server.lost && runs != epoch {
            return Some(format!("{name} runs epoch {runs}, the plan {epoch}"));
        }
    }
    None
}

/// What is left to converge, for the failure message.
fn convergence_state(world: &World) -> String {
    let clients: Vec<usize> = world
        .clients
        .iter()
        .map(|node| node.client.in_flight_count())
        .collect();
    let devices: Vec<usize> = world
        .devices
        .iter()
        .map(|node| node.device().live_entry_count())
        .collect();
    let servers: Vec<(bool, usize)> = (0..world.servers.len())
        .map(|server| world.primary(server))
        .map(|node| {
            (
                node.server.is_recovering(),
                node.server.busy_session_count(),
            )
        })
        .collect();
    let busy: Vec<String> = (0..world.servers.len())
        .map(|server| world.primary(server))
        .map(|node| node.server.busy_sessions_text())
        .filter(|text| !text.is_empty())
        .collect();
    let plan = match world
        .plan_must_settle
        .then(|| plan_unsettled(world))
        .flatten()
    {
        Some(why) => format!("; the plan has not settled: {why}"),
        None => String::new(),
    };
    format!(
        "in flight per client {clients:?}, live log entries per device {devices:?}, \
         (recovering, busy sessions) per server {servers:?}{}{plan}",
        if busy.is_empty() {
            String::new()
        } else {
            format!(" [{}]", busy.join(" | "))
        }
    )
}

/// The liveness phase cannot go on: no event is left before its deadline, and the world has
/// not converged.
pub(super) fn fail_not_converged(world: &World, bound: Duration) -> ! {
    let replication: Vec<String> = (0..world.servers.len())
        .map(|server| world.primary(server))
        .filter(|node| !node.server.config().replicas.is_empty())
        .map(|node| node.server.replication_text())
        .collect();
    panic!(
        "invariant: not converged {:?} after the faults healed: {}{}",
        bound,
        convergence_state(world),
        if replication.is_empty() {
            String::new()
        } else {
            format!("; primaries: {}", replication.join("; "))
        }
    )
}

/// Note in the trace that the world converged, `elapsed` after the faults were healed.
pub(super) fn note_converged(world: &mut World, elapsed: Duration) {
    world.note_by(
        "check",
        &format!(
            "invariant 5 (convergence): converged {elapsed:?} after the faults \
             healed: nothing in flight, no live log entry, nothing buffered"
        ),
    );
}

//! Invariant 5, convergence: once the faults are healed, every session converges within a
//! bounded virtual time.

use std::time::Duration;

use crate::world::World;

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
    format!(
        "in flight per client {clients:?}, live log entries per device {devices:?}, \
         (recovering, busy sessions) per server {servers:?}{}",
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

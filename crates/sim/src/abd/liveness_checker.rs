//! Replicated memory's world's liveness check: once healed (partitions and loss gone, every
//! node and the device restarted), within [`LIVENESS_BOUND`] every node is a member again and
//! each client's next two operations, started once every node is a member, completed.

use std::time::Duration;

use super::world::AbdWorld;

/// Once healed: every node a member and every client's operations in flight done within this.
const LIVENESS_BOUND: Duration = Duration::from_secs(15);

/// Whether the run is done (healed and live); `Err` once the bound has passed without.
pub(super) fn converged(world: &AbdWorld) -> Result<bool, String> {
    if !world.healing() {
        return Ok(false);
    }
    let members = world
        .nodes
        .iter()
        .all(|node| node.up && node.node().is_member());
    let idle = world
        .clients
        .iter()
        .all(|client| client.final_ops == 0 && client.in_flight.is_empty());
    if members && idle {
        return Ok(true);
    }
    if world.now >= world.end_of_safety + LIVENESS_BOUND {
        return Err(format!(
            "not live {LIVENESS_BOUND:?} after the faults healed: nodes {:?}, clients' \
             operations in flight {:?}, final operations left {:?}",
            world
                .nodes
                .iter()
                .map(|node| node.node().state_text())
                .collect::<Vec<_>>(),
            world
                .clients
                .iter()
                .map(|client| client.in_flight.len())
                .collect::<Vec<_>>(),
            world
                .clients
                .iter()
                .map(|client| client.final_ops)
                .collect::<Vec<_>>(),
        ));
    }
    Ok(false)
}

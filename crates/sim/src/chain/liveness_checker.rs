//! The chain store's world's liveness check: once the faults heal (the member lost for good
//! stays lost), within [`LIVENESS_BOUND`] every group's chain has as many members as are alive
//! up to three, none paused or joining, every member runs the controller's epoch, and every
//! client's last request has completed. With fixed chains: every member up and every client
//! idle.

use super::world::{ChainWorld, CHAIN, LIVENESS_BOUND};

/// Whether the run is done (healed and converged); `Err` once the bound has passed without.
pub(super) fn converged(world: &ChainWorld) -> Result<bool, String> {
    if !world.healing() {
        return Ok(false);
    }
    let idle = world.clients.iter().all(|client| client.current.is_none());
    let late = world.now >= world.end_of_safety + LIVENESS_BOUND;
    let seed = world.seed;
    if !world.controlled {
        if world.members.iter().all(|member| member.up) && idle {
            return Ok(true);
        }
        if late {
            return Err(format!(
                "seed {seed}: clients busy {LIVENESS_BOUND:?} after healing"
            ));
        }
        return Ok(false);
    }
    let layout = world.controller.layout();
    let alive = world.members.iter().filter(|member| !member.lost).count();
    let whole = layout.groups.iter().all(|group| {
        group.chain.len() == alive.min(CHAIN) && group.joining.is_none() && !group.paused
    });
    let current = world
        .members
        .iter()
        .filter(|member| !member.lost)
        .all(|member| member.node().epoch() == layout.epoch);
    if whole && current && idle {
        return Ok(true);
    }
    if late {
        return Err(format!(
            "seed {seed}: not whole {LIVENESS_BOUND:?} after the faults healed: chains {:?}, \
             epoch {}, members at {:?}, clients busy {}; each member's latest version of each \
             key {:?}",
            layout.groups,
            layout.epoch,
            world
                .members
                .iter()
                .map(|m| (m.up, m.lost, m.node().epoch()))
                .collect::<Vec<_>>(),
            world.clients.iter().filter(|c| c.current.is_some()).count(),
            world
                .members
                .iter()
                .map(|member| world
                    .keys
                    .iter()
                    .map(|key| member.node().table().latest(key).map(|v| v.seq))
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        ));
    }
    Ok(false)
}

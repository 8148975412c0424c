//! The chain store's world (docs/simulation.md, "Chain stores"): the NetChain members' and
//! controller's production state machines, four members (three in the chains, one spare),
//! clients taking the chains from the controller, on a lossy, duplicating, reordering
//! network, with member crashes (tables reopened from what the crash left in persistent
//! memory), a member lost for good, partitions (a member cut off from the controller, or from
//! everyone) and controller restarts. One seed decides everything. [`run_seed_fixed`] runs the
//! same world with the fixed chains of `--chain-member` (no controller; crashes only).
//!
//! Each member runs as `pmnet device --chain-member` runs it: `ChainFunction` in a device's
//! pipeline, its table writes carried out by the device's region executor
//! (`crate::function_host`).
//!
//! Checked: every key's history of completed reads, writes and compare-and-sets, with the
//! versions they returned, is linearizable (`pmnet-lincheck`'s versioned register, so lock
//! recipes on compare-and-set are safe; `linearizability_checker.rs`); once the faults heal,
//! the chains are whole again (as many members as are alive, up to three) with no recovery
//! under way, and every client's last request completes (`liveness_checker.rs`).
//!
//! A run is the world's set-up (`world.rs`), then steps of virtual time until the liveness
//! check passes, each step: the faults due (`faults.rs`), the clients' requests and outcomes
//! (`workload.rs`), the network's deliveries and the timers (`delivery.rs`).

mod delivery;
mod faults;
mod linearizability_checker;
mod liveness_checker;
mod report;
mod workload;
mod world;

use crate::TracedRun;
pub use report::ChainReport;
use world::ChainWorld;

/// Run one seed; `Err` names what failed.
pub fn run_seed(seed: u64) -> Result<ChainReport, String> {
    run_traced(seed, true, None).result
}

/// Run one seed with fixed chains (no controller): member crashes and restarts on the
/// network's faults; linearizability, and every client's last request completes once healed.
pub fn run_seed_fixed(seed: u64) -> Result<ChainReport, String> {
    run_traced(seed, false, None).result
}

/// Run one seed, with the controller or with fixed chains, keeping its trace when `keep`
/// (`Some(false)`: without the datagram lines); the trace is hashed either way.
pub fn run_traced(seed: u64, controlled: bool, keep: Option<bool>) -> TracedRun<ChainReport> {
    let mut world = match ChainWorld::new(seed, controlled, keep) {
        Ok(world) => world,
        Err(error) => return TracedRun::not_started(error),
    };
    let result = run(&mut world, seed);
    TracedRun::conclude(
        &mut world.network.trace,
        world.now,
        result,
        |report, hash| {
            report.trace_hash = hash;
        },
    )
}

fn run(world: &mut ChainWorld, seed: u64) -> Result<ChainReport, String> {
    loop {
        world.trace_epoch();
        world.inject_due_faults();
        world.restart_due()?;
        world.heal_when_due();
        world.clients_step()?;
        world.deliver();
        world.fire_timers();
        if liveness_checker::converged(world)? {
            break;
        }
        world.advance();
    }
    let report = world.final_report();
    linearizability_checker::check(seed, &world.history)?;
    Ok(report)
}

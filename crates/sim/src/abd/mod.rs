//! The replicated memory's world (docs/simulation.md, "Replicated memory"): the production
//! state machines of `pmnet-abd` — memory nodes over their direct-mapped tables on the
//! simulated persistent memory, a coordinating device (`AbdFunction`) with client sessions
//! through it (`AbdClient`), and client-driven coordinators (`Coordinator` in the client,
//! each with its own writer id), all at once on one memory of 16 lines (8 of them contended,
//! 8 rarely touched) — on the chain store's network (loss, duplication, reordering,
//! partitions). One seed decides everything. The memory nodes and the device run as
//! `pmnet memnode` and `pmnet device --abd-node` run them: their function in a device's
//! pipeline, a node's line writes carried out by the device's region executor
//! (`crate::function_host`).
//!
//! Faults (`faults.rs`): memory node crashes (the batches of line writes under way cut at
//! random; every unfenced line kept, lost or torn) and restarts on what the crash left; a
//! node's memory lost for good (it restarts on a new, empty table and must learn);
//! partitions; device restarts (the coordinator's operations and its sessions' memory lost).
//! At most a minority of the nodes are down, learning or cut off at once, except in a power
//! failure: every node crashes at once, its persistent memory kept.
//!
//! Checked: every line's history is linearizable (`linearizability_checker.rs`); one
//! timestamp is never stored with two values of a line, and after every crash, when a node
//! joins and at the end, each node's durable line is one a coordinator stored with that
//! timestamp (`stores_checker.rs`); when a node joins after learning, each line's highest
//! acknowledged timestamp (or a higher one) is durable on enough of the nodes with memory that
//! every majority of them includes one, and at the end on a majority of the nodes
//! (`durability_checker.rs`); once the faults heal, every node is a member again and every
//! client's next operations complete (`liveness_checker.rs`).
//!
//! A run is the world's set-up (`world.rs`: the group forms first), then steps of virtual
//! time until the liveness check passes, each step: the faults and restarts due, the clients'
//! operations (`workload.rs`), the network's deliveries and the timers (`delivery.rs`).

mod delivery;
mod durability_checker;
mod faults;
mod line;
mod linearizability_checker;
mod liveness_checker;
mod report;
mod stores_checker;
mod workload;
mod world;

use crate::TracedRun;
pub use report::AbdReport;
use world::AbdWorld;

/// Lines of the memory: [`HOT`] that clients contend for, the rest written and read rarely
/// (so that a line's latest write can sit on a bare majority for a while: what a node that
/// lost its memory must learn from the others).
pub const LINES: u32 = 16;
/// Lines `0 .. HOT` take nearly every operation.
const HOT: u32 = 8;
/// Of the operations, those on the lines past [`HOT`].
const COLD_SHARE: f64 = 0.004;

/// Run one seed; `Err` names what failed.
pub fn run_seed(seed: u64) -> Result<AbdReport, String> {
    run_traced(seed, None).result
}

/// Run one seed, keeping its trace when `keep` (`Some(false)`: without the datagram lines);
/// the trace is hashed either way.
pub fn run_traced(seed: u64, keep: Option<bool>) -> TracedRun<AbdReport> {
    let mut world = match AbdWorld::new(seed, keep) {
        Ok(world) => world,
        Err(error) => return TracedRun::not_started(format!("seed {seed}: {error}")),
    };
    let result = run(&mut world).map_err(|error| format!("seed {seed}: {error}"));
    TracedRun::conclude(
        &mut world.network.trace,
        world.now,
        result,
        |report, hash| {
            report.trace_hash = hash;
        },
    )
}

fn run(world: &mut AbdWorld) -> Result<AbdReport, String> {
    loop {
        world.form_group()?;
        world.inject_due_faults();
        world.restart_due()?;
        world.start_operations()?;
        world.collect_results()?;
        world.deliver();
        world.fire_timers()?;
        if liveness_checker::converged(world)? {
            break;
        }
        world.advance();
    }
    world.count_state_machines();
    world.stores.all_read()?;
    for (index, node) in world.nodes.iter().enumerate() {
        let what = format!("at the end, node {index}");
        world.stores.check_node(node.node(), &what)?;
    }
    durability_checker::durable_on_majority(&world.nodes, &world.acked)
        .map_err(|error| format!("at the end, {error}"))?;
    linearizability_checker::check(&world.history)?;
    if world.report.completed == 0 {
        return Err("no operation completed".to_owned());
    }
    Ok(world.report.clone())
}

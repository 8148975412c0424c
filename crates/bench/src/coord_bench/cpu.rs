//! The CPU a measured phase costs per request: the ensemble's processes', the clients' (this
//! process) and the rest of the machine's meanwhile. `pmnet bench --abd` measures with it too.

use pmnet_runtime::Shutdown;
use serde::Serialize;

use super::load::{self, CoordClient, Phase};
use crate::procs;
use pmnet::CliError;

/// CPU time spent per request (lock: per cycle), warm-up included, in µs: by the system's
/// processes (all three members) and by the clients (the benchmark's process). On a machine
/// whose CPUs are all busy, throughput is about the CPUs over their sum.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuPerOp {
    pub servers: f64,
    pub clients: f64,
    /// CPUs the machine's other processes kept busy meanwhile, on average (0: the run had
    /// the machine to itself).
    pub others_cpus: Option<f64>,
}

/// Run `phase` and measure the CPU time the ensemble's processes (`pids`) and the clients
/// (this process) spend on it, per request. (`pmnet bench --abd` measures with it too.)
pub fn run_phase(
    clients: &mut [Box<dyn CoordClient>],
    phase: &Phase,
    shutdown: &Shutdown,
    pids: &[u32],
) -> Result<(load::Measured, CpuPerOp), CliError> {
    let servers = procs::cpu_seconds_of_all(pids);
    let own = pmnet_runtime::metrics::process_cpu_seconds();
    let machine = procs::machine_busy_seconds();
    let started = std::time::Instant::now();
    let measured = load::run_phase(clients, phase, shutdown)?;
    let elapsed = started.elapsed().as_secs_f64();
    let servers = procs::cpu_seconds_of_all(pids) - servers;
    let own = pmnet_runtime::metrics::process_cpu_seconds() - own;
    // What the rest of the machine used meanwhile: other processes disturb the figures.
    let others = machine
        .zip(procs::machine_busy_seconds())
        .map(|(before, after)| ((after - before - servers - own) / elapsed).max(0.0));
    let per_op = |seconds: f64| {
        let us = seconds * 1e6 / measured.completed.max(1) as f64;
        (us * 10.0).round() / 10.0
    };
    let cpu = CpuPerOp {
        servers: per_op(servers),
        clients: per_op(own),
        others_cpus: others.map(|cpus| (cpus * 100.0).round() / 100.0),
    };
    Ok((measured, cpu))
}

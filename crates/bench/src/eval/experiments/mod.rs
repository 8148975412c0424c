//! The experiments of `pmnet eval`, in the order they run and the report shows them.

mod functions;
mod micro;
mod pktstore;
mod recovery;
mod workloads;

use super::model::Experiment;

/// Every experiment, in order.
pub fn all() -> Vec<Experiment> {
    let mut all = vec![
        micro::LATENCY_PAYLOAD,
        micro::LOAD,
        micro::UPDATE_RATIO,
        micro::CDF,
        workloads::WORKLOADS,
        recovery::RECOVERY,
        pktstore::PKTSTORE,
    ];
    all.extend(functions::all());
    all
}

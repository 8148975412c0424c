//! The later functions' figures: the read cache, replication, the chain store, replicated
//! memory and the in-path datapath.

use crate::eval::model::Experiment;

/// The later functions' experiments, in order.
pub fn all() -> Vec<Experiment> {
    Vec::new()
}

//! The later functions' figures: the read cache, replication, the chain store, replicated
//! memory and the in-path datapath.

mod abd;
mod cache;
mod inpath;
mod netchain;
mod replication;
mod shared;

use crate::eval::model::Experiment;

/// The later functions' experiments, in order.
pub fn all() -> Vec<Experiment> {
    vec![
        cache::CACHE,
        replication::REPLICATION,
        netchain::NETCHAIN,
        abd::ABD,
        inpath::INPATH,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_experiment_has_a_unique_name() {
        let all = all();
        assert_eq!(all.len(), 5);
        let mut names: Vec<&str> = all.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 5);
    }
}

//! The chain store's world's safety check: every key's history of completed reads, puts,
//! deletions and compare-and-sets, with the versions they returned, is linearizable
//! (`pmnet-lincheck`'s versioned register: versions only grow, a compare-and-set holds exactly
//! when the present version is the one expected, reads see the exact version; a request whose
//! client gave up may or may not have taken effect). A run in which nothing completed fails.

use pmnet_lincheck::{check_by_key, VersionedRegister, PENDING};

use super::world::History;

/// Steps the search may take: a key with a few dozen unknown outcomes (writes whose clients
/// gave up in a storm of faults) needs hundreds of millions (seed 4037074536255826666: about
/// two minutes); an exhausted budget fails the seed as unchecked.
const STEP_BUDGET: u64 = 1_000_000_000;

/// Check `history` (seed `seed`'s).
pub(super) fn check(seed: u64, history: &History) -> Result<(), String> {
    let verdict = check_by_key(&VersionedRegister::default(), history, STEP_BUDGET);
    if !verdict.is_linearizable() {
        return Err(format!(
            "seed {seed}: a key's history is not linearizable: {verdict:?}"
        ));
    }
    if !history.iter().any(|(_, op)| op.ret != PENDING) {
        return Err(format!("seed {seed}: no operation completed"));
    }
    Ok(())
}

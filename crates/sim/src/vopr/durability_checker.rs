//! Invariant 4, a PMNet-ACK is a promise: a device never acks before its log write is durable
//! by the persistence model (the world checks that on every PMNet-ACK it sends, and counts
//! them), and a log entry corrupted at rest is never recovered as valid.

use pmnet_pm::EntryKey;

use crate::world::World;

/// After device `index` restarted over a log whose entry `key` was corrupted at rest: the
/// recovered device holds no live entry of that key.
pub(super) fn check_corrupted_entry_not_recovered(world: &mut World, index: usize, key: EntryKey) {
    let node = &world.devices[index];
    assert!(
        node.device().live_keys().all(|live| *live != key),
        "invariant: a corrupted log entry {key:?} was recovered as valid"
    );
    world.note_by(
        "check",
        &format!("invariant 4: device{index} did not recover the corrupted entry"),
    );
}

/// Note in the trace how many PMNet-ACKs the world checked against the persistence model.
pub(super) fn note_acks_checked(world: &mut World) {
    let acks = world.acks_checked;
    world.note_by(
        "check",
        &format!(
            "invariant 4 (an ack is a promise): {acks} PMNet-ACKs, each of an entry durable \
             in the persistence model"
        ),
    );
}

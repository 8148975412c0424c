//! Device crashes: what the crash leaves in the log (held writes, a write half done, torn cache
//! lines, an entry corrupted at rest) and the restart that recovers from it.

use pmnet_pm::{LogWork, PmRegion, CACHE_LINE_SIZE};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::world::World;

use super::durability_checker::check_corrupted_entry_not_recovered;
use super::FaultSummary;

/// Crash device `index` (when the seed's crash weight allows): maybe with an applied entry
/// corrupted at rest, maybe in the middle of a batch of log work, and with a crash image that keeps
/// what was persisted or tears the unpersisted cache lines; then restart it.
pub(super) fn crash_device(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    summary: &mut FaultSummary,
    weight: u32,
) {
    if rng.random_range(0..4) >= weight {
        return;
    }
    let index = rng.random_range(0..world.devices.len());
    if world.devices[index].lost {
        return;
    }
    let actor = format!("device{index}");
    summary.counts.device_crashes += 1;
    let held = world.devices[index].held.len();
    if held > 0 {
        summary.counts.device_crashes_with_held_writes += 1;
    }
    world.note_by(
        &actor,
        &format!("CRASH ({held} persistence batches issued but not complete)"),
    );
    if rng.random_bool(0.3) {
        corrupt_applied_entry_at_rest(world, rng, index, summary);
    }
    // A batch the device issued but the log has not finished: its stores may be anywhere
    // between the cache and the medium when the crash comes.
    if rng.random_bool(0.5) {
        let node = world.device_mut(index);
        if let Some(batch) = node.held.front().cloned() {
            node.log.persist_batch_without_fences(&batch.work);
            let writes = batch
                .work
                .iter()
                .filter(|work| matches!(work, LogWork::Write { .. }))
                .count();
            if writes > 0 {
                summary.counts.device_crashes_mid_write += 1;
            }
            world.note_by(
                &actor,
                &format!(
                    "crash in the middle of persistence batch {} ({} items, {writes} log \
                     writes): its stores issued, not fenced",
                    batch.number,
                    batch.work.len()
                ),
            );
        }
    }
    if rng.random_bool(0.5) {
        summary.counts.device_crashes_torn += 1;
        let crash_seed: u64 = rng.random();
        world.note_by(
            &actor,
            &format!(
                "crash image: each unpersisted cache line kept, lost or torn at 8 bytes \
                 (crash seed {crash_seed})"
            ),
        );
        world.restart_device_with(index, |region| {
            region.crash(&mut ChaCha8Rng::seed_from_u64(crash_seed))
        });
    } else {
        world.note_by(&actor, "crash image: what was persisted, nothing more");
        world.restart_device(index);
    }
}

/// Flip one bit inside a live log entry whose request its server (and each of its replicas)
/// already applied (so that no acknowledged update is lost to the corruption), and check that the reopened log rejects it.
fn corrupt_applied_entry_at_rest(
    world: &mut World,
    rng: &mut ChaCha8Rng,
    index: usize,
    summary: &mut FaultSummary,
) {
    let candidates: Vec<(u32, usize)> = {
        let node = &world.devices[index];
        (0..node.log.slot_count())
            .filter_map(|slot| {
                let (key, packet) = node.log.read(slot)?;
                let server = usize::from(key.server_id.checked_sub(crate::SERVER_ID)?);
                if server >= world.servers.len() {
                    return None;
                }
                let applied = world.primary(server).app.sessions.get(&key.session_id)?.0;
                // With replica servers, on every one that may yet be promoted as well.
                let on_replicas = (world.live_replicas(server).into_iter())
                    .map(|replica| &world.replicas[replica])
                    .all(|replica| {
                        replica
                            .app
                            .sessions
                            .get(&key.session_id)
                            .is_some_and(|(last, _)| *last >= key.seq)
                    });
                (applied >= key.seq && on_replicas).then_some((slot, packet.len()))
            })
            .collect()
    };
    if candidates.is_empty() {
        return;
    }
    let (slot, packet_len) = candidates[rng.random_range(0..candidates.len())];
    let node = world.device_mut(index);
    let start = node.log.slot_range(slot).start;
    let offset = start + rng.random_range(0..CACHE_LINE_SIZE + packet_len);
    let bit = rng.random_range(0..8u8);
    let key = node.log.read(slot).map(|(key, _)| key);
    node.log.region_mut().flip_bit(offset, bit);
    assert!(node.log.region().len() > offset);
    summary.counts.entries_corrupted_at_rest += 1;
    world.note_by(
        &format!("device{index}"),
        &format!(
            "log slot {slot} corrupted at rest: bit {bit} of byte {} flipped ({key:?}, \
             already applied); restart",
            offset - start
        ),
    );
    world.restart_device(index);
    if let Some(key) = key {
        check_corrupted_entry_not_recovered(world, index, key);
    }
}

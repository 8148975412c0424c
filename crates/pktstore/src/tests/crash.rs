//! Crashes at any point of random runs, and space reclaimed online under load and crashes.

use pmnet_pm::SimRegion;
use pmnet_store::{Application, NoSpace, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    assert_matches, check_matches, config, random_request, region_len, same_reply, seeds,
    store_full_read, try_stage, Model, Tap,
};
use crate::layout::EngineKind;
use crate::store::Store;

/// One randomised run: requests in batches of random size, some through received slots;
/// returns the model after each commit and the operation count at each commit's end.
struct Run {
    states: Vec<Model>,
    commit_ends: Vec<u64>,
}

fn drive(store: &mut Store<Tap>, rng: &mut ChaCha8Rng, request_count: usize) -> Run {
    let mut model = Model::default();
    let mut states = vec![model.clone()];
    let mut commit_ends = vec![store.region().operations];
    let mut seqs = [0u32; 4];
    let mut staged = 0;
    let mut batch_len = rng.random_range(1..6);
    for _ in 0..request_count {
        let session = rng.random_range(0..4usize);
        seqs[session] += 1;
        let session_id = 1000 + session as u64;
        let request = random_request(rng, 1100);
        let via_slots = rng.random_bool(0.6);
        let epoch = store.committed_epoch();
        let staged_result = try_stage(store, session_id, seqs[session], &request, via_slots);
        if store.committed_epoch() != epoch {
            // Finding room committed the requests staged before this one: an acknowledged
            // state (its end is counted a little late, which only widens what may survive).
            states.push(model.clone());
            commit_ends.push(store.region().operations);
        }
        let Ok(reply) = staged_result else {
            // No room: nothing of it was staged, so the model does not see it either.
            continue;
        };
        let expected = model.apply(session_id, seqs[session], &request);
        if store_full_read(&reply, &request) {
            model.sessions.insert(session_id, (seqs[session], reply));
        } else {
            assert!(
                same_reply(&reply, &expected),
                "reply {reply:?} expected {expected:?}"
            );
        }
        staged += 1;
        if staged >= batch_len {
            store.commit();
            store.check_against_region().unwrap();
            states.push(model.clone());
            commit_ends.push(store.region().operations);
            staged = 0;
            batch_len = rng.random_range(1..6);
        }
    }
    store.commit();
    states.push(model.clone());
    commit_ends.push(store.region().operations);
    Run {
        states,
        commit_ends,
    }
}

/// Crash a random run at a random point; with `full`, the store is small enough that requests
/// find no room (refused, then the store keeps going), otherwise it never fills.
fn crash_run(engine: EngineKind, seed: u64, full: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let request_count = if full {
        rng.random_range(40..150)
    } else {
        rng.random_range(5..80)
    };
    // Room for everything the requests can write (< 80 requests of at most 3 slots, replies
    // included) unless `full`. Slots are still reused: freed slots go back to the front of the
    // free list. A full run: 24 keys of up to 3 slots each do not fit in 24–40 slots.
    let slots = if full {
        rng.random_range(24..40)
    } else {
        rng.random_range(260..320)
    };
    let base = Store::format(SimRegion::new(region_len(slots)), config(engine))
        .unwrap()
        .into_region();
    // A dry run counts the operations; the real one crashes before a random one of them.
    let mut dry = Store::open(Tap::new(base.clone(), None, seed)).unwrap();
    let run_rng_seed = rng.random::<u64>();
    drive(
        &mut dry,
        &mut ChaCha8Rng::seed_from_u64(run_rng_seed),
        request_count,
    );
    let total = dry.region().operations;
    let crash_at = rng.random_range(0..=total);
    let mut store = Store::open(Tap::new(base, Some(crash_at), seed)).unwrap();
    let run = drive(
        &mut store,
        &mut ChaCha8Rng::seed_from_u64(run_rng_seed),
        request_count,
    );
    let mut tap = store.into_region();
    let image = match tap.image.take() {
        Some(image) => image,
        None => {
            assert_eq!(crash_at, total, "seed {seed}: crash point not reached");
            tap.inner.crash(&mut rng)
        }
    };
    // Every commit that ended before the crash is acknowledged; the one in progress may or
    // may not have happened. Nothing else is allowed.
    let acknowledged = run
        .commit_ends
        .iter()
        .filter(|end| **end <= crash_at)
        .count()
        - 1;
    let context = format!(
        "{engine:?} seed {seed} (PMNET_SEED={seed}): crash before operation {crash_at} of \
         {total}, {acknowledged} batches acknowledged"
    );
    let recovered = Store::open(image).unwrap_or_else(|e| panic!("{context}: {e}"));
    if let Err(broken) = recovered.check_against_region() {
        panic!("{context}: right after recovery: {broken}");
    }
    assert!(
        recovered.recovery().corrupt_records.is_empty()
            && recovered.recovery().index_broken.is_none(),
        "{context}: {:?}",
        recovered.recovery()
    );
    let candidates: Vec<&Model> = run.states[acknowledged..].iter().take(2).collect();
    let outcomes: Vec<Result<(), String>> = candidates
        .iter()
        .map(|model| check_matches(&recovered, model))
        .collect();
    let Some(which) = outcomes.iter().position(Result::is_ok) else {
        panic!("{context}: matches neither the acknowledged state nor the next: {outcomes:?}");
    };
    // The recovered store keeps working, and survives a second crash-free restart.
    let mut store = recovered;
    let mut model = candidates[which].clone();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 77);
    for seq in 1..30 {
        let request = random_request(&mut rng, 600);
        let Ok(reply) = store.apply(42, seq, &request) else {
            continue;
        };
        let expected = model.apply(42, seq, &request);
        if store_full_read(&reply, &request) {
            model.sessions.insert(42, (seq, reply));
        } else {
            assert!(same_reply(&reply, &expected), "{context}: after recovery");
        }
        if let Err(broken) = store.check_against_region() {
            panic!("{context}: after recovery, request {seq}: {broken}");
        }
    }
    let reopened = Store::open(store.into_region()).unwrap();
    assert_matches(&reopened, &model, &format!("{context}, second restart"));
}

#[test]
fn a_crash_at_any_point_recovers_a_prefix_with_every_acknowledged_request() {
    for seed in seeds("crash_at_any_point", 100) {
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            crash_run(engine, seed, false);
        }
    }
}

/// The same in a store too small for the requests: refusals leave nothing behind, the early
/// commits that reclaim space are crash-consistent, and deletes keep making room.
#[test]
fn a_crash_at_any_point_of_a_full_store_recovers_a_prefix() {
    for seed in seeds("crash_at_any_point_full", 100) {
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            crash_run(engine, seed, true);
        }
    }
}

#[test]
fn space_is_reclaimed_online_under_overwrite_load_and_crashes() {
    for seed in seeds("space_reclaimed_under_load", 20) {
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            // 40 slots, 2000 writes of up to 3 slots each: without reclamation it would fill
            // fifty times over.
            let mut store = Store::format(SimRegion::new(region_len(40)), config(engine)).unwrap();
            let mut model = Model::default();
            let mut full_replies = 0;
            for seq in 1..=2000u32 {
                let key = format!("k{}", rng.random_range(0..6u32)).into_bytes();
                let request = if rng.random_bool(0.15) {
                    Request::Del { key: &key }.to_bytes()
                } else {
                    let value = vec![seq as u8; rng.random_range(0..1000usize)];
                    Request::Set {
                        key: &key,
                        value: &value,
                    }
                    .to_bytes()
                };
                match try_stage(&mut store, 7, seq, &request, rng.random_bool(0.5)) {
                    Ok(reply) => assert!(same_reply(&reply, &model.apply(7, seq, &request))),
                    Err(NoSpace) => full_replies += 1,
                }
                store.commit();
                if seq % 500 == 0 {
                    // Crash between two batches with unflushed work lost, and carry on.
                    let region = store.into_region();
                    let crashed = region.crash(&mut rng);
                    store = Store::open(crashed).unwrap();
                    assert_matches(&store, &model, &format!("seed {seed} at {seq}"));
                }
            }
            assert_eq!(full_replies, 0, "seed {seed}: {engine:?} ran out of space");
            assert!(store.stats().records_freed > 1000 || store.recovery().committed_epoch > 0);
            assert_matches(&store, &model, "end");
        }
    }
}

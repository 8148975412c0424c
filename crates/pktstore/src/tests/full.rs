//! A full store: updates refused with nothing kept of them, deletes that always run, and
//! refusals that leave no trace.

use pmnet_pm::{PmRegion, SimRegion};
use pmnet_store::{Application, NoSpace, Reply, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    assert_matches, check_matches, config, region_len, same_reply, seeds, store_full_read,
    try_stage, Model,
};
use crate::layout::EngineKind;
use crate::store::Store;

fn set_request(key: &[u8], value: &[u8]) -> Vec<u8> {
    Request::Set { key, value }.to_bytes()
}

/// SETs of new keys by session 1 (from `seq` on), each committed, until one finds no room;
/// returns the keys stored. `via_slots`: through received slots when there are any to lend.
pub(super) fn fill_store<R: PmRegion>(
    store: &mut Store<R>,
    seq: &mut u32,
    value: &[u8],
    via_slots: bool,
) -> Vec<Vec<u8>> {
    let mut stored = Vec::new();
    loop {
        *seq += 1;
        let key = format!("k{seq}").into_bytes();
        let result = try_stage(store, 1, *seq, &set_request(&key, value), via_slots);
        store.commit();
        match result {
            Ok(reply) => {
                assert_eq!(reply, Reply::Ok.to_bytes());
                stored.push(key);
            }
            Err(NoSpace) => return stored,
        }
        assert!(*seq < 100_000, "the store never filled");
    }
}

#[test]
fn a_full_store_refuses_updates_and_keeps_nothing_of_them() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut store = Store::format(SimRegion::new(region_len(48)), config(engine)).unwrap();
        let value = vec![9u8; 300];
        let mut seq = 0;
        // Received in place while slots can be lent, then from bytes.
        let mut stored = fill_store(&mut store, &mut seq, &value, true);
        stored.extend(fill_store(&mut store, &mut seq, &value, false));
        let refused = seq;
        let last_stored: u32 = std::str::from_utf8(&stored.last().unwrap()[1..])
            .unwrap()
            .parse()
            .unwrap();
        assert!(stored.len() > 10, "{engine:?}: {} keys", stored.len());
        assert_eq!(store.stats().no_space, 2, "{engine:?}");
        store.check_against_region().unwrap();
        if engine == EngineKind::Packet {
            assert!(store.free_slot_count() >= store.delete_reserve_slots());
        }
        let refused_set = set_request(format!("k{refused}").as_bytes(), &value);
        // Nothing of the refused SET: its session is where it was, its key absent.
        let sessions = store.sessions();
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0].last_seq, last_stored, "{engine:?}");
        assert!(store
            .get(format!("k{refused}").as_bytes())
            .unwrap()
            .is_none());
        // Asked again with the same seq: the same answer; an INCR or APPEND, or a SET of
        // another session, is refused alike and leaves no session behind.
        assert_eq!(store.apply(1, refused, &refused_set), Err(NoSpace));
        let incr = Request::Incr {
            key: b"n",
            delta: 1,
        }
        .to_bytes();
        let append = Request::Append {
            key: &stored[0],
            value: b"more",
        }
        .to_bytes();
        assert_eq!(store.apply(2, 1, &incr), Err(NoSpace));
        assert_eq!(store.apply(2, 1, &append), Err(NoSpace));
        assert_eq!(
            try_stage(&mut store, 2, 1, &refused_set, true),
            Err(NoSpace)
        );
        store.commit();
        assert_eq!(store.sessions(), sessions);
        // A GET still works: a short reply as usual, a long one (no room for its record) as
        // an ERROR that says so.
        let reply = store.apply_ok(3, 1, &Request::Get { key: b"absent" }.to_bytes());
        assert_eq!(reply, Reply::NotFound.to_bytes());
        let reply = store.apply_ok(3, 2, &Request::Get { key: &stored[0] }.to_bytes());
        assert!(store_full_read(
            &reply,
            &Request::Get { key: &stored[0] }.to_bytes()
        ));
        assert_eq!(store.stats().store_full_replies, 1);
        let sessions = store.sessions();

        // A crash loses nothing acknowledged and shows nothing refused.
        let mut store = Store::open(store.into_region().crash(&mut rng)).unwrap();
        store.check_against_region().unwrap();
        assert_eq!(store.sessions(), sessions);
        assert_eq!(store.keys().len(), stored.len());
        assert!(store
            .get(format!("k{refused}").as_bytes())
            .unwrap()
            .is_none());
        assert!(store.get(b"n").unwrap().is_none());
        assert_eq!(store.get(&stored[0]).unwrap().unwrap().to_vec(), value);
        // Still full after the restart. A DEL runs, and then the refused SET fits.
        assert_eq!(store.apply(1, refused, &refused_set), Err(NoSpace));
        let del = Request::Del { key: &stored[1] }.to_bytes();
        assert_eq!(store.apply_ok(4, 1, &del), Reply::Deleted(1).to_bytes());
        assert_eq!(
            store.apply(1, refused, &refused_set),
            Ok(Reply::Ok.to_bytes())
        );
        store.check_against_region().unwrap();
        let store = Store::open(store.into_region().crash(&mut rng)).unwrap();
        assert_eq!(
            store
                .get(format!("k{refused}").as_bytes())
                .unwrap()
                .unwrap()
                .to_vec(),
            value
        );
        assert!(store.get(&stored[1]).unwrap().is_none());
        let session_1 = store.sessions().into_iter().find(|s| s.session_id == 1);
        assert_eq!(session_1.unwrap().last_seq, refused, "{engine:?}");
    }
}

/// A store filled to the last byte with keys of every length (up to the longest) can always
/// be emptied by DELs, many to a batch, from bytes or received in place, across crashes.
#[test]
fn deletes_always_run_in_a_full_store() {
    for seed in seeds("deletes_always_run_in_a_full_store", 10) {
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let slots = rng.random_range(30..120);
            let mut store =
                Store::format(SimRegion::new(region_len(slots)), config(engine)).unwrap();
            let mut stored = Vec::new();
            let mut seq = 0;
            // A DEL of a long key needs the most room. The packet engine reads a key from the
            // first datagram of its record, which holds 409 bytes of key with these slots.
            let longest_key = match engine {
                EngineKind::Packet => 400,
                EngineKind::Conventional => pmnet_store::codec::MAX_KEY_LEN,
            };
            // Long keys first, then ever smaller values into what is left.
            for value_len in [0, 1000, 300, 40, 0] {
                loop {
                    seq += 1;
                    let key_len = if stored.len() % 3 == 0 {
                        longest_key - rng.random_range(0..8)
                    } else {
                        rng.random_range(1..40)
                    };
                    let mut key = format!("{seq}-").into_bytes();
                    key.resize(key_len.max(key.len()), b'x');
                    let request = set_request(&key, &vec![1; value_len]);
                    let result = try_stage(&mut store, 1, seq, &request, rng.random_bool(0.3));
                    store.commit();
                    match result {
                        Ok(reply) => {
                            assert_eq!(reply, Reply::Ok.to_bytes());
                            stored.push(key);
                        }
                        Err(NoSpace) => break,
                    }
                }
            }
            let context = format!("{engine:?} seed {seed} (PMNET_SEED={seed}), {slots} slots");
            assert!(stored.len() > 3, "{context}");
            // Every session table slot the deletes will use already taken by a long reply.
            for session in 0..4u64 {
                let get = Request::Get { key: &stored[0] }.to_bytes();
                let _ = store.apply_ok(100 + session, 1, &get);
            }
            let mut model = Model::default();
            while !stored.is_empty() {
                let batch = rng.random_range(1..=70usize).min(stored.len());
                for _ in 0..batch {
                    let key = stored.swap_remove(rng.random_range(0..stored.len()));
                    let session_id = 100 + rng.random_range(0..4u64);
                    seq += 1;
                    let request = Request::Del { key: &key }.to_bytes();
                    let reply = try_stage(&mut store, session_id, seq, &request, true)
                        .unwrap_or_else(|NoSpace| panic!("{context}: a DEL found no room"));
                    assert_eq!(reply, Reply::Deleted(1).to_bytes(), "{context}");
                    model.sessions.insert(session_id, (seq, reply));
                }
                store.commit();
                store
                    .check_against_region()
                    .unwrap_or_else(|broken| panic!("{context}: {broken}"));
                if rng.random_bool(0.2) {
                    store = Store::open(store.into_region().crash(&mut rng)).unwrap();
                }
            }
            assert_eq!(store.key_count(), 0, "{context}");
            assert_matches(&store, &model, &context);
            // Empty again: a SET fits.
            seq += 1;
            let request = set_request(b"again", &[2; 500]);
            assert_eq!(store.apply(1, seq, &request), Ok(Reply::Ok.to_bytes()));
        }
    }
}

/// Refusing a request any number of times, then applying it once room was made, leaves the
/// store exactly as applying it only then: the model sees each request once, when it
/// succeeds, and the store matches it after every step, every commit and every crash.
#[test]
fn refusals_then_success_equal_success_alone() {
    for seed in seeds("refusals_then_success_equal_success_alone", 10) {
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut store = Store::format(SimRegion::new(region_len(40)), config(engine)).unwrap();
            let mut model = Model::default();
            let mut next_seq = [1u32; 5];
            // Each session's refused request, retried before anything else of that session.
            let mut waiting: [Option<Vec<u8>>; 5] = Default::default();
            let (mut refusals, mut retried_later) = (0, 0);
            let context = format!("{engine:?} seed {seed} (PMNET_SEED={seed})");
            for step in 0..600 {
                // Sessions 0–3 do anything; session 4 only deletes, so room is made while the
                // others wait.
                let session = rng.random_range(0..5usize);
                let session_id = 200 + session as u64;
                let seq = next_seq[session];
                let was_waiting = waiting[session].is_some();
                let request = match waiting[session].take() {
                    Some(request) => request,
                    None if session == 4 => {
                        let key = format!("k{}", rng.random_range(0..30u32)).into_bytes();
                        Request::Del { key: &key }.to_bytes()
                    }
                    None => {
                        let key = format!("k{}", rng.random_range(0..30u32)).into_bytes();
                        match rng.random_range(0..10u32) {
                            0..=5 => set_request(&key, &vec![7; rng.random_range(0..1000)]),
                            6 => Request::Append {
                                key: &key,
                                value: &[3; 150],
                            }
                            .to_bytes(),
                            7 => Request::Incr {
                                key: b"n",
                                delta: 2,
                            }
                            .to_bytes(),
                            8 => Request::Get { key: &key }.to_bytes(),
                            _ => Request::Del { key: &key }.to_bytes(),
                        }
                    }
                };
                match try_stage(&mut store, session_id, seq, &request, rng.random_bool(0.5)) {
                    Ok(reply) => {
                        let expected = model.apply(session_id, seq, &request);
                        if store_full_read(&reply, &request) {
                            model.sessions.insert(session_id, (seq, reply));
                        } else {
                            assert!(same_reply(&reply, &expected), "{context}: step {step}");
                        }
                        next_seq[session] += 1;
                        retried_later += usize::from(was_waiting);
                    }
                    Err(NoSpace) => {
                        refusals += 1;
                        waiting[session] = Some(request);
                    }
                }
                if rng.random_bool(0.3) {
                    store.commit();
                    if let Err(difference) = check_matches(&store, &model) {
                        panic!("{context}: step {step}: {difference}");
                    }
                    if rng.random_bool(0.1) {
                        store = Store::open(store.into_region().crash(&mut rng)).unwrap();
                        assert_matches(&store, &model, &format!("{context}: step {step}"));
                    }
                }
            }
            store.commit();
            assert!(
                refusals > 0 && retried_later > 0,
                "{context}: {refusals} refusals"
            );
            let store = Store::open(store.into_region()).unwrap();
            assert_matches(&store, &model, &context);
        }
    }
}

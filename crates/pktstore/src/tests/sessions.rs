//! The session table: eviction, long replies, and sequence numbers kept when a session's last
//! record is displaced.

use std::collections::BTreeMap;

use pmnet_pm::SimRegion;
use pmnet_store::{Application, Reply, Request};

use super::{config, region_len, stage};
use crate::layout::EngineKind;
use crate::store::Store;

#[test]
fn sessions_beyond_the_table_evict_the_least_recent() {
    let mut store = Store::format(
        SimRegion::new(region_len(64)),
        config(EngineKind::Conventional),
    )
    .unwrap();
    for session in 0..300u64 {
        store.apply_ok(session, 1, &Request::Get { key: b"x" }.to_bytes());
    }
    assert!(store.stats().sessions_evicted >= 300 - 128);
    let reopened = Store::open(store.into_region()).unwrap();
    let sessions = reopened.sessions();
    assert_eq!(sessions.len(), 128);
    assert!(sessions.iter().all(|s| s.session_id >= 300 - 128));
}

#[test]
fn a_session_kept_active_is_never_the_one_evicted() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
        let mut seq_of_zero = 0;
        for session in 1..2000u64 {
            store.apply_ok(session, 1, &Request::Get { key: b"x" }.to_bytes());
            if session % 10 == 0 {
                seq_of_zero += 1;
                store.apply_ok(0, seq_of_zero, &Request::Get { key: b"x" }.to_bytes());
            }
        }
        assert!(store.stats().sessions_evicted >= 2000 - 128);
        let reopened = Store::open(store.into_region()).unwrap();
        let sessions = reopened.sessions();
        assert_eq!(sessions.len(), 128, "{engine:?}");
        assert!(
            sessions
                .iter()
                .any(|s| s.session_id == 0 && s.last_seq == seq_of_zero),
            "{engine:?}: the session active every tenth request was evicted"
        );
    }
}

#[test]
fn long_replies_are_kept_in_reply_records() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
        let value = vec![3u8; 1500];
        store.apply_ok(
            1,
            1,
            &Request::Set {
                key: b"v",
                value: &value,
            }
            .to_bytes(),
        );
        let reply = store.apply_ok(2, 1, &Request::Get { key: b"v" }.to_bytes());
        assert_eq!(reply, Reply::Value(value.clone()).to_bytes());
        let reopened = Store::open(store.into_region()).unwrap();
        let session = reopened
            .sessions()
            .into_iter()
            .find(|s| s.session_id == 2)
            .unwrap();
        assert_eq!(session.last_reply, reply, "{engine:?}");
    }
}

#[test]
fn a_displaced_last_request_keeps_its_sessions_sequence_number() {
    // Session 1's last request is the record holding "k"; session 2 overwrites "k", so the
    // record that said "session 1 applied seq 7" leaves the index and its seq must move to the
    // session table in the same batch (a fold), or a retransmission of seq 7 after a restart
    // would be applied again.
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        for via_slots in [true, false] {
            let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
            let set = |value: &'static [u8]| Request::Set { key: b"k", value }.to_bytes();
            stage(&mut store, 1, 7, &set(b"one"), via_slots);
            store.commit();
            assert_eq!(store.stats().session_folds, 0);
            stage(&mut store, 2, 1, &set(b"two"), via_slots);
            store.commit();
            assert_eq!(
                store.stats().session_folds,
                1,
                "{engine:?} via slots {via_slots}"
            );
            // Session 2 then moves on to another key: its record for "k" stays the holder, so
            // nothing folds.
            stage(
                &mut store,
                2,
                2,
                &Request::Get { key: b"k" }.to_bytes(),
                via_slots,
            );
            store.commit();
            assert_eq!(store.stats().session_folds, 1);
            let reopened = Store::open(store.into_region()).unwrap();
            let sessions: BTreeMap<u64, u32> = reopened
                .sessions()
                .into_iter()
                .map(|s| (s.session_id, s.last_seq))
                .collect();
            assert_eq!(
                sessions.get(&1),
                Some(&7),
                "{engine:?} via slots {via_slots}"
            );
            assert_eq!(
                sessions.get(&2),
                Some(&2),
                "{engine:?} via slots {via_slots}"
            );
            let value = reopened.get(b"k").unwrap().unwrap().to_vec();
            assert_eq!(value, b"two");
        }
    }
}

#[test]
fn a_stale_request_applies_nothing() {
    // A server whose table forgot a session the store still records may stage an old
    // number again (the no-op fill of one its client gave up on): refused, nothing applied,
    // the record unchanged, across a restart too.
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
        let set = |value: &[u8]| Request::Set { key: b"k", value }.to_bytes();
        let reply = store.apply_ok(1, 3, &set(b"v3"));
        for (seq, request) in [(3, set(b"old")), (2, Vec::new())] {
            assert_eq!(
                store.apply_ok(1, seq, &request),
                pmnet_store::stale_reply(seq, 3),
                "{engine:?}"
            );
        }
        assert_eq!(store.stats().stale_requests, 2, "{engine:?}");
        let reopened = Store::open(store.into_region()).unwrap();
        let sessions = reopened.sessions();
        assert_eq!(sessions.len(), 1, "{engine:?}");
        assert_eq!((sessions[0].last_seq, &sessions[0].last_reply), (3, &reply));
        assert_eq!(
            reopened.get(b"k").unwrap().map(|value| value.to_vec()),
            Some(b"v3".to_vec()),
            "{engine:?}"
        );
    }
}

//! Every request kind against the model, the receive path, bad input, and the fences of a
//! commit.

use pmnet_pm::{PmRegion, SimRegion};
use pmnet_store::{Application, Reply, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    assert_matches, config, datagrams, random_request, region_len, same_reply, stage, Model,
};
use crate::layout::EngineKind;
use crate::store::Store;

#[test]
fn every_request_kind_matches_the_model_in_both_engines() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        for via_slots in [false, true] {
            let mut store = Store::format(SimRegion::new(region_len(400)), config(engine)).unwrap();
            let mut model = Model::default();
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let mut seqs = [0u32; 3];
            for _ in 0..600 {
                let session = rng.random_range(0..3usize);
                seqs[session] += 1;
                let request = random_request(&mut rng, 900);
                let session_id = 100 + session as u64;
                let expected = model.apply(session_id, seqs[session], &request);
                let reply = stage(&mut store, session_id, seqs[session], &request, via_slots);
                store.commit();
                assert!(
                    same_reply(&reply, &expected),
                    "{engine:?}: reply {reply:?}, expected {expected:?} for {request:?}"
                );
            }
            assert_matches(&store, &model, engine.name());
            // Ordered scans.
            let scanned = store.scan(b"key05", 3).unwrap();
            let expected: Vec<&Vec<u8>> = model
                .keys
                .range(b"key05".to_vec()..)
                .take(3)
                .map(|(k, _)| k)
                .collect();
            let scanned_keys: Vec<&[u8]> = scanned.iter().map(|(k, _)| *k).collect();
            assert_eq!(
                scanned_keys,
                expected.iter().map(|k| k.as_slice()).collect::<Vec<_>>()
            );
            // A clean restart returns exactly what was acknowledged.
            let reopened = Store::open(store.into_region()).unwrap();
            assert!(reopened.recovery().corrupt_records.is_empty());
            assert!(reopened.recovery().index_broken.is_none());
            assert_matches(&reopened, &model, "reopened");
        }
    }
}

#[test]
fn received_datagrams_become_records_in_place() {
    let mut store =
        Store::format(SimRegion::new(region_len(64)), config(EngineKind::Packet)).unwrap();
    let value = vec![7u8; 1000]; // Three fragments of 400 bytes.
    let request = Request::Set {
        key: b"big",
        value: &value,
    }
    .to_bytes();
    let packets = datagrams(9, 1, &request, 400);
    assert_eq!(packets.len(), 3);
    let mut lent = Vec::new();
    store.lend_receive_slots(3, &mut lent);
    assert_eq!(lent.len(), 3);
    for (slot, packet) in lent.iter().zip(&packets) {
        // What the kernel does with the iovec the runtime built from this slot.
        assert!(packet.len() <= slot.capacity);
        store.write_received(slot.slot, packet, 123_456).unwrap();
    }
    let slots: Vec<u32> = lent.iter().map(|s| s.slot).collect();
    let reply = store.stage_received(9, 1, &slots).unwrap().unwrap();
    store.commit();
    assert_eq!(reply, Reply::Ok.to_bytes());
    assert_eq!(store.stats().records_received_in_place, 1);
    assert_eq!(store.stats().records_written, 0, "nothing was copied");
    let stored = store.get(b"big").unwrap().unwrap();
    assert_eq!(
        stored.segments.len(),
        3,
        "read as a scatter-gather list over the packets"
    );
    assert_eq!(stored.to_vec(), value);
    // The bytes served are the received packet's bytes, in the slot they arrived in.
    let first_offset = lent[0].offset;
    let region_bytes = store.region().bytes();
    let segment = stored.segments[0];
    let segment_offset = segment.as_ptr() as usize - region_bytes.as_ptr() as usize;
    assert!(segment_offset > first_offset && segment_offset < first_offset + lent[0].capacity);
    assert_eq!(store.receive_time_ns(b"big"), Some(123_456));
    // Those slots are live: never lent again while the record lives.
    let mut more = Vec::new();
    store.lend_receive_slots(64, &mut more);
    assert!(more.iter().all(|s| !slots.contains(&s.slot)));
    for slot in more {
        store.release_slot(slot.slot);
    }
    // A DEL received in place removes it; the slots come back after the next commit.
    let del = Request::Del { key: b"big" }.to_bytes();
    let packet = &datagrams(9, 2, &del, 400)[0];
    store.lend_receive_slots(1, &mut lent);
    store.write_received(lent[0].slot, packet, 0).unwrap();
    let reply = store
        .stage_received(9, 2, &[lent[0].slot])
        .unwrap()
        .unwrap();
    store.commit();
    assert_eq!(reply, Reply::Deleted(1).to_bytes());
    assert!(store.get(b"big").unwrap().is_none());
    let before = store.free_slot_count();
    store.apply_ok(9, 3, &Request::Get { key: b"x" }.to_bytes());
    assert_eq!(
        store.free_slot_count(),
        before + 4,
        "three value slots and the DEL slot"
    );
    assert_eq!(store.sessions()[0].last_seq, 3);
}

#[test]
fn bad_input_is_rejected_with_a_reason() {
    let mut store =
        Store::format(SimRegion::new(region_len(64)), config(EngineKind::Packet)).unwrap();
    let good = datagrams(
        5,
        1,
        &Request::Set {
            key: b"k",
            value: b"v",
        }
        .to_bytes(),
        1000,
    );
    let mut bad_crc = good[0].clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0x40;
    let mut wrong_len = good[0].clone();
    wrong_len.push(0);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (bad_crc, "bad_checksum"),
        (
            b"hello world, this is not a PMNet datagram!".to_vec(),
            "bad_magic",
        ),
        (wrong_len, "trailing_bytes"),
    ];
    let mut lent = Vec::new();
    for (datagram, reason) in cases {
        store.lend_receive_slots(1, &mut lent);
        store.write_received(lent[0].slot, &datagram, 0).unwrap();
        assert_eq!(store.check_received(lent[0].slot).unwrap_err(), reason);
        store.release_slot(lent[0].slot);
    }
    // Structural garbage reaching stage_received is refused, not stored, never a panic.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..500 {
        let len = rng.random_range(32..200usize);
        let mut datagram: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if rng.random_bool(0.5) {
            datagram[0..4].copy_from_slice(&[0x50, 0x4E, 1, 1]);
        }
        store.lend_receive_slots(1, &mut lent);
        store.write_received(lent[0].slot, &datagram, 0).unwrap();
        let free = store.free_slot_count();
        assert!(store.stage_received(5, 1, &[lent[0].slot]).is_err());
        assert_eq!(store.free_slot_count(), free + 1, "the slot came back");
    }
    // A datagram that claims another request is refused.
    store.lend_receive_slots(1, &mut lent);
    store.write_received(lent[0].slot, &good[0], 0).unwrap();
    let rejected = store.stage_received(5, 2, &[lent[0].slot]).unwrap_err();
    assert_eq!(rejected.reason, "slots_hold_another_request");
    // Oversized and unlent slots.
    store.lend_receive_slots(1, &mut lent);
    assert_eq!(
        store
            .on_slot_received(lent[0].slot, 100_000, 0)
            .unwrap_err()
            .reason,
        "larger_than_slot"
    );
    assert_eq!(
        store.on_slot_received(99_999, 40, 0).unwrap_err().reason,
        "slot_not_lent"
    );
    // Garbage requests from bytes get an ERROR reply and still advance the session.
    let reply = store.apply_ok(5, 1, &[0xEE, 1, 2]);
    assert_eq!(reply[0], 255);
    assert_eq!(store.sessions()[0].last_seq, 1);
    assert_eq!(store.key_count(), 0);
}

#[test]
fn batches_commit_with_two_fences() {
    let mut store =
        Store::format(SimRegion::new(region_len(200)), config(EngineKind::Packet)).unwrap();
    let fences_before = store.region().fence_count();
    for seq in 1..=32u32 {
        let key = format!("k{seq}").into_bytes();
        stage(
            &mut store,
            1,
            seq,
            &Request::Set {
                key: &key,
                value: b"v",
            }
            .to_bytes(),
            true,
        );
    }
    store.commit();
    assert_eq!(store.region().fence_count() - fences_before, 2);
    assert_eq!(store.key_count(), 32);
}

/// Slots may be larger than a datagram (up to 128 KiB): a value the store writes itself is cut
/// into datagrams of at most `MAX_PAYLOAD_LEN` bytes of payload however large the slot, so a
/// value longer than one datagram reads back, before and after a restart.
#[test]
fn values_longer_than_a_datagram_in_slots_larger_than_one() {
    let slot_size = crate::layout::MAX_SLOT_SIZE;
    let config = crate::store::StoreConfig {
        engine: EngineKind::Packet,
        slot_size,
        max_sessions: 128,
    };
    let mut store = Store::format(SimRegion::new(40 * 1024 + 24 * slot_size), config).unwrap();
    assert_eq!(
        store.one_slot_key_and_value_len(),
        pmnet_wire::MAX_PAYLOAD_LEN - 7
    );
    let mut model = Model::default();
    for (seq, len) in [65_000usize, 65_500, 70_000, 200_000]
        .into_iter()
        .enumerate()
    {
        let key = format!("big{seq}").into_bytes();
        let value: Vec<u8> = (0..len).map(|i| (i * 7 + seq) as u8).collect();
        let request = Request::Set {
            key: &key,
            value: &value,
        }
        .to_bytes();
        let seq = seq as u32 + 1;
        let expected = model.apply(1, seq, &request);
        assert_eq!(store.apply_ok(1, seq, &request), expected);
        store.commit();
    }
    assert_matches(&store, &model, "large slots");
    let reopened = Store::open(store.into_region()).unwrap();
    assert!(reopened.recovery().corrupt_records.is_empty());
    assert_matches(&reopened, &model, "large slots, reopened");
}

/// Batches longer than an intent block (the store commits early when one fills, and to reuse
/// what earlier batches freed), with receive slots lent across the commits: replies match the
/// model, and the bookkeeping holds at every commit (debug builds check it there) and
/// against the region at the end of each batch.
#[test]
fn long_batches_and_outstanding_loans_keep_the_bookkeeping() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut store = Store::format(SimRegion::new(region_len(1000)), config(engine)).unwrap();
        let mut model = Model::default();
        let mut rng = ChaCha8Rng::seed_from_u64(29);
        let mut seqs = [0u32; 4];
        let mut idle = Vec::new();
        if engine == EngineKind::Packet {
            store.lend_receive_slots(5, &mut idle);
            assert_eq!(idle.len(), 5);
        }
        for _ in 0..4 {
            for _ in 0..150 {
                let session = rng.random_range(0..4usize);
                seqs[session] += 1;
                let session_id = 200 + session as u64;
                let request = random_request(&mut rng, 600);
                let expected = model.apply(session_id, seqs[session], &request);
                let via_slots = rng.random_bool(0.5);
                let reply = stage(&mut store, session_id, seqs[session], &request, via_slots);
                assert!(
                    same_reply(&reply, &expected),
                    "{engine:?}: reply {reply:?}, expected {expected:?} for {request:?}"
                );
            }
            store.commit();
            store.check_against_region().unwrap();
        }
        // Four commits asked for, and at least one early in each batch.
        assert!(store.stats().batches >= 8, "{:?}", store.stats());
        for slot in idle {
            store.release_slot(slot.slot);
        }
        store.check_invariants();
        assert_matches(&store, &model, engine.name());
    }
}

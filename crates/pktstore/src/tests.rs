//! Tests of the store: behaviour against a model, the receive path, crashes at every point
//! (SimRegion's crash model), corruption, reclamation under load, bad input.
//!
//! Randomised tests print their seed; `PMNET_SEED=N` replays one, `PMNET_SEEDS=K` runs more.

use std::collections::BTreeMap;

use pmnet_pm::{MediumInfo, PmRegion, SimRegion};
use pmnet_store::{Application, NoSpace, Reply, Request};
use pmnet_wire::{Header, PacketType, HEADER_LEN};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::layout::{EngineKind, META_LEN};
use crate::store::{Store, StoreConfig};

fn seeds(test_name: &str, default_count: u64) -> Vec<u64> {
    if let Ok(text) = std::env::var("PMNET_SEED") {
        let seed = text
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("PMNET_SEED must be a u64, got {text:?}"));
        eprintln!("{test_name}: PMNET_SEED={seed}");
        return vec![seed];
    }
    let count = std::env::var("PMNET_SEEDS")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(default_count);
    let base = rand::random::<u64>();
    eprintln!("{test_name}: seeds PMNET_SEED={base} and the {count} following");
    (0..count).map(|i| base.wrapping_add(i)).collect()
}

const SLOT_SIZE: usize = 512;

fn config(engine: EngineKind) -> StoreConfig {
    StoreConfig {
        engine,
        slot_size: SLOT_SIZE,
        max_sessions: 128,
    }
}

fn region_len(slots: usize) -> usize {
    // Superblock, intents and a 128-session table take 40 KiB.
    40 * 1024 + slots * SLOT_SIZE
}

/// A region that builds the image a crash would leave just before its `crash_at`-th
/// operation (write, flush or fence), and otherwise passes everything through.
struct Tap {
    inner: SimRegion,
    operations: u64,
    crash_at: Option<u64>,
    image: Option<SimRegion>,
    rng: ChaCha8Rng,
}

impl Tap {
    fn new(inner: SimRegion, crash_at: Option<u64>, seed: u64) -> Tap {
        Tap {
            inner,
            operations: 0,
            crash_at,
            image: None,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5EED),
        }
    }

    fn step(&mut self) {
        if self.crash_at == Some(self.operations) && self.image.is_none() {
            self.image = Some(self.inner.crash(&mut self.rng));
        }
        self.operations += 1;
    }
}

impl PmRegion for Tap {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        self.step();
        self.inner.write(offset, data);
    }
    fn flush(&mut self, offset: usize, len: usize) {
        self.step();
        self.inner.flush(offset, len);
    }
    fn fence(&mut self) {
        self.step();
        self.inner.fence();
    }
    fn medium(&self) -> MediumInfo {
        self.inner.medium()
    }
}

/// The reference semantics of the key-value requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Model {
    keys: BTreeMap<Vec<u8>, Vec<u8>>,
    sessions: BTreeMap<u64, (u32, Vec<u8>)>,
}

impl Model {
    fn apply(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Vec<u8> {
        let reply = match Request::decode(request) {
            Err(_) => Reply::Error("x".into()).to_bytes(),
            Ok(Request::Set { key, value }) => {
                self.keys.insert(key.to_vec(), value.to_vec());
                Reply::Ok.to_bytes()
            }
            Ok(Request::Get { key }) => match self.keys.get(key) {
                Some(value) => Reply::Value(value.clone()).to_bytes(),
                None => Reply::NotFound.to_bytes(),
            },
            Ok(Request::Del { key }) => {
                Reply::Deleted(u32::from(self.keys.remove(key).is_some())).to_bytes()
            }
            Ok(Request::Incr { key, delta }) => {
                let current = match self.keys.get(key) {
                    None => Some(0),
                    Some(value) => std::str::from_utf8(value)
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok()),
                };
                match current.and_then(|c| c.checked_add(delta)) {
                    Some(new) => {
                        self.keys.insert(key.to_vec(), new.to_string().into_bytes());
                        Reply::Integer(new).to_bytes()
                    }
                    None => Reply::Error("x".into()).to_bytes(),
                }
            }
            Ok(Request::Append { key, value }) => {
                let entry = self.keys.entry(key.to_vec()).or_default();
                entry.extend_from_slice(value);
                Reply::Ok.to_bytes()
            }
        };
        self.sessions.insert(session_id, (seq, reply.clone()));
        reply
    }
}

/// Replies equal, counting any two ERRORs as equal (messages are diagnostics).
fn same_reply(a: &[u8], b: &[u8]) -> bool {
    (a.first() == Some(&255) && b.first() == Some(&255)) || a == b
}

fn random_request(rng: &mut ChaCha8Rng, max_value_len: usize) -> Vec<u8> {
    let key = format!("key{:02}", rng.random_range(0..24u32)).into_bytes();
    match rng.random_range(0..20u32) {
        0..=8 => {
            let len = rng.random_range(0..=max_value_len);
            let value: Vec<u8> = (0..len).map(|_| rng.random::<u8>()).collect();
            Request::Set {
                key: &key,
                value: &value,
            }
            .to_bytes()
        }
        9..=11 => Request::Get { key: &key }.to_bytes(),
        12..=14 => Request::Del { key: &key }.to_bytes(),
        15..=16 => {
            let key = format!("n{}", rng.random_range(0..4u32)).into_bytes();
            let delta = rng.random_range(-5..=5i64);
            Request::Incr { key: &key, delta }.to_bytes()
        }
        17..=18 => {
            let key = format!("log{}", rng.random_range(0..3u32)).into_bytes();
            let value = format!("{},", rng.random::<u16>()).into_bytes();
            Request::Append {
                key: &key,
                value: &value,
            }
            .to_bytes()
        }
        _ => {
            let len = rng.random_range(0..12usize);
            (0..len).map(|_| rng.random::<u8>()).collect()
        }
    }
}

/// The datagrams of an update request as a client would send them, with fragments of at
/// most `fragment_payload_len` bytes.
fn datagrams(
    session_id: u64,
    seq: u32,
    payload: &[u8],
    fragment_payload_len: usize,
) -> Vec<Vec<u8>> {
    let count = payload.len().div_ceil(fragment_payload_len).max(1);
    (0..count)
        .map(|index| {
            let mut header = Header::new(PacketType::UpdateRequest, 1, session_id, seq);
            header.fragment_index = index as u16;
            header.fragment_count = count as u16;
            let start = (index * fragment_payload_len).min(payload.len());
            let end = ((index + 1) * fragment_payload_len).min(payload.len());
            header.encode(&payload[start..end])
        })
        .collect()
}

impl<R: PmRegion> Store<R> {
    /// [`Application::apply`] of a request that must find room (every test but the
    /// full-store ones).
    fn apply_ok(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Vec<u8> {
        self.apply(session_id, seq, request)
            .unwrap_or_else(|NoSpace| panic!("session {session_id} seq {seq}: no space"))
    }
}

/// [`try_stage`] of a request that must find room.
fn stage<R: PmRegion>(
    store: &mut Store<R>,
    session_id: u64,
    seq: u32,
    request: &[u8],
    via_slots: bool,
) -> Vec<u8> {
    try_stage(store, session_id, seq, request, via_slots)
        .unwrap_or_else(|NoSpace| panic!("session {session_id} seq {seq}: no space"))
}

/// Stage one request the way the runtime would: through received slots when the engine and
/// the request allow it (a SET or DEL whose key fits the first fragment), else from bytes.
fn try_stage<R: PmRegion>(
    store: &mut Store<R>,
    session_id: u64,
    seq: u32,
    request: &[u8],
    via_slots: bool,
) -> Result<Vec<u8>, NoSpace> {
    if via_slots && store.engine() == EngineKind::Packet {
        let fragment_len = SLOT_SIZE - META_LEN - HEADER_LEN - 40;
        let packets = datagrams(session_id, seq, request, fragment_len);
        let mut lent = Vec::new();
        store.lend_receive_slots(packets.len(), &mut lent);
        if lent.len() == packets.len() {
            for (slot, packet) in lent.iter().zip(&packets) {
                store
                    .write_received(slot.slot, packet, 1_000 + u64::from(seq))
                    .unwrap();
                store.check_received(slot.slot).unwrap();
            }
            let slots: Vec<u32> = lent.iter().map(|slot| slot.slot).collect();
            if let Ok(reply) = store.stage_received(session_id, seq, &slots) {
                return reply;
            }
        } else {
            for slot in lent {
                store.release_slot(slot.slot);
            }
        }
    }
    store.stage_request(session_id, seq, request)
}

fn check_matches<R: PmRegion>(store: &Store<R>, model: &Model) -> Result<(), String> {
    let keys: Vec<Vec<u8>> = store.keys();
    let expected: Vec<Vec<u8>> = model.keys.keys().cloned().collect();
    if keys != expected {
        return Err(format!("keys differ: {keys:?} vs {expected:?}"));
    }
    for (key, value) in &model.keys {
        match store.get(key) {
            Ok(Some(stored)) if &stored.to_vec() == value => {}
            Ok(Some(_)) => return Err(format!("value of {key:?} differs")),
            Ok(None) => return Err(format!("key {key:?} missing")),
            Err(corruption) => return Err(corruption.to_string()),
        }
    }
    let recovered: BTreeMap<u64, (u32, Vec<u8>)> = store
        .sessions()
        .into_iter()
        .map(|record| (record.session_id, (record.last_seq, record.last_reply)))
        .collect();
    for (session_id, (seq, reply)) in &model.sessions {
        let Some((stored_seq, stored_reply)) = recovered.get(session_id) else {
            return Err(format!("session {session_id} lost"));
        };
        if stored_seq != seq {
            return Err(format!(
                "last seq of session {session_id}: {stored_seq}, expected {seq}"
            ));
        }
        if !same_reply(stored_reply, reply) {
            return Err(format!(
                "last reply of session {session_id}: {stored_reply:?} vs {reply:?}"
            ));
        }
    }
    let scrub = store.verify_all();
    if !scrub.is_empty() {
        return Err(format!("scrub failed: {scrub:?}"));
    }
    Ok(())
}

fn assert_matches<R: PmRegion>(store: &Store<R>, model: &Model, context: &str) {
    if let Err(difference) = check_matches(store, model) {
        panic!("{context}: {difference}");
    }
}

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
fn opening_garbage_never_panics() {
    for seed in seeds("opening_garbage_never_panics", 40) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for engine in [EngineKind::Packet, EngineKind::Conventional] {
            let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
            for seq in 1..40 {
                let request = random_request(&mut rng, 300);
                store.apply_ok(1, seq, &request);
            }
            let mut region = store.into_region();
            for _ in 0..rng.random_range(1..200) {
                let offset = rng.random_range(64..region.len());
                region.corrupt_at_rest(offset, &mut rng);
            }
            if let Ok(store) = Store::open(region) {
                // Whatever survived is served or reported, never a panic.
                for key in store.keys() {
                    let _ = store.get(&key);
                }
                let _ = store.sessions();
                let _ = store.verify_all();
            }
        }
        let mut junk = SimRegion::new(region_len(8));
        let bytes: Vec<u8> = (0..junk.len()).map(|_| rng.random()).collect();
        junk.write(0, &bytes);
        assert!(Store::open(junk).is_err());
    }
}

#[test]
fn a_corrupted_record_is_reported_never_returned() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
        let value = b"precious value bytes".to_vec();
        store.apply_ok(
            1,
            1,
            &Request::Set {
                key: b"a",
                value: &value,
            }
            .to_bytes(),
        );
        store.apply_ok(
            1,
            2,
            &Request::Set {
                key: b"b",
                value: b"other",
            }
            .to_bytes(),
        );
        // Find the value's bytes in the region and flip a bit of them at rest.
        let offset = {
            let stored = store.get(b"a").unwrap().unwrap();
            stored.segments[0].as_ptr() as usize - store.region().bytes().as_ptr() as usize
        };
        let mut region = store.into_region();
        region.flip_bit(offset + 3, 2);
        // Reads before a restart: detected and reported.
        let mut store = Store::open(region.clone()).unwrap();
        let report = store.recovery().clone();
        assert_eq!(report.corrupt_records.len(), 1, "{engine:?}: {report:?}");
        assert_eq!(report.corrupt_records[0].reason, "bad_checksum");
        assert!(report.warning().is_some());
        assert!(store.get(b"a").unwrap().is_none(), "dropped from the index");
        assert_eq!(store.get(b"b").unwrap().unwrap().to_vec(), b"other");
        // The damaged record is not served by a GET either.
        let reply = store.apply_ok(1, 3, &Request::Get { key: b"a" }.to_bytes());
        assert_eq!(reply, Reply::NotFound.to_bytes());
    }
}

#[test]
fn read_verify_catches_corruption_under_a_live_store() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut store = Store::format(SimRegion::new(region_len(64)), config(engine)).unwrap();
        store.apply_ok(
            1,
            1,
            &Request::Set {
                key: b"a",
                value: b"0123456789",
            }
            .to_bytes(),
        );
        let offset = {
            let stored = store.get(b"a").unwrap().unwrap();
            stored.segments[0].as_ptr() as usize - store.region().bytes().as_ptr() as usize
        };
        store.region_mut().flip_bit(offset + 4, 5);
        let corruption = store.get(b"a").unwrap_err();
        assert_eq!(corruption.reason, "bad_checksum", "{engine:?}");
        assert_eq!(store.scan(b"", 10).unwrap_err(), corruption);
        let reply = store.apply_ok(1, 2, &Request::Get { key: b"a" }.to_bytes());
        assert_eq!(reply[0], 255, "an ERROR, not the damaged bytes");
        assert_eq!(store.stats().read_verify_failures, 1);
        assert_eq!(store.verify_all().len(), 1);
        // An APPEND or INCR on the damaged value does not build on it.
        let reply = store.apply_ok(
            1,
            3,
            &Request::Append {
                key: b"a",
                value: b"x",
            }
            .to_bytes(),
        );
        assert_eq!(reply[0], 255);
    }
}

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
            store.check_invariants().unwrap();
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

/// A GET answered that its long reply could not be kept: what a full store does to a read.
fn store_full_read(reply: &[u8], request: &[u8]) -> bool {
    let full = matches!(Reply::decode(reply), Ok(Reply::Error(message)) if message.starts_with("store full"));
    if full {
        assert!(
            matches!(Request::decode(request), Ok(Request::Get { .. })),
            "only a GET may be answered \"store full\": {request:?}"
        );
    }
    full
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
    if let Err(broken) = recovered.check_invariants() {
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
        if let Err(broken) = store.check_invariants() {
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

fn set_request(key: &[u8], value: &[u8]) -> Vec<u8> {
    Request::Set { key, value }.to_bytes()
}

/// SETs of new keys by session 1 (from `seq` on), each committed, until one finds no room;
/// returns the keys stored. `via_slots`: through received slots when there are any to lend.
fn fill_store<R: PmRegion>(
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
        store.check_invariants().unwrap();
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
        store.check_invariants().unwrap();
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
        store.check_invariants().unwrap();
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
                    .check_invariants()
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

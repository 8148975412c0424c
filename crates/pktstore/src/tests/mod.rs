//! Tests of the store: behaviour against a model, the receive path, crashes at every point
//! (SimRegion's crash model), corruption, reclamation under load, bad input.
//!
//! Randomised tests print their seed; `PMNET_SEED=N` replays one, `PMNET_SEEDS=K` runs more.
//!
//! By topic: `model.rs` every request kind against the model, the receive path, bad input and
//! the fences of a commit; `corruption.rs` damaged regions and records; `crash.rs` crashes at
//! any point and reclamation under load; `sessions.rs` the session table; `full.rs` a full
//! store. This file holds what they share: seeds, the crash-tapping region, the model, and
//! staging requests as the runtime would.

mod copy;
mod corruption;
mod crash;
mod full;
mod grow;
mod model;
mod sessions;

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

//! Tests of [`KvStore`] against a model, under simulated crashes and corruption.
//!
//! Randomised tests print their seed; set `PMNET_SEED` to replay one.

use std::collections::{BTreeMap, HashMap};

use pmnet_pm::{MediumInfo, PmRegion, SimRegion};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::layout::{read_record, ReadOutcome, RecordKind};
use super::*;
use crate::codec::Request;

fn test_seed(test_name: &str) -> u64 {
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("PMNET_SEED must be a u64, got {text:?}")),
        Err(_) => rand::random::<u64>(),
    };
    eprintln!("{test_name}: PMNET_SEED={seed}");
    seed
}

/// A region small enough that a few dozen applies fill a half and compact.
fn small_region_len(max_sessions: u32) -> usize {
    let half = align_up(reserve_bytes(max_sessions) + MIN_DATA_BYTES, HALF_ALIGN);
    HALVES_OFFSET + 2 * half
}

fn set(key: &[u8], value: &[u8]) -> Vec<u8> {
    Request::Set { key, value }.to_bytes()
}
fn get(key: &[u8]) -> Vec<u8> {
    Request::Get { key }.to_bytes()
}
fn del(key: &[u8]) -> Vec<u8> {
    Request::Del { key }.to_bytes()
}
fn incr(key: &[u8], delta: i64) -> Vec<u8> {
    Request::Incr { key, delta }.to_bytes()
}
fn append(key: &[u8], value: &[u8]) -> Vec<u8> {
    Request::Append { key, value }.to_bytes()
}
fn reply(bytes: &[u8]) -> Reply {
    Reply::decode(bytes).expect("store replies decode")
}

impl<R: PmRegion> KvStore<R> {
    /// [`Application::apply`] of a request that must fit (every test but the full-store ones).
    fn apply_ok(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Vec<u8> {
        self.apply(session_id, seq, request)
            .unwrap_or_else(|NoSpace| panic!("session {session_id} seq {seq}: no space"))
    }
}

/// What the store must contain: applies the same semantics independently.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Model {
    max_sessions: usize,
    keys: BTreeMap<Vec<u8>, Vec<u8>>,
    /// session → (last_seq, last_reply, activity)
    sessions: HashMap<u64, (u32, Vec<u8>, u64)>,
    clock: u64,
}

impl Model {
    fn new(max_sessions: u32) -> Model {
        Model {
            max_sessions: max_sessions as usize,
            keys: BTreeMap::new(),
            sessions: HashMap::new(),
            clock: 0,
        }
    }

    fn apply(&mut self, session_id: u64, seq: u32, request: &[u8]) -> Vec<u8> {
        let reply = match Request::decode(request) {
            Err(error) => Reply::Error(format!("bad request: {error}")),
            Ok(Request::Set { key, value }) => {
                self.keys.insert(key.to_vec(), value.to_vec());
                Reply::Ok
            }
            Ok(Request::Get { key }) => match self.keys.get(key) {
                Some(value) => Reply::Value(value.clone()),
                None => Reply::NotFound,
            },
            Ok(Request::Del { key }) => Reply::Deleted(u32::from(self.keys.remove(key).is_some())),
            Ok(Request::Append { key, value }) => {
                let current = self.keys.get(key).cloned().unwrap_or_default();
                if current.len() + value.len() > crate::codec::MAX_VALUE_LEN {
                    Reply::Error("append would make the value longer than 1048576 bytes".to_owned())
                } else {
                    let mut new = current;
                    new.extend_from_slice(value);
                    self.keys.insert(key.to_vec(), new);
                    Reply::Ok
                }
            }
            Ok(Request::Incr { key, delta }) => {
                let current = match self.keys.get(key) {
                    None => Some(0),
                    Some(value) => std::str::from_utf8(value)
                        .ok()
                        .and_then(|text| text.parse::<i64>().ok())
                        .filter(|number| number.to_string().as_bytes() == value.as_slice()),
                };
                match current {
                    None => Reply::Error("value is not an integer".to_owned()),
                    Some(current) => match current.checked_add(delta) {
                        None => Reply::Error("increment or decrement would overflow".to_owned()),
                        Some(new) => {
                            self.keys.insert(key.to_vec(), new.to_string().into_bytes());
                            Reply::Integer(new)
                        }
                    },
                }
            }
        };
        let reply = reply.to_bytes();
        self.clock += 1;
        if !self.sessions.contains_key(&session_id) && self.sessions.len() == self.max_sessions {
            let oldest = *self
                .sessions
                .iter()
                .min_by_key(|(_, (_, _, activity))| *activity)
                .unwrap()
                .0;
            self.sessions.remove(&oldest);
        }
        self.sessions
            .insert(session_id, (seq, reply.clone(), self.clock));
        reply
    }

    fn session_records(&self) -> Vec<SessionRecord> {
        let mut records: Vec<SessionRecord> = self
            .sessions
            .iter()
            .map(|(session_id, (last_seq, last_reply, _))| SessionRecord {
                session_id: *session_id,
                last_seq: *last_seq,
                last_reply: last_reply.clone(),
            })
            .collect();
        records.sort_by_key(|record| record.session_id);
        records
    }

    fn matches<R: PmRegion>(&self, store: &KvStore<R>) -> bool {
        store.len() == self.keys.len()
            && self
                .keys
                .iter()
                .all(|(key, value)| store.get(key) == Some(value.as_slice()))
            && store.sessions() == self.session_records()
    }

    fn assert_matches<R: PmRegion>(&self, store: &KvStore<R>) {
        assert_eq!(store.len(), self.keys.len(), "key count");
        for (key, value) in &self.keys {
            assert_eq!(store.get(key), Some(value.as_slice()), "key {key:02x?}");
        }
        assert_eq!(store.sessions(), self.session_records());
    }
}

/// A random request over a small key space, sometimes malformed.
fn random_request(rng: &mut impl Rng) -> Vec<u8> {
    let key = format!("key{}", rng.random_range(0..12u8)).into_bytes();
    match rng.random_range(0..100u8) {
        0..=39 => {
            let len = rng.random_range(0..48usize);
            let value: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            set(&key, &value)
        }
        40..=59 => get(&key),
        60..=69 => del(&key),
        70..=74 => {
            let len = rng.random_range(0..16usize);
            let value: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            append(&key, &value)
        }
        75..=94 => incr(&key, rng.random_range(-5..=5i64)),
        95..=97 => incr(
            &key,
            if rng.random_bool(0.5) {
                i64::MAX
            } else {
                i64::MIN
            },
        ),
        _ => {
            let len = rng.random_range(0..8usize);
            (0..len).map(|_| rng.random()).collect()
        }
    }
}

/// Drives sessions with strictly increasing seqs (never reset, so gaps appear after crashes).
struct Workload {
    rng: ChaCha8Rng,
    session_count: u64,
    next_seq: HashMap<u64, u32>,
}

impl Workload {
    fn new(seed: u64, session_count: u64) -> Workload {
        Workload {
            rng: ChaCha8Rng::seed_from_u64(seed),
            session_count,
            next_seq: HashMap::new(),
        }
    }

    fn next(&mut self) -> (u64, u32, Vec<u8>) {
        let session_id = 1000 + self.rng.random_range(0..self.session_count);
        let seq = self.next_seq.entry(session_id).or_insert(1);
        let this_seq = *seq;
        *seq += self.rng.random_range(1..=2);
        (session_id, this_seq, random_request(&mut self.rng))
    }
}

/// A region that, at random operations, records what a crash there would leave.
struct CrashingRegion {
    inner: SimRegion,
    rng: ChaCha8Rng,
    crash_probability: f64,
    /// Applies completed when each image was taken, and the image.
    images: Vec<(usize, SimRegion)>,
    applies_completed: usize,
}

impl CrashingRegion {
    fn new(inner: SimRegion, seed: u64, crash_probability: f64) -> CrashingRegion {
        CrashingRegion {
            inner,
            rng: ChaCha8Rng::seed_from_u64(seed),
            crash_probability,
            images: Vec::new(),
            applies_completed: 0,
        }
    }

    fn maybe_crash(&mut self) {
        if self.crash_probability > 0.0 && self.rng.random_bool(self.crash_probability) {
            let image = if self.rng.random_bool(0.2) {
                self.inner.crash_losing_unpersisted()
            } else {
                self.inner.crash(&mut self.rng)
            };
            self.images.push((self.applies_completed, image));
        }
    }
}

impl PmRegion for CrashingRegion {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        self.maybe_crash();
        self.inner.write(offset, data);
    }
    fn flush(&mut self, offset: usize, len: usize) {
        self.maybe_crash();
        self.inner.flush(offset, len);
    }
    fn fence(&mut self) {
        self.maybe_crash();
        self.inner.fence();
    }
    fn medium(&self) -> MediumInfo {
        self.inner.medium()
    }
}

#[test]
fn basic_operations_and_reopen() {
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig::default()).unwrap();
    assert!(store.is_empty());
    assert_eq!(reply(&store.apply_ok(1, 1, &set(b"a", b"1"))), Reply::Ok);
    assert_eq!(
        reply(&store.apply_ok(1, 2, &get(b"a"))),
        Reply::Value(b"1".to_vec())
    );
    assert_eq!(reply(&store.apply_ok(1, 3, &get(b"b"))), Reply::NotFound);
    assert_eq!(
        reply(&store.apply_ok(2, 7, &incr(b"a", 41))),
        Reply::Integer(42)
    );
    assert_eq!(
        reply(&store.apply_ok(2, 8, &incr(b"n", -3))),
        Reply::Integer(-3)
    );
    assert_eq!(reply(&store.apply_ok(2, 9, &del(b"n"))), Reply::Deleted(1));
    assert_eq!(reply(&store.apply_ok(2, 10, &del(b"n"))), Reply::Deleted(0));
    assert_eq!(store.get(b"a"), Some(&b"42"[..]));
    assert_eq!(store.len(), 1);
    assert_eq!(store.stats().records_appended, 7);
    assert!(store.medium().is_some());

    let sessions = store.sessions();
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert_eq!(store.sessions(), sessions);
    assert_eq!(sessions[0].last_seq, 3);
    assert_eq!(
        sessions[1],
        SessionRecord {
            session_id: 2,
            last_seq: 10,
            last_reply: vec![4, 0, 0, 0, 0]
        }
    );
    assert_eq!(store.get(b"a"), Some(&b"42"[..]));
    assert_eq!(store.len(), 1);
    assert_eq!(store.stats().recovered_records, 7);
    assert_eq!(store.recovery().log_records, 7);
    assert_eq!(store.recovery().rejected, None);
}

#[test]
fn incr_accepts_only_canonical_integers() {
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig::default()).unwrap();
    let not_integer = Reply::Error("value is not an integer".to_owned());
    for (seq, value) in [
        &b"007"[..],
        b"+5",
        b" 5",
        b"5 ",
        b"",
        b"x",
        b"-0",
        b"99999999999999999999",
    ]
    .iter()
    .enumerate()
    {
        let seq = 2 * seq as u32 + 1;
        store.apply_ok(1, seq, &set(b"k", value));
        assert_eq!(
            reply(&store.apply_ok(1, seq + 1, &incr(b"k", 1))),
            not_integer,
            "{value:?}"
        );
    }
    store.apply_ok(1, 100, &set(b"k", i64::MAX.to_string().as_bytes()));
    assert_eq!(
        reply(&store.apply_ok(1, 101, &incr(b"k", 1))),
        Reply::Error("increment or decrement would overflow".to_owned())
    );
    assert_eq!(store.get(b"k"), Some(i64::MAX.to_string().as_bytes()));
    store.apply_ok(1, 102, &set(b"k", b"-10"));
    assert_eq!(
        reply(&store.apply_ok(1, 103, &incr(b"k", 3))),
        Reply::Integer(-7)
    );
}

#[test]
fn append_builds_a_history_and_survives_reopen() {
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig::default()).unwrap();
    assert_eq!(
        reply(&store.apply_ok(1, 1, &append(b"h", b"1,"))),
        Reply::Ok
    );
    assert_eq!(reply(&store.apply_ok(1, 2, &append(b"h", b""))), Reply::Ok);
    assert_eq!(
        reply(&store.apply_ok(1, 3, &append(b"h", b"2,"))),
        Reply::Ok
    );
    assert_eq!(
        reply(&store.apply_ok(1, 4, &get(b"h"))),
        Reply::Value(b"1,2,".to_vec())
    );
    // APPEND to a SET value, and after a DEL starts from empty.
    store.apply_ok(2, 1, &set(b"x", b"ab"));
    store.apply_ok(2, 2, &append(b"x", b"cd"));
    assert_eq!(store.get(b"x"), Some(&b"abcd"[..]));
    store.apply_ok(2, 3, &del(b"x"));
    store.apply_ok(2, 4, &append(b"x", b"z"));
    assert_eq!(store.get(b"x"), Some(&b"z"[..]));
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert_eq!(store.get(b"h"), Some(&b"1,2,"[..]));
    assert_eq!(store.get(b"x"), Some(&b"z"[..]));
    assert_eq!(store.sessions()[0].last_seq, 4);
    assert_eq!(
        store.sessions()[0].last_reply,
        Reply::Value(b"1,2,".to_vec()).to_bytes()
    );
}

#[test]
fn append_past_the_value_limit_is_refused_and_changes_nothing() {
    let max = crate::codec::MAX_VALUE_LEN;
    let mut store = KvStore::format(SimRegion::new(8 << 20), KvConfig::default()).unwrap();
    let big = vec![7u8; max - 1];
    assert_eq!(reply(&store.apply_ok(1, 1, &set(b"k", &big))), Reply::Ok);
    assert_eq!(
        reply(&store.apply_ok(1, 2, &append(b"k", b"xy"))),
        Reply::Error("append would make the value longer than 1048576 bytes".to_owned())
    );
    assert_eq!(store.get(b"k").map(<[u8]>::len), Some(max - 1));
    assert_eq!(reply(&store.apply_ok(1, 3, &append(b"k", b"x"))), Reply::Ok);
    assert_eq!(store.get(b"k").map(<[u8]>::len), Some(max));
    assert_eq!(store.sessions()[0].last_seq, 3);
}

#[test]
fn bad_request_is_recorded_with_its_seq() {
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig::default()).unwrap();
    let bytes = store.apply_ok(5, 1, &[0x09]);
    assert_eq!(
        reply(&bytes),
        Reply::Error("bad request: unknown op 9".to_owned())
    );
    let bytes = store.apply_ok(5, 2, &[]);
    assert_eq!(
        reply(&bytes),
        Reply::Error("bad request: empty message".to_owned())
    );
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert_eq!(
        store.sessions(),
        vec![SessionRecord {
            session_id: 5,
            last_seq: 2,
            last_reply: bytes
        }]
    );
}

#[test]
fn a_stale_request_applies_nothing() {
    // A server whose table forgot a session the store still records may stage an old
    // number again (the no-op fill of one its client gave up on): refused, nothing applied,
    // the record unchanged, across a restart too.
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig::default()).unwrap();
    let reply = store.apply_ok(1, 3, &set(b"k", b"v3"));
    for (seq, request) in [
        (3, set(b"k", b"old")),
        (2, Vec::new()),
        (1, set(b"x", b"1")),
    ] {
        assert_eq!(store.apply_ok(1, seq, &request), crate::stale_reply(seq, 3));
    }
    assert_eq!(store.get(b"k"), Some(&b"v3"[..]));
    assert_eq!(store.get(b"x"), None);
    assert_eq!(store.stats().stale_requests, 3);
    let store = KvStore::open(store.into_region()).unwrap();
    assert_eq!(
        store.sessions(),
        vec![SessionRecord {
            session_id: 1,
            last_seq: 3,
            last_reply: reply
        }]
    );
}

#[test]
fn format_and_open_errors() {
    assert_eq!(
        KvStore::format(SimRegion::new(1 << 20), KvConfig { max_sessions: 0 }).unwrap_err(),
        StoreError::InvalidConfig("max_sessions must be at least 1")
    );
    let error = KvStore::format(SimRegion::new(8192), KvConfig::default()).unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::RegionTooSmall {
                len_bytes: 8192,
                ..
            }
        ),
        "{error}"
    );
    let min_len = small_region_len(4);
    assert!(KvStore::format(SimRegion::new(min_len), KvConfig { max_sessions: 4 }).is_ok());
    assert!(KvStore::format(SimRegion::new(min_len - 1), KvConfig { max_sessions: 4 }).is_err());

    assert_eq!(
        KvStore::open(SimRegion::new(1 << 16)).unwrap_err(),
        StoreError::NotAStore
    );
    assert_eq!(
        KvStore::open(SimRegion::new(100)).unwrap_err(),
        StoreError::NotAStore
    );

    let store = KvStore::format(SimRegion::new(1 << 20), KvConfig::default()).unwrap();
    let region = store.into_region();

    let mut wrong_version = region.clone();
    wrong_version.write(8, &2u32.to_le_bytes());
    assert_eq!(
        KvStore::open(wrong_version).unwrap_err(),
        StoreError::WrongVersion {
            found: 2,
            supported: 1
        }
    );

    let mut damaged = region.clone();
    damaged.flip_bit(20, 3);
    assert_eq!(
        KvStore::open(damaged).unwrap_err(),
        StoreError::CorruptSuperblock
    );

    let mut larger = SimRegion::new(region.len() + 4096);
    larger.write(0, region.bytes());
    assert_eq!(
        KvStore::open(larger).unwrap_err(),
        StoreError::RegionLenMismatch {
            recorded_len_bytes: region.len() as u64,
            region_len_bytes: region.len() as u64 + 4096
        }
    );
    assert!(KvStore::open(region).is_ok());
}

#[test]
fn reformat_does_not_resurrect_old_records() {
    let mut store = KvStore::format(
        SimRegion::new(small_region_len(4)),
        KvConfig { max_sessions: 4 },
    )
    .unwrap();
    for seq in 1..200 {
        store.apply_ok(1, seq, &set(format!("k{}", seq % 7).as_bytes(), b"value"));
    }
    assert!(store.stats().compactions > 0);
    let store = KvStore::format(store.into_region(), KvConfig { max_sessions: 4 }).unwrap();
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert!(store.is_empty());
    assert!(store.sessions().is_empty());
}

#[test]
fn compaction_preserves_state() {
    let max_sessions = 4;
    let mut store = KvStore::format(
        SimRegion::new(small_region_len(max_sessions)),
        KvConfig { max_sessions },
    )
    .unwrap();
    let mut model = Model::new(max_sessions);
    let mut workload = Workload::new(7, 3);
    for _ in 0..2000 {
        let (session_id, seq, request) = workload.next();
        assert_eq!(
            store.apply_ok(session_id, seq, &request),
            model.apply(session_id, seq, &request)
        );
    }
    assert!(store.stats().compactions > 10, "{:?}", store.stats());
    assert_eq!(store.stats().store_full_replies, 0);
    model.assert_matches(&store);
    let generation = store.superblock.generation;
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert_eq!(store.recovery().generation, generation);
    model.assert_matches(&store);
}

#[test]
fn session_table_evicts_least_recently_active() {
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig { max_sessions: 2 }).unwrap();
    store.apply_ok(1, 1, &get(b"k"));
    store.apply_ok(2, 1, &get(b"k"));
    store.apply_ok(1, 2, &get(b"k"));
    store.apply_ok(3, 1, &get(b"k")); // evicts 2, the least recently active
    assert_eq!(store.stats().evicted_sessions, 1);
    let ids: Vec<u64> = store.sessions().iter().map(|s| s.session_id).collect();
    assert_eq!(ids, vec![1, 3]);
    // An evicted session is unknown: any seq is accepted for it.
    store.apply_ok(2, 1, &get(b"k")); // evicts 1
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    let ids: Vec<u64> = store.sessions().iter().map(|s| s.session_id).collect();
    assert_eq!(ids, vec![2, 3]);
}

/// Fill a store with SETs of new keys (session 1, from `seq` on) until one is refused; returns
/// the refused SET's seq and the keys stored.
fn fill<R: PmRegion>(store: &mut KvStore<R>, seq: &mut u32, value: &[u8]) -> usize {
    let mut stored = 0;
    loop {
        *seq += 1;
        match store.apply(1, *seq, &set(format!("k{seq}").as_bytes(), value)) {
            Ok(bytes) => {
                assert_eq!(reply(&bytes), Reply::Ok);
                stored += 1;
            }
            Err(NoSpace) => return stored,
        }
        assert!(*seq < 10_000, "the store never filled");
    }
}

#[test]
fn store_full_refuses_updates_and_makes_nothing_durable() {
    let max_sessions = 2;
    let region = SimRegion::new(small_region_len(max_sessions));
    let mut store = KvStore::format(region, KvConfig { max_sessions }).unwrap();
    let capacity = store.capacity_bytes();
    let value = vec![7u8; 1000];
    let mut seq = 0;
    // Large values, then empty ones into what is left: full to the last record.
    let mut stored = fill(&mut store, &mut seq, &value);
    stored += fill(&mut store, &mut seq, &[]);
    let refused = seq;
    assert!(stored > 0);
    assert!(store.used_bytes() <= capacity);
    assert_eq!(store.stats().no_space, 2);
    assert_eq!(store.stats().store_full_replies, 0);
    assert_eq!(store.len(), stored);
    // The refused SET left its session at the seq before it, and nothing in the store.
    let sessions = store.sessions();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].last_seq, refused - 1);
    assert_eq!(reply(&sessions[0].last_reply), Reply::Ok);
    assert_eq!(store.get(format!("k{refused}").as_bytes()), None);
    // Updates of other sessions, new and old, are refused the same way and leave no trace:
    // no session record, no eviction (two slots, one taken by session 1).
    for session_id in [2, 3, 4] {
        let refusal = store.apply(session_id, 1, &set(b"another", &value));
        assert_eq!(refusal, Err(NoSpace));
        let refusal = store.apply(session_id, 2, &incr(b"a number", 1));
        assert_eq!(refusal, Err(NoSpace));
        let refusal = store.apply(session_id, 3, &append(b"k1", &[b'x'; 64]));
        assert_eq!(refusal, Err(NoSpace));
    }
    assert_eq!(store.sessions(), sessions);
    assert_eq!(store.stats().evicted_sessions, 0);
    // Asked again, with the same seq, the same answer.
    assert_eq!(
        store.apply(1, refused, &set(format!("k{refused}").as_bytes(), &[])),
        Err(NoSpace)
    );
    // A GET whose reply would not fit is answered with an error (it changes nothing a device
    // acknowledged), and a small one is fine.
    seq += 1;
    assert!(matches!(
        reply(&store.apply_ok(1, seq, &get(b"k1"))),
        Reply::Error(message) if message.starts_with("store full")
    ));
    assert_eq!(store.stats().store_full_replies, 1);
    seq += 1;
    assert_eq!(
        reply(&store.apply_ok(1, seq, &get(b"missing"))),
        Reply::NotFound
    );
    let sessions = store.sessions();

    // Nothing of the refusals survives a crash either.
    let mut store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert_eq!(store.sessions(), sessions);
    assert_eq!(store.len(), stored);
    assert_eq!(store.get(format!("k{refused}").as_bytes()), None);
    assert_eq!(store.get(b"another"), None);
    assert_eq!(store.get(b"a number"), None);
    // Still full after the restart; a DEL runs, and then the SET refused before fits.
    assert_eq!(store.apply(3, 9, &set(b"another", &value)), Err(NoSpace));
    seq += 1;
    assert_eq!(
        reply(&store.apply_ok(1, seq, &del(b"k1"))),
        Reply::Deleted(1)
    );
    seq += 1;
    assert_eq!(
        reply(&store.apply_ok(1, seq, &set(b"k1", &value))),
        Reply::Ok
    );
}

#[test]
fn deletes_run_in_a_full_store_until_it_is_empty() {
    for max_sessions in [1, 4] {
        let region = SimRegion::new(small_region_len(max_sessions));
        let mut store = KvStore::format(region, KvConfig { max_sessions }).unwrap();
        // Fill with values of mixed sizes, small ones last, so the store is as full as it gets.
        let mut seq = 0;
        let mut stored = fill(&mut store, &mut seq, &[1u8; 700]);
        stored += fill(&mut store, &mut seq, &[2u8; 60]);
        stored += fill(&mut store, &mut seq, &[]);
        let keys: Vec<Vec<u8>> = store.state.keys.keys().cloned().collect();
        assert_eq!(keys.len(), stored);
        // Every session slot in use with a long reply: the least room a DEL may find.
        for session_id in 2..=u64::from(max_sessions) {
            let _ = store.apply(session_id, 1, &get(&keys[0]));
        }
        for (index, key) in keys.iter().enumerate() {
            seq += 1;
            let bytes = store.apply(1, seq, &del(key)).expect("a DEL always fits");
            assert_eq!(reply(&bytes), Reply::Deleted(1));
            if index % 7 == 0 {
                store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
            }
        }
        assert!(store.is_empty());
        assert_eq!(store.used_bytes(), store.state.session_excess_bytes as u64);
    }
}

/// A refused request changes nothing: refusing it any number of times, then applying it once
/// room was made, leaves the store as applying it only then would.
#[test]
fn refusals_then_success_equal_success_alone() {
    let seed = test_seed("refusals_then_success_equal_success_alone");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_sessions = 3;
    for _ in 0..20 {
        let mut retried = KvStore::format(
            SimRegion::new(small_region_len(max_sessions)),
            KvConfig { max_sessions },
        )
        .unwrap();
        let mut direct = KvStore::format(
            SimRegion::new(small_region_len(max_sessions)),
            KvConfig { max_sessions },
        )
        .unwrap();
        let mut next_seq: HashMap<u64, u32> = HashMap::new();
        // Each session's refused request, retried before anything else of that session.
        let mut waiting: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut refusals = 0;
        for _ in 0..400 {
            let session_id = rng.random_range(1..=4u64);
            let seq = *next_seq.entry(session_id).or_insert(1);
            let request = match waiting.get(&session_id) {
                Some(request) => request.clone(),
                None => {
                    let key = format!("k{}", rng.random_range(0..40u8)).into_bytes();
                    match rng.random_range(0..10u8) {
                        0..=5 => set(&key, &vec![b'v'; rng.random_range(0..900)]),
                        6 => append(&key, &vec![b'a'; rng.random_range(0..200)]),
                        7 => incr(&key, 1),
                        8 => get(&key),
                        _ => del(&key),
                    }
                }
            };
            match retried.apply(session_id, seq, &request) {
                Ok(bytes) => {
                    // The store that never saw the refusals gets the request only now.
                    assert_eq!(direct.apply(session_id, seq, &request), Ok(bytes));
                    waiting.remove(&session_id);
                    *next_seq.get_mut(&session_id).unwrap() += 1;
                }
                Err(NoSpace) => {
                    refusals += 1;
                    waiting.insert(session_id, request);
                }
            }
            assert_eq!(retried.sessions(), direct.sessions());
            assert_eq!(retried.state.keys, direct.state.keys);
            if rng.random_bool(0.05) {
                retried = KvStore::open(retried.into_region().crash_losing_unpersisted()).unwrap();
            }
        }
        assert!(refusals > 0, "the workload never filled the store");
        let retried = KvStore::open(retried.into_region().crash_losing_unpersisted()).unwrap();
        assert_eq!(retried.sessions(), direct.sessions());
        assert_eq!(retried.state.keys, direct.state.keys);
    }
}

/// Offsets (from the region start) of the APPLY records in the active half.
fn apply_record_offsets<R: PmRegion>(store: &KvStore<R>) -> Vec<(usize, usize)> {
    let half_offset = store.half_offset(store.superblock.active_half());
    let half = &store.region().bytes()[half_offset..half_offset + store.half_len_bytes];
    let mut crc = chain_seed(store.superblock.store_id, store.superblock.generation);
    let mut position = 0;
    let mut offsets = Vec::new();
    while let ReadOutcome::Record {
        record: Ok(record),
        crc: next_crc,
        next_position,
    } = read_record(half, position, crc)
    {
        if record.kind == RecordKind::Apply {
            let len = layout::RECORD_HEADER_SIZE
                + record.key.len()
                + record.value.len()
                + record.reply.len();
            offsets.push((half_offset + position, len));
        }
        crc = next_crc;
        position = next_position;
    }
    offsets
}

#[test]
fn bit_flip_in_log_record_is_rejected_and_reported() {
    let seed = test_seed("bit_flip_in_log_record_is_rejected_and_reported");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..50 {
        let mut store =
            KvStore::format(SimRegion::new(1 << 20), KvConfig { max_sessions: 8 }).unwrap();
        let mut models = vec![Model::new(8)];
        let mut workload = Workload::new(rng.random(), 4);
        let count = rng.random_range(1..40);
        for _ in 0..count {
            let (session_id, seq, request) = workload.next();
            let mut model = models.last().unwrap().clone();
            model.apply(session_id, seq, &request);
            store.apply_ok(session_id, seq, &request);
            models.push(model);
        }
        let offsets = apply_record_offsets(&store);
        assert_eq!(offsets.len(), count);
        let victim = rng.random_range(0..count);
        let (offset, len) = offsets[victim];
        let byte = rng.random_range(0..len);
        let mut region = store.into_region().crash_losing_unpersisted();
        region.flip_bit(offset + byte, rng.random_range(0..8));

        let mut store = KvStore::open(region).unwrap();
        models[victim].assert_matches(&store);
        let rejected = store
            .recovery()
            .rejected
            .expect("the flipped record is rejected");
        assert_eq!(rejected.offset_bytes, offset as u64);
        let is_last = victim == count - 1;
        if is_last {
            assert!(!rejected.valid_record_follows);
        } else if byte >= 4 {
            // The length is intact, so the next record is found and verifies: corruption.
            assert!(rejected.valid_record_follows);
            assert_eq!(rejected.reason, RejectReason::ChecksumMismatch);
        }
        assert_eq!(store.stats().rejected_tail_records, 1);
        assert_eq!(store.recovery().log_records, victim as u64);
        assert!(store.recovery().scrubbed_bytes > 0);

        // The store carries on from the surviving prefix, and reopens cleanly.
        let mut model = models[victim].clone();
        for _ in 0..10 {
            let (session_id, seq, request) = workload.next();
            assert_eq!(
                store.apply_ok(session_id, seq, &request),
                model.apply(session_id, seq, &request)
            );
        }
        let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
        assert_eq!(store.recovery().rejected, None);
        model.assert_matches(&store);
    }
}

#[test]
fn bit_flip_in_snapshot_fails_open() {
    let max_sessions = 4;
    let mut store = KvStore::format(
        SimRegion::new(small_region_len(max_sessions)),
        KvConfig { max_sessions },
    )
    .unwrap();
    let mut seq = 0;
    while store.stats().compactions == 0 {
        seq += 1;
        store.apply_ok(
            1,
            seq,
            &set(format!("k{}", seq % 5).as_bytes(), b"some value"),
        );
    }
    let half_offset = store.half_offset(store.superblock.active_half());
    let mut region = store.into_region().crash_losing_unpersisted();
    // Byte 70 is inside the first KEY record, right after the 64-byte snapshot header.
    region.flip_bit(half_offset + 70, 0);
    let error = KvStore::open(region).unwrap_err();
    assert_eq!(
        error,
        StoreError::Corrupt {
            offset_bytes: (half_offset + 64) as u64,
            reason: "snapshot record damaged"
        }
    );
}

#[test]
fn damaged_newest_superblock_is_repaired_from_its_snapshot() {
    let max_sessions = 4;
    let mut store = KvStore::format(
        SimRegion::new(small_region_len(max_sessions)),
        KvConfig { max_sessions },
    )
    .unwrap();
    let mut model = Model::new(max_sessions);
    let mut workload = Workload::new(11, 3);
    while store.stats().compactions < 3 {
        let (session_id, seq, request) = workload.next();
        store.apply_ok(session_id, seq, &request);
        model.apply(session_id, seq, &request);
    }
    let generation = store.superblock.generation;
    let newest_slot = store.superblock.active_half();

    // Damage the newest copy: open adopts its generation from the complete snapshot.
    let mut region = store.into_region().crash_losing_unpersisted();
    region.flip_bit(newest_slot * SUPERBLOCK_SIZE + 17, 5);
    let store = KvStore::open(region).unwrap();
    assert!(store.recovery().superblock_repaired);
    assert_eq!(store.recovery().generation, generation);
    model.assert_matches(&store);
    let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    assert!(!store.recovery().superblock_repaired);
    model.assert_matches(&store);

    // Damage the older copy: ignored.
    let mut region = store.into_region();
    region.flip_bit((1 - newest_slot) * SUPERBLOCK_SIZE + 17, 5);
    let store = KvStore::open(region).unwrap();
    assert!(!store.recovery().superblock_repaired);
    assert_eq!(store.recovery().generation, generation);
    model.assert_matches(&store);
}

/// Crash at random write/flush/fence points during a workload with frequent compactions; every
/// crash image must reopen to a prefix of the applied requests that includes every request
/// whose apply returned, and the reopened store must carry on correctly.
#[test]
fn crash_at_random_points_recovers_an_acknowledged_prefix() {
    let seed = test_seed("crash_at_random_points_recovers_an_acknowledged_prefix");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_sessions = 4;
    let mut images_checked = 0;
    let mut torn_tails = 0;
    let mut repaired = 0;
    for _ in 0..8 {
        let region = CrashingRegion::new(
            SimRegion::new(small_region_len(max_sessions)),
            rng.random(),
            0.0,
        );
        let mut store = KvStore::format(region, KvConfig { max_sessions }).unwrap();
        store.region.crash_probability = 0.01;
        // Six sessions over a table of four: evictions happen too.
        let mut workload = Workload::new(rng.random(), 6);
        let mut models = vec![Model::new(max_sessions)];
        for _ in 0..1000 {
            let (session_id, seq, request) = workload.next();
            let mut model = models.last().unwrap().clone();
            let expected = model.apply(session_id, seq, &request);
            assert_eq!(store.apply_ok(session_id, seq, &request), expected);
            models.push(model);
            store.region.applies_completed += 1;
        }
        assert!(store.stats().compactions > 5, "{:?}", store.stats());
        let images = std::mem::take(&mut store.region.images);
        for (completed, image) in images {
            let mut recovered = KvStore::open(image).unwrap();
            // Acknowledged ⇒ present: the prefix is everything completed, or that plus the
            // request in flight at the crash.
            let prefix = if models[completed].matches(&recovered) {
                completed
            } else {
                assert!(
                    completed + 1 < models.len(),
                    "state matches no acknowledged prefix"
                );
                models[completed + 1].assert_matches(&recovered);
                completed + 1
            };
            if let Some(rejected) = recovered.recovery().rejected {
                assert!(
                    !rejected.valid_record_follows,
                    "a crash cannot look like corruption"
                );
                torn_tails += 1;
            }
            repaired += u64::from(recovered.recovery().superblock_repaired);
            images_checked += 1;

            // Carry on from the recovered state through another compaction, then reopen.
            let mut model = models[prefix].clone();
            let mut carry_on = Workload::new(rng.random(), 6);
            carry_on.next_seq = workload.next_seq.clone();
            for _ in 0..100 {
                let (session_id, seq, request) = carry_on.next();
                assert_eq!(
                    recovered.apply_ok(session_id, seq, &request),
                    model.apply(session_id, seq, &request)
                );
            }
            let reopened =
                KvStore::open(recovered.into_region().crash_losing_unpersisted()).unwrap();
            assert_eq!(reopened.recovery().rejected, None);
            model.assert_matches(&reopened);
        }
    }
    eprintln!("checked {images_checked} crash images: {torn_tails} torn tails, {repaired} superblock repairs");
    assert!(images_checked > 50);
}

/// Crash between applies, many times in a row, on one store.
#[test]
fn repeated_crashes_between_applies() {
    let seed = test_seed("repeated_crashes_between_applies");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_sessions = 4;
    let mut store = KvStore::format(
        SimRegion::new(small_region_len(max_sessions)),
        KvConfig { max_sessions },
    )
    .unwrap();
    let mut model = Model::new(max_sessions);
    let mut workload = Workload::new(rng.random(), 5);
    for _ in 0..100 {
        for _ in 0..rng.random_range(0..30) {
            let (session_id, seq, request) = workload.next();
            assert_eq!(
                store.apply_ok(session_id, seq, &request),
                model.apply(session_id, seq, &request)
            );
        }
        // Every apply returned, so everything is durable: the crash loses nothing.
        let image = if rng.random_bool(0.5) {
            store.region().crash(&mut rng)
        } else {
            store.region().crash_losing_unpersisted()
        };
        store = KvStore::open(image).unwrap();
        assert_eq!(store.recovery().rejected, None);
        model.assert_matches(&store);
    }
}

#[test]
fn mmap_region_round_trip() {
    use pmnet_pm::{MmapOptions, MmapRegion};
    let path = std::env::temp_dir().join(format!("pmnet-store-test-{}.pm", std::process::id()));
    let _ = std::fs::remove_file(&path);
    {
        let region = MmapRegion::create(&path, 1 << 20, MmapOptions::default()).unwrap();
        let mut store = KvStore::format(region, KvConfig::default()).unwrap();
        store.apply_ok(1, 1, &set(b"k", b"v"));
        store.apply_ok(1, 2, &incr(b"n", 5));
    }
    {
        let region = MmapRegion::open(&path, MmapOptions::default()).unwrap();
        let store = KvStore::open(region).unwrap();
        assert_eq!(store.get(b"k"), Some(&b"v"[..]));
        assert_eq!(store.get(b"n"), Some(&b"5"[..]));
        assert_eq!(store.sessions()[0].last_seq, 2);
        eprintln!("medium: {}", store.medium().unwrap());
    }
    std::fs::remove_file(&path).unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Set(u8, Vec<u8>),
    Get(u8),
    Del(u8),
    Incr(u8, i64),
    Append(u8, Vec<u8>),
    Garbage(Vec<u8>),
    Reopen,
}

fn op() -> impl Strategy<Value = (u64, Op)> {
    let key = 0u8..8;
    let op = prop_oneof![
        4 => (key.clone(), proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(k, v)| Op::Set(k, v)),
        2 => key.clone().prop_map(Op::Get),
        2 => key.clone().prop_map(Op::Del),
        3 => (key.clone(), -3i64..3).prop_map(|(k, d)| Op::Incr(k, d)),
        2 => (key, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(k, v)| Op::Append(k, v)),
        1 => proptest::collection::vec(any::<u8>(), 0..6).prop_map(Op::Garbage),
        1 => Just(Op::Reopen),
    ];
    (0u64..5, op)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The store against the model, on a small region (compactions, refusals and store-full
    /// replies to long GETs when values pile up, evictions with five sessions over three
    /// slots) with clean reopens.
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..300)) {
        let max_sessions = 3;
        let mut store = KvStore::format(SimRegion::new(small_region_len(max_sessions)), KvConfig { max_sessions }).unwrap();
        let mut model = Model::new(max_sessions);
        let mut next_seq: HashMap<u64, u32> = HashMap::new();
        for (session_id, op) in ops {
            let key = |k: u8| vec![b'k', k];
            let request = match op {
                Op::Set(k, value) => set(&key(k), &value),
                Op::Get(k) => get(&key(k)),
                Op::Del(k) => del(&key(k)),
                Op::Incr(k, delta) => incr(&key(k), delta),
                Op::Append(k, value) => append(&key(k), &value),
                Op::Garbage(bytes) => bytes,
                Op::Reopen => {
                    store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
                    model.assert_matches(&store);
                    continue;
                }
            };
            let seq = next_seq.entry(session_id).or_insert(1);
            *seq += 1;
            let Ok(actual) = store.apply(session_id, *seq, &request) else {
                // No room: nothing changed, in memory or on the medium.
                model.assert_matches(&store);
                continue;
            };
            if let Ok(Reply::Error(message)) = Reply::decode(&actual) {
                if message.starts_with("store full") {
                    // The model has no capacity; record the refusal as the store did.
                    model.clock += 1;
                    apply_refusal(&mut model, session_id, *seq, actual);
                    continue;
                }
            }
            prop_assert_eq!(actual, model.apply(session_id, *seq, &request));
        }
        prop_assert!(store.used_bytes() <= store.capacity_bytes());
        let store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
        model.assert_matches(&store);
    }
}

/// Record in the model a GET whose reply did not fit: no effect, the ERROR reply recorded.
fn apply_refusal(model: &mut Model, session_id: u64, seq: u32, reply: Vec<u8>) {
    if !model.sessions.contains_key(&session_id) && model.sessions.len() == model.max_sessions {
        let oldest = *model
            .sessions
            .iter()
            .min_by_key(|(_, (_, _, a))| *a)
            .unwrap()
            .0;
        model.sessions.remove(&oldest);
    }
    model.sessions.insert(session_id, (seq, reply, model.clock));
}

/// Crash at every write/flush/fence of applies that compact, including while the new
/// superblock copy is unfenced (kept old, taken new, or torn).
#[test]
fn crash_at_every_point_of_compaction() {
    let seed = test_seed("crash_at_every_point_of_compaction");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_sessions = 4;
    let region = CrashingRegion::new(SimRegion::new(small_region_len(max_sessions)), seed, 0.0);
    let mut store = KvStore::format(region, KvConfig { max_sessions }).unwrap();
    let mut workload = Workload::new(rng.random(), 6);
    let mut model = Model::new(max_sessions);
    let (mut images_checked, mut repaired, mut new_generation) = (0, 0, 0);
    while store.stats().compactions < 20 {
        let (session_id, seq, request) = workload.next();
        let before = model.clone();
        let compactions = store.stats().compactions;
        let generation = store.superblock.generation;
        store.region.crash_probability = 1.0;
        assert_eq!(
            store.apply_ok(session_id, seq, &request),
            model.apply(session_id, seq, &request)
        );
        store.region.crash_probability = 0.0;
        let images = std::mem::take(&mut store.region.images);
        if store.stats().compactions == compactions {
            continue;
        }
        for (_, image) in images {
            let recovered = KvStore::open(image).unwrap();
            if before.matches(&recovered) {
                assert_eq!(recovered.recovery().generation, generation);
            } else {
                model.assert_matches(&recovered);
                assert_eq!(recovered.recovery().generation, generation + 1);
                new_generation += 1;
            }
            repaired += u64::from(recovered.recovery().superblock_repaired);
            images_checked += 1;
        }
    }
    eprintln!("checked {images_checked} images: {new_generation} in the new generation, {repaired} repaired");
    assert!(repaired > 0);
    assert!(new_generation > repaired);
}

#[test]
fn a_session_is_evicted_only_with_the_servers_permit() {
    let mut store = KvStore::format(SimRegion::new(1 << 20), KvConfig { max_sessions: 2 }).unwrap();
    store.note_time(1_000);
    assert_eq!(store.eviction_candidate(3), None, "room");
    store.apply_ok(1, 1, &get(b"k"));
    store.note_time(1_100);
    store.apply_ok(2, 1, &get(b"k"));
    // Full: session 1 would go, applied at 1 000 ms. Without a permit a new session waits,
    // nothing evicted or written.
    store.note_time(1_500);
    assert_eq!(store.eviction_candidate(3), Some((1, 1_000)));
    assert_eq!(store.stage(3, 1, &get(b"k")), Err(NoSpace));
    store.permit_eviction(2);
    assert_eq!(
        store.stage(3, 1, &get(b"k")),
        Err(NoSpace),
        "not the one that would go"
    );
    assert_eq!(store.stats().sessions_full, 2);
    assert_eq!(store.stats().evicted_sessions, 0);
    store.permit_eviction(1);
    store.apply_ok(3, 1, &get(b"k"));
    assert_eq!(store.stats().evicted_sessions, 1);
    let ids: Vec<u64> = store.sessions().iter().map(|s| s.session_id).collect();
    assert_eq!(ids, vec![2, 3]);
    assert_eq!(
        store.stage(4, 1, &get(b"k")),
        Err(NoSpace),
        "a permit is used once"
    );
    // After a restart the recovered sessions count as applied when the server first tells
    // the time.
    let mut store = KvStore::open(store.into_region().crash_losing_unpersisted()).unwrap();
    store.note_time(50_000);
    assert_eq!(store.eviction_candidate(4), Some((2, 50_000)));
    assert_eq!(store.stage(4, 1, &get(b"k")), Err(NoSpace));
    store.permit_eviction(2);
    store.apply_ok(4, 1, &get(b"k"));
}

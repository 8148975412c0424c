//! Tests of the device log: layout, crash consistency, recovery, damage.

use std::collections::HashMap;

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::{test_seed, SimRegion};

const SLOT_COUNT: u32 = 8;
const SLOT_SIZE: u32 = 256;
/// Random crashes tried at each recorded point of an operation.
const CRASHES_PER_POINT: usize = 40;

type Contents = HashMap<u32, (EntryKey, Vec<u8>)>;

fn write_of(slot: u32, key: EntryKey, packet: Vec<u8>) -> LogWork {
    LogWork::Write {
        slot,
        key,
        return_address: None,
        packet: packet.into(),
    }
}

fn key(n: u32) -> EntryKey {
    EntryKey {
        server_id: (n % 3) as u16,
        session_id: 0x1_0000_0000 + u64::from(n),
        seq: n.wrapping_mul(7),
        fragment_index: (n % 2) as u16,
    }
}

fn packet(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt))
        .collect()
}

fn region_len() -> usize {
    PmLog::<SimRegion>::required_region_len(SLOT_COUNT, SLOT_SIZE)
}

fn new_log() -> PmLog<SimRegion> {
    PmLog::format(SimRegion::new(region_len()), SLOT_COUNT, SLOT_SIZE).unwrap()
}

fn contents(recovery: &LogRecovery) -> Contents {
    let mut map = Contents::new();
    for entry in &recovery.entries {
        let previous = map.insert(entry.slot, (entry.key, entry.packet.clone()));
        assert!(previous.is_none(), "slot {} recovered twice", entry.slot);
    }
    map
}

fn assert_sorted(recovery: &LogRecovery) {
    assert!(recovery
        .entries
        .windows(2)
        .all(|pair| (pair[0].key, pair[0].slot) < (pair[1].key, pair[1].slot)));
}

/// A simulated region that keeps a copy of itself after every operation, so a test can crash
/// "between any two instructions" of the code under test.
#[derive(Debug, Clone)]
struct Recorder {
    region: SimRegion,
    snapshots: Vec<SimRegion>,
}

impl Recorder {
    fn record(&mut self) {
        self.snapshots.push(self.region.clone());
    }

    /// Forget earlier points and record the present one: the state before the next operation.
    fn start(&mut self) {
        self.snapshots.clear();
        self.record();
    }
}

impl PmRegion for Recorder {
    fn len(&self) -> usize {
        self.region.len()
    }
    fn bytes(&self) -> &[u8] {
        self.region.bytes()
    }
    fn write(&mut self, offset: usize, data: &[u8]) {
        self.region.write(offset, data);
        self.record();
    }
    fn flush(&mut self, offset: usize, len: usize) {
        self.region.flush(offset, len);
        self.record();
    }
    fn fence(&mut self) {
        self.region.fence();
        self.record();
    }
    fn medium(&self) -> MediumInfo {
        self.region.medium()
    }
}

fn new_recorded_log() -> PmLog<Recorder> {
    let recorder = Recorder {
        region: SimRegion::new(region_len()),
        snapshots: Vec::new(),
    };
    PmLog::format(recorder, SLOT_COUNT, SLOT_SIZE).unwrap()
}

/// What recovery returns after crashes at every recorded point: the deterministic
/// lose-everything-unpersisted crash and `CRASHES_PER_POINT` random ones at each.
fn recoveries_after_crashes(snapshots: &[SimRegion], rng: &mut ChaCha8Rng) -> Vec<LogRecovery> {
    assert!(!snapshots.is_empty());
    let mut recoveries = Vec::new();
    for snapshot in snapshots {
        let mut crashed = vec![snapshot.crash_losing_unpersisted()];
        crashed.extend((0..CRASHES_PER_POINT).map(|_| snapshot.crash(rng)));
        for region in crashed {
            let (_, recovery) = PmLog::open(region).expect("the superblock is durable");
            assert_sorted(&recovery);
            recoveries.push(recovery);
        }
    }
    recoveries
}

#[test]
fn format_open_round_trip() {
    let mut log = new_log();
    assert_eq!(log.slot_count(), SLOT_COUNT);
    assert_eq!(log.slot_size(), SLOT_SIZE);
    assert_eq!(log.max_packet_len(), 192);
    assert_eq!(log.medium().medium, crate::Medium::Simulated);
    assert_eq!(log.slot_range(0), 4096..4352);
    assert_eq!(log.slot_range(7), 4096 + 7 * 256..4096 + 8 * 256);
    assert!(log.read(0).is_none());

    let empty = packet(0, 0);
    let full = packet(192, 1);
    log.write(0, &key(10), &empty);
    log.write(5, &key(11), &full);
    log.write(2, &key(12), &packet(70, 2));
    assert_eq!(log.read(5), Some((key(11), full.as_slice())));
    assert_eq!(log.read(0), Some((key(10), empty.as_slice())));
    assert!(log.region().is_durable(0, region_len()));

    let (log, recovery) = PmLog::open(log.into_region()).unwrap();
    assert_eq!(recovery.rejected_slot_count, 0);
    assert_eq!(recovery.entries.len(), 3);
    assert_sorted(&recovery);
    // Sorted by key: key(12) has server 0, key(10) server 1, key(11) server 2.
    let slots: Vec<u32> = recovery.entries.iter().map(|entry| entry.slot).collect();
    assert_eq!(slots, [2, 0, 5]);
    assert_eq!(
        recovery.entries[1],
        RecoveredEntry {
            slot: 0,
            key: key(10),
            return_address: None,
            packet: empty
        }
    );
    assert_eq!(log.read(2), Some((key(12), packet(70, 2).as_slice())));
    assert_eq!(contents(&recovery).len(), 3);
}

#[test]
fn write_and_invalidate_fence_counts() {
    let mut log = new_log();
    let fences = log.region().fence_count();
    log.write(1, &key(1), &packet(100, 1));
    assert_eq!(log.region().fence_count(), fences + 2);
    let batch = vec![
        write_of(2, key(2), vec![1, 2, 3]),
        write_of(3, key(3), vec![4; 150]),
        write_of(4, key(4), Vec::new()),
    ];
    let stats = log.persist_batch(&batch);
    assert_eq!(log.region().fence_count(), fences + 4);
    assert_eq!((stats.writes, stats.invalidations, stats.fences), (3, 0, 2));
    log.invalidate(1);
    assert_eq!(log.region().fence_count(), fences + 5);
    let frees: Vec<LogWork> = [2, 3, 4]
        .into_iter()
        .map(|slot| LogWork::Invalidate { slot })
        .collect();
    assert_eq!(log.persist_batch(&frees).fences, 1);
    assert_eq!(log.region().fence_count(), fences + 6);
    assert_eq!(log.persist_batch(&[]), BatchStats::default());
    log.invalidate_batch(&[]);
    assert_eq!(log.region().fence_count(), fences + 6);
    // Writes and invalidations of other slots share the pair of fences; a slot freed and
    // written again in the same batch costs one more, before its new entry is stored.
    let mixed = vec![
        write_of(5, key(5), vec![5]),
        LogWork::Invalidate { slot: 5 },
    ];
    assert_eq!(log.persist_batch(&mixed).fences, 2);
    let reuse = vec![
        LogWork::Invalidate { slot: 0 },
        write_of(0, key(6), vec![6]),
    ];
    log.write(0, &key(0), &packet(10, 0));
    assert_eq!(log.persist_batch(&reuse).fences, 3);
    assert_eq!(log.read(0), Some((key(6), &[6u8][..])));
    log.invalidate(0);
    log.invalidate(5);
    assert!((0..SLOT_COUNT).all(|slot| log.read(slot).is_none()));
    assert!(log.region().is_durable(0, region_len()));
}

#[test]
fn crash_during_write_never_yields_a_wrong_entry() {
    let seed = test_seed("crash_during_write_never_yields_a_wrong_entry");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = new_recorded_log();
    let a = (key(1), packet(150, 1));
    let b = (key(2), packet(192, 2));
    log.write(1, &a.0, &a.1);
    log.write(3, &b.0, &b.1);

    // A new entry into a free slot.
    let n = (key(3), packet(130, 3));
    log.region_mut().start();
    let fences_before = log.region().region.fence_count();
    log.write(0, &n.0, &n.1);
    let snapshots = std::mem::take(&mut log.region_mut().snapshots);
    for recovery in recoveries_after_crashes(&snapshots, &mut rng) {
        let found = contents(&recovery);
        assert_eq!(recovery.rejected_slot_count, 0, "seed {seed}");
        assert_eq!(found.get(&1), Some(&a), "seed {seed}");
        assert_eq!(found.get(&3), Some(&b), "seed {seed}");
        if let Some(entry) = found.get(&0) {
            assert_eq!(entry, &n, "seed {seed}: wrong entry recovered");
        }
        assert_eq!(found.len(), 2 + usize::from(found.contains_key(&0)));
    }
    // After the payload is persisted and before the state is: durable, and not an entry.
    let after_payload = snapshots
        .iter()
        .find(|s| s.fence_count() == fences_before + 1)
        .unwrap();
    let slot_range = log.slot_range(0);
    assert!(after_payload.is_durable(slot_range.start, slot_range.len()));
    let (_, recovery) = PmLog::open(after_payload.crash_losing_unpersisted()).unwrap();
    assert!(!contents(&recovery).contains_key(&0));
    // Once write returns, every crash keeps the entry.
    let last = snapshots.last().unwrap();
    assert!(last.is_durable(slot_range.start, slot_range.len()));
    for _ in 0..CRASHES_PER_POINT {
        let (_, recovery) = PmLog::open(last.crash(&mut rng)).unwrap();
        assert_eq!(contents(&recovery).get(&0), Some(&n), "seed {seed}");
    }

    // Overwriting a committed entry: old, new, or (torn) rejected and gone; never a mix.
    let c = (key(4), packet(40, 4));
    log.region_mut().start();
    log.write(3, &c.0, &c.1);
    let snapshots = std::mem::take(&mut log.region_mut().snapshots);
    let (mut old_seen, mut new_seen) = (false, false);
    for recovery in recoveries_after_crashes(&snapshots, &mut rng) {
        let found = contents(&recovery);
        assert!(recovery.rejected_slot_count <= 1, "seed {seed}");
        assert_eq!(found.get(&1), Some(&a), "seed {seed}");
        match found.get(&3) {
            None => {}
            Some(entry) if *entry == b => old_seen = true,
            Some(entry) if *entry == c => new_seen = true,
            Some(entry) => panic!("seed {seed}: wrong entry recovered: {entry:?}"),
        }
    }
    assert!(old_seen && new_seen, "seed {seed}");
}

#[test]
fn crash_during_batches_never_yields_a_wrong_entry() {
    let seed = test_seed("crash_during_batches_never_yields_a_wrong_entry");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = new_recorded_log();
    let written: Vec<(u32, EntryKey, Vec<u8>)> = vec![
        (0, key(20), packet(10, 20)),
        (2, key(21), packet(192, 21)),
        (5, key(22), packet(0, 22)),
    ];
    let batch: Vec<LogWork> = written
        .iter()
        .map(|(slot, key, packet)| write_of(*slot, *key, packet.clone()))
        .collect();
    log.region_mut().start();
    log.persist_batch(&batch);
    let snapshots = std::mem::take(&mut log.region_mut().snapshots);
    let mut partial_seen = false;
    for recovery in recoveries_after_crashes(&snapshots, &mut rng) {
        let found = contents(&recovery);
        assert_eq!(recovery.rejected_slot_count, 0, "seed {seed}");
        for (slot, entry) in &found {
            let expected = written.iter().find(|(s, _, _)| s == slot).unwrap();
            assert_eq!(entry, &(expected.1, expected.2.clone()), "seed {seed}");
        }
        partial_seen |= found.len() == 1 || found.len() == 2;
    }
    assert!(
        partial_seen,
        "seed {seed}: a batch is not atomic; some crash should show it"
    );
    let (_, recovery) = PmLog::open(snapshots.last().unwrap().crash(&mut rng)).unwrap();
    assert_eq!(recovery.entries.len(), 3);

    // Invalidating: each entry present and intact, or gone.
    log.region_mut().start();
    log.invalidate_batch(&[0, 5]);
    log.invalidate(2);
    let snapshots = std::mem::take(&mut log.region_mut().snapshots);
    for recovery in recoveries_after_crashes(&snapshots, &mut rng) {
        assert_eq!(recovery.rejected_slot_count, 0, "seed {seed}");
        for (slot, entry) in contents(&recovery) {
            let expected = written.iter().find(|(s, _, _)| *s == slot).unwrap();
            assert_eq!(entry, (expected.1, expected.2.clone()), "seed {seed}");
        }
    }
    let (_, recovery) = PmLog::open(snapshots.last().unwrap().crash(&mut rng)).unwrap();
    assert!(recovery.entries.is_empty());
}

#[test]
fn crash_during_a_batch_that_reuses_a_freed_slot_never_yields_a_torn_entry() {
    let seed = test_seed("crash_during_a_batch_that_reuses_a_freed_slot_never_yields_a_torn_entry");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = new_recorded_log();
    let old = (key(30), packet(180, 30));
    let kept = (key(31), packet(60, 31));
    log.write(4, &old.0, &old.1);
    log.write(6, &kept.0, &kept.1);
    // The device freed slot 4 (its server acked) and logs a new update into it, in one batch.
    let new = (key(32), packet(120, 32));
    log.region_mut().start();
    log.persist_batch(&[
        LogWork::Invalidate { slot: 4 },
        write_of(4, new.0, new.1.clone()),
    ]);
    let snapshots = std::mem::take(&mut log.region_mut().snapshots);
    let (mut old_seen, mut none_seen, mut new_seen) = (false, false, false);
    for recovery in recoveries_after_crashes(&snapshots, &mut rng) {
        let found = contents(&recovery);
        assert_eq!(recovery.rejected_slot_count, 0, "seed {seed}: a torn entry");
        assert_eq!(found.get(&6), Some(&kept), "seed {seed}");
        match found.get(&4) {
            None => none_seen = true,
            Some(entry) if *entry == old => old_seen = true,
            Some(entry) if *entry == new => new_seen = true,
            Some(entry) => panic!("seed {seed}: wrong entry recovered: {entry:?}"),
        }
    }
    assert!(old_seen && none_seen && new_seen, "seed {seed}");
}

#[test]
fn crash_during_format_never_leaves_a_partial_log() {
    let seed = test_seed("crash_during_format_never_leaves_a_partial_log");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = new_recorded_log();
    for slot in 0..SLOT_COUNT {
        log.write(slot, &key(slot), &packet(100, slot as u8));
    }
    let mut recorder = log.into_region();
    recorder.start();
    let log = PmLog::format(recorder, SLOT_COUNT, SLOT_SIZE).unwrap();
    let snapshots = &log.region().snapshots;
    for snapshot in snapshots {
        let mut crashed = vec![snapshot.crash_losing_unpersisted()];
        crashed.extend((0..CRASHES_PER_POINT).map(|_| snapshot.crash(&mut rng)));
        for region in crashed {
            match PmLog::open(region) {
                Ok((_, recovery)) => {
                    assert_eq!(recovery.rejected_slot_count, 0, "seed {seed}");
                    let count = recovery.entries.len();
                    assert!(count == 0 || count == SLOT_COUNT as usize, "seed {seed}");
                }
                Err(
                    LogError::Unformatted
                    | LogError::NotALog { .. }
                    | LogError::SuperblockCorrupt { .. },
                ) => {}
                Err(error) => panic!("seed {seed}: unexpected {error}"),
            }
        }
    }
}

#[test]
fn corruption_at_rest_is_rejected_and_counted() {
    let mut log = new_log();
    let entry = (key(5), packet(100, 5));
    log.write(4, &entry.0, &entry.1);
    log.write(6, &key(6), &packet(20, 6));
    let slot_start = log.slot_range(4).start;
    let region = log.into_region();

    // Every bit of the header and packet, including the state and the reserved bytes.
    for offset in slot_start..slot_start + SLOT_HEADER_SIZE + 100 {
        for bit in 0..8 {
            let mut corrupted = region.clone();
            corrupted.flip_bit(offset, bit);
            let (log, recovery) = PmLog::open(corrupted).unwrap();
            assert_eq!(
                recovery.rejected_slot_count,
                1,
                "byte {} bit {bit}",
                offset - slot_start
            );
            assert_eq!(recovery.entries.len(), 1);
            assert_eq!(recovery.entries[0].slot, 6);
            assert!(log.read(4).is_none());
            // The rejected slot was freed durably: a second recovery is clean.
            let region = log.into_region();
            assert!(region.is_durable(0, region.len()));
            let (_, recovery) = PmLog::open(region.crash_losing_unpersisted()).unwrap();
            assert_eq!(recovery.rejected_slot_count, 0);
            assert_eq!(recovery.entries.len(), 1);
        }
    }

    // Bytes past the packet are not part of the entry.
    let mut corrupted = region.clone();
    corrupted.flip_bit(slot_start + SLOT_HEADER_SIZE + 100, 0);
    let (_, recovery) = PmLog::open(corrupted).unwrap();
    assert_eq!(recovery.rejected_slot_count, 0);
    assert_eq!(contents(&recovery).get(&4), Some(&entry));

    // A FREE state with a flipped bit is neither FREE nor VALID: corrupt.
    let mut corrupted = region.clone();
    corrupted.flip_bit(PmLog::<SimRegion>::required_region_len(0, SLOT_SIZE), 3);
    let (_, recovery) = PmLog::open(corrupted).unwrap();
    assert_eq!(recovery.rejected_slot_count, 1);
    assert_eq!(recovery.entries.len(), 2);
}

#[test]
fn rejected_slots_say_what_they_held() {
    let mut log = new_log();
    log.write(4, &key(5), &packet(100, 5));
    log.write(6, &key(6), &packet(20, 6));
    let slot4 = log.slot_range(4).start;
    let slot6 = log.slot_range(6).start;
    let region = log.into_region();

    // A flipped packet bit: the checksum fails, the header's fields are unverified.
    let mut corrupted = region.clone();
    corrupted.flip_bit(slot4 + SLOT_HEADER_SIZE + 10, 1);
    // A damaged state word over an intact header and packet: the fields are the entry's.
    corrupted.write(slot6 + HEADER_STATE, &0x1234_5678u32.to_le_bytes());
    let (_, recovery) = PmLog::open(corrupted).unwrap();
    assert_eq!(recovery.rejected_slot_count, 2);
    assert_eq!(
        recovery.rejected_slots,
        [
            RejectedSlot {
                slot: 4,
                damage: SlotDamage::Checksum,
                key: key(5),
                packet_len: 100,
                fields_verified: false,
            },
            RejectedSlot {
                slot: 6,
                damage: SlotDamage::State(0x1234_5678),
                key: key(6),
                packet_len: 20,
                fields_verified: true,
            },
        ]
    );
    let text = recovery.rejected_slots[0].to_string();
    for expected in [
        "slot 4",
        "CRC32C",
        "seq 35",
        "fragment 1",
        "100 bytes",
        "unverified",
    ] {
        assert!(text.contains(expected), "{expected:?} not in {text}");
    }
    assert!(!recovery.rejected_slots[1]
        .to_string()
        .contains("unverified"));
}

#[test]
fn rejected_slots_are_described_up_to_a_bound_and_all_counted() {
    let slot_count = REJECTED_SLOTS_DESCRIBED as u32 + 8;
    let len = PmLog::<SimRegion>::required_region_len(slot_count, SLOT_SIZE);
    let mut log = PmLog::format(SimRegion::new(len), slot_count, SLOT_SIZE).unwrap();
    for slot in 0..slot_count {
        log.write(slot, &key(slot), &packet(30, slot as u8));
    }
    let mut region = log.into_region();
    for slot in 0..slot_count as usize {
        region.flip_bit(SUPERBLOCK_SIZE + slot * SLOT_SIZE as usize + HEADER_SEQ, 0);
    }
    let (_, recovery) = PmLog::open(region).unwrap();
    assert_eq!(recovery.rejected_slot_count, slot_count);
    assert_eq!(recovery.rejected_slots.len(), REJECTED_SLOTS_DESCRIBED);
    assert!(recovery.entries.is_empty());
}

#[test]
fn a_scan_finds_intact_entries_without_a_superblock() {
    let mut log = new_log();
    for slot in [0, 3, 5] {
        log.write(slot, &key(slot), &packet(40 + slot as usize, slot as u8));
    }
    log.write(7, &key(7), &packet(50, 7));
    log.invalidate(7);
    let mut region = log.into_region();
    region.write(0, &[0; SB_FIELDS_SIZE]);
    assert_eq!(
        PmLog::open(region.clone()).unwrap_err(),
        LogError::Unformatted
    );
    assert_eq!(
        scan_for_entries(region.bytes()),
        EntryScan {
            intact_entries: 3,
            slot_size: Some(SLOT_SIZE),
        }
    );
    // A damaged entry is not counted.
    region.flip_bit(
        SUPERBLOCK_SIZE + 3 * SLOT_SIZE as usize + SLOT_HEADER_SIZE,
        0,
    );
    assert_eq!(scan_for_entries(region.bytes()).intact_entries, 2);
    assert_eq!(
        scan_for_entries(new_log().region().bytes()),
        EntryScan::default()
    );
    assert_eq!(scan_for_entries(&[0; 10]), EntryScan::default());
}

#[test]
fn random_corruption_at_rest_never_yields_a_wrong_entry() {
    let seed = test_seed("random_corruption_at_rest_never_yields_a_wrong_entry");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = new_log();
    let mut written = Contents::new();
    for slot in 0..SLOT_COUNT {
        let entry = (key(slot), packet(slot as usize * 24, slot as u8));
        log.write(slot, &entry.0, &entry.1);
        written.insert(slot, entry);
    }
    let region = log.into_region();
    for _ in 0..500 {
        let mut corrupted = region.clone();
        let flip_count = rand::Rng::random_range(&mut rng, 1..4);
        for _ in 0..flip_count {
            let offset = rand::Rng::random_range(&mut rng, SUPERBLOCK_SIZE..region.len());
            corrupted.corrupt_at_rest(offset, &mut rng);
        }
        let (_, recovery) = PmLog::open(corrupted).unwrap();
        for (slot, entry) in contents(&recovery) {
            assert_eq!(Some(&entry), written.get(&slot), "seed {seed}");
        }
        assert!(
            recovery.entries.len() + recovery.rejected_slot_count as usize
                >= SLOT_COUNT as usize - flip_count,
            "seed {seed}"
        );
    }
}

#[test]
fn bad_superblocks_are_errors_that_say_what_is_wrong() {
    let region = new_log().into_region();
    let open_error = |region: SimRegion| PmLog::open(region).unwrap_err();

    let error = open_error(SimRegion::new(region_len()));
    assert_eq!(error, LogError::Unformatted);
    assert!(error.to_string().contains("blank (all zero)"), "{error}");

    let error = open_error(SimRegion::new(100));
    assert!(
        matches!(error, LogError::NoSuperblock { region_len: 100 }),
        "{error}"
    );
    assert!(error.to_string().contains("shorter than"), "{error}");
    let error = LogError::NoSuperblock { region_len: 0 };
    assert!(error.to_string().contains("empty (0 bytes)"), "{error}");

    let mut not_a_log = SimRegion::new(region_len());
    not_a_log.write(0, b"SQLite format 3\0");
    let error = open_error(not_a_log);
    assert!(matches!(error, LogError::NotALog { .. }), "{error}");
    assert!(error.to_string().contains("not a pmnet log"), "{error}");

    let mut bad_magic = region.clone();
    bad_magic.flip_bit(0, 0);
    assert!(matches!(open_error(bad_magic), LogError::NotALog { .. }));

    for offset in SB_LAYOUT_VERSION..SB_CRC + 4 {
        let mut corrupt = region.clone();
        corrupt.flip_bit(offset, 2);
        let error = open_error(corrupt);
        assert!(
            matches!(error, LogError::SuperblockCorrupt { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("corrupt"), "{error}");
    }

    // Well-formed superblocks this build refuses.
    let rewrite = |fields: [u8; SB_FIELDS_SIZE]| {
        let mut region = region.clone();
        region.write(0, &fields);
        region
    };
    let mut newer = encode_superblock(SLOT_COUNT, SLOT_SIZE);
    newer[SB_LAYOUT_VERSION] = 2;
    let crc = crc32c::crc32c(&newer[..SB_CRC]);
    newer[SB_CRC..].copy_from_slice(&crc.to_le_bytes());
    let error = open_error(rewrite(newer));
    assert_eq!(error, LogError::UnsupportedVersion { found: 2 });
    assert!(
        error.to_string().contains("the build that wrote it"),
        "{error}"
    );

    let error = open_error(rewrite(encode_superblock(SLOT_COUNT, 100)));
    assert!(
        matches!(error, LogError::SuperblockGeometry { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("formatted differently"),
        "{error}"
    );

    let error = open_error(rewrite(encode_superblock(SLOT_COUNT + 1, SLOT_SIZE)));
    assert!(matches!(error, LogError::Truncated { .. }), "{error}");
}

#[test]
fn format_checks_geometry_and_region_size() {
    let format = |len: usize, slot_count: u32, slot_size: u32| {
        PmLog::format(SimRegion::new(len), slot_count, slot_size).map(|_| ())
    };
    for (slot_count, slot_size) in [(0, 256), (4, 64), (4, 200), (4, SLOT_SIZE_MAX + 64)] {
        let error = format(1 << 16, slot_count, slot_size).unwrap_err();
        assert!(matches!(error, LogError::BadGeometry { .. }), "{error}");
    }
    let error = format(1 << 16, SLOT_COUNT_MAX + 1, 128).unwrap_err();
    assert!(matches!(error, LogError::BadGeometry { .. }), "{error}");
    let error = format(region_len() - 1, SLOT_COUNT, SLOT_SIZE).unwrap_err();
    assert!(matches!(error, LogError::RegionTooSmall { .. }), "{error}");
    assert!(error.to_string().contains("make it at least"), "{error}");
    // A larger region is fine.
    format(region_len() + 1000, SLOT_COUNT, SLOT_SIZE).unwrap();
    assert_eq!(
        PmLog::<SimRegion>::required_region_len(u32::MAX, u32::MAX),
        (u32::MAX as usize) * (u32::MAX as usize) + SUPERBLOCK_SIZE
    );
}

#[test]
fn format_erases_a_previous_log() {
    let mut log = new_log();
    log.write(3, &key(3), &packet(50, 3));
    let log = PmLog::format(log.into_region(), SLOT_COUNT, SLOT_SIZE).unwrap();
    assert!(log.read(3).is_none());
    let (_, recovery) = PmLog::open(log.into_region().crash_losing_unpersisted()).unwrap();
    assert_eq!(recovery, LogRecovery::default());
}

#[test]
#[should_panic(expected = "exceeds the slot")]
fn oversized_packet_panics() {
    new_log().write(0, &key(0), &[0; 193]);
}

#[test]
#[should_panic(expected = "out of range")]
fn slot_out_of_range_panics() {
    new_log().invalidate(SLOT_COUNT);
}

#[cfg(target_os = "linux")]
#[test]
fn log_on_a_mapped_file_survives_reopening() {
    use crate::{MmapOptions, MmapRegion};
    let path = std::env::temp_dir().join(format!("pmnet-pm-test-{}-log", std::process::id()));
    let len = PmLog::<MmapRegion>::required_region_len(16, 1024);
    {
        let region = MmapRegion::create(&path, len, MmapOptions::default()).unwrap();
        let mut log = PmLog::format(region, 16, 1024).unwrap();
        log.write(9, &key(9), &packet(900, 9));
        log.write(10, &key(10), &packet(10, 10));
        log.invalidate(10);
    }
    let region = MmapRegion::open(&path, MmapOptions::default()).unwrap();
    let (log, recovery) = PmLog::open(region).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(recovery.rejected_slot_count, 0);
    assert_eq!(
        recovery.entries,
        vec![RecoveredEntry {
            slot: 9,
            key: key(9),
            return_address: None,
            packet: packet(900, 9)
        }]
    );
    assert_eq!(log.slot_count(), 16);
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        slot: u32,
        key_n: u32,
        len: usize,
        salt: u8,
    },
    WriteBatch(Vec<(u32, u32, usize, u8)>),
    Invalidate(u32),
    InvalidateBatch(Vec<u32>),
    Reopen,
    Crash(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let slot = 0..SLOT_COUNT;
    let entry = (0..SLOT_COUNT, 0..50u32, 0..=192usize, any::<u8>());
    prop_oneof![
        4 => entry.clone().prop_map(|(slot, key_n, len, salt)| Op::Write { slot, key_n, len, salt }),
        2 => prop::collection::vec(entry, 0..5).prop_map(Op::WriteBatch),
        3 => slot.clone().prop_map(Op::Invalidate),
        1 => prop::collection::vec(slot, 0..5).prop_map(Op::InvalidateBatch),
        1 => Just(Op::Reopen),
        1 => any::<u64>().prop_map(Op::Crash),
    ]
}

fn check_recovery(recovery: &LogRecovery, model: &Contents) {
    assert_eq!(recovery.rejected_slot_count, 0);
    assert_sorted(recovery);
    assert_eq!(&contents(recovery), model);
}

proptest! {
    #[test]
    fn log_matches_a_model(ops in prop::collection::vec(op_strategy(), 1..40)) {
        let mut log = new_log();
        let mut model = Contents::new();
        for op in ops {
            match op {
                Op::Write { slot, key_n, len, salt } => {
                    let entry = (key(key_n), packet(len, salt));
                    log.write(slot, &entry.0, &entry.1);
                    model.insert(slot, entry);
                }
                Op::WriteBatch(entries) => {
                    let owned: Vec<(u32, EntryKey, Vec<u8>)> = entries
                        .iter()
                        .map(|(slot, key_n, len, salt)| (*slot, key(*key_n), packet(*len, *salt)))
                        .collect();
                    let batch: Vec<LogWork> = owned
                        .iter()
                        .map(|(slot, key, packet)| write_of(*slot, *key, packet.clone()))
                        .collect();
                    log.persist_batch(&batch);
                    for (slot, key, packet) in owned {
                        model.insert(slot, (key, packet));
                    }
                }
                Op::Invalidate(slot) => {
                    log.invalidate(slot);
                    model.remove(&slot);
                }
                Op::InvalidateBatch(slots) => {
                    log.invalidate_batch(&slots);
                    for slot in slots {
                        model.remove(&slot);
                    }
                }
                Op::Reopen => {
                    let (reopened, recovery) = PmLog::open(log.into_region()).unwrap();
                    check_recovery(&recovery, &model);
                    log = reopened;
                }
                Op::Crash(seed) => {
                    // Every operation is durable on return: a crash loses nothing.
                    let region = log.into_region();
                    prop_assert!(region.is_durable(0, region.len()));
                    let crashed = region.crash(&mut ChaCha8Rng::seed_from_u64(seed));
                    let (reopened, recovery) = PmLog::open(crashed).unwrap();
                    check_recovery(&recovery, &model);
                    log = reopened;
                }
            }
            for slot in 0..SLOT_COUNT {
                let expected = model.get(&slot).map(|(key, packet)| (*key, packet.as_slice()));
                prop_assert_eq!(log.read(slot), expected);
            }
        }
    }
}

#[test]
fn return_addresses_survive_reopen() {
    let region = SimRegion::new(PmLog::<SimRegion>::required_region_len(4, 256));
    let mut log = PmLog::format(region, 4, 256).unwrap();
    let v4: std::net::SocketAddr = "192.0.2.7:40001".parse().unwrap();
    let v6: std::net::SocketAddr = "[2001:db8::1]:51000".parse().unwrap();
    log.write_with_return_address(0, &key(1), Some(v4), b"four");
    log.write_with_return_address(1, &key(2), Some(v6), b"six");
    log.write(2, &key(3), b"none");
    let (_, recovery) = PmLog::open(log.into_region().crash_losing_unpersisted()).unwrap();
    let mut entries = recovery.entries;
    entries.sort_by_key(|entry| entry.slot);
    let addresses: Vec<_> = entries.iter().map(|entry| entry.return_address).collect();
    assert_eq!(addresses, [Some(v4), Some(v6), None]);
}

#[test]
fn inspect_reports_what_open_would_recover_and_writes_nothing() {
    let mut log = new_log();
    let client: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    log.write_with_return_address(1, &key(1), Some(client), &packet(40, 1));
    log.write(3, &key(3), &packet(100, 3));
    log.write(5, &key(5), &packet(10, 5));
    let mut bytes = log.region().bytes().to_vec();
    // Damage slot 5's packet: its CRC fails.
    let offset = SUPERBLOCK_SIZE + 5 * SLOT_SIZE as usize + SLOT_HEADER_SIZE;
    bytes[offset] ^= 0xff;
    let before = bytes.clone();

    let inspection = inspect(&bytes).unwrap();
    assert_eq!(bytes, before, "inspect changed the bytes");
    assert_eq!(
        (inspection.slot_count, inspection.slot_size),
        (SLOT_COUNT, SLOT_SIZE)
    );
    assert!(!inspection.is_truncated());
    let slots: Vec<u32> = inspection.entries.iter().map(|entry| entry.slot).collect();
    assert_eq!(slots, vec![1, 3]);
    assert_eq!(inspection.entries[0].key, key(1));
    assert_eq!(inspection.entries[0].return_address, Some(client));
    assert_eq!(inspection.entries[1].packet, packet(100, 3));
    assert_eq!(inspection.damaged.len(), 1);
    assert_eq!(inspection.damaged[0].slot, 5);
    assert_eq!(inspection.damaged[0].damage, SlotDamage::Checksum);

    // What open recovers is what inspect listed.
    let mut region = SimRegion::new(bytes.len());
    region.write(0, &bytes);
    region.fence();
    let (_, recovery) = PmLog::open(region).unwrap();
    let mut recovered: Vec<u32> = recovery.entries.iter().map(|entry| entry.slot).collect();
    recovered.sort_unstable();
    assert_eq!(recovered, slots);
    assert_eq!(recovery.rejected_slot_count, 1);

    // Truncated in the middle of slot 4: slots 0..4 are read, the rest are missing.
    let cut = SUPERBLOCK_SIZE + 4 * SLOT_SIZE as usize + 10;
    let inspection = inspect(&before[..cut]).unwrap();
    assert!(inspection.is_truncated());
    assert_eq!(inspection.slots_present, 4);
    assert_eq!(inspection.entries.len(), 2);
    assert!(inspection.damaged.is_empty());

    // Not a log at all.
    assert!(matches!(
        inspect(&[0x55; 8192]),
        Err(LogError::NotALog { .. })
    ));
    assert!(matches!(inspect(&[]), Err(LogError::NoSuperblock { .. })));
    assert!(matches!(inspect(&[0; 8192]), Err(LogError::Unformatted)));
}

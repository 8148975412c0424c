//! The table under the crash model: random writes and deletions of a few keys, batches made
//! durable or cut by a crash (each unpersisted line kept, lost or torn), the table reopened
//! from what the crash left. After every crash each key holds exactly its last durable
//! version, or a newer one whose write was under way — never an older one, never a torn one.
//! Randomised: prints its seed; `PMNET_SEED=N` replays one.

use std::collections::HashMap;

use pmnet_pm::SimRegion;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{FileError, Geometry, Refused, Table, TableFile, Version, Written};

fn geometry() -> Geometry {
    Geometry {
        buckets: 64,
        key_max: 16,
        value_max: 100,
    }
}

fn seed() -> u64 {
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text.trim().parse().expect("PMNET_SEED is a u64"),
        Err(_) => rand::random(),
    };
    eprintln!("PMNET_SEED={seed}");
    seed
}

fn fresh() -> (Table, TableFile<SimRegion>) {
    let region = SimRegion::new(geometry().region_len());
    let file = TableFile::format(region, geometry()).expect("format");
    (Table::new(geometry()), file)
}

fn reopen(region: SimRegion) -> (Table, TableFile<SimRegion>, crate::Recovered) {
    let (file, recovered) = TableFile::open(region).expect("reopen");
    let table = Table::recover(file.geometry(), recovered.clone());
    (table, file, recovered)
}

fn persist_all(table: &mut Table, file: &mut TableFile<SimRegion>) -> Vec<(Vec<u8>, u64)> {
    let mut durable = Vec::new();
    while let Some(batch) = table.poll_persist() {
        file.persist_batch(&batch.work);
        durable.extend(table.on_persisted(batch.number));
    }
    durable
}

#[test]
fn versions_survive_a_reopen_and_a_stale_write_changes_nothing() {
    let (mut table, mut file) = fresh();
    let version = |seq: u64, value: &[u8]| Version {
        seq,
        value: Some(value.to_vec()),
    };
    assert_eq!(table.write(b"k", version(2, b"two")), Ok(Written::Pending));
    assert!(!table.is_clean(b"k"));
    assert_eq!(table.durable(b"k"), None);
    assert_eq!(persist_all(&mut table, &mut file), vec![(b"k".to_vec(), 2)]);
    assert!(table.is_clean(b"k"));
    assert_eq!(table.write(b"k", version(1, b"one")), Ok(Written::Stale));
    assert_eq!(table.write(b"k", version(2, b"again")), Ok(Written::Stale));
    // Two writes in one turn: the second waits for the first, then replaces it.
    assert_eq!(
        table.write(b"k", version(3, b"three")),
        Ok(Written::Pending)
    );
    assert_eq!(table.write(b"k", version(4, b"four")), Ok(Written::Pending));
    assert_eq!(table.latest(b"k"), Some(&version(4, b"four")));
    assert_eq!(
        persist_all(&mut table, &mut file),
        vec![(b"k".to_vec(), 3), (b"k".to_vec(), 4)]
    );
    assert_eq!(
        table.write(
            b"gone",
            Version {
                seq: 9,
                value: None
            }
        ),
        Ok(Written::Pending)
    );
    persist_all(&mut table, &mut file);
    let (table, _, recovered) = reopen(file.region().crash_losing_unpersisted());
    assert_eq!(recovered.damaged_records, 0);
    assert_eq!(table.durable(b"k"), Some(&version(4, b"four")));
    assert_eq!(
        table.durable(b"gone"),
        Some(&Version {
            seq: 9,
            value: None
        })
    );
    assert_eq!(table.len(), 2);
}

#[test]
fn bad_keys_values_and_a_full_neighbourhood_are_refused() {
    let (mut table, _) = fresh();
    let value = |len: usize| Version {
        seq: 1,
        value: Some(vec![7; len]),
    };
    assert_eq!(table.write(b"", value(1)), Err(Refused::BadKey));
    assert_eq!(table.write(&[1; 17], value(1)), Err(Refused::BadKey));
    assert_eq!(table.write(b"k", value(101)), Err(Refused::ValueTooLarge));
    for index in 0..64u32 {
        assert_eq!(
            table.write(&index.to_le_bytes(), value(1)),
            Ok(Written::Pending)
        );
    }
    assert_eq!(table.write(b"one more", value(1)), Err(Refused::Full));
}

#[test]
fn a_region_that_holds_no_table_is_refused_without_panicking() {
    assert!(matches!(
        TableFile::open(SimRegion::new(4096)),
        Err(FileError::NotATable(_))
    ));
    assert!(matches!(
        TableFile::open(SimRegion::new(10)),
        Err(FileError::NotATable(_))
    ));
    let (_, file) = fresh();
    let mut bytes = file.region().durable_bytes().to_vec();
    bytes.truncate(2000);
    let mut short = SimRegion::new(bytes.len());
    pmnet_pm::PmRegion::write(&mut short, 0, &bytes);
    assert!(matches!(
        TableFile::open(short),
        Err(FileError::TooSmall { .. })
    ));
    assert!(matches!(
        TableFile::format(
            SimRegion::new(100),
            Geometry {
                buckets: 0,
                key_max: 1,
                value_max: 1
            }
        ),
        Err(FileError::BadGeometry(_))
    ));
}

#[test]
fn any_bytes_in_the_records_are_read_without_panicking() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..50 {
        let (_, file) = fresh();
        let mut region = file.region().crash_losing_unpersisted();
        let len = pmnet_pm::PmRegion::len(&region);
        for _ in 0..200 {
            let offset = rng.random_range(crate::SUPERBLOCK_LEN..len);
            let byte: u8 = rng.random();
            pmnet_pm::PmRegion::write(&mut region, offset, &[byte]);
        }
        let (file, recovered) = TableFile::open(region).expect("the superblock is intact");
        let table = Table::recover(file.geometry(), recovered);
        assert!(table.len() <= 64);
    }
}

#[test]
fn a_crash_never_leaves_a_key_older_than_its_last_durable_version() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let keys: Vec<Vec<u8>> = (0..12u8).map(|index| vec![b'k', index]).collect();
    let (mut table, mut file) = fresh();
    // Per key: the last version made durable, and every version issued since.
    let mut durable: HashMap<Vec<u8>, Version> = HashMap::new();
    let mut issued: HashMap<Vec<u8>, Vec<Version>> = HashMap::new();
    let mut next_seq: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut crashes = 0;
    for step in 0..4_000 {
        let key = keys[rng.random_range(0..keys.len())].clone();
        let seq = next_seq.entry(key.clone()).or_insert(0);
        // The network may reorder: sometimes an older number comes late.
        let written_seq = if rng.random_bool(0.1) && *seq > 2 {
            *seq - rng.random_range(1..=2)
        } else {
            *seq += 1;
            *seq
        };
        let version = Version {
            seq: written_seq,
            value: if rng.random_bool(0.15) {
                None
            } else {
                let len = rng.random_range(0..=100);
                Some(
                    (0..len)
                        .map(|i| (written_seq as u8).wrapping_add(i))
                        .collect(),
                )
            },
        };
        if table.write(&key, version.clone()) == Ok(Written::Pending) {
            issued.entry(key.clone()).or_default().push(version);
        }
        if rng.random_bool(0.3) {
            continue;
        }
        let Some(batch) = table.poll_persist() else {
            continue;
        };
        if rng.random_bool(0.05) {
            // A crash in the middle of the batch: its records stored and flushed, no fence.
            file.persist_batch_without_fence(&batch.work);
            let crashed = file.region().crash(&mut rng);
            let (recovered_table, recovered_file, recovered) = reopen(crashed);
            crashes += 1;
            for key in &keys {
                let got = recovered_table.durable(key);
                let last = durable.get(key);
                match (got, last) {
                    (None, None) => {}
                    (None, Some(last)) => panic!(
                        "seed {seed} step {step}: key {key:?} lost its durable version {last:?}"
                    ),
                    (Some(got), last) => {
                        let floor = last.map_or(0, |last| last.seq);
                        assert!(
                            got.seq >= floor,
                            "seed {seed} step {step}: key {key:?} went back to {got:?} from {last:?}"
                        );
                        let known = last == Some(got)
                            || issued
                                .get(key)
                                .is_some_and(|versions| versions.contains(got));
                        assert!(
                            known,
                            "seed {seed} step {step}: key {key:?} holds {got:?}, never written"
                        );
                    }
                }
            }
            // Go on from what the crash left.
            table = recovered_table;
            file = recovered_file;
            durable = keys
                .iter()
                .filter_map(|key| Some((key.clone(), table.durable(key)?.clone())))
                .collect();
            for (key, version) in &durable {
                next_seq.insert(key.clone(), next_seq[key].max(version.seq));
            }
            issued.clear();
            assert_eq!(recovered.conflicting_buckets, 0);
            continue;
        }
        file.persist_batch(&batch.work);
        for (key, seq) in table.on_persisted(batch.number) {
            let version = table.durable(&key).expect("durable").clone();
            assert_eq!(version.seq, seq);
            durable.insert(key, version);
        }
    }
    eprintln!("{crashes} crashes");
    assert!(crashes > 0);
}

#[test]
fn a_replaced_older_version_is_the_current_one_after_a_reopen_and_pages_see_changes() {
    let (mut table, mut file) = fresh();
    let version = |seq: u64, value: &[u8]| Version {
        seq,
        value: Some(value.to_vec()),
    };
    table.write(b"a", version(6, b"phantom")).unwrap();
    table.write(b"b", version(2, b"bee")).unwrap();
    persist_all(&mut table, &mut file);
    let all = table.page(|_| true, 0, 0, 1 << 20);
    assert_eq!(all.entries.len(), 2);
    assert_eq!(all.next, None);
    let since = all.change;

    // A joining member takes its source's older version: it must stay current after a
    // reopen, though the other record holds a higher sequence number.
    assert_eq!(
        table.replace(b"a", version(5, b"five")),
        Ok(Written::Pending)
    );
    assert_eq!(table.replace(b"b", version(2, b"bee")), Ok(Written::Stale));
    persist_all(&mut table, &mut file);
    let changed = table.page(|_| true, since, 0, 1 << 20);
    assert_eq!(changed.entries, vec![(b"a".to_vec(), version(5, b"five"))]);
    assert_eq!(
        table.page(|key| key == b"b", since, 0, 1 << 20).entries,
        vec![]
    );
    let (table, _, _) = reopen(file.region().crash_losing_unpersisted());
    assert_eq!(table.durable(b"a"), Some(&version(5, b"five")));

    // Written with the generation ignored, the reopened table would take the phantom back.
    let (mut table, mut file) = fresh();
    table.write(b"a", version(6, b"phantom")).unwrap();
    persist_all(&mut table, &mut file);
    table.replace(b"a", version(5, b"five")).unwrap();
    let batch = table.poll_persist().unwrap();
    let mut ignored = batch.work.clone();
    ignored[0].generation = 0;
    file.persist_batch(&ignored);
    let (reopened, _, _) = reopen(file.region().crash_losing_unpersisted());
    assert_eq!(reopened.durable(b"a"), Some(&version(6, b"phantom")));
}

#[test]
fn a_page_is_bounded_and_resumes_at_its_cursor() {
    let (mut table, mut file) = fresh();
    for index in 0..40u8 {
        table
            .write(
                &[b'k', index],
                Version {
                    seq: 1,
                    value: Some(vec![index; 50]),
                },
            )
            .unwrap();
    }
    persist_all(&mut table, &mut file);
    let mut seen = Vec::new();
    let mut cursor = 0;
    let mut pages = 0;
    loop {
        let page = table.page(|key| key[1] % 2 == 0, 0, cursor, 300);
        assert!(page.entries.len() <= 5, "{} entries", page.entries.len());
        seen.extend(page.entries.into_iter().map(|(key, _)| key));
        pages += 1;
        match page.next {
            Some(next) => cursor = next,
            None => break,
        }
    }
    seen.sort();
    let expected: Vec<Vec<u8>> = (0..40u8)
        .step_by(2)
        .map(|index| vec![b'k', index])
        .collect();
    assert_eq!(seen, expected);
    assert!(pages >= 4);
}

#[test]
fn a_direct_mapped_table_keeps_each_line_in_its_own_bucket_every_one_usable() {
    let geometry = Geometry {
        buckets: 64,
        key_max: 4,
        value_max: 64,
    };
    let region = SimRegion::new(geometry.region_len());
    let mut file = TableFile::format(region, geometry).expect("formats");
    let mut table = Table::new_direct(geometry);
    // Every bucket takes its own line: no probing, so a full table has no "full" neighbourhood.
    for bucket in 0..64u32 {
        let version = Version {
            seq: u64::from(bucket) + 1,
            value: Some(vec![bucket as u8; 64]),
        };
        assert_eq!(
            table.write(&crate::direct_key(bucket), version),
            Ok(Written::Pending)
        );
    }
    // Keys that are no bucket's are refused.
    let version = Version {
        seq: 1,
        value: Some(vec![0; 64]),
    };
    assert_eq!(
        table.write(&crate::direct_key(64), version.clone()),
        Err(Refused::BadKey)
    );
    assert_eq!(table.write(b"abc", version), Err(Refused::BadKey));
    persist_all(&mut table, &mut file);
    let (file, recovered) = TableFile::open(file.into_region()).expect("reopens");
    for (key, (bucket, ..)) in &recovered.keys {
        assert_eq!(crate::direct_bucket(key), Some(*bucket));
    }
    let table = Table::recover_direct(file.geometry(), recovered);
    assert_eq!(table.len(), 64);
    assert_eq!(
        table.durable(&crate::direct_key(9)).map(|v| v.seq),
        Some(10)
    );
}

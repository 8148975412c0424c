//! A store grown into a longer file (`Store::grow`): the data area extended by one durable
//! aligned 8-byte store. A crash at any point of it leaves the store as it was or grown, with
//! every key it held; the grown store takes keys the old one had no room for, and keeps them
//! across crashes.

use pmnet_pm::{PmRegion, SimRegion};

use super::{config, region_len, Tap};
use crate::layout::{EngineKind, GROWTH_OFFSET};
use crate::store::Store;

/// `region`'s durable image in a region of `len` bytes whose tail is zero, all durable: a
/// closed store's file made longer (and synced) by the runtime before it grows the store.
fn extended(region: &SimRegion, len: usize) -> SimRegion {
    let durable = region.durable_bytes();
    let mut longer = SimRegion::new(len);
    longer.write(0, durable);
    longer.persist(0, durable.len());
    longer
}

/// SETs of new keys by session 1 until one finds no room (`full.rs`), through received slots
/// while they can be lent; the keys stored.
fn fill<R: PmRegion>(store: &mut Store<R>, seq: &mut u32, value: &[u8]) -> Vec<Vec<u8>> {
    super::full::fill_store(store, seq, value, true)
}

fn assert_holds<R: PmRegion>(store: &Store<R>, keys: &[Vec<u8>], value: &[u8], what: &str) {
    assert_eq!(store.key_count(), keys.len(), "{what}: key count");
    for key in keys {
        let found = store
            .get(key)
            .expect("no corruption")
            .map(|found| found.to_vec());
        assert_eq!(found.as_deref(), Some(value), "{what}: key {key:?}");
    }
}

#[test]
fn a_full_store_grown_takes_more_keys_and_keeps_every_one() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let value = vec![7u8; 300];
        let mut store = Store::format(SimRegion::new(region_len(48)), config(engine)).unwrap();
        let mut seq = 0;
        let mut stored = fill(&mut store, &mut seq, &value);
        assert!(stored.len() > 10, "{engine:?}: {} keys", stored.len());
        let before = *store.geometry();
        let durable = store.into_region().crash_losing_unpersisted();

        // The file made longer, not grown yet: the same store, the tail unused.
        let longer = extended(&durable, region_len(128));
        let store = Store::open(longer.clone()).unwrap();
        assert_eq!(*store.geometry(), before, "{engine:?}");
        assert_holds(&store, &stored, &value, "made longer");
        drop(store);

        let mut region = longer;
        let (old, new) = Store::grow(&mut region).unwrap();
        assert_eq!(old, before);
        assert!(
            new.data_len > old.data_len + 60 * 512,
            "{engine:?}: {new:?}"
        );
        assert_eq!(new.data_offset, old.data_offset);
        // Durable on return: a crash now keeps it.
        let mut store = Store::open(region.crash_losing_unpersisted()).unwrap();
        assert_eq!(*store.geometry(), new, "{engine:?}");
        assert_holds(&store, &stored, &value, "grown");
        let more = fill(&mut store, &mut seq, &value);
        assert!(
            more.len() > stored.len(),
            "{engine:?}: {} keys more after growing, {} before",
            more.len(),
            stored.len()
        );
        stored.extend(more);
        let store = Store::open(store.into_region().crash_losing_unpersisted()).unwrap();
        assert_holds(&store, &stored, &value, "grown, filled and crashed");

        // Nothing more to grow into: refused, nothing changed.
        let mut region = store.into_region();
        assert!(Store::grow(&mut region).is_err());
        let store = Store::open(region).unwrap();
        assert_eq!(*store.geometry(), new);
    }
}

#[test]
fn a_crash_at_any_point_of_growing_leaves_the_old_store_or_the_grown_one() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let value = vec![3u8; 200];
        let mut store = Store::format(SimRegion::new(region_len(40)), config(engine)).unwrap();
        let mut seq = 0;
        let stored = fill(&mut store, &mut seq, &value);
        let before = *store.geometry();
        let longer = extended(
            &store.into_region().crash_losing_unpersisted(),
            region_len(80),
        );
        let mut grown = None;
        for crash_at in 0.. {
            let mut tap = Tap::new(longer.clone(), Some(crash_at), crash_at);
            let (_, after) = Store::grow(&mut tap).unwrap();
            grown = Some(after);
            let Some(image) = tap.image else {
                // Grow finished before the crash point: every point was tried.
                break;
            };
            let store = Store::open(image).unwrap();
            let geometry = *store.geometry();
            assert!(
                geometry == before || geometry == after,
                "{engine:?}, crash at {crash_at}: {geometry:?}"
            );
            assert_holds(&store, &stored, &value, "crashed while growing");
        }
        let grown = grown.expect("grown");
        let store = Store::open(longer).unwrap();
        assert_eq!(
            *store.geometry(),
            before,
            "the image it grew from is untouched"
        );
        assert!(grown.data_len > before.data_len);
    }
}

#[test]
fn a_damaged_or_truncated_growth_word_is_told_not_followed() {
    let engine = EngineKind::Packet;
    let mut store = Store::format(SimRegion::new(region_len(16)), config(engine)).unwrap();
    let mut seq = 0;
    let value = vec![1u8; 100];
    let _ = fill(&mut store, &mut seq, &value);
    let before = *store.geometry();
    let mut region = extended(
        &store.into_region().crash_losing_unpersisted(),
        region_len(32),
    );
    Store::grow(&mut region).unwrap();
    // A bit flipped in the word: it is no growth word, and the store opens as it was made.
    let mut damaged = region.clone();
    damaged.flip_bit(GROWTH_OFFSET + 1, 3);
    assert_eq!(*Store::open(damaged).unwrap().geometry(), before);
    // The file cut back to its old length after growing: an error naming it, not a panic.
    let mut short = SimRegion::new(region_len(16));
    short.write(0, &region.bytes()[..region_len(16)]);
    let error = Store::open(short).unwrap_err().to_string();
    assert!(error.contains("truncated"), "{error}");
    // A file shorter than a superblock: an error, not a panic.
    assert!(Store::open(SimRegion::new(100)).is_err());
}

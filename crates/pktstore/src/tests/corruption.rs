//! Damaged regions and records: detected and reported, never returned, never a panic.

use pmnet_pm::{PmRegion, SimRegion};
use pmnet_store::{Application, Reply, Request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{config, random_request, region_len, seeds};
use crate::layout::EngineKind;
use crate::store::Store;

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

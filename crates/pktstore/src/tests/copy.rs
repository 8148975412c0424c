//! A store copied into another (`Store::copy_into`, `pmnet store compact`): the copy holds
//! every key and answers every session as the original does, across a crash.

use pmnet_pm::SimRegion;
use pmnet_store::{Application, Request};

use super::{config, region_len};
use crate::layout::EngineKind;
use crate::store::{Store, COPY_SESSION};

fn all_keys<R: pmnet_pm::PmRegion>(store: &Store<R>) -> Vec<(Vec<u8>, Vec<u8>)> {
    store
        .scan(b"", usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(key, value)| (key.to_vec(), value.to_vec()))
        .collect()
}

#[test]
fn a_copy_holds_every_key_and_answers_every_session_as_the_original() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let mut source = Store::format(SimRegion::new(region_len(400)), config(engine)).unwrap();
        // Sessions 1..=6, each ending on another kind of request.
        let long = vec![b'v'; 1500];
        let mut replies = Vec::new();
        for session in 1..=6u64 {
            for seq in 1..=5u32 {
                let key = format!("k{session}-{seq}").into_bytes();
                let request = match (session, seq) {
                    (_, 5) if session % 3 == 0 => Request::Incr {
                        key: b"counter",
                        delta: session as i64,
                    }
                    .to_bytes(),
                    (_, 5) if session % 3 == 1 => Request::Get { key: b"k1-1" }.to_bytes(),
                    (_, 5) => Request::Del { key: b"k2-2" }.to_bytes(),
                    (2, 3) => Request::Set {
                        key: &key,
                        value: &long,
                    }
                    .to_bytes(),
                    _ => Request::Set {
                        key: &key,
                        value: format!("value {session} {seq}").as_bytes(),
                    }
                    .to_bytes(),
                };
                let reply = source.stage(session, seq, &request).unwrap();
                if seq == 5 {
                    replies.push((session, request, reply));
                }
            }
            source.commit();
        }
        let keys = all_keys(&source);
        let sessions = source.sessions();
        assert_eq!(sessions.len(), 6);

        // Into a smaller store than the source: compacted.
        let mut target = Store::format(SimRegion::new(region_len(200)), config(engine)).unwrap();
        let report = source.copy_into(&mut target).unwrap();
        assert_eq!(
            (report.keys, report.sessions),
            (keys.len(), 6),
            "{engine:?}"
        );
        let mut target = Store::open(target.into_region().crash_losing_unpersisted()).unwrap();
        assert_eq!(
            all_keys(&target),
            keys,
            "{engine:?}: the keys after a crash"
        );
        let copied: Vec<_> = target
            .sessions()
            .into_iter()
            .filter(|record| record.session_id != COPY_SESSION)
            .collect();
        assert_eq!(copied, sessions, "{engine:?}: the sessions' records");
        for (session, request, reply) in replies {
            // The last request's reply is the record's (the server answers a retransmission
            // with it), and the request again is refused with nothing applied, as by the
            // original.
            let record = copied.iter().find(|r| r.session_id == session).unwrap();
            assert_eq!((record.last_seq, &record.last_reply), (5, &reply));
            assert_eq!(
                target.stage(session, 5, &request).unwrap(),
                source.stage(session, 5, &request).unwrap()
            );
            // An older one: refused as stale, as the original refuses it.
            let older = Request::Set {
                key: b"x",
                value: b"y",
            }
            .to_bytes();
            assert_eq!(
                target.stage(session, 2, &older).unwrap(),
                source.stage(session, 2, &older).unwrap()
            );
        }
        target.commit();
        assert_eq!(all_keys(&target), keys, "{engine:?}: nothing applied twice");

        // A copy into a store that has keys already is refused.
        let mut used = Store::open(target.into_region()).unwrap();
        assert!(source.copy_into(&mut used).is_err());
    }
}

#[test]
fn a_copy_into_a_store_too_small_says_so() {
    let engine = EngineKind::Packet;
    let mut source = Store::format(SimRegion::new(region_len(200)), config(engine)).unwrap();
    for seq in 1..=100u32 {
        let key = format!("key{seq}").into_bytes();
        source
            .stage(
                1,
                seq,
                &Request::Set {
                    key: &key,
                    value: &[7; 300],
                }
                .to_bytes(),
            )
            .unwrap();
        source.commit();
    }
    let mut target = Store::format(SimRegion::new(region_len(40)), config(engine)).unwrap();
    let error = source.copy_into(&mut target).unwrap_err().to_string();
    assert!(error.contains("no room"), "{error}");
}

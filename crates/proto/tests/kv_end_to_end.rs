//! The protocol in front of the real key-value store: what clients were told is what the
//! store holds, across device and server crashes.

use std::time::Duration;

use pmnet_proto::{ClientEvent, Completion};
use pmnet_sim::World;
use pmnet_store::{Reply, Request};

fn set(key: &str, value: &str) -> Vec<u8> {
    Request::Set {
        key: key.as_bytes(),
        value: value.as_bytes(),
    }
    .to_bytes()
}

fn get(key: &str) -> Vec<u8> {
    Request::Get {
        key: key.as_bytes(),
    }
    .to_bytes()
}

fn reply_of(world: &World, client: usize, seq: u32) -> Reply {
    match world.completion(client, seq) {
        Some(ClientEvent::Completed {
            completion: Completion::Replied { reply, .. },
            ..
        }) => Reply::decode(reply).expect("a valid reply"),
        other => panic!("seq {seq} did not complete with a reply: {other:?}"),
    }
}

#[test]
fn sets_acked_by_the_device_reach_the_store_across_crashes() {
    let mut world = World::new(2, Some(32)).with_kv_store(1 << 20);
    world.run_for(Duration::from_millis(100));
    world.stop_server(0);
    for index in 0..5 {
        world.update(0, &set(&format!("a{index}"), &format!("first {index}")));
        world.update(1, &set(&format!("b{index}"), &format!("first {index}")));
    }
    world.run_for(Duration::from_millis(1));
    let acked = world
        .clients
        .iter()
        .map(|node| node.completed.len())
        .sum::<usize>();
    assert_eq!(
        acked, 10,
        "every set is acked by the device while the server is down"
    );
    world.restart_device(0);
    world.start_server(0);
    world.run_for(Duration::from_secs(1));
    // Overwrite some, then read back through the protocol, in the same session.
    world.update(0, &set("a0", "second"));
    let read_a0 = world.bypass(0, &get("a0"));
    let read_b4 = world.bypass(1, &get("b4"));
    let read_missing = world.bypass(1, &get("zz"));
    world.run_for(Duration::from_secs(1));
    assert_eq!(
        reply_of(&world, 0, read_a0),
        Reply::Value(b"second".to_vec())
    );
    assert_eq!(
        reply_of(&world, 1, read_b4),
        Reply::Value(b"first 4".to_vec())
    );
    assert_eq!(reply_of(&world, 1, read_missing), Reply::NotFound);
    let store = world.servers[0].app.kv.as_ref().unwrap();
    assert_eq!(store.get(b"a1"), Some(&b"first 1"[..]));
    assert_eq!(store.len(), 10);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn a_noop_fill_is_recorded_by_the_store_without_effect() {
    let mut world = World::new(1, None).with_kv_store(1 << 20);
    // The first transmission of seq 1 and all its retransmissions are lost: it fails.
    world.drop_when(|seen| {
        seen.header.seq == 1 && seen.header.packet_type == pmnet_wire::PacketType::UpdateRequest
    });
    let lost = world.update(0, &set("lost", "never"));
    world.run_for(Duration::from_secs(30));
    assert!(matches!(
        world.completion(0, lost),
        Some(ClientEvent::Failed { .. })
    ));
    world.clear_drop_rules();
    // A later request reveals the hole; the server asks, the client fills it.
    let later = world.update(0, &set("later", "applied"));
    world.run_for(Duration::from_secs(1));
    assert!(matches!(
        world.completion(0, later),
        Some(ClientEvent::Completed { .. })
    ));
    assert_eq!(world.clients[0].client.counters().noop_fills_sent, 1);
    let store = world.servers[0].app.kv.as_ref().unwrap();
    assert_eq!(store.get(b"lost"), None);
    assert_eq!(store.get(b"later"), Some(&b"applied"[..]));
}

#[test]
fn a_cache_read_sees_the_keyed_writes_acked_before_it_and_the_reader_s_own() {
    // Without a cache in the device, cache reads are answered by the server: after every
    // keyed write acked before the read was sent (another session's: the device names it),
    // and after the reader's own earlier update (read-your-writes).
    let mut world = World::new(2, Some(64)).with_kv_store(1 << 20);
    world.run_for(Duration::from_millis(200));
    let value = Reply::Value(b"v1".to_vec()).to_bytes();
    let seq = world.keyed_update(0, b"k", Some(&value), &set("k", "v1"));
    world.drive_until(100_000, |w| w.completion(0, seq).is_some());
    let id = world.cache_read(1, b"k", &get("k"));
    world.drive_until(100_000, |w| w.read_event(1, id).is_some());
    let read = world.read_event(1, id).expect("answered").clone();
    let (reply, from) = read.outcome.expect("a reply");
    assert_eq!(Reply::decode(&reply).unwrap(), Reply::Value(b"v1".to_vec()));
    assert_eq!(from, 0, "the server answered (no cache in the device)");
    // The reader writes, then reads its own write at once.
    let own = world.keyed_update(1, b"k", None, &set("k", "v2"));
    let id = world.cache_read(1, b"k", &get("k"));
    world.drive_until(100_000, |w| w.read_event(1, id).is_some());
    assert!(world.completion(1, own).is_some());
    let (reply, _) = world
        .read_event(1, id)
        .unwrap()
        .outcome
        .clone()
        .expect("a reply");
    assert_eq!(Reply::decode(&reply).unwrap(), Reply::Value(b"v2".to_vec()));
}

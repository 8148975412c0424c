//! Batches (docs/protocol.md, "Batches"): what a device sends a server in one turn goes out
//! packed, the server answers packed, and each entry is handled as if it had come alone —
//! every promise kept. Hostile batches are counted and dropped entry by entry.

use std::time::Duration;

use pmnet_proto::{ClientEvent, Completion};
use pmnet_sim::{device_addr, server_addr, World};
use pmnet_wire::{encode_batch, Header, PacketType};

const STEPS: usize = 200_000;

#[test]
fn a_backlog_replayed_to_a_restarted_server_goes_in_batches_and_is_applied_once() {
    let clients = 4;
    let per_client = 6u32;
    let mut world = World::new(clients, Some(256)).with_batching(Duration::ZERO);
    world.run_for(Duration::from_millis(10));
    // The server is down: the device logs and acks every update, and keeps them.
    world.stop_server(0);
    let mut issued = Vec::new();
    for client in 0..clients {
        for round in 0..per_client {
            let seq = world.update(client, format!("SET k{client} v{round}").as_bytes());
            issued.push((client, seq));
        }
    }
    world.drive_until(STEPS, |world| {
        issued
            .iter()
            .all(|&(client, seq)| world.completion(client, seq).is_some())
    });
    for &(client, seq) in &issued {
        assert!(
            matches!(
                world.completion(client, seq),
                Some(ClientEvent::Completed {
                    completion: Completion::Logged { .. },
                    ..
                })
            ),
            "client {client} seq {seq}: acked by the device"
        );
    }
    assert_eq!(world.device(0).device().live_entry_count(), issued.len());
    // The server comes back and polls the device, which replays its whole log at once:
    // packed, and the server's acks go back packed too.
    world.start_server(0);
    world.drive_until(STEPS, |world| {
        world.device(0).device().live_entry_count() == 0
    });
    for client in 0..clients {
        let session = world.session(client);
        assert_eq!(
            world.applied_seqs(session),
            (1..=per_client).collect::<Vec<_>>(),
            "client {client}: every update applied, in order"
        );
        for seq in 1..=per_client {
            assert_eq!(world.servers[0].app.times_applied(session, seq), 1);
        }
    }
    let device = world
        .device(0)
        .pipeline
        .batch_counters()
        .expect("batching on");
    let server = world.servers[0].server.counters();
    assert!(device.batches_sent >= 1, "{device:?}");
    assert!(device.datagrams_batched >= 2, "{device:?}");
    assert!(server.batches_received >= 1);
    assert!(server.batches.batches_sent >= 1, "{:?}", server.batches);
    assert!(world.seen_of(PacketType::Batch).len() >= 2);
}

#[test]
fn without_batching_the_same_backlog_goes_one_datagram_each() {
    let mut world = World::new(2, Some(64));
    world.run_for(Duration::from_millis(10));
    world.stop_server(0);
    for client in 0..2 {
        for _ in 0..3 {
            world.update(client, b"SET k v");
        }
    }
    world.run_for(Duration::from_millis(50));
    world.start_server(0);
    world.drive_until(STEPS, |world| {
        world.device(0).device().live_entry_count() == 0
    });
    assert!(world.seen_of(PacketType::Batch).is_empty());
    assert_eq!(world.device(0).pipeline.batch_counters(), None);
}

#[test]
fn hostile_batches_are_dropped_entry_by_entry_and_never_nest() {
    let mut world = World::new(1, Some(64)).with_batching(Duration::ZERO);
    world.run_for(Duration::from_millis(10));
    let session = 0x5EED_0000_0000_0001;
    let good = |seq: u32| {
        Header::new(
            PacketType::UpdateRequest,
            pmnet_sim::SERVER_ID,
            session,
            seq,
        )
        .encode(b"SET a b")
    };
    // A batch inside a batch, a good entry, then an entry whose length runs past the end.
    let nested = encode_batch(pmnet_sim::SERVER_ID, 0, &[good(1), good(2)]);
    let mut bytes = encode_batch(pmnet_sim::SERVER_ID, 0, &[nested, good(1)]);
    let (header, payload) = Header::parse(&bytes).unwrap();
    let mut truncated = payload.to_vec();
    truncated.extend_from_slice(&500u16.to_be_bytes());
    truncated.extend_from_slice(&[0; 40]);
    bytes = header.encode(&truncated);
    world.inject(device_addr(0), server_addr(0), bytes.clone());
    world.run_for(Duration::from_millis(10));
    let dropped = &world.servers[0].server.counters().dropped;
    assert_eq!(dropped.get("nested_batch"), Some(&1), "{dropped:?}");
    assert_eq!(dropped.get("truncated"), Some(&1), "{dropped:?}");
    assert_eq!(
        world.applied_seqs(session),
        vec![1],
        "the good entry was applied: {:?}",
        world.servers[0].server.counters()
    );
    // The device's pipeline treats a batch from a server the same way.
    world.inject(server_addr(0), device_addr(0), bytes);
    world.run_for(Duration::from_millis(10));
    let dropped = world.device(0).pipeline.dropped();
    assert_eq!(dropped.get("nested_batch"), Some(&1), "{dropped:?}");
    assert_eq!(dropped.get("truncated"), Some(&1), "{dropped:?}");
}

#[test]
fn held_updates_wait_at_most_the_hold_and_a_read_behind_them_sends_them_at_once() {
    let hold = Duration::from_millis(5);
    let mut world = World::new(1, Some(64)).with_batching(hold);
    world.run_for(Duration::from_millis(10));
    let session = world.session(0);
    // An update is acked by the device at once, and reaches the server only when the hold
    // has passed.
    let started = world.now;
    let seq = world.update(0, b"SET a 1");
    world.drive_until(STEPS, |world| world.completion(0, seq).is_some());
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        })
    ));
    assert!(
        world.now < started + hold,
        "the ack does not wait for the hold"
    );
    assert!(world.applied_seqs(session).is_empty(), "held at the device");
    world.drive_until(STEPS, |world| !world.applied_seqs(session).is_empty());
    assert!(world.now >= started + hold, "sent when the hold passed");
    assert!(world.now < started + hold + Duration::from_millis(1));
    // Two updates then a read: the read does not wait, and takes the updates with it, first.
    let started = world.now;
    world.update(0, b"SET b 2");
    world.update(0, b"SET c 3");
    let read = world.bypass(0, b"GET c");
    world.drive_until(STEPS, |world| world.completion(0, read).is_some());
    assert!(world.now < started + hold, "the read was not held");
    assert_eq!(world.applied_seqs(session), vec![1, 2, 3, 4]);
    let counters = world.device(0).pipeline.batch_counters().unwrap();
    assert!(counters.batches_held >= 1, "{counters:?}");
}

//! Protocol behaviour, end to end through an in-memory network with a virtual clock.

use std::time::Duration;

use pmnet_proto::{ClientEvent, Completion, RequestKind};
use pmnet_sim::{client_addr, device_addr, server_addr, World, DEVICE_ID, SERVER_ID};
use pmnet_wire::{Header, PacketType};

const STEPS: usize = 100_000;

fn drive_to_completion(world: &mut World, client: usize, seq: u32) {
    world.drive_until(STEPS, |w| w.completion(client, seq).is_some());
}

fn drive_to_quiet(world: &mut World) {
    world.run_for(Duration::from_secs(5));
}

#[test]
fn update_is_acked_by_the_device_before_the_server_applies_it() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world); // the server's start-up recovery poll
    let session = world.session(0);
    // Hold the server back so the order of events is unambiguous.
    world.stop_server(0);
    let seq = world.update(0, b"x=1");
    drive_to_completion(&mut world, 0, seq);
    assert_eq!(
        world.completion(0, seq),
        Some(&ClientEvent::Completed {
            seq,
            kind: RequestKind::Update,
            completion: Completion::Logged {
                device_id: DEVICE_ID
            },
        })
    );
    assert!(
        world.applied_seqs(session).is_empty(),
        "applied before the server ran"
    );
    world.start_server(0);
    drive_to_quiet(&mut world);
    assert_eq!(world.applied_seqs(session), vec![seq]);
    // The server's later reply stops at the device, which acked the update: the client
    // completed once and is not woken for it.
    assert_eq!(world.clients[0].completed.len(), 1);
    let device = world.device(0).device().counters();
    assert_eq!(device.server_acks_absorbed, 1);
    assert_eq!(device.server_acks_forwarded, 0);
    assert_eq!(world.clients[0].client.counters().server_acks_received, 0);
}

#[test]
fn a_server_ack_the_device_owes_no_ack_for_reaches_the_client() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    // The log write never completes: the server's reply arrives first, and the device, which
    // never acked, passes it on.
    world.device_mut(0).hold_persistence = true;
    let seq = world.update(0, b"k=v");
    drive_to_completion(&mut world, 0, seq);
    assert!(world.seen_of(PacketType::PmnetAck).is_empty());
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Replied { makeup: false, .. },
            ..
        })
    ));
    let device = world.device(0).device().counters();
    assert_eq!(device.server_acks_forwarded, 1);
    assert_eq!(device.server_acks_absorbed, 0);
}

#[test]
fn a_lost_pmnet_ack_is_made_good_although_the_server_ack_stops_at_the_device() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.drop_first(|seen| seen.header.packet_type == PacketType::PmnetAck);
    let seq = world.update(0, b"k=v");
    drive_to_completion(&mut world, 0, seq);
    // The device absorbed the server's reply to the first copy, the client retransmitted,
    // and the second copy was acked again (logged anew, or answered by a make-up ACK).
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed { .. })
    ));
    assert_eq!(
        world.clients[0].client.counters().retransmitted_fragments,
        1
    );
    assert!(world.device(0).device().counters().server_acks_absorbed >= 1);
    drive_to_quiet(&mut world);
    assert_eq!(world.servers[0].app.times_applied(session, seq), 1);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn pmnet_ack_waits_for_the_log_write_to_be_durable() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    world.device_mut(0).hold_persistence = true;
    world.stop_server(0);
    let seq = world.update(0, b"k=v");
    drive_to_quiet(&mut world);
    assert!(
        world.seen_of(PacketType::PmnetAck).is_empty(),
        "ack sent before persistence"
    );
    assert!(world.completion(0, seq).is_none());
    assert_eq!(world.device(0).held.len(), 1);
    world.release_persistence(0, None);
    drive_to_completion(&mut world, 0, seq);
    assert_eq!(world.seen_of(PacketType::PmnetAck).len(), 1);
}

#[test]
fn server_ack_frees_the_log_slot() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    for index in 0..10u8 {
        world.update(0, &[index]);
    }
    drive_to_quiet(&mut world);
    let device = &world.device(0).device();
    assert_eq!(device.counters().updates_logged, 10);
    assert_eq!(device.counters().entries_invalidated, 10);
    assert_eq!(device.live_entry_count(), 0);
    assert_eq!(world.servers[0].server.counters().requests_applied, 10);
}

#[test]
fn collision_and_full_log_forward_without_ack() {
    // One slot: the second in-flight update collides, and completes on the server's reply.
    let mut world = World::new(1, Some(1));
    drive_to_quiet(&mut world);
    world.stop_server(0);
    let first = world.update(0, b"a");
    let second = world.update(0, b"b");
    // Less than one retransmission timeout: each update reached the device once.
    world.run_for(Duration::from_micros(100));
    let counters = world.device(0).device().counters().clone();
    assert_eq!(counters.updates_logged, 1);
    assert_eq!(counters.log_full + counters.log_collisions, 1);
    assert!(matches!(
        world.completion(0, first),
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        })
    ));
    assert!(
        world.completion(0, second).is_none(),
        "an unlogged update was acked"
    );
    world.start_server(0);
    drive_to_completion(&mut world, 0, second);
    // Either the server's reply or, once the slot is free again, a PMNet-ACK of a
    // retransmission completes it; both mean it is durable.
    assert!(matches!(
        world.completion(0, second),
        Some(ClientEvent::Completed { .. })
    ));
    let session = world.session(0);
    assert_eq!(world.applied_seqs(session), vec![first, second]);
}

#[test]
fn hash_collision_with_probe_limit_one_is_counted() {
    let mut world = World::new(2, Some(1));
    let now = world.now;
    let node = world.device_mut(0);
    node.config.probe_limit = 1;
    node.config.live_entries_max = 8; // so the slot, not the limit, is what runs out
    *node.pipeline.device_mut() = pmnet_proto::Device::new(node.config.clone(), now, Vec::new());
    drive_to_quiet(&mut world);
    world.stop_server(0);
    world.update(0, b"a");
    world.update(1, b"b");
    world.run_for(Duration::from_micros(100));
    let counters = world.device(0).device().counters();
    assert_eq!(counters.updates_logged, 1);
    assert_eq!(counters.log_collisions, 1);
    assert_eq!(counters.log_full, 0);
}

#[test]
fn a_forward_lost_after_the_ack_is_resent_from_the_log() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    // The device's first forward of seq 1 to the server is lost.
    world.drop_first(|seen| {
        seen.to == server_addr(0) && seen.header.packet_type == PacketType::UpdateRequest
    });
    let seq = world.update(0, b"lost on the way");
    drive_to_completion(&mut world, 0, seq);
    drive_to_quiet(&mut world);
    assert_eq!(world.applied_seqs(session), vec![seq]);
    let device = &world.device(0).device();
    assert!(device.counters().resend_timeouts >= 1);
    assert_eq!(device.live_entry_count(), 0);
}

#[test]
fn a_gap_is_filled_by_retransmission_from_the_log() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    // Lose the first forward of seq 2; seq 3 arrives and reveals the gap.
    world.drop_first(|seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.seq == 2
    });
    for payload in [b"one", b"two", b"thr"] {
        world.update(0, payload);
    }
    drive_to_quiet(&mut world);
    assert_eq!(world.applied_seqs(session), vec![1, 2, 3]);
    assert!(world.servers[0].server.counters().retransmit_requests_sent >= 1);
    assert!(world.device(0).device().counters().resent_from_log >= 1);
    assert_eq!(world.servers[0].server.counters().requests_reordered, 1);
}

#[test]
fn a_gap_not_in_the_log_is_passed_to_the_client() {
    // Without a slot for seq 2 (one-slot log, held persistence keeps seq 1 there), the
    // device cannot answer the retransmission request; the client resends.
    let mut world = World::new(1, Some(1));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.drop_first(|seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.seq == 2
    });
    world.device_mut(0).hold_persistence = true;
    world.update(0, b"one");
    world.update(0, b"two");
    world.update(0, b"thr");
    world.run_for(Duration::from_micros(500));
    world.device_mut(0).hold_persistence = false;
    world.release_persistence(0, None);
    drive_to_quiet(&mut world);
    assert_eq!(world.applied_seqs(session), vec![1, 2, 3]);
    assert!(
        world.clients[0]
            .client
            .counters()
            .retransmit_requests_answered
            >= 1
            || world.clients[0].client.counters().retransmitted_fragments >= 1
    );
}

#[test]
fn reordered_requests_are_applied_in_sequence_order() {
    let mut world = World::new(1, None); // client straight to server
    let session = world.session(0);
    // Delay seq 1 by dropping its first transmission; the client's timer resends it.
    world.drop_first(|seen| {
        seen.header.packet_type == PacketType::UpdateRequest && seen.header.seq == 1
    });
    for index in 0..5u8 {
        world.update(0, &[index]);
    }
    drive_to_quiet(&mut world);
    assert_eq!(world.applied_seqs(session), vec![1, 2, 3, 4, 5]);
    assert_eq!(world.servers[0].server.counters().requests_reordered, 4);
    assert!(world.clients[0].completed.len() == 5);
}

#[test]
fn a_redone_update_is_not_applied_twice_and_gets_a_makeup_ack() {
    let mut world = World::new(1, None);
    let session = world.session(0);
    // Every server reply to seq 1 is lost once: the client retransmits.
    world.drop_first(|seen| seen.header.packet_type == PacketType::ServerAck);
    let seq = world.update(0, b"once");
    drive_to_completion(&mut world, 0, seq);
    assert_eq!(world.servers[0].app.times_applied(session, seq), 1);
    assert_eq!(world.servers[0].server.counters().makeup_acks_sent, 1);
    assert_eq!(
        world.completion(0, seq),
        Some(&ClientEvent::Completed {
            seq,
            kind: RequestKind::Update,
            completion: Completion::Replied {
                reply: b"ok".to_vec(),
                makeup: true
            },
        })
    );
}

#[test]
fn large_requests_are_fragmented_logged_and_acked_per_fragment() {
    let mut world = World::new(1, Some(256));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.stop_server(0);
    let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let seq = world.update(0, &payload);
    drive_to_completion(&mut world, 0, seq);
    let acks = world.seen_of(PacketType::PmnetAck);
    assert_eq!(acks.len(), 4, "5000 bytes in 1440-byte fragments");
    assert!(acks.iter().all(|seen| seen.header.fragment_count == 4));
    world.start_server(0);
    drive_to_quiet(&mut world);
    assert_eq!(world.servers[0].app.applied.len(), 1);
    assert_eq!(
        world.servers[0].app.applied[0].3, payload,
        "reassembled in order"
    );
    assert_eq!(world.applied_seqs(session), vec![seq]);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn a_lost_fragment_ack_resends_only_that_fragment() {
    let mut world = World::new(1, Some(256));
    drive_to_quiet(&mut world);
    world.drop_first(|seen| {
        seen.header.packet_type == PacketType::PmnetAck && seen.header.fragment_index == 2
    });
    world.stop_server(0);
    let seq = world.update(0, &vec![7u8; 4000]);
    drive_to_completion(&mut world, 0, seq);
    let counters = world.clients[0].client.counters();
    assert_eq!(counters.retransmitted_fragments, 1);
    assert_eq!(world.device(0).device().counters().duplicate_updates, 1);
}

#[test]
fn a_bypass_read_sees_the_sessions_earlier_updates() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    // The server is slow to receive the updates: they are all acked by the device first.
    world.stop_server(0);
    for index in 0..5u8 {
        world.update(0, &[index]);
    }
    let read = world.bypass(0, b"read");
    world.run_for(Duration::from_micros(200));
    assert!(
        world.completion(0, read).is_none(),
        "a bypass completed without the server"
    );
    world.start_server(0);
    drive_to_completion(&mut world, 0, read);
    assert_eq!(
        world.completion(0, read),
        Some(&ClientEvent::Completed {
            seq: read,
            kind: RequestKind::Bypass,
            completion: Completion::Replied {
                reply: 5u32.to_be_bytes().to_vec(),
                makeup: false
            },
        })
    );
    assert!(world
        .seen_of(PacketType::PmnetAck)
        .iter()
        .all(|seen| seen.header.seq != read));
}

#[test]
fn device_restart_rebuilds_its_index_and_replays_the_log() {
    let mut world = World::new(2, Some(64));
    drive_to_quiet(&mut world);
    world.stop_server(0);
    for index in 0..4u8 {
        world.update(0, &[index]);
        world.update(1, &[index]);
    }
    drive_to_quiet(&mut world);
    assert_eq!(world.device(0).device().live_entry_count(), 8);
    world.restart_device(0);
    let device = &world.device(0).device();
    assert_eq!(device.counters().entries_recovered, 8);
    assert_eq!(device.live_entry_count(), 8);
    world.start_server(0);
    drive_to_quiet(&mut world);
    for client in 0..2 {
        let session = world.session(client);
        assert_eq!(world.applied_seqs(session), vec![1, 2, 3, 4]);
    }
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn device_crash_before_persist_completes_loses_no_acked_update() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    world.stop_server(0);
    let acked = world.update(0, b"acked");
    drive_to_completion(&mut world, 0, acked);
    world.device_mut(0).hold_persistence = true;
    let pending = world.update(0, b"not yet durable");
    world.run_for(Duration::from_micros(100));
    assert!(world.completion(0, pending).is_none());
    world.restart_device(0); // the held write never happened
    assert_eq!(world.device(0).device().live_entry_count(), 1);
    world.start_server(0);
    drive_to_quiet(&mut world);
    let session = world.session(0);
    // The unacked update is retransmitted by the client and applied after the acked one.
    assert_eq!(world.applied_seqs(session), vec![acked, pending]);
}

#[test]
fn server_restart_polls_the_device_and_applies_pending_entries_first() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.update(0, b"applied before the crash");
    drive_to_quiet(&mut world);
    world.stop_server(0);
    let logged: Vec<u32> = (0..3u8).map(|index| world.update(0, &[index])).collect();
    drive_to_quiet(&mut world);
    assert!(logged.iter().all(|seq| world.completion(0, *seq).is_some()));
    world.start_server(0);
    assert!(world.servers[0].server.is_recovering());
    drive_to_quiet(&mut world);
    assert!(!world.servers[0].server.is_recovering());
    assert_eq!(world.applied_seqs(session), vec![1, 2, 3, 4]);
    assert!(world.device(0).device().counters().recovery_entries_resent >= 3);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
    // A duplicate after the restart is answered from the stored reply, not applied.
    let redo = Header::new(PacketType::UpdateRequest, SERVER_ID, session, 4).encode(&[2]);
    world.inject(device_addr(0), server_addr(0), redo);
    drive_to_quiet(&mut world);
    assert_eq!(world.servers[0].app.times_applied(session, 4), 1);
    assert!(world.servers[0].server.counters().makeup_acks_sent >= 1);
}

#[test]
fn bad_datagrams_are_counted_and_dropped() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let mut corrupt = Header::new(PacketType::UpdateRequest, SERVER_ID, 1, 1).encode(b"payload");
    corrupt[35] ^= 0xFF;
    world.inject(client_addr(0), device_addr(0), corrupt);
    world.inject(client_addr(0), device_addr(0), b"not pmnet at all".to_vec());
    world.inject(client_addr(0), device_addr(0), vec![0x50, 0x4e, 0x01]);
    let unknown_server = Header::new(PacketType::UpdateRequest, 99, 1, 1).encode(b"x");
    world.inject(client_addr(0), device_addr(0), unknown_server);
    // A server-ACK forged by a client must not invalidate anything.
    let forged = Header::new(PacketType::ServerAck, SERVER_ID, 1, 1).encode(b"");
    world.inject(client_addr(0), device_addr(0), forged);
    drive_to_quiet(&mut world);
    let dropped = world.device(0).pipeline.dropped();
    assert_eq!(dropped.get("bad_checksum"), Some(&1));
    assert_eq!(dropped.get("bad_magic"), Some(&1));
    assert_eq!(dropped.get("truncated"), Some(&1));
    assert_eq!(dropped.get("unknown_server"), Some(&1));
    assert_eq!(dropped.get("unexpected_source"), Some(&1));
    // And it keeps serving.
    let seq = world.update(0, b"still works");
    drive_to_completion(&mut world, 0, seq);
}

#[test]
fn baseline_without_a_device_completes_on_the_server_reply() {
    let mut world = World::new(1, None);
    let seq = world.update(0, b"direct");
    drive_to_completion(&mut world, 0, seq);
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Replied { makeup: false, .. },
            ..
        })
    ));
}

#[test]
fn a_request_that_is_never_acknowledged_fails_after_bounded_retries() {
    let mut world = World::new(1, None);
    world.drop_when(|seen| seen.header.packet_type == PacketType::UpdateRequest);
    let seq = world.update(0, b"into the void");
    drive_to_completion(&mut world, 0, seq);
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Failed { .. })
    ));
    let sent = world.seen_of(PacketType::UpdateRequest).len() as u32;
    assert_eq!(sent, 1 + world.clients[0].client.config().retransmits_max);
}

#[test]
fn the_window_bounds_requests_in_flight() {
    let mut world = World::new(1, Some(64));
    let window = world.clients[0].client.config().window;
    world.stop_server(0);
    world.device_mut(0).hold_persistence = true;
    for index in 0..window {
        world.clients[0]
            .client
            .update(world.now, &index.to_be_bytes())
            .unwrap();
    }
    assert_eq!(
        world.clients[0].client.update(world.now, b"one too many"),
        Err(pmnet_proto::ClientError::WindowFull)
    );
}

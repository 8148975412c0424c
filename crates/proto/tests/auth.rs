//! Attacks of someone on the path who does not hold the deployment key: each succeeds without
//! authentication and fails with it (the datagram is counted as an authentication failure and
//! dropped, never answered).

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{Authenticator, ClientEvent, Completion, DeploymentKey, KeySet, RequestKind};
use pmnet_sim::{client_addr, device_addr, server_addr, World, SERVER_ID};
use pmnet_wire::{flags, Header, PacketType};

const STEPS: usize = 100_000;

fn keys(id: u16) -> KeySet {
    KeySet::new(vec![DeploymentKey::new(id, [0x42 ^ id as u8; 32])])
}

/// A world of one client, one device (64 slots) and one server, quiet, with or without keys.
fn world(auth: bool) -> World {
    let mut world = World::new(1, Some(64));
    if auth {
        world = world.with_auth(keys(1));
    }
    world.run_for(Duration::from_secs(1));
    world
}

fn attacker() -> SocketAddr {
    "10.66.66.66:6666".parse().unwrap()
}

/// The forger's variants of a datagram: as it is (no tag), and with the flag and a made-up
/// trailer (a guess at the tag).
fn forgeries(header: Header, payload: &[u8]) -> Vec<Vec<u8>> {
    let plain = header.encode(payload);
    let mut guessed = Header {
        flags: header.flags | flags::AUTHENTICATED,
        ..header
    }
    .encode(payload);
    guessed.extend_from_slice(&1u16.to_be_bytes());
    guessed.extend_from_slice(&[0xA5; pmnet_auth::TRAILER_LEN - 2]);
    vec![plain, guessed]
}

fn auth_drops(counts: &std::collections::BTreeMap<&'static str, u64>) -> u64 {
    [
        "unauthenticated",
        "bad_tag",
        "unknown_key",
        "auth_truncated",
    ]
    .iter()
    .filter_map(|reason| counts.get(reason))
    .sum()
}

fn payload_applied(world: &World, session: u64, seq: u32) -> Option<Vec<u8>> {
    world.servers[0]
        .app
        .applied
        .iter()
        .find(|(s, q, _, _)| *s == session && *q == seq)
        .map(|(_, _, _, request)| request.clone())
}

/// A forged update with the victim's session and next sequence number, sent to the device:
/// without keys it is logged, acked and applied in place of the victim's own.
fn forged_update(auth: bool) -> (Option<Vec<u8>>, u64) {
    let mut world = world(auth);
    let session = world.session(0);
    let first = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, first).is_some());
    for forged in forgeries(
        Header::new(PacketType::UpdateRequest, SERVER_ID, session, 2),
        b"x=evil",
    ) {
        world.inject(attacker(), device_addr(0), forged);
    }
    world.run_for(Duration::from_millis(50));
    let second = world.update(0, b"x=2");
    world.drive_until(STEPS, |w| w.completion(0, second).is_some());
    world.run_for(Duration::from_secs(1));
    (
        payload_applied(&world, session, 2),
        auth_drops(&world.device(0).pipeline.dropped()),
    )
}

#[test]
fn a_forged_update_is_applied_without_keys_and_dropped_with_them() {
    assert_eq!(forged_update(false).0.as_deref(), Some(&b"x=evil"[..]));
    let (applied, dropped) = forged_update(true);
    assert_eq!(applied.as_deref(), Some(&b"x=2"[..]));
    assert_eq!(dropped, 2);
}

/// A forged server-ACK from the server's address frees the device's log entry of an update the
/// server never applied: without keys the acknowledged write is lost.
fn forged_server_ack(auth: bool) -> (Vec<u32>, u64) {
    let mut world = world(auth);
    let session = world.session(0);
    world.stop_server(0);
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        })
    ));
    for forged in forgeries(
        Header::new(PacketType::ServerAck, SERVER_ID, session, seq),
        b"OK",
    ) {
        world.inject(server_addr(0), device_addr(0), forged);
    }
    world.run_for(Duration::from_millis(1));
    let live = world.device(0).device().live_entry_count();
    world.start_server(0);
    world.run_for(Duration::from_secs(5));
    assert!(live <= 1);
    (
        world.applied_seqs(session),
        auth_drops(&world.device(0).pipeline.dropped()),
    )
}

#[test]
fn a_forged_server_ack_loses_an_acked_write_without_keys_and_is_dropped_with_them() {
    assert_eq!(forged_server_ack(false).0, Vec::<u32>::new());
    let (applied, dropped) = forged_server_ack(true);
    assert_eq!(applied, vec![1]);
    assert_eq!(dropped, 2);
}

/// A forged PMNet-ACK makes the client report "durable" for a write nobody logged.
fn forged_pmnet_ack(auth: bool) -> (bool, u64) {
    let mut world = world(auth);
    let session = world.session(0);
    world.stop_device(0);
    let seq = world.update(0, b"x=1");
    let mut ack = Header::new(PacketType::PmnetAck, SERVER_ID, session, seq);
    ack.device_id = 7;
    for forged in forgeries(ack, b"") {
        world.inject(device_addr(0), client_addr(0), forged);
    }
    world.run_for(Duration::from_millis(1));
    let completed = matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        })
    );
    (
        completed,
        auth_drops(&world.clients[0].client.counters().dropped),
    )
}

#[test]
fn a_forged_pmnet_ack_completes_an_unlogged_write_without_keys_and_is_dropped_with_them() {
    assert!(forged_pmnet_ack(false).0);
    assert_eq!(forged_pmnet_ack(true), (false, 2));
}

/// A forged reply to a read (a server-ACK with the forger's value).
fn forged_reply(auth: bool) -> (Option<Vec<u8>>, u64) {
    let mut world = world(auth);
    let session = world.session(0);
    world.stop_server(0);
    let seq = world.bypass(0, b"GET k");
    for forged in forgeries(
        Header::new(PacketType::ServerAck, SERVER_ID, session, seq),
        b"forged",
    ) {
        world.inject(device_addr(0), client_addr(0), forged);
    }
    world.run_for(Duration::from_millis(1));
    world.start_server(0);
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    let reply = match world.completion(0, seq) {
        Some(ClientEvent::Completed {
            kind: RequestKind::Bypass,
            completion: Completion::Replied { reply, .. },
            ..
        }) => Some(reply.clone()),
        _ => None,
    };
    (
        reply,
        auth_drops(&world.clients[0].client.counters().dropped),
    )
}

#[test]
fn a_forged_reply_is_believed_without_keys_and_dropped_with_them() {
    assert_eq!(forged_reply(false).0.as_deref(), Some(&b"forged"[..]));
    let (reply, dropped) = forged_reply(true);
    assert_ne!(reply.as_deref(), Some(&b"forged"[..]));
    assert!(reply.is_some());
    assert_eq!(dropped, 2);
}

/// A forged first fragment of a two-fragment request under the victim's next number, sent to
/// the server: without keys the server holds it and the victim's own request of that number
/// never completes the assembly.
fn wedge(auth: bool) -> (Vec<u32>, u64) {
    let mut world = world(auth);
    let session = world.session(0);
    let mut fragment = Header::new(PacketType::UpdateRequest, SERVER_ID, session, 1);
    fragment.fragment_count = 2;
    for forged in forgeries(fragment, b"half") {
        world.inject(device_addr(0), server_addr(0), forged);
    }
    world.run_for(Duration::from_millis(1));
    let seqs: Vec<u32> = (0..3)
        .map(|i| world.update(0, format!("x={i}").as_bytes()))
        .collect();
    world.run_for(Duration::from_secs(5));
    let _ = seqs;
    (
        world.applied_seqs(session),
        auth_drops(&world.servers[0].server.counters().dropped),
    )
}

#[test]
fn a_forged_fragment_cannot_wedge_a_session_with_keys() {
    let (applied, dropped) = wedge(true);
    assert_eq!(applied, vec![1, 2, 3]);
    assert_eq!(dropped, 2);
    // Without keys the forged fragment is taken as the start of request 1.
    let (applied, _) = wedge(false);
    assert_ne!(
        applied,
        vec![1, 2, 3],
        "the forged fragment wedged nothing without keys"
    );
}

#[test]
fn a_replayed_update_is_applied_once() {
    let mut world = world(true);
    let session = world.session(0);
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    world.run_for(Duration::from_secs(1));
    // What an eavesdropper captured: the genuine sealed datagram.
    let mut captured =
        Header::new(PacketType::UpdateRequest, SERVER_ID, session, seq).encode(b"x=1");
    Authenticator::new(keys(1)).seal(&mut captured);
    for _ in 0..3 {
        world.inject(attacker(), device_addr(0), captured.clone());
        world.inject(device_addr(0), server_addr(0), captured.clone());
    }
    world.run_for(Duration::from_secs(1));
    assert_eq!(world.servers[0].app.times_applied(session, seq), 1);
}

#[test]
fn a_client_with_a_revoked_key_is_refused() {
    let mut world = World::new(1, Some(64)).with_auth(keys(2));
    world.reconfigure_client(0, |config| config.auth = Some(Authenticator::new(keys(1))));
    world.run_for(Duration::from_secs(1));
    let session = world.session(0);
    world.update(0, b"x=1");
    world.run_for(Duration::from_secs(1));
    assert!(world.applied_seqs(session).is_empty());
    assert!(
        world
            .device(0)
            .pipeline
            .dropped()
            .get("unknown_key")
            .copied()
            .unwrap_or(0)
            >= 1
    );
}

#[test]
fn a_device_forwards_each_update_with_the_trailer_it_came_with() {
    let mut world = World::new(1, Some(64))
        .with_batching(Duration::ZERO)
        .with_auth(keys(1));
    world.run_for(Duration::from_secs(1));
    let before = world.device(0).pipeline.seal_counts().unwrap();
    let updates = 20;
    for round in 0..updates {
        let seq = world.update(0, format!("k{round}=v").as_bytes());
        world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    }
    world.run_for(Duration::from_secs(1));
    let after = world.device(0).pipeline.seal_counts().unwrap();
    // Each update is verified, then forwarded unchanged: its trailer goes with it. The
    // device computes a MAC only for what it makes itself (its acks).
    assert_eq!(
        after.reused - before.reused,
        updates,
        "{before:?} -> {after:?}"
    );
}

//! A device acks only what its server can apply: a device and a server with different key
//! files (one keyed and one not, or two different keys) never PMNet-ACK — the client waits for
//! the server's reply and fails naming why — and the device says why, naming the server. With
//! the same keys on both, writes are acked as before.

use std::time::Duration;

use pmnet_proto::{ClientError, ClientEvent, Completion, DeploymentKey, KeySet};
use pmnet_sim::{server_addr, World, SERVER_ID};
use pmnet_wire::{NotLoggedReason, PacketType};

const STEPS: usize = 1_000_000;

fn keys(id: u16, secret: u8) -> KeySet {
    KeySet::new(vec![DeploymentKey::new(id, [secret; 32])])
}

/// One write through a world whose device, server and client hold `device`, `server` and
/// `client` keys: how it ended, PMNet-ACKs seen, and why the device does not trust its server.
fn write_through(
    device: Option<KeySet>,
    server: Option<KeySet>,
    client: Option<KeySet>,
) -> (ClientEvent, usize, Option<String>) {
    let mut world = World::new(1, Some(64)).with_keys(device, server, client);
    // Past the device's start-up grace (it logs and holds acks while it waits for the
    // server's first answer).
    world.run_for(Duration::from_secs(1));
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    let event = world
        .completion(0, seq)
        .expect("a request ends, acked or failed")
        .clone();
    let acks = world.seen_of(PacketType::PmnetAck).len();
    let now = world.now;
    let reason = world
        .device(0)
        .device()
        .server_unverified_reason(SERVER_ID, now);
    (event, acks, reason)
}

fn assert_refused(outcome: (ClientEvent, usize, Option<String>), named: &str) {
    let (event, acks, reason) = outcome;
    assert_eq!(
        acks, 0,
        "no PMNet-ACK for a server that cannot apply the write"
    );
    match event {
        ClientEvent::Failed { error, .. } => {
            assert_eq!(
                error,
                ClientError::NotLogged(NotLoggedReason::ServerUnverified),
                "the client's failure says why no ack came"
            );
            assert!(error.to_string().contains("--key-file"), "{error}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    let reason = reason.expect("the device says why it does not ack");
    assert!(
        reason.contains(&server_addr(0).to_string()) && reason.contains("--key-file"),
        "{reason}"
    );
    assert!(reason.contains(named), "{reason} should name {named}");
}

#[test]
fn a_keyed_device_in_front_of_an_unkeyed_server_acks_nothing() {
    assert_refused(
        write_through(Some(keys(1, 7)), None, Some(keys(1, 7))),
        "unauthenticated",
    );
}

#[test]
fn an_unkeyed_device_in_front_of_a_keyed_server_acks_nothing() {
    assert_refused(
        write_through(None, Some(keys(1, 7)), None),
        "sealed_without_key",
    );
}

#[test]
fn a_device_and_a_server_with_different_keys_ack_nothing() {
    assert_refused(
        write_through(Some(keys(1, 7)), Some(keys(2, 7)), Some(keys(1, 7))),
        "unknown_key",
    );
    assert_refused(
        write_through(Some(keys(1, 7)), Some(keys(1, 8)), Some(keys(1, 7))),
        "bad_tag",
    );
}

#[test]
fn the_same_keys_on_both_ack_as_before() {
    for keys in [None, Some(keys(1, 7))] {
        let (event, acks, reason) = write_through(keys.clone(), keys.clone(), keys);
        assert!(
            matches!(
                event,
                ClientEvent::Completed {
                    completion: Completion::Logged { .. },
                    ..
                }
            ),
            "{event:?}"
        );
        assert!(acks >= 1);
        assert_eq!(reason, None);
    }
}

/// A device started while its server is down acks nothing, and warns that the server answers
/// none of its probes; once the server is up and answers, writes are acked again.
/// (See also `the_first_writes_are_acked_once_the_server_answers`.)
#[test]
fn a_device_acks_once_its_server_answers() {
    let mut world = World::new(1, Some(64));
    world.stop_server(0);
    world.restart_device(0);
    world.run_for(Duration::from_secs(2));
    let now = world.now;
    let reason = world
        .device(0)
        .device()
        .server_unverified_reason(SERVER_ID, now)
        .expect("unverified while the server is down");
    assert!(reason.contains("answered none"), "{reason}");
    world.start_server(0);
    world.drive_until(STEPS, |w| w.device(0).device().server_verified(SERVER_ID));
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert!(
        matches!(
            world.completion(0, seq),
            Some(ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            })
        ),
        "{:?}",
        world.completion(0, seq)
    );
}

/// Writes that reach a device before its server's first answer (the start-up round trip) are
/// logged and acked once the answer verifies: late, not lost to the server's reply.
#[test]
fn the_first_writes_are_acked_once_the_server_answers() {
    let keys = Some(keys(1, 7));
    let mut world = World::new(1, Some(64)).with_keys(keys.clone(), keys.clone(), keys);
    // The server's first answer is late: its probe answers are lost for 100 ms.
    world.drop_when(|seen| {
        seen.header.packet_type == PacketType::Probe && seen.at.as_nanos() < 100_000_000
    });
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert!(
        matches!(
            world.completion(0, seq),
            Some(ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            })
        ),
        "{:?}",
        world.completion(0, seq)
    );
    // Acked while the server was silent (silence is no evidence against it: it may be
    // down), and verified once its answer comes.
    world.drive_until(STEPS, |w| w.device(0).device().server_verified(SERVER_ID));
    assert!(world.device(0).device().server_verified(SERVER_ID));
}

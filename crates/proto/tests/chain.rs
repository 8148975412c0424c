//! Devices in series (docs/replication.md), on the simulator's network: a client that wants R
//! devices' acks completes an update only once R distinct devices logged every fragment; each
//! device of the chain logs it; the server applies it once; the server-ACK travels back
//! through every device and frees each one's entry. Randomised runs print their seed;
//! `PMNET_SEED=N` replays one.

use std::time::Duration;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use pmnet_proto::{ClientEvent, Completion, DeploymentKey, KeySet};
use pmnet_sim::{Faults, Topology, World};
use pmnet_wire::replication::CLIENT_ADDRESS;
use pmnet_wire::{Header, PacketType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn chain(devices: usize, replicas: u8) -> World {
    let mut world = World::with_topology(Topology {
        client_count: 1,
        device_slot_counts: vec![256; devices],
        server_count: 1,
        chain: true,
        server_replicas: 0,
    });
    world.reconfigure_client(0, |config| config.replicas = replicas);
    world.run_for(Duration::from_millis(50));
    world
}

fn logged(world: &World, device: usize) -> u64 {
    world.device(device).device().counters().updates_logged
}

fn live_entries(world: &World) -> Vec<usize> {
    (0..world.devices.len())
        .map(|device| world.device(device).device().live_entry_count())
        .collect()
}

#[test]
fn an_update_completes_on_acks_from_every_device_of_the_chain() {
    let mut world = chain(3, 3);
    // The server is down: only the devices' acks can complete the update.
    world.stop_server(0);
    let seq = world.update(0, b"k=v");
    // Each hop takes 5 µs: the first device's ack reaches the client after 10 µs, the third's
    // (relayed by the two before it) after 30 µs. Not complete on the first two.
    world.run_for(Duration::from_micros(22));
    assert!(world.completion(0, seq).is_none(), "two acks are not three");
    world.run_for(Duration::from_millis(1));
    match world.completion(0, seq) {
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        }) => {}
        other => panic!("expected completion on the devices' acks, got {other:?}"),
    }
    for device in 0..3 {
        assert_eq!(logged(&world, device), 1, "device {device} logged it");
    }
    assert_eq!(
        live_entries(&world),
        vec![1, 1, 1],
        "held until the server acks"
    );
    world.start_server(0);
    world.run_for(Duration::from_secs(1));
    assert_eq!(world.servers[0].app.applied.len(), 1, "applied once");
    assert_eq!(
        live_entries(&world),
        vec![0, 0, 0],
        "the server-ACK freed every entry"
    );
    let relayed: u64 = (0..3)
        .map(|device| world.device(device).device().counters().chain_acks_relayed)
        .sum();
    assert_eq!(
        relayed, 3,
        "device 1 relays device 2's and 3's acks, device 2 device 3's"
    );
}

#[test]
fn a_client_wanting_fewer_acks_than_devices_completes_on_the_first_ones() {
    let mut world = chain(3, 2);
    world.stop_server(0);
    let seq = world.update(0, b"k=v");
    world.run_for(Duration::from_micros(22));
    assert!(
        matches!(
            world.completion(0, seq),
            Some(ClientEvent::Completed { .. })
        ),
        "two devices' acks are enough"
    );
    world.start_server(0);
    world.run_for(Duration::from_secs(1));
    assert_eq!(live_entries(&world), vec![0, 0, 0]);
}

#[test]
fn updates_through_a_lossy_chain_complete_and_are_applied_once_in_order() {
    let seed: u64 = match std::env::var("PMNET_SEED") {
        Ok(text) => text.parse().expect("PMNET_SEED is a number"),
        Err(_) => rand::rng().random(),
    };
    eprintln!("PMNET_SEED={seed}");
    let mut world = chain(3, 3);
    world.network.faults = Some(Faults {
        rng: ChaCha8Rng::seed_from_u64(seed),
        loss: 0.05,
        duplicate: 0.02,
        jitter: Duration::from_micros(20),
        corrupt: 0.0,
    });
    let mut issued = Vec::new();
    for value in 0..200u32 {
        while !world.clients[0].client.can_send() {
            world.run_for(Duration::from_micros(50));
        }
        issued.push(world.update(0, format!("k={value}").as_bytes()));
        world.run_for(Duration::from_micros(30));
    }
    world.network.faults = None;
    world.run_for(Duration::from_secs(5));
    for &seq in &issued {
        match world.completion(0, seq) {
            Some(ClientEvent::Completed { .. }) => {}
            other => panic!("seed {seed}: update {seq} ended {other:?}"),
        }
    }
    let applied: Vec<u32> = world.servers[0]
        .app
        .applied
        .iter()
        .map(|(_, seq, ..)| *seq)
        .collect();
    assert_eq!(applied, issued, "seed {seed}: once each, in order");
    assert_eq!(live_entries(&world), vec![0, 0, 0], "seed {seed}");
}

/// A client that waits for one device's ack in a chain: the first device keeps back the
/// server-ACK (its client has every ack it needs), but the devices after it get it — the first
/// device marks what it forwards to a device it heard PMNet-ACKs from as `REPLICATED`, so no
/// device behind it takes it for a client and keeps the server-ACK back.
#[test]
fn a_chain_frees_every_entry_when_clients_wait_for_one_device() {
    let mut world = chain(3, 1);
    let mut issued = Vec::new();
    for value in 0..20u32 {
        while !world.clients[0].client.can_send() {
            world.run_for(Duration::from_micros(50));
        }
        issued.push(world.update(0, format!("k={value}").as_bytes()));
        world.run_for(Duration::from_micros(30));
    }
    world.run_for(Duration::from_secs(5));
    for &seq in &issued {
        assert!(matches!(
            world.completion(0, seq),
            Some(ClientEvent::Completed { .. })
        ));
    }
    assert_eq!(world.servers[0].app.applied.len(), 20, "applied once each");
    assert_eq!(
        live_entries(&world),
        vec![0, 0, 0],
        "every device's entries freed by the server-ACKs"
    );
}

/// An update the first device logged and acked never reaches the second one (every copy is
/// lost on that link), and a later update does: the server sees a gap that the last device —
/// the one it asks — knows nothing of. It must not skip it: the second device passes the
/// fill query on to the first, which holds the update, so the gap waits for it however long
/// the link stays bad, and the update is applied in order once the link carries it.
#[test]
fn a_gap_that_only_the_first_device_of_a_chain_holds_is_never_skipped() {
    let mut world = chain(2, 1);
    let (first, second) = (pmnet_sim::device_addr(0), pmnet_sim::device_addr(1));
    world.drop_when(move |seen| {
        seen.from == first
            && seen.to == second
            && seen.header.packet_type == pmnet_wire::PacketType::UpdateRequest
            && seen.header.seq == 1
    });
    let lost = world.update(0, b"a=1");
    world.run_for(Duration::from_millis(5));
    assert!(
        matches!(
            world.completion(0, lost),
            Some(ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            })
        ),
        "acked by the first device: {:?}",
        world.completion(0, lost)
    );
    let later = world.update(0, b"b=2");
    // Far past every request lifetime: a gap with no device's hold would be skipped by now.
    world.run_for(Duration::from_secs(90));
    let session = world.session(0);
    assert!(
        world.applied_seqs(session).is_empty(),
        "nothing out of order"
    );
    assert_eq!(
        world.servers[0].server.counters().sequence_numbers_skipped,
        0,
        "the acked update was skipped"
    );
    assert!(
        world.device(1).device().counters().fill_queries_passed_on > 0,
        "the second device asked the first"
    );
    world.clear_drop_rules();
    world.run_for(Duration::from_secs(5));
    assert_eq!(world.applied_seqs(session), vec![lost, later]);
    assert_eq!(live_entries(&world), vec![0, 0]);
}

/// Every datagram the network carries from now on: (from, to, header).
fn watch(world: &mut World) -> Rc<RefCell<Vec<(SocketAddr, SocketAddr, Header)>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = Rc::clone(&seen);
    world.drop_when(move |datagram| {
        log.borrow_mut()
            .push((datagram.from, datagram.to, datagram.header));
        false
    });
    seen
}

/// The PMNet-ACKs of `seq` the network carried: (from, to, device id).
fn acks_of(
    seen: &RefCell<Vec<(SocketAddr, SocketAddr, Header)>>,
    seq: u32,
) -> Vec<(SocketAddr, SocketAddr, u16)> {
    seen.borrow()
        .iter()
        .filter(|(_, _, header)| header.packet_type == PacketType::PmnetAck && header.seq == seq)
        .map(|(from, to, header)| (*from, *to, header.device_id))
        .collect()
}

fn device_counter(
    world: &World,
    device: usize,
    get: fn(&pmnet_proto::DeviceCounters) -> u64,
) -> u64 {
    get(world.device(device).device().counters())
}

/// Once each device knows the next one for a device (its PMNet-ACK of the first update), it
/// forwards every update with the client's address, and each device after the first acks the
/// client directly: three devices cost four hops to the last ack (20 µs at 5 µs a hop), not
/// six. Nothing is relayed; the server never sees the address; the server-ACK still travels
/// back through every device and frees each entry. With keys: every device re-seals what it
/// forwards, address and all, and the next one verifies it.
#[test]
fn each_device_of_a_chain_acks_the_client_directly_when_it_follows_a_named_device() {
    for keyed in [false, true] {
        let mut world = chain(3, 3);
        if keyed {
            world = world.with_auth(KeySet::new(vec![DeploymentKey::new(1, [0x42; 32])]));
            world.run_for(Duration::from_millis(50));
        }
        world.stop_server(0);
        // The first update teaches each device that its "server" is a device (its ack).
        let first = world.update(0, b"a=1");
        world.run_for(Duration::from_millis(1));
        assert!(
            matches!(
                world.completion(0, first),
                Some(ClientEvent::Completed { .. })
            ),
            "keys {keyed}: {:?}",
            world.completion(0, first)
        );
        let relayed_before: u64 = (0..3)
            .map(|device| device_counter(&world, device, |c| c.chain_acks_relayed))
            .sum();
        let seen = watch(&mut world);
        let seq = world.update(0, b"b=2");
        world.run_for(Duration::from_micros(22));
        match world.completion(0, seq) {
            Some(ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            }) => {}
            other => panic!("keys {keyed}: four hops to the last ack, got {other:?}"),
        }
        let client = pmnet_sim::client_addr(0);
        let mut acks = acks_of(&seen, seq);
        acks.sort();
        let expected: Vec<(SocketAddr, SocketAddr, u16)> = (0..3)
            .map(|device| {
                (
                    pmnet_sim::device_addr(device),
                    client,
                    pmnet_sim::DEVICE_ID + device as u16,
                )
            })
            .collect();
        assert_eq!(
            acks, expected,
            "keys {keyed}: each device acked the client itself"
        );
        let relayed_after: u64 = (0..3)
            .map(|device| device_counter(&world, device, |c| c.chain_acks_relayed))
            .sum();
        assert_eq!(
            relayed_after, relayed_before,
            "keys {keyed}: nothing relayed"
        );
        for device in 0..2 {
            assert!(device_counter(&world, device, |c| c.client_addresses_carried) >= 1);
        }
        for device in 1..3 {
            assert_eq!(device_counter(&world, device, |c| c.acks_sent_direct), 1);
        }
        world.start_server(0);
        world.run_for(Duration::from_secs(1));
        assert_eq!(
            world.servers[0].app.applied.len(),
            2,
            "keys {keyed}: applied once each"
        );
        assert_eq!(live_entries(&world), vec![0, 0, 0], "keys {keyed}");
        let to_server = pmnet_sim::server_addr(0);
        assert!(
            seen.borrow()
                .iter()
                .all(|(_, to, header)| *to != to_server || !header.has_flag(CLIENT_ADDRESS)),
            "keys {keyed}: the server never gets a client's address"
        );
        assert!(!world.servers[0]
            .server
            .counters()
            .dropped
            .contains_key("bad_client_address"));
        for device in 0..3 {
            let dropped = world.device(device).pipeline.dropped();
            for reason in [
                "auth_truncated",
                "unauthenticated",
                "unknown_key",
                "bad_tag",
                "stale",
                "from_the_future",
                "sealed_without_key",
                "bad_client_address",
            ] {
                assert!(
                    !dropped.contains_key(reason),
                    "keys {keyed}: device {device} dropped {dropped:?}"
                );
            }
        }
    }
}

/// Without `--previous-device` a device does not believe an address another one carries: it
/// acks the source, as before, and the acks travel back along the chain (six hops).
#[test]
fn without_previous_devices_acks_travel_back_along_the_chain() {
    let mut world = chain(3, 3);
    for device in 1..3 {
        world.devices[device].config.previous_devices.clear();
        world.restart_device(device);
    }
    world.run_for(Duration::from_millis(50));
    world.stop_server(0);
    let first = world.update(0, b"a=1");
    world.run_for(Duration::from_millis(1));
    assert!(matches!(
        world.completion(0, first),
        Some(ClientEvent::Completed { .. })
    ));
    let seen = watch(&mut world);
    let seq = world.update(0, b"b=2");
    world.run_for(Duration::from_micros(22));
    assert!(world.completion(0, seq).is_none(), "not in four hops");
    world.run_for(Duration::from_micros(10));
    assert!(
        matches!(
            world.completion(0, seq),
            Some(ClientEvent::Completed { .. })
        ),
        "in six: {:?}",
        world.completion(0, seq)
    );
    let client = pmnet_sim::client_addr(0);
    let direct: Vec<u16> = acks_of(&seen, seq)
        .into_iter()
        .filter(|(from, to, _)| *to == client && *from != pmnet_sim::device_addr(0))
        .map(|(_, _, device)| device)
        .collect();
    assert!(direct.is_empty(), "acked the client directly: {direct:?}");
    assert_eq!(device_counter(&world, 1, |c| c.client_addresses_ignored), 1);
    assert_eq!(device_counter(&world, 2, |c| c.acks_sent_direct), 0);
    world.start_server(0);
    world.run_for(Duration::from_secs(1));
    assert_eq!(world.servers[0].app.applied.len(), 2);
    assert_eq!(live_entries(&world), vec![0, 0, 0]);
}

/// What a sender may make a device of a chain send with an address: from anyone but the
/// device before it, nothing new (its source is acked); a malformed address drops the update
/// (counted, no panic); a genuine forward replayed is acked once more, to the same client.
#[test]
fn carried_addresses_are_honoured_only_from_the_device_before_and_malformed_ones_dropped() {
    let mut world = chain(2, 2);
    world.stop_server(0);
    let first = world.update(0, b"a=1");
    world.run_for(Duration::from_millis(1));
    assert!(matches!(
        world.completion(0, first),
        Some(ClientEvent::Completed { .. })
    ));
    let (d1, d2) = (pmnet_sim::device_addr(0), pmnet_sim::device_addr(1));
    let session = world.session(0);
    let victim: SocketAddr = "10.9.9.9:9999".parse().unwrap();
    let stranger: SocketAddr = "10.8.8.8:8888".parse().unwrap();
    let mut update = Header::new(PacketType::UpdateRequest, pmnet_sim::SERVER_ID, session, 40);
    update.flags = pmnet_wire::replication::REPLICATED;
    let carrying = pmnet_wire::replication::with_client_address(&update, b"x=1", victim).unwrap();
    let seen = watch(&mut world);
    // From a stranger: acked to the stranger (its source), not to the address it names.
    world.inject(stranger, d2, carrying.clone());
    world.run_for(Duration::from_millis(1));
    assert_eq!(
        acks_of(&seen, 40),
        vec![(d2, stranger, pmnet_sim::DEVICE_ID + 1)]
    );
    assert_eq!(device_counter(&world, 1, |c| c.client_addresses_ignored), 1);
    // Malformed, from the device before it: dropped and counted, nothing sent.
    let mut malformed = carrying.clone();
    let len = malformed.len();
    malformed[len - 19] = 9; // family 9
    let mut packet = pmnet_wire::Packet::new_unchecked(&mut malformed[..]);
    packet.fill_checksum();
    update.seq = 41;
    let truncated_payload = pmnet_wire::Header {
        flags: update.flags | CLIENT_ADDRESS,
        ..update
    }
    .encode(b"short");
    seen.borrow_mut().clear();
    world.inject(d1, d2, malformed);
    world.inject(d1, d2, truncated_payload);
    world.run_for(Duration::from_millis(1));
    assert!(acks_of(&seen, 40).is_empty() && acks_of(&seen, 41).is_empty());
    assert_eq!(
        world.device(1).pipeline.dropped().get("bad_client_address"),
        Some(&2)
    );
    // Genuine, from the device before it: acked to the address, once per copy received.
    seen.borrow_mut().clear();
    let mut genuine = update;
    genuine.seq = 42;
    let genuine = pmnet_wire::replication::with_client_address(&genuine, b"y=1", victim).unwrap();
    world.inject(d1, d2, genuine.clone());
    world.run_for(Duration::from_millis(1));
    world.inject(d1, d2, genuine);
    world.run_for(Duration::from_millis(1));
    assert_eq!(
        acks_of(&seen, 42),
        vec![(d2, victim, pmnet_sim::DEVICE_ID + 1); 2],
        "one ack per copy, to the client named"
    );
    // A server takes no update that carries an address (only devices carry one, to devices).
    world.start_server(0);
    world.run_for(Duration::from_secs(1));
    world.inject(d2, pmnet_sim::server_addr(0), carrying);
    world.run_for(Duration::from_millis(1));
    assert_eq!(
        world.servers[0]
            .server
            .counters()
            .dropped
            .get("bad_client_address"),
        Some(&1)
    );
}

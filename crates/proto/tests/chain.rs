//! Devices in series (docs/replication.md), on the simulator's network: a client that wants R
//! devices' acks completes an update only once R distinct devices logged every fragment; each
//! device of the chain logs it; the server applies it once; the server-ACK travels back
//! through every device and frees each one's entry. Randomised runs print their seed;
//! `PMNET_SEED=N` replays one.

use std::time::Duration;

use pmnet_proto::{ClientEvent, Completion};
use pmnet_sim::{Faults, Topology, World};
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

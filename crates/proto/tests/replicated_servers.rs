//! Replicated servers (docs/replication.md), on the simulator's network: a primary forwards
//! every request to its replicas and applies it, and sends the server-ACK — which frees the
//! devices' entries — only once every replica applied it; replicas apply in the primary's
//! order, once each; a replica promoted after the primary is lost for good goes on with nothing
//! acknowledged lost and nothing applied twice. Randomised runs print their seed;
//! `PMNET_SEED=N` replays one.

use std::time::Duration;

use pmnet_proto::ClientEvent;
use pmnet_sim::{Faults, Topology, World};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn replicated(clients: usize, replicas: usize) -> World {
    let mut world = World::with_topology(Topology {
        client_count: clients,
        device_slot_counts: vec![256],
        server_count: 1,
        chain: false,
        server_replicas: replicas,
    });
    world.run_for(Duration::from_millis(50));
    world
}

fn seed() -> u64 {
    let seed: u64 = match std::env::var("PMNET_SEED") {
        Ok(text) => text.parse().expect("PMNET_SEED is a number"),
        Err(_) => rand::rng().random(),
    };
    eprintln!("PMNET_SEED={seed}");
    seed
}

/// What a node applied: (session, seq), in order.
fn applied(app: &pmnet_sim::ServerApp) -> Vec<(u64, u32)> {
    app.applied
        .iter()
        .map(|(session, seq, ..)| (*session, *seq))
        .collect()
}

#[test]
fn the_server_ack_waits_until_every_replica_applied_the_update() {
    let mut world = replicated(1, 2);
    world.stop_replica(1);
    let seq = world.update(0, b"k=v");
    world.run_for(Duration::from_millis(100));
    assert!(
        matches!(
            world.completion(0, seq),
            Some(ClientEvent::Completed { .. })
        ),
        "the device's ack completes the update"
    );
    assert_eq!(
        applied(&world.servers[0].app).len(),
        0,
        "the primary applies only what every replica has"
    );
    assert_eq!(
        applied(&world.replicas[0].app).len(),
        1,
        "replica 0 applied it"
    );
    assert_eq!(
        world.device(0).device().live_entry_count(),
        1,
        "no server-ACK while replica 1 lacks it: the device keeps its entry"
    );
    assert_eq!(world.servers[0].server.replication_pending(), 1);
    world.start_replica(1);
    world.run_for(Duration::from_secs(2));
    assert_eq!(
        applied(&world.replicas[1].app),
        vec![(world.session(0), seq)],
        "the device's resend reached replica 1 through the primary"
    );
    assert_eq!(world.device(0).device().live_entry_count(), 0, "freed");
    assert_eq!(world.servers[0].server.replication_pending(), 0);
    let counters = &world.servers[0].server.counters().replication;
    assert_eq!(counters.forwarded, 1);
    assert!(counters.forwards_resent >= 1, "{counters:?}");
    assert_eq!(counters.released, 1);
    assert_eq!(applied(&world.servers[0].app).len(), 1);
}

#[test]
fn a_bypass_request_is_answered_only_once_every_replica_applied_it() {
    let mut world = replicated(1, 1);
    world.stop_replica(0);
    let seq = world.bypass(0, b"read");
    world.run_for(Duration::from_millis(100));
    assert!(world.completion(0, seq).is_none(), "no reply yet");
    world.start_replica(0);
    world.run_for(Duration::from_secs(2));
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed { .. })
    ));
    assert_eq!(applied(&world.replicas[0].app).len(), 1);
}

/// Three sessions, updates and bypasses, through a lossy network with duplicates and jitter,
/// a replica restarted in the middle: every request completes, and each replica applied
/// exactly what the primary applied, in the primary's order across sessions.
#[test]
fn replicas_apply_what_the_primary_applied_in_its_order() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut world = replicated(3, 2);
    world.faults = Some(Faults {
        rng: ChaCha8Rng::seed_from_u64(seed ^ 1),
        loss: 0.05,
        duplicate: 0.02,
        jitter: Duration::from_micros(20),
        corrupt: 0.0,
    });
    let mut issued = Vec::new();
    for round in 0..300u32 {
        let client = rng.random_range(0..3);
        while !world.clients[client].client.can_send() {
            world.run_for(Duration::from_micros(50));
        }
        let payload = format!("k{}={round}", rng.random_range(0..4));
        let seq = if rng.random_bool(0.2) {
            world.bypass(client, payload.as_bytes())
        } else {
            world.update(client, payload.as_bytes())
        };
        issued.push((client, seq));
        world.run_for(Duration::from_micros(rng.random_range(0..40)));
        if round == 100 {
            world.stop_replica(1);
        }
        if round == 200 {
            world.start_replica(1);
        }
    }
    world.faults = None;
    world.run_for(Duration::from_secs(10));
    for &(client, seq) in &issued {
        match world.completion(client, seq) {
            Some(ClientEvent::Completed { .. }) => {}
            other => panic!("seed {seed}: client {client} request {seq} ended {other:?}"),
        }
    }
    let primary = applied(&world.servers[0].app);
    assert_eq!(primary.len(), issued.len(), "seed {seed}: once each");
    for replica in 0..2 {
        assert_eq!(
            applied(&world.replicas[replica].app),
            primary,
            "seed {seed}: replica {replica} applied what the primary applied, in its order"
        );
    }
    assert_eq!(
        world.device(0).device().live_entry_count(),
        0,
        "seed {seed}"
    );
    assert_eq!(world.servers[0].server.replication_pending(), 0);
}

/// The primary crashes and restarts (what it held for its replicas is gone): the devices'
/// resends bring every request to the replicas, each applied once.
#[test]
fn a_restarted_primary_still_brings_every_request_to_every_replica() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut world = replicated(2, 2);
    let mut issued = Vec::new();
    for round in 0..120u32 {
        let client = rng.random_range(0..2);
        while !world.clients[client].client.can_send() {
            world.run_for(Duration::from_micros(50));
        }
        issued.push((
            client,
            world.update(client, format!("k={round}").as_bytes()),
        ));
        world.run_for(Duration::from_micros(rng.random_range(0..30)));
        if round == 40 {
            // Replica 0 misses what comes next; then the primary goes down with it held.
            world.stop_replica(0);
        }
        if round == 60 {
            world.stop_server(0);
            world.start_replica(0);
        }
        if round == 80 {
            world.start_server(0);
        }
    }
    world.run_for(Duration::from_secs(10));
    for &(client, seq) in &issued {
        assert!(
            matches!(
                world.completion(client, seq),
                Some(ClientEvent::Completed { .. })
            ),
            "seed {seed}: client {client} update {seq}"
        );
    }
    for (client, _) in [(0, ()), (1, ())] {
        let session = world.session(client);
        let mine: Vec<u32> = issued
            .iter()
            .filter(|(c, _)| *c == client)
            .map(|(_, seq)| *seq)
            .collect();
        for (name, app) in [
            ("primary", &world.servers[0].app),
            ("replica 0", &world.replicas[0].app),
            ("replica 1", &world.replicas[1].app),
        ] {
            let seqs: Vec<u32> = applied(app)
                .into_iter()
                .filter(|(s, _)| *s == session)
                .map(|(_, seq)| seq)
                .collect();
            assert_eq!(
                seqs, mine,
                "seed {seed}: {name}, session of client {client}"
            );
        }
    }
    assert_eq!(
        world.device(0).device().live_entry_count(),
        0,
        "seed {seed}"
    );
}

/// The primary is lost for good, with updates acknowledged by the device but not yet on every
/// replica; replica 0 is promoted in its place: every acknowledged update is applied on the new
/// primary and on the other replica, once, in each session's order.
#[test]
fn a_promoted_replica_loses_nothing_acknowledged_and_applies_nothing_twice() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut world = replicated(2, 2);
    world.faults = Some(Faults {
        rng: ChaCha8Rng::seed_from_u64(seed ^ 2),
        loss: 0.03,
        duplicate: 0.02,
        jitter: Duration::from_micros(10),
        corrupt: 0.0,
    });
    let mut issued = Vec::new();
    for round in 0..200u32 {
        let client = rng.random_range(0..2);
        while !world.clients[client].client.can_send() {
            world.run_for(Duration::from_micros(50));
        }
        issued.push((
            client,
            world.update(client, format!("k={round}").as_bytes()),
        ));
        world.run_for(Duration::from_micros(rng.random_range(0..30)));
        if round == 80 {
            // Replica 1 falls behind: the primary holds what it lacks.
            world.stop_replica(1);
        }
        if round == 120 {
            world.stop_server(0);
            world.start_replica(1);
            world.promote_replica(0, 0);
        }
    }
    world.faults = None;
    world.run_for(Duration::from_secs(10));
    for &(client, seq) in &issued {
        assert!(
            matches!(
                world.completion(client, seq),
                Some(ClientEvent::Completed { .. })
            ),
            "seed {seed}: client {client} update {seq}"
        );
    }
    for client in 0..2 {
        let session = world.session(client);
        let mine: Vec<u32> = issued
            .iter()
            .filter(|(c, _)| *c == client)
            .map(|(_, seq)| *seq)
            .collect();
        for (name, app) in [
            ("promoted primary", &world.servers[0].app),
            ("replica 1", &world.replicas[1].app),
        ] {
            let seqs: Vec<u32> = applied(app)
                .into_iter()
                .filter(|(s, _)| *s == session)
                .map(|(_, seq)| seq)
                .collect();
            assert_eq!(
                seqs, mine,
                "seed {seed}: {name}, session of client {client}"
            );
        }
    }
    assert_eq!(
        world.device(0).device().live_entry_count(),
        0,
        "seed {seed}"
    );
}

//! Devices in series under the controller (docs/replication.md, "Automatic failover"), on the
//! simulator's world: the production planner takes a lost device out once it has been silent
//! for the suspicion delay and puts the spare in, each device restarts in place for its route,
//! the server asks the chain's new last device and the clients follow the chain's first
//! device — and every update a client saw complete is applied, once, in order.

use std::time::Duration;

use pmnet_proto::route::START_GRACE;
use pmnet_proto::ClientEvent;
use pmnet_sim::{Topology, World, SERVER_SUSPECT_AFTER, SUSPECT_AFTER};

/// Three devices in series and a spare in front of one server, `clients` clients each waiting
/// for two devices' acks, under the controller.
fn chain_with_controller(clients: usize) -> World {
    let mut world = World::with_topology(Topology {
        client_count: clients,
        device_slot_counts: vec![64; 3],
        server_count: 1,
        chain: true,
        server_replicas: 0,
    })
    .with_kv_store(1 << 20)
    .with_controller(Some(64));
    for client in 0..clients {
        world.reconfigure_client(client, |config| config.replicas = 2);
    }
    world.run_for(Duration::from_millis(50));
    world
}

/// Issue `count` updates from each client, `gap` apart, then run until every one ended.
fn write(world: &mut World, count: usize, gap: Duration) -> Vec<(usize, u32)> {
    let mut issued = Vec::new();
    for round in 0..count {
        for client in 0..world.clients.len() {
            let seq = world.update(client, format!("k{client}={round}").as_bytes());
            issued.push((client, seq));
        }
        world.run_for(gap);
    }
    world.drive_until(10_000_000, |world| {
        issued
            .iter()
            .all(|&(client, seq)| world.completion(client, seq).is_some())
    });
    issued
}

/// Every update issued completed and is applied once, in order.
fn check_applied(world: &mut World, issued: &[(usize, u32)]) {
    for &(client, seq) in issued {
        assert!(
            matches!(
                world.completion(client, seq),
                Some(ClientEvent::Completed { .. })
            ),
            "client {client} seq {seq}: {:?}",
            world.completion(client, seq)
        );
    }
    world.run_for(Duration::from_secs(1));
    for client in 0..world.clients.len() {
        let session = world.session(client);
        let applied = world.applied_seqs(session);
        let last = issued
            .iter()
            .filter(|(c, _)| *c == client)
            .map(|(_, seq)| *seq)
            .max()
            .unwrap_or(0);
        assert_eq!(applied, (1..=last).collect::<Vec<_>>(), "client {client}");
    }
}

/// What every incarnation of the controller's planner counted.
fn planner_counters(world: &World) -> pmnet_proto::route::PlannerCounters {
    world.controller.as_ref().expect("a controller").counters()
}

#[test]
fn a_lost_middle_device_is_taken_out_and_the_spare_put_in_after_the_last() {
    let mut world = chain_with_controller(2);
    let mut issued = write(&mut world, 10, Duration::from_millis(5));
    world.lose_device(1);
    let lost_at = world.now;
    // Silent for less than the suspicion delay: still in the chain.
    world.run_for(SUSPECT_AFTER - Duration::from_millis(200));
    assert_eq!(planner_counters(&world).devices_removed, 0);
    assert_eq!(world.chain, vec![0, 1, 2]);
    issued.extend(write(&mut world, 10, Duration::from_millis(50)));
    assert!(world.now - lost_at >= SUSPECT_AFTER);
    let counters = planner_counters(&world);
    assert_eq!((counters.devices_removed, counters.spares_joined), (1, 1));
    // The spare (device 3) goes in before the server.
    assert_eq!(world.chain, vec![0, 2, 3]);
    // The device before the lost one and the one that was last restarted in place for their
    // new places; the spare too (it follows the device before it now).
    for device in [0, 2, 3] {
        assert!(
            world.devices[device].restarts_in_place >= 1,
            "device {device}"
        );
    }
    assert_eq!(world.devices[1].restarts_in_place, 0);
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
    // The spare logged what came after it joined.
    assert!(world.devices[3].device().counters().updates_logged > 0);
}

#[test]
fn clients_follow_the_chain_to_its_next_device_when_the_first_is_lost() {
    let mut world = chain_with_controller(1);
    let mut issued = write(&mut world, 5, Duration::from_millis(5));
    world.lose_device(0);
    issued.extend(write(&mut world, 10, Duration::from_millis(100)));
    assert_eq!(planner_counters(&world).devices_removed, 1);
    assert_eq!(world.chain, vec![1, 2, 3]);
    let client = world.clients[0].client.counters();
    assert!(client.routes_taken >= 1, "the client followed a route");
    issued.extend(write(&mut world, 5, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
    // The last updates went through the new first device.
    assert!(world.devices[1].device().counters().updates_logged > 0);
}

/// Two devices in series in front of a server with `replicas` replica servers, all under
/// the controller; `clients` clients each waiting for one device's ack.
fn replicated_chain_with_controller(clients: usize, replicas: usize) -> World {
    let mut world = World::with_topology(Topology {
        client_count: clients,
        device_slot_counts: vec![64; 2],
        server_count: 1,
        chain: true,
        server_replicas: replicas,
    })
    .with_kv_store(1 << 20)
    .with_controller(None);
    world.run_for(Duration::from_millis(50));
    world
}

#[test]
fn a_lost_primary_is_replaced_by_its_replica_furthest_along_and_nothing_acked_is_lost() {
    let mut world = replicated_chain_with_controller(2, 2);
    let mut issued = write(&mut world, 10, Duration::from_millis(5));
    // Writes in flight when the primary is lost.
    for client in 0..world.clients.len() {
        let seq = world.update(client, format!("k{client}=in-flight").as_bytes());
        issued.push((client, seq));
    }
    world.run_for(Duration::from_micros(300));
    world.lose_server(0);
    let lost_at = world.now;
    world.run_for(SERVER_SUSPECT_AFTER - Duration::from_millis(200));
    assert_eq!(planner_counters(&world).primaries_replaced, 0);
    issued.extend(write(&mut world, 10, Duration::from_millis(50)));
    assert!(world.now - lost_at >= SERVER_SUSPECT_AFTER);
    let counters = planner_counters(&world);
    assert_eq!(
        (counters.primaries_replaced, counters.replicas_removed),
        (1, 0)
    );
    let primary = world.promoted[0].expect("a replica promoted");
    // The promoted replica restarted in place as the primary (at its own address), the other
    // one in place as its replica, and the chain's last device now forwards to it.
    assert!(world.replicas[primary].restarts_in_place >= 1);
    assert!(!world.replicas[primary].server.config().replicas.is_empty());
    let other = 1 - primary;
    assert!(world.replicas[other].restarts_in_place >= 1);
    assert_eq!(
        world.replicas[other].server.config().devices,
        vec![pmnet_sim::replica_addr(primary)]
    );
    assert_eq!(
        world.devices[1].config.servers,
        vec![(pmnet_sim::SERVER_ID, pmnet_sim::replica_addr(primary))]
    );
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
    // Every acked write is on the remaining replica too, once each.
    for client in 0..world.clients.len() {
        let session = world.session(client);
        let on_primary = world.applied_seqs(session);
        let on_other: Vec<u32> = (world.replicas[other].app.applied.iter())
            .filter(|(s, ..)| *s == session)
            .map(|(_, seq, ..)| *seq)
            .collect();
        assert_eq!(on_other, on_primary, "client {client}");
    }
}

#[test]
fn a_lost_replica_is_taken_out_and_writes_go_on() {
    let mut world = replicated_chain_with_controller(2, 2);
    let mut issued = write(&mut world, 10, Duration::from_millis(5));
    world.lose_replica(1);
    // Acked by the devices meanwhile; applied once the replica is taken out.
    issued.extend(write(&mut world, 10, Duration::from_millis(100)));
    world.run_for(SERVER_SUSPECT_AFTER);
    let counters = planner_counters(&world);
    assert_eq!(
        (counters.primaries_replaced, counters.replicas_removed),
        (0, 1)
    );
    assert_eq!(world.promoted[0], None);
    // The primary restarted in place with the replica left.
    assert!(world.servers[0].restarts_in_place >= 1);
    assert_eq!(
        world.servers[0].server.config().replicas,
        vec![pmnet_sim::replica_addr(0)]
    );
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
}

#[test]
fn a_promoted_replica_loses_nothing_when_the_new_primary_is_lost_too() {
    let mut world = replicated_chain_with_controller(1, 2);
    let mut issued = write(&mut world, 10, Duration::from_millis(5));
    world.lose_server(0);
    issued.extend(write(&mut world, 10, Duration::from_millis(100)));
    world.run_for(SERVER_SUSPECT_AFTER);
    let first = world.promoted[0].expect("a replica promoted");
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    world.lose_server(0);
    issued.extend(write(&mut world, 10, Duration::from_millis(100)));
    world.run_for(SERVER_SUSPECT_AFTER);
    let second = world.promoted[0].expect("a replica promoted");
    assert_ne!(first, second);
    assert_eq!(planner_counters(&world).primaries_replaced, 2);
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
}

/// The epoch each live device and the server run, and the controller's.
fn epochs(world: &World) -> (Vec<u64>, u64, u64) {
    let devices = (world.devices.iter())
        .filter(|node| !node.lost)
        .map(|node| node.device().follower().expect("follows").epoch())
        .collect();
    let server = world.servers[0].server.follower().expect("follows").epoch();
    let plan = world
        .controller
        .as_ref()
        .expect("a controller")
        .planner
        .epoch();
    (devices, server, plan)
}

#[test]
fn a_device_lost_while_the_controller_is_down_is_taken_out_once_it_is_back() {
    let mut world = chain_with_controller(2);
    let mut issued = write(&mut world, 10, Duration::from_millis(5));
    world.crash_controller(None);
    world.lose_device(1);
    // Down far longer than the suspicion delay: nothing is taken out, nothing routed.
    world.run_for(5 * SUSPECT_AFTER);
    let node = world.controller.as_ref().expect("a controller");
    assert!(!node.up);
    assert_eq!((node.crashes, node.losses_while_down), (1, 1));
    assert_eq!(planner_counters(&world).devices_removed, 0);
    assert_eq!(world.chain, vec![0, 1, 2]);
    let restarted_at = world.now;
    world.restart_controller();
    let node = world.controller.as_ref().expect("a controller");
    assert!(node.up);
    assert_eq!(node.restarts, 1);
    // Restarted from its saved plan: every node unheard, so none is suspected before the
    // start grace, the lost device neither.
    world.run_for(START_GRACE - Duration::from_millis(200));
    assert_eq!(planner_counters(&world).devices_removed, 0);
    assert_eq!(world.chain, vec![0, 1, 2]);
    // Writes issued now complete once the lost device is out and the spare in.
    issued.extend(write(&mut world, 10, Duration::from_millis(50)));
    assert!(world.now - restarted_at >= START_GRACE);
    let counters = planner_counters(&world);
    assert_eq!((counters.devices_removed, counters.spares_joined), (1, 1));
    assert_eq!(world.chain, vec![0, 2, 3]);
    assert_eq!(
        world
            .controller
            .as_ref()
            .expect("a controller")
            .wrongly_suspected,
        0
    );
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
    let (devices, server, plan) = epochs(&world);
    assert!(
        devices.iter().all(|&epoch| epoch == plan),
        "{devices:?} {plan}"
    );
    assert_eq!(server, plan);
}

#[test]
fn routes_lost_when_the_controller_crashes_right_after_saving_still_reach_every_node() {
    let mut world = chain_with_controller(2);
    let mut issued = write(&mut world, 10, Duration::from_millis(5));
    let (_, _, first) = epochs(&world);
    world.crash_controller_at_next_save(Duration::from_millis(500));
    world.lose_device(1);
    // The lost device is taken out and the spare put in: a plan saved, then the crash before
    // any route of it went out.
    world.run_for(SUSPECT_AFTER + Duration::from_millis(150));
    let node = world.controller.as_ref().expect("a controller");
    assert!(!node.up);
    assert_eq!((node.crashes, node.crashes_at_save), (1, 1));
    assert_eq!(world.chain, vec![0, 2, 3], "the saved plan's chain");
    let (devices, server, plan) = epochs(&world);
    assert!(plan > first);
    assert!(
        devices.iter().all(|&epoch| epoch == first) && server == first,
        "no node heard of the saved plan: {devices:?} {server}"
    );
    // Back from the saved plan: its epoch, and every node is sent it on its next status.
    world.run_for(Duration::from_millis(700));
    let node = world.controller.as_ref().expect("a controller");
    assert!(node.up);
    assert_eq!(node.restarts, 1);
    let (devices, server, restored) = epochs(&world);
    assert_eq!(restored, plan, "the saved plan, not a newer epoch");
    assert!(
        devices.iter().all(|&epoch| epoch == plan),
        "{devices:?} {plan}"
    );
    assert_eq!(server, plan);
    issued.extend(write(&mut world, 10, Duration::from_millis(5)));
    check_applied(&mut world, &issued);
    assert!(world.devices[3].device().counters().updates_logged > 0);
}

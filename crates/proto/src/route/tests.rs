//! The planner and a follower, datagram by datagram.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_wire::route::{NodeStatus, Role, Route, NODE_STATUS, ROUTE};
use pmnet_wire::{Header, PacketType};

use super::*;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

const SERVER: u16 = 9000;
const CONTROLLER: u16 = 7700;

fn planner(now: Time) -> Planner {
    Planner::new(
        PlannerConfig {
            chains: vec![ChainSpec {
                server_id: 1,
                server: addr(SERVER),
                devices: vec![(1, addr(1)), (2, addr(2)), (3, addr(3))],
                spares: vec![(4, addr(4))],
                replicas: Vec::new(),
            }],
            suspect_after: Duration::from_millis(50),
            server_suspect_after: Duration::from_millis(50),
            auth: None,
        },
        now,
        None,
    )
    .expect("a planner")
}

fn status(role: Role, device_id: u16, boot: u64, epoch: u64, stamp: u64) -> Vec<u8> {
    let header = Header {
        device_id,
        ..Header::new(PacketType::Reserved(NODE_STATUS), 1, boot, 0)
    };
    let mut payload = Vec::new();
    NodeStatus {
        role,
        boot,
        epoch,
        stamp,
        position: 0,
    }
    .emit(&mut payload);
    header.encode(&payload)
}

fn ms(value: u64) -> Time {
    Time::from_nanos(value * 1_000_000)
}

/// Every route the planner queued: (destination, route).
fn routes(planner: &mut Planner) -> Vec<(SocketAddr, Route)> {
    let mut out = Vec::new();
    while let Some(transmit) = planner.poll_transmit() {
        let (header, payload) = Header::parse(&transmit.bytes).expect("a datagram");
        assert_eq!(header.packet_type, PacketType::Reserved(ROUTE));
        out.push((
            transmit.destination,
            Route::parse(payload).expect("a route"),
        ));
    }
    out
}

/// Statuses from the devices `ports` (ids = ports) and the server, at `now`.
fn hear(planner: &mut Planner, now: Time, ports: &[u16], epoch: u64) {
    for &port in ports {
        let bytes = status(
            Role::Device,
            port,
            u64::from(port),
            epoch,
            now.as_nanos() / 1_000_000,
        );
        planner.handle(now, addr(port), &bytes);
    }
    let bytes = status(Role::Server, 0, 99, epoch, now.as_nanos() / 1_000_000);
    planner.handle(now, addr(SERVER), &bytes);
}

#[test]
fn a_silent_device_is_taken_out_and_a_heard_spare_put_in_before_the_server() {
    let mut planner = planner(ms(0));
    assert!(planner.poll_save().is_some(), "the first plan is saved");
    assert_eq!(planner.epoch(), 1);
    // Every node runs its command line (epoch 0): each is sent epoch 1.
    hear(&mut planner, ms(1), &[1, 2, 3, 4], 0);
    let sent = routes(&mut planner);
    let mut to: Vec<SocketAddr> = sent.iter().map(|(to, _)| *to).collect();
    to.sort();
    assert_eq!(
        to,
        vec![addr(1), addr(2), addr(3), addr(4), addr(SERVER)],
        "a spare is sent the route too"
    );
    // Device 2 falls silent; the others go on.
    for at in (10..=50).step_by(10) {
        hear(&mut planner, ms(at), &[1, 3, 4], 1);
        planner.handle_timeout(ms(at));
    }
    assert_eq!(
        planner.counters().devices_removed,
        0,
        "not yet: heard at 1 ms"
    );
    hear(&mut planner, ms(70), &[1, 3, 4], 1);
    planner.handle_timeout(ms(70));
    assert_eq!(planner.counters().devices_removed, 1);
    assert_eq!(planner.counters().spares_joined, 1);
    let events: Vec<String> = std::iter::from_fn(|| planner.poll_event())
        .map(|event| event.to_string())
        .collect();
    assert!(
        events
            .iter()
            .any(|line| line.contains("device 2") && line.contains("removed")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|line| line.contains("spare device 4") && line.contains("joined")),
        "{events:?}"
    );
    assert!(
        routes(&mut planner).is_empty(),
        "nothing goes before the plan is saved"
    );
    let saved = planner.poll_save().expect("the change is saved");
    let sent = routes(&mut planner);
    let (_, route) = &sent[0];
    assert_eq!(route.epoch, planner.epoch());
    let chain = &route.chain;
    assert_eq!(
        chain.devices,
        vec![(1, addr(1)), (3, addr(3)), (4, addr(4))]
    );
    assert_eq!(device_place(chain, 1), Some((addr(3), None)));
    assert_eq!(device_place(chain, 3), Some((addr(4), Some((1, addr(1))))));
    assert_eq!(
        device_place(chain, 4),
        Some((addr(SERVER), Some((3, addr(3)))))
    );
    assert_eq!(device_place(chain, 2), None);
    assert_eq!(chain.last(), (4, addr(4)));
    let mut to: Vec<SocketAddr> = sent.iter().map(|(to, _)| *to).collect();
    to.sort();
    assert_eq!(to, vec![addr(1), addr(3), addr(4), addr(SERVER)]);
    // A controller that takes over starts from the saved plan.
    let restored = Planner::new(
        PlannerConfig {
            chains: vec![ChainSpec {
                server_id: 1,
                server: addr(SERVER),
                devices: vec![(1, addr(1)), (2, addr(2)), (3, addr(3))],
                spares: vec![(4, addr(4))],
                replicas: Vec::new(),
            }],
            suspect_after: Duration::from_millis(50),
            server_suspect_after: Duration::from_millis(50),
            auth: None,
        },
        ms(100),
        Some(&saved),
    )
    .expect("restored");
    assert_eq!(restored.epoch(), planner.epoch());
    let (_, route, spares, removed) = restored.chains().next().expect("a chain");
    assert_eq!(route.devices, chain.devices);
    assert!(spares.is_empty());
    assert_eq!(removed, &[(2, addr(2))]);
}

#[test]
fn the_last_device_of_a_chain_is_never_taken_out_and_a_device_never_heard_has_a_grace() {
    let mut planner = planner(ms(0));
    planner.poll_save();
    // Nobody heard: nothing is suspected within the start's grace.
    planner.handle_timeout(ms(4_000));
    assert_eq!(planner.counters().devices_removed, 0);
    // Past it: all but one taken out, never the last.
    planner.handle_timeout(Time::ZERO + START_GRACE + Duration::from_millis(1));
    assert_eq!(planner.counters().devices_removed, 2);
    let (_, route, _, _) = planner.chains().next().expect("a chain");
    assert_eq!(route.devices.len(), 1);
}

#[test]
fn replayed_or_foreign_statuses_change_nothing() {
    let mut planner = planner(ms(0));
    planner.poll_save();
    let genuine = status(Role::Device, 2, 2, 1, 10);
    planner.handle(ms(10), addr(2), &genuine);
    // The same status again (a replay): dropped, the time it was heard unchanged.
    planner.handle(ms(40), addr(2), &genuine);
    assert_eq!(planner.drops().get("stale_data"), Some(&1));
    // A device's status from another address, or naming another device: not believed.
    planner.handle(ms(40), addr(5), &status(Role::Device, 2, 2, 1, 20));
    planner.handle(ms(40), addr(2), &status(Role::Device, 3, 2, 1, 21));
    planner.handle(ms(40), addr(3), &status(Role::Server, 0, 2, 1, 22));
    assert_eq!(planner.drops().get("unexpected_source"), Some(&3));
    // Garbage of every length never panics.
    for len in 0..genuine.len() {
        planner.handle(ms(41), addr(2), &genuine[..len]);
    }
    let heard = planner.heard(1, ms(50));
    let (_, ago) = heard.iter().find(|(at, _)| *at == addr(2)).expect("heard");
    assert_eq!(
        *ago,
        Duration::from_millis(40),
        "heard at 10 ms, not at the replay"
    );
}

#[test]
fn a_client_is_told_where_its_chain_starts_and_a_flood_of_questions_is_bounded() {
    let mut planner = planner(ms(0));
    planner.poll_save();
    let client = addr(50_000);
    planner.handle(ms(1), client, &status(Role::Client, 0, 0xC1, 0, 1));
    let sent = routes(&mut planner);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, client);
    assert_eq!(sent[0].1.boot, 0xC1);
    assert_eq!(sent[0].1.chain.first(), (1, addr(1)));
    // A client that runs the epoch is not answered; a flood is cut at the budget.
    planner.handle(ms(2), client, &status(Role::Client, 0, 0xC1, 1, 2));
    assert!(routes(&mut planner).is_empty());
    for index in 0..5_000 {
        planner.handle(ms(3), client, &status(Role::Client, 0, index, 0, 3));
    }
    assert!(routes(&mut planner).len() <= 1_000);
}

#[test]
fn a_follower_takes_only_newer_routes_for_its_boot_from_a_controller() {
    let controller = addr(CONTROLLER);
    let mut config = FollowerConfig::new(vec![controller], Role::Device, 1, 0xB007);
    config.device_id = 2;
    let mut follower = Follower::new(config, ms(0));
    follower.handle_timeout(ms(0));
    let sent = follower.poll_transmit().expect("a status");
    assert_eq!(sent.destination, controller);
    let (header, payload) = Header::parse(&sent.bytes).expect("a datagram");
    assert_eq!(header.device_id, 2);
    assert_eq!(NodeStatus::parse(payload).expect("a status").boot, 0xB007);
    assert!(follower.poll_transmit().is_none());
    let route = |epoch: u64, boot: u64| {
        let mut payload = Vec::new();
        Route {
            epoch,
            boot,
            to: addr(2),
            chain: pmnet_wire::route::ChainRoute {
                devices: vec![(1, addr(1)), (2, addr(2))],
                server: addr(SERVER),
                replicas: Vec::new(),
            },
        }
        .emit(&mut payload);
        let header = Header::new(PacketType::Reserved(ROUTE), 1, boot, 0);
        (header, payload)
    };
    let (header, payload) = route(3, 0xB007);
    assert_eq!(
        follower.on_route(addr(1), &header, &payload),
        Err(crate::DropReason::UnexpectedSource),
        "only a controller routes"
    );
    assert_eq!(follower.on_route(controller, &header, &payload), Ok(true));
    let taken = follower.take_route().expect("taken");
    assert_eq!(
        device_place(&taken.chain, 2),
        Some((addr(SERVER), Some((1, addr(1)))))
    );
    assert_eq!(follower.epoch(), 3);
    // The same route again, an older one, or one for an earlier boot: nothing.
    assert_eq!(follower.on_route(controller, &header, &payload), Ok(false));
    let (header, payload) = route(2, 0xB007);
    assert_eq!(follower.on_route(controller, &header, &payload), Ok(false));
    let (header, payload) = route(9, 0xB006);
    assert_eq!(follower.on_route(controller, &header, &payload), Ok(false));
    assert!(follower.take_route().is_none());
    assert_eq!(follower.counters().routes_stale, 3);
}

#[test]
fn any_saved_plan_bytes_are_refused_or_taken_never_a_panic() {
    let mut planner = planner(ms(0));
    let saved = planner.poll_save().expect("saved");
    let config = || PlannerConfig {
        chains: Vec::new(),
        suspect_after: Duration::from_millis(50),
        server_suspect_after: Duration::from_millis(50),
        auth: None,
    };
    for len in 0..saved.len() {
        assert!(
            Planner::new(config(), ms(0), Some(&saved[..len])).is_err(),
            "cut at {len}"
        );
    }
    for index in 0..saved.len() {
        for value in [0u8, 1, 0x7F, 0xFF] {
            let mut damaged = saved.clone();
            damaged[index] = value;
            let _ = Planner::new(config(), ms(0), Some(&damaged));
        }
    }
}

#[test]
fn a_device_s_settings_follow_its_place_in_the_chain() {
    let address = |host: u8| SocketAddr::from(([10, 0, 0, host], 7000));
    let chain = ChainRoute {
        devices: vec![(7, address(1)), (8, address(2))],
        server: address(9),
        replicas: Vec::new(),
    };
    let first = device_settings(&chain, 1, 7).expect("in the chain");
    assert_eq!(first.next, address(2));
    assert_eq!(first.previous, None);
    assert_eq!(first.servers, vec![(1, address(2))]);
    assert!(first.previous_devices.is_empty());
    let last = device_settings(&chain, 1, 8).expect("in the chain");
    assert_eq!(last.servers, vec![(1, address(9))]);
    assert_eq!(last.previous, Some((7, address(1))));
    assert_eq!(last.previous_devices, vec![(1, address(1))]);
    assert_eq!(device_settings(&chain, 1, 9), None);
}

fn server_status(boot: u64, epoch: u64, stamp: u64, position: u64) -> Vec<u8> {
    let header = Header::new(PacketType::Reserved(NODE_STATUS), 1, boot, 0);
    let mut payload = Vec::new();
    NodeStatus {
        role: Role::Server,
        boot,
        epoch,
        stamp,
        position,
    }
    .emit(&mut payload);
    header.encode(&payload)
}

#[test]
fn a_silent_primary_is_replaced_by_the_replica_furthest_along_and_a_silent_replica_taken_out() {
    let (r1, r2, r3) = (addr(SERVER + 1), addr(SERVER + 2), addr(SERVER + 3));
    let mut planner = Planner::new(
        PlannerConfig {
            chains: vec![ChainSpec {
                server_id: 1,
                server: addr(SERVER),
                devices: vec![(1, addr(1))],
                spares: Vec::new(),
                replicas: vec![r1, r2, r3],
            }],
            suspect_after: Duration::from_millis(50),
            server_suspect_after: Duration::from_millis(50),
            auth: None,
        },
        ms(0),
        None,
    )
    .expect("a planner");
    planner.poll_save();
    let hear_servers = |planner: &mut Planner, at: u64, primary: bool| {
        let device = status(Role::Device, 1, 1, 1, at);
        planner.handle(ms(at), addr(1), &device);
        if primary {
            planner.handle(ms(at), addr(SERVER), &server_status(90, 1, at, 500));
        }
        // Replica 2 is furthest along; replica 3 falls silent after 10 ms.
        planner.handle(ms(at), r1, &server_status(91, 1, at, 400));
        planner.handle(ms(at), r2, &server_status(92, 1, at, 450));
        if at <= 10 {
            planner.handle(ms(at), r3, &server_status(93, 1, at, 460));
        }
    };
    hear_servers(&mut planner, 10, true);
    for at in (20..=70).step_by(10) {
        hear_servers(&mut planner, at, false);
        planner.handle_timeout(ms(at));
    }
    let events: Vec<String> = std::iter::from_fn(|| planner.poll_event())
        .map(|event| event.to_string())
        .filter(|line| !line.contains("heard"))
        .collect();
    assert_eq!(planner.counters().primaries_replaced, 1, "{events:?}");
    assert_eq!(planner.counters().replicas_removed, 1, "{events:?}");
    assert!(
        events[0].contains(&format!("replaced by its replica {r2}")),
        "replica 3 was silent too, so replica 2 (450) goes before replica 1 (400): {events:?}"
    );
    planner.poll_save().expect("saved");
    let sent = routes(&mut planner);
    let route = &sent[0].1;
    assert_eq!(route.chain.server, r2);
    assert_eq!(route.chain.replicas, vec![r1]);
    // The device forwards to the new primary; each node is told who it is.
    assert_eq!(device_place(&route.chain, 1), Some((r2, None)));
    for (to, route) in &sent {
        assert_eq!(route.to, *to);
    }
    let mut to: Vec<SocketAddr> = sent.iter().map(|(to, _)| *to).collect();
    to.sort();
    assert_eq!(
        to,
        vec![r1, r2],
        "the device not yet: the new primary has not taken its route"
    );
    // The device asks again (its next status): still not, until the new primary runs the
    // plan, then at once.
    let epoch = planner.epoch();
    planner.handle(ms(80), addr(1), &status(Role::Device, 1, 1, 1, 80));
    planner.handle(ms(80), r1, &server_status(91, epoch, 80, 400));
    assert!(routes(&mut planner).is_empty());
    planner.handle(ms(81), r2, &server_status(92, epoch, 81, 450));
    let sent = routes(&mut planner);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, addr(1));
    assert_eq!(sent[0].1.epoch, epoch);
    assert_eq!(device_place(&sent[0].1.chain, 1), Some((r2, None)));
}

#[test]
fn a_device_restarting_in_place_for_a_change_gets_a_grace_before_it_is_suspected() {
    let mut planner = planner(ms(0));
    planner.poll_save();
    hear(&mut planner, ms(1), &[1, 2, 3, 4], 0);
    for at in (10..=50).step_by(10) {
        hear(&mut planner, ms(at), &[1, 3, 4], 1);
        planner.handle_timeout(ms(at));
    }
    hear(&mut planner, ms(60), &[1, 3, 4], 1);
    planner.handle_timeout(ms(60));
    assert_eq!(
        planner.counters().devices_removed,
        1,
        "device 2 out at 60 ms"
    );
    planner.poll_save();
    let epoch = planner.epoch();
    // Devices 1 and 4 took the route; device 3 restarts in place and says nothing meanwhile.
    for at in (70..=1_100).step_by(10) {
        hear(&mut planner, ms(at), &[1, 4], epoch);
        planner.handle_timeout(ms(at));
    }
    assert_eq!(
        planner.counters().devices_removed,
        1,
        "still within the grace: 60 ms + the delay + RESTART_GRACE"
    );
    for at in (1_110..=1_200).step_by(10) {
        hear(&mut planner, ms(at), &[1, 4], epoch);
        planner.handle_timeout(ms(at));
    }
    assert_eq!(
        planner.counters().devices_removed,
        2,
        "past the grace it is out"
    );
}

#[test]
fn a_spare_is_sent_the_route_and_forwards_to_the_promoted_primary() {
    let r1 = addr(SERVER + 1);
    let mut planner = Planner::new(
        PlannerConfig {
            chains: vec![ChainSpec {
                server_id: 1,
                server: addr(SERVER),
                devices: vec![(1, addr(1)), (2, addr(2))],
                spares: vec![(4, addr(4))],
                replicas: vec![r1],
            }],
            suspect_after: Duration::from_millis(50),
            server_suspect_after: Duration::from_millis(50),
            auth: None,
        },
        ms(0),
        None,
    )
    .expect("a planner");
    planner.poll_save();
    let hear_all = |planner: &mut Planner, at: u64, primary: bool| {
        for port in [1, 2, 4] {
            let bytes = status(Role::Device, port, u64::from(port), 1, at);
            planner.handle(ms(at), addr(port), &bytes);
        }
        if primary {
            planner.handle(ms(at), addr(SERVER), &server_status(90, 1, at, 10));
        }
        planner.handle(ms(at), r1, &server_status(91, 1, at, 10));
    };
    hear_all(&mut planner, 10, true);
    let _ = routes(&mut planner);
    for at in (20..=70).step_by(10) {
        hear_all(&mut planner, at, false);
        planner.handle_timeout(ms(at));
    }
    assert_eq!(planner.counters().primaries_replaced, 1);
    planner.poll_save().expect("saved");
    let mut sent = routes(&mut planner);
    assert!(
        sent.iter().all(|(to, _)| *to == r1),
        "only the new primary, until it runs the plan"
    );
    let epoch = planner.epoch();
    planner.handle(ms(80), r1, &server_status(91, epoch, 80, 10));
    sent.extend(routes(&mut planner));
    // Before this change a spare was in no route, and one that logged anything (a
    // misdirected or replayed request) kept sending it to the lost primary for ever.
    let (_, to_spare) = sent
        .iter()
        .find(|(to, _)| *to == addr(4))
        .expect("the spare is sent the route");
    assert_eq!(device_settings(&to_spare.chain, 1, 4), None, "not placed");
    let settings = spare_settings(&to_spare.chain, 1);
    assert_eq!(settings.next, r1);
    assert_eq!(settings.servers, vec![(1, r1)]);
    assert_eq!(settings.previous, None);
    assert!(settings.previous_devices.is_empty());
}

/// A planner restored from a plan older than what the nodes run — its save lost (a
/// controller's own etcd wiped, none at all), or an older copy — must not hand out an epoch
/// the nodes already ran with another chain (a node takes only a newer route, so it would
/// keep its chain under the same number, or ignore the plan until the epochs catch up): it
/// moves its epoch past the newest a node runs, saves, and sends every node the plan.
#[test]
fn a_planner_restored_from_an_older_plan_moves_past_the_epoch_the_nodes_run() {
    let config = || PlannerConfig {
        chains: vec![ChainSpec {
            server_id: 1,
            server: addr(SERVER),
            devices: vec![(1, addr(1)), (2, addr(2)), (3, addr(3))],
            spares: vec![(4, addr(4))],
            replicas: Vec::new(),
        }],
        suspect_after: Duration::from_millis(50),
        server_suspect_after: Duration::from_millis(50),
        auth: None,
    };
    let mut first = planner(ms(0));
    let older = first.poll_save().expect("the first plan");
    hear(&mut first, ms(1), &[1, 2, 3, 4], 0);
    routes(&mut first);
    // Device 2 falls silent: taken out, the spare put in (epochs 2 and 3), which the nodes run.
    for at in (10..=70).step_by(10) {
        let epoch = first.epoch();
        hear(&mut first, ms(at), &[1, 3, 4], epoch);
        first.handle_timeout(ms(at));
        first.poll_save();
        routes(&mut first);
    }
    let ran = first.epoch();
    assert_eq!(ran, 3);
    let ran_chain = first.chains().next().expect("a chain").1.clone();
    for saved in [Some(&older[..]), None] {
        let mut restored = Planner::new(config(), ms(100), saved).expect("restored");
        assert_eq!(restored.epoch(), 1, "the older plan's epoch");
        restored.poll_save();
        hear(&mut restored, ms(101), &[1, 3, 4], ran);
        assert!(
            routes(&mut restored).is_empty(),
            "nothing goes before the new epoch is saved"
        );
        assert_eq!(restored.counters().newer_epochs_heard, 1);
        let plan = restored
            .poll_save()
            .expect("the plan moved past the nodes' epoch, saved");
        assert_eq!(restored.epoch(), ran + 1);
        let sent = routes(&mut restored);
        let mut to: Vec<SocketAddr> = sent.iter().map(|(to, _)| *to).collect();
        to.sort();
        assert_eq!(to, vec![addr(1), addr(3), addr(4), addr(SERVER)]);
        for (_, route) in &sent {
            assert!(
                route.epoch > ran,
                "a node takes it: newer than what it runs"
            );
            assert_ne!(
                route.chain, ran_chain,
                "the older plan's chain, under an epoch of its own"
            );
        }
        // A follower that runs the nodes' epoch takes it.
        let controller = addr(CONTROLLER);
        let mut follow = FollowerConfig::new(vec![controller], Role::Device, 1, 3);
        follow.device_id = 3;
        follow.epoch = ran;
        let mut follower = Follower::new(follow, ms(0));
        let (_, route) = sent.iter().find(|(to, _)| *to == addr(3)).expect("sent");
        let mut payload = Vec::new();
        route.emit(&mut payload);
        let header = Header::new(PacketType::Reserved(ROUTE), 1, 3, 0);
        assert_eq!(follower.on_route(controller, &header, &payload), Ok(true));
        // Restored again from what it saved: the nodes run its epoch, nothing moves.
        let mut again = Planner::new(config(), ms(200), Some(&plan)).expect("restored");
        hear(&mut again, ms(201), &[1, 3, 4], ran + 1);
        assert!(again.poll_save().is_none());
        assert_eq!(again.epoch(), ran + 1);
        assert!(routes(&mut again).is_empty());
    }
    // An epoch no deployment reaches is refused, never taken (the epoch must not wrap).
    let mut planner = planner(ms(0));
    planner.poll_save();
    let bytes = status(Role::Device, 1, 1, u64::MAX, 5);
    planner.handle(ms(5), addr(1), &bytes);
    assert_eq!(planner.epoch(), 1);
    assert_eq!(planner.counters().newer_epochs_heard, 0);
}

//! A server back from an outage applies every acknowledged update at once, not a request
//! lifetime per gap later: the gaps left by requests no device logged are resolved together
//! from what the devices know (when they first saw later numbers, the no-op fills they saw).
//! Driven through the in-memory network on a virtual clock, so the times asserted are exact.

use std::time::Duration;

use pmnet_proto::{ClientEvent, Completion, RequestKind};
use pmnet_sim::{device_addr, World};
use pmnet_wire::{flags, PacketType};

const CLIENTS: usize = 4;
const WINDOW: u32 = 16;

/// What the outage left: per client, the updates the device acked (the others failed).
struct Outage {
    world: World,
    acked: Vec<Vec<u32>>,
    failed: usize,
}

/// The server down, 4 clients × window 16 write `updates` each through a device whose log
/// turns some away (one probe per slot: a slot taken is a collision, the update is forwarded
/// unlogged and its client told so); every client gives up on those and leaves; the server
/// starts `down_for` after it went down, or `after_clients` after the last client finished if
/// that is later. With `fills_lost`, the clients' no-op fills never reach the device (the
/// clients were killed as they gave up): only the device's dates tell.
fn outage(updates: u32, down_for: Duration, after_clients: Duration, fills_lost: bool) -> Outage {
    let mut world = World::new(CLIENTS, Some(2048));
    world.devices[0].config.probe_limit = 1;
    world.restart_device(0);
    for client in 0..CLIENTS {
        world.reconfigure_client(client, |config| config.window = WINDOW);
    }
    world.run_for(Duration::from_secs(1));
    world.stop_server(0);
    let down_at = world.now;
    if fills_lost {
        world.drop_when(|seen| seen.to == device_addr(0) && seen.header.has_flag(flags::NOOP_FILL));
    }
    let mut issued = [0u32; CLIENTS];
    loop {
        for (client, issued) in issued.iter_mut().enumerate() {
            while *issued < updates && world.clients[client].client.can_send() {
                world.update(client, format!("c{client}u{issued}").as_bytes());
                *issued += 1;
            }
        }
        let done = (0..CLIENTS).all(|client| {
            issued[client] == updates
                && (1..=updates).all(|seq| world.completion(client, seq).is_some())
        });
        if done {
            break;
        }
        assert!(world.step(), "the world ran out of events");
    }
    let mut acked = vec![Vec::new(); CLIENTS];
    let mut failed = 0;
    for (client, acked) in acked.iter_mut().enumerate() {
        for seq in 1..=updates {
            match world.completion(client, seq) {
                Some(ClientEvent::Completed {
                    completion: Completion::Logged { .. },
                    ..
                }) => acked.push(seq),
                Some(ClientEvent::Failed { .. }) => failed += 1,
                other => panic!("client {client} seq {seq}: {other:?}"),
            }
        }
        world.client_leaves(client);
    }
    let start_at = (down_at + down_for).max(world.now + after_clients);
    world.run_for(start_at.saturating_duration_since(world.now));
    world.start_server(0);
    Outage {
        world,
        acked,
        failed,
    }
}

/// Whether every acked update of every client is applied.
fn all_acked_applied(world: &World, acked: &[Vec<u32>]) -> bool {
    acked.iter().enumerate().all(|(client, seqs)| {
        let applied = world.applied_seqs(world.session(client));
        seqs.iter().all(|seq| applied.contains(seq))
    })
}

fn assert_every_acked_update_applied_within_two_seconds(outage: Outage) -> World {
    let Outage {
        mut world,
        acked,
        failed,
    } = outage;
    assert!(failed > 0, "the log turned some updates away");
    assert!(acked.iter().all(|seqs| !seqs.is_empty()));
    let started = world.now;
    world.drive_until(2_000_000, |w| {
        all_acked_applied(w, &acked) || w.now >= started + Duration::from_secs(30)
    });
    let took = world.now.saturating_duration_since(started);
    println!(
        "{} acked and {failed} failed updates; every acked one applied {took:?} after the \
         server's start",
        acked.iter().map(Vec::len).sum::<usize>()
    );
    assert!(
        took <= Duration::from_secs(2),
        "the acked updates took {took:?} to be applied after the server's start"
    );
    // The updates applied are the acked ones (in order and each once: the application checks
    // that); the other numbers went as no-op fills or skips.
    for (client, seqs) in acked.iter().enumerate() {
        let session = world.session(client);
        let updates: Vec<u32> = world.servers[0]
            .app
            .applied
            .iter()
            .filter(|(id, _, kind, _)| *id == session && *kind == RequestKind::Update)
            .map(|(_, seq, _, _)| *seq)
            .collect();
        assert_eq!(
            &updates, seqs,
            "client {client}: the updates applied are the acked ones"
        );
    }
    // And the server says so: the recovery is complete, the log empty.
    world.run_for(Duration::from_millis(100));
    assert!(!world.servers[0].server.is_recovering());
    assert!(!world.servers[0].server.is_draining());
    assert_eq!(world.device(0).device().live_entry_count(), 0);
    assert_eq!(world.servers[0].server.busy_session_count(), 0);
    world
}

#[test]
fn after_an_outage_the_gaps_of_killed_clients_are_resolved_by_the_devices_dates() {
    // Every client gave up on what was turned away 12 s after sending it, and every datagram
    // of those is gone 20 s after the device first saw a later number: the server starts 21 s
    // after the last client left.
    let outage = outage(120, Duration::ZERO, Duration::from_secs(21), true);
    let world = assert_every_acked_update_applied_within_two_seconds(outage);
    let server = world.servers[0].server.counters();
    assert!(server.sequence_numbers_skipped > 0);
    assert_eq!(world.device(0).device().counters().fills_resent, 0);
}

#[test]
fn after_an_outage_the_clients_fills_the_device_saw_close_their_gaps() {
    // The server starts 1 s after the last client gave up (and sent its fills, which found
    // the server down): the dates would not allow a skip of the last holes for seconds; the
    // fills the device saw close them at once.
    let outage = outage(120, Duration::ZERO, Duration::from_secs(1), false);
    let world = assert_every_acked_update_applied_within_two_seconds(outage);
    assert!(world.device(0).device().counters().fills_resent > 0);
}

#[test]
fn a_gap_whose_clients_may_still_send_is_not_skipped_before_their_lifetime_is_over() {
    // One window each, all sent at once; down for 14 s and the fills lost: nothing tells the
    // server the numbers can no longer come until 20 s after the device first saw the
    // numbers after them. Nothing is skipped before then, and everything is applied soon
    // after.
    let Outage {
        mut world,
        acked,
        failed,
    } = outage(WINDOW, Duration::from_secs(14), Duration::ZERO, true);
    assert!(failed > 0);
    let started = world.now;
    world.run_for(Duration::from_secs(4));
    assert_eq!(
        world.servers[0].server.counters().sequence_numbers_skipped,
        0,
        "skipped before every client could have given up"
    );
    assert!(!all_acked_applied(&world, &acked));
    assert!(world.servers[0].server.is_draining());
    world.drive_until(2_000_000, |w| all_acked_applied(w, &acked));
    let took = world.now.saturating_duration_since(started);
    assert!(took <= Duration::from_secs(8), "took {took:?}");
    // Resolved by skips, after the devices answered fill queries.
    assert!(!world.seen_of(PacketType::FillReply).is_empty());
    assert!(world.servers[0].server.counters().sequence_numbers_skipped > 0);
}

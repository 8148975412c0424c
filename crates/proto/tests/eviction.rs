//! Exactly once across eviction: a request the server applied, whose server-ACK was lost,
//! stays in a device's log; if the device is then cut off from the server for longer than
//! the keeping time while other sessions fill the server's session table, the session must
//! not be forgotten, or the device's resend after the cut would be applied a second time.
//! A server forgets a session only once every device said how old the oldest entry it
//! holds is (hold queries, docs/protocol.md "Sessions"). Driven through the in-memory
//! network on a virtual clock.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use pmnet_pm::SimRegion;
use pmnet_proto::{ClientEvent, Completion};
use pmnet_sim::{device_addr, server_addr, Seen, Topology, World};
use pmnet_store::{KvConfig, KvStore};
use pmnet_wire::PacketType;

/// Clients 0, 2, 4 reach the server through device 0, clients 1, 3, 5 through device 1.
const CLIENTS: usize = 6;

/// The server's session table holds `sessions_max`; with `kv`, so does its `kv` store (and
/// the table many more), so that the store is the one that must forget.
fn world_with(sessions_max: usize, kv: bool) -> World {
    let mut world = World::with_topology(Topology {
        client_count: CLIENTS,
        device_slot_counts: vec![64, 64],
        server_count: 1,
        chain: false,
        server_replicas: 0,
    });
    if kv {
        let config = KvConfig {
            max_sessions: sessions_max as u32,
        };
        world.servers[0].app.kv =
            Some(KvStore::format(SimRegion::new(1 << 20), config).expect("format a store"));
    } else {
        world.servers[0].config.sessions_max = sessions_max;
    }
    world.stop_server(0);
    world.start_server(0);
    world.run_for(Duration::from_secs(1));
    world
}

fn world(sessions_max: usize) -> World {
    world_with(sessions_max, false)
}

fn logged(world: &World, client: usize, seq: u32) -> bool {
    matches!(
        world.completion(client, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        })
    )
}

/// Client 0 writes once; the server applies it, and its server-ACK to device 0 is lost, so
/// device 0 keeps the entry. Then `cut` decides which datagrams between device 0 and the
/// server are lost, for 120 s, while clients 1, 3 and 5 (through device 1) each write once,
/// 30 s apart: with room for two sessions, each new one needs an older one forgotten.
fn applied_then_cut(sessions_max: usize, kv: bool, cut: fn(&Seen) -> bool) -> World {
    let mut world = world_with(sessions_max, kv);
    let session = world.clients[0].client.session_id();
    // Until the cut ends, server-ACKs of the session to device 0 are lost (its make-up
    // ACKs too, which would free the entry before the cut begins).
    let cutting = Rc::new(Cell::new(false));
    let healed = Rc::new(Cell::new(false));
    let (during, after) = (cutting.clone(), healed.clone());
    world.drop_when(move |seen| {
        if after.get() {
            return false;
        }
        let ack_lost = seen.from == server_addr(0)
            && seen.to == device_addr(0)
            && seen.header.packet_type == PacketType::ServerAck
            && seen.header.session_id == session;
        ack_lost || (during.get() && cut(seen))
    });
    world.update(0, b"once");
    world.run_for(Duration::from_millis(200));
    assert!(logged(&world, 0, 1), "acked by device 0");
    assert_eq!(world.servers[0].app.times_applied(session, 1), 1);
    assert_eq!(world.devices[0].device().live_entry_count(), 1, "held");
    cutting.set(true);
    for client in [1, 3, 5] {
        world.update(client, format!("client {client}").as_bytes());
        world.run_for(Duration::from_secs(30));
    }
    world.run_for(Duration::from_secs(30));
    assert_eq!(
        world.servers[0].app.times_applied(session, 1),
        1,
        "applied once before the cut ends"
    );
    healed.set(true);
    world.run_for(Duration::from_secs(120));
    world
}

fn between_device_0_and_the_server(seen: &Seen) -> bool {
    let pair = [seen.from, seen.to];
    pair.contains(&device_addr(0)) && pair.contains(&server_addr(0))
}

#[test]
fn a_resend_after_a_cut_longer_than_the_keeping_time_is_never_applied_twice() {
    for kv in [false, true] {
        resend_after_a_long_cut(kv);
    }
}

fn resend_after_a_long_cut(kv: bool) {
    let world = applied_then_cut(2, kv, between_device_0_and_the_server);
    let session = world.clients[0].client.session_id();
    assert_eq!(
        world.servers[0].app.times_applied(session, 1),
        1,
        "the device's resend after the cut found its session remembered"
    );
    // Nothing the device held is left, and every other write was acked and applied once.
    assert_eq!(world.devices[0].device().live_entry_count(), 0);
    for client in [1, 3, 5] {
        assert!(logged(&world, client, 1), "client {client} acked");
        let session = world.clients[client].client.session_id();
        assert_eq!(
            world.servers[0].app.times_applied(session, 1),
            1,
            "client {client}"
        );
    }
    // While device 0 could not answer, the server (or its store) refused to forget the
    // session, and asked.
    let counters = world.servers[0].server.counters();
    let refused = if kv {
        let store = world.servers[0].app.kv.as_ref().expect("a store");
        store.stats().sessions_full
    } else {
        counters.dropped.get("sessions_full").copied().unwrap_or(0)
    };
    assert!(refused > 0, "kv {kv}");
    assert!(counters.hold_queries_sent > 0 && counters.hold_replies > 0);
}

/// Device 0 answers hold queries, but every resend of its entry is lost: it says how old
/// the entry is, and the server keeps the session for as long as that entry could come.
#[test]
fn a_session_is_kept_while_a_device_that_answers_holds_an_old_entry_of_it() {
    fn resends_lost(seen: &Seen) -> bool {
        seen.from == device_addr(0)
            && seen.to == server_addr(0)
            && matches!(
                seen.header.packet_type,
                PacketType::UpdateRequest | PacketType::Batch
            )
    }
    let world = applied_then_cut(2, false, resends_lost);
    let session = world.clients[0].client.session_id();
    assert_eq!(world.servers[0].app.times_applied(session, 1), 1);
    assert_eq!(world.devices[0].device().live_entry_count(), 0);
    for client in [1, 3, 5] {
        let session = world.clients[client].client.session_id();
        assert_eq!(
            world.servers[0].app.times_applied(session, 1),
            1,
            "client {client}"
        );
    }
}

/// Sessions are still forgotten when nothing holds them: a table of two serves six
/// sessions one after another once each is idle past the keeping time.
#[test]
fn idle_sessions_no_device_holds_are_forgotten() {
    let mut world = world(2);
    for client in 0..CLIENTS {
        world.update(client, format!("client {client}").as_bytes());
        world.run_for(Duration::from_secs(40));
    }
    world.run_for(Duration::from_secs(60));
    for client in 0..CLIENTS {
        let session = world.clients[client].client.session_id();
        assert_eq!(
            world.servers[0].app.times_applied(session, 1),
            1,
            "client {client}"
        );
    }
    assert!(world.servers[0].server.counters().sessions_evicted >= 4);
}

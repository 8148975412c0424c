//! A server behind devices applies only keyed writes a device ordered. A client's copy of a
//! keyed write that reaches the server without passing through the device (sent or replayed
//! straight to it) would change the key behind the device's cache; it is dropped and
//! counted, and the client's copy through the device is the one applied.

use std::time::Duration;

use pmnet_sim::{client_addr, device_addr, server_addr, Attacker, World};
use pmnet_wire::PacketType;

const STEPS: usize = 1_000_000;

fn unordered_drops(world: &World) -> u64 {
    world.servers[0]
        .server
        .counters()
        .dropped
        .get("unordered_keyed_write")
        .copied()
        .unwrap_or(0)
}

#[test]
fn a_keyed_write_replayed_straight_to_the_server_is_not_applied_until_the_device_orders_it() {
    let mut world = World::new(1, Some(64));
    world.network.attacker = Some(Attacker::capturing(64, 0, 0));
    world.run_for(Duration::from_secs(1));
    // The client's first copy never reaches the device; an eavesdropper holds it.
    world.drop_first(|seen| {
        seen.from == client_addr(0)
            && seen.to == device_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
    });
    let seq = world.keyed_update(0, b"k", Some(b"v1"), b"k=v1");
    let (_, _, _, bytes) = world
        .network
        .attacker
        .as_ref()
        .expect("an eavesdropper")
        .recent()
        .iter()
        .rev()
        .find(|(_, from, to, _)| *from == client_addr(0) && *to == device_addr(0))
        .cloned()
        .expect("the client's keyed write was captured");
    // Replayed to the server from the client's address, before any copy reached the device.
    world.inject(client_addr(0), server_addr(0), bytes.clone());
    world.drive_until(STEPS, |w| unordered_drops(w) >= 1);
    assert_eq!(unordered_drops(&world), 1);
    assert!(
        world.servers[0].app.times_applied(world.session(0), seq) == 0,
        "a write no device ordered was applied"
    );
    // The client sends it again through the device, which orders it: applied once.
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    world.run_for(Duration::from_millis(50));
    assert_eq!(world.servers[0].app.times_applied(world.session(0), seq), 1);
    // A replay after it was applied is a duplicate: answered, neither applied nor dropped
    // as unordered.
    world.inject(client_addr(0), server_addr(0), bytes);
    world.run_for(Duration::from_millis(50));
    assert_eq!(world.servers[0].app.times_applied(world.session(0), seq), 1);
    assert_eq!(unordered_drops(&world), 1);
}

#[test]
fn a_server_with_no_device_applies_a_clients_keyed_write() {
    let mut world = World::new(1, None);
    world.run_for(Duration::from_secs(1));
    let seq = world.keyed_update(0, b"k", Some(b"v1"), b"k=v1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert_eq!(world.servers[0].app.times_applied(world.session(0), seq), 1);
    assert_eq!(unordered_drops(&world), 0);
}

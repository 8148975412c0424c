//! A device is a pipeline of functions: a second function in front of the log owns its own
//! packet type, while the log behind it keeps logging and acking as before.

use std::time::Duration;

use pmnet_proto::{ClientEvent, Completion, Counter, FrontFunction, COUNTER_TYPE_CODE};
use pmnet_sim::{client_addr, device_addr, World, DEVICE_ID, SERVER_ID};
use pmnet_wire::{Header, PacketType};

const STEPS: usize = 100_000;

fn counter() -> Box<dyn FrontFunction> {
    Box::new(Counter::default())
}

fn ask(session: u64) -> Vec<u8> {
    Header::new(
        PacketType::Reserved(COUNTER_TYPE_CODE),
        SERVER_ID,
        session,
        1,
    )
    .encode(&[0; 8])
}

#[test]
fn a_function_in_front_of_the_log_owns_its_type_and_the_log_still_acks_updates() {
    let mut world = World::new(1, Some(64)).with_front(counter);
    world.run_for(Duration::from_secs(1));
    let session = world.session(0);
    world.inject(client_addr(0), device_addr(0), ask(session));
    world.inject(client_addr(0), device_addr(0), ask(session));
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Logged {
                device_id: DEVICE_ID
            },
            ..
        })
    ));
    world.run_for(Duration::from_secs(1));
    let answers = world
        .seen_of(PacketType::Reserved(COUNTER_TYPE_CODE))
        .iter()
        .filter(|seen| seen.from == device_addr(0) && seen.to == client_addr(0))
        .count();
    assert_eq!(answers, 2, "each ask answered once by the front function");
    let front = format!("{:?}", world.device(0).pipeline.front());
    assert!(front.contains("count: 2"), "{front}");
    assert_eq!(world.device(0).device().counters().updates_logged, 1);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn a_reserved_type_no_function_owns_is_counted_and_dropped() {
    let mut world = World::new(1, Some(64));
    world.run_for(Duration::from_secs(1));
    let session = world.session(0);
    // Without the counter in front, its type belongs to nobody.
    world.inject(client_addr(0), device_addr(0), ask(session));
    let chain = Header::new(PacketType::Reserved(0x20), SERVER_ID, session, 1).encode(b"x");
    world.inject(client_addr(0), device_addr(0), chain);
    world.run_for(Duration::from_secs(1));
    assert_eq!(
        world.device(0).pipeline.dropped().get("unknown_type"),
        Some(&2)
    );
    assert!(world
        .seen_of(PacketType::Reserved(COUNTER_TYPE_CODE))
        .iter()
        .all(|seen| seen.from != device_addr(0)));
}

//! Randomised runs of the whole protocol under network faults and crashes of the device and
//! the server, checking that acknowledged updates are applied exactly once and in order.
//!
//! Each run is driven by one seed, printed at the start; set `PMNET_SEED` to replay one run.
//! `PMNET_SEEDS` sets how many runs (default 64). The deterministic simulator (`pmnet sim`)
//! goes much further; this is the protocol crate's own guard.

mod harness;

use std::time::Duration;

use harness::{Faults, World};
use pmnet_proto::{ClientEvent, Completion, RequestKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CLIENT_COUNT: usize = 3;
const REQUESTS_PER_CLIENT: u32 = 40;

fn seeds() -> Vec<u64> {
    if let Ok(text) = std::env::var("PMNET_SEED") {
        return vec![text.trim().parse().expect("PMNET_SEED must be a u64")];
    }
    let count: u64 = std::env::var("PMNET_SEEDS")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(64);
    let base: u64 = rand::random();
    (0..count).map(|index| base.wrapping_add(index)).collect()
}

#[test]
fn acked_updates_survive_loss_reordering_duplication_and_crashes() {
    for seed in seeds() {
        eprintln!("random_faults: PMNET_SEED={seed}");
        run(seed);
    }
}

fn run(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let slot_count = rng.random_range(2..64);
    let mut world = World::new(CLIENT_COUNT, Some(slot_count));
    world.faults = Some(Faults {
        rng: ChaCha8Rng::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15),
        loss: rng.random_range(0.0..0.2),
        duplicate: rng.random_range(0.0..0.1),
        jitter: Duration::from_micros(rng.random_range(0..200)),
    });
    let mut issued = [0u32; CLIENT_COUNT];
    let mut kinds: Vec<Vec<RequestKind>> = vec![Vec::new(); CLIENT_COUNT];
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); CLIENT_COUNT];
    let mut failures = 0;

    // Safety phase: requests, faults and crashes.
    for _ in 0..2_000 {
        match rng.random_range(0..100) {
            0..=39 => {
                let client = rng.random_range(0..CLIENT_COUNT);
                if issued[client] < REQUESTS_PER_CLIENT && world.clients[client].client.can_send() {
                    let size = if rng.random_bool(0.1) { 3000 } else { 16 };
                    let payload = vec![issued[client] as u8; size];
                    payloads[client].push(payload.clone());
                    if rng.random_bool(0.8) {
                        world.update(client, &payload);
                        kinds[client].push(RequestKind::Update);
                    } else {
                        world.bypass(client, &payload);
                        kinds[client].push(RequestKind::Bypass);
                    }
                    issued[client] += 1;
                }
            }
            40 => {
                let torn = rng.random_bool(0.5);
                let crash_seed: u64 = rng.random();
                world.restart_device_with(|region| {
                    if torn {
                        region.crash(&mut ChaCha8Rng::seed_from_u64(crash_seed))
                    } else {
                        region.crash_losing_unpersisted()
                    }
                });
            }
            41 if world.server.up => world.stop_server(),
            42..=44 if !world.server.up => world.start_server(),
            45 => {
                // Hold the device's persistence for a while: acks wait, crashes lose the writes.
                let node = world.device.as_mut().unwrap();
                node.hold_persistence = !node.hold_persistence;
                if !node.hold_persistence {
                    world.release_persistence(None);
                }
            }
            _ => {
                let steps = rng.random_range(1..20);
                for _ in 0..steps {
                    world.step();
                }
            }
        }
    }

    // Liveness phase: heal everything, finish what was started, converge.
    world.faults = None;
    if let Some(node) = world.device.as_mut() {
        node.hold_persistence = false;
    }
    world.release_persistence(None);
    if !world.server.up {
        world.start_server();
    }
    for client in 0..CLIENT_COUNT {
        while issued[client] < REQUESTS_PER_CLIENT && world.clients[client].client.can_send() {
            world.update(client, b"tail");
            kinds[client].push(RequestKind::Update);
            payloads[client].push(b"tail".to_vec());
            issued[client] += 1;
        }
    }
    world.run_for(Duration::from_secs(60));

    let context = || format!("seed {seed}: replay with PMNET_SEED={seed}");
    for client in 0..CLIENT_COUNT {
        let session = world.session(client);
        let node = &world.clients[client];
        assert_eq!(
            node.client.in_flight_count(),
            0,
            "{}: requests still in flight",
            context()
        );
        // Every request completed (none failed once healed), and was applied exactly once,
        // in sequence order.
        // Every sequence number was applied exactly once and in order: the request itself,
        // or, for a request the client gave up on, either it or its no-op fill.
        let applied = world.applied_seqs(session);
        // A prefix of the session is applied; whatever is missing at the end failed (nothing
        // after it revealed a gap, so nobody asked for a fill).
        let failed: Vec<u32> = node
            .completed
            .iter()
            .filter_map(|event| match event {
                ClientEvent::Failed { seq, .. } => Some(*seq),
                ClientEvent::Completed { .. } => None,
            })
            .collect();
        let applied_through = applied.len() as u32;
        let expected: Vec<u32> = (1..=applied_through).collect();
        assert_eq!(
            applied,
            expected,
            "{}: client {client} applied sequence",
            context()
        );
        for missing in applied_through + 1..=issued[client] {
            assert!(
                failed.contains(&missing),
                "{}: client {client} seq {missing} lost",
                context()
            );
        }
        let applied_requests: Vec<&Vec<u8>> = world
            .server
            .app
            .applied
            .iter()
            .filter(|(s, ..)| *s == session)
            .map(|(.., request)| request)
            .collect();
        let mut completed_updates = Vec::new();
        for event in &node.completed {
            match event {
                ClientEvent::Completed {
                    seq,
                    kind,
                    completion,
                } => {
                    let index = *seq as usize - 1;
                    assert_eq!(*kind, kinds[client][index]);
                    assert!(
                        index < applied_requests.len(),
                        "{}: completed {seq} not applied",
                        context()
                    );
                    // What the server applied is what the client sent, not a fill.
                    assert_eq!(
                        applied_requests[index],
                        &payloads[client][index],
                        "{}",
                        context()
                    );
                    if *kind == RequestKind::Update {
                        completed_updates.push(*seq);
                    }
                    if let (
                        RequestKind::Bypass,
                        Completion::Replied {
                            reply,
                            makeup: false,
                        },
                    ) = (kind, completion)
                    {
                        // Read-your-writes: the bypass saw every earlier update of its session
                        // that completed, and no update issued after it.
                        let seen = u32::from_be_bytes(reply[..4].try_into().unwrap());
                        let issued_before = kinds[client][..index]
                            .iter()
                            .filter(|kind| **kind == RequestKind::Update)
                            .count() as u32;
                        let completed_before = completed_updates
                            .iter()
                            .filter(|done| **done < *seq)
                            .count() as u32;
                        assert!(
                            completed_before <= seen && seen <= issued_before,
                            "{}: bypass {seq} saw {seen} updates",
                            context()
                        );
                    }
                }
                ClientEvent::Failed { .. } => failures += 1,
            }
        }
    }
    eprintln!("random_faults: seed {seed}: {failures} requests failed during the fault phase");
    let device = &world.device.as_ref().unwrap().device;
    assert_eq!(
        device.live_entry_count(),
        0,
        "{}: leaked log entries",
        context()
    );
    assert_eq!(world.server.server.busy_session_count(), 0, "{}", context());
}

//! An ack is a promise, everywhere: scenarios where an acknowledged update used to be lost or a
//! sender could make an endpoint spend without bound, each driven through the in-memory
//! network with a virtual clock.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{ClientError, ClientEvent, Completion, RequestKind};
use pmnet_sim::{client_addr, device_addr, server_addr, World, SERVER_ID};
use pmnet_wire::{Header, PacketType, MAX_REQUEST_LIFETIME_MS};

const STEPS: usize = 2_000_000;

fn drive_to_quiet(world: &mut World) {
    world.run_for(Duration::from_secs(5));
}

/// Longer than any client's request lifetime plus the server's margin: every gap is resolved.
fn past_every_lifetime() -> Duration {
    Duration::from_millis(MAX_REQUEST_LIFETIME_MS) + Duration::from_secs(10)
}

fn is_logged(event: Option<&ClientEvent>) -> bool {
    matches!(
        event,
        Some(ClientEvent::Completed {
            completion: Completion::Logged { .. },
            ..
        })
    )
}

fn is_failed(event: Option<&ClientEvent>) -> bool {
    matches!(event, Some(ClientEvent::Failed { .. }))
}

fn short_lifetime(world: &mut World, client: usize) {
    world.reconfigure_client(client, |config| {
        config.request_lifetime = Duration::from_millis(300);
    });
}

#[test]
fn a_full_store_keeps_the_acked_update_in_the_log_until_there_is_room() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.servers[0].store_full = true;
    let seq = world.update(0, b"k=v");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert!(is_logged(world.completion(0, seq)), "acked by the device");
    drive_to_quiet(&mut world);
    // The store has no room: nothing applied, no server-ACK, and the entry stays logged.
    assert!(world.applied_seqs(session).is_empty());
    assert!(world.seen_of(PacketType::ServerAck).is_empty());
    assert_eq!(world.device(0).device().live_entry_count(), 1);
    assert!(world.servers[0].server.counters().requests_deferred >= 2);
    // A later bypass of the session waits behind it (order is kept).
    let read = world.bypass(0, b"get k");
    drive_to_quiet(&mut world);
    assert!(world.completion(0, read).is_none());
    world.servers[0].store_full = false;
    world.drive_until(STEPS, |w| w.completion(0, read).is_some());
    drive_to_quiet(&mut world);
    assert_eq!(world.applied_seqs(session), vec![seq, read]);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn a_request_the_client_gave_up_on_does_not_strand_the_acked_ones_behind_it() {
    // Two log slots, the server down: updates 1 and 2 are logged and acked, 3 finds the log
    // full, is forwarded unlogged and fails. The server starts; update 4 is acked and the
    // client goes away. 4 must be applied without the client.
    let mut world = World::new(1, Some(2));
    short_lifetime(&mut world, 0);
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.stop_server(0);
    let first = world.update(0, b"a1");
    let second = world.update(0, b"a2");
    let third = world.update(0, b"a3");
    world.drive_until(STEPS, |w| w.completion(0, third).is_some());
    assert!(is_logged(world.completion(0, first)));
    assert!(is_logged(world.completion(0, second)));
    assert_eq!(
        world.completion(0, third),
        Some(&ClientEvent::Failed {
            seq: third,
            kind: RequestKind::Update,
            error: ClientError::NotLogged(pmnet_wire::NotLoggedReason::LogFull),
        })
    );
    // The no-op fills the client sends (on giving up, and when asked) are lost: as if it had
    // exited at once, as a command-line client does.
    world.drop_when(|seen| seen.header.has_flag(pmnet_wire::flags::NOOP_FILL));
    world.start_server(0);
    world.drive_until(STEPS, |w| w.device(0).device().live_entry_count() == 0);
    let fourth = world.update(0, b"a4");
    world.drive_until(STEPS, |w| w.completion(0, fourth).is_some());
    assert!(is_logged(world.completion(0, fourth)));
    world.client_leaves(0);
    world.run_for(past_every_lifetime());
    assert_eq!(world.applied_seqs(session), vec![first, second, fourth]);
    assert_eq!(
        world.servers[0].server.counters().sequence_numbers_skipped,
        1
    );
    assert_eq!(world.device(0).device().live_entry_count(), 0);
    assert_eq!(world.servers[0].server.busy_session_count(), 0);
}

#[test]
fn a_window_of_acked_updates_behind_a_hole_is_applied_after_the_client_left() {
    // The server is down; one update of a window finds no slot and is forwarded unlogged,
    // the ones behind it are logged and acked; the client gives up on the hole and leaves.
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    world.stop_server(0);
    // Seq 3 is never logged: every copy of it is lost before the device.
    world.drop_when(|seen| {
        seen.to == device_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.seq == 3
    });
    let seqs: Vec<u32> = (0..16)
        .map(|index| world.update(0, format!("v{index}").as_bytes()))
        .collect();
    world.run_for(Duration::from_millis(50));
    for &seq in &seqs {
        if seq != 3 {
            assert!(is_logged(world.completion(0, seq)), "seq {seq} acked");
        }
    }
    world.client_leaves(0);
    world.start_server(0);
    world.run_for(past_every_lifetime());
    let expected: Vec<u32> = seqs.iter().copied().filter(|seq| *seq != 3).collect();
    assert_eq!(world.applied_seqs(session), expected);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
    let server = world.servers[0].server.counters();
    assert_eq!(server.sequence_numbers_skipped, 1);
    assert!(server.fill_queries_sent >= 1);
    // Nothing was dropped for being beyond the reorder window, nor asked for forever.
    assert_eq!(server.dropped.get("beyond_reorder_window"), None);
    let asked = server.retransmit_requests_sent;
    world.run_for(Duration::from_secs(60));
    assert_eq!(
        world.servers[0].server.counters().retransmit_requests_sent,
        asked
    );
}

#[test]
fn a_number_a_device_holds_whole_is_never_skipped() {
    // The device holds seq 1 (acked) while the server is down for longer than every request
    // lifetime; seq 2's forward arrives first. The fill query finds seq 1 at the device.
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let session = world.session(0);
    // Every forward of seq 1 and every resend is lost until the lease has passed.
    world.drop_when(|seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.seq == 1
            && seen.at.as_nanos() < 25_000_000_000
    });
    let first = world.update(0, b"one");
    let second = world.update(0, b"two");
    world.drive_until(STEPS, |w| w.completion(0, second).is_some());
    assert!(is_logged(world.completion(0, first)));
    world.run_for(past_every_lifetime() + Duration::from_secs(10));
    assert_eq!(world.applied_seqs(session), vec![first, second]);
    let server = world.servers[0].server.counters();
    assert_eq!(server.sequence_numbers_skipped, 0);
    assert!(world.device(0).device().counters().fill_queries_held >= 1);
}

#[test]
fn a_spoofed_gap_gets_at_most_what_its_source_paid_for() {
    // One valid update with a random session and seq 2, straight at the server from an
    // address nobody verified: the gap at seq 1 must not make the server send that address
    // more bytes than it sent, however long the gap lasts.
    let mut world = World::new(1, None);
    drive_to_quiet(&mut world);
    let victim: SocketAddr = "192.0.2.77:4000".parse().expect("address");
    let header = Header::new(
        PacketType::UpdateRequest,
        SERVER_ID,
        0xBAD5_E551_0000_0001,
        2,
    );
    let datagram = header.encode(b"x");
    let sent_len = datagram.len();
    world.inject(victim, server_addr(0), datagram);
    world.run_for(Duration::from_secs(60));
    // Unsolicited: everything but the reply to the request once it is applied.
    let towards_victim: usize = world
        .network
        .seen
        .iter()
        .filter(|seen| seen.to == victim && seen.header.packet_type != PacketType::ServerAck)
        .map(|_| pmnet_wire::HEADER_LEN)
        .sum();
    assert!(
        towards_victim <= sent_len,
        "{towards_victim} bytes sent towards a source that sent {sent_len}"
    );
    // And the gap was resolved: without devices nothing can hold seq 1, so it was skipped.
    let server = &world.servers[0].server;
    assert_eq!(server.busy_session_count(), 0);
    assert_eq!(server.counters().sequence_numbers_skipped, 1);
}

#[test]
fn a_device_passes_on_only_what_the_client_paid_for() {
    // A spoofed update through the device: the server's retransmission requests go to the
    // device, which may pass them on to the client's address only within its credit.
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let victim: SocketAddr = "192.0.2.78:4000".parse().expect("address");
    let header = Header::new(
        PacketType::UpdateRequest,
        SERVER_ID,
        0xBAD5_E551_0000_0002,
        2,
    );
    let datagram = header.encode(b"y");
    let sent_len = datagram.len();
    world.inject(victim, device_addr(0), datagram);
    world.run_for(Duration::from_secs(60));
    let unsolicited: usize = world
        .network
        .seen
        .iter()
        .filter(|seen| {
            seen.to == victim
                && !matches!(
                    seen.header.packet_type,
                    PacketType::PmnetAck | PacketType::ServerAck
                )
        })
        .map(|_| pmnet_wire::HEADER_LEN)
        .sum();
    assert!(
        unsolicited <= sent_len,
        "{unsolicited} unsolicited bytes towards a source that sent {sent_len}"
    );
    // The update itself was acked (it was valid) and, once the gap outlived every lifetime,
    // applied: no log slot held for good.
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn fragment_counts_no_sender_may_use_cost_nothing() {
    let mut world = World::new(1, None);
    drive_to_quiet(&mut world);
    let from = client_addr(0);
    for session in 0..1000u64 {
        let mut header = Header::new(PacketType::UpdateRequest, SERVER_ID, 0xF000 + session, 1);
        header.fragment_count = u16::MAX;
        world.inject(from, server_addr(0), header.encode(&[0]));
    }
    world.run_for(Duration::from_millis(10));
    let server = &world.servers[0].server;
    assert_eq!(server.counters().dropped.get("bad_fragment"), Some(&1000));
    assert_eq!(server.buffered_bytes(), 0);
}

#[test]
fn reassembly_memory_is_bounded_in_all_and_per_session() {
    let mut world = World::new(1, None);
    let now = world.now;
    let node = &mut world.servers[0];
    node.config.buffered_bytes_max = 1 << 20;
    node.config.session_buffered_bytes_max = 256 << 10;
    node.server = pmnet_proto::Server::new(node.config.clone(), now, Vec::new());
    drive_to_quiet(&mut world);
    let from = client_addr(0);
    // Many sessions, each starting the largest reassembly a sender may claim.
    for session in 0..2000u64 {
        let mut header = Header::new(PacketType::UpdateRequest, SERVER_ID, 0xE000 + session, 1);
        header.fragment_count = pmnet_wire::MAX_FRAGMENT_COUNT;
        world.inject(from, server_addr(0), header.encode(&[0; 64]));
    }
    // One session sending every sequence number of its reorder window, large.
    for seq in 2..1000u32 {
        let header = Header::new(PacketType::UpdateRequest, SERVER_ID, 0xD000, seq);
        world.inject(from, server_addr(0), header.encode(&[1; 1400]));
    }
    world.run_for(Duration::from_millis(10));
    let server = &world.servers[0].server;
    assert!(server.buffered_bytes() <= 1 << 20);
    assert!(server.counters().dropped.get("reassembly_budget").copied() > Some(0));
}

#[test]
fn updates_no_server_accepts_do_not_hold_log_slots_for_good() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let from = client_addr(0);
    // Seq 0 is refused at the door.
    for session in 0..10u64 {
        let header = Header::new(PacketType::UpdateRequest, SERVER_ID, 0xA000 + session, 0);
        world.inject(from, device_addr(0), header.encode(b"z"));
    }
    // Far beyond the server's reorder window, on sessions it never saw.
    for session in 0..10u64 {
        let header = Header::new(
            PacketType::UpdateRequest,
            SERVER_ID,
            0xB000 + session,
            1_000_000,
        );
        world.inject(from, device_addr(0), header.encode(b"w"));
    }
    world.run_for(Duration::from_millis(10));
    let device = &world.device(0).device();
    assert_eq!(device.counters().dropped.get("zero_seq"), Some(&10));
    assert_eq!(device.live_entry_count(), 10);
    world.run_for(past_every_lifetime());
    // Resolved: the gaps before them skipped (no device held anything there), then applied.
    assert_eq!(world.device(0).device().live_entry_count(), 0);
    assert_eq!(world.servers[0].server.busy_session_count(), 0);
}

#[test]
fn a_server_back_after_an_outage_drains_the_log_in_order_without_drops() {
    let mut world = World::new(4, Some(4096));
    drive_to_quiet(&mut world);
    world.stop_server(0);
    let mut logged = 0;
    for round in 0..200 {
        for client in 0..4 {
            let seq = world.update(client, format!("r{round}").as_bytes());
            world.drive_until(STEPS, |w| w.completion(client, seq).is_some());
            assert!(is_logged(world.completion(client, seq)));
            logged += 1;
        }
    }
    assert_eq!(world.device(0).device().live_entry_count(), logged);
    world.run_for(Duration::from_secs(5)); // resends pile up against a dead server
    world.start_server(0);
    world.drive_until(STEPS, |w| w.device(0).device().live_entry_count() == 0);
    let server = world.servers[0].server.counters();
    assert_eq!(server.requests_applied, logged as u64);
    assert_eq!(server.dropped.get("beyond_reorder_window"), None);
    let device = world.device(0).device().counters();
    // Paced: the replay never had more out than its window.
    assert!(device.replay_sent >= logged as u64);
    for client in 0..4 {
        let session = world.session(client);
        assert_eq!(world.applied_seqs(session), (1..=200).collect::<Vec<u32>>());
    }
    assert!(!is_failed(world.completion(0, 1)));
}

#[test]
fn a_late_recovery_done_is_counted_as_a_drop() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    assert!(!world.servers[0].server.is_recovering());
    let mut done = Header::new(PacketType::RecoveryDone, SERVER_ID, 0, 1);
    done.device_id = pmnet_sim::DEVICE_ID;
    world.inject(
        device_addr(0),
        server_addr(0),
        done.encode(&pmnet_wire::encode_recovery_done_payload(0)),
    );
    world.run_for(Duration::from_millis(1));
    assert_eq!(
        world.servers[0]
            .server
            .counters()
            .dropped
            .get("late_recovery_done"),
        Some(&1)
    );
}

#[test]
fn what_a_recovering_server_held_back_is_applied_in_arrival_order_across_sessions() {
    // A server starting up holds every request until its device answers the recovery poll.
    // An update acked by the device and then a read of another session (a smaller session
    // id, so an order by id would put it first) must reach the store in the order they came.
    use pmnet_proto::{Server, ServerConfig, ServerEvent, Time};
    let device = device_addr(0);
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, vec![device]),
        Time::ZERO,
        Vec::new(),
    );
    assert!(server.is_recovering());
    let (writer, reader) = (0x9000_u64, 0x1000_u64);
    for (session, seq, packet_type, body) in [
        (writer, 1, PacketType::UpdateRequest, &b"k=v"[..]),
        (reader, 1, PacketType::BypassRequest, &b"get k"[..]),
        (writer, 2, PacketType::UpdateRequest, &b"k=w"[..]),
    ] {
        let datagram = Header::new(packet_type, SERVER_ID, session, seq).encode(body);
        server.handle(Time::ZERO, device, &datagram);
    }
    assert!(
        std::iter::from_fn(|| server.poll_event()).next().is_none(),
        "nothing applied while recovering"
    );
    let mut done = Header::new(PacketType::RecoveryDone, SERVER_ID, 0, 0);
    done.device_id = pmnet_sim::DEVICE_ID;
    server.handle(
        Time::ZERO,
        device,
        &done.encode(&pmnet_wire::encode_recovery_done_payload(0)),
    );
    let applied: Vec<(u64, u32)> = std::iter::from_fn(|| server.poll_event())
        .filter_map(|event| match event {
            ServerEvent::Apply {
                session_id, seq, ..
            } => Some((session_id, seq)),
            _ => None,
        })
        .collect();
    assert_eq!(applied, vec![(writer, 1), (reader, 1), (writer, 2)]);
}

/// A keyed write as a device forwards it: its descriptor's order names the request it follows.
fn keyed_write(session: u64, seq: u32, after: Option<(u64, u32)>, value: &[u8]) -> Vec<u8> {
    use pmnet_wire::cache::{WriteDescriptor, WriteOrder, KEYED};
    let (after_session, after_seq) = after.unwrap_or((0, 0));
    let mut payload = Vec::new();
    WriteDescriptor {
        order: WriteOrder {
            after_session,
            after_seq,
            stamp: u64::from(seq),
        },
        key: b"k",
        reply_after: Some(value),
        afters: &[],
    }
    .emit(&mut payload);
    payload.extend_from_slice(b"k=");
    payload.extend_from_slice(value);
    let mut header = Header::new(PacketType::UpdateRequest, SERVER_ID, session, seq);
    header.flags |= KEYED;
    header.encode(&payload)
}

fn applied_events(server: &mut pmnet_proto::Server) -> Vec<(u64, u32, Vec<u8>)> {
    use pmnet_proto::ServerEvent;
    std::iter::from_fn(|| server.poll_event())
        .filter_map(|event| match event {
            ServerEvent::Apply {
                session_id,
                seq,
                request,
                ..
            } => Some((session_id, seq, request)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_keyed_write_waits_for_the_earlier_write_to_its_key_it_names() {
    use pmnet_proto::{Server, ServerConfig, Time};
    let device = device_addr(0);
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, Vec::new()),
        Time::ZERO,
        Vec::new(),
    );
    let (first, second) = (0xA, 0xB);
    // The later write arrives first (the earlier one's forward was delayed or lost).
    server.handle(
        Time::ZERO,
        device,
        &keyed_write(second, 1, Some((first, 1)), b"new"),
    );
    assert!(
        applied_events(&mut server).is_empty(),
        "held until the earlier write is applied"
    );
    assert_eq!(server.counters().keyed_writes_held, 1);
    server.handle(Time::ZERO, device, &keyed_write(first, 1, None, b"old"));
    // The earlier one goes to the application, without its descriptor; the later one still
    // waits: issued is not applied.
    assert_eq!(
        applied_events(&mut server),
        vec![(first, 1, b"k=old".to_vec())]
    );
    server.on_applied(Time::ZERO, first, 1, b"+OK".to_vec());
    assert_eq!(
        applied_events(&mut server),
        vec![(second, 1, b"k=new".to_vec())]
    );
    server.on_applied(Time::ZERO, second, 1, b"+OK".to_vec());
    assert_eq!(server.busy_session_count(), 0);
}

#[test]
fn a_keyed_write_whose_wait_is_given_up_for_lack_of_room_goes_at_once() {
    // A table of one session: the session a keyed write names cannot be taken in, so the
    // wait is given up at once (counted) and the write goes to the application then, not
    // only when something else happens to the session (found by the swarm: the session
    // stalled for good).
    use pmnet_proto::{Server, ServerConfig, Time};
    let device = device_addr(0);
    let mut config = ServerConfig::new(SERVER_ID, Vec::new());
    config.sessions_max = 1;
    let mut server = Server::new(config, Time::ZERO, Vec::new());
    let (first, second) = (0xA, 0xB);
    server.handle(
        Time::ZERO,
        device,
        &keyed_write(second, 1, Some((first, 1)), b"new"),
    );
    assert_eq!(server.counters().keyed_order_given_up, 1);
    assert_eq!(
        applied_events(&mut server),
        vec![(second, 1, b"k=new".to_vec())]
    );
    server.on_applied(Time::ZERO, second, 1, b"+OK".to_vec());
    assert_eq!(server.busy_session_count(), 0);
}

#[test]
fn a_keyed_write_that_names_a_request_no_one_holds_is_applied_once_it_is_skipped() {
    // The session named never sent that request through any device (a stale or forged
    // order): the server asks the devices, none holds it, the number is skipped, and the
    // waiting write goes on. A session never waits for what cannot come.
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let (absent, waiting) = (0xDEAD_0000_0000_0001, 0xBEEF_0000_0000_0001);
    world.inject(
        device_addr(0),
        server_addr(0),
        keyed_write(waiting, 1, Some((absent, 5)), b"v"),
    );
    world.run_for(Duration::from_millis(10));
    assert!(world.applied_seqs(waiting).is_empty(), "waits at first");
    world.run_for(past_every_lifetime());
    assert_eq!(world.applied_seqs(waiting), vec![1]);
    let server = world.servers[0].server.counters();
    assert_eq!(server.keyed_writes_held, 1);
    assert!(server.sequence_numbers_skipped >= 5);
}

fn cache_read(session: u64, id: u32, read_after: u32, after: Option<(u64, u32)>) -> Vec<u8> {
    use pmnet_wire::cache::{ReadDescriptor, CACHE_READ};
    let (after_session, after_seq) = after.unwrap_or((0, 0));
    let mut payload = Vec::new();
    ReadDescriptor {
        read_after,
        after_session,
        after_seq,
        key: b"k",
    }
    .emit(&mut payload);
    payload.extend_from_slice(b"get k");
    Header::new(PacketType::Reserved(CACHE_READ), SERVER_ID, session, id).encode(&payload)
}

fn read_events(server: &mut pmnet_proto::Server) -> Vec<(u64, u32, Vec<u8>)> {
    use pmnet_proto::ServerEvent;
    std::iter::from_fn(|| server.poll_event())
        .filter_map(|event| match event {
            ServerEvent::Read {
                session_id,
                id,
                request,
            } => Some((session_id, id, request)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_cache_read_waits_for_its_session_s_updates_and_for_the_write_a_device_names() {
    use pmnet_proto::{Server, ServerConfig, Time};
    use pmnet_wire::cache::CACHE_REPLY;
    let device = device_addr(0);
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, Vec::new()),
        Time::ZERO,
        Vec::new(),
    );
    let (reader, writer) = (0x1, 0x2);
    // Read-your-writes: the reader's update 1 is not applied yet.
    server.handle(Time::ZERO, device, &cache_read(reader, 7, 1, None));
    // And another read names the writer's keyed write 1, acked by the device, not applied.
    server.handle(
        Time::ZERO,
        device,
        &cache_read(reader, 8, 0, Some((writer, 1))),
    );
    assert!(read_events(&mut server).is_empty());
    assert_eq!(server.held_read_count(), 2);
    server.handle(Time::ZERO, device, &keyed_write(reader, 1, None, b"mine"));
    assert_eq!(applied_events(&mut server).len(), 1);
    server.on_applied(Time::ZERO, reader, 1, b"+OK".to_vec());
    assert_eq!(
        read_events(&mut server),
        vec![(reader, 7, b"get k".to_vec())]
    );
    server.handle(Time::ZERO, device, &keyed_write(writer, 1, None, b"theirs"));
    assert_eq!(applied_events(&mut server).len(), 1);
    server.on_applied(Time::ZERO, writer, 1, b"+OK".to_vec());
    assert_eq!(
        read_events(&mut server),
        vec![(reader, 8, b"get k".to_vec())]
    );
    while server.poll_transmit().is_some() {}
    // The application's answer goes back as a cache reply, to where the read came from.
    server.on_read_reply(reader, 8, b"theirs");
    let reply = server.poll_transmit().expect("a cache reply");
    assert_eq!(reply.destination, device);
    let (header, _) = Header::parse(&reply.bytes).unwrap();
    assert_eq!(header.packet_type, PacketType::Reserved(CACHE_REPLY));
    assert_eq!((header.session_id, header.seq), (reader, 8));
    assert_eq!(&reply.bytes[pmnet_wire::HEADER_LEN..], b"theirs");
    assert_eq!(server.counters().reads.answered, 1);
    // A read whose descriptor does not parse is counted and dropped.
    let bad = Header::new(
        PacketType::Reserved(pmnet_wire::cache::CACHE_READ),
        SERVER_ID,
        3,
        1,
    )
    .encode(&[0, 0]);
    server.handle(Time::ZERO, device, &bad);
    assert_eq!(server.counters().dropped.get("bad_cache_read"), Some(&1));
}

#[test]
fn held_cache_reads_are_bounded_and_the_oldest_go_first() {
    use pmnet_proto::{Server, ServerConfig, Time, HELD_READS_MAX};
    let device = device_addr(0);
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, Vec::new()),
        Time::ZERO,
        Vec::new(),
    );
    // Reads that wait for an update their session never sends.
    for id in 0..=HELD_READS_MAX as u32 {
        server.handle(Time::ZERO, device, &cache_read(0x77, id + 1, 1_000, None));
    }
    assert_eq!(server.held_read_count(), HELD_READS_MAX);
    assert_eq!(server.counters().reads.dropped_held_full, 1);
}

#[test]
fn keyed_writes_to_one_key_are_applied_in_the_order_the_device_acked_them() {
    // Two sessions write one key through the device; the first write's forward to the
    // server is lost, so the second reaches the server first. The device wrote into the
    // second the write it must follow, and the server waits for the device's resend.
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let (first, second) = (0x1111_0000_0000_0001, 0x2222_0000_0000_0001);
    world.drop_first(move |seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.session_id == first
    });
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(first, 1, None, b"old"),
    );
    world.run_for(Duration::from_micros(300));
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(second, 1, None, b"new"),
    );
    world.run_for(Duration::from_secs(2));
    let applied: Vec<u64> = world.servers[0]
        .app
        .applied
        .iter()
        .map(|(session, ..)| *session)
        .filter(|session| [first, second].contains(session))
        .collect();
    assert_eq!(applied, vec![first, second], "in the device's order");
    let pipeline = &world.device(0).pipeline;
    assert_eq!(
        pipeline.front_sample("pmnet_device_keyed_writes_ordered_total"),
        Some(2)
    );
    assert_eq!(
        pipeline.front_sample("pmnet_device_keyed_keys"),
        Some(0),
        "both acked by the server"
    );
    assert_eq!(world.servers[0].server.counters().keyed_writes_held, 1);
}

/// A barrier (a keyed write with no key) as a client sends it, with room for `room` afters.
fn barrier(session: u64, seq: u32, room: usize, value: &[u8]) -> Vec<u8> {
    let mut payload = pmnet_wire::cache::WriteDescriptor::barrier(room);
    payload.extend_from_slice(b"k=");
    payload.extend_from_slice(value);
    let mut header = Header::new(PacketType::UpdateRequest, SERVER_ID, session, seq);
    header.flags |= pmnet_wire::cache::KEYED;
    header.encode(&payload)
}

fn applied_sessions(world: &World, sessions: &[u64]) -> Vec<u64> {
    world.servers[0]
        .app
        .applied
        .iter()
        .map(|(session, ..)| *session)
        .filter(|session| sessions.contains(session))
        .collect()
}

#[test]
fn a_barrier_is_applied_after_every_session_s_keyed_write_the_device_acked_before_it() {
    // Two sessions' keyed writes to two keys; both forwards are lost. A barrier from a third
    // session, acked after them, reaches the server first: it waits for both. A keyed write
    // acked after the barrier (to a third key) waits for the barrier.
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let (one, two, three, four) = (
        0x1111_0000_0000_0002,
        0x2222_0000_0000_0002,
        0x3333_0000_0000_0002,
        0x4444_0000_0000_0002,
    );
    world.drop_first(move |seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.session_id == one
    });
    world.drop_first(move |seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.session_id == two
    });
    let write_to = |world: &mut World, session: u64, key: &[u8]| {
        use pmnet_wire::cache::{WriteDescriptor, WriteOrder, KEYED};
        let mut payload = Vec::new();
        WriteDescriptor {
            order: WriteOrder::default(),
            key,
            reply_after: None,
            afters: &[],
        }
        .emit(&mut payload);
        payload.extend_from_slice(b"k=v");
        let mut header = Header::new(PacketType::UpdateRequest, SERVER_ID, session, 1);
        header.flags |= KEYED;
        world.inject(client_addr(0), device_addr(0), header.encode(&payload));
        world.run_for(Duration::from_micros(300));
    };
    write_to(&mut world, one, b"a");
    write_to(&mut world, two, b"b");
    world.inject(client_addr(0), device_addr(0), barrier(three, 1, 4, b"x"));
    world.run_for(Duration::from_micros(300));
    write_to(&mut world, four, b"c");
    world.run_for(Duration::from_secs(2));
    let applied = applied_sessions(&world, &[one, two, three, four]);
    assert_eq!(applied.len(), 4, "{applied:x?}");
    let at = |session| applied.iter().position(|s| *s == session).unwrap();
    assert!(at(three) > at(one) && at(three) > at(two), "{applied:x?}");
    assert!(at(four) > at(three), "{applied:x?}");
    assert_eq!(
        world
            .device(0)
            .pipeline
            .front_sample("pmnet_device_keyed_keys"),
        Some(0)
    );
    assert!(world.servers[0].server.counters().keyed_writes_held >= 2);
}

#[test]
fn a_barrier_without_room_for_the_sessions_it_must_follow_is_dropped_and_counted() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let (one, two, three) = (0x1111_0000_0000_0003, 0x2222_0000_0000_0003, 0x3);
    // Nothing reaches the server: both writes stay unacknowledged.
    world.drop_when(move |seen| seen.to == server_addr(0));
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(one, 1, None, b"1"),
    );
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(two, 1, None, b"2"),
    );
    world.run_for(Duration::from_micros(300));
    world.inject(client_addr(0), device_addr(0), barrier(three, 1, 1, b"x"));
    world.run_for(Duration::from_micros(300));
    let dropped = world.device(0).pipeline.dropped();
    assert_eq!(dropped.get("barrier_no_room"), Some(&1), "{dropped:?}");
    // With room for both, it is logged.
    world.inject(client_addr(0), device_addr(0), barrier(three, 1, 2, b"x"));
    world.run_for(Duration::from_micros(300));
    assert_eq!(
        world.device(0).pipeline.dropped().get("barrier_no_room"),
        Some(&1)
    );
    assert_eq!(
        world
            .device(0)
            .pipeline
            .front_sample("pmnet_device_keyed_keys"),
        Some(2),
        "k and the barriers"
    );
}

#[test]
fn a_cache_read_the_device_forwards_waits_for_the_keyed_write_it_acked() {
    let mut world = World::new(1, Some(64));
    drive_to_quiet(&mut world);
    let (writer, reader) = (0x3333_0000_0000_0001, 0x4444_0000_0000_0001);
    world.drop_first(move |seen| {
        seen.to == server_addr(0)
            && seen.header.packet_type == PacketType::UpdateRequest
            && seen.header.session_id == writer
    });
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(writer, 1, None, b"v"),
    );
    world.run_for(Duration::from_micros(300));
    world.inject(
        client_addr(0),
        device_addr(0),
        cache_read(reader, 1, 0, None),
    );
    world.run_for(Duration::from_secs(2));
    let device = world.device(0).device().counters().clone();
    let reads_ordered = world
        .device(0)
        .pipeline
        .front_sample("pmnet_device_cache_reads_ordered_total");
    assert_eq!((device.cache_reads_forwarded, reads_ordered), (1, Some(1)));
    assert_eq!(device.cache_replies_forwarded, 1);
    let reads = world.servers[0].server.counters().reads.clone();
    assert_eq!((reads.held, reads.answered), (1, 1));
    // Answered only after the write it follows was applied.
    let replied_at = world
        .seen_of(PacketType::Reserved(pmnet_wire::cache::CACHE_REPLY))
        .first()
        .map(|seen| seen.at)
        .expect("a cache reply");
    let applied_at = world
        .seen_of(PacketType::ServerAck)
        .iter()
        .find(|seen| seen.header.session_id == writer)
        .map(|seen| seen.at)
        .expect("the write's server-ACK");
    assert!(applied_at <= replied_at);
}

#[test]
fn a_cache_read_waits_for_a_keyed_write_the_device_could_not_log() {
    // One log slot, held by an update whose forward is lost. A keyed write then finds the log
    // full: it is forwarded unlogged, and that forward is lost too. A cache read of its key
    // forwarded behind it must not be answered before the write is applied (its answer could
    // be cached, and the write's value lost to readers): the client's resend applies it.
    let mut world = World::new(1, Some(1));
    drive_to_quiet(&mut world);
    let (filler, writer, reader) = (
        0x5555_0000_0000_0001,
        0x6666_0000_0000_0001,
        0x7777_0000_0000_0001,
    );
    for session in [filler, writer] {
        world.drop_first(move |seen| {
            seen.to == server_addr(0)
                && seen.header.packet_type == PacketType::UpdateRequest
                && seen.header.session_id == session
        });
    }
    let plain = Header::new(PacketType::UpdateRequest, SERVER_ID, filler, 1).encode(b"x=1");
    world.inject(client_addr(0), device_addr(0), plain);
    world.run_for(Duration::from_micros(50));
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(writer, 1, None, b"v"),
    );
    world.run_for(Duration::from_micros(50));
    assert_eq!(world.device(0).device().counters().log_full, 1);
    world.inject(
        client_addr(0),
        device_addr(0),
        cache_read(reader, 1, 0, None),
    );
    world.run_for(Duration::from_millis(5));
    world.inject(
        client_addr(0),
        device_addr(0),
        keyed_write(writer, 1, None, b"v"),
    );
    world.run_for(Duration::from_secs(2));
    assert_eq!(
        world
            .device(0)
            .pipeline
            .front_sample("pmnet_device_cache_reads_ordered_total"),
        Some(1),
        "the read follows the write"
    );
    let replied_at = world
        .seen_of(PacketType::Reserved(pmnet_wire::cache::CACHE_REPLY))
        .first()
        .map(|seen| seen.at)
        .expect("a cache reply");
    let applied_at = world
        .seen_of(PacketType::ServerAck)
        .iter()
        .find(|seen| seen.header.session_id == writer)
        .map(|seen| seen.at)
        .expect("the write's server-ACK");
    assert!(
        applied_at <= replied_at,
        "read answered at {replied_at:?}, write applied at {applied_at:?}"
    );
    assert_eq!(
        world
            .device(0)
            .pipeline
            .front_sample("pmnet_device_keyed_keys"),
        Some(0)
    );
}

#[test]
fn keyed_writes_that_wait_for_each_other_are_applied_after_the_longest_wait() {
    // A cycle of waits cannot be built by one device's order (docs/cache.md), but a device
    // that forgot an unlogged keyed bypass in a crash can place it after a write that waits
    // for it. The server gives the wait up after ORDER_WAIT_MAX (60 s) rather than hold both.
    use pmnet_proto::{Server, ServerConfig, Time};
    let device = device_addr(0);
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, Vec::new()),
        Time::ZERO,
        Vec::new(),
    );
    let (one, two) = (0xA, 0xB);
    server.handle(
        Time::ZERO,
        device,
        &keyed_write(one, 1, Some((two, 1)), b"1"),
    );
    server.handle(
        Time::ZERO,
        device,
        &keyed_write(two, 1, Some((one, 1)), b"2"),
    );
    let mut now = Time::ZERO;
    loop {
        let next = server
            .poll_timeout()
            .unwrap_or(now)
            .max(Time::from_nanos(now.as_nanos() + 1_000_000));
        if next >= Time::from_nanos(59_000_000_000) {
            break;
        }
        now = next;
        server.handle_timeout(now);
        while server.poll_transmit().is_some() {}
        assert!(applied_events(&mut server).is_empty(), "held at {now:?}");
    }
    now = Time::from_nanos(61_000_000_000);
    server.handle_timeout(now);
    // Both waits started together and are given up together.
    let applied: Vec<u64> = applied_events(&mut server)
        .into_iter()
        .map(|(session, ..)| session)
        .collect();
    assert_eq!(
        applied,
        vec![one, two],
        "applied once the waits are given up"
    );
    assert_eq!(server.counters().keyed_order_timed_out, 2);
}

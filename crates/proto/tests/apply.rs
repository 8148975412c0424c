//! The server-side executor: requests staged in batches, committed once per batch, reported
//! applied (and acked) only after the commit; a request with no room handed back after what
//! was staged before it is committed.

use std::net::SocketAddr;

use pmnet_proto::{RequestKind, Server, ServerConfig, Stager, Time};
use pmnet_wire::{Header, PacketType};

#[derive(Debug, Default)]
struct Recorder {
    /// What happened, in order: "stage s/q", "commit", "refuse s/q".
    log: Vec<String>,
    /// Requests of these sequence numbers find no room.
    refuse: Vec<u32>,
    max_staged: usize,
}

impl Stager for Recorder {
    fn stage(&mut self, session_id: u64, seq: u32, _: RequestKind, _: &[u8]) -> Option<Vec<u8>> {
        if self.refuse.contains(&seq) {
            self.log.push(format!("refuse {session_id}/{seq}"));
            return None;
        }
        self.log.push(format!("stage {session_id}/{seq}"));
        Some(b"OK".to_vec())
    }
    fn commit(&mut self) {
        self.log.push("commit".into());
    }
    fn read(&mut self, request: &[u8]) -> Vec<u8> {
        self.log
            .push(format!("read {}", String::from_utf8_lossy(request)));
        b"value".to_vec()
    }
    fn error_reply(&self, message: &str) -> Vec<u8> {
        format!("error: {message}").into_bytes()
    }
    fn max_staged(&self) -> usize {
        self.max_staged
    }
}

const SERVER_ID: u16 = 1;

fn device() -> SocketAddr {
    "192.0.2.7:7400".parse().unwrap()
}

fn server() -> Server {
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, Vec::new()),
        Time::ZERO,
        Vec::new(),
    );
    while server.poll_transmit().is_some() {}
    server
}

fn update(server: &mut Server, session: u64, seq: u32) {
    let datagram = Header::new(PacketType::UpdateRequest, SERVER_ID, session, seq).encode(b"x");
    server.handle(Time::ZERO, device(), &datagram);
}

fn acks(server: &mut Server) -> Vec<(u64, u32)> {
    std::iter::from_fn(|| server.poll_transmit())
        .filter_map(|transmit| Header::parse(&transmit.bytes).ok().map(|(h, _)| h))
        .filter(|header| header.packet_type == PacketType::ServerAck)
        .map(|header| (header.session_id, header.seq))
        .collect()
}

#[test]
fn a_batch_is_committed_once_before_any_of_its_acks() {
    let mut server = server();
    for seq in 1..=3 {
        update(&mut server, 5, seq);
    }
    update(&mut server, 6, 1);
    assert!(
        acks(&mut server).is_empty(),
        "nothing acked before it is applied"
    );
    let mut app = Recorder {
        max_staged: 100,
        ..Recorder::default()
    };
    let applied = server.apply_ready(Time::ZERO, &mut app);
    assert_eq!(
        (applied.applied, applied.commits, applied.deferred),
        (4, 1, 0)
    );
    assert_eq!(app.log.last().map(String::as_str), Some("commit"));
    assert_eq!(app.log.iter().filter(|entry| *entry == "commit").count(), 1);
    let mut acked = acks(&mut server);
    acked.sort_unstable();
    assert_eq!(acked, vec![(5, 1), (5, 2), (5, 3), (6, 1)]);
}

#[test]
fn a_batch_is_bounded_by_max_staged() {
    let mut server = server();
    for seq in 1..=5 {
        update(&mut server, 5, seq);
    }
    let mut app = Recorder {
        max_staged: 2,
        ..Recorder::default()
    };
    let applied = server.apply_ready(Time::ZERO, &mut app);
    assert_eq!((applied.applied, applied.commits), (5, 3));
    assert_eq!(
        app.log,
        [
            "stage 5/1",
            "stage 5/2",
            "commit",
            "stage 5/3",
            "stage 5/4",
            "commit",
            "stage 5/5",
            "commit"
        ]
    );
}

#[test]
fn a_request_with_no_room_is_handed_back_after_what_came_before_it_is_committed() {
    let mut server = server();
    for seq in 1..=3 {
        update(&mut server, 5, seq);
    }
    let mut app = Recorder {
        max_staged: 100,
        refuse: vec![2],
        ..Recorder::default()
    };
    let applied = server.apply_ready(Time::ZERO, &mut app);
    assert_eq!((applied.applied, applied.deferred), (1, 1));
    assert_eq!(app.log, ["stage 5/1", "refuse 5/2", "commit"]);
    // Only what was committed is acked; seq 2 (and 3 behind it) wait for room.
    assert_eq!(acks(&mut server), vec![(5, 1)]);
    assert_eq!(server.counters().requests_deferred, 1);
}

#[test]
fn a_cache_read_is_answered_on_what_is_committed() {
    use pmnet_wire::cache::{ReadDescriptor, CACHE_READ};
    let mut server = server();
    update(&mut server, 5, 1);
    let mut payload = Vec::new();
    ReadDescriptor {
        read_after: 1,
        after_session: 0,
        after_seq: 0,
        key: b"k",
    }
    .emit(&mut payload);
    payload.extend_from_slice(b"get k");
    let read = Header::new(PacketType::Reserved(CACHE_READ), SERVER_ID, 5, 9).encode(&payload);
    server.handle(Time::ZERO, device(), &read);
    let mut app = Recorder {
        max_staged: 100,
        ..Recorder::default()
    };
    // The read waits for update 1 (read-your-writes), and is answered once it is applied
    // and committed, in the same round.
    let applied = server.apply_ready(Time::ZERO, &mut app);
    assert_eq!((applied.applied, applied.reads), (1, 1));
    assert_eq!(app.log, ["stage 5/1", "commit", "read get k"]);
}

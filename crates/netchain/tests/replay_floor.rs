//! A restarted head knows only what reached it since: a write sealed before it started is
//! refused, even of a session it has learned again since (a later write of that session passed
//! down to it as a member of another chain). Replayed then, the write would run twice.

mod common;

use std::collections::VecDeque;
use std::net::SocketAddr;

use common::{client, geometry, member};
use pmnet_netchain::{group_of, ChainConfig, ChainNode, Table, TableFile};
use pmnet_pm::SimRegion;
use pmnet_proto::Time;
use pmnet_wire::netchain::{Op, Request, Write, CHAIN_REQUEST, CHAIN_WRITE};
use pmnet_wire::{Header, PacketType};

const MEMBERS: usize = 3;
const GROUPS: u16 = 2;
const SESSION: u64 = 9;

fn config(index: usize) -> ChainConfig {
    let members: Vec<SocketAddr> = (0..MEMBERS).map(member).collect();
    ChainConfig::new(
        member(index),
        1,
        pmnet_netchain::rotated_groups(&members, GROUPS),
    )
}

/// A key of `group`.
fn key_of(group: u16) -> Vec<u8> {
    (0..=255u8)
        .map(|byte| vec![b'k', byte])
        .find(|key| group_of(key, GROUPS) == group)
        .expect("a key of each group")
}

struct Chain {
    members: Vec<ChainNode>,
    /// When each member started (Unix ms).
    started_ms: Vec<u64>,
    files: Vec<TableFile<SimRegion>>,
}

impl Chain {
    fn new() -> Chain {
        Chain {
            members: (0..MEMBERS)
                .map(|index| ChainNode::new(config(index), Table::new(geometry()), Time::ZERO))
                .collect(),
            started_ms: vec![500; MEMBERS],
            files: (0..MEMBERS)
                .map(|_| {
                    TableFile::format(SimRegion::new(geometry().region_len()), geometry())
                        .expect("format")
                })
                .collect(),
        }
    }

    /// Deliver `bytes` and everything it causes, each datagram sealed at `sealed_ms` and
    /// received with the wall clock at `now_ms`, on a perfect network.
    fn deliver(
        &mut self,
        from: SocketAddr,
        to: SocketAddr,
        bytes: Vec<u8>,
        sealed_ms: u64,
        now_ms: u64,
    ) {
        let mut queue = VecDeque::from([(from, to, bytes, sealed_ms)]);
        while let Some((from, to, bytes, sealed_ms)) = queue.pop_front() {
            let Some(index) = (0..MEMBERS).find(|&index| member(index) == to) else {
                continue; // the client's replies
            };
            let (header, payload) = Header::parse(&bytes).unwrap();
            self.members[index].note_seal(sealed_ms, self.started_ms[index]);
            self.members[index].handle(Time::ZERO, from, &header, payload);
            while let Some(batch) = self.members[index].poll_persist() {
                self.files[index].persist_batch(&batch.work);
                self.members[index].on_persisted(Time::ZERO, batch.number);
            }
            while let Some(transmit) = self.members[index].poll_transmit() {
                // What the members send now is sealed now.
                queue.push_back((member(index), transmit.destination, transmit.bytes, now_ms));
            }
        }
    }

    fn restart(&mut self, index: usize, now_ms: u64) {
        self.started_ms[index] = now_ms;
        let (file, recovered) = TableFile::open(self.files[index].region().clone()).expect("open");
        let table = Table::recover(file.geometry(), recovered);
        self.members[index] = ChainNode::new(config(index), table, Time::ZERO);
        self.files[index] = file;
    }

    fn latest(&self, index: usize, key: &[u8]) -> u64 {
        self.members[index]
            .table()
            .latest(key)
            .map_or(0, |version| version.seq)
    }
}

fn put(key: &[u8], request: u32, value: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    Request {
        op: Op::Put,
        group: group_of(key, GROUPS),
        key,
        value,
    }
    .emit(&mut payload);
    Header::new(PacketType::Reserved(CHAIN_REQUEST), 1, SESSION, request).encode(&payload)
}

#[test]
fn a_restarted_head_refuses_a_write_sealed_before_it_started_of_a_session_it_learned_again() {
    // Member 0 heads group 0's chain (0 → 1 → 2) and ends group 1's (1 → 2 → 0).
    let (mine, theirs) = (key_of(0), key_of(1));
    let mut chain = Chain::new();
    chain.deliver(client(), member(0), put(&mine, 1, b"one"), 1_000, 1_000);
    let second = put(&mine, 2, b"two");
    chain.deliver(client(), member(0), second.clone(), 2_000, 2_000);
    assert_eq!(chain.latest(0, &mine), 2);

    // The head restarts; then a write of the same session from its first request (a
    // predecessor's resend, sealed afresh) reaches it as group 1's tail: it learns the
    // session again, knowing of it only request 1.
    chain.restart(0, 4_000);
    let mut payload = Vec::new();
    Write {
        value: Some(b"theirs"),
        group: 1,
        version: 1,
        client: client(),
        key: &theirs,
    }
    .emit(&mut payload);
    let resend = Header::new(PacketType::Reserved(CHAIN_WRITE), 1, SESSION, 1).encode(&payload);
    chain.deliver(member(2), member(0), resend, 5_000, 5_000);
    assert_eq!(chain.latest(0, &theirs), 1);

    // Request 2, replayed verbatim (sealed before the restart), is refused: it ran once.
    chain.deliver(client(), member(0), second, 2_000, 5_001);
    assert_eq!(chain.members[0].counters().replays_refused, 1);
    assert_eq!(chain.latest(0, &mine), 2, "the replay ran again");

    // The client's own next write, sealed now, is taken.
    chain.deliver(client(), member(0), put(&mine, 3, b"three"), 5_002, 5_002);
    assert_eq!(chain.latest(0, &mine), 3);
}

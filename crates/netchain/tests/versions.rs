//! Versions no head issued: a write forged (no keys) from a member's predecessor with a
//! version far above any the head stamped is refused, so the chain stays in step — the head's
//! later writes reach the tail and every member holds the same latest version and value. So is
//! a commit of a version a member never held.

mod common;

use std::collections::VecDeque;
use std::net::SocketAddr;

use common::{client, geometry, member};
use pmnet_netchain::{group_of, ChainConfig, ChainNode, Table, TableFile};
use pmnet_pm::SimRegion;
use pmnet_proto::Time;
use pmnet_wire::netchain::{Commit, Op, Request, Write, CHAIN_COMMIT, CHAIN_REQUEST, CHAIN_WRITE};
use pmnet_wire::{Header, PacketType};

const MEMBERS: usize = 3;

/// One group, chain member 0 → 1 → 2.
struct Chain {
    members: Vec<ChainNode>,
    files: Vec<TableFile<SimRegion>>,
}

impl Chain {
    fn new() -> Chain {
        let chain: Vec<SocketAddr> = (0..MEMBERS).map(member).collect();
        Chain {
            members: (0..MEMBERS)
                .map(|index| {
                    ChainNode::new(
                        ChainConfig::new(member(index), 1, vec![chain.clone()]),
                        Table::new(geometry()),
                        Time::ZERO,
                    )
                })
                .collect(),
            files: (0..MEMBERS)
                .map(|_| {
                    TableFile::format(SimRegion::new(geometry().region_len()), geometry())
                        .expect("format")
                })
                .collect(),
        }
    }

    /// Deliver `bytes` from `from` to `to` and everything it causes, on a perfect network.
    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        let mut queue = VecDeque::from([(from, to, bytes)]);
        while let Some((from, to, bytes)) = queue.pop_front() {
            let Some(index) = (0..MEMBERS).find(|&index| member(index) == to) else {
                continue; // the client's replies
            };
            let (header, payload) = Header::parse(&bytes).unwrap();
            self.members[index].handle(Time::ZERO, from, &header, payload);
            while let Some(batch) = self.members[index].poll_persist() {
                self.files[index].persist_batch(&batch.work);
                self.members[index].on_persisted(Time::ZERO, batch.number);
            }
            while let Some(transmit) = self.members[index].poll_transmit() {
                queue.push_back((member(index), transmit.destination, transmit.bytes));
            }
        }
    }

    fn put(&mut self, request: u32, value: &[u8]) {
        let mut payload = Vec::new();
        Request {
            op: Op::Put,
            group: group_of(b"k", 1),
            key: b"k",
            value,
        }
        .emit(&mut payload);
        let bytes =
            Header::new(PacketType::Reserved(CHAIN_REQUEST), 1, 9, request).encode(&payload);
        self.deliver(client(), member(0), bytes);
    }

    fn durable(&self, index: usize) -> (u64, Vec<u8>) {
        let version = self.members[index].table().durable(b"k").expect("held");
        (version.seq, version.value.clone().unwrap_or_default())
    }
}

#[test]
fn a_forged_write_with_a_huge_version_leaves_the_chain_in_step() {
    let mut chain = Chain::new();
    chain.put(1, b"real-1");
    // Spoofed from the head's address to the middle member: version 2^62.
    let mut payload = Vec::new();
    Write {
        value: Some(b"forged"),
        group: 0,
        version: 1 << 62,
        client: client(),
        key: b"k",
    }
    .emit(&mut payload);
    let forged = Header::new(PacketType::Reserved(CHAIN_WRITE), 1, 66, 66).encode(&payload);
    chain.deliver(member(0), member(1), forged);
    assert_eq!(chain.members[1].counters().versions_refused, 1);
    chain.put(2, b"real-2");
    for index in 0..MEMBERS {
        assert_eq!(
            chain.durable(index),
            (2, b"real-2".to_vec()),
            "member {index} holds the head's latest"
        );
    }
}

#[test]
fn a_write_within_the_head_s_lead_is_still_taken() {
    let mut chain = Chain::new();
    chain.put(1, b"real-1");
    // A version a head may have stamped while earlier ones were lost on the way.
    let mut payload = Vec::new();
    Write {
        value: Some(b"later"),
        group: 0,
        version: 5,
        client: client(),
        key: b"k",
    }
    .emit(&mut payload);
    let write = Header::new(PacketType::Reserved(CHAIN_WRITE), 1, 10, 1).encode(&payload);
    chain.deliver(member(0), member(1), write);
    assert_eq!(chain.members[1].counters().versions_refused, 0);
    assert_eq!(chain.durable(2), (5, b"later".to_vec()));
}

#[test]
fn a_commit_of_a_version_never_held_is_refused() {
    let mut chain = Chain::new();
    chain.put(1, b"real-1");
    let mut payload = Vec::new();
    Commit {
        group: 0,
        version: u64::MAX,
        key: b"k",
    }
    .emit(&mut payload);
    let forged = Header::new(PacketType::Reserved(CHAIN_COMMIT), 1, 0, 0).encode(&payload);
    chain.deliver(member(2), member(1), forged);
    assert_eq!(chain.members[1].counters().versions_refused, 1);
    // Passed up by nobody: the head saw the real commit only.
    assert_eq!(chain.members[0].counters().commits, 1);
}

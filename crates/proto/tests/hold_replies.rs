//! A device answers a hold query (docs/protocol.md, "Sessions") only once every entry it freed
//! before the question is freed durably: an entry whose invalidation is still in an unpersisted
//! batch comes back after a crash and is resent — to a server that, told nothing is held,
//! may have forgotten the session and would apply it again (found by the swarm with small
//! session tables, seed 7965994876265090280).

use std::net::SocketAddr;

use pmnet_proto::{Device, DeviceConfig, Time};
use pmnet_wire::{Header, PacketType};

const SERVER_ID: u16 = 1;
const SESSION: u64 = 0x5E55;

fn server_addr() -> SocketAddr {
    "192.0.2.9:7500".parse().unwrap()
}

fn client_addr() -> SocketAddr {
    "192.0.2.20:40000".parse().unwrap()
}

fn hold_replies(device: &mut Device) -> Vec<Vec<bool>> {
    std::iter::from_fn(|| device.poll_transmit())
        .filter_map(|transmit| {
            let (header, payload) = Header::parse(&transmit.bytes).ok()?;
            (header.packet_type == PacketType::HoldReply)
                .then(|| pmnet_wire::decode_hold_reply_payload(payload).unwrap())
        })
        .collect()
}

fn persist_all(device: &mut Device) {
    while let Some(batch) = device.poll_persist() {
        device.on_persisted(Time::ZERO, batch.number);
    }
}

#[test]
fn a_hold_reply_waits_until_the_entries_freed_before_it_are_freed_durably() {
    let config = DeviceConfig::new(3, vec![(SERVER_ID, server_addr())], 64, 2048);
    let mut device = Device::new(config, Time::ZERO, Vec::new());
    let update = Header::new(PacketType::UpdateRequest, SERVER_ID, SESSION, 1).encode(b"k=v");
    device.handle(Time::ZERO, client_addr(), &update);
    persist_all(&mut device);
    assert_eq!(device.live_entry_count(), 1);
    // The server applied it: the entry is freed, its invalidation not yet persisted.
    let ack = Header::new(PacketType::ServerAck, SERVER_ID, SESSION, 1).encode(b"+OK");
    device.handle(Time::ZERO, server_addr(), &ack);
    assert_eq!(device.live_entry_count(), 0);
    hold_replies(&mut device);
    let query = Header::new(PacketType::HoldQuery, SERVER_ID, 0, 77).encode(
        &pmnet_wire::encode_hold_query_payload(&[SESSION, SESSION + 1]),
    );
    device.handle(Time::ZERO, server_addr(), &query);
    assert_eq!(
        hold_replies(&mut device),
        Vec::<Vec<bool>>::new(),
        "no answer while the invalidation may still be lost in a crash"
    );
    persist_all(&mut device);
    assert_eq!(hold_replies(&mut device), vec![vec![false, false]]);
    // With nothing waiting to be made durable, the answer is at once.
    device.handle(Time::ZERO, server_addr(), &query);
    assert_eq!(hold_replies(&mut device), vec![vec![false, false]]);
}

//! A probe is answered once, and an answer never: a probe with a forged source (another
//! server, a device, the receiver itself) cannot start two endpoints answering each other
//! for ever. The simulator's attacker found a server answering a replayed probe "from"
//! itself, its own answer again, without end.

use std::net::SocketAddr;

use pmnet_proto::{Device, DeviceConfig, Server, ServerConfig, Time};
use pmnet_wire::{flags, Header, PacketType};

const SERVER_ID: u16 = 1;

fn server_addr() -> SocketAddr {
    "192.0.2.9:7500".parse().unwrap()
}

fn other() -> SocketAddr {
    "192.0.2.50:7400".parse().unwrap()
}

fn probe(answer: bool) -> Vec<u8> {
    let mut header = Header::new(PacketType::Probe, SERVER_ID, 0, 7);
    if answer {
        header.flags |= flags::ANSWER;
    }
    header.encode(&[])
}

fn drain<T>(poll: impl FnMut() -> Option<T>) -> Vec<T> {
    std::iter::from_fn(poll).collect()
}

#[test]
fn a_server_answers_a_probe_once_and_never_an_answer() {
    let mut server = Server::new(
        ServerConfig::new(SERVER_ID, Vec::new()),
        Time::ZERO,
        Vec::new(),
    );
    drain(|| server.poll_transmit());
    server.handle(Time::ZERO, other(), &probe(false));
    let sent = drain(|| server.poll_transmit());
    assert_eq!(sent.len(), 1);
    let (header, _) = Header::parse(&sent[0].bytes).unwrap();
    assert_eq!(header.packet_type, PacketType::Probe);
    assert_ne!(header.flags & flags::ANSWER, 0, "an answer is marked");
    // Its own answer, sent back to it (a forged source: itself, or another server).
    server.handle(Time::ZERO, server_addr(), &sent[0].bytes);
    server.handle(Time::ZERO, other(), &probe(true));
    assert!(drain(|| server.poll_transmit()).is_empty());
}

#[test]
fn a_device_answers_a_probe_of_another_device_and_never_an_answer_or_its_server() {
    let config = DeviceConfig::new(3, vec![(SERVER_ID, server_addr())], 64, 2048);
    let mut device = Device::new(config, Time::ZERO, Vec::new());
    drain(|| device.poll_transmit());
    // A device before it in a chain asks: answered, marked.
    device.handle(Time::ZERO, other(), &probe(false));
    let sent = drain(|| device.poll_transmit());
    assert_eq!(sent.len(), 1);
    let (header, _) = Header::parse(&sent[0].bytes).unwrap();
    assert_ne!(header.flags & flags::ANSWER, 0);
    // An answer from anyone, and a question "from" its server: not answered.
    device.handle(Time::ZERO, other(), &probe(true));
    device.handle(Time::ZERO, server_addr(), &probe(false));
    let answers = drain(|| device.poll_transmit())
        .into_iter()
        .filter(|transmit| {
            Header::parse(&transmit.bytes).is_ok_and(|(header, _)| {
                header.packet_type == PacketType::Probe && header.flags & flags::ANSWER != 0
            })
        })
        .count();
    assert_eq!(answers, 0);
}

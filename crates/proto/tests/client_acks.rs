//! A request of several fragments is logged only once the devices wanted each hold it whole.
//! With devices in series, a device whose log is full for one fragment passes it on and the
//! next one logs it: each fragment was then acked by some device, but no device could give
//! the server the whole request, and a server that asked about the number would skip it (found
//! by the swarm, `pmnet sim --seed 3803400000000005674`).

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{Client, ClientConfig, ClientEvent, Time};
use pmnet_wire::{Header, PacketType};

const SERVER_ID: u16 = 1;
const SESSION: u64 = 0x5E55;

fn device() -> SocketAddr {
    "192.0.2.7:7400".parse().unwrap()
}

fn ack(seq: u32, fragment_index: u16, device_id: u16) -> Vec<u8> {
    let mut header = Header::new(PacketType::PmnetAck, SERVER_ID, SESSION, seq);
    header.fragment_index = fragment_index;
    header.fragment_count = 2;
    header.device_id = device_id;
    header.encode(&[])
}

fn events(client: &mut Client) -> Vec<ClientEvent> {
    std::iter::from_fn(|| client.poll_event()).collect()
}

/// Fragment indexes `client` sends (its transmissions drained).
fn sent_fragments(client: &mut Client) -> Vec<u16> {
    std::iter::from_fn(|| client.poll_transmit())
        .map(|transmit| Header::parse(&transmit.bytes).unwrap().0.fragment_index)
        .collect()
}

#[test]
fn a_request_is_logged_only_once_a_device_holds_every_fragment() {
    let mut config = ClientConfig::new(SESSION, SERVER_ID, device());
    config.datagram_len_max = 200;
    config.retransmit_timeout = Duration::from_millis(10);
    let mut client = Client::new(config);
    let seq = client.update(Time::ZERO, &[7u8; 250]).unwrap();
    assert_eq!(sent_fragments(&mut client), vec![0, 1], "two fragments");
    // Device 8 (the next in the chain) logged fragment 0, device 7 fragment 1.
    client.handle(Time::ZERO, device(), &ack(seq, 0, 8));
    client.handle(Time::ZERO, device(), &ack(seq, 1, 7));
    assert!(events(&mut client).is_empty(), "no device holds it whole");
    // The retransmission goes to both: device 7 lacks fragment 0, device 8 fragment 1.
    let later = Time::ZERO + Duration::from_millis(11);
    client.handle_timeout(later);
    assert_eq!(sent_fragments(&mut client), vec![0, 1]);
    client.handle(later, device(), &ack(seq, 0, 7));
    assert!(matches!(
        events(&mut client).as_slice(),
        [ClientEvent::Completed { seq: done, .. }] if *done == seq
    ));
}

//! A device's pipeline in the runtime: a function in front of the log owns its packet type
//! over real UDP sockets, the log behind it still logs, persists in batches and acks, and a
//! type no function owns is counted and dropped.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use pmnet_pm::{FlushChoice, MmapOptions};
use pmnet_proto::{Counter, COUNTER_TYPE_CODE};
use pmnet_runtime::{DeviceOptions, DeviceRuntime, LogOptions, LoopOptions, Shutdown};
use pmnet_wire::{Header, PacketType};

/// Turns of the device loop given to a datagram to arrive and be answered. Each turn waits
/// at most a millisecond for the answer, so this bounds the test, not its pace.
const TURNS: usize = 10_000;

fn socket() -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    socket
}

/// Turn the device's loop until `socket` receives a datagram, and return it.
fn turn_until_received(device: &mut DeviceRuntime, socket: &UdpSocket) -> Vec<u8> {
    let mut buffer = [0u8; 2048];
    for _ in 0..TURNS {
        let _ = device.poll_once();
        if let Ok((len, _)) = socket.recv_from(&mut buffer) {
            return buffer[..len].to_vec();
        }
    }
    panic!("nothing received within {TURNS} turns of the device loop");
}

#[test]
fn a_counter_in_front_of_the_log_answers_its_type_and_the_log_still_acks() {
    let dir = tempfile::tempdir().unwrap();
    let server = socket();
    let client = socket();
    let options = DeviceOptions {
        device_id: 3,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        servers: vec![(1, server.local_addr().unwrap())],
        previous_devices: Vec::new(),
        follow: None,
        log: Some(LogOptions {
            path: dir.path().join("device.log"),
            slot_count: 64,
            slot_size: 2048,
            format: false,
            mmap: MmapOptions {
                flush: FlushChoice::Msync,
                added_latency_ns: 0,
            },
        }),
        forward_listen: None,
        echo_listen: None,
        max_resends_in_flight: None,
        resend_timeout: None,
        keys: None,
        batch: true,
        batch_hold: std::time::Duration::ZERO,
        xdp: None,
        loop_options: LoopOptions {
            report_interval: None,
            ..LoopOptions::default()
        },
    };
    let mut device =
        DeviceRuntime::open_with_front(options, Shutdown::new(), Box::new(Counter::default()))
            .unwrap();
    let to = device.addresses().data;

    // The device probes its server before it acks anything for it: answered in kind.
    let probe = turn_until_received(&mut device, &server);
    let (header, _) = Header::parse(&probe).unwrap();
    assert_eq!(header.packet_type, PacketType::Probe);
    let answer = Header {
        flags: header.flags | pmnet_wire::flags::ANSWER,
        ..header
    };
    server.send_to(&answer.encode(&[]), to).unwrap();

    // The counter's own type: answered by the front function, never forwarded.
    let ask = Header::new(PacketType::Reserved(COUNTER_TYPE_CODE), 1, 42, 1).encode(&[0; 8]);
    client.send_to(&ask, to).unwrap();
    let answer = turn_until_received(&mut device, &client);
    let (header, payload) = Header::parse(&answer).unwrap();
    assert_eq!(header.packet_type, PacketType::Reserved(COUNTER_TYPE_CODE));
    assert_eq!(payload, 1u64.to_be_bytes());

    // An update passes the counter: the log writes it, acks the client, forwards it.
    let update = Header::new(PacketType::UpdateRequest, 1, 42, 1).encode(b"SET k v");
    client.send_to(&update, to).unwrap();
    let ack = turn_until_received(&mut device, &client);
    let (header, _) = Header::parse(&ack).unwrap();
    assert_eq!(header.packet_type, PacketType::PmnetAck);
    assert_eq!(header.device_id, 3);
    let forwarded = turn_until_received(&mut device, &server);
    assert_eq!(forwarded, update);
    assert_eq!(device.live_entry_count(), 1);
    assert_eq!(device.counters().updates_logged, 1);
    let metrics = device.metrics().render();
    assert!(
        metrics.contains("pmnet_device_log_batches_total 1"),
        "{metrics}"
    );

    // A type in the reserved ranges that no function owns: counted, dropped, unanswered.
    let chain = Header::new(PacketType::Reserved(0x20), 1, 42, 1).encode(&[0; 8]);
    client.send_to(&chain, to).unwrap();
    let mut buffer = [0u8; 2048];
    for _ in 0..TURNS {
        let _ = device.poll_once();
        if device.dropped().get("unknown_type") == Some(&1) {
            break;
        }
        // Wait for the datagram on the client's socket (nothing should come) rather than spin.
        assert!(
            client.recv_from(&mut buffer).is_err(),
            "a dropped type was answered"
        );
    }
    assert_eq!(device.dropped().get("unknown_type"), Some(&1));
}

//! A client whose key differs from its device's: what comes back fails verification, and the
//! client's failure says so — how many datagrams, and why — instead of "never answered"; a
//! datagram that fails verification is not the peer answering.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pmnet_auth::{Authenticator, DeploymentKey, KeySet};
use pmnet_proto::ClientError;
use pmnet_runtime::{ClientSession, SessionOptions};
use pmnet_wire::{Header, PacketType};

fn keys(id: u16) -> KeySet {
    KeySet::new(vec![DeploymentKey::new(id, [id as u8; 32])])
}

/// A "device" that answers every datagram with a PMNet-ACK sealed under `keys` (or unsealed).
fn answering_device(keys: Option<KeySet>) -> (SocketAddr, Arc<AtomicBool>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let addr = socket.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let mut auth = keys.map(Authenticator::new);
        let mut buffer = [0u8; 2048];
        while !stopped.load(Ordering::Relaxed) {
            let Ok((len, from)) = socket.recv_from(&mut buffer) else {
                continue;
            };
            let Ok(packet) =
                pmnet_wire::Packet::new_checked(pmnet_auth::without_trailer(&buffer[..len]))
            else {
                continue;
            };
            let mut ack = Header::new(
                PacketType::PmnetAck,
                packet.server_id(),
                packet.session_id(),
                packet.seq(),
            );
            ack.fragment_count = packet.fragment_count();
            ack.device_id = 1;
            let mut bytes = ack.encode(&[]);
            if let Some(auth) = auth.as_mut() {
                auth.seal(&mut bytes);
            }
            let _ = socket.send_to(&bytes, from);
        }
    });
    (addr, stop)
}

fn failed_update(client_keys: Option<KeySet>, device_keys: Option<KeySet>) -> ClientSession {
    let (device, stop) = answering_device(device_keys);
    let mut options = SessionOptions::new(1, device);
    options.keys = client_keys;
    options.request_lifetime = Some(Duration::from_millis(300));
    let mut session = ClientSession::open(options).unwrap();
    assert_eq!(session.update(b"x=1"), Err(ClientError::TimedOut));
    stop.store(true, Ordering::Relaxed);
    session
}

#[test]
fn a_client_names_answers_it_could_not_verify() {
    for (client, device, reason) in [
        (Some(keys(1)), Some(keys(2)), "unknown_key"),
        (Some(keys(1)), None, "unauthenticated"),
        (None, Some(keys(1)), "sealed_without_key"),
    ] {
        let session = failed_update(client, device);
        let why = session
            .unverified_answers()
            .expect("the answers that failed are counted");
        assert!(
            why.contains("answered nothing this client could verify")
                && why.contains(reason)
                && why.contains(&session.peer().to_string()),
            "{why}"
        );
        let count: u64 = session.counters().dropped.get(reason).copied().unwrap_or(0);
        assert!(
            count >= 1 && why.contains(&format!("{count} datagram(s)")),
            "{why}"
        );
        // Nothing it could verify: the device never answered, as far as the client knows.
        let silence = session.peer_silence().expect("silent");
        assert!(silence.contains("never answered"), "{silence}");
    }
}

#[test]
fn a_client_with_the_same_key_reports_nothing_unverified() {
    let (device, stop) = answering_device(Some(keys(1)));
    let mut options = SessionOptions::new(1, device);
    options.keys = Some(keys(1));
    let mut session = ClientSession::open(options).unwrap();
    assert!(session.update(b"x=1").is_ok());
    stop.store(true, Ordering::Relaxed);
    assert_eq!(session.unverified_answers(), None);
    assert_eq!(session.peer_silence(), None);
}

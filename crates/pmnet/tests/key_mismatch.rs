//! Peers that cannot be believed, with real processes: a device and a server whose key files
//! differ (or one of which has none) ack nothing and say why; datagrams that fail verification
//! leave no trace in `pmnet status`'s peers; a memory node counts its drops under its own name.

mod common;

use std::path::Path;

use common::{args, device_args, free_udp_addr, poll_until, run_pmnet, server_args, Node};

fn keygen(dir: &Path, name: &str) -> String {
    let path = dir.join(name).display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &path]), None);
    assert!(status.success(), "{stderr}");
    path
}

/// A device with `device_keys` in front of a server with `server_keys`: a client holding the
/// device's key gets no PMNet-ACK and is told why; the device warns, naming the server and
/// the reason (`named`).
fn refused(device_keys: Option<&str>, server_keys: Option<&str>, named: &str) {
    let dir = tempfile::tempdir().unwrap();
    let device_addr = free_udp_addr();
    let server_addr = free_udp_addr();
    let mut server = server_args(server_addr, device_addr, &dir.path().join("s.data"), None);
    if let Some(keys) = server_keys {
        server.extend(args(&["--key-file", keys]));
    }
    let _server = Node::start("server", server);
    let mut device = device_args(device_addr, server_addr, &dir.path().join("d.log"));
    if let Some(keys) = device_keys {
        device.extend(args(&["--key-file", keys]));
    }
    let device = Node::start("device", device);
    // The device warns, naming the server and the reason (after its start-up grace, in which
    // it logs writes and holds their acks for the server's first answer).
    let warning = poll_until("the device says why it acks nothing", || {
        let stderr = device.proc.stderr();
        let wanted = format!("server {server_addr} answers nothing this device can verify");
        match stderr.lines().find(|line| line.contains(&wanted)) {
            Some(line) => Ok(line.to_owned()),
            None => Err(stderr),
        }
    });
    assert!(
        warning.contains("WARN") && warning.contains(named) && warning.contains("--key-file"),
        "{warning}"
    );
    let to = device_addr.to_string();
    let mut list = vec!["client", "--to", &to, "--request-lifetime", "1"];
    if let Some(keys) = device_keys {
        list.extend(["--key-file", keys]);
    }
    list.extend(["set", "k", "v"]);
    let (status, stdout, stderr) = run_pmnet(&args(&list), None);
    assert!(!status.success(), "{stdout}{stderr}");
    assert!(!stdout.contains("durable"), "{stdout}");
    assert!(
        format!("{stdout}{stderr}").contains("acks nothing until it has verified its server"),
        "{stdout}{stderr}"
    );
    device.wait_metric(
        "pmnet_device_unverified_forwards_total",
        "port=\"pmnet\"",
        "counts the writes it forwarded without an ack",
        |value| value >= 1.0,
    );
}

#[test]
fn a_device_and_a_server_with_different_keys_ack_nothing_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keygen(dir.path(), "a.keys");
    let other = keygen(dir.path(), "b.keys");
    refused(Some(&keys), None, "unauthenticated");
    refused(None, Some(&keys), "sealed_without_key");
    refused(Some(&keys), Some(&other), "bad_tag");
}

/// Datagrams that fail verification do not make their senders peers: `pmnet status` lists
/// the client whose datagram verified, not the sender of the others.
#[test]
fn unverified_datagrams_are_no_peers() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keygen(dir.path(), "a.keys");
    let device_addr = free_udp_addr();
    let server_addr = free_udp_addr();
    let mut device = device_args(device_addr, server_addr, &dir.path().join("d.log"));
    device.extend(args(&["--key-file", &keys]));
    let device = Node::start("device", device);
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let update = pmnet_wire::Header::new(pmnet_wire::PacketType::UpdateRequest, 1, 7, 1);
    for _ in 0..5 {
        stranger.send_to(&update.encode(b"x"), device_addr).unwrap();
    }
    device.wait_metric(
        "pmnet_device_dropped_total",
        "port=\"pmnet\",reason=\"unauthenticated\"",
        "counts the stranger's datagrams",
        |value| value >= 5.0,
    );
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let text = std::fs::read_to_string(&keys).unwrap();
    let mut auth = pmnet_auth::Authenticator::new(pmnet_auth::KeySet::parse(&text).unwrap());
    let mut sealed =
        pmnet_wire::Header::new(pmnet_wire::PacketType::BypassRequest, 1, 8, 1).encode(b"x");
    auth.seal(&mut sealed);
    let metrics = device.metrics.expect("a metrics endpoint").to_string();
    let listed = |addr: std::net::SocketAddr| {
        let (status, stdout, stderr) = run_pmnet(&args(&["status", "--json", &metrics]), None);
        assert!(status.success(), "{stderr}");
        stdout.contains(&format!("\"{addr}\""))
    };
    poll_until("the client whose datagram verified is listed", || {
        client.send_to(&sealed, device_addr).unwrap();
        if listed(client.local_addr().unwrap()) {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    });
    assert!(
        !listed(stranger.local_addr().unwrap()),
        "a sender of datagrams that failed verification is listed as a peer"
    );
}

/// A memory node counts what it drops under its own metric, not the device's.
#[test]
fn a_memory_node_counts_its_drops_as_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keygen(dir.path(), "a.keys");
    let node_addr = free_udp_addr();
    let node = Node::start(
        "memnode",
        args(&[
            "memnode",
            "--listen",
            &node_addr.to_string(),
            "--lines",
            "64",
            "--file",
            &dir.path().join("n.lines").display().to_string(),
            "--key-file",
            &keys,
            "--metrics",
            "127.0.0.1:0",
        ]),
    );
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let query = pmnet_wire::Header::new(pmnet_wire::PacketType::Reserved(0x32), 0, 7, 1);
    stranger.send_to(&query.encode(&[]), node_addr).unwrap();
    node.wait_metric(
        "pmnet_memnode_datagrams_dropped_total",
        "port=\"pmnet\",reason=\"unauthenticated\"",
        "counts the unauthenticated datagram",
        |value| value >= 1.0,
    );
    let device_named = node.metric(
        "pmnet_device_dropped_total",
        "port=\"pmnet\",reason=\"unauthenticated\"",
    );
    assert!(device_named.is_err(), "{device_named:?}");
}

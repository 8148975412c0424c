//! Three `pmnet device --chain-member` processes as a chain store (docs/netchain.md), driven
//! by `pmnet kv` as a user runs it: put, get, compare-and-set and a lock taken by one owner
//! at a time; a member is SIGKILLed and started again on its table — every value written
//! before is still read, and writes go on. A member's emulated capacity
//! (`--chain-max-ops-per-s`) holds requests back.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;

use common::{args, chain_member, device_args, free_udp_addr, run_pmnet, Node};
use pmnet_netchain::{rotated_groups, ChainClient, ClientConfig, ClientOp};
use pmnet_proto::Time;

fn member(id: u16, listen: SocketAddr, members: &[SocketAddr], dir: &Path) -> Node {
    let membership: Vec<String> = members
        .iter()
        .flat_map(|member| ["--chain-member".to_owned(), member.to_string()])
        .collect();
    chain_member(id, listen, &membership, dir)
}

fn kv(members: &[SocketAddr], words: &[&str]) -> (bool, String) {
    let mut all: Vec<String> = vec![
        "kv".to_owned(),
        "--timeout-ms".to_owned(),
        "3000".to_owned(),
    ];
    for member in members {
        all.extend(["--member".to_owned(), member.to_string()]);
    }
    all.extend(words.iter().map(|word| (*word).to_owned()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let (status, stdout, _) = run_pmnet(&args(&refs), None);
    (status.success(), stdout.trim().to_owned())
}

#[test]
fn a_chain_store_of_three_devices_keeps_values_and_locks_through_a_member_s_crash() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let members = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    let mut nodes: Vec<Node> = (0..3)
        .map(|index| member(index as u16 + 1, members[index], &members, dir.path()))
        .collect();
    assert!(
        nodes[0]
            .banner
            .iter()
            .any(|line| line.contains("chain store: member")),
        "{:?}",
        nodes[0].banner
    );

    for index in 0..20 {
        let (ok, out) = kv(
            &members,
            &["put", &format!("key{index}"), &format!("v{index}")],
        );
        assert!(ok && out.starts_with("OK (version 1)"), "{out}");
    }
    let (ok, out) = kv(&members, &["get", "key7"]);
    assert!(ok && out == "v7", "{out}");
    let (ok, out) = kv(&members, &["get", "never"]);
    assert!(ok && out == "(nil)", "{out}");
    let (ok, out) = kv(&members, &["cas", "key7", "1", "w7"]);
    assert!(ok && out == "OK (version 2)", "{out}");
    let (ok, out) = kv(&members, &["cas", "key7", "1", "x7"]);
    assert!(!ok && out.contains("holds version 2: w7"), "{out}");

    let (ok, out) = kv(&members, &["lock", "leader", "--owner", "alice"]);
    assert!(ok && out.starts_with("locked by alice"), "{out}");
    let (ok, out) = kv(&members, &["lock", "leader", "--owner", "bob"]);
    assert!(!ok && out.starts_with("held by alice"), "{out}");

    // The middle member of the first groups dies and starts again on its table.
    nodes[1].proc.kill();
    nodes[1] = member(2, members[1], &members, dir.path());
    for index in 0..20 {
        let expected = if index == 7 {
            "w7".to_owned()
        } else {
            format!("v{index}")
        };
        let (ok, out) = kv(&members, &["get", &format!("key{index}")]);
        assert!(ok && out == expected, "key{index}: {out}");
    }
    let (ok, out) = kv(&members, &["unlock", "leader", "--owner", "alice"]);
    assert!(ok && out == "unlocked", "{out}");
    let (ok, out) = kv(&members, &["lock", "leader", "--owner", "bob"]);
    assert!(ok && out.starts_with("locked by bob"), "{out}");
    let (ok, out) = kv(&members, &["put", "key7", "after"]);
    assert!(ok && out == "OK (version 3)", "{out}");
    let (ok, out) = kv(&members, &["get", "key7"]);
    assert!(ok && out == "after", "{out}");
    drop(nodes);
}

#[test]
fn a_member_s_emulated_capacity_holds_requests_back() {
    let dir = tempfile::tempdir().unwrap();
    let members = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    let mut nodes = Vec::new();
    for (index, &listen) in members.iter().enumerate() {
        let id = index + 1;
        let mut list = device_args(
            listen,
            free_udp_addr(),
            &dir.path().join(format!("device{id}.log")),
        );
        list.extend(["--device-id".to_owned(), id.to_string()]);
        list.extend([
            "--chain-table".to_owned(),
            dir.path()
                .join(format!("chain{id}.table"))
                .display()
                .to_string(),
            "--chain-keys".to_owned(),
            "1000".to_owned(),
            "--chain-groups".to_owned(),
            "1".to_owned(),
            "--chain-max-ops-per-s".to_owned(),
            "1".to_owned(),
        ]);
        for member in &members {
            list.extend(["--chain-member".to_owned(), member.to_string()]);
        }
        let node = Node::start(&format!("member {id}"), list);
        assert!(
            node.banner
                .iter()
                .any(|line| line.contains("chain capacity: at most 1 requests/s (emulated")),
            "{:?}",
            node.banner
        );
        nodes.push(node);
    }
    // 40 sessions each read a key at the tail (member 3) at once.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for session in 0..40u64 {
        let mut config = ClientConfig::new(1000 + session, rotated_groups(&members, 1));
        config.reads = pmnet_netchain::ReadFrom::Tail;
        let mut client = ChainClient::new(config);
        client.start(Time::ZERO, b"k", ClientOp::Get).unwrap();
        let transmit = client.poll_transmit().unwrap();
        assert_eq!(transmit.destination, members[2]);
        socket
            .send_to(&transmit.bytes, transmit.destination)
            .unwrap();
    }
    nodes[2].wait_metric(
        "pmnet_chain_capacity_delayed_total",
        "",
        "counts the requests held back",
        |delayed| delayed >= 30.0,
    );
    assert_eq!(
        nodes[0]
            .metric("pmnet_chain_capacity_delayed_total", "")
            .unwrap(),
        0.0
    );
}

#[test]
fn a_capacity_without_a_chain_is_refused() {
    let (status, _, stderr) = run_pmnet(
        &args(&[
            "device",
            "--server",
            "1=127.0.0.1:9",
            "--chain-max-ops-per-s",
            "100",
        ]),
        None,
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--chain-max-ops-per-s limits a chain member: give --chain-member"),
        "{stderr}"
    );
}
